"""One observation of the machine for the exporter: telemetry, Xids, checks, tuning, probe.

``observe`` is the only place an ``Observation`` is built. ``gpud metrics`` gives it a snapshot and
lets it read the rest now; the daemon's tick gives it everything it already holds (its snapshot,
doctor's last checks, the kernel log's Xids, the applied profile and its drift, the cached probe
result) and what only a running daemon has (``Running``). So the one-shot exposition and the
daemon's ``/metrics`` carry the same families from the same code, never two lists.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpud.config import Config
from gpud.doctor import diagnose
from gpud.doctor.health import Health, gather
from gpud.hw.machine import Machine
from gpud.model import CheckResult, Snapshot, XidEvent
from gpud.observation import Counters, Observation, TickStats
from gpud.paths import burnin_path
from gpud.probe import history
from gpud.probe.report import ProbeReport
from gpud.profiles import engine
from gpud.profiles import state as tuning_state
from gpud.profiles.enforce import DriftMetric, exported
from gpud.usage import Usage

Drift = DriftMetric  # (gpu, setting, differs from the profile now)


def drift_of(machine: Machine, daemon: bool, snapshot: Snapshot) -> tuple[str | None, DriftMetric]:
    """The applied profile and its drift now: ``engine.drift`` (as ``gpud verify``), exported as the
    daemon's enforcement exports it (``enforce.exported``)."""
    data, drifts = engine.verify(machine, daemon=daemon, snapshot=snapshot)
    if data is None:
        return None, ()
    return data.profile, exported(drifts)


@dataclass(frozen=True)
class Running:
    """What only a running daemon knows (a one-shot ``gpud metrics`` has none of it)."""

    counters: Counters = Counters()
    tick: TickStats | None = None
    last_tick: float | None = None
    usage: Usage | None = None  # time accounting over the daemon's ticks


def observe(machine: Machine, config: Config | None, *, snapshot: Snapshot | None = None,
            checks: tuple[CheckResult, ...] | None = None, xids: tuple[XidEvent, ...] | None = None,
            tuning: tuple[str | None, Drift] | None = None,
            probe: Callable[[], ProbeReport | None] = history.latest,
            running: Running | None = None, daemon_fans: bool = False,
            health: tuple[Health, ...] | None = None,
            profiles: tuple[tuple[int, str, str], ...] | None = None,
            previous: Observation | None = None) -> Observation:
    """The observation of ``machine``: what is not given is read now.

    Without ``running`` (``gpud metrics``): a missing snapshot is taken, doctor runs (``config``), the
    Xids come from the kernel log, the drift from ``tuning.verify`` and the profile from the state
    file. With ``running`` (the daemon): ``snapshot`` may be None (no reading yet) and is never taken
    here; ``tuning`` is (the profile the daemon enforces, its drift). ``daemon_fans``: a daemon drives
    the fans, so ``gpud metrics`` compares their curves as the daemon does. ``profiles``: (gpu, profile,
    rule) per GPU, as the daemon holds them; read from the state file when not given. ``previous``: the
    daemon's last observation, whose ``version`` this one keeps if its slow families read the same."""
    snap = snapshot if snapshot is not None or running is not None else machine.snapshot()
    if checks is None:
        checks = diagnose(machine, config if config is not None else Config(), snapshot=snap, in_daemon=True).checks
    if tuning is not None:
        profile, drifts = tuning
    elif snap is None:
        profile, drifts = None, ()
    else:
        profile, drifts = drift_of(machine, running is not None or daemon_fans, snap)
        if profile is None:
            data = tuning_state.load()
            profile = data.profile if data else None
    if xids is None:
        xids = tuple(machine.host.xid_events() or ())
    if health is None:  # `gpud metrics`: from these checks and Xids, and the journal
        health = gather(machine, config if config is not None else Config(), checks, snap, xids=xids)
    if profiles is None:
        profiles = tuning_state.gpu_profiles(tuning_state.load())
    run = running if running is not None else Running()
    return Observation(snapshot=snap, xids=xids, checks=checks, profile=profile, drift=drifts,
                       counters=run.counters, probe=probe(), nvml_errors=dict(machine.nvml.errors), tick=run.tick,
                       last_tick=run.last_tick, usage=run.usage, burnin=last_burnin(), health=health,
                       profiles=profiles).following(previous)


_burnin_cache: dict[str, Any] = {"key": None, "doc": None}


def last_burnin() -> dict[str, Any] | None:
    """The last ``gpud burnin`` document (``gpud.paths.burnin_path``), read again only when the file
    changes (the daemon asks every tick), so the exporter's slow families are re-rendered only then."""
    path = burnin_path()
    try:
        st = path.stat()
    except OSError:
        _burnin_cache.update(key=None, doc=None)
        return None
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key != _burnin_cache["key"]:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = None
        _burnin_cache.update(key=key, doc=doc if isinstance(doc, dict) and doc.get("kind") == "burnin" else None)
    doc_now: dict[str, Any] | None = _burnin_cache["doc"]
    return doc_now
