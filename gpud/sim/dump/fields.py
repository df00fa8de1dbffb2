"""The fields of ``nvidia-smi -q`` gpud reads, under every name drivers have printed them.

Each field lists its paths: the text form of current drivers, of older ones (``Power Readings``
and ``Power Limit`` before 530, ``Clocks Throttle Reasons`` before 535, ``Ecc Mode`` in some
releases) and the XML form. A value nvidia-smi could not read (``N/A``, ``[Not Supported]``,
``Requested functionality has been deprecated``…) counts as absent.
"""

from __future__ import annotations

import re
from typing import Any, Callable, TypeVar

from gpud.sim.dump.read import Entry, GpuDump, fail

_POWER = ("gpu power readings", "power readings", "gpu_power_readings", "power_readings")
_REASONS = ("clocks event reasons", "clocks throttle reasons", "clocks_event_reasons", "clocks_throttle_reasons")


def _in(sections: tuple[str, ...], *keys: str) -> tuple[str, ...]:
    return tuple(f"{s}/{k}" for s in sections for k in keys)


FIELDS: dict[str, tuple[str, ...]] = {
    "name": ("product name", "product_name"),
    "architecture": ("product architecture", "product_architecture"),
    "mig_mode": ("mig mode/current", "mig_mode/current_mig"),
    "persistence": ("persistence mode", "persistence_mode"),
    "serial": ("serial number", "serial"),
    "uuid": ("gpu uuid", "uuid"),
    "vbios": ("vbios version", "vbios_version"),
    "bus_id": ("pci/bus id", "pci/pci_bus_id"),
    "device_id": ("pci/device id", "pci/pci_device_id"),
    "subsystem_id": ("pci/sub system id", "pci/pci_sub_system_id"),
    "gen_max": ("pci/gpu link info/pcie generation/max", "pci/pci_gpu_link_info/pcie_gen/max_link_gen"),
    "gen_current": ("pci/gpu link info/pcie generation/current", "pci/pci_gpu_link_info/pcie_gen/current_link_gen"),
    "gen_device_max": ("pci/gpu link info/pcie generation/device max",
                       "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen"),
    "gen_host_max": ("pci/gpu link info/pcie generation/host max",
                     "pci/pci_gpu_link_info/pcie_gen/max_host_link_gen"),
    "width_max": ("pci/gpu link info/link width/max", "pci/pci_gpu_link_info/link_widths/max_link_width"),
    "width_current": ("pci/gpu link info/link width/current",
                      "pci/pci_gpu_link_info/link_widths/current_link_width"),
    "replays": ("pci/replays since reset", "pci/replay_counter"),
    "fan": ("fan speed", "fan_speed"),
    "pstate": ("performance state", "performance_state"),
    "memory_total": ("fb memory usage/total", "fb_memory_usage/total"),
    "memory_used": ("fb memory usage/used", "fb_memory_usage/used"),
    "memory_reserved": ("fb memory usage/reserved", "fb_memory_usage/reserved"),
    "compute_mode": ("compute mode", "compute_mode"),
    "utilization": ("utilization/gpu", "utilization/gpu_util"),
    "ecc_current": ("ecc mode/current", "ecc_mode/current_ecc"),
    "ecc_pending": ("ecc mode/pending", "ecc_mode/pending_ecc"),
    "retired_sbe": ("retired pages/single bit ecc", "retired_pages/multiple_single_bit_retirement/retired_count"),
    "retired_dbe": ("retired pages/double bit ecc", "retired_pages/double_bit_retirement/retired_count"),
    "retired_pending": ("retired pages/pending page blacklist", "retired pages/pending",
                        "retired_pages/pending_blacklist"),
    "remapped_rows": ("remapped rows", "remapped_rows"),
    "remap_correctable": ("remapped rows/correctable error", "remapped_rows/remapped_row_corr"),
    "remap_uncorrectable": ("remapped rows/uncorrectable error", "remapped_rows/remapped_row_unc"),
    "remap_pending": ("remapped rows/pending", "remapped_rows/remapped_row_pending"),
    "remap_failure": ("remapped rows/remapping failure occurred", "remapped_rows/remapped_row_failure"),
    "temperature": ("temperature/gpu current temp", "temperature/gpu_temp"),
    "shutdown": ("temperature/gpu shutdown temp", "temperature/gpu_temp_max_threshold"),
    "slowdown": ("temperature/gpu slowdown temp", "temperature/gpu_temp_slow_threshold"),
    "max_operating": ("temperature/gpu max operating temp", "temperature/gpu_temp_max_gpu_threshold"),
    "memory_max": ("temperature/memory max operating temp", "temperature/gpu_temp_max_mem_threshold"),
    # the current margin to T.Limit (nvmlDeviceGetMarginTemperature): T.Limit = current temperature + margin
    "tlimit_margin": ("temperature/gpu t.limit temp", "temperature/gpu current t.limit temp",
                      "temperature/gpu_temp_tlimit"),
    "tlimit_shutdown": ("temperature/gpu shutdown t.limit temp", "temperature/gpu_temp_max_tlimit_threshold"),
    "tlimit_slowdown": ("temperature/gpu slowdown t.limit temp", "temperature/gpu_temp_slow_tlimit_threshold"),
    "tlimit_max_operating": ("temperature/gpu max operating t.limit temp",
                             "temperature/gpu_temp_max_gpu_tlimit_threshold"),
    "power_draw": _in(_POWER, "power draw", "average power draw", "instantaneous power draw", "power_draw",
                      "average_power_draw", "instant_power_draw"),
    "power_limit": _in(_POWER, "current power limit", "power limit", "enforced power limit",
                       "current_power_limit", "power_limit", "enforced_power_limit"),
    "power_requested": _in(_POWER, "requested power limit", "requested_power_limit"),
    "power_default": _in(_POWER, "default power limit", "default_power_limit"),
    "power_min": _in(_POWER, "min power limit", "min_power_limit"),
    "power_max": _in(_POWER, "max power limit", "max_power_limit"),
    # Driver 580+: time in each reason (NVML's violation counters), e.g. "SW Power Capping : 204642816 us"
    "violation_power": ("clocks event reasons counters/sw power capping",
                        "clocks_event_reasons_counters/clocks_event_reasons_counters_sw_power_cap"),
    "clock_graphics": ("clocks/graphics", "clocks/graphics_clock"),
    "clock_sm": ("clocks/sm", "clocks/sm_clock"),
    "clock_memory": ("clocks/memory", "clocks/mem_clock"),
    "app_graphics": ("applications clocks/graphics", "applications_clocks/graphics_clock"),
    "app_memory": ("applications clocks/memory", "applications_clocks/mem_clock"),
    "default_app_graphics": ("default applications clocks/graphics", "default_applications_clocks/graphics_clock"),
    "default_app_memory": ("default applications clocks/memory", "default_applications_clocks/mem_clock"),
    "max_graphics": ("max clocks/graphics", "max_clocks/graphics_clock"),
    "max_sm": ("max clocks/sm", "max_clocks/sm_clock"),
    "max_memory": ("max clocks/memory", "max_clocks/mem_clock"),
}

# clock-event reason as printed (text, XML suffix) → gpud's name
REASONS: dict[str, str] = {
    "idle": "gpu_idle", "gpu_idle": "gpu_idle",
    "applications clocks setting": "applications_clocks_setting",
    "applications_clocks_setting": "applications_clocks_setting",
    "sw power cap": "sw_power_cap", "sw_power_cap": "sw_power_cap",
    "hw slowdown": "hw_slowdown", "hw_slowdown": "hw_slowdown",
    "hw thermal slowdown": "hw_thermal_slowdown", "hw_thermal_slowdown": "hw_thermal_slowdown",
    "hw power brake slowdown": "hw_power_brake_slowdown", "hw_power_brake_slowdown": "hw_power_brake_slowdown",
    "sync boost": "sync_boost", "sync_boost": "sync_boost",
    "sw thermal slowdown": "sw_thermal_slowdown", "sw_thermal_slowdown": "sw_thermal_slowdown",
    "display clock setting": "display_clock_setting", "display_clocks_setting": "display_clock_setting",
}
_CORRECTABLE = {"sram correctable", "dram correctable", "sram_correctable", "dram_correctable",
                "single bit/total", "single_bit/total"}
_UNCORRECTABLE = {"sram uncorrectable parity", "sram uncorrectable sec-ded", "sram uncorrectable",
                  "dram uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded",
                  "sram_uncorrectable", "dram_uncorrectable", "double bit/total", "double_bit/total"}
_ABSENT = re.compile(r"^(\[.*\]|n/a|not supported|not available|unknown error|insufficient permissions|"
                     r"requested functionality has been deprecated|none|)$", re.I)
T = TypeVar("T")


def absent(value: str) -> bool:
    return bool(_ABSENT.match(value.strip()))


class Reader:
    """One GPU's fields, parsed; a present value that cannot be parsed is ``file:line: reason``."""

    def __init__(self, gpu: GpuDump, file: str):
        self.gpu = gpu
        self.file = file
        self.lower: dict[str, Entry] = {}  # lower-case path of every entry, for case-insensitive look-ups ("Ecc Mode")
        for e in gpu.entries:
            self.lower.setdefault(e.path.lower(), e)

    def entry(self, name: str) -> Entry | None:
        for path in FIELDS[name]:
            e = self.lower.get(path)
            if e is not None and not absent(e.value):
                return e
        return None

    def has_section(self, name: str) -> bool:
        return any(p in self.lower for p in FIELDS[name])

    def _parse(self, name: str, conv: Callable[[str], T | None], what: str) -> T | None:
        e = self.entry(name)
        if e is None:
            return None
        value = conv(e.value)
        if value is None:
            key = e.path.rsplit("/", 1)[-1]
            raise fail(self.file, e.line, f"{key}: expected {what}, found {e.value!r}")
        return value

    def text(self, name: str) -> str | None:
        e = self.entry(name)
        return e.value if e else None

    def number(self, name: str, unit: str = "") -> float | None:
        def conv(v: str) -> float | None:
            m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*" + re.escape(unit) if unit else r"(-?\d+(?:\.\d+)?)", v.strip())
            return float(m.group(1)) if m else None
        return self._parse(name, conv, f"a number{' in ' + unit if unit else ''}")

    def integer(self, name: str, unit: str = "") -> int | None:
        v = self.number(name, unit)
        return None if v is None else int(round(v))

    def hex_id(self, name: str) -> int | None:
        def conv(v: str) -> int | None:
            m = re.fullmatch(r"(?:0x)?([0-9A-Fa-f]{1,8})", v.strip())
            return int(m.group(1), 16) if m else None
        return self._parse(name, conv, "a hexadecimal id like 0x223010DE")

    def flag(self, name: str, yes: tuple[str, ...], no: tuple[str, ...]) -> bool | None:
        def conv(v: str) -> bool | None:
            low = v.strip().lower()
            return True if low in yes else False if low in no else None
        return self._parse(name, conv, " or ".join(repr(x) for x in yes + no))

    def ecc_counts(self, scope: str) -> tuple[int | None, int | None]:
        """(corrected, uncorrected) summed over the memory kinds of ``volatile`` or ``aggregate``."""
        corrected = uncorrected = None
        for e in self.gpu.entries:
            low = e.path.lower()
            for prefix in (f"ecc errors/{scope}/", f"ecc_errors/{scope}/"):
                if not low.startswith(prefix) or absent(e.value):
                    continue
                leaf = low[len(prefix):]
                if leaf not in _CORRECTABLE and leaf not in _UNCORRECTABLE:
                    continue
                if not e.value.strip().isdigit():
                    raise fail(self.file, e.line, f"{leaf}: expected a count, found {e.value!r}")
                if leaf in _CORRECTABLE:
                    corrected = (corrected or 0) + int(e.value)
                else:
                    uncorrected = (uncorrected or 0) + int(e.value)
        return corrected, uncorrected

    def reasons(self) -> tuple[list[str], bool]:
        """Active clock-event reasons, and whether the section was there at all."""
        active: list[str] = []
        seen = False
        for e in self.gpu.entries:
            low = e.path.lower()
            section, _, leaf = low.partition("/")
            if section not in _REASONS or not leaf:
                continue
            seen = True
            for prefix in ("clocks_event_reason_", "clocks_throttle_reason_"):
                leaf = leaf.removeprefix(prefix)
            name = REASONS.get(leaf)
            if name and e.value.strip().lower() == "active" and name not in active:
                active.append(name)
        return active, seen

    def processes(self) -> list[dict[str, Any]]:
        """Processes as ``pid``, ``type``, ``name``, ``used_mib`` (text and XML forms)."""
        procs: list[dict[str, Any]] = []
        for e in self.gpu.entries:
            low = e.path.lower()
            if not low.startswith("processes/"):
                continue
            leaf = low.rsplit("/", 1)[-1]
            if leaf in ("process id", "pid"):
                if not e.value.strip().isdigit():
                    raise fail(self.file, e.line, f"process id: expected a number, found {e.value!r}")
                procs.append({"pid": int(e.value), "type": "C", "name": "", "used_mib": 0, "line": e.line})
            elif procs and leaf == "type":
                procs[-1]["type"] = e.value.strip()
            elif procs and leaf in ("name", "process_name"):
                procs[-1]["name"] = e.value.strip()
            elif procs and leaf in ("used gpu memory", "used_memory"):
                m = re.fullmatch(r"(\d+)\s*MiB", e.value.strip())
                procs[-1]["used_mib"] = int(m.group(1)) if m else 0
        return procs
