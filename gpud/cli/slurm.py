"""``gpud doctor --prolog`` and ``--epilog``: Slurm's questions in Slurm's terms.

``--prolog``: is this node fit for the next job? At most ``PROLOG_BUDGET_S`` seconds (the health
states from doctor's fast checks, the kernel log and the journal); exit 0 when nothing is unhealthy,
else exit 1 and exactly one line of at most 200 ASCII characters on stdout, the drain reason, the most severe
finding first (``GPU3 Xid48 DBE ECC -> reset GPU; ...``: ``sinfo -R`` shows 20 characters). It also
notes when the job began (``SLURM_JOB_ID``), for the epilog. No kernel log readable (the Xids are
unknown, not absent): ``[doctor] unreadable_kernel_log`` decides, "fit" (the default: exit 0 and one
warning line on stderr, so a missing mount does not drain a cluster) or "unfit" (exit 1, the line says
which sources were tried and what is missing).

``--epilog``: puts back what a job's profile changed (``gpud restore``, through the daemon when one
runs), writes the Xids seen since the job began to the journal (``job_end``) and fails the node
(exit 1, one line) when a GPU was lost during the job. When the job began: ``SLURM_JOB_START_TIME``
where Slurm passes it, else the time this node's prolog noted for ``SLURM_JOB_ID``, else the boot.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpud import config as cfg
from gpud.cli.apply import Target, tuning_lock
from gpud.cli.common import machine
from gpud.cli.health import NOT_HEALTH, states_of
from gpud.config import Config
from gpud.doctor import diagnose
from gpud.doctor import health as hl
from gpud.doctor.health import COMPONENTS, Health, ascii_line, one_line, policy_of
from gpud.doctor.xid import describe, unreadable_needs
from gpud.errors import GpudError
from gpud.hw.host import KernelLogUnreadable
from gpud.hw.machine import Machine
from gpud.journal import Journal
from gpud.model import SLOW_OPEN_S
from gpud.paths import _dir_refusal, atomic_write, state_dir
from gpud.profiles import state as tuning_state
from gpud.profiles.session import DaemonGone

PROLOG_BUDGET_S = 9.0  # of the 10 s answer, from the process's start: a second left for the exit
LINE = 200  # Slurm's drain reason, as the contract has it
# Every reason gpud gives Slurm ends so: how the health check knows a drain as its own (LBNL NHC's manners:
# it lifts only the drains it made, and leaves an admin's alone).
TAG = "[gpud]"


def say(line: str) -> None:
    """The one line on stdout: printable ASCII (``°C`` → ``C``: Slurm's reason, ``sinfo``'s columns), at
    most ``LINE`` characters, what is wrong first (``sinfo -R`` shows 20) and ``TAG`` last."""
    sys.stdout.write(reason_line(line) + "\n")
    sys.stdout.flush()


def reason_line(line: str) -> str:

    text = ascii_line(line).strip()
    text = text.removeprefix("gpud: ").removesuffix(TAG).rstrip()
    room = LINE - len(TAG) - 1
    return (text if len(text) <= room else text[:room - 3] + "...") + " " + TAG


def ours(reason: str) -> bool:
    """Whether a node's drain reason is one gpud gave (``scontrol show node`` may add `` [user@time]``)."""

    return re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", reason.strip()).endswith(TAG)


def jobs_dir() -> Path:

    return state_dir() / "jobs"


def _job_id() -> str | None:
    job = os.environ.get("SLURM_JOB_ID", "")
    return job if job.isdigit() else None


def job_gpus(count: int) -> tuple[list[int] | None, str]:
    """The job's GPUs as NVML indices, and where they came from: ``SLURM_JOB_GPUS`` (Slurm's GPU ids, in
    the Prolog's and Epilog's environment; with ``AutoDetect=nvml`` in gres.conf they are NVML's indices),
    else ``CUDA_VISIBLE_DEVICES``, else None: the whole machine. What does not name a GPU of this machine
    by index (a UUID: telling which needs every GPU opened, seconds each without persistence mode) is said
    on stderr and the whole machine judged: better a node judged whole than a GPU of the job left out."""
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = os.environ.get(var, "").strip()
        if not value:
            continue
        out: list[int] = []
        for item in value.split(","):
            item = item.strip()
            lo, dash, hi = item.partition("-")
            if item.isdigit():
                out.append(int(item))
            elif dash and lo.isdigit() and hi.isdigit() and var == "SLURM_JOB_GPUS":
                out.extend(range(int(lo), int(hi) + 1))
            else:
                sys.stderr.write(f"gpud: {var}={value}: {item!r} is not a GPU index; the whole machine is judged\n")
                return None, "all"
        bad = [i for i in out if not 0 <= i < count]
        if bad:
            sys.stderr.write(f"gpud: {var}={value}: no GPU {','.join(map(str, bad))} here ({count} GPUs); the whole "
                             f"machine is judged\n")
            return None, "all"
        return sorted(set(out)), var
    return None, "all"


def fit_checks() -> list[str]:
    """The checks that can make a node unfit: those whose component can be unhealthy. The others
    (configuration, host, PCIe link, NVLink, clocks) are at worst degraded, so the prolog leaves them
    out; the Xids come from the kernel log and the journal, not from a check."""

    return [check for check, (_, worst, _, _) in COMPONENTS.items() if worst == "unhealthy"]


def since_start() -> float:
    """Seconds since this process started (``/proc/self/stat``'s start time against ``/proc/uptime``):
    the budget counts Python's start and the imports too."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def suspects(m: Machine, conf: Config) -> list[str]:
    """PCI addresses worth opening first, known without opening any GPU: those the kernel log names in
    an Xid of this boot that is not the application's (``[health]``'s policy), most recent first."""

    policy = policy_of(conf.health)
    out: list[str] = []
    for x in reversed(m.host.xid_events() or []):
        if policy.kind(x.xid) != "application" and x.pci_bus_id.lower() not in out:
            out.append(x.pci_bus_id.lower())
    return out


class Progress:
    """What the prolog's reading thread has found so far (read by the main thread at the deadline)."""

    def __init__(self) -> None:
        self.count: int | None = None  # GPUs NVML counts (nvmlDeviceGetCount opens none)
        self.opened: list[int] = []  # NVML indices opened, in order
        self.slow: dict[int, float] = {}  # index → seconds its first lookup took (SLOW_OPEN_S or more)
        self.states: tuple[Health, ...] | None = None  # the answer: the first unhealthy finding, or all read
        self.unread: KernelLogUnreadable | None = None  # no kernel log could be read: the Xids are unknown
        self.error: Exception | None = None
        self.scope: list[int] | None = None  # the job's GPUs (job_gpus), None: the whole machine


def read_health(m: Machine, conf: Config, progress: Progress, job: bool = True) -> None:
    """The states, the first failure first. Without persistence mode each GPU's first handle lookup
    initialises it (nvml.h; 1-3 s each, NVIDIA's driver-persistence documentation) and the driver does
    it under its lock, one GPU at a time: four such GPUs do not fit in a prolog's 10 s. So: the GPUs the
    kernel log accuses are opened first, by PCI address (``nvmlDeviceGetHandleByPciBusId_v2`` initialises
    that GPU only), then the others one by one; after the accused and after each GPU slow to open, the
    fit checks of the GPUs read so far, and the first unhealthy finding is the answer. All read and
    nothing unhealthy: the whole machine's states (with ``gpu.count``'s count, which needs every GPU)."""

    read = m.host.read_xids()
    xids, progress.unread = ((), read) if isinstance(read, KernelLogUnreadable) else (read, None)
    try:
        m.nvml.init()
        progress.count = m.nvml.device_count()
    except GpudError:
        progress.states = states_of(m, conf, only=fit_checks())[1]  # no NVML: its own finding
        return
    history = hl.journal_history()
    count = progress.count
    progress.scope = job_gpus(count)[0] if job else None
    scope = progress.scope if progress.scope is not None else list(range(count))
    first = []
    for bus in suspects(m, conf):
        try:
            index = m.nvml.open_bus(bus)
        except GpudError:
            continue  # lost or not NVML's: its index is opened (and judged) below
        if index in scope:  # another job's GPU is not this job's to judge (the health check judges all)
            first.append(index)
    order = list(dict.fromkeys([*first, *scope]))

    def judge_opened() -> tuple[Health, ...]:
        """The fit checks of the GPUs opened so far. gpu.count's machine-wide findings compare every GPU
        with the PCI bus: not made here; its per-GPU ones (a GPU that cannot be opened, and why) stand."""
        snap = m.snapshot(only=progress.opened)
        report = diagnose(m, conf, only=fit_checks(), skip=NOT_HEALTH, snapshot=snap)
        checks = [r for r in report.checks if not (r.id == "gpu.count" and r.gpu is None)]
        return hl.gather(m, conf, checks, snap, xids=xids, history=history, unread=progress.unread)
    for n, index in enumerate(order):
        if index not in first:
            try:
                m.nvml.handle(index)
            except GpudError:
                pass  # a lost GPU: the snapshot says so
        progress.opened.append(index)
        took = m.nvml.open_seconds(index)
        if took is not None and took >= SLOW_OPEN_S:
            progress.slow[index] = took
        # Judged so far: once the accused GPUs are all open, and after each GPU that was slow to open (the
        # next may be as slow); GPUs that open at once wait for the whole machine's judgement below.
        if n + 1 == len(order) or not (n + 1 == len(first) or index in progress.slow):
            continue
        states = judge_opened()
        if hl.worst_of(states) == "unhealthy":
            progress.states = states
            return
    # the job's GPUs all read: judged as such; the whole machine: with gpu.count, which needs every GPU
    progress.states = judge_opened() if progress.scope is not None else states_of(m, conf, only=fit_checks())[1]


def too_slow(progress: Progress, budget: float) -> str:
    """The drain reason when the GPUs could not all be read in time and none read was unhealthy."""
    wanted = progress.scope if progress.scope is not None else range(progress.count or 0)
    unread = [i for i in wanted if i not in progress.opened]
    gpus = ",".join(str(i) for i in unread) or "?"
    if progress.slow:
        slow = ",".join(str(i) for i in sorted(progress.slow))
        took = max(progress.slow.values())
        return (f"persistence mode off: GPU{slow} took up to {took:.1f} s each to open (no process held them), "
                f"GPU{gpus} not read within {budget:.0f} s -> `sudo nvidia-smi -pm 1` or run the gpud daemon")
    if progress.count is None:
        return f"NVML did not answer within {budget:.0f} s (a GPU hangs?) -> `nvidia-smi`, reboot"
    return f"GPU{gpus} did not answer within {budget:.0f} s (a GPU hangs?) -> `nvidia-smi`, reboot"


def prolog(simulate: str | None, config: str | None, budget: float | None = None) -> int:
    """``budget``: seconds left for the answer (default: ``PROLOG_BUDGET_S`` less this process's age)."""
    verdict = judge(simulate, config, budget, job=True)
    if verdict.line:
        say(verdict.line)
    verdict.leave()
    return verdict.code


class Verdict:
    """The prolog's answer: the exit code, the drain reason (None: fit), and whether the reading thread is
    still stuck in NVML (then the process must end with ``os._exit``: that thread cannot be stopped)."""

    def __init__(self, code: int, line: str | None = None, stuck: bool = False) -> None:
        self.code, self.line, self.stuck = code, line, stuck

    def leave(self) -> None:
        if self.stuck:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.code)


def judge(simulate: str | None, config: str | None, budget: float | None, job: bool) -> Verdict:
    """Is this node fit (``job``: for the job whose GPUs Slurm names, ``job_gpus``; else the whole machine)?"""

    started = time.time()
    if budget is None:
        budget = PROLOG_BUDGET_S - since_start()
    try:
        conf = cfg.load(config)
    except GpudError as err:
        return Verdict(2, str(err))
    progress = Progress()

    def work() -> None:
        try:

            read_health(machine(simulate), conf, progress, job=job)
        except Exception as err:  # noqa: BLE001 - said as the one line, never a traceback to Slurm
            progress.error = err

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(max(0.5, budget))
    if t.is_alive():  # the GPUs open one by one (persistence mode off), or a GPU hangs
        return Verdict(1, too_slow(progress, PROLOG_BUDGET_S), stuck=True)
    if job:
        _note_job(started)
    if progress.error is not None:
        return Verdict(1, f"health not read: {progress.error}")

    line = one_line(progress.states or (), LINE)
    if line:
        return Verdict(1, line)
    if progress.unread is not None:
        code, why = unreadable_answer(progress.unread, conf.doctor.unreadable_kernel_log)
        return Verdict(code, why)
    return Verdict(0)


def unreadable_answer(unread: KernelLogUnreadable, policy: str) -> tuple[int, str | None]:
    """No kernel log readable and nothing else unhealthy: ``[doctor] unreadable_kernel_log`` says fit
    (exit 0, one warning line on stderr) or unfit (exit 1 and the drain reason, naming what is missing)."""

    needs = unreadable_needs(unread.tried, os.geteuid() == 0)
    what = f"no kernel log readable ({unread.says()}): Xids not judged"
    if policy == "unfit":  # what to mount or grant first: a long list of sources is what a 200-character reason cuts
        return 1, f"Xids not judged -> {needs[0]} (no kernel log readable: {unread.says()})"
    text = " ".join("".join(c if c.isprintable() else " " for c in f"gpud: warning: {what}; node left fit "
                            f"([doctor] unreadable_kernel_log = \"fit\"); gpud needs: {'; '.join(needs)}").split())
    sys.stderr.write(text + "\n")
    return 0, None


def _note_job(started: float) -> None:
    """The prolog's time for ``SLURM_JOB_ID`` (the epilog's fallback for when the job began)."""
    job = _job_id()
    if job is None:
        return

    try:
        atomic_write(jobs_dir() / job, f"{started:.3f}\n")
    except OSError as err:
        sys.stderr.write(f"gpud: job {job}'s start not noted: {err}\n")


def job_start(boot_time: float | None) -> tuple[float | None, str]:
    """When the job began and where that came from."""
    value = os.environ.get("SLURM_JOB_START_TIME", "")
    if value.isdigit():
        return float(value), "SLURM_JOB_START_TIME"
    job = _job_id()
    if job is not None:
        try:
            return float((jobs_dir() / job).read_text().strip()), "prolog"
        except (OSError, ValueError):
            pass
    return boot_time, "boot"


def epilog(simulate: str | None, config: str | None) -> int:

    try:
        conf = cfg.load(config)
    except GpudError as err:
        say(str(err))
        return 2
    m = machine(simulate)
    try:
        m.nvml.init()
        scope = job_gpus(m.nvml.device_count())[0]
    except GpudError:
        scope = None  # no NVML: the restore says why
    restored = _restore(simulate, config, m, scope)
    boot = m.host.boot_time()
    since, source = job_start(boot)
    job = _job_id()
    lost, xids = _since(m, conf, since, scope)
    _journal(m, job, since, source, xids, lost, restored)
    if job is not None:
        (jobs_dir() / job).unlink(missing_ok=True)
    for x in xids:
        sys.stderr.write(f"gpud: job {job or '?'}: GPU{x['gpu']} Xid {x['xid']} ({x['kind']}): {x['meaning']}\n")
    if lost:
        say(f"GPU{','.join(str(g) for g in lost)} lost during job {job or '?'} (since {source}) -> reboot")
        return 1
    return 0


def _restore(simulate: str | None, config: str | None, m: Machine, gpus: list[int] | None) -> list[str]:
    """What the job's profile changed on its GPUs (``gpus``; None: all), put back: through the daemon when it
    drives this machine. The other GPUs keep theirs (another job's)."""

    if tuning_state.load() is None:
        return []
    t = Target(simulate, config)
    t._machine = m
    try:
        session = t.daemon_session()
        try:
            res = session.restore(gpus=gpus) if session is not None else None
        except DaemonGone:
            res = None  # it stopped between the ping and the request: put the job's GPUs back here
        if res is None:
            with tuning_lock("gpud doctor --epilog"):
                res = t.local().restore(gpus=gpus)
        done, failed = list(res.restored), list(res.failed)
    except GpudError as err:
        done, failed = [], [str(err)]
    for line in failed:
        sys.stderr.write(f"gpud: could not restore {line}\n")
    return done


def _since(m: Machine, conf: Config, since: float | None,
           scope: list[int] | None) -> tuple[list[int], list[dict[str, Any]]]:
    """The job's GPUs (``scope``; None: all) lost now or during the job; the Xids logged on them since it
    began: an Xid of another job's GPU, or one logged before this job began, is not this job's."""

    try:
        snap = m.snapshot()
    except GpudError as err:
        sys.stderr.write(f"gpud: GPUs not read: {err}\n")
        snap = None
    bus = {g.pci_bus_id.lower(): g.index for g in snap.gpus} if snap is not None else {}
    lost = ({s.index for s in snap.samples if s.lost and (scope is None or s.index in scope)}
            if snap is not None else set())
    boot = m.host.boot_time()
    policy = policy_of(conf.health)
    out = []
    for x in m.host.xid_events() or []:
        at = boot + x.seconds_since_boot if boot is not None and x.seconds_since_boot is not None else None
        if since is not None and at is not None and at < since:
            continue
        gpu = bus.get(x.pci_bus_id.lower())
        if scope is not None and gpu not in scope:
            continue
        out.append({"gpu": gpu, "pci_bus_id": x.pci_bus_id, "xid": x.xid, "kind": policy.kind(x.xid),
                    "meaning": describe(x.xid).meaning, "at": at})
        if x.xid == 79 and gpu is not None:  # fell off the bus, even if it answers again
            lost.add(gpu)
    return sorted(lost), out


def _journal(m: Machine, job: str | None, since: float | None, source: str, xids: list[dict[str, Any]],
             lost: list[int], restored: list[str]) -> None:

    summary = (f"job {job or '?'} ended: {len(xids)} Xid(s) since it began"
               + (f", GPU {', '.join(map(str, lost))} lost" if lost else "")
               + (f", {len(restored)} setting(s) restored" if restored else ""))
    try:
        j = Journal(busy_wait_s=2.0)
    except Exception as err:  # noqa: BLE001 - the answer to Slurm matters more than the record
        sys.stderr.write(f"gpud: journal not written: {err}\n")
        return
    try:
        j.record("job_end", summary, boot_id=m.host.boot_id(), key=f"job_end:{job}" if job else None,
                 data={"job_id": job, "since": since, "since_source": source, "xids": xids, "lost": lost,
                       "restored": restored})
    finally:
        j.close()


# -- HealthCheckProgram ------------------------------------------------------------------------------
# Where slurmd's hosts keep scontrol (Debian's and SchedMD's packages, a source build's prefixes). gpud runs
# as root here: only a root-owned file nobody else may write is run.
SCONTROL = ("/usr/bin/scontrol", "/usr/local/bin/scontrol", "/opt/slurm/bin/scontrol", "/usr/sbin/scontrol")


def scontrol_path() -> str | None:

    for path in SCONTROL:
        try:
            st, parent = os.stat(path), os.stat(os.path.dirname(path))
        except OSError:
            continue
        if (st.st_uid == 0 and not st.st_mode & 0o022 and os.access(path, os.X_OK)
                and _dir_refusal(parent, os.path.dirname(path), "scontrol") is None):
            return path
    return None


def node_name() -> str:
    """The node's name in slurm.conf: ``SLURMD_NODENAME`` (slurmd sets it), else the short host name."""

    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def node_state(scontrol: str, node: str) -> tuple[str, str]:
    """(State, Reason) from ``scontrol show node NODE -o``; raises OSError/ValueError when it cannot tell."""

    r = subprocess.run([scontrol, "show", "node", node, "-o"], capture_output=True, text=True, timeout=20,
                       stdin=subprocess.DEVNULL, check=False)
    if r.returncode != 0:
        raise ValueError(f"scontrol show node {node}: {(r.stderr or r.stdout).strip()[:200]}")
    state = re.search(r"\bState=(\S+)", r.stdout)
    reason = re.search(r"\bReason=(.*?)(?= \w+=|$)", r.stdout.strip())
    if state is None:
        raise ValueError(f"scontrol show node {node}: no State= in its answer")
    return state.group(1), (reason.group(1).strip() if reason else "")


def health_check(simulate: str | None, config: str | None) -> int:
    """Slurm's HealthCheckProgram, with LBNL NHC's manners: the whole machine judged as the prolog judges
    it; unfit: the node drained with the reason, unless it is drained already with someone else's (an
    admin's "new PSU" stays); fit: a drain of gpud's own (its reason ends with ``TAG``) lifted, and any
    other left. Exit 0 fit, 1 unfit, 2 when Slurm could not be asked or told."""

    verdict = judge(simulate, config, None, job=False)
    code = 0 if verdict.code == 0 else 1
    scontrol = scontrol_path()
    node = node_name()
    if verdict.line:
        say(verdict.line)
    try:
        if scontrol is None:
            raise ValueError(f"no scontrol (looked for {', '.join(SCONTROL)}, root's and only root's to write)")
        state, reason = node_state(scontrol, node)
        drained = "DRAIN" in state.upper()
        change: list[str] = []
        if code and drained and not ours(reason):
            sys.stderr.write(f"gpud: node {node} stays drained as it was ({reason!r}): not gpud's drain\n")
        elif code:
            change = ["state=drain", f"reason={reason_line(verdict.line or 'unfit')}"]
        elif drained and ours(reason):
            change = ["state=resume"]
            sys.stderr.write(f"gpud: node {node} healthy again: gpud's drain ({reason!r}) lifted\n")
        if change:
            r = subprocess.run([scontrol, "update", f"nodename={node}", *change], capture_output=True, text=True,
                               timeout=20, stdin=subprocess.DEVNULL, check=False)
            if r.returncode != 0:
                raise ValueError(f"scontrol update nodename={node} {change[0]}: {(r.stderr or r.stdout).strip()[:200]}")
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        sys.stderr.write(f"gpud: health check of node {node}: {err}\n")
        code = 2
    verdict.code = code
    verdict.leave()
    return code
