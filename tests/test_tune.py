"""`gpud tune`: the performance model, the search, the safety (GPUs put back, a SIGKILL undone by
`gpud restore`, throttling stops a trial), the outputs (JSON, profile, HTML in a browser), the daemon."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from daemon_helpers import RunningDaemon
from tuning_helpers import cli, fingerprint, fresh

from gpud.autotune import search
from gpud.autotune.run import (
    LocalApplier,
    Outcome,
    TuningBusy,
    check_start,
    confirm,
    fan_ceiling,
    memory_clocks,
    run_tune,
)
from gpud.autotune.trial import Measure, Trial, relative_ci
from gpud.autotune.workload import Training
from gpud.backends import SimPace
from gpud.errors import GpudError
from gpud.json_schema import check
from gpud.profiles import state as st
from gpud.profiles.profile import load
from gpud.sim import perf

SIM = "z8-fury-4x-a6000"
# The least energy saving a tune within 5 % slowdown must find on the simulated Z8: the performance model's
# best at that slowdown is about 9 % with its cited constants (the first test below), and the search stops
# within NVML's 5 % power resolution under the trials' noise: at least half of it.
SAVING = 0.045
# Tune's choice is a verdict a person relies on: its tests run in three realisations of the simulator's noise.
SEEDS = (1, 2, 3)


# -- the model ------------------------------------------------------------------------------

def test_the_model_lowers_the_clock_under_a_cap_and_its_savings_stay_within_the_published_range() -> None:
    assert perf.power_share(1.0) == pytest.approx(1.0)
    shares = [perf.power_share(k / 100) for k in range(1, 101)]
    assert shares == sorted(shares)  # power rises with the clock
    demand = perf.training_demand_watts(300.0)
    x, draw, capped = perf.capped_share(1.0, demand, 300.0)
    assert capped and draw == 300.0 and demand * perf.power_share(x) == pytest.approx(300.0, rel=1e-6)
    assert perf.capped_share(1.0, demand, 400.0)[2] is False
    # Unconstrained, the least energy per sample the model allows over the A6000's 100-300 W range lies in
    # Zeus's reported 23.8-74.7 %; at <= 5 % slowdown the saving is below the ~15 % power-capping studies report
    # (with the cited MEMORY_BOUND = 0.4 it is about 9 %: whatever the constants give, no kinder than that).
    base_x = perf.capped_share(1.0, demand, 300.0)[0]
    base = 300.0 / perf.throughput_share(base_x)
    rows = []
    for w in range(100, 301, 5):
        xs, d, _ = perf.capped_share(1.0, demand, float(w))
        rows.append((1 - d / perf.throughput_share(xs) / base, 1 - perf.throughput_share(xs) / perf.throughput_share(
            base_x)))
    assert 0.238 <= max(s for s, _ in rows) <= 0.747
    assert 0.0 < max(s for s, slow in rows if slow <= 0.05) <= 0.15


def test_the_simulated_nvml_reports_the_models_clock_draw_and_reasons(open_sim: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")  # the model's exact figures: no sensor ripple, no clock bins
    m = open_sim(SIM)
    sim = m.simulation.machine
    demand = perf.training_demand_watts(300.0)
    sim.set_load(0, 100, demand)
    m.nvml.set_power_limit(0, 200.0)
    sim.advance(2.0)
    s = m.nvml.telemetry(0)
    x, draw, _ = perf.capped_share(1.0, demand, 200.0)
    assert s.clocks_mhz["sm"] == int(1800 * x) and s.power_watts == pytest.approx(200.0, abs=1)  # of its boost
    assert "sw_power_cap" in (s.clock_events or ())
    # A locked clock below what the cap allows draws less than the cap, and the cap no longer binds.
    m.nvml.set_power_limit(0, 300.0)
    m.nvml.set_locked_gpu_clocks(0, 1200, 1200)
    sim.advance(2.0)
    s = m.nvml.telemetry(0)
    assert s.clocks_mhz["sm"] == 1200
    assert s.power_watts == pytest.approx(demand * perf.power_share(1200 / 1800), abs=1)
    assert "sw_power_cap" not in (s.clock_events or ())
    m.nvml.reset_locked_gpu_clocks(0)


def test_the_simulated_nvml_lists_memory_clocks_and_a_lower_one_slows_the_step_and_saves_power(
        open_sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")  # the saving's exact figure: no sensor ripple
    m = open_sim(SIM)
    clocks = m.nvml.supported_memory_clocks(0)
    assert clocks == (8001, 405)  # the maximum (= default application clock) and the idle clock, highest first
    sim = m.simulation.machine
    demand = perf.training_demand_watts(300.0)
    sim.set_load(0, 100, demand)
    m.nvml.set_locked_gpu_clocks(0, 1200, 1200)  # below the cap: the draw is the model's, not the limit
    sim.advance(2.0)
    full = m.nvml.telemetry(0).power_watts
    m.nvml.set_locked_memory_clocks(0, 405, 405)
    sim.advance(2.0)
    s = m.nvml.telemetry(0)
    assert s.clocks_mhz["memory"] == 405
    saved = demand * perf.MEMORY_POWER_SHARE * (1 - 405 / 8001)
    assert full is not None and s.power_watts == pytest.approx(full - saved, abs=1)
    # The memory-bound share of the step stretches with the memory clock.
    assert perf.throughput_share(1.0, 405 / 8001) < 0.15 < perf.throughput_share(1.0, 0.9) < perf.throughput_share(1.0)
    # Under a binding cap, what the memory no longer draws goes to the SM clock.
    assert perf.capped_share(1.0, demand, 250.0, 0.5)[0] > perf.capped_share(1.0, demand, 250.0)[0]
    m.nvml.reset_locked_memory_clocks(0)
    m.nvml.reset_locked_gpu_clocks(0)


def test_memclocks_knob_measures_the_supported_clocks_after_the_power_stage_and_skips_where_unsupported() -> None:
    m = fresh(SIM)
    before = fingerprint(m)
    out = _tune(m, knobs=["power", "memclocks"])
    stages = [t.stage for t in out.trials]
    assert "memclocks" in stages and stages.index("memclocks") > max(i for i, x in enumerate(stages) if x == "power")
    mem = [t for t in out.trials if t.stage == "memclocks"]
    assert all(g["memory_clocks"] == [405, 405] for t in mem for g in t.settings.values())
    # The power stage's best limit stays under the lock; 405 MHz starves the memory-bound half of the step.
    assert out.baseline is not None and out.baseline.samples_per_second
    assert mem[0].samples_per_second is not None and mem[0].samples_per_second < 0.2 * out.baseline.samples_per_second
    assert out.picked is not None and out.picked.stage == "power" and (out.energy_saving or 0) >= SAVING
    assert fingerprint(fresh(SIM)) == before
    clocks, why = memory_clocks(fresh("z8-g4-2x-rtx8000-sli"), [0, 1])  # Turing: no locked memory clocks
    assert clocks == {} and "GPU 0: locked memory clocks need Ampere or newer" in why
    assert memory_clocks(fresh(SIM), [0, 3]) == ({0: [405], 3: [405]}, "")


@pytest.mark.parametrize("seed", SEEDS)
def test_fans_knob_finds_the_quietest_curve_that_holds_the_gpus_own_ceiling_after_a_soak(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    m = fresh(SIM)
    before = fingerprint(m)
    info = m.info(0)
    assert info is not None and info.temperature_max_operating_celsius == 93 and info.temperature_slowdown_celsius == 95
    assert fan_ceiling(m, 0) is not None and fan_ceiling(m, 0)[0] == 91.0  # type: ignore[index]  # 93 - (95 - 93)
    out = _tune(m, goal="quiet", knobs=["power", "fans"], gpus=[0, 1])
    fans = [t for t in out.trials if t.stage == "fans"]
    assert 2 <= len(fans) and all(t.soak_s > 0 for t in fans)
    assert all(t.settled for t in fans if t.ok), [t.json() for t in fans]
    c, b = out.chosen, fans[0]
    assert all(g["fan"] == {"mode": "auto"} for g in b.settings.values())  # the driver's policy, soaked alike
    held = [t for t in fans if t.ok and t is not b and max(t.temperature_c.values()) < 91]
    p = min(held, key=lambda t: (sum(t.fan_percent.values()), t.number))  # the quietest curve below the ceilings
    assert c is not None and p.stage == "fans", [t.json() for t in out.trials]
    # The curve picked: quieter than the driver's own policy, within the slowdown, below the ceiling on every GPU.
    assert sum(p.fan_percent.values()) < sum(b.fan_percent.values()) - 5 * len(p.fan_percent), [
        t.json() for t in fans]
    assert max(p.temperature_c.values()) < 91 and not {"sw_thermal_slowdown", "hw_slowdown"} & set(p.reasons)
    # Measured again against a fresh baseline, after a soak of its own: within the bound, below every ceiling;
    # where no curve held that again (the picks sit at the bound), the confirmed limits with the driver's fans.
    assert c.stage == "confirm" and out.confirmed and out.slowdown is not None and out.slowdown_ci is not None
    assert out.slowdown + out.slowdown_ci <= 0.05 + 1e-9 and max(c.temperature_c.values()) < 91
    if c.settings != p.settings:  # another curve (or none) held in its confirmation: the notes say which did not
        assert "did not confirm" in " ".join(out.notes), out.notes
    assert fingerprint(fresh(SIM)) == before  # the fans back on the driver's automatic policy


def test_goal_quiet_searches_the_fans_by_default_and_the_profile_carries_the_curve(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's side of the fans knob (the search itself is judged above, in three realisations): --goal
    quiet searches the fans by default; the profile carries the curve and loads; the fans are put back."""
    before = fingerprint(fresh(SIM))
    profile = tmp_path / "quiet.toml"
    code, outp, err = cli(capsys, "tune", "--simulate", SIM, "--goal", "quiet", "--gpus", "0", "-o", str(profile),
                          "--json")
    assert code == 0, err
    doc = json.loads(outp)
    assert check(doc) == [] and doc["knobs"] == ["power", "fans"]
    if "fan" not in doc["chosen"]["settings"]["0"]:  # no curve held again in its confirmation: said, none written
        assert "no chosen setting confirmed" in " ".join(doc["notes"]) or doc["confirmed"] is False, doc["notes"]
        return
    curve = doc["chosen"]["settings"]["0"]["fan"]
    assert curve["mode"] == "curve" and curve["points"][-1] == [91.0, 100]
    p = load(str(profile))
    assert [g["fan"]["points"] for g in p.gpus][0] == curve["points"]
    assert fingerprint(fresh(SIM)) == before


# -- the search ------------------------------------------------------------------------------

def test_golden_section_needs_fewer_points_than_the_linear_sweep() -> None:
    seen: list[int] = []

    def f(k: int) -> float:
        seen.append(k)
        return (k - 712) ** 2

    search.golden(f, 333, 1000, search.POWER_RESOLUTION * 1000)
    assert abs(min(seen, key=lambda k: (k - 712) ** 2) - 712) <= 50
    assert len(seen) + 1 < search.zeus_sweep_trials(100, 300) == 9  # + the baseline
    assert relative_ci([1.0, 1.0, 1.0]) == 0.0 and relative_ci([1.0]) == float("inf")


def test_a_choice_that_does_not_confirm_gives_way_to_a_safer_one() -> None:
    """The search's best sits at the slowdown bound; when a fresh measurement puts it over, the next
    candidate is the best that the search measured slowing less, not the next best by energy alone (which
    sits at the same bound and fails the same way)."""
    def t(n: int, stage: str, watts: float, rate: float, joules: float, ref: Trial | None) -> Trial:
        x = Trial(n, stage, {0: {"power_limit": watts}} if stage != "baseline" else {}, samples_per_second=rate,
                  ci=0.005, ci_reached=True, joules_per_sample=joules, j_ci=0.005, power_w=watts)
        x.ref = ref if ref is not None else x
        return x

    base = t(0, "baseline", 300, 100.0, 1.00, None)
    at_bound = t(1, "power", 240, 96.4, 0.90, base)  # 3.6 % slower: feasible (+0.7 % margin ≤ 5 %)
    next_by_energy = t(2, "power", 245, 96.3, 0.91, base)  # as slow: the objective's second
    safer = t(3, "power", 270, 98.0, 0.95, base)  # 2 % slower
    out = Outcome("energy", 0.05, ["power"], [0], "training", "cpu", "samples", trials=[base, at_bound,
                                                                                      next_by_energy, safer])
    asked: list[int] = []

    def baseline() -> Trial:
        b = t(len(out.trials), "baseline", 300, 100.0, 1.00, None)
        out.trials.append(b)
        return b

    def again(cand: Trial, b: Trial) -> Trial:  # measured again: 1.5 points slower than the search saw
        asked.append(cand.number)
        return t(len(out.trials), "confirm", cand.settings[0]["power_limit"], (cand.samples_per_second or 0) - 1.5,
                 cand.joules_per_sample or 0, b)

    c = search.Constraint("energy", 0.05, 100.0, 0.005)
    got = confirm(out, at_bound, baseline, again, lambda x: search.feasible(x, c), lambda x: search.objective(x, c))
    assert asked == [1, 3] and out.confirmed and out.picked is safer and got.stage == "confirm", out.notes
    assert "trial 1's settings did not confirm" in out.notes[0], out.notes


def _tune(m: Any, **kw: Any) -> Any:
    load = Training(SimPace(m.simulation), {})
    args: dict[str, Any] = {"goal": "energy", "max_slowdown": 0.05, "knobs": ["power"], "gpus": [0, 1, 2, 3],
                            "measure": Measure()} | kw
    return run_tune(m, load, LocalApplier(m), **args)


def _energy_tune_holds(out: Any, before: Any) -> None:
    """What an energy tune of the simulated Z8 within 5 % must give, in every realisation of the noise: a
    saving of at least ``SAVING`` within the slowdown, confirmed against a fresh baseline, fewer settings
    tried than Zeus's sweep, every interval reached, and every GPU put back as it was."""
    assert out.energy_saving is not None and out.energy_saving >= SAVING, [t.json() for t in out.trials]
    assert out.slowdown is not None and out.slowdown <= 0.05
    assert out.confirmed and out.chosen is not None and out.chosen.stage == "confirm"  # measured again, fresh baseline
    assert out.chosen.ref is not None and out.chosen.ref.number == out.chosen.number - 1
    # the joint power search tries fewer limits than Zeus's sweep (the baselines again and the confirmations
    # are not settings tried); where one realisation leaves some ranks waiting 3 points more than the others
    # (silicon: docs/tune.md, step 6), their own limits' golden section comes on top, as docs/tune.md counts it
    stages = [t.stage for t in out.trials]
    assert stages.count("power") < out.zeus_trials == 9, stages
    assert out.search_trials == stages.count("power") + stages.count("pergpu"), stages
    assert out.chosen is not None and out.chosen.settings and all(
        s["power_limit"] < 300 for s in out.chosen.settings.values())
    assert all(t.ci_reached for t in out.trials if t.ok)
    assert fingerprint(fresh(SIM)) == before and st.load() is None  # every setting read back as it was


def test_clocks_knob_searches_locked_clocks_and_keeps_the_constraint() -> None:
    m = fresh(SIM)
    before = fingerprint(m)
    out = _tune(m, knobs=["power", "clocks"])
    stages = {t.stage for t in out.trials}
    assert "clocks" in stages
    assert out.slowdown is not None and out.slowdown <= 0.05 and (out.energy_saving or 0) >= SAVING
    assert fingerprint(fresh(SIM)) == before


def test_quiet_and_throughput_goals() -> None:
    m = fresh(SIM)
    quiet = _tune(m, goal="quiet")
    assert quiet.chosen is not None and quiet.baseline is not None and quiet.slowdown is not None
    # less draw than the baseline, surely (the interval of the difference above zero), within the slowdown
    assert quiet.slowdown <= 0.05 and (quiet.chosen.power_w or 0) < (quiet.baseline.power_w or 0)
    assert quiet.gain_excludes_zero and quiet.confirmed
    fast = _tune(m, goal="throughput")
    # the maximum limit: nothing above it to try (the GPUs' own, so as fast as the baseline within the noise);
    # if it measured faster it is measured again against a fresh baseline, and it is no surer gain than that
    stages = [t.stage for t in fast.trials]
    assert stages in (["baseline", "power"], ["baseline", "power", "baseline", "confirm"]), stages
    assert not fast.gain_excludes_zero
    assert fast.trials[1].settings[0]["power_limit"] == 300.0


@pytest.mark.parametrize("seed", SEEDS)
def test_a_gpu_that_runs_slower_sets_the_pace_and_matching_the_others_is_measured(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    m = fresh(SIM)
    before = fingerprint(m)
    m.simulation.machine.inject("clock_events", gpu=3, reasons=["sw_thermal_slowdown"])  # a hotter GPU: -15 %
    out = _tune(m, knobs=["power", "clocks"])
    m.simulation.machine.clear_faults()
    # GPUs 0-2 wait for GPU 3 at every all-reduce: their limits are searched on their own, GPU 3 keeps its own
    base = out.trials[0]
    assert min(base.waiting[g] for g in (0, 1, 2)) > base.waiting[3] + 0.05, base.waiting
    pergpu = [t for t in out.trials if t.stage == "pergpu"]
    assert pergpu and all(set(t.settings) == {0, 1, 2} for t in pergpu)
    match = [t for t in out.trials if t.stage == "match"]
    assert len(match) == 1
    # the constraint the tune judged by: the baseline's rate and its interval
    b0 = out.trials[0]
    assert b0.samples_per_second
    ci = b0.ci if b0.ci is not None and math.isfinite(b0.ci) else 0.0
    src = search.best([t for t in out.trials if t.number < match[0].number],
                      search.Constraint("energy", 0.05, b0.samples_per_second, ci))
    assert src is not None
    pace = round(min(src.sm_mhz.values()))
    slowest = min(src.sm_mhz, key=lambda g: src.sm_mhz[g])
    assert "gpu_clocks" not in match[0].settings[slowest] or match[0].settings[slowest]["gpu_clocks"] == "reset"
    assert all(match[0].settings[g]["gpu_clocks"] == [pace, pace] for g in range(4)
               if g != slowest and src.sm_mhz[g] > pace)
    # Whether matching costs nothing is measured, not assumed: it is judged like any trial (after the per-GPU
    # limits it may be slower: the slowest's mean clock dithers), and the choice keeps the bound.
    assert match[0].ok and out.slowdown is not None and out.slowdown_ci is not None
    assert out.slowdown + out.slowdown_ci <= 0.05 + 1e-9
    assert out.energy_saving is not None and out.energy_saving >= SAVING and out.confirmed
    assert fingerprint(fresh(SIM)) == before


@pytest.mark.parametrize(("kind", "params", "status", "words"), [
    ("clock_events", {"gpu": 2, "reasons": ["hw_slowdown"]}, "throttled", "hw_slowdown"),
    ("clock_events", {"gpu": 0, "reasons": ["hw_power_brake_slowdown"]}, "throttled", "hw_power_brake_slowdown"),
    ("xid", {"gpu": 1, "xid": 79}, "xid", "Xid"),
])
def test_a_trial_hit_mid_window_by_an_xid_or_hw_slowdown_is_stopped_in_that_window_and_rolled_back(
        kind: str, params: dict[str, Any], status: str, words: str) -> None:
    m = fresh(SIM)
    before = fingerprint(m)
    sim = m.simulation.machine
    armed: list[float] = []  # seconds the workload ran since the first trial after the baseline applied
    hit: list[float] = []  # the simulated time of the fault, and of the roll-back after it

    class Pace(SimPace):
        def wait(self, seconds: float, tick: Any = None, paced: bool = True) -> None:
            for _ in range(int(round(seconds))):
                if armed and not hit:
                    armed[0] += 1
                    if armed[0] == 8:  # past the settling (2-3 s): inside the trial's first 5 s window
                        sim.inject(kind, **params)
                        m.simulation.refresh_root()  # the kernel log shows an Xid from now on
                        hit.append(sim.now())
                super().wait(1.0, tick, paced)

    class Watch(LocalApplier):
        def apply(self, settings: Any, label: str) -> None:
            super().apply(settings, label)
            if not armed:
                armed.append(0.0)

        def restore(self) -> list[str]:
            if len(hit) == 1:
                hit.append(sim.now())
            sim.clear_faults()
            m.simulation.refresh_root()
            return super().restore()

    out = run_tune(m, Training(Pace(m.simulation), {}), Watch(m), goal="energy", max_slowdown=0.05, knobs=["power"],
                   gpus=[0, 1, 2, 3], measure=Measure())
    bad = [t for t in out.trials if t.status != "ok"]
    assert [t.status for t in bad] == [status] and words in bad[0].note and bad[0].number == 1
    assert bad[0].windows == 0  # stopped inside its first window, not after it
    # rolled back at the end of the second that showed it (the roll-back's own writes take simulated time)
    assert len(hit) == 2 and hit[1] - hit[0] < 1.5, hit
    assert out.chosen is not bad[0] and len(out.trials) > 3  # the search went on without it
    assert fingerprint(fresh(SIM)) == before


def test_refuses_while_a_profile_is_applied(capsys: pytest.CaptureFixture[str]) -> None:
    m = fresh(SIM)
    code, _, err = cli(capsys, "apply", "quiet", "--simulate", SIM)
    assert code == 0, err
    with pytest.raises(TuningBusy, match="profile 'quiet' is applied"):
        check_start(m, [0, 1, 2, 3], allow_busy=False)
    code, _, err = cli(capsys, "tune", "--simulate", SIM)
    assert code == 1 and "gpud restore" in err


def test_refuses_gpus_other_processes_use_unless_allowed() -> None:
    m = fresh("z8-fury-4x-a6000-degraded")  # GPU 1 runs alice's training
    before = fingerprint(m)
    with pytest.raises(GpudError, match="GPU 1 is in use by 48213") as err:
        check_start(m, [0, 1], allow_busy=False)
    assert "--allow-busy" in err.value.remedy
    check_start(m, [0], allow_busy=False)  # the idle one may be tuned
    check_start(m, [0, 1], allow_busy=True)
    assert fingerprint(fresh("z8-fury-4x-a6000-degraded")) == before


@pytest.mark.parametrize(("args", "key"), [(["--goal", "fastest"], "--goal"), (["--knobs", "fan"], "--knobs"),
                                           (["--max-slowdown", "-1"], "--max-slowdown"),
                                           (["-o", "/nonexistent/x.toml"], "-o")])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], key: str) -> None:
    before = fingerprint(fresh(SIM))
    code, _, err = cli(capsys, "tune", "--simulate", SIM, *args)
    assert code == 2 and key in err and len(err.strip().splitlines()) == 1
    assert fingerprint(fresh(SIM)) == before


# -- the command line end to end -----------------------------------------------------------------

def _gpud(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpud", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_tune_json_profile_and_report_then_the_profile_applies(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    before = fingerprint(fresh(SIM))
    profile, report = tmp_path / "tuned.toml", tmp_path / "tune.html"
    code, out, err = cli(capsys, "tune", "--simulate", SIM, "--goal", "energy", "--max-slowdown", "5", "-o",
                         str(profile), "--report", str(report), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert check(doc) == []
    assert doc["kind"] == "tune" and doc["figures"] == "model" and "model" in doc["figures_note"]
    assert doc["energy_saving_percent"] >= SAVING * 100 and doc["slowdown_percent"] <= 5
    # The power stage's golden section against Zeus's linear sweep of the same limits (docs/tune.md). A GPU whose
    # rank waited for the others in the baseline (the dies' spread, under noise) has its limit searched on its own
    # too (``pergpu``, about 6 settings more), which the notes name: not a stage the sweep has.
    stages = Counter(t["stage"] for t in doc["trials"])
    assert stages["power"] < doc["linear_sweep_trials"] and doc["confirmed"] and doc["gain_excludes_zero"]
    assert doc["search_trials"] == sum(n for stage, n in stages.items() if stage not in ("baseline", "confirm"))
    assert not stages["pergpu"] or any("waited for the others" in note for note in doc["notes"]), doc["notes"]
    assert doc["energy_saving_ci_percent"] > 0 and doc["slowdown_ci_percent"] > 0  # the intervals
    for key in ("samples_per_second", "joules_per_sample", "settings"):
        assert doc["baseline"][key] and doc["chosen"][key]
    assert fingerprint(fresh(SIM)) == before
    p = load(str(profile))  # the profile loader keeps the record of what was measured
    assert p.measured["figures"] == "model" and p.measured["energy_saving_percent"] == doc["energy_saving_percent"]
    assert p.measured["driver"] == "550.127.05" and len(p.measured["gpus"]) == 4
    code, _, err = cli(capsys, "apply", str(profile), "--simulate", SIM)
    assert code == 0, err
    after = fingerprint(fresh(SIM))
    assert [after[str(g)]["power"] for g in range(4)] == [doc["chosen"]["settings"][str(g)]["power_limit"]
                                                          for g in range(4)]
    assert cli(capsys, "restore", "--simulate", SIM)[0] == 0
    assert fingerprint(fresh(SIM)) == before
    # Human output: the trial table, the chart, the summary.
    code, out, err = cli(capsys, "tune", "--simulate", SIM)
    assert code == 0, err
    assert "Zeus's 25 W linear sweep: 9" in out and "B baseline, C chosen" in out
    assert "performance model" in out and "chosen:" in out
    _browser_shows_the_chart(report, tmp_path)


def _browser_shows_the_chart(report: Path, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed")
        pytest.skip("chromium is not installed: apt-get install chromium")
    html = report.read_text()
    assert "<script" not in html and "https://" not in html
    profile = tmp_path / "chrome"
    profile.mkdir()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", f"file://{report}"], capture_output=True, text=True,
                         timeout=90)
    assert 'id="tune-chart"' in dom.stdout and dom.stdout.count('class="trial"') >= 5
    assert "chosen" in dom.stdout and "baseline" in dom.stdout


def test_a_tune_killed_halfway_is_undone_by_restore() -> None:
    m = fresh(SIM)
    before = fingerprint(m)
    sim = m.simulation.machine
    sim.inject("crash", at_write=sim.state["writes"] + 6)  # SIGKILL at the 6th hardware write: mid-search
    r = _gpud("tune", "--simulate", SIM)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert st.load() is not None  # the originals were saved before the first write
    changed = fingerprint(fresh(SIM))
    assert changed != before
    fresh(SIM).simulation.machine.clear_faults()
    r = _gpud("restore", "--simulate", SIM)
    assert r.returncode == 0, r.stderr
    assert fingerprint(fresh(SIM)) == before and st.load() is None


def test_a_tune_killed_while_it_drives_a_fan_curve_is_undone_by_restore(capsys: pytest.CaptureFixture[str]) -> None:
    m = fresh(SIM)
    before = fingerprint(m)
    sim = m.simulation.machine
    sim.inject("crash", at_write=sim.state["writes"] + 6)  # past the reference trial's writes: a curve's duty
    r = _gpud("tune", "--simulate", SIM, "--goal", "quiet", "--knobs", "fans", "--gpus", "0")
    assert r.returncode == -signal.SIGKILL, r.stderr
    changed = fingerprint(fresh(SIM))
    assert changed["0"]["fans"][0][0] == "manual"  # killed with the fan under the tune's curve
    fresh(SIM).simulation.machine.clear_faults()
    code, _, err = cli(capsys, "restore", "--simulate", SIM)
    assert code == 0, err
    assert fingerprint(fresh(SIM)) == before and st.load() is None


def test_a_command_shorter_than_the_energy_counter_can_measure_is_refused_before_any_setting(
        capsys: pytest.CaptureFixture[str]) -> None:
    before = fingerprint(fresh(SIM))
    true = shutil.which("true")
    assert true is not None
    code, out, err = cli(capsys, "tune", "--simulate", SIM, "--workload", true, "--json")
    assert code == 1 and "less than the 1 s a run must last" in err and "runs for minutes" in err, err
    assert len(err.strip().splitlines()) <= 2  # the error and its remedy, no traceback
    assert fingerprint(fresh(SIM)) == before and st.load() is None


def test_apply_goes_through_a_running_daemon(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    before = fingerprint(fresh(SIM))
    d = RunningDaemon(tmp_path)
    try:
        monkeypatch.setenv("GPUD_SOCKET", d.sock)
        if os.geteuid() == 0:  # the daemon runs as root: a member of its group (uid 1000) is refused at once
            with monkeypatch.context() as mp:
                mp.setattr(os, "geteuid", lambda: 1000)
                code, out, err = cli(capsys, "tune", "--simulate", SIM, "--apply")
            assert code == 1 and "loads only profiles root owns" in err and "sudo gpud tune" in err, err
            assert fingerprint(fresh(SIM)) == before
        code, out, err = cli(capsys, "tune", "--simulate", SIM, "--apply", "--json")
        assert code == 0, err + d.logs()
        doc = json.loads(out)
        assert doc["applied"] is True and doc["profile"] and doc["energy_saving_percent"] >= SAVING * 100
        code, out, _ = cli(capsys, "verify", "--simulate", SIM, "--json")
        assert json.loads(out)["profile"] == "tuned"
        after = fingerprint(fresh(SIM))
        assert [after[str(g)]["power"] for g in range(4)] == [doc["chosen"]["settings"][str(g)]["power_limit"]
                                                              for g in range(4)]
        assert cli(capsys, "restore", "--simulate", SIM)[0] == 0
        assert fingerprint(fresh(SIM)) == before
    finally:
        d.stop()


def test_a_baseline_that_throttles_is_refused_and_nothing_changes() -> None:
    m = fresh(SIM)
    before = fingerprint(m)
    m.simulation.machine.inject("clock_events", gpu=1, reasons=["hw_thermal_slowdown"])
    with pytest.raises(GpudError, match="baseline did not measure"):
        _tune(m)
    m.simulation.machine.clear_faults()
    assert fingerprint(fresh(SIM)) == before


def _pick(seed: int | None, monkeypatch: pytest.MonkeyPatch) -> tuple[float, Any]:
    """The power limit a `--goal energy --max-slowdown 5` tune chooses for the GPUs that set the job's pace,
    with noise in the realisation ``seed``, or noise-free (``None``). Four alike GPUs share one limit, unless a
    realisation leaves some ranks waiting for the others (silicon), whose own lower limits (the `pergpu`
    stage) cost no slowdown: the highest limit of the four is the one the slowdown depends on."""
    if seed is None:
        monkeypatch.setenv("GPUD_SIM_NOISE", "0")
    else:
        monkeypatch.delenv("GPUD_SIM_NOISE", raising=False)
        monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    m = fresh(SIM)
    before = fingerprint(m)
    out = _tune(m)
    _energy_tune_holds(out, before)  # the energy goal's promises, in this realisation too
    assert out.chosen is not None
    limits = [float(out.chosen.settings.get(g, {}).get("power_limit", 300.0)) for g in range(4)]
    return max(limits), out


@pytest.mark.long
def test_eight_noisy_seeds_pick_no_more_aggressively_than_the_noise_free_answer_allows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue #35's acceptance: `--goal energy --max-slowdown 5` on the simulated Z8 with noise on, over eight
    seeds: the pick is more aggressive than the noise-free model allows (below the lowest limit whose
    slowdown is within 5 %) in at most one, and more than 30 W above the noise-free tune's pick in at most one;
    every output carries the intervals. Each of the nine tunes also keeps the energy goal's promises
    (``_energy_tune_holds``: the saving, the confirmation, the trials, every GPU put back)."""
    demand, ar = perf.training_demand_watts(300.0), perf.allreduce_exposed(4)

    def rate(w: float) -> float:  # the model's noise-free DDP rate at a limit (four alike GPUs)
        return 1.0 / (perf.step_time(perf.capped_share(1.0, demand, w)[0]) + ar)

    allowed = min(w for w in range(100, 301) if 1 - rate(w) / rate(300) <= 0.05)  # what 5 % allows: 254 W
    clean, out = _pick(None, monkeypatch)
    assert allowed <= clean <= allowed + 30 and out.confirmed, [t.json() for t in out.trials]
    picks = []
    for seed in range(1, 9):
        w, out = _pick(seed, monkeypatch)
        picks.append(w)
        assert out.energy_saving_ci is not None and out.slowdown_ci is not None  # the intervals
        assert out.slowdown is not None and out.slowdown + out.slowdown_ci <= 0.05 + 1e-9
    assert sum(w < allowed for w in picks) <= 1, (allowed, clean, picks)
    assert sum(w > clean + 30 for w in picks) <= 1, (allowed, clean, picks)


MIXED = '''
[machine]
name = "z8-fury-mixed"
summary = "HP Z8 G5 Fury, 2x RTX A6000 + 2x RTX 6000 Ada, PCIe only"
sockets = 1
cores_per_socket = 56
threads_per_core = 2
memory_gib = 512
psu_watts = 2250
driver_version = "550.127.05"
cuda_driver_version = "12.4"
nvml_version = "12.550.127.05"

[gpu_defaults]
numa_node = 0

[[gpu]]
model = "RTX A6000"
bus_id = "0000:16:00.0"
root_port = "0000:15:01.0"

[[gpu]]
model = "RTX A6000"
bus_id = "0000:38:00.0"
root_port = "0000:37:01.0"

[[gpu]]
model = "RTX 6000 Ada"
bus_id = "0000:5a:00.0"
root_port = "0000:59:01.0"

[[gpu]]
model = "RTX 6000 Ada"
bus_id = "0000:7c:00.0"
root_port = "0000:7b:01.0"
'''


@pytest.mark.long
def test_a_mixed_machine_caps_the_faster_cards_on_their_own_within_one_percent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2x RTX A6000 + 2x RTX 6000 Ada in one DDP job, --max-slowdown 1: the Ada cards (their ranks wait at
    every all-reduce for the A6000s) are capped alone, the A6000s keep their limit, energy is saved with
    the slowdown's upper bound within 1 %; no clock "match" across architectures."""
    desc = tmp_path / "mixed.toml"
    desc.write_text(MIXED)
    before = fingerprint(fresh(str(desc)))
    code, out, err = cli(capsys, "tune", "--simulate", str(desc), "--max-slowdown", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert check(doc) == []
    wait = doc["trials"][0]["waiting_percent"]  # the baseline's: every rank waits out the all-reduce's exposed part
    assert abs(wait["0"] - wait["1"]) < 3  # the A6000s set the pace, the Ada ranks wait for them besides
    assert min(wait["2"], wait["3"]) > max(wait["0"], wait["1"]) + 20, wait
    chosen = doc["chosen"]["settings"]
    assert set(chosen) == {"2", "3"} and all(chosen[g]["power_limit"] < 300 for g in ("2", "3")), chosen
    assert doc["confirmed"] and doc["gain_excludes_zero"] and doc["energy_saving_percent"] > 0
    assert doc["slowdown_percent"] + doc["slowdown_ci_percent"] <= 1.0
    assert not any(t["stage"] == "match" for t in doc["trials"])
    assert fingerprint(fresh(str(desc))) == before
