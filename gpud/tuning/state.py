"""The tuning state file: which profile is applied, what it asked for, and the originals.

Written atomically (temp, fsync, rename) *before* the first hardware write of an apply, so a
process killed at any point can be undone by ``gpud restore`` from a new process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpud.paths import atomic_write, state_dir

VERSION = 1


def path() -> Path:
    return state_dir() / "tuning.json"


def load() -> dict[str, Any] | None:
    """The state, or None when nothing is applied (or the file is unreadable)."""
    try:
        data = json.loads(path().read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == VERSION else None


def save(data: dict[str, Any]) -> None:
    atomic_write(path(), json.dumps({**data, "version": VERSION}, indent=1, sort_keys=True))


def clear() -> None:
    try:
        path().unlink()
    except FileNotFoundError:
        pass


def profile_settings(data: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """What the applied profile asked for, per GPU index (for doctor and the daemon)."""
    if not data:
        return {}
    return {int(k): v for k, v in data.get("desired", {}).items() if k.isdigit()}
