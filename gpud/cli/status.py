"""``gpud status``: one row per GPU from one snapshot."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from gpud.cli.common import Json, Simulate, machine
from gpud.cli.output import emit_json, fmt, is_tty, table
from gpud.model import GpuInfo, GpuSample, Snapshot

HEADERS = ["GPU", "Name", "Temp", "Fan", "Power / limit", "SM / mem MHz", "Util", "Memory",
           "PCIe", "Persist", "Clock events"]


def _row(s: GpuSample, info: GpuInfo | None) -> list[str]:
    if s.lost:
        return [str(s.index), info.name if info else "?", "LOST"] + [""] * (len(HEADERS) - 3)
    assert info is not None
    fans = "/".join(fmt(f.speed_percent, "%") + ("*" if f.policy == "manual" else "") for f in s.fans) or "-"
    mem = (f"{s.memory_used_bytes / 2**30:.1f}/{s.memory_total_bytes / 2**30:.0f} GiB"
           if s.memory_used_bytes is not None and s.memory_total_bytes else "n/a")
    events = [e for e in (s.clock_events or ()) if e != "gpu_idle"]
    return [
        str(s.index),
        info.name.replace("NVIDIA ", ""),
        fmt(s.temperature_celsius, "°C"),
        fans,
        f"{fmt(s.power_watts)}/{fmt(s.power_limit_watts)} W",
        f"{fmt(s.clocks_mhz.get('sm'))}/{fmt(s.clocks_mhz.get('memory'))}",
        fmt(s.utilization_gpu_percent, "%"),
        mem,
        f"Gen{fmt(s.pcie_generation)}/{fmt(info.pcie_max_generation)} "
        f"x{fmt(s.pcie_width)}/{fmt(info.pcie_max_width)}",
        {True: "on", False: "off", None: "n/a"}[s.persistence_mode],
        ",".join(events) or ("idle" if s.clock_events else "-"),
    ]


def render(label: str, snap: Snapshot) -> None:
    infos = {g.index: g for g in snap.gpus}
    v = snap.versions
    title = f"{label} — driver {fmt(v.driver)}, CUDA {fmt(v.cuda_driver)}, {len(snap.samples)} GPU(s)"
    table(HEADERS, [_row(s, infos.get(s.index)) for s in snap.samples], title=title)


def status(
    simulate: Simulate = None,
    json: Json = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until interrupted.")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between refreshes.")] = 2.0,
) -> None:
    """GPU telemetry: temperature, fans, power, clocks, utilisation, memory, PCIe, health."""
    m = machine(simulate)
    while True:
        snap = m.snapshot(pcie=True)
        if json:
            emit_json({"host": m.label, "versions": snap.versions, "gpus": [
                {"info": info, "sample": s} for s in snap.samples
                for info in [next((g for g in snap.gpus if g.index == s.index), None)]
            ]})
        else:
            if watch and is_tty():
                typer.echo("\033[2J\033[H", nl=False)
            render(m.label, snap)
        if not watch:
            return
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return


def register(app: typer.Typer) -> None:
    app.command("status")(status)
