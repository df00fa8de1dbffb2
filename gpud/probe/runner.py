"""Run the training probe: plan the launches, run each in child processes with a timeout,
check correctness, explain the figures, keep the history. torch is never imported here.

One probe at a time per machine (a lock shared by the CLI and the daemon); busy GPUs are refused
before anything starts; every launch runs with NCCL's debug output in a file, read back for the
transport each channel used.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpud.child import environment, python
from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.model import ACS_BITS, GpuInfo, GpuProcess, GpuSample
from gpud.paths import probe_lock_path, state_dir
from gpud.probe import history
from gpud.probe.diagnose import DEFAULT_THRESHOLDS, Seen, View, explain
from gpud.probe.expect import cpu_link, cpu_vendor
from gpud.probe.report import Device, Load, Nccl, Placement, ProbeReport

SUITES = ("ddp", "pipeline", "allreduce", "p2p")
PARAM_TOLERANCE = {"cpu": 1e-4, "cuda": 1e-3}
CPU_NOTE = "CPU run: a functional check of DDP, the pipeline, all-reduce and P2P — not a measure of hardware."
ACS_P2P_BITS = 0x01 | 0x04 | 0x08  # SrcValid, ReqRedir, CmpltRedir (as gpud doctor's pcie.acs)
ACS_HANG = ("ACS on a PCIe bridge above the GPUs redirects peer-to-peer requests through the root complex, "
            "where they are slow or never complete (NCCL troubleshooting, \"PCI Access Control Services\"): "
            "`gpud doctor --check pcie.acs`, `sudo lspci -vvv | grep ACSCtl`")
TEARDOWN_GRACE = 10.0  # seconds the ranks get to exit once the result is written
BUSY_UTILIZATION = 5  # percent: a GPU above it (or running a job) is busy
VERSION = 2  # of the report's format


class ProbeError(GpudError):
    remedy = "the failing rank's last output is above (all ranks' logs: the directory named); check `gpud doctor`"

    def __init__(self, message: str, partial: dict[str, Any] | None = None, hung: dict[str, Any] | None = None,
                 logs: Path | None = None) -> None:
        super().__init__(message)
        self.partial = partial  # what rank 0 had measured before the launch failed
        self.hung = hung  # the P2P pair that passed its deadline: its progress line
        self.logs = logs


class ProbeBusy(ProbeError):
    remedy = "wait for the other probe or job to finish (`gpud status`, `nvidia-smi`), or pass --allow-busy"


@dataclass
class Plan:
    device: Device
    world_sizes: list[int]
    suites: list[str]
    quick: bool
    gpus: int
    stages: list[int] = field(default_factory=list)  # pipeline stage counts
    launches: list[dict[str, Any]] = field(default_factory=list)


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


# NVIDIA's MIG user guide, "Application Considerations": with MIG, no GPU-to-GPU P2P (PCIe or NVLink) is
# supported, and a CUDA process enumerates a single MIG device ("CUDA Device Enumeration"); NCCL between
# instances can then only go through host memory, which measures nothing of the hardware the probe judges.
MIG_SKIPPED = ("NCCL and P2P between MIG instances are not supported (NVIDIA MIG user guide: no P2P over PCIe "
               "or NVLink under MIG, one MIG device per CUDA process)")


def restrict_to_mig(plan: Plan, samples: Iterable[GpuSample]) -> str | None:
    """On a machine with a MIG-enabled GPU, keep only what one process on one MIG instance measures: the
    one-process DDP baseline (training on one device). The multi-rank launches
    (DDP scaling, all-reduce, the pipeline) and the P2P copies are dropped. Returns the sentence saying
    so, or None when no GPU has MIG enabled. CUDA enumerates the instances instead of their GPUs then, so
    NVML's GPU indices name no CUDA device either."""
    mig = [s.index for s in samples if s.mig_mode and not s.lost]
    if not mig or plan.device != "cuda":
        return None
    skipped: list[str] = []
    kept: list[dict[str, Any]] = []
    for launch in plan.launches:
        # the pipeline's baselines only compare with a pipeline run, which is not made
        tasks = [t for t in launch["tasks"] if launch["world_size"] == 1 and t not in ("p2p", "pipeline_baseline")]
        skipped += [f"{t} ({launch['world_size']} ranks)" if launch["world_size"] > 1 else t
                    for t in launch["tasks"] if t not in tasks]
        if tasks:
            kept.append({**launch, "tasks": tasks})
    plan.launches = kept
    plan.world_sizes = [1]
    plan.stages = []
    gpus = ", ".join(f"GPU{i}" for i in mig)
    measured = ("measured: one process training on one MIG instance (the one-device DDP baseline)" if kept
                else "nothing left to measure")
    what = (f"skipped: {', '.join(skipped)}; " if skipped else "") + measured
    return f"{gpus} in MIG mode: {MIG_SKIPPED}; {what}."


def make_plan(device: Device, gpus: int, world_sizes: list[int] | None, suites: list[str], quick: bool) -> Plan:
    """A baseline launch of one process (one-GPU DDP, the pipeline's unsplit and naive-split baselines,
    device-to-device copies between every GPU pair), then one launch per world size of two or more."""
    if device == "cuda":
        most = max(1, gpus)
        sizes = world_sizes or sorted({1, *[2 ** k for k in range(1, 8) if 2 ** k <= most], most})
    else:
        sizes = world_sizes or [1, 2]
    for n in sizes:
        if n < 1 or (device == "cuda" and n > gpus):
            raise GpudError(f"world size {n} is not possible with {gpus} GPU(s)" if device == "cuda"
                            else f"world size {n} must be at least 1")
    plan = Plan(device, sorted(set(sizes)), suites, quick, gpus)
    multi = [n for n in plan.world_sizes if n >= 2]
    if "pipeline" in suites and multi:
        plan.stages = [multi[0]] if quick else sorted({multi[0], multi[-1]})
    base = []
    if "ddp" in suites:
        base.append("ddp")
    if plan.stages:
        base.append("pipeline_baseline")
    if base:
        plan.launches.append({"world_size": 1, "tasks": base})
    if "p2p" in suites and device == "cuda" and gpus >= 2:
        # A launch of its own: a pair that hangs (ACS) costs its own deadline, not the baselines' figures.
        plan.launches.append({"world_size": 1, "tasks": ["p2p"]})
    cpu_p2p = "p2p" in suites and device == "cpu"
    for n in multi:
        tasks: list[str] = [t for t in ("ddp", "allreduce") if t in suites]
        if n in plan.stages:
            tasks.append("pipeline")
        if cpu_p2p:
            tasks.append("p2p")
            cpu_p2p = False
        if tasks:
            plan.launches.append({"world_size": n, "tasks": tasks})
    return plan


# -- NCCL -------------------------------------------------------------------------------------

TRANSPORT_LINE = re.compile(r"Channel (\d+)(?:/(\d+))? : (\d+)\[([0-9a-fA-Fx]+)\] -> (\d+)\[([0-9a-fA-Fx]+)\]"
                            r"(?: \[(send|receive)\])? via (\S+)")


def parse_nccl_transports(text: str) -> list[dict[str, Any]]:
    """The transport of each channel from NCCL's INFO lines, e.g.
    ``NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC`` (p2p.cc), ``… via SHM/direct/direct`` (shm.cc),
    ``… [send] via NET/Socket/0`` (net.cc), ``… via P2P/CUMEM/read``.

    The bracket after each rank is the GPU: its NVML index (``nvmlDev``) from NCCL 2.18.3 on (commit
    ea383122), its PCI bus id in hex before. The rank is the communicator's: a ``send``/``recv`` pair
    has a two-rank communicator of its own, so only the bracket says which GPUs a line is about."""
    rows, seen = [], set()
    for m in TRANSPORT_LINE.finditer(text):
        channel, _, src, src_dev, dst, dst_dev, direction, via = m.groups()
        key = (int(channel), int(src), src_dev, int(dst), dst_dev, via)
        if key in seen:
            continue
        seen.add(key)
        rows.append({"channel": int(channel), "src_rank": int(src), "dst_rank": int(dst), "src_dev": src_dev,
                     "dst_dev": dst_dev, "transport": via, **({"direction": direction} if direction else {})})
    return rows


def nccl_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Every NCCL_* variable of the environment the ranks inherit."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in sorted(env.items()) if k.startswith("NCCL_")}


# -- one launch -------------------------------------------------------------------------------

def rank_env(spec: dict[str, Any], world: int, rank: int, workdir: Path, gpus: int | None,
             environ: dict[str, str] | None = None) -> dict[str, str]:
    """One rank's environment (``gpud.child.environment``: only what a rank needs): its rank, PCI bus
    order, the data planes on loopback alone (Gloo's and NCCL's bootstrap sockets; the rendezvous itself is
    a file store, ``spec["store"]``), its own temporary directory, and on GPUs NCCL's INFO output in a
    file per rank (the transports are read back from it; the user's NCCL_DEBUG settings win)."""
    env = environment(base=os.environ if environ is None else environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    env |= {"WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(rank), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "TMPDIR": str(workdir),
            "OMP_NUM_THREADS": str(spec.get("threads_per_rank", 1))}
    if spec["device"] == "cuda":
        if gpus is not None and "CUDA_VISIBLE_DEVICES" not in env:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
        if "NCCL_DEBUG" not in env:
            env |= {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}
        if "NCCL_DEBUG_FILE" not in env:
            env["NCCL_DEBUG_FILE"] = str(workdir / f"nccl-ws{world}-rank{rank}.log")
    return env


def launch(spec: dict[str, Any], world: int, timeout: float, workdir: Path, gpus: int | None = None,
           affinity: list[list[int]] | None = None, pids: set[int] | None = None) -> dict[str, Any]:
    """Start one process per rank (loopback rendezvous), wait with a timeout, return rank 0's JSON.

    The collectives' own timeout is half the launch's, so a hang ends in a rank's error naming the
    collective, not in the launch's kill. Once rank 0 has written its result, a tear-down that hangs
    is killed after a grace period and does not fail the probe."""
    out = workdir / f"ws{world}-{'-'.join(spec['tasks'])}.json"
    progress = out.with_suffix(".progress")
    progress.unlink(missing_ok=True)
    partial = Path(str(out) + ".partial")
    partial.unlink(missing_ok=True)
    spec = {**spec, "out": str(out), "timeout": timeout, "collective_timeout": max(5.0, timeout / 2),
            "progress": str(progress)}
    spec_file = out.with_suffix(".spec.json")
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    store = workdir / f"ws{world}-{'-'.join(spec['tasks'])}.store"  # a file store: nothing listens for it
    store.unlink(missing_ok=True)
    spec["store"] = str(store)
    for rank in range(world):
        log = open(workdir / f"ws{world}-rank{rank}.log", "wb")
        logs.append(log)
        env = rank_env(spec, world, rank, workdir, gpus)
        rank_spec = spec | ({"cpus": affinity[rank]} if affinity and rank < len(affinity) and affinity[rank] else {})
        rank_file = spec_file.with_suffix(f".{rank}.json")
        rank_file.write_text(json.dumps(rank_spec))
        argv = python("-W", "ignore", "-m", "gpud.probe.worker", str(rank_file))
        procs.append(subprocess.Popen(argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        if pids is not None:
            pids.add(procs[-1].pid)
    deadline = time.monotonic() + timeout
    failed = None
    culprit = 0
    written_at: float | None = None
    lingering: list[int] = []
    hung: dict[str, Any] | None = None
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            hung = _overdue(progress)
            if hung is not None and written_at is None:
                failed = (f"P2P GPU{hung['p2p_pair'][0]}→GPU{hung['p2p_pair'][1]} hung (no result within "
                          f"{hung['deadline_seconds']:.0f} s)")
                break
            if written_at is None and out.is_file():
                written_at = now
            if written_at is not None and now - written_at > TEARDOWN_GRACE:
                lingering = [k for k, p in enumerate(procs) if p.poll() is None]
                break
            if now > deadline:
                failed = f"timed out after {timeout:.0f} s"
                break
            bad = [p for p in procs if p.poll() not in (None, 0)]
            if bad and written_at is None:
                time.sleep(0.2)  # let the other ranks notice, so the first failure is the one reported
                bad = sorted((p for p in procs if p.poll() not in (None, 0)), key=lambda p: -p.returncode)
                culprit = procs.index(bad[0])
                failed = f"rank {culprit} exited with {bad[0].returncode}"
                break
            time.sleep(0.05)
        if failed is None and written_at is None and not out.is_file():
            bad = [p for p in procs if p.returncode not in (None, 0)]
            if bad:
                culprit = procs.index(bad[0])
                failed = f"rank {culprit} exited with {bad[0].returncode}"
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()  # reaped: no zombie
        for log in logs:
            log.close()
    if failed is not None or not out.is_file():
        tail = "" if hung else (workdir / f"ws{world}-rank{culprit}.log").read_text(errors="replace")[-2000:]
        kept = json.loads(partial.read_text()) if partial.is_file() else None
        raise ProbeError(f"world size {world} ({', '.join(spec['tasks'])}): {failed or 'no result written'}"
                         + (f"\n{tail}" if tail.strip() else ""), kept, hung, workdir)
    data: dict[str, Any] = json.loads(out.read_text())
    if lingering:
        data["teardown_killed_ranks"] = lingering
    text = "".join(f.read_text(errors="replace") for f in sorted(workdir.glob(f"nccl-ws{world}-rank*.log")))
    data["nccl_transports"] = parse_nccl_transports(text)
    return data


def _overdue(progress: Path) -> dict[str, Any] | None:
    """The step rank 0 announced last (a P2P pair) when it has run past its deadline, else None."""
    try:
        lines = progress.read_text().splitlines()
        last: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return None
    deadline = last.get("deadline_seconds")
    if isinstance(deadline, (int, float)) and time.time() - float(last.get("at", time.time())) > deadline:
        return last
    return None


# -- before and during the run ------------------------------------------------------------------

@contextmanager
def probe_lock() -> Iterator[None]:
    """One probe at a time on this machine, whoever starts it (CLI, daemon, a job script).

    The lock file is opened once, in a directory no other user can write (checked on its descriptor),
    never through a symlink, and written to only when it is this user's own: a lock in a world-writable
    directory could be a symlink to a file root would truncate, or a file another user holds to block
    every probe. A user who cannot open the machine's lock (``/run/gpud`` is root's) takes one in their
    own state directory: their probes exclude each other, and the busy-GPU check stands between them and
    root's."""
    path = probe_lock_path()
    fd = _open_lock(path)
    if fd is None:  # the machine's lock is not this user's to open
        path = state_dir() / "probe.lock"
        fd = _open_lock(path)
        if fd is None:
            raise ProbeError(f"cannot open the probe's lock {path}")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()[:16] or "?"
            raise ProbeBusy(f"another probe is running on this machine (pid {holder}, lock {path})") from None
        if os.fstat(fd).st_uid == os.geteuid():
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _open_lock(path: Path) -> int | None:
    """The lock file's descriptor; None where this user may not open it (not root, the machine's lock);
    ProbeError where it is unsafe (a symlink, not a file, a directory others can write)."""
    euid = os.geteuid()
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if euid != 0 and err.errno in (errno.EACCES, errno.EPERM, errno.ENOENT):
            return None
        raise ProbeError(f"cannot open the probe lock's directory {path.parent}: {err.strerror}") from err
    try:
        st = os.fstat(dfd)
        if st.st_uid not in (0, euid) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ProbeError(f"the probe lock's directory {path.parent} can be written by another user "
                             f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): refused")
        flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(path.name, flags | os.O_RDWR | os.O_CREAT, 0o644, dir_fd=dfd)
        except PermissionError:
            if euid == 0:
                raise
            try:
                fd = os.open(path.name, flags | os.O_RDONLY, dir_fd=dfd)  # root's lock: flock needs no write
            except OSError:
                return None
    except OSError as err:
        why = "a symlink" if err.errno == errno.ELOOP else err.strerror
        raise ProbeError(f"cannot open the probe's lock {path}: {why}: refused") from err
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, euid):
        os.close(fd)
        raise ProbeError(f"the probe's lock {path} is not a file of root's or this user's (uid {st.st_uid}): refused")
    return fd


def visible_gpus(infos: list[GpuInfo], env: dict[str, str] | None = None) -> list[int]:
    """NVML indices of the GPUs CUDA will number 0, 1, … (CUDA_DEVICE_ORDER=PCI_BUS_ID): all, in bus
    order, or those CUDA_VISIBLE_DEVICES names (indices or UUID prefixes), in its order. The ranks'
    reported UUIDs are what the diagnosis maps by; this is the guess made before the launch."""
    ordered = sorted(infos, key=lambda g: g.pci_bus_id)
    spec = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [g.index for g in ordered]
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            break
        if item.isdigit():
            if int(item) >= len(ordered):
                break
            out.append(ordered[int(item)].index)
        else:
            match = [g for g in ordered if g.uuid.startswith(item) or g.uuid.startswith("GPU-" + item)]
            if len(match) != 1:
                break  # CUDA stops at the first entry it cannot resolve
            out.append(match[0].index)
    return out


def _named(p: GpuProcess) -> str:
    return f"pid {p.pid}" + (f" ({p.user}: {p.command})" if p.user or p.command else "")


def busy_gpus(machine: Machine, indices: list[int], ours: set[int] | None = None,
              unreadable_ours: bool = False) -> list[str]:
    """GPUs in use by others now: a job (a process on NVML's compute list) or utilisation above
    BUSY_UTILIZATION %. A desktop's display server and shell (the graphics list alone) are not jobs:
    what they draw shows in the utilisation. ``ours``: the probe's own PIDs; ``unreadable_ours``: a
    process whose /proc entry cannot be read (a host PID seen from a container) counts as the probe's."""
    out = []
    for s in machine.snapshot().samples:
        if s.index not in indices or s.lost:
            continue
        jobs = [_named(p) for p in s.processes or () if not p.graphics_only and p.pid not in (ours or ())
                and not (unreadable_ours and p.user is None and p.command is None)]
        util = s.utilization_gpu_percent or 0
        if jobs or util > BUSY_UTILIZATION:
            out.append(f"GPU{s.index}: {util} % busy" + (f", {', '.join(jobs)}" if jobs else ""))
    return out


def cpu_affinity(machine: Machine | None, gpus: list[int]) -> list[list[int]]:
    """Each rank's CPUs: its GPU's CPU affinity (NVML), where the machine has more than one NUMA node,
    restricted to the CPUs this process may use. Empty lists where nothing is to be pinned."""
    if machine is None or not gpus:
        return []
    infos = {i: machine.info(i) for i in gpus}
    nodes = {g.numa_node for g in infos.values() if g is not None}
    if len(nodes) < 2 and machine.host.cpu_info().numa_nodes < 2:
        return []
    allowed = os.sched_getaffinity(0)
    out = []
    for i in gpus:
        g = infos[i]
        cpus = sorted(set(g.cpu_affinity or ()) & allowed) if g is not None else []
        out.append(cpus)
    return out


def acs_above(machine: Machine) -> dict[int, list[str]]:
    """NVML index → PCIe bridges above that GPU with ACS bits set that redirect or block P2P."""
    by_bus = {g.pci_bus_id.lower(): g.index for g in machine.snapshot().gpus}
    out: dict[int, list[str]] = {}
    for dev in machine.host.nvidia_gpus():
        idx = by_bus.get(dev.address.lower())
        if idx is None:
            continue
        for addr in dev.parents:
            bridge = machine.host.pci_device(addr)
            if bridge is not None and bridge.acs_ctrl is not None and bridge.acs_ctrl & ACS_P2P_BITS:
                flags = ",".join(n for bit, n in ACS_BITS if bridge.acs_ctrl & bit)
                out.setdefault(idx, []).append(f"{addr} {flags}")
    return out


class LoadMonitor:
    """Samples NVML while the probe runs: PCIe generation under load, clock events (thermal, power),
    and processes on the GPUs that are not the probe's ranks."""

    def __init__(self, machine: Machine | None, period: float = 0.5) -> None:
        self.machine = machine
        self.period = period
        self.seen = Seen()
        self.ours: set[int] = set()
        self.before: dict[int, set[int]] = {}  # GPU → PIDs on it before the probe started
        self.hidden: dict[int, set[int]] = {}  # GPU → PIDs taken for the probe's ranks (see ``others``)
        self.loaded: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def others(self, gpu: int, procs: Iterable[GpuProcess]) -> list[GpuProcess]:
        """The jobs on a GPU that are not the probe's ranks. In a container NVML reports the host's PIDs,
        which this PID namespace does not know (no /proc entry: neither user nor command), so the ranks'
        own PIDs do not match: a process unknown here that was not on the GPU when the probe started is
        taken for one of its ranks (kept in ``hidden``)."""
        out = []
        for p in procs:
            if p.graphics_only or p.pid in self.ours:
                continue
            if p.user is None and p.command is None and p.pid not in self.before.get(gpu, set()):
                self.hidden.setdefault(gpu, set()).add(p.pid)
                continue
            out.append(p)
        return out

    @property
    def max_gen(self) -> dict[int, int]:
        return self.seen.pcie_generation

    def __enter__(self) -> LoadMonitor:
        if self.machine is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def sample(self) -> None:
        assert self.machine is not None
        for s in self.machine.snapshot().samples:
            if s.lost:
                continue
            if s.clock_events:
                self.seen.clock_events.setdefault(s.index, set()).update(s.clock_events)
            others = [_named(p) for p in self.others(s.index, s.processes or ())]
            if others:
                known = self.seen.processes.setdefault(s.index, [])
                known.extend(o for o in others if o not in known)
            if (s.utilization_gpu_percent or 0) >= 50 and s.pcie_generation is not None:
                self.loaded.add(s.index)
                gens = self.seen.pcie_generation
                gens[s.index] = max(gens.get(s.index, 0), s.pcie_generation)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sample()
            except GpudError:
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


# -- the report ---------------------------------------------------------------------------------

def assemble(plan: Plan, launches: list[dict[str, Any]]) -> ProbeReport:
    """The launches' figures (each rank 0's JSON) in one report: speedups against the baselines, and
    the correctness checks."""
    res = ProbeReport(device=plan.device, quick=plan.quick, world_sizes=plan.world_sizes,
                      suites=sorted(plan.suites), nccl=Nccl(env=nccl_env()))
    baselines: dict[str, Any] = {}
    for i, lr in enumerate(launches):
        n = str(lr["world_size"])
        if i == 0:  # the first launch says
            res.torch, res.dtype = lr.get("torch"), lr.get("dtype")
        if lr.get("gpu_name"):
            res.gpu_name = lr["gpu_name"]
        if lr.get("nccl"):
            res.nccl.version = lr["nccl"]
        res.ranks[n] = [r.get("uuid") for r in lr.get("ranks") or []]
        if lr.get("nccl_transports"):
            res.nccl.transports[n] = lr["nccl_transports"]
        if lr.get("teardown_killed_ranks"):
            res.teardown_killed = (res.teardown_killed or {}) | {n: lr["teardown_killed_ranks"]}
        if "ddp" in lr:
            res.ddp[n] = lr["ddp"]
        if "allreduce" in lr and "skipped" not in lr["allreduce"]:
            res.allreduce[n] = lr["allreduce"]
        if "pipeline_baseline" in lr:
            baselines |= lr["pipeline_baseline"]["by_stages"]
        if "pipeline" in lr and "skipped" not in lr["pipeline"]:
            res.pipeline[n] = lr["pipeline"]
        if "p2p" in lr and lr["p2p"].get("pairs"):
            res.p2p = lr["p2p"]
    for k, p in res.pipeline.items():
        b = baselines.get(k)
        if b and b.get("dtype", "fp32") == p.get("dtype"):  # a speedup compares one precision with itself
            p |= b | {"speedup": p["pipeline_samples_per_second"] / b["single_samples_per_second"],
                      "naive_speedup": b["naive_samples_per_second"] / b["single_samples_per_second"]}
    base = res.ddp.get("1")
    for n, r in res.ddp.items():
        if base:
            r["speedup"] = r["samples_per_second"] / base["samples_per_second"]
            r["efficiency"] = r["speedup"] / int(n)
    tol = PARAM_TOLERANCE[plan.device]
    ddp = list(res.ddp.values())
    if ddp:
        res.correctness.params_identical_across_ranks = all(r["params_max_spread"] == 0.0 for r in ddp)
        res.correctness.ddp_matches_one_process = all(
            r["reference"]["param_max_abs_diff"] <= tol and r["reference"]["loss_abs_diff"] <= tol * max(
                1.0, abs(r["reference"]["loss"])) for r in ddp)
    pipes = list(res.pipeline.values())
    if pipes:
        res.correctness.pipeline_matches_unsplit = all(p["output_max_abs_diff"] <= tol for p in pipes)
    model = next((r.get("model") for r in ddp), None)
    # The GPU count is set after the launches: the workload has always recorded it as null.
    res.workload = history.workload({**res.to_json(), "gpus": None}, model)
    return res


def machine_view(machine: Machine, seen: Seen, env: dict[str, str]) -> View | None:
    try:
        snap = machine.snapshot()
        cpuinfo = machine.host.read("/proc/cpuinfo")
        vendor = cpu_vendor(machine.host.cpu_info().model, cpuinfo)
        return View(machine.topology(snap), {g.index: g for g in snap.gpus}, {s.index: s for s in snap.samples},
                    seen, vendor, acs_above(machine), env, cpu_link(vendor, cpuinfo))
    except GpudError:
        return None


def run_probe(*, device: Device, gpus: int, world_sizes: list[int] | None = None, suites: list[str] | None = None,
              quick: bool = False, machine: Machine | None = None, host: str = "",
              thresholds: dict[int, float] | None = None, progress: Callable[[str, int, int], None] | None = None,
              keep_history: bool = True, timeout: float | None = None, allow_busy: bool = False) -> ProbeReport:
    if not torch_available():
        err = ProbeError("PyTorch is not installed for this Python")
        err.remedy = (f"install a PyTorch build matching the driver's CUDA into {sys.executable}'s environment "
                      "(a CPU build is enough to try the probe): see the README, \"PyTorch for the probe\"")
        raise err
    plan = make_plan(device, gpus, world_sizes, list(suites or SUITES), quick)
    with probe_lock():
        return _run(plan, machine, host, thresholds, progress, keep_history, timeout, allow_busy)


def _run(plan: Plan, machine: Machine | None, host: str, thresholds: dict[int, float] | None,
         progress: Callable[[str, int, int], None] | None, keep_history: bool, timeout: float | None,
         allow_busy: bool) -> ProbeReport:
    device = plan.device
    gpu_machine = machine if device == "cuda" else None
    used: list[int] = []
    busy: list[str] = []
    affinity: list[list[int]] = []
    unseen = None
    mig_note: str | None = None
    monitor = LoadMonitor(gpu_machine)
    if gpu_machine is not None:
        try:
            snap = gpu_machine.snapshot()
            used = visible_gpus(list(snap.gpus))[:plan.gpus]
            monitor.before = {s.index: {p.pid for p in s.processes or ()} for s in snap.samples}
            mig_note = restrict_to_mig(plan, snap.samples)
            busy = busy_gpus(gpu_machine, used)
            affinity = cpu_affinity(gpu_machine, used)
        except GpudError as err:  # no NVML: the probe still runs, unjudged
            gpu_machine, unseen = None, f"NVML unavailable ({err}): busy GPUs not checked, links not judged"
    if busy and not allow_busy:
        raise ProbeBusy("GPUs in use, the probe's figures would be wrong: " + "; ".join(busy))
    if mig_note is not None and not plan.launches:
        nothing = ProbeError(mig_note)
        nothing.remedy = ("add the ddp suite (one MIG instance alone), or disable MIG for the probe: "
                          "`sudo nvidia-smi -mig 0`")
        raise nothing
    cores = os.cpu_count() or 1
    started = time.time()
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="gpud-probe-"))
    monitor.machine = gpu_machine
    try:
        with monitor:
            for k, spec in enumerate(plan.launches):
                n = spec["world_size"]
                if progress:
                    progress(f"world size {n}: {', '.join(spec['tasks'])}", k, len(plan.launches))
                full = {"device": device, "tasks": spec["tasks"], "quick": plan.quick, "stages": plan.stages,
                        "threads_per_rank": max(1, cores // n) if device == "cpu" else 1}
                limit = timeout or (90.0 if plan.quick else 300.0) * (2 if device == "cpu" else 1)
                results.extend(_launch_kept(full, n, limit, workdir, plan.gpus if device == "cuda" else None,
                                            affinity[:n] if n > 1 else affinity[:1], monitor, failures,
                                            gpu_machine))
            if gpu_machine is not None:
                try:
                    monitor.sample()
                except GpudError:
                    pass
    finally:
        if not failures:
            shutil.rmtree(workdir, ignore_errors=True)
    if progress:
        progress("done", len(plan.launches), len(plan.launches))
    res = assemble(plan, results)
    res.version, res.host, res.started_at, res.finished_at, res.gpus = VERSION, host, started, time.time(), plan.gpus
    res.busy_at_start, res.cpu_affinity = busy, affinity
    res.nvml = unseen or None
    if device == "cpu":
        res.note = CPU_NOTE
    elif mig_note is not None:
        res.note = mig_note
    view = machine_view(gpu_machine, monitor.seen, res.nccl.env) if gpu_machine is not None else None
    res.diagnosis = explain(res, view, thresholds or DEFAULT_THRESHOLDS)
    res.load = Load({str(k): v for k, v in monitor.max_gen.items()},
                    {str(k): sorted(v) for k, v in monitor.seen.clock_events.items()},
                    {str(k): v for k, v in monitor.seen.processes.items()})
    res.failures = failures or None
    res.ok = res.correctness.ok() and not res.diagnosis.failed() and not failures
    # CPU figures say nothing about the hardware: no regression is read into them.
    res.regressions = history.regressions(res.to_json(), history.load()) if device == "cuda" else []
    if keep_history:
        history.append(res)
    return res


def _launch_kept(spec: dict[str, Any], n: int, limit: float, workdir: Path, gpus: int | None,
                 affinity: list[list[int]], monitor: LoadMonitor, failures: list[str],
                 machine: Machine | None) -> list[dict[str, Any]]:
    """One planned launch; when it fails or times out, what its rank 0 had measured is kept and the
    failure is said in ``failures``. A P2P pair that hangs is killed at its deadline and the copies start
    again after it (its reverse skipped too: the same path), within the launch's time."""
    kept: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit
    skip: list[list[int]] = []
    while True:
        try:
            kept.append(launch(spec, n, max(1.0, deadline - time.monotonic()), workdir, gpus, affinity, monitor.ours))
            return kept
        except ProbeError as err:
            if err.partial:
                kept.append(err.partial)
            if err.hung is None:
                lines = [x.strip() for x in str(err).splitlines() if x.strip()]
                why = f": {lines[-1]}" if len(lines) > 1 else ""
                failures.append(f"{lines[0] if lines else err}{why}" + (f" (the ranks' logs: {err.logs})"
                                                                          if err.logs else ""))
                return kept
            a, b = err.hung["p2p_pair"]
            failures.append(hung_sentence(err.hung, machine))
            skip += [[a, b], [b, a]]
            done = (err.partial or {}).get("p2p", {}).get("pairs", [])
            spec = spec | {"p2p_skip": skip, "p2p_done": done}
            if deadline - time.monotonic() < 5:
                failures.append("P2P: the pairs after the one that hung were not measured (launch time used up)")
                return kept


def hung_sentence(hung: dict[str, Any], machine: Machine | None) -> str:
    """'P2P GPU a→b hung' in NVML's numbering where the GPUs' UUIDs are known, with ACS as the likely cause
    and the bridges with ACS on above either GPU."""
    a, b = hung["p2p_pair"]
    acs: dict[int, list[str]] = {}
    if machine is not None:
        try:
            by_uuid = {g.uuid: g.index for g in machine.snapshot().gpus}
            a, b = by_uuid.get(hung.get("src_uuid") or "", a), by_uuid.get(hung.get("dst_uuid") or "", b)
            acs = acs_above(machine)
        except GpudError:
            pass
    seen = [f"GPU{g}: {', '.join(acs[g])}" for g in (a, b) if acs.get(g)]
    return (f"P2P GPU{a}→GPU{b} hung: its copies did not finish within {hung['deadline_seconds']:.0f} s; "
            + ACS_HANG + (f"; ACS is on above {'; '.join(seen)}" if seen else ""))


def torch_gpus() -> int:
    """GPUs torch sees (asked in a child process: the caller never imports torch); 0 without torch."""
    if not torch_available():
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="gpud-torch-") as cwd:
            r = subprocess.run(python("-c", "import torch; print(torch.cuda.device_count() "
                                            "if torch.cuda.is_available() else 0)"),
                               capture_output=True, text=True, timeout=120, cwd=cwd, env=environment())
        return int(r.stdout.strip() or 0)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0


def torchrun_command(*, nnodes: int, node_rank: int, endpoint: str, nproc_per_node: int | None,
                     probe_args: list[str]) -> list[str]:
    """This machine's part of a probe across ``nnodes`` machines: torchrun (this Python's
    ``torch.distributed.run``) with its static rendezvous at ``endpoint`` (node 0's address and a free
    port, which node 0's agent listens on), ``nproc_per_node`` ranks here (None: one per GPU torch sees,
    at least one), each running ``gpud probe
    probe_args``. Every machine runs the same command but for ``node_rank``; a rank that fails ends the
    run (no restarts: a probe measures, it does not recover)."""
    from gpud.errors import InvalidInput

    if under_torchrun():
        raise InvalidInput("--nnodes", str(nnodes), "already under torchrun: give torchrun its --nnodes, not gpud")
    if not 0 <= node_rank < nnodes:
        raise InvalidInput("--node-rank", str(node_rank), f"must be between 0 and {nnodes - 1} (--nnodes {nnodes})")
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput("--rdzv-endpoint", endpoint, "must be HOST:PORT (node 0's address and a free port)")
    if not torch_available():
        err = ProbeError("PyTorch is not installed for this Python (torchrun is part of it)")
        err.remedy = f"install PyTorch into {sys.executable}'s environment on every machine of the probe"
        raise err
    nproc = nproc_per_node or max(1, torch_gpus())
    return [*python("-m", "torch.distributed.run"), "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "static", "--rdzv-endpoint", endpoint,
            "--max-restarts", "0", "-m", "gpud", "probe", *probe_args]


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) and int(os.environ["WORLD_SIZE"]) > 1


def siblings() -> set[int]:
    """PIDs of this process's siblings (torchrun's other local ranks: children of the same agent)."""
    parent, out = os.getppid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                    out.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


def placement(ranks: list[Any]) -> list[Placement]:
    """Each rank's node, host and GPU, from what the ranks said of themselves (``worker.run``)."""
    out = []
    for r in ranks:
        if isinstance(r, dict) and isinstance(r.get("rank"), int):
            out.append(Placement(rank=r["rank"], node=int(r.get("node") or 0), host=str(r.get("host") or "?"),
                                 gpu_uuid=r.get("uuid") if isinstance(r.get("uuid"), str) else None))
    return out


def run_distributed(*, quick: bool, suites: list[str], host: str, thresholds: dict[int, float] | None = None,
                    machine: Machine | None = None, allow_busy: bool = False) -> ProbeReport | None:
    """Under torchrun (one or many machines): this process is one rank; rank 0 returns the report.

    Each node's local rank 0 takes the machine's probe lock and checks its GPUs for other jobs (its
    node's own ranks excepted) before anything is measured; a refusal on any node ends every rank."""
    from gpud.probe import worker  # torch: only here, only under torchrun

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    device: Device = "cuda" if worker.cuda_available() else "cpu"
    tasks = [t for t in ("ddp", "allreduce") if t in suites]
    started = time.time()
    spec = {"device": device, "tasks": tasks, "quick": quick, "collective_timeout": 300}
    with ExitStack() as held:
        refusal = None
        if local == 0:
            try:
                held.enter_context(probe_lock())
                if machine is not None and device == "cuda" and not allow_busy:
                    used = visible_gpus(list(machine.snapshot().gpus))[:local_world]
                    # the node's other ranks: the agent's children here, PIDs /proc cannot read in a container
                    busy = busy_gpus(machine, used, ours=siblings() | {os.getpid()}, unreadable_ours=True)
                    if busy:
                        refusal = "GPUs in use, the probe's figures would be wrong: " + "; ".join(busy)
            except ProbeBusy as err:
                refusal = str(err)
            except GpudError:
                pass  # no NVML on this node: not checked, as without torchrun
        worker.init(spec, rank, world, local)
        refusals = [r for r in worker.gather(f"{host}: {refusal}" if refusal else None) if r]
        if refusals:
            worker.finish_group()
            raise ProbeBusy("; ".join(refusals))
        full = worker.run(spec, rank, world, local)
        # The one-GPU baseline after the group's run, on rank 0's GPU alone, while the others wait.
        baseline = worker.run({"device": device, "tasks": ["ddp"], "quick": quick}, 0, 1, local) if rank == 0 else None
        worker.finish_group()
    if rank != 0:
        return None
    plan = Plan(device, [1, world], suites, quick, world)
    res = assemble(plan, [baseline or {}, full])
    res.version, res.host, res.started_at, res.finished_at, res.gpus = VERSION, host, started, time.time(), world
    res.placement = placement(full.get("ranks") or [])
    # the nodes that ran (each rank says its torchrun node rank); the agent's count where none did
    res.nodes = (len({p.node for p in res.placement}) if res.placement
                 else int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("NNODES", "1")) or 1))
    res.torchrun = True
    if device == "cpu":
        res.note = CPU_NOTE
    res.diagnosis = explain(res, None, thresholds or DEFAULT_THRESHOLDS)
    res.ok = res.correctness.ok() and not res.diagnosis.failed()
    # CPU figures say nothing about the hardware: no regression is read into them.
    res.regressions = history.regressions(res.to_json(), history.load()) if device == "cuda" else []
    history.append(res)
    return res
