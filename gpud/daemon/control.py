"""The control socket: the CLI talks to a running daemon over a Unix socket.

One JSON request per connection (``{"cmd": "apply", "args": {...}}``), one JSON reply. The
socket is mode 0660, group ``gpud``; each peer's credentials are read with SO_PEERCRED and only
root, the daemon's own user and members of the group are served — anyone else gets a clear
refusal. The requests, their arguments and access: ``gpud.daemon.requests.REQUESTS``.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpud.daemon.peer import Peer, peer_credentials, peer_groups
from gpud.daemon.requests import REQUESTS
from gpud.daemon.wake import Wakeable
from gpud.errors import GpudError
from gpud.paths import depth

log = logging.getLogger("gpud.control")
MAX_REQUEST = 64 * 1024


class ControlError(GpudError):
    """The daemon refused or failed a request."""


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class Access:
    def __init__(self, group: str | None) -> None:
        self.group = group
        try:
            self.gid: int | None = grp.getgrnam(group).gr_gid if group else None
        except KeyError:
            self.gid = None

    def check(self, pid: int, uid: int, gid: int) -> str | None:
        """None if the peer may control the daemon, else why not."""
        if uid in (0, os.geteuid()):
            return None
        if self.gid is not None and (gid == self.gid or self.gid in peer_groups(pid)):
            return None
        who = user_name(uid)
        if self.gid is None:
            return f"refused: {who} (uid {uid}) is not root"
        return (f"refused: {who} (uid {uid}) is neither root nor in group '{self.group}' — "
                f"`sudo usermod -aG {self.group} {who}`, then log in again")


# The request shapes the daemon accepts: command → {argument: type} (from the dispatch table).
COMMANDS: dict[str, dict[str, type | tuple[type, ...]]] = {name: r.args for name, r in REQUESTS.items()}
MAX_DEPTH = 4


def check_request(request: Any) -> str | None:
    """None when ``request`` has a shape the daemon serves, else why not (without echoing it)."""

    if not isinstance(request, dict):
        return "a request is a JSON object"
    if depth(request, MAX_DEPTH) > MAX_DEPTH:
        return "nested too deeply"
    extra = set(request) - {"cmd", "args"}
    if extra:
        return "unknown field(s) " + ", ".join(sorted(repr(str(k))[:40] for k in extra))
    cmd = request.get("cmd")
    if not isinstance(cmd, str) or cmd not in COMMANDS:
        return f"unknown command (known: {', '.join(COMMANDS)})"
    args = request.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return "args must be a JSON object"
    spec = COMMANDS[cmd]
    for k, v in args.items():
        if k not in spec:
            return f"{cmd}: unknown argument {str(k)[:40]!r} (known: {', '.join(spec) or 'none'})"
        if not isinstance(v, spec[k]) or (spec[k] is not bool and isinstance(v, bool)):
            return f"{cmd}: argument {k} has the wrong type"
        if isinstance(v, str) and (len(v) > 4096 or "\0" in v):
            return f"{cmd}: argument {k} is not a usable string"
        if isinstance(v, list) and (len(v) > 1024 or not all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1024 for x in v)):
            return f"{cmd}: argument {k} must be a list of GPU indices"
    for k in REQUESTS[cmd].required:
        if k not in args:
            return f"{cmd}: missing argument {k!r}"
    return None


class _Server(Wakeable, socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("control connection failed", exc_info=True)


class SocketInUse(GpudError):
    """Another daemon answers on the control socket."""


def _live(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _read_request(conn: socket.socket) -> tuple[bytes, bool]:
    """One request: bytes up to the first newline, or up to the end of input, or as soon as they form
    one whole JSON object (a client that sends no newline and waits for the answer). (bytes, whether
    the request ended); more than ``MAX_REQUEST`` bytes, or silence past the timeout, did not end."""
    buf = b""
    while len(buf) <= MAX_REQUEST:
        try:
            chunk = conn.recv(65536)
        except OSError:
            return buf, False
        if not chunk:
            return buf, True  # the end of input ends the request
        buf += chunk
        if b"\n" in buf:
            return buf.split(b"\n", 1)[0] + b"\n", True
        if buf.rstrip().endswith(b"}"):
            try:
                json.loads(buf)
                return buf, True
            except (ValueError, UnicodeDecodeError, RecursionError):
                pass
    return buf, False


def serve(path: str, handler: Callable[[dict[str, Any], Peer], dict[str, Any]], group: str | None,
          mode: int = 0o660) -> tuple[_Server, threading.Thread]:
    access = Access(group)

    class Conn(socketserver.StreamRequestHandler):
        timeout = 10  # a peer that connects and sends nothing is dropped

        def handle(self) -> None:
            pid, uid, gid = peer_credentials(self.request)
            refusal = access.check(pid, uid, gid)
            line, ended = _read_request(self.request)
            if not line.strip():
                return  # a connect-and-close (`gpud doctor` asking whether a daemon runs)
            if refusal:  # every request needs the socket's access: a refused peer's line is not even parsed
                log.warning("control socket: %s (pid %d)", refusal, pid)
                self._answer({"ok": False, "error": refusal})
                return
            request: Any = None
            why: str | None = (f"bad request: larger than {MAX_REQUEST} bytes" if len(line) > MAX_REQUEST
                               else "bad request: not one line (no end of line, and not one whole JSON object)")
            if len(line) <= MAX_REQUEST and ended:
                try:
                    request = json.loads(line)
                    why = None  # its shape is the handler's to check (``check_request``), once
                except (ValueError, UnicodeDecodeError, RecursionError):
                    why = "bad request: not valid JSON"
            if why is not None:
                reply: dict[str, Any] = {"ok": False, "error": why}
            else:
                reply = handler(request, Peer(pid, uid, gid))
            self._answer(reply)

        def _answer(self, reply: dict[str, Any]) -> None:
            try:
                self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")
            except OSError:
                pass  # the peer went away: nothing to tell it

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if _live(p):
        err = SocketInUse(f"another gpud daemon answers on {p}: refusing to take over its control socket")
        err.remedy = "stop it first (`systemctl stop gpud`), or give this one its own [daemon] socket and listen"
        raise err
    if p.is_socket():
        p.unlink()  # left by a daemon that died: nobody answers on it
    elif p.exists():
        raise SocketInUse(f"{p} exists and is not a socket: refusing to replace it")
    old = os.umask(0o117)
    try:
        srv = _Server(str(p), Conn)
    finally:
        os.umask(old)
    srv.inode = os.stat(p).st_ino  # type: ignore[attr-defined]
    os.chmod(p, mode)
    if access.gid is not None:
        try:
            os.chown(p, -1, access.gid)
        except PermissionError:
            log.warning("cannot give %s to group %s (not root): only this user can use it", p, group)
    t = threading.Thread(target=srv.serve_forever, name="gpud-control", daemon=True)
    t.start()
    return srv, t


def remove_if_ours(path: str, srv: Any) -> None:
    """Delete the socket file only if it is still the one this daemon created."""
    try:
        if os.stat(path).st_ino == getattr(srv, "inode", None):
            os.unlink(path)
    except OSError:
        pass


DIED = ("the gpud daemon closed the connection without answering: it stopped or crashed during the command "
        "(see `journalctl -u gpud`); `gpud verify` shows what is applied now and `gpud restore` undoes it")


def request(path: str | os.PathLike[str], cmd: str, timeout: float = 600, **args: Any) -> dict[str, Any] | None:
    """Send one command to the daemon. None when no daemon listens there (act directly)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        try:
            s.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        except PermissionError as err:
            raise ControlError(f"the gpud daemon runs, but {path} refuses this user ({err.strerror}): be root or "
                               "in its group (`sudo usermod -aG gpud $USER`, then log in again)") from err
        data = b""
        try:
            s.sendall(json.dumps({"cmd": cmd, "args": args}).encode() + b"\n")
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError as err:
            raise ControlError(f"the gpud daemon on {path} did not answer {cmd} within {timeout:.0f} s") from err
        except OSError as err:
            raise ControlError(f"{DIED} ({err.strerror or err})") from err
    finally:
        s.close()
    if not data.endswith(b"\n"):
        raise ControlError(DIED)
    try:
        reply = json.loads(data)
    except ValueError as err:
        raise ControlError(f"the gpud daemon on {path} answered something that is not JSON") from err
    if not isinstance(reply, dict):
        raise ControlError(f"the gpud daemon on {path} answered something that is not a reply")
    if not reply.get("ok", False) and str(reply.get("error", "")).startswith("refused"):
        raise ControlError(reply["error"])
    return reply
