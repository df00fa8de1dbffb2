"""One trial: apply a candidate setting through the tuning engine under the running workload, wait until
the clocks and the draw have settled, measure windows until the samples per second and the joules per
sample are known to the stated confidence (each window: the workload's step counter and NVML's energy
counters over the same interval), and stop at once (and undo the setting) when the hardware slows
itself down, an Xid appears or the workload fails."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpud.autotune.workload import RunTooShort, Unsafe, Workload, WorkloadFailed
from gpud.burnin.telemetry import HW_REASONS
from gpud.errors import GpudError
from gpud.hw.machine import Machine

Settings = dict[int, dict[str, Any]]  # per GPU index: profile keys (power_limit, gpu_clocks) → value


@dataclass(frozen=True)
class Measure:
    """How long each trial runs. Zeus profiles 10 warm-up and 40 measured iterations per power limit;
    gpud measures windows until the 95 % confidence interval of the samples per second is within
    ``ci_bound`` of the mean (at least ``min_windows``, at most ``max_windows``)."""

    warmup_s: float = 10.0  # a command's first run, not kept; the training job warms up by ``warm_max_s``
    window_s: float = 5.0
    min_windows: int = 3
    max_windows: int = 12
    ci_bound: float = 0.01
    # The 95 % interval of a mean of n windows takes Student's t with n - 1 degrees of freedom (4.30 for 3
    # windows), not the normal's 1.96, which claims a narrower interval than 3 windows give (Student 1908).
    confidence: float = 0.95
    # A fan-curve trial first soaks until the temperature settles: the hottest GPU moved less than NVML's
    # 1 °C resolution over ``settle_s`` (two time constants of a GPU's heatsink warm it to 86 % of its
    # rise; the simulator's is 30 s, docs/simulation.md), for at most ``soak_max_s`` (the burn-in's soak).
    settle_s: float = 60.0
    soak_max_s: float = 1800.0
    # Before the first baseline the training job warms the GPUs the same way (a cold GPU draws less and
    # clocks higher than it will a minute later, so a baseline taken cold flatters every trial after it),
    # for at most this long.
    warm_max_s: float = 600.0
    # After each change of settings, the draw and the SM clock settle before a window starts: GPU Boost
    # moves the clock within a few hundred ms, NVML's power reading averages over up to 1 s (Yang, Adamek,
    # Armour, SC24): settled when two one-second readings in a row agree within these shares, after at
    # least ``settle_min_s`` and at most ``settle_max_s``.
    settle_power: float = 0.02
    settle_clock: float = 0.01
    settle_min_s: float = 2.0
    settle_max_s: float = 30.0


class Applier(Protocol):
    """Writes a trial's settings (through the tuning engine: originals saved first) and puts every GPU
    back at the end (``gpud restore``'s engine)."""

    def apply(self, settings: Settings, label: str) -> None: ...

    def tick(self, now: float) -> None:
        """Called about once a second while the workload runs (a trial's fan curve is driven here when
        no daemon drives it)."""
        ...

    def restore(self) -> list[str]: ...


@dataclass
class Trial:
    number: int
    stage: str  # baseline | power | clocks | match | memclocks | fans | confirm
    settings: Settings
    # the baseline this trial is compared with (the latest before it; a baseline's is itself)
    ref: Trial | None = field(default=None, compare=False, repr=False)
    status: str = "ok"  # ok | throttled | xid | failed
    note: str = ""
    samples_per_second: float | None = None
    ci: float | None = None  # relative half-width of the 95 % CI
    ci_reached: bool = False
    joules_per_sample: float | None = None
    j_ci: float | None = None  # relative half-width of the 95 % CI of the joules per sample
    settle_s: float = 0.0  # how long the draw and the clock took to settle after the change
    power_w: float | None = None  # mean draw of the GPUs tuned, all together
    sm_mhz: dict[int, float] = field(default_factory=dict)  # mean per GPU
    temperature_c: dict[int, float] = field(default_factory=dict)  # highest per GPU
    fan_percent: dict[int, float] = field(default_factory=dict)  # mean per GPU
    waiting: dict[int, float] = field(default_factory=dict)  # mean share of a step each GPU's rank waits
    reasons: list[str] = field(default_factory=list)  # every clock-event reason seen
    windows: int = 0
    soak_s: float = 0.0  # a fan trial's soak before its windows (the temperature settled)
    settled: bool | None = None  # whether the soak saw the temperature settle (None: no soak)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.samples_per_second is not None and self.joules_per_sample is not None

    def json(self) -> dict[str, Any]:
        return {"number": self.number, "stage": self.stage,
                "settings": {str(g): s for g, s in sorted(self.settings.items())}, "status": self.status,
                "note": self.note, "samples_per_second": _r(self.samples_per_second, 3),
                "ci_percent": None if self.ci is None or math.isinf(self.ci) else round(self.ci * 100, 3),
                "ci_reached": self.ci_reached, "joules_per_sample": _r(self.joules_per_sample, 4),
                "joules_ci_percent": None if self.j_ci is None or math.isinf(self.j_ci) else round(self.j_ci * 100, 3),
                "baseline_trial": None if self.ref is None else self.ref.number,
                "settle_seconds": round(self.settle_s, 1),
                "power_watts": _r(self.power_w, 1), "windows": self.windows,
                "sm_mhz": {str(g): round(v) for g, v in sorted(self.sm_mhz.items())},
                "temperature_c": {str(g): round(v, 1) for g, v in sorted(self.temperature_c.items())},
                "fan_percent": {str(g): round(v, 1) for g, v in sorted(self.fan_percent.items())},
                "waiting_percent": {str(g): round(v * 100, 1) for g, v in sorted(self.waiting.items())},
                "reasons": sorted(self.reasons), "soak_seconds": round(self.soak_s, 1), "settled": self.settled}


def _r(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


# Student's t, two-sided 95 % (the 0.975 quantile), for 1..30 degrees of freedom (any table of it); beyond
# 30 the normal's 1.96 is within 4 % of it.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_quantile(df: int, confidence: float = 0.95) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``df`` degrees of freedom (95 % only)."""
    if abs(confidence - 0.95) > 1e-9:
        raise ValueError("only the 95 % interval is tabulated")
    return T_975[df - 1] if 1 <= df <= len(T_975) else 1.96


def relative_ci(values: list[float], confidence: float = 0.95) -> float:
    """Half-width of the ``confidence`` interval of the mean (Student's t: the windows' spread is estimated
    from the windows themselves), relative to the mean (inf for < 2 values)."""
    if len(values) < 2:
        return math.inf
    mean = statistics.fmean(values)
    t = t_quantile(len(values) - 1, confidence)
    return t * statistics.stdev(values) / math.sqrt(len(values)) / mean if mean else math.inf


def _energy(machine: Machine, gpus: list[int]) -> float | None:
    """The GPUs' energy counters together, J (NVML's total energy, Volta and later); None if one has none."""
    total = 0.0
    for g in gpus:  # one call per GPU (``sample`` reads a hundred): mJ since the driver loaded
        mj = machine.nvml.get("nvmlDeviceGetTotalEnergyConsumption", machine.nvml.handle(g), gpu=g)
        if mj is None:
            return None
        total += float(mj) / 1000.0
    return total


def _xids(machine: Machine) -> int | None:
    try:
        events = machine.host.xid_events()
    except OSError:
        return None
    return None if events is None else len(events)


def _hottest(machine: Machine, gpus: list[int], reasons: set[str]) -> float | None:
    """The hottest GPU's temperature now (the clock-event reasons seen are added to ``reasons``)."""
    temps = []
    for g in gpus:
        s = machine.nvml.telemetry(g)
        reasons |= set(s.clock_events or ())
        if s.temperature_celsius is not None:
            temps.append(float(s.temperature_celsius))
    return max(temps) if temps else None


class Guard:
    """The safety of a trial, checked once a second while the workload runs (``Workload.guard``): the
    hardware's own slowdowns (HW slowdown from the clock-event reasons, HW thermal slowdown and power brake
    also from NVML's violation counters, which count the time in them since the driver loaded, so one
    between two readings is seen) and new Xids in the kernel log. ``Unsafe`` stops the window at once."""

    def __init__(self, machine: Machine, gpus: list[int], reasons: set[str]) -> None:
        self.machine, self.gpus, self.reasons = machine, gpus, reasons
        self.xids0 = _xids(machine)
        self.violations0 = {g: self._violations(g) for g in gpus}
        self.why = ""
        self.kind = ""

    def _violations(self, g: int) -> dict[str, int]:
        try:
            return self.machine.nvml.violations(g) or {}
        except GpudError:
            return {}

    def __call__(self, now: float) -> None:
        self.check()

    def check(self) -> None:
        if self.why:
            raise Unsafe(self.why)
        hw: set[str] = set()
        for g in self.gpus:
            try:
                mask = self.machine.nvml.telemetry(g).clock_events or ()
            except GpudError:
                mask = ()
            self.reasons |= set(mask)
            hw |= set(mask) & set(HW_REASONS)
            now = self._violations(g)
            hw |= {r for r in HW_REASONS if now.get(r, 0) > self.violations0[g].get(r, 0)}
        if hw:
            self.reasons |= hw
            self.kind, self.why = "throttled", f"the hardware slowed itself down ({', '.join(sorted(hw))})"
            raise Unsafe(self.why)
        xids = _xids(self.machine)
        if self.xids0 is not None and xids is not None and xids > self.xids0:
            self.kind, self.why = "xid", f"{xids - self.xids0} new Xid event(s) in the kernel log during the trial"
            raise Unsafe(self.why)


def soak(machine: Machine, workload: Workload, gpus: list[int], measure: Measure, reasons: set[str],
         max_s: float | None = None) -> tuple[float, bool]:
    """Run the load until the hottest GPU's temperature settles (``Measure.settle_s``), the hardware
    slows itself down, or ``max_s`` (``soak_max_s``) passes: (seconds soaked, settled)."""
    start = workload.now()
    limit = measure.soak_max_s if max_s is None else max_s
    history: list[tuple[float, float]] = []  # (time, hottest temperature)
    while workload.now() - start < limit:
        if hasattr(workload, "counter"):
            workload.wait(measure.window_s)
        else:
            workload.window(measure.window_s)  # a command: its runs are the load
        hot = _hottest(machine, gpus, reasons)
        now = workload.now()
        if hot is None or reasons & set(HW_REASONS):
            return now - start, False
        history.append((now, hot))
        past = [temp for when, temp in history if when <= now - measure.settle_s]
        if past and abs(hot - past[-1]) < 1.0:
            return now - start, True
    return workload.now() - start, False


def settle(machine: Machine, workload: Workload, gpus: list[int], measure: Measure) -> float:
    """Wait until the GPUs' draw and SM clocks have settled after a change: two one-second readings in a
    row within ``settle_power`` (the draw, all GPUs together) and ``settle_clock`` (each GPU's SM clock),
    after at least ``settle_min_s``, at most ``settle_max_s``. The seconds waited."""
    start = workload.now()
    prev: tuple[float, dict[int, float]] | None = None
    calm = 0
    while workload.now() - start < measure.settle_max_s:
        workload.wait(1.0)
        power, clocks = 0.0, {}
        for g in gpus:
            s = machine.nvml.telemetry(g)
            power += s.power_watts or 0.0
            clocks[g] = float(s.clocks_mhz.get("sm") or 0.0)
        if prev is not None:
            p0, c0 = prev
            same = abs(power - p0) <= measure.settle_power * max(p0, 1e-9) and all(
                abs(clocks[g] - c0.get(g, 0.0)) <= measure.settle_clock * max(c0.get(g, 0.0), 1e-9) for g in gpus)
            calm = calm + 1 if same else 0
        prev = (power, clocks)
        if calm >= 2 and workload.now() - start >= measure.settle_min_s:
            break
    return workload.now() - start


# A locked SM clock has no getter in NVML: the clock the GPU runs at under load is the evidence that the
# lock holds. GPU Boost steps in bins of 15 MHz (docs/simulation.md); a clock more than one bin above the
# lock means it was not applied (below it is fine: a power cap or a thermal limit may hold it lower).
LOCK_SLACK_MHZ = 15


def locks_unheld(machine: Machine, settings: Settings) -> str:
    """Why a trial's locked SM clocks did not hold under load ('' when they did, or none was locked)."""
    for g, s in sorted(settings.items()):
        lock = s.get("gpu_clocks")
        if not isinstance(lock, list) or len(lock) != 2:
            continue
        sm = machine.nvml.telemetry(g).clocks_mhz.get("sm")
        if sm is not None and sm > int(lock[1]) + LOCK_SLACK_MHZ:
            return (f"GPU {g}: the SM clock under load is {sm} MHz, above the {lock[1]} MHz locked: NVML cannot "
                    "read a lock back, and this clock says it did not hold")
    return ""


def run_trial(machine: Machine, workload: Workload, applier: Applier, gpus: list[int], number: int, stage: str,
              settings: Settings, measure: Measure, say: Callable[[str], None] | None = None,
              soaked: bool = False, ref: Trial | None = None, warm: bool = False) -> Trial:
    """Apply ``settings`` (none for a baseline: the GPUs as they were) under the running workload, let the
    draw and the clocks settle, measure, judge. Each window's figures are the workload's samples over the
    window (its step counter) and the GPUs' energy over the same interval (NVML's counters, read at its
    edges): samples per second, and joules per sample as the mean draw over the samples per second. A
    trial that throttles in hardware, raises an Xid or fails is stopped at once (``Guard``, every second)
    and its setting undone (``Applier.restore``). ``soaked``: a soak until the temperature settles first (a
    fan curve's trial); ``warm``: the same before the first baseline (at most ``warm_max_s``); ``ref``: the
    baseline the trial is compared with."""
    t = Trial(number, stage, settings, ref=ref)
    if settings:
        try:
            applier.apply(settings, f"trial {number}")
        except GpudError as err:
            t.status, t.note = "failed", f"could not apply: {err}"
            applier.restore()
            return t
    rates: list[float] = []
    jps: list[float] = []
    clocks: dict[int, list[float]] = {g: [] for g in gpus}
    temps: dict[int, list[float]] = {g: [] for g in gpus}
    fans: dict[int, list[float]] = {g: [] for g in gpus}
    waits: dict[int, list[float]] = {g: [] for g in gpus}
    reasons: set[str] = set()
    guard = Guard(machine, gpus, reasons)
    samples = seconds = joules = energy_s = 0.0
    had_guard = getattr(workload, "guard", None)
    workload.guard = guard
    try:
        if soaked:
            t.soak_s, t.settled = soak(machine, workload, gpus, measure, reasons)
        elif warm and hasattr(workload, "counter"):
            t.soak_s, t.settled = soak(machine, workload, gpus, measure, reasons, measure.warm_max_s)
        elif measure.warmup_s and not hasattr(workload, "counter"):
            workload.window(measure.warmup_s)  # a command's first run: its figures are not kept
        if hasattr(workload, "counter"):
            t.settle_s = settle(machine, workload, gpus, measure)
        guard.check()
        unheld = locks_unheld(machine, settings)
        if unheld:
            raise WorkloadFailed(unheld)
        while len(rates) < measure.max_windows:
            e0, t0 = _energy(machine, gpus), workload.now()
            n, took = workload.window(measure.window_s)
            e1, t1 = _energy(machine, gpus), workload.now()
            guard.check()  # a command's run is checked when it ends
            if n <= 0 or took <= 0:
                raise WorkloadFailed(f"{workload.name}: no {workload.unit} in a window")
            samples += n
            seconds += took
            rates.append(n / took)
            if e0 is not None and e1 is not None and e1 <= e0 and not hasattr(workload, "counter"):
                raise RunTooShort(f"{workload.name}: NVML's energy counters did not move over a run of {took:.2f} s "
                                  "(shorter than their update): it cannot be measured")
            if e0 is not None and e1 is not None and t1 > t0:
                watts = (e1 - e0) / (t1 - t0)
                joules += e1 - e0
                energy_s += t1 - t0
                jps.append(watts * took / n)
            waiting = getattr(workload, "waiting", None)
            for g, w in (waiting() if waiting is not None else {}).items():
                waits.setdefault(g, []).append(w)
            for g in gpus:
                s = machine.nvml.telemetry(g)
                reasons |= set(s.clock_events or ())
                sm = s.clocks_mhz.get("sm")
                if sm is not None:
                    clocks[g].append(float(sm))
                if s.temperature_celsius is not None:
                    temps[g].append(float(s.temperature_celsius))
                duty = [f.speed_percent for f in s.fans if f.speed_percent is not None]
                if duty:
                    fans[g].append(statistics.fmean(duty))
            if len(rates) >= measure.min_windows and relative_ci(rates, measure.confidence) <= measure.ci_bound and (
                    len(jps) < len(rates) or relative_ci(jps, measure.confidence) <= measure.ci_bound):
                break
    except Unsafe:
        t.status, t.note = guard.kind or "throttled", guard.why
    except RunTooShort:
        raise
    except WorkloadFailed as err:
        t.status, t.note = "failed", str(err)
    finally:
        workload.guard = had_guard
    hw = sorted(reasons & set(HW_REASONS))
    if hw and t.status == "ok":
        t.status, t.note = "throttled", f"the hardware slowed itself down ({', '.join(hw)})"
    t.windows = len(rates)
    t.reasons = sorted(reasons)
    t.sm_mhz = {g: statistics.fmean(v) for g, v in clocks.items() if v}
    t.temperature_c = {g: max(v) for g, v in temps.items() if v}
    t.fan_percent = {g: statistics.fmean(v) for g, v in fans.items() if v}
    t.waiting = {g: statistics.fmean(v) for g, v in waits.items() if v}
    if rates and t.status == "ok":
        t.samples_per_second = samples / seconds if seconds > 0 else None
        t.ci = relative_ci(rates, measure.confidence)
        t.ci_reached = t.ci <= measure.ci_bound
    if jps and len(jps) == len(rates) and t.status == "ok" and samples > 0 and energy_s > 0:
        t.power_w = joules / energy_s
        t.joules_per_sample = t.power_w * seconds / samples
        t.j_ci = relative_ci(jps, measure.confidence)
    if t.status != "ok" and settings:
        applier.restore()  # stop and roll back: the GPUs are put back before anything else runs
    if say is not None:
        say(f"trial {number} ({stage}): {t.status}")
    return t
