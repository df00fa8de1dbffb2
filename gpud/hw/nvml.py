"""The one choke point for NVML: the only module that touches ``pynvml``.

``Nvml`` takes the NVML module as a parameter — the real ``pynvml`` (nvidia-ml-py) or the
simulator's stand-in with the same function names, constants and ``NVMLError_*`` classes — so
the code below is the code that runs on a real workstation. Every call goes through
``Nvml.call``: lazy ``nvmlInit`` under a lock, a call counter, and translation of
``NVMLError_*`` into gpud's own errors. Reads of optional fields give ``None`` when NVML cannot
give them (Unsupported is not zero); a lost GPU is never hidden.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Callable, TypeVar

from gpud.errors import (
    DriverMismatch,
    DriverNotLoaded,
    GpuLost,
    GpuUnusable,
    InsufficientPower,
    IrqIssue,
    NvmlError,
    PermissionDenied,
    Unsupported,
)
from gpud.model import (
    P2P_STATUSES,
    SLOW_OPEN_S,
    EccCounts,
    FanReading,
    GpuInfo,
    GpuProcess,
    GpuSample,
    NvLinkInfo,
    Topology,
    Versions,
    decode_clock_events,
)

T = TypeVar("T")
log = logging.getLogger("gpud.nvml")

# NVML return codes (nvml.h); fixed by the C API, so spelled out here rather than read from
# the bindings (some binding releases carry typos, e.g. NVML_P2P_CAPS_INDEX_READ = (0,)).
_NOT_SUPPORTED = {3, 13, 26}  # NOT_SUPPORTED, FUNCTION_NOT_FOUND, DEPRECATED (app clocks on 590+ drivers)
_NO_PERMISSION = {4}
_GPU_LOST = {15, 16}  # GPU_IS_LOST, RESET_REQUIRED
_NO_DRIVER = {9, 12}  # DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND
_RM_MISMATCH = 18  # LIB_RM_VERSION_MISMATCH: the library of a newer driver over the old kernel module
_UNUSABLE = {8: InsufficientPower, 11: IrqIssue}  # INSUFFICIENT_POWER, IRQ_ISSUE (nvml.h)
_UNINITIALIZED = 1

CLOCK_TYPES = {"graphics": 0, "sm": 1, "memory": 2}  # NVML_CLOCK_*
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN = 0, 1  # NVML_TEMPERATURE_THRESHOLD_*
PCIE_TX, PCIE_RX = 0, 1  # NVML_PCIE_UTIL_*_BYTES (KB/s)
FAN_POLICY = {0: "auto", 1: "manual"}  # NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW, _MANUAL
FAN_POLICY_AUTO = 0
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1  # NVML_MEMORY_ERROR_TYPE_*
ECC_VOLATILE, ECC_AGGREGATE = 0, 1  # NVML_*_ECC
RETIRE_SBE, RETIRE_DBE = 0, 1  # NVML_PAGE_RETIREMENT_CAUSE_*
NVLINK_CAP_SLI_BRIDGE = 4
AFFINITY_SCOPE_NODE = 0
P2P_READ, P2P_WRITE, P2P_NVLINK = 0, 1, 2
P2P_STATUS = dict(enumerate(P2P_STATUSES))  # nvmlGpuP2PStatus_t
# nvmlDeviceGetTopologyCommonAncestor → nvidia-smi topo -m legend.
TOPO_LEVEL = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
ARCHITECTURES = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
                 9: "hopper", 10: "blackwell"}
LOCKED_CLOCKS_FROM = "volta"  # nvmlDeviceSetGpuLockedClocks needs Volta or newer
MAX_NVLINKS = 18  # per GPU on every generation up to Hopper
SLOW_EVERY_S = 10.0  # ECC, page retirement, row remapping, PCIe replays: read this often
# Answers that depend on the moment, not on the GPU's capability: asked again every time.
# The temperature too: a GPU that read it once and fails now has a fault that may clear (a fan curve
# must see it come back), not a missing capability.
CHANGING_SUPPORT = {"nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkState", "nvmlDeviceGetTemperature"}
CPU_SET_WORDS = 16  # 64-bit words: up to 1024 CPUs
# NVLink data counters that every link answered Not Supported are asked again this much later, not
# never: on an NVSwitch system the daemon may start before the fabric manager has trained the links,
# and what a link that is not up yet answers is not documented.
NVLINK_DATA_RETRY_S = 600.0
THRESHOLD_GPU_MAX = 3  # NVML_TEMPERATURE_THRESHOLD_GPU_MAX ("GPU Max Operating Temp")
# NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR (nvml.h; nvidia-ml-py 13.580.82 pynvml.py): the temperature the
# driver's automatic fan policy holds the GPU at, nvidia-smi's "GPU Target Temperature".
THRESHOLD_ACOUSTIC_CURR = 5
# Ada and later: thresholds as offsets from T.Limit (nvml.h: NVML_FI_DEV_TEMPERATURE_*_TLIMIT), with the
# current margin from nvmlDeviceGetMarginTemperature; nvidia-smi prints only these there.
FI_TLIMIT = {"shutdown": 193, "slowdown": 194, "max_operating": 196}
NVLINK_DEVICE_SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES = 197, 198  # NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES (cumulative)
# Readings that block (nvmlDeviceGetPcieThroughput: 20 ms each, NVML reference; the running-process
# lists: milliseconds, docs/simulation.md) are read off the tick by the daemon, this often.
OFFTICK_EVERY_S = 5.0
# Compute processes: the newest entry point first; an old driver lacks _v3 (FUNCTION_NOT_FOUND).
PROCESS_CALLS = ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")
# Graphics processes (Xorg, a desktop, a visualisation): the same entry layout (nvml.h).
GRAPHICS_CALLS = ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2")
# nvml.h's process entry is 24 bytes (pid, usedGpuMemory, gpuInstanceId, computeInstanceId); early
# R535 drivers wrote 32 (with usedGpuCcProtectedMemory), and nvidia-ml-py's struct follows neither
# reliably (12.535: 32 bytes, 13.x: 24). gpud reads the entries itself and measures their size.
PROCESS_ENTRY_MAX = 32
# nvmlNvLinkErrorCounter_t: NVML_NVLINK_ERROR_DL_REPLAY, _DL_RECOVERY, _DL_CRC_FLIT, _DL_CRC_DATA
NVLINK_ERROR_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}
# NVML's violation counters (ns in each clock-event reason since the driver loaded): field values
# NVML_FI_DEV_CLOCKS_EVENT_REASON_*, else the deprecated nvmlDeviceGetViolationStatus per policy. 74 and 76
# (the older PERF_POLICY ids) never moved; the three thermal ids were renumbered: nvml.h 12.9 and 13.0
# (drivers 575 to 580.65; nvidia-ml-py 12.575.51, 13.580.65) put them at 251–253 and power-smoothing
# settings at 269–271, nvml.h 13.1 (drivers from 580.82; nvidia-ml-py 13.580.82) the other way round. The
# ids asked are chosen by the running driver, so a power-smoothing setting is never read as throttle time;
# a driver before 575, or one whose version is unknown, is asked only 74 and 76.
FI_VIOLATIONS = {74: "sw_power_cap", 76: "sync_boost"}
FI_THERMAL_VIOLATIONS: tuple[tuple[tuple[int, int], dict[int, str]], ...] = (  # (first driver, ids), newest first
    ((580, 82), {269: "sw_thermal_slowdown", 270: "hw_thermal_slowdown", 271: "hw_power_brake_slowdown"}),
    ((575, 0), {251: "sw_thermal_slowdown", 252: "hw_thermal_slowdown", 253: "hw_power_brake_slowdown"}),
)
PERF_POLICIES = {0: "sw_power_cap", 1: "sw_thermal_slowdown", 2: "sync_boost"}  # nvmlPerfPolicyType_t (nvml.h)
FI_NVLINK_DATA = {138: "tx", 139: "rx"}  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/_RX: KiB, scopeId = link
NOT_FOUND = 6


class ProcessUtilizationSample(ctypes.Structure):
    """``nvmlProcessUtilizationSample_t`` (nvml.h): gpud's own, so the size call works with any bindings."""

    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


SENTINEL = 0xA5
INSUFFICIENT_SIZE = 7
NOT_AVAILABLE_ULL = 2**64 - 1


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

    __slots__ = ("pid", "usedGpuMemory", "kind", "sm")

    def __init__(self, pid: int, used: int | None, kind: str = "compute") -> None:
        self.pid = pid
        self.usedGpuMemory = used
        self.kind = kind
        self.sm: int | None = None  # SM use from nvmlDeviceGetProcessUtilization


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


def field_int(v: Any) -> tuple[int, int] | None:
    """(value, width in bits) of an integer ``nvmlFieldValue_t``; None when it failed or is no integer."""
    if v.nvmlReturn != 0:
        return None
    kind = {1: ("uiVal", 32), 2: ("ulVal", 64), 3: ("ullVal", 64), 4: ("sllVal", 64), 5: ("siVal", 32)}.get(
        int(v.valueType))
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


class TickGate:
    """Keeps the sampler's blocking calls out of a tick. The driver serialises NVML calls on its RM lock, so
    a tick whose calls met the sampler's would wait for one slow call (20 ms of PCIe throughput, a process
    list) each. A snapshot holds ``tick()`` while it reads every GPU; each sampler call holds ``call()``:
    one at a time, none while a tick runs or waits, so a tick waits for at most the one in progress. A
    sampler call made inside a tick's own thread (a one-shot read before the sampler runs) passes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ticks: dict[int, int] = {}  # thread → snapshots it runs (running or waiting)
        self._calling = False

    @contextlib.contextmanager
    def tick(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            self._ticks[me] = self._ticks.get(me, 0) + 1
            while self._calling:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._ticks[me] -= 1
                if not self._ticks[me]:
                    del self._ticks[me]
                self._cond.notify_all()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        if threading.get_ident() in self._ticks:
            yield
            return
        with self._cond:
            while self._ticks or self._calling:
                self._cond.wait()
            self._calling = True
        try:
            yield
        finally:
            with self._cond:
                self._calling = False
                self._cond.notify_all()


class Nvml:
    """NVML behind a lock, with gpud errors, call counting and static caching.

    ``nvidia-smi`` equivalents are given per reading in ``docs/architecture.md``.
    """

    def __init__(self, module: Any = None) -> None:
        if module is None:
            import pynvml  # the one place gpud imports the real bindings

            module = pynvml
        self._m = module
        self._lock = threading.RLock()
        self._initialized = False
        self._handles: dict[int, Any] = {}
        self._open_seconds: dict[int, float] = {}  # how long this process's first handle lookup took, per GPU
        self._info: dict[int, GpuInfo] = {}
        self._sli: dict[int, tuple[bool | None, ...]] = {}
        self._pairs: dict[tuple[int, int], tuple[str, str, str, str]] = {}
        self._versions: Versions | None = None
        self._slow: dict[int, tuple[float, dict[str, Any]]] = {}
        self._remotes: dict[int, dict[int, tuple[str, bool | None]]] = {}
        self._pcie_counts: dict[int, tuple[float, int, int]] = {}  # cumulative byte counters, last tick
        self._pcie_sampled: dict[int, tuple[float, int, int]] = {}  # (when, TX B/s, RX B/s) off the tick
        self._procs: dict[int, tuple[float, Any]] = {}  # (when, processes) read off the tick
        self._util_seen: dict[int, int] = {}  # newest process-utilisation sample read per GPU (µs)
        self._pcie_counter_ok: set[int] = set()  # GPUs whose cumulative PCIe byte counters answer
        self._gone: set[str] = set()  # functions the driver or the bindings do not have
        self.offtick = False  # a sampler thread reads the blocking readings; the tick uses its results
        self._gate = TickGate()  # the sampler's blocking calls only between ticks (the driver's RM lock)
        self._unsupported: set[tuple[Any, ...]] = set()  # (function, GPU, arguments) that said NotSupported
        self._fields_retry: dict[tuple[int, str], float] = {}  # (GPU, field group) → when to ask it again
        self.calls = 0  # NVML calls made (for the benchmarks)
        self.errors: Counter[str] = Counter()  # NVML errors per function name

    # -- the choke point ---------------------------------------------------------------
    def _translate(self, err: Exception, call: str, gpu: int | None) -> NvmlError:
        code = getattr(err, "value", None)
        where = f"GPU {gpu}: " if gpu is not None else ""
        msg = f"{where}{call}: {err}"
        if code in _NOT_SUPPORTED:
            return Unsupported(msg, call=call, gpu=gpu, code=code)
        if code in _NO_PERMISSION:
            return PermissionDenied(msg, call=call, gpu=gpu, code=code)
        if code in _GPU_LOST:
            return GpuLost(msg, call=call, gpu=gpu, code=code)
        if code in _UNUSABLE:
            return _UNUSABLE[code](msg, call=call, gpu=gpu, code=code)
        if code == _RM_MISMATCH:
            return DriverMismatch(f"NVML library and kernel module differ in version ({err})", call=call, gpu=gpu,
                                  code=code)
        if code in _NO_DRIVER or (code == _UNINITIALIZED and call == "nvmlInit"):
            return DriverNotLoaded(
                f"NVIDIA driver/NVML not available ({err})", call=call, gpu=gpu, code=code
            )
        return NvmlError(msg, call=call, gpu=gpu, code=code)

    def _raw(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        """One binding call. Nothing but gpud errors leaves here: an ``NVMLError`` is translated by
        its code; a binding that lacks the function, or whose wrapper does not fit the driver
        (``NVMLLibraryMismatchError``), is Unsupported; anything else the bindings raise (a
        ``TypeError`` from an argument list that changed between nvidia-ml-py releases, a ctypes
        error) is an NvmlError naming the call."""
        fn = getattr(self._m, name, None)
        if fn is None:
            raise Unsupported(f"{name}: not in these NVML bindings", call=name, gpu=gpu)
        self.calls += 1
        try:
            return fn(*args)
        except self._m.NVMLError as err:
            self.errors[name] += 1
            raise self._translate(err, name, gpu) from err
        except Exception as err:  # noqa: BLE001 - the boundary: no binding exception escapes gpud.hw
            self.errors[name] += 1
            where = f"GPU {gpu}: " if gpu is not None else ""
            if type(err).__name__ == "NVMLLibraryMismatchError":
                raise Unsupported(f"{where}{name}: {err}", call=name, gpu=gpu) from err
            raise NvmlError(f"{where}{name}: {type(err).__name__}: {err}", call=name, gpu=gpu) from err

    def init(self) -> None:
        """``nvmlInit`` once; raises DriverNotLoaded when there is no driver."""
        with self._lock:
            if not self._initialized:
                self._raw("nvmlInit")
                self._initialized = True

    def shutdown(self) -> None:
        with self._lock:
            if self._initialized:
                self._initialized = False
                self._handles.clear()
                try:
                    self._raw("nvmlShutdown")
                except NvmlError:
                    pass

    def call(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        """Call an NVML function; gpud errors only."""
        with self._lock:
            if not self._initialized:
                self.init()
            return self._raw(name, *args, gpu=gpu)

    def get(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        """Like ``call`` for an optional reading: None when NVML cannot give it here.

        A lost GPU or a missing driver still raise: those are not "unsupported". What a GPU said
        it does not support is not asked again (a capability does not come back by itself): no
        wasted call and no error counted every tick for, say, page retirement on an Ampere card.
        """
        plain = tuple(_hashable(a) for a in args)
        key = (name, gpu, plain[1:]) if gpu is not None else (name, gpu, plain)  # args[0]: the GPU's handle
        return self._optional(key, lambda: self.call(name, *args, gpu=gpu))

    def _optional(self, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
        name = key[0]
        if key in self._unsupported:
            return None
        try:
            return read()
        except (GpuLost, DriverNotLoaded):
            raise
        except Unsupported as err:
            if name not in CHANGING_SUPPORT:
                self._unsupported.add(key)
            if err.code in (13, None):  # FUNCTION_NOT_FOUND, or not in these bindings: gone for good
                self._gone.add(name)
            return None
        except NvmlError:
            return None

    def get_out(self, name: str, h: Any, *inputs: Any, outputs: int = 1, gpu: int) -> tuple[int, ...] | None:
        """An optional reading whose outputs gpud passes as pointers and reads back (unsigned ints).

        nvidia-ml-py 12.535–12.560 declare the outputs of ``nvmlDeviceGetMinMaxFanSpeed`` and
        ``nvmlDeviceGetFanControlPolicy_v2`` as required arguments and hand them to the C library as
        given; later releases accept the same pointers (and return NVML_SUCCESS). Passing
        ``byref(c_uint())`` works with both.
        """
        cells = [ctypes.c_uint() for _ in range(outputs)]

        def read() -> tuple[int, ...]:
            self.call(name, h, *inputs, *(ctypes.byref(c) for c in cells), gpu=gpu)
            return tuple(int(c.value) for c in cells)

        out: tuple[int, ...] | None = self._optional((name, gpu, inputs), read)
        return out

    # -- system ------------------------------------------------------------------------
    def versions(self) -> Versions:
        if self._versions is None:
            cuda = self.get("nvmlSystemGetCudaDriverVersion_v2")
            drv = self.get("nvmlSystemGetDriverVersion")
            nvml = self.get("nvmlSystemGetNVMLVersion")
            self._versions = Versions(
                driver=_text(drv) if drv is not None else None,
                cuda_driver=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
                nvml=_text(nvml) if nvml is not None else None,
            )
        return self._versions

    def device_count(self) -> int:
        return int(self.call("nvmlDeviceGetCount"))

    def handle(self, index: int) -> Any:
        """The GPU's handle. A GPU that NVML counts but cannot open — a GPU fallen off the bus answers
        ``NVML_ERROR_UNKNOWN`` (999) or ``GPU_IS_LOST`` here, and ``nvidia-smi`` prints "Unable to
        determine the device handle for GPU …" — is lost, whatever the code; but for the answers that name
        another cause (no permission; its power cables, an interrupt problem: ``GpuUnusable``)."""
        with self._lock:
            h = self._handles.get(index)
            if h is None:
                started = time.perf_counter()
                try:
                    h = self.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
                except (GpuLost, DriverNotLoaded, PermissionDenied, GpuUnusable):
                    raise  # NO_PERMISSION: a device node this user may not open (nvml.h), not a lost GPU
                except NvmlError as err:
                    raise GpuLost(str(err), call=err.call, gpu=index, code=err.code) from err
                self._handles[index] = h
                # The first lookup initialises a GPU nobody holds open (persistence mode off): seconds.
                self._open_seconds.setdefault(index, time.perf_counter() - started)
            return h

    # -- static facts, read once ------------------------------------------------------
    def cached_info(self, index: int) -> GpuInfo | None:
        """The static facts if they were read already (also for a GPU lost since)."""
        return self._info.get(index)

    def info(self, index: int) -> GpuInfo:
        cached = self._info.get(index)
        if cached is not None:
            return cached
        h = self.handle(index)

        def get(name: str, *args: Any) -> Any:
            return self.get(name, h, *args, gpu=index)

        def watts(mw: Any) -> float | None:
            return mw / 1000.0 if mw is not None else None

        pci = self.call("nvmlDeviceGetPciInfo", h, gpu=index)
        constraints = get("nvmlDeviceGetPowerManagementLimitConstraints") or (None, None)
        fan_count = get("nvmlDeviceGetNumFans")
        fan_range = (self.get_out("nvmlDeviceGetMinMaxFanSpeed", h, outputs=2, gpu=index) if fan_count
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
                self.call("nvmlDeviceGetNvLinkState", h, link, gpu=index)
            except (GpuLost, DriverNotLoaded):
                raise
            except NvmlError:
                break
            cap = get("nvmlDeviceGetNvLinkCapability", link, NVLINK_CAP_SLI_BRIDGE)
            links.append(bool(cap) if cap is not None else None)
        self._sli[index] = tuple(links)
        info = GpuInfo(
            index=index,
            uuid=_text(self.call("nvmlDeviceGetUUID", h, gpu=index)),
            name=_text(self.call("nvmlDeviceGetName", h, gpu=index)),
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
            open_seconds=slow if (slow := round(self._open_seconds.get(index, 0.0), 1)) >= SLOW_OPEN_S else None,
        )
        self._info[index] = info
        return info

    def _tlimit_thresholds(self, index: int, h: Any) -> dict[str, int | None]:
        """Absolute thresholds from T.Limit offsets: threshold = temperature + margin − offset (the
        offset is where the margin stands when the threshold is reached). Empty without the margin
        call (nvidia-ml-py before 12.570) or the fields."""
        margin = self._optional(("nvmlDeviceGetMarginTemperature", index, ()), lambda: self._margin(h, index))
        temp = self._temperature(h, index)
        values = self.get("nvmlDeviceGetFieldValues", h, list(FI_TLIMIT.values()), gpu=index)
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
        if hasattr(self._m, "nvmlDeviceGetMarginTemperature"):
            return int(self.call("nvmlDeviceGetMarginTemperature", h, gpu=index))

        class Margin(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint), ("marginTemperature", ctypes.c_int)]

        out = Margin(version=ctypes.sizeof(Margin) | 1 << 24)  # NVML_STRUCT_VERSION(MarginTemperature, 1)
        fn = self._c_function("nvmlDeviceGetMarginTemperature", index)
        self.calls += 1
        self._c_check(fn(h, ctypes.byref(out)), "nvmlDeviceGetMarginTemperature", index)
        return int(out.marginTemperature)

    def _temperature(self, h: Any, index: int) -> int | None:
        """GPU temperature: ``nvmlDeviceGetTemperature``, deprecated ("will be removed in CUDA 14.0"),
        then its successor ``nvmlDeviceGetTemperatureV`` where the first is gone."""
        t = self.get("nvmlDeviceGetTemperature", h, TEMPERATURE_GPU, gpu=index)
        if t is None and "nvmlDeviceGetTemperature" in self._gone:
            t = self.get("nvmlDeviceGetTemperatureV", h, TEMPERATURE_GPU, gpu=index)
        return int(t) if t is not None else None

    # -- one reading per tick ---------------------------------------------------------
    def sample(self, index: int) -> GpuSample:
        """Read one GPU's telemetry. A lost GPU gives a sample with ``lost=True``."""
        with self._lock:  # once for the whole sample: the calls inside re-enter it cheaply
            return self._sample_locked(index)

    def reading_all(self) -> contextlib.AbstractContextManager[None]:
        """Held while a snapshot reads every GPU (``Machine.snapshot``): the sampler's blocking calls wait."""
        return self._gate.tick()

    def _sample_locked(self, index: int, read: Callable[[int, GpuInfo, float], GpuSample] | None = None) -> GpuSample:
        """``read`` (default: the whole ``_sample``) under the one translation of a lost or unusable GPU."""
        now = time.time()
        cached = self._info.get(index)
        try:
            info = self.info(index)
            return (read or self._sample)(index, info, now)
        except DriverNotLoaded:
            raise
        except NvmlError as err:  # lost, or a reading every GPU must give failed: this GPU only
            self._handles.pop(index, None)  # look the GPU up again next time: it may come back
            self._info.pop(index, None) if cached is None else None
            return GpuSample(index=index, uuid=cached.uuid if cached else "", timestamp=now, lost=True,
                             error=str(err), inaccessible=isinstance(err, PermissionDenied),
                             cause=err.cause if isinstance(err, GpuUnusable) else None)

    def _sample(self, index: int, info: GpuInfo, now: float) -> GpuSample:
        h = self.handle(index)

        def get(name: str, *args: Any) -> Any:
            return self.get(name, h, *args, gpu=index)

        def watts(mw: Any) -> float | None:
            return mw / 1000.0 if mw is not None else None

        slow = self._slow_fields(index, h, info, now)
        fans: list[FanReading] = []
        if info.fan_count is not None:
            for fan in range(info.fan_count):
                policy = slow["fan_policies"][fan]
                fans.append(
                    FanReading(
                        fan=fan,
                        speed_percent=get("nvmlDeviceGetFanSpeed_v2", fan),
                        target_percent=get("nvmlDeviceGetTargetFanSpeed", fan),
                        policy=FAN_POLICY.get(policy) if policy is not None else None,
                    )
                )
        else:
            speed = get("nvmlDeviceGetFanSpeed")
            if speed is not None:
                fans.append(FanReading(0, speed, None, None))
        util = get("nvmlDeviceGetUtilizationRates")
        used, total, reserved, free = self._memory(index, h)
        tx, rx = self._pcie_rates(index, h, now)
        events = self._clock_event_mask(get)
        persistence, compute = slow["persistence"], slow["compute"]
        ecc_mode, ecc, sbe, dbe, retired_pending, remap, replay = (
            slow["ecc_mode"], slow["ecc"], slow["sbe"], slow["dbe"], slow["retired_pending"], slow["remap"],
            slow["replay"])
        ecc_on = bool(ecc_mode[0]) if ecc_mode is not None else None
        procs = self._offtick_processes(index, now) if self.offtick else self._processes(index, h)
        return GpuSample(
            index=index,
            uuid=info.uuid,
            timestamp=now,
            temperature_celsius=self._temperature(h, index),
            fans=tuple(fans),
            power_watts=watts(get("nvmlDeviceGetPowerUsage")),
            power_limit_watts=watts(get("nvmlDeviceGetEnforcedPowerLimit")),
            power_management_limit_watts=watts(slow["management_limit"]),
            energy_joules=watts(get("nvmlDeviceGetTotalEnergyConsumption")),
            clocks_mhz={k: get("nvmlDeviceGetClockInfo", v) for k, v in CLOCK_TYPES.items()},
            applications_clocks_mhz=slow["applications_clocks"],
            utilization_gpu_percent=util.gpu if util is not None else None,
            utilization_memory_percent=util.memory if util is not None else None,
            memory_used_bytes=used,
            memory_total_bytes=total,
            memory_reserved_bytes=reserved,
            memory_free_bytes=free,
            pcie_generation=get("nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_width=slow["pcie_width"],
            pcie_tx_bytes_per_second=tx,
            pcie_rx_bytes_per_second=rx,
            pcie_replay_errors=replay,
            clock_event_mask=events,
            clock_events=decode_clock_events(events) if events is not None else None,
            persistence_mode=bool(persistence) if persistence is not None else None,
            compute_mode=COMPUTE_MODES.get(compute, str(compute)) if compute is not None else None,
            mig_mode=bool(slow["mig"][0]) if slow["mig"] is not None else None,
            ecc_enabled=ecc_on,
            ecc_pending=bool(ecc_mode[1]) if ecc_mode is not None else None,
            ecc_errors=ecc,
            retired_pages_single_bit=len(sbe) if sbe is not None else None,
            retired_pages_double_bit=len(dbe) if dbe is not None else None,
            retired_pages_pending=bool(retired_pending) if retired_pending is not None else None,
            remapped_rows_correctable=remap[0] if remap is not None else None,
            remapped_rows_uncorrectable=remap[1] if remap is not None else None,
            remapped_rows_pending=bool(remap[2]) if remap is not None else None,
            remapped_rows_failure=bool(remap[3]) if remap is not None else None,
            nvlinks=self._nvlinks(index, h),
            nvlink_errors=slow["nvlink_errors"],
            clock_event_nanoseconds=slow["violations"],
            nvlink_data_bytes=slow["nvlink_data"],
            processes=tuple(
                GpuProcess(pid=p.pid, used_memory_bytes=p.usedGpuMemory, user=None, command=None,
                           kind=getattr(p, "kind", "compute"), sm_utilization_percent=getattr(p, "sm", None))
                for p in procs
            )
            if procs is not None
            else None,
        )

    def _memory(self, index: int, h: Any) -> tuple[int | None, int | None, int | None, int | None]:
        """(used, total, reserved, free) bytes: ``nvmlDeviceGetMemoryInfo_v2`` keeps the driver's
        reservation apart (nvml.h: v1's ``used`` is reserved + allocated); v1 where the driver or the
        bindings lack it (reserved unknown)."""
        version = getattr(self._m, "nvmlMemory_v2", None)
        v2 = self.get("nvmlDeviceGetMemoryInfo", h, version, gpu=index) if version is not None else None
        if v2 is not None:
            return int(v2.used), int(v2.total), int(v2.reserved), int(v2.free)
        mem = self.get("nvmlDeviceGetMemoryInfo", h, gpu=index)
        if mem is None:
            return None, None, None, None
        return int(mem.used), int(mem.total), None, int(mem.free)

    def _processes(self, index: int, h: Any, locked: bool = True) -> Any:
        """The GPU's compute and graphics processes (one entry per pid: a process in both lists is
        ``compute+graphics``, as nvidia-smi's "C+G"). None when the compute list cannot be read."""
        compute = self._process_list(index, h, locked, PROCESS_CALLS)
        if compute is None:
            return None
        graphics = self._process_list(index, h, locked, GRAPHICS_CALLS) or []
        by_pid = {p.pid: p for p in compute}
        for g in graphics:
            seen = by_pid.get(g.pid)
            if seen is not None:
                seen.kind = "compute+graphics"
            else:
                g.kind = "graphics"
                by_pid[g.pid] = g
        sm = self._process_sm(index, h, locked) if by_pid else None  # no process: nothing to ask
        for p in by_pid.values():
            # NVML samples only processes with non-zero use: in a window that has samples, a process
            # without one used no SM (0); with no sample at all (NOT_FOUND) there is no figure.
            p.sm = None if not sm else sm.get(p.pid, 0)
        return list(by_pid.values())

    def _process_sm(self, index: int, h: Any, locked: bool) -> dict[int, int] | None:
        """Each process's SM use over the samples since the last read (the mean of its samples); empty
        when NVML has no newer sample. None when the GPU does not give it."""
        name = "nvmlDeviceGetProcessUtilization"

        out: dict[int, int] | None = self._optional(
            (name, index, ()), lambda: self._maybe_locked(locked, self._utilization_samples, name, h, index))
        return out

    def _utilization_samples(self, name: str, h: Any, index: int) -> dict[int, int]:
        """``nvmlDeviceGetProcessUtilization`` with gpud's own buffer: the bindings' wrapper raises on the
        size call's SUCCESS and NOT_FOUND answers (nvidia-ml-py 12.535 and 13.x alike). NOT_FOUND ("no
        valid sample entries are found since the lastSeenTimeStamp", nvml.h) means no figure, not 0."""
        fn = self._c_function(name, index)
        last = ctypes.c_ulonglong(self._util_seen.get(index, 0))
        count = ctypes.c_uint(0)
        self.calls += 1
        ret = fn(h, None, ctypes.byref(count), last)
        if ret in (0, NOT_FOUND):
            return {}
        if ret != INSUFFICIENT_SIZE:
            self._c_check(ret, name, index)
        room = count.value * 2 + 5  # processes may start between the two calls
        buf = (ProcessUtilizationSample * room)()
        count.value = room
        self.calls += 1
        ret = fn(h, buf, ctypes.byref(count), last)
        if ret == NOT_FOUND:
            return {}
        self._c_check(ret, name, index)
        samples = buf[:min(count.value, room)]
        per: dict[int, list[int]] = {}
        for smp in samples:
            per.setdefault(int(smp.pid), []).append(min(int(smp.smUtil), 100))
        if samples:
            self._util_seen[index] = max(int(smp.timeStamp) for smp in samples)
        return {pid: round(sum(v) / len(v)) for pid, v in per.items()}

    def _maybe_locked(self, locked: bool, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` under gpud's NVML lock, or without it (the off-tick sampler: NVML is thread-safe),
        between two ticks' reads."""
        if not locked:
            with self._gate.call():
                return fn(*args)
        with self._lock:
            return fn(*args)

    def _process_list(self, index: int, h: Any, locked: bool, calls: tuple[str, ...]) -> Any:
        """One of NVML's process lists, from the newest entry point the driver exports."""
        for name in calls:
            if (name, index, ()) in self._unsupported:
                continue

            procs = self._optional((name, index, ()),
                                   functools.partial(self._maybe_locked, locked, self._process_entries, name, h, index))
            if procs is not None:
                return procs
        return None

    def _c_function(self, name: str, gpu: int | None) -> Any:
        """An entry point of the C library itself, through the bindings' resolver (all versions)."""
        try:
            return self._m._nvmlGetFunctionPointer(name)
        except self._m.NVMLError as err:
            raise self._translate(err, name, gpu) from err
        except AttributeError as err:
            raise Unsupported(f"{name}: the bindings cannot resolve C functions", call=name, gpu=gpu) from err

    def _c_check(self, ret: int, name: str, gpu: int | None) -> None:
        if ret != 0:
            self.errors[name] += 1
            raise self._translate(self._m.NVMLError(ret), name, gpu)

    def _process_entries(self, name: str, h: Any, index: int) -> list[GpuProcessEntry]:
        """Call the process-list entry point with gpud's own buffer: sized for the largest entry any
        driver writes and filled with a sentinel, so the entry size the driver used is seen in the
        bytes it left untouched (a pid or a memory size is never 0xA5A5…)."""
        fn = self._c_function(name, index)
        count = ctypes.c_uint(0)
        self.calls += 1
        ret = fn(h, ctypes.byref(count), None)
        if ret == 0:
            return []
        if ret != INSUFFICIENT_SIZE:
            self._c_check(ret, name, index)
        room = count.value * 2 + 5  # processes may start between the two calls
        buf = (ctypes.c_ubyte * (room * PROCESS_ENTRY_MAX))()
        ctypes.memset(buf, SENTINEL, ctypes.sizeof(buf))
        count.value = room
        self.calls += 1
        self._c_check(fn(h, ctypes.byref(count), buf), name, index)
        n = count.value
        raw = bytes(buf)
        size = 24 if n == 0 or raw[24 * n:32 * n] == bytes([SENTINEL]) * (8 * n) else 32
        out = []
        for k in range(n):
            pid = int.from_bytes(raw[k * size:k * size + 4], "little")
            mem = int.from_bytes(raw[k * size + 8:k * size + 16], "little")
            out.append(GpuProcessEntry(pid, None if mem == NOT_AVAILABLE_ULL else mem))
        return out

    def _offtick_processes(self, index: int, now: float) -> Any:
        got = self._procs.get(index)
        return got[1] if got is not None and now - got[0] <= 3 * OFFTICK_EVERY_S else None

    def _pcie_rates(self, index: int, h: Any, now: float) -> tuple[int | None, int | None]:
        """PCIe TX/RX bytes per second without blocking the tick: from NVML's cumulative byte counters
        (two ticks apart) where the GPU has them, else the latest off-tick ``sample_pcie`` result."""
        # Every id Not Supported: no counters, not asked again (a call that fails whole is asked again).
        values = self._field_values(index, h, [FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES], "pcie_bytes", retry_s=None)
        if values is not None:
            counts = [field_int(v) for v in values]
            if None not in counts:
                self._pcie_counter_ok.add(index)
                (tx, bits), (rx, _) = counts  # type: ignore[misc]
                last = self._pcie_counts.get(index)
                self._pcie_counts[index] = (now, tx, rx)
                if last is not None and now > last[0]:
                    dt, wrap = now - last[0], 1 << bits  # "Value can be wrapped" (nvml.h): modulo its width
                    return int((tx - last[1]) % wrap / dt), int((rx - last[2]) % wrap / dt)
            elif any(int(v.nvmlReturn) == 3 for v in values):  # one of the pair missing: no use either
                self._fields_retry[(index, "pcie_bytes")] = math.inf
        sampled = self._pcie_sampled.get(index)  # no counters, or no earlier count yet
        if sampled is None or now - sampled[0] > 3 * OFFTICK_EVERY_S:
            return None, None
        return sampled[1], sampled[2]

    def needs_pcie_sampling(self, index: int) -> bool:
        """No working byte counters (yet) and a throughput call that answers."""
        return (index not in self._pcie_counter_ok
                and ("nvmlDeviceGetPcieThroughput", index, (PCIE_TX,)) not in self._unsupported)

    def sample_pcie(self, index: int) -> None:
        """Read ``nvmlDeviceGetPcieThroughput`` (each call counts bytes over 20 ms, NVML reference) for
        one GPU *without* holding gpud's NVML lock, so a tick never waits for it. NVML itself is
        thread-safe. Meant for a sampler thread (the daemon) or a one-shot read of all GPUs at once."""
        try:
            h = self.handle(index)
        except NvmlError:
            return
        rates: list[int] = []
        for counter in (PCIE_TX, PCIE_RX):
            key = ("nvmlDeviceGetPcieThroughput", index, (counter,))

            def read(c: int = counter) -> Any:
                with self._gate.call():
                    return self._raw("nvmlDeviceGetPcieThroughput", h, c, gpu=index)

            kbs = self._optional(key, read)
            if kbs is None:
                return
            rates.append(int(kbs) * 1024)
        self._pcie_sampled[index] = (time.time(), rates[0], rates[1])

    def sample_offtick(self, index: int, processes: bool = False) -> None:
        """The blocking readings of one GPU, without gpud's lock: PCIe throughput where there are no
        byte counters, and (``processes``) the process list. Never raises: a thread runs it."""
        try:
            if self.needs_pcie_sampling(index):
                self.sample_pcie(index)
            if processes:
                procs = self._processes(index, self.handle(index), locked=False)
                self._procs[index] = (time.time(), procs)
        except NvmlError as err:  # a lost GPU or a missing driver: the tick reports it
            log.debug("off-tick readings of GPU %d: %s", index, err)

    def telemetry(self, index: int) -> GpuSample:
        """The readings a load test follows each second, and nothing else (about 10 plain calls, none
        blocking): temperature, fans (as asked), power and its enforced limit, SM and memory clocks,
        utilisation, clock-event reasons, the PCIe link's generation and width. ``sample`` gives the
        whole picture (health counters, processes) at 10× the cost; a lost GPU reads as it does there."""
        with self._lock:
            return self._sample_locked(index, self._telemetry)

    def _telemetry(self, index: int, info: GpuInfo, now: float) -> GpuSample:
        h = self.handle(index)

        def get(name: str, *args: Any) -> Any:
            return self.get(name, h, *args, gpu=index)

        fans = tuple(FanReading(f, get("nvmlDeviceGetFanSpeed_v2", f), None, None) for f in range(info.fan_count or 0))
        events = self._clock_event_mask(get)
        power, limit = get("nvmlDeviceGetPowerUsage"), get("nvmlDeviceGetEnforcedPowerLimit")
        util = get("nvmlDeviceGetUtilizationRates")
        return GpuSample(
            index=index, uuid=info.uuid, timestamp=now, temperature_celsius=self._temperature(h, index),
            fans=fans, power_watts=power / 1000.0 if power is not None else None,
            power_limit_watts=limit / 1000.0 if limit is not None else None,
            clocks_mhz={k: get("nvmlDeviceGetClockInfo", CLOCK_TYPES[k]) for k in ("sm", "memory")},
            utilization_gpu_percent=util.gpu if util is not None else None,
            pcie_generation=get("nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_width=get("nvmlDeviceGetCurrPcieLinkWidth"),
            clock_event_mask=events,
            clock_events=decode_clock_events(events) if events is not None else None)

    @staticmethod
    def _clock_event_mask(get: Callable[..., Any]) -> Any:
        """The clock-event reasons bitmask: the R535+ name, else the older "throttle" one."""
        events = get("nvmlDeviceGetCurrentClocksEventReasons")
        return events if events is not None else get("nvmlDeviceGetCurrentClocksThrottleReasons")

    def sample_pcie_all(self, indices: list[int], processes: bool = False) -> None:
        """Every GPU's blocking readings, a thread per GPU. The driver serialises NVML calls on its RM lock
        (and ``TickGate`` makes them one at a time): about 40 ms of PCIe throughput per GPU all the same."""
        threads = [threading.Thread(target=self.sample_offtick, args=(i, processes), daemon=True) for i in indices]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def start_sampler(self, stop: threading.Event, every_s: float = OFFTICK_EVERY_S) -> threading.Thread:
        """Serve the tick's blocking readings from a thread, every ``every_s``; the first round is read
        here, before the first tick. Until it runs (NVML not ready at start), the tick reads them."""

        def round_() -> None:
            try:
                self.sample_pcie_all(list(range(self.device_count())), processes=True)
            except NvmlError as err:
                log.debug("off-tick sampler: %s", err)
                return
            self.offtick = True  # from the first round that could read, the tick uses these

        round_()

        def loop() -> None:
            while not stop.wait(every_s):
                round_()

        thread = threading.Thread(target=loop, name="gpud-offtick-sampler", daemon=True)
        thread.start()
        return thread

    def _slow_fields(self, index: int, h: Any, info: GpuInfo, now: float) -> dict[str, Any]:
        """What changes only when someone sets it, or slowly: health counters (ECC, page retirement, row
        remapping, PCIe replays), modes, the management power limit, application clocks, fan policies
        and the trained link width. Read every SLOW_EVERY_S seconds, not every tick; gpud's own setters
        read them afresh (the enforced limit, clocks, link generation and NVLink state stay per tick)."""
        cached = self._slow.get(index)
        if cached is not None and now - cached[0] < SLOW_EVERY_S:
            return cached[1]

        def get(name: str, *args: Any) -> Any:
            return self.get(name, h, *args, gpu=index)

        policies = []
        for fan in range(info.fan_count or 0):
            out = self.get_out("nvmlDeviceGetFanControlPolicy_v2", h, fan, gpu=index)
            policies.append(out[0] if out is not None else None)
        ecc_mode = get("nvmlDeviceGetEccMode")
        ecc = None
        if ecc_mode is not None and ecc_mode[0]:
            ecc = EccCounts(
                volatile_corrected=get("nvmlDeviceGetTotalEccErrors", ECC_CORRECTED, ECC_VOLATILE),
                volatile_uncorrected=get("nvmlDeviceGetTotalEccErrors", ECC_UNCORRECTED, ECC_VOLATILE),
                aggregate_corrected=get("nvmlDeviceGetTotalEccErrors", ECC_CORRECTED, ECC_AGGREGATE),
                aggregate_uncorrected=get("nvmlDeviceGetTotalEccErrors", ECC_UNCORRECTED, ECC_AGGREGATE),
            )
        fields = {"ecc_mode": ecc_mode, "ecc": ecc, "sbe": get("nvmlDeviceGetRetiredPages", RETIRE_SBE),
                  "dbe": get("nvmlDeviceGetRetiredPages", RETIRE_DBE),
                  "retired_pending": get("nvmlDeviceGetRetiredPagesPendingStatus"),
                  "remap": get("nvmlDeviceGetRemappedRows"), "replay": get("nvmlDeviceGetPcieReplayCounter"),
                  "fan_policies": policies, "persistence": get("nvmlDeviceGetPersistenceMode"),
                  "compute": get("nvmlDeviceGetComputeMode"), "mig": get("nvmlDeviceGetMigMode"),
                  "management_limit": get("nvmlDeviceGetPowerManagementLimit"),
                  "applications_clocks": {k: get("nvmlDeviceGetApplicationsClock", CLOCK_TYPES[k])
                                          for k in ("graphics", "memory")},
                  "pcie_width": get("nvmlDeviceGetCurrPcieLinkWidth"),
                  "nvlink_errors": self._nvlink_errors(index, h, info),
                  "violations": self._violations(index, h), "nvlink_data": self._nvlink_data(index, h, info)}
        self._slow[index] = (now, fields)
        return fields

    def _violations(self, index: int, h: Any) -> dict[str, int] | None:
        """NVML's violation counters, ns per clock-event reason: one field-value call for every id; a
        reason no field gives (a driver that does not know the id) from nvmlDeviceGetViolationStatus
        where a policy counts it. None when the GPU keeps none (the caller counts per tick then)."""
        out: dict[str, int] = {}
        ids = violation_fields(self.versions().driver)
        # every id Not Supported: a capability, not asked again
        for v in self._field_values(index, h, list(ids), "violations", retry_s=None) or ():
            got = field_int(v)
            if got is not None and int(v.fieldId) in ids:
                out[ids[int(v.fieldId)]] = got[0]
        for policy, reason in PERF_POLICIES.items():
            if reason not in out:
                t = self.get("nvmlDeviceGetViolationStatus", h, policy, gpu=index)
                if t is not None:
                    out[reason] = int(t.violationTime)
        return out or None

    def _nvlink_data(self, index: int, h: Any, info: GpuInfo) -> tuple[tuple[int, str, int], ...] | None:
        """Data bytes each link sent and received since the driver loaded (field values 138/139 per link,
        KiB); None where the GPU gives none."""
        if not info.nvlink_count:
            return None
        ids = [(fid, link) for link in range(info.nvlink_count) for fid in FI_NVLINK_DATA]
        # No link counts data (a workstation bridge, or links not trained yet): asked again later.
        values = self._field_values(index, h, ids, "nvlink_data", retry_s=NVLINK_DATA_RETRY_S)
        out = []
        for v in values or ():
            got = field_int(v)
            if got is not None and int(v.fieldId) in FI_NVLINK_DATA:
                out.append((int(v.scopeId), FI_NVLINK_DATA[int(v.fieldId)], got[0] * 1024))
        return tuple(out) if out else None

    def _field_values(self, index: int, h: Any, ids: list[Any], what: str, retry_s: float | None) -> Any:
        """One ``nvmlDeviceGetFieldValues`` call for ``ids``; None when it cannot be read. A GPU that
        answers every id Not Supported is not asked again for ``retry_s`` seconds (None: never)."""
        if time.monotonic() < self._fields_retry.get((index, what), 0.0):
            return None
        try:
            values = self.call("nvmlDeviceGetFieldValues", h, ids, gpu=index)
        except (GpuLost, DriverNotLoaded, GpuUnusable):
            raise
        except NvmlError as err:
            # The call failed whole: nvml.h gives each field its own answer (nvmlReturn), so this says
            # nothing about the fields (asked again next time) unless the function itself is missing.
            if err.code in (13, None):
                self._gone.add("nvmlDeviceGetFieldValues")
                self._fields_retry[(index, what)] = math.inf
            return None
        if values is not None and all(int(v.nvmlReturn) == 3 for v in values):
            self._fields_retry[(index, what)] = math.inf if retry_s is None else time.monotonic() + retry_s
            return None
        return values

    def _nvlink_errors(self, index: int, h: Any, info: GpuInfo) -> tuple[tuple[int, str, int], ...] | None:
        """Each link's error counters (``nvidia-smi nvlink -e``); None where the GPU gives none."""
        out = []
        for link in range(info.nvlink_count):
            for name, counter in NVLINK_ERROR_COUNTERS.items():
                n = self.get("nvmlDeviceGetNvLinkErrorCounter", h, link, counter, gpu=index)
                if n is not None:
                    out.append((link, name, int(n)))
        return tuple(out) if out else None

    def _nvlinks(self, index: int, h: Any) -> tuple[NvLinkInfo, ...]:
        """Link states every tick; a link's remote end is read when it comes up, then kept."""
        out = []
        remotes = self._remotes.setdefault(index, {})
        for link, sli in enumerate(self._sli.get(index, ())):
            state = self.get("nvmlDeviceGetNvLinkState", h, link, gpu=index)
            up = bool(state)
            remote: str | None = None
            switch: bool | None = None
            if up:
                known = remotes.get(link)
                if known is None:
                    pci = self.get("nvmlDeviceGetNvLinkRemotePciInfo", h, link, gpu=index)
                    if pci is not None:
                        kind = self.get("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, gpu=index)
                        known = (normalize_bus_id(pci.busId), kind == NVLINK_DEVICE_SWITCH if kind is not None
                                 else None)
                        remotes[link] = known
                if known is not None:
                    remote, switch = known
            else:
                remotes.pop(link, None)
            out.append(NvLinkInfo(link=link, up=up, remote_pci_bus_id=remote, sli_bridge=sli,
                                  remote_is_switch=switch))
        return tuple(out)

    # -- pairs ------------------------------------------------------------------------
    def _pair(self, i: int, j: int) -> tuple[str, str, str, str]:
        """(PCIe level, P2P read, P2P write, P2P NVLink) between GPUs i and j, cached."""
        key = (min(i, j), max(i, j))
        cached = self._pairs.get(key)
        if cached is None:
            hi, hj = self.handle(key[0]), self.handle(key[1])
            anc = self.get("nvmlDeviceGetTopologyCommonAncestor", hi, hj, gpu=i)

            def p2p(idx: int) -> str:
                st = self.get("nvmlDeviceGetP2PStatus", hi, hj, idx, gpu=i)
                return P2P_STATUS.get(st, "unknown") if st is not None else "unknown"

            cached = (
                TOPO_LEVEL.get(anc, "SYS") if anc is not None else "?",
                p2p(P2P_READ),
                p2p(P2P_WRITE),
                p2p(P2P_NVLINK),
            )
            self._pairs[key] = cached
        return cached

    def topology(self, samples: list[GpuSample] | tuple[GpuSample, ...]) -> Topology:
        """Pairwise topology; NV# counts the links up in ``samples`` (one per GPU)."""
        idx = tuple(s.index for s in samples)
        bus = {i: self.info(i).pci_bus_id for i in idx if not self._lost(samples, i)}
        n = len(idx)
        level, pcie, nvl, rd, wr, nv = ([["X"] * n for _ in range(n)] for _ in range(6))
        for a in range(n):
            nvl[a][a] = 0  # type: ignore[call-overload]
        for a, i in enumerate(idx):
            for b, j in enumerate(idx):
                if a == b:
                    continue
                if i not in bus or j not in bus:
                    level[a][b] = pcie[a][b] = "?"
                    nvl[a][b] = 0  # type: ignore[call-overload]
                    rd[a][b] = wr[a][b] = nv[a][b] = "unknown"
                    continue
                lvl, r, w, v = self._pair(i, j)
                links = sum(1 for ln in samples[a].nvlinks if ln.up and ln.remote_pci_bus_id == bus[j])
                if not links:  # NVSwitch fabric (HGX): GPUs reach each other over their switch links
                    links = min(self._switch_links(samples[a], bus), self._switch_links(samples[b], bus))
                pcie[a][b] = lvl
                level[a][b] = f"NV{links}" if links else lvl
                nvl[a][b] = links  # type: ignore[call-overload]
                rd[a][b], wr[a][b], nv[a][b] = r, w, v

        def freeze(m: list[list[Any]]) -> tuple[tuple[Any, ...], ...]:
            return tuple(tuple(row) for row in m)

        return Topology(
            gpus=idx,
            level=freeze(level),
            pcie_level=freeze(pcie),
            nvlinks=freeze(nvl),
            p2p_read=freeze(rd),
            p2p_write=freeze(wr),
            p2p_nvlink=freeze(nv),
        )

    @staticmethod
    def _switch_links(sample: GpuSample, gpu_buses: dict[int, str]) -> int:
        """Links up to an NVSwitch: the remote says so, or (bindings without the device-type call) the
        remote end is no GPU of this machine."""
        others = set(gpu_buses.values())
        return sum(1 for ln in sample.nvlinks if ln.up and ln.remote_pci_bus_id is not None and (
            ln.remote_is_switch or (ln.remote_is_switch is None and ln.remote_pci_bus_id not in others)))

    @staticmethod
    def _lost(samples: Any, index: int) -> bool:
        return any(s.index == index and s.lost for s in samples)

    # -- setters, each followed by a read-back where NVML has a getter ----------------
    def _set(self, index: int, setter: str, args: tuple[Any, ...], getter: str | None = None,
             getter_args: tuple[Any, ...] = (), convert: Callable[[Any], T] | None = None) -> Any:
        h = self.handle(index)
        self._slow.pop(index, None)
        self.call(setter, h, *args, gpu=index)
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

    def set_fan_auto(self, index: int, fan: int) -> str:
        """Hand the fan back to the driver's automatic policy; returns the policy read back."""
        h = self.handle(index)
        self._slow.pop(index, None)
        self.call("nvmlDeviceSetDefaultFanSpeed_v2", h, fan, gpu=index)
        out = self.get_out("nvmlDeviceGetFanControlPolicy_v2", h, fan, gpu=index)
        if out is not None and out[0] != FAN_POLICY_AUTO:
            self.call("nvmlDeviceSetFanControlPolicy", h, fan, FAN_POLICY_AUTO, gpu=index)
            out = self.get_out("nvmlDeviceGetFanControlPolicy_v2", h, fan, gpu=index)
        return FAN_POLICY.get(out[0], "auto") if out is not None else "auto"
