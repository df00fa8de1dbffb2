"""Each doctor check reports through a ``Reporter`` bound to the id its ``@check`` registers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpud.backends import open_machine
from gpud.config import Config
from gpud.doctor import CHECKS, diagnose
from gpud.doctor.registry import Check, Context, Reporter, run
from gpud.model import CheckResult


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
