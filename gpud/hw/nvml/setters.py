"""Setters, each with a read-back of what the driver took."""

from __future__ import annotations

import ctypes
from typing import Any, Callable

from gpud.errors import Unsupported
from gpud.hw.nvml.constants import (
    CLOCK_OFFSET_V1,
    CLOCK_TYPES,
    COMPUTE_MODES,
    FAN_POLICY,
    FAN_POLICY_AUTO,
    OFFSET_DOMAINS,
    PSTATE_0,
    VF_OFFSET_CALLS,
    ClockOffsetStruct,
    T,
)
from gpud.hw.nvml.readings import NvmlReadings


class NvmlSetters(NvmlReadings):
    """Setters, each with a read-back of what the driver took."""

    # -- setters, each followed by a read-back where NVML has a getter ----------------
    def _set(self, index: int, setter: str, args: tuple[Any, ...], getter: str | None = None,
             getter_args: tuple[Any, ...] = (), convert: Callable[[Any], T] | None = None) -> Any:
        h = self.handle(index)
        with self._lock:  # a tick's sample holds it whole: the slow fields it caches are from before the write
            self.call(setter, h, *args, gpu=index)
            self._slow.pop(index, None)
            if getter is None:
                return None
            value = self.call(getter, h, *getter_args, gpu=index)
        return convert(value) if convert is not None else value

    def set_power_limit(self, index: int, watts: float) -> float:
        """``nvidia-smi -i N -pl W``; returns the limit read back (W)."""
        return float(self._set(index, "nvmlDeviceSetPowerManagementLimit", (int(round(watts * 1000)),),
                         "nvmlDeviceGetPowerManagementLimit", convert=lambda mw: mw / 1000.0))

    def set_locked_gpu_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """``nvidia-smi -i N -lgc MIN,MAX``. NVML has no getter: nothing to read back."""
        self._set(index, "nvmlDeviceSetGpuLockedClocks", (min_mhz, max_mhz))

    def reset_locked_gpu_clocks(self, index: int) -> None:
        """``nvidia-smi -i N -rgc``."""
        self._set(index, "nvmlDeviceResetGpuLockedClocks", ())

    def set_locked_memory_clocks(self, index: int, min_mhz: int, max_mhz: int) -> None:
        """``nvidia-smi -i N -lmc MIN,MAX``. No getter."""
        self._set(index, "nvmlDeviceSetMemoryLockedClocks", (min_mhz, max_mhz))

    def reset_locked_memory_clocks(self, index: int) -> None:
        """``nvidia-smi -i N -rmc``."""
        self._set(index, "nvmlDeviceResetMemoryLockedClocks", ())

    def set_applications_clocks(self, index: int, memory_mhz: int, graphics_mhz: int) -> tuple[int, int]:
        """``nvidia-smi -i N -ac MEM,GFX``; returns (memory, graphics) read back."""
        self._set(index, "nvmlDeviceSetApplicationsClocks", (memory_mhz, graphics_mhz))
        h = self.handle(index)
        return (
            self.call("nvmlDeviceGetApplicationsClock", h, CLOCK_TYPES["memory"], gpu=index),
            self.call("nvmlDeviceGetApplicationsClock", h, CLOCK_TYPES["graphics"], gpu=index),
        )

    def reset_applications_clocks(self, index: int) -> None:
        """``nvidia-smi -i N -rac``."""
        self._set(index, "nvmlDeviceResetApplicationsClocks", ())

    def set_clock_offset(self, index: int, domain: str, mhz: int) -> int | None:
        """P0's clock offset in ``domain`` (graphics, memory), MHz (0: none); returns the offset read back
        (the driver rounds to the step its hardware takes). ``nvmlDeviceSetClockOffsets`` where the driver
        has it (R555 on), else ``nvmlDeviceSetGpcClkVfOffset`` / ``nvmlDeviceSetMemClkVfOffset``."""
        h = self.handle(index)
        with self._lock:
            try:
                fn = self._c_function("nvmlDeviceSetClockOffsets", index)
            except Unsupported:
                fn = None  # a driver before R555 (FUNCTION_NOT_FOUND): the per-domain call
            if fn is not None:
                arg = ClockOffsetStruct(version=CLOCK_OFFSET_V1, type=OFFSET_DOMAINS[domain], pstate=PSTATE_0,
                                        clockOffsetMHz=int(mhz))
                self.calls += 1
                self._c_check(fn(h, ctypes.byref(arg)), "nvmlDeviceSetClockOffsets", index)
            else:
                self.call(VF_OFFSET_CALLS[domain][2], h, int(mhz), gpu=index)
            self._slow.pop(index, None)
            return self.clock_offset_now(index, h, domain)

    def set_persistence_mode(self, index: int, enabled: bool) -> bool:
        """``nvidia-smi -i N -pm 1|0``; returns the mode read back."""
        return bool(self._set(index, "nvmlDeviceSetPersistenceMode", (1 if enabled else 0,),
                         "nvmlDeviceGetPersistenceMode", convert=bool))

    def set_compute_mode(self, index: int, mode: str) -> str:
        """``nvidia-smi -i N -c MODE``; returns the mode read back."""
        code = {v: k for k, v in COMPUTE_MODES.items()}[mode]
        return str(self._set(index, "nvmlDeviceSetComputeMode", (code,), "nvmlDeviceGetComputeMode",
                         convert=lambda c: COMPUTE_MODES.get(c, str(c))))

    def set_fan_speed(self, index: int, fan: int, percent: int) -> int:
        """Manual fan duty (``nvidia-settings -a GPUTargetFanSpeed``); returns the target read back."""
        return int(self._set(index, "nvmlDeviceSetFanSpeed_v2", (fan, int(percent)),
                         "nvmlDeviceGetTargetFanSpeed", (fan,), convert=int))

    def fan_policy(self, index: int, fan: int) -> str | None:
        """The fan's control policy now (``auto`` or ``manual``), past the slow fields' 10 s cache; None
        where NVML cannot say."""
        out = self.get_out("nvmlDeviceGetFanControlPolicy_v2", self.handle(index), fan, gpu=index)
        return FAN_POLICY.get(out[0], str(out[0])) if out is not None else None

    def set_fan_auto(self, index: int, fan: int) -> str:
        """Hand the fan back to the driver's automatic policy; returns the policy read back."""
        h = self.handle(index)
        with self._lock:  # as ``_set``: the slow fields dropped after the write, not before
            self.call("nvmlDeviceSetDefaultFanSpeed_v2", h, fan, gpu=index)
            out = self.get_out("nvmlDeviceGetFanControlPolicy_v2", h, fan, gpu=index)
            if out is not None and out[0] != FAN_POLICY_AUTO:
                self.call("nvmlDeviceSetFanControlPolicy", h, fan, FAN_POLICY_AUTO, gpu=index)
                out = self.get_out("nvmlDeviceGetFanControlPolicy_v2", h, fan, gpu=index)
            self._slow.pop(index, None)
        return FAN_POLICY.get(out[0], "auto") if out is not None else "auto"
