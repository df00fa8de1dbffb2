"""The simulator: descriptions, persistence across processes, faults, thermal model."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MINIMAL, REPO, SHIPPED

from gpud.backends import open_machine
from gpud.errors import InvalidInput
from gpud.sim import reset
from gpud.sim.description import load, parse
from gpud.sim.faults import validate_fault


def test_every_shipped_description_loads() -> None:
    assert set(SHIPPED) == {"z8-fury-4x-a6000", "z8-fury-4x-a6000-degraded", "z8-fury-4x-rtx6000ada",
                            "z8-g4-2x-rtx8000-sli", "2s-8x-a6000", "hgx-8x-h200"}
    for name in SHIPPED:
        m = open_machine(name)
        assert m.label == name


def test_writes_persist_across_processes_until_reset() -> None:
    a = open_machine("z8-fury-4x-a6000")
    a.nvml.set_power_limit(3, 240)
    b = open_machine("z8-fury-4x-a6000")  # a new NVML layer and simulator: a new process, in effect
    assert b.snapshot().samples[3].power_limit_watts == 240
    reset("z8-fury-4x-a6000")
    c = open_machine("z8-fury-4x-a6000")
    assert c.snapshot().samples[3].power_limit_watts == 300


def test_faults_injected_elsewhere_are_seen_by_a_running_reader() -> None:
    daemon = open_machine("z8-fury-4x-a6000")
    assert not daemon.snapshot().samples[1].lost
    other = open_machine("z8-fury-4x-a6000")
    other.simulation.machine.inject("gpu_lost", gpu=1)
    daemon.simulation.machine._checked = 0.0  # skip the 250 ms refresh throttle
    assert daemon.snapshot().samples[1].lost


def test_writes_are_counted() -> None:
    m = open_machine("z8-fury-4x-a6000")
    sim = m.simulation.machine
    assert sim.state["writes"] == 0
    m.nvml.set_power_limit(0, 250)
    m.nvml.set_fan_speed(0, 0, 60)
    assert sim.state["writes"] == 2


def test_degraded_description_shows_each_fault() -> None:
    m = open_machine("z8-fury-4x-a6000-degraded")
    snap = m.snapshot()
    s = {x.index: x for x in snap.samples}
    assert s[2].pcie_width == 8
    assert not any(ln.up for ln in s[2].nvlinks) and not any(ln.up for ln in s[3].nvlinks)
    assert all(ln.up for ln in s[0].nvlinks)
    assert s[1].temperature_celsius == 89 and {"hw_slowdown", "hw_thermal_slowdown"} <= set(s[1].clock_events)
    # GPU3's stalled fan: NVML reports the duty asked for, the GPU is hot and held down by the driver
    assert s[3].fans[0].speed_percent == 100 and s[3].temperature_celsius == 94
    assert "sw_thermal_slowdown" in s[3].clock_events
    assert s[0].power_limit_watts == 200
    assert [x.persistence_mode for x in snap.samples] == [True, False, False, False]
    assert s[1].processes[0].user == "alice"


def test_thermal_model_fan_and_power_move_the_temperature() -> None:
    m = open_machine("z8-fury-4x-a6000")
    sim = m.simulation.machine
    sim.set_load(0, 100, 290)
    sim.advance(600)
    assert sim.temperature(0) > 70
    m.nvml.set_fan_speed(0, 0, 60)  # below what the automatic policy runs it at under this load (about 95 %)
    sim.advance(600)
    hot = sim.temperature(0)
    m.nvml.set_fan_speed(0, 0, 100)
    sim.advance(600)
    cooled = sim.temperature(0)
    assert cooled < hot - 2, (hot, cooled)
    m.nvml.set_power_limit(0, 150)
    sim.advance(600)
    assert sim.temperature(0) < cooled - 5
    # the described equilibrium is stable when nothing changes (GPU 3: no loaded neighbour warms its air)
    assert abs(sim.temperature(3) - 36) < 0.5


def test_fan_stuck_heats_a_loaded_gpu() -> None:
    m = open_machine("z8-fury-4x-a6000")
    sim = m.simulation.machine
    sim.set_load(1, 100, 280)
    sim.inject("fan_stuck", gpu=1)
    sim.advance(900)
    s = m.snapshot().samples[1]
    assert s.fans[0].speed_percent == 100  # what the driver asks for, not what the fan does (NVML)
    assert s.temperature_celsius >= 95 and "hw_thermal_slowdown" in s.clock_events


def test_runtime_faults_rebuild_the_host_tree() -> None:
    from gpud.sim import open_simulation

    sim = open_simulation("z8-fury-4x-a6000")
    sim.machine.inject("xid", gpu=0, xid=79)
    sim.machine.inject("link_degraded", gpu=1, width=4)
    sim.refresh_root()
    m = open_machine("z8-fury-4x-a6000")
    assert [e.xid for e in m.host.xid_events()] == [79]
    assert m.host.pci_device("0000:38:00.0").current_link_width == 4
    assert m.snapshot().samples[1].pcie_width == 4


@pytest.mark.parametrize(
    ("patch", "key", "reason"),
    [
        ('[[gpu]]\nmodel = "RTX 9000"\nbus_id = "0000:18:00.0"\nroot_port = "0000:17:01.0"\n', "gpu[1].model",
         "unknown GPU model"),
        ('[[gpu]]\nmodel = "RTX A6000"\nbus_id = "18:00.0"\nroot_port = "0000:17:01.0"\n', "gpu[1].bus_id",
         "PCI address"),
        ('[[gpu]]\nmodel = "RTX A6000"\nbus_id = "0000:18:00.0"\nroot_port = "0000:17:01.0"\nfanz = 1\n',
         "gpu[1].fanz", "unknown key"),
        ('[[gpu]]\nmodel = "RTX A6000"\nbus_id = "0000:18:00.0"\nroot_port = "0000:17:01.0"\n'
         "power_limit_watts = 500\n", "gpu[1].power_limit_watts", "within 100..300"),
        ('[[nvlink]]\ngpus = [0, 5]\n', "nvlink[0].gpus", "GPU indices"),
        ('[[fault]]\nkind = "meltdown"\n', "fault[0].kind", "must be one of"),
        ('[[fault]]\nkind = "xid"\ngpu = 0\n', "fault[0].xid", "required"),
        ('[[fault]]\nkind = "clock_events"\ngpu = 0\nreasons = ["too_hot"]\n', "fault[0].reasons", "unknown reason"),
        ('[machine.extra]\n', "machine.extra", "unknown key"),
    ],
)
def test_invalid_descriptions_name_file_key_reason(tmp_path: Path, patch: str, key: str, reason: str) -> None:
    p = tmp_path / "bad.toml"
    p.write_text(MINIMAL.format(name="bad") + patch)
    with pytest.raises(InvalidInput) as exc:
        load(p)
    assert exc.value.file == str(p) and exc.value.key == key and reason in exc.value.reason
    assert str(exc.value).startswith(f"{p}: {key}: ")


def test_type_errors_are_reported() -> None:
    with pytest.raises(InvalidInput, match="machine.sockets: must be an integer"):
        parse({"machine": {"name": "x", "sockets": "two"}, "gpu": [{}]}, "f.toml")
    with pytest.raises(InvalidInput, match="gpu: at least one"):
        parse({"machine": {"name": "x"}}, "f.toml")


def test_state_from_another_description_version_is_dropped(tmp_path: Path) -> None:
    p = tmp_path / "box.toml"
    p.write_text(MINIMAL.format(name="box"))
    open_machine(str(p)).nvml.set_power_limit(0, 200)
    assert open_machine(str(p)).snapshot().samples[0].power_limit_watts == 200
    p.write_text(MINIMAL.format(name="box") + "# edited\n")
    assert open_machine(str(p)).snapshot().samples[0].power_limit_watts == 300


def test_state_file_is_json(state_dir: Path) -> None:
    open_machine("z8-fury-4x-a6000").nvml.set_persistence_mode(0, False)
    data = json.loads((state_dir / "sim" / "z8-fury-4x-a6000.json").read_text())
    assert data["gpus"]["0"]["persistence"] == 0


def test_the_dataclasses_carry_every_key_of_the_format() -> None:
    """The TOML key tables and the dataclasses the validator builds name the same things: a key
    added to one and not the other would be refused, or lost between the file and the simulator."""
    from dataclasses import fields

    from gpud.sim.description import (
        GPU_KEYS,
        MACHINE_KEYS,
        MODEL_KEYS,
        PROCESS_KEYS,
        XORG_KEYS,
        GpuSpec,
        MachineSpec,
        Process,
        Xorg,
    )
    from gpud.sim.presets import GPU_MODELS, Preset

    def names(cls: type) -> set[str]:
        return {f.name for f in fields(cls)}

    assert names(Preset) == set(MODEL_KEYS)
    assert names(GpuSpec) == set(MODEL_KEYS) | set(GPU_KEYS)
    assert names(MachineSpec) == set(MACHINE_KEYS)
    assert names(Process) == set(PROCESS_KEYS)
    assert names(Xorg) == set(XORG_KEYS)
    assert all(isinstance(p, Preset) for p in GPU_MODELS.values())
    desc = open_machine("z8-fury-4x-a6000-degraded").simulation.description
    g = desc.gpus[0]
    assert isinstance(g, GpuSpec) and g.model == "RTX A6000" and g.name == "NVIDIA RTX A6000"
    with pytest.raises(AttributeError):
        g.fans = 3  # type: ignore[misc]  # frozen: the description is what the file said


def test_every_fault_kind_is_registered_once_with_its_keys_and_where_it_acts() -> None:
    from gpud.sim.faults import FAULT_KEYS, FAULTS, Fault, validate_fault

    assert set(FAULT_KEYS) == set(FAULTS)
    assert all(kind.acts_in for kind in FAULTS.values())
    f = validate_fault({"kind": "nvlink_down", "gpus": [0, 1]}, 2, "inject", "fault")
    assert isinstance(f, Fault) and f.gpus == (0, 1) and f.links is None and f.params == {"gpus": [0, 1],
                                                                                          "links": None}
    with pytest.raises(InvalidInput, match="must be one of gpu_lost, off_bus"):
        validate_fault({"kind": "melted"}, 2, "inject", "fault")


def test_a_crash_fault_kills_at_its_call_only(state_dir) -> None:
    """``crash`` with ``call``: the process dies as it makes that call on that GPU, not at another write
    (tests/test_rules.py kills the daemon mid-switch with it); without a call or a write number it is refused."""
    with pytest.raises(InvalidInput, match=r"fault.call: required \(or at_write\)"):
        validate_fault({"kind": "crash"}, 2, "inject", "fault")
    m = open_machine("z8-fury-4x-a6000")
    m.simulation.machine.inject("crash", call="nvmlDeviceSetMemoryLockedClocks", gpu=3)
    child = ("from gpud.backends import open_machine\n"
             "m = open_machine('z8-fury-4x-a6000')\n"
             "m.nvml.set_power_limit(3, 250); m.nvml.set_fan_speed(3, 0, 60)\n"
             "m.nvml.set_locked_memory_clocks(2, 5001, 5001)\n"
             "print('alive', flush=True)\n"
             "m.nvml.set_locked_memory_clocks(3, 5001, 5001)\n"
             "print('after', flush=True)\n")
    r = subprocess.run([sys.executable, "-I", "-c", child], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == -signal.SIGKILL and r.stdout == "alive\n", (r.returncode, r.stdout, r.stderr)
    after = open_machine("z8-fury-4x-a6000").simulation.machine
    assert after.settings(3)["power_limit_mw"] == 250_000 and after.settings(3).get("locked_mem") is None
    assert after.settings(2)["locked_mem"] == [5001, 5001]


def test_field_values_cost_a_reading_per_id(state_dir) -> None:
    """The latency model charges nvmlDeviceGetFieldValues per id asked (docs/simulation.md)."""
    from gpud.backends import open_machine

    m = open_machine("hgx-8x-h200")
    m.nvml.init()
    lib = m.simulation.library
    h = m.nvml.handle(0)
    before = lib.modelled_s
    m.nvml.get("nvmlDeviceGetFieldValues", h, [(138, link) for link in range(18)] * 2, gpu=0)
    assert lib.modelled_s - before == pytest.approx(36 * lib.latency.default_s)


def test_every_process_sees_the_same_boot_time(state_dir) -> None:
    """The boot time (``/proc/stat`` btime, the origin of the kernel-log clock and of the counters since
    boot) is one per simulated boot, not one per process that opens the machine."""
    import time

    from gpud.backends import open_machine

    first = open_machine("hgx-8x-h200").simulation.machine.boot_time()
    time.sleep(1.1)  # a boot time computed afresh would now be a second later
    assert open_machine("hgx-8x-h200").simulation.machine.boot_time() == first
