"""The daemon's tick: one snapshot → fan loop and enforcement (the daemon's, under its tuning lock) →
doctor/probe schedule → time accounting and health journal → what the next ``Observation`` is made of, swapped
whole (the observation itself is made when a scrape or ``/status`` asks for it, not on every tick).

Not every tick reads everything. A whole snapshot (about 16 NVML calls a GPU) is read every
``WHOLE_EVERY_S`` (and at most every ``WHOLE_EVERY_TICKS``-th tick at sub-second intervals); the ticks
between read what the fan loop steps on and the power figures (temperature and power: 2 calls; the fans'
speeds, the slowest plain reading, come with the whole ones) over the last whole one
(``Machine.snapshot(over=...)``). The applied profile is enforced on whole snapshots only: its settings
(limits, clocks, modes) are compared with values read that tick, never with held ones."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from gpud.daemon.recorder import Recorder
from gpud.daemon.schedule import Schedule
from gpud.daemon.status import TickTiming
from gpud.daemon.thermal import ThermalHistory
from gpud.doctor.health import Health, Tracker
from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.model import CheckResult, Snapshot, XidEvent
from gpud.observation import Counters, Observation
from gpud.observe import Drift, Running, observe
from gpud.probe import history
from gpud.probe.report import ProbeReport
from gpud.usage import Accounting

log = logging.getLogger("gpud.daemon")
XID_EVERY_S = 10.0
# A whole snapshot at least every 5 s: what Prometheus sees (every 15 s as shipped, the PodMonitor's
# interval; dcgm-exporter collects its fields every 30 s by default) is never more than 5 s older than the
# scrape, and the counters that sum time between readings (violations, energy, ECC) lose nothing by it.
WHOLE_EVERY_S = 5.0
WHOLE_EVERY_TICKS = 5  # and at sub-second ticks, every 5th: a quick tick's held readings stay recent

# The tick's hardware work: (snapshot, why there is none, whether the snapshot is whole) → drift. With no
# snapshot every fan goes to its failsafe; with one, the fan loop steps and, on a whole one, the applied
# profile is enforced.
Drive = Callable[[Snapshot | None, str, bool], Drift]


# A deadline this close is due now: a wait's timeout may end a little early, and waking again for the rest
# would be one more wake-up for nothing.
EARLY_S = 0.005


class Pace:
    """When the daemon's loop wakes and what it runs then: the tick every ``interval``, the profile rules' poll
    every ``poll`` seconds (None: nothing to poll for, no wake-up for it). Both run on the one loop, on one grid
    anchored at the tick: at the default 1 s ticks and 0.5 s polls, every other poll comes with a tick, two
    wake-ups a second where a thread for each took three. Each wake-up of an idle daemon runs cold and costs
    more than the work it does (docs/performance.md, "One loop for the tick and the rules' poll"). A round that
    overran starts the grid again from now (late rounds are skipped, not bunched)."""

    def __init__(self, now: float, interval: float) -> None:
        self.tick_at = now + interval
        self.poll_at = math.inf  # anchored at the first ``sleep_s`` that has a poll period

    def sleep_s(self, now: float, poll: float | None) -> float:
        """Seconds until the next round."""
        if poll is None:
            self.poll_at = math.inf
        elif self.poll_at == math.inf:  # on the tick's grid: the first poll time after now
            self.poll_at = self.tick_at - max(0, math.ceil(max(0.0, self.tick_at - now) / poll - 1e-9) - 1) * poll
        return max(0.0, min(self.tick_at, self.poll_at) - now)

    def due(self, now: float, interval: float, poll: float | None) -> tuple[bool, bool]:
        """(tick, poll): what this round runs; the next deadlines move on."""
        tick = now >= self.tick_at - EARLY_S
        polls = poll is not None and now >= self.poll_at - EARLY_S
        if tick:
            self.tick_at += interval
            if self.tick_at <= now:  # overran: a new grid from now, the poll anchored on it again
                self.tick_at, self.poll_at = now + interval, math.inf
        if polls and poll is not None and self.poll_at != math.inf:
            self.poll_at += poll
            if self.poll_at <= now:
                self.poll_at = math.inf
        return tick, polls


class TuningFacts(NamedTuple):
    """What the enforcement tells the tick: the profile it enforces and its counters."""

    profile: str | None
    counters: Counters
    profiles: tuple[tuple[int, str, str], ...] = ()  # (gpu, profile, rule): what each GPU follows


class KernelLog:
    """The kernel log's Xids, read every ``XID_EVERY_S``, not every tick; through the recorder, so the
    counts never go backwards when the ring buffer wraps."""

    def __init__(self, machine: Machine, recorder: Callable[[], Recorder]) -> None:
        self.machine = machine
        self._recorder = recorder
        self.xids: tuple[XidEvent, ...] = ()
        self.read_at = 0.0

    def read(self, now: float) -> tuple[XidEvent, ...]:
        if now - self.read_at >= XID_EVERY_S:
            self.read_at = now
            self.xids = self._recorder().xid_events(self.machine.host.xid_events())
        return self.xids


class LatestProbe:
    """The latest probe result, re-read only when the history file changed (the same object until
    then, so the renderer keeps the probe's families)."""

    def __init__(self) -> None:
        self.mtime = 0.0
        self.latest: ProbeReport | None = None

    def __call__(self) -> ProbeReport | None:
        try:
            mtime = history.path().stat().st_mtime
        except OSError:
            return None
        if mtime != self.mtime:
            self.mtime = mtime
            self.latest = history.latest()
        return self.latest


class Ticker:
    def __init__(self, machine: Machine, drive: Drive, tuning: Callable[[], TuningFacts], schedule: Schedule,
                 recorder: Callable[[], Recorder], interval_s: float,
                 whole_wanted: Callable[[], bool] = lambda: False) -> None:
        self.machine = machine
        self._whole_wanted = whole_wanted  # True: the next tick reads whole (a profile applied, switched, restored)
        self._whole_at: float | None = None
        self._since_whole = 0  # quick ticks since the last whole snapshot
        self._drive = drive
        self._tuning = tuning
        self.schedule = schedule
        self._recorder = recorder
        self.accounting = Accounting(max_gap_s=3 * interval_s)
        self.timing = TickTiming()
        self.kernel_log = KernelLog(machine, recorder)
        self.probe = LatestProbe()
        self.lost: set[int] = set()
        self.thermal = ThermalHistory()  # each GPU's recent cooling, for health.fans
        self.snapshot: Snapshot | None = None
        self.last_tick: float | None = None  # when the tick whose readings ``observation`` shows began
        self.health = Tracker()  # the health states, worked out again when their inputs change
        # The observation is made when it is asked for (a scrape, /status), from what the last tick left in
        # ``_made_of``, not on every tick: a scrape every 15 s, a tick every second. The lock covers what a
        # making copies and the tick changes: ``_made_of``, the tick timing's and the accounting's figures.
        self._lock = threading.Lock()
        self._made_of: tuple[Snapshot | None, tuple[CheckResult, ...], tuple[XidEvent, ...], TuningFacts, Drift,
                             tuple[Health, ...]] | None = None
        self._observation = Observation(snapshot=None)

    @property
    def observation(self) -> Observation:
        """The observation of the last tick, made now if that tick's is not made yet (on the asking thread)."""
        with self._lock:
            made_of, self._made_of = self._made_of, None
            if made_of is not None:
                snap, checks, xids, facts, drift, health = made_of
                self._observation = observe(
                    self.machine, None, snapshot=snap, checks=checks, xids=xids, tuning=(facts.profile, drift),
                    probe=self.probe, health=health,
                    running=Running(counters=facts.counters, tick=self.timing.copy(), last_tick=self.last_tick,
                                    usage=self.accounting.frozen()),
                    profiles=facts.profiles, previous=self._observation)
            return self._observation

    def __call__(self) -> None:
        t0 = time.perf_counter()
        now = time.time()
        whole = self._whole_due(now)
        try:
            snap = self.machine.snapshot(over=None if whole else self.snapshot)
        except GpudError as err:
            log.error("cannot read the GPUs: %s", err)
            snap = None
            self._whole_at = None  # the next reading is whole
            self._drive(None, f"no NVML reading: {err}", False)  # no temperature at all: no fan may stay manual
        recorder = self._recorder()
        if snap is not None:
            if whole:
                self._whole_at, self._since_whole = now, 0
            else:
                self._since_whole += 1
            self.snapshot = snap
            self._log_lost(snap)
            drift = self._drive(snap, "", whole)
            self.thermal.add(snap)
            self.schedule.step(snap, now, self.thermal.points)
            recorder.snapshot(snap, whole)
        else:
            drift = ()
        facts = self._tuning()
        recorder.fan_failsafes(facts.counters.fan_failsafe_total)
        took = time.perf_counter() - t0
        xids = self.kernel_log.read(now)
        checks = self.schedule.checks
        health = self.health.update(self.machine, self.schedule.config(), checks, self.snapshot, xids, now)
        with self._lock:  # what the next observation is made of, swapped whole
            if snap is not None:
                self.accounting.add(snap)
            self.timing.begin(now)
            self.timing.end(now, took)
            self._made_of = (self.snapshot, checks, xids, facts, drift, health)
            self.last_tick = now

    def _whole_due(self, now: float) -> bool:
        last = self.snapshot
        return (last is None or self._whole_at is None or now - self._whole_at >= WHOLE_EVERY_S
                or self._since_whole + 1 >= WHOLE_EVERY_TICKS or self._whole_wanted()
                or not self.machine.quick_over(last))

    def _log_lost(self, snap: Snapshot) -> None:
        """A lost GPU is logged when it is lost and when it is back, not on every tick."""
        lost = {s.index for s in snap.samples if s.lost}
        for gpu in sorted(lost - self.lost):
            log.error("GPU %d is lost (fell off the bus or needs a reset): `dmesg | grep -i xid`", gpu)
        for gpu in sorted(self.lost - lost):
            log.warning("GPU %d answers again", gpu)
        self.lost = lost
