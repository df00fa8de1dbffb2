"""``gpud profile``, ``gpud apply``, ``gpud verify``, ``gpud restore``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpud.cli import complete
from gpud.cli.common import Json, Simulate, emit_document, local_host, machine, machine_host
from gpud.cli.output import clean, echo_wrapped, plural, table, table_lines, wrap
from gpud.errors import GpudError, InvalidInput
from gpud.text import ranges

if TYPE_CHECKING:
    from gpud.profiles.session import ApplyResult, DaemonSession, LocalSession

Config = Annotated[str | None, typer.Option("--config", metavar="PATH",
                                            help="gpud.toml (its [daemon] socket is where the daemon listens)")]

profile_app = typer.Typer(help="Tuning profiles: list them, show one resolved.", no_args_is_help=True)


def _shown(key: str, v: Any) -> str:
    """Setting ``key``'s value as its tunable shows it (``Setting.shown``)."""
    from gpud.profiles.settings import shown

    return shown(key, v)


@profile_app.command("list")
def profile_list(json: Json = False) -> None:
    """Profiles: /etc/gpud/profiles first, then the shipped ones."""
    from gpud.profiles.profile import available, load

    rows = []
    for name, path in available():
        try:
            desc = load(str(path)).description
        except Exception as err:  # noqa: BLE001 - list the others, say why this one is broken
            desc = f"INVALID: {err}"
        rows.append({"name": name, "path": str(path), "description": desc})
    if json:
        emit_document("profile_list", local_host(), profiles=rows)
    else:  # shipped profiles are named "shipped" (their path is an installation detail), users' by path
        from gpud.profiles.profile import SHIPPED

        table(["Profile", "Description", "File"],
              [[clean(r["name"]), clean(r["description"]),
                "shipped" if Path(r["path"]).parent == SHIPPED else clean(r["path"])]
               for r in rows])


@profile_app.command("show")
def profile_show(name: Annotated[str, typer.Argument(help="Profile name or path.", autocompletion=complete.profiles)],
                 json: Json = False,
                 simulate: Simulate = None) -> None:
    """A profile after inheritance; with --simulate (or on a GPU machine) resolved per GPU."""
    from gpud.profiles.profile import load, resolve

    p = load(name)
    resolved = None
    try:
        m = machine(simulate)
        snap = m.snapshot()
        resolved = resolve(p, list(snap.gpus))
    except GpudError as err:
        if simulate:
            raise
        resolved_note = f"(not resolved per GPU: {err})"
    data = {"name": p.name, "source": p.source, "chain": list(p.chain), "description": p.description,
            "all": p.all, "gpus": [{k: v for k, v in g.items() if not k.startswith("_")} for g in p.gpus],
            "host_settings": p.host, "resolved": {str(k): v for k, v in (resolved or {}).items()}}
    if json:
        emit_document("profile", machine_host(m) if resolved is not None else local_host(), **data)
        return
    out = [clean(line) for line in (f"{p.name}: {p.description}", f"  file: {p.source}",
                                    f"  inherits: {' → '.join(p.chain)}")]
    out = [x for line in out for x in wrap(line, indent="    ")]
    if resolved is None:
        out += wrap(resolved_note, indent="    ", first="  ")
    rows = [[f"GPU{gpu}", k, _shown(k, v)] for gpu, settings in sorted((resolved or {}).items())
            for k, v in settings.items() if k != "required"]
    rows += [["host", k, str(v)] for k, v in p.host.items()]
    if rows:
        out += table_lines(["", "Setting", "Value"], rows)
    sys.stdout.write("\n".join(out) + "\n")


# The one vocabulary of plan actions, in text, JSON and docs/profiles.md (the engine's own words: set, none).
ACTIONS = {"set": "change", "none": "ok", "skip": "skip", "daemon": "daemon"}


def _public(result: dict[str, Any]) -> dict[str, Any]:
    """The apply result with plan actions in the documented vocabulary (change, ok, skip, daemon)."""
    out = dict(result)
    for key in ("plan", "skipped"):
        if isinstance(out.get(key), list):
            out[key] = [{**c, "action": ACTIONS.get(c.get("action"), c.get("action"))} for c in out[key]]
    return out


def _plan_rows(plan: list[dict[str, Any]]) -> list[list[str]]:
    """One row per setting and outcome, the GPUs it holds for grouped as doctor groups them (GPU0-3)."""

    groups: dict[tuple[str, ...], list[int]] = {}
    hosts: list[tuple[str, ...]] = []
    for c in plan:
        action = ACTIONS[c["action"]]
        key = tuple(clean(str(k)) for k in (c["setting"], _shown(c["setting"], c["current"]),
                                            _shown(c["setting"], c["desired"]),
                                            action + (f": {c['note']}" if c["note"] else "")))
        if c["gpu"] is None:
            hosts.append(key)
        else:
            groups.setdefault(key, []).append(int(c["gpu"]))
    rows = [[f"GPU{ranges(sorted(gpus))}", *key] for key, gpus in groups.items()]
    return rows + [["host", *key] for key in hosts]


class Target:
    """The machine a tuning command acts on, opened once, and the daemon that drives it (if any)."""

    def __init__(self, simulate: str | None, config: str | None) -> None:
        from gpud import config as cfg
        from gpud.paths import control_socket

        self.simulate = simulate
        conf = cfg.load(config)  # invalid → exit 2 before anything is read or written
        self.socket = control_socket(conf.daemon.socket)
        self.group = conf.daemon.socket_group
        self._machine: Any = None

    @property
    def machine(self) -> Any:
        if self._machine is None:
            self._machine = machine(self.simulate)
        return self._machine

    @property
    def name(self) -> str:
        from gpud.profiles.engine import target

        return target(self.machine)

    def daemon_session(self) -> DaemonSession | None:
        """The running daemon's session, or None when no daemon drives this machine (act directly)."""
        from gpud.daemon.control import request
        from gpud.profiles.session import DaemonSession

        ping = request(self.socket, "ping", timeout=10)
        if ping is None:
            return None
        theirs = ping.get("target")
        if theirs is not None and theirs != self.name:
            # Never act through a daemon driving other GPUs: act here (the tuning lock then tells
            # whether that daemon's state is in the way).
            sys.stderr.write(f"gpud: the daemon on {self.socket} drives {theirs}, not {self.name}: "
                             "acting directly\n")
            return None
        return DaemonSession(self.ask, theirs or self.name)

    def ask(self, cmd: str, **args: Any) -> dict[str, Any] | None:
        """One request to the daemon (None: it did not answer); its InvalidInput raised as it raised it."""
        from gpud.daemon.control import request

        reply = request(self.socket, cmd, **args)
        if reply is not None and reply.get("invalid"):
            raise _invalid(reply)
        return reply

    def local(self) -> LocalSession:
        """The engine on this machine, from this process (the caller takes the tuning lock to write)."""
        from gpud.profiles.session import LocalSession

        return LocalSession(self.machine)


def _invalid(reply: dict[str, Any]) -> InvalidInput:
    """The daemon's InvalidInput as it raised it: its file, key and reason (a daemon older than the client
    sends ``invalid: true`` and the message alone, taken apart at its first two ": ")."""
    parts = reply["invalid"]
    if isinstance(parts, dict) and all(isinstance(parts.get(k), str) for k in ("file", "key", "reason")):
        return InvalidInput(parts["file"], parts["key"], parts["reason"])
    file, _, rest = str(reply["error"]).partition(": ")
    key, _, reason = rest.partition(": ")
    return InvalidInput(file, key if reason else "", reason or key)


# NVML's words for NVML_ERROR_NO_PERMISSION (nvmlErrorString), and EACCES's for a host file.
DENIED = ("Insufficient Permissions", "Permission denied")


def _denied(text: Any) -> bool:
    return any(d in str(text or "") for d in DENIED)


def need_root(command: str, t: Target) -> Any:
    """The one line for a write refused for lack of privileges, with the two ways to have them."""
    err = GpudError(f"{command} needs root: the first write was refused, nothing was changed")
    err.remedy = (f"run it with sudo, or start the gpud daemon (`sudo systemctl start gpud`) and let it act: "
                  f"members of the group {t.group!r} may use its socket {t.socket} "
                  f"(`sudo usermod -aG {t.group} $USER`, then log in again)")
    return err


def tuning_lock(role: str) -> Any:
    """The machine-wide tuning lock, waited for a while (another job's apply), never for a daemon."""
    from gpud.paths import LockBusy, TuningLock

    lock = TuningLock(role)
    try:
        lock.acquire(wait=120.0)
    except LockBusy as busy:
        err = GpudError(f"another gpud holds the tuning lock ({busy.holder}): refusing to tune at the same time")
        err.remedy = ("use the daemon's control socket (GPUD_SOCKET or [daemon] socket), stop it, or give this "
                      "command its own GPUD_STATE_DIR" if busy.holder.endswith("daemon")
                      else "wait for it to finish and try again")
        raise err from None
    return lock


def apply(
    profile: Annotated[str | None, typer.Argument(help="Profile name (see `gpud profile list`) or path to a TOML "
                                                       "file.", autocompletion=complete.profiles)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan; write nothing.")] = False,
    rules: Annotated[bool, typer.Option("--rules", help="Hand the GPUs back to the daemon's [[rules]] (paused by a "
                                                        "profile applied by hand), PROFILE (or the configured "
                                                        "one) as the base.")] = False,
    json: Json = False,
    simulate: Simulate = None,
    config: Config = None,
) -> None:
    """Apply a tuning profile: plan, save originals, write, read back; roll back on any failure.

    With the daemon running, the daemon applies it (and drives the fan curves); a profile applied by
    hand pauses the daemon's [[rules]] until `gpud restore` or `gpud apply --rules`.
    """

    t = Target(simulate, config)
    where = os.path.abspath(profile) if profile is not None and "/" in profile else profile
    if rules and dry_run:
        raise InvalidInput("--rules", "", "cannot be combined with --dry-run")
    if not rules and profile is None:
        raise InvalidInput("gpud apply", "PROFILE", "name a profile (`gpud profile list`), or give --rules")
    session = t.daemon_session()  # after the arguments: a usage error never reaches the socket
    if rules:
        if session is None:
            err = GpudError("the [[rules]] are the daemon's: no gpud daemon drives this machine")
            err.remedy = "start it (`systemctl start gpud`)"
            raise err
        result = session.resume_rules(where)
        if result.ok and result.profile is None:  # no base profile: nothing applied, the rules switch again
            if json:
                emit_document("apply", machine_host(t.machine), ok=True, profile=None, plan=[], written=0,
                              target=result.target, daemon=True, chain=[], dry_run=False)
            else:
                echo_wrapped(f"rules resumed on {result.target} (no base profile)")
            return
    elif session is not None:
        result = session.apply(str(where), dry_run)
    else:
        from gpud.profiles.profile import load

        assert profile is not None  # refused above without --rules
        p = load(profile)  # invalid → exit 2 before anything is read or written
        with tuning_lock("gpud apply"):
            result = t.local().apply(p, dry_run)
        if not json and not result.ok and not result.written and not result.rolled_back and _denied(result.error):
            raise need_root("gpud apply", t)  # one line, not the plan and then a refusal
    if not result.planned:  # refused before planning
        raise typer.Exit(_fail(result, json))
    doc = result.to_json()
    plan = doc["plan"] + doc.get("skipped", [])
    todo = sum(1 for c in plan if c["action"] == "set")
    if json:
        emit_document("apply", machine_host(t.machine), **_public(doc))
    else:
        table(["GPU", "Setting", "Current", "Desired", "Action"], _plan_rows(plan),
              title=f"Profile {result.profile} ({' → '.join(result.chain)}) on {result.target}: "
                    f"{plural(todo - len(result.skipped), 'change')}")
        if any(c["action"] == "daemon" and c["setting"] == "fan" for c in plan) and not result.daemon:
            echo_wrapped("Fan curves need the gpud daemon (`systemctl start gpud`): the fans stay on the "
                         "driver's automatic policy until it runs.")
        if not dry_run and result.ok:
            via = " by the gpud daemon" if result.daemon else ""
            echo_wrapped(f"applied {result.profile}{via} on {result.target}: "
                         f"{plural(result.written, 'setting')} written and read back")
        if any(c["action"] == "skip" and "persistence mode is off" in c["note"] for c in plan):
            echo_wrapped("Skipped settings the driver would forget without persistence mode: "
                         "`sudo nvidia-smi -pm 1` or enable nvidia-persistenced, then apply again.")
        for line in result.messages:
            sys.stderr.write(f"gpud: warning: {line}\n")
    if not result.ok:
        raise typer.Exit(_fail(result, json))


def _fail(result: ApplyResult, json: bool) -> int:
    if not json:
        lines = [f"gpud: apply failed: {result.error}"]
        lines += [f"  rolled back: {r}" for r in result.rolled_back]
        lines += [f"  NOT restored: {r}" for r in result.not_restored]
        sys.stderr.write("\n".join(lines) + "\n")
    elif not result.planned:
        emit_document("apply", local_host(), **result.to_json())
    return 1


def verify(
    json: Json = False,
    simulate: Simulate = None,
    config: Config = None,
    strict: Annotated[bool, typer.Option("--strict", help="Also exit 1 when a setting cannot be read back "
                                                          "(locked clocks: NVML has no getter).")] = False,
) -> None:
    """Compare the GPUs with the applied profile; exit 1 on drift (and with --strict on settings
    that cannot be read back). The summary counts both."""
    t = Target(simulate, config)
    res = (t.daemon_session() or t.local()).verify()
    bad, unread = res.drifted, res.unverifiable
    if json:
        emit_document("verify", machine_host(t.machine), profile=res.profile, drift=len(bad), unverifiable=len(unread),
                      settings=res.to_json()["settings"])
    elif not res.applied:
        sys.stdout.write("no profile applied\n")
    else:
        table(["GPU", "Setting", "Current", "Desired", "Status"],
              [["host" if d.gpu is None else f"GPU{d.gpu}", d.setting, _shown(d.setting, d.current),
                _shown(d.setting, d.desired), d.status] for d in res.settings],
              title=f"Profile {res.profile}: {plural(len(bad), 'drifted setting')}, "
                    f"{len(unread)} that cannot be read back" + (" (--strict fails on them)" if unread else ""))
    if bad or (strict and unread):
        raise typer.Exit(1)


def restore(
    fans_only: Annotated[bool, typer.Option("--fans-only", help="Only hand the fans back to the driver.")] = False,
    json: Json = False,
    simulate: Simulate = None,
    config: Config = None,
) -> None:
    """Put back what gpud changed: fans automatic, clocks reset, power, persistence, governor."""
    t = Target(simulate, config)
    session = t.daemon_session()
    if session is not None:
        res = session.restore(fans_only)
    else:
        with tuning_lock("gpud restore"):
            res = t.local().restore(fans_only)
        if not json and res.failed and not res.restored and all(_denied(f) for f in res.failed):
            raise need_root("gpud restore", t)  # one line, not one refusal per GPU and setting
    if json:
        emit_document("restore", machine_host(t.machine), restored=list(res.restored), failed=list(res.failed),
                      target=res.target)
    else:
        if res.restored or res.failed:
            sys.stdout.write(f"restoring {res.target}\n")
        for line in res.restored:
            sys.stdout.write(f"restored {line}\n")
        for line in res.failed:
            sys.stderr.write(f"gpud: could not restore {line}\n")
        if not res.restored and not res.failed:
            sys.stdout.write("nothing to restore\n")
    if res.failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
    app.command("apply")(apply)
    app.command("verify")(verify)
    app.command("restore")(restore)
