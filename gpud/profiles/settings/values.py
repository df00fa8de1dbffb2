"""The values tunables take, typed: the words that stand for no number (reset, unknown, unsupported), a
pair of clocks, a CPU governor per CPU. Each has one reading of the state file's form (``ValueError`` when
it is not one), and its JSON form is what the state file, plans and the daemon's socket carry: a
``NamedTuple`` is a JSON list, a word a string. The fan policy is typed beside its controller
(``gpud.profiles.fancurve``), since the fan loop, doctor and the burn-in read it too."""

from __future__ import annotations

import math
from typing import Any, Final, Literal, NamedTuple

# The driver's default (a reset); no getter and gpud did not set it (locked clocks); a desired value recorded
# for what this GPU cannot take.
Reset = Literal["reset"]
Unknown = Literal["unknown"]
Unsupported = Literal["unsupported"]
RESET: Final[Reset] = "reset"
UNKNOWN: Final[Unknown] = "unknown"
UNSUPPORTED: Final[Unsupported] = "unsupported"
MAX_MHZ = 100_000  # no clock comes near this: a larger figure is a typo (kHz), not a clock


def mhz(v: Any) -> bool:
    """A clock in MHz: a positive whole number below ``MAX_MHZ`` (not a boolean)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < MAX_MHZ


def finite(v: Any, lo: float, hi: float) -> bool:
    """A number (not a boolean), finite, within ``lo``..``hi``."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi


class ClockRange(NamedTuple):
    """Locked clocks: the lowest and highest MHz the GPU may run at (``nvidia-smi -lgc LOW,HIGH``)."""

    low: int
    high: int


class AppClocks(NamedTuple):
    """Application clocks: memory and graphics MHz (``nvidia-smi -ac MEM,GFX``)."""

    memory: int
    graphics: int


def clock_pair(raw: Any) -> tuple[int, int]:
    """Two clocks in MHz from the state file's list (or a pair already read); ValueError otherwise."""
    if isinstance(raw, list | tuple) and len(raw) == 2 and all(mhz(x) for x in raw):
        return int(raw[0]), int(raw[1])
    raise ValueError(f"not two clocks in MHz: {raw!r}")


Governors = dict[int, str]  # each CPU's governor, by CPU number


def governor(raw: Any) -> str | Governors:
    """One governor for every CPU, or (restore, rollback) each CPU's own, keyed by CPU number as text in
    the state file; ValueError otherwise."""
    if isinstance(raw, str) and raw:
        return raw
    if isinstance(raw, dict) and all(str(k).isdigit() and isinstance(g, str) and g for k, g in raw.items()):
        return {int(k): g for k, g in raw.items()}
    raise ValueError(f"not a CPU governor: {raw!r}")


__all__ = ["MAX_MHZ", "RESET", "UNKNOWN", "UNSUPPORTED", "AppClocks", "ClockRange", "Governors", "Reset", "Unknown",
           "Unsupported", "clock_pair", "finite", "governor", "mhz"]
