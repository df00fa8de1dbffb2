"""The workstation gpud runs on: NVML + host files, and one snapshot per tick.

A ``Machine`` is built by ``gpud.backends.open_machine``, the one place that chooses real hardware
or a simulated workstation (this layer never imports the simulator); everything above works on a
``Machine`` and cannot tell which.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from gpud.errors import GpuLost
from gpud.hw.host import Host
from gpud.hw.nvml import Nvml
from gpud.model import GpuInfo, Snapshot, Topology


@dataclass
class Machine:
    nvml: Nvml
    host: Host
    label: str  # hostname, or the simulated workstation's name
    simulation: Any = None  # the gpud.sim.Simulation when simulated (tests inject faults through it)

    def snapshot(self, pcie: bool = False) -> Snapshot:
        """Read every GPU once. Lost GPUs come back as ``lost`` samples, not as errors.

        ``pcie``: also measure PCIe throughput now, for every GPU at once (about 40 ms: NVML samples
        it over 20 ms per direction) — one-shot commands; the daemon samples it off the tick instead.
        """
        self.nvml.init()
        versions = self.nvml.versions()
        count = self.nvml.device_count()
        if pcie:
            self.nvml.sample_pcie_all(list(range(count)))
        samples = []
        for i in range(count):
            sample = self.nvml.sample(i)  # a lost GPU keeps the UUID NVML's cache knows
            if sample.processes:
                sample = dataclasses.replace(sample, processes=tuple(
                    dataclasses.replace(p, user=u, command=c, container=self.host.workload(p.pid))
                    for p in sample.processes
                    for u, c in [self.host.process(p.pid)]
                ))
            samples.append(sample)
        infos = (self.nvml.cached_info(s.index) for s in samples)
        return Snapshot(
            timestamp=time.time(),
            versions=versions,
            gpus=tuple(g for g in infos if g is not None),
            samples=tuple(samples),
        )

    def topology(self, snap: Snapshot) -> Topology:
        return self.nvml.topology(snap.samples)

    def info(self, index: int) -> GpuInfo | None:
        try:
            return self.nvml.info(index)  # cached after the first read
        except GpuLost:
            return self.nvml.cached_info(index)
