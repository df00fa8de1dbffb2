"""Where the simulated GPUs sit: CPU numbering per NUMA node, the PCIe tree (host bridge, root port,
switch and its downstream port) and the common ancestor of two GPUs, the link each trained to, and
the NVLink peers. ``gpud.sim.libnvml`` answers NVML's topology calls from here and
``gpud.sim.rootfs`` lays out ``/sys`` from the same functions, so the two cannot disagree."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpud.sim.description import GpuSpec, MachineSpec
    from gpud.sim.machine import SimMachine

# nvmlGpuTopologyLevel_t
TOPO_SINGLE, TOPO_MULTIPLE, TOPO_HOSTBRIDGE, TOPO_NODE, TOPO_SYSTEM = 10, 20, 30, 40, 50


def node_cpus(machine: MachineSpec, node: int) -> list[int]:
    return cpu_numbering(machine.sockets, machine.cores_per_socket, machine.threads_per_core,
                         machine.numa_nodes_per_socket, node)


def cpu_numbering(sockets: int, cores_per_socket: int, threads_per_core: int, numa_nodes_per_socket: int,
                  node: int) -> list[int]:
    """Linux numbering: physical cores of all sockets first, then their hyper-thread siblings."""
    per_socket = cores_per_socket
    per_node = per_socket // numa_nodes_per_socket
    total = per_socket * sockets
    cores = list(range(node * per_node, (node + 1) * per_node))
    if threads_per_core > 1:
        cores += [c + total for c in cores]
    return cores


def socket_of(machine: MachineSpec, node: int) -> int:
    return node // int(machine.numa_nodes_per_socket)


def host_bridge(g: GpuSpec) -> str:
    dom, bus, _ = g.root_port.split(":")
    return f"{dom}:{bus}"


def downstream_port(switch: str, index: int) -> str:
    """The switch's downstream port that GPU ``index`` hangs from (on the bus below the switch's)."""
    dom, bus, _ = switch.split(":")
    return f"{dom}:{int(bus, 16) + 1:02x}:{index % 32:02x}.0"


def common_ancestor(machine: MachineSpec, a: GpuSpec, b: GpuSpec) -> int:
    if a.switch and a.switch == b.switch:
        return TOPO_SINGLE
    if a.root_port == b.root_port:
        return TOPO_MULTIPLE
    if host_bridge(a) == host_bridge(b):
        return TOPO_HOSTBRIDGE
    if socket_of(machine, a.numa_node) == socket_of(machine, b.numa_node):
        return TOPO_NODE
    return TOPO_SYSTEM


def link_state(sim: SimMachine, index: int, g: GpuSpec) -> tuple[int, int]:
    """(current PCIe generation, width): what the link trained to, and an idle downshift.

    The width is the narrower of the GPU and its slot, or what a ``link_degraded`` fault leaves.
    Idle GPUs drop their link to Gen1 to save power (ASPM / the driver's link-speed management;
    real A6000 and RTX 6000 Ada dumps show "Current: 1" while idle), back to the trained maximum
    under load.
    """
    gen = min(int(g.pcie_max_generation), int(g.slot_generation))
    width = min(int(g.pcie_max_width), int(g.slot_width))
    for p in sim.faults_of("link_degraded", index):
        gen = p.generation or gen
        width = p.width or width
    if sim.utilization(index) == 0 and g.idle_pcie_generation is not None:
        gen = min(gen, int(g.idle_pcie_generation))
    return gen, width


def nvlink_peer(sim: SimMachine, i: int, link: int) -> tuple[int | None, bool]:
    """(GPU at the other end of GPU ``i``'s NVLink ``link`` — or -1 for an NVSwitch, None for no
    bridge —, is it up): the description's bridges, less ``nvlink_down`` faults and lost peers."""
    g = sim.desc.gpus[i]
    if g.nvswitch:
        down = any(p.links is None or link in p.links for p in sim.faults_of("nvlink_down", i)
                   if not p.gpus or i in p.gpus)
        return -1, not down
    for b in sim.desc.nvlinks:
        if i in b.gpus and link < b.links:
            other = b.gpus[1] if b.gpus[0] == i else b.gpus[0]
            for p in sim.faults_of("nvlink_down", i):
                if other in p.gpus and (p.links is None or link in p.links):
                    return other, False
            if sim.lost(other):
                return other, False
            return other, True
    return None, False
