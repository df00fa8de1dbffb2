"""The one choke point for NVML: the only package that touches ``pynvml``.

``Nvml`` takes the NVML module as a parameter — the real ``pynvml`` (nvidia-ml-py) or the
simulator's stand-in with the same function names, constants and ``NVMLError_*`` classes — so
the code below is the code that runs on a real workstation. Every call goes through
``NvmlClient.call``: lazy ``nvmlInit`` under a lock, a call counter, and translation of
``NVMLError_*`` into gpud's own errors. Reads of optional fields give ``None`` when NVML cannot
give them (Unsupported is not zero); a lost GPU is never hidden.

The package, one concern a module: ``constants`` (NVML's codes and ids), ``values`` (turning answers
into gpud's values), ``handles`` (``NvmlClient``, the choke point: init, calls, errors, handles,
versions), and the readers, each owning its caches and calling NVML through the client only: ``info``
(static information, offsets, temperature), ``processes``, ``counters`` (the slow readings: ECC,
violations, NVLink counters), ``pairs`` (P2P, topology), ``readings`` (a tick's sample, telemetry, the
off-tick sampler) and ``setters``. ``Nvml`` composes them and is what the rest of gpud holds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpud.hw.nvml.constants import ARCHITECTURES, FI_NVLINK_DATA, NVLINK_DATA_RETRY_S, TEMPERATURE_GPU
from gpud.hw.nvml.counters import Counters
from gpud.hw.nvml.handles import NvmlClient
from gpud.hw.nvml.info import Info
from gpud.hw.nvml.pairs import Pairs
from gpud.hw.nvml.processes import Processes
from gpud.hw.nvml.readings import Readings
from gpud.hw.nvml.setters import Setters

__all__ = ["ARCHITECTURES", "FI_NVLINK_DATA", "NVLINK_DATA_RETRY_S", "TEMPERATURE_GPU", "Nvml", "NvmlClient"]


class Nvml:
    """NVML behind a lock, with gpud errors, call counting and static caching: the client and its readers
    composed, their public methods one level up (``nvidia-smi`` equivalents: ``docs/architecture.md``)."""

    def __init__(self, module: Any = None) -> None:
        self.client = c = NvmlClient(module)
        self.statics = Info(c)
        self.processes = Processes(c)
        self.counters = Counters(c, self.statics)
        self.pairs = Pairs(c, self.statics)
        self.readings = r = Readings(c, self.statics, self.processes, self.counters)
        self.setters = s = Setters(c, self.statics, self.counters)
        # the choke point
        self.init, self.shutdown, self.call, self.get = c.init, c.shutdown, c.call, c.get
        self.handle, self.open_bus, self.open_seconds = c.handle, c.open_bus, c.open_seconds
        self.versions, self.device_count, self.recent_count = c.versions, c.device_count, c.recent_count
        # what a GPU is, who runs on it, how GPUs pair
        self.info, self.cached_info = self.statics.info, self.statics.cached
        self.supported_memory_clocks = self.statics.supported_memory_clocks
        self.running_processes, self.memory_in_use = self.processes.running_processes, self.processes.memory_in_use
        self.sampled_compute = self.processes.sampled_compute
        self.violations, self.topology = self.counters.violations, self.pairs.topology
        # readings
        self.sample, self.quick_sample, self.fresh_sample, self.telemetry = (
            r.sample, r.quick_sample, r.fresh_sample, r.telemetry)
        self.reading_all, self.settings_held, self.start_sampler = r.reading_all, r.settings_held, r.start_sampler
        self.sample_pcie, self.sample_pcie_all, self.sample_offtick = r.sample_pcie, r.sample_pcie_all, r.sample_offtick
        self.needs_pcie_sampling = r.needs_pcie_sampling
        # setters
        self.set_power_limit, self.set_persistence_mode, self.set_compute_mode = (
            s.set_power_limit, s.set_persistence_mode, s.set_compute_mode)
        self.set_locked_gpu_clocks, self.reset_locked_gpu_clocks = s.set_locked_gpu_clocks, s.reset_locked_gpu_clocks
        self.set_locked_memory_clocks, self.reset_locked_memory_clocks = (
            s.set_locked_memory_clocks, s.reset_locked_memory_clocks)
        self.set_applications_clocks, self.reset_applications_clocks = (
            s.set_applications_clocks, s.reset_applications_clocks)
        self.set_clock_offset = s.set_clock_offset
        self.set_fan_speed, self.set_fan_auto, self.fan_policy = s.set_fan_speed, s.set_fan_auto, s.fan_policy

    @property
    def calls(self) -> int:
        """NVML calls made (for the benchmarks)."""
        return self.client.calls

    @property
    def errors(self) -> Counter[str]:
        """NVML errors per function name."""
        return self.client.errors

    @property
    def offtick(self) -> bool:
        """Whether a sampler thread reads the blocking readings (the tick uses its results)."""
        return self.readings.offtick

    @offtick.setter
    def offtick(self, on: bool) -> None:
        self.readings.offtick = on
