"""The host's settings: the CPU frequency governor."""

from __future__ import annotations

from typing import Any

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.profiles.settings.base import Checked, Planned, Scope, show


class CpuGovernor:
    """The host's CPU frequency governor (every CPU). Its original is each CPU's own governor."""

    key = profile_key = "cpu_governor"
    scope: Scope = "host"
    verifiable = True
    needs_persistence = False
    enforced = True
    restored_first = False
    spec = str
    stored_as = "a CPU governor (or one per CPU)"

    def parse(self, value: Any, file: str, where: str) -> Any:
        return value

    def stored(self, value: Any) -> bool:
        return (isinstance(value, str) and bool(value)) or (isinstance(value, dict) and all(
            k.isdigit() and isinstance(g, str) and g for k, g in value.items()))

    def shown(self, value: Any) -> str:
        """One governor, or each CPU's (``{cpu: governor}``) as the distinct ones: performance/powersave."""
        return show(value)

    def read(self, machine: Machine) -> dict[int, str]:
        return machine.host.cpu_governors()

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
