"""Where gpud keeps its state and finds its configuration."""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_DIR = Path("/etc/gpud")
DEFAULT_SOCKET = "/run/gpud/gpud.sock"


def control_socket() -> Path:
    """The daemon's control socket: ``GPUD_SOCKET``, else /run/gpud/gpud.sock."""
    return Path(os.environ.get("GPUD_SOCKET", DEFAULT_SOCKET))


def daemon_running() -> bool:
    """Whether a gpud daemon answers on its control socket."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.2)
    try:
        s.connect(str(control_socket()))
        return True
    except OSError:
        return False
    finally:
        s.close()


def state_dir() -> Path:
    """``GPUD_STATE_DIR``; else ``/var/lib/gpud`` as root, the user's state directory otherwise."""
    env = os.environ.get("GPUD_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/gpud")
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpud"


def atomic_write(path: Path, data: str) -> None:
    """Write temp, fsync, rename: a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def probe_lock_path() -> Path:
    """The training probe's machine-wide lock (one probe at a time, CLI and daemon alike):
    ``GPUD_PROBE_LOCK``; else under ``GPUD_STATE_DIR`` when that is set; else /run/lock (or /tmp)."""
    env = os.environ.get("GPUD_PROBE_LOCK")
    if env:
        return Path(env)
    if os.environ.get("GPUD_STATE_DIR"):
        return state_dir() / "probe.lock"
    base = Path("/run/lock")
    return (base if base.is_dir() and os.access(base, os.W_OK) else Path("/tmp")) / "gpud-probe.lock"


def probe_output_path() -> Path:
    """Where the daemon keeps the stderr of the probe it started last (its failure is logged from it)."""
    return state_dir() / "probe-daemon.err"
