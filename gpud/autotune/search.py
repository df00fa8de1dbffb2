"""The search: which settings to try, given what the trials so far measured (pure: the trials come
from a callback).

Zeus sweeps the power limit from the maximum to the minimum in 25 W steps. gpud brackets instead:
a golden-section search over the power limit for the goal's objective, the slowdown constraint
folded in as a penalty (throughput falls monotonically with the limit, energy per sample is
unimodal over it), stopped when the bracket is narrower than NVML's ±5 % power accuracy of the
maximum limit. Then, with the ``clocks`` knob, the same search over a locked maximum SM clock
around the clock the chosen limit left; and where GPUs of one job run at different clocks, a
trial that locks the faster ones at the slowest's pace (measured, not assumed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from gpud.autotune.trial import Trial

Goal = Literal["throughput", "energy", "quiet"]
GOALS: tuple[str, ...] = ("throughput", "energy", "quiet")
INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0
# nvml.h, nvmlDeviceGetPowerUsage: "accurate to within +/- 5% of current power draw": a bracket
# narrower than 5 % of the maximum limit cannot be told apart by the readings.
POWER_RESOLUTION = 0.05
CLOCK_RESOLUTION = 0.05  # the same share of the maximum SM clock for a locked-clock search
PENALTY = 20.0  # the objective grows by this much per unit of slowdown beyond the allowed one
ZEUS_STEP_W = 25.0


@dataclass(frozen=True)
class Constraint:
    goal: Goal
    max_slowdown: float  # a share: 0.05 for 5 %
    baseline_rate: float
    baseline_ci: float = 0.0  # the baseline's relative 95 % half-width (Trial.ci)


def slowdown(t: Trial, baseline_rate: float) -> float:
    """Share of the baseline's samples per second lost (negative: faster)."""
    if t.samples_per_second is None or baseline_rate <= 0:
        return math.inf
    return 1.0 - t.samples_per_second / baseline_rate


def _finite(*cis: float | None) -> float:
    """Relative half-widths in quadrature (one without an interval counts none)."""
    return math.sqrt(sum(x * x for x in cis if x is not None and math.isfinite(x)))


def _ref(t: Trial, c: Constraint) -> tuple[float, float | None, float | None, float | None, float | None]:
    """(rate, rate CI, J/sample, J CI, draw) of the baseline ``t`` is compared with: its own (``Trial.ref``,
    the latest baseline measured before it, the same state of the GPUs), else the constraint's."""
    r = t.ref
    if r is not None and r.ok and r.samples_per_second:
        return r.samples_per_second, r.ci, r.joules_per_sample, r.j_ci, r.power_w
    return c.baseline_rate, c.baseline_ci, None, None, None


def trial_slowdown(t: Trial, c: Constraint) -> float:
    """``t``'s slowdown against its own baseline."""
    return slowdown(t, _ref(t, c)[0])


def margin(t: Trial, c: Constraint) -> float:
    """The 95 % half-width of ``t``'s slowdown: its rate's and its baseline's relative half-widths in
    quadrature (the first-order interval of a ratio of two independent means)."""
    return _finite(t.ci, _ref(t, c)[1])


def saving(t: Trial, c: Constraint) -> tuple[float, float] | None:
    """``t``'s saving in joules per sample against its own baseline, and its 95 % half-width (the two
    measurements' relative half-widths in quadrature); None without energy figures."""
    _, _, jb, jb_ci, _ = _ref(t, c)
    if not jb or t.joules_per_sample is None:
        return None
    return 1.0 - t.joules_per_sample / jb, _finite(t.j_ci, jb_ci)


def feasible(t: Trial, c: Constraint) -> bool:
    """Within the slowdown bound at 95 % confidence: the slowdown's upper bound (``margin``) meets it. A
    point estimate alone, under the windows' noise, would pick a setting whose true slowdown is beyond the
    bound about half the time where the search ends at the bound (issue #34's replay: 38-47 %)."""
    if not t.ok:
        return False
    return c.goal == "throughput" or trial_slowdown(t, c) + margin(t, c) <= c.max_slowdown + 1e-12


def objective(t: Trial, c: Constraint) -> float:
    """What the goal minimises, relative to ``t``'s own baseline (so trials compared with different
    baselines compare): J per sample (energy), draw (quiet: heat, so fan speed), or minus samples per
    second (throughput); a failed trial is infinite; beyond the slowdown, a penalty."""
    if not t.ok:
        return math.inf
    assert t.samples_per_second is not None and t.joules_per_sample is not None
    rate, _, jb, _, pb = _ref(t, c)
    if c.goal == "throughput":
        return -t.samples_per_second / rate
    if c.goal == "energy":
        value = t.joules_per_sample / jb if jb else t.joules_per_sample
    else:
        value = (t.power_w / pb if pb else t.power_w) if t.power_w else math.inf
    excess = max(0.0, trial_slowdown(t, c) + margin(t, c) - c.max_slowdown)  # as ``feasible`` judges
    return value * (1.0 + PENALTY * excess)


def best(trials: list[Trial], c: Constraint) -> Trial | None:
    """The feasible trial with the lowest objective (ties: the earliest)."""
    ok = [t for t in trials if feasible(t, c)]
    return min(ok, key=lambda t: (objective(t, c), t.number)) if ok else None


def golden(f: Callable[[int], float], lo: int, hi: int, tol: float) -> None:
    """Golden-section search for the minimum of ``f`` over whole numbers in [lo, hi], until the last
    comparison leaves a bracket at most ``tol`` wide. ``f`` is called once per point (the caller caches)."""
    a, b = float(lo), float(hi)
    c, d = round(b - INV_PHI * (b - a)), round(a + INV_PHI * (b - a))
    fc, fd = f(c), f(d)
    while (b - a) * INV_PHI > tol and c != d:  # the next comparison leaves a bracket of (b - a) · 0.618
        if fc <= fd:
            b, d, fd = d, c, fc
            c = round(b - INV_PHI * (b - a))
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = round(a + INV_PHI * (b - a))
            fd = f(d)


def zeus_sweep_trials(min_w: float, max_w: float, step_w: float = ZEUS_STEP_W) -> int:
    """How many power limits Zeus's linear sweep profiles: the maximum down to the minimum in 25 W steps."""
    return int(math.floor((max_w - min_w) / step_w + 1e-9)) + 1
