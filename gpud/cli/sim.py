"""``gpud sim``: the simulated workstations (list, reset, inject faults, import a real machine)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, List

import typer

from gpud.cli.common import Json, Simulate, emit_document, local_host
from gpud.cli.output import table
from gpud.errors import GpudError, InvalidInput

sim_app = typer.Typer(help="Simulated workstations: try gpud without NVIDIA GPUs, test it.", no_args_is_help=True)


def _target(name: str | None, simulate: str | None) -> str:
    target = name or simulate
    if not target:
        raise InvalidInput("gpud sim", "NAME", "name a simulated workstation (or set --simulate / GPUD_SIMULATE)")
    return target


@sim_app.command("list")
def sim_list(json: Json = False) -> None:
    """The shipped simulated workstations."""
    from gpud.sim import shipped

    descs = shipped()
    if json:
        emit_document("sim_list", local_host(), machines=[{"name": d.name, "gpus": len(d.gpus),
                                                           "summary": d.machine.summary} for d in descs])
        return
    table(["Name", "GPUs", "Summary"], [[d.name, len(d.gpus), d.machine.summary] for d in descs])


@sim_app.command("reset")
def sim_reset(name: Annotated[str | None, typer.Argument(help="Name or path (default: --simulate).")] = None,
              simulate: Simulate = None) -> None:
    """Forget what was written to the simulated hardware, and injected faults."""
    from gpud.sim import reset

    target = _target(name, simulate)
    removed = reset(target)
    typer.echo(f"{target}: reset ({len(removed)} item(s) removed)")


@sim_app.command("inject")
def sim_inject(
    kind: Annotated[str, typer.Argument(help="gpu_lost, unsupported, no_permission, link_degraded, nvlink_down, "
                                             "p2p, clock_events, xid, fan_stuck, process, process_exit, … "
                                             "(docs/simulation.md)")],
    params: Annotated[List[str] | None, typer.Argument(help='KEY=VALUE, values in TOML: gpu=2 gpus=[2,3] '
                                                               'call="nvmlDeviceGetTemperature"')] = None,
    simulate: Simulate = None,
) -> None:
    """Inject a fault into a simulated workstation while gpud runs on it."""
    from gpud.schema import parse_toml_value
    from gpud.sim import open_simulation

    values = {}
    for p in params or []:
        key, eq, raw = p.partition("=")
        if not eq:
            raise InvalidInput("gpud sim inject", p, "expected KEY=VALUE")
        values[key] = parse_toml_value(raw)
    sim = open_simulation(_target(None, simulate))
    fault = sim.machine.inject(kind, **values)
    _saved(sim, "the injected fault")
    sim.refresh_root()
    typer.echo(f"{sim.description.name}: injected {fault.kind} {fault.params}")


def _saved(sim: Any, what: str) -> None:
    """A change to the simulated machine that could not be saved (a full or read-only state
    directory) lasts only as long as this command: say so, exit 1."""
    if sim.machine.in_memory:

        err = GpudError(f"{what} could not be saved in {sim.machine.state_file.parent}: the state directory is "
                        "full or read-only, so other gpud processes do not see it")
        err.remedy = "free space or make it writable (GPUD_STATE_DIR chooses another directory)"
        raise err


@sim_app.command("reboot")
def sim_reboot(simulate: Simulate = None) -> None:
    """Reboot a simulated workstation: settings and injected faults gone, a new boot id."""
    from gpud.sim import open_simulation

    sim = open_simulation(_target(None, simulate))
    boot = sim.machine.reboot()
    _saved(sim, "the reboot")
    sim.refresh_root()
    sys.stdout.write(f"{sim.description.name}: rebooted (boot {boot}, boot id {sim.machine.boot_id()})\n")


@sim_app.command("clear")
def sim_clear(simulate: Simulate = None) -> None:
    """Remove the faults injected at run time (those of the description stay)."""
    from gpud.sim import open_simulation

    sim = open_simulation(_target(None, simulate))
    sim.machine.clear_faults()
    _saved(sim, "clearing the faults")
    sim.refresh_root()
    sys.stdout.write(f"{sim.description.name}: injected faults cleared\n")


@sim_app.command("import")
def sim_import(
    dump: Annotated[Path, typer.Argument(metavar="NVIDIA_SMI_Q", help="Output of `nvidia-smi -q` (or `-q -x`).")],
    topo: Annotated[Path | None, typer.Option("--topo", metavar="TOPO_M",
                                              help="Output of `nvidia-smi topo -m` of the same machine.")] = None,
    xml: Annotated[bool, typer.Option("--xml", help="The dump is `nvidia-smi -q -x` (found by itself "
                                                    "when it starts with '<?xml').")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="FILE",
                                                help="Write the description here (default: stdout).")] = None,
) -> None:
    """A simulated twin of a real machine from its nvidia-smi output (a description TOML)."""
    from gpud.paths import atomic_write, check_output
    from gpud.sim.dump import import_dump, render

    if output is not None:  # refused before the dump is read
        check_output(output, "-o")
    name = output.stem if output else dump.stem
    twin = import_dump(dump, topo, True if xml else None, name, str(dump), str(topo) if topo else None)
    text = render(twin)
    inferred, unread = twin.notes.lines(len(twin.data["gpu"]))
    target = str(output) if output else "stdout"
    lines = [f"{target}: {len(twin.data['gpu'])} GPU(s) from {dump}; {len(inferred)} inferred key group(s):"]
    lines += [f"  {line}" for line in inferred]
    if unread:
        lines.append(f"{len(unread)} thing(s) in the dump not reproduced:")
        lines += [f"  {line}" for line in unread]
    if output:
        try:
            atomic_write(output, text)
        except OSError as err:
            raise InvalidInput(str(output), "", f"cannot write: {err.strerror}") from err
    else:
        sys.stdout.write(text)
    sys.stderr.write("\n".join(lines) + "\n")


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
