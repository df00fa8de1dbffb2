"""The clock-offset tunable (``gpu_clock_offset``, ``memory_clock_offset``): a profile sets it, apply writes it
through NVML and reads it back, verify compares it, restore puts the original back; out of the GPU's range is
a one-line error before any write; a driver before R555 is driven through the older VF-offset calls."""

from __future__ import annotations

import json

import pytest
from tuning_helpers import cli, fingerprint, fresh, write_profile

from gpud.profiles import state as st

SIM = "z8-fury-4x-a6000"  # driver 550: before nvmlDeviceGetClockOffsets (R555)
NEW = "hgx-8x-h200"  # driver 570: nvmlDeviceGet/SetClockOffsets


def _offsets(name: str) -> list[dict[str, int]]:
    return [dict(s.clock_offsets_mhz) for s in fresh(name).snapshot().samples]


@pytest.mark.parametrize("name", [SIM, NEW])
def test_apply_verify_restore_an_offset_on_either_driver(capsys, state_dir, tmp_path, name) -> None:
    before = fingerprint(fresh(name))
    assert all(o == {"graphics": 0, "memory": 0} for o in _offsets(name))
    path = write_profile(tmp_path, {"all": {"gpu_clock_offset": 150, "memory_clock_offset": -200},
                                    "gpus": [{"select": [1], "gpu_clock_offset": -100}]}, "oc.toml")
    m = fresh(name)
    code, out, err = cli(capsys, "apply", str(path), "--simulate", name)
    assert code == 0, err
    assert "+150 MHz" in out and "-200 MHz" in out  # the plan shows them as offsets
    got = _offsets(name)
    assert got[0] == {"graphics": 150, "memory": -200} and got[1] == {"graphics": -100, "memory": -200}
    code, out, _ = cli(capsys, "verify", "--simulate", name, "--json")
    rows = [r for r in json.loads(out)["settings"] if r["setting"].endswith("clock_offset")]
    assert code == 0 and rows and {r["status"] for r in rows} == {"ok"}
    assert {(r["gpu"], r["setting"]): r["current"] for r in rows}[(1, "gpu_clock_offset")] == -100
    state = st.read()
    assert state is not None and state.originals["0"]["gpu_clock_offset"] == 0
    m.nvml.set_clock_offset(2, "graphics", 50)  # behind gpud's back
    code, out, _ = cli(capsys, "verify", "--simulate", name, "--json")
    drift = [r for r in json.loads(out)["settings"] if r["status"] == "drift"]
    assert code == 1 and drift == [{"gpu": 2, "setting": "gpu_clock_offset", "current": 50, "desired": 150,
                                    "status": "drift"}]
    assert cli(capsys, "restore", "--simulate", name)[0] == 0
    assert fingerprint(fresh(name)) == before


@pytest.mark.parametrize(("name", "entry"), [(SIM, "nvmlDeviceSetGpcClkVfOffset"), (NEW, "nvmlDeviceSetClockOffsets")])
def test_the_driver_gets_the_call_it_has(state_dir, name, entry) -> None:
    """R555 and later: nvmlDeviceSetClockOffsets (the VF-offset setters are deprecated); before: the VF calls."""
    m = fresh(name)
    lib = m.simulation.library
    assert m.nvml.set_clock_offset(0, "graphics", 120) == 120
    assert lib.called[entry] == 1
    other = "nvmlDeviceSetClockOffsets" if entry != "nvmlDeviceSetClockOffsets" else "nvmlDeviceSetGpcClkVfOffset"
    assert lib.called[other] == 0
    assert m.info(0).clock_offset_ranges_mhz == {"graphics": (-1000, 1000), "memory": (-1000, 3000)}


def test_an_offset_outside_the_gpus_range_is_refused_before_any_write(capsys, state_dir, tmp_path) -> None:
    before = fingerprint(fresh(SIM))
    path = write_profile(tmp_path, {"all": {"gpu_clock_offset": 1500}}, "too-far.toml")
    code, _, err = cli(capsys, "apply", str(path), "--simulate", SIM)
    assert code == 2
    assert "all.gpu_clock_offset" in err and "+1500 MHz is outside GPU 0's graphics clock offsets -1000..+1000" in err
    assert str(path) in err
    assert fingerprint(fresh(SIM)) == before and st.read() is None
    path = write_profile(tmp_path, {"all": {"memory_clock_offset": "max"}}, "typo.toml")
    code, _, err = cli(capsys, "apply", str(path), "--simulate", SIM)
    assert code == 2 and "all.memory_clock_offset" in err and "must be an offset in MHz or \"reset\"" in err


def test_a_gpu_without_offsets_skips_them_and_required_makes_that_fail(capsys, state_dir, tmp_path) -> None:
    m = fresh(NEW)
    m.simulation.machine.inject("unsupported", call="nvmlDeviceGetClockOffsets", gpu=3)
    assert "graphics" not in fresh(NEW).info(3).clock_offset_ranges_mhz
    before = fingerprint(fresh(NEW))
    path = write_profile(tmp_path, {"all": {"gpu_clock_offset": 100}}, "oc.toml")
    code, out, err = cli(capsys, "apply", str(path), "--simulate", NEW, "--dry-run", "--json")
    assert code == 0, err
    plan = {(c["gpu"], c["setting"]): c for c in json.loads(out)["plan"]}
    assert plan[(3, "gpu_clock_offset")]["action"] == "skip" and plan[(0, "gpu_clock_offset")]["action"] == "change"
    strict = write_profile(tmp_path, {"all": {"gpu_clock_offset": 100, "required": ["gpu_clock_offset"]}},
                           "oc-required.toml")
    code, _, err = cli(capsys, "apply", str(strict), "--simulate", NEW)
    assert code != 0 and "gpu_clock_offset" in err
    assert fingerprint(fresh(NEW)) == before


def test_a_loaded_gpu_runs_its_offset_faster(state_dir, monkeypatch) -> None:
    """The simulator models the offset's effect: a loaded GPU's SM clock rises by the offset (up to a locked
    maximum); the memory clock by the memory offset."""
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")
    m = fresh(SIM)
    sim = m.simulation.machine
    sim.set_load(0, 100, 150.0)  # a light load: not power-capped
    base = m.nvml.fresh_sample(0).clocks_mhz
    m.nvml.set_clock_offset(0, "graphics", 90)
    m.nvml.set_clock_offset(0, "memory", 400)
    after = m.nvml.fresh_sample(0).clocks_mhz
    assert after["sm"] == base["sm"] + 90 and after["memory"] == base["memory"] + 400


def test_a_sample_reads_each_offset_in_one_call_and_the_range_once(state_dir) -> None:
    """The offsets are slow fields (every 10 s, in the daemon's whole snapshots): one call a domain, with either
    driver; the range is the GPU's static information, read once."""
    m = fresh(SIM)
    lib = m.simulation.library
    m.nvml.fresh_sample(0)
    ranges = lib.called["nvmlDeviceGetGpcClkMinMaxVfOffset"]
    assert ranges == 1
    for _ in range(3):
        m.nvml.fresh_sample(0)
    assert lib.called["nvmlDeviceGetGpcClkMinMaxVfOffset"] == ranges
    assert lib.called["nvmlDeviceGetGpcClkVfOffset"] == 4  # a sample each; the information reads the range alone


def test_an_offset_the_driver_snaps_is_applied_and_verifies(capsys, state_dir, tmp_path) -> None:
    """The driver rounds a memory offset to its hardware's step (465 MHz reads back 464, LACT issue #1202): the
    apply is not rolled back for it and verify reports no drift."""
    path = write_profile(tmp_path, {"all": {"memory_clock_offset": 465}}, "odd.toml")
    code, _, err = cli(capsys, "apply", str(path), "--simulate", SIM)
    assert code == 0, err
    assert [o["memory"] for o in _offsets(SIM)] == [464] * 4
    code, out, _ = cli(capsys, "verify", "--simulate", SIM, "--json")
    assert code == 0 and json.loads(out)["drift"] == 0


def test_a_reset_offset_is_written_without_persistence_mode(capsys, state_dir, tmp_path) -> None:
    """No offset is the driver's default, which it never forgets: "reset" is written on a GPU without persistence
    mode (a non-zero offset is skipped there, with the remedy)."""
    m = fresh(SIM)
    m.nvml.set_clock_offset(0, "graphics", 80)
    m.nvml.set_persistence_mode(0, False)
    path = write_profile(tmp_path, {"all": {"gpu_clock_offset": "reset"}}, "reset.toml")
    code, out, err = cli(capsys, "apply", str(path), "--simulate", SIM, "--dry-run", "--json")
    plan = {(c["gpu"], c["setting"]): c for c in json.loads(out)["plan"]}
    assert code == 0 and plan[(0, "gpu_clock_offset")]["action"] == "change", plan[(0, "gpu_clock_offset")]
    up = write_profile(tmp_path, {"all": {"gpu_clock_offset": 100}}, "up.toml")
    code, out, err = cli(capsys, "apply", str(up), "--simulate", SIM, "--dry-run", "--json")
    plan = {(c["gpu"], c["setting"]): c for c in json.loads(out)["plan"]}
    assert plan[(0, "gpu_clock_offset")]["action"] == "skip" and "persistence" in plan[(0, "gpu_clock_offset")]["note"]
