"""What the daemon runs beside its ticks: doctor every few minutes in a thread, the training probe
in a child process once the GPUs have been idle long enough, and the reaping of that child."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpud import config as cfg
from gpud.child import environment, python
from gpud.daemon.recorder import Recorder
from gpud.doctor import diagnose
from gpud.hw.machine import Machine
from gpud.model import CheckResult, Snapshot, ThermalPoint
from gpud.paths import probe_output_path
from gpud.probe import history

log = logging.getLogger("gpud.daemon")


class Schedule:
    def __init__(self, machine: Machine, config: Callable[[], cfg.Config], recorder: Callable[[], Recorder]) -> None:
        self.machine = machine
        self._config = config  # the daemon's current configuration (a reload replaces it)
        self._recorder = recorder  # the health journal's writer (opened when the daemon starts)
        self.checks: tuple[CheckResult, ...] = ()
        self.checks_at = 0.0
        self.doctor_thread: threading.Thread | None = None
        self.probe_proc: subprocess.Popen[bytes] | None = None
        self.probe_why = ""
        self.idle_since: float | None = None
        self.last_probe_start = 0.0

    def config(self) -> cfg.Config:
        """The daemon's configuration now (the health states read its ``[health]`` Xid policy)."""
        return self._config()

    def step(self, snap: Snapshot, now: float,
             thermal: Callable[[], Mapping[str, Sequence[ThermalPoint]]] | None = None) -> None:
        """Once a tick, after the hardware work: start what is due, reap what ended. ``thermal`` gives the
        tick's history of each GPU's cooling, for the checks that judge a fan by its effect over time."""
        d = self._config().daemon
        if now - self.checks_at >= d.doctor_interval_seconds and (
                self.doctor_thread is None or not self.doctor_thread.is_alive()):
            self.checks_at = now
            history = thermal() if thermal is not None else {}  # copied here, not on every tick
            self.doctor_thread = threading.Thread(target=self._doctor, args=(snap, history), name="gpud-doctor",
                                                  daemon=True)
            self.doctor_thread.start()
        self.reap_probe()
        busy = any(s.processes or (s.utilization_gpu_percent or 0) > 5 for s in snap.samples if not s.lost)
        self.idle_since = None if busy else (self.idle_since or now)
        hours = d.probe_interval_hours
        if (hours and self.idle_since is not None and now - self.idle_since >= d.probe_idle_minutes * 60
                and now - self.last_probe_start >= hours * 3600 and not self.probe_running()):
            self.start_probe("schedule")

    def _doctor(self, snap: Snapshot, thermal: Mapping[str, Sequence[ThermalPoint]]) -> None:
        try:
            self.checks = diagnose(self.machine, self._config(), snapshot=snap, in_daemon=True,
                                   thermal=thermal).checks
            self._recorder().check_results(self.checks)
        except Exception as err:  # noqa: BLE001 - a broken check must not stop the daemon
            log.exception("doctor failed: %s", err)

    # -- the probe ----------------------------------------------------------------------
    def probe_running(self) -> bool:
        return self.probe_proc is not None and self.probe_proc.poll() is None

    def start_probe(self, why: str) -> dict[str, Any]:
        if self.probe_running():
            return {"ok": False, "error": "a probe is already running"}
        args = python("-m", "gpud", "probe", "--quick", "--json")
        world_sizes = self._config().daemon.probe_world_sizes
        if world_sizes:
            args += ["--world-sizes", ",".join(map(str, world_sizes))]
        if self.machine.simulation is not None:  # the daemon's machine, simulated too
            args += ["--simulate", self.machine.simulation.description.source]
        self.last_probe_start = time.time()
        out = probe_output_path()
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as f:  # the child keeps its own descriptor
            # Isolated, in the state directory (root's own), with only the environment a probe needs.
            self.probe_proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True,
                                               cwd=out.parent, env=environment())
        self.probe_why = why
        log.info("probe started (%s), pid %d", why, self.probe_proc.pid)
        return {"ok": True, "message": f"probe started, pid {self.probe_proc.pid}"}

    def reap_probe(self) -> None:
        """Log a finished probe's result or failure, and reap it (no zombie)."""
        proc = self.probe_proc
        if proc is None or proc.poll() is None:
            return
        self.probe_proc = None
        why = self.probe_why
        latest = history.latest()
        if latest is not None and latest.started_at and latest.started_at < self.last_probe_start - 1:
            latest = None  # the history's newest record is an older run's: this one wrote none
        if proc.returncode in (0, 1) and latest is not None:
            said = [s for s in latest.diagnosis.sentences if not s.startswith("CPU run")]
            log.info("probe finished (%s): %s%s", why, "OK" if proc.returncode == 0 else "FAILED",
                     f": {said[0]}" if said else "")
            self._recorder().probe(latest, proc.returncode == 0, why)
            return
        try:
            lines = [ln for ln in probe_output_path().read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            lines = []
        reason = _reason(lines) or f"exit status {proc.returncode}, no message"
        log.error("probe failed (%s): exit %d: %s", why, proc.returncode, reason)
        self._recorder().probe(None, False, why, error=reason)

    def stop_probe(self) -> None:
        """At shutdown: end a running probe and reap it."""
        if self.probe_proc is not None and self.probe_proc.poll() is None:
            self.probe_proc.terminate()
            try:
                self.probe_proc.wait(timeout=10)  # reaped: no zombie
            except subprocess.TimeoutExpired:
                self.probe_proc.kill()
                self.probe_proc.wait()


def _reason(lines: list[str]) -> str | None:
    """Why a probe failed, from what it wrote to stderr: its error line (``gpud: error: …``, or the last
    line of a traceback), not a progress bar or the remedy printed after it."""
    for ln in lines:
        text = ln.strip().replace("\r", "")
        if text.lower().startswith(("error:", "gpud: error:", "gpud: ")):
            return text.split("error:", 1)[-1].strip() or text
    return lines[-1].strip()[:300] if lines else None
