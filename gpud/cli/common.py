"""Options every command shares, and opening the machine they ask for."""

from __future__ import annotations

import dataclasses
import socket
from types import SimpleNamespace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpud import __version__
from gpud.backends import open_machine
from gpud.cli.output import emit_json
from gpud.errors import GpudError, InvalidInput
from gpud.hw.machine import Machine
from gpud.model import document, host_json, pci_address

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
        autocompletion=lambda incomplete: _complete("machines", incomplete),
    ),
]
def _complete(what: str, incomplete: str) -> list[str]:
    from gpud.cli import complete

    return list(getattr(complete, what)(incomplete))


Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def machine(simulate: str | None) -> Machine:
    return open_machine(simulate or None)


def host(m: Machine, snap: Snapshot | None) -> dict[str, Any]:
    """``host`` as every JSON document writes it (gpud.model.host_json)."""

    try:
        cpu = m.host.cpu_info()
        mem = m.host.memory_total_bytes()
    except OSError:
        cpu, mem = None, None
    return host_json(m.label, snap.versions if snap is not None else None,
                     len(snap.samples) if snap is not None else None, cpu, mem)


GpuIds = Annotated[
    str | None,
    typer.Option("--id", "-i", metavar="GPU[,GPU]",
                 help="Only these GPUs (as nvidia-smi -i): index, UUID or PCI bus id; a comma list."),
]


def gpu_ids(spec: str | None, gpus: Any) -> set[int] | None:
    """The indexes ``-i/--id`` names among ``gpus`` (objects with ``index``, ``uuid``, ``pci_bus_id``),
    or None without the option. A name matching no GPU is bad usage: exit 2 with the GPUs there are."""

    if spec is None:
        return None
    known = list(gpus)
    out: set[int] = set()
    for word in (w.strip() for w in spec.split(",")):
        if not word:
            raise InvalidInput("--id", spec, "an empty GPU id (index, UUID or PCI bus id, comma separated)")
        bus = pci_address(word)
        low = word.lower()
        found = [g.index for g in known if word == str(g.index) or low == str(g.uuid).lower()
                 or (low.startswith("gpu-") and len(low) >= 8 and str(g.uuid).lower().startswith(low))
                 or (bus is not None and bus == pci_address(str(g.pci_bus_id or "")))]
        if not found:
            have = ", ".join(f"{g.index} ({g.pci_bus_id or 'not readable'})" for g in known) or "none"
            raise InvalidInput("--id", word, f"no such GPU: give an index, UUID or PCI bus id ({have})")
        out.update(found)
    return out


def machine_host(m: Machine) -> dict[str, Any]:
    """``host`` for a document whose command reads no snapshot (apply, verify, restore): versions and
    GPU count from NVML, or the name alone when NVML cannot answer."""

    try:
        m.nvml.init()
        versions, count = m.nvml.versions(), m.nvml.device_count()
    except GpudError:
        return host_json(m.label)
    try:
        cpu, mem = m.host.cpu_info(), m.host.memory_total_bytes()
    except OSError:
        cpu, mem = None, None
    return host_json(m.label, versions, count, cpu, mem)


def local_host() -> dict[str, Any]:
    """``host`` for a document about this machine that reads no GPU (profile list, sim list, events)."""


    return host_json(socket.gethostname())


def emit_document(kind: str, host_: dict[str, Any], **body: Any) -> None:
    """One ``--json`` document of the shared schema (docs/json.md): the envelope, then ``body``."""

    emit_json(document(kind, __version__, host_, **body))


def gpus_of(snap: Snapshot) -> list[Any]:
    """Every GPU of a snapshot as ``-i/--id`` matches it, a lost one too (its index and UUID)."""

    infos = {g.index: g for g in snap.gpus}
    return [SimpleNamespace(index=s.index, uuid=s.uuid,
                            pci_bus_id=infos[s.index].pci_bus_id if s.index in infos else None) for s in snap.samples]


def narrow(snap: Snapshot, only: set[int] | None) -> Snapshot:
    """``snap`` with only the GPUs ``-i/--id`` named (all without the option)."""

    if only is None:
        return snap
    return dataclasses.replace(snap, gpus=tuple(g for g in snap.gpus if g.index in only),
                               samples=tuple(s for s in snap.samples if s.index in only))
