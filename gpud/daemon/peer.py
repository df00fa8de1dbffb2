"""Who is at the other end of the control socket: credentials from SO_PEERCRED, supplementary groups from
``/proc/PID/status``, and whether that peer could read a file itself. The socket server (``control``) and
the requests' handlers (``requests``) both use it."""

from __future__ import annotations

import os
import socket
import stat as st
import struct
from pathlib import Path

from gpud.procinfo import status_ids


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def peer_groups(pid: int) -> set[int]:
    """The peer's supplementary groups (``/proc/PID/status`` ``Groups:``): read as bytes and parsed by
    ``gpud.procinfo.status_ids``, so no character of the peer's own name (``\\x1c``, ``\\r``…) adds a
    ``Groups:`` line of its choosing."""
    try:
        with Path(f"/proc/{pid}/status").open("rb") as f:
            text = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return set()
    return set(status_ids(text, "Groups"))


class Peer:
    """Who sent a request (SO_PEERCRED), to check file access on their behalf."""

    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid

    def may_read(self, path: str) -> bool:
        """Whether this peer could read ``path`` itself: the daemon never opens a file for a peer
        who could not (so no contents or parse errors of root's files reach a group member)."""
        if self.uid == 0:
            return True
        try:
            info = os.stat(path)
        except OSError:
            return False
        groups = peer_groups(self.pid) | {self.gid}
        if info.st_uid == self.uid:
            return bool(info.st_mode & st.S_IRUSR)
        if info.st_gid in groups:
            return bool(info.st_mode & st.S_IRGRP)
        return bool(info.st_mode & st.S_IROTH)


__all__ = ["Peer", "peer_credentials", "peer_groups"]
