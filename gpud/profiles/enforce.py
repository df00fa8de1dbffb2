"""The daemon's enforcement: each tick, the applied profile's drift, and re-applying what drifted.

A driver reload or a reboot resets a GPU's settings, and anybody with root can change one behind
gpud's back. Each tick the daemon hands its snapshot here: ``engine.drift`` (the function
``gpud verify`` and ``gpud metrics`` use) compares every setting of the profile with it; when one
of a GPU's enforced settings differs, all of that GPU's enforced settings are written again in
registry order (locked clocks too: they have no getter, and a reset lost them as well); a drifted
CPU governor is written again on every CPU. What is returned is the drift *after* that: a setting
that was written and read back as asked is no longer drift; one whose write failed still is.

A setting whose re-apply failed is tried again with an exponential back-off (10 s doubling to
10 min), not on every tick: the failure is logged and journalled when it starts and once when it
clears, each attempt made is counted, and the setting stays drift while it differs. A successful
re-apply, or another desired value (a new profile), starts afresh. The CPU governors (one sysfs
file per CPU) are read at most every 10 s, and again after each re-apply of the governor.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.model import Snapshot
from gpud.profiles import engine
from gpud.profiles.engine import Desired, Drift
from gpud.profiles.settings import HOST, UNSUPPORTED, Host, setting_for, settings_of, shown, target_at
from gpud.profiles.state import TuningState

log = logging.getLogger("gpud.daemon")

# (kind, summary, **fields): how a re-apply reaches the daemon's health journal.
Record = Callable[..., None]
# What ``gpud_profile_drift`` exports: (gpu, setting, differs from the profile now).
DriftMetric = tuple[tuple[int | None, str, bool], ...]

BACKOFF_FIRST_S = 10.0  # the first retry after a failed re-apply
BACKOFF_MAX_S = 600.0  # doubling up to this
HOST_EVERY_S = 10.0  # how often the host's settings (the CPU governors) are read


@dataclass
class Failing:
    """A setting whose re-apply failed: the value asked, attempts failed in a row, the next try."""

    value: Any
    failures: int
    delay: float
    next_at: float


def exported(drifts: list[Drift]) -> DriftMetric:
    """The drift items compared with a reading, as ``gpud_profile_drift`` exports them."""
    return tuple((d.gpu, d.setting, d.drifted) for d in drifts if d.measured)


class Enforcer:
    """Holds the profile the daemon applied; ``enforce`` is called each tick under the tuning lock.
    ``clock`` (monotonic seconds) times the back-off and the governor readings."""

    def __init__(self, machine: Machine, record: Record | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.machine = machine
        self.record = record
        self.clock = clock
        self.state: TuningState | None = None
        self.reapply_total = 0  # re-applies (one per GPU or host whose settings drifted), plus start-up writes
        self.reapply_failures_total = 0  # settings whose re-apply was attempted and failed
        self.failing: dict[tuple[int | None, str], Failing] = {}
        self._host: tuple[float, list[Drift]] | None = None  # (read at, the host's drift then)
        self.changed = False  # a profile followed or a setting forgotten since the last ``enforce``

    def follow(self, profile: str | None, desired: Desired, host: dict[str, Any] | None = None) -> None:
        """Enforce ``desired`` (per GPU, as the apply left it) and ``host`` from now on; None: nothing."""
        self.failing = {}
        self._host = None
        self.changed = True
        if profile is None:
            self.state = None
            return
        self.state = TuningState(profile=profile, desired=engine.keyed(desired, host))

    def forget(self, key: str) -> None:
        """Stop comparing setting ``key`` (``gpud restore --fans-only`` hands the fans back)."""
        if self.state is not None:
            self.state = replace(self.state, desired={k: {s: v for s, v in want.items() if s != key}
                                                      for k, want in self.state.desired.items()})
        self.failing = {k: f for k, f in self.failing.items() if k[1] != key}
        self._host = None
        self.changed = True

    def enforce(self, snap: Snapshot) -> DriftMetric:
        """Drift against ``snap``; re-apply what drifted; the drift that remains, for ``/metrics``."""
        self.changed = False
        if self.state is None:
            return ()
        now = self.clock()
        drifts = self._drift(snap, now)
        fixed: set[tuple[int | None, str]] = set()
        by_gpu: dict[int | None, list[Drift]] = {}
        for d in drifts:
            if d.drifted and d.current is not None and self._enforced(d):
                by_gpu.setdefault(d.gpu, []).append(d)
            elif d.measured and not d.drifted:
                self._matches_again(d)
        for gpu, drifted in by_gpu.items():
            if any(self._due(gpu, d.setting, now) for d in drifted):
                fixed |= self._reapply(gpu, drifted, now)
        return exported([replace(d, current=d.desired, status="ok") if d.drifted and (d.gpu, d.setting) in fixed
                         else d for d in drifts])

    def _drift(self, snap: Snapshot, now: float) -> list[Drift]:
        """``engine.drift`` of the GPUs against ``snap``, then the host's, read at most every ``HOST_EVERY_S``."""
        assert self.state is not None
        desired = self.state.desired
        drifts = engine.drift(self.machine, replace(self.state, desired={k: v for k, v in desired.items()
                                                                         if k != HOST.key}), snap, daemon=True)
        if HOST.key not in desired:
            return drifts
        if self._host is None or now - self._host[0] >= HOST_EVERY_S:
            host = engine.drift(self.machine, replace(self.state, desired={HOST.key: desired[HOST.key]}), snap,
                                daemon=True)
            self._host = (now, host)
        return drifts + self._host[1]

    @staticmethod
    def _enforced(d: Drift) -> bool:
        setting = setting_for(d.target, d.setting)
        return setting is not None and setting.enforced

    def _want(self, gpu: int | None) -> dict[str, Any]:
        assert self.state is not None
        return dict(self.state.desired.get(target_at(gpu).key, {}))

    def _due(self, gpu: int | None, key: str, now: float) -> bool:
        """Whether a re-apply of ``key`` may be tried now: not failing, asked another value, or its back-off over."""
        f = self.failing.get((gpu, key))
        return f is None or f.value != self._want(gpu).get(key) or now >= f.next_at

    def _matches_again(self, d: Drift) -> None:
        """A failing setting read as the profile asks (someone else put it back): its back-off ends."""
        f = self.failing.pop((d.gpu, d.setting), None)
        if f is not None:
            log.info("%s: %s matches profile %s again after %d failed re-apply(s)", d.target.where, d.setting,
                     self.state.profile if self.state else None, f.failures)

    def _failed(self, gpu: int | None, key: str, value: Any, now: float) -> bool:
        """Note a failed re-apply of ``key``; True when it is a new failure (not a retry of one)."""
        f = self.failing.get((gpu, key))
        if f is None or f.value != value:
            self.failing[(gpu, key)] = Failing(value, 1, BACKOFF_FIRST_S, now + BACKOFF_FIRST_S)
            return True
        f.failures += 1
        f.delay = min(f.delay * 2, BACKOFF_MAX_S)
        f.next_at = now + f.delay
        return False

    def _reapply(self, gpu: int | None, drifted: list[Drift], now: float) -> set[tuple[int | None, str]]:
        """Write the GPU's (or the host's) enforced settings again, those in back-off left out; the
        (gpu, setting) read back as asked. Logged and journalled when a drift or a failure is new,
        and when a failure clears; a retry that fails again is only counted."""
        assert self.state is not None
        names = [d.setting for d in drifted]
        target = target_at(gpu)
        where = target.where
        profile = self.state.profile
        want = self._want(gpu)
        before = {d.setting: self.failing.get((gpu, d.setting)) for d in drifted}
        new_drift = [k for k, f in before.items() if f is None or f.value != want.get(k)]
        if new_drift:
            log.warning("%s: %s drifted from profile %s: re-applying", where, ", ".join(names), profile)
        keys = [s.key for s in settings_of(target) if s.enforced]
        fixed: set[tuple[int | None, str]] = set()
        failed: set[str] = set()
        new_failed: set[str] = set()
        recovered: list[str] = []
        for key in keys:
            value = want.get(key)
            if value is None or value == UNSUPPORTED or not self._due(gpu, key, now):
                continue
            why = ""
            try:
                got = engine.write(self.machine, target, key, value)
                if not engine.read_back_ok(target, key, value, got):
                    why = f"read back {shown(key, got)}, wanted {shown(key, value)}"
            except GpudError as err:
                why = f"failed: {err}"
            if not why:
                fixed.add((gpu, key))
                was = self.failing.pop((gpu, key), None)
                if was is not None and was.value == value:
                    recovered.append(f"{key} re-applied after {was.failures} failure(s)")
                continue
            failed.add(key)
            if self._failed(gpu, key, value, now):
                new_failed.add(key)
                log.error("%s: re-applying %s %s (next try in %.0f s, backing off to %.0f s)", where, key, why,
                          BACKOFF_FIRST_S, BACKOFF_MAX_S)
            else:
                f = self.failing[(gpu, key)]
                log.debug("%s: re-applying %s %s again (%d in a row; next try in %.0f s)", where, key, why,
                          f.failures, f.delay)
        if isinstance(target, Host):
            self._host = None  # read the governors again on the next tick
        self.reapply_total += 1
        self.reapply_failures_total += len(failed)
        for line in recovered:
            log.info("%s: %s (profile %s)", where, line, profile)
        if self.record is not None:
            if new_failed:
                self.record("profile_drift", f"{where}: {', '.join(names)} drifted from profile {profile}: "
                            f"re-applying {', '.join(sorted(new_failed))} failed",
                            gpu=gpu, drifted=names, failed=sorted(new_failed))
            elif new_drift and not failed:
                self.record("profile_reapply", f"{where}: {', '.join(names)} drifted from profile {profile}: "
                            "re-applied" + "".join(f"; {line}" for line in recovered),
                            gpu=gpu, drifted=names, failed=[])
            elif recovered:
                self.record("profile_reapply", f"{where}: {'; '.join(recovered)} (profile {profile})",
                            gpu=gpu, drifted=names, failed=sorted(failed))
        return fixed


__all__ = ["BACKOFF_FIRST_S", "BACKOFF_MAX_S", "HOST_EVERY_S", "DriftMetric", "Enforcer", "Failing", "exported"]
