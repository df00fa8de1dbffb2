"""Telemetry the burn-in follows each second of the GPUs' time, and the figures judged from it.

Readings come from ``Nvml.telemetry`` (through the NVML layer); time from the ``Bench`` (wall
time on hardware, simulated time on a simulated workstation).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from gpud.model import GpuSample

# NVIDIA's clock-event reasons that mean the hardware itself slowed down (nvml.h,
# nvmlClocksEventReasons: HW slowdown, HW thermal slowdown, HW power brake slowdown).
HW_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass
class Point:
    t: float  # seconds since the burn-in began (the GPUs' time)
    phase: str
    temperature_c: int | None
    fan_percent: int | None
    sm_mhz: int | None
    power_w: float | None
    limit_w: float | None
    reasons: tuple[str, ...]
    pcie_gen: int | None
    pcie_width: int | None
    utilization: int | None
    load_share: float | None = None  # targeted power: the load's work as a share of its largest

    def json(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "phase": self.phase, "temperature_c": self.temperature_c,
                "fan_percent": self.fan_percent, "sm_mhz": self.sm_mhz, "power_w": self.power_w,
                "limit_w": self.limit_w, "reasons": list(self.reasons), "pcie_gen": self.pcie_gen,
                "pcie_width": self.pcie_width, "utilization": self.utilization, "load_share": self.load_share}


def point(t: float, phase: str, s: GpuSample) -> Point:
    fans = [f.speed_percent for f in s.fans if f.speed_percent is not None]
    return Point(t, phase, s.temperature_celsius, int(round(sum(fans) / len(fans))) if fans else None,
                 s.clocks_mhz.get("sm"), s.power_watts, s.power_limit_watts, tuple(s.clock_events or ()),
                 s.pcie_generation, s.pcie_width, s.utilization_gpu_percent)


@dataclass
class Check:
    """What the load's checked products showed between two readings (``gpud.probe.stress.Checked``): how
    many products, how many differed bit for bit from the GPU's first, the last one's checksum (compared
    with the siblings'), and the GPU's temperature then."""

    t: float
    phase: str
    temperature_c: int | None
    products: int
    wrong: int
    words: int
    checksum: int | None
    first: int | None
    n: int | None = None  # the matrix dimension (targeted power sizes the load): checksums compare at one size
    by_dtype: dict[str, int] | None = None  # the wrong products per dtype (fp32, tf32, bf16)

    def json(self) -> dict[str, Any]:
        return {"t": round(self.t, 3), "phase": self.phase, "temperature_c": self.temperature_c,
                "products": self.products, "wrong": self.wrong, "words": self.words, "checksum": self.checksum,
                "first": self.first, "n": self.n, "by_dtype": self.by_dtype}


@dataclass
class Series:
    gpu: int
    points: list[Point] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    reference: dict[str, Any] | None = None  # the first product's rows against the host's float64 product
    check_error: str | None = None  # the checked load could not run: why

    def of(self, *phases: str) -> list[Point]:
        return [p for p in self.points if p.phase in phases]

    def seconds_in(self, reason: str, pts: list[Point]) -> float:
        """Seconds with ``reason`` active: each reading stands for the interval up to the next one."""
        total = 0.0
        for a, b in zip(pts, pts[1:], strict=False):
            if reason in a.reasons:
                total += b.t - a.t
        return total


def settle(pts: list[Point], band: float) -> tuple[float | None, float | None]:
    """(the settled temperature, seconds from the first point until every later reading stays within
    ``band`` of it), the settled temperature being the mean of the last tenth of the readings; the
    seconds are None when the readings never stay in the band."""
    temps = [(p.t, p.temperature_c) for p in pts if p.temperature_c is not None]
    if len(temps) < 10:
        return None, None
    tail = temps[-max(1, len(temps) // 10):]
    final = statistics.fmean(v for _, v in tail)
    start = temps[0][0]
    since = None
    for t, v in reversed(temps):
        if abs(v - final) > band:
            break
        since = t
    if since is None or since == tail[0][0] and abs(tail[0][1] - final) > band:
        return final, None
    return final, since - start


def cv(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean else None
