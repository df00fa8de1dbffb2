"""docs/deployment.md's Slurm answers against a real Slurm (Debian's slurm-wlm 22.05): munged, slurmctld and
slurmd brought up on this machine (loopback, a private configuration, spool and state under tmp_path, root
daemons in the foreground), with the page's ``slurm.conf`` lines and its prolog and epilog scripts as written
(read from the page's code blocks), installed where the page puts them (``/etc/slurm/gpud-*.sh``) and calling
gpud where the page's installation links it. That path is a wrapper onto this checkout's ``.venv/bin/gpud``
which adds the one thing a real node would not have: ``GPUD_SIMULATE`` (the simulated workstation named in a
file the test rewrites), with ``GPUD_STATE_DIR`` and ``GPUD_SOCKET`` under tmp_path. The wrapper and the
scripts are removed afterwards.

The healthy Z8 runs ``srun -N1 true`` (the health check at slurmd's start, the prolog and the epilog all
pass); the degraded one, given a job, fails the prolog: the node drains with gpud's reason, whose first 20
characters (``sinfo -R``'s column) name the GPU and the fault (GPU3's Xid 48), and the job goes back to the
queue PENDING, not held (``nohold_on_prolog_fail``). Then the page's health check (HealthCheckProgram,
run as slurmd runs it): it lifts gpud's own drain once the node is healthy, leaves an admin's drain as the
admin wrote it (degraded or healthy), and drains an undrained degraded node with gpud's reason. Needs root
and slurm-wlm + munge installed: skipped without them, failed under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "deployment.md"
GPUD = Path(sys.executable).with_name("gpud")
HEALTHY = "z8-fury-4x-a6000"
DEGRADED = "z8-fury-4x-a6000-degraded"
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/srun", "/usr/bin/sbatch",
           "/usr/bin/sinfo", "/usr/bin/scontrol", "/usr/bin/squeue", "/usr/bin/scancel")
MARK = "# gpud tests/test_slurm_real.py"  # in what the test installs: removed only if it is ours

pytestmark = pytest.mark.long


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"real Slurm test not run under CI: {why}")
    pytest.skip(why)


def slurm_section() -> str:
    text = DOC.read_text()
    start = text.index("\n## Slurm\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def code_blocks(text: str) -> list[str]:
    """The fenced code blocks of a Markdown text, their contents as written."""
    return [m.group(1) for m in re.finditer(r"^```[a-z]*\n(.*?)^```$", text, re.M | re.S)]


def page() -> tuple[list[str], str, str, str, Path]:
    """The page's slurm.conf lines, prolog, epilog and health-check scripts and the gpud path its installation
    links."""
    blocks = code_blocks(slurm_section())
    conf = next(b for b in blocks if "Prolog=/etc/slurm/gpud-prolog.sh" in b)
    prolog = next(b for b in blocks if b.startswith("#!/bin/sh") and "doctor --prolog" in b)
    epilog = next(b for b in blocks if b.startswith("#!/bin/sh") and "doctor --epilog" in b)
    check = next(b for b in blocks if b.startswith("#!/bin/sh") and "doctor --health-check" in b)
    link = re.search(r"^sudo ln -s /opt/gpud/bin/gpud (/\S+)$", DOC.read_text(), re.M)
    assert link, "docs/deployment.md's installation links the gpud command somewhere"
    return conf.strip().splitlines(), prolog, epilog, check, Path(link.group(1))


def test_the_pages_scripts_call_gpud_where_its_installation_puts_it() -> None:
    conf, prolog, epilog, check, gpud = page()
    for script in (prolog, epilog, check):
        called = set(re.findall(r"(/\S*/gpud)\b doctor", script))
        assert called == {str(gpud)}, (called, gpud)
        assert "/usr/bin/timeout" in script  # its own deadline, under PrologEpilogTimeout
    keys = dict(line.split("=", 1) for line in conf)
    assert keys["PrologFlags"] == "Alloc" and "nohold_on_prolog_fail" in keys["SchedulerParameters"]
    deadline = max(int(n) for n in re.findall(r"timeout -k (\d+) (\d+)", prolog + epilog)[0])
    assert int(keys["PrologEpilogTimeout"]) > deadline


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _install(path: Path, text: str, installed: list[Path]) -> None:
    if path.exists() or path.is_symlink():
        _unavailable(f"{path} exists (not this test's): not overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    installed.append(path)


class Cluster:
    def __init__(self, tmp: Path, machine_file: Path, env: dict[str, str], health_check: Path) -> None:
        self.tmp = tmp
        self.machine_file = machine_file
        self.env = env
        self.node = socket.gethostname().split(".")[0]
        self.health_check_path = health_check

    def health_check(self) -> subprocess.CompletedProcess[str]:
        """The page's HealthCheckProgram as slurmd runs it: root, no PATH, the node's name and Slurm's config."""
        return subprocess.run([str(self.health_check_path)], capture_output=True, text=True, timeout=70,
                              env={"SLURMD_NODENAME": self.node, "SLURM_CONF": self.env["SLURM_CONF"]})

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def node_state(self) -> tuple[str, str]:
        out = self.run("scontrol", "show", "node", self.node, "-o").stdout
        state = re.search(r"\bState=(\S+)", out)
        reason = re.search(r"\bReason=(.*?)(?: \[[^\]]*@[^\]]*\])?(?= \w+=|$)", out)
        return (state.group(1) if state else "?"), (reason.group(1) if reason else "")

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
                         for p in sorted((self.tmp / "log").glob("*")))

    def wait(self, what: str, ok: Callable[[], bool], timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not ok():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not within {timeout:.0f} s: node {self.node_state()}\n{self.logs()}")
            time.sleep(0.5)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    missing = [d for d in DAEMONS if not os.access(d, os.X_OK)]
    if missing:
        _unavailable(f"Slurm or munge not installed ({', '.join(missing)}): apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        _unavailable("slurmd and the page's scripts run as root")
    conf_lines, prolog, epilog, check, gpud_path = page()
    # a private directory for munged's socket: its parents must be reachable (munged checks them)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")).resolve() / f"gpud-slurm-{os.getpid()}"
    tmp.mkdir(mode=0o755)
    for d in ("munge", "etc", "spool", "state", "log", "gpud-state"):
        (tmp / d).mkdir(mode=0o700 if d == "munge" else 0o755)
    (tmp / "munge").chmod(0o755)
    key = tmp / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = tmp / "munge" / "munge.socket"
    machine_file = tmp / "machine"
    machine_file.write_text(HEALTHY + "\n")
    node = socket.gethostname().split(".")[0]
    conf_path = tmp / "etc" / "slurm.conf"
    conf_path.write_text("\n".join([
        "ClusterName=gpudtest", "SlurmctldHost=localhost", f"SlurmctldPort={_free_port()}",
        f"SlurmdPort={_free_port()}", "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge",
        "CredType=cred/munge", f"AuthInfo=socket={sock}", f"StateSaveLocation={tmp / 'state'}",
        f"SlurmdSpoolDir={tmp / 'spool'}", f"SlurmctldPidFile={tmp / 'slurmctld.pid'}",
        f"SlurmdPidFile={tmp / 'slurmd.pid'}", f"SlurmctldLogFile={tmp / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={tmp / 'log' / 'slurmd.log'}", "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres", "ReturnToService=2", "SlurmctldDebug=info", "SlurmdDebug=info",
        "# docs/deployment.md's lines, as written:", *conf_lines,
        f"NodeName={node} CPUs={os.cpu_count() or 1} State=UNKNOWN",
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP", ""]))
    installed: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(conf_path), "HOME": str(tmp)}
    try:
        # the page's scripts, as written, where its slurm.conf lines name them
        paths = dict(line.split("=", 1) for line in conf_lines)
        _install(Path(paths["Prolog"]), prolog, installed)
        _install(Path(paths["Epilog"]), epilog, installed)
        _install(Path(paths["HealthCheckProgram"]), check, installed)
        # the gpud command where the installation links it: this checkout's, on a simulated workstation
        _install(gpud_path, f"#!/bin/sh\n{MARK}: this checkout's gpud on a simulated workstation\n"
                            f"GPUD_SIMULATE=$(cat {machine_file}) GPUD_STATE_DIR={tmp / 'gpud-state'} "
                            f"GPUD_SOCKET={tmp / 'no-daemon.sock'} exec {GPUD} \"$@\"\n", installed)
        for argv, log in (
                (["/usr/sbin/munged", "-F", "--force", f"--key-file={key}", f"--socket={sock}",
                  f"--pid-file={tmp / 'munge' / 'munged.pid'}", f"--seed-file={tmp / 'munge' / 'seed'}",
                  f"--log-file={tmp / 'log' / 'munged.log'}"], "munged.out"),
                (["/usr/sbin/slurmctld", "-D", "-i", "-f", str(conf_path)], "slurmctld.out"),
                (["/usr/sbin/slurmd", "-D", "-f", str(conf_path)], "slurmd.out")):
            with open(tmp / "log" / log, "wb") as out:
                procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True))
            if argv[0].endswith("munged"):
                deadline = time.monotonic() + 10
                while not sock.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
            else:
                time.sleep(1)
            if procs[-1].poll() is not None:
                raise AssertionError(f"{argv[0]} exited {procs[-1].returncode}:\n"
                                     + (tmp / "log" / log).read_text(errors="replace"))
        yield Cluster(tmp, machine_file, env, Path(paths["HealthCheckProgram"]))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
        for path in installed:
            path.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_real_slurm_runs_jobs_on_the_healthy_z8_and_drains_the_degraded_one_with_gpuds_reason(
        cluster: Cluster) -> None:
    c = cluster
    # slurmd's start ran the health check (the prolog script): the healthy Z8 registers idle
    c.wait("the node idle", lambda: c.node_state()[0] == "IDLE")
    r = c.run("srun", "-N1", "true", timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr, c.logs())
    # the epilog ran and passed: the node is idle again, not drained
    c.wait("the node idle after the job's epilog", lambda: c.node_state()[0] == "IDLE")

    # the same node now a degraded Z8: a job's prolog drains it with gpud's reason and the job waits
    c.machine_file.write_text(DEGRADED + "\n")
    r = c.run("sbatch", "-N1", "-o", "/dev/null", "--parsable", "--wrap", "true")
    assert r.returncode == 0, (r.stdout, r.stderr)
    job = r.stdout.strip().split(";")[0]
    c.wait("the node drained", lambda: "DRAIN" in c.node_state()[0])
    state, reason = c.node_state()
    assert reason.startswith("GPU3 Xid48 DBE ECC"), (state, reason)
    assert reason.isascii() and reason.endswith("[gpud]") and len(reason) <= 200, reason
    column = c.run("sinfo", "-R", "-h").stdout  # sinfo -R's default: the reason's first 20 characters
    assert column.startswith("GPU3 Xid48 DBE ECC"), column
    c.wait("the job back in the queue", lambda: c.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
           == "PENDING")
    why = c.run("squeue", "-h", "-j", job, "-o", "%r").stdout.strip()
    print(f"sinfo -R:\n{c.run('sinfo', '-R').stdout}scontrol: State={state} Reason={reason}\n"
          f"squeue: job {job} PENDING ({why})")
    assert why != "JobHeldAdmin" and "Held" not in why, why  # nohold_on_prolog_fail: not held
    log = (c.tmp / "log" / "slurmd.log").read_text(errors="replace")
    assert "not found" not in log, log[-3000:]
    c.run("scancel", job)

    # The health check (HealthCheckProgram) with LBNL NHC's manners. The node healthy again: gpud's own drain
    # is lifted.
    c.machine_file.write_text(HEALTHY + "\n")
    r = c.health_check()
    assert r.returncode == 0, (r.stdout, r.stderr)
    c.wait("gpud's drain lifted", lambda: c.node_state()[0] == "IDLE")
    # An admin's drain: a degraded node keeps the admin's reason, and a healthy one stays drained.
    r = c.run("scontrol", "update", f"nodename={c.node}", "state=drain", "reason=admin: new PSU")
    assert r.returncode == 0, r.stderr
    c.machine_file.write_text(DEGRADED + "\n")
    r = c.health_check()
    assert r.returncode == 1 and r.stdout.startswith("GPU3 Xid48 DBE ECC"), (r.stdout, r.stderr)
    assert "stays drained" in r.stderr and c.node_state()[1] == "admin: new PSU", (r.stderr, c.node_state())
    c.machine_file.write_text(HEALTHY + "\n")
    r = c.health_check()
    assert r.returncode == 0, (r.stdout, r.stderr)
    state, reason = c.node_state()
    assert "DRAIN" in state and reason == "admin: new PSU", (state, reason)
    # Resumed by the admin, then a degraded node undrained: the health check drains it with gpud's reason.
    assert c.run("scontrol", "update", f"nodename={c.node}", "state=resume").returncode == 0
    c.wait("the admin's resume", lambda: "DRAIN" not in c.node_state()[0])
    c.machine_file.write_text(DEGRADED + "\n")
    r = c.health_check()
    assert r.returncode == 1, (r.stdout, r.stderr)
    state, reason = c.node_state()
    assert "DRAIN" in state and reason.startswith("GPU3 Xid48 DBE ECC") and reason.endswith("[gpud]"), (state, reason)
