"""The read-only HTTP endpoint: /metrics, /healthz, /status. No control over HTTP.

Threaded (one thread per request), so slow scrapers never hold each other up, and every handler
only reads the daemon's latest observation: a scrape never touches the hardware. Optional TLS and
basic auth come from a web configuration file in the Prometheus exporters' format::

    tls_server_config:
      cert_file: /etc/gpud/tls.crt
      key_file: /etc/gpud/tls.key
      client_ca_file: /etc/gpud/ca.crt     # optional: require client certificates
    basic_auth_users:
      prometheus: $2b$12$...                # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':\\n')
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpud.errors import InvalidInput

log = logging.getLogger("gpud.http")


def load_web_config(path: str) -> dict[str, Any]:
    """Validate a web configuration file; InvalidInput (file, key, reason) when it is wrong."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as err:
        raise InvalidInput(path, "", f"cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise InvalidInput(path, "", f"not valid YAML: {err}") from err
    if not isinstance(data, dict):
        raise InvalidInput(path, "", "must be a mapping")
    for key in data:
        if key not in ("tls_server_config", "basic_auth_users", "http_server_config"):
            raise InvalidInput(path, key, "unknown key (known: basic_auth_users, http_server_config, "
                                          "tls_server_config)")
    tls = data.get("tls_server_config")
    if tls is not None:
        if not isinstance(tls, dict) or not tls.get("cert_file") or not tls.get("key_file"):
            raise InvalidInput(path, "tls_server_config", "needs cert_file and key_file")
        for k in ("cert_file", "key_file", "client_ca_file"):
            if tls.get(k) and not Path(tls[k]).is_file():
                raise InvalidInput(path, f"tls_server_config.{k}", f"no such file: {tls[k]}")
    users = data.get("basic_auth_users")
    if users is not None:
        if not isinstance(users, dict) or not all(isinstance(v, str) and v.startswith("$2") for v in users.values()):
            raise InvalidInput(path, "basic_auth_users", "must map user names to bcrypt hashes ($2…)")
    return data


def ssl_context(tls: dict[str, Any]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls["cert_file"], tls["key_file"])
    if tls.get("client_ca_file"):
        ctx.load_verify_locations(tls["client_ca_file"])
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class Endpoints:
    """What the handler serves; the daemon supplies the three producers."""

    def __init__(self, metrics: Callable[[], bytes], healthy: Callable[[], tuple[bool, str]],
                 status: Callable[[], dict[str, Any]], users: dict[str, str] | None = None) -> None:
        self.metrics = metrics
        self.healthy = healthy
        self.status = status
        self.users = users or {}
        self._checked: dict[tuple[str, str], bool] = {}  # bcrypt is slow: remember verified pairs

    def authorized(self, header: str | None) -> bool:
        if not self.users:
            return True
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if hashed is None:
            return False
        key = (user, password)
        if key not in self._checked:
            import bcrypt

            self._checked[key] = bcrypt.checkpw(password.encode(), hashed.encode())
        return self._checked[key]


def make_handler(ep: Endpoints) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gpud"
        # One request per connection: a keep-alive connection would hold one of the few handler
        # slots while its scraper sleeps between scrapes.
        protocol_version = "HTTP/1.0"

        def log_message(self, fmt: str, *args: Any) -> None:  # scrapes are not worth a log line
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, code: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
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

        do_PUT = do_DELETE = do_PATCH = do_POST

    return Handler


MAX_HANDLERS = 8


class Server(ThreadingHTTPServer):
    """One thread per connection, but never more than MAX_HANDLERS at once: fifty scrapers must
    not turn into fifty threads fighting the daemon's loop for the interpreter."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()  # waits in the accept thread; the kernel's backlog holds the rest
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve(host: str, port: int, ep: Endpoints, tls: dict[str, Any] | None = None) -> tuple[Server, threading.Thread]:
    cls: type[Server] = Server
    if ":" in host:
        import socket

        cls = type("Server6", (Server,), {"address_family": socket.AF_INET6})
    srv = cls((host, port), make_handler(ep))
    if tls:
        srv.socket = ssl_context(tls).wrap_socket(srv.socket, server_side=True)
    t = threading.Thread(target=srv.serve_forever, name="gpud-http", daemon=True)
    t.start()
    return srv, t
