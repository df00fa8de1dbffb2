"""Time accounting across the daemon's ticks: GPU-seconds per user, and seconds in each clock-event
reason per GPU (the counters behind ``gpud_user_gpu_seconds_total`` and
``gpud_gpu_clock_event_seconds_total``). Pure: fed one snapshot per tick.

A reason whose time NVML counts itself (its violation counters, ``GpuSample.clock_event_nanoseconds``)
follows NVML's figure: the first reading is the total since the driver loaded, later ones add their
difference, and a counter that went down (the driver reloaded, the GPU was reset) adds what it shows since.
Other reasons are counted per tick from the clock-event mask. ``source`` says which, per series.

Cardinality is bounded: at most ``max_users`` (16) users have a label of their own, the others are
counted as ``other``; a process whose owner cannot be read is ``unknown``. The named users are those
with the most *recent* GPU time: each user's GPU-seconds decayed exponentially (time constant
``recent_s``, an hour), so a user busy now takes the name of one idle for long, and 17 transient uids
(a rootless container's subuids, a burst of short jobs) cannot hold every name for the daemon's life.
A free name goes to the first user seen; when all are taken, a user whose recent GPU time exceeds the
least recent named user's by ``margin_s`` (a minute of one GPU) takes that name, so two users of equal
use do not swap names every tick.

The counters stay counters (``gpud_user_gpu_seconds_total``): a user's series is exported while the user
is named and grows only; from the tick it loses its name its time goes to ``other`` and its series is
no longer exported (Prometheus marks it stale). Its total is kept (the last ``4 × max_users`` such
users), and should the user be named again its series continues from that total, never below a value
already scraped; a user forgotten by then starts at 0 again, which Prometheus' ``rate`` and
``increase`` read as a counter reset. ``other`` and ``unknown`` only grow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpud.model import CLOCK_EVENT_REASONS, GpuSample, Snapshot

MAX_USERS = 16
OTHER, UNKNOWN = "other", "unknown"
RECENT_S = 3600.0  # time constant of the decayed GPU time the named users are chosen by
MARGIN_S = 60.0  # GPU-seconds a user must lead the least recent named user by to take its name
# Clock-event reasons that mean the GPU is held below the clocks it was asked for.
THROTTLE_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                              "hw_power_brake_slowdown"})


def user_label(user: str | None, named: list[str] | tuple[str, ...], max_users: int = MAX_USERS) -> str:
    """The label a user is counted under, given the users named now (a free name: the user's own)."""
    if user is None:
        return UNKNOWN
    if user in named or len(named) < max_users:
        return user
    return OTHER


@dataclass
class Accounting:
    max_users: int = MAX_USERS
    max_gap_s: float = 10.0  # a longer gap between ticks (a stalled loop) counts only this much
    recent_s: float = RECENT_S
    margin_s: float = MARGIN_S
    named: list[str] = field(default_factory=list)  # users with a label of their own now
    user_seconds: dict[str, float] = field(default_factory=dict)  # the exported: named users, other, unknown
    recent: dict[str, float] = field(default_factory=dict)  # user → decayed GPU-seconds (named and not)
    retired: dict[str, float] = field(default_factory=dict)  # a user who lost its name → its counter then
    event_seconds: dict[tuple[int, str, str], float] = field(default_factory=dict)  # (gpu, uuid, reason)
    throttled_seconds: dict[tuple[int, str], float] = field(default_factory=dict)  # (gpu, uuid): any reason
    watched_seconds: dict[tuple[int, str], float] = field(default_factory=dict)  # (gpu, uuid): clock events read
    event_source: dict[tuple[int, str, str], str] = field(default_factory=dict)  # "nvml" or "tick"
    _nvml_ns: dict[tuple[int, str, str], int] = field(default_factory=dict)  # NVML's last counter reading
    _last: float | None = None
    # per GPU: (uuid, NVML's counters, clock events) last counted, and the per-tick keys active in them. A quick
    # tick holds the whole snapshot's objects (gpud.daemon.tick): the same objects count the same way again.
    _held: dict[int, tuple[str, object, object, tuple[tuple[int, str, str], ...]]] = field(default_factory=dict)

    def label(self, user: str | None) -> str:
        got = user_label(user, self.named, self.max_users)
        if got not in (OTHER, UNKNOWN) and got not in self.named:
            self._name(got)
        return got

    def _name(self, user: str) -> None:
        self.named.append(user)
        self.user_seconds[user] = self.retired.pop(user, self.user_seconds.get(user, 0.0))

    def _unname(self, user: str) -> None:
        self.named.remove(user)
        self.retired.pop(user, None)
        self.retired[user] = self.user_seconds.pop(user, 0.0)
        while len(self.retired) > 4 * self.max_users:
            del self.retired[next(iter(self.retired))]

    def _recent(self, dt: float, occupied: list[list[str]]) -> None:
        """Decay every user's recent GPU time by ``dt`` and add this tick's; then let the users most
        recently busy take the names (the module's docstring)."""
        decay = math.exp(-dt / self.recent_s) if self.recent_s > 0 else 0.0
        for user in self.recent:
            self.recent[user] *= decay
        present: dict[str, None] = {}
        for users in occupied:
            for user in users:
                self.recent[user] = self.recent.get(user, 0.0) + dt
                present[user] = None
        for user in sorted((u for u in present if u not in self.named), key=lambda u: -self.recent[u]):
            if len(self.named) < self.max_users:
                self._name(user)
                continue
            least = min(self.named, key=lambda u: self.recent.get(u, 0.0))
            if self.recent[user] <= self.recent.get(least, 0.0) + self.margin_s:
                break  # the others present have less
            self._unname(least)
            self._name(user)
        keep = 4 * self.max_users  # users neither named nor recently busy are forgotten
        if len(self.recent) > self.max_users + keep:
            others = sorted((u for u in self.recent if u not in self.named), key=lambda u: self.recent[u])
            for user in others[:len(self.recent) - self.max_users - keep]:
                del self.recent[user]

    def add(self, snap: Snapshot) -> None:
        """Count the time since the previous snapshot for what this one shows."""
        now = snap.timestamp
        dt = 0.0 if self._last is None else min(max(0.0, now - self._last), self.max_gap_s)
        self._last = now
        occupied: list[list[str | None]] = []  # each GPU's users, in the order NVML lists their processes
        for s in snap.samples:
            if s.lost:
                continue
            held = self._held.get(s.index)
            if (held is not None and held[0] == s.uuid and held[1] is s.clock_event_nanoseconds
                    and held[2] is s.clock_events and s.clock_events is not None):
                # The objects counted last time (a quick tick's held readings): NVML's counters add nothing, the
                # sources stand, and the per-tick reasons active then are active now.
                key = (s.index, s.uuid)
                self.watched_seconds[key] += dt
                if THROTTLE_REASONS.intersection(s.clock_events):
                    self.throttled_seconds[key] += dt
                for k in held[3]:
                    self.event_seconds[k] += dt
            else:
                self._count(s, dt)
            occupied.append(list(dict.fromkeys(p.user for p in s.processes or ())))
        self._recent(dt, [[u for u in users if u is not None and u not in (OTHER, UNKNOWN)] for users in occupied])
        for users in occupied:
            for label in {self.label(u) for u in users}:  # a GPU occupied by a user: 1 GPU-second/s
                self.user_seconds[label] = self.user_seconds.get(label, 0.0) + dt

    def _count(self, s: GpuSample, dt: float) -> None:
        """One GPU's clock-event time: NVML's counters where it has them, else per tick."""
        nvml = s.clock_event_nanoseconds or {}
        for reason, ns in nvml.items():
            self._count_nvml((s.index, s.uuid, reason), ns)
        self._held.pop(s.index, None)
        if s.clock_events is None:
            return
        key = (s.index, s.uuid)
        self.throttled_seconds.setdefault(key, 0.0)
        self.watched_seconds[key] = self.watched_seconds.get(key, 0.0) + dt
        if THROTTLE_REASONS & set(s.clock_events):
            self.throttled_seconds[key] += dt
        active = []
        for _, reason in CLOCK_EVENT_REASONS:
            k = (s.index, s.uuid, reason)
            if reason in nvml:
                continue
            if self._nvml_ns.pop(k, None) is not None or k not in self.event_source:  # NVML stopped
                self.event_source[k] = "tick"  # answering: counted per tick again, from where it was
            on = reason in s.clock_events
            self.event_seconds[k] = self.event_seconds.get(k, 0.0) + (dt if on else 0.0)
            if on:
                active.append(k)
        self._held[s.index] = (s.uuid, s.clock_event_nanoseconds, s.clock_events, tuple(active))

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
