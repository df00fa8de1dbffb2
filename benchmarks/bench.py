"""gpud's benchmarks: what it costs and how fast it answers. Prints a table and writes JSON.

    python benchmarks/bench.py [--json PATH] [--runs N]

Wall times are medians of N runs in child processes, as a user would see them; CPU costs are
measured in-process with time.process_time over many snapshots. Everything runs on simulated
workstations in a private state directory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def wall(cmd: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, cwd=REPO, check=False)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def snapshot_cost(name: str, n: int = 200) -> tuple[float, float]:
    """(CPU seconds per snapshot, NVML calls per GPU per snapshot) on a simulated workstation."""
    from gpud.hw.machine import open_machine

    m = open_machine(name)
    m.snapshot()  # static facts are read once, not per tick
    calls = m.nvml.calls
    t = time.process_time()
    for _ in range(n):
        snap = m.snapshot()
    cpu = (time.process_time() - t) / n
    return cpu, (m.nvml.calls - calls) / n / len(snap.samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results.json"), help="where to write the results")
    ap.add_argument("--runs", type=int, default=7, help="runs per wall-time figure (median)")
    args = ap.parse_args()
    state = tempfile.mkdtemp(prefix="gpud-bench-")
    os.environ["GPUD_STATE_DIR"] = state
    env = {**os.environ, "GPUD_STATE_DIR": state}
    gpud = [sys.executable, "-m", "gpud"]
    rows = []

    def row(figure: str, value: float, unit: str, target: float | None, how: str) -> None:
        verdict = "n/a" if target is None else ("ok" if value <= target else "MISSED")
        rows.append({"figure": figure, "value": round(value, 4), "unit": unit, "target": target,
                     "verdict": verdict, "how": how})

    row("gpud --help wall", wall([*gpud, "--help"], env, args.runs), "s", 0.3, f"median of {args.runs}")
    for name in ("z8-fury-4x-a6000", "z8-fury-4x-a6000-degraded", "z8-fury-4x-rtx6000ada"):
        subprocess.run([*gpud, "doctor", "--simulate", name], env=env, capture_output=True, check=False)  # warm
        row(f"gpud doctor wall ({name})", wall([*gpud, "doctor", "--simulate", name], env, args.runs), "s", 1.0,
            f"median of {args.runs}, all checks, no --probe")
    for name, gpus in (("z8-fury-4x-a6000", 4), ("2s-8x-a6000", 8)):
        cpu, calls = snapshot_cost(name)
        row(f"snapshot CPU time ({gpus} GPUs, simulated NVML)", cpu * 1000, "ms", None,
            "process_time over 200 snapshots; the simulator's own cost included")
        row(f"NVML calls per GPU per snapshot ({gpus} GPUs)", calls, "calls", None, "counted at the choke point")

    width = max(len(r["figure"]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>10}  {'target':>8}  verdict")
    for r in rows:
        target = f"≤ {r['target']}" if r["target"] is not None else "-"
        print(f"{r['figure']:<{width}}  {r['value']:>8.3f} {r['unit']:<2} {target:>8}  {r['verdict']}")
    Path(args.json).write_text(json.dumps({"time": time.time(), "rows": rows}, indent=2) + "\n")
    print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
