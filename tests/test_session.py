"""The tuning session's results travel as JSON between the daemon and the command line: what one side
writes, the other reads back the same; a daemon's refusal stays a refusal."""

from __future__ import annotations

from typing import Any

import pytest

from gpud.errors import GpudError
from gpud.profiles.engine import Change, Drift
from gpud.profiles.session import ApplyResult, DaemonGone, DaemonSession, RestoreResult, VerifyResult

PLAN = (Change(0, "power_limit", 300.0, 250.0, "set"), Change(None, "cpu_governor", "powersave", "performance", "set",
                                                            "note"),
        Change(1, "fan", {"mode": "auto"}, {"mode": "curve", "points": [[40, 30], [80, 100]]}, "daemon"))


def test_results_read_back_as_they_were_written() -> None:
    applied = ApplyResult(ok=False, profile="quiet", chain=("balanced", "quiet"), source="/etc/gpud/quiet.toml",
                          target="host z8", daemon=True, plan=PLAN, skipped=PLAN[:1], written=2, error="GPU 0: no",
                          rolled_back=("GPU 0 power_limit",), not_restored=("x",), messages=("m",))
    assert ApplyResult.from_json(applied.to_json()) == applied
    dry = ApplyResult(ok=True, profile="quiet", target="host z8", dry_run=True, daemon=True, plan=PLAN)
    assert ApplyResult.from_json(dry.to_json()) == dry and "written" not in dry.to_json()
    refused = ApplyResult(ok=False, profile=None, target="host z8", daemon=True, planned=False, error="no",
                          remedy="restore first")
    assert ApplyResult.from_json(refused.to_json()) == refused
    verified = VerifyResult("quiet", True, (Drift(0, "power_limit", 300.0, 250.0, "drift"),
                                            Drift(None, "cpu_governor", "performance", "performance", "ok")))
    assert VerifyResult.from_json(verified.to_json()) == verified and [d.gpu for d in verified.drifted] == [0]
    restored = RestoreResult(("GPU 0 power_limit: 300 W",), ("GPU 1 fan",), "host z8")
    assert RestoreResult.from_json(restored.to_json(), "host z8") == restored and not restored.ok


def _daemon(replies: dict[str, dict[str, Any] | None]) -> DaemonSession:
    def ask(cmd: str, **args: Any) -> dict[str, Any] | None:
        reply = replies[cmd]
        return None if reply is None else dict(reply)

    return DaemonSession(ask, "host z8")


def test_a_daemons_refusal_is_never_read_as_nothing_applied() -> None:
    session = _daemon({"verify": {"ok": False, "error": "tuning.json is not JSON", "remedy": "gpud restore"},
                       "restore": {"ok": False, "error": "refused: not in the group"},
                       "apply": {"ok": False, "error": "busy", "remedy": "wait"}})
    with pytest.raises(GpudError, match="tuning.json is not JSON") as err:
        session.verify()
    assert err.value.remedy == "gpud restore"
    restored = session.restore()
    assert not restored.ok and restored.failed == ("refused: not in the group",)  # the refusal is what failed
    applied = session.apply("quiet")
    assert not applied.ok and not applied.planned and applied.to_json()["remedy"] == "wait"
    with pytest.raises(DaemonGone):
        _daemon({"restore": None}).restore()
