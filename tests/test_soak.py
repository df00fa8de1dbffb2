"""The reliability soak, two minutes of it (benchmarks/soak.py runs 30): 50 scrapers, a SIGHUP every
10 s, apply/restore over the socket and injected faults, and the daemon makes no error and does not grow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

pytestmark = pytest.mark.long


def test_a_minute_of_the_soak_makes_no_error_and_no_growth(tmp_path) -> None:
    """The soak's whole mix for one minute (its 30-minute figures are the benchmark's, docs/robustness.md):
    the suite's share of CI's 10 minutes."""
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "soak.py"), "--minutes", "1", "--scrapers", "50",
                        "--json", str(out)], capture_output=True, text=True, timeout=420, cwd=REPO)
    res = json.loads(out.read_text())
    assert r.returncode == 0 and res["errors"] == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for figure in ("errors", "RSS growth after warm-up", "tick period error p99", "scrapes", "SIGHUPs"):
        assert figure in r.stdout
    assert res["sighups"] >= 5 and res["faults"] >= 10 and res["control"] >= 10 and res["scrapes"] > 500
    assert res["rss_growth_mb"] <= 5.0, res
