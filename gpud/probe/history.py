"""Probe results, appended as JSON lines to ``$GPUD_STATE_DIR/probe-history.jsonl``.

Readable without torch: the daemon and the exporter use it. A figure at least 10 % below the
machine's best recent one is a regression.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpud.paths import state_dir

KEEP = 500  # results kept in the file
RECENT = 20  # results the regression check compares against
REGRESSION = 0.10


def path() -> Path:
    return state_dir() / "probe-history.jsonl"


def load(limit: int | None = None) -> list[dict[str, Any]]:
    try:
        lines = path().read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines[-limit:] if limit else lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def latest() -> dict[str, Any] | None:
    runs = load(limit=1)
    return runs[-1] if runs else None


def append(result: dict[str, Any]) -> None:
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    runs = load()[-(KEEP - 1):] + [result]
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in runs))
    os.replace(tmp, p)


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The comparable figures of one run (higher is better)."""
    out: dict[str, float] = {}
    for ws, r in (result.get("ddp") or {}).get("by_world_size", {}).items():
        out[f"ddp samples/s at world size {ws}"] = r["samples_per_second"]
    for ws, r in (result.get("allreduce") or {}).get("by_world_size", {}).items():
        out[f"all-reduce busbw at world size {ws}"] = r["peak_busbw_bytes_per_second"]
    for pair in (result.get("p2p") or {}).get("pairs", []):
        out[f"P2P GPU{pair['src']}→GPU{pair['dst']}"] = pair["bandwidth_bytes_per_second"]
    return out


def regressions(result: dict[str, Any], previous: list[dict[str, Any]]) -> list[str]:
    """Figures ≥ 10 % below the best of the recent comparable runs (same device and host)."""
    same = [r for r in previous[-RECENT:] if r.get("device") == result.get("device")
            and r.get("host") == result.get("host")]
    best: dict[str, float] = {}
    for r in same:
        for k, v in figures(r).items():
            best[k] = max(best.get(k, 0.0), v)
    out = []
    for k, v in figures(result).items():
        if k in best and best[k] > 0 and v < (1 - REGRESSION) * best[k]:
            out.append(f"{k}: {v:.4g}, {100 * (1 - v / best[k]):.0f} % below the recent best {best[k]:.4g}")
    return out
