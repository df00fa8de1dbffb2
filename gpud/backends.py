"""The composition root: real NVML and ``/``, or a simulated workstation.

The only module above ``gpud.hw`` that imports the simulator, and only when simulation is asked
for; everything else receives a ``Machine`` and cannot tell which it is.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from gpud.hw.host import Host
from gpud.hw.machine import Machine
from gpud.hw.nvml import Nvml


def simulated_workstations() -> list[str]:
    """The names of the simulated workstations gpud ships (``--simulate NAME``; its completion)."""
    from gpud.sim.description import shipped_names

    return shipped_names()


def open_machine(simulate: str | None = None) -> Machine:
    """Real NVML and ``/``, or the simulated workstation ``simulate`` (a name or a path)."""
    if simulate:
        from gpud.sim import open_simulation  # the simulator is never imported otherwise

        sim = open_simulation(simulate)
        return Machine(Nvml(sim.module), Host(sim.root), sim.description.name, simulation=sim)
    return Machine(Nvml(), Host(os.environ.get("GPUD_ROOT", "/")), socket.gethostname())


class RealBench:
    """Time and load on real GPUs: the wall clock, and the burn-in's kernels in child processes."""

    simulated_time = False

    def __init__(self, device: str, uuids: dict[int, str] | None = None) -> None:
        from gpud.probe.stress_run import HardwareLoad

        self._load = HardwareLoad(device, uuids=uuids)
        self.results_are_the_gpus = device == "cuda"  # on the host's CPU they say nothing of the GPUs
        self.check_every_s = 1.0  # the children check every product; each reading collects what they found

    def check_period(self, reading_s: float) -> float:
        """Seconds between collecting the load's checks: each reading (the children check every product)."""
        return max(self.check_every_s, reading_s)

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def load(self, gpus: list[int], busy: bool, seconds: float) -> None:
        if busy:
            self._load.start(gpus, seconds)
        else:
            self._load.pause()

    def release(self) -> None:
        self._load.stop()

    def check(self, gpus: list[int], tag: Any = None) -> list[tuple[Any, dict[int, dict[str, Any]]]]:
        """What the load's children checked since the last call (every product, against each GPU's first),
        as of now (``tag``); nothing to collect at a phase's end (``tag`` None)."""
        return [(tag, self._load.checks())] if tag is not None else []

    def size(self, gpu: int, share: float) -> None:
        """The GPU's load sized to ``share`` of its largest (the children's matrix dimension)."""
        self._load.size(gpu, share)

    def device_faults(self, gpu: int) -> list[str]:
        return []

    def memtest_wall(self, seconds: float, fade_s: float) -> tuple[float, float]:
        """The memory test's time and bit-fade wait in the child: the GPUs' time is the wall clock."""
        return seconds, fade_s


class SimBench:
    """Time and load on a simulated workstation: simulated time, which passes as fast as the code
    runs (``advance``), and the load set on the simulated GPUs (utilisation and the power the
    kernels would want, ``Physics.stress_demand_watts``), so the physics answers with heat, fans,
    clocks and clock-event reasons. The short measured kernels still run on the CPU, which stands in
    for each GPU; a GPU's ``wrong_results`` or ``memory_errors`` fault reaches its stand-in from here."""

    simulated_time = True
    # The stand-in computes what the simulated GPU does: its faults (wrong_results, memory_errors) reach it.
    results_are_the_gpus = True
    # One checked product per GPU every 5 s of simulated time: the CPU standing in cannot compute the GPU's
    # products; a fault's onset is seen within 5 s (its temperature then, at most that late).
    check_every_s = 5.0

    def check_period(self, reading_s: float) -> float:
        """Seconds between the stand-in's checked products: every 5 s, or every fifth reading where readings
        are further apart (a 24-hour soak reads every 12 s: a product a minute, its errors still counted per
        minute); each is a sample of what the GPU computes then."""
        return max(self.check_every_s, 5 * reading_s) if reading_s > 1.0 else self.check_every_s

    def __init__(self, sim: Any, largest_share: float | None = None) -> None:
        """``largest_share``: what the load at its largest asks, as a share of the board's maximum power
        limit (default the physics' GEMM stress, ``STRESS_DEMAND_SHARE``: more than the board may draw); a
        lighter workload (one that stops short of the limit) asks less."""
        self.sim = sim
        self._touched: set[int] = set()
        self._checks: Any = None  # the checked load's child (gpud.probe.stress_run.SteppedChecks), when asked
        self._largest = largest_share
        self._share: dict[int, float] = {}

    def _demand(self, gpu: int) -> float:
        from gpud.sim.physics import STRESS_DEMAND_SHARE

        m = self.sim.machine
        full = m.stress_demand_watts(gpu) * (self._largest or STRESS_DEMAND_SHARE) / STRESS_DEMAND_SHARE
        return float(full * self._share.get(gpu, 1.0))

    def size(self, gpu: int, share: float) -> None:
        """The load sized to ``share`` of its largest: it asks that share of the largest's power (a GEMM's
        draw follows its work, n² of the matrix dimension, as DCGM's targeted power assumes)."""
        self._share[gpu] = max(0.0, min(1.0, share))
        m = self.sim.machine
        if (m.settings(gpu).get("load") or [0])[0]:
            m.set_load(gpu, 100, self._demand(gpu))

    def check(self, gpus: list[int], tag: Any = None) -> list[tuple[Any, dict[int, dict[str, Any]]]]:
        """One checked product per GPU on its stand-in, with the faults the GPU has now (a ``wrong_results``
        with ``above_celsius`` while it is that hot), tagged ``tag``: the same ``Checked`` kernel and
        comparison as the load's children on GPUs, stepped by simulated time. The stand-in computes while
        the caller reads the telemetry: the answers returned are of the step asked before (each with its
        tag); ``tag`` None collects the last one and asks nothing (a phase's end)."""
        from gpud.probe.stress_run import SteppedChecks

        if self._checks is None or self._checks.gpus != list(gpus):
            if tag is None:
                return []
            if self._checks is not None:
                self._checks.stop()
            self._checks = SteppedChecks("cpu", list(gpus))
        faults = {g: self.device_faults(g) for g in gpus} if tag is not None else None
        return list(self._checks.check(faults, tag))

    def now(self) -> float:
        return float(self.sim.machine.now())

    def sleep(self, seconds: float) -> None:
        self.sim.machine.advance(max(0.0, seconds))

    def load(self, gpus: list[int], busy: bool, seconds: float) -> None:
        m = self.sim.machine
        for g in gpus:
            self._touched.add(g)
            m.set_load(g, 100 if busy else 0, self._demand(g) if busy else m.desc.gpus[g].idle_power_watts)

    def release(self) -> None:
        """Put back the described load on every GPU the burn-in loaded."""
        m = self.sim.machine
        m.step()
        with m.mutate():
            for g in self._touched:
                m.settings(g)["load"] = None
        self._touched.clear()
        if self._checks is not None:
            self._checks.stop()
            self._checks = None

    def memtest_wall(self, seconds: float, fade_s: float) -> tuple[float, float]:
        """The stand-in runs one pass of the memory test and its bit-fade pass without a wait: the test's time
        passes in simulated time (the burn-in reads the telemetry through it), and the host's memory standing in
        cannot fade in a simulated minute."""
        return 0.0, 0.0

    def device_faults(self, gpu: int) -> list[str]:
        """The faults of the GPU that its stand-in must show now: ``wrong_results``, ``memory_errors`` (one
        with ``above_celsius`` only while the GPU is at least that hot: the kernels run with the faults
        the GPU has when they start)."""
        m = self.sim.machine
        out = []
        for kind in ("wrong_results", "memory_errors"):
            found = m.faults_of(kind, gpu)
            if any(f.above_celsius is None or m.temperature(gpu) >= f.above_celsius for f in found):
                out.append(kind)
        return out


def open_bench(machine: Machine, device: str) -> RealBench | SimBench:
    """The clock and load source for a load test on ``machine`` (the burn-in)."""
    if machine.simulation is not None:
        return SimBench(machine.simulation)
    infos = (machine.info(i) for i in range(machine.nvml.device_count()))
    return RealBench(device, {i.index: i.uuid for i in infos if i is not None})


Tick = Any  # Callable[[float], None]: called once a second of the workload with its time


class RealPace:
    """The tune's training job on real GPUs: it runs free (``gpud.probe.training``, one rank per GPU), time
    is the monotonic clock, and waiting is sleeping, one second at a time (``tick`` after each)."""

    figures = "gpu"
    paced = False
    device = "cuda"
    batch_per_rank: int | None = None  # the probe's own

    def start(self, job: Any, gpus: list[int]) -> None:
        self.job = job

    def now(self) -> float:
        return time.monotonic()

    def wait(self, seconds: float, tick: Tick = None) -> None:
        end = time.monotonic() + max(0.0, seconds)
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            if tick is not None:
                tick(self.now())

    def stop(self) -> None:
        pass


class SimPace:
    """The tune's training job on a simulated workstation: the same job (``gpud.probe.training``), one rank
    on the CPU standing in for the GPUs, its steps paced by the performance model (``gpud.sim.perf``) through
    its standard input, the channel the burn-in's faults take to its child. Each simulated second, every
    simulated rank's compute time per step comes from its GPU's clocks as the physics has them (its model's
    tensor throughput and memory bandwidth), the GPUs draw what the model says, so the energy counters,
    clocks and clock-event reasons NVML reports follow. Under noise each rank's step time varies from second
    to second (``perf.STEP_CV``), drawn from the machine's seed and the simulated time.

    The job's start-up (torch's import, the model, NCCL) lasts ``startup_s`` of simulated time at
    ``startup_share`` of the default power limit, with no steps: what a window must not include."""

    figures = "model"
    paced = True
    device = "cpu"
    # One sample per rank and step: the step counter moves about a hundred times a second (a window's
    # figure is read from the step boundaries in any case).
    batch_per_rank: int | None = 1
    STARTUP_S = 30.0  # PyTorch's import, CUDA's context and NCCL's set-up: tens of seconds (an assumption)

    def __init__(self, sim: Any, startup_s: float | None = None, startup_share: float | None = None,
                 demand_share: float | None = None) -> None:
        self.sim = sim
        self.gpus: list[int] = []
        self.job: Any = None
        self.startup_s = self.STARTUP_S if startup_s is None else startup_s
        self.startup_share = startup_share  # None: the training's own draw
        self.demand_share = demand_share  # None: perf.TRAINING_DEMAND_SHARE
        self._paced_at: float | None = None  # the simulated time the job was last paced to

    def _demand(self, g: int, share: float | None) -> float:
        from gpud.sim import perf

        default = float(self.sim.machine.desc.gpus[g].power_default_watts)
        return default * share if share is not None else perf.training_demand_watts(default)

    def start(self, job: Any, gpus: list[int]) -> None:
        m = self.sim.machine
        self.job, self.gpus = job, list(gpus)
        for g in gpus:
            m.set_load(g, 100, self._demand(g, self.startup_share if self.startup_share is not None
                                            else self.demand_share))
        self.wait(self.startup_s, paced=False)
        for g in gpus:
            m.set_load(g, 100, self._demand(g, self.demand_share))
        self._paced_at = self.now()

    def now(self) -> float:
        return float(self.sim.machine.now())

    def wait(self, seconds: float, tick: Tick = None, paced: bool = True) -> None:
        from gpud.sim import perf
        from gpud.sim.physics import CLOCK_MEM, CLOCK_SM

        m = self.sim.machine
        m._checked = 0.0  # settings another process (a daemon) wrote count from now on, not 0.25 s later
        m.refresh()
        done = 0.0
        while done < seconds - 1e-9:
            step = min(1.0, seconds - done)
            m.advance(step)
            done += step
            if paced and self.job is not None:
                compute = []
                for g in self.gpus:
                    spec = m.desc.gpus[g]
                    t = perf.step_time(m.clock_mhz(g, CLOCK_SM) / m.boost_mhz(g),
                                       m.clock_mhz(g, CLOCK_MEM) / float(spec.max_memory_mhz),
                                       float(spec.tensor_tflops), float(spec.memory_bandwidth_gbs))
                    jitter = m.gauss(g, "step", m.bucket()) if m.noisy else 0.0
                    compute.append(perf.seconds(perf.jittered(t, jitter), self.batch_per_rank or 1))
                # the whole simulated interval since the last pace: simulated time is the wall clock plus what
                # was advanced, so the wall time the code took is training time too (as the energy counts it)
                now = self.now()
                since = now - self._paced_at if self._paced_at is not None else step
                self._paced_at = now
                self.job.pace(now, since, compute,
                              perf.seconds(perf.allreduce_exposed(len(self.gpus)), self.batch_per_rank or 1))
            if tick is not None:
                tick(self.now())

    def stop(self) -> None:
        """Put back the described load on the GPUs it loaded."""
        m = self.sim.machine
        m.step()
        with m.mutate():
            for g in self.gpus:
                m.settings(g)["load"] = None


def open_training(machine: Machine) -> RealPace | SimPace:
    """What paces the tune's training job: real GPUs (it runs free), or the simulator's performance model."""
    return SimPace(machine.simulation) if machine.simulation is not None else RealPace()
