"""Time accounting across the daemon's ticks: GPU-seconds per user, and seconds in each clock-event
reason per GPU (the counters behind ``gpud_user_gpu_seconds_total`` and
``gpud_gpu_clock_event_seconds_total``). Pure: fed one snapshot per tick.

A reason whose time NVML counts itself (its violation counters, ``GpuSample.clock_event_nanoseconds``)
follows NVML's figure: the first reading is the total since the driver loaded, later ones add their
difference, and a counter that went down (the driver reloaded, the GPU was reset) adds what it shows since.
Other reasons are counted per tick from the clock-event mask. ``source`` says which, per series.

Cardinality is bounded: the first ``max_users`` distinct users keep their name (so a counter never
changes its label), later ones are counted as ``other``; a process whose owner cannot be read is
``unknown``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpud.model import CLOCK_EVENT_REASONS, Snapshot

MAX_USERS = 16
OTHER, UNKNOWN = "other", "unknown"
# Clock-event reasons that mean the GPU is held below the clocks it was asked for.
THROTTLE_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                              "hw_power_brake_slowdown"})


def user_label(user: str | None, named: list[str] | tuple[str, ...], max_users: int = MAX_USERS) -> str:
    """The label a user is counted under, given the users already named (first come, first named)."""
    if user is None:
        return UNKNOWN
    if user in named or len(named) < max_users:
        return user
    return OTHER


@dataclass
class Accounting:
    max_users: int = MAX_USERS
    max_gap_s: float = 10.0  # a longer gap between ticks (a stalled loop) counts only this much
    named: list[str] = field(default_factory=list)  # users with a label of their own, in order seen
    user_seconds: dict[str, float] = field(default_factory=dict)
    event_seconds: dict[tuple[int, str, str], float] = field(default_factory=dict)  # (gpu, uuid, reason)
    throttled_seconds: dict[tuple[int, str], float] = field(default_factory=dict)  # (gpu, uuid): any reason
    watched_seconds: dict[tuple[int, str], float] = field(default_factory=dict)  # (gpu, uuid): clock events read
    event_source: dict[tuple[int, str, str], str] = field(default_factory=dict)  # "nvml" or "tick"
    _nvml_ns: dict[tuple[int, str, str], int] = field(default_factory=dict)  # NVML's last counter reading
    _last: float | None = None

    def label(self, user: str | None) -> str:
        got = user_label(user, self.named, self.max_users)
        if got not in (OTHER, UNKNOWN) and got not in self.named:
            self.named.append(got)
        return got

    def add(self, snap: Snapshot) -> None:
        """Count the time since the previous snapshot for what this one shows."""
        now = snap.timestamp
        dt = 0.0 if self._last is None else min(max(0.0, now - self._last), self.max_gap_s)
        self._last = now
        for s in snap.samples:
            if s.lost:
                continue
            nvml = s.clock_event_nanoseconds or {}
            for reason, ns in nvml.items():
                self._count_nvml((s.index, s.uuid, reason), ns)
            if s.clock_events is not None:
                key = (s.index, s.uuid)
                self.throttled_seconds.setdefault(key, 0.0)
                self.watched_seconds[key] = self.watched_seconds.get(key, 0.0) + dt
                if THROTTLE_REASONS & set(s.clock_events):
                    self.throttled_seconds[key] += dt
                for _, reason in CLOCK_EVENT_REASONS:
                    k = (s.index, s.uuid, reason)
                    if reason in nvml:
                        continue
                    if self._nvml_ns.pop(k, None) is not None or k not in self.event_source:  # NVML stopped
                        self.event_source[k] = "tick"  # answering: counted per tick again, from where it was
                    self.event_seconds[k] = self.event_seconds.get(k, 0.0) + (dt if reason in s.clock_events else 0.0)
            for user in {self.label(p.user) for p in s.processes or ()}:  # a GPU occupied by a user: 1 GPU-second/s
                self.user_seconds[user] = self.user_seconds.get(user, 0.0) + dt

    def _count_nvml(self, key: tuple[int, str, str], ns: int) -> None:
        last = self._nvml_ns.get(key)
        if last is None:  # NVML's total, unless this series was counted per tick until now
            delta = 0 if key in self.event_seconds else ns
        elif ns >= last:
            delta = ns - last
        else:  # the counter started again (driver reload, GPU reset): what it shows is new time
            delta = ns
        self._nvml_ns[key] = ns
        self.event_source[key] = "nvml"
        self.event_seconds[key] = self.event_seconds.get(key, 0.0) + delta / 1e9

    def frozen(self) -> Usage:
        return Usage(tuple(self.named), dict(self.user_seconds), dict(self.event_seconds),
                     dict(self.throttled_seconds), dict(self.watched_seconds), dict(self.event_source))


@dataclass(frozen=True)
class Usage:
    """A copy for one observation (the daemon's accounting goes on changing)."""

    named: tuple[str, ...]
    user_seconds: dict[str, float]
    event_seconds: dict[tuple[int, str, str], float]
    throttled_seconds: dict[tuple[int, str], float]
    watched_seconds: dict[tuple[int, str], float]
    event_source: dict[tuple[int, str, str], str] = field(default_factory=dict)  # "nvml" or "tick"
