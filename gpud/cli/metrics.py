"""``gpud metrics``: one Prometheus exposition of this machine, then exit."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gpud import config as cfg
from gpud.cli.common import Simulate, machine
from gpud.exporter import exposition
from gpud.observe import observe
from gpud.paths import daemon_running


def metrics(simulate: Simulate = None,
            config: Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml")] = None
            ) -> None:
    """Print the metrics the daemon exports (telemetry, checks, tuning, probe) once."""

    conf = cfg.load(config)
    m = machine(simulate)
    # With a daemon driving the fans, their curves are compared as the daemon compares them, so
    # gpud_profile_drift says the same here as on the daemon's /metrics.
    daemon = daemon_running(conf.daemon.socket)
    sys.stdout.write(exposition(observe(m, conf, snapshot=m.snapshot(pcie=True), daemon_fans=daemon)).decode())


def register(app: typer.Typer) -> None:
    app.command("metrics")(metrics)
