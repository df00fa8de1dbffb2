"""`gpud reload` and `gpud probe-now`: the control socket's requests from the command line."""

from __future__ import annotations

import json

from conftest import run_gpud
from daemon_helpers import RunningDaemon

from gpud.json_schema import check


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
        doc = json.loads(r.stdout)  # a document of the shared schema, as every --json
        assert doc["kind"] == "daemon_reply" and doc["request"] == "probe-now" and check(doc) == [], check(doc)
        assert "probe started" in d.wait_for(lambda: "probe started" in d.logs() and d.logs(), what="probe log")
    finally:
        d.stop()


def test_without_a_daemon_one_line_and_exit_1(tmp_path) -> None:
    for cmd in ("reload", "probe-now"):
        r = run_gpud(cmd, env={"GPUD_SOCKET": str(tmp_path / "none.sock")})
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
        assert "no gpud daemon listens on" in r.stderr and "systemctl start gpud" in r.stderr


def test_the_dispatch_table_is_the_one_list_of_requests(state_dir) -> None:
    """Each control request is one entry of ``REQUESTS``: its shape check and its handler (every one needs the
    socket's access: tests/test_daemon.py refuses a peer outside the group)."""
    import json

    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.control import COMMANDS, check_request
    from gpud.daemon.requests import REQUESTS
    from gpud.daemon.service import Daemon

    names = ["ping", "status", "verify", "reload", "probe-now", "apply", "restore", "set-healthy", "rules-resume"]
    assert list(COMMANDS) == list(REQUESTS) == names
    assert check_request({"cmd": "nope"}) == f"unknown command (known: {', '.join(names)})"
    m = open_machine("z8-fury-4x-a6000")
    d = Daemon(m, cfg.Config())
    d.tick()
    writes = m.simulation.machine.state["writes"]
    for name in ("ping", "status", "verify"):  # the requests that only read
        reply = d.handle({"cmd": name})
        assert reply["ok"], reply
        json.dumps(reply)  # as the socket sends it
    assert m.simulation.machine.state["writes"] == writes and d.profile is None  # they changed nothing
    reply = d.handle({"cmd": "apply", "args": {"profile": "training", "dry_run": True}})
    assert reply["ok"] and reply["dry_run"] and reply["plan"], reply
    assert d.profile is None and m.simulation.machine.state["writes"] == writes  # nothing written
    reply = d.handle({"cmd": "apply", "args": {"profile": "training"}})
    assert reply["ok"] and d.profile == "training" and m.simulation.machine.state["writes"] > writes, reply
    assert d.handle({"cmd": "restore"})["ok"] and d.profile is None
    # set-healthy: its arguments checked before its handler; no journal opened here, so nothing kept
    assert "bad request" in d.handle({"cmd": "set-healthy", "args": {"gpu": 0, "reason": "x"}})["error"]
    reply = d.handle({"cmd": "set-healthy", "args": {"gpu": "0", "reason": "reseated"}})
    assert not reply["ok"] and "journal" in reply["error"]
    reply = d.handle({"cmd": "rules-resume", "args": {"profile": "quiet"}})  # gpud apply --rules quiet
    assert reply["ok"] and d.profile == "quiet" and d.rules.base == "quiet", reply


def test_the_daemon_applies_a_fan_curve_profile_on_gpus_without_fans(state_dir) -> None:
    """The H200 is passively cooled: the plan skips its fan curve (unsupported), and the daemon's fan
    loop must take that as "no curve", not fail the apply."""
    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.service import Daemon

    d = Daemon(open_machine("hgx-8x-h200"), cfg.Config())
    reply = d.handle({"cmd": "apply", "args": {"profile": "training"}})
    assert reply["ok"], reply
    assert d.enforcer.state is not None and d.enforcer.state.desired["0"]["fan"] == "unsupported"
    assert d.fans.controllers == {}
