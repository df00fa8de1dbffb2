"""``gpud status``: one row per GPU from one snapshot; values outside their limits are marked."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Annotated, Any

import typer

from gpud import __version__
from gpud.cli.common import GpuIds, Json, Simulate, gpu_ids, host, machine, narrow
from gpud.cli.output import clear_screen, colour, emit_json, fmt, is_tty, plural, table, wrap
from gpud.hw.machine import Machine
from gpud.model import GpuInfo, GpuSample, Snapshot, document, sample_json, to_jsonable

HEADERS = ["GPU", "Name", "Temp", "Fan", "Power / limit", "SM / mem clock", "Util", "Memory",
           "PCIe now/max", "Persist", "ECC", "NVLink", "Processes", "Clock events"]
LEGEND = ("Legend: ! outside its limit (each listed below); * fan under manual control; - none; "
          "n/a not reported by this GPU; DBE uncorrectable (double-bit) ECC errors; Processes: count "
          "(the user with the most)")
BAD_EVENTS = {"sw_power_cap": "power capped", "hw_slowdown": "HW slowdown",
              "sw_thermal_slowdown": "SW thermal slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
              "hw_power_brake_slowdown": "HW power brake"}
TEMP_MARGIN_C = 10  # closer than this to the slowdown temperature is flagged (as doctor's health.thermal)
FAN_OFF_TARGET = 10  # percentage points between a fan's speed and its target


def problems(s: GpuSample, info: GpuInfo | None) -> dict[str, str]:
    """Column → why its value is outside its limit, for one GPU."""
    out: dict[str, str] = {}
    if s.lost:
        return {"GPU": f"lost: {s.error or 'NVML cannot read it'}"}
    if info is None:
        return out
    t, slow = s.temperature_celsius, info.temperature_slowdown_celsius
    if t is not None and slow is not None and slow - t < TEMP_MARGIN_C:
        out["Temp"] = f"{t} °C is {slow - t} °C below slowdown ({slow} °C)"
    for f in s.fans:
        if f.speed_percent is not None and f.target_percent is not None \
                and abs(f.speed_percent - f.target_percent) > FAN_OFF_TARGET:
            out["Fan"] = f"fan {f.fan} at {f.speed_percent} %, target {f.target_percent} %"
        elif f.speed_percent == 0 and t is not None and t >= 70:
            out["Fan"] = f"fan {f.fan} at 0 % with the GPU at {t} °C"
    events = set(s.clock_events or ())
    default = info.power_default_limit_watts
    if "sw_power_cap" in events or "hw_power_brake_slowdown" in events:
        out["Power / limit"] = "power capped: clocks held back by the power limit"
    elif s.power_limit_watts is not None and default and s.power_limit_watts < default:
        out["Power / limit"] = f"limit {s.power_limit_watts:.0f} W, below the default {default:.0f} W"
    loaded = (s.utilization_gpu_percent or 0) > 0
    if s.pcie_width is not None and info.pcie_max_width and s.pcie_width < info.pcie_max_width:
        out["PCIe now/max"] = f"link x{s.pcie_width}, the slot and GPU do x{info.pcie_max_width}"
    elif loaded and s.pcie_generation is not None and info.pcie_max_generation \
            and s.pcie_generation < info.pcie_max_generation:
        out["PCIe now/max"] = f"Gen{s.pcie_generation} under load, max Gen{info.pcie_max_generation}"
    ecc = _ecc_problem(s)
    if ecc:
        out["ECC"] = ecc
    up = sum(1 for ln in s.nvlinks if ln.up)
    if info.nvlink_count and up < info.nvlink_count:
        out["NVLink"] = f"{up} of {info.nvlink_count} NVLinks up"
    bad = [BAD_EVENTS[e] for e in sorted(events) if e in BAD_EVENTS and e != "sw_power_cap"]
    if bad:
        out["Clock events"] = "clocks cut: " + ", ".join(bad)
    return out


def _ecc_problem(s: GpuSample) -> str:
    e = s.ecc_errors
    bits = []
    if e is not None and (e.volatile_uncorrected or 0) > 0:
        bits.append(plural(e.volatile_uncorrected or 0, "uncorrectable error") + " since boot")
    elif e is not None and (e.aggregate_uncorrected or 0) > 0:
        bits.append(plural(e.aggregate_uncorrected or 0, "uncorrectable error") + " in the GPU's lifetime")
    if s.remapped_rows_failure:
        bits.append("row remapping failed")
    if s.remapped_rows_pending or s.retired_pages_pending:
        bits.append("memory repair pending (reset the GPU)")
    return "; ".join(bits)


def _ecc_cell(s: GpuSample) -> str:
    if s.ecc_enabled is None and s.remapped_rows_pending is None:
        return "n/a"
    e = s.ecc_errors
    if s.remapped_rows_failure:
        return "remap failed"
    if e is not None and ((e.volatile_uncorrected or 0) or (e.aggregate_uncorrected or 0)):
        return f"{max(e.volatile_uncorrected or 0, e.aggregate_uncorrected or 0)} DBE"
    if s.remapped_rows_pending or s.retired_pages_pending:
        return "pending"
    return "off" if s.ecc_enabled is False else "ok"


def _procs_cell(s: GpuSample) -> str:
    if s.processes is None:
        return "n/a"
    if not s.processes:
        return "-"
    users = Counter(p.user or "?" for p in s.processes)
    top = users.most_common(1)[0][0]
    return f"{len(s.processes)} ({top})"


def _row(s: GpuSample, info: GpuInfo | None, bad: dict[str, str]) -> list[str]:
    if s.lost:
        return [str(s.index), info.name.replace("NVIDIA ", "") if info else "?", colour("LOST!", "1;31")] \
            + ["-"] * (len(HEADERS) - 3)
    assert info is not None
    fans = "/".join(fmt(f.speed_percent, " %") + ("*" if f.policy == "manual" else "") for f in s.fans) or "-"
    mem = (f"{s.memory_used_bytes / 2**30:.1f} / {s.memory_total_bytes / 2**30:.0f} GiB"
           if s.memory_used_bytes is not None and s.memory_total_bytes else "n/a")
    events = [e for e in (s.clock_events or ()) if e != "gpu_idle"]
    up = sum(1 for ln in s.nvlinks if ln.up)
    if s.power_watts is not None and s.power_limit_watts is not None:
        power = f"{s.power_watts:.0f} / {s.power_limit_watts:.0f} W"
    elif s.power_limit_watts is not None:  # a board without a power reading (never "n/a/300 W")
        power = f"limit {s.power_limit_watts:.0f} W"
    else:
        power = fmt(s.power_watts, " W")
    sm, memclk = s.clocks_mhz.get("sm"), s.clocks_mhz.get("memory")
    cells = {
        "GPU": str(s.index),
        "Name": info.name.replace("NVIDIA ", ""),
        "Temp": fmt(s.temperature_celsius, " °C"),
        "Fan": fans,
        "Power / limit": power,
        "SM / mem clock": "n/a" if sm is None and memclk is None else f"{fmt(sm)} / {fmt(memclk)} MHz",
        "Util": fmt(s.utilization_gpu_percent, " %"),
        "Memory": mem,
        "PCIe now/max": f"Gen{fmt(s.pcie_generation)}/{fmt(info.pcie_max_generation)} "
                        f"x{fmt(s.pcie_width)}/{fmt(info.pcie_max_width)}",
        "Persist": {True: "on", False: "off", None: "n/a"}[s.persistence_mode],
        "ECC": _ecc_cell(s),
        "NVLink": f"{up}/{info.nvlink_count} up" if info.nvlink_count else "-",
        "Processes": _procs_cell(s),
        "Clock events": ", ".join(events) or ("idle" if s.clock_events else "-"),
    }
    return [colour(v + "!", "1;33") if k in bad else v for k, v in cells.items()]


def render(label: str, snap: Snapshot, when: float | None = None) -> None:
    infos = {g.index: g for g in snap.gpus}
    v = snap.versions
    title = (f"{label} — driver {fmt(v.driver)}, CUDA {fmt(v.cuda_driver)}, "
             f"{plural(len(snap.samples), 'GPU')}")
    if when is not None:
        title += f" — {time.strftime('%H:%M:%S', time.localtime(when))}"
    bad = {s.index: problems(s, infos.get(s.index)) for s in snap.samples}
    table(HEADERS, [_row(s, infos.get(s.index), bad[s.index]) for s in snap.samples], title=title)
    lines = wrap(LEGEND, indent="")
    for i, why in bad.items():
        for col, text in why.items():
            lines += wrap(f"{col}: {text}", indent="        ", first=colour(f"  GPU{i}", "1") + "  ")
    sys.stdout.write("\n" + "\n".join(lines) + "\n")


def status_document(m: Machine, snap: Snapshot) -> dict[str, Any]:
    infos = {g.index: g for g in snap.gpus}
    return document("status", __version__, host(m, snap), timestamp=snap.timestamp,
                    gpus=[{"info": to_jsonable(infos.get(s.index)), "sample": sample_json(s)}
                          for s in snap.samples])


def status(
    simulate: Simulate = None,
    json: Json = False,
    ids: GpuIds = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until interrupted (with --json: one JSON "
                                                        "document per line).")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between refreshes.")] = 2.0,
) -> None:
    """GPU telemetry: temperature, fans, power, clocks, memory, PCIe, ECC, NVLink, processes.

    Values outside their limits are marked with ! and explained under the table. Exit 1 when a
    GPU is lost (NVML cannot read it).
    """
    m = machine(simulate)
    while True:
        snap = m.snapshot(pcie=True)
        snap = narrow(snap, gpu_ids(ids, snap.gpus))
        if json:
            emit_json(status_document(m, snap), compact=watch)
        else:
            if watch and is_tty():
                clear_screen()
            render(m.label, snap, time.time() if watch else None)
            if watch:
                sys.stdout.flush()
        if not watch:
            if any(s.lost for s in snap.samples):
                raise typer.Exit(1)
            return
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return


def register(app: typer.Typer) -> None:
    app.command("status")(status)
