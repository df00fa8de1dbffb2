"""The daemon's enforcement: each tick, the applied profile's drift, and re-applying what drifted.

A driver reload or a reboot resets a GPU's settings, and anybody with root can change one behind
gpud's back. Each tick the daemon hands its snapshot here: ``engine.drift`` (the function
``gpud verify`` and ``gpud metrics`` use) compares every setting of the profile with it; when one
of a GPU's enforced settings differs, all of that GPU's enforced settings are written again in
registry order (locked clocks too: they have no getter, and a reset lost them as well); a drifted
CPU governor is written again on every CPU. What is returned is the drift *after* that: a setting
that was written and read back as asked is no longer drift; one whose write failed still is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.model import Snapshot
from gpud.tuning import engine
from gpud.tuning.engine import Desired, Drift
from gpud.tuning.settings import BY_KEY, GPU_SETTINGS, HOST_BY_KEY, UNSUPPORTED
from gpud.tuning.state import TuningState

log = logging.getLogger("gpud.daemon")

# (kind, summary, **fields): how a re-apply reaches the daemon's health journal.
Record = Callable[..., None]
# What ``gpud_profile_drift`` exports: (gpu, setting, differs from the profile now).
DriftMetric = tuple[tuple[int | None, str, bool], ...]


def exported(drifts: list[Drift]) -> DriftMetric:
    """The drift items compared with a reading, as ``gpud_profile_drift`` exports them."""
    return tuple((d.gpu, d.setting, d.drifted) for d in drifts if d.measured)


class Enforcer:
    """Holds the profile the daemon applied; ``enforce`` is called each tick under the tuning lock."""

    def __init__(self, machine: Machine, record: Record | None = None) -> None:
        self.machine = machine
        self.record = record
        self.state: TuningState | None = None
        self.reapply_total = 0  # re-applies (one per GPU or host whose settings drifted), plus start-up writes
        self.reapply_failures_total = 0  # settings whose re-apply failed

    def follow(self, profile: str | None, desired: Desired, host: dict[str, Any] | None = None) -> None:
        """Enforce ``desired`` (per GPU, as the apply left it) and ``host`` from now on; None: nothing."""
        if profile is None:
            self.state = None
            return
        want: dict[str, dict[str, Any]] = {str(gpu): {k: v for k, v in d.items() if k != "required"}
                                           for gpu, d in desired.items()}
        if host:
            want["host"] = dict(host)
        self.state = TuningState(profile=profile, desired=want)

    def forget(self, key: str) -> None:
        """Stop comparing setting ``key`` (``gpud restore --fans-only`` hands the fans back)."""
        if self.state is not None:
            self.state = replace(self.state, desired={k: {s: v for s, v in want.items() if s != key}
                                                      for k, want in self.state.desired.items()})

    def enforce(self, snap: Snapshot) -> DriftMetric:
        """Drift against ``snap``; re-apply what drifted; the drift that remains, for ``/metrics``."""
        if self.state is None:
            return ()
        drifts = engine.drift(self.machine, self.state, snap, daemon=True)
        fixed: set[tuple[int | None, str]] = set()
        by_gpu: dict[int | None, list[Drift]] = {}
        for d in drifts:
            if d.drifted and d.current is not None and self._enforced(d):
                by_gpu.setdefault(d.gpu, []).append(d)
        for gpu, drifted in by_gpu.items():
            fixed |= self._reapply(gpu, drifted)
        return exported([replace(d, current=d.desired, status="ok") if d.drifted and (d.gpu, d.setting) in fixed
                         else d for d in drifts])

    @staticmethod
    def _enforced(d: Drift) -> bool:
        if d.gpu is None:
            return d.setting in HOST_BY_KEY and HOST_BY_KEY[d.setting].enforced
        return d.setting in BY_KEY and BY_KEY[d.setting].enforced

    def _reapply(self, gpu: int | None, drifted: list[Drift]) -> set[tuple[int | None, str]]:
        """Write the GPU's (or the host's) enforced settings again; the (gpu, setting) read back as asked."""
        assert self.state is not None
        names = [d.setting for d in drifted]
        where = "host" if gpu is None else f"GPU {gpu}"
        profile = self.state.profile
        want = self.state.desired.get("host" if gpu is None else str(gpu), {})
        log.warning("%s: %s drifted from profile %s: re-applying", where, ", ".join(names), profile)
        keys = (list(HOST_BY_KEY) if gpu is None
                else [s.key for s in GPU_SETTINGS if s.enforced])
        fixed: set[tuple[int | None, str]] = set()
        failed: set[str] = set()
        for key in keys:
            value = want.get(key)
            if value is None or value == UNSUPPORTED:
                continue
            try:
                got = engine.write(self.machine, gpu, key, value)
            except GpudError as err:
                log.error("%s: re-applying %s failed: %s", where, key, err)
                failed.add(key)
                continue
            change = engine.Change(gpu, key, None, value, "set")
            if engine.read_back_ok(change, got):
                fixed.add((gpu, key))
            else:
                log.error("%s: re-applying %s read back %s, wanted %s", where, key, engine.show(got),
                          engine.show(value))
                failed.add(key)
        self.reapply_total += 1
        self.reapply_failures_total += len(failed)
        if self.record is not None:
            self.record("profile_drift" if failed else "profile_reapply",
                        f"{where}: {', '.join(names)} drifted from profile {profile}: "
                        + (f"re-applying {', '.join(sorted(failed))} failed" if failed else "re-applied"),
                        gpu=gpu, drifted=names, failed=sorted(failed))
        return fixed


__all__ = ["DriftMetric", "Enforcer", "exported"]
