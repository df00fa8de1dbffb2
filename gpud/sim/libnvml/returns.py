"""The simulated library's return codes (``nvmlReturn_t``, nvml.h), the constants its entry points share,
and the C calling convention: outputs written through ``byref()`` pointers and string buffers.
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpud.model import P2P_STATUSES

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
# NVML_FI_DEV_NVLINK_{REPLAY,RECOVERY,CRC_FLIT,CRC_DATA}_ERROR_COUNT_L0–L11: the ids of link 0 and link 6
FI_NVLINK_ERRORS = {"replay": (46, 108), "recovery": (53, 114), "crc_flit": (32, 96), "crc_data": (39, 102)}
# NVML_FI_DEV_ECC_{SBE,DBE}_{VOL,AGG}_TOTAL → (scope, kind) of the GPU's ECC counts
FI_ECC_TOTALS = {3: ("volatile", "corrected"), 4: ("volatile", "uncorrected"), 5: ("aggregate", "corrected"),
                 6: ("aggregate", "uncorrected")}
PROCESS_SAMPLES_KEPT = 5  # samples per process in the driver's buffer (one per second): a model
VALUE_TYPE_ULL = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
NVLINK_DEVICE_GPU, NVLINK_DEVICE_SWITCH = 0, 2
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN, THRESHOLD_MEM_MAX, THRESHOLD_GPU_MAX = 0, 1, 2, 3
THRESHOLD_ACOUSTIC_CURR = 5  # nvidia-smi's "GPU Target Temperature" (nvml.h, pynvml.py)
SLI_BRIDGE_CAP = 4  # NVML_NVLINK_CAP_SLI_BRIDGE
TLIMIT_FIELDS = {193: "shutdown_celsius", 194: "slowdown_celsius", 196: "max_operating_celsius"}
VALUE_TYPE_SIGNED_INT = 5


class NvmlReturn(Exception):
    """An entry point's non-success return code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def fail(code: int) -> Any:
    raise NvmlReturn(code)


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
    store_into(_target(p), value)


def store_into(t: Any, value: Any) -> None:
    """``value`` into ``t``, what an output argument points at (``_target``)."""
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

