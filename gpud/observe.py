"""One observation of the machine for the exporter: telemetry, Xids, checks, tuning, probe."""

from __future__ import annotations

from gpud.config import Config
from gpud.doctor import diagnose
from gpud.exporter import Observation, TickStats
from gpud.hw.machine import Machine
from gpud.model import CheckResult, Snapshot
from gpud.probe import history
from gpud.tuning import engine
from gpud.tuning import state as tuning_state
from gpud.tuning.enforce import DriftMetric, exported


def drift_of(machine: Machine, daemon: bool, snapshot: Snapshot) -> tuple[str | None, DriftMetric]:
    """The applied profile and its drift now: ``engine.drift`` (as ``gpud verify``), exported as the
    daemon's enforcement exports it (``enforce.exported``)."""
    data, drifts = engine.verify(machine, daemon=daemon, snapshot=snapshot)
    if data is None:
        return None, ()
    return data.profile, exported(drifts)


def observe(machine: Machine, config: Config, *, snapshot: Snapshot | None = None,
            checks: tuple[CheckResult, ...] | None = None, daemon: bool = False, reapply_total: int = 0,
            fan_failsafe_total: int = 0, tick: TickStats | None = None, last_tick: float | None = None,
            drift: tuple[str | None, tuple[tuple[int | None, str, bool], ...]] | None = None) -> Observation:
    snap = snapshot if snapshot is not None else machine.snapshot()
    if checks is None:
        checks = diagnose(machine, config, snapshot=snap, in_daemon=True).checks
    profile, drifts = drift if drift is not None else drift_of(machine, daemon, snap)
    if profile is None:
        data = tuning_state.load()
        profile = data.profile if data else None
    return Observation(snapshot=snap, xids=tuple(machine.host.xid_events() or ()), checks=checks, profile=profile,
                       drift=drifts, reapply_total=reapply_total, fan_failsafe_total=fan_failsafe_total,
                       probe=history.latest(), nvml_errors=dict(machine.nvml.errors), tick=tick, last_tick=last_tick)
