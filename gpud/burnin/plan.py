"""The burn-in's levels (what each runs, for how long) and its thresholds, each with its source.

A threshold is a published default (DCGM's plugins, NVIDIA's documented clock-event reasons, the
probe's expected bandwidths, the issue's acceptance figures) or relative to the machine itself (the
GPU's siblings of the same model, its own link's maximum). docs/burnin.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["quick", "standard", "soak"]
LEVELS: tuple[Level, ...] = ("quick", "standard", "soak")


@dataclass(frozen=True)
class Threshold:
    value: float
    source: str


THRESHOLDS: dict[str, Threshold] = {
    "gemm.digest": Threshold(0, "bit-identical results across GPUs of one model on the same inputs with "
                                "deterministic kernels (gpu-burn compares each result with its own first within "
                                "an epsilon; deterministic kernels allow bit for bit)"),
    "checked": Threshold(0, "every product of the load (targeted power, load steps, soak) the same bits as the GPU's "
                            "first product of the same inputs (fp32, deterministic kernels); gpu-burn compares each "
                            "iteration's result with its first for the whole run (within an epsilon), heat being "
                            "when a marginal GPU starts to err"),
    "load.reference": Threshold(1, "the first product's leading rows within Higham's bound of the host's float64 "
                                   "product: |C - fl(AB)| <= gamma_k |A||B|, gamma_k = k u / (1 - k u), u = 2^-24 "
                                   "(Higham, Accuracy and Stability of Numerical Algorithms, 2002, eq. 3.13)"),
    "gemm.reference": Threshold(1, "each element of a 64x64 product within Higham's bound of the float64 host "
                                   "product: (2 u_in + gamma_k(u_acc) + u_out) |A||B| (tf32 inputs 2^-11, fp32 "
                                   "sums 2^-24, a bf16 result 2^-8; Higham, Accuracy and Stability of Numerical "
                                   "Algorithms, 2002, eq. 3.13)"),
    "spread": Threshold(0.03, "within 3 % of the median of the GPUs of the same model (siblings)"),
    "outlier_z": Threshold(3.5, "a modified z-score 0.6745 (x - median) / MAD above 3.5 among the siblings "
                                "(Iglewicz and Hoaglin, 1993): robust on a handful of GPUs, where '3 sigma' of the "
                                "values themselves cannot fire below 11"),
    # A healthy link delivers less than its nominal rate (TLP headers, framing, flow-control DLLPs): pinned
    # copies on Gen4 x16 land about 24-26 GB/s of its 31.5, which 80 % of nominal (25.2) failed. The figure
    # a link of that generation and width is expected to carry is NCCL's model of it (kvDictPciGen: 24 GB/s
    # for Gen4 x16, 76 % of nominal; gpud.probe.expect.PCIE_LANE_MODEL). What the test must catch are links
    # at half or less (x8, or a generation down), which land at or below 50 % of that: 80 % of NCCL's figure
    # separates the two with a margin either side.
    "host_bandwidth": Threshold(0.8, "at least 80 % of what NCCL's topology model expects of the link's "
                                     "generation and width (kvDictPciGen: 24 GB/s for Gen4 x16; gpud.probe.expect, "
                                     "docs/probe.md): a healthy link lands at 100-110 % of it, one at half its "
                                     "width or a generation down at 50 %"),
    "memtest": Threshold(0, "no mismatching word in any pattern (DCGM's memtest and memory plugins fail on any "
                            "error)"),
    "targeted_power": Threshold(0.95, "mean draw at least 95 % of the enforced limit while the load wants more "
                                      "(stricter than DCGM targeted power's 0.75× lower bound)"),
    "hw_slowdown_s": Threshold(0, "HW slowdown, HW thermal slowdown, HW power brake: 0 s (nvml.h: the hardware "
                                  "halves clocks or more; DCGM's diagnostics fail on them)"),
    "sw_thermal_share": Threshold(0.01, "SW thermal slowdown under 1 % of the time (the driver is holding the GPU "
                                        "at its operating limit: the cooling does not keep up)"),
    "settle_s": Threshold(600, "temperature settles within ±2 °C of its equilibrium within 10 minutes"),
    "settle_band_c": Threshold(2, "±2 °C band around the settled temperature"),
    "curve_equilibrium_c": Threshold(2, "±2 °C of the fan curve's equilibrium under the load (the issue's "
                                        "acceptance): the temperature at which the curve asks the duty measured "
                                        "over the soak's settled last tenth (the curve from the applied profile); "
                                        "below it by up to the curve's hysteresis more (a duty a rising reading "
                                        "set is held until the temperature falls that far)"),
    "target_c": Threshold(2, "at most 2 °C above the driver's target temperature (NVML_TEMPERATURE_THRESHOLD_"
                             "ACOUSTIC_CURR, nvidia-smi's \"GPU Target Temperature\"): the automatic fan policy "
                             "holds a loaded GPU at or below it"),
    "clock_cv": Threshold(0.01, "SM clock coefficient of variation at most 1 % after settling"),
    "link": Threshold(1, "under load the link runs at its own maximum generation and width (NVML's max link, "
                         "the lower of the GPU's and the slot's)"),
    "new_errors": Threshold(0, "no new Xid, ECC error or NVLink replay/recovery error during the run"),
    # DCGM's DcgmGpuHardwareLimits.h: "8 replays per minute is the maximum recommended by RM"
    # (DCGM_LIMIT_MAX_PCIREPLAY_RATE); below it a new replay is a warning.
    "pcie_replay_rate": Threshold(8, "PCIe replays at most 8 a minute (DCGM_LIMIT_MAX_PCIREPLAY_RATE: \"the maximum "
                                     "recommended by RM\"); fewer new ones warn"),
    # DcgmGpuHardwareLimits.h: "CRC errors only matter at rates of 100+ per second"
    # (DCGM_LIMIT_MAX_LWLINK_CRC_ERROR 100.0); replay and recovery errors: DCGM_LIMIT_MAX_LWLINK_ERROR 1.
    "nvlink_crc_rate": Threshold(100, "NVLink CRC errors under 100 a second (DCGM_LIMIT_MAX_LWLINK_CRC_ERROR); "
                                      "any replay or recovery error fails (DCGM_LIMIT_MAX_LWLINK_ERROR 1)"),
    # DcgmGpuHardwareLimits.h: DCGM_LIMIT_MAX_RETIRED_PAGES 60, DCGM_LIMIT_MAX_RETIRED_PAGES_SOFT_LIMIT 15.
    "retired_pages": Threshold(60, "fewer than 60 retired pages and none pending (DCGM_LIMIT_MAX_RETIRED_PAGES); "
                                   "15 or more warn (its soft limit)"),
    "retired_pages_soft": Threshold(15, "DCGM_LIMIT_MAX_RETIRED_PAGES_SOFT_LIMIT"),
    "remapped_rows": Threshold(0, "no failed row remap (nvmlDeviceGetRemappedRows: a failure means no spare row "
                                  "was left); a pending remap warns: it applies at the next GPU reset"),
}


@dataclass(frozen=True)
class Plan:
    """What one level runs. Times are seconds of the GPUs' time (simulated time on a simulated
    workstation, where they pass as fast as the code runs)."""

    level: Level
    load_s: float  # the load held while the GEMM and bandwidth figures are measured, with telemetry
    memtest_s: float  # the memory test's passes, then its bit-fade pass (0: none)
    targeted_power_s: float
    pulse_steps: int
    pulse_s: float  # each half of a load step
    soak_s: float
    gemm_seconds: float  # per dtype, in the child (wall time)

    @property
    def memtest(self) -> bool:
        return self.memtest_s > 0

    @property
    def memtest_fade_s(self) -> float:
        """The bit-fade pass's wait after each of its two patterns: a tenth of the memory test's time (60 s of
        the default 10 minutes; memtest86+'s test 10 "sleeps for a period of time" and names none: a choice,
        not a published figure)."""
        return self.memtest_s / 10.0

    @property
    def soak_sample_s(self) -> float:
        """Seconds between the soak's readings: each second up to 2 hours, then at most 7 200 readings per
        GPU (a 24-hour soak reads every 12 s), which bounds the result file and the report (a reading a second
        of four GPUs for 24 hours is 345 600 points, about 80 MB of JSON)."""
        return max(1.0, self.soak_s / 7200.0)


# DCGM's memtest plugin runs 600 s by default (its test_duration; dcgmi diag -r 4, or -r memtest).
MEMTEST_S = 600.0


def plan_for(level: Level, duration_s: float | None = None, memtest_s: float | None = None) -> Plan:
    if level == "quick":
        return Plan(level, 60.0, 0.0, 0.0, 0, 0.0, 0.0, 2.0)
    mem = float(MEMTEST_S if memtest_s is None else memtest_s)
    if level == "standard":
        # DCGM targeted power: test_duration 120 s (nvvs/plugin_src/targeted_power defaults).
        return Plan(level, 60.0, mem, 120.0, 5, 15.0, 0.0, 5.0)
    return Plan(level, 60.0, mem, 120.0, 5, 15.0, float(duration_s or 1800.0), 5.0)


def next_share(share: float, power_w: float | None, target_w: float, max_w: float | None) -> float:
    """Targeted power's closed loop, DCGM's way (nvvs plugin ``TargetedPower.cpp``, ``RecalcMatrixDim``): a
    target at 90 % or more of the board's maximum power takes the largest load ("if we're targeting close to
    max power, just go for it"); otherwise the load's work (n² of the matrix dimension) follows the percent
    difference between the draw and the target, ramping up fast from far below (-50 % or less) and left alone
    within ±5 %. ``share``: the load's work as a share of its largest."""
    if max_w is not None and target_w >= 0.9 * max_w:
        return 1.0
    if power_w is None or power_w <= 0:
        return share
    diff = 200.0 * (power_w - target_w) / (power_w + target_w)  # DCGM's PercentDiff
    if diff <= -50.0:
        return min(1.0, share * 2.0)
    if abs(diff) >= 5.0:
        return max(0.01, min(1.0, share * target_w / power_w))
    return share
