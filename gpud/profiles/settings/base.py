"""What every tunable shares: ``Setting[T]``, the interface one implements (its whole life: profile, state
file, hardware, people) for a value of type ``T``, what it acts on (``Gpu`` or ``Host``, read through ``At``), its
plan and check results, and the checks of clock pairs several tunables take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

from gpud.errors import InvalidInput
from gpud.hw.machine import Machine
from gpud.hw.nvml import ARCHITECTURES
from gpud.model import GpuInfo, GpuSample
from gpud.profiles.settings.values import RESET, UNSUPPORTED

Scope = Literal["gpu", "host"]
# Plan actions: write it, already there, cannot (with the reason), left to the daemon's fan loop.
PlanAction = Literal["set", "none", "skip", "daemon"]
# Verify statuses: as asked, differs now, no getter (locked clocks, a reset), needs the daemon,
# cannot be read or set here (a CPU governor on a host without cpufreq).
DriftStatus = Literal["ok", "drift", "unverifiable", "daemon", "skip"]

_ARCH_RANK = {name: code for code, name in ARCHITECTURES.items()}
NUM = (int, float)
T = TypeVar("T")


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


def gpu_index(target: Target) -> int:
    """The GPU a GPU setting acts on (a host target is a caller's mistake: TypeError)."""
    if not isinstance(target, Gpu):
        raise TypeError(f"a GPU setting cannot act on the {target.where}")
    return target.index


def target_at(gpu: int | None) -> Target:
    """The target a plan's or a drift's ``gpu`` names (None: the host)."""
    return HOST if gpu is None else Gpu(gpu)


def target_keyed(key: str) -> Target | None:
    """The target a state-file key names ("0", "1", … or "host"); None for any other key."""
    if key == HOST.key:
        return HOST
    return Gpu(int(key)) if key.isdigit() else None


@dataclass(frozen=True)
class At:
    """What a setting of ``target`` is planned and checked against: the machine, and for a GPU its static
    facts and the reading just taken (``info``, ``sample``). A host setting reads the machine itself."""

    machine: Machine
    target: Target
    gpu_info: GpuInfo | None = None
    gpu_sample: GpuSample | None = None

    @property
    def info(self) -> GpuInfo:
        if self.gpu_info is None:
            raise TypeError(f"{self.target.where}: no GPU's static facts to read a GPU setting against")
        return self.gpu_info

    @property
    def sample(self) -> GpuSample:
        if self.gpu_sample is None:
            raise TypeError(f"{self.target.where}: no GPU reading to read a GPU setting from")
        return self.gpu_sample


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
    if isinstance(v, list | tuple):  # clocks, as the state file lists them or as a setting read them back
        return ",".join(map(str, v))
    return str(v)


@dataclass(frozen=True)
class Planned:
    """One setting's line of a plan, before it becomes a ``Change``: the value read now and the one asked
    for (as people and JSON see them), and what restore and a rollback would write back (the state file's
    form, from the value read now)."""

    current: Any
    desired: Any
    action: PlanAction
    note: str = ""
    original: Any = None
    undo: Any = None


@dataclass(frozen=True)
class Checked:
    """One setting compared with the profile now (what ``Drift`` carries, less the GPU)."""

    current: Any
    desired: Any
    status: DriftStatus


class Setting(Generic[T]):
    """A tunable whose value is a ``T``: its key, its profile form, its state file form, its get/set pair,
    comparison, originals and support. One of a GPU (``scope`` "gpu") or of the host ("host"): both take the
    same calls, a GPU's reading what ``At`` holds of the GPU, the host's the machine.

    Values cross module boundaries (plans, the state file, the daemon's socket) in their JSON form;
    ``from_json`` reads that as a ``T`` (or one of the words reset, unknown), ``to_json`` writes it back, and the
    engine hands the setting typed values only."""

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
        """The profile's value for GPU ``g`` in the units of the state file and plans (its JSON form),
        checked against that GPU's limits."""
        return value

    def accepts(self, at: At, value: Any) -> str:
        """Why ``at`` cannot be asked ``value`` at all, a fault of the profile (exit 2: "" when it can): what
        ``resolve`` cannot tell without the machine (the host's available governors)."""
        return ""

    def from_json(self, raw: Any) -> T:
        """The JSON form (the state file's, a plan's) as a value to act on; ``ValueError`` when it is none."""
        return raw  # type: ignore[no-any-return]  # the settings whose JSON form is their value

    def to_json(self, value: Any) -> Any:
        """A value in the JSON form the state file, plans and the socket carry."""
        return value

    def stored(self, raw: Any) -> bool:
        """Whether ``raw`` (from the state file's ``desired`` or ``originals``) is one it can act on."""
        try:
            self.from_json(raw)
        except (ValueError, TypeError):
            return False
        return True

    def shown(self, value: Any) -> str:
        return show(value)

    # -- the hardware ---------------------------------------------------------------------------
    def read(self, at: At, recorded: Any = None) -> Any:
        """The current value (``recorded``: what gpud itself set, for a setting with no getter)."""
        raise NotImplementedError

    def write(self, machine: Machine, target: Target, value: T) -> Any:
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

    def unsupported(self, at: At, value: Any, current: Any) -> str:
        """Why this GPU (or host) cannot take ``value`` ("" when it can)."""
        if value is None or value == UNSUPPORTED:
            return "not supported by this GPU"
        if current is None:
            return "not reported by this GPU"
        return ""

    def original(self, current: Any) -> Any:
        """What restore writes back (the state file's form), given the value read before the first write."""
        return self.to_json(current)

    def undo(self, current: Any) -> Any:
        """What a rollback writes back (the state file's form), given the value read before this apply's write."""
        return self.to_json(current)

    def plan(self, at: At, value: T, recorded: Any, daemon: bool) -> Planned:
        cur = self.read(at, recorded)
        skip = self.unsupported(at, value, cur)
        if skip:
            return Planned(cur, value, "skip", skip)
        return Planned(cur, value, "none" if self.same(cur, value) else "set", original=self.original(cur),
                       undo=self.undo(cur))

    def check(self, at: At, value: T, daemon: bool) -> Checked:
        cur = self.read(at)
        if value == RESET:
            return Checked(cur, value, "unverifiable")
        return Checked(cur, value, "ok" if self.same(cur, value) else "drift")


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
