"""Entry points over pairs and links: NVLink state, errors and peers, topology and P2P status."""

from __future__ import annotations

from typing import Any

from gpud.sim.entries import entry
from gpud.sim.libnvml.handles import pci_info
from gpud.sim.libnvml.library import SimLibrary, peer
from gpud.sim.libnvml.returns import (
    ARCH_CODES,
    FI_NVLINK_ERRORS,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    NVLINK_DEVICE_GPU,
    NVLINK_DEVICE_SWITCH,
    P2P_CODES,
    SLI_BRIDGE_CAP,
    fail,
)
from gpud.sim.topology import common_ancestor


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
    return nvlink_errors(lib, i, int(link), int(counter))


def nvlink_errors(lib: SimLibrary, i: int, link: int, counter: int) -> int:
    """One link's errors of one kind (``nvmlNvLinkErrorCounter_t``), as its own call and its field value give them."""
    return sum(int(f.per_second * lib.sim.now()) for f in lib.sim.faults_of("nvlink_errors", i)
               if f.link in (None, link) and NVLINK_ERROR_COUNTERS[f.counter] == counter)


def nvlink_error_field(lib: SimLibrary, i: int, field_id: int) -> int | None:
    """The count an NVLink error field id gives on GPU ``i`` (None: not one, not a link it has, or a Blackwell or
    later GPU: NVML's field-value reference marks the per-link error counts unsupported there)."""
    if ARCH_CODES.get(str(lib.gpu(i).architecture), 0) >= ARCH_CODES["blackwell"]:
        return None
    for name, (first, sixth) in FI_NVLINK_ERRORS.items():
        for base, link0 in ((first, 0), (sixth, 6)):  # links 0–5 from the first id, 6–11 from the second
            if base <= field_id < base + 6:
                link = link0 + field_id - base
                if link >= int(lib.gpu(i).nvlinks or 0):
                    return None
                return nvlink_errors(lib, i, link, NVLINK_ERROR_COUNTERS[name])
    return None


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
