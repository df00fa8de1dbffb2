"""``gpud ps``: every process on every GPU — who (user), what (command), where (container, pod, Slurm
job or systemd unit), how much GPU memory and SM ("-": no utilisation sample for it since the last read);
on a MIG GPU, the instance it runs in (GI/CI, as nvidia-smi's process table).

One process is one line: the command (and a long container or unit name) is cut with … to the
terminal's width; ``--wide`` and ``--json`` give it whole."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpud import __version__
from gpud.cli.common import GpuIds, Json, Simulate, gpu_ids, gpus_of, host, machine
from gpud.cli.output import UNLIMITED, clean, cut, emit_json, fmt, table_lines, width
from gpud.model import Snapshot, document

HEADERS = ["GPU", "PID", "User", "Type", "Memory", "SM", "Container / job", "Command"]
MIN_COMMAND = 12  # the command column is never narrower: a narrower terminal cuts the container first
MAX_CONTAINER = 24


def rows_of(snap: Snapshot, only: set[int] | None = None) -> list[dict[str, Any]]:
    """One dict per process on each GPU (GPUs whose list NVML cannot give are left out)."""
    out = []
    for s in snap.samples:
        if only is not None and s.index not in only:
            continue
        # a MIG GPU's process runs in one of its instances: which one, and the UUID a job names it by
        mig = {(m.gpu_instance_id, m.compute_instance_id): m.uuid for m in s.mig_instances or ()}
        for p in s.processes or ():
            out.append({"gpu": s.index, "uuid": s.uuid, "pid": p.pid, "user": p.user, "kind": p.kind,
                        "used_memory_bytes": p.used_memory_bytes, "container": p.container,
                        "sm_utilization_percent": p.sm_utilization_percent,
                        "gpu_instance_id": p.gpu_instance_id, "compute_instance_id": p.compute_instance_id,
                        "mig_uuid": mig.get((p.gpu_instance_id, p.compute_instance_id)), "command": p.command})
    return out


def _gpu_cell(r: dict[str, Any]) -> str:
    """The GPU, and on a MIG GPU the instance (nvidia-smi's GI ID and CI ID columns)."""
    if r.get("gpu_instance_id") is None:  # a record without it (a daemon from before MIG was read): the GPU
        return str(r["gpu"])
    return f"{r['gpu']} GI{r['gpu_instance_id']}/CI{fmt(r['compute_instance_id'])}"


def _mib(n: int | None) -> str:
    return f"{n / 2**20:.0f} MiB" if n is not None else "n/a"


def lines(rows: list[dict[str, Any]], title: str, limit: int) -> list[str]:
    """The table, one line per process within ``limit`` columns (UNLIMITED: nothing cut)."""
    cells = [[_gpu_cell(r), str(r["pid"]), clean(fmt(r["user"])), r["kind"], _mib(r["used_memory_bytes"]),
              fmt(r["sm_utilization_percent"], "%", none="-"), clean(r["container"] or "-"),
              clean(fmt(r["command"]))] for r in rows]
    if limit < UNLIMITED and cells:
        for c in cells:
            c[6] = cut(c[6], MAX_CONTAINER)
            c[2] = cut(c[2], 12)
        fixed = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADERS[:-1])]
        room = limit - sum(fixed) - 2 * (len(HEADERS) - 1)
        if room < MIN_COMMAND:  # a narrow terminal: the container column gives way first
            give = min(MIN_COMMAND - room, fixed[6] - len(HEADERS[6]))
            for c in cells:
                c[6] = cut(c[6], fixed[6] - give)
            room += give
        for c in cells:
            c[7] = cut(c[7], max(MIN_COMMAND, room))
    else:  # whole: as wide as the widest row
        limit = max([UNLIMITED] + [sum(len(x) + len(h) + 2 for x, h in zip(c, HEADERS, strict=True)) for c in cells])
    return table_lines(HEADERS, cells, title=title, max_width=limit)


def ps(
    simulate: Simulate = None,
    json: Json = False,
    ids: GpuIds = None,
    wide: Annotated[bool, typer.Option("--wide", "-w", help="Whole commands and container names, however "
                                                            "long the line.")] = False,
) -> None:
    """Processes on the GPUs: pid, user, type, GPU memory, SM use, container or job, command."""
    m = machine(simulate)
    snap = m.snapshot()
    only = gpu_ids(ids, gpus_of(snap))
    rows = rows_of(snap, only)
    unknown = [s.index for s in snap.samples if s.processes is None and (only is None or s.index in only)]
    if json:
        emit_json(document("ps", __version__, host(m, snap), processes=rows, unreadable_gpus=unknown))
        return
    title = f"{m.label} — {len(rows)} process(es) on {len({r['gpu'] for r in rows})} GPU(s)"
    out = lines(rows, clean(title), UNLIMITED if wide else width())
    sys.stdout.write("\n".join(out) + "\n")
    if unknown:
        print(f"process list not reported for GPU {', '.join(map(str, unknown))}")


def register(app: Any) -> None:
    app.command("ps")(ps)
