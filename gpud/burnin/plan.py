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
                                "deterministic kernels (gpu-burn compares results the same way)"),
    "gemm.reference": Threshold(1, "relative error against a float64 host product within 4× the format's unit "
                                   "roundoff (bf16 2^-8, tf32 2^-10, fp32 2^-20 with sqrt(k) growth; Higham, ch. 3)"),
    "spread": Threshold(0.03, "within 3 % of the median of the GPUs of the same model (siblings)"),
    "outlier_z": Threshold(3.5, "a modified z-score 0.6745 (x - median) / MAD above 3.5 among the siblings "
                                "(Iglewicz and Hoaglin, 1993): robust on a handful of GPUs, where '3 sigma' of the "
                                "values themselves cannot fire below 11"),
    "host_bandwidth": Threshold(0.8, "at least 80 % of what the PCIe link should carry (the probe's expected "
                                     "bandwidth, gpud.probe.expect, docs/probe.md)"),
    "memtest": Threshold(0, "no mismatching word (DCGM memtest/memory plugins fail on any error)"),
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
    "new_errors": Threshold(0, "no new Xid, ECC error or PCIe replay during the run"),
}


@dataclass(frozen=True)
class Plan:
    """What one level runs. Times are seconds of the GPUs' time (simulated time on a simulated
    workstation, where they pass as fast as the code runs)."""

    level: Level
    load_s: float  # the load held while the GEMM and bandwidth figures are measured, with telemetry
    memtest: bool
    targeted_power_s: float
    pulse_steps: int
    pulse_s: float  # each half of a load step
    soak_s: float
    gemm_seconds: float  # per dtype, in the child (wall time)


def plan_for(level: Level, duration_s: float | None = None) -> Plan:
    if level == "quick":
        return Plan(level, 60.0, False, 0.0, 0, 0.0, 0.0, 2.0)
    if level == "standard":
        # DCGM targeted power: test_duration 120 s (nvvs/plugin_src/targeted_power defaults).
        return Plan(level, 60.0, True, 120.0, 5, 15.0, 0.0, 5.0)
    return Plan(level, 60.0, True, 120.0, 5, 15.0, float(duration_s or 1800.0), 5.0)
