"""The last burn-in's result (``burnin.json`` in the state directory, for ``gpud doctor --burnin`` and
the exporter) and its entry in the health journal."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from gpud.burnin.result import Result
from gpud.paths import atomic_write, state_dir

log = logging.getLogger(__name__)


def last_path() -> Path:
    return state_dir() / "burnin.json"


def record(res: Result, doc: dict[str, Any]) -> None:
    """Keep the document (without telemetry) as the last result, and add a ``burnin`` event to the
    journal: the level, the verdict, the failed GPUs and tests."""
    path = last_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({**doc, "telemetry": None}, indent=1))
    failed = res.failed_gpus()
    tests = sorted({v.test for v in res.verdicts if v.status == "fail"})
    summary = f"burn-in {res.level}: {res.status}" + (f" (GPU {', '.join(map(str, failed))}: {', '.join(tests)})"
                                                     if failed else "")
    try:
        from gpud.journal import Journal

        j = Journal()
        try:
            j.record("burnin", summary, data={"level": res.level, "status": res.status, "failed_gpus": failed,
                                               "tests": tests, "seconds": res.seconds})
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
