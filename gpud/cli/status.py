"""``gpud status``: one row per GPU from one snapshot; values outside their limits are marked."""

from __future__ import annotations

import sys
import time
from collections import Counter
from typing import Annotated, Any

import typer

from gpud import __version__
from gpud import config as cfg
from gpud.cli.common import GpuIds, Json, Simulate, gpu_ids, gpus_of, host, machine, narrow
from gpud.cli.output import clean, clear_screen, colour, emit_json, fmt, is_tty, plural, table, visible_len, width, wrap
from gpud.doctor import diagnose
from gpud.hw.machine import Machine
from gpud.model import CheckResult, GpuInfo, GpuSample, Snapshot, document, sample_json, slow_open, to_jsonable
from gpud.profiles import state as tuning_state

HEADERS = ["GPU", "Name", "Temp", "Fan", "Power / limit", "SM / mem clock", "Util", "Memory",
           "PCIe now/max", "Persist", "ECC", "NVLink", "Processes", "Clock events"]
LEGEND = ("Legend: ! outside its limit (each listed below); * fan under manual control; - none; "
          "n/a not reported by this GPU; DBE uncorrectable (double-bit) ECC errors; Processes: count "
          "(the user with the most)")
BAD_EVENTS = {"sw_power_cap": "power capped", "hw_slowdown": "HW slowdown",
              "sw_thermal_slowdown": "SW thermal slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
              "hw_power_brake_slowdown": "HW power brake"}
# The columns doctor judges: status marks them when, and as, doctor's check does (one judgement:
# a power limit the active profile asked for is fine in both; a stalled fan fails in both).
JUDGED_BY = {"Temp": "health.thermal", "Fan": "health.fans", "Power / limit": "config.power_limit"}
Verdicts = dict[tuple[str, int], CheckResult]


def verdicts(m: Machine, snap: Snapshot) -> Verdicts:
    """doctor's checks of the judged columns on this snapshot, with doctor's configuration."""

    report = diagnose(m, cfg.load(None), only=list(JUDGED_BY.values()), snapshot=snap)
    return {(r.id, r.gpu): r for r in report.checks if r.gpu is not None}


def problems(s: GpuSample, info: GpuInfo | None, judged: Verdicts | None = None) -> dict[str, str]:
    """Column → why its value is outside its limit, for one GPU."""
    out: dict[str, str] = {}
    if s.lost:
        return {"GPU": f"lost: {s.error or 'NVML cannot read it'}"}
    if info is None:
        return out
    for col, check_id in JUDGED_BY.items():
        r = (judged or {}).get((check_id, s.index))
        if r is not None and r.status in ("warn", "fail"):
            out[col] = r.summary
    events = set(s.clock_events or ())
    if "Power / limit" not in out and ("sw_power_cap" in events or "hw_power_brake_slowdown" in events):
        out["Power / limit"] = "power capped: clocks held back by the power limit"
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


COMPACT = ["GPU", "Temp", "Fan", "Power", "Util", "Memory", "Processes"]
COMPACT_LEGEND = ("Compact view (the full table would split at this width; --wide for every column): "
                  "GPU N! a value outside its limit in a column not shown (listed below).")


def _compact_row(full: list[str], bad: dict[str, str], lost: bool) -> list[str]:
    """One short line per GPU (as gpustat): the full row's cells, without the spaces a table can afford."""
    cells = dict(zip(HEADERS, full, strict=True))
    if lost:
        return [cells["GPU"], cells["Temp"], "-", "-", "-", "-", "-"]
    power = cells["Power / limit"].replace(" / ", "/")
    memory = cells["Memory"].replace(" / ", "/")
    shown = {"Temp", "Fan", "Power / limit", "Util", "Memory", "Processes"}
    gpu = colour(cells["GPU"] + "!", "1;33") if set(bad) - shown else cells["GPU"]
    return [gpu, cells["Temp"], cells["Fan"], power, cells["Util"], memory, cells["Processes"]]


def _fits(rows: list[list[str]], limit: int) -> bool:
    widths = [max(visible_len(h), *(visible_len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    return sum(widths) + 2 * (len(HEADERS) - 1) <= limit


def render(label: str, snap: Snapshot, when: float | None = None, view: str = "auto",
           judged: Verdicts | None = None) -> None:
    """The table; ``view`` "compact" (one short line per GPU), "wide" (every column, split into
    column groups where it must) or "auto" (compact where the full table would split)."""
    infos = {g.index: g for g in snap.gpus}
    v = snap.versions
    names = sorted({infos[s.index].name.replace("NVIDIA ", "") for s in snap.samples if s.index in infos})
    bad = {s.index: problems(s, infos.get(s.index), judged) for s in snap.samples}
    rows = [_row(s, infos.get(s.index), bad[s.index]) for s in snap.samples]
    compact = view == "compact" or (view == "auto" and bool(rows) and not _fits(rows, width()))
    title = (f"{label} — driver {fmt(v.driver)}, CUDA {fmt(v.cuda_driver)}, "
             f"{plural(len(snap.samples), 'GPU')}" + (f" ({', '.join(names)})" if compact and names else ""))
    if when is not None:
        title += f" — {time.strftime('%H:%M:%S', time.localtime(when))}"
    if compact:
        table(COMPACT, [_compact_row(r, bad[s.index], s.lost) for r, s in zip(rows, snap.samples, strict=True)],
              title=title)
    else:
        table(HEADERS, rows, title=title)
    lines = wrap(LEGEND, indent="") + (wrap(COMPACT_LEGEND, indent="") if compact else [])
    for i, why in bad.items():
        for col, text in why.items():
            lines += wrap(f"{col}: {text}", indent="        ", first=colour(f"  GPU{i}", "1") + "  ")
    for i in sorted(infos):
        slow = slow_open(infos[i])
        if slow:  # why this command was slow: the lookup initialised the GPU
            lines += wrap(f"{slow}; `sudo nvidia-smi -pm 1` keeps it initialised", indent="        ",
                          first=colour(f"  GPU{i}", "1") + "  ")
    sys.stdout.write("\n" + "\n".join(lines) + "\n")


def status_document(m: Machine, snap: Snapshot) -> dict[str, Any]:
    infos = {g.index: g for g in snap.gpus}
    shown = {s.index for s in snap.samples}
    return document("status", __version__, host(m, snap), timestamp=snap.timestamp,
                    gpus=[{"info": to_jsonable(infos.get(s.index)), "sample": sample_json(s)}
                          for s in snap.samples],
                    profiles=[{"gpu": g, "profile": p, "rule": r or None} for g, p, r in active_profiles()
                              if g in shown])


def active_profiles() -> tuple[tuple[int, str, str], ...]:
    """(gpu, profile, rule) of each GPU with a profile, from the state file (a rule's, or the applied one)."""

    return tuning_state.gpu_profiles(tuning_state.load())


def profiles_line(snap: Snapshot) -> str | None:
    """``Profiles: GPU0-1,3 quiet; GPU2 max-performance (rule alice-trains)``; None when none is applied."""
    shown = {s.index for s in snap.samples}
    groups: dict[tuple[str, str], list[int]] = {}
    for gpu, name, rule in active_profiles():
        if gpu in shown:
            groups.setdefault((name, rule), []).append(gpu)
    if not groups:
        return None
    parts = [f"GPU{','.join(map(str, gpus))} {clean(name)}" + (f" (rule {clean(rule)})" if rule else "")
             for (name, rule), gpus in sorted(groups.items(), key=lambda kv: kv[1][0])]
    return "Profiles: " + "; ".join(parts)


def status(
    simulate: Simulate = None,
    json: Json = False,
    ids: GpuIds = None,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until interrupted (with --json: one JSON "
                                                        "document per line).")] = False,
    interval: Annotated[float, typer.Option("--interval", min=0.1, help="Seconds between refreshes.")] = 2.0,
    compact: Annotated[bool, typer.Option("--compact", "-c", help="One short line per GPU (the default where "
                                                                  "the full table would not fit).")] = False,
    wide: Annotated[bool, typer.Option("--wide", "-w", help="Every column, in column groups where the "
                                                            "terminal is too narrow.")] = False,
) -> None:
    """GPU telemetry: temperature, fans, power, clocks, memory, PCIe, ECC, NVLink, processes.

    Values outside their limits are marked with ! and explained under the table. Exit 1 when a
    GPU is lost (NVML cannot read it).
    """
    m = machine(simulate)
    while True:
        snap = m.snapshot(pcie=True)
        snap = narrow(snap, gpu_ids(ids, gpus_of(snap)))
        if json:
            emit_json(status_document(m, snap), compact=watch)
        else:
            if watch and is_tty():
                clear_screen()
            render(m.label, snap, time.time() if watch else None,
                   "compact" if compact else "wide" if wide else "auto", verdicts(m, snap))
            line = profiles_line(snap)
            if line:
                sys.stdout.write(line + "\n")
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
