"""Start a real gpud daemon on a simulated workstation, talk to it over loopback and its socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from conftest import REPO

METRICS = [
    "gpud_build_info", "gpud_gpu_info", "gpud_gpu_up", "gpud_gpu_temperature_celsius",
    "gpud_gpu_slowdown_temperature_celsius", "gpud_gpu_fan_speed_ratio", "gpud_gpu_fan_manual",
    "gpud_gpu_power_watts", "gpud_gpu_power_limit_watts", "gpud_gpu_power_default_limit_watts",
    "gpud_gpu_energy_joules_total", "gpud_gpu_clock_hertz", "gpud_gpu_max_clock_hertz", "gpud_gpu_utilization_ratio",
    "gpud_gpu_memory_used_bytes", "gpud_gpu_memory_total_bytes", "gpud_gpu_pcie_link_generation",
    "gpud_gpu_pcie_link_width", "gpud_gpu_pcie_throughput_bytes_per_second", "gpud_gpu_pcie_replay_errors_total",
    "gpud_gpu_nvlink_link_up", "gpud_gpu_clock_event_active", "gpud_gpu_ecc_errors_total",
    "gpud_gpu_xid_errors_total", "gpud_check_status", "gpud_profile_info", "gpud_profile_drift",
    "gpud_profile_reapply_total", "gpud_profile_reapply_failures_total",
    "gpud_fan_failsafe_total", "gpud_tick_duration_seconds_bucket",
    "gpud_nvml_errors_total", "gpud_probe_ddp_samples_per_second", "gpud_probe_ddp_efficiency_ratio",
    "gpud_probe_allreduce_busbw_bytes_per_second", "gpud_probe_p2p_bandwidth_bytes_per_second",
    "gpud_probe_last_run_timestamp_seconds", "gpud_probe_success",
    "gpud_gpu_clock_event_seconds_total", "gpud_gpu_throttled_seconds_total", "gpud_gpu_watched_seconds_total",
    "gpud_last_tick_timestamp_seconds", "gpud_health_state", "gpud_health_info", "gpud_gpu_profile_active",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningDaemon:
    """``healthz=False``: ready once the control socket exists (the daemon binds its HTTP listener first),
    for a daemon whose /healthz a plain request cannot reach (TLS, credentials)."""

    def __init__(self, tmp: Path, sim: str = "z8-fury-4x-a6000", config: str = "", interval: float = 0.2,
                 sock_dir: Path | None = None, env: dict[str, str] | None = None, healthz: bool = True) -> None:
        self.sock = str((sock_dir or tmp) / "gpud.sock")
        self.config = tmp / "gpud.toml"
        self.env = {**os.environ, "GPUD_SOCKET": self.sock, "GPUD_SIMULATE": sim, **(env or {})}
        self.log = open(tmp / "daemon.log", "w+")
        # free_port() leaves a moment in which another test's daemon, or a client's ephemeral port, can
        # take the port (tests run in parallel): a daemon that could not listen is started again on another.
        for attempt in range(3):
            self.port = free_port()
            self.config.write_text(f'[daemon]\nlisten = "127.0.0.1:{self.port}"\ninterval_seconds = {interval}\n'
                                   f"doctor_interval_seconds = 10\n{config}")
            self.url = f"http://127.0.0.1:{self.port}"
            start = self.log.tell()
            self.proc = subprocess.Popen([sys.executable, "-m", "gpud", "daemon", "--config", str(self.config)],
                                         env=self.env, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)
            try:
                self._wait_ready(healthz)
                return
            except RuntimeError:
                self.log.flush()
                self.log.seek(start)
                taken = f"cannot listen on 127.0.0.1:{self.port}" in self.log.read()
                self.log.seek(0, os.SEEK_END)
                if not taken or attempt == 2:
                    raise

    def _wait_ready(self, healthz: bool) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}: {self.logs()}")
            try:
                if os.path.exists(self.sock) and (not healthz or self.get("/healthz")[0] == 200):
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("daemon did not become healthy: " + self.logs())

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def metrics(self) -> str:
        code, body = self.get("/metrics")
        assert code == 200
        return body

    def value(self, name: str, **labels: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                head, _, val = line.rpartition(" ")
                if all(f'{k}="{v}"' in head for k, v in labels.items()):
                    return float(val)
        return None

    def wait_for(self, cond: Any, timeout: float = 10.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; log:\n{self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-5000:]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> tuple[int, float]:
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return code, time.monotonic() - t0
