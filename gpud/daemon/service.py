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
import subprocess
import sys
import threading
import time
from typing import Any

from gpud import __version__
from gpud import config as cfg
from gpud.daemon import control, http
from gpud.daemon.recorder import Recorder
from gpud.daemon.systemd import notify, watchdog_seconds
from gpud.doctor import diagnose
from gpud.errors import GpudError, InvalidInput
from gpud.exporter import Observation, Renderer, TickStats
from gpud.hw.machine import Machine
from gpud.journal import Journal
from gpud.model import CheckResult, Snapshot, XidEvent, document, host_json, probe_document, sample_json, to_jsonable
from gpud.paths import LockBusy, TuningLock, control_socket, probe_output_path, trusted
from gpud.probe import history
from gpud.tuning import engine
from gpud.tuning.enforce import DriftMetric, Enforcer
from gpud.tuning.fanloop import FanControl
from gpud.tuning.profile import Profile, load
from gpud.usage import Accounting

log = logging.getLogger("gpud.daemon")
XID_EVERY_S = 10.0


def load_trusted_profile(name: str, peer: control.Peer | None = None) -> Profile:
    if peer is not None and ("/" in name or name.endswith(".toml")) and not peer.may_read(name):
        # Never parse a file for a peer who could not read it: no contents, no parse errors.
        raise GpudError(f"refused: {name} is not readable by uid {peer.uid}; give a profile you can read")
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
        self.enforcer = Enforcer(machine, lambda kind, summary, **kw: self.recorder.profile(kind, summary, **kw))
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
        self.lock = TuningLock("gpud daemon")
        self.endpoints: http.Endpoints | None = None
        self.web: dict[str, Any] = {}
        self.bound: tuple[str, str] = ("", "")  # (listen, socket) actually served
        self.lost: set[int] = set()
        self.accounting = Accounting(max_gap_s=3 * float(config.daemon["interval_seconds"]))
        self.recorder = Recorder(None, None)  # the health journal, opened at start()
        self.overrides: dict[str, Any] = {}  # command-line options: they win over a reloaded file too

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Everything that can refuse to start does so before the hardware is touched: the web
        configuration (exit 2), another daemon holding the tuning lock or the control socket, a
        port in use (exit 1)."""
        d = self.config.daemon
        self.web = http.load_web_config(d["web_config"]) if d["web_config"] else {}
        try:
            self.lock.acquire()
        except LockBusy as busy:
            err = GpudError(f"another gpud holds the tuning lock of {self.lock.path().parent} ({busy.holder}): "
                            "one daemon per machine")
            err.remedy = "stop the other one (`systemctl stop gpud`), or give this one its own GPUD_STATE_DIR"
            raise err from None
        self.endpoints = http.Endpoints(self.metrics, self.healthy, self.status, self.web.get("basic_auth_users"),
                                        (self.web.get("http_server_config") or {}).get("headers"))
        self.http_server = self._bind_http(d["listen"], self.web)
        try:
            self.control_server, _ = control.serve(self.socket_path(), self.handle, d["socket_group"])
        except BaseException:
            self.http_server.shutdown()
            self.http_server.server_close()
            raise
        self.bound = (d["listen"], self.socket_path())
        self._open_journal()
        self._load_profile_at_start()
        try:  # blocking readings (PCIe throughput, processes): a thread off the tick, first round now
            self.machine.nvml.start_sampler(self.stop_event)
        except GpudError as err:
            log.warning("off-tick sampler not started: %s", err)
        self.tick()
        log.info("gpud %s serving %s/metrics, control socket %s, %d GPU(s) of %s, profile %s", __version__,
                 self.url(), self.socket_path(), len(self.snapshot.samples) if self.snapshot else 0,
                 engine.target(self.machine), self.profile or "none")
        notify(f"READY=1\nSTATUS={self.status_line()}")

    def _bind_http(self, listen: str, web: dict[str, Any]) -> http.Server:
        host, port = cfg.parse_listen(listen)
        assert self.endpoints is not None
        try:
            srv, _ = http.serve(host, port, self.endpoints, web.get("tls_server_config"))
        except OSError as err:
            e = GpudError(f"cannot listen on {listen}: {err.strerror or err}")
            e.remedy = (f"another program uses it (`ss -ltnp 'sport = {port}'`): choose another [daemon] listen"
                        if err.errno == 98 else "check the address in [daemon] listen")
            raise e from err
        return srv

    def url(self) -> str:
        assert self.http_server is not None
        host, port = str(self.http_server.server_address[0]), self.http_server.server_address[1]
        scheme = "https" if self.http_server.tls is not None else "http"
        return f"{scheme}://{f'[{host}]' if ':' in str(host) else host}:{port}"

    def socket_path(self) -> str:
        return str(control_socket(self.config.daemon["socket"]))

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
                try:
                    done, failed = engine.restore(self.machine)
                except GpudError as err:
                    failed = [str(err)]
                for line in failed:
                    log.error("restore on stop: %s", line)
        for srv in (self.http_server, self.control_server):
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        control.remove_if_ours(self.bound[1], self.control_server)
        self.lock.release()
        if self.probe_proc is not None and self.probe_proc.poll() is None:
            self.probe_proc.terminate()
            try:
                self.probe_proc.wait(timeout=10)  # reaped: no zombie
            except subprocess.TimeoutExpired:
                self.probe_proc.kill()
                self.probe_proc.wait()
        if self.recorder.journal is not None:
            self.recorder.journal.close()
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
            if self.overrides:
                new = cfg.Config(new.path, new.machine, new.doctor, {**new.daemon, **self.overrides}, new.probe)
            web = http.load_web_config(new.daemon["web_config"]) if new.daemon["web_config"] else {}
        except GpudError as err:
            log.error("reload refused, old configuration kept: %s", err)
            return {"ok": False, "error": f"reload refused, old configuration kept: {err}"}
        notes = self._rebind(new, web)
        self.config = new
        if self.endpoints is not None:
            self.endpoints.set_users(web.get("basic_auth_users"))
            self.endpoints.headers = dict((web.get("http_server_config") or {}).get("headers") or {})
        self.web = web
        msg = f"configuration reloaded from {path}" + "".join(f"; {n}" for n in notes)
        log.info("%s", msg)
        return {"ok": True, "message": msg}

    def _rebind(self, new: cfg.Config, web: dict[str, Any]) -> list[str]:
        """Serve a changed listen address, TLS setting or control socket at once; where the new one
        cannot be had, keep the old and say so (never "reloaded" while serving the old port silently)."""
        notes = []
        listen, sock = new.daemon["listen"], str(control_socket(new.daemon["socket"]))
        tls_changed = (web.get("tls_server_config") or None) != (self.web.get("tls_server_config") or None)
        if listen != self.bound[0] or tls_changed:
            old = self.http_server
            try:
                if listen == self.bound[0] and old is not None:  # same port: TLS changes in place
                    tls = web.get("tls_server_config")
                    old.tls = http.ssl_context(tls) if tls else None
                else:
                    self.http_server = self._bind_http(listen, web)
                    if old is not None:
                        old.shutdown()
                        old.server_close()
                notes.append(f"now serving {self.url()}")
                self.bound = (listen, self.bound[1])
            except GpudError as err:
                notes.append(f"listen unchanged ({self.bound[0]}): {err}")
                new.daemon["listen"] = self.bound[0]
        if sock != self.bound[1]:
            try:
                srv, _ = control.serve(sock, self.handle, new.daemon["socket_group"])
                old_srv, old_path = self.control_server, self.bound[1]
                self.control_server, self.bound = srv, (self.bound[0], sock)
                if old_srv is not None:
                    old_srv.shutdown()
                    old_srv.server_close()
                    control.remove_if_ours(old_path, old_srv)
                notes.append(f"control socket now {sock}")
            except (GpudError, OSError) as err:
                notes.append(f"control socket unchanged ({self.bound[1]}): {err}")
                new.daemon["socket"] = self.bound[1]
        return notes

    # -- the tick -----------------------------------------------------------------------
    def _open_journal(self) -> None:
        """The health journal: a corrupt one is set aside by ``Journal`` itself; anything else leaves
        the daemon running without one."""
        try:
            self.recorder = Recorder(Journal(), self.machine.host.boot_id())
        except Exception as err:  # noqa: BLE001 - a record, never a reason not to drive the fans
            log.error("health journal not opened: %s (events are not kept)", err)

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
            self._log_lost(snap)
            with self.tuning_lock:
                self.fans.step(snap.samples, time.monotonic())  # it logs entering and leaving failsafe
                drift = self._enforce(snap)
            self._schedule(snap, now)
            self.accounting.add(snap)
            self.recorder.snapshot(snap)
        else:
            drift = ()
        self.recorder.fan_failsafes(self.fans.failsafes)
        self.last_tick = now
        self.ticks += 1
        self.tick_stats.observe(time.perf_counter() - t0)
        if now - self.xids_at >= XID_EVERY_S:  # the kernel log is read every few seconds, not every tick
            self.xids_at = now
            self.xids = self.recorder.xid_events(self.machine.host.xid_events())
        self.observation = Observation(
            snapshot=self.snapshot, xids=self.xids, checks=self.checks, profile=self.profile, drift=drift,
            reapply_total=self.enforcer.reapply_total, reapply_failures_total=self.enforcer.reapply_failures_total,
            fan_failsafe_total=self.fans.failsafes, probe=self.probe_result(),
            nvml_errors=dict(self.machine.nvml.errors), tick=self._tick_copy(), last_tick=now,
            usage=self.accounting.frozen())

    def _log_lost(self, snap: Snapshot) -> None:
        """A lost GPU is logged when it is lost and when it is back, not on every tick."""
        lost = {s.index for s in snap.samples if s.lost}
        for gpu in sorted(lost - self.lost):
            log.error("GPU %d is lost (fell off the bus or needs a reset): `dmesg | grep -i xid`", gpu)
        for gpu in sorted(self.lost - lost):
            log.warning("GPU %d answers again", gpu)
        self.lost = lost

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

    def _enforce(self, snap: Snapshot) -> DriftMetric:
        return self.enforcer.enforce(snap)  # gpud.tuning.enforce: drift, re-apply, what still differs

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
            self.recorder.check_results(self.checks)
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
            self.recorder.probe(latest, proc.returncode == 0, why)
            return
        try:
            lines = [ln for ln in probe_output_path().read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            lines = []
        log.error("probe failed (%s): exit %d%s", why, proc.returncode, f": {lines[-1]}" if lines else "")
        self.recorder.probe({"diagnosis": {"sentences": lines[-1:]}}, False, why)

    # -- profiles -----------------------------------------------------------------------
    def _load_profile_at_start(self) -> None:
        """Apply the configured profile, else the last applied one: a reboot lost it."""
        name = self.config.daemon["profile"]
        try:
            data = engine.read_state(self.machine)
        except GpudError as err:
            log.error("no profile applied at start: %s — remedy: %s", err, err.remedy)
            return
        if name is None and data:
            name = data.source or data.profile
        if not name:
            return
        try:
            reply = self.apply(name)
            if not reply["ok"]:
                log.error("profile %s not applied at start: %s", name, reply.get("error"))
            elif reply.get("written"):
                self.enforcer.reapply_total += int(reply["written"])
                log.info("profile %s applied at start (%d setting(s) written)", self.profile, reply["written"])
        except GpudError as err:
            log.error("profile %s not applied at start: %s", name, err)

    def apply(self, name: str, dry_run: bool = False, peer: control.Peer | None = None) -> dict[str, Any]:
        with self.tuning_lock:
            p = load_trusted_profile(name, peer)
            changes, desired = engine.plan(self.machine, p, daemon=True)
            reply: dict[str, Any] = {"ok": True, "profile": p.name, "chain": list(p.chain), "source": p.source,
                                     "plan": [c.as_dict() for c in changes], "dry_run": dry_run,
                                     "target": engine.target(self.machine)}
            if dry_run:
                return reply
            out = engine.apply(self.machine, p, changes, desired, self.machine.host.cpu_governors())
            reply |= out.as_dict()
            if out.ok:
                desired = engine.unsupported_removed(desired, out)  # neither enforced nor verified
                self.desired = desired
                self.enforcer.follow(p.name, desired, p.host)
                self.profile = p.name
                self.fans.configure(desired)
                log.info("profile %s applied", p.name)
                who = f"uid {peer.uid} (pid {peer.pid})" if peer is not None else "the daemon"
                self.recorder.profile("profile_apply", f"profile {p.name} applied by {who}", profile=p.name,
                                      uid=peer.uid if peer else None, written=len(out.written))
            return reply

    def restore(self, fans_only: bool = False, peer: control.Peer | None = None) -> dict[str, Any]:
        with self.tuning_lock:
            self.fans.release()
            if not fans_only:
                self.fans.configure({})
                self.desired = {}
                self.profile = None
                self.enforcer.follow(None, {})
            else:
                self.fans.configure({})
                for want in self.desired.values():
                    want.pop("fan", None)
                self.enforcer.forget("fan")
            done, failed = engine.restore(self.machine, fans_only=fans_only)
            who = f"uid {peer.uid} (pid {peer.pid})" if peer is not None else "the daemon"
            self.recorder.profile("profile_restore", f"{'fans' if fans_only else 'settings'} restored by {who}"
                                  + (f"; failed: {failed}" if failed else ""), uid=peer.uid if peer else None,
                                  fans_only=fans_only)
            return {"ok": not failed, "restored": done, "failed": failed}

    # -- requests ------------------------------------------------------------------------
    def handle(self, req: dict[str, Any], peer: control.Peer | None = None) -> dict[str, Any]:
        why = control.check_request(req)
        if why is not None:
            return {"ok": False, "error": f"bad request: {why}"}
        cmd, args = req.get("cmd"), req.get("args") or {}
        try:
            if cmd == "ping":
                return {"ok": True, "pid": os.getpid(), "version": __version__, "target": engine.target(self.machine)}
            if cmd == "status":
                return {"ok": True, **self.status(full=True)}
            if cmd == "apply":
                return self.apply(str(args["profile"]), bool(args.get("dry_run")), peer)
            if cmd == "verify":
                data, drifts = engine.verify(self.machine, daemon=True, snapshot=self.snapshot)
                return {"ok": True, "profile": data.profile if data else None, "applied": data is not None,
                        "settings": [to_jsonable(d) for d in drifts]}
            if cmd == "restore":
                return self.restore(bool(args.get("fans_only")), peer)
            if cmd == "reload":
                return self.reload()
            if cmd == "probe-now":
                return self.start_probe("requested")
        except InvalidInput as err:
            if peer is not None and peer.uid != 0 and err.file and not peer.may_read(err.file):
                return {"ok": False, "error": "refused: the profile's files are not readable by this user"}
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

    def show_processes(self) -> bool:
        """Whether /status may name users and command lines: ``[daemon] status_processes``."""
        mode = self.config.daemon["status_processes"]
        return mode == "always" or (mode == "protected" and http.protected(self.web))

    def status(self, full: bool = False) -> dict[str, Any]:
        obs = self.observation
        snap = obs.snapshot
        infos = {g.index: g for g in snap.gpus} if snap is not None else {}
        gpus = [{"info": to_jsonable(infos.get(x.index)), "sample": sample_json(x)}
                for x in (snap.samples if snap is not None else ())]
        if not full and not self.show_processes():
            for g in gpus:
                for proc in g["sample"].get("processes") or []:
                    proc["user"] = proc["command"] = proc["container"] = None
        if not hasattr(self, "_host_facts"):  # read once: /status never reads files per request
            self._host_facts = (self.machine.host.cpu_info(), self.machine.host.memory_total_bytes())
        where = host_json(self.machine.label, snap.versions if snap is not None else None,
                          len(snap.samples) if snap is not None else None, *self._host_facts)
        last = history.latest()
        return document("daemon_status", __version__, where, uptime_seconds=time.time() - self.started,
                        ticks=self.ticks, last_tick=self.last_tick, profile=self.profile,
                        timestamp=snap.timestamp if snap is not None else None, gpus=gpus,
                        checks=[to_jsonable(c) for c in obs.checks],
                        drift=[{"gpu": g, "setting": s, "drift": d} for g, s, d in obs.drift],
                        reapply_total=self.enforcer.reapply_total, fan_failsafe_total=self.fans.failsafes,
                        probe=probe_document(last, __version__, host_json(last.get("host"))) if last else None,
                        probe_running=self.probe_running(), tick=self.tick_summary())

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


def run(machine: Machine, config: cfg.Config, config_path: str | None,
        overrides: dict[str, Any] | None = None) -> int:
    if config_path:
        trusted(config_path, "configuration")
    d = Daemon(machine, config, config_path)
    d.overrides = dict(overrides or {})
    return d.run()


__all__ = ["Daemon", "run", "trusted"]
