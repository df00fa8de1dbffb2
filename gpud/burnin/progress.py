"""A burn-in's result file, written as it runs: what was measured survives a crash or a reboot in hour 9.

JSON lines, appended and flushed after every reading (fsync'd at most every ``SYNC_EVERY_S`` of wall
time, and at the verdicts): a ``start`` line (the run: machine, GPUs, limits, the kernels' figures, the
document's envelope), a ``p`` line per GPU and reading (``Point``), a ``c`` line per checked step
(``Check``), a ``memtest`` line once the memory test has run,
a ``so_far`` line every 10 minutes of the GPUs' time, every 30 in a 24-hour soak (the
verdicts as they stand, the error counters read afresh), and an ``end`` line with the final verdicts. A
line cut short by the crash is skipped when the file is read back (``load``), which rebuilds the
``Result`` for the text, JSON and HTML report (``gpud burnin --from FILE``): a run without its ``end``
line is ``interrupted``, judged as far as its last ``so_far`` line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import IO, Any

from gpud.burnin.result import Result, Verdict
from gpud.burnin.telemetry import Check, Point, Series
from gpud.journal import Journal

# The verdicts so far: every 10 minutes of the GPUs' time, or 48 times in a longer run (a 24-hour soak every
# 30 minutes: judging the whole run so far costs as much as its length).
SO_FAR_EVERY_S = 600.0
SO_FAR_TIMES = 48
SYNC_EVERY_S = 30.0  # fsync the file at most this often (wall time): a reboot loses at most that much
JOURNAL_EVERY_S = 3600.0  # an hourly progress event in the health journal (gpud events)


class ProgressLog:
    """Appends a running burn-in to ``path`` (truncated when the run starts)."""

    def __init__(self, path: Path, version: str, host: dict[str, Any]) -> None:
        self.path, self.version, self.host = path, version, host
        self._f: IO[str] | None = None
        self._synced = 0.0
        self._so_far_at = 0.0
        self._journal_at = 0.0
        self.so_far_every_s = SO_FAR_EVERY_S

    def _write(self, rows: list[dict[str, Any]], sync: bool = False) -> None:
        if self._f is None:
            return
        self._f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        self._f.flush()  # a killed process loses nothing written here
        now = time.monotonic()
        if sync or now - self._synced >= SYNC_EVERY_S:
            os.fsync(self._f.fileno())
            self._synced = now

    def start(self, res: Result, total_s: float = 0.0) -> None:
        """The run's first line; ``total_s``: the GPUs' time it will take (sets how often the verdicts so far
        are written)."""
        self.so_far_every_s = max(SO_FAR_EVERY_S, total_s / SO_FAR_TIMES)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - held for the run, closed by end()
        self._write([{"start": {"version": self.version, "host": self.host, "machine": res.machine,
                                "level": res.level, "device": res.device, "gpus": res.gpus,
                                "names": {str(g): n for g, n in res.names.items()},
                                "uuids": {str(g): u for g, u in res.uuids.items()}, "started": res.started,
                                "simulated_time": res.simulated_time,
                                "results_are_the_gpus": res.results_are_the_gpus,
                                "limits": {str(g): v for g, v in res.limits.items()},
                                "fan_curves": {str(g): v for g, v in res.fan_curves.items()},
                                "workload": {str(g): w for g, w in res.workload.items()},
                                "verdicts": [v.json() for v in res.verdicts]}}], sync=True)

    def reading(self, points: dict[int, Point], checks: list[tuple[int, Check]]) -> None:
        self._write([{"p": g, **p.json()} for g, p in points.items()] + [{"c": g, **c.json()} for g, c in checks])

    def memtest(self, results: dict[int, dict[str, Any]]) -> None:
        """The memory test's results per GPU, once it has run (the kernels' other figures are in ``start``)."""
        self._write([{"memtest": {str(g): r for g, r in results.items()}}], sync=True)

    def due(self, seconds: float) -> bool:
        """Whether the verdicts so far are due (every ``so_far_every_s`` of the GPUs' time)."""
        return self._f is not None and seconds - self._so_far_at >= self.so_far_every_s

    def so_far(self, res: Result, verdicts: list[Verdict], seconds: float) -> None:
        self._so_far_at = seconds
        self._write([{"so_far": {"seconds": round(seconds, 3), "verdicts": [v.json() for v in verdicts]}}],
                    sync=True)
        if seconds - self._journal_at >= JOURNAL_EVERY_S:
            self._journal_at = seconds
            _journal(res, verdicts, seconds)

    def end(self, res: Result) -> None:
        self._write([{"end": {"seconds": round(res.seconds, 3), "wall_seconds": round(res.wall_seconds, 3),
                              "interrupted": res.interrupted, "verdicts": [v.json() for v in res.verdicts]}}],
                    sync=True)
        self.close()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def _journal(res: Result, verdicts: list[Verdict], seconds: float) -> None:
    """The progress as a ``burnin`` event in the health journal: how far, and the verdict so far."""
    failed = sorted({v.gpu for v in verdicts if v.status == "fail" and v.gpu is not None})
    tests = sorted({v.test for v in verdicts if v.status == "fail"})
    so_far = f"failing (GPU {', '.join(map(str, failed))}: {', '.join(tests)})" if tests else "nothing failed yet"
    summary = f"burn-in {res.level}: {seconds / 3600:.1f} h so far, {so_far}"
    try:

        j = Journal()
        try:
            j.record("burnin", summary, data={"level": res.level, "progress": True, "seconds": seconds,
                                               "failed_gpus": failed, "tests": tests})
        finally:
            j.close()
    except Exception:  # noqa: BLE001, S110 - the journal never stops a burn-in
        pass


def _verdict(v: dict[str, Any]) -> Verdict:
    return Verdict(v["test"], v["status"], v["summary"], v.get("gpu"), v.get("figure"), v.get("threshold"),
                   v.get("source", ""), v.get("remedy", ""))


def load(path: Path) -> tuple[Result, dict[str, Any]]:
    """The run a result file holds (``Result``, its start line's envelope: version and host). Raises
    ``OSError`` when it cannot be read, ``ValueError`` when it is not a burn-in's result file."""
    start: dict[str, Any] | None = None
    points: dict[int, list[Point]] = {}
    checks: dict[int, list[Check]] = {}
    verdicts: list[dict[str, Any]] | None = None
    memtest: dict[str, Any] = {}
    end: dict[str, Any] | None = None
    seconds = 0.0
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue  # the line the crash cut short
            if not isinstance(row, dict):
                continue
            if "start" in row:
                start = row["start"]
            elif "p" in row:
                g = int(row.pop("p"))
                share = row.pop("load_share", None)
                pt = Point(**{k: row[k] for k in ("t", "phase", "temperature_c", "fan_percent", "sm_mhz", "power_w",
                                                  "limit_w", "pcie_gen", "pcie_width", "utilization")},
                           reasons=tuple(row.get("reasons") or ()), load_share=share)
                points.setdefault(g, []).append(pt)
                seconds = max(seconds, pt.t)
            elif "c" in row:
                g = int(row.pop("c"))
                checks.setdefault(g, []).append(Check(**{k: row[k] for k in (
                    "t", "phase", "temperature_c", "products", "wrong", "words", "checksum", "first")},
                    n=row.get("n"), by_dtype=row.get("by_dtype")))
            elif "memtest" in row:
                memtest = dict(row["memtest"])
            elif "so_far" in row:
                verdicts = row["so_far"]["verdicts"]
            elif "end" in row:
                end = row["end"]
    if start is None:
        raise ValueError(f"{path}: not a burn-in's result file (no start line)")
    res = Result(start["machine"], start["level"], start["device"], [int(g) for g in start["gpus"]],
                 {int(g): n for g, n in start["names"].items()}, float(start["started"]),
                 simulated_time=bool(start["simulated_time"]),
                 results_are_the_gpus=bool(start.get("results_are_the_gpus", True)))
    res.uuids = {int(g): u for g, u in start["uuids"].items()}
    res.limits = {int(g): v for g, v in start["limits"].items()}
    res.fan_curves = {int(g): v for g, v in start["fan_curves"].items()}
    res.workload = {int(g): w for g, w in start["workload"].items()}
    for key, r in memtest.items():
        res.workload.setdefault(int(key), {})["memtest"] = r
    res.series = {g: Series(g, points.get(g, []), checks.get(g, [])) for g in res.gpus}
    if end is not None:
        res.seconds, res.wall_seconds, res.interrupted = float(end["seconds"]), float(end["wall_seconds"]), \
            bool(end["interrupted"])
        res.verdicts = [_verdict(v) for v in end["verdicts"]]
    else:
        res.seconds, res.interrupted = seconds, True
        res.verdicts = [_verdict(v) for v in (verdicts if verdicts is not None else start["verdicts"])]
    return res, {"version": start["version"], "host": start["host"]}
