"""The simulated GPUs' performance and power model: what a training step's speed and a board's draw
are at a given SM clock, and which clock a power limit leaves (docs/tune.md, "The model";
docs/simulation.md, "Performance and power").

Power in shares of the full-clock figures (the full clock: the model's rated boost clock), time from the
model's own throughput, so that one model serves every preset and a mixed machine has a faster and a
slower card:

- **Power** at SM clock ``x`` (a share of the maximum clock): ``P(x) = D · (S + (1 − S) · x · v(x)²)``,
  where ``D`` is what the load draws at the maximum clock, ``S`` the static share (leakage, memory,
  board; it does not scale with the SM clock) and ``v(x)`` the voltage relative to its top value:
  flat at ``V_FLOOR`` up to the knee ``X_KNEE``, then rising linearly to 1 at the maximum clock
  (dynamic CMOS power ``∝ f·V²``; the V–f shape DVFS measurement studies report).
- **A power limit** below ``P`` at the allowed clock lowers the clock until ``P(x)`` meets the limit,
  as GPU Boost does (the board then reports SW Power Cap).
- **A step's time** on a GPU at SM clock share ``x`` and memory clock share ``y``:
  ``(1 − M) · (F_ref / F) / x + M · (B_ref / B) / y`` reference steps, ``F`` its dense tensor throughput
  and ``B`` its memory bandwidth (the datasheets'), ``M`` the memory-bound share of the step on the
  reference GPU (an RTX A6000 at its boost clock). A locked memory clock saves
  ``MEMORY_POWER_SHARE · (1 − y)`` of the full-clock draw (the DRAM interface's share).
- **DDP**: every rank waits for the slowest at the all-reduce, so a step lasts the slowest rank's time
  plus the all-reduce's exposed part (``ALLREDUCE_EXPOSED`` · 2(n − 1)/n, the ring's traffic factor).

Every constant is a cited figure or a stated assumption, and the results are what they give
(docs/simulation.md, "Performance and power"; docs/tune.md).
"""

from __future__ import annotations

import functools

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
# The share of a training step that does not scale with the SM clock: memory-bound operators take about
# 40 % of a transformer's training time (Ivanov et al., "Data Movement Is All You Need", MLSys 2021:
# contractions are 99.8 % of the flops but 61 % of the runtime), on the reference GPU.
MEMORY_BOUND = 0.4
# The reference GPU the step's unit is measured on: an RTX A6000 at its 1800 MHz boost clock, 154.8 TFLOP/s
# dense FP16 tensor throughput with FP32 accumulate (half its datasheet's 309.7 with sparsity) and 768 GB/s
# (NVIDIA RTX A6000 datasheet).
REFERENCE_TFLOPS = 154.8
REFERENCE_BANDWIDTH_GBS = 768.0
# The all-reduce's part of a DDP step that the backward pass does not hide, in reference steps per unit of
# the ring's traffic factor 2(n - 1)/n (nccl-tests PERFORMANCE.md): an assumption (DDP overlaps the
# bucketed all-reduce with the backward pass, Li et al., VLDB 2020; what stays exposed depends on the
# model and the link), the same on every GPU (the link, not the clock, sets it).
ALLREDUCE_EXPOSED = 0.05
# What a training load draws at the maximum clock, as a share of the default power limit: DDP
# training runs at the power cap on these boards (SW Power Cap active), lightly.
TRAINING_DEMAND_SHARE = 1.05
# Spread of each rank's mean step time from one second to the next (coefficient of variation): an
# assumption of the size (no published per-second figure was found), so that a measurement needs
# repeating until its confidence interval is narrow, and a DDP step, the slowest rank's, is slower on
# average than any rank's mean (the straggler effect of a barrier). Off with GPUD_SIM_NOISE=0.
STEP_CV = 0.01
# What the reference GPU's step rate is in the model's units (samples per second at its boost clock): a
# unit, not a measurement; other GPUs' rates follow from their throughput and bandwidth.
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
    return _share_at(limit_w / demand_w + memory_saving(mem), top), limit_w, True


def _share_at(p: float, top: float) -> float:
    """The clock share whose ``power_share`` is ``p`` (below ``top``, where it is more): the inverse of the
    increasing ``power_share``, in closed form below the knee (linear) and by Newton's method above it
    (a convex cubic: from the right it converges without overshoot), to float precision. What a 50-step
    bisection gave, at a tenth of the cost: the soak reads it every simulated second of every GPU."""
    if p <= STATIC_SHARE:
        return 0.0
    below = (p - STATIC_SHARE) / ((1.0 - STATIC_SHARE) * V_FLOOR**2)
    if below <= X_KNEE:
        return min(below, top)
    slope = (1.0 - V_FLOOR) / (1.0 - X_KNEE)
    x = top
    for _ in range(60):
        v = V_FLOOR + slope * (x - X_KNEE)
        f = STATIC_SHARE + (1.0 - STATIC_SHARE) * x * v * v - p
        step = f / ((1.0 - STATIC_SHARE) * (v * v + 2.0 * x * v * slope))
        x -= step
        if abs(step) < 1e-15:
            break
    return max(X_KNEE, min(x, top))


def throughput_share(x: float, mem: float = 1.0) -> float:
    """Step rate at SM clock share ``x`` and memory clock share ``mem``, as a share of the full-clock rate."""
    if x <= 0 or mem <= 0:
        return 0.0
    return 1.0 / ((1.0 - MEMORY_BOUND) / x + MEMORY_BOUND / mem)


def step_time(x: float, mem: float = 1.0, tflops: float = REFERENCE_TFLOPS,
              bandwidth_gbs: float = REFERENCE_BANDWIDTH_GBS) -> float:
    """A training step's time, in reference steps, on a GPU of ``tflops`` and ``bandwidth_gbs`` at SM clock
    share ``x`` (of its boost clock) and memory clock share ``mem``."""
    if x <= 0 or mem <= 0 or tflops <= 0 or bandwidth_gbs <= 0:
        return float("inf")
    return ((1.0 - MEMORY_BOUND) * (REFERENCE_TFLOPS / tflops) / x
            + MEMORY_BOUND * (REFERENCE_BANDWIDTH_GBS / bandwidth_gbs) / mem)


def step_rate(times: list[float], jitter: list[float] | None = None) -> float:
    """A DDP job's samples per second over ranks whose steps take ``times`` (reference steps): every rank
    waits for the slowest at each all-reduce, so a step is the slowest rank's time plus the all-reduce's
    exposed part. ``jitter``: each rank's standard normal deviate for this second (``STEP_CV``)."""
    if not times:
        return 0.0
    n = len(times)
    if jitter is not None:
        times = [jittered(t, j) for t, j in zip(times, jitter, strict=True)]
    step = max(times) + allreduce_exposed(n)
    return NOMINAL_SAMPLES_PER_SECOND * n / step if step > 0 else 0.0


def jittered(time_ref: float, deviate: float) -> float:
    """A rank's step time this second: ``time_ref`` varied by ``STEP_CV`` times a standard normal deviate."""
    return time_ref * max(0.5, 1.0 + STEP_CV * deviate)


def allreduce_exposed(ranks: int) -> float:
    """The all-reduce's exposed part of a DDP step over ``ranks`` ranks, in reference steps."""
    return ALLREDUCE_EXPOSED * 2.0 * (ranks - 1) / ranks if ranks > 1 else 0.0


def seconds(time_ref: float, batch_per_rank: int = 1) -> float:
    """Reference steps as seconds of a step of ``batch_per_rank`` samples per rank (``NOMINAL_SAMPLES_PER_SECOND``
    per rank on the reference GPU)."""
    return time_ref * batch_per_rank / NOMINAL_SAMPLES_PER_SECOND


def training_demand_watts(default_limit_w: float) -> float:
    """What a DDP training load draws at the maximum clock on a board with this default limit."""
    return default_limit_w * TRAINING_DEMAND_SHARE

