"""Workstation descriptions (TOML) → validated, immutable dataclasses.

The format is documented key by key in ``docs/simulation.md``. Every error names the file, the
key and the reason (``InvalidInput``), before anything is built. What is built is a
``Description``: a ``MachineSpec``, one ``GpuSpec`` per GPU (its model's ``Preset`` with the
overrides, and its own keys; ``Process`` per process), ``Bridge`` per NVLink bridge, the ``Fault``s
(``gpud.sim.faults``) and ``Xorg``. The key tables below (``MACHINE_KEYS``…) are the TOML format;
the dataclasses' fields carry the same names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpud.errors import InvalidInput
from gpud.schema import REQUIRED as _ANY
from gpud.schema import load_toml, take
from gpud.sim.faults import FAULTS, PCIE_GENERATIONS, PCIE_WIDTHS, Fault, gpu_pair, validate_fault
from gpud.sim.jobs import PROCESS_KEYS, Process, check_process
from gpud.sim.mig import MigSpec, validate_instances
from gpud.sim.presets import GPU_MODELS, Preset

SHIPPED = Path(__file__).parent / "descriptions"
BUS_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
MIN_GPU_CELSIUS = -40  # the lowest ambient a description allows (machine.ambient_celsius)

MACHINE_KEYS: dict[str, tuple[Any, Any]] = {
    # key: (type or tuple of types / allowed values, default; _ANY = required)
    "name": (str, _ANY),
    "summary": (str, ""),
    "vendor_model": (str, "Workstation"),
    "cpu_model": (str, "Intel(R) Xeon(R) CPU"),
    "sockets": (int, 1),
    "cores_per_socket": (int, 16),
    "threads_per_core": (int, 2),
    "numa_nodes_per_socket": (int, 1),
    "memory_gib": (int, 128),
    "psu_watts": (int, None),  # none: the firmware does not say (SMBIOS has no type 39 entry)
    "cpu_tdp_watts": (int, 350),
    "driver_version": (str, "550.54.15"),
    "cuda_driver_version": (str, "12.4"),
    "nvml_version": (str, "12.550.54.15"),
    "driver_loaded": (bool, True),
    "kernel_cmdline": (str, "BOOT_IMAGE=/boot/vmlinuz root=/dev/nvme0n1p2 ro quiet"),
    "cpu_governor": (str, "performance"),
    "shm_mib": (int, None),  # default: half of memory, as tmpfs does
    "memlock_kib": ((int, str), "unlimited"),
    "iommu": (("off", "passthrough", "translated"), "off"),
    "modules": (list, ["nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm"]),
    "ambient_celsius": ((int, float), 25.0),
    "nvswitches": (list, []),  # PCI addresses of NVSwitches (HGX baseboards)
    "driver_lacks": (list, []),  # NVML entry points an older driver does not export
    "process_entry_bytes": (int, 24),  # the driver's process-list entry: nvml.h 24, early R535 32
}

GPU_KEYS: dict[str, tuple[Any, Any]] = {
    "model": (str, _ANY),
    "bus_id": (str, _ANY),
    "root_port": (str, _ANY),
    "switch": (str, None),
    "numa_node": (int, 0),
    "uuid": (str, None),
    "serial": (str, None),
    "temperature_celsius": ((int, float), 32),
    "power_watts": ((int, float), None),  # draw; default: the model's idle power
    "utilization_percent": (int, 0),
    "memory_used_mib": (int, 1),
    "power_limit_watts": ((int, float), None),  # default: the model's default limit
    "persistence_mode": (bool, True),
    "compute_mode": (("default", "exclusive_process", "prohibited"), "default"),
    "ecc_enabled": (bool, False),
    "ecc_pending_enabled": (bool, None),  # default: the same as ecc_enabled
    "ecc_volatile_corrected": (int, 0),
    "ecc_volatile_uncorrected": (int, 0),
    "ecc_aggregate_corrected": (int, 0),
    "ecc_aggregate_uncorrected": (int, 0),
    "retired_pages_sbe": (int, 0),
    "retired_pages_dbe": (int, 0),
    "retired_pages_pending": (bool, False),
    "remapped_rows_correctable": (int, 0),
    "remapped_rows_uncorrectable": (int, 0),
    "remapped_rows_pending": (bool, False),
    "remapped_rows_failure": (bool, False),
    "pcie_replay_errors": (int, 0),
    "acs": (bool, False),
    "acs_capable": (bool, True),  # the ports above the GPU have an ACS capability at all
    "processes": (list, []),
    "slot_generation": (int, None),  # the slot's (root or switch port's) maximum; default: the GPU's
    "slot_width": (int, None),
    "nvswitch": (bool, False),  # every NVLink goes to an NVSwitch (machine.nvswitches)
    # The described moment as a real dump showed it (``gpud sim import``); None: derived by the physics.
    "fan_percent": (int, None),  # the fans' speed at the described temperature (automatic policy)
    "idle_reason": (bool, None),  # the Idle clock-event reason in the described state (default: at 0 %)
    "sm_mhz": (int, None),  # SM and graphics clock in the described state (default: idle clocks or maximum)
    "memory_mhz": (int, None),
    "memory_reserved_mib": (int, 0),  # memory the driver reserves (nvmlMemory_v2_t.reserved)
    "power_enforced_watts": ((int, float), None),  # a board or module power budget below the limit set
    "mig_mode": (bool, None),  # MIG enabled (nvmlDeviceGetMigMode); None: a GPU without MIG (Not Supported)
    "mig_instances": (list, []),  # with mig_mode: its MIG devices (gpud.sim.mig.MIG_INSTANCE_KEYS)
    # This GPU's silicon: its draw at a given clock above (+) or below (-) its model's, as a share; None:
    # drawn from the machine's seed (docs/simulation.md, "Noise and spread"), 0 with GPUD_SIM_NOISE=0
    "power_variation": ((int, float), None),
}
# Every preset key can be overridden per GPU.
MODEL_KEYS: dict[str, tuple[Any, Any]] = {
    "name": (str, None),
    "pci_device_id": (int, None),
    "architecture": (str, None),
    "memory_mib": (int, None),
    "power_default_watts": ((int, float), None),
    "power_min_watts": ((int, float), None),
    "power_max_watts": ((int, float), None),
    "idle_power_watts": ((int, float), None),
    "pcie_max_generation": (int, None),
    "pcie_max_width": (int, None),
    "fans": (int, None),
    "fan_min_percent": (int, None),
    "fan_max_percent": (int, None),
    "slowdown_celsius": (int, None),
    "shutdown_celsius": (int, None),
    "max_graphics_mhz": (int, None),
    "max_sm_mhz": (int, None),
    "max_memory_mhz": (int, None),
    "nvlinks": (int, None),
    "vbios": (str, None),
    "ecc_supported": (bool, None),
    "retired_pages_supported": (bool, None),
    "remapped_rows_supported": (bool, None),
    "pci_subsystem_id": (int, None),
    "memory_ecc_mib": (int, None),
    "max_operating_celsius": (int, None),
    "memory_max_celsius": (int, None),
    "default_app_graphics_mhz": (int, None),
    "default_app_memory_mhz": (int, None),
    "idle_sm_mhz": (int, None),
    "idle_memory_mhz": (int, None),
    "idle_pcie_generation": (int, None),
    "pcie_byte_counters": (bool, None),
    "tlimit_thresholds": (bool, None),
    "violation_counters": (bool, None),
    "nvlink_throughput": (bool, None),
    "target_celsius": (int, None),
    "boost_sm_mhz": (int, None),
    "tensor_tflops": ((int, float), None),
    "memory_bandwidth_gbs": ((int, float), None),
    "power_sensor": (("instant", "average", "partial"), None),
}
NVLINK_KEYS: dict[str, tuple[Any, Any]] = {"gpus": (list, _ANY), "links": (int, None)}
XORG_KEYS: dict[str, tuple[Any, Any]] = {"conf": (str, None), "files": (dict, {}), "log": (str, None)}


@dataclass(frozen=True)
class MachineSpec:
    """The ``[machine]`` table: the host around the GPUs, its driver and kernel (``MACHINE_KEYS``)."""

    name: str
    summary: str
    vendor_model: str
    cpu_model: str
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    numa_nodes_per_socket: int
    memory_gib: int
    psu_watts: int | None
    cpu_tdp_watts: int
    driver_version: str
    cuda_driver_version: str
    nvml_version: str
    driver_loaded: bool
    kernel_cmdline: str
    cpu_governor: str
    shm_mib: int
    memlock_kib: int | str  # or "unlimited"
    iommu: str  # off, passthrough, translated
    modules: tuple[str, ...]
    ambient_celsius: float
    nvswitches: tuple[str, ...]
    driver_lacks: tuple[str, ...]
    process_entry_bytes: int


@dataclass(frozen=True)
class GpuSpec(Preset):
    """One ``[[gpu]]``: its model's preset with the description's overrides, and the GPU's own keys
    (``GPU_KEYS``): where it sits, what it is doing, its settings at boot and its health."""

    model: str
    bus_id: str
    root_port: str
    switch: str | None
    numa_node: int
    uuid: str
    serial: str
    temperature_celsius: float
    power_watts: float
    utilization_percent: int
    memory_used_mib: int
    power_limit_watts: float
    persistence_mode: bool
    compute_mode: str
    ecc_enabled: bool
    ecc_pending_enabled: bool | None  # None: the same as ecc_enabled
    ecc_volatile_corrected: int
    ecc_volatile_uncorrected: int
    ecc_aggregate_corrected: int
    ecc_aggregate_uncorrected: int
    retired_pages_sbe: int
    retired_pages_dbe: int
    retired_pages_pending: bool
    remapped_rows_correctable: int
    remapped_rows_uncorrectable: int
    remapped_rows_pending: bool
    remapped_rows_failure: bool
    pcie_replay_errors: int
    acs: bool
    acs_capable: bool
    processes: tuple[Process, ...]
    slot_generation: int
    slot_width: int
    nvswitch: bool
    fan_percent: int | None
    idle_reason: bool | None
    sm_mhz: int | None
    memory_mhz: int | None
    memory_reserved_mib: int
    power_enforced_watts: float | None
    mig_mode: bool | None
    mig_instances: tuple[MigSpec, ...]
    power_variation: float | None


@dataclass(frozen=True)
class Bridge:
    """One ``[[nvlink]]``: an NVLink bridge between two GPUs, with this many links."""

    gpus: tuple[int, int]
    links: int


@dataclass(frozen=True)
class Xorg:
    """The ``[xorg]`` table: X server configuration and log."""

    conf: str | None = None
    files: Mapping[str, Any] = field(default_factory=dict)  # xorg.conf.d name: text
    log: str | None = None


@dataclass(frozen=True)
class Description:
    source: str  # file path as given (for messages)
    digest: str  # content hash
    machine: MachineSpec
    gpus: tuple[GpuSpec, ...]
    nvlinks: tuple[Bridge, ...]
    faults: tuple[Fault, ...]
    xorg: Xorg = field(default_factory=Xorg)

    @property
    def name(self) -> str:
        return self.machine.name


def _check_machine(machine: dict[str, Any], file: str) -> None:
    for key, lo, hi in (("cores_per_socket", 1, 1024), ("threads_per_core", 1, 8), ("memory_gib", 1, 1 << 20),
                        ("cpu_tdp_watts", 1, 10_000), ("sockets", 1, 16),
                        ("numa_nodes_per_socket", 1, 64), ("ambient_celsius", -40, 60)):
        if not lo <= machine[key] <= hi:
            raise InvalidInput(file, f"machine.{key}", f"must be {lo}..{hi}, not {machine[key]}")
    if machine["psu_watts"] is not None and not 1 <= machine["psu_watts"] <= 100_000:
        raise InvalidInput(file, "machine.psu_watts", f"must be 1..100000, not {machine['psu_watts']}")
    if machine["shm_mib"] is not None and machine["shm_mib"] < 0:
        raise InvalidInput(file, "machine.shm_mib", "must not be negative")
    if isinstance(machine["memlock_kib"], int) and machine["memlock_kib"] < 0:
        raise InvalidInput(file, "machine.memlock_kib", "must not be negative")
    for key in ("modules", "nvswitches", "driver_lacks"):
        if not all(isinstance(v, str) and v and v.isprintable() for v in machine[key]):
            raise InvalidInput(file, f"machine.{key}", "must be a list of names (strings)")
    for key in ("kernel_cmdline", "driver_version", "cuda_driver_version", "nvml_version", "cpu_governor"):
        if not machine[key].isprintable():
            raise InvalidInput(file, f"machine.{key}", "one line: no newline or control character")


def _check_gpu(gpu: dict[str, Any], file: str, where: str) -> None:
    """Physically impossible or self-contradicting values: the simulator would model nonsense."""
    for key in ("power_default_watts", "power_min_watts", "power_max_watts"):
        if not 0 < gpu[key] <= 5000:
            raise InvalidInput(file, f"{where}.{key}", f"must be 0..5000 W, not {gpu[key]}")
    if not gpu["power_min_watts"] <= gpu["power_default_watts"] <= gpu["power_max_watts"]:
        raise InvalidInput(file, f"{where}.power_default_watts", "must lie within power_min_watts..power_max_watts")
    for key in ("power_watts", "idle_power_watts"):
        if gpu[key] is not None and not 0 <= gpu[key] <= 5000:
            raise InvalidInput(file, f"{where}.{key}", f"must be 0..5000 W, not {gpu[key]}")
    if not 0 < gpu["slowdown_celsius"] < gpu["shutdown_celsius"] <= 150:
        raise InvalidInput(file, f"{where}.slowdown_celsius",
                           f"must be above 0 and below shutdown_celsius ({gpu['shutdown_celsius']} °C, at most 150)")
    # Any temperature a GPU reports: idle GPUs in cold rooms read below the room's 25 °C, a vGPU
    # guest reads 0 °C. The ambient is a model parameter, not a floor (the physics evolves from here).
    if not MIN_GPU_CELSIUS <= gpu["temperature_celsius"] < gpu["shutdown_celsius"]:
        raise InvalidInput(file, f"{where}.temperature_celsius",
                           f"must be between {MIN_GPU_CELSIUS} °C and shutdown_celsius "
                           f"{gpu['shutdown_celsius']} °C")
    if gpu["fans"] < 0 or gpu["fans"] > 8:
        raise InvalidInput(file, f"{where}.fans", "must be 0..8")
    if gpu["fans"] and not 0 <= gpu["fan_min_percent"] <= gpu["fan_max_percent"] <= 100:
        raise InvalidInput(file, f"{where}.fan_min_percent", "must be 0..100 and at most fan_max_percent")
    if gpu["fan_percent"] is not None and not (gpu["fans"] and 0 <= gpu["fan_percent"] <= 100):
        raise InvalidInput(file, f"{where}.fan_percent", "must be 0..100, on a GPU with fans")
    for key in ("sm_mhz", "memory_mhz", "memory_reserved_mib"):
        if gpu[key] is not None and gpu[key] < 0:
            raise InvalidInput(file, f"{where}.{key}", "must not be negative")
    if gpu["power_enforced_watts"] is not None and not 0 < gpu["power_enforced_watts"] <= 5000:
        raise InvalidInput(file, f"{where}.power_enforced_watts",
                           f"must be 0..5000 W, not {gpu['power_enforced_watts']}")
    if gpu["power_variation"] is not None and not -0.3 <= gpu["power_variation"] <= 0.5:
        raise InvalidInput(file, f"{where}.power_variation",
                           f"must be -0.3..0.5 (a share of the model's draw), not {gpu['power_variation']}")
    for key in ("memory_mib", "pcie_max_generation", "pcie_max_width", "max_graphics_mhz", "max_sm_mhz",
                "max_memory_mhz", "boost_sm_mhz", "tensor_tflops", "memory_bandwidth_gbs"):
        if gpu[key] is not None and gpu[key] <= 0:
            raise InvalidInput(file, f"{where}.{key}", "must be positive")
    if gpu["nvlinks"] is not None and not 0 <= gpu["nvlinks"] <= 18:
        raise InvalidInput(file, f"{where}.nvlinks", "must be 0..18")
    if gpu["memory_used_mib"] < 0 or (gpu["memory_mib"] and gpu["memory_used_mib"] > gpu["memory_mib"]):
        raise InvalidInput(file, f"{where}.memory_used_mib", f"must be 0..{gpu['memory_mib']} (the GPU's memory)")
    for key in ("ecc_volatile_corrected", "ecc_volatile_uncorrected", "ecc_aggregate_corrected",
                "ecc_aggregate_uncorrected", "retired_pages_sbe", "retired_pages_dbe", "remapped_rows_correctable",
                "remapped_rows_uncorrectable", "pcie_replay_errors"):
        if gpu[key] < 0:
            raise InvalidInput(file, f"{where}.{key}", "a count must not be negative")
    for key in ("pcie_max_generation", "slot_generation", "idle_pcie_generation"):
        if gpu.get(key) is not None and not 1 <= gpu[key] <= PCIE_GENERATIONS:
            raise InvalidInput(file, f"{where}.{key}", f"must be a PCIe generation, 1..{PCIE_GENERATIONS}")
    for key in ("pcie_max_width", "slot_width"):
        if gpu.get(key) is not None and gpu[key] not in PCIE_WIDTHS:
            raise InvalidInput(file, f"{where}.{key}",
                               f"must be a PCIe link width ({', '.join(map(str, PCIE_WIDTHS))})")
    if gpu.get("ecc_supported") is False:
        if gpu["ecc_enabled"] or gpu.get("ecc_pending_enabled"):
            raise InvalidInput(file, f"{where}.ecc_enabled",
                               "ecc_supported = false: a GPU without ECC cannot enable it")
        for key in ("ecc_volatile_corrected", "ecc_volatile_uncorrected", "ecc_aggregate_corrected",
                    "ecc_aggregate_uncorrected", "retired_pages_sbe", "retired_pages_dbe"):
            if gpu[key]:
                raise InvalidInput(file, f"{where}.{key}", "ecc_supported = false: a GPU without ECC counts no ECC "
                                                           "errors")


def load(path: Path, shown: str | None = None) -> Description:
    """Read and validate a description file."""
    file = shown or str(path)
    data, text = load_toml(path, file)
    return parse(data, file, hashlib.sha256(text).hexdigest()[:16])


def parse(data: dict[str, Any], file: str, digest: str = "") -> Description:
    known = {"machine", "gpu_defaults", "gpu", "nvlink", "fault", "xorg"}
    for key in data:
        if key not in known:
            raise InvalidInput(file, key, f"unknown section (known: {', '.join(sorted(known))})")
    machine = take(data.get("machine", {}), MACHINE_KEYS, file, "machine")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", machine["name"]):
        raise InvalidInput(file, "machine.name", "letters, digits, '.', '_' and '-' only")
    if machine["sockets"] < 1 or machine["numa_nodes_per_socket"] < 1:
        raise InvalidInput(file, "machine.sockets", "must be at least 1")
    if isinstance(machine["memlock_kib"], str) and machine["memlock_kib"] != "unlimited":
        raise InvalidInput(file, "machine.memlock_kib", "must be an integer or \"unlimited\"")
    if machine["process_entry_bytes"] not in (24, 32):
        raise InvalidInput(file, "machine.process_entry_bytes", "must be 24 (nvml.h) or 32 (early R535 drivers)")
    _check_machine(machine, file)
    if machine["shm_mib"] is None:
        machine["shm_mib"] = machine["memory_gib"] * 512
    defaults = data.get("gpu_defaults", {})
    if not isinstance(defaults, dict):
        raise InvalidInput(file, "gpu_defaults", "must be a table")
    raw_gpus = data.get("gpu", [])
    if not isinstance(raw_gpus, list) or not raw_gpus:
        raise InvalidInput(file, "gpu", "at least one [[gpu]] is required")
    gpus = []
    nodes = machine["sockets"] * machine["numa_nodes_per_socket"]
    for i, raw in enumerate(raw_gpus):
        where = f"gpu[{i}]"
        if not isinstance(raw, dict):
            raise InvalidInput(file, where, "must be a table")
        merged = {**defaults, **raw}
        model = merged.get("model")
        if model not in GPU_MODELS:
            raise InvalidInput(file, f"{where}.model", f"unknown GPU model {model!r} (known: {', '.join(GPU_MODELS)})")
        own = take({k: v for k, v in merged.items() if k not in MODEL_KEYS}, GPU_KEYS, file, where)
        overrides = take({k: v for k, v in merged.items() if k in MODEL_KEYS}, MODEL_KEYS, file, where)
        gpu = {**asdict(GPU_MODELS[model]), **{k: v for k, v in overrides.items() if v is not None}, **own}
        for key in ("bus_id", "root_port", "switch"):
            if gpu[key] is not None and not BUS_RE.match(gpu[key]):
                raise InvalidInput(file, f"{where}.{key}", f"must be a PCI address like 0000:17:00.0, not {gpu[key]!r}")
        if not 0 <= gpu["numa_node"] < nodes:
            raise InvalidInput(file, f"{where}.numa_node", f"must be in 0..{nodes - 1}")
        if gpu["power_watts"] is None:
            gpu["power_watts"] = gpu["idle_power_watts"]
        if gpu["power_limit_watts"] is None:
            gpu["power_limit_watts"] = gpu["power_default_watts"]
        for key, own_max in (("slot_generation", "pcie_max_generation"), ("slot_width", "pcie_max_width")):
            if gpu[key] is None:
                gpu[key] = gpu[own_max]
        if gpu["nvswitch"] and not machine["nvswitches"]:
            raise InvalidInput(file, f"{where}.nvswitch", "needs machine.nvswitches (the switches' PCI addresses)")
        if not gpu["power_min_watts"] <= gpu["power_limit_watts"] <= gpu["power_max_watts"]:
            raise InvalidInput(file, f"{where}.power_limit_watts",
                               f"must be within {gpu['power_min_watts']}..{gpu['power_max_watts']} W")
        if not 0 <= gpu["utilization_percent"] <= 100:
            raise InvalidInput(file, f"{where}.utilization_percent", "must be 0..100")
        _check_gpu(gpu, file, where)
        gpu["processes"] = [take(p, PROCESS_KEYS, file, f"{where}.processes[{k}]")
                            for k, p in enumerate(gpu["processes"])]
        for k, proc in enumerate(gpu["processes"]):
            check_process(proc, file, f"{where}.processes[{k}]")
        gpu["uuid"] = gpu["uuid"] or _uuid(machine["name"], i)
        gpu["mig_instances"] = validate_instances(gpu["mig_instances"], gpu, file, where)
        gpu["serial"] = gpu["serial"] or str(1320021000000 + int(_uuid(machine["name"], i)[4:12], 16) % 10**9)
        gpus.append(gpu)
    seen = [g["bus_id"] for g in gpus]
    if len(set(seen)) != len(seen):
        raise InvalidInput(file, "gpu", "two GPUs share a bus_id")
    for i, g in enumerate(gpus):
        for key in ("root_port", "switch"):
            if g[key] is not None and g[key] in seen:
                raise InvalidInput(file, f"gpu[{i}].{key}",
                                   f"{g[key]} is a GPU's bus_id: two devices at one PCI address")
    nvlinks = []
    for k, raw in enumerate(data.get("nvlink", [])):
        link = take(raw, NVLINK_KEYS, file, f"nvlink[{k}]")
        a, b = gpu_pair(link["gpus"], len(gpus), file, f"nvlink[{k}].gpus")
        most = min(gpus[a]["nvlinks"], gpus[b]["nvlinks"])
        if link["links"] is None:
            link["links"] = most
        if not 1 <= link["links"] <= most:
            raise InvalidInput(file, f"nvlink[{k}].links", f"must be 1..{most} for these GPUs")
        nvlinks.append(Bridge((a, b), link["links"]))
    specs = tuple(GpuSpec(**{**g, "processes": tuple(Process(**p) for p in g["processes"])}) for g in gpus)
    faults = tuple(validate_fault(f, len(gpus), file, f"fault[{k}]") for k, f in enumerate(data.get("fault", [])))
    for k, f in enumerate(faults):
        check = FAULTS[f.kind].check_gpus
        if check is not None:
            check(f, specs, file, f"fault[{k}]")
    xorg = take(data.get("xorg", {}), XORG_KEYS, file, "xorg")
    for name, text in xorg["files"].items():
        if not isinstance(text, str):
            raise InvalidInput(file, f"xorg.files.{name}", "must be the file's text (a string)")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*\.conf", name):
            raise InvalidInput(file, f"xorg.files.{name}", "an xorg.conf.d file name: NAME.conf, no '/'")
    for key in ("modules", "nvswitches", "driver_lacks"):
        machine[key] = tuple(machine[key])
    return Description(file, digest, MachineSpec(**machine), specs, tuple(nvlinks), faults, Xorg(**xorg))


def _uuid(name: str, index: int) -> str:
    h = hashlib.sha256(f"{name}/{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def resolve(name_or_path: str) -> tuple[Path, str]:
    """A shipped name (``z8-fury-4x-a6000``) or a path → (file, how to show it)."""
    shipped = SHIPPED / f"{name_or_path}.toml"
    if "/" not in name_or_path and shipped.is_file():
        return shipped, name_or_path
    path = Path(name_or_path)
    if path.is_file() or "/" in name_or_path or name_or_path.endswith(".toml"):
        return path, name_or_path
    names = ", ".join(shipped_names())
    raise InvalidInput(name_or_path, "", f"no such simulated workstation (shipped: {names}) and no such file")


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.toml"))
