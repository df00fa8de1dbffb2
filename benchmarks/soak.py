"""The reliability soak: the daemon on a simulated 8-GPU workstation under everything at once.

    python benchmarks/soak.py [--minutes 30] [--scrapers 50] [--json PATH]

For ``--minutes`` the daemon (a child process, private state directory, 1 s ticks, the `training`
profile's fan curves) is scraped by ``--scrapers`` clients without pause, sent SIGHUP every 10 s,
asked to apply `quiet` and to restore over its control socket in a loop, and meets injected faults
in turn (a GPU lost and back, a fan stuck at 0 %, an Xid, then all cleared). It prints, and writes
as JSON: errors (want 0: a scrape that was not a 200, a control request without an answer, a
traceback in the daemon's log, the daemon gone), the daemon's RSS growth after its warm-up (want
≤ 5 MB), the tick duration and tick period error p99. Refusals (an apply refused while a GPU is
lost) are counted apart: they are answers. docs/robustness.md holds the figures of a 30-minute run;
`tests/test_soak.py` runs two minutes of it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import free_port, pct  # noqa: E402 - the benchmarks' helpers, said once

SIM = "2s-8x-a6000"
FAULTS = ("gpu_lost", "fan_stuck", "xid", "clear")
RSS_TARGET_MB = 5.0


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Soak:
    def __init__(self, seconds: float, scrapers: int, hup_every: float) -> None:
        self.seconds, self.scrapers, self.hup_every = seconds, scrapers, hup_every
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self._due = threading.local()  # each thread's next point on its grid (``_wait_next``)
        self.counts: dict[str, int] = {"scrapes": 0, "scrape_errors": 0, "control": 0, "control_errors": 0,
                                       "refusals": 0, "sighups": 0, "faults": 0, "fault_errors": 0}
        self.refusals: set[str] = set()
        self.failures: set[str] = set()
        self.periods: list[float] = []
        self.durations: list[float] = []
        self.rss: list[tuple[float, float]] = []

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    # -- the load ---------------------------------------------------------------------------
    def scraper(self, port: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        while not self.stop.is_set():
            try:
                conn.request("GET", "/metrics")
                r = conn.getresponse()
                r.read()
                ok = r.status == 200
                if r.getheader("Connection", "").lower() == "close" or r.version == 10:
                    conn.close()
            except OSError:
                ok = False
                conn.close()
            self.add("scrapes")
            if not ok:
                self.add("scrape_errors")
            time.sleep(0.05)
        conn.close()

    def _wait_next(self, every: float) -> bool:
        """Wait for the next point of this thread's grid of ``every`` seconds (True: the soak ends): on a grid,
        not ``every`` after the last action, so that an action slowed by a loaded machine does not thin out
        the ones after it (a minute holds its 12 faults, its 30 control requests)."""
        due = getattr(self._due, "t", None)
        due = (time.monotonic() if due is None else due) + every
        self._due.t = max(due, time.monotonic())  # an action longer than the period: the next at once, none piled up
        return self.stop.wait(max(0.0, due - time.monotonic()))

    def controller(self, sock: str) -> None:
        from gpud.daemon import control

        k = 0
        while not self._wait_next(2.0):
            cmd, args = (("apply", {"profile": "quiet"}) if k % 2 == 0 else ("restore", {}))
            k += 1
            why = "no daemon listens on the socket"
            try:
                reply = control.request(sock, cmd, timeout=60, **args)
            except Exception as err:  # noqa: BLE001 - an unanswered request is the error this counts
                reply, why = None, f"{type(err).__name__}: {err}"
            self.add("control")
            if reply is None:
                self.add("control_errors")
                with self.lock:
                    self.failures.add(f"{cmd}: {why[:160]}")
            elif not reply.get("ok", False):
                self.add("refusals")
                with self.lock:
                    # a refusal says why in `error`; a restore that could not put everything back lists `failed`
                    why = reply.get("error") or "; ".join(map(str, reply.get("failed") or [])) or "no reason given"
                    self.refusals.add(f"{cmd}: {str(why)[:120]}")

    def faults(self) -> None:
        from gpud.backends import open_machine

        sim = open_machine(SIM).simulation
        assert sim is not None
        k = 0
        while not self._wait_next(5.0):
            kind, gpu = FAULTS[k % len(FAULTS)], (k // len(FAULTS)) % len(sim.description.gpus)
            k += 1
            try:
                if kind == "clear":
                    sim.machine.clear_faults()
                elif kind == "fan_stuck":
                    sim.machine.inject("fan_stuck", gpu=gpu, fan=0, percent=0)
                elif kind == "xid":
                    sim.machine.inject("xid", gpu=gpu, xid=31, seconds=time.time() % 86400)
                    sim.refresh_root()
                else:
                    sim.machine.inject(kind, gpu=gpu)
                self.add("faults")
            except Exception:  # noqa: BLE001 - the soak's own failure, reported
                self.add("fault_errors")

    def watcher(self, pid: int, port: int) -> None:
        seen = 0
        while not self.stop.wait(10.0):
            r = rss_mb(pid)
            if r is not None:
                self.rss.append((time.monotonic(), r))
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                c.request("GET", "/status")
                tick = json.loads(c.getresponse().read()).get("tick", {})
                periods = tick.get("recent_periods", [])
                total = tick.get("periods", 0)
                new = min(len(periods), max(0, total - seen))
                self.periods += periods[len(periods) - new:] if new else []
                seen = total
                self.durations.append(float(tick.get("duration_mean_seconds") or 0.0))
            except (OSError, ValueError):
                self.add("scrape_errors")


def run(minutes: float, scrapers: int, hup_every: float) -> dict[str, Any]:
    seconds = minutes * 60
    tmp = Path(tempfile.mkdtemp(prefix="gpud-soak-"))
    os.environ.update({"GPUD_STATE_DIR": str(tmp / "state"), "GPUD_SIMULATE": SIM, "GPUD_SIM_EUID": "0"})
    os.environ.pop("GPUD_CONFIG", None)
    port, sock = free_port(), str(tmp / "gpud.sock")
    os.environ["GPUD_SOCKET"] = sock  # overrides [daemon] socket: the daemon's and the requests' alike
    conf = tmp / "gpud.toml"
    conf.write_text(f'[daemon]\nlisten = "127.0.0.1:{port}"\nsocket = "{sock}"\ninterval_seconds = 1\n'
                    'doctor_interval_seconds = 30\nprofile = "training"\n')
    log = open(tmp / "daemon.log", "w+b")  # noqa: SIM115 - read back at the end
    proc = subprocess.Popen([sys.executable, "-m", "gpud", "daemon", "--config", str(conf)], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    soak = Soak(seconds, scrapers, hup_every)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                break
        except OSError:
            time.sleep(0.2)
    else:
        proc.kill()
        raise SystemExit(f"the daemon did not start; log:\n{(tmp / 'daemon.log').read_text()[-3000:]}")
    threads = [threading.Thread(target=soak.scraper, args=(port,), daemon=True) for _ in range(scrapers)]
    threads += [threading.Thread(target=soak.controller, args=(sock,), daemon=True),
                threading.Thread(target=soak.faults, daemon=True),
                threading.Thread(target=soak.watcher, args=(proc.pid, port), daemon=True)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    died = False
    while time.monotonic() - t0 < seconds:
        time.sleep(min(hup_every, max(0.0, seconds - (time.monotonic() - t0))))
        if proc.poll() is not None:
            died = True
            break
        try:
            os.kill(proc.pid, signal.SIGHUP)
            soak.add("sighups")
        except ProcessLookupError:
            died = True
            break
    soak.stop.set()
    for th in threads:
        th.join(70)
    alive = proc.poll() is None
    if alive:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.seek(0)
    text = log.read().decode(errors="replace")
    log.close()
    tracebacks = text.count("Traceback")
    warm = t0 + min(60.0, seconds * 0.25)
    after = [r for t, r in soak.rss if t >= warm]
    growth = (after[-1] - after[0]) if len(after) >= 2 else float("nan")
    c = soak.counts
    errors = c["scrape_errors"] + c["control_errors"] + tracebacks + (1 if died or not alive else 0) + c["fault_errors"]
    return {"minutes": minutes, "scrapers": scrapers, "sighup_every_seconds": hup_every, "machine": SIM,
            "errors": errors, "tracebacks": tracebacks, "daemon_died": died or not alive, **c,
            "refusal_reasons": sorted(soak.refusals)[:20], "error_reasons": sorted(soak.failures)[:20],
            "rss_start_mb": after[0] if after else None, "rss_end_mb": after[-1] if after else None,
            "rss_growth_mb": growth, "tick_period_error_p99_ms": pct([abs(p - 1.0) for p in soak.periods], 0.99) * 1000,
            "tick_duration_mean_p99_ms": pct(soak.durations, 0.99) * 1000, "ticks_seen": len(soak.periods),
            "log_tail": text[-2000:] if errors else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--scrapers", type=int, default=50)
    ap.add_argument("--sighup-every", type=float, default=10.0, help="seconds between SIGHUPs")
    ap.add_argument("--json", default=None, help="write the figures here too")
    a = ap.parse_args()
    res = run(a.minutes, a.scrapers, a.sighup_every)
    rows = [("errors", res["errors"], "", "0", res["errors"] == 0),
            ("RSS growth after warm-up", res["rss_growth_mb"], "MB", f"≤ {RSS_TARGET_MB:g}",
             res["rss_growth_mb"] <= RSS_TARGET_MB),
            ("tick period error p99", res["tick_period_error_p99_ms"], "ms", "≤ 100",
             res["tick_period_error_p99_ms"] <= 100),
            ("tick duration (mean per 10 s) p99", res["tick_duration_mean_p99_ms"], "ms", "-", None),
            ("scrapes", res["scrapes"], "", "-", None), ("control requests", res["control"], "", "-", None),
            ("refusals (answers)", res["refusals"], "", "-", None), ("SIGHUPs", res["sighups"], "", "-", None),
            ("faults injected", res["faults"], "", "-", None)]
    print(f"gpud soak: {a.minutes:g} min on simulated {SIM}, {a.scrapers} scrapers, SIGHUP every "
          f"{a.sighup_every:g} s, apply/restore loop, faults {', '.join(FAULTS)}")
    for name, value, unit, target, ok in rows:
        verdict = "n/a" if ok is None else "ok" if ok else "MISSED"
        shown = f"{value:.1f}" if isinstance(value, float) else str(value)
        print(f"  {name:<36} {shown:>10} {unit:<3} target {target:<6} {verdict}")
    for why in res["error_reasons"]:
        print(f"  error: {why}")
    if res["log_tail"]:
        print("daemon log (tail):\n" + res["log_tail"])
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
