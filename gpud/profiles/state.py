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
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpud.errors import GpudError, InvalidInput
from gpud.paths import atomic_write, depth, open_trusted, read_fd, state_dir
from gpud.profiles.settings import GPU_SETTINGS, HOST_SETTINGS, Gpu, Host, Target, target_keyed

VERSION = 1
MAX_STATE = 1 << 20


class StateError(GpudError):
    """tuning.json exists but cannot be used, or cannot be written."""


def _kind(value: Any) -> str:
    return {dict: "a table", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


# the keys TuningState.from_json checks (null is absent for each): key, test, what it should be
_TYPES: tuple[tuple[str, Any, str], ...] = (
    ("profile", lambda v: isinstance(v, str), "a profile name"),
    ("source", lambda v: isinstance(v, str), "a file name"),
    ("chain", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of profile names"),
    ("desired", lambda v: isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),
     "a table of settings"),
    ("originals", lambda v: isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),
     "a table of settings"),
    ("pending", lambda v: isinstance(v, bool), "true or false"),
    ("started_at", _number, "a time (seconds since 1970)"),
    ("applied_at", _number, "a time (seconds since 1970)"),
    ("target", lambda v: isinstance(v, str), "a machine's name"),
)


# Every value a state file may hold for a setting, in ``desired`` and in ``originals`` alike: each tunable's
# own (``Setting.stored``); "unsupported" (desired only) is accepted for each. One table, read by
# ``TuningState.from_json``: verify, restore and apply all read the file through it, so they agree.
SETTING_VALUES: dict[str, tuple[Any, str]] = {
    **{s.key: (s.stored, s.stored_as) for s in GPU_SETTINGS},
    "required": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of setting names"),
}
HOST_VALUES: dict[str, tuple[Any, str]] = {s.key: (s.stored, s.stored_as) for s in HOST_SETTINGS}


def _check_settings(section: str, table: Mapping[str, Any]) -> None:
    """ValueError naming the first value of ``desired`` or ``originals`` gpud could not act on."""
    for where, values in table.items():
        t = target_keyed(str(where))
        known = None if t is None else HOST_VALUES if isinstance(t, Host) else SETTING_VALUES
        if known is None:
            raise ValueError(f"'{section}.{where}' is neither a GPU index nor \"host\"")
        for key, value in values.items():
            if key not in known:
                raise ValueError(f"'{section}.{where}.{key}' is not a setting this gpud knows")
            ok, what = known[key]
            if not ok(value) and not (section == "desired" and value == "unsupported"):
                raise ValueError(f"'{section}.{where}.{key}' is {_kind(value)} ({str(value)[:40]!r}), not {what}")


@dataclass(frozen=True)
class TuningState:
    """What ``tuning.json`` holds. ``desired`` and ``originals`` are keyed by GPU index as text
    ("0", "1", …) and "host", then by setting key (``gpud.profiles.settings``); values are as written
    to the file. Keys this gpud does not know are kept in ``extra`` and written back unchanged."""

    profile: str | None = None
    source: str | None = None
    chain: tuple[str, ...] = ()
    desired: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    originals: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    pending: bool = False  # saved before the first write; False once every write was read back
    started_at: float | None = None
    applied_at: float | None = None
    target: str | None = None  # the machine it was applied to (``engine.target``); None in older files
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TuningState:
        """The state a file holds; ValueError ("'key' is …, not …") for a value of the wrong type."""
        for key, ok, what in _TYPES:
            if data.get(key) is not None and not ok(data[key]):
                raise ValueError(f"'{key}' is {_kind(data[key])}, not {what}")
        for section in ("desired", "originals"):
            _check_settings(section, data.get(section) or {})
        known = {f.name for f in fields(cls)} - {"extra"}
        return cls(profile=data.get("profile"), source=data.get("source"), chain=tuple(data.get("chain") or ()),
                   desired={str(k): dict(v) for k, v in (data.get("desired") or {}).items()},
                   originals={str(k): dict(v) for k, v in (data.get("originals") or {}).items()},
                   pending=bool(data.get("pending", False)), started_at=data.get("started_at"),
                   applied_at=data.get("applied_at"), target=data.get("target"),
                   extra={k: v for k, v in data.items() if k not in known and k != "version"})

    def to_json(self) -> dict[str, Any]:
        """The file's content, as gpud has always written it (``applied_at`` once applied, ``target`` when known)."""
        out: dict[str, Any] = {**self.extra, "profile": self.profile, "source": self.source,
                               "chain": list(self.chain), "desired": {k: dict(v) for k, v in self.desired.items()},
                               "originals": {k: dict(v) for k, v in self.originals.items()},
                               "pending": self.pending, "started_at": self.started_at, "version": VERSION}
        if self.target is not None:  # older files have none
            out["target"] = self.target
        if self.applied_at is not None:
            out["applied_at"] = self.applied_at
        return out

    def gpu_indices(self) -> set[int]:
        """The GPUs the applied profile gives settings (``gpu_desired``'s keys, without copying its settings:
        the daemon asks every tick)."""
        return {t.index for k in self.desired if isinstance(t := target_keyed(k), Gpu)}

    def gpu_desired(self) -> dict[int, dict[str, Any]]:
        """What the applied profile asked for, per GPU index (the host's settings left out)."""
        return {t.index: want for t, want in by_target(self.desired).items() if isinstance(t, Gpu)}


def by_target(section: Mapping[str, Mapping[str, Any]]) -> dict[Target, dict[str, Any]]:
    """``desired`` or ``originals`` keyed by target: the GPUs in index order, then the host (keys that name
    neither are left out; ``from_json`` refused them)."""
    out = {t: dict(v) for k, v in section.items() if (t := target_keyed(k)) is not None}
    return dict(sorted(out.items(), key=lambda kv: (isinstance(kv[0], Host), kv[0].gpu or 0)))


def gpu_profiles(data: TuningState | None) -> tuple[tuple[int, str, str], ...]:
    """(gpu, profile, rule) of each GPU the state file gives settings: the rule that switched it
    (``extra["rules"]``, written by the daemon's rules), else the applied profile with rule ""."""
    if data is None:
        return ()
    raw = data.extra.get("rules")
    rules = raw if isinstance(raw, dict) else {}
    out = []
    for key in sorted(set(data.gpu_desired()) | {int(k) for k in rules if str(k).isdigit()}):
        got = rules.get(str(key))
        if isinstance(got, dict) and isinstance(got.get("profile"), str):
            out.append((key, str(got["profile"]), str(got.get("rule") or "")))
        elif data.profile:
            out.append((key, data.profile, ""))
    return tuple(out)


def path() -> Path:
    return state_dir() / "tuning.json"


def _bad(p: Path, why: str) -> StateError:
    err = StateError(f"{p}: {why}: gpud cannot tell which settings it changed or what they were before")
    err.remedy = (f"if a backup exists put it back; otherwise move the file aside (`mv {p} {p}.bad`) and put "
                  "the driver's defaults back with `gpud apply balanced`")
    return err


def read() -> TuningState | None:
    """The state; None when no file exists (nothing applied). Anything else wrong → StateError."""
    p = path()
    try:
        # One descriptor, checked as it is read: as root the file steers what gpud writes to the GPUs, so
        # one another user could have written (or a symbolic link, or in a directory others can change)
        # is refused.
        fd = open_trusted(p, "state file")
        try:
            raw = read_fd(fd, MAX_STATE)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _bad(p, f"cannot read ({err.strerror})") from err
    except InvalidInput as err:
        raise _bad(p, err.reason) from err
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
    try:
        return TuningState.from_json(data)
    except ValueError as err:  # a value of the wrong type: the key and what it should be
        raise _bad(p, str(err)) from err
    except (TypeError, AttributeError) as err:
        raise _bad(p, "not a gpud state file") from err


def load() -> TuningState | None:
    """The state for readers that only report (doctor, metrics): None when absent or unusable."""
    try:
        return read()
    except StateError:
        return None


def save(data: TuningState) -> None:
    """Write the state atomically; StateError (no temporary file left) when it cannot be written."""
    try:
        atomic_write(path(), json.dumps(data.to_json(), indent=1, sort_keys=True))
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


def profile_settings(data: TuningState | None) -> dict[int, dict[str, Any]]:
    """What the applied profile asked for, per GPU index (for doctor and the daemon)."""
    return data.gpu_desired() if data is not None else {}
