"""Contract tests for the NVML layer: run over every shipped description (and real NVML if present).

Like psutil's tests over every backend: the same invariants hold whatever is underneath, and
whatever goes wrong comes out as a gpud error, never a pynvml one.
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any

import pynvml
import pytest
from conftest import SHIPPED

from gpud.backends import open_machine
from gpud.errors import DriverNotLoaded, GpudError, GpuLost, PermissionDenied, Unsupported
from gpud.hw.machine import Machine
from gpud.hw.nvml import Nvml
from gpud.model import TOPO_LEVELS, GpuSample


def _real_machine() -> Machine | None:
    m = open_machine(None)
    try:
        m.nvml.init()
        if m.nvml.device_count() == 0:
            return None
    except GpudError:
        return None
    return m


BACKENDS = [*SHIPPED, "real"]


@pytest.fixture(params=BACKENDS)
def machine(request: pytest.FixtureRequest) -> Machine:
    if request.param == "real":
        m = _real_machine()
        if m is None:
            pytest.skip("no NVIDIA driver/GPU on this machine: the real-NVML backend is checked on GPU hosts")
        return m
    return open_machine(request.param)


def test_static_info_is_complete_and_typed(machine: Machine) -> None:
    snap = machine.snapshot()
    assert snap.versions.driver
    assert len(snap.gpus) == machine.nvml.device_count() == len(snap.samples)
    for g in snap.gpus:
        assert g.uuid.startswith("GPU-")
        assert len(g.pci_bus_id) == 12 and g.pci_bus_id == g.pci_bus_id.lower()
        assert g.name and isinstance(g.name, str)
        assert g.pcie_max_width in (1, 2, 4, 8, 16, None)
        if g.power_min_limit_watts is not None:
            assert g.power_min_limit_watts <= (g.power_default_limit_watts or 0) <= g.power_max_limit_watts
        assert g.temperature_slowdown_celsius is None or g.temperature_slowdown_celsius < g.temperature_shutdown_celsius
        assert g.numa_node is None or g.numa_node >= 0
        assert g.cpu_affinity is None or len(g.cpu_affinity) > 0


def test_samples_are_plausible(machine: Machine) -> None:
    snap = machine.snapshot()
    for s in snap.samples:
        assert not s.lost
        assert 0 < s.temperature_celsius < 110
        assert s.power_watts is None or s.power_watts <= s.power_limit_watts + 0.5
        assert s.memory_used_bytes is None or s.memory_used_bytes <= s.memory_total_bytes
        assert s.utilization_gpu_percent is None or 0 <= s.utilization_gpu_percent <= 100
        for f in s.fans:
            assert f.speed_percent is None or 0 <= f.speed_percent <= 100
            assert f.policy in ("auto", "manual", None)
        assert s.clock_events is None or all(isinstance(e, str) for e in s.clock_events)
        assert s.compute_mode in ("default", "exclusive_process", "prohibited", None)
        # NVML's counters: absent (None) where the GPU keeps none, never negative; SM use a percentage or None
        assert s.clock_event_nanoseconds is None or (s.clock_event_nanoseconds and all(
            isinstance(v, int) and v >= 0 for v in s.clock_event_nanoseconds.values()))
        for link, direction, n in s.nvlink_data_bytes or ():
            assert 0 <= link < len(s.nvlinks) and direction in ("tx", "rx") and n >= 0
        for p in s.processes or ():
            assert p.sm_utilization_percent is None or 0 <= p.sm_utilization_percent <= 100
        for field in dataclasses.fields(GpuSample):
            value = getattr(s, field.name)
            assert not isinstance(value, pynvml.NVMLError)


def test_topology_is_symmetric_and_uses_smi_levels(machine: Machine) -> None:
    snap = machine.snapshot()
    t = machine.topology(snap)
    n = len(t.gpus)
    for a in range(n):
        assert t.level[a][a] == "X"
        for b in range(n):
            assert t.level[a][b] == t.level[b][a]
            assert t.nvlinks[a][b] == t.nvlinks[b][a]
            if a != b:
                lvl = t.level[a][b]
                assert lvl.startswith("NV") or lvl in TOPO_LEVELS
                assert t.pcie_level[a][b] in TOPO_LEVELS[2:]
                assert (t.nvlinks[a][b] > 0) == lvl.startswith("NV")


@pytest.mark.parametrize("name", SHIPPED)
def test_topology_matches_the_description(name: str) -> None:
    m = open_machine(name)
    desc = m.simulation.description
    t = m.topology(m.snapshot())
    down = {tuple(sorted(f.gpus)) for f in desc.faults if f.kind == "nvlink_down"}
    for b in desc.nvlinks:
        i, j = b.gpus
        expect = 0 if tuple(sorted((i, j))) in down else b.links
        assert t.nvlinks[i][j] == expect


def test_a_gpu_lost_mid_run_is_a_gpud_error_and_a_lost_sample(open_sim) -> None:
    m = open_sim("z8-fury-4x-a6000")
    before = m.snapshot()
    assert not any(s.lost for s in before.samples)
    m.simulation.machine.inject("gpu_lost", gpu=2)
    after = m.snapshot()
    assert [s.lost for s in after.samples] == [False, False, True, False]
    assert after.samples[2].uuid == before.samples[2].uuid  # still identifiable
    with pytest.raises(GpuLost) as exc:
        m.nvml.set_power_limit(2, 250)
    assert not isinstance(exc.value, m.simulation.module.NVMLError)
    cause = exc.value.__cause__
    while cause is not None and not isinstance(cause, m.simulation.module.NVMLError):
        cause = cause.__cause__
    assert cause is not None and cause.value in (15, 999)  # GPU_IS_LOST, or UNKNOWN from the handle lookup
    # the other GPUs still answer and their topology still reads
    t = m.topology(after)
    assert t.level[0][1] == "NV4" and t.level[2][3] == "?"


def test_a_gpu_lost_before_first_read(open_sim) -> None:
    m = open_sim("z8-fury-4x-a6000")
    m.simulation.machine.inject("gpu_lost", gpu=0)
    snap = m.snapshot()
    assert snap.samples[0].lost and len(snap.gpus) == 3


def test_not_supported_reads_are_none_not_zero(open_sim) -> None:
    m = open_sim("z8-fury-4x-a6000")
    sim = m.simulation.machine
    sim.inject("unsupported", call="nvmlDeviceGetPowerUsage", gpu=1)
    sim.inject("unsupported", call="nvmlDeviceGetTemperature")
    snap = m.snapshot()
    assert snap.samples[1].power_watts is None
    assert snap.samples[0].power_watts is not None
    assert all(s.temperature_celsius is None for s in snap.samples)
    assert m.nvml.errors["nvmlDeviceGetTemperature"] == 4


def test_not_supported_setter_raises_unsupported(open_sim) -> None:
    m = open_sim("z8-fury-4x-a6000")
    m.simulation.machine.inject("unsupported", call="nvmlDeviceSetGpuLockedClocks", gpu=0)
    with pytest.raises(Unsupported) as exc:
        m.nvml.set_locked_gpu_clocks(0, 1800, 2100)
    assert exc.value.call == "nvmlDeviceSetGpuLockedClocks" and exc.value.gpu == 0
    assert not isinstance(exc.value, pynvml.NVMLError)


def test_no_permission_comes_out_as_permission_denied(open_sim) -> None:
    m = open_sim("z8-fury-4x-a6000")
    m.simulation.machine.inject("no_permission", call="nvmlDeviceSetPowerManagementLimit")
    m.simulation.machine.inject("no_permission", call="nvmlDeviceGetSerial")
    with pytest.raises(PermissionDenied) as exc:
        m.nvml.set_power_limit(1, 250)
    assert "sudo" in exc.value.remedy
    assert not isinstance(exc.value, pynvml.NVMLError)
    assert m.snapshot().gpus[0].serial is None  # an optional read refused: None


def test_passive_card_has_no_fans_and_unsupported_fields(tmp_path) -> None:
    p = tmp_path / "h200.toml"
    p.write_text('[machine]\nname = "h200-box"\n[[gpu]]\nmodel = "H200"\nbus_id = "0000:19:00.0"\n'
                 'root_port = "0000:18:01.0"\n')
    m = open_machine(str(p))
    snap = m.snapshot()
    g, s = snap.gpus[0], snap.samples[0]
    assert g.fan_count in (0, None) and s.fans == ()  # NumFans: NOT_SUPPORTED on a passive card
    assert g.fan_min_speed_percent is None
    assert s.retired_pages_double_bit is None  # Hopper: row remapping, no page retirement
    assert s.remapped_rows_pending is False


def test_no_driver_is_driver_not_loaded(tmp_path) -> None:
    p = tmp_path / "nodrv.toml"
    p.write_text('[machine]\nname = "nodrv"\ndriver_loaded = false\n[[gpu]]\nmodel = "RTX A6000"\n'
                 'bus_id = "0000:17:00.0"\nroot_port = "0000:16:01.0"\n')
    m = open_machine(str(p))
    with pytest.raises(DriverNotLoaded) as exc:
        m.snapshot()
    assert "nvidia-smi" in exc.value.remedy


def test_setters_read_back(open_sim) -> None:
    m = open_sim("z8-fury-4x-a6000")
    n = m.nvml
    assert n.set_power_limit(0, 250) == 250.0
    assert n.set_persistence_mode(0, False) is False
    assert n.set_compute_mode(0, "exclusive_process") == "exclusive_process"
    assert n.set_applications_clocks(0, 8001, 1800) == (8001, 1800)
    assert n.set_fan_speed(0, 0, 70) == 70
    n.set_locked_gpu_clocks(0, 1500, 2000)
    n.set_locked_memory_clocks(0, 8001, 8001)
    s = m.snapshot().samples[0]
    assert s.power_limit_watts == 250 and s.persistence_mode is False
    assert s.fans[0].policy == "manual" and s.fans[0].target_percent == 70
    assert n.set_fan_auto(0, 0) == "auto"
    n.reset_locked_gpu_clocks(0)
    n.reset_locked_memory_clocks(0)
    n.reset_applications_clocks(0)
    assert m.snapshot().samples[0].fans[0].policy == "auto"


def test_invalid_setter_arguments_are_gpud_errors(open_sim) -> None:
    m = open_sim("z8-fury-4x-a6000")
    with pytest.raises(GpudError) as exc:
        m.nvml.set_power_limit(0, 900)  # above the 300 W maximum
    assert not isinstance(exc.value, pynvml.NVMLError)
    with pytest.raises(GpudError):
        m.nvml.set_fan_speed(0, 0, 10)  # below the fan's minimum


def test_static_facts_are_read_once(open_sim) -> None:
    m = open_sim("z8-fury-4x-a6000")
    m.snapshot()
    first = m.nvml.calls
    m.snapshot()
    per_tick = m.nvml.calls - first
    m.snapshot()
    assert m.nvml.calls - first == 2 * per_tick  # steady: no static re-reads
    assert per_tick / 4 < 60, f"{per_tick / 4} NVML calls per GPU per snapshot"


def test_nvml_layer_accepts_the_real_bindings_module() -> None:
    n = Nvml(pynvml)
    try:
        n.init()
    except DriverNotLoaded as err:
        assert isinstance(err.__cause__, pynvml.NVMLError)
        return
    assert n.device_count() >= 0


@pytest.mark.parametrize("name", SHIPPED)
def test_the_simulated_library_never_raises(name: str) -> None:
    """A C library cannot raise: a Python exception inside the stand-in is a simulator bug, which
    gpud would otherwise turn into a quiet "unreadable" (loaded GPUs included)."""
    m = open_machine(name)
    for i in range(len(m.simulation.description.gpus)):
        m.simulation.machine.set_load(i, 80, 200)
    m.topology(m.snapshot(pcie=True))
    m.snapshot()
    assert m.simulation.library.internal_errors == 0


def _as_the_library_sees(arg: Any) -> Any:
    """One argument of a C call as the library reads it: a pointer's target type (its size and fields), a
    handle's device, a number's value (ctypes passes a Python int as the C int the wrapper's types hold)."""
    target = getattr(arg, "_obj", None)  # byref(...)
    if target is not None:
        kind = type(target)
        if issubclass(kind, ctypes.Structure):  # its layout: each field's name, type and offset
            return ("out", ctypes.sizeof(kind), tuple((f[0], f[1]._type_, getattr(kind, f[0]).offset)
                                                      for f in kind._fields_))
        code = getattr(kind, "_type_", None)  # a simple type's letter ("I": unsigned int, "Q": unsigned long long)
        return ("out", ctypes.sizeof(kind), code if isinstance(code, str) else kind.__name__)
    if isinstance(arg, ctypes._Pointer):
        return ("handle", ctypes.addressof(arg.contents))
    return ("in", getattr(arg, "value", arg))


def test_direct_readings_call_the_c_entry_point_as_the_bindings_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpud calls its most frequent readings (``DIRECT_READINGS``) through the C entry point itself: with each
    the library must get what the installed bindings' wrapper gives it (the same inputs, an output of the same
    size and kind), and gpud must read the same answer. Run again through the lowest nvidia-ml-py (.ci/run)."""
    from gpud.hw.nvml.constants import CLOCK_TYPES, DIRECT_READINGS, TEMPERATURE_GPU
    from gpud.sim.libnvml import library

    seen: list[tuple[str, list[Any]]] = []
    bind = library.SimLibrary._bind

    def recording(self: Any, name: str, e: Any) -> Any:
        f = bind(self, name, e)

        def c_function(*args: Any) -> Any:
            seen.append((name, [_as_the_library_sees(a) for a in args]))
            return f(*args)

        return c_function

    monkeypatch.setattr(library.SimLibrary, "_bind", recording)
    m = open_machine("z8-fury-4x-a6000")
    mod, client = m.simulation.module, m.nvml.client
    client.init()
    h = client.handle(0)
    inputs = {"nvmlDeviceGetFanSpeed_v2": (0,), "nvmlDeviceGetTargetFanSpeed": (0,),
              "nvmlDeviceGetTemperature": (TEMPERATURE_GPU,), "nvmlDeviceGetClockInfo": (CLOCK_TYPES["memory"],),
              "nvmlDeviceGetNvLinkState": (0,), "nvmlDeviceGetApplicationsClock": (CLOCK_TYPES["graphics"],)}
    assert set(inputs) <= set(DIRECT_READINGS)
    for name, (_, n) in DIRECT_READINGS.items():
        args = inputs.get(name, ())
        assert len(args) == n, name
        seen.clear()
        wrapped = getattr(mod, name)(h, *args)
        by_gpud = [client.raw(name, h, *args, gpu=0), client.get(name, h, *args, gpu=0)]  # resolving, then resolved
        calls = [s for s in seen if s[0] == name]
        assert len(calls) == 3, (name, seen)
        assert calls[1] == calls[0] and calls[2] == calls[0], name
        for got in by_gpud:
            if isinstance(wrapped, int):
                assert type(got) is int, name
                if name not in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "nvmlDeviceGetFanSpeed",
                                "nvmlDeviceGetFanSpeed_v2", "nvmlDeviceGetTotalEnergyConsumption"):
                    assert got == wrapped, name  # a setting or a state: the same at once (the others move)
            else:  # a struct: each field nvml.h gives it, by name (utilisation moves: its fields' kinds only)
                fields = [f for f, _ in type(got)._fields_]
                assert fields and all(type(getattr(got, f)) is int for f in fields), name
                if name != "nvmlDeviceGetUtilizationRates":
                    assert [getattr(got, f) for f in fields] == [getattr(wrapped, f) for f in fields], name


def test_a_direct_readings_error_keeps_the_bindings_error_as_its_cause(open_sim) -> None:
    """Through the C entry point as through the bindings' wrapper: the gpud error by the code, the bindings' own
    error as ``__cause__`` (docs/architecture.md, "The choke point")."""
    m = open_sim("z8-fury-4x-a6000")
    m.snapshot()
    m.simulation.machine.inject("gpu_lost", gpu=1)
    h = m.nvml.handle(1)
    with pytest.raises(GpuLost) as exc:
        m.nvml.client.get("nvmlDeviceGetPowerUsage", h, gpu=1)
    assert isinstance(exc.value.__cause__, m.simulation.module.NVMLError)
    assert exc.value.code == 15  # GPU_IS_LOST
