"""Options every command shares, and opening the machine they ask for."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpud.backends import open_machine
from gpud.hw.machine import Machine

if TYPE_CHECKING:
    from gpud.model import Snapshot

Simulate = Annotated[
    str | None,
    typer.Option(
        "--simulate",
        envvar="GPUD_SIMULATE",
        metavar="NAME|PATH",
        help="Run on a simulated workstation (see `gpud sim list`) instead of the real GPUs.",
        show_envvar=True,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def machine(simulate: str | None) -> Machine:
    return open_machine(simulate or None)


def host(m: Machine, snap: Snapshot | None) -> dict[str, Any]:
    """``host`` as every JSON document writes it (gpud.model.host_json)."""
    from gpud.model import host_json

    try:
        cpu = m.host.cpu_info()
        mem = m.host.memory_total_bytes()
    except OSError:
        cpu, mem = None, None
    return host_json(m.label, snap.versions if snap is not None else None,
                     len(snap.samples) if snap is not None else None, cpu, mem)
