"""``gpud report``: one archive to attach to a support ticket, redacted unless asked.

Inside (``gpud-report/``): ``status.json``, ``topo.json``, ``doctor.json`` (the documents of
docs/json.md), ``probe-history.json`` (probe documents), ``versions.json`` (gpud, driver, CUDA,
NVML, nvidia-ml-py, torch, kernel, Python), ``tuning.json`` (the applied profile, its file and the
state gpud keeps to restore it), ``daemon.log`` (the service's recent journal, where readable),
``kernel-nvidia.log`` (the kernel log's NVIDIA lines since boot), ``MANIFEST.txt`` (what is in it,
what could not be read, and what was redacted).

``events.json`` (the health journal) and ``dossiers.json`` (each GPU's history, as ``gpud events
--dossier``) when the daemon has kept a journal.

Redaction (default): the names and ids found on the machine — host names, user names (GPU processes,
the machine's accounts, the user running gpud), container, pod, Slurm job and systemd unit ids,
process command lines and the scripts they run, process names in kernel lines — are replaced by
``<host>``, ``<user1>``, ``<container1>``… wherever they stand in any file, inside words too (a
profile named ``alice-quiet``). ``--no-redact`` keeps them. A JSON file is redacted value by value
(every string and every key, parsed and written again), a text file line by line: whatever a
command line holds (``":``, a backslash, a line break), every file still parses as it did.
"""

from __future__ import annotations

import getpass
import io
import json
import os
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
from gpud.errors import GpudError
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
    from gpud.profiles import state

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
    _journal_files(files, notes)
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


def _passwd_users(m) -> list[str]:  # type: ignore[no-untyped-def]
    """The machine's people: /etc/passwd accounts with a user id from 1000 (not nobody)."""
    out: list[str] = []
    for line in (m.host.read("/etc/passwd") or "").splitlines():
        parts = line.split(":")
        if len(parts) > 3 and parts[2].isdigit() and 1000 <= int(parts[2]) < 60000 and parts[0]:
            out.append(parts[0])
    return out


def _script_names(command: str) -> list[str]:
    """The file names a command line runs (``train_resnet.py``, ``/home/x/run.sh`` → ``run.sh``) and
    their 15-character kernel names (what an Xid line's ``name=`` shows)."""
    out: list[str] = []
    for token in command.split():
        base = token.rstrip("/").rsplit("/", 1)[-1]
        if ("." in base or "/" in token) and len(base) >= 3 and not token.startswith("-"):
            out += [base, base[:15]]
    return out


def _secrets(m, files: dict[str, str], label: str) -> tuple[dict[str, str], list[str]]:  # type: ignore[no-untyped-def]
    """What to replace (value → placeholder), and a note for each kind: the names and ids found on the
    machine (users, hosts, containers, pods, Slurm jobs, systemd units, command lines and the scripts
    they run), replaced wherever they stand in any file, inside words too (a profile ``alice-quiet``)."""
    status = json.loads(files["status.json"])
    users: list[str] = []
    commands: list[str] = []
    places: dict[str, list[str]] = {"container": [], "pod": [], "job": [], "unit": []}
    kinds = {"docker": "container", "podman": "container", "pod": "pod", "slurm": "job", "unit": "unit",
             "user-unit": "unit"}  # a unit a user named in their own systemd manager (gpud.procinfo)
    for g in status["gpus"]:
        for p in (g.get("sample") or {}).get("processes") or []:
            if p.get("user") and p["user"] not in users:
                users.append(p["user"])
            if p.get("command"):
                commands.append(p["command"])
            runtime, _, ident = str(p.get("container") or "").partition(":")
            if runtime in kinds and ident and ident not in places[kinds[runtime]]:
                places[kinds[runtime]].append(ident)
    try:
        me = getpass.getuser()
    except (KeyError, OSError):
        me = None
    for u in [*_passwd_users(m), me]:
        if u and u not in users and u != "root":
            users.append(u)
    out: dict[str, str] = {c: "<command>" for c in sorted(set(commands), key=len, reverse=True)}
    for c in commands:
        for name in _script_names(c):
            out.setdefault(name, "<script>")
    hosts = {label, socket.gethostname(), socket.getfqdn()}
    hosts |= {p["host"]["name"] for p in json.loads(files["probe-history.json"]) if p["host"]["name"]}
    hosts |= {h.split(".")[0] for h in hosts if h}
    for name in hosts:
        if name and name not in ("localhost", "localhost.localdomain"):
            out[name] = "<host>"
    for kind, idents in places.items():
        for i, ident in enumerate(idents, 1):
            out[ident] = f"<{kind}{i}>"
    for i, u in enumerate(users, 1):
        out[u] = f"<user{i}>"
    short = [u for u in users if len(u) < 2]
    notes = [f"redacted: host names as <host>, {plural(len(users), 'user name')} as <userN>, "
             f"{plural(len(set(commands)), 'command line')} as <command> (and the scripts they run as <script>), "
             f"container, pod, Slurm job and unit ids as <containerN>, <podN>, <jobN>, <unitN>, process names in "
             "kernel lines as <process>; `gpud report --no-redact` keeps them"]
    if short:
        notes.append(f"{plural(len(short), 'one-letter user name')} could not be told from text and "
                     "were not redacted")
    return out, notes


_KERNEL_NAME = r"(?<=\bname=)[^,\s]+"  # an Xid line's process name: "pid=4242, name=python, …"


def _forms(value: str) -> list[str]:
    """A command line as it stands in a value, and escaped as JSON or Python would print it inside a
    text (a log line that quotes it): each of them, longest first, none with a line break of its own."""
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1]}
    return sorted(forms, key=len, reverse=True)


class _Redactor:
    """The secrets as one pattern, applied in one pass: what one replacement wrote (``<user1>``) is
    never read again by another (a user named ``user1``, a host named ``command``), and a placeholder
    holds no character that could end a line or a JSON string."""

    def __init__(self, secrets: dict[str, str]) -> None:
        self.exact = {v: p for v, p in secrets.items() if p == "<command>"}  # a whole value, any length
        alternatives: list[tuple[int, str, str]] = [(10**9, _KERNEL_NAME, "<process>")]
        literals = {"name="}  # what every alternative holds as it stands: a value without any is left as it is
        for value, what in secrets.items():
            if len(value) < 2:
                continue
            if what == "<command>":  # raw, and as a log line quotes it; a multi-line one line by line too
                pieces = [*_forms(value), *(p for p in value.split("\n") if len(p) >= 2 and "\n" in value)]
                alternatives += [(len(p), re.escape(p), what) for p in pieces]
                literals.update(pieces)
            elif what.startswith("<job"):  # a number: only where it stands as a job
                prefixes = "|".join(f"(?<={re.escape(p)})" for p in ("slurm:", "job_", "job ", "jobid=",
                                                                        "SLURM_JOB_ID="))
                alternatives.append((len(value), rf"(?:{prefixes}){re.escape(value)}(?!\d)", what))
            elif what.startswith(("<container", "<pod")):  # a short id stands for the whole one too
                alternatives.append((len(value), rf"(?<![0-9a-f]){re.escape(value)}[0-9a-f-]*", what))
            else:  # inside words joined by - . / @ too ("alice-quiet"), not inside another name ("malice")
                # nor a JSON key's word ("gpu_count" for a host named "gpu")
                alternatives.append((len(value), rf"(?<![A-Za-z0-9_]){re.escape(value)}(?![A-Za-z0-9_])", what))
            literals.add(value)
        alternatives.sort(key=lambda a: -a[0])  # at one place, the longest secret wins
        self.placeholders = [what for _, _, what in alternatives]
        assert all("\n" not in p and "\r" not in p and '"' not in p and "\\" not in p for p in self.placeholders)
        self.pattern = re.compile("|".join(f"(?P<s{i}>{pat})" for i, (_, pat, _) in enumerate(alternatives)))
        # one pass of plain text first: most values hold no secret (the full pattern is slow on 29 000 events)
        self.quick = re.compile("|".join(re.escape(v) for v in sorted(literals, key=len, reverse=True)))

    def _sub(self, m: re.Match[str]) -> str:
        return self.placeholders[int((m.lastgroup or "s0")[1:])]

    def value(self, text: str) -> str:
        """A string value (of JSON, or one line of a text file)."""
        if text in self.exact:
            return self.exact[text]
        return self.pattern.sub(self._sub, text) if self.quick.search(text) else text

    def text(self, text: str) -> str:
        """A text file, line by line: no line is joined to another or split."""
        return "\n".join(self.value(line) if line else line for line in text.split("\n"))

    def json(self, obj: Any) -> Any:
        """Every string value and every key of a parsed JSON document."""
        if isinstance(obj, str):
            return self.value(obj)
        if isinstance(obj, list):
            return [self.json(v) for v in obj]
        if isinstance(obj, dict):
            out: dict[str, Any] = {}
            for k, v in obj.items():
                key = self.value(k)
                n = 1
                while key in out:  # two names redacted alike ("alice", "bob" → "<user1>", "<user2>" never;
                    n += 1  # a command and its script both "<command>"…): both kept
                    key = f"{self.value(k)} ({n})"
                out[key] = self.json(v)
            return out
        return obj

    def file(self, name: str, text: str) -> str:
        """A file of the archive: a JSON one parsed, redacted value by value and written again (it
        still parses); any other as text, line by line."""
        if name.endswith(".json"):
            try:
                doc = json.loads(text)
            except ValueError:
                return self.text(text)
            return json.dumps(self.json(doc), indent=2, default=str) + "\n"
        return self.text(text)


def _journal_files(files: dict[str, str], notes: list[str]) -> None:
    """The health journal's events and each GPU's dossier (what a support ticket needs most)."""
    from gpud import journal
    from gpud.cli.events import dossier

    if not journal.journal_path().exists():
        notes.append("events.json, dossiers.json: no health journal yet (the gpud daemon writes it while it runs)")
        return
    problems: list[str] = []
    try:
        evs = journal.events(problems=problems)
        known = journal.gpus()
    except journal.JournalError as err:
        notes.append(f"events.json, dossiers.json: {err}")
        return
    files["events.json"] = json.dumps({"events": [
        {"id": e.id, "time": e.ts, "boot_id": e.boot_id, "kind": e.kind, "gpu": e.gpu, "uuid": e.uuid,
         "serial": e.serial, "summary": e.summary, "data": e.data} for e in evs]}, indent=2, default=str) + "\n"
    dossiers = []
    for g in known:
        try:
            dossiers.append(dossier(str(g["uuid"]), problems))
        except Exception as err:  # noqa: BLE001 - one GPU's odd rows must not lose the others
            notes.append(f"dossiers.json: GPU {g.get('uuid')}: {err}")
    files["dossiers.json"] = json.dumps(dossiers, indent=2, default=str) + "\n"
    notes += [f"events.json: {p}" for p in dict.fromkeys(problems)]


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
    if output is not None:  # refused before anything is gathered
        from gpud.paths import check_output

        check_output(output, "--output")
    m = machine(simulate)
    files, notes = _gather(m, config)
    if not no_redact:
        secrets, more = _secrets(m, files, m.label)
        redactor = _Redactor(secrets)
        files = {name: redactor.file(name, text) for name, text in files.items()}
        notes = [redactor.text(n) for n in notes] + more
    else:
        notes.append("not redacted (--no-redact): host name, user names and command lines are in the files")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = output or Path(f"gpud-report-{stamp}.tar.gz")
    manifest = ["gpud report", f"written {time.strftime('%Y-%m-%d %H:%M:%S %z')} by gpud {__version__}", "",
                "files:"] + [f"  {name}" for name in sorted(files)] + ["", "notes:"] + [f"  {n}" for n in notes]
    files["MANIFEST.txt"] = "\n".join(manifest) + "\n"
    try:
        # created here, never through a link planted since the check above (a root gpud writing where a
        # user can), and only readable by whoever runs it: the archive holds the machine's details
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, text in sorted(files.items()):
                data = text.encode()
                info = tarfile.TarInfo(f"gpud-report/{name}")
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
                tar.addfile(info, io.BytesIO(data))
    except OSError as err:

        e = GpudError(f"cannot write {target}: {err.strerror or err}")
        e.remedy = "choose a writable place with `--output PATH`"
        raise e from err
    sys.stdout.write(f"wrote {target} ({len(files)} files; {'not ' if no_redact else ''}redacted)\n")
    for n in notes:
        echo_wrapped(n, indent="    ", first="  ")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
