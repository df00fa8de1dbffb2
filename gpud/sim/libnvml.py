"""The simulated NVML C library: what ``libnvidia-ml.so.1`` exports, over a ``SimMachine``.

The real ``pynvml`` (nvidia-ml-py, whatever version is installed) runs unchanged on top of it:
``gpud.sim.bindings`` loads a private copy of that module whose ``nvmlLib`` is a ``SimLibrary``
instead of the driver's ``CDLL``. ``pynvml`` resolves each entry point by name
(``getattr(nvmlLib, "nvmlDeviceGetTemperature")``); a name this library does not export raises
``AttributeError``, which ``pynvml`` turns into ``NVML_ERROR_FUNCTION_NOT_FOUND`` as it does for
an old driver. Each entry point takes the C arguments ``pynvml`` passes (``c_uint`` values,
``byref(...)`` pointers, structures, arrays and string buffers), writes its outputs through the
pointers and returns an ``nvmlReturn_t`` code, as the C library does (nvml.h).

Every call costs at least the latency the ``LatencyModel`` gives it (docs/simulation.md, "Call
latency"), so a tick that makes blocking calls is as slow here as on real hardware.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from gpud.model import P2P_STATUSES
from gpud.sim.description import GpuSpec
from gpud.sim.machine import SimMachine
from gpud.sim.physics import CLOCK_GRAPHICS, CLOCK_MEM, CLOCK_SM
from gpud.sim.topology import common_ancestor, link_state, node_cpus, nvlink_peer

# nvmlReturn_t (nvml.h)
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
INSUFFICIENT_POWER = 8
DRIVER_NOT_LOADED = 9
IRQ_ISSUE = 11
GPU_IS_LOST = 15
LIB_RM_VERSION_MISMATCH = 18
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

ERROR_TEXT = {26: "Requested functionality has been deprecated",
              SUCCESS: "Success", UNINITIALIZED: "Uninitialized", INVALID_ARGUMENT: "Invalid Argument",
              NOT_SUPPORTED: "Not Supported", NO_PERMISSION: "Insufficient Permissions", NOT_FOUND: "Not Found",
              INSUFFICIENT_SIZE: "Insufficient Size", DRIVER_NOT_LOADED: "Driver Not Loaded",
              GPU_IS_LOST: "GPU is lost", 13: "Function Not Found", UNKNOWN: "Unknown Error",
              ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
              INSUFFICIENT_POWER: "Insufficient External Power", IRQ_ISSUE: "Interrupt request issue",
              LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch."}
HANDLE_ERRORS = {"insufficient_power": INSUFFICIENT_POWER, "irq_issue": IRQ_ISSUE}

IDLE_SM_MHZ, IDLE_MEM_MHZ = 210, 405
ARCH_CODES = {"kepler": 2, "maxwell": 3, "pascal": 4, "volta": 5, "turing": 6, "ampere": 7, "ada": 8,
              "hopper": 9, "blackwell": 10}
P2P_CODES = {name: code for code, name in enumerate(P2P_STATUSES)}
FI_PCIE_COUNT_TX_BYTES, FI_PCIE_COUNT_RX_BYTES = 197, 198  # NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES
# NVML_FI_DEV_CLOCKS_EVENT_REASON_*: time in each reason since the driver loaded, in ns. 74 and 76 are the
# older NVML_FI_DEV_PERF_POLICY_POWER / _SYNC_BOOST ids. The thermal ones were renumbered: 251–253 in
# nvml.h 12.9 and 13.0 (drivers 575 to 580.65), 269–271 from nvml.h 13.1 (drivers from 580.82); the other
# triple holds power-smoothing settings in each, which no modelled GPU has (Not Supported).
FI_VIOLATIONS = {74: "sw_power_cap", 76: "sync_boost"}
FI_THERMAL_OLD = {251: "sw_thermal_slowdown", 252: "hw_thermal_slowdown", 253: "hw_power_brake_slowdown"}
FI_THERMAL_NEW = {269: "sw_thermal_slowdown", 270: "hw_thermal_slowdown", 271: "hw_power_brake_slowdown"}
THERMAL_IDS_RENUMBERED = (580, 82)  # the first driver with the thermal ids at 269–271
VIOLATION_FIELDS_FROM_DRIVER = 580  # the first driver whose nvidia-smi prints "Clocks Event Reasons Counters"
# nvmlPerfPolicyType_t → the reason its violation time counts (nvml.h's translation table).
PERF_POLICIES = {0: "sw_power_cap", 1: "sw_thermal_slowdown", 2: "sync_boost"}
# NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/_RX (KiB, scopeId = link); RAW (140/141) is not modelled.
FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX = 138, 139
PROCESS_SAMPLES_KEPT = 5  # samples per process in the driver's buffer (one per second): a model
VALUE_TYPE_ULL = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
NVLINK_DEVICE_GPU, NVLINK_DEVICE_SWITCH = 0, 2
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN, THRESHOLD_MEM_MAX, THRESHOLD_GPU_MAX = 0, 1, 2, 3
THRESHOLD_ACOUSTIC_CURR = 5  # nvidia-smi's "GPU Target Temperature" (nvml.h, pynvml.py)
SLI_BRIDGE_CAP = 4  # NVML_NVLINK_CAP_SLI_BRIDGE


class NvmlReturn(Exception):
    """An entry point's non-success return code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def fail(code: int) -> Any:
    raise NvmlReturn(code)


@dataclass
class LatencyModel:
    """How long each entry point takes on real hardware, at least (seconds).

    Sources are in docs/simulation.md. A call that the simulator answers faster is made to wait
    the rest, so tick times measured here are not kinder than the hardware's.
    """

    # A plain reading: about 22 µs a call measured on an RTX 5080 (4 readings in 0.09 ms), 11.6 µs
    # for GetMemoryInfo on an RTX 4090 laptop.
    default_s: float = 20e-6
    # Opening a GPU that is not initialised (persistence mode off, no other client): "order of 1-3 second
    # startup cost per GPU due to ECC scrubbing" (NVIDIA driver-persistence documentation); the upper end.
    # GPUD_SIM_GPU_INIT_S overrides it (the test suite shortens it; tests of it use the default).
    gpu_init_s: float = field(default_factory=lambda: float(os.environ.get("GPUD_SIM_GPU_INIT_S") or 3.0))
    per_call: dict[str, float] = field(default_factory=lambda: {
        # "… sampled over a 20 ms interval" (NVML reference, nvmlDeviceGetPcieThroughput).
        "nvmlDeviceGetPcieThroughput": 20e-3,
        # Measured on an RTX 4090 laptop (median): the process lists talk to the GPU's firmware.
        "nvmlDeviceGetComputeRunningProcesses_v3": 4.5e-3,
        "nvmlDeviceGetComputeRunningProcesses_v2": 4.5e-3,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": 4.5e-3,  # the same list, of graphics clients
        "nvmlDeviceGetGraphicsRunningProcesses_v2": 4.5e-3,
        # Not measured anywhere we found; it reads the same per-process accounting as the lists.
        "nvmlDeviceGetProcessUtilization": 4.5e-3,
        "nvmlDeviceGetFanSpeed": 137e-6,
        "nvmlDeviceGetFanSpeed_v2": 137e-6,
    })

    def of(self, name: str, args: tuple[Any, ...] = ()) -> float:
        if name == "nvmlDeviceGetFieldValues" and len(args) >= 2:
            # No measurement of how its cost grows with the ids asked was found: each id is taken
            # to cost a plain reading (the stricter; an H200 asks 36 NVLink ids in one call).
            return self.default_s * max(1, int(value_of(args[1])))
        return self.per_call.get(name, self.default_s)


def effective_uid() -> int:
    """The caller's uid as the driver sees it. ``GPUD_SIM_EUID`` stands in for running under sudo
    (the test suite sets 0); unset, it is the process's own."""
    value = os.environ.get("GPUD_SIM_EUID", "")
    return int(value) if value.isdigit() else os.geteuid()


def wait_until(deadline: float) -> None:
    """Sleep for long waits, spin for the last part (``time.sleep`` overshoots short waits)."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if left > 2e-3:
            time.sleep(left - 1e-3)


# -- C argument handling --------------------------------------------------------------------------
_CARG = type(ctypes.byref(ctypes.c_int()))


def _target(p: Any) -> Any:
    """What a C output argument points at: ``byref(x)`` → x, ``pointer(x)`` → x, an array → itself."""
    if p is None:
        fail(INVALID_ARGUMENT)
    if isinstance(p, _CARG):
        return p._obj  # type: ignore[attr-defined]
    if isinstance(p, ctypes._Pointer):
        if not p:
            fail(INVALID_ARGUMENT)
        return p.contents
    return p


def store(p: Any, value: Any) -> None:
    t = _target(p)
    if isinstance(value, dict):
        for k, v in value.items():
            setattr(t, k, v)
    elif isinstance(t, ctypes.Array) and not isinstance(value, bytes):
        for i, v in enumerate(value):
            t[i] = v
    else:
        t.value = value


def store_text(buf: Any, size: Any, text: str) -> None:
    """A ``char *`` output of ``size`` bytes: INSUFFICIENT_SIZE when the text and NUL do not fit."""
    data = text.encode()
    if buf is None:
        fail(INVALID_ARGUMENT)
    if len(data) + 1 > value_of(size):
        fail(INSUFFICIENT_SIZE)
    t = _target(buf)
    ctypes.memmove(ctypes.addressof(t), data + b"\0", len(data) + 1)


def value_of(a: Any) -> Any:
    if isinstance(a, ctypes._SimpleCData):
        return a.value
    return a


def _is_handle(a: Any) -> bool:
    return isinstance(a, ctypes._Pointer) and type(a)._type_.__name__ == "struct_c_nvmlDevice_t"


@dataclass(frozen=True)
class Entry:
    impl: Callable[..., Any]
    outs: int | str  # trailing output pointers, "text" for (buffer, size), "raw" for the impl's own
    handles: int
    setter: bool  # changes the hardware: runs under the simulator's state lock, on the freshest state


ENTRIES: dict[str, Entry] = {}


def entry(name: str, outs: int | str = 1, handles: int = 1,
          setter: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        ENTRIES[name] = Entry(fn, outs, handles, setter)
        return fn

    return register


def base_name(name: str) -> str:
    """``nvmlDeviceGetPciInfo_v3`` → ``nvmlDeviceGetPciInfo`` (faults name either)."""
    head, sep, tail = name.rpartition("_v")
    return head if sep and tail.isdigit() else name


# Entry points a driver exports only from a release on (nvml.h of the first CUDA toolkit that declares them).
ENTRY_FROM_DRIVER = {"nvmlDeviceGetMarginTemperature": 570}  # nvml.h 12.8 (R570)
MARGIN_FROM_DRIVER = ENTRY_FROM_DRIVER["nvmlDeviceGetMarginTemperature"]


class SimLibrary:
    """The simulated ``libnvidia-ml.so.1``: ``getattr(lib, name)`` gives a C entry point."""

    def __init__(self, sim: SimMachine, latency: LatencyModel | None = None) -> None:
        self.sim = sim
        self.latency = latency or LatencyModel()
        self._lock = threading.RLock()  # the RM lock: every entry point holds it for its whole duration
        self._init_count = 0
        self._handle_of: dict[int, int] = {}  # address of the handle's struct → description index
        self._structs: dict[int, Any] = {}  # index → the struct a handle points at (kept alive)
        self.spent_s = 0.0  # wall time inside this library (the simulator's own cost and the waits)
        self.modelled_s = 0.0  # the latency model's total for the calls made: what hardware would take
        self.called: Counter[str] = Counter()  # calls per entry point
        self.internal_errors = 0  # Python exceptions inside an entry point: simulator bugs
        lacks = set(sim.desc.machine.driver_lacks)  # an older driver exports fewer entry points
        major = str(sim.desc.machine.driver_version).split(".")[0]
        lacks |= {name for name, first in ENTRY_FROM_DRIVER.items() if not major.isdigit() or int(major) < first}
        self._functions: dict[str, Callable[..., Any]] = {
            name: self._bind(name, e) for name, e in ENTRIES.items() if name not in lacks}
        self._functions["nvmlErrorString"] = self._error_string

        sim.nvlink_up = lambda gpu, link: peer(self, gpu, link)[1]

    def __getattr__(self, name: str) -> Any:
        functions = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(name)  # pynvml: NVML_ERROR_FUNCTION_NOT_FOUND

    @staticmethod
    def _error_string(code: Any) -> bytes:
        return ERROR_TEXT.get(int(value_of(code)), "Unknown Error").encode()

    def exported(self) -> list[str]:
        return sorted(self._functions)

    # -- the C calling convention ----------------------------------------------------------
    def _bind(self, name: str, e: Entry) -> Callable[..., int]:
        def c_function(*args: Any) -> int:
            entered = time.perf_counter()
            latency = self.latency.of(name, args)
            # The driver's resource-manager lock: a call holds it for all of its time, so a slow call
            # (20 ms of PCIe throughput) makes every other thread's call wait (docs/simulation.md).
            with self._lock:
                start = time.perf_counter()
                try:
                    code = self._invoke(name, e, args)
                finally:
                    wait_until(start + latency)
                    self.spent_s += time.perf_counter() - entered
                    self.modelled_s += latency
                    self.called[name] += 1
            return code

        c_function.__name__ = name
        return c_function

    def _invoke(self, name: str, e: Entry, args: tuple[Any, ...]) -> int:
        try:
            if name not in ("nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown") and self._init_count <= 0:
                fail(UNINITIALIZED)
            gpus = [self._gpu_of(a) for a in args[: e.handles]]
            self.guard(name, gpus)
            rest = args[e.handles:]
            if e.setter and effective_uid() != 0:
                fail(NO_PERMISSION)  # NVML's setters need root ("Requires root/admin permissions", nvml.h)
            with self.sim.mutate() if e.setter else nullcontext():
                self._run(e, gpus, rest)
            return SUCCESS
        except NvmlReturn as r:
            return r.code
        except Exception:  # a C library cannot raise: a bug of the simulator, counted and shown
            self.internal_errors += 1
            raise

    def _run(self, e: Entry, gpus: list[int], rest: tuple[Any, ...]) -> None:
        if e.outs == "raw":
            e.impl(self, *gpus, *rest)
        elif e.outs == "text":
            inputs, (buf, size) = rest[:-2], rest[-2:]
            store_text(buf, size, e.impl(self, *gpus, *map(value_of, inputs)))
        else:
            n = int(e.outs)
            inputs, ptrs = (rest[:-n], rest[-n:]) if n else (rest, ())
            if len(ptrs) != n:
                fail(INVALID_ARGUMENT)
            for p in ptrs:
                _target(p)  # a NULL output pointer is INVALID_ARGUMENT before anything runs
            result = e.impl(self, *gpus, *map(value_of, inputs))
            values = () if n == 0 else result if n > 1 else (result,)
            for p, v in zip(ptrs, values, strict=True):
                store(p, v)

    def _gpu_of(self, handle: Any) -> int:
        if not _is_handle(handle) or not handle:
            fail(INVALID_ARGUMENT)
        index = self._handle_of.get(ctypes.addressof(handle.contents))
        if index is None:
            fail(INVALID_ARGUMENT)
        return index  # type: ignore[return-value]

    def guard(self, name: str, gpus: list[int]) -> None:
        """Lost GPUs and the injected NotSupported / NoPermission answers (matched on the name with or
        without its ``_vN`` suffix)."""
        self.sim.refresh()
        for g in gpus:
            if self.sim.lost(g):
                fail(GPU_IS_LOST)
        gpu = gpus[0] if gpus else None
        for call in {name, base_name(name)}:
            if self.sim.refused("unsupported", call, gpu):
                fail(NOT_SUPPORTED)
            if self.sim.refused("no_permission", call, gpu):
                fail(NO_PERMISSION)

    def new_handle(self, out: Any, index: int) -> None:
        target = _target(out)  # a c_nvmlDevice_t (pointer to an opaque struct)
        struct = self._structs.get(index)
        if struct is None:
            struct = type(target)._type_()
            self._structs[index] = struct
            self._handle_of[ctypes.addressof(struct)] = index
        target.contents = struct

    def write(self) -> None:
        """Every setter starts here: count the write, fire a fault armed for this write number."""
        kind = self.sim.write_fault(self.sim.count_write())
        if kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies between two writes
        if kind == "gpu_lost":
            fail(GPU_IS_LOST)
        if kind == "no_permission":
            fail(NO_PERMISSION)

    def gpu(self, i: int) -> GpuSpec:
        return self.sim.desc.gpus[i]

    def settings(self, i: int) -> dict[str, Any]:
        return self.sim.settings(i)

    def visible(self) -> list[int]:
        """Description indices NVML enumerates: a GPU off the bus stays on PCI but not here."""
        gone = {p.gpu for p in self.sim.faults_of("off_bus")}
        return [i for i in range(len(self.sim.desc.gpus)) if i not in gone]


# -- system -------------------------------------------------------------------------------------


def _init(lib: SimLibrary, flags: int = 0) -> None:
    if not lib.sim.desc.machine.driver_loaded:
        fail(DRIVER_NOT_LOADED)
    if lib.sim.faults_of("driver_mismatch"):
        # A driver upgraded without a reboot: the new library finds the old kernel module (nvidia-smi:
        # "Failed to initialize NVML: Driver/library version mismatch").
        fail(LIB_RM_VERSION_MISMATCH)
    lib.sim.client_attach()
    lib._init_count += 1


entry("nvmlInitWithFlags", outs=0, handles=0)(_init)
entry("nvmlInit_v2", outs=0, handles=0)(_init)


@entry("nvmlShutdown", outs=0, handles=0)
def _shutdown(lib: SimLibrary) -> None:
    if lib._init_count <= 0:
        fail(UNINITIALIZED)
    lib._init_count -= 1
    lib.sim.client_detach()


@entry("nvmlSystemGetDriverVersion", outs="text", handles=0)
def _driver_version(lib: SimLibrary) -> str:
    return str(lib.sim.desc.machine.driver_version)


@entry("nvmlSystemGetNVMLVersion", outs="text", handles=0)
def _nvml_version(lib: SimLibrary) -> str:
    return str(lib.sim.desc.machine.nvml_version)


@entry("nvmlSystemGetCudaDriverVersion_v2", handles=0)
@entry("nvmlSystemGetCudaDriverVersion", handles=0)
def _cuda_version(lib: SimLibrary) -> int:
    major, _, minor = str(lib.sim.desc.machine.cuda_driver_version).partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


@entry("nvmlDeviceGetCount_v2", handles=0)
def _count(lib: SimLibrary) -> int:
    return len(lib.visible())


@entry("nvmlDeviceGetHandleByIndex_v2", outs="raw", handles=0)
def _handle_by_index(lib: SimLibrary, index: Any, out: Any) -> None:
    visible = lib.visible()
    i = value_of(index)
    if not 0 <= i < len(visible):
        fail(INVALID_ARGUMENT)
    if lib.sim.lost(visible[i]):
        # A GPU that fell off the bus: drivers answer the handle lookup with Unknown Error
        # (nvidia-smi: "Unable to determine the device handle for GPU …: Unknown Error") or GPU is lost.
        params = [p for p in lib.sim.faults_of("gpu_lost", visible[i]) if p.at_write is None]
        fail(GPU_IS_LOST if params and params[0].handle_error == "gpu_is_lost" else UNKNOWN)
    for refused in lib.sim.faults_of("handle_refused", visible[i]):
        fail(HANDLE_ERRORS[refused.error])  # nvml.h: cables not attached, or an interrupt problem
    if not lib.settings(visible[i]).get("initialised", True):
        # nvml.h: "this API causes NVML to initialize the target GPU"; under the RM lock, so every other
        # call waits too.
        wait_until(time.perf_counter() + lib.latency.gpu_init_s)
        lib.modelled_s += lib.latency.gpu_init_s
        with lib.sim.mutate():
            lib.settings(visible[i])["initialised"] = True
    lib.new_handle(out, visible[i])


# -- identity ---------------------------------------------------------------------------------


@entry("nvmlDeviceGetUUID", outs="text")
def _uuid(lib: SimLibrary, i: int) -> str:
    return str(lib.gpu(i).uuid)


@entry("nvmlDeviceGetName", outs="text")
def _name(lib: SimLibrary, i: int) -> str:
    return str(lib.gpu(i).name)


@entry("nvmlDeviceGetSerial", outs="text")
def _serial(lib: SimLibrary, i: int) -> str:
    return str(lib.gpu(i).serial)


@entry("nvmlDeviceGetVbiosVersion", outs="text")
def _vbios(lib: SimLibrary, i: int) -> str:
    return str(lib.gpu(i).vbios)


@entry("nvmlDeviceGetArchitecture")
def _architecture(lib: SimLibrary, i: int) -> int:
    return ARCH_CODES.get(str(lib.gpu(i).architecture), 0xFFFFFFFF)


def pci_info(address: str, device_id: int, subsystem_id: int) -> dict[str, Any]:
    dom, bus, devfn = address.split(":")
    dev, fn = devfn.split(".")
    bus_id = f"{int(dom, 16):08X}:{bus.upper()}:{dev.upper()}.{fn}".encode()
    return {"busId": bus_id, "busIdLegacy": bus_id[4:], "domain": int(dom, 16), "bus": int(bus, 16),
            "device": int(dev, 16), "pciDeviceId": device_id, "pciSubSystemId": subsystem_id}


@entry("nvmlDeviceGetPciInfo_v3")
@entry("nvmlDeviceGetPciInfo_v2")
def _pci_info(lib: SimLibrary, i: int) -> dict[str, Any]:
    g = lib.gpu(i)
    return pci_info(g.bus_id, g.pci_device_id, g.pci_subsystem_id)


@entry("nvmlDeviceGetMemoryAffinity", outs="raw")
def _memory_affinity(lib: SimLibrary, i: int, size: Any, out: Any, scope: Any) -> None:
    words = [0] * value_of(size)
    node = lib.gpu(i).numa_node
    if node // 64 >= len(words):
        fail(INSUFFICIENT_SIZE)
    words[node // 64] |= 1 << (node % 64)
    store(out, words)


@entry("nvmlDeviceGetNumaNodeId")
def _numa_node(lib: SimLibrary, i: int) -> int:
    return int(lib.gpu(i).numa_node)


@entry("nvmlDeviceGetCpuAffinity", outs="raw")
def _cpu_affinity(lib: SimLibrary, i: int, size: Any, out: Any) -> None:
    words = [0] * value_of(size)
    for cpu in node_cpus(lib.sim.desc.machine, lib.gpu(i).numa_node):
        if cpu // 64 < len(words):
            words[cpu // 64] |= 1 << (cpu % 64)
    store(out, words)


# -- thermal and fans ---------------------------------------------------------------------------


@entry("nvmlDeviceGetTemperature")
def _temperature(lib: SimLibrary, i: int, sensor: int) -> int:
    if sensor != 0:  # NVML_TEMPERATURE_GPU is the only sensor
        fail(INVALID_ARGUMENT)
    return int(round(lib.sim.temperature(i)))


TLIMIT_FIELDS = {193: "shutdown_celsius", 194: "slowdown_celsius", 196: "max_operating_celsius"}
VALUE_TYPE_SIGNED_INT = 5


@entry("nvmlDeviceGetTemperatureThreshold")
def _threshold(lib: SimLibrary, i: int, threshold: int) -> int:
    g = lib.gpu(i)
    if (g.tlimit_thresholds and threshold in (THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN, THRESHOLD_GPU_MAX)
            and driver_major(lib) >= MARGIN_FROM_DRIVER):
        # Ada and later: nvidia-smi prints these only relative to T.Limit ("GPU Slowdown T.Limit Temp: -2 C").
        # Whether the call still answers once nvmlDeviceGetMarginTemperature exists (R570) is not documented:
        # Not Supported, the stricter reading. Before R570 there is no margin call, and nvml.h documents
        # this one: it answers there.
        fail(NOT_SUPPORTED)
    key = {THRESHOLD_SHUTDOWN: "shutdown_celsius", THRESHOLD_SLOWDOWN: "slowdown_celsius",
           THRESHOLD_GPU_MAX: "max_operating_celsius", THRESHOLD_MEM_MAX: "memory_max_celsius",
           # the model's target where its dumps give one ("GPU Target Temperature: 84 C"); N/A there: Not Supported
           THRESHOLD_ACOUSTIC_CURR: "target_celsius"}.get(threshold)
    if key is None or getattr(g, key) is None:
        fail(NOT_SUPPORTED)
    return int(getattr(g, str(key)))


MARGIN_V1 = 8 | 1 << 24  # nvmlMarginTemperature_v1 = NVML_STRUCT_VERSION(MarginTemperature, 1): 8 bytes
ARGUMENT_VERSION_MISMATCH = 25


@entry("nvmlDeviceGetMarginTemperature", outs="raw")
def _margin(lib: SimLibrary, i: int, out: Any) -> None:
    """Degrees left before T.Limit (the max operating temperature): "GPU T.Limit Temp: 61 C". The struct's
    ``version`` must be nvmlMarginTemperature_v1 (nvml.h: ARGUMENT_VERSION_MISMATCH otherwise)."""
    target = _target(out)
    if int(getattr(target, "version", 0)) != MARGIN_V1 or ctypes.sizeof(target) < 8:
        fail(ARGUMENT_VERSION_MISMATCH)
    g = lib.gpu(i)
    if not g.tlimit_thresholds:
        fail(NOT_SUPPORTED)
    limit = g.max_operating_celsius  # a model with T.Limit thresholds has a max operating temperature
    target.marginTemperature = int(limit) - int(round(lib.sim.temperature(i)))  # type: ignore[arg-type]


@entry("nvmlDeviceGetNumFans")
def _num_fans(lib: SimLibrary, i: int) -> int:
    if not lib.gpu(i).fans:
        fail(NOT_SUPPORTED)  # passive cards (H200 SXM): nvidia-smi prints "Fan Speed: N/A"
    return int(lib.gpu(i).fans)


def _fan(lib: SimLibrary, i: int, fan: int) -> dict[str, Any]:
    fans = lib.settings(i)["fans"]
    if not fans:
        fail(NOT_SUPPORTED)
    if not 0 <= fan < len(fans):
        fail(INVALID_ARGUMENT)
    return fans[fan]  # type: ignore[no-any-return,unused-ignore]


@entry("nvmlDeviceGetFanSpeed")
def _fan_speed_v1(lib: SimLibrary, i: int) -> int:
    return int(_fan_speed(lib, i, 0))


@entry("nvmlDeviceGetFanSpeed_v2")
def _fan_speed(lib: SimLibrary, i: int, fan: int) -> int:
    """The *intended* duty (NVML: "if the fan is physically blocked … the output will not match
    the actual fan speed"): a stalled fan still reads what it was asked to do."""
    _fan(lib, i, fan)
    return lib.sim.intended_duty(i, fan)


@entry("nvmlDeviceGetTargetFanSpeed")
def _target_fan(lib: SimLibrary, i: int, fan: int) -> int:
    _fan(lib, i, fan)
    return lib.sim.intended_duty(i, fan)


@entry("nvmlDeviceGetMinMaxFanSpeed", outs=2)
def _fan_range(lib: SimLibrary, i: int) -> tuple[int, int]:
    g = lib.gpu(i)
    if not g.fans:
        fail(NOT_SUPPORTED)
    return int(g.fan_min_percent), int(g.fan_max_percent)  # type: ignore[arg-type]


@entry("nvmlDeviceGetFanControlPolicy_v2")
def _fan_policy(lib: SimLibrary, i: int, fan: int) -> int:
    return int(_fan(lib, i, fan)["policy"])


@entry("nvmlDeviceSetFanSpeed_v2", outs=0, setter=True)
def _set_fan(lib: SimLibrary, i: int, fan: int, speed: int) -> None:
    lib.write()
    f = _fan(lib, i, fan)
    g = lib.gpu(i)
    if not g.fan_min_percent <= speed <= g.fan_max_percent:  # type: ignore[operator]
        fail(INVALID_ARGUMENT)
    lib.sim.step()
    f["policy"], f["target"] = 1, int(speed)


@entry("nvmlDeviceSetDefaultFanSpeed_v2", outs=0, setter=True)
def _set_fan_default(lib: SimLibrary, i: int, fan: int) -> None:
    lib.write()
    f = _fan(lib, i, fan)
    lib.sim.step()
    f["policy"], f["target"] = 0, None


@entry("nvmlDeviceSetFanControlPolicy", outs=0, setter=True)
def _set_fan_policy(lib: SimLibrary, i: int, fan: int, policy: int) -> None:
    lib.write()
    f = _fan(lib, i, fan)
    if policy not in (0, 1):
        fail(INVALID_ARGUMENT)
    lib.sim.step()
    f["policy"] = int(policy)
    if policy == 0:
        f["target"] = None


# -- power ------------------------------------------------------------------------------------


@entry("nvmlDeviceGetPowerUsage")
def _power(lib: SimLibrary, i: int) -> int:
    return int(lib.sim.draw_watts(i) * 1000)


@entry("nvmlDeviceGetPowerManagementLimit")
def _power_limit(lib: SimLibrary, i: int) -> int:
    """The limit as set ("Requested Power Limit")."""
    return int(lib.settings(i)["power_limit_mw"])


@entry("nvmlDeviceGetEnforcedPowerLimit")
def _power_enforced(lib: SimLibrary, i: int) -> int:
    """The limit held ("Current Power Limit"): the one set, or a lower board/module power budget."""
    return int(round(lib.sim.enforced_limit_watts(i) * 1000))


@entry("nvmlDeviceGetPowerManagementDefaultLimit")
def _power_default(lib: SimLibrary, i: int) -> int:
    return int(lib.gpu(i).power_default_watts * 1000)


@entry("nvmlDeviceGetPowerManagementLimitConstraints", outs=2)
def _power_constraints(lib: SimLibrary, i: int) -> tuple[int, int]:
    g = lib.gpu(i)
    return int(g.power_min_watts * 1000), int(g.power_max_watts * 1000)


@entry("nvmlDeviceGetTotalEnergyConsumption")
def _energy(lib: SimLibrary, i: int) -> int:
    lib.sim.step()
    return int(lib.sim.thermal[i].energy_mj)


@entry("nvmlDeviceSetPowerManagementLimit", outs=0, setter=True)
def _set_power(lib: SimLibrary, i: int, limit_mw: int) -> None:
    lib.write()
    g = lib.gpu(i)
    if not g.power_min_watts * 1000 <= limit_mw <= g.power_max_watts * 1000:
        fail(INVALID_ARGUMENT)
    lib.sim.step()
    lib.settings(i)["power_limit_mw"] = int(limit_mw)


# -- clocks -----------------------------------------------------------------------------------


def events(lib: SimLibrary, i: int) -> int:
    return lib.sim.clock_events(i)  # the mask of the reasons the violation counters count too


@entry("nvmlDeviceGetCurrentClocksEventReasons")
@entry("nvmlDeviceGetCurrentClocksThrottleReasons")
def _events(lib: SimLibrary, i: int) -> int:
    return events(lib, i)


@entry("nvmlDeviceGetMaxClockInfo")
def _max_clock(lib: SimLibrary, i: int, clock: int) -> int:
    g = lib.gpu(i)
    key = {CLOCK_GRAPHICS: "max_graphics_mhz", CLOCK_SM: "max_sm_mhz", CLOCK_MEM: "max_memory_mhz"}.get(clock)
    if key is None:
        fail(INVALID_ARGUMENT)
    return int(getattr(g, str(key)))


@entry("nvmlDeviceGetClockInfo")
def _clock(lib: SimLibrary, i: int, clock: int) -> int:
    if clock not in (CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM):
        fail(INVALID_ARGUMENT)
    return lib.sim.clock_mhz(i, clock)


DEPRECATED = 26  # NVML_ERROR_DEPRECATED


def app_clocks_gone(lib: SimLibrary) -> None:
    """Drivers from 590 answer the application-clock calls with Deprecated (nvml.h marks them
    DEPRECATED(13.0); an H200 on 590.48.01 prints "Requested functionality has been deprecated")."""
    major = str(lib.sim.desc.machine.driver_version).split(".")[0]
    if major.isdigit() and int(major) >= 590:
        fail(DEPRECATED)


@entry("nvmlDeviceGetApplicationsClock")
def _app_clock(lib: SimLibrary, i: int, clock: int) -> int:
    app_clocks_gone(lib)
    g, s = lib.gpu(i), lib.settings(i)
    if s["app_clocks"]:
        return int(s["app_clocks"][0] if clock == CLOCK_MEM else s["app_clocks"][1])
    return int(g.default_app_memory_mhz if clock == CLOCK_MEM else g.default_app_graphics_mhz)


@entry("nvmlDeviceGetDefaultApplicationsClock")
def _default_app_clock(lib: SimLibrary, i: int, clock: int) -> int:
    app_clocks_gone(lib)
    g = lib.gpu(i)
    return int(g.default_app_memory_mhz if clock == CLOCK_MEM else g.default_app_graphics_mhz)


def _clock_write(lib: SimLibrary, i: int, key: str, value: list[int] | None, limit_key: str | None = None,
                 since: str | None = None) -> None:
    """A locked range (min ≤ max ≤ the model's maximum), application clocks, or None to reset."""
    if since is not None and ARCH_CODES.get(lib.gpu(i).architecture, 0) < ARCH_CODES[since]:
        fail(NOT_SUPPORTED)
    lib.write()
    if value is not None and limit_key is not None:
        g = lib.gpu(i)
        if value[0] > value[1] or value[0] < 0 or value[1] > getattr(g, limit_key):
            fail(INVALID_ARGUMENT)
    lib.settings(i)[key] = value


@entry("nvmlDeviceSetGpuLockedClocks", outs=0, setter=True)
def _lock_gpu(lib: SimLibrary, i: int, lo: int, hi: int) -> None:
    _clock_write(lib, i, "locked_gpu", [int(lo), int(hi)], "max_sm_mhz", since="volta")


@entry("nvmlDeviceResetGpuLockedClocks", outs=0, setter=True)
def _reset_gpu(lib: SimLibrary, i: int) -> None:
    _clock_write(lib, i, "locked_gpu", None, since="volta")


@entry("nvmlDeviceSetMemoryLockedClocks", outs=0, setter=True)
def _lock_mem(lib: SimLibrary, i: int, lo: int, hi: int) -> None:
    _clock_write(lib, i, "locked_mem", [int(lo), int(hi)], "max_memory_mhz", since="ampere")


@entry("nvmlDeviceResetMemoryLockedClocks", outs=0, setter=True)
def _reset_mem(lib: SimLibrary, i: int) -> None:
    _clock_write(lib, i, "locked_mem", None, since="ampere")


@entry("nvmlDeviceSetApplicationsClocks", outs=0, setter=True)
def _set_app(lib: SimLibrary, i: int, mem: int, gfx: int) -> None:
    app_clocks_gone(lib)
    g = lib.gpu(i)
    if mem > g.max_memory_mhz or gfx > g.max_graphics_mhz:
        lib.write()
        fail(INVALID_ARGUMENT)
    _clock_write(lib, i, "app_clocks", [int(mem), int(gfx)])


@entry("nvmlDeviceResetApplicationsClocks", outs=0, setter=True)
def _reset_app(lib: SimLibrary, i: int) -> None:
    app_clocks_gone(lib)
    _clock_write(lib, i, "app_clocks", None)


# -- modes ------------------------------------------------------------------------------------


@entry("nvmlDeviceGetPersistenceMode")
def _persistence(lib: SimLibrary, i: int) -> int:
    return int(lib.settings(i)["persistence"])


@entry("nvmlDeviceSetPersistenceMode", outs=0, setter=True)
def _set_persistence(lib: SimLibrary, i: int, mode: int) -> None:
    lib.write()
    lib.settings(i)["persistence"] = 1 if mode else 0
    lib.settings(i)["initialised"] = True  # the GPU was opened to set it: it stays initialised now


@entry("nvmlDeviceGetComputeMode")
def _compute_mode(lib: SimLibrary, i: int) -> int:
    return int(lib.settings(i)["compute_mode"])


@entry("nvmlDeviceSetComputeMode", outs=0, setter=True)
def _set_compute_mode(lib: SimLibrary, i: int, mode: int) -> None:
    lib.write()
    if mode not in (0, 2, 3):
        fail(INVALID_ARGUMENT)
    lib.settings(i)["compute_mode"] = int(mode)


# -- utilisation, memory, processes ---------------------------------------------------------------


@entry("nvmlDeviceGetUtilizationRates")
def _utilization(lib: SimLibrary, i: int) -> dict[str, int]:
    """nvml.h: "On MIG-enabled GPUs, querying device utilization rates is not currently supported."""
    if lib.gpu(i).mig_mode:
        fail(NOT_SUPPORTED)
    u = lib.sim.utilization(i)
    return {"gpu": u, "memory": int(u * 0.6)}


def memory_total_mib(g: GpuSpec) -> int:
    """What NVML reports as total: the ECC reservation is taken off when ECC is on (a real RTX
    A6000 reports 49140 MiB with ECC off and 46068 MiB with it on)."""
    return int(g.memory_ecc_mib if g.ecc_enabled and g.memory_ecc_mib else g.memory_mib)


def _memory_parts(lib: SimLibrary, i: int) -> tuple[int, int, int]:
    """(total, reserved by the driver, allocated) in bytes."""
    g = lib.gpu(i)
    total = memory_total_mib(g) << 20
    reserved = min(int(g.memory_reserved_mib) << 20, total)
    allocated = min((g.memory_used_mib + sum(p.used_mib for p in g.processes)) << 20, total - reserved)
    return total, reserved, allocated


@entry("nvmlDeviceGetMigMode", outs=2)
def _mig_mode(lib: SimLibrary, i: int) -> tuple[int, int]:
    """(current, pending): NVML_DEVICE_MIG_ENABLE is 1; a GPU without MIG answers Not Supported."""
    mode = lib.gpu(i).mig_mode
    if mode is None:
        fail(NOT_SUPPORTED)
    return int(bool(mode)), int(bool(mode))


@entry("nvmlDeviceGetMemoryInfo")
def _memory(lib: SimLibrary, i: int) -> dict[str, int]:
    """nvml.h's ``nvmlMemory_t``: ``used`` is reserved + allocated ("Sum of Reserved and Allocated")."""
    total, reserved, allocated = _memory_parts(lib, i)
    return {"total": total, "used": reserved + allocated, "free": total - reserved - allocated}


MEMORY_V2 = 0x02000028  # nvml.h: nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2), sizeof 40


@entry("nvmlDeviceGetMemoryInfo_v2", outs="raw")
def _memory_v2(lib: SimLibrary, i: int, out: Any) -> None:
    """``nvmlMemory_v2_t``: reserved apart, ``used`` the allocated memory alone (what nvidia-smi prints
    as Used beside Reserved); a struct of another version is ARGUMENT_VERSION_MISMATCH."""
    t = _target(out)
    if int(getattr(t, "version", 0)) != MEMORY_V2:
        fail(ARGUMENT_VERSION_MISMATCH)
    total, reserved, allocated = _memory_parts(lib, i)
    t.total, t.reserved, t.used, t.free = total, reserved, allocated, total - reserved - allocated


def _processes(lib: SimLibrary, i: int, count: Any, out: Any, graphics: bool = False) -> None:
    """``*infoCount`` in: the room the caller has; out: the number of processes. The entries are
    written as the driver lays them out — nvml.h's 24 bytes (pid, pad, usedGpuMemory, gpuInstanceId,
    computeInstanceId), or 32 with usedGpuCcProtectedMemory (``process_entry_bytes``, early R535) —
    whatever struct the bindings declared. Compute and graphics lists share the layout (nvml.h)."""
    procs = [p for p in lib.gpu(i).processes
             if (p.graphics if graphics else (p.compute if p.compute is not None else not p.graphics))]
    n = _target(count)
    if out is None or n.value < len(procs):
        n.value = len(procs)
        if procs:
            fail(INSUFFICIENT_SIZE)
        return
    size = int(lib.sim.desc.machine.process_entry_bytes)
    data = b"".join(
        p.pid.to_bytes(4, "little") + bytes(4) + (p.used_mib << 20).to_bytes(8, "little")
        + (0xFFFFFFFF).to_bytes(4, "little") * 2 + bytes(size - 24) for p in procs)
    target = _target(out)
    # A real driver writes all of it, past a buffer declared for smaller entries; here it stops at
    # the buffer's end (this process's own memory is at stake), which the test of the layout notes.
    ctypes.memmove(ctypes.addressof(target), data, min(len(data), ctypes.sizeof(target)))
    n.value = len(procs)


entry("nvmlDeviceGetComputeRunningProcesses_v3", outs="raw")(_processes)
entry("nvmlDeviceGetComputeRunningProcesses_v2", outs="raw")(_processes)


def _graphics_processes(lib: SimLibrary, i: int, count: Any, out: Any) -> None:
    _processes(lib, i, count, out, graphics=True)


entry("nvmlDeviceGetGraphicsRunningProcesses_v3", outs="raw")(_graphics_processes)
entry("nvmlDeviceGetGraphicsRunningProcesses_v2", outs="raw")(_graphics_processes)


# -- PCIe ------------------------------------------------------------------------------------------


@entry("nvmlDeviceGetCurrPcieLinkGeneration")
def _pcie_gen(lib: SimLibrary, i: int) -> int:
    return link_state(lib.sim, i, lib.gpu(i))[0]


@entry("nvmlDeviceGetCurrPcieLinkWidth")
def _pcie_width(lib: SimLibrary, i: int) -> int:
    return link_state(lib.sim, i, lib.gpu(i))[1]


@entry("nvmlDeviceGetMaxPcieLinkGeneration")
def _pcie_max_gen(lib: SimLibrary, i: int) -> int:
    """The maximum of this GPU *in this slot* (NVML reference): the lower of GPU and slot."""
    g = lib.gpu(i)
    return min(int(g.pcie_max_generation), int(g.slot_generation))


@entry("nvmlDeviceGetMaxPcieLinkWidth")
def _pcie_max_width(lib: SimLibrary, i: int) -> int:
    g = lib.gpu(i)
    return min(int(g.pcie_max_width), int(g.slot_width))


@entry("nvmlDeviceGetGpuMaxPcieLinkGeneration")
def _gpu_max_gen(lib: SimLibrary, i: int) -> int:
    return int(lib.gpu(i).pcie_max_generation)


@entry("nvmlDeviceGetPcieThroughput")
def _pcie_throughput(lib: SimLibrary, i: int, counter: int) -> int:
    tx, rx = lib.sim.pcie_rates(i)
    return int((tx if counter == 0 else rx) / 1024)  # KB/s over the last 20 ms


@entry("nvmlDeviceGetPcieReplayCounter")
def _replays(lib: SimLibrary, i: int) -> int:
    return int(lib.gpu(i).pcie_replay_errors)


@entry("nvmlDeviceGetFieldValues", outs="raw")
def _field_values(lib: SimLibrary, i: int, count: Any, values: Any) -> None:
    arr = _target(values)
    n = value_of(count)
    counters = lib.sim.pcie_counters(i) if lib.gpu(i).pcie_byte_counters else None
    now_us = int(time.time() * 1e6)
    for k in range(n):
        v = arr[k]
        v.timestamp, v.latencyUsec = now_us, 0
        if v.fieldId in (FI_PCIE_COUNT_TX_BYTES, FI_PCIE_COUNT_RX_BYTES) and counters is not None:
            v.valueType = VALUE_TYPE_ULL
            v.value.ullVal = int(counters[0 if v.fieldId == FI_PCIE_COUNT_TX_BYTES else 1]) & (2**64 - 1)
            v.nvmlReturn = SUCCESS
        elif (reason := violation_field(lib, i, int(v.fieldId))) is not None:
            v.valueType = VALUE_TYPE_ULL
            v.value.ullVal = lib.sim.violation_ns(i)[reason] & (2**64 - 1)
            v.nvmlReturn = SUCCESS
        elif (v.fieldId in (FI_NVLINK_DATA_TX, FI_NVLINK_DATA_RX) and lib.gpu(i).nvlink_throughput
              and 0 <= v.scopeId < int(lib.gpu(i).nvlinks or 0)):
            v.valueType = VALUE_TYPE_ULL  # both directions alike: a GPU in a collective sends what it receives
            v.value.ullVal = lib.sim.nvlink_kib(i, int(v.scopeId)) & (2**64 - 1)
            v.nvmlReturn = SUCCESS
        elif v.fieldId in TLIMIT_FIELDS and lib.gpu(i).tlimit_thresholds:
            g = lib.gpu(i)  # the margin T.Limit shows when the threshold is reached: −2 for slowdown
            v.valueType = VALUE_TYPE_SIGNED_INT
            limit = g.max_operating_celsius
            v.value.siVal = int(limit) - int(getattr(g, TLIMIT_FIELDS[v.fieldId]))  # type: ignore[arg-type]
            v.nvmlReturn = SUCCESS
        else:
            v.nvmlReturn = NOT_SUPPORTED


def driver_release(lib: SimLibrary) -> tuple[int, int]:
    """The driver's (major, minor): ``580.65.06`` → (580, 65); (0, 0) when it does not parse."""
    parts = [*str(lib.sim.desc.machine.driver_version).split("."), "", ""]
    return (int(parts[0]) if parts[0].isdigit() else 0, int(parts[1]) if parts[1].isdigit() else 0)


def driver_major(lib: SimLibrary) -> int:
    return driver_release(lib)[0]


def violation_field(lib: SimLibrary, i: int, field_id: int) -> str | None:
    """The reason a violation-counter field id counts, where the GPU keeps the counters
    (``violation_counters``) and this driver gives the id: 74 and 76 always; the thermal reasons only from
    driver 580 (the first whose nvidia-smi prints these counters), at 251–253 before 580.82 and at 269–271
    from it (nvml.h 13.0 / 13.1). None: Not Supported."""
    if not lib.gpu(i).violation_counters:
        return None
    if field_id in FI_VIOLATIONS:
        return FI_VIOLATIONS[field_id]
    if driver_major(lib) < VIOLATION_FIELDS_FROM_DRIVER:
        return None
    return (FI_THERMAL_NEW if driver_release(lib) >= THERMAL_IDS_RENUMBERED else FI_THERMAL_OLD).get(field_id)


@entry("nvmlDeviceGetViolationStatus")
def _violation_status(lib: SimLibrary, i: int, policy: int) -> dict[str, int]:
    """``nvmlViolationTime_t``: referenceTime (CPU timestamp, µs) and violationTime (ns) for the power,
    thermal and sync-boost policies; the other policies (board limit, low utilisation, reliability,
    totals) are not modelled: Not Supported."""
    reason = PERF_POLICIES.get(int(policy))
    if not lib.gpu(i).violation_counters or reason is None:
        fail(NOT_SUPPORTED)
    return {"referenceTime": int(time.time() * 1e6), "violationTime": lib.sim.violation_ns(i)[reason]}  # type: ignore[index]


@entry("nvmlDeviceGetProcessUtilization", outs="raw")
def _process_utilization(lib: SimLibrary, i: int, out: Any, count: Any, last_seen: Any) -> None:
    """Samples newer than ``lastSeenTimeStamp`` (µs), one per second per process that had non-zero SM
    use, the last few kept (nvml.h: "one utilization sample structure is returned per process running,
    that had some non-zero utilization during the last sample period"; NOT_FOUND when none is newer).
    A process's share of the device's utilisation follows its memory, so the shares sum to at most the
    device's figure."""
    seen = int(value_of(last_seen))
    util = lib.sim.utilization(i)
    procs = lib.gpu(i).processes
    total = sum(max(int(p.used_mib), 1) for p in procs)
    shares = [(p.pid, util * max(int(p.used_mib), 1) // total) for p in procs] if procs else []
    now_s = int(time.time() + lib.sim.offset)
    samples = [(pid, (now_s - k) * 1_000_000, sm) for k in range(PROCESS_SAMPLES_KEPT)
               for pid, sm in shares if sm > 0 and (now_s - k) * 1_000_000 > seen]
    n = _target(count)
    if not samples:
        fail(NOT_FOUND)
    if out is None or n.value < len(samples):
        n.value = len(samples)
        fail(INSUFFICIENT_SIZE)
    arr = _target(out)
    for k, (pid, ts, sm) in enumerate(samples):
        arr[k].pid, arr[k].timeStamp, arr[k].smUtil = pid, ts, sm
        arr[k].memUtil, arr[k].encUtil, arr[k].decUtil = int(sm * 0.6), 0, 0
    n.value = len(samples)


# -- ECC and memory health -------------------------------------------------------------------------


@entry("nvmlDeviceGetEccMode", outs=2)
def _ecc_mode(lib: SimLibrary, i: int) -> tuple[int, int]:
    g = lib.gpu(i)
    if not g.ecc_supported:
        fail(NOT_SUPPORTED)
    pending = g.ecc_enabled if g.ecc_pending_enabled is None else g.ecc_pending_enabled
    return (1 if g.ecc_enabled else 0), (1 if pending else 0)


@entry("nvmlDeviceGetTotalEccErrors")
def _ecc_errors(lib: SimLibrary, i: int, error_type: int, counter_type: int) -> int:
    g = lib.gpu(i)
    if not (g.ecc_supported and g.ecc_enabled):
        fail(NOT_SUPPORTED)
    scope = "volatile" if counter_type == 0 else "aggregate"
    kind = "corrected" if error_type == 0 else "uncorrected"
    return int(getattr(g, f"ecc_{scope}_{kind}"))


@entry("nvmlDeviceGetRetiredPages", outs="raw")
def _retired_pages(lib: SimLibrary, i: int, cause: Any, count: Any, out: Any) -> None:
    g = lib.gpu(i)
    if not g.retired_pages_supported:
        fail(NOT_SUPPORTED)
    n = g.retired_pages_sbe if value_of(cause) == 0 else g.retired_pages_dbe
    c = _target(count)
    if out is None or c.value < n:
        c.value = n
        if n:
            fail(INSUFFICIENT_SIZE)
        return
    for k in range(n):
        out[k] = 0x1000 * (k + 1)
    c.value = n


@entry("nvmlDeviceGetRetiredPagesPendingStatus")
def _retired_pending(lib: SimLibrary, i: int) -> int:
    g = lib.gpu(i)
    if not g.retired_pages_supported:
        fail(NOT_SUPPORTED)
    return 1 if g.retired_pages_pending else 0


@entry("nvmlDeviceGetRemappedRows", outs=4)
def _remapped(lib: SimLibrary, i: int) -> tuple[int, int, int, int]:
    g = lib.gpu(i)
    if not g.remapped_rows_supported:
        fail(NOT_SUPPORTED)
    return (g.remapped_rows_correctable, g.remapped_rows_uncorrectable, int(g.remapped_rows_pending),
            int(g.remapped_rows_failure))


# -- NVLink and topology ----------------------------------------------------------------------------


def peer(lib: SimLibrary, i: int, link: int) -> tuple[int | None, bool]:
    """(GPU at the other end of this link — or -1 for an NVSwitch —, is it up)."""
    if not 0 <= link < lib.gpu(i).nvlinks:
        fail(INVALID_ARGUMENT)
    return nvlink_peer(lib.sim, i, link)


@entry("nvmlDeviceGetNvLinkState")
def _nvlink_state(lib: SimLibrary, i: int, link: int) -> int:
    return 1 if peer(lib, i, link)[1] else 0


NVLINK_ERROR_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}  # nvmlNvLinkErrorCounter_t


@entry("nvmlDeviceGetNvLinkErrorCounter")
def _nvlink_error_counter(lib: SimLibrary, i: int, link: int, counter: int) -> int:
    """Errors on one link since the driver loaded (``nvidia-smi nvlink -e``): 0 unless an
    ``nvlink_errors`` fault makes them climb at its rate (counted from the host's boot)."""
    g = lib.gpu(i)
    if not g.nvlinks:
        fail(NOT_SUPPORTED)
    if not 0 <= int(link) < int(g.nvlinks) or int(counter) not in NVLINK_ERROR_COUNTERS.values():
        fail(INVALID_ARGUMENT)
    return sum(int(f.per_second * lib.sim.now()) for f in lib.sim.faults_of("nvlink_errors", i)
               if f.link in (None, int(link)) and NVLINK_ERROR_COUNTERS[f.counter] == int(counter))


@entry("nvmlDeviceGetNvLinkRemotePciInfo_v2")
def _nvlink_remote(lib: SimLibrary, i: int, link: int) -> dict[str, Any]:
    other, up = peer(lib, i, link)
    if other is None or not up:
        fail(NOT_SUPPORTED)
    if other == -1:
        switches = lib.sim.desc.machine.nvswitches
        return pci_info(switches[link % len(switches)], 0x22A310DE, 0x16BD10DE)
    g = lib.gpu(other)  # type: ignore[arg-type]
    return pci_info(g.bus_id, g.pci_device_id, g.pci_subsystem_id)


@entry("nvmlDeviceGetNvLinkRemoteDeviceType")
def _nvlink_remote_type(lib: SimLibrary, i: int, link: int) -> int:
    other, up = peer(lib, i, link)
    if other is None or not up:
        fail(NOT_SUPPORTED)
    return NVLINK_DEVICE_SWITCH if other == -1 else NVLINK_DEVICE_GPU


@entry("nvmlDeviceGetNvLinkCapability")
def _nvlink_cap(lib: SimLibrary, i: int, link: int, capability: int) -> int:
    other, _ = peer(lib, i, link)
    if capability == SLI_BRIDGE_CAP:
        return 1 if other is not None and other != -1 else 0
    return 1


@entry("nvmlDeviceGetTopologyCommonAncestor", handles=2)
def _common_ancestor(lib: SimLibrary, i: int, j: int) -> int:
    return common_ancestor(lib.sim.desc.machine, lib.gpu(i), lib.gpu(j))


@entry("nvmlDeviceGetP2PStatus", handles=2)
def _p2p(lib: SimLibrary, i: int, j: int, index: int) -> int:
    pair = {i, j}
    caps = {0: "read", 1: "write", 2: "nvlink"}.get(index, "other")
    for p in lib.sim.faults_of("p2p"):
        if set(p.gpus) == pair and (p.caps == "all" or p.caps == caps):
            return P2P_CODES[p.status]
    if caps == "nvlink":
        up_i = [peer(lib, i, ln) for ln in range(lib.gpu(i).nvlinks)]
        if any(o == j and u for o, u in up_i):
            return 0
        both_switched = lib.gpu(i).nvswitch and lib.gpu(j).nvswitch
        return 0 if both_switched and any(u for _, u in up_i) else P2P_CODES["not_supported"]
    return 0
