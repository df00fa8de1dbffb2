"""Why scaling is below what the hardware allows: measurements against the topology.

No torch here: the inputs are the probe's figures and gpud's own view of the machine (NVML
topology, link widths and generations, NVLink state), so it is unit-tested on synthetic
measurements with the shipped workstations' real topologies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpud.model import GpuInfo, GpuSample, Topology

GB = 1e9
PCIE_X16_GEN4 = 25 * GB  # what a Gen4 x16 link delivers in practice, per direction
GEN_FACTOR = {1: 0.125, 2: 0.25, 3: 0.5, 4: 1.0, 5: 2.0, 6: 4.0}
# NVLink bandwidth per link and direction, by GPU (datasheets: an RTX A6000 bridge has 4 links,
# 56.25 GB/s per direction; a Quadro RTX 8000 bridge 2 links, 50 GB/s; H100/H200 18 links, 450 GB/s).
NVLINK_PER_LINK = {"ampere": 14.0625 * GB, "turing": 25 * GB, "hopper": 25 * GB, "ada": 0.0, "volta": 25 * GB}
DEFAULT_THRESHOLDS = {2: 0.85, 4: 0.875, 8: 0.775}  # the seeds' figures: 1.7×/2, 3.5×/4, 6.2×/8


@dataclass(frozen=True)
class Link:
    a: int
    b: int
    kind: str  # nvlink | pcie | host
    bandwidth: float  # bytes/s per direction the topology allows
    text: str  # "NVLink ×4", "PCIe Gen4 x8"
    notes: tuple[str, ...]


def pair_link(t: Topology, infos: dict[int, GpuInfo], samples: dict[int, GpuSample], a: int, b: int) -> Link:
    ia, ib = t.gpus.index(a), t.gpus.index(b)
    ga, gb = infos[a], infos[b]
    notes: list[str] = []
    links = t.nvlinks[ia][ib]
    if links:
        per = NVLINK_PER_LINK.get(ga.architecture or "", 25 * GB)
        return Link(a, b, "nvlink", links * per, f"NVLink ×{links}", ())
    gens = [samples[i].pcie_generation for i in (a, b)]
    maxgens = [g.pcie_max_generation for g in (ga, gb)]
    widths = [samples[i].pcie_width for i in (a, b)]
    gen = min(m or 0 for m in maxgens) or min(x or 0 for x in gens) or 4
    width = min(w or 16 for w in widths)
    bw = PCIE_X16_GEN4 * GEN_FACTOR.get(gen, 1.0) * width / 16
    for i, g, s in ((a, ga, samples[a]), (b, gb, samples[b])):
        if g.nvlink_count and not any(ln.up for ln in s.nvlinks):
            notes.append(f"GPU{i}'s NVLink bridge is down")
        if s.pcie_width is not None and g.pcie_max_width and s.pcie_width < g.pcie_max_width:
            notes.append(f"GPU{i}'s link runs at x{s.pcie_width} of x{g.pcie_max_width}")
    kind = "pcie"
    if t.p2p_read[ia][ib] != "OK" or t.p2p_write[ia][ib] != "OK":
        bw /= 2
        kind = "host"
        notes.append("P2P is not available: traffic goes through host memory")
    if t.pcie_level[ia][ib] == "SYS":
        notes.append("the path crosses the CPU sockets' interconnect")
    return Link(a, b, kind, bw, f"PCIe Gen{gen} x{width}", tuple(dict.fromkeys(notes)))


def threshold(thresholds: dict[int, float], n: int) -> float:
    """The pass threshold for n GPUs: its own, else the next larger world size's, else the largest's."""
    keys = sorted(thresholds)
    for k in keys:
        if n <= k:
            return thresholds[k]
    return thresholds[keys[-1]]


def bottleneck(t: Topology, infos: dict[int, GpuInfo], samples: dict[int, GpuSample], n: int) -> Link | None:
    """The slowest link of the ring 0 → 1 → … → n−1 → 0 (a down bridge wins a tie)."""
    gpus = [g for g in t.gpus if g in infos][:n]
    if len(gpus) < 2:
        return None
    ring = [pair_link(t, infos, samples, gpus[k], gpus[(k + 1) % len(gpus)]) for k in range(len(gpus))]
    return min(ring, key=lambda ln: (ln.bandwidth, -len(ln.notes)))


def explain(result: dict[str, Any], t: Topology | None, infos: dict[int, GpuInfo], samples: dict[int, GpuSample],
            thresholds: dict[int, float] | None = None) -> dict[str, Any]:
    """Verdicts per world size and a plain sentence for each shortfall."""
    thresholds = thresholds or DEFAULT_THRESHOLDS
    cpu = result.get("device") != "cuda"
    out: dict[str, Any] = {"sentences": [], "verdicts": {}, "links": []}
    if cpu:
        out["sentences"].append("CPU run: the figures check that DDP, the pipeline, all-reduce and P2P work; they "
                                "say nothing about GPU hardware.")
    ddp = (result.get("ddp") or {}).get("by_world_size", {})
    ar = (result.get("allreduce") or {}).get("by_world_size", {})
    for ws_text, r in sorted(ddp.items(), key=lambda kv: int(kv[0])):
        n = int(ws_text)
        if n < 2:
            continue
        want = threshold(thresholds, n)
        eff = r["efficiency"]
        if cpu:
            out["verdicts"][ws_text] = "n/a"
            continue
        ok = eff >= want
        out["verdicts"][ws_text] = "pass" if ok else "fail"
        link = bottleneck(t, infos, samples, n) if t is not None else None
        measured = (ar.get(ws_text) or {}).get("peak_busbw_bytes_per_second")
        if ok:
            out["sentences"].append(f"{n}-GPU efficiency {eff:.0%}: at or above the {want:.1%} expected.")
            continue
        if link is None:
            out["sentences"].append(f"{n}-GPU efficiency {eff:.0%}, below the {want:.1%} expected.")
            continue
        figure = f"{measured / GB:.1f} GB/s measured" if measured else f"{link.bandwidth / GB:.1f} GB/s at most"
        sentence = (f"{n}-GPU efficiency {eff:.0%} (below {want:.1%}): all-reduce limited by GPU{link.a}↔GPU{link.b} "
                    f"over {link.text} ({figure}; the link allows {link.bandwidth / GB:.1f} GB/s)")
        if link.notes:
            sentence += "; " + "; ".join(link.notes)
        out["sentences"].append(sentence + ".")
    if t is not None and not cpu:
        for pair in (result.get("p2p") or {}).get("pairs", []):
            a, b = pair["src"], pair["dst"]
            if a == b or a not in infos or b not in infos:
                continue
            link = pair_link(t, infos, samples, a, b)
            ratio = pair["bandwidth_bytes_per_second"] / link.bandwidth if link.bandwidth else 0
            out["links"].append({"src": a, "dst": b, "link": link.text, "expected_bytes_per_second": link.bandwidth,
                                 "measured_bytes_per_second": pair["bandwidth_bytes_per_second"], "ratio": ratio,
                                 "notes": list(link.notes)})
            if ratio < 0.5:
                out["sentences"].append(f"P2P GPU{a}→GPU{b}: {pair['bandwidth_bytes_per_second'] / GB:.1f} GB/s, "
                                        f"{ratio:.0%} of what {link.text} allows"
                                        + ("; " + "; ".join(link.notes) if link.notes else "") + ".")
    return out
