"""``gpud rules``: the ``[[rules]]`` of gpud.toml against the processes running now.

``gpud rules test`` reads the GPUs' processes once (as ``gpud ps``), matches every rule as the daemon
does (``gpud.profiles.rules``) and says which profile each GPU would follow, which rule wins and which
lose; nothing is written. The daemon's hold-off is not applied: this is the moment, not the history.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpud import __version__
from gpud.cli.common import Json, Simulate, host, machine
from gpud.cli.output import clean, emit_json, table_lines
from gpud.model import document

rules_app = typer.Typer(help="Profile rules: the profile each GPU follows for its jobs.",
                        no_args_is_help=True)

Config = Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml (default: GPUD_CONFIG, "
                                                                             "then /etc/gpud/gpud.toml).")]


@rules_app.command("test")
def rules_test(config: Config = None, simulate: Simulate = None, json: Json = False) -> None:
    """What the [[rules]] would apply to the processes running now (nothing is written)."""
    from gpud import config as cfg
    from gpud.daemon.rules import groups
    from gpud.doctor import configcheck
    from gpud.profiles.rules import Job, choose, matches

    conf = cfg.load(config)  # an invalid file: `file: key: reason`, exit 2
    m = machine(simulate)
    configcheck.rules_valid(conf, len(m.host.nvidia_gpus()))
    snap = m.snapshot()
    jobs = [Job(s.index, p.pid, p.user, groups(m, p.pid), p.command, p.container, p.kind)
            for s in snap.samples for p in (s.processes or ())]
    choices = choose(conf.rules, jobs)
    base = conf.daemon.profile
    processes = [{"gpu": j.gpu, "pid": j.pid, "user": j.user, "groups": list(j.groups), "command": j.command,
                  "container": j.workload, "kind": j.kind, "rules": [r.name for r in conf.rules if matches(r, j)]}
                 for j in jobs]
    gpus: list[dict[str, Any]] = []
    for s in snap.samples:
        c = choices.get(s.index)
        gpus.append({"gpu": s.index, "profile": c.rule.profile if c else base, "rule": c.rule.name if c else None,
                     "pid": c.job.pid if c else None,
                     "lost": [{"rule": r.name, "profile": r.profile, "pid": j.pid} for r, j in c.lost] if c else []})
    if json:
        emit_json(document("rules_test", __version__, host(m, snap), base=base, rules=[r.name for r in conf.rules],
                           gpus=gpus, processes=processes))
        return
    if not conf.rules:
        sys.stdout.write(f"no [[rules]] in {conf.path or 'gpud.toml (none found)'}: every GPU follows "
                         f"{base or 'no profile'}\n")
        return
    rows = []
    for g in gpus:
        c = choices.get(g["gpu"])
        why = clean(c.describe()) if c else f"{clean(base or 'no profile')} (base: no rule matches)"
        rows.append([f"GPU{g['gpu']}", why])
        for r, j in c.lost if c else ():
            rows.append(["", f"  rule {clean(r.name)} ({clean(r.profile)}; {clean(j.describe())}) loses to "
                             f"{clean(c.rule.name) if c else ''}"])
    out = table_lines(["GPU", "Profile (rule: who, process, job)"], rows,
                      title=f"{len(conf.rules)} rule(s), {len(jobs)} GPU process(es) on {clean(m.label)}")
    sys.stdout.write("\n".join(out) + "\n")


def register(app: typer.Typer) -> None:
    app.add_typer(rules_app, name="rules")
