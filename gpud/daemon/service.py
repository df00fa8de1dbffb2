"""``gpud daemon``: the life cycle of the service — start, run, reload, shutdown, signals, sd_notify.

One tick per interval (``gpud.daemon.tick``): read one snapshot, drive the fan curves, enforce the
applied profile (re-applying what a driver reload, a reboot or someone else undid, counted), publish
one immutable observation for the scrapers. Doctor's cheap checks run every few minutes and the
training probe on a schedule (``gpud.daemon.schedule``), in background threads/child processes, so
neither delays a tick. Control requests are dispatched through ``gpud.daemon.requests.REQUESTS``;
``/status``, ``/healthz`` and ``/metrics`` come from ``gpud.daemon.status``.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpud import __version__
from gpud import config as cfg
from gpud.daemon import control, http
from gpud.daemon.peer import Peer
from gpud.daemon.recorder import Recorder
from gpud.daemon.requests import REQUESTS
from gpud.daemon.rules import ProfileRules
from gpud.daemon.schedule import Schedule
from gpud.daemon.status import Report, healthy
from gpud.daemon.systemd import notify, watchdog_seconds
from gpud.daemon.tick import Pace, Ticker, TuningFacts
from gpud.daemon.wake import Stop
from gpud.doctor import configcheck, health
from gpud.errors import GpudError, InvalidInput
from gpud.hw.machine import Machine
from gpud.journal import Journal
from gpud.model import Snapshot
from gpud.observation import Counters, Observation
from gpud.observe import Drift
from gpud.paths import LockBusy, TuningLock, control_socket
from gpud.profiles import engine
from gpud.profiles import state as st
from gpud.profiles.enforce import DriftMetric, Enforcer
from gpud.profiles.fanloop import FanControl
from gpud.profiles.profile import Profile, load
from gpud.profiles.session import LocalSession

log = logging.getLogger("gpud.daemon")


def load_trusted_profile(name: str, peer: Peer | None = None) -> Profile:
    if peer is not None and ("/" in name or name.endswith(".toml")) and not peer.may_read(name):
        # Never parse a file for a peer who could not read it: no contents, no parse errors.
        raise GpudError(f"refused: {name} is not readable by uid {peer.uid}; give a profile you can read")
    # ``load`` opens each file of the chain once and checks that descriptor before parsing it (as root:
    # owned by root, not writable by others, no symbolic link, directories only root can change).
    return load(name)


class Settings:
    """The configuration in force, the file it came from and the command line's options (which win
    over a reloaded file too)."""

    def __init__(self, config: cfg.Config, path: str | None, overrides: dict[str, Any] | None) -> None:
        self.config = config
        self.path = path
        self.overrides = dict(overrides or {})

    def reread(self) -> tuple[cfg.Config, dict[str, Any], str] | None:
        """(configuration, web configuration, file) read again; None when there is no file.
        GpudError when either is invalid."""
        if not self.path and not os.environ.get("GPUD_CONFIG") and not cfg.DEFAULT_PATH.is_file():
            return None
        path = self.path or os.environ.get("GPUD_CONFIG") or str(cfg.DEFAULT_PATH)
        new = cfg.load(path)  # checked on the descriptor it is read from (gpud.paths.read_trusted)
        if self.overrides:
            new = new.with_daemon(**self.overrides)
        web = http.load_web_config(new.daemon.web_config) if new.daemon.web_config else {}
        return new, web, path


class Front:
    """What the daemon holds towards the outside: the tuning lock (one daemon per machine), the HTTP
    endpoint and the control socket, and the web configuration they serve under."""

    def __init__(self, handle: Callable[[dict[str, Any], Peer], dict[str, Any]]) -> None:
        self.lock = TuningLock("gpud daemon")
        self.handle = handle
        self.web: dict[str, Any] = {}
        self.endpoints: http.Endpoints | None = None
        self.http_server: http.Server | None = None
        self.control_server: Any = None
        self.bound: tuple[str, str] = ("", "")  # (listen, socket) actually served

    def open(self, d: cfg.DaemonSection, socket_path: str, metrics: Callable[[], bytes],
             healthy: Callable[[], tuple[bool, str]], status: Callable[..., dict[str, Any]]) -> None:
        """Everything that can refuse to start does so here, before the hardware is touched: the web
        configuration (exit 2), another daemon holding the tuning lock or the control socket, a port
        in use (exit 1)."""
        self.web = http.load_web_config(d.web_config) if d.web_config else {}
        try:
            self.lock.acquire()
        except LockBusy as busy:
            err = GpudError(f"another gpud holds the tuning lock of {self.lock.path().parent} ({busy.holder}): "
                            "one daemon per machine")
            err.remedy = "stop the other one (`systemctl stop gpud`), or give this one its own GPUD_STATE_DIR"
            raise err from None
        self.endpoints = http.Endpoints(metrics, healthy, status, self.web.get("basic_auth_users"),
                                        (self.web.get("http_server_config") or {}).get("headers"))
        self.http_server = self._bind_http(d.listen, self.web)
        try:
            self.control_server, _ = control.serve(socket_path, self.handle, d.socket_group)
        except BaseException:
            self.http_server.shutdown()
            self.http_server.server_close()
            raise
        self.bound = (d.listen, socket_path)

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

    def rebind(self, new: cfg.Config, web: dict[str, Any]) -> tuple[list[str], cfg.Config]:
        """Serve a changed listen address, TLS setting or control socket at once; where the new one
        cannot be had, keep the old and say so (never "reloaded" while serving the old port silently).
        Returns the notes and ``new`` with what is still served."""
        notes = []
        listen, sock = new.daemon.listen, str(control_socket(new.daemon.socket))
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
                new = new.with_daemon(listen=self.bound[0])
        if sock != self.bound[1]:
            try:
                srv, _ = control.serve(sock, self.handle, new.daemon.socket_group)
                old_srv, old_path = self.control_server, self.bound[1]
                self.control_server, self.bound = srv, (self.bound[0], sock)
                if old_srv is not None:
                    old_srv.shutdown()
                    old_srv.server_close()
                    control.remove_if_ours(old_path, old_srv)
                notes.append(f"control socket now {sock}")
            except (GpudError, OSError) as err:
                notes.append(f"control socket unchanged ({self.bound[1]}): {err}")
                new = new.with_daemon(socket=self.bound[1])
        return notes, new

    def use_web(self, web: dict[str, Any]) -> None:
        """A reloaded web configuration: its users and headers from the next request on."""
        if self.endpoints is not None:
            self.endpoints.set_users(web.get("basic_auth_users"))
            self.endpoints.headers = dict((web.get("http_server_config") or {}).get("headers") or {})
        self.web = web

    def close(self) -> None:
        for srv in (self.http_server, self.control_server):
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        control.remove_if_ours(self.bound[1], self.control_server)
        self.lock.release()


class Daemon:
    """Composes the parts: ``Front`` (lock, HTTP, control socket), ``Ticker`` (the tick),
    ``Schedule`` (doctor, probe), ``Report`` (what HTTP serves), the health journal's ``Recorder``,
    and the tuning enforcement (fans, desired settings, applied profile) under ``tuning_lock``."""

    def __init__(self, machine: Machine, config: cfg.Config, config_path: str | None = None,
                 overrides: dict[str, Any] | None = None) -> None:
        self.machine = machine
        self.session = LocalSession(machine, in_daemon=True)  # apply, verify, restore: the engine's, here
        self.settings = Settings(config, config_path, overrides)
        self.stop_event = Stop()
        # tuning enforcement: apply/restore and the tick's fan and drift work, under one lock
        self.tuning_lock = threading.RLock()
        self.fans = FanControl(machine)
        self.recorder = Recorder(None, None)  # the health journal, opened at start()
        self.enforcer = Enforcer(machine, lambda kind, summary, **kw: self.recorder.profile(kind, summary, **kw))
        self.schedule = Schedule(machine, lambda: self.config, lambda: self.recorder)
        self.ticker = Ticker(machine, self._drive, self._tuning_facts, self.schedule, lambda: self.recorder,
                             float(config.daemon.interval_seconds), whole_wanted=lambda: self.enforcer.changed)
        self._drift: Drift = ()  # the enforcement's last drift, until the next whole snapshot
        self.front = Front(self.handle)
        self.report = Report(machine)
        # [[rules]]: a thread polls the GPUs' processes and switches the GPUs whose rule changed
        self.rules = ProfileRules(self.session, self.tuning_lock, self.enforcer, self.fans, lambda: self.recorder,
                                  lambda: self.config, load_trusted_profile)

    # The parts' state, read through the daemon by its own methods, the request handlers (``Served``) and the
    # HTTP front.
    @property
    def profile(self) -> str | None:
        """The profile the daemon applied and enforces (the enforcer holds it)."""
        return (self.enforcer.state.profile or None) if self.enforcer.state is not None else None

    @property
    def config(self) -> cfg.Config:
        return self.settings.config

    @config.setter
    def config(self, value: cfg.Config) -> None:
        self.settings.config = value

    @property
    def web(self) -> dict[str, Any]:
        return self.front.web

    @web.setter
    def web(self, value: dict[str, Any]) -> None:
        self.front.web = value

    @property
    def snapshot(self) -> Snapshot | None:
        return self.ticker.snapshot

    @property
    def observation(self) -> Observation:
        return self.ticker.observation

    # -- life cycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Everything that can refuse to start does so before the hardware is touched (``Front.open``)."""
        self.front.open(self.config.daemon, self.socket_path(), self.metrics, self.healthy, self.status)
        note = configcheck.group_note(self.config)
        if note:
            log.warning("%s", note)
        self._open_journal()
        self.rules.at_start()  # GPUs a killed daemon left on a rule's profile: back to their originals first
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

    def url(self) -> str:
        return self.front.url()

    def socket_path(self) -> str:
        return str(control_socket(self.config.daemon.socket))

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=self.reload).start())
        self.start()
        interval = float(self.config.daemon.interval_seconds)
        wd = watchdog_seconds()
        settle_gc()
        pace = Pace(time.monotonic(), interval)  # the tick and the rules' poll, one loop (no thread of their own)
        poll_s = self.rules.poll_every()
        while not self.stop_event.wait(pace.sleep_s(time.monotonic(), poll_s)):
            tick, poll = pace.due(time.monotonic(), interval, poll_s)
            if tick:
                self.tick()
                if wd is not None:
                    notify("WATCHDOG=1")
                if self.ticker.timing.ticks % 10 == 0:
                    notify(f"STATUS={self.status_line()}")
            if poll:
                self.rules.poll()
            interval = float(self.config.daemon.interval_seconds)
            poll_s = self.rules.poll_every()
        return self.shutdown()

    def shutdown(self) -> int:
        notify("STOPPING=1")
        with self.tuning_lock:
            self.rules.stop()  # no daemon, no switch back: a rule's GPUs go back to the base now
            self.fans.release()  # fans back to the driver first, whatever else happens
            if self.config.daemon.restore_on_stop:
                try:
                    done, failed = engine.restore(self.machine)
                except GpudError as err:
                    failed = [str(err)]
                for line in failed:
                    log.error("restore on stop: %s", line)
        self.front.close()
        self.schedule.stop_probe()
        if self.recorder.journal is not None:
            self.recorder.journal.close()
        log.info("stopped")
        return 0

    def reload(self) -> dict[str, Any]:
        """SIGHUP: read the configuration again; an invalid one is refused and the old kept."""
        try:
            got = self.settings.reread()
        except GpudError as err:
            log.error("reload refused, old configuration kept: %s", err)
            return {"ok": False, "error": f"reload refused, old configuration kept: {err}"}
        if got is None:
            return {"ok": True, "message": "no configuration file: defaults kept"}
        new, web, path = got
        try:
            configcheck.check(new, len(self.machine.host.nvidia_gpus()))
        except GpudError as err:
            log.error("reload refused, old configuration kept: %s", err)
            return {"ok": False, "error": f"reload refused, old configuration kept: {err}"}
        notes, new = self.front.rebind(new, web)
        self.config = new
        self.front.use_web(web)
        msg = f"configuration reloaded from {path}" + "".join(f"; {n}" for n in notes)
        log.info("%s", msg)
        return {"ok": True, "message": msg}

    def _open_journal(self) -> None:
        """The health journal: a corrupt one is set aside by ``Journal`` itself; anything else leaves
        the daemon running without one."""
        try:
            self.recorder = Recorder(Journal(), self.machine.host.boot_id())
        except Exception as err:  # noqa: BLE001 - a record, never a reason not to drive the fans
            log.error("health journal not opened: %s (events are not kept)", err)

    # -- the tick -----------------------------------------------------------------------
    def tick(self) -> None:
        self.ticker()

    def _drive(self, snap: Snapshot | None, why: str, whole: bool = True) -> Drift:
        """The tick's hardware work, under the lock apply/restore take: without a snapshot every fan
        goes to its failsafe (no temperature at all: none may stay manual); with one, the fan loop
        steps (it logs entering and leaving failsafe) and, when the snapshot is whole, the applied
        profile is enforced (a quick tick's held limits and clocks are not compared: the last drift stands)."""
        with self.tuning_lock:
            if snap is None:
                self.fans.failsafe_all(why)
                return ()
            for ev in self.fans.step(snap.samples, time.monotonic()):
                if ev.kind == "reapply":  # counted and journalled as the enforcer's re-applies are
                    self.enforcer.reapply_total += 1
                    self.recorder.profile("profile_reapply", f"GPU {ev.gpu}: {ev.detail} (profile {self.profile})",
                                          ev.gpu, drifted=["fan"], failed=[])
            if whole:
                self._drift = self._enforce(snap)
            return self._drift

    def _tuning_facts(self) -> TuningFacts:
        return TuningFacts(self.profile, self.counters(), self.rules.profiles())

    def counters(self) -> Counters:
        """The running counts, for the metrics and ``/status``."""
        return Counters(self.enforcer.reapply_total, self.enforcer.reapply_failures_total, self.fans.failsafes)

    def _enforce(self, snap: Snapshot) -> DriftMetric:
        return self.enforcer.enforce(snap)  # gpud.profiles.enforce: drift, re-apply, what still differs

    # -- profiles -----------------------------------------------------------------------
    def _load_profile_at_start(self) -> None:
        """Apply the configured profile, else the last applied one: a reboot lost it."""
        name = self.config.daemon.profile
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

    def apply(self, name: str, dry_run: bool = False, peer: Peer | None = None,
              rules: bool = False) -> dict[str, Any]:
        """Apply a profile. By a person (``peer``): the rules pause until ``gpud restore`` or ``gpud apply
        --rules``; by the daemon, or with ``rules``: it becomes the base profile the rules switch from."""
        with self.tuning_lock:
            p = load_trusted_profile(name, peer)
            if not dry_run:
                if peer is not None and not rules:
                    self.rules.pause(f"profile {p.name} applied by uid {peer.uid} (pid {peer.pid})")
                else:
                    self.rules.release()
            res = replace(self.session.apply(p, dry_run), daemon=True)
            if res.ok and not dry_run:  # what the driver said it cannot take is neither enforced nor verified
                self.enforcer.follow(p.name, res.desired, res.host)
                self.fans.configure(res.desired)
                self.rules.base = name if peer is None or rules else None
                if rules:
                    self.rules.resume(f"profile {p.name} applied as the base by uid "
                                      f"{peer.uid if peer else os.getuid()}")
                log.info("profile %s applied", p.name)
                who = f"uid {peer.uid} (pid {peer.pid})" if peer is not None else "the daemon"
                self.recorder.profile("profile_apply", f"profile {p.name} applied by {who}", profile=p.name,
                                      uid=peer.uid if peer else None, written=res.written)
            return res.to_json()

    def resume_rules(self, profile: str | None = None, peer: Peer | None = None) -> dict[str, Any]:
        """``gpud apply --rules [PROFILE]``: the rules switch again, from PROFILE as the base (else the
        configured ``[daemon] profile``, else the profile applied now)."""
        name = profile or self.config.daemon.profile or self.rules.base or self.profile
        if name:
            return self.apply(name, peer=peer, rules=True)
        with self.tuning_lock:
            who = f"uid {peer.uid} (pid {peer.pid})" if peer is not None else "the daemon"
            self.rules.resume(f"asked by {who}, no base profile")
        return {"ok": True, "profile": None, "plan": [], "written": 0,
                "target": engine.target(self.machine)}

    def restore(self, fans_only: bool = False, peer: Peer | None = None,
                gpus: list[int] | None = None) -> dict[str, Any]:
        if gpus is not None and not fans_only:
            return self._restore_gpus(gpus, peer)
        with self.tuning_lock:
            self.fans.release()
            if not fans_only:
                self.fans.configure({})
                self.enforcer.follow(None, {})
            else:
                self.fans.configure({})
                self.enforcer.forget("fan")
            res = self.session.restore(fans_only)
            who = f"uid {peer.uid} (pid {peer.pid})" if peer is not None else "the daemon"
            if not fans_only:
                self.rules.base = None
                self.rules.resume(f"settings restored by {who}")
            self.recorder.profile("profile_restore", f"{'fans' if fans_only else 'settings'} restored by {who}"
                                  + (f"; failed: {list(res.failed)}" if res.failed else ""),
                                  uid=peer.uid if peer else None, fans_only=fans_only)
            return res.to_json()

    def _restore_gpus(self, gpus: list[int], peer: Peer | None) -> dict[str, Any]:
        """A Slurm job's GPUs put back (``gpud doctor --epilog``): the others keep their profile, enforced and
        with their fan curves, as the state file still holds it; the rules go on as they were."""

        with self.tuning_lock:
            res = self.session.restore(gpus=gpus)
            data = st.load()
            desired = data.gpu_desired() if data is not None else {}
            self.enforcer.follow(data.profile if data is not None and desired else None, desired,
                                 dict(data.desired.get("host") or {}) if data is not None else None)
            self.fans.configure(desired)
            who = f"uid {peer.uid} (pid {peer.pid})" if peer is not None else "the daemon"
            self.recorder.profile("profile_restore", f"GPU {','.join(map(str, gpus))} restored by {who}"
                                  + (f"; failed: {list(res.failed)}" if res.failed else ""),
                                  uid=peer.uid if peer else None, fans_only=False)
            return res.to_json()

    # -- requests ------------------------------------------------------------------------
    def set_healthy(self, gpu: str, reason: str, peer: Peer | None = None) -> dict[str, Any]:
        """``gpud health set-healthy``: the journal's entry (who: the peer; why), then the states again."""

        text = health.check_reason(reason)
        snap = self.snapshot
        sample = next((s for s in snap.samples if gpu in (s.uuid, str(s.index))), None) if snap else None
        if sample is None:
            return {"ok": False, "error": f"no GPU {gpu!r} on this machine"}
        who = control.user_name(peer.uid) if peer is not None else "the daemon"
        summary, data = health.set_healthy_entry(self.observation.health, sample.index, who,
                                                 peer.uid if peer else None, text)
        j = self.recorder.journal
        if j is None or not j.record("set_healthy", summary, gpu=sample.index, uuid=sample.uuid,
                                     boot_id=self.recorder.boot_id, data=data):
            return {"ok": False, "error": "the health journal could not be written: the entry was not kept"}
        self.ticker.health.invalidate()
        return {"ok": True, "summary": summary}

    def start_probe(self, why: str) -> dict[str, Any]:
        return self.schedule.start_probe(why)

    def handle(self, req: dict[str, Any], peer: Peer | None = None) -> dict[str, Any]:
        """One control request, through the dispatch table (``REQUESTS``); gpud's errors become replies."""
        why = control.check_request(req)  # the one check of a request's shape, the socket's and any caller's
        if why is not None:
            return {"ok": False, "error": f"bad request: {why}"}
        request, args = REQUESTS[req["cmd"]], req.get("args") or {}
        try:
            return request.handler(self, args, peer)
        except InvalidInput as err:
            if peer is not None and peer.uid != 0 and err.file and not peer.may_read(err.file):
                return {"ok": False, "error": "refused: the profile's files are not readable by this user"}
            # the parts themselves: a reason may hold ": " too, and the client raises the same InvalidInput
            return {"ok": False, "error": str(err), "invalid": {"file": err.file, "key": err.key, "reason": err.reason}}
        except GpudError as err:
            return {"ok": False, "error": str(err), "remedy": err.remedy}
        except KeyError as err:
            return {"ok": False, "error": f"missing argument {err}"}

    # -- what HTTP serves ------------------------------------------------------------------
    def metrics(self) -> bytes:
        return self.report.metrics(self.observation)

    def healthy(self) -> tuple[bool, str]:
        """``/healthz``, by the last tick whose readings ``/metrics`` and ``/status`` serve (left whole at the tick's
        end, ``Ticker.last_tick``), not by the tick's timing: "ok" never answers before the first tick's figures
        can be scraped. No observation is made for it (a kubelet asks every 5 s)."""
        return healthy(self.ticker.last_tick, float(self.config.daemon.interval_seconds))

    def show_processes(self) -> bool:
        """Whether /status may name users and command lines: ``[daemon] status_processes``."""
        mode = self.config.daemon.status_processes
        return mode == "always" or (mode == "protected" and http.protected(self.web))

    def status(self, full: bool = False) -> dict[str, Any]:
        return self.report.status(self.observation, self.ticker.timing, self.tick_summary(),
                                  show_processes=full or self.show_processes(), profile=self.profile,
                                  counters=self.counters(),
                                  probe_running=self.schedule.probe_running())

    def tick_summary(self) -> dict[str, Any]:
        return self.ticker.timing.summary(float(self.config.daemon.interval_seconds))

    def status_line(self) -> str:
        n = len(self.snapshot.samples) if self.snapshot else 0
        lost = sum(1 for s in self.snapshot.samples if s.lost) if self.snapshot else 0
        return f"{n} GPU(s){f', {lost} lost' if lost else ''}, profile {self.profile or 'none'}"


# The collector's first threshold for the running daemon: a young-generation collection every 10 000 net
# allocations of container objects instead of CPython's 700 (about one a second at 1 s ticks, each run cold).
GC_YOUNG_THRESHOLD = 10_000


def settle_gc() -> None:
    """The daemon's objects after start-up (modules, the simulator or NVML's bindings, the configuration, the
    first observation) are kept for its whole life: ``gc.freeze`` moves them out of the collector's sight, so a
    full collection does not walk them again (the standard library's own advice for long-lived processes), and
    young collections come less often. What a tick allocates is freed by reference counting; the collector only
    finds cycles, and ten thousand allocations hold at most a few MiB of them."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def run(machine: Machine, config: cfg.Config, config_path: str | None,
        overrides: dict[str, Any] | None = None) -> int:
    # ``config`` was read by ``cfg.load``, which checks the descriptor it reads (a check of the path
    # here, after the read, would check a file that may no longer be the one read).
    return Daemon(machine, config, config_path, overrides).run()


__all__ = ["Daemon", "run"]
