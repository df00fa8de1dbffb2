"""Entry points: initialisation, the system's versions, handle lookup and each GPU's identity and affinity."""

from __future__ import annotations

import time
from typing import Any

from gpud.model import pci_address
from gpud.sim.entries import entry
from gpud.sim.libnvml.library import MigRef, SimLibrary, wait_until
from gpud.sim.libnvml.returns import (
    ARCH_CODES,
    DRIVER_NOT_LOADED,
    GPU_IS_LOST,
    HANDLE_ERRORS,
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    LIB_RM_VERSION_MISMATCH,
    NOT_FOUND,
    NOT_SUPPORTED,
    UNINITIALIZED,
    UNKNOWN,
    NvmlReturn,
    fail,
    store,
    value_of,
)
from gpud.sim.mig import MAX_MIG_DEVICES, MigSpec
from gpud.sim.topology import node_cpus

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
    _open(lib, visible, i, out)


@entry("nvmlDeviceGetHandleByPciBusId_v2", outs="raw", handles=0)
def _handle_by_bus(lib: SimLibrary, bus_id: Any, out: Any) -> None:
    """nvml.h: "causes NVML to initialize the target GPU" (only it, but for an SLI slave); an address no
    GPU has answers NOT_FOUND, one that does not parse INVALID_ARGUMENT."""
    raw = value_of(bus_id)
    key = pci_address(raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or ""))
    if key is None:
        fail(INVALID_ARGUMENT)
    visible = lib.visible()
    for i, d in enumerate(visible):
        if pci_address(lib.sim.desc.gpus[d].bus_id) == key:
            _open(lib, visible, i, out)
            return
    fail(NOT_FOUND)


@entry("nvmlDeviceGetIndex")
def _index(lib: SimLibrary, i: int) -> int:
    """The GPU's NVML index: its place among the GPUs NVML enumerates."""
    return lib.visible().index(i)


def _open(lib: SimLibrary, visible: list[int], i: int, out: Any) -> None:
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


@entry("nvmlDeviceGetUUID", outs="text", mig=True)
def _uuid(lib: SimLibrary, i: int | MigRef) -> str:
    if isinstance(i, MigRef):
        return mig_spec(lib, i).uuid
    return str(lib.gpu(i).uuid)


@entry("nvmlDeviceGetName", outs="text", mig=True)
def _name(lib: SimLibrary, i: int | MigRef) -> str:
    """A MIG device's name is its GPU's and its profile ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", as NVML
    and CUDA report it); without a known profile, its GPU's and "MIG"."""
    if isinstance(i, MigRef):
        profile = mig_spec(lib, i).profile
        return f"{lib.gpu(i.gpu).name} MIG" + (f" {profile}" if profile else "")
    return str(lib.gpu(i).name)


# -- MIG devices (docs/simulation.md, "Fidelity") ------------------------------------------------


def mig_spec(lib: SimLibrary, ref: MigRef) -> MigSpec:
    return lib.gpu(ref.gpu).mig_instances[ref.k]


@entry("nvmlDeviceGetMaxMigDeviceCount")
def _max_mig_devices(lib: SimLibrary, i: int) -> int:
    """nvml.h: "Returns zero if MIG is not supported or enabled"; a GPU without MIG at all (no mode to
    read) answers Not Supported, as its nvmlDeviceGetMigMode does."""
    mode = lib.gpu(i).mig_mode
    if mode is None:
        fail(NOT_SUPPORTED)
    return MAX_MIG_DEVICES if mode else 0


@entry("nvmlDeviceGetMigDeviceHandleByIndex", outs="raw")
def _mig_handle(lib: SimLibrary, i: int, index: Any, out: Any) -> None:
    """nvml.h: NOT_FOUND "if no valid MIG device was found at index"; an index beyond the maximum is
    INVALID_ARGUMENT."""
    g = lib.gpu(i)
    if g.mig_mode is None:
        fail(NOT_SUPPORTED)
    k = int(value_of(index))
    if not 0 <= k < MAX_MIG_DEVICES:
        fail(INVALID_ARGUMENT)
    if not g.mig_mode or k >= len(g.mig_instances):
        fail(NOT_FOUND)
    lib.new_mig_handle(out, MigRef(i, k))


@entry("nvmlDeviceIsMigDeviceHandle", mig=True)
def _is_mig(lib: SimLibrary, i: int | MigRef) -> int:
    return int(isinstance(i, MigRef))


@entry("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", outs="raw", mig=True)
def _mig_parent(lib: SimLibrary, i: int | MigRef, out: Any) -> None:
    if not isinstance(i, MigRef):
        raise NvmlReturn(INVALID_ARGUMENT)  # nvml.h: "if migDevice or device is invalid"
    lib.new_handle(out, i.gpu)


@entry("nvmlDeviceGetGpuInstanceId", mig=True)
def _gpu_instance_id(lib: SimLibrary, i: int | MigRef) -> int:
    if isinstance(i, MigRef):
        return mig_spec(lib, i).gpu_instance_id
    raise NvmlReturn(NOT_SUPPORTED)  # nvml.h: "if device is not supported" (a GPU's own handle)


@entry("nvmlDeviceGetComputeInstanceId", mig=True)
def _compute_instance_id(lib: SimLibrary, i: int | MigRef) -> int:
    if isinstance(i, MigRef):
        return mig_spec(lib, i).compute_instance_id
    raise NvmlReturn(NOT_SUPPORTED)


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
