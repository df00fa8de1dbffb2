"""Probe results, appended as JSON lines to ``$GPUD_STATE_DIR/probe-history.jsonl``.

Readable without torch: the daemon and the exporter use it. Each line is a ``ProbeReport``'s
JSON; ``load`` gives the records as written (any version, for comparisons and the support
archive), ``latest`` the newest as a ``ProbeReport``. A line that is not JSON, or not a report
(not an object, or a value of the wrong type: a hand-edited or damaged file), is skipped, with a
warning naming the file and the line, once each time the file changes. A figure below the machine's best
recent one on the same workload by more than 10 % — or by more than three times the spread of its
timed windows, when that is larger — is a regression.
"""

from __future__ import annotations

import fcntl
import json
import logging
from pathlib import Path
from typing import Any

from gpud.paths import atomic_write, in_state_dir
from gpud.probe.report import ProbeReport

log = logging.getLogger("gpud.probe")

Record = dict[str, Any]  # one line of the file, as written (by this or an earlier gpud)

KEEP = 500  # results kept in the file
RECENT = 20  # results the regression check compares against
REGRESSION = 0.10
SPREAD_FACTOR = 3.0  # a drop must exceed this many times the figure's measured spread


def path() -> Path:
    return in_state_dir("probe-history.jsonl")


# the file as last seen (name, mtime, size) and the numbers of its skipped lines already logged
_warned: tuple[tuple[str, int, int], set[int]] = (("", 0, 0), set())


def _parse(line: str) -> tuple[Record | None, str]:
    """One line as a record, or None and why it is not one."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None, "not valid JSON"
    if not isinstance(rec, dict):
        return None, "not a probe report (not a JSON object)"
    problems: list[str] = []
    ProbeReport.from_json(rec, problems)
    if problems:
        return None, "not a probe report (" + "; ".join(problems[:3]) + (", …" if len(problems) > 3 else "") + ")"
    return rec, ""


def _read(newest: int | None = None) -> list[tuple[int, Record]]:
    """The usable records with their line numbers, oldest first; with ``newest``, only that many
    of the newest usable ones (read from the end). Skipped lines are logged once per file change."""
    global _warned
    p = path()
    try:
        st = p.stat()
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out: list[tuple[int, Record]] = []
    skipped: list[tuple[int, str]] = []
    order = range(len(lines) - 1, -1, -1) if newest else range(len(lines))
    for i in order:
        if not lines[i].strip():
            continue
        rec, why = _parse(lines[i])
        if rec is None:
            skipped.append((i + 1, why))
            continue
        out.append((i + 1, rec))
        if newest and len(out) >= newest:
            break
    sig = (str(p), st.st_mtime_ns, st.st_size)
    if sig != _warned[0]:
        _warned = (sig, set())
    for n, why in sorted(skipped):
        if n not in _warned[1]:
            _warned[1].add(n)
            log.warning("%s line %d skipped: %s", p, n, why)
    return sorted(out, key=lambda x: x[0]) if newest else out


def load(limit: int | None = None) -> list[Record]:
    """The usable records, oldest first (the newest ``limit`` of them when given)."""
    return [rec for _, rec in _read(limit)]


def latest() -> ProbeReport | None:
    """The newest usable record as a report; None when there is none."""
    runs = load(limit=1)
    return ProbeReport.from_json(runs[-1]) if runs else None


def append(result: ProbeReport) -> None:
    """Add a result: under a lock (a CLI probe and the daemon's may finish together), written
    atomically (temp, fsync, rename), the oldest beyond KEEP dropped."""
    p = path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p.with_name(p.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = load()[-(KEEP - 1):] + [result.to_json()]
        atomic_write(p, "".join(json.dumps(r, sort_keys=True) + "\n" for r in runs))


def workload(result: Record, model: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything that changes what the probe runs: a full run is never compared with a quick one."""
    return {"device": result.get("device"), "quick": bool(result.get("quick")),
            "suites": sorted(result.get("suites") or []), "dtype": result.get("dtype"), "model": model,
            "gpu_name": result.get("gpu_name"), "gpus": result.get("gpus")}


def figures(result: Record) -> dict[str, tuple[float, float]]:
    """The comparable figures of one run (higher is better), each with its spread (0 when unknown)."""
    out: dict[str, tuple[float, float]] = {}

    def put(name: str, r: Any, value: str, spread: str) -> None:  # a record lacking a figure: left out
        v, s = (r.get(value), r.get(spread, 0.0)) if isinstance(r, dict) else (None, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[name] = (float(v), float(s) if isinstance(s, (int, float)) else 0.0)

    for ws, r in _table(result, "ddp", "by_world_size").items():
        put(f"ddp samples/s at world size {ws}", r, "samples_per_second", "spread")
    for ws, r in _table(result, "allreduce", "by_world_size").items():
        put(f"all-reduce busbw at world size {ws}", r, "peak_busbw_bytes_per_second", "peak_spread")
    pairs = (result.get("p2p") or {}).get("pairs") if isinstance(result.get("p2p"), dict) else None
    for pair in pairs if isinstance(pairs, list) else []:
        if isinstance(pair, dict):
            put(f"P2P GPU{pair.get('src')}→GPU{pair.get('dst')}", pair, "bandwidth_bytes_per_second", "spread")
    return out


def _table(result: Record, section: str, key: str) -> dict[str, Any]:
    part = result.get(section)
    table = part.get(key) if isinstance(part, dict) else None
    return table if isinstance(table, dict) else {}


def _key(result: Record) -> Any:
    return result.get("workload") or workload(result)


def regressions(result: Record, previous: list[Record]) -> list[str]:
    """Figures below the best of the recent comparable runs (same host and workload) by more than
    REGRESSION, or SPREAD_FACTOR × the figure's own spread where that is larger."""
    key = _key(result)
    same = [r for r in previous[-RECENT:] if r.get("host") == result.get("host") and _key(r) == key]
    best: dict[str, float] = {}
    for r in same:
        for k, (v, _) in figures(r).items():
            best[k] = max(best.get(k, 0.0), v)
    out = []
    for k, (v, spread) in figures(result).items():
        limit = max(REGRESSION, SPREAD_FACTOR * spread)
        if k in best and best[k] > 0 and v < (1 - limit) * best[k]:
            out.append(f"{k}: {v:.4g}, {100 * (1 - v / best[k]):.0f} % below the recent best {best[k]:.4g} "
                       f"(threshold {100 * limit:.0f} %)")
    return out
