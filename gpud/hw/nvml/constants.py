"""NVML's codes and ids as gpud uses them (nvml.h), and how often the slow readings are taken."""

from __future__ import annotations

import ctypes
import logging
from typing import Any, TypeVar

from gpud.errors import (
    InsufficientPower,
    IrqIssue,
)
from gpud.model import (
    P2P_STATUSES,
)

T = TypeVar("T")
log = logging.getLogger("gpud.nvml")

# NVML return codes (nvml.h); fixed by the C API, so spelled out here rather than read from
# the bindings (some binding releases carry typos, e.g. NVML_P2P_CAPS_INDEX_READ = (0,)).
_NOT_SUPPORTED = {3, 13, 26}  # NOT_SUPPORTED, FUNCTION_NOT_FOUND, DEPRECATED (app clocks on 590+ drivers)
_NO_PERMISSION = {4}
_GPU_LOST = {15, 16}  # GPU_IS_LOST, RESET_REQUIRED
_NO_DRIVER = {9, 12}  # DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND
_LIBRARY_NOT_FOUND = 12  # "NVML Shared Library Not Found": no libnvidia-ml.so.1 (a container without the runtime)
_RM_MISMATCH = 18  # LIB_RM_VERSION_MISMATCH: the library of a newer driver over the old kernel module
_UNUSABLE = {8: InsufficientPower, 11: IrqIssue}  # INSUFFICIENT_POWER, IRQ_ISSUE (nvml.h)
_UNINITIALIZED = 1

CLOCK_TYPES = {"graphics": 0, "sm": 1, "memory": 2}  # NVML_CLOCK_*
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
# Clock offsets (the "manual clock values" of overclocking and undervolting tools), per domain: nvml.h's
# nvmlDeviceGet/SetClockOffsets (R555 on) with its struct, else the older per-domain VF-offset calls
# (getter, range getter, setter; deprecated "will be removed in CUDA 14.0"). gpud reads and writes P0's.
OFFSET_DOMAINS = {"graphics": CLOCK_TYPES["graphics"], "memory": CLOCK_TYPES["memory"]}
VF_OFFSET_CALLS = {
    "graphics": ("nvmlDeviceGetGpcClkVfOffset", "nvmlDeviceGetGpcClkMinMaxVfOffset", "nvmlDeviceSetGpcClkVfOffset"),
    "memory": ("nvmlDeviceGetMemClkVfOffset", "nvmlDeviceGetMemClkMinMaxVfOffset", "nvmlDeviceSetMemClkVfOffset"),
}
PSTATE_0 = 0  # NVML_PSTATE_0: the performance state a GPU runs its load in


class ClockOffsetStruct(ctypes.Structure):
    """nvml.h's ``nvmlClockOffset_t`` (version 1), declared here: nvidia-ml-py before 12.555 lacks it."""

    _fields_ = [("version", ctypes.c_uint), ("type", ctypes.c_uint), ("pstate", ctypes.c_uint),
                ("clockOffsetMHz", ctypes.c_int), ("minClockOffsetMHz", ctypes.c_int),
                ("maxClockOffsetMHz", ctypes.c_int)]


CLOCK_OFFSET_V1 = ctypes.sizeof(ClockOffsetStruct) | 1 << 24  # NVML_STRUCT_VERSION(ClockOffset, 1): 0x1000018
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN = 0, 1  # NVML_TEMPERATURE_THRESHOLD_*
PCIE_TX, PCIE_RX = 0, 1  # NVML_PCIE_UTIL_*_BYTES (KB/s)
FAN_POLICY = {0: "auto", 1: "manual"}  # NVML_FAN_POLICY_TEMPERATURE_CONTINOUS_SW, _MANUAL
FAN_POLICY_AUTO = 0
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1  # NVML_MEMORY_ERROR_TYPE_*
ECC_VOLATILE, ECC_AGGREGATE = 0, 1  # NVML_*_ECC
# Each ECC total: its field id (nvml.h NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL: single-bit = corrected,
# double-bit = uncorrected) and nvmlDeviceGetTotalEccErrors's (error type, counter type) for the same count.
ECC_TOTALS = {"volatile_corrected": (3, ECC_CORRECTED, ECC_VOLATILE),
              "volatile_uncorrected": (4, ECC_UNCORRECTED, ECC_VOLATILE),
              "aggregate_corrected": (5, ECC_CORRECTED, ECC_AGGREGATE),
              "aggregate_uncorrected": (6, ECC_UNCORRECTED, ECC_AGGREGATE)}
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
# PCIe throughput where a GPU has no cumulative byte counters: two 20 ms samples a GPU, each holding the driver's
# lock for its window (docs/simulation.md, "Call latency"): 320 ms of every round on 8 GPUs. Its readers are
# the exporter, scraped every 15 s as shipped (deploy/kubernetes/podmonitor.yaml ``interval``, docs/deployment.md
# ``scrape_interval``), and ``/status``; a 20 ms window says what the link carried then, not over the interval. A
# sample every 15 s gives each scrape its own; every round gave each three, two of them never read. One-shot
# commands (``snapshot(pcie=True)``) sample when they run.
PCIE_SAMPLE_EVERY_S = 15.0
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
# The same counters as field values, one id per link and counter (nvml.h NVML_FI_DEV_NVLINK_*_ERROR_COUNT_L0–L11;
# DCGM's DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_L* read these): (id of link 0, id of link 6), links 0–11 only.
FI_NVLINK_ERRORS = {"replay": (46, 108), "recovery": (53, 114), "crc_flit": (32, 96), "crc_data": (39, 102)}
FI_NVLINK_ERROR_LINKS = 12
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


class FieldValueUnion(ctypes.Union):
    """``nvmlValue_t`` (nvml.h)."""

    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort)]


class FieldValue(ctypes.Structure):
    """``nvmlFieldValue_t`` (nvml.h): gpud's own, whose fields read at C speed. The bindings' struct reads and
    writes each field through Python (``__getattribute__``, ``__setattr__``): through it, one call for a bridged
    A6000's 20 ECC and NVLink counters cost more of gpud's CPU than the 20 plain calls (92–101 µs against
    84–86 µs); through this one, 107 µs against 155 µs (the simulated library's part 175 µs against 505 µs)."""

    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_int), ("nvmlReturn", ctypes.c_int),
                ("value", FieldValueUnion)]


class MemoryStruct(ctypes.Structure):
    """nvml.h's ``nvmlMemory_t`` (bytes), gpud's own as ``FieldValue`` is: the bindings' struct reads each field
    through Python."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class UtilizationStruct(ctypes.Structure):
    """nvml.h's ``nvmlUtilization_t`` (percent of the last sample period), as ``MemoryStruct``."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


# The readings the daemon makes most (on 8 GPUs its tick and the rules' poll make about 60 a second), called
# through the C entry point as nvidia-ml-py's wrapper of each calls it: the handle, the inputs as given, one
# output cell of nvml.h's type. name → (the output's type, how many inputs after the handle). The wrapper's
# own Python (a lookup of the function under the bindings' lock, its check of the return code) was 3.5 µs of
# the 8 µs that a reading cost gpud beside the C call (docs/performance.md, "The tick's readings through the
# C entry points"). A scalar reads as its value, a struct as itself; any other arity goes through the wrapper.
DIRECT_READINGS: dict[str, tuple[type[ctypes._SimpleCData[Any]] | type[ctypes.Structure], int]] = {
    "nvmlDeviceGetFanSpeed": (ctypes.c_uint, 0),
    "nvmlDeviceGetFanSpeed_v2": (ctypes.c_uint, 1),  # fan
    "nvmlDeviceGetTargetFanSpeed": (ctypes.c_uint, 1),  # fan
    "nvmlDeviceGetPowerUsage": (ctypes.c_uint, 0),  # mW
    "nvmlDeviceGetTemperature": (ctypes.c_uint, 1),  # sensor
    "nvmlDeviceGetClockInfo": (ctypes.c_uint, 1),  # clock type
    "nvmlDeviceGetEnforcedPowerLimit": (ctypes.c_uint, 0),  # mW
    "nvmlDeviceGetTotalEnergyConsumption": (ctypes.c_ulonglong, 0),  # mJ
    "nvmlDeviceGetCurrPcieLinkGeneration": (ctypes.c_uint, 0),
    "nvmlDeviceGetCurrentClocksEventReasons": (ctypes.c_ulonglong, 0),
    "nvmlDeviceGetMemoryInfo": (MemoryStruct, 0),  # v1; with a version (v2) through the wrapper
    # A whole snapshot's other single-output readings (every 5 s, the slow ones every SLOW_EVERY_S; about 9 a second on
    # 8 GPUs): the same wrapper cost on each, none of them blocking.
    "nvmlDeviceGetUtilizationRates": (UtilizationStruct, 0),
    "nvmlDeviceGetNvLinkState": (ctypes.c_uint, 1),  # link
    "nvmlDeviceGetApplicationsClock": (ctypes.c_uint, 1),  # clock type
    "nvmlDeviceGetPersistenceMode": (ctypes.c_uint, 0),
    "nvmlDeviceGetComputeMode": (ctypes.c_uint, 0),
    "nvmlDeviceGetPowerManagementLimit": (ctypes.c_uint, 0),  # mW
    "nvmlDeviceGetCurrPcieLinkWidth": (ctypes.c_uint, 0),
    "nvmlDeviceGetPcieReplayCounter": (ctypes.c_uint, 0),
}


SENTINEL = 0xA5
INSUFFICIENT_SIZE = 7
NOT_AVAILABLE_ULL = 2**64 - 1
