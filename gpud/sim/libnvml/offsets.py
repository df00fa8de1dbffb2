"""Clock offsets: P0's graphics and memory clock offsets and the range the driver allows, through
``nvmlDeviceGet/SetClockOffsets`` (nvml.h, R555 on) and the older per-domain VF-offset calls
(``nvmlDeviceGet/SetGpcClkVfOffset``, ``…MemClkVfOffset``, their ``MinMax`` ranges).

The range is what NVML reports on a GeForce-class board, −1000..+1000 MHz for the graphics clock
(LACT issue #918's dump of ``nvmlDeviceGetClockOffsets``); the memory range is taken as −1000..+3000 MHz
(a +3000 MHz memory offset applied through NVML on an RTX 4090, LACT issues #418 and #1001). Offsets exist
from Maxwell on ("Maxwell or newer fully supported devices", nvml.h). The driver keeps them while the GPU
stays initialised: persistence mode off, the last client leaving drops them (``SimMachine``). It snaps a
memory offset to an even figure, down (a GTX 1650 Ti's 465 MHz read back 464: LACT issue #1202). Under load an
offset moves the clock the GPU runs at by as much (``gpud.sim.physics``).
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpud.sim.entries import entry
from gpud.sim.libnvml.library import SimLibrary
from gpud.sim.libnvml.returns import ARCH_CODES, INVALID_ARGUMENT, NOT_SUPPORTED, _target, fail

ARGUMENT_VERSION_MISMATCH = 25
CLOCK_OFFSET_V1 = 24 | 1 << 24  # nvmlClockOffset_v1 = NVML_STRUCT_VERSION(ClockOffset, 1): 24 bytes
DOMAINS = {0: "graphics", 2: "memory"}  # NVML_CLOCK_GRAPHICS, NVML_CLOCK_MEM
RANGES_MHZ = {"graphics": (-1000, 1000), "memory": (-1000, 3000)}
PSTATES = 16  # NVML_PSTATE_0 … NVML_PSTATE_15


def offsets(lib: SimLibrary, i: int) -> dict[str, int]:
    """The GPU's offsets as set; a reading changes nothing (a state file from before offsets were simulated
    has none: 0)."""
    if ARCH_CODES.get(lib.gpu(i).architecture, 0) < ARCH_CODES["maxwell"]:
        fail(NOT_SUPPORTED)
    got: dict[str, int] = lib.settings(i).get("clock_offsets") or {"graphics": 0, "memory": 0}
    return got


def _write(lib: SimLibrary, i: int, domain: str, mhz: int) -> None:
    set_now = dict(offsets(lib, i))
    lib.write()
    lo, hi = RANGES_MHZ[domain]
    if not lo <= mhz <= hi:
        fail(INVALID_ARGUMENT)
    lib.sim.step()
    # the memory offset snapped to an even figure, down: 465 reads back 464 (LACT issue #1202)
    set_now[domain] = int(mhz) - int(mhz) % 2 if domain == "memory" else int(mhz)
    lib.settings(i)["clock_offsets"] = set_now


def _struct(out: Any) -> Any:
    target = _target(out)
    if int(getattr(target, "version", 0)) != CLOCK_OFFSET_V1 or ctypes.sizeof(target) < 24:
        fail(ARGUMENT_VERSION_MISMATCH)
    if int(target.type) not in DOMAINS or not 0 <= int(target.pstate) < PSTATES:
        fail(INVALID_ARGUMENT)
    return target


@entry("nvmlDeviceGetClockOffsets", outs="raw")
def _get(lib: SimLibrary, i: int, out: Any) -> None:
    t = _struct(out)
    domain = DOMAINS[int(t.type)]
    t.clockOffsetMHz = offsets(lib, i)[domain]
    t.minClockOffsetMHz, t.maxClockOffsetMHz = RANGES_MHZ[domain]


@entry("nvmlDeviceSetClockOffsets", outs="raw", setter=True)
def _set(lib: SimLibrary, i: int, arg: Any) -> None:
    t = _struct(arg)
    _write(lib, i, DOMAINS[int(t.type)], int(t.clockOffsetMHz))


@entry("nvmlDeviceGetGpcClkVfOffset")
def _gpc(lib: SimLibrary, i: int) -> int:
    return offsets(lib, i)["graphics"]


@entry("nvmlDeviceGetMemClkVfOffset")
def _mem(lib: SimLibrary, i: int) -> int:
    return offsets(lib, i)["memory"]


@entry("nvmlDeviceGetGpcClkMinMaxVfOffset", outs=2)
def _gpc_range(lib: SimLibrary, i: int) -> tuple[int, int]:
    offsets(lib, i)
    return RANGES_MHZ["graphics"]


@entry("nvmlDeviceGetMemClkMinMaxVfOffset", outs=2)
def _mem_range(lib: SimLibrary, i: int) -> tuple[int, int]:
    offsets(lib, i)
    return RANGES_MHZ["memory"]


@entry("nvmlDeviceSetGpcClkVfOffset", outs=0, setter=True)
def _set_gpc(lib: SimLibrary, i: int, mhz: int) -> None:
    _write(lib, i, "graphics", int(mhz))


@entry("nvmlDeviceSetMemClkVfOffset", outs=0, setter=True)
def _set_mem(lib: SimLibrary, i: int, mhz: int) -> None:
    _write(lib, i, "memory", int(mhz))
