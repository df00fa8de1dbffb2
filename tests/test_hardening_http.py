"""Issue 13, the HTTP endpoint and the control socket: idle and slow clients, TLS, basic auth,
the web configuration, /status privacy, malformed requests."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpud.daemon import http
from gpud.errors import InvalidInput


def _ep(users: dict[str, str] | None = None) -> http.Endpoints:
    return http.Endpoints(lambda: b"gpud_up 1\n", lambda: (True, "ok"), lambda: {"ok": True}, users)


@pytest.fixture
def server():
    made: list[http.Server] = []

    def start(users: dict[str, str] | None = None, tls: dict[str, str] | None = None,
              deadline: float | None = None) -> http.Server:
        srv, _ = http.serve("127.0.0.1", 0, _ep(users), tls)
        if deadline is not None:
            srv.head_deadline = deadline
        made.append(srv)
        return srv

    yield start
    for srv in made:
        srv.shutdown()
        srv.server_close()


def _get(port: int, path: str = "/metrics", timeout: float = 3.0, ctx: ssl.SSLContext | None = None,
         headers: dict[str, str] | None = None) -> int:
    scheme = "https" if ctx else "http"
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def _connect(port: int, send: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if send:
        s.sendall(send)
    return s


def test_idle_partial_and_http09_connections_do_not_take_the_slots(server) -> None:
    srv = server()
    port = srv.server_address[1]
    held = [_connect(port) for _ in range(20)]  # send nothing
    held += [_connect(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n") for _ in range(20)]  # half a request
    held += [_connect(port, b"GET /metrics\r\n") for _ in range(5)]  # an HTTP/0.9 line
    try:
        t0 = time.monotonic()
        codes = [_get(port, timeout=2.0) for _ in range(20)]
        assert codes == [200] * 20
        assert time.monotonic() - t0 < 5.0
    finally:
        for s in held:
            s.close()


def test_a_thread_that_answered_waits_for_the_next_connection_and_a_burst_gets_one_each(server) -> None:
    """Requests one after the other are answered by one thread (none started per request); idle connections
    each hold a thread while a scrape still gets its own; after the burst, at most MAX_HANDLERS wait."""
    srv = server(deadline=2.0)
    port = srv.server_address[1]

    def waiting(n: int) -> int:  # a thread answers, then closes the connection, then waits: the client is faster
        deadline = time.monotonic() + 10
        while len(srv.workers._idle) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return len(srv.workers._idle)

    for _ in range(5):
        assert _get(port) == 200 and waiting(1) == 1
    assert srv.workers.started == 1
    idle = [_connect(port) for _ in range(12)]
    assert _get(port) == 200  # not queued behind the twelve idle connections' threads
    assert srv.workers.started == 13
    for s in idle:
        s.close()
    assert waiting(http.MAX_HANDLERS) == http.MAX_HANDLERS
    assert _get(port) == 200 and srv.workers.started == 13
    deadline = time.monotonic() + 10
    while srv.workers.alive > http.MAX_HANDLERS and time.monotonic() < deadline:  # the others end (this pool's
        time.sleep(0.01)  # own count: other tests' servers in this process have threads of the same name)
    assert srv.workers.alive == http.MAX_HANDLERS


def test_a_connection_that_never_finishes_its_request_is_closed_at_the_deadline(server) -> None:
    srv = server(deadline=0.5)
    port = srv.server_address[1]
    idle = _connect(port)
    trickle = _connect(port, b"G")
    t0 = time.monotonic()
    for _ in range(10):  # a byte every 0.1 s: activity does not extend the deadline
        try:
            trickle.sendall(b"E")
        except OSError:
            break
        time.sleep(0.1)
    idle.settimeout(3)
    assert idle.recv(1) == b""  # closed by the server
    trickle.settimeout(3)
    try:
        assert trickle.recv(1) == b""
    except ConnectionResetError:
        pass
    assert time.monotonic() - t0 < 2.5


def _openssl() -> str:
    tool = shutil.which("openssl")
    if tool is None:
        pytest.skip("openssl not installed")
    return tool


def _pair(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.crt", d / f"{name}.key"
    subprocess.run([_openssl(), "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def test_one_idle_connection_does_not_block_tls_clients(server, tmp_path: Path) -> None:
    cert, key = _pair(tmp_path, "a")
    srv = server(tls={"cert_file": str(cert), "key_file": str(key)})
    port = srv.server_address[1]
    idle = [_connect(port) for _ in range(3)]  # no ClientHello
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    try:
        assert [_get(port, ctx=ctx, timeout=2.0) for _ in range(5)] == [200] * 5
    finally:
        for s in idle:
            s.close()


def _basic(user: str, password: bytes) -> str:
    return "Basic " + base64.b64encode(user.encode() + b":" + password).decode()


def test_an_unknown_user_costs_as_much_as_a_wrong_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown user's answer takes one bcrypt check at the highest cost in use, as a wrong password's
    does: counted, not timed (a timed comparison failed under load with no change to the code)."""
    import bcrypt

    ep = _ep({"prom": bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=9)).decode(),
              "ci": bcrypt.hashpw(b"other", bcrypt.gensalt(rounds=4)).decode()})
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def counted(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return bool(real(password, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", counted)
    for k, user in enumerate(("prom", "nobody", "nobody")):  # a new password each time: no cache answers
        assert ep.authorized(_basic(user, f"wrong{k}".encode())) is False
    assert len(checked) == 3  # one check each, the unknown user's too
    costs = [int(h.decode().split("$")[2]) for h in checked]
    assert costs == [9, 9, 9], costs  # the unknown user's against the highest cost in use


def test_auth_cache_keeps_successes_only_and_is_bounded() -> None:
    import bcrypt

    users = {f"u{i}": bcrypt.hashpw(f"p{i}".encode(), bcrypt.gensalt(rounds=4)).decode() for i in range(80)}
    ep = _ep(users)
    for _ in range(3):
        assert not ep.authorized(_basic("u1", b"nope"))
    assert len(ep._ok) == 0
    for i in range(80):
        assert ep.authorized(_basic(f"u{i}", f"p{i}".encode()))
    assert len(ep._ok) <= http.Endpoints.CACHE


def test_a_password_over_72_bytes_is_a_401_not_a_crashed_handler(server) -> None:
    import bcrypt

    good = b"x" * 72
    srv = server(users={"prom": bcrypt.hashpw(good, bcrypt.gensalt(rounds=4)).decode()})
    port = srv.server_address[1]
    assert _get(port, headers={"Authorization": _basic("prom", good + b"tail")}) == 401
    assert _get(port, headers={"Authorization": _basic("prom", b"y" * 200)}) == 401
    assert _get(port, headers={"Authorization": _basic("prom", good)}) == 200


def _web(tmp_path: Path, text: str) -> str:
    p = tmp_path / "web.yml"
    p.write_text(text)
    p.chmod(0o600)
    return str(p)


def test_web_configuration_is_checked_whole(tmp_path: Path) -> None:
    a_cert, a_key = _pair(tmp_path, "a")
    b_cert, b_key = _pair(tmp_path, "b")
    junk = tmp_path / "junk.crt"
    junk.write_text("hello\n")
    cases = [
        ("basic_auth_users:\n  prom: '$2b$12$tooshort'\n", "basic_auth_users.prom", "not a bcrypt hash"),
        (f"tls_server_config:\n  cert_file: {a_cert}\n  key_file: {b_key}\n", "tls_server_config.key_file",
         "does not match"),
        (f"tls_server_config:\n  cert_file: {junk}\n  key_file: {a_key}\n", "tls_server_config.cert_file",
         "not a PEM certificate"),
        (f"tls_server_config:\n  cert_file: {a_cert}\n  key_file: {a_key}\n  colour: blue\n",
         "tls_server_config.colour", "unknown key"),
        ("tls_server_config: [1, 2]\n", "tls_server_config", "must be a mapping"),
        ("basic_auth_users: {}\n", "basic_auth_users", "must map"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "", ""),
    ]
    for text, key, reason in cases:
        with pytest.raises(InvalidInput) as exc:
            http.load_web_config(_web(tmp_path, text))
        assert exc.value.key == key and reason in exc.value.reason, (text[:60], str(exc.value))
    http.load_web_config(_web(tmp_path, f"tls_server_config:\n  cert_file: {b_cert}\n  key_file: {b_key}\n"))


def test_as_root_a_web_configuration_others_can_write_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("the ownership rule applies as root")
    p = _web(tmp_path, "basic_auth_users:\n  prom: '$2b$04$" + "a" * 53 + "'\n")
    os.chmod(p, 0o666)
    with pytest.raises(InvalidInput, match="writable by group or others"):
        http.load_web_config(p)


def test_daemon_with_a_bad_web_configuration_exits_2_before_touching_anything(tmp_path: Path, state_dir) -> None:
    from conftest import run_gpud

    web = _web(tmp_path, "basic_auth_users:\n  prom: 'plain-text'\n")
    conf = tmp_path / "gpud.toml"
    conf.write_text(f'[daemon]\nlisten = "127.0.0.1:0"\nweb_config = "{web}"\nprofile = "quiet"\n')
    r = run_gpud("daemon", "--config", str(conf), env={"GPUD_SIMULATE": "z8-fury-4x-a6000",
                                                       "GPUD_SOCKET": str(tmp_path / "s.sock")})
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{web}: basic_auth_users.prom: not a bcrypt hash" in lines[0], r.stderr
    assert not (state_dir / "tuning.json").exists()


def test_status_hides_users_and_command_lines_unless_protected(state_dir) -> None:
    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.service import Daemon

    d = Daemon(open_machine("z8-fury-4x-a6000-degraded"), cfg.Config())
    d.tick()

    def procs() -> list[dict[str, object]]:
        return [p for g in d.status()["gpus"] for p in g["sample"].get("processes") or []]

    assert procs() and all(p["user"] is None and p["command"] is None and p["container"] is None for p in procs())
    assert {p["pid"] for p in procs()} == {48213, 60112, 51877}  # pids and memory stay: no names
    d.web = {"basic_auth_users": {"prom": "$2b$04$" + "a" * 53}}
    assert all(p["user"] and p["command"] for p in procs())
    assert {p["container"] for p in procs()} >= {"docker:3f9c2a1b7d4e"}
    d.web = {}
    d.config = cfg.parse({"daemon": {"status_processes": "always"}}, "gpud.toml")
    assert all(p["user"] and p["command"] for p in procs())
    assert all(p["user"] for g in d.handle({"cmd": "status"})["gpus"]
               for p in g["sample"].get("processes") or [])  # the control socket's members see them


def test_control_requests_of_the_wrong_shape_are_refused(state_dir) -> None:
    from gpud.daemon.control import check_request

    assert check_request({"cmd": "apply", "args": [1]}) == "args must be a JSON object"
    assert check_request({"cmd": "apply", "args": {"profile": {"a": 1}}}) == \
        "apply: argument profile has the wrong type"
    assert check_request({"cmd": "restore", "args": {"fans_only": "yes"}}) is not None
    assert check_request({"cmd": "apply", "args": {}}) == "apply: missing argument 'profile'"
    assert check_request([1, 2]) == "a request is a JSON object"
    deep: object = 1
    for _ in range(50):
        deep = {"a": deep}
    assert check_request({"cmd": "ping", "args": deep}) == "nested too deeply"
    assert check_request({"cmd": "ping"}) is None


def test_a_group_member_never_sees_root_only_files(tmp_path: Path, state_dir) -> None:
    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.peer import Peer
    from gpud.daemon.service import Daemon

    secret = tmp_path / "secret.toml"
    secret.write_text("secret_token_value = 1\n")
    secret.chmod(0o600)
    d = Daemon(open_machine("z8-fury-4x-a6000"), cfg.Config())
    member = Peer(os.getpid(), 4242, 4242)  # not the owner, not root
    reply = d.handle({"cmd": "apply", "args": {"profile": str(secret), "dry_run": True}}, member)
    assert not reply["ok"] and "secret_token" not in json.dumps(reply) and "refused" in reply["error"]
    if os.geteuid() == 0:  # root asking for its own file gets the real error
        reply = d.handle({"cmd": "apply", "args": {"profile": str(secret), "dry_run": True}}, Peer(1, 0, 0))
        assert "secret_token_value" in reply["error"]


def _send_raw(port: int, data: bytes) -> None:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(data)
            s.settimeout(0.3)
            try:
                s.recv(4096)
            except OSError:
                pass
    except OSError:
        pass


def _send_unix(path: str, data: bytes) -> None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            s.connect(path)
            s.sendall(data)
            try:
                s.recv(65536)
            except OSError:
                pass
    except OSError:
        pass


def test_malformed_requests_leave_the_daemon_answering_with_fans_under_control(tmp_path: Path, state_dir) -> None:
    from daemon_helpers import RunningDaemon
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    from gpud.daemon.control import check_request, request

    def harmless(v: object) -> bool:  # a well-formed restore would rightly hand the fans back
        return check_request(v) is not None or not isinstance(v, dict) or v.get("cmd") not in ("restore", "apply")

    d = RunningDaemon(tmp_path, config='profile = "training"\n')
    try:
        d.wait_for(lambda: d.value("gpud_gpu_fan_manual", gpu="0") == 1, 10, "the curve driving the fans")
        json_values = hs.recursive(hs.none() | hs.booleans() | hs.integers() | hs.floats() | hs.text(max_size=20),
                                   lambda c: hs.lists(c, max_size=4) | hs.dictionaries(hs.text(max_size=8), c,
                                                                                       max_size=4), max_leaves=20)
        control = hs.one_of(
            hs.binary(max_size=300),
            json_values.filter(harmless).map(lambda v: json.dumps(v).encode() + b"\n"),
            hs.fixed_dictionaries({"cmd": hs.sampled_from(["apply", "restore", "ping", "verify", "x"]),
                                   "args": json_values}).filter(harmless).map(lambda v: json.dumps(v).encode() + b"\n"),
            hs.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n + b"\n"))
        http_req = hs.one_of(
            hs.binary(max_size=300),
            hs.builds(lambda m, p, v: f"{m} {p} {v}\r\n".encode(), hs.sampled_from(["GET", "POST", "HEAD", "BREW"]),
                      hs.text(max_size=30).map(lambda t: "/" + t.replace(" ", "")),
                      hs.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/9", ""])),
            hs.builds(lambda h: b"GET /metrics HTTP/1.1\r\n" + h + b"\r\n\r\n", hs.binary(max_size=200)))

        @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
        @given(hs.one_of(control.map(lambda b: ("unix", b)), http_req.map(lambda b: ("tcp", b))))
        def attack(case: tuple[str, bytes]) -> None:
            kind, data = case
            if kind == "unix":
                _send_unix(d.sock, data)
            else:
                _send_raw(d.port, data)

        attack()
        assert request(d.sock, "ping")["ok"]
        assert d.get("/healthz")[0] == 200
        assert d.proc.poll() is None
        for gpu in range(4):
            assert d.value("gpud_gpu_fan_manual", gpu=str(gpu)) == 1  # still on the curve
        assert "Traceback" not in d.logs()
    finally:
        d.stop()


def _fake_daemon(path: str, target: str) -> threading.Thread:
    """A daemon that answers ping, then dies in the middle of the next command."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)

    def run() -> None:
        for _ in range(2):
            conn, _ = srv.accept()
            line = conn.makefile("rb").readline()
            if json.loads(line)["cmd"] == "ping":
                conn.sendall(json.dumps({"ok": True, "target": target}).encode() + b"\n")
            conn.close()
        srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_apply_through_a_daemon_that_dies_mid_apply_says_so(tmp_path: Path, monkeypatch, capsys) -> None:
    from tuning_helpers import cli

    sock = str(tmp_path / "dying.sock")
    monkeypatch.setenv("GPUD_SOCKET", sock)
    _fake_daemon(sock, "simulated workstation z8-fury-4x-a6000")
    code, _, err = cli(capsys, "apply", "quiet", "--simulate", "z8-fury-4x-a6000")
    assert code == 1 and "closed the connection without answering" in err and "None" not in err, err
