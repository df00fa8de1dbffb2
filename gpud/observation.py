"""One observation of the machine, as the daemon replaces it each tick and the exporter and ``/status``
read it: the data alone (``gpud.observe`` takes one, ``gpud.exporter`` renders it), so a command that shows
a machine's state needs neither the Prometheus client nor the checks to name its parts."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from gpud.doctor.health import Health
from gpud.model import CheckResult, Snapshot, XidEvent
from gpud.probe.report import ProbeReport
from gpud.usage import Usage

TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class TickStats:
    """Tick durations as a cumulative histogram (the daemon adds one per tick)."""

    counts: list[int] = field(default_factory=lambda: [0] * len(TICK_BUCKETS))
    total: int = 0
    sum: float = 0.0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(TICK_BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
        self.total += 1
        self.sum += seconds


@dataclass(frozen=True)
class Counters:
    """What a running daemon counts (all 0 for a one-shot ``gpud metrics``), passed whole from the
    daemon to the observation and ``/status``."""

    reapply_total: int = 0  # re-applies after drift, a reboot or a driver reload, plus start-up writes
    reapply_failures_total: int = 0  # the daemon's re-applies that failed
    fan_failsafe_total: int = 0  # fans handed back to the driver by the failsafe


_versions = itertools.count(1)


@dataclass(frozen=True)
class Observation:
    """Everything one scrape exposes; replaced whole, never mutated.

    ``version`` names what the slow families show: two observations with the same version show the
    same slow families (``following`` keeps the previous one's when their inputs did not change), so
    the ``Renderer`` formats them again only when it changes. Every other observation gets a new one."""

    snapshot: Snapshot | None
    xids: tuple[XidEvent, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    profile: str | None = None
    drift: tuple[tuple[int | None, str, bool], ...] = ()  # (gpu, setting, differs from the profile now)
    counters: Counters = Counters()
    probe: ProbeReport | None = None
    nvml_errors: dict[str, int] = field(default_factory=dict)
    tick: TickStats | None = None
    last_tick: float | None = None
    usage: Usage | None = None  # the daemon's time accounting (None for a one-shot `gpud metrics`)
    burnin: Mapping[str, Any] | None = None  # the last `gpud burnin` document (docs/json.md), or None
    health: tuple[Health, ...] = ()  # gpud.doctor.health: per GPU and component
    # (gpu, profile, rule) of each GPU with a profile: the rule that switched it, "" for the base profile
    profiles: tuple[tuple[int, str, str], ...] = ()
    version: int = field(default_factory=lambda: next(_versions), compare=False)

    def slow_inputs(self) -> tuple[Any, ...]:
        """What the slow families read: static facts and versions, which GPUs answer, checks, Xids,
        probe, profile and the GPUs' profiles, burn-in, health."""
        return self._slow_inputs

    @cached_property
    def _slow_inputs(self) -> tuple[Any, ...]:  # worked out once: the next tick compares with it again
        snap = self.snapshot
        gpus = (snap.gpus, snap.versions, tuple((s.index, s.uuid, s.lost) for s in snap.samples)) if snap else None
        return (gpus, self.checks, self.xids, self.probe, self.profile, self.profiles, self.burnin, self.health)

    def following(self, previous: Observation | None) -> Observation:
        """This observation with ``previous``'s version if its slow families read the same inputs."""
        if previous is None or previous.slow_inputs() != self.slow_inputs():
            return self
        return replace(self, version=previous.version)
