"""Entry points that read a GPU's use: utilisation, memory, processes, PCIe, field values and
violation counters, ECC and memory health.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

from gpud.sim.description import GpuSpec
from gpud.sim.entries import entry
from gpud.sim.jobs import Process, on_gpu
from gpud.sim.libnvml.library import MigRef, SimLibrary, driver_major, driver_release, effective_uid
from gpud.sim.libnvml.pairs import nvlink_error_field
from gpud.sim.libnvml.returns import (
    ARGUMENT_VERSION_MISMATCH,
    FI_ECC_TOTALS,
    FI_NVLINK_DATA_RX,
    FI_NVLINK_DATA_TX,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    FI_THERMAL_NEW,
    FI_THERMAL_OLD,
    FI_VIOLATIONS,
    INSUFFICIENT_SIZE,
    NOT_FOUND,
    NOT_SUPPORTED,
    PERF_POLICIES,
    PROCESS_SAMPLES_KEPT,
    SUCCESS,
    THERMAL_IDS_RENUMBERED,
    TLIMIT_FIELDS,
    VALUE_TYPE_SIGNED_INT,
    VALUE_TYPE_ULL,
    VIOLATION_FIELDS_FROM_DRIVER,
    _target,
    fail,
    value_of,
)
from gpud.sim.mig import NOT_IN_AN_INSTANCE
from gpud.sim.topology import link_state

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


def _in_instance(lib: SimLibrary, ref: MigRef) -> list[Process]:
    """The processes a MIG device runs: those naming its GPU instance and compute instance."""
    m = lib.gpu(ref.gpu).mig_instances[ref.k]
    return [p for p in on_gpu(lib.sim, ref.gpu)
            if p.gpu_instance_id == m.gpu_instance_id and (p.compute_instance_id or 0) == m.compute_instance_id]


def _memory_parts(lib: SimLibrary, i: int | MigRef) -> tuple[int, int, int]:
    """(total, reserved by the driver, allocated) in bytes; a MIG device's own memory on its handle."""
    if isinstance(i, MigRef):
        m = lib.gpu(i.gpu).mig_instances[i.k]
        total = m.memory_mib << 20
        reserved = min(m.reserved_mib << 20, total)
        used = (m.used_mib or 0) + sum(p.used_mib for p in _in_instance(lib, i))
        return total, reserved, min(used << 20, total - reserved)
    g = lib.gpu(i)
    total = memory_total_mib(g) << 20
    reserved = min(int(g.memory_reserved_mib) << 20, total)
    allocated = min((g.memory_used_mib + sum(p.used_mib for p in on_gpu(lib.sim, i))) << 20, total - reserved)
    return total, reserved, allocated


@entry("nvmlDeviceGetMigMode", outs=2)
def _mig_mode(lib: SimLibrary, i: int) -> tuple[int, int]:
    """(current, pending): NVML_DEVICE_MIG_ENABLE is 1; a GPU without MIG answers Not Supported."""
    mode = lib.gpu(i).mig_mode
    if mode is None:
        fail(NOT_SUPPORTED)
    return int(bool(mode)), int(bool(mode))


@entry("nvmlDeviceGetMemoryInfo", mig=True)
def _memory(lib: SimLibrary, i: int | MigRef) -> dict[str, int]:
    """nvml.h's ``nvmlMemory_t``: ``used`` is reserved + allocated ("Sum of Reserved and Allocated")."""
    total, reserved, allocated = _memory_parts(lib, i)
    return {"total": total, "used": reserved + allocated, "free": total - reserved - allocated}


MEMORY_V2 = 0x02000028  # nvml.h: nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2), sizeof 40


@entry("nvmlDeviceGetMemoryInfo_v2", outs="raw", mig=True)
def _memory_v2(lib: SimLibrary, i: int | MigRef, out: Any) -> None:
    """``nvmlMemory_v2_t``: reserved apart, ``used`` the allocated memory alone (what nvidia-smi prints
    as Used beside Reserved); a struct of another version is ARGUMENT_VERSION_MISMATCH."""
    t = _target(out)
    if int(getattr(t, "version", 0)) != MEMORY_V2:
        fail(ARGUMENT_VERSION_MISMATCH)
    total, reserved, allocated = _memory_parts(lib, i)
    t.total, t.reserved, t.used, t.free = total, reserved, allocated, total - reserved - allocated


def _processes(lib: SimLibrary, i: int | MigRef, count: Any, out: Any, graphics: bool = False) -> None:
    """``*infoCount`` in: the room the caller has; out: the number of processes. The entries are
    written as the driver lays them out — nvml.h's 24 bytes (pid, pad, usedGpuMemory, gpuInstanceId,
    computeInstanceId), or 32 with usedGpuCcProtectedMemory (``process_entry_bytes``, early R535) —
    whatever struct the bindings declared. Compute and graphics lists share the layout (nvml.h).

    MIG (nvml.h): a MIG device's handle lists its own processes; the GPU's handle "returns aggregate
    information, only if the caller has appropriate privileges" — as root all of them, otherwise an empty
    list here (nvml.h does not say what; the answer that would hide every job). A process of a GPU without
    MIG is in no instance: gpuInstanceId and computeInstanceId 0xFFFFFFFF."""
    if isinstance(i, MigRef):
        listed = [] if graphics else _in_instance(lib, i)  # MIG has no graphics contexts
    elif lib.gpu(i).mig_mode and effective_uid() != 0:
        listed = []
    else:
        listed = on_gpu(lib.sim, i)
    procs = [p for p in listed
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
        + (NOT_IN_AN_INSTANCE if p.gpu_instance_id is None else p.gpu_instance_id).to_bytes(4, "little")
        + (NOT_IN_AN_INSTANCE if p.gpu_instance_id is None else p.compute_instance_id or 0).to_bytes(4, "little")
        + bytes(size - 24) for p in procs)
    target = _target(out)
    # A real driver writes all of it, past a buffer declared for smaller entries; here it stops at
    # the buffer's end (this process's own memory is at stake), which the test of the layout notes.
    ctypes.memmove(ctypes.addressof(target), data, min(len(data), ctypes.sizeof(target)))
    n.value = len(procs)


entry("nvmlDeviceGetComputeRunningProcesses_v3", outs="raw", mig=True)(_processes)
entry("nvmlDeviceGetComputeRunningProcesses_v2", outs="raw", mig=True)(_processes)


def _graphics_processes(lib: SimLibrary, i: int | MigRef, count: Any, out: Any) -> None:
    _processes(lib, i, count, out, graphics=True)


entry("nvmlDeviceGetGraphicsRunningProcesses_v3", outs="raw", mig=True)(_graphics_processes)
entry("nvmlDeviceGetGraphicsRunningProcesses_v2", outs="raw", mig=True)(_graphics_processes)


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
        elif (errors := nvlink_error_field(lib, i, int(v.fieldId))) is not None:
            v.valueType, v.value.ullVal, v.nvmlReturn = VALUE_TYPE_ULL, errors & (2**64 - 1), SUCCESS
        elif v.fieldId in FI_ECC_TOTALS and lib.gpu(i).ecc_supported and lib.gpu(i).ecc_enabled:
            scope, kind = FI_ECC_TOTALS[int(v.fieldId)]
            count = int(getattr(lib.gpu(i), f"ecc_{scope}_{kind}"))
            v.valueType, v.value.ullVal, v.nvmlReturn = VALUE_TYPE_ULL, count, SUCCESS
        elif v.fieldId in TLIMIT_FIELDS and lib.gpu(i).tlimit_thresholds:
            g = lib.gpu(i)  # the margin T.Limit shows when the threshold is reached: −2 for slowdown
            v.valueType = VALUE_TYPE_SIGNED_INT
            limit = g.max_operating_celsius
            v.value.siVal = int(limit) - int(getattr(g, TLIMIT_FIELDS[v.fieldId]))  # type: ignore[arg-type]
            v.nvmlReturn = SUCCESS
        else:
            v.nvmlReturn = NOT_SUPPORTED


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
    procs = on_gpu(lib.sim, i)
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
