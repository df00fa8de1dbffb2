"""sd_notify(3) without a library: one datagram to $NOTIFY_SOCKET (READY=1, WATCHDOG=1, STATUS=…)."""

from __future__ import annotations

import os
import socket


def notify(message: str) -> bool:
    """Send a state change to systemd; False when not run by systemd (no NOTIFY_SOCKET)."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(message.encode())
        return True
    except OSError:
        return False


def watchdog_seconds() -> float | None:
    """The watchdog period systemd expects (WATCHDOG_USEC), if this process is the one watched."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6
