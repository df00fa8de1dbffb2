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
from gpud.hw.nvml.counters import Counters
from gpud.hw.nvml.handles import NvmlClient
from gpud.hw.nvml.info import Info


class Setters:
    """Setters, each with a read-back of what the driver took. A write drops the GPU's slow fields (its
    settings as last read): the next sample reads them afresh."""

    def __init__(self, client: NvmlClient, info: Info, counters: Counters) -> None:
        self._c = client
        self._info = info
        self._counters = counters

    def _set(self, index: int, setter: str, args: tuple[Any, ...], getter: str | None = None,
             getter_args: tuple[Any, ...] = (), convert: Callable[[Any], T] | None = None) -> Any:
        c = self._c
        h = c.handle(index)
        with c.lock:  # a tick's sample holds it whole: the slow fields it caches are from before the write
            c.call(setter, h, *args, gpu=index)
            self._counters.drop(index)
            if getter is None:
                return None
            value = c.call(getter, h, *getter_args, gpu=index)
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
        h = self._c.handle(index)
        return (
            self._c.call("nvmlDeviceGetApplicationsClock", h, CLOCK_TYPES["memory"], gpu=index),
            self._c.call("nvmlDeviceGetApplicationsClock", h, CLOCK_TYPES["graphics"], gpu=index),
        )

    def reset_applications_clocks(self, index: int) -> None:
        """``nvidia-smi -i N -rac``."""
        self._set(index, "nvmlDeviceResetApplicationsClocks", ())

    def set_clock_offset(self, index: int, domain: str, mhz: int) -> int | None:
        """P0's clock offset in ``domain`` (graphics, memory), MHz (0: none); returns the offset read back
        (the driver rounds to the step its hardware takes). ``nvmlDeviceSetClockOffsets`` where the driver
        has it (R555 on), else ``nvmlDeviceSetGpcClkVfOffset`` / ``nvmlDeviceSetMemClkVfOffset``."""
        c = self._c
        h = c.handle(index)
        with c.lock:
            try:
                fn = c.c_function("nvmlDeviceSetClockOffsets", index)
            except Unsupported:
                fn = None  # a driver before R555 (FUNCTION_NOT_FOUND): the per-domain call
            if fn is not None:
                arg = ClockOffsetStruct(version=CLOCK_OFFSET_V1, type=OFFSET_DOMAINS[domain], pstate=PSTATE_0,
                                        clockOffsetMHz=int(mhz))
                c.c_check(c.c_call(fn, h, ctypes.byref(arg)), "nvmlDeviceSetClockOffsets", index)
            else:
                c.call(VF_OFFSET_CALLS[domain][2], h, int(mhz), gpu=index)
            self._counters.drop(index)
            return self._info.clock_offset_now(index, h, domain)

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
        out = self._c.get_out("nvmlDeviceGetFanControlPolicy_v2", self._c.handle(index), fan, gpu=index)
        return FAN_POLICY.get(out[0], str(out[0])) if out is not None else None

    def set_fan_auto(self, index: int, fan: int) -> str:
        """Hand the fan back to the driver's automatic policy; returns the policy read back."""
        c = self._c
        h = c.handle(index)
        with c.lock:  # as ``_set``: the slow fields dropped after the write, not before
            c.call("nvmlDeviceSetDefaultFanSpeed_v2", h, fan, gpu=index)
            out = c.get_out("nvmlDeviceGetFanControlPolicy_v2", h, fan, gpu=index)
            if out is not None and out[0] != FAN_POLICY_AUTO:
                c.call("nvmlDeviceSetFanControlPolicy", h, fan, FAN_POLICY_AUTO, gpu=index)
                out = c.get_out("nvmlDeviceGetFanControlPolicy_v2", h, fan, gpu=index)
            self._counters.drop(index)
        return FAN_POLICY.get(out[0], "auto") if out is not None else "auto"
