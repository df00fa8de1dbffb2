"""``gpud health``: per GPU and component, healthy / degraded / unhealthy, with a reason and a
repair action; ``gpud health set-healthy``: a person says a GPU is healthy again (gpud.doctor.health)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpud.cli.common import Json, Simulate, emit_document, gpu_ids, gpus_of, host, machine
from gpud.cli.output import clean, colour, table
from gpud.errors import GpudError, InvalidInput

if TYPE_CHECKING:
    from gpud.config import Config
    from gpud.doctor.health import Health
    from gpud.hw.machine import Machine
    from gpud.model import Snapshot

ConfigPath = Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml (its [health] "
                                                "section is the Xid policy; default /etc/gpud/gpud.toml).")]
STATE_COLOUR = {"healthy": "32", "degraded": "33", "unhealthy": "31", "unknown": "35"}
# Checks that say nothing of the machine's health (the caller's environment, processes) or take
# seconds (torch.cuda starts the training environment's Python): left out of health and the prolog.
NOT_HEALTH = ["env.cuda", "torch.cuda", "gpu.processes"]

app = typer.Typer(no_args_is_help=False, invoke_without_command=True, add_completion=False)


def states_of(m: Machine, conf: Config, snap: Snapshot | None = None,
              only: list[str] | None = None) -> tuple[Snapshot | None, tuple[Health, ...]]:
    """Doctor's checks that bear on health (none that are slow; with ``only``, those), then the states."""
    from gpud.doctor import diagnose
    from gpud.doctor import health as hl

    if snap is None:
        try:
            snap = m.snapshot()
        except GpudError:
            snap = None
    report = diagnose(m, conf, only=only, skip=NOT_HEALTH, snapshot=snap)
    return snap, hl.gather(m, conf, report.checks, snap)


def render(states: tuple[Health, ...], verbose: bool = False) -> None:
    from gpud.doctor.health import worst_of

    rows = []
    for h in states:
        if h.state == "healthy" and not verbose and h.acknowledged is None:
            continue
        rows.append([h.label, h.component, colour(h.state, STATE_COLOUR[h.state]), h.action,
                     clean(h.reason + (f" [{h.acknowledged}]" if h.acknowledged else ""))])
    gpus = sorted({h.label for h in states if h.gpu is not None}, key=int)
    for g in gpus:
        if not any(r[0] == g for r in rows):
            rows.append([g, "all", colour("healthy", "32"), "none", "no problem found"])
    rows.sort(key=lambda r: (r[0] == "host", int(r[0]) if r[0].isdigit() else 0))
    table(["GPU", "component", "state", "action", "reason"], rows,
          title=f"health: {worst_of(states)}")


@app.callback()
def health(
    ctx: typer.Context,
    simulate: Simulate = None,
    json: Json = False,
    config: ConfigPath = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Every component, the healthy ones too.")]
    = False,
) -> None:
    """Per GPU and component: healthy, degraded or unhealthy, the reason and the repair action; unknown
    where what it is judged from could not be read (no readable kernel log: the Xids).

    Exit 0 when nothing is unhealthy, 1 when something is, 2 on bad usage or an invalid gpud.toml.
    """
    if ctx.invoked_subcommand is not None:  # `gpud health --simulate X set-healthy …`: the options carry over
        ctx.obj = {"simulate": simulate, "config": config}
        return
    from gpud import config as cfg
    from gpud.doctor import health as hl

    conf = cfg.load(config)
    m = machine(simulate)
    snap, states = states_of(m, conf)
    code = 1 if hl.worst_of(states) == "unhealthy" else 0
    if json:
        emit_document("health", host(m, snap), state=hl.worst_of(states), components=hl.as_json(states),
                      exit_code=code)
    else:
        render(states, verbose)
    raise typer.Exit(code)


def invoker() -> tuple[str, int]:
    """Who runs the command: the user's name (``SUDO_USER`` named too under sudo) and uid."""
    from gpud.daemon.control import user_name

    uid = os.getuid()
    who = user_name(uid)
    sudo = os.environ.get("SUDO_USER")
    if sudo and sudo != who and uid == 0:
        who = f"{clean(sudo)[:64]} (sudo)"
    return who, uid


@app.command("set-healthy")
def set_healthy(
    ctx: typer.Context,
    gpu: Annotated[str, typer.Argument(metavar="GPU", help="Index, UUID or PCI bus id.")],
    reason: Annotated[str, typer.Option("--reason", metavar="TEXT", help="Why it is healthy again "
                                                                         "(what was repaired or checked).")],
    simulate: Simulate = None,
    json: Json = False,
    config: ConfigPath = None,
) -> None:
    """Say a GPU is healthy again: a journal entry with who and why; later states count only what
    happens after it, and a finding it acknowledged only when its reason changes.

    Through the daemon when one runs (its control socket), else written to the journal here.
    """
    from gpud import config as cfg
    from gpud.daemon.control import request
    from gpud.doctor import health as hl
    from gpud.paths import control_socket

    parent = ctx.obj if isinstance(ctx.obj, dict) else {}
    simulate, config = simulate or parent.get("simulate"), config or parent.get("config")
    text = hl.check_reason(reason)
    conf = cfg.load(config)
    m = machine(simulate)
    snap, states = states_of(m, conf)
    if snap is None:
        raise InvalidInput("GPU", gpu, "the GPUs cannot be read now, so no GPU can be named")
    picked = gpu_ids(gpu, gpus_of(snap)) or set()
    if len(picked) != 1:
        raise InvalidInput("GPU", gpu, "name one GPU")
    index = picked.pop()
    uuid = next(s.uuid for s in snap.samples if s.index == index)
    who, uid = invoker()
    reply = request(control_socket(conf.daemon.socket), "set-healthy", timeout=30, gpu=uuid, reason=text)
    via = "daemon"
    if reply is None:  # no daemon: the journal directly
        via = "journal"
        summary, data = hl.set_healthy_entry(states, index, who, uid, text)
        _record(summary, data, index, uuid, m.host.boot_id())
    elif not reply.get("ok"):
        sys.stderr.write(f"gpud: {reply.get('error')}\n")
        raise typer.Exit(1)
    else:
        summary = str(reply.get("summary", ""))
    if json:
        emit_document("health", host(m, snap), state="healthy", set_healthy={"gpu": index, "uuid": uuid,
                                                                            "via": via, "summary": summary},
                      components=[], exit_code=0)
    else:
        sys.stdout.write(clean(summary) + "\n")


def _record(summary: str, data: dict[str, Any], index: int, uuid: str, boot_id: str | None) -> None:
    from gpud.journal import Journal

    j = Journal(busy_wait_s=2.0)
    try:
        if j.db is None or not j.record("set_healthy", summary, gpu=index, uuid=uuid, boot_id=boot_id, data=data):
            raise GpudError(f"the health journal {j.path} could not be written: the entry was not kept")
    finally:
        j.close()


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="health", help="Health per GPU and component, with repair actions; set-healthy.",
                   short_help="Health states per GPU, with repair actions.")
