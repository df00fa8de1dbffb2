"""``gpud events``: what happened to the GPUs, from the health journal (read without the daemon), and a
per-GPU dossier for a return (RMA) request."""

from __future__ import annotations

import re
import sys
import time
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from gpud import journal
from gpud.cli import complete
from gpud.cli.common import GpuIds, Json, Simulate, emit_document, gpu_ids, local_host
from gpud.cli.output import clean, cut, echo_wrapped, table
from gpud.doctor.xid import repeated_hardware_xids
from gpud.errors import InvalidInput

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``10m``, ``2h``, ``7d``, ``1w`` (or a plain number of seconds)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw]?)", text.strip())
    if m and float(m.group(1)) * UNITS[m.group(2) or "s"] > 1e10:
        m = None  # more than three centuries: not a duration anyone means
    if not m:
        raise InvalidInput("--since", "", f"not a duration: {text!r} (e.g. 90s, 10m, 2h, 7d)")
    return float(m.group(1)) * UNITS[m.group(2) or "s"]


def _when(ts: Any) -> str:
    """A journal time for people; "?" for one that is not a time (a row written by hand)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _dossier_line(text: str, first: str = "  ") -> None:
    """A line of the dossier: data cleaned and cut at 1000 characters, wrapped between words (a serial
    number or a UUID is never split across lines)."""
    echo_wrapped(cut(clean(text), 1000), indent=first + "    ", first=first)


def _warn(problems: list[str]) -> None:
    for p in problems:
        print(f"gpud: warning: health journal: {p}", file=sys.stderr)


def dossier(which: str, problems: list[str] | None = None) -> dict[str, Any]:
    """Everything the journal knows about one GPU (index, UUID or serial): identity, Xids (with the
    raw kernel lines), ECC and row-remap history, lost/back, probe results, repeats across boots."""

    known = journal.gpus()
    match = [g for g in known if which in (str(g["gpu"]), g["uuid"], g["serial"])]
    if not match:
        raise InvalidInput("--dossier", "", f"no GPU {which!r} in the journal (index, UUID or serial)")
    g = max(match, key=lambda x: x["last_seen"] or 0)
    evs = journal.events(uuid=g["uuid"], problems=problems)
    probe = [e for e in journal.events(kinds=("probe",))]
    repeats = [{"xid": x, "boots": n} for u, x, n in repeated_hardware_xids(evs) if u == g["uuid"]]
    return {"gpu": g, "boots_with_events": len({e.boot_id for e in evs if e.boot_id}),
            "xids": [{"when": e.ts, "boot_id": e.boot_id, **e.data} for e in evs if e.kind == "xid"],
            "ecc": [{"when": e.ts, **e.data} for e in evs if e.kind == "ecc"],
            "lost": [{"when": e.ts, "kind": e.kind, "summary": e.summary} for e in evs
                     if e.kind in ("gpu_lost", "gpu_back")],
            "probe": [{"when": e.ts, "summary": e.summary, **e.data} for e in probe],
            "repeated_hardware_xids": repeats,
            "verdict": ("inspect the hardware: the same hardware Xid in more than one boot" if repeats
                        else "no hardware Xid repeated across boots")}


def events(
    since: Annotated[str | None, typer.Option("--since", metavar="DURATION", help="Only the last 10m, 2h, 7d…")] = None,
    gpu: Annotated[int | None, typer.Option("--gpu", metavar="N", help="Only this GPU (index).")] = None,
    kind: Annotated[list[str] | None, typer.Option("--kind", metavar="K", autocompletion=complete.event_kinds,
                                                   help="Only this kind (repeatable): "
                                                   "xid, gpu_lost, gpu_back, fan_failsafe, throttle, check, "
                                                   "profile_*, probe, ecc, reboot, journal_reset.")] = None,
    ids: GpuIds = None,
    dossier_of: Annotated[str | None, typer.Option("--dossier", metavar="GPU", help="A GPU's history for a return "
                                                   "(RMA) request: index, UUID or serial.")] = None,
    json: Json = False,
    simulate: Simulate = None,
) -> None:
    """What happened to the GPUs: Xids, lost GPUs, fan failsafes, throttling, check changes, profile
    changes, probe results, reboots — from the health journal the daemon keeps, across reboots.
    With --simulate: the journal a daemon over that simulated workstation keeps (in the same state
    directory: GPUD_STATE_DIR)."""

    problems: list[str] = []
    if since is not None:
        parse_duration(since)  # "" and garbage are refused before anything is read
    kinds = tuple(kind or ())
    for k in kinds:
        if k not in journal.KINDS:
            raise InvalidInput("--kind", "", f"unknown kind {k!r} (known: {', '.join(journal.KINDS)})")
    if not journal.journal_path().exists():
        if dossier_of is not None:
            raise InvalidInput("--dossier", "", f"no GPU {dossier_of!r} in the journal: no events yet")
        if json:
            emit_document("events", local_host(), events=[])
        else:
            print(f"no events yet: the gpud daemon writes them to {journal.journal_path()} while it runs "
                  "(`systemctl start gpud`, or `gpud daemon`)")
        return
    if dossier_of is not None:
        d = dossier(dossier_of, problems)
        _warn(problems)
        if json:
            emit_document("dossier", local_host(), **d)
            return
        g = d["gpu"]
        _dossier_line(f"GPU {g['gpu']} {g['name']}, UUID {g['uuid']}, serial {g['serial']}, VBIOS {g['vbios']}, "
                      f"bus {g['pci_bus_id']}", "")
        _dossier_line(f"seen {_when(g['first_seen'])} .. {_when(g['last_seen'])}; events in "
                      f"{d['boots_with_events']} boot(s)", "")
        for x in d["xids"]:
            _dossier_line(f"{_when(x['when'])}  Xid {x.get('xid')}  boot {str(x['boot_id'])[:8]}  {x.get('line', '')}")
        for e in d["ecc"]:
            counts = ", ".join(f"{k}={v}" for k, v in e.items() if k != "when")
            _dossier_line(f"{_when(e['when'])}  ECC/rows  {counts}")
        for e in d["lost"]:
            _dossier_line(f"{_when(e['when'])}  {e['summary']}")
        for e in d["probe"]:
            _dossier_line(f"{_when(e['when'])}  probe: {e['summary']}")
        print(f"verdict: {d['verdict']}")
        return
    start = time.time() - parse_duration(since) if since is not None else None
    evs = journal.events(since=start, gpu=gpu, kinds=kinds, problems=problems)
    _warn(problems)
    if ids is not None:  # the GPUs the journal has seen, as -i names them (index, UUID, bus id)
        known = [SimpleNamespace(index=g["gpu"], uuid=g["uuid"], pci_bus_id=g["pci_bus_id"]) for g in journal.gpus()]
        picked = gpu_ids(ids, known) or set()
        uuids = {g.uuid for g in known if g.index in picked}
        evs = [e for e in evs if e.uuid in uuids or (e.uuid is None and e.gpu in picked)]
    if json:
        emit_document("events", local_host(), events=[
            {"id": e.id, "time": e.ts, "boot_id": e.boot_id, "kind": e.kind, "gpu": e.gpu, "uuid": e.uuid,
             "serial": e.serial, "summary": e.summary, "data": e.data} for e in evs])
        return
    table(["Time", "Boot", "Kind", "GPU", "What"],
          [[_when(e.ts), clean((e.boot_id or "")[:8]), clean(e.kind), "" if e.gpu is None else str(e.gpu),
            clean(str(e.summary))] for e in evs], title=f"{len(evs)} event(s)")
    for uuid, xid, n in repeated_hardware_xids(evs):
        print(f"Xid {xid} on {uuid} in {n} boots: inspect the hardware (`gpud events --dossier {uuid}`)")


def register(app: Any) -> None:
    app.command("events")(events)
