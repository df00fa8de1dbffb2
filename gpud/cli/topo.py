"""``gpud topo``: the ``nvidia-smi topo -m`` matrix, affinities, PCIe links and P2P status."""

from __future__ import annotations

import sys
from typing import Any

import typer

from gpud import __version__
from gpud.cli.common import GpuIds, Json, Simulate, gpu_ids, gpus_of, host, machine
from gpud.cli.output import echo_wrapped, emit_json, fmt, table
from gpud.model import document
from gpud.text import ranges

LEGEND = """Legend:
  X    = self
  SYS  = through PCIe and the interconnect between NUMA nodes / CPU sockets
  NODE = through PCIe and between PCIe host bridges within a NUMA node
  PHB  = through PCIe and a PCIe host bridge (the CPU's root complex)
  PXB  = through several PCIe bridges, without a host bridge
  PIX  = through at most one PCIe bridge (a switch)
  NV#  = through a bonded set of # NVLinks"""


def topo_document(m, snap) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """``gpud topo --json``'s document (docs/json.md)."""
    t = m.topology(snap)
    infos = {g.index: g for g in snap.gpus}
    samples = {s.index: s for s in snap.samples}
    gpus: list[dict[str, Any]] = []
    for i in t.gpus:
        g, s = infos.get(i), samples[i]
        gpus.append({
            "index": i,
            "uuid": g.uuid if g else None,
            "name": g.name if g else None,
            "pci_bus_id": g.pci_bus_id if g else None,
            "lost": s.lost,
            "numa_node": g.numa_node if g else None,
            "cpu_affinity": list(g.cpu_affinity) if g and g.cpu_affinity is not None else None,
            "pcie_generation": s.pcie_generation, "pcie_width": s.pcie_width,
            "pcie_max_generation": g.pcie_max_generation if g else None,
            "pcie_max_width": g.pcie_max_width if g else None,
            "nvlinks_up": sum(1 for ln in s.nvlinks if ln.up),
            "nvlink_count": g.nvlink_count if g else None,
        })
    return document("topo", __version__, host(m, snap), gpus=gpus, matrix=t.level, pcie_level=t.pcie_level,
                    nvlinks=t.nvlinks, p2p={"read": t.p2p_read, "write": t.p2p_write, "nvlink": t.p2p_nvlink})


def _keep(doc: dict[str, Any], only: set[int] | None) -> dict[str, Any]:
    """The document with the rows and columns of the GPUs ``-i/--id`` named."""
    if only is None:
        return doc
    pos = [a for a, g in enumerate(doc["gpus"]) if g["index"] in only]
    out = dict(doc, gpus=[doc["gpus"][a] for a in pos])
    for key in ("matrix", "pcie_level", "nvlinks"):
        out[key] = [[doc[key][a][b] for b in pos] for a in pos]
    out["p2p"] = {k: [[v[a][b] for b in pos] for a in pos] for k, v in doc["p2p"].items()}
    return out


def topo(simulate: Simulate = None, json: Json = False, ids: GpuIds = None) -> None:
    """GPU-to-GPU topology: NVLink/PCIe levels, CPU and NUMA affinity, link widths, P2P."""
    m = machine(simulate)
    snap = m.snapshot()
    doc = _keep(topo_document(m, snap), gpu_ids(ids, gpus_of(snap)))
    if json:
        emit_json(doc)
        return
    gpus = doc["gpus"]
    names = [f"GPU{g['index']}" for g in gpus]
    level, p2p = doc["matrix"], doc["p2p"]
    rows = [[names[a], *level[a], ranges(g["cpu_affinity"]), fmt(g["numa_node"])] for a, g in enumerate(gpus)]
    table(["", *names, "CPU Affinity", "NUMA"], rows)
    sys.stdout.write("\n" + LEGEND + "\n\n")
    table(["GPU", "Bus id", "PCIe now", "PCIe max", "NVLinks up"],
          [[f"GPU{g['index']}", fmt(g["pci_bus_id"]),
            f"Gen{fmt(g['pcie_generation'])} x{fmt(g['pcie_width'])}",
            f"Gen{fmt(g['pcie_max_generation'])} x{fmt(g['pcie_max_width'])}",
            f"{g['nvlinks_up']}/{fmt(g['nvlink_count'])}"] for g in gpus], title="Links")
    sys.stdout.write("\n")
    short = {"OK": "OK", "not_supported": "NS", "chipset_not_supported": "CNS", "gpu_not_supported": "GNS",
             "topology_not_supported": "TNS", "disabled_by_regkey": "DIS", "unknown": "U", "X": "X"}
    rows = [[names[a], *(f"{short.get(p2p['read'][a][b], '?')}/{short.get(p2p['write'][a][b], '?')}/"
                         f"{short.get(p2p['nvlink'][a][b], '?')}" if a != b else "X" for b in range(len(names)))]
            for a in range(len(names))]
    table(["P2P r/w/nvl", *names], rows, title="Peer-to-peer (read/write/NVLink)")
    echo_wrapped("OK = supported, NS = not supported, CNS = chipset, GNS = GPU, TNS = topology, "
                 "DIS = disabled by registry key, U = unknown", indent="  ", first="  ")


def register(app: typer.Typer) -> None:
    app.command("topo")(topo)
