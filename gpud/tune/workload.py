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


class Command:
    """The user's command, run to completion once per window: a window's figure is one run (runs per
    second = 1 / its wall time). Its environment gets CUDA_VISIBLE_DEVICES for the GPUs tuned."""

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

    def start(self, gpus: list[int]) -> None:
        visible = [self.uuids[g] for g in gpus if g in self.uuids]
        self._env = {"CUDA_VISIBLE_DEVICES": ",".join(visible)} if len(visible) == len(gpus) else {}

    def window(self, seconds: float) -> tuple[float, float]:
        t0 = time.monotonic()
        try:
            with ticking(self.ticker):
                done = subprocess.run(self.argv, env={**os.environ, **self._env}, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise WorkloadFailed(f"{self.name}: {err}") from None
        took = time.monotonic() - t0
        if done.returncode != 0:
            tail = (done.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise WorkloadFailed(f"{self.name}: exit status {done.returncode} {tail[0]}".strip())
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
        from gpud.probe.runner import ProbeError, run_probe

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
