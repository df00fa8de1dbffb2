"""The daemon as it runs under systemd: exporter, fan control, enforcement, signals, control socket."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, run_gpud
from daemon_helpers import METRICS, RunningDaemon

from gpud.backends import open_machine
from gpud.daemon.control import request
from gpud.probe.torchrun import torch_available


def promtool() -> str | None:
    path = shutil.which("promtool")
    if path is None and os.environ.get("CI") == "true":
        pytest.fail("promtool is missing (Debian's prometheus package)")
    return path


@pytest.fixture
def daemon(tmp_path: Path, state_dir):
    d = RunningDaemon(tmp_path, config='profile = "training"\n')
    yield d
    d.stop(signal.SIGKILL)


def _sim():
    return open_machine("z8-fury-4x-a6000").simulation.machine


def test_metrics_carry_every_metric_for_four_gpus_and_pass_promtool(daemon: RunningDaemon) -> None:
    if torch_available():  # the probe's metrics come from a real probe run, started over the socket
        reply = request(daemon.sock, "probe-now")
        assert reply and reply["ok"], reply
        daemon.wait_for(lambda: daemon.value("gpud_probe_success") is not None, 120, "the probe's metrics")
    daemon.wait_for(lambda: "gpud_check_status{" in daemon.metrics(), 15, "doctor's checks")
    body = daemon.metrics()
    names = {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line and not line.startswith("#")}
    expected = [m for m in METRICS if torch_available() or not m.startswith("gpud_probe_")]
    missing = [m for m in expected if m not in names]
    assert not missing, missing
    for gpu in range(4):
        assert daemon.value("gpud_gpu_up", gpu=str(gpu)) == 1
        assert daemon.value("gpud_gpu_fan_manual", gpu=str(gpu)) == 1  # the training curve drives the fans
    assert daemon.value("gpud_profile_info", profile="training") == 1
    tool = promtool()
    if tool:
        r = subprocess.run([tool, "check", "metrics"], input=body, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr
    code, text = daemon.get("/healthz")
    assert code == 200 and text.startswith("ok")
    code, text = daemon.get("/status")
    status = json.loads(text)
    assert status["profile"] == "training" and len(status["gpus"]) == 4
    assert daemon.get("/nope")[0] == 404


def test_gpu_lost_mid_run(daemon: RunningDaemon) -> None:
    daemon.wait_for(lambda: daemon.value("gpud_gpu_fan_manual", gpu="2") == 1, 5, "GPU2's fan under control")
    r = run_gpud("sim", "inject", "gpu_lost", "gpu=2", env={"GPUD_SIMULATE": "z8-fury-4x-a6000"})
    assert r.returncode == 0, r.stderr
    daemon.wait_for(lambda: daemon.value("gpud_gpu_up", gpu="2") == 0, 5, "gpud_gpu_up{gpu=2} 0")
    assert daemon.get("/healthz")[0] == 200  # still serving
    for gpu in (0, 1, 3):
        assert daemon.value("gpud_gpu_fan_manual", gpu=str(gpu)) == 1  # the others stay under control
    assert _sim().settings(2)["fans"][0]["policy"] == 0  # GPU2's fan is automatic again
    assert daemon.value("gpud_fan_failsafe_total") >= 1


def test_temperature_read_failure_triggers_the_failsafe(daemon: RunningDaemon) -> None:
    daemon.wait_for(lambda: _sim().settings(1)["fans"][0]["policy"] == 1, 5, "GPU1's fan manual")
    sim = _sim()
    ticks = daemon.value("gpud_tick_duration_seconds_count") or 0
    sim.inject("unsupported", call="nvmlDeviceGetTemperature", gpu=1)
    daemon.wait_for(lambda: _sim().settings(1)["fans"][0]["policy"] == 0, 5, "GPU1's fan automatic")
    # the simulator's state reaches the daemon within 0.25 s, then the failsafe acts in the tick that reads
    # it, not at the slow readings' refresh (10 s: 50 ticks). Counted in the daemon's ticks, not in seconds:
    # this test's own inject and polls stretch under load (7-13 ticks measured at load 13 on 2 cores).
    assert (daemon.value("gpud_tick_duration_seconds_count") or 0) - ticks <= 20
    assert _sim().settings(0)["fans"][0]["policy"] == 1
    daemon.wait_for(lambda: (daemon.value("gpud_fan_failsafe_total") or 0) >= 1, 3, "the failsafe counted")


def test_sigterm_exits_0_fast_with_fans_automatic(daemon: RunningDaemon) -> None:
    daemon.wait_for(lambda: all(_sim().settings(i)["fans"][0]["policy"] == 1 for i in range(4)), 5, "fans manual")
    code, seconds = daemon.stop(signal.SIGTERM)
    assert code == 0 and seconds < 2.0, (code, seconds, daemon.logs())
    assert all(_sim().settings(i)["fans"][0]["policy"] == 0 for i in range(4))
    assert not os.path.exists(daemon.sock)


def test_sigkill_then_restore_fans_only(daemon: RunningDaemon) -> None:
    daemon.wait_for(lambda: all(_sim().settings(i)["fans"][0]["policy"] == 1 for i in range(4)), 5, "fans manual")
    code, _ = daemon.stop(signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert all(_sim().settings(i)["fans"][0]["policy"] == 1 for i in range(4))  # left manual by the crash
    r = run_gpud("restore", "--fans-only", env={"GPUD_SIMULATE": "z8-fury-4x-a6000", "GPUD_SOCKET": daemon.sock})
    assert r.returncode == 0, r.stderr
    assert all(_sim().settings(i)["fans"][0]["policy"] == 0 for i in range(4))


def test_apply_through_the_socket_switches_profile_without_restart(daemon: RunningDaemon) -> None:
    env = {"GPUD_SOCKET": daemon.sock, "GPUD_SIMULATE": "z8-fury-4x-a6000"}
    pid = daemon.proc.pid
    r = run_gpud("apply", "quiet", env=env)
    assert r.returncode == 0, r.stderr
    assert "applied quiet by the gpud daemon" in r.stdout
    daemon.wait_for(lambda: daemon.value("gpud_profile_info", profile="quiet") == 1, 5, "profile quiet")
    assert daemon.proc.pid == pid and daemon.proc.poll() is None
    assert _sim().settings(0)["power_limit_mw"] == 240000
    r = run_gpud("verify", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["profile"] == "quiet"


def test_an_invalid_profile_through_the_socket_is_the_same_invalid_input_in_the_client(daemon: RunningDaemon,
                                                                                     tmp_path: Path) -> None:
    """The daemon sends an InvalidInput's file, key and reason apart, and the CLI raises the same one (exit 2): a
    reason that holds ": " itself (a curve "not monotonic: …") is not cut there. A daemon older than its
    client sends the message alone, which the client still takes apart."""
    from gpud.cli.apply import _invalid

    bad = tmp_path / "bad.toml"
    bad.write_text('[all.fan]\nmode = "curve"\npoints = [[40, 60], [30, 80]]\n')
    reply = request(daemon.sock, "apply", profile=str(bad))
    assert reply is not None and reply["ok"] is False
    parts = reply["invalid"]
    assert parts["file"] == str(bad) and parts["key"] == "all.fan.points[1]"
    assert parts["reason"].startswith("not monotonic: temperatures must rise")
    err = _invalid(reply)
    assert (err.file, err.key, err.reason) == (parts["file"], parts["key"], parts["reason"])
    assert str(err) == reply["error"]
    old = _invalid({"ok": False, "error": reply["error"], "invalid": True})
    assert str(old) == reply["error"] and old.file == str(bad)
    r = run_gpud("apply", str(bad), env={"GPUD_SOCKET": daemon.sock, "GPUD_SIMULATE": "z8-fury-4x-a6000"})
    assert r.returncode == 2 and "all.fan.points[1]: not monotonic" in r.stderr


def test_drift_is_reapplied_and_counted(daemon: RunningDaemon) -> None:
    run_gpud("apply", "quiet", env={"GPUD_SOCKET": daemon.sock, "GPUD_SIMULATE": "z8-fury-4x-a6000"})
    before = daemon.value("gpud_profile_reapply_total") or 0
    m = open_machine("z8-fury-4x-a6000")
    m.nvml.set_power_limit(3, 300)  # behind gpud's back, as a driver reload would
    daemon.wait_for(lambda: _sim().settings(3)["power_limit_mw"] == 240000, 15,
                    "power limit re-applied")  # the power limit is read again within 10 s
    daemon.wait_for(lambda: (daemon.value("gpud_profile_reapply_total") or 0) > before, 3, "re-apply counted")
    from gpud import journal  # and journalled: the re-apply on GPU3, the applies and who asked for them

    def kinds() -> list[tuple[str, int | None, str]]:
        return [(e.kind, e.gpu, e.summary) for e in journal.events(kinds=("profile_apply", "profile_reapply"))]

    daemon.wait_for(lambda: any(k == "profile_reapply" and g == 3 for k, g, _ in kinds()), 5, "the re-apply journalled")
    applies = [summary for k, _, summary in kinds() if k == "profile_apply"]
    assert "profile training applied by the daemon" in applies
    assert any(s.startswith("profile quiet applied by uid ") for s in applies), applies


def _drift_lines(exposition: str) -> list[str]:
    return sorted(line for line in exposition.splitlines() if line.startswith("gpud_profile_drift{"))


def test_a_drift_that_cannot_be_reapplied_reads_the_same_in_gpud_metrics(daemon: RunningDaemon) -> None:
    daemon.wait_for(lambda: daemon.value("gpud_profile_drift", gpu="3", setting="power_limit_watts") == 0, 5,
                    "GPU3's power limit as the profile asks")
    sim = _sim()
    sim.inject("no_permission", gpu=3, call="nvmlDeviceSetPowerManagementLimit")  # gpud cannot write it back
    with sim.mutate():
        sim.settings(3)["power_limit_mw"] = 250000  # changed behind gpud's back
    daemon.wait_for(lambda: (daemon.value("gpud_profile_reapply_failures_total") or 0) >= 1, 15,
                    "the failure counted")  # the power limit is read again within 10 s
    assert daemon.value("gpud_profile_drift", gpu="3", setting="power_limit_watts") == 1  # differs now
    assert daemon.value("gpud_profile_drift", gpu="2", setting="power_limit_watts") == 0
    assert daemon.value("gpud_profile_drift", gpu="3", setting="persistence_mode") == 0
    r = run_gpud("metrics", "--config", str(daemon.config), env={"GPUD_SIMULATE": "z8-fury-4x-a6000",
                                                                  "GPUD_SOCKET": daemon.sock})
    assert r.returncode == 0, r.stderr
    assert _drift_lines(r.stdout) == _drift_lines(daemon.metrics())
    assert 'gpud_profile_drift{gpu="3",setting="fan"} 0.0' in r.stdout  # the curve, judged as the daemon does


def test_a_drifted_cpu_governor_is_reapplied(daemon: RunningDaemon, tmp_path: Path) -> None:
    profile = tmp_path / "governor.toml"
    profile.write_text('extends = "training"\n[host]\ncpu_governor = "powersave"\n')
    r = run_gpud("apply", str(profile), env={"GPUD_SOCKET": daemon.sock, "GPUD_SIMULATE": "z8-fury-4x-a6000"})
    assert r.returncode == 0, r.stderr
    m = open_machine("z8-fury-4x-a6000")
    assert set(m.host.cpu_governors().values()) == {"powersave"}
    before = daemon.value("gpud_profile_reapply_total") or 0
    m.host.set_cpu_governor("performance", [0])  # behind gpud's back
    daemon.wait_for(lambda: set(m.host.cpu_governors().values()) == {"powersave"}, 15,
                    "the governor re-applied")  # the governors are read again within 10 s
    daemon.wait_for(lambda: (daemon.value("gpud_profile_reapply_total") or 0) > before, 3, "re-apply counted")
    assert daemon.value("gpud_profile_drift", gpu="", setting="cpu_governor") == 0
    from gpud import journal

    daemon.wait_for(lambda: any(e.summary.startswith("host: cpu_governor drifted")
                                for e in journal.events(kinds=("profile_reapply",))), 5, "journalled")


def test_sighup_refuses_an_invalid_configuration(daemon: RunningDaemon) -> None:
    good = daemon.config.read_text()
    daemon.config.write_text(good + "interval_seconds_typo = 3\n")
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: "reload refused, old configuration kept" in daemon.logs(), 5, "the refusal logged")
    assert "daemon.interval_seconds_typo: unknown key" in daemon.logs()
    assert daemon.get("/healthz")[0] == 200
    daemon.config.write_text(good.replace("doctor_interval_seconds = 10", "doctor_interval_seconds = 20"))
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: "configuration reloaded" in daemon.logs(), 5, "the reload logged")


def _as_nobody(path: str) -> str:
    """Ask the daemon for a ping from a forked child that became uid/gid 65534 (no exec needed)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, talk, report through the pipe
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            from gpud.daemon.control import ControlError

            try:
                msg = json.dumps(request(path, "ping"))
            except ControlError as err:
                msg = str(err)
        except BaseException as err:  # noqa: BLE001
            msg = f"child failed: {err!r}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        return f.read()


def test_control_socket_refuses_a_peer_outside_the_group(tmp_path: Path, state_dir) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    import tempfile

    open_dir = Path(tempfile.mkdtemp(prefix="gpud-sock-", dir="/tmp"))
    open_dir.chmod(0o755)  # like /run/gpud: the stranger can reach the socket's directory
    daemon = RunningDaemon(tmp_path, sock_dir=open_dir)
    os.chmod(daemon.sock, 0o666)  # let the stranger reach the socket: the daemon itself must refuse
    got = _as_nobody(daemon.sock)
    assert got.startswith("refused: nobody (uid 65534) is ") and "root" in got, got
    os.chmod(daemon.sock, 0o660)  # as installed: the file mode refuses first
    got = _as_nobody(daemon.sock)
    assert "refuses this user" in got, got
    assert request(daemon.sock, "ping")["ok"]  # root is served
    daemon.stop(signal.SIGKILL)
    shutil.rmtree(open_dir, ignore_errors=True)


def test_root_refuses_a_writable_profile(daemon: RunningDaemon, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the ownership rule applies when the daemon runs as root")
    p = tmp_path / "mine.toml"
    p.write_text('[all]\npower_limit = 250\n')
    p.chmod(0o666)
    r = run_gpud("apply", str(p), env={"GPUD_SOCKET": daemon.sock, "GPUD_SIMULATE": "z8-fury-4x-a6000"})
    assert r.returncode == 2 and "writable by group or others (mode 666)" in r.stderr


def test_scrapers_do_not_disturb_the_ticks(daemon: RunningDaemon) -> None:
    errors: list[str] = []
    stop = time.monotonic() + 3.0

    def scrape() -> None:
        while time.monotonic() < stop:
            try:
                with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as r:
                    if r.status != 200:
                        errors.append(str(r.status))
            except OSError as err:
                errors.append(str(err))

    threads = [threading.Thread(target=scrape) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    status = json.loads(daemon.get("/status")[1])
    assert status["tick"]["periods"] > 10


def test_tls_and_basic_auth(tmp_path: Path, state_dir) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    import bcrypt

    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n"
                   f"basic_auth_users:\n  prom: '{hashed}'\n")
    d = RunningDaemon(tmp_path, config=f'web_config = "{web}"\n', healthz=False)  # /healthz needs TLS: probed below
    import base64
    import ssl

    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    url = f"https://127.0.0.1:{d.port}/metrics"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(url), context=ctx, timeout=5)
            raise AssertionError("served without credentials")
        except urllib.error.HTTPError as err:
            assert err.code == 401
            break
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    auth = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}

    def scrape() -> bytes:
        with urllib.request.urlopen(urllib.request.Request(url, headers=auth), context=ctx, timeout=5) as r:
            assert r.status == 200
            return r.read()

    d.wait_for(lambda: b"gpud_gpu_up" in scrape(), timeout=20, what="the first tick's metrics over TLS")
    assert f"serving https://127.0.0.1:{d.port}/metrics" in d.logs()  # the start-up line says what it serves
    bad = {"Authorization": "Basic " + base64.b64encode(b"prom:wrong").decode()}
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(urllib.request.Request(url, headers=bad), context=ctx, timeout=5)
    assert exc.value.code == 401
    d.stop(signal.SIGKILL)


def test_systemd_unit_is_hardened_and_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-analyze is missing")
        pytest.skip("systemd-analyze not installed")
    unit = (REPO / "systemd" / "gpud.service").read_text()
    gpud = shutil.which("gpud", path=os.path.dirname(sys.executable)) or shutil.which("gpud")
    assert gpud, "the gpud console script is not installed"
    local = tmp_path / "gpud.service"
    local.write_text(unit.replace("/usr/local/bin/gpud", gpud))  # where this checkout installed it
    r = subprocess.run([tool, "security", "--offline=true", str(local)], capture_output=True, text=True)
    line = next(x for x in (r.stdout + r.stderr).splitlines() if "Overall exposure level" in x)
    score = float(line.split(":")[1].split()[0])
    print(f"systemd-analyze security: {line.strip()}")
    assert score <= 3.0, line
    r = subprocess.run([tool, "verify", str(local)], capture_output=True, text=True)
    print(f"systemd-analyze verify: rc={r.returncode} {r.stdout + r.stderr!r}")
    assert r.returncode == 0 and (r.stdout + r.stderr).strip() == "", r.stdout + r.stderr
    assert "ExecStopPost=/usr/local/bin/gpud restore --fans-only" in unit and "Type=notify" in unit
    assert "Restart=on-failure" in unit and "WatchdogSec=" in unit


def test_gpud_metrics_prints_one_exposition(state_dir) -> None:
    r = run_gpud("metrics", "--simulate", "z8-fury-4x-a6000-degraded")
    assert r.returncode == 0
    assert 'gpud_check_status{check="pcie.link_width",gpu="2",status="fail"} 1.0' in r.stdout
    assert 'gpud_gpu_xid_errors_total{gpu="3"' in r.stdout
    assert 'gpud_gpu_pcie_link_width{gpu="2"' in r.stdout
    tool = promtool()
    if tool:
        p = subprocess.run([tool, "check", "metrics"], input=r.stdout, capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout + p.stderr == ""


# Families only a running daemon exports, each with why a one-shot `gpud metrics` cannot have it.
DAEMON_ONLY = {
    "gpud_tick_duration_seconds": "the durations of the daemon's ticks: a one-shot run has no ticks",
    "gpud_last_tick_timestamp_seconds": "when the daemon's last tick read the GPUs",
    "gpud_user_gpu_seconds_total": "GPU-seconds per user, accumulated over ticks (gpud.usage.Accounting)",
    "gpud_gpu_clock_event_seconds_total": "time in each clock-event reason, accumulated over ticks",
    "gpud_gpu_throttled_seconds_total": "time throttled, accumulated over ticks",
    "gpud_gpu_watched_seconds_total": "time the clock events were watched, accumulated over ticks",
    "gpud_gpu_clock_event_source_info": "which of those seconds follow NVML's counters: part of the accounting",
}


def _families(body: str) -> tuple[set[str], set[str]]:
    """(every family the exposition declares, those with at least one sample)."""
    declared = {line.split()[2] for line in body.splitlines() if line.startswith("# TYPE ")}
    names = {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line and not line.startswith("#")}
    suffixes = ("", "_total", "_bucket", "_sum", "_count", "_created")
    sampled = {f for f in declared if any(f.removesuffix("_total") + x in names for x in suffixes)}
    return declared, sampled


def test_gpud_metrics_and_the_daemon_export_the_same_families(tmp_path: Path, state_dir) -> None:
    """One Observation builder (gpud.observe.observe): `gpud metrics` and the daemon's /metrics on the same
    simulated machine declare and fill the same families, but those only a running daemon has."""
    desc = "z8-fury-4x-a6000-degraded"
    r = run_gpud("metrics", "--simulate", desc)
    assert r.returncode == 0, r.stderr
    cli_declared, cli_sampled = _families(r.stdout)
    d = RunningDaemon(tmp_path, sim=desc)
    try:
        d.wait_for(lambda: "gpud_check_status{" in d.metrics(), 15, "doctor's checks")
        declared, sampled = _families(d.metrics())
    finally:
        d.stop()
    assert set(DAEMON_ONLY) <= declared, set(DAEMON_ONLY) - declared
    assert not set(DAEMON_ONLY) & cli_declared, set(DAEMON_ONLY) & cli_declared  # else: not daemon-only
    assert declared - set(DAEMON_ONLY) == cli_declared, (declared ^ cli_declared) - set(DAEMON_ONLY)
    assert sampled - set(DAEMON_ONLY) == cli_sampled, (sampled ^ cli_sampled) - set(DAEMON_ONLY)
    assert "gpud_check_status" in cli_sampled and "gpud_gpu_xid_errors_total" in cli_sampled


def test_sd_notify_ready_and_watchdog(tmp_path: Path, state_dir) -> None:
    sock_path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sock_path)
    s.settimeout(20)
    os.environ["NOTIFY_SOCKET"] = sock_path
    os.environ["WATCHDOG_USEC"] = "2000000"
    try:
        d = RunningDaemon(tmp_path)
    finally:
        del os.environ["NOTIFY_SOCKET"], os.environ["WATCHDOG_USEC"]
    got = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any("WATCHDOG=1" in g for g in got):
        got.append(s.recv(4096).decode())
    d.stop()
    s.close()
    assert got[0].startswith("READY=1\nSTATUS=4 GPU(s)"), got
    assert any("WATCHDOG=1" in g for g in got)


def test_probe_runs_on_schedule_only_when_idle(tmp_path: Path, state_dir) -> None:
    sched = "probe_interval_hours = 0.0001\nprobe_idle_minutes = 0\nprobe_world_sizes = [1]\n"
    (tmp_path / "busy").mkdir()
    (tmp_path / "idle").mkdir()
    # Two machines, each with its own state directory (one daemon per state directory: its tuning lock)
    busy = RunningDaemon(tmp_path / "busy", sim="z8-fury-4x-a6000-degraded", config=sched,  # GPU1 trains
                         env={"GPUD_STATE_DIR": str(tmp_path / "busy" / "state")})
    try:
        idle = RunningDaemon(tmp_path / "idle", config=sched, env={"GPUD_STATE_DIR": str(tmp_path / "idle" / "state")})
    except BaseException:
        busy.stop(signal.SIGKILL)  # never leave a daemon behind
        raise
    try:
        idle.wait_for(lambda: "probe started (schedule)" in idle.logs(), 10, "a scheduled probe on the idle machine")
        time.sleep(1.0)
        assert "probe started" not in busy.logs()
    finally:
        idle.stop(signal.SIGKILL)
        busy.stop(signal.SIGKILL)
