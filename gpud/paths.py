"""Where gpud keeps its state and finds its configuration."""

from __future__ import annotations

import os
from pathlib import Path

CONFIG_DIR = Path("/etc/gpud")


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
