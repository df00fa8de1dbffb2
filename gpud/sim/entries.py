"""The registry of the simulated NVML library's entry points: ``@entry`` adds a C function by its
exported name; ``gpud.sim.libnvml``'s modules fill it as they load (``gpud.sim`` imports them first).
It stands below the faults, which check an injected call's name against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Entry:
    impl: Callable[..., Any]
    outs: int | str  # trailing output pointers, "text" for (buffer, size), "raw" for the impl's own
    handles: int
    setter: bool  # changes the hardware: runs under the simulator's state lock, on the freshest state
    # answers on a MIG device's handle too; every other entry point is Not Supported there (what nvidia-smi
    # shows of a MIG device is ids, attributes, ECC and memory: the rest is its GPU's)
    mig: bool = False


ENTRIES: dict[str, Entry] = {}


def entry(name: str, outs: int | str = 1, handles: int = 1,
          setter: bool = False, mig: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        ENTRIES[name] = Entry(fn, outs, handles, setter, mig)
        return fn

    return register


def base_name(name: str) -> str:
    """``nvmlDeviceGetPciInfo_v3`` → ``nvmlDeviceGetPciInfo`` (faults name either)."""
    head, sep, tail = name.rpartition("_v")
    return head if sep and tail.isdigit() else name
