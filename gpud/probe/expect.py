"""What each link should deliver: the expected-bandwidth table and NCCL's choice of path.

No torch and no measurement here: the inputs are gpud's view of the machine. Figures are bytes/s
per direction. ``nominal`` is the datasheet signalling rate after line encoding; ``model`` is what
NCCL itself plans with (``src/graph/topo.h`` and ``topo.cc``), the figure a healthy link should
reach in an all-reduce. Sources: docs/probe.md.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

GB = 1e9

# PCIe per lane and direction after encoding (8b/10b for Gen1–2, 128b/130b for Gen3–5, FLIT for Gen6).
PCIE_LANE_NOMINAL = {1: 0.25 * GB, 2: 0.5 * GB, 3: 0.985 * GB, 4: 1.969 * GB, 5: 3.938 * GB, 6: 7.563 * GB}
# NCCL's model: kvDictPciGen (15, 30, 60, 120, 240, 480 × 100 Mb/s per lane), bw = width · speed / 80 GB/s.
PCIE_LANE_MODEL = {1: 0.1875 * GB, 2: 0.375 * GB, 3: 0.75 * GB, 4: 1.5 * GB, 5: 3.0 * GB, 6: 6.0 * GB}


@dataclass(frozen=True)
class NvlinkRate:
    generation: str
    nominal: float  # per link and direction, datasheet
    model: float  # per link and direction, NCCL's SMxx_NVLINK_BW


# Per GPU family. A6000 (GA102, sm_86): NVLink3 bridge of 4 links × 14.0625 GB/s = 56.25 GB/s per direction;
# A100 (GA100, sm_80): NVLink3, 12 links × 25 GB/s; H100/H200 (sm_90): NVLink4, 18 links × 25 GB/s = 450 GB/s;
# Quadro RTX 8000 (sm_75): NVLink2 bridge, 2 links × 25 GB/s; V100: NVLink2; B200: NVLink5, 18 × 50 GB/s.
NVLINK = {
    "pascal": NvlinkRate("NVLink1", 20 * GB, 18.0 * GB),
    "volta": NvlinkRate("NVLink2", 25 * GB, 20.0 * GB),
    "turing": NvlinkRate("NVLink2", 25 * GB, 20.0 * GB),
    "ga100": NvlinkRate("NVLink3", 25 * GB, 20.0 * GB),
    "ampere": NvlinkRate("NVLink3 (GA10x bridge)", 14.0625 * GB, 12.0 * GB),
    "hopper": NvlinkRate("NVLink4", 25 * GB, 20.6 * GB),
    "blackwell": NvlinkRate("NVLink5", 50 * GB, 40.1 * GB),
}
# NCCL's model of the CPU-to-CPU link a path crosses between sockets: src/graph/topo.h (BDW_QPI_BW 6,
# SKL_QPI_BW 10, SRP_QPI_BW 22, ERP_QPI_BW 40, AMD_BW 16 GB/s), chosen in topo.cc's ncclTopoGetInterCpuBw by
# the Intel model that ncclTopoAddCpu reads (family 6: model >= 0xCF ERP, >= 0x8F SRP, >= 0x55 SKL, else BDW).
INTEL_CPU_LINK = ((0xCF, 40.0 * GB), (0x8F, 22.0 * GB), (0x55, 10.0 * GB))  # (lowest model, GB/s), newest first
INTEL_OLDEST_LINK = 6.0 * GB  # BDW_QPI_BW: NCCL's figure for an Intel model it does not place later
AMD_CPU_LINK = 16.0 * GB  # AMD_BW, every AMD x86 CPU
# topo.h INTEL_P2P_OVERHEAD(bw) = bw · 6/5: an Intel root complex splits GPU-to-GPU traffic into 64-byte
# TLPs, so a path through it (NCCL's PATH_PHB: nvidia-smi's PHB and NODE) is charged 6/5 of its bytes on
# its PCIe links (search.cc followPath): it delivers 5/6 of the link.
INTEL_P2P_OVERHEAD = 6 / 5
# gpud's own model, not NCCL's: with no P2P, NCCL's SHM transport stages every byte in host memory
# (the sender's GPU writes it over its link, the receiver's GPU reads it over its own), so a healthy
# path delivers about half of its slower link. Calibrated against hardware runs (docs/probe.md).
HOST_BOUNCE = 0.5


def nvlink_rate(name: str, architecture: str | None) -> NvlinkRate | None:
    """The NVLink generation and per-link rate of a GPU, from its name and architecture."""
    if any(k in name for k in ("A100", "A800", "A30")):
        return NVLINK["ga100"]
    if any(k in name for k in ("B100", "B200", "B300", "GB200")):
        return NVLINK["blackwell"]
    return NVLINK.get(architecture or "")


def pcie(gen: int | None, width: int | None, model: bool = True) -> float:
    table = PCIE_LANE_MODEL if model else PCIE_LANE_NOMINAL
    return table.get(gen or 4, table[4]) * (width or 16)


def cpu_vendor(model: str | None, cpuinfo: str | None = None) -> str:
    """``amd`` or ``intel``: /proc/cpuinfo's ``vendor_id`` where it is given, else the model name."""
    ident = _cpuinfo_field(cpuinfo, "vendor_id")
    if ident:
        return "amd" if ident == "AuthenticAMD" else "intel"
    text = (model or "").lower()
    return "amd" if ("amd" in text or "epyc" in text or "threadripper" in text) else "intel"


def _cpuinfo_field(cpuinfo: str | None, key: str) -> str | None:
    for line in (cpuinfo or "").splitlines():
        k, _, v = (x.strip() for x in line.partition(":"))
        if k == key:
            return v
    return None


def cpu_link(vendor: str, cpuinfo: str | None = None) -> float:
    """NCCL's bandwidth of the link between CPU sockets (per direction), from /proc/cpuinfo's
    ``cpu family`` and ``model`` as NCCL reads them (cpuid); an Intel CPU whose model is not given
    gets NCCL's oldest figure (BDW), the stricter."""
    if vendor == "amd":
        return AMD_CPU_LINK
    family, model = _cpuinfo_field(cpuinfo, "cpu family"), _cpuinfo_field(cpuinfo, "model")
    if family == "6" and model and model.isdigit():
        for lowest, bw in INTEL_CPU_LINK:
            if int(model) >= lowest:
                return bw
    return INTEL_OLDEST_LINK


# nvidia-smi topo levels, nearest first, and NCCL_P2P_LEVEL's names for the same paths
# (NCCL: LOC, NVL, PIX, PXB, PHB, SYS; NODE is NCCL's PHB-or-further, counted as PHB here).
LEVEL_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 3, "SYS": 4}
NCCL_LEVEL = {"LOC": 0, "NVL": 0, "PIX": 1, "PXB": 2, "PHB": 3, "SYS": 4}
OLD_LEVELS = {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 4}  # NCCL_P2P_LEVEL as a number (paths.cc levelsOldToNew)


def p2p_level(env: dict[str, str], vendor: str, gpus: int) -> int:
    """The furthest PCIe path NCCL uses P2P over: PXB by default ("don't use P2P across CPU host
    bridges"), SYS on AMD with at most two GPUs, NCCL_P2P_LEVEL or NCCL_P2P_DISABLE when set."""
    if env.get("NCCL_P2P_DISABLE", "0") not in ("", "0"):
        return -1
    user = env.get("NCCL_P2P_LEVEL", "").strip().upper()
    if user:
        if user.isdigit():
            return OLD_LEVELS.get(int(user), 4)
        if user in NCCL_LEVEL:
            return NCCL_LEVEL[user]
    return 4 if vendor == "amd" and gpus <= 2 else 2


def best_ring(n: int, bandwidth: dict[tuple[int, int], float]) -> tuple[float, list[int]]:
    """The ring over positions 0..n−1 whose slowest hop is fastest (NCCL searches its rings the same
    way); brute force, position 0 fixed: at most 7! rings for 8 GPUs."""
    if n < 2:
        return 0.0, list(range(n))
    best: tuple[float, list[int]] = (-1.0, list(range(n)))
    for rest in itertools.permutations(range(1, n)):
        ring = [0, *rest]
        slowest = min(bandwidth[(ring[k], ring[(k + 1) % n])] for k in range(n))
        if slowest > best[0]:
            best = (slowest, ring)
    return best
