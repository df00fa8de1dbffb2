"""The daemon's footprint as a Kubernetes DaemonSet sizes it: RSS and CPU on a simulated 8-GPU node
while a real Prometheus scrapes it, with doctor's checks running as often as the daemon allows.

    python benchmarks/footprint.py [--simulate hgx-8x-h200] [--seconds 180] [--scrape-interval 5s]

The daemon runs as a child process (1 s ticks, ``doctor_interval_seconds = 10``: thirty times the
default, so the doctor thread's peak is inside the window), scraped by ``prometheus`` (Debian's
package) on loopback for ``/metrics``, and by this script for ``/status`` and ``/healthz`` every
scrape interval. RSS is read from ``/proc/PID/status`` every second (``VmRSS``; ``VmHWM`` is the
kernel's own peak), CPU from ``/proc/PID/stat`` (utime + stime) over the window after a 5 s settling
time. ``gpud doctor`` (what Node Problem Detector's check runs) is measured once as a child: wall
time and its peak RSS (``getrusage`` of the children). docs/deployment.md, "Resources", holds a run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import free_port, wait_http  # noqa: E402  (the benchmarks' shared helpers)

MIB = 2**20


def proc_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get(port: int, path: str) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    r.read()
    return r.status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--simulate", default="hgx-8x-h200")
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--scrape-interval", default="5s", help="Prometheus's scrape_interval")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpud-footprint-"))
    port, prom_port = free_port(), free_port()
    (work / "gpud.toml").write_text("[daemon]\ninterval_seconds = 1\ndoctor_interval_seconds = 10\n")
    env = {**os.environ, "GPUD_STATE_DIR": str(work / "state"), "GPUD_SOCKET": str(work / "gpud.sock"),
           "GPUD_SIMULATE": args.simulate, "NO_COLOR": "1"}
    (work / "state").mkdir()
    gpud = [sys.executable, "-m", "gpud"]
    daemon = subprocess.Popen([*gpud, "daemon", "--config", str(work / "gpud.toml"), "--listen", f"127.0.0.1:{port}"],
                              env=env, stderr=subprocess.DEVNULL, cwd=REPO)
    prom = None
    try:
        wait_http(port, "/healthz")
        if shutil.which("prometheus"):
            (work / "prometheus.yml").write_text(
                f"global: {{scrape_interval: {args.scrape_interval}}}\n"
                f"scrape_configs:\n  - job_name: gpud\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
            prom = subprocess.Popen(["prometheus", f"--config.file={work / 'prometheus.yml'}",
                                     f"--storage.tsdb.path={work / 'tsdb'}",
                                     f"--web.listen-address=127.0.0.1:{prom_port}"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(5)  # settle: imports done, the first doctor run under way
        step = float(args.scrape_interval.rstrip("s"))
        t0, c0 = time.monotonic(), cpu_seconds(daemon.pid)
        rss, errors, next_scrape = [], 0, 0.0
        while time.monotonic() - t0 < args.seconds:
            now = time.monotonic() - t0
            if now >= next_scrape:
                errors += sum(get(port, p) != 200 for p in ("/status", "/healthz"))
                next_scrape += step
            rss.append(proc_kib(daemon.pid, "VmRSS"))
            time.sleep(1)
        span, used = time.monotonic() - t0, cpu_seconds(daemon.pid) - c0
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
        shutil.rmtree(work, ignore_errors=True)
    out = {"simulate": args.simulate, "seconds": round(span, 1), "scrape_interval": args.scrape_interval,
           "prometheus_up": up, "http_errors": errors,
           "daemon_cpu_percent_of_a_core": round(100 * used / span, 2),
           "daemon_rss_mib_max_sampled": round(max(rss) / 1024, 1), "daemon_rss_mib_median": round(
               sorted(rss)[len(rss) // 2] / 1024, 1), "daemon_vmhwm_mib": round(hwm / 1024, 1),
           "doctor_wall_seconds": round(doctor_wall, 2),
           "doctor_peak_rss_mib": round(doctor_rss / 1024, 1) if doctor_rss > before else None}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
