"""A GPU's static information (read once, cached), its clock offsets, thresholds and temperature."""

from __future__ import annotations

import ctypes
from typing import Any

from gpud.errors import (
    DriverNotLoaded,
    GpuLost,
    NvmlError,
)
from gpud.hw.nvml.constants import (
    AFFINITY_SCOPE_NODE,
    ARCHITECTURES,
    CLOCK_OFFSET_V1,
    CLOCK_TYPES,
    CPU_SET_WORDS,
    FI_TLIMIT,
    MAX_NVLINKS,
    NVLINK_CAP_SLI_BRIDGE,
    OFFSET_DOMAINS,
    PSTATE_0,
    TEMPERATURE_GPU,
    THRESHOLD_ACOUSTIC_CURR,
    THRESHOLD_GPU_MAX,
    THRESHOLD_SHUTDOWN,
    THRESHOLD_SLOWDOWN,
    VF_OFFSET_CALLS,
    ClockOffsetStruct,
)
from gpud.hw.nvml.handles import NvmlClient
from gpud.hw.nvml.values import _bits, _text, field_int, normalize_bus_id, watts
from gpud.model import (
    SLOW_OPEN_S,
    GpuInfo,
)


class Info:
    """A GPU's static information (read once, cached), its clock offsets, thresholds and temperature."""

    def __init__(self, client: NvmlClient) -> None:
        self._c = client
        self._info: dict[int, GpuInfo] = {}
        self._sli: dict[int, tuple[bool | None, ...]] = {}  # per NVLink: an SLI bridge's (its capability)
        client.on_renumber(self._forget)

    def _forget(self) -> None:
        self._info.clear()
        self._sli.clear()

    def cached(self, index: int) -> GpuInfo | None:
        """The static facts if they were read already (also for a GPU lost since)."""
        return self._info.get(index)

    def drop(self, index: int) -> None:
        """Forget GPU ``index``'s facts (read when it was lost: read again when it comes back)."""
        self._info.pop(index, None)

    def sli_links(self, index: int) -> tuple[bool | None, ...]:
        """Each NVLink's SLI-bridge capability, as ``info`` read them (the links there are)."""
        return self._sli.get(index, ())

    def info(self, index: int) -> GpuInfo:
        cached = self._info.get(index)
        if cached is not None:
            return cached
        c = self._c
        h, get = c.reader(index)

        pci = c.call("nvmlDeviceGetPciInfo", h, gpu=index)
        constraints = get("nvmlDeviceGetPowerManagementLimitConstraints") or (None, None)
        fan_count = get("nvmlDeviceGetNumFans")
        fan_range = (c.get_out("nvmlDeviceGetMinMaxFanSpeed", h, outputs=2, gpu=index) if fan_count
                     else None) or (None, None)
        mem = get("nvmlDeviceGetMemoryInfo")
        serial = get("nvmlDeviceGetSerial")
        vbios = get("nvmlDeviceGetVbiosVersion")
        numa = get("nvmlDeviceGetMemoryAffinity", 1, AFFINITY_SCOPE_NODE)
        numa_nodes = _bits(numa) if numa is not None else ()
        if not numa_nodes:
            node = get("nvmlDeviceGetNumaNodeId")
            numa_nodes = (node,) if node is not None and node >= 0 else ()
        cpus = get("nvmlDeviceGetCpuAffinity", CPU_SET_WORDS)
        thresholds = {
            "slowdown": get("nvmlDeviceGetTemperatureThreshold", THRESHOLD_SLOWDOWN),
            "shutdown": get("nvmlDeviceGetTemperatureThreshold", THRESHOLD_SHUTDOWN),
            "max_operating": get("nvmlDeviceGetTemperatureThreshold", THRESHOLD_GPU_MAX),
        }
        if None in thresholds.values():
            for k, v in self._tlimit_thresholds(index, h).items():
                thresholds[k] = thresholds[k] if thresholds[k] is not None else v
        links: list[bool | None] = []
        for link in range(MAX_NVLINKS):
            try:
                c.call("nvmlDeviceGetNvLinkState", h, link, gpu=index)
            except (GpuLost, DriverNotLoaded):
                raise
            except NvmlError:
                break
            cap = get("nvmlDeviceGetNvLinkCapability", link, NVLINK_CAP_SLI_BRIDGE)
            links.append(bool(cap) if cap is not None else None)
        self._sli[index] = tuple(links)
        info = GpuInfo(
            index=index,
            uuid=_text(c.call("nvmlDeviceGetUUID", h, gpu=index)),
            name=_text(c.call("nvmlDeviceGetName", h, gpu=index)),
            serial=_text(serial) if serial else None,
            pci_bus_id=normalize_bus_id(pci.busId),
            pci_device_id=getattr(pci, "pciDeviceId", None),
            architecture=ARCHITECTURES.get(arch, str(arch)) if (arch := get("nvmlDeviceGetArchitecture")) is not None
            else None,
            vbios_version=_text(vbios) if vbios is not None else None,
            memory_total_bytes=mem.total if mem is not None else None,
            pcie_max_generation=get("nvmlDeviceGetMaxPcieLinkGeneration"),
            pcie_max_width=get("nvmlDeviceGetMaxPcieLinkWidth"),
            power_default_limit_watts=watts(get("nvmlDeviceGetPowerManagementDefaultLimit")),
            power_min_limit_watts=watts(constraints[0]),
            power_max_limit_watts=watts(constraints[1]),
            temperature_slowdown_celsius=thresholds["slowdown"],
            temperature_shutdown_celsius=thresholds["shutdown"],
            max_clocks_mhz={k: get("nvmlDeviceGetMaxClockInfo", v) for k, v in CLOCK_TYPES.items()},
            fan_count=fan_count,
            fan_min_speed_percent=fan_range[0],
            fan_max_speed_percent=fan_range[1],
            nvlink_count=len(links),
            numa_node=numa_nodes[0] if numa_nodes else None,
            cpu_affinity=_bits(cpus) if cpus is not None else None,
            pcie_gpu_max_generation=get("nvmlDeviceGetGpuMaxPcieLinkGeneration"),
            temperature_max_operating_celsius=thresholds["max_operating"],
            temperature_target_celsius=get("nvmlDeviceGetTemperatureThreshold", THRESHOLD_ACOUSTIC_CURR),
            default_applications_clocks_mhz={
                k: get("nvmlDeviceGetDefaultApplicationsClock", CLOCK_TYPES[k]) for k in ("graphics", "memory")
            },
            clock_offset_ranges_mhz={d: span for d in OFFSET_DOMAINS
                                     if (span := self.clock_offset_range(index, h, d)) is not None},
            open_seconds=slow if (slow := round(c.open_seconds(index) or 0.0, 1)) >= SLOW_OPEN_S else None,
        )
        self._info[index] = info
        return info

    def clock_offset_range(self, index: int, h: Any, domain: str) -> tuple[int, int] | None:
        """The clock offsets the driver allows in P0 for ``domain`` (graphics, memory): (min, max) MHz; None
        where the GPU or the driver has none. ``nvmlDeviceGetClockOffsets`` through the C function
        (nvidia-ml-py's wrapper drops its return code: a Not Supported would read as 0 in 0..0), else the
        per-domain ``MinMax`` VF-offset call of drivers before R555."""
        got = self._clock_offsets_struct(index, h, domain)
        if self._c.gone("nvmlDeviceGetClockOffsets"):
            span = self._c.get_out(VF_OFFSET_CALLS[domain][1], h, outputs=2, gpu=index, signed=True)
            return (span[0], span[1]) if span is not None else None
        return (got[1], got[2]) if got is not None else None

    def clock_offset_now(self, index: int, h: Any, domain: str) -> int | None:
        """P0's offset in ``domain``, MHz, in one call with either driver (the range is ``GpuInfo``'s)."""
        got = self._clock_offsets_struct(index, h, domain)
        if self._c.gone("nvmlDeviceGetClockOffsets"):
            offset = self._c.get(VF_OFFSET_CALLS[domain][0], h, gpu=index)
            return int(offset) if offset is not None else None
        return got[0] if got is not None else None

    def _clock_offsets_struct(self, index: int, h: Any, domain: str) -> tuple[int, int, int] | None:
        def read() -> tuple[int, int, int]:
            out = ClockOffsetStruct(version=CLOCK_OFFSET_V1, type=OFFSET_DOMAINS[domain], pstate=PSTATE_0)
            with self._c.lock:  # as ``call``: one call at a time through gpud, counted
                fn = self._c.c_function("nvmlDeviceGetClockOffsets", index)
                self._c.c_check(self._c.c_call(fn, h, ctypes.byref(out)), "nvmlDeviceGetClockOffsets", index)
            return int(out.clockOffsetMHz), int(out.minClockOffsetMHz), int(out.maxClockOffsetMHz)

        got: tuple[int, int, int] | None = self._c.optional(("nvmlDeviceGetClockOffsets", index, (domain,)), read)
        return got

    def supported_memory_clocks(self, index: int) -> tuple[int, ...] | None:
        """The memory clocks the GPU can run at, MHz, highest first (``nvmlDeviceGetSupportedMemoryClocks``;
        ``nvidia-smi -q -d SUPPORTED_CLOCKS``): what ``nvmlDeviceSetMemoryLockedClocks`` may be given.
        None where NVML cannot say (Not Supported)."""
        got = self._c.get("nvmlDeviceGetSupportedMemoryClocks", self._c.handle(index), gpu=index)
        if not got:
            return None
        return tuple(sorted({int(c) for c in got}, reverse=True))

    def _tlimit_thresholds(self, index: int, h: Any) -> dict[str, int | None]:
        """Absolute thresholds from T.Limit offsets: threshold = temperature + margin − offset (the
        offset is where the margin stands when the threshold is reached). Empty without the margin
        call (nvidia-ml-py before 12.570) or the fields."""
        margin = self._c.optional(("nvmlDeviceGetMarginTemperature", index, ()), lambda: self._margin(h, index))
        temp = self.temperature(h, index)
        ids = list(FI_TLIMIT.values())
        values = self._c.optional(("nvmlDeviceGetFieldValues", index, tuple(ids)),
                                  lambda: self._c.field_values(h, ids, gpu=index))
        if margin is None or temp is None or values is None:
            return {}
        out: dict[str, int | None] = {}
        for (key, _), v in zip(FI_TLIMIT.items(), values, strict=False):
            got = field_int(v)
            if got is not None:
                out[key] = int(temp) + int(margin) - got[0]
        return out

    def _margin(self, h: Any, index: int) -> int:
        """``nvmlDeviceGetMarginTemperature`` — through the C function with nvml.h's versioned struct
        where the bindings (nvidia-ml-py before 12.570) have no wrapper for it."""
        if hasattr(self._c.module, "nvmlDeviceGetMarginTemperature"):
            return int(self._c.call("nvmlDeviceGetMarginTemperature", h, gpu=index))

        class Margin(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint), ("marginTemperature", ctypes.c_int)]

        out = Margin(version=ctypes.sizeof(Margin) | 1 << 24)  # NVML_STRUCT_VERSION(MarginTemperature, 1)
        fn = self._c.c_function("nvmlDeviceGetMarginTemperature", index)
        self._c.c_check(self._c.c_call(fn, h, ctypes.byref(out)), "nvmlDeviceGetMarginTemperature", index)
        return int(out.marginTemperature)

    def temperature(self, h: Any, index: int) -> int | None:
        """GPU temperature: ``nvmlDeviceGetTemperature``, deprecated ("will be removed in CUDA 14.0"),
        then its successor ``nvmlDeviceGetTemperatureV`` where the first is gone."""
        t = self._c.get("nvmlDeviceGetTemperature", h, TEMPERATURE_GPU, gpu=index)
        if t is None and self._c.gone("nvmlDeviceGetTemperature"):
            t = self._c.get("nvmlDeviceGetTemperatureV", h, TEMPERATURE_GPU, gpu=index)
        return int(t) if t is not None else None
