"""Each doctor check reports through a ``Reporter`` bound to the id its ``@check`` registers; the fans'
fit is pure functions of the history; a fan setting is read as a curve in one place."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from gpud.backends import open_machine
from gpud.config import Config
from gpud.doctor import CHECKS, diagnose, fans
from gpud.doctor.registry import Check, Context, Reporter, run
from gpud.model import CheckResult, ThermalPoint
from gpud.profiles.fancurve import FanCurve, curve_of


@pytest.mark.parametrize("name", ["z8-fury-4x-a6000", "z8-fury-4x-a6000-degraded", "z8-g4-2x-rtx8000-sli"])
def test_every_result_carries_its_checks_id(name: str, state_dir) -> None:
    report = diagnose(open_machine(name), Config())
    ids = {c.id for c in CHECKS}
    assert {r.id for r in report.checks} <= ids
    assert not [r for r in report.checks if "reported under the id" in r.summary]


def test_a_reporter_makes_results_under_its_id_only() -> None:
    r = Reporter("config.test")
    got = [r.ok("fine", gpu=1), r.warn("hm", detail="d"), r.fail("no", remedy="fix"), r.skip("n/a"),
           r.result("warn", "again")]
    assert [x.id for x in got] == ["config.test"] * 5
    assert [x.status for x in got] == ["pass", "warn", "fail", "skip", "warn"]
    assert got[0].gpu == 1 and got[1].detail == "d" and got[2].remedy == "fix"


def test_a_result_under_another_id_is_reported_as_a_broken_check(state_dir) -> None:
    def stray(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
        yield r.ok("mine")
        yield CheckResult("other.id", "pass", "not mine")

    m = open_machine("z8-fury-4x-a6000")
    ctx = Context(m, Config(), {}, snapshot=m.snapshot())
    got = run(ctx, [Check("config.test", "Configuration", stray, needs_nvml=True)])
    assert [(x.id, x.status) for x in got] == [("config.test", "pass"), ("config.test", "skip")]
    assert "reported under the id 'other.id'" in got[1].summary


def test_health_fans_keeps_its_place_in_doctors_order() -> None:
    ids = [c.id for c in CHECKS]
    assert ids.index("health.thermal") + 1 == ids.index("health.fans") == ids.index("health.pcie_replay") - 1
    assert next(c for c in CHECKS if c.id == "health.fans").fn is fans.health_fans


def _newton(settle: float, tau: float, t0: float, seconds: int, watts: float = 200.0) -> list[ThermalPoint]:
    """A GPU warming by Newton's law from t0 towards settle (exact, unrounded readings)."""
    return [ThermalPoint(float(t), settle - (settle - t0) * math.exp(-t / tau), 70.0, watts)
            for t in range(0, seconds, 5)]


def test_the_newton_fit_recovers_the_settling_temperature_and_time_constant() -> None:
    fit = fans.newton_fit(_newton(95.0, 120.0, 40.0, 300))
    assert fit is not None
    settle, tau = fit
    assert abs(settle - 95.0) < 1.0 and abs(tau - 120.0) / 120.0 < 0.05
    cooling = [ThermalPoint(float(t), 80.0 - t / 10, 70.0, 200.0) for t in range(0, 100, 5)]
    assert fans.newton_fit(cooling) is None  # the rate does not fall as it warms: nothing to project


def test_the_stretches_cut_at_a_change_of_draw() -> None:
    points = _newton(95.0, 120.0, 40.0, 100, watts=100.0) + [
        ThermalPoint(100.0 + p.timestamp, p.temperature_celsius, p.fan_percent, 250.0)
        for p in _newton(95.0, 120.0, 40.0, 100)]
    runs = fans.stretches(points)
    assert [len(run) for run in runs] == [20, 20] and {p.power_watts for p in runs[-1]} == {250.0}


def test_a_gpu_settling_above_its_limit_fails_and_one_settling_below_does_not() -> None:
    hot = fans.not_cooling_over_time(_newton(110.0, 100.0, 45.0, 300), limit=90)
    assert hot and "settles near 110 °C" in hot[0]
    assert fans.not_cooling_over_time(_newton(75.0, 100.0, 45.0, 300), limit=90) == []
    assert fans.judge_stretch(_newton(110.0, 100.0, 45.0, 300), limit=90) == hot


def test_one_reading_of_a_fan_setting() -> None:
    curve = curve_of({"mode": "curve", "points": [[40, 30], [80, 100]], "hysteresis": 2, "minimum": 20,
                      "max_ramp": 5})
    assert curve == FanCurve(((40.0, 30.0), (80.0, 100.0)), 2.0, 20.0, 5.0)
    assert curve_of({"mode": "fixed", "percent": 65}) == FanCurve(((0.0, 65.0), (110.0, 65.0)))
    for none in ("auto", "unsupported", None, {"mode": "auto"}, {"mode": "curve"}, {"mode": "curve", "points": []},
                 {"mode": "curve", "points": [[40]]}, {"mode": "fixed"}, {"mode": "curve", "points": [[40, 30]],
                                                                          "hysteresis": None}):
        assert curve_of(none) is None, none
    with pytest.raises(ValueError):
        FanCurve.from_profile({"mode": "curve", "points": [["hot", 30]]})
