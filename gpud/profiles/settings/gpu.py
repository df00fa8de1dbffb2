"""The GPU settings NVML sets directly: persistence and compute mode, the power limit, application
clocks and locked clocks."""

from __future__ import annotations

import re
from typing import Any

from gpud.errors import InvalidInput
from gpud.hw.machine import Machine
from gpud.model import GpuInfo, GpuSample
from gpud.profiles.settings.base import (
    _ARCH_RANK,
    NUM,
    RESET,
    UNKNOWN,
    UNSUPPORTED,
    Checked,
    Planned,
    Setting,
    _clocks,
    _finite,
    _parse_clocks,
)


class PersistenceMode(Setting):
    key = profile_key = "persistence_mode"
    spec = bool
    stored_as = "true or false"

    def stored(self, value: Any) -> bool:
        return isinstance(value, bool)

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        return s.persistence_mode

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        return machine.nvml.set_persistence_mode(gpu, bool(value))


class ComputeMode(Setting):
    key = profile_key = "compute_mode"
    needs_persistence = True
    spec = ("default", "exclusive_process", "prohibited")
    stored_as = "a compute mode (default, exclusive_process, prohibited)"

    def stored(self, value: Any) -> bool:
        return value in (*self.spec, "exclusive_thread")  # what NVML reads back of older drivers' settings

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        return s.compute_mode

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        return machine.nvml.set_compute_mode(gpu, value)


class PowerLimit(Setting):
    """Watts in the state file, plans and metrics (`power_limit_watts`); profiles say `power_limit`
    (watts, a share of the default, default/min/max), resolved to watts per GPU."""

    key = "power_limit_watts"
    profile_key = "power_limit"
    needs_persistence = True
    spec = (int, float, str)  # watts, "80%", "default", "min", "max"
    stored_as = "a power limit in watts"

    def parse(self, value: Any, file: str, where: str) -> Any:
        if isinstance(value, str) and value not in ("default", "min", "max") and not re.fullmatch(r"\d+(\.\d+)?%",
                                                                                                  value):
            raise InvalidInput(file, where, f"must be watts, \"NN%\" of the default, \"default\", \"min\" or "
                                            f"\"max\", not {value!r}")
        if isinstance(value, NUM) and value <= 0:
            raise InvalidInput(file, where, "must be positive")
        return value

    def resolve(self, g: GpuInfo, value: Any, file: str, where: str) -> float | None:
        """Watts, a share of the default, default/min/max → watts within the GPU's constraints (None: the
        GPU has no power management, and the plan skips it)."""
        lo, hi, default = g.power_min_limit_watts, g.power_max_limit_watts, g.power_default_limit_watts
        if lo is None or hi is None or default is None:
            return None
        w = round({"default": default, "max": hi, "min": lo}.get(value, 0.0) if value in ("default", "max", "min")
                  else default * float(value[:-1]) / 100.0 if isinstance(value, str) else float(value))
        if not lo <= w <= hi:
            raise InvalidInput(file, where, f"{w:.0f} W is outside GPU {g.index}'s limits {lo:.0f}..{hi:.0f} W "
                                            f"({g.name})")
        return float(w)

    def stored(self, value: Any) -> bool:
        return _finite(value, 1, 10_000)

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        return s.power_management_limit_watts

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        return machine.nvml.set_power_limit(gpu, float(value))

    def same(self, current: Any, desired: Any) -> bool:
        return current is not None and abs(float(current) - float(desired)) <= 1.0


class ApplicationsClocks(Setting):
    """[memory MHz, graphics MHz], "max" or "reset" in profiles."""

    key = profile_key = "applications_clocks"
    needs_persistence = True
    spec = (list, str)
    stored_as = 'two clocks in MHz or "reset"'

    def parse(self, value: Any, file: str, where: str) -> Any:
        return _parse_clocks(value, file, where, ordered=False)

    def resolve(self, g: GpuInfo, value: Any, file: str, where: str) -> Any:
        mem, gfx = g.max_clocks_mhz.get("memory"), g.max_clocks_mhz.get("graphics")
        if value == RESET:
            return RESET
        if mem is None or gfx is None:
            return UNSUPPORTED
        pair = [mem, gfx] if value == "max" else value
        if pair[0] > mem or pair[1] > gfx:
            raise InvalidInput(file, where, f"{pair} MHz is above GPU {g.index}'s maximum [{mem}, {gfx}]")
        return pair

    def stored(self, value: Any) -> bool:
        return _clocks(value)

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        mem, gfx = s.applications_clocks_mhz.get("memory"), s.applications_clocks_mhz.get("graphics")
        return [mem, gfx] if mem is not None and gfx is not None else None

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        if value in (RESET, UNKNOWN, None):
            machine.nvml.reset_applications_clocks(gpu)
            return None
        return list(machine.nvml.set_applications_clocks(gpu, value[0], value[1]))

    def original(self, current: Any) -> Any:
        return RESET  # the driver's defaults

    def plan(self, g: GpuInfo, s: GpuSample, value: Any, recorded: Any, daemon: bool) -> Planned:
        """"reset" is already done when the clocks read back as the GPU's defaults
        (nvmlDeviceGetDefaultApplicationsClock): a second apply of the same profile plans nothing."""
        p = super().plan(g, s, value, recorded, daemon)
        default = g.default_applications_clocks_mhz or {}
        at_default = [default.get("memory"), default.get("graphics")] == p.current
        if p.action == "set" and value == RESET and at_default:
            return Planned(p.current, value, "none")
        return p


class LockedClocks(Setting):
    """Locked GPU or memory clocks: NVML has no getter, so what gpud set is recorded and shown."""

    verifiable = False
    spec = (list, str)  # locked [min, max] MHz, "max", "reset"
    stored_as = 'two clocks in MHz or "reset"'

    def __init__(self, key: str, domain: str, needs: str) -> None:
        self.key = self.profile_key = key
        self.domain = domain  # "sm" or "memory": the GPU's maximum clock this one is bounded by
        self.needs = needs  # the oldest architecture that can lock it

    def parse(self, value: Any, file: str, where: str) -> Any:
        return _parse_clocks(value, file, where, ordered=True)

    def resolve(self, g: GpuInfo, value: Any, file: str, where: str) -> Any:
        top = g.max_clocks_mhz.get(self.domain)
        if value == RESET:
            return RESET
        if top is None:
            return UNSUPPORTED
        lo, hi = (top, top) if value == "max" else value
        if hi > top:
            raise InvalidInput(file, where, f"{hi} MHz is above GPU {g.index}'s maximum {top} MHz")
        return [lo, hi]

    def stored(self, value: Any) -> bool:
        return _clocks(value)

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        return UNKNOWN if recorded is None else recorded

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        n = machine.nvml
        lock, reset = ((n.set_locked_gpu_clocks, n.reset_locked_gpu_clocks) if self.key == "gpu_clocks"
                       else (n.set_locked_memory_clocks, n.reset_locked_memory_clocks))
        if value in (RESET, UNKNOWN, None):
            reset(gpu)
        else:
            lock(gpu, value[0], value[1])
        return None

    def unsupported(self, g: GpuInfo, value: Any, current: Any) -> str:
        if value is None or value == UNSUPPORTED:
            return "not supported by this GPU"
        if g.architecture in _ARCH_RANK and _ARCH_RANK[g.architecture] < _ARCH_RANK[self.needs]:
            what = "GPU" if self.key == "gpu_clocks" else "memory"
            return f"locked {what} clocks need {self.needs.title()} or newer ({g.name} is {g.architecture.title()})"
        return ""

    def original(self, current: Any) -> Any:
        return RESET

    def undo(self, current: Any) -> Any:
        return RESET if current == UNKNOWN else current

    def check(self, s: GpuSample, value: Any, daemon: bool) -> Checked:
        return Checked(UNKNOWN, value, "unverifiable")
