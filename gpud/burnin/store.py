"""The last burn-in's result (``burnin.json`` in the state directory, for ``gpud doctor --burnin`` and
the exporter) and its entry in the health journal."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from gpud.burnin.result import Result
from gpud.journal import Journal
from gpud.model import CheckResult, Status
from gpud.paths import atomic_write, burnin_path

log = logging.getLogger(__name__)


def last_path() -> Path:
    return burnin_path()


def record(res: Result, doc: dict[str, Any]) -> None:
    """Keep the document (without telemetry) as the last result, and add a ``burnin`` event to the
    journal: the level, the verdict, the failed GPUs and tests."""
    path = last_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({**doc, "telemetry": None}, indent=1))
    failed = res.failed_gpus()
    tests = sorted({v.test for v in res.verdicts if v.status == "fail"})
    unjudged = sorted({v.test for v in res.not_judged()})
    summary = f"burn-in {res.level}: {res.status}" + (f" (GPU {', '.join(map(str, failed))}: {', '.join(tests)})"
                                                     if failed else "")
    if unjudged:  # unknown is not pass: the journal says what was not judged
        summary += f"; {len(unjudged)} test(s) not judged"
    try:

        j = Journal()
        try:
            j.record("burnin", summary, data={"level": res.level, "status": res.status, "failed_gpus": failed,
                                               "tests": tests, "seconds": res.seconds, "not_judged": unjudged})
        finally:
            j.close()
    except Exception as err:  # noqa: BLE001 - the journal never stops a command
        log.warning("journal: %s", err)


def last() -> dict[str, Any] | None:
    """The last burn-in's document, or None (none yet, or unreadable)."""
    try:
        data = json.loads(last_path().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("kind") == "burnin" else None


def as_checks(doc: dict[str, Any] | None, now: float | None = None) -> list[CheckResult]:
    """The last burn-in as doctor's results (``gpud doctor --burnin``): ``burnin.last`` for the run
    (when, level, verdict) and ``burnin.gpu`` per GPU with its failed tests, figures and remedies."""
    if doc is None:
        return [CheckResult("burnin.last", "skip", "no burn-in has run on this machine",
                            remedy="gpud burnin --level standard --report burnin.html")]
    age_h = ((now or time.time()) - float(doc.get("started") or 0)) / 3600
    status: Status = "fail" if doc["status"] == "fail" else "warn" if doc["status"] == "warn" else "pass"
    out = [CheckResult("burnin.last", status, f"{doc['level']} burn-in {age_h:.1f} h ago: {doc['status']}"
                       + (" (interrupted)" if doc.get("interrupted") else "")
                       + (" — CPU figures" if doc.get("figures") == "cpu" else ""),
                       remedy="gpud burnin --level standard" if status != "pass" else "")]
    for g in doc.get("gpus", []):
        bad = [v for v in doc["verdicts"] if v["gpu"] == g["index"] and v["status"] in ("fail", "warn")]
        unjudged = sorted({v["test"] for v in doc["verdicts"] if v["gpu"] == g["index"] and v["status"] == "skip"
                           and str(v["summary"]).startswith("not judged")})
        st: Status = "fail" if any(v["status"] == "fail" for v in bad) else "warn" if bad else "pass"
        good = ("every burn-in test passed" if not unjudged else
                f"passed what was judged; not judged: {', '.join(unjudged)}")  # unknown is not pass
        out.append(CheckResult("burnin.gpu", st, "; ".join(f"{v['test']}: {v['summary']}" for v in bad)
                               if bad else good, g["index"],
                               detail="\n".join(f"{v['test']}: threshold: {v['source']}" for v in bad),
                               remedy=next((v["remedy"] for v in bad if v["remedy"]), "")))
    return out
