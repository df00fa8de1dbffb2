"""The fan-curve controller alone, then in a closed loop with the simulator's thermal model."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from gpud.backends import open_machine
from gpud.profiles.fancurve import FAILSAFE, FanController, FanCurve
from gpud.profiles.fanloop import FanControl
from gpud.profiles.profile import load, resolve

CURVE = FanCurve(((30, 40), (60, 70), (80, 100)), hysteresis=3, minimum=0, max_ramp=10)


def test_linear_interpolation_and_flat_ends() -> None:
    assert CURVE.duty_at(10) == 40 and CURVE.duty_at(30) == 40
    assert CURVE.duty_at(45) == 55 and CURVE.duty_at(70) == 85
    assert CURVE.duty_at(80) == 100 and CURVE.duty_at(105) == 100
    assert CURVE.target_temperature() == 80


def test_first_command_goes_straight_to_the_curve() -> None:
    c = FanController(CURVE)
    assert c.update(45, now=0) == 55


def test_ramp_limit_both_ways() -> None:
    c = FanController(CURVE)
    c.update(30, now=0)  # 40 %
    assert c.update(70, now=1) == 50  # +10 %/s at most
    assert c.update(70, now=2) == 60
    assert c.update(70, now=10) == 85
    assert c.update(30, now=11) == 75  # down: also 10 %/s
    assert c.update(30, now=20) == 40


def test_emergency_skips_the_ramp() -> None:
    c = FanController(CURVE)
    c.update(30, now=0)
    assert c.update(85, now=0.5) == 100


def test_hysteresis_on_the_way_down_only() -> None:
    c = FanController(CURVE, )
    assert c.update(60, now=0) == 70
    assert c.update(58, now=10) == 70  # 2 °C down: within hysteresis, duty holds
    assert c.update(57.5, now=20) == 70
    assert c.update(57, now=30) == 67  # 3 °C down: follows the curve again
    assert c.update(59, now=40) == 69  # rising: immediate


def test_floor_from_profile_and_gpu() -> None:
    c = FanController(FanCurve(((30, 20), (80, 100)), minimum=35), fan_min=30)
    assert c.update(20, now=0) == 35
    c = FanController(FanCurve(((30, 20), (80, 100)), minimum=0), fan_min=30)
    assert c.update(20, now=0) == 30


def test_failsafe_on_unreadable_temperature_then_resume() -> None:
    c = FanController(CURVE)
    c.update(50, now=0)
    assert c.update(None, now=1) == FAILSAFE
    assert c.duty is None
    assert c.update(50, now=2) == 60  # resumes from scratch, straight to the curve


def test_fixed_mode_is_a_flat_curve() -> None:
    curve = FanCurve.from_profile({"mode": "fixed", "percent": 65})
    c = FanController(curve)
    assert c.update(20, 0) == 65 and c.update(95, 1) == 65


def _run(m, fc: FanControl | None, seconds: int, gpu: int = 0) -> list[float]:
    """One daemon tick per simulated second; as in the daemon, the process lists (slow NVML calls)
    are read by the off-tick sampler, not by each tick's snapshot."""
    sim = m.simulation.machine
    temps = []
    stop = threading.Event()
    sampler = m.nvml.start_sampler(stop)
    try:
        for t in range(seconds):
            sim.advance(1.0)
            snap = m.snapshot()
            if fc is not None:
                fc.step(snap.samples, now=float(t))
            temps.append(snap.samples[gpu].temperature_celsius)
    finally:
        stop.set()
        sampler.join()
    return temps


def test_closed_loop_holds_a_loaded_gpu_at_or_below_the_curve_target(state_dir) -> None:
    auto = open_machine("z8-fury-4x-a6000")
    auto.simulation.machine.set_load(0, 100, 200)
    auto_temps = _run(auto, None, 1800)

    from gpud.sim import reset

    reset("z8-fury-4x-a6000")
    m = open_machine("z8-fury-4x-a6000")
    m.simulation.machine.set_load(0, 100, 200)
    desired = resolve(load("training"), list(m.snapshot().gpus))
    fc = FanControl.from_profile(m, {0: desired[0]})
    temps = _run(m, fc, 1800)
    target = FanCurve.from_profile(desired[0]["fan"]).target_temperature()
    settled = temps[-600:]
    assert max(settled) <= target, (max(settled), target)
    assert max(settled) < min(auto_temps[-600:]), "the training curve should cool better than the driver's"
    s = m.snapshot().samples[0]
    assert s.fans[0].policy == "manual" and s.fans[0].target_percent >= 85
    fc.release()
    assert m.snapshot().samples[0].fans[0].policy == "auto"


def test_failsafe_on_temperature_read_failure_within_one_step(state_dir) -> None:
    m = open_machine("z8-fury-4x-a6000")
    desired = resolve(load("training"), list(m.snapshot().gpus))
    fc = FanControl.from_profile(m, desired)
    fc.step(m.snapshot().samples, now=0)
    assert m.snapshot().samples[1].fans[0].policy == "manual"
    m.simulation.machine.inject("unsupported", call="nvmlDeviceGetTemperature", gpu=1)
    events = fc.step(m.snapshot().samples, now=1)
    assert [(e.gpu, e.kind) for e in events if e.kind == "failsafe"] == [(1, "failsafe")]
    assert m.snapshot().samples[1].fans[0].policy == "auto" and fc.failsafes == 1
    assert m.snapshot().samples[0].fans[0].policy == "manual"  # the others stay under control
    fc.step(m.snapshot().samples, now=2)
    assert fc.failsafes == 1  # counted once per episode


@pytest.mark.parametrize("fault", ["gpu_lost", "write"])
def test_failsafe_on_lost_gpu_or_failed_write(state_dir, fault: str) -> None:
    m = open_machine("z8-fury-4x-a6000")
    desired = resolve(load("training"), list(m.snapshot().gpus))
    fc = FanControl.from_profile(m, desired)
    fc.step(m.snapshot().samples, now=0)
    sim = m.simulation.machine
    if fault == "gpu_lost":
        sim.inject("gpu_lost", gpu=2)
    else:
        sim.inject("no_permission", call="nvmlDeviceSetFanSpeed_v2", gpu=2)
        sim.set_load(2, 100, 250)
        sim.advance(60)
    events = fc.step(m.snapshot().samples, now=60)
    assert (2, "failsafe") in [(e.gpu, e.kind) for e in events]
    if fault == "write":
        assert m.snapshot().samples[2].fans[0].policy == "auto"
    assert fc.failsafes == 1


def test_reconfiguring_the_same_curves_rewrites_nothing(state_dir) -> None:
    """A rule switch hands FanControl every GPU's settings (the switched GPU's and the base profile's on the
    rest): the GPUs whose curve did not change keep their controller and the duty written, so the next step
    writes only the switched GPU's fans (under process churn most ticks followed a switch and rewrote all)."""
    m = open_machine("z8-fury-4x-a6000")
    training = resolve(load("training"), list(m.snapshot().gpus))
    quiet = resolve(load("quiet"), list(m.snapshot().gpus))
    fc = FanControl.from_profile(m, training)
    fc.step(m.snapshot().samples, now=0)
    kept = {g: fc.controllers[g] for g in (0, 1, 2)}
    writes: list[int] = []
    real = m.nvml.set_fan_speed
    m.nvml.set_fan_speed = lambda gpu, fan, duty: (writes.append(gpu), real(gpu, fan, duty))[1]  # type: ignore[method-assign]
    fc.configure({**training, 3: quiet[3]})
    fc.step(m.snapshot().samples, now=1)
    assert all(fc.controllers[g] is kept[g] for g in kept)
    assert set(writes) == {3}, writes


def test_a_reset_to_auto_that_a_duty_change_would_undo_is_still_counted(state_dir) -> None:
    """The sample's fan policies are slow fields (read every 10 s) and a speed write takes a fan back to
    manual (nvml.h, nvmlDeviceSetFanSpeed_v2): a driver reload just before a duty change was re-taken
    unseen, neither logged nor counted (a daemon test met it under load). The policy is asked afresh
    before a write, so the re-apply is seen however the reload and the slow read fall."""
    m = open_machine("z8-fury-4x-a6000")
    fc = FanControl.from_profile(m, {0: {"fan": {"mode": "curve", "points": [[20, 30], [90, 100]]}}})
    first = m.snapshot()
    assert [e.kind for e in fc.step(first.samples, now=0.0)] == ["duty"]
    stale = m.snapshot()  # the policies now cached as manual for the next 10 s
    assert all(f.policy == "manual" for f in stale.samples[0].fans)
    m.nvml.set_fan_auto(0, 0)  # what a driver reload does, between two slow reads
    hotter = [dataclasses.replace(s, temperature_celsius=(s.temperature_celsius or 0) + 20) if s.index == 0 else s
              for s in stale.samples]  # a warmer reading: the curve asks another duty, a write is due
    events = fc.step(hotter, now=30.0)
    assert [e.kind for e in events] == ["reapply", "duty"], events
    assert "auto policy" in events[0].detail
    assert m.nvml.fan_policy(0, 0) == "manual"
