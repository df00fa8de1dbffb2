"""Immutable facts and readings that every layer above ``hw`` works from.

Units are in the field names. ``None`` means "NVML cannot give this here" — never 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

# Clock-event reason bits (NVML's nvmlClocksEventReason*), in bit order.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


# nvmlGpuP2PStatus_t, by code (nvml.h): the names gpud uses for P2P status everywhere.
P2P_STATUSES: tuple[str, ...] = ("OK", "chipset_not_supported", "gpu_not_supported", "topology_not_supported",
                                 "disabled_by_regkey", "not_supported", "unknown")


def decode_clock_events(mask: int) -> tuple[str, ...]:
    """Names of the reasons set in an NVML clock-event bitmask."""
    return tuple(name for bit, name in CLOCK_EVENT_REASONS if mask & bit)


@dataclass(frozen=True)
class Versions:
    driver: str | None
    cuda_driver: str | None  # "12.4" from nvmlSystemGetCudaDriverVersion_v2
    nvml: str | None


@dataclass(frozen=True)
class NvLinkInfo:
    """One NVLink of a GPU: state now, and where it goes."""

    link: int
    up: bool
    remote_pci_bus_id: str | None
    sli_bridge: bool | None  # NVML_NVLINK_CAP_SLI_BRIDGE
    remote_is_switch: bool | None = None  # the link ends at an NVSwitch (HGX), not at a GPU


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one GPU, read once."""

    index: int
    uuid: str
    name: str
    serial: str | None
    pci_bus_id: str  # sysfs form: 0000:17:00.0
    pci_device_id: int | None
    architecture: str | None  # kepler … ampere, ada, hopper, blackwell
    vbios_version: str | None
    memory_total_bytes: int | None
    pcie_max_generation: int | None
    pcie_max_width: int | None
    power_default_limit_watts: float | None
    power_min_limit_watts: float | None
    power_max_limit_watts: float | None
    temperature_slowdown_celsius: int | None
    temperature_shutdown_celsius: int | None
    max_clocks_mhz: dict[str, int | None]  # sm, memory, graphics
    fan_count: int | None
    fan_min_speed_percent: int | None
    fan_max_speed_percent: int | None
    nvlink_count: int  # links that exist (0: no NVLink)
    numa_node: int | None
    cpu_affinity: tuple[int, ...] | None  # CPU ids close to the GPU
    # The GPU's own PCIe maximum (nvmlDeviceGetGpuMaxPcieLinkGeneration); pcie_max_* above are the
    # maximum of the GPU *in this slot* (an x16 card in an x8 slot reports 8 there).
    pcie_gpu_max_generation: int | None = None
    temperature_max_operating_celsius: int | None = None  # NVML_TEMPERATURE_THRESHOLD_GPU_MAX
    # nvidia-smi's "GPU Target Temperature" (NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR): where the driver's
    # automatic fan policy holds the GPU; None where Not Supported (passive cards, many datacenter GPUs)
    temperature_target_celsius: int | None = None
    default_applications_clocks_mhz: dict[str, int | None] = field(default_factory=dict)
    # The clock offsets the driver allows in P0, per domain (graphics, memory): (min, max) MHz; a domain
    # without offsets is absent (nvmlDeviceGetClockOffsets, or the VF-offset range calls before R555)
    clock_offset_ranges_mhz: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Wall time of this process's first nvmlDeviceGetHandleByIndex where it took SLOW_OPEN_S or more: the
    # lookup initialised the GPU (persistence mode off, no other client holding it); None when it was quick.
    open_seconds: float | None = None


# A first handle lookup this slow initialised the GPU: "order of 1-3 second startup cost per GPU due to ECC
# scrubbing" without persistence mode (NVIDIA driver-persistence documentation).
SLOW_OPEN_S = 1.0


def pci_address(text: str) -> tuple[int, int, int, int] | None:
    """A PCI address as the driver compares it, (domain, bus, device, function), from any of its spellings:
    ``0000:17:00.0``, ``00000000:17:00.0`` (nvml.h: nvmlPciInfo_t's busId, busIdLegacy with 4 digits) or
    ``17:00.0`` (no domain); None when it is not one."""
    parts = text.strip().lower().replace(".", ":").split(":")
    if len(parts) == 3:
        parts = ["0", *parts]
    try:
        dom, bus, dev, fn = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return dom, bus, dev, fn


def slow_open(info: GpuInfo | None) -> str | None:
    """Why this command waited for the GPU, where its first NVML lookup initialised it; None otherwise."""
    if info is None or info.open_seconds is None or info.open_seconds < SLOW_OPEN_S:
        return None
    return (f"opening it took {info.open_seconds:.1f} s: no process held it open and persistence mode is off, so "
            "the driver initialised it for this command (ECC scrub, 1-3 s per GPU)")


@dataclass(frozen=True)
class FanReading:
    fan: int
    speed_percent: int | None
    target_percent: int | None
    policy: str | None  # "auto" | "manual"


@dataclass(frozen=True)
class ThermalPoint:
    """One tick of a GPU's cooling, kept by the daemon (``gpud.daemon.thermal``): when, how hot, the mean
    duty its fans read (the duty asked for: NVML reports no measured speed), and its draw."""

    timestamp: float
    temperature_celsius: float
    fan_percent: float
    power_watts: float


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None
    user: str | None
    command: str | None
    kind: str = "compute"  # compute | graphics | compute+graphics (in both of NVML's lists)
    container: str | None = None  # docker:ID, podman:ID, pod:UID, slurm:JOB or unit:NAME (/proc/PID/cgroup)
    # SM use over the latest samples (nvmlDeviceGetProcessUtilization); None: no sample (idle, or unsupported)
    sm_utilization_percent: int | None = None
    # On a MIG-enabled GPU: the GPU instance and compute instance the process runs in (nvmlProcessInfo_t's
    # gpuInstanceId / computeInstanceId); None on a GPU without MIG
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def graphics_only(self) -> bool:
        """On NVML's graphics list alone: a display server, a desktop shell, a browser — the desktop, not a
        job. What such a process does shows in the GPU's utilisation and memory, judged by those."""
        return self.kind == "graphics"


@dataclass(frozen=True)
class MigInstance:
    """One MIG device of a MIG-enabled GPU (a compute instance in its GPU instance), read through its own
    NVML handle (nvmlDeviceGetMigDeviceHandleByIndex). CUDA sees it, not its GPU: a job is given it by
    its UUID (``CUDA_VISIBLE_DEVICES=MIG-…``). Utilisation, clocks, power and temperature are the GPU's,
    shared by all its instances; NVML answers them on the GPU's handle only."""

    index: int  # the MIG device's index under its GPU
    uuid: str  # MIG-…
    gpu_instance_id: int | None
    compute_instance_id: int | None
    profile: str | None  # "3g.40gb": from the MIG device's name ("NVIDIA H100 80GB HBM3 MIG 3g.40gb")
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    memory_reserved_bytes: int | None
    memory_free_bytes: int | None
    processes: tuple[GpuProcess, ...] | None  # the instance's own processes; None: unreadable

    @property
    def idle(self) -> bool:
        """No job in it: no process but a desktop's graphics (the same rule as a whole GPU's)."""
        return self.processes is not None and all(p.graphics_only for p in self.processes)


def mig_profile(name: str | None) -> str | None:
    """The profile a MIG device's NVML name ends with ("… MIG 1g.10gb" → "1g.10gb"); None otherwise."""
    if not name or " MIG " not in name:
        return None
    profile = name.rsplit(" MIG ", 1)[1].strip()
    return profile or None


@dataclass(frozen=True)
class EccCounts:
    volatile_corrected: int | None
    volatile_uncorrected: int | None
    aggregate_corrected: int | None
    aggregate_uncorrected: int | None


@dataclass(frozen=True)
class GpuSample:
    """One GPU's telemetry at one instant. ``lost`` samples carry no readings."""

    index: int
    uuid: str
    timestamp: float
    lost: bool = False
    error: str | None = None  # why a lost GPU could not be read (NVML's answer)
    inaccessible: bool = False  # not lost: NVML refused this user the device (NO_PERMISSION)
    cause: str | None = None  # not lost: the handle lookup named the GPU's problem ("insufficient_power", "irq_issue")
    temperature_celsius: int | None = None
    fans: tuple[FanReading, ...] = ()
    power_watts: float | None = None
    power_limit_watts: float | None = None  # enforced
    power_management_limit_watts: float | None = None  # as set (before other limiters)
    energy_joules: float | None = None
    clocks_mhz: dict[str, int | None] = field(default_factory=dict)  # sm, memory, graphics
    applications_clocks_mhz: dict[str, int | None] = field(default_factory=dict)
    utilization_gpu_percent: int | None = None
    utilization_memory_percent: int | None = None
    memory_used_bytes: int | None = None  # allocated (nvmlMemory_v2_t.used); v1's used where _v2 is missing
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None  # reserved by the driver (_v2 only)
    memory_free_bytes: int | None = None  # what an allocation can still get: total - reserved - used
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_tx_bytes_per_second: int | None = None
    pcie_rx_bytes_per_second: int | None = None
    pcie_replay_errors: int | None = None
    clock_event_mask: int | None = None
    clock_events: tuple[str, ...] | None = None
    persistence_mode: bool | None = None
    compute_mode: str | None = None  # default | exclusive_process | prohibited
    mig_mode: bool | None = None  # MIG enabled (nvmlDeviceGetMigMode current); None: not MIG-capable
    # MIG enabled: its MIG devices (instances), each with its memory and processes; None without MIG or
    # where they could not be read
    mig_instances: tuple[MigInstance, ...] | None = None
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None
    ecc_errors: EccCounts | None = None
    retired_pages_single_bit: int | None = None
    retired_pages_double_bit: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    nvlinks: tuple[NvLinkInfo, ...] = ()
    processes: tuple[GpuProcess, ...] | None = None
    # (link, counter, errors since the driver loaded): replay, recovery, crc_flit, crc_data; read every 10 s
    nvlink_errors: tuple[tuple[int, str, int], ...] | None = None
    # NVML's violation counters: nanoseconds in each clock-event reason since the driver loaded, for the
    # reasons the GPU counts (field values, or nvmlDeviceGetViolationStatus); read every 10 s
    clock_event_nanoseconds: dict[str, int] | None = None
    # (link, direction, bytes of data since the driver loaded): tx, rx; read every 10 s
    nvlink_data_bytes: tuple[tuple[int, str, int], ...] | None = None
    # P0's clock offset per domain (graphics, memory), MHz; a domain without offsets is absent; read every 10 s
    clock_offsets_mhz: dict[str, int] = field(default_factory=dict)


# nvidia-smi topo -m levels, closest first.
TOPO_LEVELS = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class Topology:
    """Pairwise facts: ``level[i][j]`` as ``nvidia-smi topo -m`` prints it (X, NV4, PIX, …)."""

    gpus: tuple[int, ...]
    level: tuple[tuple[str, ...], ...]  # NV# where NVLinks are up, else the PCIe level
    pcie_level: tuple[tuple[str, ...], ...]  # PIX, PXB, PHB, NODE, SYS: the path without NVLink
    nvlinks: tuple[tuple[int, ...], ...]  # active NVLinks between i and j
    p2p_read: tuple[tuple[str, ...], ...]  # "OK", "chipset_not_supported", … ("X" on the diagonal)
    p2p_write: tuple[tuple[str, ...], ...]
    p2p_nvlink: tuple[tuple[str, ...], ...]


def held_over(sample: GpuSample, **fresh: Any) -> GpuSample:
    """``sample`` with ``fresh`` fields replaced: ``dataclasses.replace`` without its per-field work (it
    builds every one of a sample's ~45 fields into ``__init__``'s arguments again: 12 µs a GPU, half of a
    quick tick's own work). ``GpuSample`` has no ``__post_init__`` and no slots, so copying its fields is
    what ``replace`` does; ``fresh`` must name fields of ``GpuSample`` (checked)."""
    unknown = fresh.keys() - _SAMPLE_FIELDS
    if unknown:
        raise TypeError(f"GpuSample has no field {sorted(unknown)}")
    out = object.__new__(GpuSample)
    fields_ = out.__dict__
    fields_.update(sample.__dict__)
    fields_.update(fresh)
    return out


_SAMPLE_FIELDS = frozenset(f.name for f in dataclasses.fields(GpuSample))


@dataclass(frozen=True)
class Snapshot:
    """Everything read in one tick: static info, one sample per GPU, versions."""

    timestamp: float
    versions: Versions
    gpus: tuple[GpuInfo, ...]
    samples: tuple[GpuSample, ...]


def to_jsonable(obj: Any) -> Any:
    """Dataclasses → dicts, tuples → lists, recursively (for ``--json``)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj


# -- host facts (gpud.hw.host) ----------------------------------------------------------


@dataclass(frozen=True)
class PciDevice:
    """A PCI function from /sys/bus/pci/devices, with the bridges above it (root first)."""

    address: str  # 0000:17:00.0
    vendor: int
    device: int
    pci_class: int
    current_link_speed: str | None  # "16.0 GT/s PCIe"
    current_link_width: int | None
    max_link_speed: str | None
    max_link_width: int | None
    numa_node: int | None
    parents: tuple[str, ...]  # bridge addresses from the root complex down
    acs_ctrl: int | None  # ACS Control register; None when unreadable or there is no ACS capability
    driver: str | None
    acs_capable: bool | None = None  # has an ACS capability; None when config space is not readable


# ACS Control bits (PCIe spec 7.7.8.3)
ACS_BITS = (
    (0x01, "SrcValid"),
    (0x02, "TransBlk"),
    (0x04, "ReqRedir"),
    (0x08, "CmpltRedir"),
    (0x10, "UpstreamFwd"),
    (0x20, "EgressCtrl"),
    (0x40, "DirectTrans"),
)


@dataclass(frozen=True)
class XorgOption:
    """One ``Option "Name" "value"`` line of an Xorg configuration file."""

    file: str
    line: int
    section: str | None
    name: str
    value: str | None


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid (PCI:…): N, …`` line of the kernel log."""

    pci_bus_id: str
    xid: int
    text: str
    seconds_since_boot: float | None
    raw: str = ""  # the kernel's line as logged (from ``NVRM: Xid`` on)


@dataclass(frozen=True)
class CpuInfo:
    model: str | None
    sockets: int
    cores: int
    threads: int
    numa_nodes: int


# -- checks (gpud.doctor) -----------------------------------------------------------------

Status = Literal["pass", "warn", "fail", "skip"]  # a check's verdict, as written in every output
STATUSES: tuple[Status, ...] = get_args(Status)


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict, for one GPU (``gpu``) or for the machine (``gpu`` None)."""

    id: str  # stable dotted id: pcie.link_width
    status: Status
    summary: str  # one line
    gpu: int | None = None
    detail: str = ""
    remedy: str = ""


# -- the JSON every command and the daemon's /status write (docs/json.md) -------------------

SCHEMA_VERSION = 2  # 2: every --json has the envelope; sim list and profile list are objects


def host_json(name: str | None, versions: Versions | None = None, gpu_count: int | None = None,
              cpu: CpuInfo | None = None, memory_bytes: int | None = None) -> dict[str, Any]:
    """The one shape of ``host`` in every JSON document; what is not known is null."""
    return {"name": name, "driver_version": versions.driver if versions else None,
            "cuda_driver_version": versions.cuda_driver if versions else None,
            "nvml_version": versions.nvml if versions else None, "gpu_count": gpu_count,
            "cpu": cpu.model if cpu else None, "sockets": cpu.sockets if cpu else None,
            "memory_bytes": memory_bytes}


def sample_json(s: GpuSample) -> dict[str, Any]:
    """A sample as JSON. ``ecc_pending`` is whether an ECC mode change waits for a reboot (the mode
    after reboot differs from the mode now); ``ecc_enabled_after_reboot`` is that pending mode."""
    out: dict[str, Any] = to_jsonable(s)
    after = s.ecc_pending  # the reading holds NVML's pending mode (nvmlDeviceGetEccMode's second output)
    out["ecc_enabled_after_reboot"] = after
    out["ecc_pending"] = (after != s.ecc_enabled) if after is not None and s.ecc_enabled is not None else None
    return out


def document(kind: str, gpud_version: str, host: dict[str, Any], **body: Any) -> dict[str, Any]:
    """The envelope of every JSON document: schema version, kind, gpud version, host."""
    return {"schema_version": SCHEMA_VERSION, "kind": kind, "gpud_version": gpud_version, "host": host,
            **{k: to_jsonable(v) for k, v in body.items()}}


def probe_document(result: dict[str, Any], gpud_version: str, host: dict[str, Any]) -> dict[str, Any]:
    """A probe result (as runner and history keep it) in the shared schema: ``host`` the one host
    shape, ``gpu_count`` for the number of GPUs, ``cpu_affinity_by_rank`` for the CPUs each rank
    was pinned to (``cpu_affinity`` is one GPU's CPU list everywhere else)."""
    body = {k: v for k, v in result.items() if k not in ("host", "gpus", "cpu_affinity", "version")}
    body["gpu_count"] = result.get("gpus") or 0
    body["cpu_affinity_by_rank"] = result.get("cpu_affinity") or []
    body["result_version"] = result.get("version")
    return document("probe", gpud_version, host, **body)
