"""Where the simulated GPUs sit: CPU numbering per NUMA node, PCIe ancestry, the trained link."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpud.sim.machine import SimMachine

# nvmlGpuTopologyLevel_t
TOPO_SINGLE, TOPO_MULTIPLE, TOPO_HOSTBRIDGE, TOPO_NODE, TOPO_SYSTEM = 10, 20, 30, 40, 50


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
    return node // int(machine["numa_nodes_per_socket"])


def host_bridge(g: dict[str, Any]) -> str:
    dom, bus, _ = g["root_port"].split(":")
    return f"{dom}:{bus}"


def common_ancestor(machine: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> int:
    if a["switch"] and a["switch"] == b["switch"]:
        return TOPO_SINGLE
    if a["root_port"] == b["root_port"]:
        return TOPO_MULTIPLE
    if host_bridge(a) == host_bridge(b):
        return TOPO_HOSTBRIDGE
    if socket_of(machine, a["numa_node"]) == socket_of(machine, b["numa_node"]):
        return TOPO_NODE
    return TOPO_SYSTEM


def link_state(sim: SimMachine, index: int, g: dict[str, Any]) -> tuple[int, int]:
    """(current PCIe generation, width): what the link trained to, and an idle downshift.

    The width is the narrower of the GPU and its slot, or what a ``link_degraded`` fault leaves.
    Idle GPUs drop their link to Gen1 to save power (ASPM / the driver's link-speed management;
    real A6000 and RTX 6000 Ada dumps show "Current: 1" while idle), back to the trained maximum
    under load.
    """
    gen = min(int(g["pcie_max_generation"]), int(g["slot_generation"]))
    width = min(int(g["pcie_max_width"]), int(g["slot_width"]))
    for p in sim.faults_of("link_degraded", index):
        gen = p["generation"] or gen
        width = p["width"] or width
    if sim.utilization(index) == 0 and g["idle_pcie_generation"] is not None:
        gen = min(gen, int(g["idle_pcie_generation"]))
    return gen, width
