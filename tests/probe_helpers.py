"""Hand-built machines for the probe's diagnosis: GPUs, samples and a topology without a simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpud.model import GpuInfo, GpuSample, NvLinkInfo, Topology
from gpud.probe.diagnose import Seen, View


def gpu(index: int, name: str = "NVIDIA RTX A6000", arch: str = "ampere", gen: int = 4, width: int = 16,
        nvlinks: int = 0, numa: int = 0) -> GpuInfo:
    return GpuInfo(index=index, uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000", name=name, serial=None,
                   pci_bus_id=f"0000:{0x10 + 0x20 * index:02x}:00.0", pci_device_id=None, architecture=arch,
                   vbios_version=None, memory_total_bytes=None, pcie_max_generation=gen, pcie_max_width=width,
                   power_default_limit_watts=None, power_min_limit_watts=None, power_max_limit_watts=None,
                   temperature_slowdown_celsius=None, temperature_shutdown_celsius=None, max_clocks_mhz={},
                   fan_count=None, fan_min_speed_percent=None, fan_max_speed_percent=None, nvlink_count=nvlinks,
                   numa_node=numa, cpu_affinity=None)


def sample(info: GpuInfo, width: int | None = None, gen: int | None = None, events: tuple[str, ...] = (),
           up: int = 0) -> GpuSample:
    return GpuSample(index=info.index, uuid=info.uuid, timestamp=0.0, pcie_generation=gen or info.pcie_max_generation,
                     pcie_width=width or info.pcie_max_width, clock_events=events,
                     nvlinks=tuple(NvLinkInfo(k, k < up, None, None) for k in range(info.nvlink_count)))


def topology(n: int, pcie: dict[tuple[int, int], str], nvlinks: dict[tuple[int, int], int] | None = None,
             p2p: str = "OK", default: str = "NODE") -> Topology:
    nvlinks = nvlinks or {}

    def cell(i: int, j: int, table: dict[tuple[int, int], Any], other: Any) -> Any:
        return table.get((min(i, j), max(i, j)), other)

    def grid(f: Any) -> tuple[tuple[Any, ...], ...]:
        return tuple(tuple("X" if i == j and f(i, j) != 0 else f(i, j) for j in range(n)) for i in range(n))

    links = tuple(tuple(0 if i == j else cell(i, j, nvlinks, 0) for j in range(n)) for i in range(n))
    level = grid(lambda i, j: f"NV{links[i][j]}" if links[i][j] else cell(i, j, pcie, default))
    return Topology(gpus=tuple(range(n)), level=level, pcie_level=grid(lambda i, j: cell(i, j, pcie, default)),
                    nvlinks=links, p2p_read=grid(lambda i, j: p2p), p2p_write=grid(lambda i, j: p2p),
                    p2p_nvlink=grid(lambda i, j: "OK" if links[i][j] else "NS"))


def view(infos: list[GpuInfo], samples: list[GpuSample], t: Topology, **kw: Any) -> View:
    return View(t, {g.index: g for g in infos}, {s.index: s for s in samples}, kw.pop("seen", Seen()), **kw)


def result(n: int, busbw: float | None, efficiency: float, step: float = 0.1, grad_bytes: int = 400_000_000,
           ranks: list[str] | None = None) -> dict[str, Any]:
    """A synthetic CUDA probe result: one-GPU baseline, n GPUs with this efficiency and bus bandwidth."""
    out: dict[str, Any] = {
        "device": "cuda",
        "ddp": {"by_world_size": {
            "1": {"efficiency": 1.0, "speedup": 1.0, "step_seconds": step, "gradient_bytes": grad_bytes},
            str(n): {"efficiency": efficiency, "speedup": efficiency * n, "step_seconds": step / efficiency,
                     "gradient_bytes": grad_bytes}}},
        "allreduce": {"by_world_size": {str(n): {"peak_busbw_bytes_per_second": busbw}} if busbw else {}},
        "p2p": {"pairs": []},
    }
    if ranks:
        out["ranks"] = {str(n): ranks}
    return out


XORG = ('{ pid = 2001, used_mib = 300, user = "root", uid = 0, command = "/usr/lib/xorg/Xorg :0", graphics = true }, '
        '{ pid = 2002, used_mib = 200, user = "erin", uid = 1005, command = "/usr/bin/gnome-shell", graphics = true }')


def desktop(tmp_path: Path, processes: str = XORG) -> str:
    """The healthy Z8 as a desktop: these processes (by default Xorg and gnome-shell) on GPU0."""
    text = (Path(__file__).resolve().parent.parent / "gpud/sim/descriptions/z8-fury-4x-a6000.toml").read_text()
    marker = 'bus_id = "0000:16:00.0"'
    assert text.count(marker) == 1
    text = text.replace('name = "z8-fury-4x-a6000"', 'name = "z8-desktop"').replace(
        marker, f"{marker}\nprocesses = [{processes}]")
    path = tmp_path / "z8-desktop.toml"
    path.write_text(text)
    return str(path)
