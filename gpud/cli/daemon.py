"""``gpud daemon``: run the service (usually under systemd: systemd/gpud.service)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpud.cli.common import Simulate, emit_document, local_host, machine
from gpud.cli.output import echo_err, echo_wrapped
from gpud.errors import GpudError, InvalidInput


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
        conf = conf.with_daemon(**overrides)
    from gpud.doctor import configcheck

    m = machine(simulate)
    configcheck.check(conf, len(m.host.nvidia_gpus()))  # doctor's check, and the daemon's
    raise typer.Exit(run(m, conf, config, overrides))


def _ask(cmd: str, config: str | None, json: bool) -> None:
    """Send one control-socket request to the running daemon; no daemon → one line, exit 1."""
    from gpud import config as cfg
    from gpud.daemon.control import request
    from gpud.paths import control_socket

    conf = cfg.load(config)
    sock = control_socket(conf.daemon.socket)
    reply = request(sock, cmd, timeout=60)
    if reply is None:
        err = GpudError(f"no gpud daemon listens on {sock}")
        err.remedy = "start it (`sudo systemctl start gpud`), or pass the --config naming its socket"
        raise err
    if json:
        emit_document("daemon_reply", local_host(), request=cmd, **{k: v for k, v in reply.items() if k != "host"})
    elif reply.get("ok"):
        echo_wrapped(f"gpud {cmd}: {reply.get('message', 'done')}")
    else:
        remedy = f" — remedy: {reply['remedy']}" if reply.get("remedy") else ""
        echo_err(f"gpud: error: {reply.get('error')}{remedy}")
    if not reply.get("ok"):
        raise typer.Exit(1)


Config = Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml (names the daemon's "
                                                                            "control socket)")]
JsonOut = Annotated[bool, typer.Option("--json", help="The daemon's answer as JSON.")]


def reload(config: Config = None, json: JsonOut = False) -> None:
    """Make the running daemon read its configuration again (as `systemctl reload gpud`, SIGHUP).

    An invalid file is refused and the old configuration kept (exit 1).
    """
    _ask("reload", config, json)


def probe_now(config: Config = None, json: JsonOut = False) -> None:
    """Make the running daemon start its quick probe now (the result appears in /metrics and /status)."""
    _ask("probe-now", config, json)


def register(app: typer.Typer) -> None:
    app.command("daemon")(daemon)
    app.command("reload")(reload)
    app.command("probe-now")(probe_now)
