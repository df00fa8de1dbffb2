"""Where the imported GPUs sit: root ports, switches, NUMA nodes, CPUs and NVLinks, from
``nvidia-smi topo -m`` when given.

``topo -m`` names, for each pair of GPUs, the nearest thing their PCIe paths share: PIX a switch,
PXB several bridges below one root port, PHB a host bridge, NODE the interconnect between host
bridges of one NUMA node, SYS the link between sockets. The twin groups GPUs accordingly (a
switch for each PIX group, a root port for each PXB group, a host bridge for each PHB group) and
gives the ports addresses below the GPUs' own bus numbers. Without ``topo -m`` each GPU gets a
root port and host bridge of its own, on NUMA node 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpud.sim.dump.notes import Notes
from gpud.sim.dump.topo import LEVELS, Topo
from gpud.sim.topology import cpu_numbering
from gpud.text import ranges

HGX_NVSWITCHES = 4  # HGX H100/H200 baseboards carry four NVSwitch chips


@dataclass
class Placement:
    gpus: list[dict[str, Any]]
    machine: dict[str, Any] = field(default_factory=dict)
    bridges: list[tuple[int, int, int]] = field(default_factory=list)  # (gpu, gpu, links)
    switch_links: dict[int, int] = field(default_factory=dict)  # GPU → NVLinks to the NVSwitch fabric

    def gpu(self, i: int) -> dict[str, Any]:
        return self.gpus[i]


class _Groups:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def _rank(level: str) -> int:
    return LEVELS.index(level) if level in LEVELS else len(LEVELS)  # NV#: says nothing about PCIe


def place(buses: list[str], topo: Topo | None, notes: Notes) -> Placement:
    n = len(buses)
    sw, rp, hb, node = _Groups(n), _Groups(n), _Groups(n), _Groups(n)
    if topo is not None:
        for (a, b), level in topo.level.items():
            r = _rank(level)
            for k, groups in enumerate((sw, rp, hb, node)):
                if r <= k:
                    groups.union(a, b)
    else:
        notes.machine.append("gpu[*].root_port: no topo -m: each GPU on a root port and host bridge of its own, "
                             "NUMA node 0")
    numa = _numa(n, topo, node)
    used = {(b.split(":")[0], int(b.split(":")[1], 16)) for b in buses}

    def free_below(dom: str, start: int, span: int = 1) -> int:
        for bus in list(range(start, -1, -1)) + list(range(255, start, -1)):
            if all((dom, bus + k) not in used and bus + k <= 255 for k in range(span)):
                for k in range(span):
                    used.add((dom, bus + k))
                return bus
        return start

    def bus_of(i: int) -> int:
        return int(buses[i].split(":")[1], 16)

    out: list[dict[str, Any]] = [{"bus_id": b, "numa_node": numa[i]} for i, b in enumerate(buses)]
    members: dict[int, list[int]] = {}
    for i in range(n):
        members.setdefault(sw.find(i), []).append(i)
    for group in members.values():
        if len(group) > 1:  # a switch: its upstream port and the bus of its downstream ports
            dom = buses[group[0]].split(":")[0]
            up = free_below(dom, min(bus_of(i) for i in group) - 2, span=2)
            for i in group:
                out[i]["switch"] = f"{dom}:{up:02x}:00.0"
    bridges: dict[int, list[int]] = {}
    for i in range(n):
        bridges.setdefault(hb.find(i), []).append(i)
    for group in bridges.values():
        dom = buses[group[0]].split(":")[0]
        lowest = min([bus_of(i) for i in group] + [int(out[i]["switch"].split(":")[1], 16)
                                                    for i in group if "switch" in out[i]])
        host = free_below(dom, lowest - 1)
        ports: dict[int, int] = {}
        for i in sorted(group, key=bus_of):
            dev = ports.setdefault(rp.find(i), len(ports) + 1)
            out[i]["root_port"] = f"{dom}:{host:02x}:{dev:02x}.0"
    placement = Placement(out)
    if topo is not None:
        _check_levels(topo, out, notes)
        _nvlinks(topo, placement, used, notes)
        placement.machine.update(_cpus(topo, numa, notes))
    return placement


def _numa(n: int, topo: Topo | None, node: _Groups) -> list[int]:
    if topo is not None and all(v is not None for v in topo.numa):
        return [int(v) for v in topo.numa]  # type: ignore[arg-type]
    roots: dict[int, int] = {}
    return [roots.setdefault(node.find(i), len(roots)) if topo is not None else 0 for i in range(n)]


def _level(a: dict[str, Any], b: dict[str, Any], same_socket: bool) -> str:
    if a.get("switch") and a.get("switch") == b.get("switch"):
        return "PIX"
    if a["root_port"] == b["root_port"]:
        return "PXB"
    if a["root_port"].rsplit(":", 1)[0] == b["root_port"].rsplit(":", 1)[0]:
        return "PHB"
    return "NODE" if same_socket else "SYS"


def _check_levels(topo: Topo, out: list[dict[str, Any]], notes: Notes) -> None:
    for (a, b), level in sorted(topo.level.items()):
        if level not in LEVELS:
            continue
        same = out[a]["numa_node"] == out[b]["numa_node"]
        twin = _level(out[a], out[b], same)
        if twin != level:
            notes.unread.append(f"GPU{a}-GPU{b}: topo -m says {level}, the twin has {twin} "
                                "(the levels of the matrix are not consistent with one PCIe tree)")


def _nvlinks(topo: Topo, placement: Placement, used: set[tuple[str, int]], notes: Notes) -> None:
    n = topo.n
    pairs = {p: topo.nvlinks(*p) for p in topo.level if topo.nvlinks(*p)}
    counts = set(pairs.values())
    if n > 2 and len(pairs) == n * (n - 1) // 2 and len(counts) == 1:
        links = counts.pop()  # every pair NV18 (NV12 on A100): an NVSwitch fabric, not bridges
        dom = placement.gpus[0]["bus_id"].split(":")[0]
        switches: list[str] = []
        for bus in range(1, 256):
            if len(switches) == HGX_NVSWITCHES:
                break
            if (dom, bus) not in used:
                used.add((dom, bus))
                switches.append(f"{dom}:{bus:02x}:00.0")
        placement.machine["nvswitches"] = switches
        notes.machine.append(f"machine.nvswitches: NV{links} between every pair is an NVSwitch fabric; "
                             f"{HGX_NVSWITCHES} switches as on HGX H100/H200 baseboards (addresses assumed)")
        for i in range(n):
            placement.gpus[i]["nvswitch"] = True
            placement.switch_links[i] = links
        return
    bridged: set[int] = set()
    for (a, b), k in sorted(pairs.items()):
        if a in bridged or b in bridged:
            notes.unread.append(f"GPU{a}-GPU{b}: NV{k} not modelled (the simulator bridges each GPU to one other)")
            continue
        bridged.update((a, b))
        placement.bridges.append((a, b, k))


def _cpus(topo: Topo, numa: list[int], notes: Notes) -> dict[str, Any]:
    """CPU layout from the affinity column: ``0-51,104-155`` on node 0 is 52 cores with their
    hyper-threads, and 104 cores in all."""
    sets = {numa[i]: topo.cpus[i] for i in range(topo.n) if topo.cpus[i]}
    if not sets:
        notes.machine.append("machine: sockets and cores: no CPU Affinity in topo -m (defaults)")
        return {"sockets": max(numa) + 1} if max(numa) > 0 else {}
    cpus = next(iter(sets.values()))
    assert cpus is not None
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    per_node = len(runs[0])
    threads = 2 if len(runs) == 2 and len(runs[1]) == per_node else 1
    if threads == 2:
        total = runs[1][0]
    else:
        total = max(max(s) for s in sets.values() if s) + 1
        per_node = len(cpus)
    nodes = max(max(numa) + 1, total // per_node if per_node else 1)
    machine = {"sockets": nodes, "cores_per_socket": max(per_node, 1), "threads_per_core": threads,
               "numa_nodes_per_socket": 1}
    notes.machine.append(f"machine: {nodes} socket(s) of {per_node} cores, {threads} thread(s) each, from the "
                         "CPU Affinity column (one NUMA node per socket assumed)")
    for node, want in sets.items():
        if want and sorted(cpu_numbering(**machine, node=node)) != sorted(want):
            notes.unread.append(f"NUMA node {node}: CPU affinity {ranges(want)} "
                                "not reproduced by a regular CPU numbering")
    return machine
