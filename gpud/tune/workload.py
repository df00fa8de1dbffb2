"""What a trial runs on the GPUs: the probe's DDP training step, or the user's own command.

A ``Workload`` starts the load, runs one measured window and says how many samples it did in how
many seconds, and stops. ``figures`` says what the figures depend on: ``gpu`` (the GPUs ran it),
``model`` (a simulated workstation's performance model, ``gpud.backends.SimTraining``) or ``cpu``
(a command on a simulated workstation: the CPU runs it, so its figures do not depend on the GPUs'
settings).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from gpud.child import environment
from gpud.errors import GpudError, InvalidInput
from gpud.hw.machine import Machine

# The labels of ``figures``, as the output and docs/tune.md say them.
FIGURES = {"gpu": "measured on the GPUs",
           "model": "from the simulator's performance model (docs/tune.md), not measured",
           "cpu": "the CPU ran the command: its figures do not depend on the GPUs' settings"}


class WorkloadFailed(GpudError):
    """The workload did not run (a command's exit status, a probe that failed)."""


Ticker = Callable[[float], None]  # called about once a second while a window runs, with ``now()``


class Workload(Protocol):
    figures: str  # gpu | model | cpu
    name: str  # "probe" or the command
    unit: str  # what a sample is ("samples" for the probe; "runs" for a command)
    ticker: Ticker | None  # the trial's fan curve, driven while the load runs (``Applier.tick``)

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
        import pwd

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

    def popen(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """The command started in its own session (a timeout kills the whole process group), under sudo
        with the invoking user's uid, gid and groups (subprocess sets groups, then gid, then uid)."""
        null, pipe = subprocess.DEVNULL, subprocess.PIPE
        if self.uid is None:
            return subprocess.Popen(self.argv(argv), env=env, start_new_session=True, stdin=null, stdout=null,
                                    stderr=pipe)
        return subprocess.Popen(self.argv(argv), env=env, start_new_session=True, stdin=null, stdout=null,
                                stderr=pipe, user=self.uid, group=self.gid, extra_groups=self.groups, cwd="/")


class Command:
    """The user's command, run to completion once per window: a window's figure is one run (runs per
    second = 1 / its wall time). Its environment gets CUDA_VISIBLE_DEVICES for the GPUs tuned. Under
    sudo it runs as the invoking user (``RunAs``), as root in a clean environment; always in its own
    process group, all of it killed at the timeout."""

    unit = "runs"

    def __init__(self, command: str, figures: str, uuids: dict[int, str], timeout_s: float = 3600.0) -> None:
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
        self._env: dict[str, str] = {}
        self.ticker: Ticker | None = None
        self.run_as = RunAs()

    def start(self, gpus: list[int]) -> None:
        visible = [self.uuids[g] for g in gpus if g in self.uuids]
        self._env = {"CUDA_VISIBLE_DEVICES": ",".join(visible)} if len(visible) == len(gpus) else {}

    def _run(self) -> tuple[int, bytes]:
        import signal

        proc = self.run_as.popen(self.argv, self.run_as.env(self._env))
        try:
            _, err = proc.communicate(timeout=self.timeout_s)
        except BaseException:  # the timeout, or gpud interrupted: the whole group goes, nothing left behind
            with contextlib.suppress(OSError):  # not yet reaped: its pid (the group's id) is still its own
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        return proc.returncode, err or b""

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
        return 1.0, took

    def now(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def stop(self) -> None:
        pass


class Probe:
    """The probe's DDP training step on the GPUs (``gpud probe --suite ddp``): one launch per window,
    its samples per second over the timed iterations (after the probe's own warm-up)."""

    figures = "gpu"
    name = "probe"
    unit = "samples"

    def __init__(self, machine: Machine, host: str) -> None:
        self.machine = machine
        self.host = host
        self.gpus: list[int] = []
        self.ticker: Ticker | None = None

    def start(self, gpus: list[int]) -> None:
        self.gpus = gpus

    def window(self, seconds: float) -> tuple[float, float]:
        from gpud.probe.errors import ProbeError
        from gpud.probe.runner import run_probe

        t0 = time.monotonic()
        try:
            with ticking(self.ticker):
                rep = run_probe(device="cuda", gpus=len(self.gpus), world_sizes=[len(self.gpus)], suites=["ddp"],
                                quick=True, machine=self.machine, host=self.host,
                                keep_history=False, allow_busy=True)
        except ProbeError as err:
            raise WorkloadFailed(f"the probe: {str(err).splitlines()[0]}") from None
        took = time.monotonic() - t0
        figures = rep.ddp.get(str(len(self.gpus))) or {}
        rate = figures.get("samples_per_second")
        if not rate or rep.failures:
            raise WorkloadFailed("the probe gave no DDP samples per second" + (f": {rep.failures[0]}" if rep.failures
                                                                              else ""))
        return float(rate) * took, took

    def now(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def stop(self) -> None:
        pass
