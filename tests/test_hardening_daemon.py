"""Issue 13, one daemon one target, and the daemon's own behaviour: takeover of a live socket,
ports in use, --simulate against another machine's daemon, SIGHUP rebinding, no tracebacks,
fan failsafe recovery, lost GPUs logged once."""

from __future__ import annotations

import logging
import signal
import socket
import time
from pathlib import Path

import pytest
from conftest import run_gpud
from daemon_helpers import RunningDaemon, free_port

from gpud.daemon.control import request


@pytest.fixture
def daemon(tmp_path: Path, state_dir):
    d = RunningDaemon(tmp_path, config='profile = "training"\n')
    yield d
    d.stop(signal.SIGKILL)


def _second(tmp_path: Path, sock: str, listen: str) -> tuple[int, str]:
    other = tmp_path / "other"
    other.mkdir()
    conf = other / "gpud.toml"
    conf.write_text(f'[daemon]\nlisten = "{listen}"\n')
    r = run_gpud("daemon", "--config", str(conf), env={"GPUD_SIMULATE": "z8-fury-4x-a6000", "GPUD_SOCKET": sock,
                                                       "GPUD_STATE_DIR": str(other / "state")}, timeout=60)
    return r.returncode, r.stderr


def test_a_second_daemon_does_not_take_over_a_live_control_socket(daemon: RunningDaemon, tmp_path: Path) -> None:
    code, err = _second(tmp_path, daemon.sock, f"127.0.0.1:{free_port()}")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "another gpud daemon answers on" in err, err
    assert request(daemon.sock, "ping")["ok"]  # the first one still has its socket


def test_a_port_in_use_is_one_line_and_exit_1(tmp_path: Path, state_dir) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code, err = _second(tmp_path, str(tmp_path / "x.sock"), f"127.0.0.1:{port}")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in err
    assert not (tmp_path / "x.sock").exists()


def test_simulate_never_acts_through_a_daemon_driving_other_gpus(daemon: RunningDaemon) -> None:
    before = request(daemon.sock, "status")["profile"]
    r = run_gpud("apply", "quiet", "--simulate", "z8-fury-4x-rtx6000ada", env={"GPUD_SOCKET": daemon.sock})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "drives simulated workstation z8-fury-4x-a6000, not simulated workstation z8-fury-4x-rtx6000ada" in r.stderr
    assert "tuning lock" in r.stderr and "Traceback" not in r.stderr
    assert request(daemon.sock, "status")["profile"] == before


def test_the_cli_finds_the_daemon_through_the_configured_socket(daemon: RunningDaemon, tmp_path: Path) -> None:
    conf = tmp_path / "cli.toml"
    conf.write_text(f'[daemon]\nsocket = "{daemon.sock}"\n')
    env = {"GPUD_SOCKET": "", "GPUD_SIMULATE": "z8-fury-4x-a6000"}
    r = run_gpud("verify", "--json", "--config", str(conf), env=env)
    assert '"profile": "training"' in r.stdout, r.stdout + r.stderr
    r = run_gpud("apply", "quiet", "--config", str(conf), env=env)
    assert r.returncode == 0 and "by the gpud daemon" in r.stdout, r.stdout + r.stderr
    r = run_gpud("restore", "--fans-only", "--config", str(conf), env=env)
    assert r.returncode == 0, r.stderr


def test_sighup_with_a_new_listen_address_rebinds(daemon: RunningDaemon) -> None:
    new = free_port()
    daemon.config.write_text(daemon.config.read_text().replace(f"127.0.0.1:{daemon.port}", f"127.0.0.1:{new}"))
    daemon.proc.send_signal(signal.SIGHUP)
    daemon.wait_for(lambda: f"now serving http://127.0.0.1:{new}" in daemon.logs(), 10, "the new port")
    old_url, daemon.url = daemon.url, f"http://127.0.0.1:{new}"
    assert daemon.get("/healthz")[0] == 200
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", daemon.port), timeout=2).close()
    daemon.url = old_url


def test_sighup_keeps_the_old_port_and_says_so_when_the_new_one_is_taken(daemon: RunningDaemon) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        daemon.config.write_text(daemon.config.read_text().replace(f"127.0.0.1:{daemon.port}",
                                                                   f"127.0.0.1:{taken}"))
        reply = request(daemon.sock, "reload")
    assert reply["ok"] and f"listen unchanged (127.0.0.1:{daemon.port})" in reply["message"], reply
    assert daemon.get("/healthz")[0] == 200


def test_connect_and_close_clients_cause_no_traceback(daemon: RunningDaemon) -> None:
    for _ in range(5):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(daemon.sock)
        s.close()
    r = run_gpud("doctor", "--check", "health.*", env={"GPUD_SOCKET": daemon.sock,
                                                        "GPUD_SIMULATE": "z8-fury-4x-a6000"})
    assert r.returncode in (0, 1), r.stderr
    time.sleep(0.5)
    assert request(daemon.sock, "ping")["ok"]
    assert "Traceback" not in daemon.logs() and "BrokenPipe" not in daemon.logs()


@pytest.mark.parametrize("argv,needle", [
    (["--listen", "nonsense"], "--listen: nonsense: must be HOST:PORT"),
    (["--log-level", "LOUD"], "--log-level: LOUD: must be DEBUG, INFO, WARNING or ERROR"),
    (["--interval", "0"], "--interval: 0.0: must be 0.05..60 s"),
    (["--interval", "61"], "--interval: 61.0: must be 0.05..60 s"),
])
def test_bad_daemon_options_are_one_line_and_exit_2(argv: list[str], needle: str, tmp_path: Path) -> None:
    r = run_gpud("daemon", *argv, env={"GPUD_SIMULATE": "z8-fury-4x-a6000", "GPUD_SOCKET": str(tmp_path / "s")})
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_fans_return_to_their_curve_when_the_temperature_reads_again(state_dir, caplog) -> None:
    from gpud.backends import open_machine
    from gpud.profiles.fanloop import FanControl

    m = open_machine("z8-fury-4x-a6000")
    fc = FanControl(m)
    fc.configure({0: {"fan": {"mode": "curve", "points": [[30, 40], [80, 90]], "hysteresis": 3, "minimum": 0,
                              "max_ramp": 10}}})
    fc.step(m.snapshot().samples, 1.0)
    sim = m.simulation.machine
    sim.inject("unsupported", gpu=0, call="nvmlDeviceGetTemperature")
    time.sleep(0.3)  # the simulator picks up faults a few times a second
    with caplog.at_level(logging.WARNING, logger="gpud"):
        for t in range(2, 6):
            assert [e.kind for e in fc.step(m.snapshot().samples, float(t))] == ["failsafe"]
        sim.clear_faults()
        time.sleep(0.3)
        events = fc.step(m.snapshot().samples, 7.0)
    assert [e.kind for e in events] == ["duty"] and 0 not in fc.in_failsafe
    assert m.snapshot().samples[0].fans[0].policy == "manual"
    failsafe_lines = [r for r in caplog.records if "failsafe" in r.getMessage()]
    assert len(failsafe_lines) == 1 and fc.failsafes == 1  # logged and counted once, not every tick


def test_a_lost_gpu_is_logged_once_and_when_it_changes(state_dir, caplog) -> None:
    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.service import Daemon

    d = Daemon(open_machine("z8-fury-4x-a6000"), cfg.Config())
    assert d.apply("training")["ok"]  # fan curves on every GPU
    d.tick()
    open_machine("z8-fury-4x-a6000").simulation.machine.inject("gpu_lost", gpu=2)
    time.sleep(0.3)
    with caplog.at_level(logging.INFO, logger="gpud"):
        for _ in range(6):
            d.tick()
    lines = [r.getMessage() for r in caplog.records if "GPU 2" in r.getMessage()]
    assert len([x for x in lines if x.startswith("GPU 2 is lost")]) == 1, lines
    assert len(lines) <= 3, lines  # lost, fan failsafe, nothing per tick


def test_sighup_with_a_new_socket_moves_the_control_socket(tmp_path: Path, state_dir) -> None:
    import os

    d = RunningDaemon(tmp_path, config=f'socket = "{tmp_path / "gpud.sock"}"\n', env={"GPUD_SOCKET": ""})
    try:
        new = tmp_path / "moved.sock"
        d.config.write_text(d.config.read_text().replace(str(tmp_path / "gpud.sock"), str(new)))
        d.proc.send_signal(signal.SIGHUP)
        d.wait_for(lambda: f"control socket now {new}" in d.logs(), 10, "the moved socket")
        assert request(str(new), "ping")["ok"]
        assert not os.path.exists(d.sock)  # the old one removed: it was this daemon's
    finally:
        d.stop(signal.SIGKILL)
