"""The tune: refuse what is unsafe, measure the baseline, search, put every GPU back, choose.

Every trial's settings go through the tuning engine (``LocalApplier``, or the daemon's control
socket: the CLI's applier), which saves the originals to the state file before the first write, so
a tune killed at any moment is undone by ``gpud restore`` (or by the daemon). At the end, whatever
happened (Ctrl-C included), the load is stopped and the originals are written back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpud.autotune import search
from gpud.autotune.search import Constraint, Goal
from gpud.autotune.trial import Applier, Measure, Settings, Trial, run_trial
from gpud.autotune.workload import Workload
from gpud.errors import GpudError, InvalidInput
from gpud.hw.machine import Machine
from gpud.hw.nvml import TEMPERATURE_GPU
from gpud.model import FanReading, GpuSample
from gpud.profiles import engine
from gpud.profiles.fancurve import curve_of
from gpud.profiles.fanloop import FanControl
from gpud.profiles.profile import Profile
from gpud.profiles.session import LocalSession
from gpud.profiles.settings import MEMORY_CLOCKS, At, Gpu

KNOBS = ("power", "clocks", "memclocks", "fans")
# The baseline is measured again after this many trials (and before the confirmation): each trial is
# compared with the latest baseline, taken minutes before it at the same temperatures and drift, not with
# one taken while the GPUs still warmed.
REBASELINE_EVERY = 3  # what the search sets (docs/tune.md, "Knobs")
MATCH_SPREAD = 0.02  # GPUs whose clocks differ by more than this share are matched in a trial of their own
CLOCK_SPAN = (0.6, 1.1)  # the locked-clock search spans these shares of the clock the chosen limit left


class TuneRefused(GpudError):
    """The tune will not start: GPUs in use, a profile applied, a lost GPU, no power management."""


@dataclass
class Outcome:
    goal: str
    max_slowdown: float
    knobs: list[str]
    gpus: list[int]
    workload: str
    figures: str
    unit: str
    trials: list[Trial] = field(default_factory=list)
    baseline: Trial | None = None
    chosen: Trial | None = None
    baseline_settings: Settings = field(default_factory=dict)
    restored: list[str] = field(default_factory=list)
    zeus_trials: int = 0
    measure: Measure = field(default_factory=Measure)
    interrupted: bool = False
    started_at: float = 0.0
    notes: list[str] = field(default_factory=list)
    confirmed: bool | None = None  # the chosen point measured again against a fresh baseline, within the bound
    picked: Trial | None = None  # the search's trial whose settings ``chosen`` (its confirmation) measured again

    @property
    def search_trials(self) -> int:
        """Trials of settings the search chose to try: not the baselines measured again, not the confirmations
        (what Zeus's sweep count is compared with)."""
        return sum(1 for t in self.trials if t.stage not in ("baseline", "confirm"))

    def _ref(self) -> Trial | None:
        c = self.chosen
        return c.ref if c is not None and c.ref is not None else self.baseline

    @property
    def energy_saving_ci(self) -> float | None:
        """The 95 % half-width of ``energy_saving`` (the chosen trial's and its baseline's in quadrature)."""
        b, c = self._ref(), self.chosen
        if b is None or c is None or c is b or b.j_ci is None or c.j_ci is None:
            return None
        return math.sqrt(b.j_ci ** 2 + c.j_ci ** 2)

    @property
    def slowdown_ci(self) -> float | None:
        b, c = self._ref(), self.chosen
        if b is None or c is None or c is b or b.ci is None or c.ci is None:
            return None
        return math.sqrt(b.ci ** 2 + c.ci ** 2)

    @property
    def gain_excludes_zero(self) -> bool:
        """The chosen point is better than its baseline at 95 % confidence in what the goal asks: energy per
        sample (energy), draw (quiet) or samples per second (throughput): what ``--apply`` needs."""
        b, c = self._ref(), self.chosen
        if b is None or c is None or c is b or not c.ok or not b.ok or c.stage == "baseline":
            return False
        if self.goal == "throughput":
            hw = self.slowdown_ci
            return self.slowdown is not None and hw is not None and -self.slowdown - hw > 0
        if self.goal == "quiet":
            if not (b.power_w and c.power_w):
                return False
            hw = self.energy_saving_ci
            return hw is not None and 1.0 - c.power_w / b.power_w - hw > 0
        s, hw = self.energy_saving, self.energy_saving_ci
        return s is not None and hw is not None and s - hw > 0

    @property
    def energy_saving(self) -> float | None:
        b, c = self._ref(), self.chosen
        if b is None or c is None or not b.joules_per_sample or c.joules_per_sample is None:
            return None
        return 1.0 - c.joules_per_sample / b.joules_per_sample

    @property
    def slowdown(self) -> float | None:
        b, c = self._ref(), self.chosen
        if b is None or c is None or not b.samples_per_second or c.samples_per_second is None:
            return None
        return 1.0 - c.samples_per_second / b.samples_per_second


class LocalApplier:
    """Trials applied by this process through the tuning engine (the caller holds the tuning lock)."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.session = LocalSession(machine)
        self.fans: FanControl | None = None  # a trial's fan curve, driven by ``tick`` (no daemon drives it)

    def apply(self, settings: Settings, label: str) -> None:
        planned = self.session.plan(trial_profile(settings, label))
        skipped = [c for c in planned.changes if c.action == "skip" and c.setting != "persistence_mode"]
        if skipped:
            c = skipped[0]
            raise GpudError(f"{c.where}: {c.setting}: {c.note}")
        self._release_fans()
        res = self.session.write(planned)  # the fans' original policy saved first
        if not res.ok:
            raise GpudError(res.error or "apply failed")
        if any(curve_of(s.get("fan")) is not None for s in res.desired.values()):
            self.fans = FanControl.from_profile(self.machine, res.desired)

    def tick(self, now: float) -> None:
        """One step of the trial's fan curve (the daemon's fan loop, run here) at the workload's time
        ``now``, about once a second. The loop needs each GPU's temperature and fan count only: one NVML
        call per GPU (a lost GPU, or an unreadable temperature, sends its fans to the failsafe)."""
        if self.fans is not None:
            self.fans.step([self._reading(g, now) for g in sorted(self.fans.controllers)], now)

    def _reading(self, g: int, now: float) -> GpuSample:
        info = self.machine.info(g)
        uuid = info.uuid if info is not None else ""
        try:
            temp = self.machine.nvml.get("nvmlDeviceGetTemperature", self.machine.nvml.handle(g), TEMPERATURE_GPU,
                                         gpu=g)
        except GpudError as err:
            return GpuSample(index=g, uuid=uuid, timestamp=now, lost=True, error=str(err))
        fans = tuple(FanReading(f, None, None, None) for f in range(info.fan_count or 0 if info else 0))
        return GpuSample(index=g, uuid=uuid, timestamp=now, temperature_celsius=temp, fans=fans)

    def _release_fans(self) -> None:
        if self.fans is not None:
            self.fans.release()
            self.fans = None

    def restore(self) -> list[str]:
        self._release_fans()  # the fans back to the driver's automatic policy before anything else
        res = self.session.restore()
        return list(res.restored) + [f"NOT restored: {f}" for f in res.failed]


def trial_profile(settings: Settings, label: str) -> Profile:
    """A trial's settings as a profile of the engine (one selection per GPU; persistence on, so the
    driver keeps them while no gpud runs; restore puts it back)."""
    source = f"gpud tune ({label})"
    gpus = tuple({"select": [g], "persistence_mode": True, **s, "_where": f"gpus[{k}]", "_file": source}
                 for k, (g, s) in enumerate(sorted(settings.items())))
    return Profile(name="gpud-tune", source=source, description=f"gpud tune: {label}", all={}, gpus=gpus, host={},
                   chain=("gpud-tune",))


def check_start(machine: Machine, gpus: list[int], allow_busy: bool) -> None:
    """Refuse a tune that would measure someone else's work or lose someone's settings."""
    data = engine.read_state(machine)
    if data is not None:
        what = "an unfinished apply or tune" if data.pending else f"profile {data.profile!r}"
        busy = TuningBusy(f"{what} is applied: a tune would put the GPUs back to the settings before it at the end")
        busy.remedy = "`gpud restore` first (it writes the originals back), then tune, then apply what you chose"
        raise busy
    snap = machine.snapshot()
    for g in gpus:
        s = snap.samples[g]
        if s.lost:
            raise TuneRefused(f"GPU {g} is lost: cannot tune it")
        if s.processes and not allow_busy:
            procs = ", ".join(f"{p.pid} ({p.command or '?'})" for p in s.processes)
            err = TuneRefused(f"GPU {g} is in use by {procs}: its figures would not be the tune's alone, and its "
                              "settings would change under that work")
            err.remedy = "stop the processes (gpud ps), or pass --allow-busy"
            raise err


class TuningBusy(TuneRefused):
    """A profile (or an unfinished apply) is recorded in the tuning state."""


def _limits(machine: Machine, gpus: list[int]) -> dict[int, tuple[float, float, float]]:
    """(minimum, maximum, default) power limit per GPU."""
    out = {}
    for g in gpus:
        i = machine.info(g)
        lo, hi = (i.power_min_limit_watts, i.power_max_limit_watts) if i else (None, None)
        default = i.power_default_limit_watts if i else None
        if lo is None or hi is None or default is None:
            raise TuneRefused(f"GPU {g} reports no power limits: NVML cannot cap its power")
        out[g] = (float(lo), float(hi), float(default))
    return out


def run_tune(machine: Machine, workload: Workload, applier: Applier, *, goal: Goal, max_slowdown: float,
             knobs: list[str], gpus: list[int], measure: Measure, say: Callable[[str], None] | None = None) -> Outcome:
    """The whole tune. The caller has called ``check_start`` and holds the tuning lock (or drives a daemon)."""
    for k in knobs:
        if k not in KNOBS:
            raise InvalidInput("--knobs", "", f"{k!r}: the search sets {', '.join(KNOBS)}")
    limits = _limits(machine, gpus)
    # Each trial's interval is at most a quarter of the slowdown allowed: the bound is judged on the trial's
    # and its baseline's intervals together, and a tight bound (1 %) with ±1 % trials would leave nothing
    # that can be shown within it.
    if goal != "throughput" and max_slowdown > 0:
        measure = replace(measure, ci_bound=min(measure.ci_bound, max_slowdown / 4))
    out = Outcome(goal, max_slowdown, list(knobs), list(gpus), workload.name, workload.figures, workload.unit,
                  measure=measure, started_at=time.time())
    out.zeus_trials = max(search.zeus_sweep_trials(lo, hi) for lo, hi, _ in limits.values())
    snap = machine.snapshot()
    out.baseline_settings = {g: {"power_limit": snap.samples[g].power_management_limit_watts} for g in gpus}
    cache: dict[tuple[Any, ...], Trial] = {}
    latest: list[Trial] = []  # the latest baseline
    since = [0]  # trials since it

    def baseline(warm: bool = False) -> Trial:
        """The GPUs as they were (the engine's restore first, when a trial's settings are on), measured."""
        if out.trials:
            applier.restore()
        b = run_trial(machine, workload, applier, gpus, len(out.trials), "baseline", {}, measure, say, warm=warm)
        b.ref = b
        out.trials.append(b)
        if not b.ok or not b.samples_per_second:
            raise GpudError(f"the baseline did not measure: {b.status}: {b.note}")
        latest[:] = [b]
        since[0] = 0
        return b

    def trial(stage: str, settings: Settings) -> Trial:
        key = tuple(sorted((g, tuple(sorted((k, str(v)) for k, v in s.items()))) for g, s in settings.items()))
        if key in cache:
            return cache[key]
        if since[0] >= REBASELINE_EVERY:
            baseline()
        t = run_trial(machine, workload, applier, gpus, len(out.trials), stage, settings, measure, say,
                      soaked=stage == "fans", ref=latest[0])
        out.trials.append(t)
        since[0] += 1
        cache[key] = t
        return t

    workload.start(gpus)
    workload.ticker = applier.tick
    try:
        base = baseline(warm=True)
        out.baseline = base
        c = Constraint(goal, max_slowdown, base.samples_per_second or 0.0,
                       base.ci if base.ci is not None and math.isfinite(base.ci) else 0.0)

        def at_share(permille: int, clocks: dict[int, list[int]] | None = None) -> Settings:
            s: Settings = {}
            for g, (lo, hi, _) in limits.items():
                s[g] = {"power_limit": float(min(hi, max(lo, round(hi * permille / 1000))))}
                if "clocks" in knobs:
                    s[g]["gpu_clocks"] = clocks[g] if clocks and g in clocks else "reset"
            return s

        # Models differ: a clock in MHz is not the same pace on another architecture (locking a 6000 Ada at
        # an A6000's clock cost a quarter of the throughput), so no "match" trial; per-GPU limits match paces.
        mixed = len({(i.name if (i := machine.info(g)) is not None else "") for g in gpus}) > 1
        if "power" in knobs and goal != "throughput":
            _pergpu(out, base, limits, trial, c)
        if "power" in knobs:
            if goal == "throughput":
                trial("power", at_share(1000))
            else:
                lo_permille = max(round(1000 * lo / hi) for lo, hi, _ in limits.values())
                tol = search.POWER_RESOLUTION * 1000
                search.golden(lambda k: search.objective(trial("power", at_share(k)), c), lo_permille, 1000, tol)
        chosen = search.best(out.trials, c) or base
        if "clocks" in knobs:
            cap = chosen.settings or at_share(1000)
            power = {g: float(cap.get(g, {}).get("power_limit", limits[g][1])) for g in gpus}
            infos = {g: machine.info(g) for g in gpus}
            top = {g: (i.max_clocks_mhz.get("sm") if i is not None else None) for g, i in infos.items()}
            if all(top.values()) and chosen.sm_mhz:
                if goal == "throughput":
                    trial("clocks", {g: {"power_limit": power[g], "gpu_clocks": [int(top[g] or 0)] * 2}
                                     for g in gpus})
                else:
                    share = min(chosen.sm_mhz.get(g, 0.0) / float(top[g] or 1) for g in gpus)
                    lo_k = max(1, round(1000 * share * CLOCK_SPAN[0]))
                    hi_k = min(1000, round(1000 * share * CLOCK_SPAN[1]))

                    def locked(k: int) -> Settings:
                        return {g: {"power_limit": float(limits[g][1]),
                                    "gpu_clocks": [round(float(top[g] or 0) * k / 1000)] * 2} for g in gpus}

                    search.golden(lambda k: search.objective(trial("clocks", locked(k)), c), lo_k, hi_k,
                                  search.CLOCK_RESOLUTION * 1000)
                chosen = search.best(out.trials, c) or base
                clocks = chosen.sm_mhz
                if clocks and min(clocks.values()) < (1 - MATCH_SPREAD) * max(clocks.values()) and len(gpus) > 1 \
                        and not mixed:
                    pace = round(min(clocks.values()))  # the slowest GPU's clock: the others wait for it anyway
                    slowest = min(clocks, key=lambda g: clocks[g])
                    settings = {g: dict(chosen.settings.get(g, {"power_limit": power[g]})) for g in gpus}
                    for g in gpus:  # not the slowest itself: its mean clock (dithering in bins) rounds to the pace
                        if g != slowest and clocks.get(g, 0) > pace:
                            settings[g]["gpu_clocks"] = [pace, pace]
                    trial("match", settings)
            else:
                out.notes.append("the GPUs report no maximum SM clock or no clock readings: clocks not searched")
        elif chosen.sm_mhz and len(gpus) > 1 and not mixed and min(chosen.sm_mhz.values()) < (
                1 - MATCH_SPREAD) * max(chosen.sm_mhz.values()):
            out.notes.append("the GPUs ran at different clocks: the slowest sets a DDP job's pace; "
                             "--knobs power,clocks measures locking the faster ones to match")
        if "memclocks" in knobs:
            _memclocks(machine, out, trial, c, gpus)
        def again(cand: Trial, b: Trial) -> Trial:
            return run_trial(machine, workload, applier, gpus, len(out.trials), "confirm", cand.settings, measure,
                             say, soaked=cand.stage == "fans", ref=b)

        def judge(t: Trial) -> bool:
            return search.feasible(t, c)

        def rank(t: Trial) -> float:
            return search.objective(t, c)

        pick = search.best(out.trials, c) or base
        out.chosen = confirm(out, pick, baseline, again, judge, rank)
        if "fans" in knobs:  # the curves on top of the confirmed settings, the quietest confirmed in turn
            start = out.chosen
            quietest = _fans(machine, out, trial, c, gpus, start)
            if quietest is not None:
                ceilings = _ceilings(machine, gpus)
                first, first_pick, first_ok = out.chosen, out.picked, out.confirmed
                out.chosen = confirm(out, quietest, baseline, again,  # the bound itself, and the ceilings
                                      lambda t: search.feasible(t, c) and fan_objective(t, c, ceilings) < math.inf,
                                      lambda t: fan_objective(t, c, ceilings, start), stage="fans")
                if out.confirmed is False:  # no curve confirmed: the confirmed settings with the driver's fans
                    out.chosen, out.picked, out.confirmed = first, first_pick, first_ok
    except KeyboardInterrupt:
        out.interrupted = True
    finally:
        workload.stop()
        out.restored = applier.restore()
    if out.chosen is None:
        out.chosen = out.baseline
    elif out.chosen.ref is not None:
        out.baseline = out.chosen.ref  # what the chosen point was compared with: the fresh baseline
    return out


TrialFn = Callable[[str, Settings], Trial]
# A rank that waits this much more of each step than the one that waits least runs faster than the job's
# pace (every rank waits for the slowest at each all-reduce): its GPU could do the same with less power.
# Three times the simulated per-second spread of a rank's step (``gpud.sim.perf.STEP_CV``).
WAIT_SPREAD = 0.03


def waiting_gpus(t: Trial) -> list[int]:
    """The GPUs whose ranks wait for the others in trial ``t`` (``Trial.waiting``, from the job's ranks)."""
    if len(t.waiting) < 2:
        return []
    least = min(t.waiting.values())
    return sorted(g for g, v in t.waiting.items() if v > least + WAIT_SPREAD)


def _pergpu(out: Outcome, base: Trial, limits: dict[int, tuple[float, float, float]], trial: TrialFn,
            c: Constraint) -> None:
    """Per-GPU limits where the GPUs differ (mixed models, or one slot or die slower): the GPUs whose ranks
    wait at every all-reduce for the slowest (``waiting_gpus``) get their limit searched on their own, the
    GPUs that set the pace keep theirs. Lowering a waiting GPU's limit costs nothing until it stops waiting,
    then it slows the job: the same golden section as the joint search, over those GPUs' share alone."""
    fast = waiting_gpus(base)
    if not fast or len(fast) == len(base.waiting):
        return
    out.notes.append("GPUs " + ", ".join(f"{g} ({base.waiting[g] * 100:.0f} %)" for g in fast)
                     + " waited for the others in each step of the baseline: their limits were searched on their "
                     "own, the others kept theirs")

    def capped(permille: int) -> Settings:
        return {g: {"power_limit": float(min(limits[g][1], max(limits[g][0], round(limits[g][1] * permille / 1000))))}
                for g in fast}

    lo = max(round(1000 * limits[g][0] / limits[g][1]) for g in fast)
    search.golden(lambda k: search.objective(trial("pergpu", capped(k)), c), lo, 1000, search.POWER_RESOLUTION * 1000)


def _ceilings(machine: Machine, gpus: list[int]) -> dict[int, float]:
    return {g: v[0] for g in gpus if (v := fan_ceiling(machine, g)) is not None}


CONFIRM_TRIES = 3  # candidates measured again, best first, before the GPUs are left as they were


def confirm(out: Outcome, pick: Trial, baseline: Callable[[], Trial], again: Callable[[Trial, Trial], Trial],
             judge: Callable[[Trial], bool], rank: Callable[[Trial], float], stage: str | None = None) -> Trial:
    """Measure the chosen point again against a fresh baseline: a search's best trial is the minimum over
    noisy measurements, biased toward luck, so a choice stands only where a measurement that did not choose
    it still passes ``judge`` (within the slowdown bound; a fan curve also below the ceilings). A point that
    does not confirm gives way to the best trial that passed (of ``stage``, by ``rank``) and that the search
    measured safer than it, a smaller slowdown (the next best by the objective alone sits at the same bound,
    and fails the same way), up to ``CONFIRM_TRIES``; if none confirms the GPUs stay as they were (the last
    fresh baseline is the choice), and the notes say why."""
    if pick.stage in ("baseline", "confirm") or not pick.settings:
        out.confirmed, out.picked = None, pick
        return pick
    c = search.Constraint("energy", out.max_slowdown, 0.0)
    seen: set[str] = set()
    others = sorted((t for t in out.trials if t is not pick and t.stage not in ("baseline", "confirm")
                     and t.settings and (stage is None or t.stage == stage) and judge(t)
                     and (stage is not None or rank(t) < 1.0)), key=lambda t: (rank(t), t.number))
    fresh = pick
    below = math.inf  # the search's slowdown of the last candidate that did not confirm: the next is safer
    for cand in [pick, *others]:
        key = repr(sorted(cand.settings.items()))
        if key in seen or search.trial_slowdown(cand, c) >= below:
            continue
        seen.add(key)
        if len(seen) > CONFIRM_TRIES:
            break
        fresh = baseline()
        t = again(cand, fresh)
        out.trials.append(t)
        if judge(t):
            out.confirmed, out.picked = True, cand
            return t
        below = search.trial_slowdown(cand, c)
        slow = search.trial_slowdown(t, c)
        out.notes.append(f"trial {cand.number}'s settings did not confirm against a fresh baseline (trial "
                         f"{t.number}: {t.status}, slowdown {slow * 100:+.1f} %)")
    out.confirmed = False
    out.notes.append("no chosen setting confirmed: the GPUs are left as they were")
    return fresh


def memory_clocks(machine: Machine, gpus: list[int]) -> tuple[dict[int, list[int]], str]:
    """Per GPU, the memory clocks below its maximum it supports, highest first; or why none can be locked."""
    out: dict[int, list[int]] = {}
    for g in gpus:
        info = machine.info(g)
        if info is None:
            return {}, f"GPU {g}: no information"
        why = MEMORY_CLOCKS.unsupported(At(machine, Gpu(g), info), [0, 0], None)
        if why:
            return {}, f"GPU {g}: {why}"
        clocks = machine.nvml.supported_memory_clocks(g)
        top = info.max_clocks_mhz.get("memory") or (max(clocks) if clocks else None)
        below = [c for c in clocks or () if top is not None and c < top]
        if not below:
            return {}, f"GPU {g}: NVML lists no memory clock below the maximum (nvidia-smi -q -d SUPPORTED_CLOCKS)"
        out[g] = below
    return out, ""


def _memclocks(machine: Machine, out: Outcome, trial: TrialFn, c: Constraint, gpus: list[int]) -> None:
    """Locked memory clocks, after the power and SM clock stage: the supported clocks below the maximum,
    highest first, each on top of the best settings so far. A lower memory clock slows the memory-bound
    share of a step and saves the DRAM interface's power; throughput only falls with it, so the walk
    stops at the first step that is worse than the one before (or breaks the slowdown bound)."""
    clocks, why = memory_clocks(machine, gpus)
    if not clocks:
        out.notes.append(f"memory clocks not searched: {why}")
        return
    base = search.best(out.trials, c) or out.baseline
    start = dict(base.settings) if base is not None else {}
    prev = search.objective(base, c) if base is not None else float("inf")
    for k in range(max(len(v) for v in clocks.values())):
        settings: Settings = {}
        for g in gpus:
            mhz = clocks[g][min(k, len(clocks[g]) - 1)]
            settings[g] = {**start.get(g, {}), "memory_clocks": [mhz, mhz]}
        t = trial("memclocks", settings)
        value = search.objective(t, c)
        if not search.feasible(t, c) or value >= prev:
            break
        prev = value


def fan_ceiling(machine: Machine, g: int) -> tuple[float, str] | None:
    """The temperature a fan curve must keep GPU ``g`` below, from its own thresholds: the lowest at which
    it slows itself (max operating temperature, where SW thermal slowdown starts; else the slowdown
    threshold), less the gap the GPU leaves between that and its next threshold (slowdown − max operating,
    or shutdown − slowdown; at least NVML's 1 °C resolution). None without thresholds."""
    info = machine.info(g)
    if info is None:
        return None
    mo, sd, sh = (info.temperature_max_operating_celsius, info.temperature_slowdown_celsius,
                  info.temperature_shutdown_celsius)
    if mo is not None and sd is not None:
        return float(mo) - max(1.0, float(sd - mo)), f"max operating {mo} °C − ({sd} − {mo}) °C"
    if sd is not None and sh is not None:
        return float(sd) - max(1.0, float(sh - sd)), f"slowdown {sd} °C − ({sh} − {sd}) °C"
    return None


def fan_curve(knee: float, ceiling: float, floor: float) -> dict[str, Any]:
    """The fan curve a fans trial drives: the GPU's minimum duty up to ``knee`` °C, rising to 100 % at
    ``ceiling`` (at or past it the controller goes to full cooling at once: ``gpud.profiles.fancurve``)."""
    return {"mode": "curve", "points": [[round(knee, 1), round(floor)], [round(ceiling, 1), 100]], "hysteresis": 3,
            "minimum": 0, "max_ramp": 10}


def _fans(machine: Machine, out: Outcome, trial: TrialFn, c: Constraint, gpus: list[int],
          start_trial: Trial | None = None) -> Trial | None:
    """The quietest fan curve: the lowest mean duty that keeps the throughput within the slowdown bound
    and every GPU below its ceiling (``fan_ceiling``) after a soak. The curve holds the GPU's minimum duty
    up to a knee and reaches 100 % at the ceiling; a higher knee lets the GPU run warmer, which takes less
    air (the heat a heatsink sheds grows with the temperature above the intake's), so the mean duty falls
    with the knee until the ceiling is crossed: a golden-section search over the knee, from the coolest
    temperature the best trial so far ran at to 1 °C below the ceiling. The quietest feasible curve's
    trial (the best settings so far, with the curve) is the tune's choice; None if none held."""
    fanned = [g for g in gpus if (i := machine.info(g)) is not None and i.fan_count]
    if not fanned:
        out.notes.append("fans not searched: no GPU tuned has fans gpud can drive (passive cards)")
        return None
    ceilings = {g: fan_ceiling(machine, g) for g in fanned}
    if any(v is None for v in ceilings.values()):
        out.notes.append("fans not searched: a GPU reports no slowdown or max operating temperature")
        return None
    top = {g: v[0] for g, v in ceilings.items() if v is not None}
    base = start_trial or search.best(out.trials, c) or out.baseline
    if base is None or not base.temperature_c:
        out.notes.append("fans not searched: no temperature was read in the trials")
        return None
    start = dict(base.settings)
    floors = {g: float(getattr(machine.info(g), "fan_min_speed_percent", None) or 0) for g in fanned}
    lo = int(min(base.temperature_c.get(g, top[g]) for g in fanned))
    hi = int(min(top.values())) - 1
    if lo >= hi:
        out.notes.append(f"fans not searched: the GPUs already run at {lo} °C, at their ceiling")
        return None
    out.notes.append("fan ceilings: " + "; ".join(f"GPU {g} {v[0]:g} °C ({v[1]})" for g, v in ceilings.items()
                                                   if v is not None))

    def curve(knee: int) -> Settings:
        s: Settings = {g: dict(start.get(g, {})) for g in gpus}
        for g in fanned:
            s[g]["fan"] = fan_curve(float(min(knee, top[g] - 1)), top[g], floors[g])
        return s

    def value(knee: int) -> float:
        t = trial("fans", curve(knee))
        return fan_objective(t, c, top, base)

    # The driver's automatic policy, soaked like the curves: what a curve must be quieter than.
    trial("fans", {g: {**start.get(g, {}), **({"fan": {"mode": "auto"}} if g in fanned else {})} for g in gpus})
    search.golden(value, lo, hi, FAN_RESOLUTION_C)
    held = [t for t in out.trials if t.stage == "fans" and fan_objective(t, c, top, base) < float("inf")]
    return min(held, key=lambda t: (fan_objective(t, c, top, base), t.number)) if held else None


def as_fast(t: Trial, base: Trial, c: Constraint) -> bool:
    """``t`` is not measurably slower than ``base``, a feasible trial: its rate is below ``base``'s by no more
    than the root sum of squares of their relative 95 % half-widths (``Trial.ci``)."""
    if not (t.ok and search.feasible(base, c) and t.samples_per_second and base.samples_per_second):
        return False
    cis = [x for x in (t.ci, base.ci) if x is not None and math.isfinite(x)]
    margin = math.sqrt(sum(x * x for x in cis)) if len(cis) == 2 else 0.0
    return 1.0 - t.samples_per_second / base.samples_per_second <= margin


FAN_RESOLUTION_C = 1.0  # NVML reports whole degrees: knees closer than that cannot be told apart


def fan_objective(t: Trial, c: Constraint, ceilings: dict[int, float], base: Trial | None = None) -> float:
    """A fans trial's mean duty over its GPUs; infinite when it failed, ran at or past a ceiling or beyond
    the slowdown bound (quiet that costs throughput is not what was asked). A fans trial runs the settings
    of ``base`` (the best trial so far, feasible) with a curve: it is within the bound unless it is slower
    than ``base`` by more than the two measurements' confidence intervals together (``as_fast``), so that
    measuring ``base``'s settings once more, with the noise every measurement has, does not by itself put a
    curve beyond a bound ``base`` met."""
    if not t.fan_percent or not (search.feasible(t, c) or (base is not None and as_fast(t, base, c))):
        return float("inf")
    if any(t.temperature_c.get(g, 0.0) >= top for g, top in ceilings.items()):
        return float("inf")
    return sum(t.fan_percent.values()) / len(t.fan_percent)
