"""The read-only HTTP endpoint: /metrics, /healthz, /status. No control over HTTP.

Every handler only reads the daemon's latest observation: a scrape never touches the hardware.
Optional TLS and basic auth come from a web configuration file in the Prometheus exporters'
format::

    tls_server_config:
      cert_file: /etc/gpud/tls.crt
      key_file: /etc/gpud/tls.key
      client_ca_file: /etc/gpud/ca.crt     # optional: require client certificates
    basic_auth_users:
      prometheus: $2b$12$...                # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':\\n')

Idle and slow clients cannot take the endpoint down. Each connection gets its own thread that
reads the request head (and does the TLS handshake) under one deadline for the whole head; only
a complete request takes one of the few *slots* that produce answers. A connection that sends
nothing, half a request or trickles bytes is closed at its deadline and never held a slot.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import queue
import re
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpud.daemon.wake import Wakeable
from gpud.errors import InvalidInput
from gpud.paths import open_trusted, read_trusted

log = logging.getLogger("gpud.http")

MAX_HANDLERS = 8  # requests answered at once (the slots)
MAX_CONNECTIONS = 512  # connections open at once, most of them reading; beyond that a new one is closed
HEAD_DEADLINE_S = 5.0  # TLS handshake + request line + headers, all together
WRITE_TIMEOUT_S = 10.0
SLOT_WAIT_S = 5.0  # a complete request waits this long for a slot, then gets 503
MAX_HEAD = 16 * 1024
MAX_WEB_CONFIG = 64 * 1024
BCRYPT_HASH = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
WEB_KEYS = ("basic_auth_users", "http_server_config", "tls_server_config")
TLS_KEYS = ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version")
HTTP_KEYS = ("headers",)
CLIENT_AUTH = ("NoClientCert", "RequireAndVerifyClientCert")


def _pem(path: str, file: str, key: str, what: str) -> None:
    # As root: owned by root, not writable by others, no symbolic link, in directories only root can change.
    text = read_trusted(path, "TLS file", 1 << 20, shown=file, key=key)
    if f"-----BEGIN {what}".encode() not in text and not (what == "PRIVATE KEY" and b"PRIVATE KEY-----" in text):
        raise InvalidInput(file, key, f"{path} is not a PEM {what.lower()}")


def _known_keys(path: str, where: str, value: Any, known: Any) -> None:
    """``value`` is a mapping of ``known`` keys only (``where``: its dotted name, "" at the top)."""
    if not isinstance(value, dict):
        raise InvalidInput(path, where, "must be a mapping")
    for key in value:
        if key not in known:
            raise InvalidInput(path, f"{where}.{key}" if where else str(key),
                               f"unknown key (known: {', '.join(known)})")


def load_web_config(path: str) -> dict[str, Any]:
    """Validate a web configuration file; InvalidInput (file, key, reason) when it is wrong.

    Checks everything the server will need so a bad file is refused at start (and on reload)
    instead of failing at the first request: keys, bcrypt hashes, PEM files, that the key belongs
    to the certificate; as root, that no other user could have written any of the files.
    """
    import yaml

    text = read_trusted(path, "web configuration", MAX_WEB_CONFIG)  # checked on the descriptor it is read from
    try:
        data = yaml.safe_load(text) or {}
    except RecursionError as err:
        raise InvalidInput(path, "", "nested too deeply") from err
    except yaml.YAMLError as err:
        raise InvalidInput(path, "", f"not valid YAML: {' '.join(str(err).split())}") from err
    _known_keys(path, "", data, WEB_KEYS)
    tls = data.get("tls_server_config")
    if tls is not None:
        _known_keys(path, "tls_server_config", tls, TLS_KEYS)
        for key in ("cert_file", "key_file"):
            if not isinstance(tls.get(key), str) or not tls[key]:
                raise InvalidInput(path, f"tls_server_config.{key}", "required: a file path")
        if tls.get("client_ca_file") is not None and not isinstance(tls["client_ca_file"], str):
            raise InvalidInput(path, "tls_server_config.client_ca_file", "must be a file path")
        if tls.get("client_auth_type", "RequireAndVerifyClientCert") not in CLIENT_AUTH:
            raise InvalidInput(path, "tls_server_config.client_auth_type", f"must be one of {', '.join(CLIENT_AUTH)}")
        if tls.get("min_version", "TLS12") not in ("TLS12", "TLS13"):
            raise InvalidInput(path, "tls_server_config.min_version", "must be TLS12 or TLS13")
        for key, what in (("cert_file", "CERTIFICATE"), ("key_file", "PRIVATE KEY"), ("client_ca_file", "CERTIFICATE")):
            if tls.get(key):
                _pem(tls[key], path, f"tls_server_config.{key}", what)
        try:
            ssl_context(tls)
        except ssl.SSLError as err:
            reason = "does not match cert_file" if "KEY_VALUES_MISMATCH" in str(err) else \
                f"not usable: {err.reason or err}"
            raise InvalidInput(path, "tls_server_config.key_file", reason) from err
        except OSError as err:
            raise InvalidInput(path, "tls_server_config", f"cannot load: {err.strerror or err}") from err
    users = data.get("basic_auth_users")
    if users is not None:
        if not isinstance(users, dict) or not users:
            raise InvalidInput(path, "basic_auth_users", "must map user names to bcrypt hashes ($2b$…)")
        for user, hashed in users.items():
            if not isinstance(user, str) or not user or ":" in user:
                raise InvalidInput(path, f"basic_auth_users.{user}", "a user name is a non-empty string without ':'")
            if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
                raise InvalidInput(path, f"basic_auth_users.{user}",
                                   "not a bcrypt hash ($2b$NN$ and 53 characters; `htpasswd -nBC 12 \"\"`)")
    hsc = data.get("http_server_config")
    if hsc is not None:
        _known_keys(path, "http_server_config", hsc, HTTP_KEYS)
        headers = hsc.get("headers", {})
        if not isinstance(headers, dict) or not all(
                isinstance(k, str) and isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9-]+", k)
                and "\n" not in v and "\r" not in v for k, v in headers.items()):
            raise InvalidInput(path, "http_server_config.headers", "must map header names to one-line strings")
    return data


def ssl_context(tls: dict[str, Any]) -> ssl.SSLContext:
    """The server's TLS context. Each file is opened once and checked on that descriptor
    (``gpud.paths.open_trusted``), and OpenSSL reads that same open file through /proc/self/fd: a
    file swapped after ``load_web_config`` checked it is never the one loaded."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3 if tls.get("min_version") == "TLS13" else ssl.TLSVersion.TLSv1_2
    fds: dict[str, int] = {}
    try:
        for key in ("cert_file", "key_file", "client_ca_file"):
            if tls.get(key):
                fds[key] = open_trusted(tls[key], "TLS file", key=f"tls_server_config.{key}")
        ctx.load_cert_chain(f"/proc/self/fd/{fds['cert_file']}", f"/proc/self/fd/{fds['key_file']}")
        if "client_ca_file" in fds:
            ctx.load_verify_locations(f"/proc/self/fd/{fds['client_ca_file']}")
            ctx.verify_mode = (ssl.CERT_NONE if tls.get("client_auth_type") == "NoClientCert"
                               else ssl.CERT_REQUIRED)
    finally:
        for fd in fds.values():
            os.close(fd)
    return ctx


def protected(web: dict[str, Any]) -> bool:
    """Whether only known clients can read the endpoint (basic auth, or required client certificates)."""
    tls = web.get("tls_server_config") or {}
    return bool(web.get("basic_auth_users")) or bool(
        tls.get("client_ca_file") and tls.get("client_auth_type", "RequireAndVerifyClientCert") != "NoClientCert")


class Endpoints:
    """What the handler serves; the daemon supplies the three producers."""

    CACHE = 64  # verified (user, password) pairs remembered; failures are never remembered

    def __init__(self, metrics: Callable[[], bytes], healthy: Callable[[], tuple[bool, str]],
                 status: Callable[[], dict[str, Any]], users: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.metrics = metrics
        self.healthy = healthy
        self.status = status
        self.headers = dict(headers or {})
        self._salt = os.urandom(16)
        self._ok: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()
        self.users: dict[str, str] = {}
        self._dummy = b""
        self.set_users(users)

    def set_users(self, users: dict[str, str] | None) -> None:
        users = dict(users or {})
        dummy = b""
        if users:
            import bcrypt

            # An unknown user costs one bcrypt check at the highest cost in use, like a wrong
            # password does: no telling which user names exist from the answer time.
            cost = max(int(h.split("$")[2]) for h in users.values())
            dummy = bcrypt.hashpw(os.urandom(16).hex().encode(), bcrypt.gensalt(rounds=cost))
        with self._lock:
            self.users, self._dummy = users, dummy
            self._ok.clear()

    def authorized(self, header: str | None) -> bool:
        users, dummy = self.users, self._dummy
        if not users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        secret = password.encode()
        hashed = users.get(user)
        key = hashlib.sha256(self._salt + user.encode() + b"\0" + secret + b"\0" + (hashed or "").encode()).digest()
        with self._lock:
            if hashed is not None and key in self._ok:
                self._ok.move_to_end(key)
                return True
        import bcrypt

        # bcrypt reads at most 72 bytes (and newer versions refuse more): a longer password is
        # wrong, after the same work a wrong one costs.
        candidate = secret if len(secret) <= 72 else secret[:72]
        target = hashed.encode() if hashed is not None else dummy
        try:
            good = bcrypt.checkpw(candidate, target)
        except ValueError:
            good = False
        good = good and hashed is not None and len(secret) <= 72
        if good:
            with self._lock:
                self._ok[key] = None
                while len(self._ok) > self.CACHE:
                    self._ok.popitem(last=False)
        return good


class _HeadError(Exception):
    """The client did not deliver a request head in time (or sent too much, or failed TLS). ``status``:
    the answer it still gets (414 for a request line, 431 for headers too large, 505 for HTTP/0.9);
    None: it is only closed."""

    def __init__(self, why: str, status: int | None = None) -> None:
        super().__init__(why)
        self.status = status


REFUSED = {414: "URI Too Long", 431: "Request Header Fields Too Large", 505: "HTTP Version Not Supported"}
MAX_REQUEST_LINE = 8 * 1024  # method, URL and version


def make_handler(ep: Endpoints) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpud"
        # One request per connection: a keep-alive connection would hold a slot between scrapes.
        protocol_version = "HTTP/1.0"
        server: Server

        def setup(self) -> None:
            self.deadline = time.monotonic() + self.server.head_deadline
            self.failed: str | None = None
            self.refuse: int | None = None
            conn: socket.socket = self.request
            try:
                ctx = self.server.tls
                if ctx is not None:
                    conn.settimeout(self.server.head_deadline)
                    conn = ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
                    self.request = self.connection = conn
                    conn.do_handshake()
                else:
                    self.connection = conn
                head = self._read_head(conn)
            except (OSError, ssl.SSLError, _HeadError) as err:
                self.failed = str(err) or type(err).__name__
                self.refuse = err.status if isinstance(err, _HeadError) else None
                head = b""
            conn.settimeout(WRITE_TIMEOUT_S)
            self.rfile = io.BytesIO(head)
            self.wfile = conn.makefile("wb", buffering=0)  # type: ignore[assignment]

        def _read_head(self, conn: socket.socket) -> bytes:
            buf = b""
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    end = buf.find(b"\n\n")
                line, nl, _ = buf.partition(b"\n")
                if len(line) > MAX_REQUEST_LINE:
                    raise _HeadError("request line too long", 414)
                if nl and len(line.split()) == 2:  # HTTP/0.9 "GET /": answered with a status line, no data
                    raise _HeadError("HTTP/0.9 request", 505)
                if len(buf) > MAX_HEAD if end < 0 else end > MAX_HEAD:
                    raise _HeadError("request head too large", 431)
                if end >= 0:
                    return buf
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise _HeadError("no complete request before the deadline")
                conn.settimeout(left)
                try:
                    chunk = conn.recv(4096)
                except TimeoutError as err:
                    raise _HeadError("no complete request before the deadline") from err
                if not chunk:
                    raise _HeadError("closed before a complete request")
                buf += chunk

        def handle(self) -> None:
            if self.failed is not None:
                log.debug("%s: %s", self.client_address[0] if self.client_address else "?", self.failed)
                if self.refuse is not None:
                    body = f"{self.refuse} {REFUSED[self.refuse]}: {self.failed}\n".encode()
                    try:
                        self.wfile.write(f"HTTP/1.0 {self.refuse} {REFUSED[self.refuse]}\r\nContent-Type: text/plain"
                                         f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                                         + body)
                    except OSError:
                        pass
                return
            if not self.server.slots.acquire(timeout=SLOT_WAIT_S):
                self.wfile.write(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
                return
            try:
                super().handle()
            finally:
                self.server.slots.release()

        def finish(self) -> None:
            try:
                super().finish()
            except OSError:
                pass
            if isinstance(self.connection, ssl.SSLSocket):
                self.connection.close()  # the server closes the plain socket it accepted, not this one

        def log_message(self, fmt: str, *args: Any) -> None:  # scrapes are not worth a log line
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in {**ep.headers, **(extra or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if not ep.authorized(self.headers.get("Authorization")):
                self._send(401, b"unauthorized\n", "text/plain", {"WWW-Authenticate": 'Basic realm="gpud"'})
                return
            route = self.path.split("?", 1)[0]
            if route == "/metrics":
                self._send(200, ep.metrics(), "text/plain; version=0.0.4; charset=utf-8")
            elif route == "/healthz":
                ok, why = ep.healthy()
                self._send(200 if ok else 503, (why + "\n").encode(), "text/plain")
            elif route == "/status":
                self._send(200, json.dumps(ep.status(), default=str).encode(), "application/json")
            elif route == "/":
                page = (b"<html><head><title>gpud</title></head><body><h1>gpud</h1><ul>"
                        b"<li><a href='/metrics'>/metrics</a></li><li><a href='/healthz'>/healthz</a></li>"
                        b"<li><a href='/status'>/status</a></li></ul></body></html>")
                self._send(200, page, "text/html")
            else:
                self._send(404, b"not found\n", "text/plain")

        do_HEAD = do_GET

        def do_POST(self) -> None:  # noqa: N802
            self._send(405, b"read-only: use the control socket (gpud apply/restore)\n", "text/plain",
                       {"Allow": "GET, HEAD"})

        do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    return Handler


class Workers:
    """The connections' threads: one per connection open, as ``ThreadingMixIn`` gives, but a thread that has
    answered waits for the next connection instead of ending, up to ``keep`` of them idle. Starting a thread
    for each request is most of what a scrape or a kubelet probe costs an idle daemon (2 cores, a request a
    second: 560 µs of the process's CPU a request with a new thread, 142 µs handed to a waiting one, 102 µs
    for none); a burst of connections still gets a thread each, and the ones beyond ``keep`` end after it."""

    def __init__(self, answer: Callable[[Any, Any], None], keep: int, name: str) -> None:
        self._answer = answer
        self._keep = keep
        self._name = name
        self._idle: list[queue.SimpleQueue[tuple[Any, Any] | None]] = []  # each idle thread's inbox
        self._lock = threading.Lock()
        self.started = 0  # threads started (the tests read it)
        self.alive = 0  # threads of this pool not ended yet, idle or busy

    def submit(self, request: Any, client_address: Any) -> None:
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
            if inbox is None:
                self.started += 1
                self.alive += 1
        if inbox is not None:
            inbox.put((request, client_address))
            return
        inbox = queue.SimpleQueue()
        inbox.put((request, client_address))
        threading.Thread(target=self._serve, args=(inbox,), name=self._name, daemon=True).start()

    def _serve(self, inbox: queue.SimpleQueue[tuple[Any, Any] | None]) -> None:
        try:
            while True:
                item = inbox.get()
                if item is None:
                    return
                self._answer(*item)
                with self._lock:
                    if len(self._idle) >= self._keep:
                        return  # enough are waiting already
                    self._idle.append(inbox)
        finally:
            with self._lock:
                self.alive -= 1

    def close(self) -> None:
        """The idle threads end (the busy ones end after their connection)."""
        with self._lock:
            idle, self._idle, self._keep = self._idle, [], 0
        for inbox in idle:
            inbox.put(None)


class Server(Wakeable, ThreadingHTTPServer):
    """A thread per connection for reading its request (cheap: it sleeps in recv; ``Workers`` keeps a few
    for the next connections), MAX_HANDLERS slots for answering, MAX_CONNECTIONS open at once: fifty
    scrapers never turn into fifty threads fighting the daemon's loop for the interpreter, and a hundred
    idle ones block nobody."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, *args: Any, tls: ssl.SSLContext | None = None, **kwargs: Any) -> None:
        # Before the base class binds: a bind that fails closes the server, which closes the workers.
        self.workers = Workers(self.process_request_thread, MAX_HANDLERS, "gpud-http-conn")
        super().__init__(*args, **kwargs)
        self.tls = tls
        self.head_deadline = HEAD_DEADLINE_S
        self.slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self._open = 0
        self._open_lock = threading.Lock()
        self.refused = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = self._open >= MAX_CONNECTIONS
            if not full:
                self._open += 1
        if full:
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            self.workers.submit(request, client_address)  # ThreadingMixIn's, but a waiting thread where one is
        except Exception:
            with self._open_lock:
                self._open -= 1
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("HTTP connection from %s failed", client_address, exc_info=True)

    def server_close(self) -> None:
        super().server_close()
        self.workers.close()


def serve(host: str, port: int, ep: Endpoints, tls: dict[str, Any] | None = None) -> tuple[Server, threading.Thread]:
    cls: type[Server] = Server
    if ":" in host:
        cls = type("Server6", (Server,), {"address_family": socket.AF_INET6})
    srv = cls((host, port), make_handler(ep), tls=ssl_context(tls) if tls else None)
    t = threading.Thread(target=srv.serve_forever, name="gpud-http", daemon=True)
    t.start()
    return srv, t
