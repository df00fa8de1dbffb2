"""``gpud report``: one archive to attach to a support ticket, redacted unless asked.

Inside (``gpud-report/``): ``status.json``, ``topo.json``, ``doctor.json`` (the documents of
docs/json.md), ``probe-history.json`` (probe documents), ``versions.json`` (gpud, driver, CUDA,
NVML, nvidia-ml-py, torch, kernel, Python), ``tuning.json`` (the applied profile, its file and the
state gpud keeps to restore it), ``daemon.log`` (the service's recent journal, where readable),
``kernel-nvidia.log`` (the kernel log's NVIDIA lines since boot), ``MANIFEST.txt`` (what is in it,
what could not be read, and what was redacted).

Redaction (default): the host name, the user names of GPU processes and of the user running gpud,
and process command lines are replaced by ``<host>``, ``<user1>``…, ``<command>`` in every file.
``--no-redact`` keeps them.
"""

from __future__ import annotations

import getpass
import io
import json
import platform
import re
import socket
import subprocess
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer

from gpud import __version__
from gpud.cli.common import Simulate, host, machine
from gpud.cli.output import echo_wrapped, plural
from gpud.model import document, host_json, probe_document

NVIDIA_LINE = re.compile(r"NVRM|nvidia|Xid|NVLink|nvlink", re.IGNORECASE)
JOURNAL_LINES = 500


def _package(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _gather(m, config_path: str | None) -> tuple[dict[str, str], list[str]]:  # type: ignore[no-untyped-def]
    """File name → text, and notes on what could not be read."""
    from gpud import config as cfg
    from gpud.cli.status import status_document
    from gpud.cli.topo import topo_document
    from gpud.doctor import diagnose
    from gpud.probe import history
    from gpud.tuning import state

    notes: list[str] = []
    files: dict[str, str] = {}

    def dump(obj: Any) -> str:
        return json.dumps(obj, indent=2) + "\n"

    snap = m.snapshot(pcie=True)
    where = host(m, snap)
    files["status.json"] = dump(status_document(m, snap))
    files["topo.json"] = dump(topo_document(m, snap))
    conf = cfg.load(config_path)
    report = diagnose(m, conf)
    files["doctor.json"] = dump(document("doctor", __version__, report.host, checks=[
        {"id": r.id, "status": r.status, "gpu": r.gpu, "summary": r.summary, "detail": r.detail,
         "remedy": r.remedy} for r in report.checks], counts=report.counts, exit_code=report.exit_code(False)))
    files["probe-history.json"] = dump([probe_document(r, __version__, host_json(r.get("host")))
                                        for r in history.load()])
    v = snap.versions
    files["versions.json"] = dump({
        "gpud": __version__, "driver": v.driver, "cuda_driver": v.cuda_driver, "nvml": v.nvml,
        "nvidia-ml-py": _package("nvidia-ml-py"), "torch": _package("torch"), "kernel": platform.release(),
        "python": platform.python_version(), "os": platform.platform()})
    try:
        st = state.read()
    except Exception as err:  # noqa: BLE001 - an unusable state file is itself worth reporting
        st = None
        notes.append(f"tuning.json: the state file is unusable: {err}")
    files["tuning.json"] = dump({"configured_profile": conf.daemon.profile, "config_file": conf.path,
                                 "state_file": str(state.path()),
                                 "state": st.to_json() if st is not None else None})
    log = _journal()
    if log is None:
        notes.append("daemon.log: the gpud service's journal is not readable here (journalctl missing, or "
                     "run as root or a member of systemd-journal)")
    else:
        files["daemon.log"] = log
    kernel = m.host.kernel_log()
    if kernel is None:
        notes.append("kernel-nvidia.log: the kernel log is not readable (run as root, or "
                     "`sudo sysctl kernel.dmesg_restrict=0`)")
    else:
        files["kernel-nvidia.log"] = "".join(
            (f"[{secs:12.6f}] " if secs is not None else "") + line + "\n"
            for secs, line in kernel if NVIDIA_LINE.search(line))
    files["host.json"] = dump(where)
    return files, notes


def _journal() -> str | None:
    try:
        r = subprocess.run(["journalctl", "-u", "gpud", "-n", str(JOURNAL_LINES), "--no-pager", "-o", "short-iso"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    return r.stdout


def _secrets(files: dict[str, str], label: str) -> tuple[dict[str, str], list[str]]:
    """What to replace (value → placeholder), and a note for each kind."""
    status = json.loads(files["status.json"])
    users: list[str] = []
    commands: list[str] = []
    for g in status["gpus"]:
        for p in g["sample"].get("processes") or []:
            if p.get("user") and p["user"] not in users:
                users.append(p["user"])
            if p.get("command"):
                commands.append(p["command"])
    try:
        me = getpass.getuser()
    except (KeyError, OSError):
        me = None
    if me and me not in users and me not in ("root",):
        users.append(me)
    out: dict[str, str] = {c: "<command>" for c in sorted(set(commands), key=len, reverse=True)}
    hosts = {label, socket.gethostname(), socket.getfqdn()}
    hosts |= {p["host"]["name"] for p in json.loads(files["probe-history.json"]) if p["host"]["name"]}
    for name in hosts:
        if name and name not in ("localhost", "localhost.localdomain"):
            out[name] = "<host>"
    for i, u in enumerate(users, 1):
        out[u] = f"<user{i}>"
    notes = [f"redacted: host names as <host>, {plural(len(users), 'user name')} as <userN>, "
             f"{plural(len(set(commands)), 'command line')} as <command>; `gpud report --no-redact` keeps them"]
    return out, notes


def _redact(text: str, secrets: dict[str, str]) -> str:
    for value in sorted(secrets, key=len, reverse=True):
        if value.startswith("<") or not value:
            continue
        if secrets[value] == "<command>":
            text = text.replace(value, "<command>").replace(json.dumps(value)[1:-1], "<command>")
        else:  # whole words only: a user "al" must not eat "total"
            text = re.sub(rf"(?<![\w.-]){re.escape(value)}(?![\w-])", secrets[value], text)
    return text


def report(
    output: Annotated[Path | None, typer.Option("--output", "-o", metavar="PATH",
                                                 help="Archive to write (default ./gpud-report-TIME.tar.gz).")] = None,
    no_redact: Annotated[bool, typer.Option("--no-redact", help="Keep host name, user names and command "
                                                                "lines.")] = False,
    simulate: Simulate = None,
    config: Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml")] = None,
) -> None:
    """Write one archive for a support ticket: status, topology, doctor, probe history, versions,
    tuning state, the daemon's and the kernel's NVIDIA log lines. Host name, user names and command
    lines are redacted unless --no-redact.
    """
    m = machine(simulate)
    files, notes = _gather(m, config)
    if not no_redact:
        secrets, more = _secrets(files, m.label)
        files = {name: _redact(text, secrets) for name, text in files.items()}
        notes = [_redact(n, secrets) for n in notes] + more
    else:
        notes.append("not redacted (--no-redact): host name, user names and command lines are in the files")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = output or Path(f"gpud-report-{stamp}.tar.gz")
    manifest = ["gpud report", f"written {time.strftime('%Y-%m-%d %H:%M:%S %z')} by gpud {__version__}", "",
                "files:"] + [f"  {name}" for name in sorted(files)] + ["", "notes:"] + [f"  {n}" for n in notes]
    files["MANIFEST.txt"] = "\n".join(manifest) + "\n"
    try:
        with tarfile.open(target, "w:gz") as tar:
            for name, text in sorted(files.items()):
                data = text.encode()
                info = tarfile.TarInfo(f"gpud-report/{name}")
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
                tar.addfile(info, io.BytesIO(data))
    except OSError as err:
        from gpud.errors import GpudError

        e = GpudError(f"cannot write {target}: {err.strerror or err}")
        e.remedy = "choose a writable place with `--output PATH`"
        raise e from err
    sys.stdout.write(f"wrote {target} ({len(files)} files; {'not ' if no_redact else ''}redacted)\n")
    for n in notes:
        echo_wrapped(n, indent="    ", first="  ")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
