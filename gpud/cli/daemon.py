"""``gpud daemon``: run the service (usually under systemd: systemd/gpud.service)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpud.cli.common import Simulate, machine


def daemon(
    simulate: Simulate = None,
    config: Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml")] = None,
    listen: Annotated[str | None, typer.Option("--listen", metavar="HOST:PORT",
                                                  help="HTTP address (default :10909)")] = None,
    interval: Annotated[float | None, typer.Option("--interval", help="Seconds per tick (default 1)")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
) -> None:
    """Run the daemon: fan control, profile enforcement, scheduled checks, Prometheus exporter."""
    from dataclasses import replace

    from gpud import config as cfg
    from gpud import logs
    from gpud.daemon.service import run

    logs.setup(log_level.upper())
    conf = cfg.load(config)
    overrides: dict[str, object] = {}
    if listen is not None:
        cfg.parse_listen(listen)
        overrides["listen"] = listen
    if interval is not None:
        overrides["interval_seconds"] = interval
    if overrides:
        conf = replace(conf, daemon={**conf.daemon, **overrides})
    raise typer.Exit(run(machine(simulate), conf, config))


def register(app: typer.Typer) -> None:
    app.command("daemon")(daemon)
