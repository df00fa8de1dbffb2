"""Every tunable as one object: how it is read, written, compared, restored and supported.

After TuneD's plugins, where a tunable's get and set live together: a ``Setting`` holds its key
(the one name used in the state file, plans, ``gpud verify`` and metrics), its scope (one GPU or
the host), its reader, its writer (which returns what the hardware reads back), its comparison,
what restore and rollback write back, why a GPU cannot take it, whether it can be verified at all,
whether the driver forgets it without persistence mode, and whether the daemon re-applies it.

``REGISTRY`` is the one ordered list: its order is the apply order (per GPU, then the host), its
reverse the rollback and restore order. Adding a tunable means adding one ``Setting`` to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gpud.errors import GpudError
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

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        """The current value (``recorded``: what gpud itself set, for a setting with no getter)."""
        raise NotImplementedError

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        """Write ``value`` (or reset it) and return what was read back (None: nothing to read)."""
        raise NotImplementedError

    def same(self, current: Any, desired: Any) -> bool:
        return bool(current == desired)

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


class PersistenceMode(Setting):
    key = profile_key = "persistence_mode"

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        return s.persistence_mode

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        return machine.nvml.set_persistence_mode(gpu, bool(value))


class ComputeMode(Setting):
    key = profile_key = "compute_mode"
    needs_persistence = True

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

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        return s.power_management_limit_watts

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        return machine.nvml.set_power_limit(gpu, float(value))

    def same(self, current: Any, desired: Any) -> bool:
        return current is not None and abs(float(current) - float(desired)) <= 1.0


class ApplicationsClocks(Setting):
    key = profile_key = "applications_clocks"
    needs_persistence = True

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

    def __init__(self, key: str, domain: str, needs: str) -> None:
        self.key = self.profile_key = key
        self.domain = domain  # "sm" or "memory": the GPU's maximum clock this one is bounded by
        self.needs = needs  # the oldest architecture that can lock it

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


class Fan(Setting):
    """The fan policy. Apply only ever writes the automatic policy; curves and fixed duties are
    driven by the daemon's fan loop (``gpud.profiles.fanloop``), never by enforcement."""

    key = profile_key = "fan"
    enforced = False
    restored_first = True

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        return [f.policy for f in s.fans]

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        info = machine.info(gpu)
        return [machine.nvml.set_fan_auto(gpu, f) for f in range(info.fan_count or 0)] if info else None

    def read_back_ok(self, wanted: Any, got: Any) -> bool:
        return True  # the policy write is read back by Nvml itself

    def original(self, current: Any) -> Any:
        return "auto"

    def plan(self, g: GpuInfo, s: GpuSample, value: Any, recorded: Any, daemon: bool) -> Planned:
        cur = self.read(s)
        if not s.fans or not g.fan_count:
            return Planned(cur, value["mode"], "skip",
                           "no fan control on this GPU (passive card cooled by the chassis)")
        if value["mode"] == "auto":
            return Planned(cur, "auto", "none" if all(p == "auto" for p in cur) else "set")
        if not daemon:
            return Planned(cur, value["mode"], "daemon",
                           "needs the gpud daemon to drive it: fans stay on the automatic policy")
        return Planned(cur, value["mode"], "daemon", "handed to the running gpud daemon's fan controller")

    def check(self, s: GpuSample, value: Any, daemon: bool) -> Checked:
        policies = self.read(s)
        if not s.fans:
            return Checked(None, value["mode"], "unverifiable")
        if value["mode"] == "auto":
            return Checked(policies, "auto", "ok" if all(p == "auto" for p in policies) else "drift")
        if not daemon:
            return Checked(policies, value["mode"], "daemon")  # needs the daemon: not drift
        if value["mode"] == "fixed":
            targets = [f.target_percent for f in s.fans]
            good = all(p == "manual" for p in policies) and all(t == value["percent"] for t in targets)
            return Checked(targets, value["percent"], "ok" if good else "drift")
        return Checked(policies, "curve", "ok" if all(p == "manual" for p in policies) else "drift")


class CpuGovernor:
    """The host's CPU frequency governor (every CPU). Its original is each CPU's own governor."""

    key = profile_key = "cpu_governor"
    scope: Scope = "host"
    verifiable = True
    needs_persistence = False
    enforced = True
    restored_first = False

    def read(self, machine: Machine) -> dict[int, str]:
        return machine.host.cpu_governors()

    @staticmethod
    def shown(per_cpu: dict[int, str]) -> str:
        return "/".join(sorted(set(per_cpu.values())))

    def write(self, machine: Machine, value: str | dict[str, str]) -> dict[int, str]:
        """One governor for every CPU, or (restore, rollback) each CPU's own saved one."""
        try:
            return machine.host.set_cpu_governor(value) if isinstance(value, str) else self._back(machine, value)
        except OSError as err:
            e = GpudError(f"cannot write the CPU governor ({err.strerror or err}: {err.filename or ''})")
            e.remedy = "run as root; check `lsattr` and `cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor`"
            raise e from err

    @staticmethod
    def _back(machine: Machine, per_cpu: dict[str, str]) -> dict[int, str]:
        """Each CPU back to its own saved governor; CPUs already there are not written (a CPU whose
        file could never be written was never changed, and must not stop the others)."""
        now = machine.host.cpu_governors()
        failed: OSError | None = None
        for cpu, gov in per_cpu.items():
            if now.get(int(cpu)) != gov:
                try:
                    machine.host.set_cpu_governor(gov, [int(cpu)])
                except OSError as err:
                    failed = err
        back = machine.host.cpu_governors()
        if failed is not None and any(back.get(int(c)) != g for c, g in per_cpu.items()):
            raise failed
        return back

    def same(self, current: dict[int, str], desired: str) -> bool:
        return bool(current) and set(current.values()) == {desired}

    def read_back_ok(self, wanted: Any, got: Any) -> bool:
        if got is None or not isinstance(wanted, str):
            return True
        return set(got.values()) == {wanted}

    @staticmethod
    def original(before: dict[int, str] | None) -> dict[str, str]:
        """Restore and rollback both write back each CPU's governor as read before the apply."""
        return {str(k): v for k, v in (before or {}).items()}

    def plan(self, machine: Machine, value: str) -> Planned:
        govs = self.read(machine)
        if not govs:
            return Planned(None, value, "skip", "no cpufreq on this host")
        return Planned(self.shown(govs), value, "none" if self.same(govs, value) else "set")

    def check(self, machine: Machine, value: str) -> Checked:
        govs = self.read(machine)
        if not govs:  # no cpufreq (P-states kept by the BIOS, a VM): nothing to compare, nothing to write
            return Checked(None, value, "skip")
        return Checked(self.shown(govs), value, "ok" if self.same(govs, value) else "drift")


PERSISTENCE = PersistenceMode()
COMPUTE = ComputeMode()
POWER = PowerLimit()
APP_CLOCKS = ApplicationsClocks()
GPU_CLOCKS = LockedClocks("gpu_clocks", "sm", "volta")
MEMORY_CLOCKS = LockedClocks("memory_clocks", "memory", "ampere")
FAN = Fan()
GOVERNOR = CpuGovernor()

# The apply order per GPU (persistence first: the settings after it need it), then the host.
GPU_SETTINGS: tuple[Setting, ...] = (PERSISTENCE, COMPUTE, POWER, APP_CLOCKS, GPU_CLOCKS, MEMORY_CLOCKS, FAN)
HOST_SETTINGS: tuple[CpuGovernor, ...] = (GOVERNOR,)
REGISTRY: tuple[Setting | CpuGovernor, ...] = (*GPU_SETTINGS, *HOST_SETTINGS)
BY_KEY: dict[str, Setting] = {s.key: s for s in GPU_SETTINGS}
HOST_BY_KEY: dict[str, CpuGovernor] = {s.key: s for s in HOST_SETTINGS}
KEYS: tuple[str, ...] = tuple(s.key for s in REGISTRY)
PROFILE_KEYS: dict[str, str] = {s.profile_key: s.key for s in GPU_SETTINGS}  # profile name → key


__all__ = ["BY_KEY", "GOVERNOR", "GPU_SETTINGS", "HOST_BY_KEY", "HOST_SETTINGS", "KEYS", "PROFILE_KEYS", "REGISTRY",
           "RESET", "UNKNOWN", "UNSUPPORTED", "Checked", "CpuGovernor", "DriftStatus", "PlanAction", "Planned",
           "Scope", "Setting"]
