"""A stand-in for the ``pynvml`` module, backed by a ``SimMachine``.

Same function names, argument order, units and return shapes as nvidia-ml-py, the real
``NVML_*`` constants and the real ``pynvml.NVMLError_*`` exception classes, so that
``gpud.hw.nvml`` cannot tell it from the real bindings.
"""

from __future__ import annotations

import functools
import os
import signal
from types import SimpleNamespace
from typing import Any, Callable

import pynvml

from gpud.sim.machine import SimMachine

E = pynvml  # error codes and classes come from the real bindings

_IDLE_SM_MHZ, _IDLE_MEM_MHZ = 210, 405
_TOPO_SINGLE, _TOPO_MULTIPLE, _TOPO_HOSTBRIDGE, _TOPO_NODE, _TOPO_SYSTEM = 10, 20, 30, 40, 50
_P2P_CODES = {"OK": 0, "chipset_not_supported": 1, "gpu_not_supported": 2, "topology_not_supported": 3,
              "disabled_by_regkey": 4, "not_supported": 5, "unknown": 6}
_EVENT_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
               "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
               "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}


class Handle:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<sim nvmlDevice {self.index}>"


def _raise(code: int) -> None:
    raise E.NVMLError(code)


def nvml_setter(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A write: guarded like any call, then run under the state lock on the freshest state."""

    @functools.wraps(fn)
    def wrapper(self: FakeNvml, *args: Any) -> Any:
        self._guard(fn.__name__, args)
        with self.sim.mutate():
            return fn(self, *args)

    return wrapper


def nvml_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Guard every call: initialised, GPU not lost, and the declared NotSupported/NoPermission."""

    @functools.wraps(fn)
    def wrapper(self: FakeNvml, *args: Any) -> Any:
        self._guard(fn.__name__, args)
        return fn(self, *args)

    return wrapper


class FakeNvml:
    """Module-like object: ``Nvml(FakeNvml(machine))`` works like ``Nvml(pynvml)``."""

    NVMLError = E.NVMLError

    def __init__(self, machine: SimMachine) -> None:
        self.sim = machine
        self._init_count = 0
        for name in dir(E):  # constants and NVMLError_* classes, exactly as the real module has them
            if name.startswith(("NVML_", "NVMLError", "nvmlClocks")):
                setattr(self, name, getattr(E, name))

    # -- guards ---------------------------------------------------------------------
    def _guard(self, call: str, args: tuple[Any, ...]) -> None:
        if self._init_count <= 0:
            _raise(E.NVML_ERROR_UNINITIALIZED)
        self.sim.refresh()
        gpus = [a.index for a in args if isinstance(a, Handle)]
        for g in gpus:
            if self.sim.lost(g):
                _raise(E.NVML_ERROR_GPU_IS_LOST)
        gpu = gpus[0] if gpus else None
        if self.sim.refused("unsupported", call, gpu):
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        if self.sim.refused("no_permission", call, gpu):
            _raise(E.NVML_ERROR_NO_PERMISSION)

    def _write(self, h: Handle) -> None:
        """Every setter starts here: count the write, fire a fault armed for this write number."""
        kind = self.sim.write_fault(self.sim.count_write())
        if kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies between two writes
        if kind == "gpu_lost":
            _raise(E.NVML_ERROR_GPU_IS_LOST)
        if kind == "no_permission":
            _raise(E.NVML_ERROR_NO_PERMISSION)

    def _gpu(self, h: Handle) -> dict[str, Any]:
        return self.sim.desc.gpus[h.index]

    def _set(self, h: Handle) -> dict[str, Any]:
        return self.sim.settings(h.index)

    # -- system ---------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if not self.sim.desc.machine["driver_loaded"]:
            _raise(E.NVML_ERROR_DRIVER_NOT_LOADED)
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        if self._init_count <= 0:
            _raise(E.NVML_ERROR_UNINITIALIZED)
        self._init_count -= 1

    @nvml_function
    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.sim.desc.machine["driver_version"])

    @nvml_function
    def nvmlSystemGetNVMLVersion(self) -> str:
        return str(self.sim.desc.machine["nvml_version"])

    @nvml_function
    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        major, _, minor = str(self.sim.desc.machine["cuda_driver_version"]).partition(".")
        return int(major) * 1000 + int(minor or 0) * 10

    def _visible(self) -> list[int]:
        """Description indices NVML enumerates: a GPU off the bus stays on PCI but not here."""
        gone = {p["gpu"] for p in self.sim.faults_of("off_bus")}
        return [i for i in range(len(self.sim.desc.gpus)) if i not in gone]

    @nvml_function
    def nvmlDeviceGetCount(self) -> int:
        return len(self._visible())

    @nvml_function
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        visible = self._visible()
        if not 0 <= index < len(visible):
            _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        if self.sim.lost(visible[index]):
            _raise(E.NVML_ERROR_GPU_IS_LOST)
        return Handle(visible[index])

    # -- identity ---------------------------------------------------------------------
    @nvml_function
    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        return str(self._gpu(h)["uuid"])

    @nvml_function
    def nvmlDeviceGetName(self, h: Handle) -> str:
        return str(self._gpu(h)["name"])

    @nvml_function
    def nvmlDeviceGetSerial(self, h: Handle) -> str:
        return str(self._gpu(h)["serial"])

    @nvml_function
    def nvmlDeviceGetArchitecture(self, h: Handle) -> int:
        names = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8,
                 "hopper": 9, "blackwell": 10}
        return names.get(str(self._gpu(h)["architecture"]), 0xFFFFFFFF)

    @nvml_function
    def nvmlDeviceGetVbiosVersion(self, h: Handle) -> str:
        return str(self._gpu(h)["vbios"])

    @nvml_function
    def nvmlDeviceGetPciInfo(self, h: Handle) -> SimpleNamespace:
        return self._pci(self._gpu(h))

    @staticmethod
    def _pci(g: dict[str, Any]) -> SimpleNamespace:
        dom, bus, devfn = g["bus_id"].split(":")
        dev = devfn.split(".")[0]
        bus_id = f"{int(dom, 16):08X}:{bus.upper()}:{dev.upper()}.{devfn.split('.')[1]}".encode()
        return SimpleNamespace(busId=bus_id, busIdLegacy=bus_id[4:], domain=int(dom, 16), bus=int(bus, 16),
                               device=int(dev, 16), pciDeviceId=g["pci_device_id"], pciSubSystemId=0x14A210DE)

    @nvml_function
    def nvmlDeviceGetMemoryAffinity(self, h: Handle, node_set_size: int, scope: int) -> list[int]:
        words = [0] * node_set_size
        node = self._gpu(h)["numa_node"]
        words[node // 64] |= 1 << (node % 64)
        return words

    @nvml_function
    def nvmlDeviceGetNumaNodeId(self, h: Handle) -> int:
        return int(self._gpu(h)["numa_node"])

    @nvml_function
    def nvmlDeviceGetCpuAffinity(self, h: Handle, cpu_set_size: int) -> list[int]:
        words = [0] * cpu_set_size
        for cpu in node_cpus(self.sim.desc.machine, self._gpu(h)["numa_node"]):
            if cpu // 64 < cpu_set_size:
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    # -- thermal and fans ---------------------------------------------------------------
    @nvml_function
    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        return int(round(self.sim.temperature(h.index)))

    @nvml_function
    def nvmlDeviceGetTemperatureThreshold(self, h: Handle, threshold: int) -> int:
        g = self._gpu(h)
        if threshold == E.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN:
            return int(g["slowdown_celsius"])
        if threshold == E.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN:
            return int(g["shutdown_celsius"])
        _raise(E.NVML_ERROR_NOT_SUPPORTED)
        return 0

    @nvml_function
    def nvmlDeviceGetNumFans(self, h: Handle) -> int:
        return int(self._gpu(h)["fans"])

    def _fan(self, h: Handle, fan: int) -> dict[str, Any]:
        fans = self._set(h)["fans"]
        if not fans:
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= fan < len(fans):
            _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        return fans[fan]

    @nvml_function
    def nvmlDeviceGetFanSpeed(self, h: Handle) -> int:
        return self.nvmlDeviceGetFanSpeed_v2(h, 0)

    @nvml_function
    def nvmlDeviceGetFanSpeed_v2(self, h: Handle, fan: int) -> int:
        self._fan(h, fan)
        self.sim.step()
        return self.sim.fan_duty(h.index, fan)

    @nvml_function
    def nvmlDeviceGetTargetFanSpeed(self, h: Handle, fan: int) -> int:
        f = self._fan(h, fan)
        if f["policy"] == 1 and f["target"] is not None:
            return int(f["target"])
        g = self._gpu(h)
        from gpud.sim.machine import auto_fan_percent

        return auto_fan_percent(self.sim.temperature(h.index), g["fan_min_percent"] or 0)

    @nvml_function
    def nvmlDeviceGetMinMaxFanSpeed(self, h: Handle) -> list[int]:
        g = self._gpu(h)
        if not g["fans"]:
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        return [int(g["fan_min_percent"]), int(g["fan_max_percent"])]

    @nvml_function
    def nvmlDeviceGetFanControlPolicy_v2(self, h: Handle, fan: int) -> int:
        return int(self._fan(h, fan)["policy"])

    @nvml_setter
    def nvmlDeviceSetFanSpeed_v2(self, h: Handle, fan: int, speed: int) -> int:
        self._write(h)
        f = self._fan(h, fan)
        g = self._gpu(h)
        if not g["fan_min_percent"] <= speed <= g["fan_max_percent"]:
            _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        self.sim.step()
        f["policy"], f["target"] = 1, int(speed)
        return 0

    @nvml_setter
    def nvmlDeviceSetDefaultFanSpeed_v2(self, h: Handle, fan: int) -> int:
        self._write(h)
        f = self._fan(h, fan)
        self.sim.step()
        f["policy"], f["target"] = 0, None
        return 0

    @nvml_setter
    def nvmlDeviceSetFanControlPolicy(self, h: Handle, fan: int, policy: int) -> int:
        self._write(h)
        f = self._fan(h, fan)
        if policy not in (0, 1):
            _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        self.sim.step()
        f["policy"] = int(policy)
        if policy == 0:
            f["target"] = None
        return 0

    # -- power --------------------------------------------------------------------------
    @nvml_function
    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return int(self.sim.draw_watts(h.index) * 1000)

    @nvml_function
    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> int:
        return int(self._set(h)["power_limit_mw"])

    @nvml_function
    def nvmlDeviceGetPowerManagementLimit(self, h: Handle) -> int:
        return int(self._set(h)["power_limit_mw"])

    @nvml_function
    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: Handle) -> int:
        return int(self._gpu(h)["power_default_watts"] * 1000)

    @nvml_function
    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: Handle) -> list[int]:
        g = self._gpu(h)
        return [int(g["power_min_watts"] * 1000), int(g["power_max_watts"] * 1000)]

    @nvml_function
    def nvmlDeviceGetTotalEnergyConsumption(self, h: Handle) -> int:
        self.sim.step()
        return int(self.sim.thermal[h.index].energy_mj)

    @nvml_setter
    def nvmlDeviceSetPowerManagementLimit(self, h: Handle, limit_mw: int) -> None:
        self._write(h)
        g = self._gpu(h)
        if not g["power_min_watts"] * 1000 <= limit_mw <= g["power_max_watts"] * 1000:
            _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        self.sim.step()
        self._set(h)["power_limit_mw"] = int(limit_mw)

    # -- clocks ---------------------------------------------------------------------------
    def _events(self, h: Handle) -> int:
        i = h.index
        g = self._gpu(h)
        mask = 0
        for p in self.sim.faults_of("clock_events", i):
            for r in p["reasons"]:
                mask |= _EVENT_BITS[r]
        if self.sim.utilization(i) == 0:
            mask |= _EVENT_BITS["gpu_idle"]
        if self.sim.demand_watts(i) > self._set(h)["power_limit_mw"] / 1000.0:
            mask |= _EVENT_BITS["sw_power_cap"]
        if self.sim.temperature(i) >= g["slowdown_celsius"]:
            mask |= _EVENT_BITS["hw_slowdown"] | _EVENT_BITS["hw_thermal_slowdown"]
        return mask

    @nvml_function
    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> int:
        return self._events(h)

    @nvml_function
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Handle) -> int:
        return self._events(h)

    @nvml_function
    def nvmlDeviceGetMaxClockInfo(self, h: Handle, clock: int) -> int:
        g = self._gpu(h)
        return int({0: g["max_graphics_mhz"], 1: g["max_sm_mhz"], 2: g["max_memory_mhz"]}[clock])

    @nvml_function
    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> int:
        i, g, s = h.index, self._gpu(h), self._set(h)
        if clock == E.NVML_CLOCK_MEM:
            if self.sim.utilization(i) == 0:
                return _IDLE_MEM_MHZ if not s["locked_mem"] else int(s["locked_mem"][0])
            return int(s["locked_mem"][1] if s["locked_mem"] else g["max_memory_mhz"])
        if self.sim.utilization(i) == 0:
            return _IDLE_SM_MHZ if not s["locked_gpu"] else int(s["locked_gpu"][0])
        top = float(s["locked_gpu"][1] if s["locked_gpu"] else g["max_sm_mhz"])
        demand, limit = self.sim.demand_watts(i), s["power_limit_mw"] / 1000.0
        if demand > limit:
            top *= (limit / demand) ** (1 / 3)  # dynamic power ~ f³
        if self._events(h) & _EVENT_BITS["hw_slowdown"]:
            top *= 0.5
        return int(top)

    @nvml_function
    def nvmlDeviceGetApplicationsClock(self, h: Handle, clock: int) -> int:
        g, s = self._gpu(h), self._set(h)
        if s["app_clocks"]:
            return int(s["app_clocks"][0] if clock == E.NVML_CLOCK_MEM else s["app_clocks"][1])
        return int(g["max_memory_mhz"] if clock == E.NVML_CLOCK_MEM else g["max_graphics_mhz"])

    def _clock_write(self, h: Handle, key: str, value: list[int] | None, limit_key: str | None = None) -> None:
        """A locked range (min ≤ max ≤ the model's maximum), application clocks, or None to reset."""
        self._write(h)
        if value is not None and limit_key is not None:
            g = self._gpu(h)
            if value[0] > value[1] or value[0] < 0 or value[1] > g[limit_key]:
                _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        self._set(h)[key] = value

    @nvml_setter
    def nvmlDeviceSetGpuLockedClocks(self, h: Handle, min_mhz: int, max_mhz: int) -> None:
        self._clock_write(h, "locked_gpu", [int(min_mhz), int(max_mhz)], "max_sm_mhz")

    @nvml_setter
    def nvmlDeviceResetGpuLockedClocks(self, h: Handle) -> None:
        self._clock_write(h, "locked_gpu", None)

    @nvml_setter
    def nvmlDeviceSetMemoryLockedClocks(self, h: Handle, min_mhz: int, max_mhz: int) -> None:
        self._clock_write(h, "locked_mem", [int(min_mhz), int(max_mhz)], "max_memory_mhz")

    @nvml_setter
    def nvmlDeviceResetMemoryLockedClocks(self, h: Handle) -> None:
        self._clock_write(h, "locked_mem", None)

    @nvml_setter
    def nvmlDeviceSetApplicationsClocks(self, h: Handle, mem_mhz: int, gfx_mhz: int) -> None:
        g = self._gpu(h)
        if mem_mhz > g["max_memory_mhz"] or gfx_mhz > g["max_graphics_mhz"]:
            self._write(h)
            _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        self._clock_write(h, "app_clocks", [int(mem_mhz), int(gfx_mhz)])

    @nvml_setter
    def nvmlDeviceResetApplicationsClocks(self, h: Handle) -> None:
        self._clock_write(h, "app_clocks", None)

    # -- modes ----------------------------------------------------------------------------
    @nvml_function
    def nvmlDeviceGetPersistenceMode(self, h: Handle) -> int:
        return int(self._set(h)["persistence"])

    @nvml_setter
    def nvmlDeviceSetPersistenceMode(self, h: Handle, mode: int) -> None:
        self._write(h)
        self._set(h)["persistence"] = 1 if mode else 0

    @nvml_function
    def nvmlDeviceGetComputeMode(self, h: Handle) -> int:
        return int(self._set(h)["compute_mode"])

    @nvml_setter
    def nvmlDeviceSetComputeMode(self, h: Handle, mode: int) -> None:
        self._write(h)
        if mode not in (0, 2, 3):
            _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        self._set(h)["compute_mode"] = int(mode)

    # -- utilisation, memory, processes ------------------------------------------------
    @nvml_function
    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> SimpleNamespace:
        u = self.sim.utilization(h.index)
        return SimpleNamespace(gpu=u, memory=int(u * 0.6))

    @nvml_function
    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> SimpleNamespace:
        g = self._gpu(h)
        total = g["memory_mib"] << 20
        used = (g["memory_used_mib"] + sum(p["used_mib"] for p in g["processes"])) << 20
        return SimpleNamespace(total=total, used=min(used, total), free=max(total - used, 0))

    @nvml_function
    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used_mib"] << 20, gpuInstanceId=0xFFFFFFFF,
                                computeInstanceId=0xFFFFFFFF) for p in self._gpu(h)["processes"]]

    # -- PCIe ------------------------------------------------------------------------------
    def _link(self, h: Handle) -> tuple[int, int]:
        g = self._gpu(h)
        return link_state(self.sim, h.index, g)

    @nvml_function
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Handle) -> int:
        return self._link(h)[0]

    @nvml_function
    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Handle) -> int:
        return self._link(h)[1]

    @nvml_function
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Handle) -> int:
        return int(self._gpu(h)["pcie_max_generation"])

    @nvml_function
    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Handle) -> int:
        return int(self._gpu(h)["pcie_max_width"])

    @nvml_function
    def nvmlDeviceGetPcieThroughput(self, h: Handle, counter: int) -> int:
        u = self.sim.utilization(h.index)
        return int(u * (40960 if counter == E.NVML_PCIE_UTIL_TX_BYTES else 81920))  # KB/s

    @nvml_function
    def nvmlDeviceGetPcieReplayCounter(self, h: Handle) -> int:
        return int(self._gpu(h)["pcie_replay_errors"])

    # -- ECC and memory health ------------------------------------------------------------
    @nvml_function
    def nvmlDeviceGetEccMode(self, h: Handle) -> list[int]:
        g = self._gpu(h)
        if not g["ecc_supported"]:
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        pending = g["ecc_enabled"] if g["ecc_pending_enabled"] is None else g["ecc_pending_enabled"]
        return [1 if g["ecc_enabled"] else 0, 1 if pending else 0]

    @nvml_function
    def nvmlDeviceGetTotalEccErrors(self, h: Handle, error_type: int, counter_type: int) -> int:
        g = self._gpu(h)
        if not (g["ecc_supported"] and g["ecc_enabled"]):
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        scope = "volatile" if counter_type == E.NVML_VOLATILE_ECC else "aggregate"
        kind = "corrected" if error_type == E.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
        return int(g[f"ecc_{scope}_{kind}"])

    @nvml_function
    def nvmlDeviceGetRetiredPages(self, h: Handle, cause: int) -> list[int]:
        g = self._gpu(h)
        if not g["retired_pages_supported"]:
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        n = g["retired_pages_sbe"] if cause == 0 else g["retired_pages_dbe"]
        return [0x1000 * (k + 1) for k in range(n)]

    @nvml_function
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: Handle) -> int:
        g = self._gpu(h)
        if not g["retired_pages_supported"]:
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        return 1 if g["retired_pages_pending"] else 0

    @nvml_function
    def nvmlDeviceGetRemappedRows(self, h: Handle) -> tuple[int, int, int, int]:
        g = self._gpu(h)
        if not g["remapped_rows_supported"]:
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        return (g["remapped_rows_correctable"], g["remapped_rows_uncorrectable"],
                int(g["remapped_rows_pending"]), int(g["remapped_rows_failure"]))

    # -- NVLink and topology ---------------------------------------------------------------
    def _peer(self, i: int, link: int) -> tuple[int | None, bool]:
        """(GPU at the other end of this link, is it up)."""
        g = self.sim.desc.gpus[i]
        if not 0 <= link < g["nvlinks"]:
            _raise(E.NVML_ERROR_INVALID_ARGUMENT)
        for b in self.sim.desc.nvlinks:
            if i in b["gpus"] and link < b["links"]:
                other = b["gpus"][1] if b["gpus"][0] == i else b["gpus"][0]
                for p in self.sim.faults_of("nvlink_down", i):
                    if other in p["gpus"] and (p["links"] is None or link in p["links"]):
                        return other, False
                if self.sim.lost(other):
                    return other, False
                return other, True
        return None, False

    @nvml_function
    def nvmlDeviceGetNvLinkState(self, h: Handle, link: int) -> int:
        return 1 if self._peer(h.index, link)[1] else 0

    @nvml_function
    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: Handle, link: int) -> SimpleNamespace:
        other, up = self._peer(h.index, link)
        if other is None or not up:
            _raise(E.NVML_ERROR_NOT_SUPPORTED)
        return self._pci(self.sim.desc.gpus[other])  # type: ignore[index]

    @nvml_function
    def nvmlDeviceGetNvLinkCapability(self, h: Handle, link: int, capability: int) -> int:
        other, _ = self._peer(h.index, link)
        if capability == E.NVML_NVLINK_CAP_SLI_BRIDGE:
            return 1 if other is not None else 0
        return 1

    @nvml_function
    def nvmlDeviceGetTopologyCommonAncestor(self, h1: Handle, h2: Handle) -> int:
        return common_ancestor(self.sim.desc.machine, self._gpu(h1), self._gpu(h2))

    @nvml_function
    def nvmlDeviceGetP2PStatus(self, h1: Handle, h2: Handle, index: Any) -> int:
        index = index[0] if isinstance(index, tuple) else index
        pair = {h1.index, h2.index}
        caps = {0: "read", 1: "write", 2: "nvlink"}.get(index, "other")
        for p in self.sim.faults_of("p2p"):
            if set(p["gpus"]) == pair and (p["caps"] == "all" or p["caps"] == caps):
                return _P2P_CODES[p["status"]]
        if caps == "nvlink":
            g = self._gpu(h1)
            up = any(self._peer(h1.index, ln) == (h2.index, True) for ln in range(g["nvlinks"]))
            return 0 if up else _P2P_CODES["not_supported"]
        return 0


def node_cpus(machine: dict[str, Any], node: int) -> list[int]:
    """Linux numbering: physical cores of all sockets first, then their hyper-thread siblings."""
    per_socket = machine["cores_per_socket"]
    per_node = per_socket // machine["numa_nodes_per_socket"]
    total = per_socket * machine["sockets"]
    cores = list(range(node * per_node, (node + 1) * per_node))
    if machine["threads_per_core"] > 1:
        cores += [c + total for c in cores]
    return cores


def socket_of(machine: dict[str, Any], node: int) -> int:
    return node // machine["numa_nodes_per_socket"]


def host_bridge(g: dict[str, Any]) -> str:
    dom, bus, _ = g["root_port"].split(":")
    return f"{dom}:{bus}"


def common_ancestor(machine: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> int:
    if a["switch"] and a["switch"] == b["switch"]:
        return _TOPO_SINGLE
    if a["root_port"] == b["root_port"]:
        return _TOPO_MULTIPLE
    if host_bridge(a) == host_bridge(b):
        return _TOPO_HOSTBRIDGE
    if socket_of(machine, a["numa_node"]) == socket_of(machine, b["numa_node"]):
        return _TOPO_NODE
    return _TOPO_SYSTEM


def link_state(sim: SimMachine, index: int, g: dict[str, Any]) -> tuple[int, int]:
    """(current PCIe generation, width) after link_degraded faults."""
    gen, width = int(g["pcie_max_generation"]), int(g["pcie_max_width"])
    for p in sim.faults_of("link_degraded", index):
        gen = p["generation"] or gen
        width = p["width"] or width
    return gen, width
