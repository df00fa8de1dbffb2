"""One trial: apply a candidate setting through the tuning engine, warm up, measure windows until the
samples per second are known to the stated confidence, read the energy counters, and stop early
(and undo the setting) when the hardware throttles itself, an Xid appears or the workload fails."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpud.burnin.telemetry import HW_REASONS
from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.tune.workload import Workload, WorkloadFailed

Settings = dict[int, dict[str, Any]]  # per GPU index: profile keys (power_limit, gpu_clocks) → value


@dataclass(frozen=True)
class Measure:
    """How long each trial runs. Zeus profiles 10 warm-up and 40 measured iterations per power limit;
    gpud measures windows until the 95 % confidence interval of the samples per second is within
    ``ci_bound`` of the mean (at least ``min_windows``, at most ``max_windows``)."""

    warmup_s: float = 10.0
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
    stage: str  # baseline | power | clocks | match
    settings: Settings
    status: str = "ok"  # ok | throttled | xid | failed
    note: str = ""
    samples_per_second: float | None = None
    ci: float | None = None  # relative half-width of the 95 % CI
    ci_reached: bool = False
    joules_per_sample: float | None = None
    power_w: float | None = None  # mean draw of the GPUs tuned, all together
    sm_mhz: dict[int, float] = field(default_factory=dict)  # mean per GPU
    temperature_c: dict[int, float] = field(default_factory=dict)  # highest per GPU
    fan_percent: dict[int, float] = field(default_factory=dict)  # mean per GPU
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
                "power_watts": _r(self.power_w, 1), "windows": self.windows,
                "sm_mhz": {str(g): round(v) for g, v in sorted(self.sm_mhz.items())},
                "temperature_c": {str(g): round(v, 1) for g, v in sorted(self.temperature_c.items())},
                "fan_percent": {str(g): round(v, 1) for g, v in sorted(self.fan_percent.items())},
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


def soak(machine: Machine, workload: Workload, gpus: list[int], measure: Measure, reasons: set[str]) -> tuple[
        float, bool]:
    """Run the load until the hottest GPU's temperature settles (``Measure.settle_s``), the hardware
    slows itself down, or ``soak_max_s`` passes: (seconds soaked, settled)."""
    start = workload.now()
    history: list[tuple[float, float]] = []  # (time, hottest temperature)
    while workload.now() - start < measure.soak_max_s:
        workload.window(measure.window_s)
        hot = _hottest(machine, gpus, reasons)
        now = workload.now()
        if hot is None or reasons & set(HW_REASONS):
            return now - start, False
        history.append((now, hot))
        past = [temp for when, temp in history if when <= now - measure.settle_s]
        if past and abs(hot - past[-1]) < 1.0:
            return now - start, True
    return workload.now() - start, False


def run_trial(machine: Machine, workload: Workload, applier: Applier, gpus: list[int], number: int, stage: str,
              settings: Settings, measure: Measure, say: Callable[[str], None] | None = None,
              soaked: bool = False) -> Trial:
    """Apply ``settings`` (none for the baseline), measure, judge. A trial that throttles in hardware,
    raises an Xid or fails is stopped and its setting undone at once (``Applier.restore``). ``soaked``:
    the warm-up is a soak until the temperature settles (a fan curve's trial)."""
    t = Trial(number, stage, settings)
    if settings:
        try:
            applier.apply(settings, f"trial {number}")
        except GpudError as err:
            t.status, t.note = "failed", f"could not apply: {err}"
            applier.restore()
            return t
    xids0 = _xids(machine)
    rates: list[float] = []
    clocks: dict[int, list[float]] = {g: [] for g in gpus}
    temps: dict[int, list[float]] = {g: [] for g in gpus}
    fans: dict[int, list[float]] = {g: [] for g in gpus}
    reasons: set[str] = set()
    samples = seconds = 0.0
    try:
        if soaked:
            t.soak_s, t.settled = soak(machine, workload, gpus, measure, reasons)
        elif measure.warmup_s:
            workload.window(measure.warmup_s)  # warm-up: its figures are not kept
        e0, t0 = _energy(machine, gpus), workload.now()
        while len(rates) < measure.max_windows and not reasons & set(HW_REASONS):
            n, took = workload.window(measure.window_s)
            samples += n
            seconds += took
            rates.append(n / took if took > 0 else 0.0)
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
            if reasons & set(HW_REASONS):
                break
            if len(rates) >= measure.min_windows and relative_ci(rates, measure.confidence) <= measure.ci_bound:
                break
        e1, t1 = _energy(machine, gpus), workload.now()
    except WorkloadFailed as err:
        t.status, t.note = "failed", str(err)
        e0 = e1 = None
        t0 = t1 = 0.0
    hw = sorted(reasons & set(HW_REASONS))
    if hw and t.status == "ok":
        t.status, t.note = "throttled", f"the hardware slowed itself down ({', '.join(hw)})"
    xids1 = _xids(machine)
    if t.status == "ok" and xids0 is not None and xids1 is not None and xids1 > xids0:
        t.status, t.note = "xid", f"{xids1 - xids0} new Xid event(s) in the kernel log during the trial"
    t.windows = len(rates)
    t.reasons = sorted(reasons)
    t.sm_mhz = {g: statistics.fmean(v) for g, v in clocks.items() if v}
    t.temperature_c = {g: max(v) for g, v in temps.items() if v}
    t.fan_percent = {g: statistics.fmean(v) for g, v in fans.items() if v}
    if rates:
        t.samples_per_second = samples / seconds if seconds > 0 else None
        t.ci = relative_ci(rates, measure.confidence)
        t.ci_reached = t.ci <= measure.ci_bound
    if e0 is not None and e1 is not None and samples > 0:
        t.joules_per_sample = (e1 - e0) / samples
        t.power_w = (e1 - e0) / (t1 - t0) if t1 > t0 else None
    if t.status != "ok" and settings:
        applier.restore()  # stop and roll back: the GPUs are put back before anything else runs
    if say is not None:
        say(f"trial {number} ({stage}): {t.status}")
    return t
