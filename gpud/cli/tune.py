"""``gpud profile``, ``gpud apply``, ``gpud verify``, ``gpud restore``."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpud.cli.common import Json, Simulate, machine
from gpud.cli.output import emit_json, table

profile_app = typer.Typer(help="Tuning profiles: list them, show one resolved.", no_args_is_help=True)


def _show(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:.0f} W"
    if isinstance(v, list):
        return ",".join(map(str, v))
    if isinstance(v, dict):
        return "/".join(sorted(set(map(str, v.values()))))
    return str(v)


@profile_app.command("list")
def profile_list(json: Json = False) -> None:
    """Profiles: /etc/gpud/profiles first, then the shipped ones."""
    from gpud.tuning.profile import available, load

    rows = []
    for name, path in available():
        try:
            desc = load(str(path)).description
        except Exception as err:  # noqa: BLE001 - list the others, say why this one is broken
            desc = f"INVALID: {err}"
        rows.append({"name": name, "path": str(path), "description": desc})
    if json:
        emit_json(rows)
    else:
        table(["Profile", "Description", "File"], [[r["name"], r["description"], r["path"]] for r in rows])


@profile_app.command("show")
def profile_show(name: Annotated[str, typer.Argument(help="Profile name or path.")], json: Json = False,
                 simulate: Simulate = None) -> None:
    """A profile after inheritance; with --simulate (or on a GPU machine) resolved per GPU."""
    from gpud.errors import GpudError
    from gpud.tuning.profile import load, resolve

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
            "host": p.host, "resolved": {str(k): v for k, v in (resolved or {}).items()}}
    if json:
        emit_json(data)
        return
    out = [f"{p.name}: {p.description}", f"  file: {p.source}", f"  inherits: {' → '.join(p.chain)}"]
    if resolved is None:
        out.append(f"  {resolved_note}")
    for gpu, settings in sorted((resolved or {}).items()):
        for k, v in settings.items():
            if k != "required":
                out.append(f"  GPU{gpu}  {k:<20} {_describe(k, v)}")
    for k, v in p.host.items():
        out.append(f"  host  {k:<20} {v}")
    sys.stdout.write("\n".join(out) + "\n")


def _describe(key: str, v: Any) -> str:
    if key == "fan" and isinstance(v, dict):
        if v["mode"] == "curve":
            pts = " ".join(f"{t}°C→{d}%" for t, d in v["points"])
            return f"curve {pts} (hysteresis {v['hysteresis']} °C, minimum {v['minimum']} %, ramp {v['max_ramp']} %/s)"
        return f"fixed {v['percent']} %" if v["mode"] == "fixed" else "auto"
    return _show(v)


def _plan_rows(changes: list[Any]) -> list[list[str]]:
    rows = []
    for c in changes:
        action = {"set": "change", "none": "ok", "skip": "skip", "daemon": "daemon"}[c.action]
        rows.append(["host" if c.gpu is None else f"GPU{c.gpu}", c.setting, _show(c.current), _show(c.desired),
                     action + (f": {c.note}" if c.note else "")])
    return rows


def apply(
    profile: Annotated[str, typer.Argument(help="Profile name (see `gpud profile list`) or path to a TOML file.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the plan; write nothing.")] = False,
    json: Json = False,
    simulate: Simulate = None,
) -> None:
    """Apply a tuning profile: plan, save originals, write, read back; roll back on any failure."""
    from gpud.paths import daemon_running
    from gpud.tuning import engine
    from gpud.tuning.profile import load

    p = load(profile)  # invalid → exit 2 before anything is read or written
    m = machine(simulate)
    daemon = daemon_running()
    changes, desired = engine.plan(m, p, daemon=daemon)
    todo = [c for c in changes if c.action == "set"]
    result: dict[str, Any] = {"profile": p.name, "source": p.source, "dry_run": dry_run, "plan": [
        {"gpu": c.gpu, "setting": c.setting, "current": c.current, "desired": c.desired, "action": c.action,
         "note": c.note} for c in changes]}
    if not json:
        table(["GPU", "Setting", "Current", "Desired", "Action"], _plan_rows(changes),
              title=f"Profile {p.name} ({' → '.join(p.chain)}): {len(todo)} change(s)")
        if any(c.action == "daemon" and c.setting == "fan" for c in changes) and not daemon:
            sys.stdout.write("Fan curves need the gpud daemon (`systemctl start gpud`): the fans stay on the "
                             "driver's automatic policy until it runs.\n")
    if dry_run:
        if json:
            emit_json(result)
        return
    host_before = m.host.cpu_governors()
    out = engine.apply(m, p, changes, desired, host_before)
    result |= {"applied": out.ok, "error": out.error, "rolled_back": out.rolled_back,
               "not_restored": out.not_restored, "written": len(out.written)}
    if json:
        emit_json(result)
    elif out.ok:
        sys.stdout.write(f"applied {p.name}: {len(out.written)} setting(s) written and read back\n")
    else:
        lines = [f"gpud: apply failed: {out.error}"]
        lines += [f"  rolled back: {r}" for r in out.rolled_back]
        lines += [f"  NOT restored: {r}" for r in out.not_restored]
        sys.stderr.write("\n".join(lines) + "\n")
    if not out.ok:
        raise typer.Exit(1)


def verify(json: Json = False, simulate: Simulate = None) -> None:
    """Compare the GPUs with the applied profile; exit 1 on drift."""
    from gpud.paths import daemon_running
    from gpud.tuning import engine

    data, drifts = engine.verify(machine(simulate), daemon=daemon_running())
    bad = [d for d in drifts if d.status == "drift"]
    if json:
        emit_json({"profile": data.get("profile") if data else None, "drift": len(bad), "settings": [
            {"gpu": d.gpu, "setting": d.setting, "current": d.current, "desired": d.desired, "status": d.status}
            for d in drifts]})
    elif data is None:
        sys.stdout.write("no profile applied\n")
    else:
        table(["GPU", "Setting", "Current", "Desired", "Status"],
              [["host" if d.gpu is None else f"GPU{d.gpu}", d.setting, _show(d.current), _describe(d.setting, d.desired)
                if isinstance(d.desired, dict) else _show(d.desired), d.status] for d in drifts],
              title=f"Profile {data.get('profile')}: {len(bad)} drifted setting(s)")
    if bad:
        raise typer.Exit(1)


def restore(
    fans_only: Annotated[bool, typer.Option("--fans-only", help="Only hand the fans back to the driver.")] = False,
    json: Json = False,
    simulate: Simulate = None,
) -> None:
    """Put back what gpud changed: fans automatic, clocks reset, power, persistence, governor."""
    from gpud.tuning import engine

    done, failed = engine.restore(machine(simulate), fans_only=fans_only)
    if json:
        emit_json({"restored": done, "failed": failed})
    else:
        for line in done:
            sys.stdout.write(f"restored {line}\n")
        for line in failed:
            sys.stderr.write(f"gpud: could not restore {line}\n")
        if not done and not failed:
            sys.stdout.write("nothing to restore\n")
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
    app.command("apply")(apply)
    app.command("verify")(verify)
    app.command("restore")(restore)
