"""Helpers that turn NVML's answers into gpud's values (bus ids, field values, driver releases, bit sets)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from gpud.hw.nvml.constants import FI_THERMAL_VIOLATIONS, FI_VIOLATIONS
from gpud.model import EccCounts, NvLinkInfo


@dataclass(frozen=True)
class SlowFields:
    """A GPU's readings that change only when someone sets them, or slowly (``Nvml._slow_fields``, read every
    ``SLOW_EVERY_S``), as NVML gave them: None where it could not."""

    ecc_mode: Any  # (current, pending) of nvmlDeviceGetEccMode
    ecc: EccCounts | None  # read only with ECC on
    sbe: Any  # retired pages: single-bit, double-bit, pending
    dbe: Any
    retired_pending: Any
    remap: Any  # (correctable, uncorrectable, pending, failure) of nvmlDeviceGetRemappedRows
    replay: int | None  # PCIe replays
    fan_policies: list[int | None]  # each fan's control policy
    persistence: int | None
    compute: int | None  # NVML's compute-mode code
    mig: Any  # (current, pending) of nvmlDeviceGetMigMode
    management_limit: int | None  # mW, as set
    applications_clocks: dict[str, int | None]
    pcie_width: int | None
    nvlink_errors: tuple[tuple[int, str, int], ...] | None
    nvlinks: tuple[NvLinkInfo, ...]
    violations: dict[str, int] | None
    nvlink_data: tuple[tuple[int, str, int], ...] | None
    clock_offsets: dict[str, int]  # P0's, per domain that has them


def watts(mw: Any) -> float | None:
    """NVML's milliwatts (or millijoules) in watts (joules); None stays None."""
    return mw / 1000.0 if mw is not None else None


def normalize_bus_id(raw: str | bytes) -> str:
    """NVML's ``00000000:17:00.0`` → sysfs's ``0000:17:00.0`` (lower case)."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    text = text.strip().lower()
    parts = text.split(":")
    if len(parts) == 3:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    if len(parts) == 2:  # no domain
        return f"0000:{parts[0]}:{parts[1]}"
    return text


class GpuProcessEntry:
    """One entry of NVML's process list (the fields gpud uses, as the bindings name them)."""

    __slots__ = ("pid", "usedGpuMemory", "kind", "sm", "gi", "ci")

    def __init__(self, pid: int, used: int | None, kind: str = "compute", gi: int | None = None,
                 ci: int | None = None) -> None:
        self.pid = pid
        self.usedGpuMemory = used
        self.kind = kind
        self.sm: int | None = None  # SM use from nvmlDeviceGetProcessUtilization
        self.gi = gi  # the MIG instance it runs in (gpuInstanceId, computeInstanceId); None without MIG
        self.ci = ci


def _hashable(arg: Any) -> Any:
    """A cache key for an argument. The real bindings' device handles are ctypes pointers, which
    cannot be hashed: such a handle is keyed by the address it points at (stable while NVML runs)."""
    if isinstance(arg, list):
        return tuple(arg)
    try:
        hash(arg)
        return arg
    except TypeError:
        if isinstance(arg, ctypes._Pointer) and arg:
            return ("handle", ctypes.addressof(arg.contents))
        return ("object", repr(arg))


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


# nvmlValueType_t → the union's member and its width in bits (the integer ones)
FIELD_INTS = {1: ("uiVal", 32), 2: ("ulVal", 64), 3: ("ullVal", 64), 4: ("sllVal", 64), 5: ("siVal", 32)}


def field_int(v: Any) -> tuple[int, int] | None:
    """(value, width in bits) of an integer ``nvmlFieldValue_t``; None when it failed or is no integer."""
    if v.nvmlReturn != 0:
        return None
    kind = FIELD_INTS.get(int(v.valueType))
    if kind is None:
        return None
    return int(getattr(v.value, kind[0])), kind[1]


def driver_release(version: str | None) -> tuple[int, int] | None:
    """``580.65.06`` → (580, 65); None when it is not a driver version."""
    parts = (version or "").split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def violation_fields(driver: str | None) -> dict[int, str]:
    """The violation-counter field ids this driver gives, and the clock-event reason each counts."""
    release = driver_release(driver)
    out = dict(FI_VIOLATIONS)
    for first, ids in FI_THERMAL_VIOLATIONS:
        if release is not None and release >= first:
            out.update(ids)
            break
    return out


def _bits(words: Any) -> tuple[int, ...]:
    out = []
    for w, word in enumerate(words):
        word = int(word)
        for b in range(64):
            if word >> b & 1:
                out.append(w * 64 + b)
    return tuple(out)
