"""What a trial runs on the GPUs: the probe's DDP training step, or the user's own command.

A ``Workload`` starts the load, runs one measured window and says how many samples it did in how
many seconds, and stops. ``figures`` says what the figures depend on: ``gpu`` (the GPUs ran it),
``model`` (a simulated workstation: the same training job, its steps paced by the performance model,
``gpud.backends.SimPace``) or ``cpu`` (a command on a simulated workstation: the CPU runs it, so its
figures do not depend on the GPUs' settings).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from gpud.child import environment
from gpud.errors import GpudError, InvalidInput
from gpud.probe.training import TrainingFailed, TrainingJob

# The labels of ``figures``, as the output and docs/tune.md say them.
FIGURES = {"gpu": "measured on the GPUs",
           "model": "from the simulator's performance model (docs/tune.md), not measured",
           "cpu": "the CPU ran the command: its figures do not depend on the GPUs' settings"}


class WorkloadFailed(GpudError):
    """The workload did not run (a command's exit status, a probe that failed)."""


class RunTooShort(WorkloadFailed):
    """A command's run ended too soon to be measured: the tune stops before any setting is tried."""

    remedy = "give a command that runs for minutes (more iterations, a longer dataset), or --workload probe"


Ticker = Callable[[float], None]  # called about once a second while a window runs, with ``now()``


class Unsafe(GpudError):
    """Raised by a window's guard (``Workload.guard``): the hardware slowed itself down or an Xid appeared;
    the window stops at once."""


class Workload(Protocol):
    figures: str  # gpu | model | cpu
    name: str  # "probe" or the command
    unit: str  # what a sample is ("samples" for the probe; "runs" for a command)
    ticker: Ticker | None  # the trial's fan curve, driven while the load runs (``Applier.tick``)
    guard: Ticker | None  # the trial's safety, once a second of a window where the workload can stop it

    def start(self, gpus: list[int]) -> None: ...

    def window(self, seconds: float) -> tuple[float, float]:
        """Run for about ``seconds``; (samples done, seconds taken)."""
        ...

    def now(self) -> float: ...

    def wait(self, seconds: float) -> None: ...

    def stop(self) -> None: ...


@contextlib.contextmanager
def ticking(ticker: Ticker | None, period_s: float = 1.0) -> Iterator[None]:
    """Call ``ticker(time.monotonic())`` every ``period_s`` from a thread while the block runs (a window
    of a real workload: the fan curve keeps its one-second step, as the daemon's loop does)."""
    if ticker is None:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(period_s):
            ticker(time.monotonic())

    ticker(time.monotonic())
    th = threading.Thread(target=loop, name="gpud-tune-fans", daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


# A command started by root gets the environment gpud builds for its children (``gpud.child``: the locale,
# the CUDA/NCCL/OpenMP settings meant for training), never its caller's LD_PRELOAD, PYTHONPATH or
# secrets, with the user's own PATH, HOME, USER and LOGNAME.
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
# Run as the invoking user: enter the directory gpud was started in when that user may (the kernel
# decides, after the privileges are dropped), else their home, else /.
_ENTER = 'cd -- "$1" 2>/dev/null || cd -- "$HOME" 2>/dev/null || cd /; shift; exec "$@"'


class RunAs:
    """Who a command runs as: under ``sudo`` (euid 0, SUDO_USER/SUDO_UID/SUDO_GID set, SUDO_UID not 0)
    the invoking user with their own groups; else gpud's own user. ``clean`` when gpud is root."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:

        env = dict(os.environ if environ is None else environ)
        self.clean = os.geteuid() == 0
        self.uid: int | None = None
        self.gid: int | None = None
        self.groups: list[int] = []
        self.user = ""
        self.home = "/"
        if not self.clean:
            return
        sudo_uid, sudo_gid, sudo_user = env.get("SUDO_UID", ""), env.get("SUDO_GID", ""), env.get("SUDO_USER", "")
        if sudo_user and sudo_uid.isdigit() and sudo_gid.isdigit() and int(sudo_uid) != 0:
            self.uid, self.gid, self.user = int(sudo_uid), int(sudo_gid), sudo_user
            try:
                pw = pwd.getpwuid(self.uid)
                self.home = pw.pw_dir or "/"
                self.groups = sorted(set(os.getgrouplist(pw.pw_name, self.gid)))
                self.user = pw.pw_name
            except KeyError:
                self.groups = [self.gid]  # no such user in the password database: its ids alone
        else:
            try:
                pw = pwd.getpwuid(os.geteuid())
                self.user, self.home = pw.pw_name, pw.pw_dir or "/"
            except KeyError:
                self.user = "root"

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        """The command's environment: gpud's own (not root), or one built for the user (root)."""
        if not self.clean:
            return {**os.environ, **extra}
        return environment({"PATH": SAFE_PATH, "HOME": self.home, "USER": self.user, "LOGNAME": self.user, **extra})

    def argv(self, argv: list[str]) -> list[str]:
        """What runs: the command itself, or (as the invoking user) a shell that first enters the
        directory gpud was started in when that user may (the kernel decides, after the privileges are
        dropped: no check of modes that ACLs could contradict), else their home, else /."""
        if self.uid is None:
            return argv
        try:
            here = os.getcwd()
        except OSError:
            here = self.home
        return ["/bin/sh", "-c", _ENTER, "gpud-workload", here, *argv]

    def popen(self, argv: list[str], env: dict[str, str], stderr: Any,
              stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        """The command started in its own session (a timeout kills the whole process group), under sudo
        with the invoking user's uid, gid and groups (subprocess sets groups, then gid, then uid)."""
        null = subprocess.DEVNULL
        if self.uid is None:
            return subprocess.Popen(self.argv(argv), env=env, start_new_session=True, stdin=null, stdout=stdout,
                                    stderr=stderr)
        return subprocess.Popen(self.argv(argv), env=env, start_new_session=True, stdin=null, stdout=stdout,
                                stderr=stderr, user=self.uid, group=self.gid, extra_groups=self.groups, cwd="/")


# A run to completion is measured by NVML's energy counter, which moves about every 10 ms on GPUs
# (gpuopenanalytics/pynvml PR #18; docs/simulation.md), and by the wall clock: a run shorter than this
# spans fewer than a hundred of the counter's steps and fewer than ten of the power sensor's 100 ms
# averaging windows (Yang, Adamek, Armour, SC24), so it is refused; so is a run over which the counter
# did not move at all (zero joules: not a saving). Runs of minutes measure best: each run's start-up is
# in its figure, for every trial alike.
MIN_RUN_S = 1.0


class Command:
    """The user's command, run to completion once per window: a window's figure is one run (runs per
    second = 1 / its wall time). Its environment gets CUDA_VISIBLE_DEVICES for the GPUs tuned. Under
    sudo it runs as the invoking user (``RunAs``), as root in a clean environment; always in its own
    process group, all of it killed at the timeout."""

    unit = "runs"

    def __init__(self, command: str, figures: str, uuids: dict[int, str], timeout_s: float = 3600.0,
                 min_run_s: float = MIN_RUN_S) -> None:
        try:
            self.argv = shlex.split(command)
        except ValueError as err:
            raise InvalidInput("--workload", "", f"cannot split {command!r}: {err}") from None
        if not self.argv:
            raise InvalidInput("--workload", "", "empty command")
        self.name = command
        self.figures = figures
        self.uuids = uuids
        self.timeout_s = timeout_s
        self.min_run_s = min_run_s
        self._env: dict[str, str] = {}
        self.ticker: Ticker | None = None
        self.guard: Ticker | None = None  # checked after each run: a run is not stopped halfway
        self.run_as = RunAs()

    def start(self, gpus: list[int]) -> None:
        visible = [self.uuids[g] for g in gpus if g in self.uuids]
        self._env = {"CUDA_VISIBLE_DEVICES": ",".join(visible)} if len(visible) == len(gpus) else {}

    def _run(self) -> tuple[int, bytes]:
        """One run. Its whole process group is killed when it ends (children it left behind, still on the
        GPUs, would run into the next trial and past the restore), at the timeout, and when gpud is
        interrupted. Its standard error goes to a file, not a pipe: a child left behind that holds a pipe
        open would keep a read of it waiting."""

        with tempfile.TemporaryFile() as err:
            proc = self.run_as.popen(self.argv, self.run_as.env(self._env), err)
            try:
                proc.wait(timeout=self.timeout_s)
            finally:  # the timeout, gpud interrupted, or the run's end: the whole group goes
                with contextlib.suppress(OSError):  # its pid is the group's id while any member lives
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            err.seek(0)
            return proc.returncode, err.read()[-4096:]

    def window(self, seconds: float) -> tuple[float, float]:
        t0 = time.monotonic()
        try:
            with ticking(self.ticker):
                code, stderr = self._run()
        except (OSError, subprocess.TimeoutExpired, subprocess.SubprocessError) as err:
            raise WorkloadFailed(f"{self.name}: {err}") from None
        took = time.monotonic() - t0
        if code != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise WorkloadFailed(f"{self.name}: exit status {code} {tail[0]}".strip())
        if took < self.min_run_s:
            raise RunTooShort(f"{self.name}: a run took {took:.2f} s, less than the {self.min_run_s:g} s a run "
                              "must last to be measured (the energy counter's readings and the start-up would "
                              "be most of it)")
        return 1.0, took

    def now(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def stop(self) -> None:
        pass


class Pace(Protocol):
    """What paces the training job (``gpud.backends``: ``RealPace`` on GPUs, ``SimPace`` on a simulated
    workstation): its clock and its waiting, the job's start-up and the load it leaves."""

    figures: str
    paced: bool
    device: str
    batch_per_rank: int | None

    def start(self, job: Any, gpus: list[int]) -> None: ...

    def now(self) -> float: ...

    def wait(self, seconds: float, tick: Ticker | None = None) -> None: ...

    def stop(self) -> None: ...


class Counted(Protocol):
    def counter(self) -> tuple[float, float]: ...  # (samples so far, when the latest was counted)

    def wait(self, seconds: float) -> None: ...


def counted_window(job: Counted, seconds: float, none: str) -> tuple[float, float]:
    """One window of a running job: its counter before and after ``seconds`` → (samples, seconds between the
    two counts); ``none`` (what the job did not do) when its counter did not move."""
    n0, t0 = job.counter()
    job.wait(seconds)
    n1, t1 = job.counter()
    if t1 <= t0:
        raise WorkloadFailed(f"{none} in {seconds:g} s")
    return n1 - n0, t1 - t0


class Training:
    """The probe's DDP training step as one long-running job (``gpud.probe.training``): started once, the
    settings changed under it between windows, as Zeus profiles inside the running job. A window is the
    difference of two lines of the job's step counter (samples, and the time the last step ended), so the
    job's start-up and the steps in flight at a window's edges are not in it; ``wait`` is the pace's (one
    second at a time: the fan curve and the window's ``guard`` run after each)."""

    name = "probe"
    unit = "samples"

    def __init__(self, pace: Pace, uuids: dict[int, str]) -> None:
        self.pace = pace
        self.figures = pace.figures
        self.uuids = uuids
        self.ticker: Ticker | None = None
        self.guard: Ticker | None = None  # called once a second of a window; raises ``Unsafe`` to stop it
        self.job: Any = None
        self.gpus: list[int] = []

    def start(self, gpus: list[int]) -> None:

        self.gpus = list(gpus)
        self.job = TrainingJob(self.pace.device, len(gpus), [self.uuids[g] for g in gpus if g in self.uuids],
                               paced=self.pace.paced, batch_per_rank=self.pace.batch_per_rank)
        try:
            self.job.start()
            self.pace.start(self.job, gpus)
        except TrainingFailed as err:
            self.stop()
            raise WorkloadFailed(str(err)) from None

    def counter(self) -> tuple[float, float]:
        """(samples done, when the last of them ended) now; waits for the job's first step (at most 60 s)."""

        try:
            for _ in range(60):
                got = self.job.latest()
                if got is not None and got.steps > 0:
                    return got.samples, got.t
                self.pace.wait(1.0, self.ticker)
        except TrainingFailed as err:
            raise WorkloadFailed(str(err)) from None
        raise WorkloadFailed("the training job made no step within 60 s")

    def _tick(self, now: float) -> None:
        if self.ticker is not None:
            self.ticker(now)
        if self.guard is not None:
            self.guard(now)

    def waiting(self) -> dict[int, float]:
        """Per GPU, the share of a step its rank waits for the others (1 − its own compute time / the step's
        time, from the job's newest line; empty where the job does not report it). A rank that waits is
        faster than the job's pace: its GPU could do with less."""
        got = self.job.latest() if self.job is not None else None
        if got is None or not got.step_s or len(got.compute_s) != len(self.gpus):
            return {}
        return {g: max(0.0, 1.0 - c / got.step_s) for g, c in zip(self.gpus, got.compute_s, strict=True)}

    def window(self, seconds: float) -> tuple[float, float]:
        return counted_window(self, seconds, "the training job made no step")

    def now(self) -> float:
        return self.pace.now()

    def wait(self, seconds: float) -> None:
        self.pace.wait(seconds, self._tick)

    def stop(self) -> None:
        if self.job is not None:
            self.job.stop()
            self.job = None
        self.pace.stop()


class RateCommand:
    """The user's own job, unmodified, run once for the whole tune (``--rate-from REGEX``): gpud reads its
    throughput from its output (standard output and error together; the first group of each matching line,
    e.g. ``([\\d.]+) it/s`` or a trainer's ``samples/s`` lines) while the settings change under it. The rate
    a line reports holds from the line before it to it, so a window's figure is the time-weighted mean of the
    lines within it (``counter``: the rate integrated over the lines so far). It runs as ``Command`` does
    (the invoking user under sudo, a clean environment as root, its own process group, killed at the end)."""

    unit = "samples"

    def __init__(self, command: str, figures: str, uuids: dict[int, str], pattern: str,
                 timeout_s: float = 3600.0) -> None:

        try:
            self.argv = shlex.split(command)
        except ValueError as err:
            raise InvalidInput("--workload", "", f"cannot split {command!r}: {err}") from None
        try:
            self.rx = re.compile(pattern)
        except re.error as err:
            raise InvalidInput("--rate-from", "", f"{pattern!r} is not a regular expression: {err}") from None
        if self.rx.groups < 1:
            raise InvalidInput("--rate-from", "", f"{pattern!r} has no group: say which part is the rate, "
                                                  "e.g. '([\\d.]+) it/s'")
        if not self.argv:
            raise InvalidInput("--workload", "", "empty command")
        self.name, self.figures, self.uuids, self.timeout_s = command, figures, uuids, timeout_s
        self.ticker: Ticker | None = None
        self.guard: Ticker | None = None
        self.run_as = RunAs()
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._samples = 0.0
        self._last: float | None = None
        self._lines = 0
        self._tail = ""
        self._started = 0.0

    def start(self, gpus: list[int]) -> None:
        visible = [self.uuids[g] for g in gpus if g in self.uuids]
        env = {"CUDA_VISIBLE_DEVICES": ",".join(visible)} if len(visible) == len(gpus) else {}
        try:
            self.proc = self.run_as.popen(self.argv, self.run_as.env(env), subprocess.STDOUT, subprocess.PIPE)
        except OSError as err:
            raise WorkloadFailed(f"{self.name}: {err}") from None
        self._started = time.monotonic()
        threading.Thread(target=self._follow, name="gpud-tune-rate", daemon=True).start()

    def _follow(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            m = self.rx.search(line)
            now = time.monotonic()
            try:
                rate = float(m.group(1)) if m else None
            except (TypeError, ValueError):
                rate = None
            with self._lock:
                self._tail = line.strip()[-200:] or self._tail
                if rate is None:
                    continue
                if self._last is not None:
                    self._samples += rate * (now - self._last)
                self._last = now
                self._lines += 1

    def counter(self) -> tuple[float, float]:
        """(the rate integrated over the lines so far, when the last line came); waits for two lines."""
        deadline = time.monotonic() + 120.0
        while True:
            with self._lock:
                if self._lines >= 2 and self._last is not None:
                    return self._samples, self._last
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise WorkloadFailed(f"{self.name}: it ended (exit status {code})"
                                     f"{': ' + self._tail if self._tail else ''}")
            if time.monotonic() > deadline:
                raise WorkloadFailed(f"{self.name}: no line matched --rate-from {self.rx.pattern!r} within 120 s")
            self.wait(1.0)

    def window(self, seconds: float) -> tuple[float, float]:
        return counted_window(self, seconds, f"{self.name}: no line matched --rate-from {self.rx.pattern!r}")

    def now(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float) -> None:
        end = time.monotonic() + max(0.0, seconds)
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            if self.proc is not None and time.monotonic() - self._started > self.timeout_s:
                raise WorkloadFailed(f"{self.name}: ran past its timeout of {self.timeout_s:g} s")
            for f in (self.ticker, self.guard):
                if f is not None:
                    f(time.monotonic())

    def stop(self) -> None:

        if self.proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
