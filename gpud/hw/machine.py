"""The workstation gpud runs on: NVML + host files, and one snapshot per tick.

A ``Machine`` is built by ``gpud.backends.open_machine``, the one place that chooses real hardware
or a simulated workstation (this layer never imports the simulator); everything above works on a
``Machine`` and cannot tell which.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpud.errors import GpudError, GpuLost
from gpud.hw.host import Host
from gpud.hw.nvml import Nvml
from gpud.model import GpuInfo, Snapshot, Topology

Owner = tuple[str | None, str | None, str | None]  # user, command line, workload (gpud.procinfo)
# How old a GPU count the quick readings and the rules' poll go by: the daemon's whole snapshots (every 5 s,
# gpud.daemon.tick.WHOLE_EVERY_S) count the GPUs; a GPU added (a driver reload) shows at the next one.
COUNT_HELD_S = 5.0


@dataclass
class Machine:
    nvml: Nvml
    host: Host
    label: str  # hostname, or the simulated workstation's name
    simulation: Any = None  # the gpud.sim.Simulation when simulated (tests inject faults through it)
    # (user, command, container) of each GPU process, read from /proc once while it stays on a GPU
    # keyed by pid with the process's start time beside it: a pid the kernel gave to a later process is read again
    _owners: dict[int, tuple[int | None, Owner]] = field(default_factory=dict, repr=False)

    def snapshot(self, pcie: bool = False, only: Sequence[int] | None = None, over: Snapshot | None = None
                 ) -> Snapshot:
        """Read every GPU once. Lost GPUs come back as ``lost`` samples, not as errors.

        ``pcie``: also measure PCIe throughput now, for every GPU (about 40 ms each: NVML samples it over
        20 ms per direction, and the driver serialises the calls) — one-shot commands; the daemon samples
        it off the tick instead. ``only``: these NVML indices alone (a partial snapshot: the prolog reads
        the GPUs it opened so far). ``over``: a whole snapshot taken before, for which ``quick_over`` said yes;
        each GPU's quick readings (``Nvml.quick_sample``: temperature, power) over its sample there, the
        rest as it was then (the daemon's ticks between two whole ones); read whole if a GPU was lost or
        written to since.
        """
        if over is not None:
            return self._quick(over)
        self.nvml.init()
        versions = self.nvml.versions()
        indices = list(range(self.nvml.device_count()) if only is None else only)
        if pcie:
            self.nvml.sample_pcie_all(indices)
        samples = []
        seen: dict[int, tuple[int | None, Owner]] = {}
        with self.nvml.reading_all():  # the off-tick sampler's blocking calls wait until every GPU is read
            read = [self.nvml.sample(i) for i in indices]  # a lost GPU keeps the UUID NVML's cache knows
        for sample in read:
            if sample.processes:
                sample = dataclasses.replace(sample, processes=tuple(
                    dataclasses.replace(p, user=u, command=c, container=w)
                    for p in sample.processes
                    for u, c, w in [self._owner(p.pid, seen)]
                ))
            samples.append(sample)
        # a process no GPU lists any more is forgotten; one whose start time could not be read is not kept
        self._owners = {pid: v for pid, v in seen.items() if v[0] is not None}
        infos = (self.nvml.cached_info(s.index) for s in samples)
        return Snapshot(
            timestamp=time.time(),
            versions=versions,
            gpus=tuple(g for g in infos if g is not None),
            samples=tuple(samples),
        )

    def quick_over(self, over: Snapshot | None) -> bool:
        """Whether ``snapshot(over=over)`` can read quick: the same GPUs as NVML counts now, none lost, and no
        setting written since (each write makes that GPU's next sample read its settings afresh:
        ``Nvml.settings_held``). The count is the one read within ``COUNT_HELD_S`` (a whole snapshot reads it):
        not a call each tick. ``snapshot(over=...)`` checks the last two itself, not the count."""
        if over is None or not self._holds(over):
            return False
        try:
            self.nvml.init()
            return len(over.samples) == self.nvml.recent_count(COUNT_HELD_S)
        except GpudError:
            return False

    def _holds(self, over: Snapshot) -> bool:
        return ([s.index for s in over.samples] == list(range(len(over.samples)))
                and all(not s.lost and self.nvml.settings_held(s.index) for s in over.samples))

    def _quick(self, over: Snapshot) -> Snapshot:
        if not self._holds(over):
            return self.snapshot()  # a GPU lost or written to: read whole (owners included)
        self.nvml.init()
        with self.nvml.reading_all():
            samples = tuple(self.nvml.quick_sample(s.index, s) for s in over.samples)
        return Snapshot(timestamp=time.time(), versions=over.versions, gpus=over.gpus, samples=samples)

    def _owner(self, pid: int, seen: dict[int, tuple[int | None, Owner]]) -> Owner:
        """(user, command, container) of a GPU process: read from ``/proc/PID`` when it first shows on a
        GPU, not on every tick (NVML's process lists change every few seconds at most), and again when the
        pid's start time (``/proc/PID/stat``) says it is another process now. What could not be read yet
        (the process was just starting) is read again next time."""
        if pid in seen:  # on several GPUs in one snapshot
            return seen[pid][1]
        start = self.host.start_time(pid)
        cached = self._owners.get(pid)
        got = cached[1] if cached is not None and start is not None and cached[0] == start else None
        if got is None or got[0] is None:
            user, command = self.host.process(pid)
            got = (user, command, self.host.workload(pid))
            if start is not None and self.host.start_time(pid) != start:
                start = None  # replaced while it was read: whose it was is not known, nothing kept
        seen[pid] = (start, got)
        return got

    def topology(self, snap: Snapshot) -> Topology:
        return self.nvml.topology(snap.samples)

    def info(self, index: int) -> GpuInfo | None:
        try:
            return self.nvml.info(index)  # cached after the first read
        except GpuLost:
            return self.nvml.cached_info(index)
