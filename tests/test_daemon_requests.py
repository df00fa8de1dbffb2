"""`gpud reload` and `gpud probe-now`: the control socket's requests from the command line."""

from __future__ import annotations

from conftest import run_gpud
from daemon_helpers import RunningDaemon


def test_reload_and_probe_now_reach_the_daemon(tmp_path, state_dir) -> None:
    d = RunningDaemon(tmp_path)
    try:
        env = {"GPUD_SOCKET": d.sock}
        r = run_gpud("reload", "--config", str(d.config), env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("gpud reload: configuration reloaded from")
        d.config.write_text("[daemon]\ninterval_seconds = 0\n")  # invalid: refused, old kept
        r = run_gpud("reload", env=env)
        assert r.returncode == 1 and "reload refused, old configuration kept" in r.stderr
        r = run_gpud("probe-now", "--json", env=env)
        assert r.returncode == 0, r.stderr
        assert '"probe started, pid' in r.stdout
        assert "probe started" in d.wait_for(lambda: "probe started" in d.logs() and d.logs(), what="probe log")
    finally:
        d.stop()


def test_without_a_daemon_one_line_and_exit_1(tmp_path) -> None:
    for cmd in ("reload", "probe-now"):
        r = run_gpud(cmd, env={"GPUD_SOCKET": str(tmp_path / "none.sock")})
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
        assert "no gpud daemon listens on" in r.stderr and "systemctl start gpud" in r.stderr
