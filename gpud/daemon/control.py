"""The control socket: the CLI talks to a running daemon over a Unix socket.

One JSON request per connection (``{"cmd": "apply", "args": {...}}``), one JSON reply. The
socket is mode 0660, group ``gpud``; each peer's credentials are read with SO_PEERCRED and only
root, the daemon's own user and members of the group are served — anyone else gets a clear
refusal. Commands: ping, status, apply, verify, restore, reload, probe-now.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import socket
import socketserver
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpud.errors import GpudError

log = logging.getLogger("gpud.control")
MAX_REQUEST = 64 * 1024
Handler = Callable[[dict[str, Any]], dict[str, Any]]


class ControlError(GpudError):
    """The daemon refused or failed a request."""


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def peer_groups(pid: int) -> set[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


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


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


def serve(path: str, handler: Handler, group: str | None, mode: int = 0o660
          ) -> tuple[socketserver.ThreadingUnixStreamServer, threading.Thread]:
    access = Access(group)

    class Conn(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            pid, uid, gid = peer_credentials(self.request)
            refusal = access.check(pid, uid, gid)
            try:
                line = self.rfile.readline(MAX_REQUEST)
                if refusal:
                    log.warning("control socket: %s (pid %d)", refusal, pid)
                    reply: dict[str, Any] = {"ok": False, "error": refusal}
                else:
                    request = json.loads(line or b"{}")
                    reply = handler(request if isinstance(request, dict) else {})
            except (ValueError, UnicodeDecodeError) as err:
                reply = {"ok": False, "error": f"bad request: {err}"}
            self.wfile.write(json.dumps(reply, default=str).encode() + b"\n")

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.is_socket() or p.exists():
        p.unlink()
    old = os.umask(0o117)
    try:
        srv = _Server(str(p), Conn)
    finally:
        os.umask(old)
    os.chmod(p, mode)
    if access.gid is not None:
        try:
            os.chown(p, -1, access.gid)
        except PermissionError:
            log.warning("cannot give %s to group %s (not root): only this user can use it", p, group)
    t = threading.Thread(target=srv.serve_forever, name="gpud-control", daemon=True)
    t.start()
    return srv, t


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
        s.sendall(json.dumps({"cmd": cmd, "args": args}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    reply = json.loads(data or b"{}")
    if not reply.get("ok", False) and str(reply.get("error", "")).startswith("refused"):
        raise ControlError(reply["error"])
    return reply if isinstance(reply, dict) else None
