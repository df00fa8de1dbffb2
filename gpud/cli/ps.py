"""``gpud ps``: every process on every GPU — who (user), what (command), where (container, pod, Slurm
job or systemd unit), how much GPU memory and SM ("-": no utilisation sample for it since the last read)."""

from __future__ import annotations

from typing import Any

from gpud.cli.common import Json, Simulate, machine
from gpud.cli.output import emit_json, fmt, table
from gpud.model import Snapshot

HEADERS = ["GPU", "PID", "User", "Type", "Memory", "SM", "Container / job", "Command"]


def rows_of(snap: Snapshot) -> list[dict[str, Any]]:
    """One dict per process on each GPU (GPUs whose list NVML cannot give are left out)."""
    out = []
    for s in snap.samples:
        for p in s.processes or ():
            out.append({"gpu": s.index, "uuid": s.uuid, "pid": p.pid, "user": p.user, "kind": p.kind,
                        "used_memory_bytes": p.used_memory_bytes, "container": p.container,
                        "sm_utilization_percent": p.sm_utilization_percent, "command": p.command})
    return out


def _mib(n: int | None) -> str:
    return f"{n / 2**20:.0f} MiB" if n is not None else "n/a"


def ps(simulate: Simulate = None, json: Json = False) -> None:
    """Processes on the GPUs: pid, user, type, GPU memory, SM use, container or job, command."""
    m = machine(simulate)
    snap = m.snapshot()
    rows = rows_of(snap)
    unknown = [s.index for s in snap.samples if s.processes is None]
    if json:
        emit_json({"host": m.label, "processes": rows, "unreadable_gpus": unknown})
        return
    table(HEADERS, [[str(r["gpu"]), str(r["pid"]), fmt(r["user"]), r["kind"], _mib(r["used_memory_bytes"]),
                     fmt(r["sm_utilization_percent"], "%", none="-"), r["container"] or "-", fmt(r["command"])]
                    for r in rows],
          title=f"{m.label} — {len(rows)} process(es) on {len({r['gpu'] for r in rows})} GPU(s)")
    if unknown:
        print(f"process list not reported for GPU {', '.join(map(str, unknown))}")


def register(app: Any) -> None:
    app.command("ps")(ps)
