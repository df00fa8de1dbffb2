"""``gpud daemon``: the loop, the exporter's HTTP endpoint, the control socket, systemd.

One tick per interval: read one snapshot, drive the fan curves, enforce the applied profile
(re-applying what a driver reload, a reboot or someone else undid, counted), publish one
immutable observation for the scrapers. Doctor's cheap checks run every few minutes and the
training probe on a schedule, both in background threads/child processes, so neither delays a tick.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from typing import Any

from gpud import __version__
from gpud import config as cfg
from gpud.daemon import control, http
from gpud.daemon.systemd import notify, watchdog_seconds
from gpud.doctor import diagnose
from gpud.errors import GpudError, InvalidInput
from gpud.exporter import Observation, Renderer, TickStats
from gpud.hw.machine import Machine
from gpud.model import CheckResult, Snapshot, XidEvent, to_jsonable
from gpud.paths import probe_output_path
from gpud.probe import history
from gpud.tuning import engine
from gpud.tuning import state as tuning_state
from gpud.tuning.fanloop import FanControl
from gpud.tuning.profile import Profile, load

log = logging.getLogger("gpud.daemon")
XID_EVERY_S = 10.0
ENFORCED = ("persistence_mode", "compute_mode", "power_limit_watts", "applications_clocks")


def trusted(path: str, what: str) -> None:
    """As root, refuse files another user could have written: a writable profile could stop the fans."""
    if os.geteuid() != 0:
        return
    try:
        st = os.stat(path)
    except OSError as err:
        raise InvalidInput(path, "", f"cannot read: {err.strerror}") from err
    if st.st_uid != 0:
        raise InvalidInput(path, "", f"{what} not owned by root (uid {st.st_uid}): refused while running as root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise InvalidInput(path, "", f"{what} writable by group or others (mode {stat.S_IMODE(st.st_mode):o}): "
                                     f"refused while running as root; `chmod go-w {path}`")


def load_trusted_profile(name: str) -> Profile:
    p = load(name)
    for file in p.files:
        trusted(file, "profile")
    return p


class Daemon:
    def __init__(self, machine: Machine, config: cfg.Config, config_path: str | None = None) -> None:
        self.machine = machine
        self.config = config
        self.config_path = config_path
        self.stop_event = threading.Event()
        self.tuning_lock = threading.RLock()  # apply/restore vs the tick's fan and drift work
        self.fans = FanControl(machine)
        self.reapply_total = 0
        self.tick_stats = TickStats()
        self.tick_periods: list[float] = []  # recent tick start-to-start periods (jitter)
        self.last_tick: float | None = None
        self.started = time.time()
        self.snapshot: Snapshot | None = None
        self.checks: tuple[CheckResult, ...] = ()
        self.checks_at = 0.0
        self.doctor_thread: threading.Thread | None = None
        self.probe_proc: subprocess.Popen[bytes] | None = None
        self.probe_why = ""
        self.idle_since: float | None = None
        self.last_probe_start = 0.0
        self.observation = Observation(snapshot=None)
        self._rendered: tuple[Observation, bytes] | None = None
        self._render_lock = threading.Lock()
        self.renderer = Renderer()
        self.desired: dict[int, dict[str, Any]] = {}
        self.profile: str | None = None
        self.http_server: http.Server | None = None
        self.control_server: Any = None
        self.ticks = 0
        self.xids: tuple[XidEvent, ...] = ()
        self.xids_at = 0.0
        self.probe_mtime = 0.0
        self.probe_latest: dict[str, Any] | None = None

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        d = self.config.daemon
        self._load_profile_at_start()
        try:  # blocking readings (PCIe throughput, processes): a thread off the tick, first round now
            self.machine.nvml.start_sampler(self.stop_event)
        except GpudError as err:
            log.warning("off-tick sampler not started: %s", err)
        self.tick()  # the first observation exists before anyone can scrape
        host, port = cfg.parse_listen(d["listen"])
        web = http.load_web_config(d["web_config"]) if d["web_config"] else {}
        ep = http.Endpoints(self.metrics, self.healthy, self.status, web.get("basic_auth_users"))
        self.http_server, _ = http.serve(host, port, ep, web.get("tls_server_config"))
        self.control_server, _ = control.serve(self.socket_path(), self.handle, d["socket_group"])
        log.info("gpud %s serving http://%s:%d/metrics, control socket %s, %d GPU(s), profile %s", __version__,
                 host, self.http_server.server_address[1], self.socket_path(),
                 len(self.snapshot.samples) if self.snapshot else 0, self.profile or "none")
        notify(f"READY=1\nSTATUS={self.status_line()}")

    def socket_path(self) -> str:
        return os.environ.get("GPUD_SOCKET") or self.config.daemon["socket"]

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=self.reload, daemon=True).start())
        self.start()
        interval = float(self.config.daemon["interval_seconds"])
        wd = watchdog_seconds()
        next_at = time.monotonic() + interval
        while not self.stop_event.wait(max(0.0, next_at - time.monotonic())):
            self.tick()
            if wd is not None:
                notify("WATCHDOG=1")
            if self.ticks % 10 == 0:
                notify(f"STATUS={self.status_line()}")
            next_at += interval
            if next_at < time.monotonic():  # a tick overran: skip, do not bunch up
                next_at = time.monotonic() + interval
            interval = float(self.config.daemon["interval_seconds"])
        return self.shutdown()

    def shutdown(self) -> int:
        notify("STOPPING=1")
        with self.tuning_lock:
            self.fans.release()  # fans back to the driver first, whatever else happens
            if self.config.daemon["restore_on_stop"]:
                done, failed = engine.restore(self.machine)
                for line in failed:
                    log.error("restore on stop: %s", line)
        for srv in (self.http_server, self.control_server):
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        try:
            os.unlink(self.socket_path())
        except OSError:
            pass
        if self.probe_proc is not None and self.probe_proc.poll() is None:
            self.probe_proc.terminate()
            try:
                self.probe_proc.wait(timeout=10)  # reaped: no zombie
            except subprocess.TimeoutExpired:
                self.probe_proc.kill()
                self.probe_proc.wait()
        log.info("stopped")
        return 0

    def reload(self) -> dict[str, Any]:
        """SIGHUP: read the configuration again; an invalid one is refused and the old kept."""
        if not self.config_path and not os.environ.get("GPUD_CONFIG") and not cfg.DEFAULT_PATH.is_file():
            return {"ok": True, "message": "no configuration file: defaults kept"}
        try:
            path = self.config_path or os.environ.get("GPUD_CONFIG") or str(cfg.DEFAULT_PATH)
            trusted(path, "configuration")
            new = cfg.load(path)
        except GpudError as err:
            log.error("reload refused, old configuration kept: %s", err)
            return {"ok": False, "error": f"reload refused, old configuration kept: {err}"}
        self.config = new
        log.info("configuration reloaded from %s", path)
        return {"ok": True, "message": f"configuration reloaded from {path}"}

    # -- the tick -----------------------------------------------------------------------
    def tick(self) -> None:
        t0 = time.perf_counter()
        now = time.time()
        if self.last_tick is not None:
            self.tick_periods.append(now - self.last_tick)
            del self.tick_periods[:-2000]
        try:
            snap = self.machine.snapshot()
        except GpudError as err:
            log.error("cannot read the GPUs: %s", err)
            snap = None
            with self.tuning_lock:  # no temperature at all: no fan may stay in manual mode
                self.fans.failsafe_all(f"no NVML reading: {err}")
        if snap is not None:
            self.snapshot = snap
            with self.tuning_lock:
                for ev in self.fans.step(snap.samples, time.monotonic()):
                    if ev.kind == "failsafe":
                        log.warning("GPU %d: fan failsafe: %s", ev.gpu, ev.detail)
                drift = self._enforce(snap)
            self._schedule(snap, now)
        else:
            drift = ()
        self.last_tick = now
        self.ticks += 1
        self.tick_stats.observe(time.perf_counter() - t0)
        if now - self.xids_at >= XID_EVERY_S:  # the kernel log is read every few seconds, not every tick
            self.xids_at = now
            self.xids = tuple(self.machine.host.xid_events() or ())
        self.observation = Observation(
            snapshot=self.snapshot, xids=self.xids, checks=self.checks, profile=self.profile, drift=drift,
            reapply_total=self.reapply_total, fan_failsafe_total=self.fans.failsafes, probe=self.probe_result(),
            nvml_errors=dict(self.machine.nvml.errors), tick=self._tick_copy(), last_tick=now)

    def probe_result(self) -> dict[str, Any] | None:
        """The latest probe result, re-read only when the history file changed."""
        try:
            mtime = history.path().stat().st_mtime
        except OSError:
            return None
        if mtime != self.probe_mtime:
            self.probe_mtime = mtime
            self.probe_latest = history.latest()
        return self.probe_latest

    def _tick_copy(self) -> TickStats:
        t = self.tick_stats
        return TickStats(list(t.counts), t.total, t.sum)

    def _enforce(self, snap: Snapshot) -> tuple[tuple[int | None, str, bool], ...]:
        """Compare readable settings with the profile; re-apply a GPU's settings when one drifted."""
        out: list[tuple[int | None, str, bool]] = []
        for s in snap.samples:
            want = self.desired.get(s.index)
            if not want or s.lost:
                continue
            drifted = []
            for setting in ENFORCED:
                if setting in want and want[setting] not in (None, "unsupported", engine.RESET):
                    cur = engine.current_value(setting, s, None)
                    if cur is not None and not engine.same(setting, cur, want[setting]):
                        drifted.append(setting)
            failed = set()
            if drifted:
                # A driver reload or reboot resets everything, locked clocks (unreadable) included.
                log.warning("GPU %d: %s drifted from profile %s: re-applying", s.index, ", ".join(drifted),
                            self.profile)
                for setting in engine.ORDER:
                    if setting in want and setting != "fan" and want[setting] not in (None, "unsupported"):
                        try:
                            engine.write(self.machine, s.index, setting, want[setting])
                        except GpudError as err:
                            log.error("GPU %d: re-applying %s failed: %s", s.index, setting, err)
                            failed.add(setting)
                self.reapply_total += 1
            for setting in ENFORCED:
                if setting in want:
                    out.append((s.index, setting, setting in failed))
        return tuple(out)

    def _schedule(self, snap: Snapshot, now: float) -> None:
        d = self.config.daemon
        if now - self.checks_at >= d["doctor_interval_seconds"] and (
                self.doctor_thread is None or not self.doctor_thread.is_alive()):
            self.checks_at = now
            self.doctor_thread = threading.Thread(target=self._doctor, args=(snap,), name="gpud-doctor", daemon=True)
            self.doctor_thread.start()
        self._reap_probe()
        busy = any(s.processes or (s.utilization_gpu_percent or 0) > 5 for s in snap.samples if not s.lost)
        self.idle_since = None if busy else (self.idle_since or now)
        hours = d["probe_interval_hours"]
        if (hours and self.idle_since is not None and now - self.idle_since >= d["probe_idle_minutes"] * 60
                and now - self.last_probe_start >= hours * 3600 and not self.probe_running()):
            self.start_probe("schedule")

    def _doctor(self, snap: Snapshot) -> None:
        try:
            self.checks = diagnose(self.machine, self.config, snapshot=snap, in_daemon=True).checks
        except Exception as err:  # noqa: BLE001 - a broken check must not stop the daemon
            log.exception("doctor failed: %s", err)

    # -- the probe ----------------------------------------------------------------------
    def probe_running(self) -> bool:
        return self.probe_proc is not None and self.probe_proc.poll() is None

    def start_probe(self, why: str) -> dict[str, Any]:
        if self.probe_running():
            return {"ok": False, "error": "a probe is already running"}
        args = [sys.executable, "-m", "gpud", "probe", "--quick", "--json"]
        if self.config.daemon["probe_world_sizes"]:
            args += ["--world-sizes", ",".join(map(str, self.config.daemon["probe_world_sizes"]))]
        if self.machine.simulation is not None:  # the daemon's machine, simulated too
            args += ["--simulate", self.machine.simulation.description.source]
        self.last_probe_start = time.time()
        out = probe_output_path()
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as f:  # the child keeps its own descriptor
            self.probe_proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
        self.probe_why = why
        log.info("probe started (%s), pid %d", why, self.probe_proc.pid)
        return {"ok": True, "message": f"probe started, pid {self.probe_proc.pid}"}

    def _reap_probe(self) -> None:
        """Log a finished probe's result or failure, and reap it (no zombie)."""
        proc = self.probe_proc
        if proc is None or proc.poll() is None:
            return
        self.probe_proc = None
        why = self.probe_why
        if proc.returncode in (0, 1):
            latest = history.latest() or {}
            said = [s for s in (latest.get("diagnosis") or {}).get("sentences", []) if not s.startswith("CPU run")]
            log.info("probe finished (%s): %s%s", why, "OK" if proc.returncode == 0 else "FAILED",
                     f": {said[0]}" if said else "")
            return
        try:
            lines = [ln for ln in probe_output_path().read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            lines = []
        log.error("probe failed (%s): exit %d%s", why, proc.returncode, f": {lines[-1]}" if lines else "")

    # -- profiles -----------------------------------------------------------------------
    def _load_profile_at_start(self) -> None:
        """Apply the configured profile, else the last applied one: a reboot lost it."""
        name = self.config.daemon["profile"]
        data = tuning_state.load()
        if name is None and data:
            name = data.get("source") or data.get("profile")
        if not name:
            return
        try:
            reply = self.apply(name)
            if not reply["ok"]:
                log.error("profile %s not applied at start: %s", name, reply.get("error"))
            elif reply.get("written"):
                self.reapply_total += int(reply["written"])
                log.info("profile %s applied at start (%d setting(s) written)", self.profile, reply["written"])
        except GpudError as err:
            log.error("profile %s not applied at start: %s", name, err)

    def apply(self, name: str, dry_run: bool = False) -> dict[str, Any]:
        with self.tuning_lock:
            p = load_trusted_profile(name)
            changes, desired = engine.plan(self.machine, p, daemon=True)
            plan = [{"gpu": c.gpu, "setting": c.setting, "current": c.current, "desired": c.desired,
                     "action": c.action, "note": c.note} for c in changes]
            reply: dict[str, Any] = {"ok": True, "profile": p.name, "chain": list(p.chain), "source": p.source,
                                     "plan": plan, "dry_run": dry_run}
            if dry_run:
                return reply
            out = engine.apply(self.machine, p, changes, desired, self.machine.host.cpu_governors())
            reply |= {"ok": out.ok, "applied": out.ok, "error": out.error, "rolled_back": out.rolled_back,
                      "not_restored": out.not_restored, "written": len(out.written)}
            if out.ok:
                self.desired = desired
                self.profile = p.name
                self.fans.configure(desired)
                log.info("profile %s applied", p.name)
            return reply

    def restore(self, fans_only: bool = False) -> dict[str, Any]:
        with self.tuning_lock:
            self.fans.release()
            if not fans_only:
                self.fans.configure({})
                self.desired = {}
                self.profile = None
            else:
                self.fans.configure({})
                for want in self.desired.values():
                    want.pop("fan", None)
            done, failed = engine.restore(self.machine, fans_only=fans_only)
            return {"ok": not failed, "restored": done, "failed": failed}

    # -- requests ------------------------------------------------------------------------
    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        cmd, args = req.get("cmd"), req.get("args") or {}
        try:
            if cmd == "ping":
                return {"ok": True, "pid": os.getpid(), "version": __version__}
            if cmd == "status":
                return {"ok": True, **self.status()}
            if cmd == "apply":
                return self.apply(str(args["profile"]), bool(args.get("dry_run")))
            if cmd == "verify":
                data, drifts = engine.verify(self.machine, daemon=True, snapshot=self.snapshot)
                return {"ok": True, "profile": data.get("profile") if data else None, "applied": data is not None,
                        "settings": [to_jsonable(d) for d in drifts]}
            if cmd == "restore":
                return self.restore(bool(args.get("fans_only")))
            if cmd == "reload":
                return self.reload()
            if cmd == "probe-now":
                return self.start_probe("requested")
        except InvalidInput as err:
            return {"ok": False, "error": str(err), "invalid": True}
        except GpudError as err:
            return {"ok": False, "error": str(err), "remedy": err.remedy}
        except KeyError as err:
            return {"ok": False, "error": f"missing argument {err}"}
        return {"ok": False, "error": f"unknown command {cmd!r} (ping, status, apply, verify, restore, reload, "
                                      "probe-now)"}

    # -- what HTTP serves ------------------------------------------------------------------
    def metrics(self) -> bytes:
        """The exposition of the latest observation, rendered once per observation however many
        scrapers ask (rendering ~1000 series costs milliseconds; the observation changes once a tick)."""
        obs = self.observation
        cached = self._rendered
        if cached is not None and cached[0] is obs:
            return cached[1]
        with self._render_lock:
            cached = self._rendered
            if cached is None or cached[0] is not obs:
                cached = (obs, self.renderer.render(obs))
                self._rendered = cached
        return cached[1]

    def healthy(self) -> tuple[bool, str]:
        if self.last_tick is None:
            return False, "no tick yet"
        age = time.time() - self.last_tick
        limit = max(3 * float(self.config.daemon["interval_seconds"]), 5.0)
        if age > limit:
            return False, f"last tick {age:.1f} s ago (limit {limit:.0f} s)"
        return True, f"ok: last tick {age:.2f} s ago"

    def status(self) -> dict[str, Any]:
        obs = self.observation
        return {"version": __version__, "host": self.machine.label, "uptime_seconds": time.time() - self.started,
                "ticks": self.ticks, "last_tick": self.last_tick, "profile": self.profile,
                "snapshot": to_jsonable(obs.snapshot), "checks": [to_jsonable(c) for c in obs.checks],
                "drift": [{"gpu": g, "setting": s, "drift": d} for g, s, d in obs.drift],
                "reapply_total": self.reapply_total, "fan_failsafe_total": self.fans.failsafes,
                "probe": history.latest(), "probe_running": self.probe_running(), "tick": self.tick_summary()}

    def tick_summary(self) -> dict[str, Any]:
        """Tick period error (actual start-to-start minus the interval): the jitter scrapers cause."""
        interval = float(self.config.daemon["interval_seconds"])
        errors = sorted(abs(p - interval) for p in self.tick_periods)
        if not errors:
            return {}

        def pct(q: float) -> float:
            return errors[min(len(errors) - 1, int(q * len(errors)))]

        return {"periods": len(errors), "interval_seconds": interval, "recent_periods": self.tick_periods[-300:],
                "period_error_p50_seconds": pct(0.5),
                "period_error_p99_seconds": pct(0.99), "period_error_max_seconds": errors[-1],
                "duration_mean_seconds": self.tick_stats.sum / max(1, self.tick_stats.total)}

    def status_line(self) -> str:
        n = len(self.snapshot.samples) if self.snapshot else 0
        lost = sum(1 for s in self.snapshot.samples if s.lost) if self.snapshot else 0
        return f"{n} GPU(s){f', {lost} lost' if lost else ''}, profile {self.profile or 'none'}"


def run(machine: Machine, config: cfg.Config, config_path: str | None) -> int:
    if config_path:
        trusted(config_path, "configuration")
    return Daemon(machine, config, config_path).run()


__all__ = ["Daemon", "run", "trusted"]
