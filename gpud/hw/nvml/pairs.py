"""NVLinks and the pairs of GPUs: links, peers, P2P status and the topology matrix."""

from __future__ import annotations

from typing import Any

from gpud.hw.nvml.constants import P2P_NVLINK, P2P_READ, P2P_STATUS, P2P_WRITE, TOPO_LEVEL
from gpud.hw.nvml.handles import NvmlClient
from gpud.hw.nvml.info import Info
from gpud.model import (
    GpuSample,
    Topology,
)


class Pairs:
    """NVLinks and the pairs of GPUs: links, peers, P2P status and the topology matrix."""

    def __init__(self, client: NvmlClient, info: Info) -> None:
        self._c = client
        self._info = info
        self._pairs: dict[tuple[int, int], tuple[str, str, str, str]] = {}
        client.on_renumber(self._pairs.clear)

    def _pair(self, i: int, j: int) -> tuple[str, str, str, str]:
        """(PCIe level, P2P read, P2P write, P2P NVLink) between GPUs i and j, cached."""
        key = (min(i, j), max(i, j))
        cached = self._pairs.get(key)
        if cached is None:
            hi, hj = self._c.handle(key[0]), self._c.handle(key[1])
            anc = self._c.get("nvmlDeviceGetTopologyCommonAncestor", hi, hj, gpu=i)

            def p2p(idx: int) -> str:
                st = self._c.get("nvmlDeviceGetP2PStatus", hi, hj, idx, gpu=i)
                return P2P_STATUS.get(st, "unknown") if st is not None else "unknown"

            cached = (
                TOPO_LEVEL.get(anc, "SYS") if anc is not None else "?",
                p2p(P2P_READ),
                p2p(P2P_WRITE),
                p2p(P2P_NVLINK),
            )
            self._pairs[key] = cached
        return cached

    def topology(self, samples: list[GpuSample] | tuple[GpuSample, ...]) -> Topology:
        """Pairwise topology; NV# counts the links up in ``samples`` (one per GPU)."""
        idx = tuple(s.index for s in samples)
        bus = {i: self._info.info(i).pci_bus_id for i in idx if not self._lost(samples, i)}
        n = len(idx)
        level, pcie, nvl, rd, wr, nv = ([["X"] * n for _ in range(n)] for _ in range(6))
        for a in range(n):
            nvl[a][a] = 0  # type: ignore[call-overload]
        for a, i in enumerate(idx):
            for b, j in enumerate(idx):
                if a == b:
                    continue
                if i not in bus or j not in bus:
                    level[a][b] = pcie[a][b] = "?"
                    nvl[a][b] = 0  # type: ignore[call-overload]
                    rd[a][b] = wr[a][b] = nv[a][b] = "unknown"
                    continue
                lvl, r, w, v = self._pair(i, j)
                links = sum(1 for ln in samples[a].nvlinks if ln.up and ln.remote_pci_bus_id == bus[j])
                if not links:  # NVSwitch fabric (HGX): GPUs reach each other over their switch links
                    links = min(self._switch_links(samples[a], bus), self._switch_links(samples[b], bus))
                pcie[a][b] = lvl
                level[a][b] = f"NV{links}" if links else lvl
                nvl[a][b] = links  # type: ignore[call-overload]
                rd[a][b], wr[a][b], nv[a][b] = r, w, v

        def freeze(m: list[list[Any]]) -> tuple[tuple[Any, ...], ...]:
            return tuple(tuple(row) for row in m)

        return Topology(
            gpus=idx,
            level=freeze(level),
            pcie_level=freeze(pcie),
            nvlinks=freeze(nvl),
            p2p_read=freeze(rd),
            p2p_write=freeze(wr),
            p2p_nvlink=freeze(nv),
        )

    @staticmethod
    def _switch_links(sample: GpuSample, gpu_buses: dict[int, str]) -> int:
        """Links up to an NVSwitch: the remote says so, or (bindings without the device-type call) the
        remote end is no GPU of this machine."""
        others = set(gpu_buses.values())
        return sum(1 for ln in sample.nvlinks if ln.up and ln.remote_pci_bus_id is not None and (
            ln.remote_is_switch or (ln.remote_is_switch is None and ln.remote_pci_bus_id not in others)))

    @staticmethod
    def _lost(samples: Any, index: int) -> bool:
        return any(s.index == index and s.lost for s in samples)
