"""The ``gpud`` command line (typer). Thin: it parses, calls the layers below, prints."""

from __future__ import annotations

import difflib
import importlib
import sys
import traceback
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperGroup

from gpud import __version__
from gpud.errors import GpudError, InvalidInput

# Each command, in `gpud --help`'s order: the module of gpud.cli whose ``register`` adds it, and its one line in
# `gpud --help`, whole at 80 columns (click would cut a longer first sentence with "..."); None for a group of
# commands, whose line is its own help.
COMMANDS: dict[str, tuple[str, str | None]] = {
    "status": ("status", "GPU telemetry, with what is outside its limits."),
    "topo": ("topo", "GPU topology: NVLink/PCIe levels, affinity, P2P."),
    "doctor": ("doctor", "Pre-flight checks with remedies."),
    "apply": ("apply", "Apply a tuning profile (--dry-run: the plan)."),
    "verify": ("apply", "Compare the GPUs with the applied profile."),
    "restore": ("apply", "Put back what gpud changed."),
    "metrics": ("metrics", "Print one Prometheus exposition."),
    "probe": ("probe", "A short training run: scaling, and why."),
    "daemon": ("daemon", "Run the service (systemd)."),
    "reload": ("daemon", "Ask the daemon to read its configuration again."),
    "probe-now": ("daemon", "Ask the daemon to run its probe now."),
    "report": ("report", "Write an archive for a support ticket."),
    "ps": ("ps", "Processes on the GPUs: user, container, memory."),
    "select": ("select", "Pick idle, well-connected GPUs for a job."),
    "events": ("events", "The health journal: what happened, per GPU."),
    "burnin": ("burnin", "Accept a machine: stress, memory, bandwidth, thermal soak."),
    "tune": ("tune", "Measure which power and clock settings train best."),
    "profile": ("apply", None),
    "sim": ("sim", None),
    "health": ("health", None),
    "rules": ("rules", None),
}
_BUILT: dict[str, TyperGroup] = {}


def _commands_of(module: str) -> TyperGroup:
    """The commands ``gpud.cli.<module>`` registers, built once (typer makes each command's parameters)."""
    group = _BUILT.get(module)
    if group is None:
        sub = typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False)  # as the root app
        importlib.import_module(f"gpud.cli.{module}").register(sub)
        for info in sub.registered_commands:
            name = info.name or ""
            if name in COMMANDS and info.short_help is None:
                info.short_help = COMMANDS[name][1]
        group = _BUILT[module] = typer.main.get_group(sub)
    return group


class Commands(TyperGroup):
    """gpud's commands, each built when it is asked for: typer builds the parameters of every command it
    holds before running one (34 ms of CPU for all of gpud's, 1.5 ms for `gpud status`'s alone), and the
    modules import what their command needs (`gpud --help` and completion build them all).

    That is why the command modules import the layers their bodies call inside those bodies, the one
    exception to imports at the top: importing every command module took 0.32 s of CPU, and 0.51 s with
    the layers their bodies import (the tuner, the burn-in, the probe's runner, rich, the daemon's
    service; 2026-12-03), on each `gpud --help` and each tab completion."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        known = COMMANDS.get(cmd_name)
        return _commands_of(known[0]).get_command(ctx, cmd_name) if known is not None else None

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """As typer's, with its "Did you mean" for a misspelt command (typer looks in the commands built)."""
        try:
            return super().resolve_command(ctx, args)
        except Exception as err:  # click's UsageError (vendored by typer 0.26 on, click's own before)
            message = getattr(err, "message", None)
            if isinstance(message, str) and args and "Did you mean" not in message:
                if matches := difflib.get_close_matches(args[0], list(COMMANDS)):
                    usage: Any = err
                    usage.message = f"{message.rstrip('.')}. Did you mean {', '.join(repr(m) for m in matches)}?"
            raise


app = typer.Typer(
    name="gpud",
    cls=Commands,
    help="Keeps multi-GPU deep-learning workstations fast and healthy.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion, --show-completion (bash, zsh, fish)
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},  # every subcommand inherits -h
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpud {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool | None, typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Colour even through a pipe, or "
                                               "never (default: on a terminal unless NO_COLOR is set); "
                                               "accepted after the command too.")] = None,
) -> None:
    from gpud.cli.output import set_colour, set_debug

    if debug:
        set_debug(True)
    if color is not None:
        set_colour(color)


def main(argv: list[str] | None = None) -> None:
    """The console script; ``argv`` for tests that run the CLI in-process."""
    from gpud.cli.output import debug_enabled, guard_streams, set_colour

    guard_streams()
    set_colour(None)  # each run decides anew (tests run several in one process)
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)
    for i in reversed(range(end)):  # `gpud status --no-color` as gpustat takes it, not only `gpud --no-color status`
        if args[i] in ("--color", "--no-color"):
            set_colour(args.pop(i) == "--color")
    try:
        app(args=args, prog_name="gpud")
    except GpudError as err:
        if debug_enabled():
            traceback.print_exc()
        from gpud.cli.output import echo_err

        remedy = f" — remedy: {err.remedy}" if err.remedy else ""
        echo_err(f"gpud: error: {err}{remedy}")  # wrapped between words at a terminal, one line in a pipe
        sys.exit(2 if isinstance(err, InvalidInput) else 1)
    except KeyboardInterrupt:
        sys.exit(130)
