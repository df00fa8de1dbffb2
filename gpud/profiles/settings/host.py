"""The host's settings: the CPU frequency governor."""

from __future__ import annotations

from typing import Any

from gpud.errors import GpudError, InvalidInput
from gpud.hw.machine import Machine
from gpud.profiles.settings.base import At, Checked, Planned, Setting, Target, show
from gpud.profiles.settings.values import Governors, governor


class CpuGovernor(Setting[str | Governors]):
    """The host's CPU frequency governor: one for every CPU in a profile; each CPU's own in the originals
    (what restore and a rollback write back)."""

    key = profile_key = "cpu_governor"
    scope = "host"
    spec = str
    stored_as = "a CPU governor (or one per CPU)"

    def parse(self, value: Any, file: str, where: str) -> Any:
        if not value.strip():
            raise InvalidInput(file, where, "must name a CPU governor (performance, powersave, …), not \"\"")
        return value

    def accepts(self, at: At, value: Any) -> str:
        avail = at.machine.host.cpu_governors_available()
        if avail and value not in avail:
            return f"{value!r} not available here (available: {', '.join(sorted(avail))})"
        return ""

    def from_json(self, raw: Any) -> str | Governors:
        return governor(raw)

    def to_json(self, value: Any) -> Any:
        return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value

    def shown(self, value: Any) -> str:
        """One governor, or each CPU's (``{cpu: governor}``) as the distinct ones: performance/powersave."""
        return show(value)

    def read(self, at: At, recorded: Any = None) -> Governors:
        return at.machine.host.cpu_governors()

    def write(self, machine: Machine, target: Target, value: str | Governors) -> Governors:
        """One governor for every CPU, or (restore, rollback) each CPU's own saved one."""
        try:
            return machine.host.set_cpu_governor(value) if isinstance(value, str) else self._back(machine, value)
        except OSError as err:
            e = GpudError(f"cannot write the CPU governor ({err.strerror or err}: {err.filename or ''})")
            e.remedy = "run as root; check `lsattr` and `cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor`"
            raise e from err

    @staticmethod
    def _back(machine: Machine, per_cpu: Governors) -> Governors:
        """Each CPU back to its own saved governor; CPUs already there are not written (a CPU whose
        file could never be written was never changed, and must not stop the others)."""
        now = machine.host.cpu_governors()
        failed: OSError | None = None
        for cpu, gov in per_cpu.items():
            if now.get(cpu) != gov:
                try:
                    machine.host.set_cpu_governor(gov, [cpu])
                except OSError as err:
                    failed = err
        back = machine.host.cpu_governors()
        if failed is not None and any(back.get(c) != g for c, g in per_cpu.items()):
            raise failed
        return back

    def same(self, current: Any, desired: Any) -> bool:
        if isinstance(desired, dict):
            return bool(current == desired)
        return bool(current) and set(current.values()) == {desired}

    def read_back_ok(self, wanted: Any, got: Any) -> bool:
        if got is None or not isinstance(wanted, str):
            return True
        return set(got.values()) == {wanted}

    def plan(self, at: At, value: str | Governors, recorded: Any, daemon: bool) -> Planned:
        """The current governors shown as the distinct ones; restore and a rollback both write back each
        CPU's governor as read now."""
        govs = self.read(at)
        if not govs:
            return Planned(None, value, "skip", "no cpufreq on this host")
        back = self.to_json(govs)
        return Planned(self.shown(govs), value, "none" if self.same(govs, value) else "set", original=back, undo=back)

    def check(self, at: At, value: str | Governors, daemon: bool) -> Checked:
        govs = self.read(at)
        if not govs:  # no cpufreq (P-states kept by the BIOS, a VM): nothing to compare, nothing to write
            return Checked(None, value, "skip")
        return Checked(self.shown(govs), value, "ok" if self.same(govs, value) else "drift")
