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
    from gpud import config as cfg
    from gpud import logs
    from gpud.daemon.service import run
    from gpud.errors import InvalidInput

    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise InvalidInput("--log-level", log_level, "must be DEBUG, INFO, WARNING or ERROR")
    logs.setup(level)
    conf = cfg.load(config)
    overrides: dict[str, object] = {}
    if listen is not None:
        try:
            cfg.parse_listen(listen)
        except ValueError as err:
            raise InvalidInput("--listen", listen, str(err)) from None
        overrides["listen"] = listen
    if interval is not None:
        if not 0.05 <= interval <= 60:  # the same range as [daemon] interval_seconds (0 would spin a core)
            raise InvalidInput("--interval", str(interval), "must be 0.05..60 s")
        overrides["interval_seconds"] = interval
    if overrides:
        conf = cfg.Config(conf.path, conf.machine, conf.doctor, {**conf.daemon, **overrides}, conf.probe)
    raise typer.Exit(run(machine(simulate), conf, config, overrides))


def register(app: typer.Typer) -> None:
    app.command("daemon")(daemon)
