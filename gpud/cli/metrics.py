"""``gpud metrics``: one Prometheus exposition of this machine, then exit."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gpud.cli.common import Simulate, machine


def metrics(simulate: Simulate = None,
            config: Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml")] = None
            ) -> None:
    """Print the metrics the daemon exports (telemetry, checks, tuning, probe) once."""
    from gpud import config as cfg
    from gpud.exporter import exposition
    from gpud.observe import observe

    conf = cfg.load(config)
    m = machine(simulate)
    sys.stdout.write(exposition(observe(m, conf, snapshot=m.snapshot(pcie=True))).decode())


def register(app: typer.Typer) -> None:
    app.command("metrics")(metrics)
