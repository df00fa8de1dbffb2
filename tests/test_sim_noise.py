"""The simulator is as noisy and as varied as real GPUs (docs/simulation.md, "Noise and spread"): readings
scatter as NVML's sensors do, clocks dither in the boost table's bins under a cap, no two GPUs are alike,
each model has its own absolute throughput, and all of it is reproducible (``GPUD_SIM_SEED``) and can be
switched off (``GPUD_SIM_NOISE=0``)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_gpud

from gpud.autotune.workload import Training
from gpud.backends import SimBench, SimPace, open_machine
from gpud.errors import InvalidInput
from gpud.sim import perf
from gpud.sim.description import load
from gpud.sim.physics import CLOCK_SM, CLOCK_STEP_MHZ

SIM = "z8-fury-4x-a6000"
SEEDS = (1, 2, 3)


def _stress(m: Any, gpus: list[int], seconds: float = 300.0) -> None:
    sim = m.simulation.machine
    for g in gpus:
        sim.set_load(g, 100, sim.stress_demand_watts(g))
    sim.advance(seconds)


def _series(m: Any, gpu: int, seconds: int) -> list[Any]:
    sim, out = m.simulation.machine, []
    for _ in range(seconds):
        sim.advance(1.0)
        out.append(m.nvml.telemetry(gpu))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_power_under_load_ripples_around_the_limit(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    m = open_machine(SIM)
    _stress(m, [0])
    e0 = m.nvml.get("nvmlDeviceGetTotalEnergyConsumption", m.nvml.handle(0), gpu=0)
    points = _series(m, 0, 120)
    e1 = m.nvml.get("nvmlDeviceGetTotalEnergyConsumption", m.nvml.handle(0), gpu=0)
    watts = [float(s.power_watts) for s in points]
    assert statistics.pstdev(watts) > 0.5  # never the flat 300.0 W of a model without a sensor
    # mean at the limit: within three standard errors of 300 W (the readings' own spread)
    assert abs(statistics.fmean(watts) - 300.0) < 3 * statistics.stdev(watts) / len(watts) ** 0.5 + 0.5
    assert max(watts) > 300.0 > min(watts)  # around the limit, both sides
    # the energy counter integrates the draw, whose mean is the limit
    assert (float(e1) - float(e0)) / 1000.0 / 120.0 == pytest.approx(300.0, rel=0.01)


def test_the_h200s_partial_sensor_scatters_more_than_a_full_average(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", "7")
    m = open_machine("hgx-8x-h200")
    sim = m.simulation.machine
    assert sim.desc.gpus[0].power_sensor == "partial"
    idle = [float(s.power_watts) for s in _series(m, 0, 200)]  # idle: a steady draw, only the sensor moves
    spread = statistics.pstdev(idle) / statistics.fmean(idle)
    # 2 % per sample over 2.5 samples a second: about 1.3 %; a full average (10 samples) would give 0.6 %
    assert 0.009 < spread < 0.018, spread


@pytest.mark.parametrize("seed", SEEDS)
def test_sm_clock_under_a_cap_dithers_in_15_mhz_bins(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    m = open_machine(SIM)
    _stress(m, [0])
    clocks = [int(s.clocks_mhz["sm"]) for s in _series(m, 0, 120)]
    assert all(c % CLOCK_STEP_MHZ == 0 for c in clocks)  # the boost table's bins
    assert len(set(clocks)) >= 3 and statistics.pstdev(clocks) > 0  # it moves as the draw crosses the limit
    assert all("sw_power_cap" in (s.clock_events or ()) for s in _series(m, 0, 5))


def test_loaded_clocks_stay_within_the_rated_boost() -> None:
    for name, boost in (("z8-fury-4x-a6000", 1800), ("z8-fury-4x-rtx6000ada", 2505)):
        m = open_machine(name)
        sim = m.simulation.machine
        sim.set_load(0, 100, 100.0)  # a light load: no cap holds it back, GPU Boost holds the rated boost
        sim.advance(5)
        assert sim.clock_mhz(0, CLOCK_SM) == boost
        _stress(m, [1], 5)
        capped = sim.clock_mhz(1, CLOCK_SM)
        assert 0.85 * boost < capped < boost, (name, capped)


@pytest.mark.parametrize("seed", SEEDS)
def test_temperature_is_whole_degrees_and_siblings_differ(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    m = open_machine(SIM)
    _stress(m, [0, 1, 2, 3], 900)
    temps = {g: [] for g in range(4)}  # type: dict[int, list[float]]
    for _ in range(60):
        m.simulation.machine.advance(1.0)
        for g in range(4):
            t = m.nvml.telemetry(g).temperature_celsius
            assert t is not None and float(t) == int(t)  # whole degrees, as NVML reports them
            temps[g].append(float(t))
    means = [statistics.fmean(v) for v in temps.values()]
    assert len({round(x, 1) for x in means}) > 1  # four cards in four slots do not read alike
    assert any(len(set(v)) > 1 for v in temps.values())  # a steady GPU's reading flickers by a degree
    assert all(abs(x - 84) <= 3 for x in means)  # each near its target (84 °C), held by the driver's policy


@pytest.mark.parametrize("seed", SEEDS)
def test_siblings_under_one_cap_run_their_own_clocks(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    m = open_machine(SIM)
    sim = m.simulation.machine
    _stress(m, [0, 1, 2, 3], 60)
    means = []
    for g in range(4):
        clocks = []
        for _ in range(60):
            sim.advance(1.0)
            clocks.append(sim.clock_mhz(g, CLOCK_SM))
        means.append(statistics.fmean(clocks))
    assert len({round(x) for x in means}) == 4
    # silicon of sigma 2 % in power: about 1 % in the clock a cap leaves; within +-4 % of each other
    assert max(means) / min(means) < 1.08


def test_power_variation_from_the_description_sets_the_clock_a_cap_allows(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")  # only the description's variation: exact figures
    src = (REPO / "gpud/sim/descriptions/z8-fury-4x-a6000.toml").read_text()
    marker = 'temperature_celsius = 36'  # the last GPU's table
    assert marker in src
    path = tmp_path / "leaky.toml"
    path.write_text(src.replace('name = "z8-fury-4x-a6000"', 'name = "leaky"').replace(
        marker, marker + "\npower_variation = 0.1"))
    m = open_machine(str(path))
    sim = m.simulation.machine
    _stress(m, [2, 3], 10)
    assert sim.power_factor(3) == pytest.approx(1.1) and sim.power_factor(2) == 1.0
    assert sim.clock_mhz(3, CLOCK_SM) < 0.97 * sim.clock_mhz(2, CLOCK_SM)  # leakier: a lower clock under the cap
    bad = tmp_path / "bad.toml"
    bad.write_text(src.replace(marker, marker + "\npower_variation = 0.9"))
    with pytest.raises(InvalidInput, match=r"gpu\[3\]\.power_variation"):
        load(bad)


def test_neighbours_exhaust_warms_the_middle_cards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", "11")
    m = open_machine(SIM)
    sim = m.simulation.machine
    before = [sim.intake(g) for g in range(4)]
    _stress(m, [0, 2], 120)  # GPU 1 sits between two loaded cards, GPU 3 beside one
    rise = [sim.intake(g) - before[g] for g in range(4)]
    assert rise[1] > rise[3] > 0.5 and rise[1] > 1.0


def test_noise_off_gives_the_flat_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")
    m = open_machine(SIM)
    _stress(m, [0, 1, 2, 3])
    points = {g: _series(m, g, 20) for g in range(4)}
    for ps in points.values():
        assert {float(s.power_watts) for s in ps} == {300.0}  # exactly at the limit, every second
        assert len({s.clocks_mhz["sm"] for s in ps}) == 1
    assert len({ps[-1].clocks_mhz["sm"] for ps in points.values()}) == 1  # siblings alike
    idle = open_machine("z8-fury-4x-rtx6000ada")
    assert [idle.nvml.telemetry(g).temperature_celsius for g in range(4)] == [
        int(g.temperature_celsius) for g in idle.simulation.machine.desc.gpus]


def _readings(text: str) -> Any:
    """``gpud status --json`` without what the clock alone moves: the time of the reading and the energy
    counter (mJ since the driver loaded, which grows with the seconds between two runs on hardware too)."""
    def strip(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in ("timestamp", "energy_joules")}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return strip(json.loads(text))


def test_the_same_seed_gives_the_same_status_twice() -> None:
    env = {"GPUD_SIM_SEED": "1"}
    first = run_gpud("status", "--simulate", SIM, "--json", env=env)
    second = run_gpud("status", "--simulate", SIM, "--json", env=env)
    assert first.returncode == 0, first.stderr
    assert _readings(first.stdout) == _readings(second.stdout)
    other = run_gpud("status", "--simulate", SIM, "--json", env={"GPUD_SIM_SEED": "2"})
    assert other.returncode == 0 and _readings(other.stdout) != _readings(first.stdout)  # another realisation


READ = """
import json, sys
from gpud.sim import open_simulation
sim = open_simulation("z8-fury-4x-a6000")
m = sim.machine
m.clock = lambda: 1000.0  # both processes at the same simulated time
m._t0 = 1000.0
m._last = 1000.0
m.set_load(0, 100, m.stress_demand_watts(0))
m.advance(37.0)
print(json.dumps([m.power_reading_mw(0), m.temperature_reading(0), m.clock_mhz(0, 1), m.power_reading_mw(2)]))
"""


def test_two_processes_read_the_same_value_at_the_same_simulated_time() -> None:
    env = {**os.environ}
    env.pop("GPUD_SIM_SEED")  # the machine's own seed, kept in its state: the first process draws it
    outs = [subprocess.run([sys.executable, "-c", READ], capture_output=True, text=True, env=env, cwd=REPO,
                           timeout=60) for _ in range(2)]
    assert all(o.returncode == 0 for o in outs), [o.stderr for o in outs]
    assert outs[0].stdout == outs[1].stdout
    power = json.loads(outs[0].stdout)[0]
    assert power != 300000  # a reading with its ripple, not the model's flat figure


def test_a_machine_keeps_its_seed_across_processes_and_reboots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUD_SIM_SEED")
    a = open_machine(SIM).simulation.machine
    b = open_machine(SIM).simulation.machine
    assert a.seed == b.seed and [a.power_factor(g) for g in range(4)] == [b.power_factor(g) for g in range(4)]
    a.reboot()
    assert open_machine(SIM).simulation.machine.seed == a.seed  # the same silicon after a reboot


def test_an_averaged_power_sensor_lags_a_load_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", "5")
    m = open_machine(SIM)  # RTX A6000: Ampere (not GA100), the reading is a 1 s average
    sim = m.simulation.machine
    sim.advance(2.0)
    idle = m.nvml.telemetry(0).power_watts
    sim.set_load(0, 100, sim.stress_demand_watts(0))
    at_once = m.nvml.telemetry(0)
    assert at_once.power_watts is not None and idle is not None and at_once.power_watts < 0.5 * 300  # not yet
    assert at_once.clocks_mhz["sm"] and at_once.clocks_mhz["sm"] > 1000  # the clock follows at once
    sim.advance(1.0)
    assert (m.nvml.telemetry(0).power_watts or 0) > 250  # a second later the average has caught up
    rtx8000 = open_machine("z8-g4-2x-rtx8000-sli")  # Turing: instantaneous
    s8 = rtx8000.simulation.machine
    s8.advance(2.0)
    s8.set_load(0, 100, s8.stress_demand_watts(0))
    assert (rtx8000.nvml.telemetry(0).power_watts or 0) > 200


def test_an_a6000_and_a_6000_ada_train_at_different_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")
    rates = {}
    for name in ("z8-fury-4x-a6000", "z8-fury-4x-rtx6000ada"):
        m = open_machine(name)
        work = Training(SimPace(m.simulation), {})
        work.start([0, 1, 2, 3])
        work.window(10.0)
        n, took = work.window(10.0)
        work.stop()
        rates[name] = n / took
    ratio = rates["z8-fury-4x-rtx6000ada"] / rates["z8-fury-4x-a6000"]
    # the datasheets' throughput and bandwidth (and each at its own capped clock): about 1.7x
    assert 1.4 < ratio < 2.0, rates


def test_ddp_pace_is_the_slowest_rank_plus_the_all_reduce() -> None:
    fast, slow = perf.step_time(1.0), perf.step_time(0.8)
    one = perf.step_rate([fast])
    assert one == pytest.approx(perf.NOMINAL_SAMPLES_PER_SECOND / fast)
    mixed = perf.step_rate([fast, fast, fast, slow])
    exposed = perf.ALLREDUCE_EXPOSED * 2 * 3 / 4
    assert mixed == pytest.approx(4 * perf.NOMINAL_SAMPLES_PER_SECOND / (slow + exposed))
    assert mixed < perf.step_rate([fast] * 4) < 4 * one
    ada = perf.step_time(1.0, 1.0, 364.2, 960.0)
    assert ada < fast  # a faster card: less time per step at its own boost clock


def test_the_step_rate_jitters_from_second_to_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", "3")
    m = open_machine(SIM)
    work = Training(SimPace(m.simulation), {})
    work.start([0, 1])
    work.window(10.0)
    rates = [n / took for n, took in (work.window(1.0) for _ in range(60))]
    work.stop()
    cv = statistics.pstdev(rates) / statistics.fmean(rates)
    assert 0.002 < cv < 0.03, cv


def test_a_marginal_gpu_errs_only_when_hot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", "9")
    m = open_machine(SIM)
    sim = m.simulation.machine
    sim.inject("wrong_results", gpu=1, above_celsius=70)
    sim.inject("memory_errors", gpu=2)  # unconditional: always
    bench = SimBench(m.simulation)
    assert bench.device_faults(1) == [] and bench.device_faults(2) == ["memory_errors"]  # cold: it passes
    _stress(m, [1], 600)
    assert sim.temperature(1) >= 70
    assert bench.device_faults(1) == ["wrong_results"]  # hot: it errs
    bench.load([1], False, 0)
    sim.advance(900)
    assert bench.device_faults(1) == []  # cool again
    with pytest.raises(InvalidInput, match="above_celsius"):
        sim.inject("wrong_results", gpu=1, above_celsius=500)


def test_the_burnin_checks_results_while_hot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU that errs only from 75 °C on passes every cold check (the kernels before the load); the load's
    checked products catch it once it is that hot, and the verdict names the temperature they began at."""
    monkeypatch.setenv("GPUD_SIM_SEED", "9")
    m = open_machine(SIM)
    m.simulation.machine.inject("wrong_results", gpu=1, above_celsius=75)
    m.simulation.machine.inject("wrong_results", gpu=2, above_celsius=95)  # hotter than a quick load makes it
    r = run_gpud("burnin", "--simulate", SIM, "--level", "quick", "--json", timeout=300)
    doc = json.loads(r.stdout)
    assert r.returncode == 1, r.stderr
    failed = {(v["test"], v["gpu"]): v for v in doc["verdicts"] if v["status"] == "fail"}
    assert not any(t.endswith(".digest") or t.endswith(".reference") for t, _ in failed)  # cold: right
    hot = failed[("burnin.gemm.load", 1)]
    began = int(hot["summary"].split("the first at ", 1)[1].split(" °C")[0])
    assert began >= 75 and hot["figure"] > 0  # named with the temperature its errors began at
    assert {g for _, g in failed} == {1}
    # GPU2 passes the quick level, which never heated it to 95 °C, and the verdict says how hot it checked
    spared = next(v for v in doc["verdicts"] if v["test"] == "burnin.gemm.load" and v["gpu"] == 2)
    hottest = int(spared["summary"].rsplit("up to ", 1)[1].split(" ")[0])
    assert spared["status"] == "pass" and "results checked only up to" in spared["summary"] and hottest < 95
