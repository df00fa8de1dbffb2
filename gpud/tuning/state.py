"""The tuning state file: which profile is applied, what it asked for, and the originals.

Written atomically (temp, fsync, rename) *before* the first hardware write of an apply, so a
process killed at any point can be undone by ``gpud restore`` from a new process. The originals
are written once, by the first apply, and kept until a restore completes: later applies only
add originals of settings not yet recorded.

A file that exists but cannot be trusted (unreadable, not JSON, truncated, another version) is an
error (``StateError``), never "nothing applied": the GPUs may be tuned and the file is the only
record of what they were before.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpud.errors import GpudError
from gpud.paths import atomic_write, depth, state_dir

VERSION = 1
MAX_STATE = 1 << 20


class StateError(GpudError):
    """tuning.json exists but cannot be used, or cannot be written."""


def path() -> Path:
    return state_dir() / "tuning.json"


def _bad(p: Path, why: str) -> StateError:
    err = StateError(f"{p}: {why}: gpud cannot tell which settings it changed or what they were before")
    err.remedy = (f"if a backup exists put it back; otherwise move the file aside (`mv {p} {p}.bad`) and put "
                  "the driver's defaults back with `gpud apply balanced`")
    return err


def read() -> dict[str, Any] | None:
    """The state; None when no file exists (nothing applied). Anything else wrong → StateError."""
    p = path()
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_STATE + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _bad(p, f"cannot read ({err.strerror})") from err
    if len(raw) > MAX_STATE:
        raise _bad(p, "larger than 1 MiB")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise _bad(p, "not valid JSON (truncated or corrupt)") from err
    if not isinstance(data, dict) or depth(data) > 8:
        raise _bad(p, "not a gpud state file")
    if data.get("version") != VERSION:
        raise _bad(p, f"version {data.get('version')!r}, this gpud reads version {VERSION}")
    for key in ("desired", "originals"):
        if not isinstance(data.get(key, {}), dict) or not all(
                isinstance(v, dict) for v in data.get(key, {}).values()):
            raise _bad(p, f"'{key}' is not a table of settings")
    if not data.get("profile") and not data.get("originals"):
        return None  # a restore that could not remove the file emptied it
    return data


def load() -> dict[str, Any] | None:
    """The state for readers that only report (doctor, metrics): None when absent or unusable."""
    try:
        return read()
    except StateError:
        return None


def save(data: dict[str, Any]) -> None:
    """Write the state atomically; StateError (no temporary file left) when it cannot be written."""
    try:
        atomic_write(path(), json.dumps({**data, "version": VERSION}, indent=1, sort_keys=True))
    except OSError as err:
        e = StateError(f"cannot save {path()}: {err.strerror or err}")
        e.remedy = f"free space or make {path().parent} writable (GPUD_STATE_DIR chooses another directory)"
        raise e from err


def clear() -> str | None:
    """Remove the state (restore completed). When the file cannot be removed it is emptied in place
    (which reads as "nothing applied"); the reason is returned when even that fails."""
    p = path()
    try:
        p.unlink()
        return None
    except FileNotFoundError:
        return None
    except OSError as err:
        why = err.strerror
    try:
        fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, json.dumps({"version": VERSION, "originals": {}}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        return None
    except OSError as err:
        return f"{p} could not be removed ({why}) nor emptied ({err.strerror}): remove it by hand"


def profile_settings(data: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """What the applied profile asked for, per GPU index (for doctor and the daemon)."""
    if not data:
        return {}
    return {int(k): v for k, v in data.get("desired", {}).items() if k.isdigit()}
