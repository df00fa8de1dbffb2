"""`gpud tune`'s workloads: the probe's training loop as one job whose step counter the windows read (its
start-up outside every window, nothing left running), and the user's command (its children killed with its
process group, runs too short to measure refused)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from tuning_helpers import fingerprint, fresh

from gpud.autotune.run import LocalApplier, run_tune
from gpud.autotune.trial import Measure, run_trial
from gpud.autotune.workload import Command, RunTooShort, Training
from gpud.backends import SimPace

SIM = "z8-fury-4x-a6000"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return not f.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return False


def _baseline(startup_share: float | None, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, float]:
    """The baseline of a light training job (10 % of the default limit at the full clock), whose start-up
    draws ``startup_share`` of the default limit; and the energy the start-up took, J."""
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")
    m = fresh(SIM)
    pace = SimPace(m.simulation, startup_share=startup_share, demand_share=0.1)
    work = Training(pace, {})
    e0 = sum(m.nvml.get("nvmlDeviceGetTotalEnergyConsumption", m.nvml.handle(g), gpu=g) for g in range(2)) / 1000
    work.start([0, 1])
    e1 = sum(m.nvml.get("nvmlDeviceGetTotalEnergyConsumption", m.nvml.handle(g), gpu=g) for g in range(2)) / 1000
    try:
        t = run_trial(m, work, LocalApplier(m), [0, 1], 0, "baseline", {}, Measure(), warm=True)
    finally:
        pids = list(work.job.pids)
        work.stop()
    assert not any(_alive(p) for p in pids)  # the job's ranks are gone with it
    return t, e1 - e0


def test_windows_exclude_the_jobs_start_up_a_start_up_at_ten_times_the_draw_gives_the_same_joules_per_sample(
        monkeypatch: pytest.MonkeyPatch) -> None:
    plain, e_plain = _baseline(None, monkeypatch)
    heavy, e_heavy = _baseline(1.0, monkeypatch)  # ten times the steady 10 %
    assert plain.ok and heavy.ok and plain.joules_per_sample and heavy.joules_per_sample
    assert e_heavy > 5 * e_plain  # the start-up did draw far more
    assert heavy.joules_per_sample == pytest.approx(plain.joules_per_sample, rel=0.01)
    assert heavy.samples_per_second == pytest.approx(plain.samples_per_second, rel=0.01)
    assert heavy.soak_s > 0 and heavy.settle_s >= Measure().settle_min_s  # warmed, then settled, then measured


def test_nothing_of_the_training_job_keeps_running_after_the_tune() -> None:
    m = fresh(SIM)
    before = fingerprint(m)
    work = Training(SimPace(m.simulation), {})
    pids: list[int] = []
    start = work.start

    def started(gpus: list[int]) -> None:
        start(gpus)
        pids.extend(work.job.pids)

    work.start = started  # type: ignore[method-assign]
    out = run_tune(m, work, LocalApplier(m), goal="throughput", max_slowdown=0.05, knobs=["power"], gpus=[0, 1],
                   measure=Measure())
    assert out.baseline is not None and pids and not any(_alive(p) for p in pids)
    assert fingerprint(fresh(SIM)) == before


def test_a_command_that_leaves_children_has_them_killed_with_its_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    cmd = Command(f"sh -c 'sleep 60 & echo $! > {pidfile}; exit 0'", "cpu", {}, min_run_s=0.0)
    cmd.start([])
    t0 = time.monotonic()
    n, _ = cmd.window(1.0)
    assert n == 1.0 and time.monotonic() - t0 < 10  # the child holding stderr does not keep the run waiting
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the command's child outlived its run"


def test_a_command_shorter_than_a_run_can_be_measured_is_refused() -> None:
    cmd = Command("true", "cpu", {})
    cmd.start([])
    with pytest.raises(RunTooShort, match="must last to be measured"):
        cmd.window(1.0)
    assert "minutes" in RunTooShort.remedy


def test_a_command_whose_runs_leave_the_energy_counters_still_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    m = fresh(SIM)
    cmd = Command("true", "cpu", {}, min_run_s=0.0)
    monkeypatch.setattr(m.nvml, "get", lambda name, *a, **k: 5000 if name == "nvmlDeviceGetTotalEnergyConsumption"
                        else type(m.nvml).get(m.nvml, name, *a, **k))
    cmd.start([0])
    with pytest.raises(RunTooShort, match="energy counters did not move"):
        run_trial(m, cmd, LocalApplier(m), [0], 0, "baseline", {}, Measure(warmup_s=0))


def test_rate_from_reads_a_running_commands_throughput_from_its_output_and_stops_it() -> None:
    import shlex
    import sys

    from gpud.autotune.workload import RateCommand

    m = fresh(SIM)
    loop = "import time\nwhile True:\n    print('step: 12.5 it/s', flush=True)\n    time.sleep(0.2)"
    cmd = RateCommand(f"{shlex.quote(sys.executable)} -u -c {shlex.quote(loop)}", "cpu", {}, r"([\d.]+) it/s")
    cmd.start([0])
    try:
        t = run_trial(m, cmd, LocalApplier(m), [0], 0, "baseline", {}, Measure())
        pid = cmd.proc.pid if cmd.proc is not None else 0
    finally:
        cmd.stop()
    assert t.ok and t.samples_per_second == pytest.approx(12.5, rel=1e-6), t.json()
    assert t.settle_s > 0 and t.windows >= 3  # a long-running job: settled, then windows of its lines
    assert pid and not _alive(pid)


@pytest.mark.parametrize(("args", "key"), [
    (["--rate-from", "([\\d.]+"], "--rate-from"),
    (["--rate-from", "it/s"], "--rate-from"),
    (["--rate-from", "([\\d.]+) it/s", "--workload", "probe"], "--rate-from"),
    (["--timeout", "0", "--workload", "sleep 5"], "--timeout"),
])
def test_bad_rate_from_or_timeout_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str],
                                                         key: str) -> None:
    from tuning_helpers import cli

    argv = ["tune", "--simulate", SIM, *args]
    if "--workload" not in args:
        argv += ["--workload", "sleep 5"]
    code, _, err = cli(capsys, *argv)
    assert code == 2 and key in err and len(err.strip().splitlines()) <= 2, err


def test_a_locked_clock_is_read_back_from_the_clock_under_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML has no getter for locked clocks: the SM clock under load is the evidence. A lock that held runs
    at or below it; a GPU that reports a clock above the lock (here: a driver that ignored it) fails the
    trial, and the setting is undone."""
    m = fresh(SIM)
    before = fingerprint(m)
    work = Training(SimPace(m.simulation, startup_s=5.0), {})
    work.start([0])
    lock = {0: {"power_limit": 300.0, "gpu_clocks": [1200, 1200]}}
    try:
        held = run_trial(m, work, LocalApplier(m), [0], 1, "clocks", lock, Measure())
        assert held.ok and held.sm_mhz[0] <= 1200 + 15, held.json()
        real = m.nvml.telemetry

        def ignored(g: int) -> Any:
            s = real(g)
            return s.__class__(**{**s.__dict__, "clocks_mhz": {**s.clocks_mhz, "sm": 1800}})

        monkeypatch.setattr(m.nvml, "telemetry", ignored)
        broke = run_trial(m, work, LocalApplier(m), [0], 2, "clocks", lock, Measure())
    finally:
        work.stop()
    assert broke.status == "failed" and "above the 1200 MHz locked" in broke.note, broke.json()
    LocalApplier(m).restore()
    assert fingerprint(fresh(SIM)) == before
