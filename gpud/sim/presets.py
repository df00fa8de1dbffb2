"""GPU models the simulator knows: what NVML reports for each (datasheet figures).

A description's ``[[gpu]]`` names one with ``model = "…"`` and may override any key.

Adding a GPU model is one ``Preset`` here (docs/architecture.md, "Adding a simulated GPU model").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """One GPU model as NVML reports it. Field names are the per-GPU keys of a description
    (docs/simulation.md, ``MODEL_KEYS`` in ``gpud.sim.description``), each of which a ``[[gpu]]``
    may override; ``None`` where the model has no such thing (no fan, no T.Limit offsets)."""

    name: str
    pci_device_id: int
    architecture: str
    memory_mib: int
    power_default_watts: float
    power_min_watts: float
    power_max_watts: float
    idle_power_watts: float
    pcie_max_generation: int
    pcie_max_width: int
    fans: int
    fan_min_percent: int | None
    fan_max_percent: int | None
    slowdown_celsius: int
    shutdown_celsius: int
    max_graphics_mhz: int
    max_sm_mhz: int
    max_memory_mhz: int
    nvlinks: int
    vbios: str
    ecc_supported: bool
    retired_pages_supported: bool
    remapped_rows_supported: bool
    pci_subsystem_id: int
    memory_ecc_mib: int | None  # what NVML reports as total with ECC on (None: memory_mib)
    max_operating_celsius: int | None  # T.Limit
    memory_max_celsius: int | None
    default_app_graphics_mhz: int
    default_app_memory_mhz: int
    idle_sm_mhz: int
    idle_memory_mhz: int
    idle_pcie_generation: int | None  # None: the link stays at its trained generation when idle
    pcie_byte_counters: bool  # NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES answered
    tlimit_thresholds: bool  # thresholds only relative to T.Limit (Ada and later, drivers from 550)
    violation_counters: bool  # NVML's violation counters (field values 74/76/269–271, ViolationStatus)
    nvlink_throughput: bool  # NVLink data counters (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/_RX, per link)
    # "GPU Target Temperature" (nvidia-smi -q): where the driver's fan policy holds the GPU at its default
    # power limit; the thermal model's loaded equilibrium (None: not known, the model has one point only)
    target_celsius: int | None
    # The rated boost clock (the datasheet's): where GPU Boost holds a loaded GPU that no limit holds back
    # (``max_sm_mhz`` is the highest clock of the boost table, reached only lightly loaded and cool)
    boost_sm_mhz: int
    # Dense FP16/BF16 tensor throughput with FP32 accumulate at the boost clock (TFLOP/s), and memory
    # bandwidth (GB/s): the datasheets' figures; a training step's time follows them (gpud.sim.perf)
    tensor_tflops: float
    memory_bandwidth_gbs: float
    # What nvmlDeviceGetPowerUsage returns: "instant" (GA100 and older), "average" (over 1 s: Ampere except
    # GA100, and newer), "partial" (a 1 s average of samples covering a quarter of it: A100/H100, SC24)
    power_sensor: str


GPU_MODELS: dict[str, Preset] = {
    "RTX A6000": Preset(
        name="NVIDIA RTX A6000",
        pci_device_id=0x223010DE,
        architecture="ampere",
        memory_mib=49140,
        power_default_watts=300,
        power_min_watts=100,
        power_max_watts=300,
        idle_power_watts=22,
        pcie_max_generation=4,
        pcie_max_width=16,
        fans=1,
        fan_min_percent=30,
        fan_max_percent=100,
        slowdown_celsius=95,
        shutdown_celsius=98,
        max_graphics_mhz=2100,
        max_sm_mhz=2100,
        max_memory_mhz=8001,
        nvlinks=4,
        vbios="94.02.5C.00.02",
        ecc_supported=True,
        retired_pages_supported=False,
        remapped_rows_supported=True,
        pci_subsystem_id=0x145910DE,
        memory_ecc_mib=46068,
        max_operating_celsius=93,
        memory_max_celsius=None,
        default_app_graphics_mhz=1800,
        default_app_memory_mhz=8001,
        idle_sm_mhz=0,
        idle_memory_mhz=405,
        idle_pcie_generation=1,
        pcie_byte_counters=False,
        tlimit_thresholds=False,
        violation_counters=False,
        nvlink_throughput=False,
        target_celsius=84,
        boost_sm_mhz=1800,
        tensor_tflops=154.8,
        memory_bandwidth_gbs=768,
        power_sensor="average",
    ),
    "RTX 6000 Ada": Preset(
        name="NVIDIA RTX 6000 Ada Generation",
        pci_device_id=0x26B110DE,
        architecture="ada",
        memory_mib=49140,
        power_default_watts=300,
        power_min_watts=100,
        power_max_watts=300,
        idle_power_watts=19,
        pcie_max_generation=4,
        pcie_max_width=16,
        fans=1,
        fan_min_percent=30,
        fan_max_percent=100,
        slowdown_celsius=91,
        shutdown_celsius=96,
        max_graphics_mhz=3105,
        max_sm_mhz=3105,
        max_memory_mhz=10001,
        nvlinks=0,
        vbios="95.02.18.80.87",
        ecc_supported=True,
        retired_pages_supported=False,
        remapped_rows_supported=True,
        pci_subsystem_id=0x16A110DE,
        memory_ecc_mib=None,
        max_operating_celsius=89,
        memory_max_celsius=None,
        default_app_graphics_mhz=2505,
        default_app_memory_mhz=10001,
        idle_sm_mhz=210,
        idle_memory_mhz=405,
        idle_pcie_generation=1,
        pcie_byte_counters=False,
        tlimit_thresholds=True,
        violation_counters=False,
        nvlink_throughput=False,
        target_celsius=85,
        boost_sm_mhz=2505,
        tensor_tflops=364.2,
        memory_bandwidth_gbs=960,
        power_sensor="average",
    ),
    "Quadro RTX 8000": Preset(
        name="Quadro RTX 8000",
        pci_device_id=0x1E3010DE,
        architecture="turing",
        memory_mib=48601,
        power_default_watts=260,
        power_min_watts=125,
        power_max_watts=260,
        idle_power_watts=18,
        pcie_max_generation=3,
        pcie_max_width=16,
        fans=1,
        fan_min_percent=33,
        fan_max_percent=100,
        slowdown_celsius=91,
        shutdown_celsius=94,
        max_graphics_mhz=2100,
        max_sm_mhz=2100,
        max_memory_mhz=7001,
        nvlinks=2,
        vbios="90.02.2E.00.0C",
        ecc_supported=True,
        retired_pages_supported=True,
        remapped_rows_supported=False,
        pci_subsystem_id=0x12BA10DE,
        memory_ecc_mib=None,
        max_operating_celsius=None,
        memory_max_celsius=None,
        default_app_graphics_mhz=1395,
        default_app_memory_mhz=7001,
        idle_sm_mhz=300,
        idle_memory_mhz=405,
        idle_pcie_generation=1,
        pcie_byte_counters=False,
        tlimit_thresholds=False,
        violation_counters=False,
        nvlink_throughput=False,
        target_celsius=None,
        boost_sm_mhz=1770,
        tensor_tflops=130.5,
        memory_bandwidth_gbs=672,
        power_sensor="instant",
    ),
    "H200": Preset(
        name="NVIDIA H200",
        pci_device_id=0x233510DE,
        architecture="hopper",
        memory_mib=143771,
        power_default_watts=700,
        power_min_watts=200,
        power_max_watts=700,
        idle_power_watts=75,
        pcie_max_generation=5,
        pcie_max_width=16,
        fans=0,
        fan_min_percent=None,
        fan_max_percent=None,
        slowdown_celsius=90,
        shutdown_celsius=96,
        max_graphics_mhz=1980,
        max_sm_mhz=1980,
        max_memory_mhz=3201,
        nvlinks=18,
        vbios="96.00.AF.00.01",
        ecc_supported=True,
        retired_pages_supported=False,
        remapped_rows_supported=True,
        pci_subsystem_id=0x18B010DE,
        memory_ecc_mib=None,
        max_operating_celsius=88,
        memory_max_celsius=None,
        default_app_graphics_mhz=1980,
        default_app_memory_mhz=3201,
        idle_sm_mhz=345,
        idle_memory_mhz=3201,
        idle_pcie_generation=None,
        pcie_byte_counters=True,
        tlimit_thresholds=True,
        violation_counters=True,
        nvlink_throughput=True,
        target_celsius=None,
        boost_sm_mhz=1980,
        tensor_tflops=989.4,
        memory_bandwidth_gbs=4800,
        power_sensor="partial",
    ),
}
