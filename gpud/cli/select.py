"""``gpud select``: a CUDA_VISIBLE_DEVICES value for a job script — idle GPUs, best connected."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from gpud.cli.common import Json, Simulate, emit_document, host, machine
from gpud.errors import InvalidInput
from gpud.hw.host import parse_size
from gpud.picker import choose


def select(
    n: Annotated[int, typer.Option("-n", "--count", min=1, help="How many GPUs.")] = 1,
    min_free_memory: Annotated[str | None, typer.Option(
        "--min-free-memory", metavar="SIZE", help="Free GPU memory each GPU needs: 20g, 512m, bytes.")] = None,
    max_utilization: Annotated[int, typer.Option(
        "--max-utilization", metavar="PCT", min=0, max=100, help="Busiest a GPU may be (percent).")] = 10,
    wait: Annotated[float, typer.Option("--wait", metavar="SECONDS", min=0,
                                        help="Wait up to this long for GPUs to free up.")] = 0.0,
    uuid: Annotated[bool, typer.Option("--uuid", help="Print GPU UUIDs instead of indices.")] = False,
    simulate: Simulate = None,
    json: Json = False,
) -> None:
    """Print a CUDA_VISIBLE_DEVICES value: N idle GPUs, the best-connected set (NVLink pair, then the
    same PCIe switch, then the same NUMA node). Exit 1 with the reason when none fits.

    A GPU in MIG mode is never given whole: for one GPU, a free MIG instance is printed as its MIG-…
    UUID when no whole GPU is idle (a CUDA process uses one MIG instance; instances have no P2P).

    Indices are NVML's (PCI bus order): use them with CUDA_DEVICE_ORDER=PCI_BUS_ID, or use --uuid.

    \b
        export CUDA_VISIBLE_DEVICES=$(gpud select -n 2 \\
            --min-free-memory 40g --uuid)
    """
    min_free = 0
    if min_free_memory is not None:
        text = min_free_memory.strip()
        for suffix in ("ib", "b"):  # 20GiB, 20GB, 20G alike (binary units)
            if text.lower().endswith(suffix) and len(text) > len(suffix) and not text[-len(suffix) - 1].isdigit():
                text = text[:-len(suffix)]
                break
        parsed = parse_size(text)
        if parsed is None:
            raise InvalidInput("--min-free-memory", "", f"not a size: {min_free_memory!r} (e.g. 20g, 512m)")
        min_free = parsed
    m = machine(simulate)
    deadline = time.monotonic() + wait
    while True:
        snap = m.snapshot()
        choice = choose(snap, m.topology(snap), n, min_free, max_utilization)
        if choice.gpus or time.monotonic() >= deadline:
            break
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
    # A MIG instance is named by its UUID whatever --uuid says: no index names it
    value = ",".join(choice.instances or (choice.uuids if uuid else map(str, choice.gpus)))
    if json:
        out: dict[str, Any] = {"cuda_visible_devices": value or None, "gpus": list(choice.gpus),
                               "uuids": list(choice.uuids), "mig_instances": list(choice.instances),
                               "reason": choice.reason}
        emit_document("select", host(m, snap), **out)
    elif choice.gpus:
        print(value)
        print(f"gpud select: {choice.reason}", file=sys.stderr)
    else:
        print(f"gpud select: no fit: {choice.reason}", file=sys.stderr)
    if not choice.gpus:
        raise typer.Exit(1)


def register(app: Any) -> None:
    app.command("select")(select)
