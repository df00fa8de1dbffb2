"""Clock offsets: the graphics or the memory clock moved by a number of MHz along its whole
voltage-frequency curve, what overclocking and undervolting tools call manual clock values (nvidia-settings'
``GPUGraphicsClockOffset``, LACT's per-P-state offsets). A profile says ``gpu_clock_offset = 100`` (MHz, may be
negative) or ``"reset"`` (none); the GPU's own range (``GpuInfo.clock_offset_ranges_mhz``) bounds it."""

from __future__ import annotations

from typing import Any

from gpud.errors import InvalidInput
from gpud.hw.machine import Machine
from gpud.model import GpuInfo
from gpud.profiles.settings.base import At, Setting, Target, gpu_index
from gpud.profiles.settings.values import RESET, UNSUPPORTED

MAX_MHZ = 10_000  # no offset a driver reports comes near this: a larger value is a typo (kHz), not a setting
# The driver snaps an offset to the step its hardware takes: a memory offset of 465 MHz reads back 464 (LACT
# issue #1202). What it read back within this of what was asked is what was asked.
STEP_MHZ = 1


class ClockOffset(Setting[int]):
    """P0's offset of one clock domain (``graphics`` or ``memory``), MHz; 0 is none."""

    needs_persistence = True  # the driver drops it with the GPU's other settings when the last client leaves
    spec = (int, str)
    stored_as = "an offset in MHz"

    def __init__(self, key: str, domain: str) -> None:
        self.key = self.profile_key = key
        self.domain = domain

    def parse(self, value: Any, file: str, where: str) -> Any:
        if isinstance(value, str) and value != RESET:
            raise InvalidInput(file, where, f"must be an offset in MHz or \"reset\", not {value!r}")
        if isinstance(value, int) and not -MAX_MHZ <= value <= MAX_MHZ:
            raise InvalidInput(file, where, f"{value} MHz is not a clock offset (-{MAX_MHZ}..{MAX_MHZ} MHz)")
        return value

    def resolve(self, g: GpuInfo, value: Any, file: str, where: str) -> Any:
        span = g.clock_offset_ranges_mhz.get(self.domain)
        if span is None:
            return UNSUPPORTED
        mhz = 0 if value == RESET else int(value)
        if not span[0] <= mhz <= span[1]:
            raise InvalidInput(file, where, f"{mhz:+d} MHz is outside GPU {g.index}'s {self.domain} clock offsets "
                                            f"{span[0]:+d}..{span[1]:+d} MHz ({g.name})")
        return mhz

    def from_json(self, raw: Any) -> int:
        if isinstance(raw, int) and not isinstance(raw, bool) and -MAX_MHZ <= raw <= MAX_MHZ:
            return raw
        raise ValueError(f"not an offset in MHz: {raw!r}")

    def same(self, current: Any, desired: Any) -> bool:
        return isinstance(current, int) and isinstance(desired, int) and abs(current - desired) <= STEP_MHZ

    def forgotten(self, value: Any) -> bool:
        return value not in (RESET, 0)  # no offset is the driver's default: nothing to forget

    def shown(self, value: Any) -> str:
        return f"{value:+d} MHz" if isinstance(value, int) and not isinstance(value, bool) else super().shown(value)

    def read(self, at: At, recorded: Any = None) -> int | None:
        return at.sample.clock_offsets_mhz.get(self.domain)

    def write(self, machine: Machine, target: Target, value: int) -> Any:
        return machine.nvml.set_clock_offset(gpu_index(target), self.domain, int(value))
