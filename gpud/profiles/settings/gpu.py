"""The GPU settings NVML sets directly: persistence and compute mode, the power limit, application
clocks and locked clocks."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from gpud.errors import InvalidInput
from gpud.hw.machine import Machine
from gpud.model import GpuInfo
from gpud.profiles.settings.base import _ARCH_RANK, NUM, At, Checked, Planned, Setting, Target, _parse_clocks, gpu_index
from gpud.profiles.settings.values import (
    RESET,
    UNKNOWN,
    UNSUPPORTED,
    AppClocks,
    ClockRange,
    Reset,
    Unknown,
    clock_pair,
    finite,
)

COMPUTE_MODES = ("default", "exclusive_process", "prohibited")
P = TypeVar("P", AppClocks, ClockRange)


class PersistenceMode(Setting[bool]):
    key = profile_key = "persistence_mode"
    spec = bool
    stored_as = "true or false"

    def from_json(self, raw: Any) -> bool:
        if not isinstance(raw, bool):
            raise ValueError(f"not true or false: {raw!r}")
        return raw

    def read(self, at: At, recorded: Any = None) -> bool | None:
        return at.sample.persistence_mode

    def write(self, machine: Machine, target: Target, value: bool) -> Any:
        return machine.nvml.set_persistence_mode(gpu_index(target), bool(value))


class ComputeMode(Setting[str]):
    key = profile_key = "compute_mode"
    needs_persistence = True
    spec = COMPUTE_MODES
    stored_as = "a compute mode (default, exclusive_process, prohibited)"

    def from_json(self, raw: Any) -> str:
        if raw not in (*COMPUTE_MODES, "exclusive_thread"):  # what NVML reads back of older drivers' settings
            raise ValueError(f"not a compute mode: {raw!r}")
        return str(raw)

    def read(self, at: At, recorded: Any = None) -> str | None:
        return at.sample.compute_mode

    def write(self, machine: Machine, target: Target, value: str) -> Any:
        return machine.nvml.set_compute_mode(gpu_index(target), value)


class PowerLimit(Setting[float]):
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

    def from_json(self, raw: Any) -> float:
        if not finite(raw, 1, 10_000):
            raise ValueError(f"not a power limit in watts: {raw!r}")
        return float(raw)

    def to_json(self, value: Any) -> Any:
        return value  # watts as read or resolved (a float; an older file's whole number stays one)

    def read(self, at: At, recorded: Any = None) -> float | None:
        return at.sample.power_management_limit_watts

    def write(self, machine: Machine, target: Target, value: float) -> Any:
        return machine.nvml.set_power_limit(gpu_index(target), float(value))

    def same(self, current: Any, desired: Any) -> bool:
        return current is not None and abs(float(current) - float(desired)) <= 1.0


class _Clocks(Setting[P | Reset | Unknown], Generic[P]):
    """Two clocks (``pair``: their type), or the words for the driver's default and for no getter; a JSON list
    of two MHz figures in the state file and plans."""

    pair: Callable[[int, int], P]
    spec = (list, str)
    stored_as = 'two clocks in MHz or "reset"'

    def from_json(self, raw: Any) -> P | Reset | Unknown:
        if raw == RESET or raw == UNKNOWN:
            return RESET if raw == RESET else UNKNOWN
        return self.pair(*clock_pair(raw))

    def to_json(self, value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value


class ApplicationsClocks(_Clocks[AppClocks]):
    """[memory MHz, graphics MHz], "max" or "reset" in profiles."""

    pair = AppClocks

    key = profile_key = "applications_clocks"
    needs_persistence = True

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
        return list(pair)

    def read(self, at: At, recorded: Any = None) -> AppClocks | None:
        clocks = at.sample.applications_clocks_mhz
        mem, gfx = clocks.get("memory"), clocks.get("graphics")
        return AppClocks(mem, gfx) if mem is not None and gfx is not None else None

    def write(self, machine: Machine, target: Target, value: AppClocks | Reset | Unknown) -> Any:
        if isinstance(value, str):
            machine.nvml.reset_applications_clocks(gpu_index(target))
            return None
        return AppClocks(*machine.nvml.set_applications_clocks(gpu_index(target), value.memory, value.graphics))

    def original(self, current: Any) -> Any:
        return RESET  # the driver's defaults

    def plan(self, at: At, value: AppClocks | Reset | Unknown, recorded: Any, daemon: bool) -> Planned:
        """"reset" is already done when the clocks read back as the GPU's defaults
        (nvmlDeviceGetDefaultApplicationsClock): a second apply of the same profile plans nothing."""
        p = super().plan(at, value, recorded, daemon)
        default = at.info.default_applications_clocks_mhz or {}
        at_default = p.current is not None and (default.get("memory"), default.get("graphics")) == p.current
        if p.action == "set" and value == RESET and at_default:
            return Planned(p.current, value, "none")
        return p


class LockedClocks(_Clocks[ClockRange]):
    """Locked GPU or memory clocks ([min, max] MHz, "max", "reset" in profiles): NVML has no getter, so what
    gpud set is recorded and shown."""

    pair = ClockRange
    verifiable = False

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

    def read(self, at: At, recorded: Any = None) -> Any:
        """What gpud set (``recorded``, typed by the engine; a word such as unsupported as it is), or
        "unknown"."""
        return UNKNOWN if recorded is None else recorded

    def write(self, machine: Machine, target: Target, value: ClockRange | Reset | Unknown) -> Any:
        n = machine.nvml
        lock, reset = ((n.set_locked_gpu_clocks, n.reset_locked_gpu_clocks) if self.key == "gpu_clocks"
                       else (n.set_locked_memory_clocks, n.reset_locked_memory_clocks))
        if isinstance(value, str):
            reset(gpu_index(target))
        else:
            lock(gpu_index(target), value.low, value.high)
        return None

    def unsupported(self, at: At, value: Any, current: Any) -> str:
        if value is None or value == UNSUPPORTED:
            return "not supported by this GPU"
        g = at.info
        if g.architecture in _ARCH_RANK and _ARCH_RANK[g.architecture] < _ARCH_RANK[self.needs]:
            what = "GPU" if self.key == "gpu_clocks" else "memory"
            return f"locked {what} clocks need {self.needs.title()} or newer ({g.name} is {g.architecture.title()})"
        return ""

    def original(self, current: Any) -> Any:
        return RESET

    def undo(self, current: Any) -> Any:
        return RESET if current == UNKNOWN else self.to_json(current)

    def check(self, at: At, value: ClockRange | Reset | Unknown, daemon: bool) -> Checked:
        return Checked(UNKNOWN, value, "unverifiable")
