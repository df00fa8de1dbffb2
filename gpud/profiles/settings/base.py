"""What every tunable shares: ``Setting``, the interface one implements (its whole life: profile, state
file, hardware, people), its plan and check results, the value words (reset, unknown, unsupported) and the
checks of clock pairs several tunables take."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from gpud.errors import InvalidInput
from gpud.hw.machine import Machine
from gpud.hw.nvml import ARCHITECTURES
from gpud.model import GpuInfo, GpuSample

Scope = Literal["gpu", "host"]
# Plan actions: write it, already there, cannot (with the reason), left to the daemon's fan loop.
PlanAction = Literal["set", "none", "skip", "daemon"]
# Verify statuses: as asked, differs now, no getter (locked clocks, a reset), needs the daemon,
# cannot be read or set here (a CPU governor on a host without cpufreq).
DriftStatus = Literal["ok", "drift", "unverifiable", "daemon", "skip"]

RESET = "reset"
UNKNOWN = "unknown"  # NVML has no getter (locked clocks) and gpud did not set it
UNSUPPORTED = "unsupported"  # desired value recorded for what this GPU cannot take
_ARCH_RANK = {name: code for code, name in ARCHITECTURES.items()}
NUM = (int, float)


@dataclass(frozen=True, order=True)
class Gpu:
    """What a GPU setting acts on: GPU ``index`` (NVML's)."""

    index: int

    @property
    def gpu(self) -> int | None:
        """The index, as plans, drift, journal lines and JSON carry a target (None: the host)."""
        return self.index

    @property
    def key(self) -> str:
        """Its key in the state file: the index as text."""
        return str(self.index)

    @property
    def where(self) -> str:
        return f"GPU {self.index}"


@dataclass(frozen=True)
class Host:
    """What a host setting acts on: the machine itself (its CPUs)."""

    gpu: ClassVar[None] = None
    key: ClassVar[str] = "host"
    where: ClassVar[str] = "host"


HOST = Host()
Target = Gpu | Host


def target_at(gpu: int | None) -> Target:
    """The target a plan's or a drift's ``gpu`` names (None: the host)."""
    return HOST if gpu is None else Gpu(gpu)


def target_keyed(key: str) -> Target | None:
    """The target a state-file key names ("0", "1", … or "host"); None for any other key."""
    if key == HOST.key:
        return HOST
    return Gpu(int(key)) if key.isdigit() else None


def show(v: Any) -> str:
    """A value for people: 300 W, on/off, 2100,2100 (clocks), powersave (governors)."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):  # only power limits are floats
        return f"{v:.0f} W"
    if isinstance(v, dict):
        return "/".join(sorted(set(map(str, v.values()))))
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


def _finite(v: Any, lo: float, hi: float) -> bool:
    return isinstance(v, NUM) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi


@dataclass(frozen=True)
class Planned:
    """One setting's line of a plan, before it becomes a ``Change``."""

    current: Any
    desired: Any
    action: PlanAction
    note: str = ""


@dataclass(frozen=True)
class Checked:
    """One setting compared with the profile now (what ``Drift`` carries, less the GPU)."""

    current: Any
    desired: Any
    status: DriftStatus


class Setting:
    """A tunable of one GPU: its key, get/set pair, comparison, originals and support."""

    key: str = ""
    profile_key: str = ""  # the name in profile files (`required` lists it by this name too)
    scope: Scope = "gpu"
    verifiable = True  # False: NVML has no getter; what gpud set is recorded instead
    needs_persistence = False  # the driver forgets it when the last NVML client exits
    enforced = True  # the daemon re-applies it when the GPU's settings drifted
    restored_first = False  # restored before the others, whatever the state file says (the fans)
    spec: Any = object  # its type in a profile, as a ``gpud.schema.Spec`` gives it
    stored_as = ""  # what the state file holds for it, in words (the error when it holds something else)

    # -- outside the hardware: the profile, the state file, people -------------------------------
    def parse(self, value: Any, file: str, where: str) -> Any:
        """The profile's value checked on its own, before any GPU is known (``InvalidInput`` naming
        ``file`` and the dotted key ``where``)."""
        return value

    def resolve(self, g: GpuInfo, value: Any, file: str, where: str) -> Any:
        """The profile's value for GPU ``g`` in the units of the state file and plans, checked against
        that GPU's limits."""
        return value

    def stored(self, value: Any) -> bool:
        """Whether ``value`` (from the state file's ``desired`` or ``originals``) is one it can act on."""
        return True

    def shown(self, value: Any) -> str:
        return show(value)

    # -- the hardware ---------------------------------------------------------------------------
    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        """The current value (``recorded``: what gpud itself set, for a setting with no getter)."""
        raise NotImplementedError

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        """Write ``value`` (or reset it) and return what was read back (None: nothing to read)."""
        raise NotImplementedError

    def same(self, current: Any, desired: Any) -> bool:
        return bool(current == desired)

    def forgotten(self, value: Any) -> bool:
        """Whether the driver would forget ``value`` when the last NVML client exits without persistence mode
        (a reset to the driver's default is never forgotten)."""
        return self.needs_persistence and value != RESET

    def read_back_ok(self, wanted: Any, got: Any) -> bool:
        return got is None or not self.verifiable or self.same(got, wanted)

    def unsupported(self, g: GpuInfo, value: Any, current: Any) -> str:
        """Why this GPU cannot take ``value`` ("" when it can)."""
        if value is None or value == UNSUPPORTED:
            return "not supported by this GPU"
        if current is None:
            return "not reported by this GPU"
        return ""

    def original(self, current: Any) -> Any:
        """What restore writes back, given the value read before the first write."""
        return current

    def undo(self, current: Any) -> Any:
        """What a rollback writes back, given the value read before this apply's write."""
        return current

    def plan(self, g: GpuInfo, s: GpuSample, value: Any, recorded: Any, daemon: bool) -> Planned:
        cur = self.read(s, recorded)
        skip = self.unsupported(g, value, cur)
        if skip:
            return Planned(cur, value, "skip", skip)
        return Planned(cur, value, "none" if self.same(cur, value) else "set")

    def check(self, s: GpuSample, value: Any, daemon: bool) -> Checked:
        cur = self.read(s)
        if value == RESET:
            return Checked(cur, value, "unverifiable")
        return Checked(cur, value, "ok" if self.same(cur, value) else "drift")


def _clocks(v: Any) -> bool:
    """Two clocks in MHz (min/max or memory/graphics), or what a reset or no getter left."""
    return (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                        and 0 < x < 100_000 for x in v)) or v in (RESET, UNKNOWN)


def _parse_clocks(value: Any, file: str, where: str, ordered: bool) -> Any:
    """[low, high] MHz (``ordered``: low ≤ high), "max" or "reset"."""
    if isinstance(value, str):
        if value not in ("max", RESET):
            raise InvalidInput(file, where, f"must be [low, high] MHz or one of max, reset, not {value!r}")
        return value
    if (len(value) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value)
            or (ordered and value[0] > value[1])):
        raise InvalidInput(file, where, f"must be two positive MHz values{' [min, max]' if ordered else ''}, "
                                        f"not {value!r}")
    return value
