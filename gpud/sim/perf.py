"""The simulated GPUs' performance and power model: what a training step's speed and a board's draw
are at a given SM clock, and which clock a power limit leaves (docs/tune.md, "The model";
docs/simulation.md, "Performance and power").

All in shares of the full-clock figures, so one model serves every preset:

- **Power** at SM clock ``x`` (a share of the maximum clock): ``P(x) = D · (S + (1 − S) · x · v(x)²)``,
  where ``D`` is what the load draws at the maximum clock, ``S`` the static share (leakage, memory,
  board; it does not scale with the SM clock) and ``v(x)`` the voltage relative to its top value:
  flat at ``V_FLOOR`` up to the knee ``X_KNEE``, then rising linearly to 1 at the maximum clock
  (dynamic CMOS power ``∝ f·V²``; the V–f shape DVFS measurement studies report).
- **A power limit** below ``P`` at the allowed clock lowers the clock until ``P(x)`` meets the limit,
  as GPU Boost does (the board then reports SW Power Cap).
- **Throughput** (steps per second) at ``x``: ``1 / ((1 − M) / x + M)`` of the full-clock rate, ``M``
  the share of a step that does not scale with the SM clock (memory-bound kernels, communication).
  A locked memory clock ``y`` (a share of its maximum) stretches that part: ``M / y``, and saves
  ``MEMORY_POWER_SHARE · (1 − y)`` of the full-clock draw (the DRAM interface's share).

The constants are chosen no kinder than the published measurements (docs/tune.md): the energy the
model saves at 5 % slowdown on an RTX A6000 (about 12 %) is below the 15 % power-capping studies
report, and its unconstrained saving (about 40 % at a 28 % slowdown) within Zeus's 23.8–74.7 %.
"""

from __future__ import annotations

import functools
import random

# The static share of the full-clock draw: leakage, memory and board power that the SM clock does
# not change (an assumption; Zeus and the power-capping studies measure only the total).
STATIC_SHARE = 0.20
# Voltage relative to its top value below the knee (GA102's V–F points run from about 0.72 V to
# 1.08 V: 0.67), and the knee as a share of the maximum SM clock (an assumption of the shape).
V_FLOOR = 0.67
X_KNEE = 0.55
# The share of the full-clock draw that scales with the memory clock: the DRAM interface's energy per
# bit moved. GDDR6X moves a bit for 7.25 pJ, 15 % less than GDDR6 (Micron's GDDR6X product brief), so
# GDDR6 about 8.5 pJ/bit; HBM2 about 3.9 pJ/bit (O'Connor et al., "Fine-Grained DRAM: Energy-Efficient
# DRAM for Extreme Bandwidth Systems", MICRO 2017). An RTX A6000's 768 GB/s at full use is then about
# 52 W of its 300 W (17 %), an H200's 4.8 TB/s about 150 W of 700 W (21 %); training keeps the
# interface busy in its memory-bound half of the step (``MEMORY_BOUND``) at most: 8.5 % and 10.5 %.
# Below both: a lower memory clock saves no more than that.
MEMORY_POWER_SHARE = 0.075
# The share of a DDP training step that does not scale with the SM clock: memory-bound operators
# take about 40 % of a transformer's training time (Ivanov et al., MLSys 2021: contractions are
# 99.8 % of the flops but 61 % of the runtime), plus the all-reduce not hidden behind the backward
# pass. Rounded up to half: a higher share makes a slower clock cheaper in time.
MEMORY_BOUND = 0.5
# What a training load draws at the maximum clock, as a share of the default power limit: DDP
# training runs at the power cap on these boards (SW Power Cap active), lightly.
TRAINING_DEMAND_SHARE = 1.05
# Step-to-step spread of a training step's time (coefficient of variation), so that a measurement
# needs repeating until its confidence interval is narrow, as on hardware.
STEP_CV = 0.01
# What one GPU's step rate is in the model's units (samples per second at the maximum clock): a unit,
# not a measurement; the model's figures are compared with each other only.
NOMINAL_SAMPLES_PER_SECOND = 100.0


def voltage(x: float) -> float:
    """Voltage at SM clock share ``x``, relative to its value at the maximum clock."""
    if x <= X_KNEE:
        return V_FLOOR
    return V_FLOOR + (1.0 - V_FLOOR) * (min(x, 1.0) - X_KNEE) / (1.0 - X_KNEE)


def power_share(x: float) -> float:
    """Draw at SM clock share ``x`` as a share of the draw at the maximum clock."""
    return STATIC_SHARE + (1.0 - STATIC_SHARE) * x * voltage(x) ** 2


def memory_saving(mem: float) -> float:
    """What a memory clock at share ``mem`` of its maximum saves, as a share of the full-clock draw."""
    return MEMORY_POWER_SHARE * (1.0 - min(1.0, max(0.0, mem)))


@functools.lru_cache(maxsize=4096)  # pure, and asked for every reading of every GPU: the bisection once per state
def capped_share(top: float, demand_w: float, limit_w: float, mem: float = 1.0) -> tuple[float, float, bool]:
    """(SM clock share, draw in W, whether the power cap binds) for a load that draws ``demand_w`` at
    the maximum clock, allowed clocks up to ``top`` (a share: 1, or a locked maximum), under ``limit_w``,
    its memory at share ``mem`` of its maximum clock (what that saves leaves room for the SM clock)."""
    want = demand_w * (power_share(top) - memory_saving(mem))
    if want <= limit_w:
        return top, want, False
    lo, hi = 0.0, top
    for _ in range(50):  # bisection: power_share is increasing
        mid = (lo + hi) / 2
        if demand_w * (power_share(mid) - memory_saving(mem)) > limit_w:
            hi = mid
        else:
            lo = mid
    return lo, limit_w, True


def throughput_share(x: float, mem: float = 1.0) -> float:
    """Step rate at SM clock share ``x`` and memory clock share ``mem``, as a share of the full-clock rate."""
    if x <= 0 or mem <= 0:
        return 0.0
    return 1.0 / ((1.0 - MEMORY_BOUND) / x + MEMORY_BOUND / mem)


def step_rate(shares: list[float], rng: random.Random | None = None) -> float:
    """A DDP job's samples per second over GPUs at these throughput shares: every rank waits for the
    slowest at each all-reduce, so the slowest sets the pace; ``rng`` adds the step-to-step spread."""
    if not shares:
        return 0.0
    rate = NOMINAL_SAMPLES_PER_SECOND * len(shares) * min(shares)
    if rng is not None:
        rate *= max(0.5, rng.gauss(1.0, STEP_CV))
    return rate


def training_demand_watts(default_limit_w: float) -> float:
    """What a DDP training load draws at the maximum clock on a board with this default limit."""
    return default_limit_w * TRAINING_DEMAND_SHARE

