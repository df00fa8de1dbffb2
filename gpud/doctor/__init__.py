"""``gpud doctor``: pre-flight checks that find the real problem and say how to fix it.

Each check has a stable dotted id, a status (pass/warn/fail/skip), a one-line summary and a
remedy a person can act on. All checks read one snapshot and the host's files once.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpud.config import Config
from gpud.doctor import (  # noqa: F401 (they register their checks)
    checks_env,
    checks_gpu,
    checks_host,
    checks_pcie,
    checks_probe,
    checks_system,
)
from gpud.doctor.registry import AREAS, CHECKS, Area, Check, Context, run, selected
from gpud.errors import DriverNotLoaded, NvmlError
from gpud.hw.machine import Machine
from gpud.model import STATUSES, CheckResult, Snapshot, Status, ThermalPoint, host_json
from gpud.paths import daemon_running
from gpud.probe.report import ProbeReport
from gpud.profiles import state as tuning_state

__all__ = ["AREAS", "CHECKS", "Area", "Report", "area_of", "diagnose"]


@dataclass(frozen=True)
class Report:
    host: dict[str, Any]  # gpud.model.host_json: the JSON documents' host
    checks: tuple[CheckResult, ...]

    @property
    def counts(self) -> dict[Status, int]:
        c = Counter(r.status for r in self.checks)
        return {k: c.get(k, 0) for k in STATUSES}

    def exit_code(self, strict: bool = False) -> int:
        n = self.counts
        return 1 if n["fail"] or (strict and n["warn"]) else 0


def area_of(check_id: str) -> Area:
    return next((c.area for c in CHECKS if c.id == check_id), AREAS[-1])


# Checks that say nothing in the daemon: its environment and Python are not the users' jobs'.
NOT_IN_DAEMON = ["env.cuda", "torch.cuda"]


def diagnose(machine: Machine, config: Config, *, only: list[str] | None = None, skip: list[str] | None = None,
             expect_gpus: int | None = None, env: dict[str, str] | None = None, debug: bool = False,
             snapshot: Snapshot | None = None, in_daemon: bool = False,
             probe: ProbeReport | None = None,
             thermal: Mapping[str, Sequence[ThermalPoint]] | None = None) -> Report:
    """Read the machine once (or use ``snapshot``) and run the selected checks."""
    ctx = Context(machine=machine, config=config, env=dict(os.environ if env is None else env),
                  expect_gpus=expect_gpus, daemon_running=in_daemon or daemon_running(config.daemon.socket),
                  profile_settings=tuning_state.profile_settings(tuning_state.load()), probe=probe,
                  thermal=thermal or {})
    if snapshot is not None:
        ctx.snapshot = snapshot
    else:
        try:
            ctx.snapshot = machine.snapshot()
        except (DriverNotLoaded, NvmlError) as err:
            ctx.error = err
    if in_daemon:
        skip = [*(skip or []), *NOT_IN_DAEMON]
    checks: list[Check] = selected(CHECKS, only or [], [*(skip or []), *config.doctor.skip], probe is not None)
    results = _once(run(ctx, [c for c in checks if not c.probe], debug=debug),
                    run(ctx, [c for c in checks if c.probe], debug=debug))
    snap = ctx.snapshot
    host = host_json(machine.label, snap.versions if snap else None, len(snap.samples) if snap else None,
                     machine.host.cpu_info(), machine.host.memory_total_bytes())
    return Report(host, tuple(results))


def _once(results: list[CheckResult], probed: list[CheckResult]) -> list[CheckResult]:
    """``--probe`` re-checks ``pcie.link_gen`` under load: its verdict replaces the idle one for the same
    GPU, so each check is listed once; when the probe saw no load, the idle verdict stays and says so."""

    again = {r.gpu for r in probed if r.id == "pcie.link_gen" and r.gpu is not None}
    no_load = any(r.id == "pcie.link_gen" and r.gpu is None and r.status == "skip" for r in probed)
    out: list[CheckResult] = []
    for r in results:
        if r.id == "pcie.link_gen" and r.gpu in again:
            continue
        if no_load and r.id == "pcie.link_gen" and "re-checked under load by the probe" in r.summary:
            r = dataclasses.replace(r, summary=r.summary.replace(
                "re-checked under load by the probe", "not re-checked: the probe put no load on this GPU"))
        out.append(r)
    return out + [r for r in probed if not (r.id == "pcie.link_gen" and r.gpu is None and r.status == "skip")]
