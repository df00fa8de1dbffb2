"""The daemon's footprint as a Kubernetes DaemonSet sizes it, and its CPU split into gpud's own code and
the simulated NVML library's: RSS and CPU on a simulated 8-GPU machine with profile rules configured
while a real Prometheus scrapes it, with doctor's checks running as often as the daemon allows.

    python benchmarks/footprint.py [--simulate 2s-8x-a6000] [--seconds 60] [--scrape-interval 15s]
                                   [--healthz-interval 5] [--status-interval 0] [--stress]
                                   [--doctor-interval 300] [--json PATH]

The daemon runs as a child process (1 s ticks, a base profile and two ``[[rules]]``: a ``command``
regex and a ``user``, polled every 0.5 s as by default; ``doctor_interval_seconds`` as by default, 300:
the run at start-up gives the doctor's cost a run and its peak is in ``VmHWM``; a run every 10 s, as this
benchmark once did, also re-rendered the exposition's slow families after each, a cost the default cadence
does not have), scraped by ``prometheus`` (Debian's
package) on loopback for ``/metrics``, and by this script for ``/healthz`` and ``/status``. By default
the load is the DaemonSet's as shipped: Prometheus every 15 s (deploy/kubernetes/podmonitor.yaml's
``interval``, docs/deployment.md's ``scrape_interval``), ``/healthz`` every 5 s (the kubelet's readiness
and liveness probes, each every 10 s: daemonset.yaml), ``/status`` never (nothing in a deployment asks
it; ``gpud status`` does, once). ``--stress``: the load of earlier runs, Prometheus, ``/status`` and
``/healthz`` every 5 s. RSS is read from ``/proc/PID/status`` every second (``VmRSS``; ``VmHWM`` is the
kernel's own peak), CPU from ``/proc/PID/stat`` (utime + stime) over the window after a 5 s settling
time, which begins after Prometheus's first scrape (``wait_first_scrape``). ``gpud doctor`` (what Node
Problem Detector's check runs) is measured once as a child: wall time and its peak RSS (``getrusage`` of the
children). docs/deployment.md, "Resources", holds a run.

The CPU split. The child is this script (``--child``), which runs gpud's own CLI (``gpud daemon``) in
its main thread after wrapping each entry point of the simulated ``libnvidia-ml.so.1``
(``SimLibrary._bind``) to count, per entry point and per calling thread, the calls, the CPU time of the
calling thread inside the stand-in (``time.thread_time``: its Python and its latency spin, which a real
machine spends in libnvidia-ml instead) and the latency model's cost (docs/simulation.md, "Call
latency"), and ``Schedule._doctor`` to count the doctor thread's CPU. The wrapper's own work is counted
as it runs, and its part outside its own clocks (entering and leaving it: about 1.5 µs a call) is measured
once at start, around a call that does nothing (``calibrate``); both are left out of gpud's own. gpud's code
is not changed; the counters leave the child on a pipe when this script asks (at the start and the end of the window,
beside the child's ``time.process_time``). Reported: the daemon's CPU, the doctor thread's per run,
and at the daemon's default doctor cadence (every 300 s): the whole, the stand-in's part, gpud's own
(whole − stand-in), beside the targets (gpud's own ≤ 0.2 %, the whole ≤ 0.5 % of a core), and the
NVML calls that cost most, with their count per second and cost. Beside the whole as measured, two bounds
with NVML as the sources give it: gpud's own plus the short calls' modelled latency (their CPU, as the
stand-in spins it) with a blocking call taken to cost no CPU, the lower; and plus every call's latency, the
upper (no source gives a blocking call's CPU). docs/performance.md holds a run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import free_port, wait_http  # noqa: E402  (the benchmarks' shared helpers)

MIB = 2**20
OWN_TARGET, WHOLE_TARGET = 0.2, 0.5  # % of a core (issue 32)
DEFAULT_DOCTOR_S = 300.0  # [daemon] doctor_interval_seconds by default (gpud/config.py)
MIN_WINDOW_S = 40.0  # a shorter window is not judged

RULES = """
[[rules]]
name = "trainers"
command = '.*python.*train.*\\.py'
profile = "max-performance"

[[rules]]
name = "bob"
user = "bob"
profile = "training"
"""


def proc_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_first_scrape(prom_port: int, timeout: float) -> float:
    """Seconds until Prometheus has scraped the daemon once (``up`` has a sample). The window starts after it:
    the first ``/metrics`` renders every family (about 30 ms on 8 GPUs, ten times a later scrape's), a cost of
    the daemon's start, not of its steady state, that fell inside or outside the window by the scrape's offset."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            c = http.client.HTTPConnection("127.0.0.1", prom_port, timeout=2)
            c.request("GET", "/api/v1/query?query=up")
            if json.loads(c.getresponse().read())["data"]["result"]:
                return time.monotonic() - started
        except (OSError, ValueError, KeyError):
            pass  # not listening yet
        time.sleep(0.2)
    raise RuntimeError(f"Prometheus scraped nothing within {timeout:.0f} s")


def get(port: int, path: str) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    r.read()
    return r.status


# -- the child: gpud's daemon with the stand-in's counters -------------------------------------------
def thread_kind(name: str) -> str:
    """A thread's name without Python's ``Thread-N`` serial: ``gpud-http-conn``, ``(sample_offtick)``…"""
    return re.sub(r"^Thread-\d+\s*", "", name) or name


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process so far, by kind, from each thread's own CPU clock
    (``pthread_getcpuclockid``: nanoseconds, where ``/proc/self/task/TID/stat`` counts 1/100 s ticks, too
    coarse for a thread that costs a tenth of a percent over a minute)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            cpu = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, ProcessLookupError):
            continue
        kind = thread_kind(t.name)
        out[kind] = out.get(kind, 0.0) + cpu
    return out


def child(fds: str, argv: list[str]) -> None:
    """Run ``gpud <argv>`` here, counting the simulated library's calls; answer each line on the request
    pipe with the counters as one JSON line on the answer pipe."""
    from gpud.daemon import schedule
    from gpud.sim.libnvml import library

    req, ans = (int(f) for f in fds.split(","))
    lock = threading.Lock()
    calls: Counter[tuple[str, str]] = Counter()  # (thread kind, entry point) → calls
    cpu: Counter[tuple[str, str]] = Counter()  # … → CPU seconds of the calling thread inside the stand-in
    modelled: Counter[tuple[str, str]] = Counter()  # … → the latency model's seconds
    counting: Counter[tuple[str, str]] = Counter()  # … → this wrapper's own bookkeeping (neither gpud nor NVML)
    doctor = {"runs": 0, "cpu_s": 0.0}
    running: dict[int, float] = {}  # doctor thread ident → its CPU clock when the run began
    bind = library.SimLibrary._bind

    def counted(f: Any, name: str, of: Any) -> Any:
        def c_function(*args: Any) -> Any:
            t = time.thread_time()
            try:
                return f(*args)
            finally:
                dt = time.thread_time() - t
                key = (thread_kind(threading.current_thread().name), name)
                with lock:
                    calls[key] += 1
                    cpu[key] += dt
                    modelled[key] += of(name, args)
                    counting[key] += time.thread_time() - t - dt

        c_function.__name__ = name
        return c_function

    def counted_bind(self: Any, name: str, e: Any) -> Any:
        return counted(bind(self, name, e), name, self.latency.of)

    uncounted_s = calibrate(counted, calls, cpu, counting)
    doctor_run = schedule.Schedule._doctor

    def counted_doctor(self: Any, *args: Any, **kwargs: Any) -> None:
        ident = threading.get_ident()
        t = running[ident] = time.thread_time()
        try:
            doctor_run(self, *args, **kwargs)
        finally:
            dt = time.thread_time() - t
            with lock:
                running.pop(ident, None)
                doctor["runs"] += 1
                doctor["cpu_s"] += dt

    library.SimLibrary._bind = counted_bind  # type: ignore[method-assign]
    schedule.Schedule._doctor = counted_doctor  # type: ignore[method-assign]

    def answer() -> None:
        with os.fdopen(req, "rb", buffering=0) as r, os.fdopen(ans, "w") as w:
            while r.readline():
                with lock:
                    live = 0.0  # a doctor run in progress: its CPU so far
                    for ident, t0 in running.items():
                        try:
                            live += time.clock_gettime(time.pthread_getcpuclockid(ident)) - t0
                        except OSError:
                            pass
                    out = {"monotonic": time.monotonic(), "process_cpu_s": time.process_time(),
                           "uncounted_s_per_call": uncounted_s,
                           "doctor_runs": doctor["runs"], "doctor_cpu_s": doctor["cpu_s"] + live,
                           "doctor_cpu_done_s": doctor["cpu_s"],
                           "calls": [[k, n, calls[(k, n)], cpu[(k, n)], modelled[(k, n)], counting[(k, n)]]
                                     for k, n in calls],
                           "threads": thread_cpu()}
                w.write(json.dumps(out) + "\n")
                w.flush()

    threading.Thread(target=answer, name="footprint-counters", daemon=True).start()
    from gpud.cli import main as gpud_main

    sys.argv = ["gpud", *argv]
    gpud_main()


def calibrate(counted: Any, calls: Counter[tuple[str, str]], cpu: Counter[tuple[str, str]],
              counting: Counter[tuple[str, str]], n: int = 20_000) -> float:
    """Seconds per call of the counting wrapper's own work that it cannot count itself: entering and leaving it,
    its first clock read's start and its last one's end. Measured here, around a call that does nothing, as the
    wrapper's whole CPU less what it counts (the call's, its bookkeeping's) less the same call made directly
    (which gpud makes without the wrapper too); the smallest of five rounds. Hot, as measured here, it is less
    than in the daemon, where each wake-up runs cold: what is left out of gpud's own is the smaller figure."""

    def nothing(*args: Any) -> int:
        return 0

    wrapped = counted(nothing, "calibration", lambda name, args: 0.0)
    key = (thread_kind(threading.current_thread().name), "calibration")
    best = float("inf")
    for _ in range(5):
        t = time.thread_time()
        for _ in range(n):
            nothing(1, 2)
        direct = time.thread_time() - t
        cpu[key] = counting[key] = 0.0
        t = time.thread_time()
        for _ in range(n):
            wrapped(1, 2)
        whole = time.thread_time() - t
        best = min(best, (whole - cpu[key] - counting[key] - direct) / n)
    for c in (calls, cpu, counting):
        c.pop(key, None)
    return max(0.0, best)


class Counters:
    """This script's end of the child's pipes."""

    def __init__(self) -> None:
        self.req_r, self.req_w = os.pipe()
        self.ans_r, self.ans_w = os.pipe()
        self._ans = os.fdopen(self.ans_r, "r")

    def child_fds(self) -> str:
        return f"{self.req_r},{self.ans_w}"

    def after_start(self) -> None:
        os.close(self.req_r)
        os.close(self.ans_w)

    def read(self) -> dict[str, Any]:
        os.write(self.req_w, b"?\n")
        line = self._ans.readline()
        if not line:
            raise RuntimeError("the daemon's counters pipe closed")
        return dict(json.loads(line))

    def close(self) -> None:
        os.close(self.req_w)
        self._ans.close()


def split(a: dict[str, Any], b: dict[str, Any], doctor_interval: float) -> dict[str, Any]:
    """The window's CPU from two readings of the child's counters, in % of a core."""
    span = b["monotonic"] - a["monotonic"]

    def table(reading: dict[str, Any]) -> dict[tuple[str, str], tuple[int, float, float, float]]:
        return {(k, n): (c, s, m, h) for k, n, c, s, m, h in reading["calls"]}

    ta, tb = table(a), table(b)
    per: dict[tuple[str, str], tuple[int, float, float, float]] = {}
    for key, (c, s, m, h) in tb.items():
        c0, s0, m0, h0 = ta.get(key, (0, 0.0, 0.0, 0.0))
        if c > c0:
            per[key] = (c - c0, s - s0, m - m0, h - h0)
    total = b["process_cpu_s"] - a["process_cpu_s"]
    doctor = b["doctor_cpu_s"] - a["doctor_cpu_s"]
    runs = b["doctor_runs"] - a["doctor_runs"]
    if runs > 0:  # runs ended in the window: their mean, else every run so far (start-up's included)
        per_run = (b["doctor_cpu_done_s"] - a["doctor_cpu_done_s"]) / runs
    else:
        per_run = b["doctor_cpu_done_s"] / b["doctor_runs"] if b["doctor_runs"] else 0.0
    doctor_lib = {k: v for k, v in per.items() if k[0] == "gpud-doctor"}
    steady = {k: v for k, v in per.items() if k[0] != "gpud-doctor"}
    doctor_lib_cpu = sum(v[1] for v in doctor_lib.values())
    doctor_lib_per_run = doctor_lib_cpu / runs if runs > 0 else 0.0
    steady_total, steady_lib = total - doctor, sum(v[1] for v in steady.values())
    steady_model = sum(v[2] for v in steady.values())
    # The short calls (a plain reading's 20 µs, the fan's 137 µs): their latency is the CPU the stand-in spins
    # for them, as NVML's ioctl would spend it. The blocking ones (PCIe throughput's 20 ms, a process list's
    # 4.5 ms) are slept: the sources give their time, not their CPU (docs/simulation.md, "Call latency").
    from gpud.sim.libnvml.library import SPIN_UP_TO_S

    short_model = sum(v[2] for v in steady.values() if v[0] and v[2] / v[0] <= SPIN_UP_TO_S)
    # The counting wrapper's own work (its clocks, lock and counters: a few µs a call), measured as it runs;
    # it is this benchmark's cost, not gpud's: left out of gpud's own (the doctor thread's is small and kept).
    counted = sum(v[3] for v in steady.values())
    # and its part that it cannot count itself (``calibrate``): per call, times the calls
    per_call = b.get("uncounted_s_per_call", 0.0)
    uncounted = per_call * sum(v[0] for v in steady.values())
    counted += uncounted
    # At the daemon's default doctor cadence: the steady part plus one doctor run per DEFAULT_DOCTOR_S.
    whole = steady_total / span + per_run / DEFAULT_DOCTOR_S
    lib = steady_lib / span + doctor_lib_per_run / DEFAULT_DOCTOR_S
    by_call: dict[str, list[float]] = {}
    by_thread: dict[str, list[float]] = {}
    for (kind, name), (c, s, m, h) in steady.items():
        for d, key in ((by_call, name), (by_thread, kind)):
            row = d.setdefault(key, [0, 0.0, 0.0, 0.0])
            row[0] += c
            row[1] += s
            row[2] += m
            row[3] += h

    live_a, live_b = a.get("threads", {}), b.get("threads", {})
    thread_own = {}
    for kind, c in live_b.items():
        if kind in live_a and kind in by_thread and kind != "gpud-doctor":
            row = by_thread[kind]
            thread_own[kind] = round(100 * (c - live_a[kind] - row[1] - row[3] - row[0] * per_call) / span, 3)
        elif kind in live_a and kind != "gpud-doctor":
            thread_own[kind] = round(100 * (c - live_a[kind]) / span, 3)
    thread_own["short-lived threads (sampler's per GPU, HTTP handlers)"] = round(
        100 * (steady_total - steady_lib - counted) / span - sum(thread_own.values()), 3)

    def rows(d: dict[str, list[float]]) -> list[dict[str, Any]]:
        return sorted(({"name": k, "calls_per_s": round(c / span, 2), "stand_in_cpu_ms_per_s": round(1e3 * s / span, 3),
                        "modelled_ms_per_s": round(1e3 * m / span, 3),
                        "by_thread": {kind: round(v[0] / span, 2) for (kind, name), v in steady.items()
                                      if k in (kind, name)}} for k, (c, s, m, _) in d.items()),
                      key=lambda r: -r["stand_in_cpu_ms_per_s"])

    return {
        "window_s": round(span, 1),
        "measured_percent": round(100 * total / span, 3),
        "doctor_interval_s": doctor_interval,
        "doctor_runs_in_window": runs,
        "doctor_cpu_s_per_run": round(per_run, 4),
        "doctor_stand_in_cpu_s_per_run": round(doctor_lib_per_run, 4),
        "steady_percent": round(100 * steady_total / span, 3),  # all but the doctor thread
        "steady_stand_in_percent": round(100 * steady_lib / span, 3),
        "steady_modelled_percent": round(100 * steady_model / span, 3),
        "whole_percent": round(100 * whole, 3),
        "stand_in_percent": round(100 * lib, 3),
        "counting_percent": round(100 * counted / span, 3),
        "counting_uncounted_us_per_call": round(1e6 * per_call, 2),
        "own_percent": round(100 * (whole - lib - counted / span), 3),
        # what the daemon would take if every call cost the CPU its whole modelled latency (an upper bound)
        "own_plus_modelled_percent": round(100 * (whole - lib - counted / span + steady_model / span), 3),
        # the whole with NVML as the sources give it, a blocking call taken to cost no CPU (a lower bound)
        "own_plus_short_modelled_percent": round(100 * (whole - lib - counted / span + short_model / span), 3),
        "nvml_calls_per_s": round(sum(v[0] for v in steady.values()) / span, 1),
        "calls": rows(by_call),
        "threads": rows(by_thread),
        "own_percent_by_thread": thread_own,  # steady: each live thread's CPU less its stand-in CPU
    }


def verdict(value: float, target: float, window: float) -> str:
    if window < MIN_WINDOW_S:
        return f"n/a (window under {MIN_WINDOW_S:.0f} s)"
    return "ok" if value <= target else "MISSED"


def report(cpu: dict[str, Any]) -> list[str]:
    w = cpu["window_s"]
    lines = [f"CPU, % of a core, over {w} s ({cpu['nvml_calls_per_s']} NVML calls/s outside doctor):",
             f"  {'figure':<58} {'value':>8}  {'target':<8} verdict"]

    def line(label: str, value: float, target: float | None = None) -> None:
        t = f"≤ {target}" if target is not None else ""
        v = verdict(value, target, w) if target is not None else ""
        lines.append(f"  {label:<58} {value:>8.3f}  {t:<8} {v}")

    line(f"daemon, measured (doctor every {cpu['doctor_interval_s']:g} s)", cpu["measured_percent"])
    line("  all but the doctor thread", cpu["steady_percent"])
    line("    of which in the simulated library (stand-in CPU)", cpu["steady_stand_in_percent"])
    lines.append(f"  doctor thread: {cpu['doctor_cpu_s_per_run']:.3f} s CPU a run "
                 f"({cpu['doctor_stand_in_cpu_s_per_run']:.3f} s in the stand-in), {cpu['doctor_runs_in_window']} runs")
    line("whole daemon, doctor every 300 s (default)", cpu["whole_percent"], WHOLE_TARGET)
    line("  in the simulated library (libnvidia-ml on hardware)", cpu["stand_in_percent"])
    line(f"  this benchmark's counting of each call, {cpu['counting_uncounted_us_per_call']:.2f} µs of it "
         "outside its clocks", cpu["counting_percent"])
    line("  gpud's own (whole − stand-in − counting)", cpu["own_percent"], OWN_TARGET)
    line("  gpud's own + short calls' modelled latency (lower bound)", cpu["own_plus_short_modelled_percent"],
         WHOLE_TARGET)
    line("  gpud's own + every call's modelled latency (upper bound)", cpu["own_plus_modelled_percent"])
    lines.append("NVML entry points (all threads but doctor's), by stand-in CPU, every one called:")
    lines.append(f"  {'entry point':<46} {'calls/s':>8} {'stand-in ms/s':>14} {'modelled ms/s':>14}  calls/s by thread")
    for r in cpu["calls"]:  # every entry point called in the window (a blocking one costs little CPU, much time)
        lines.append(f"  {r['name']:<46} {r['calls_per_s']:>8.2f} {r['stand_in_cpu_ms_per_s']:>14.3f}"
                     f" {r['modelled_ms_per_s']:>14.3f}  "
                     + ", ".join(f"{k} {v:g}" for k, v in sorted(r["by_thread"].items(), key=lambda kv: -kv[1])))
    lines.append("by calling thread:")
    for r in cpu["threads"]:
        lines.append(f"  {r['name']:<46} {r['calls_per_s']:>8.2f} {r['stand_in_cpu_ms_per_s']:>14.3f}"
                     f" {r['modelled_ms_per_s']:>14.3f}")
    lines.append("gpud's own CPU by thread (doctor's excluded), % of a core (each thread's CPU clock):")
    for k, v in sorted(cpu["own_percent_by_thread"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<58} {v:>8.3f}")
    return lines


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[sys.argv.index("--") + 1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--simulate", default="2s-8x-a6000")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--scrape-interval", default="15s", help="Prometheus's scrape_interval (0: nothing scrapes; "
                                                              "default: the shipped PodMonitor's)")
    ap.add_argument("--healthz-interval", type=float, default=5.0,
                    help="seconds between /healthz requests (default: the kubelet's two probes, each every 10 s)")
    ap.add_argument("--status-interval", type=float, default=0.0, help="seconds between /status requests (0: none)")
    ap.add_argument("--stress", action="store_true",
                    help="Prometheus, /status and /healthz every 5 s (earlier runs' load)")
    ap.add_argument("--doctor-interval", type=float, default=DEFAULT_DOCTOR_S,
                    help="[daemon] doctor_interval_seconds (default: the daemon's, 300)")
    ap.add_argument("--no-prometheus", action="store_true", help="no Prometheus, even where it is installed")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if args.stress:
        args.scrape_interval, args.healthz_interval, args.status_interval = "5s", 5.0, 5.0
    work = Path(tempfile.mkdtemp(prefix="gpud-footprint-"))
    port, prom_port = free_port(), free_port()
    (work / "gpud.toml").write_text(f'[daemon]\ninterval_seconds = 1\n'
                                    f'doctor_interval_seconds = {args.doctor_interval:g}\nprofile = "quiet"\n{RULES}')
    env = {**os.environ, "GPUD_STATE_DIR": str(work / "state"), "GPUD_SOCKET": str(work / "gpud.sock"),
           "GPUD_SIMULATE": args.simulate, "NO_COLOR": "1"}
    (work / "state").mkdir()
    gpud = [sys.executable, "-m", "gpud"]
    pipes = Counters()
    daemon = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", pipes.child_fds(), "--",
                               "daemon", "--config", str(work / "gpud.toml"), "--listen", f"127.0.0.1:{port}"],
                              env=env, stderr=subprocess.DEVNULL, cwd=REPO, pass_fds=(pipes.req_r, pipes.ans_w))
    pipes.after_start()
    prom, first_scrape_s = None, None
    try:
        wait_http(port, "/healthz")
        step = float(args.scrape_interval.rstrip("s"))
        if shutil.which("prometheus") and not args.no_prometheus and step > 0:
            (work / "prometheus.yml").write_text(
                f"global: {{scrape_interval: {args.scrape_interval}}}\n"
                f"scrape_configs:\n  - job_name: gpud\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
            prom = subprocess.Popen(["prometheus", f"--config.file={work / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={work / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{prom_port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            first_scrape_s = wait_first_scrape(prom_port, timeout=2 * step + 30)
        time.sleep(5)  # settle: imports done, the first doctor run under way
        first = pipes.read()
        t0, c0 = time.monotonic(), cpu_seconds(daemon.pid)
        load = os.getloadavg()[0]
        rss, errors = [], 0
        asks = [(p, every, 0.0) for p, every in (("/healthz", args.healthz_interval), ("/status", args.status_interval))
                if every > 0]
        while time.monotonic() - t0 < args.seconds:
            now = time.monotonic() - t0
            for n, (path, every, due) in enumerate(asks):
                if now >= due:
                    errors += get(port, path) != 200
                    asks[n] = (path, every, due + every)
            rss.append(proc_kib(daemon.pid, "VmRSS"))
            time.sleep(1)
        last = pipes.read()
        span, used = time.monotonic() - t0, cpu_seconds(daemon.pid) - c0
        load = max(load, os.getloadavg()[0])
        hwm = proc_kib(daemon.pid, "VmHWM")
        up = None
        if prom is not None:
            c = http.client.HTTPConnection("127.0.0.1", prom_port, timeout=10)
            c.request("GET", "/api/v1/query?query=up")
            res = json.loads(c.getresponse().read())["data"]["result"]
            up = res[0]["value"][1] if res else None
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t = time.perf_counter()
        subprocess.run([*gpud, "doctor"], env=env, capture_output=True, cwd=REPO, check=False)
        doctor_wall = time.perf_counter() - t
        doctor_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, the largest child so far
    finally:
        for p in (prom, daemon):
            if p is not None:
                p.terminate()
                p.wait(timeout=20)
        pipes.close()
        shutil.rmtree(work, ignore_errors=True)
    cpu = split(first, last, args.doctor_interval)
    out = {"simulate": args.simulate, "seconds": round(span, 1), "scrape_interval": args.scrape_interval,
           "healthz_interval_s": args.healthz_interval, "status_interval_s": args.status_interval,
           "prometheus_up": up,
           "prometheus_first_scrape_s": None if first_scrape_s is None else round(first_scrape_s, 1),
           "http_errors": errors, "load_average_1m_max": round(load, 2),
           "daemon_cpu_percent_of_a_core": round(100 * used / span, 2),
           "daemon_rss_mib_max_sampled": round(max(rss) / 1024, 1), "daemon_rss_mib_median": round(
               sorted(rss)[len(rss) // 2] / 1024, 1), "daemon_vmhwm_mib": round(hwm / 1024, 1),
           "doctor_wall_seconds": round(doctor_wall, 2),
           "doctor_peak_rss_mib": round(doctor_rss / 1024, 1) if doctor_rss > before else None,
           "cpu": cpu,
           "targets": {"own_percent": OWN_TARGET, "whole_percent": WHOLE_TARGET},
           "verdicts": {"own": verdict(cpu["own_percent"], OWN_TARGET, cpu["window_s"]),
                        "whole": verdict(cpu["whole_percent"], WHOLE_TARGET, cpu["window_s"]),
                        "whole_lower_bound": verdict(cpu["own_plus_short_modelled_percent"], WHOLE_TARGET,
                                                     cpu["window_s"])}}
    print(json.dumps({k: v for k, v in out.items() if k != "cpu"}, indent=2))
    print("\n".join(report(cpu)))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
