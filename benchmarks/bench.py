"""gpud's benchmarks: what it costs and how fast it answers, beside a peer. Prints a table
(figure, target, verdict) and writes the same as JSON.

    python benchmarks/bench.py [--json PATH] [--quick] [--rule-runs N]

Everything runs here, in one run, on simulated workstations (private state directory):
tick cost in-process; the daemon as a child process for footprint, scrape latency and tick
jitter; the profile rules' switch and switch-back latency (benchmarks/rules_latency.py); Debian's
prometheus-node-exporter on loopback as the peer for scrape latency; the probe's
per-step overhead against a plain DDP loop (two gloo ranks). docs/performance.md explains each.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def wall(cmd: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, cwd=REPO, check=False)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def tick_cost(name: str, ticks: int = 300) -> tuple[float, float, float, float]:
    """(CPU seconds per daemon tick, wall seconds per tick, wall seconds per tick under the latency
    model, NVML calls per GPU per tick), in-process, doctor excluded, the off-tick sampler idle.

    Under the latency model: gpud's own time (the tick's wall time less the time spent inside the
    simulated library) plus the modelled latency of every NVML call it made — what the tick takes on
    hardware whose calls last exactly as docs/simulation.md says. The raw wall time also carries the
    simulator's own Python cost per call where that exceeds the modelled latency.
    """
    import threading

    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.service import Daemon

    m = open_machine(name)
    d = Daemon(m, cfg.Config())
    stop = threading.Event()
    m.nvml.start_sampler(stop, every_s=3600)  # its first round now; none during the measurement
    d.schedule.checks_at = time.time() + 3600  # doctor's own cost is not a tick's
    d.tick()
    d.tick()
    calls = m.nvml.calls
    lib = m.simulation.library
    spent, modelled = lib.spent_s, lib.modelled_s
    t, w = time.process_time(), time.perf_counter()
    for _ in range(ticks):
        d.tick()
    cpu, wall_s = (time.process_time() - t) / ticks, (time.perf_counter() - w) / ticks
    stop.set()
    in_lib, model = (lib.spent_s - spent) / ticks, (lib.modelled_s - modelled) / ticks
    gpus = len(d.snapshot.samples if d.snapshot else [1])
    return cpu, wall_s, wall_s - in_lib + model, (m.nvml.calls - calls) / ticks / gpus


def tick_beside_sampler(name: str, ticks: int = 300) -> tuple[float, float, float, float]:
    """(tick wall p50, p99, max, sampler round wall), seconds, in-process: the off-tick sampler reads the
    blocking calls (PCIe throughput, process lists) round after round while the daemon ticks. NVML calls
    serialise on the driver's RM lock (docs/simulation.md), so a tick waits for the sampler's call in
    progress: the figure the daemon's fan control and exporter see."""
    import threading

    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.service import Daemon

    m = open_machine(name)
    d = Daemon(m, cfg.Config())
    d.schedule.checks_at = time.time() + 3600
    d.tick()
    d.tick()
    stop = threading.Event()
    rounds: list[float] = []
    gpus = list(range(m.nvml.device_count()))

    def sampler() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            m.nvml.sample_pcie_all(gpus, processes=True)
            rounds.append(time.perf_counter() - t0)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    walls = []
    for _ in range(ticks):
        t0 = time.perf_counter()
        d.tick()
        walls.append(time.perf_counter() - t0)
    stop.set()
    thread.join()
    return pct(walls, 0.5), pct(walls, 0.99), max(walls), statistics.median(rounds) if rounds else 0.0


def scrape(port: int, clients: int, seconds: float | None = None, requests: int | None = None
           ) -> tuple[list[float], int]:
    """Latencies of GET /metrics from ``clients`` threads (keep-alive connections); (latencies, errors)."""
    lat: list[float] = []
    errors = [0]
    stop = time.monotonic() + (seconds or 1e9)
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        n = 0
        while time.monotonic() < stop and (requests is None or n < requests):
            t = time.perf_counter()
            try:
                conn.request("GET", "/metrics")
                r = conn.getresponse()
                r.read()
                ok = r.status == 200
            except OSError:
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            with lock:
                if ok:
                    lat.append(time.perf_counter() - t)
                else:
                    errors[0] += 1
            n += 1
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return lat, errors[0]


class IdleClients:
    """Keep ``n`` connections open that never finish a request: half send nothing, half a partial
    request head. The server closes each at its read deadline; a closed one is opened again at
    once, so ``n`` stay open the whole time (bounded: at most 50 000 connections in all)."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.opened = 0
        self.socks: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self, k: int) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if k % 2:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        s.setblocking(False)
        self.opened += 1
        return s

    def __enter__(self) -> IdleClients:
        self.socks = [self._open(k) for k in range(self.n)]
        self.thread.start()
        return self

    def _run(self) -> None:
        import select

        while not self.stop.is_set() and self.opened < 50_000:
            ready, _, _ = select.select(self.socks, [], [], 0.2)
            for s in ready:
                try:
                    gone = s.recv(4096) == b""
                except OSError:
                    gone = True
                if gone:
                    k = self.socks.index(s)
                    s.close()
                    self.socks[k] = self._open(k)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        for s in self.socks:
            s.close()


def wait_http(port: int, path: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)  # not answering yet, or not 200 yet (/healthz before the first tick): ask again later
    raise RuntimeError(f"nothing answers 200 on {port}{path}")


def status(port: int) -> dict[str, Any]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/status")
    data: dict[str, Any] = json.loads(c.getresponse().read())
    return data


def probe_overhead(env: dict[str, str], mode: str = "", quick: bool = False) -> dict[str, Any] | None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    port = free_port()
    procs = []
    for rank in range(2):
        e = {**env, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
             "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}
        procs.append(subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "ddp_overhead.py"),
                                       *(("10", "7") if quick else ("20", "31")), mode],
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    out = procs[0].communicate(timeout=300)[0]
    procs[1].wait(timeout=60)
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def render_long_fields(n: int = 100_000) -> float:
    """Seconds to lay out a ``n``-character command line (gpud ps, doctor's summary) and journal
    summary (gpud events) at 80 columns; quadratic wrapping once took minutes for this."""
    from gpud.cli import doctor, ps
    from gpud.cli.output import table_lines, wrap

    cmd = "python train.py --data " + "x" * n + " " + "--lr 0.1 " * (n // 9)
    proc = {"gpu": 0, "pid": 4242, "user": "eve", "kind": "compute", "used_memory_bytes": 2**30,
            "sm_utilization_percent": 50, "container": None, "command": cmd}
    t = time.perf_counter()
    ps.lines([proc], "bench", 80)
    wrap(doctor.fit(f"gpu.processes: 1 process on GPU 0: GPU0: pid 4242 eve 1.0 GiB {cmd}", 80), 80, indent=" " * 9)
    table_lines(["Time", "Boot", "Kind", "GPU", "What"], [["2026-01-01 00:00:00", "b1", "xid", "0", cmd]],
                max_width=80)
    return time.perf_counter() - t


def main() -> int:  # noqa: C901 - one benchmark run, step by step
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=str(REPO / "benchmarks" / "results.json"), help="where to write the results")
    ap.add_argument("--quick", action="store_true", help="shorter phases (for a smoke run; figures are noisier)")
    ap.add_argument("--tick-only", action="store_true", help="the CLI and tick figures only (about 30 s)")
    ap.add_argument("--rule-runs", type=int, default=None, help="profile-rule switches to time (default 20, "
                                                                "--quick 3; each waits for the 3 s hold-off)")
    args = ap.parse_args()
    q = args.quick
    state = tempfile.mkdtemp(prefix="gpud-bench-")
    os.environ["GPUD_STATE_DIR"] = state
    env = {**os.environ, "GPUD_STATE_DIR": state, "GPUD_SOCKET": str(Path(state) / "gpud.sock")}
    gpud = [sys.executable, "-m", "gpud"]
    rows: list[dict[str, Any]] = []
    t_start = time.monotonic()

    def row(figure: str, value: float | None, unit: str, target: str, ok: bool | None, how: str) -> None:
        verdict = "n/a" if ok is None else ("ok" if ok else "MISSED")
        rows.append({"figure": figure, "value": value, "unit": unit, "target": target, "verdict": verdict,
                     "how": how})
        shown = "-" if value is None else f"{value:.4g}"
        print(f"  {figure}: {shown} {unit} (target {target}): {verdict}", file=sys.stderr, flush=True)

    runs = 3 if q else 7
    # -- CLI ------------------------------------------------------------------------------------
    t = wall([*gpud, "--help"], env, runs)
    row("gpud --help wall", t, "s", "≤ 0.3", t <= 0.3, f"median of {runs} runs")
    from gpud.sim.description import load, resolve
    from gpud.sim.libnvml import LatencyModel

    # --quick: one timed run after the warm-up (the degraded twin's cold GPUs take 9 s a run by design)
    doctor_runs = 1 if q else runs
    for name in ("z8-fury-4x-a6000", "z8-fury-4x-a6000-degraded", "z8-fury-4x-rtx6000ada"):
        subprocess.run([*gpud, "doctor", "--simulate", name], env=env, capture_output=True, check=False)
        t = wall([*gpud, "doctor", "--simulate", name], env, doctor_runs)
        # A GPU without persistence mode is initialised by the first process to open it: seconds on hardware
        # (docs/simulation.md), owed to the machine, not to gpud. The target allows for it.
        cold = sum(1 for g in load(resolve(name)[0]).gpus if not g.persistence_mode)
        limit = 1.0 + cold * LatencyModel().gpu_init_s
        row(f"gpud doctor wall ({name})", t, "s", f"≤ {limit:g}", t <= limit,
            f"median of {doctor_runs} run(s), all checks, no --probe" +
            (f"; {cold} GPU(s) without persistence mode, initialised by each run" if cold else ""))
    t = render_long_fields()
    row("render a 100 000-character command and journal summary at 80 columns", t, "s", "≤ 0.2", t <= 0.2,
        "in-process: gpud ps's table, doctor's wrapped summary, an events table row (linear, cut with …)")
    # -- tick cost ------------------------------------------------------------------------------
    for name, n in (("z8-fury-4x-a6000", 4), ("2s-8x-a6000", 8)):
        ticks = 100 if q else 300
        cpu, tick_wall, modelled, calls = tick_cost(name, ticks)
        row(f"tick under the NVML latency model, {n} GPUs", modelled * 1000, "ms", "≤ 5 (8 GPUs)",
            modelled <= 0.005 if n == 8 else None,
            f"gpud's own time per tick + the modelled latency of its NVML calls (docs/simulation.md), {ticks} ticks")
        row(f"tick wall time on the simulator, {n} GPUs", tick_wall * 1000, "ms", "-", None,
            "perf_counter; each call lasts max(its latency, the simulator's own Python cost)")
        row(f"tick CPU time, {n} GPUs", cpu * 1000, "ms", "-", None,
            f"process_time over {ticks} ticks, simulated NVML's own cost and latency spin included")
        row(f"NVML calls per GPU per tick, {n} GPUs", calls, "calls", "-", None, "counted at the choke point")
    ticks = 50 if q else 200
    p50, p99, worst, sampler_round = tick_beside_sampler("2s-8x-a6000", ticks)
    how = f"{ticks} ticks while the off-tick sampler reads every GPU round after round (the RM lock serialises)"
    row("tick wall p50 beside the sampler, 8 GPUs", p50 * 1000, "ms", "-", None, how)
    row("tick wall p99 beside the sampler, 8 GPUs", p99 * 1000, "ms", "-", None, how)
    row("tick wall max beside the sampler, 8 GPUs", worst * 1000, "ms", "-", None, how)
    row("sampler round wall, 8 GPUs", sampler_round * 1000, "ms", "≤ 5000", sampler_round <= 5.0,
        "median; one round must fit in the sampler's 5 s period")
    if args.tick_only:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        return 0
    # -- the daemon: footprint, scrapes, jitter --------------------------------------------------
    port = free_port()
    conf = Path(state) / "gpud.toml"
    conf.write_text(f'[daemon]\nlisten = "127.0.0.1:{port}"\ninterval_seconds = 1.0\n')
    daemon = subprocess.Popen([*gpud, "daemon", "--simulate", "2s-8x-a6000", "--config", str(conf)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node = None
    try:
        import psutil

        wait_http(port, "/healthz")
        proc = psutil.Process(daemon.pid)
        time.sleep(3)  # start-up and the first doctor run are not the steady state
        span = 5 if q else 60
        cpu0 = proc.cpu_times()
        rss = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < span:
            rss.append(proc.memory_info().rss)
            time.sleep(1)
        cpu1 = proc.cpu_times()
        used = (cpu1.user - cpu0.user + cpu1.system - cpu0.system) / (time.monotonic() - t0)
        row("daemon CPU, 8 GPUs, 1 s ticks", used * 100, "% of a core", "≤ 1", used <= 0.01,
            f"psutil over {span} s, no scraper")
        row("daemon RSS, 8 GPUs", max(rss) / 2**20, "MiB", "≤ 60", max(rss) <= 60 * 2**20, f"max over {span} s")
        exe = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
        nport = free_port()
        if exe:
            node = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{nport}"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            wait_http(nport, "/metrics")
        # One client scraping once per tick, as Prometheus does: every scrape renders a new observation.
        n1 = 5 if q else 30
        lat_g: list[float] = []
        err_g = 0
        for _ in range(n1):
            time.sleep(1.02)
            got, err = scrape(port, 1, requests=1)
            lat_g += got
            err_g += err
        row("/metrics p50, 1 client, one scrape per tick", pct(lat_g, 0.5) * 1000, "ms", "≤ node_exporter's", None,
            f"{n1} scrapes, each of a new observation (rendered)")
        row("/metrics p99, 1 client, one scrape per tick", pct(lat_g, 0.99) * 1000, "ms", "-", None, f"{n1} scrapes")
        lat_b, err_b = scrape(port, 1, requests=10 * n1)
        err_g += err_b
        row("/metrics p50, 1 client, back to back", pct(lat_b, 0.5) * 1000, "ms", "-", None,
            "repeat scrapes within a tick are served from the rendered bytes")
        if node is not None:
            lat_n: list[float] = []
            for _ in range(n1):
                time.sleep(0.2)
                lat_n += scrape(nport, 1, requests=1)[0]
            row("node_exporter /metrics p50, 1 client", pct(lat_n, 0.5) * 1000, "ms", "-", None,
                "Debian's prometheus-node-exporter, same run, loopback, one scrape at a time")
            row("node_exporter /metrics p99, 1 client", pct(lat_n, 0.99) * 1000, "ms", "-", None, f"{n1} scrapes")
            ratio = pct(lat_g, 0.5) / pct(lat_n, 0.5)
            rows[-5]["verdict"] = "ok" if ratio <= 1 else "MISSED"
            row("/metrics p50 ratio gpud / node_exporter, 1 client", ratio, "×", "≤ 1", ratio <= 1,
                "same run; gpud's scrapes each render a new observation")
        seconds = 4 if q else 30
        before = len(status(port)["tick"]["recent_periods"])
        t0 = time.monotonic()
        lat50, err50 = scrape(port, 50, seconds=seconds)
        took = time.monotonic() - t0
        periods = status(port)["tick"]["recent_periods"]
        window = periods[-max(1, int(took) - 1):] if len(periods) > before else periods
        jitter = [abs(p - 1.0) for p in window]
        row("/metrics p50, 50 clients", pct(lat50, 0.5) * 1000, "ms", "-", None,
            f"{len(lat50)} requests in {seconds} s")
        row("/metrics p99, 50 clients", pct(lat50, 0.99) * 1000, "ms", "-", None, f"{len(lat50)} requests")
        row("/metrics errors, 50 clients", err50 + err_g, "errors", "0", err50 + err_g == 0, f"{seconds} s")
        row("tick period error p99, 50 scrapers", pct(jitter, 0.99) * 1000, "ms", "≤ 100", pct(jitter, 0.99) <= 0.1,
            f"{len(jitter)} ticks of 1 s while 50 clients scraped")
        seconds = 6 if q else 20
        with IdleClients(port, 100) as idle:
            lat_i, err_i = scrape(port, 1, seconds=seconds)
            held = idle.opened
        row("/metrics p99, 100 idle or partial connections open", pct(lat_i, 0.99) * 1000, "ms", "≤ 100",
            pct(lat_i, 0.99) <= 0.1, f"{len(lat_i)} scrapes in {seconds} s while 100 connections sent nothing or "
            f"half a request ({held} opened: each is closed at the 5 s read deadline and opened again)")
        row("/metrics errors, 100 idle or partial connections open", err_i, "errors", "0", err_i == 0,
            f"{seconds} s")
        if node is not None:
            lat50n, _ = scrape(nport, 50, seconds=2 if q else 10)
            row("node_exporter /metrics p50, 50 clients", pct(lat50n, 0.5) * 1000, "ms", "-", None, "same run")
            row("node_exporter /metrics p99, 50 clients", pct(lat50n, 0.99) * 1000, "ms", "-", None, "same run")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        if node is not None:
            node.kill()
            node.wait()
    # -- profile rules: switch and switch-back latency ---------------------------------------------
    from rules_latency import measure
    from rules_latency import rows as rule_rows

    rule_state = tempfile.mkdtemp(prefix="gpud-bench-rules-")
    result = measure(args.rule_runs or (3 if q else 20), rule_state)
    os.environ["GPUD_STATE_DIR"] = state
    shutil.rmtree(rule_state, ignore_errors=True)
    for figure, value, unit, target, ok, how in rule_rows(result):
        row(figure, value, unit, target, ok, how)
    # -- the probe --------------------------------------------------------------------------------
    over = probe_overhead(env, quick=q)
    if over is not None:
        r = over["median_ratio"] - 1
        row("probe per-step overhead against a plain DDP loop", r * 100, "%", "≤ 3", r <= 0.03,
            f"2 gloo ranks, median of the ratios of {over['rounds']} alternating rounds of {over['steps']} steps, "
            "same model and DDP options")
        # Two rows with no target, a minute of the smoke run between them: measured by the full run only.
        aa = None if q else probe_overhead(env, "aa")
        row("noise floor: the plain loop against itself (A/A)", (aa["median_ratio"] - 1) * 100 if aa else None, "%",
            "-", None, "the same measurement with the plain loop on both sides" if aa else "not run with --quick")
        probe_wall: float | None = None
        if not q:
            t0 = time.perf_counter()
            p = subprocess.run([*gpud, "probe", "--device", "cpu", "--quick", "--json"], env=env, capture_output=True,
                               text=True, check=False)
            probe_wall = time.perf_counter() - t0
        row("quick CPU probe wall (world sizes 1, 2)", probe_wall, "s", "-", None if q else (p.returncode == 0 or None),
            "not run with --quick" if q else "gpud probe --quick")
    else:
        row("probe per-step overhead against a plain DDP loop", None, "%", "≤ 3", None, "torch not installed")
    shutil.rmtree(state, ignore_errors=True)

    width = max(len(r["figure"]) for r in rows)
    print(f"\n{'figure':<{width}}  {'value':>10}  {'unit':<11} {'target':<18} verdict")
    for r in rows:
        v = "-" if r["value"] is None else f"{r['value']:.3f}"
        print(f"{r['figure']:<{width}}  {v:>10}  {r['unit']:<11} {r['target']:<18} {r['verdict']}")
    total = time.monotonic() - t_start
    print(f"\n{len(rows)} figures in {total:.0f} s; written to {args.json}")
    Path(args.json).write_text(json.dumps({"time": time.time(), "seconds": total, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
