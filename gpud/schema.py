"""Checking TOML tables against a small schema: one error, naming file, key and reason."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpud.errors import InvalidInput
from gpud.paths import MAX_DEPTH, MAX_INPUT, depth, read_limited, read_trusted

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REQUIRED = object()  # a spec default meaning "this key must be given"
Spec = dict[str, tuple[Any, Any]]  # key: (type, tuple of types, or tuple of allowed strings; default)
T = TypeVar("T")


def load_toml(path: Path, shown: str | None = None, trust: str | None = None) -> tuple[dict[str, Any], bytes]:
    """Parse a TOML file; unreadable or malformed → InvalidInput naming the file. ``trust`` names a
    file that steers gpud ("profile", "configuration"): it is opened once and checked on that
    descriptor (``gpud.paths.read_trusted``: as root, owned by root, in directories only root can
    change), and what is parsed is what was read from it."""
    file = shown or str(path)
    # larger than 1 MiB: refused before parsing
    raw = read_trusted(path, trust, MAX_INPUT, file) if trust else read_limited(path, MAX_INPUT, file)
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise InvalidInput(file, "", f"not valid TOML: {err}") from err
    except RecursionError as err:
        raise InvalidInput(file, "", f"nested more than {MAX_DEPTH} deep") from err
    if depth(data) > MAX_DEPTH:
        raise InvalidInput(file, "", f"nested more than {MAX_DEPTH} deep")
    return data, raw


def not_finite(value: Any, where: str = "") -> str | None:
    """The dotted place of the first NaN or ±inf in ``value`` (TOML allows both), else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    if isinstance(value, dict):
        items: Any = value.items()
    elif isinstance(value, list):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for k, v in items:
        sub = (f"{where}{k}" if str(k).startswith("[") else f"{where}.{k}" if where else str(k))
        found = not_finite(v, sub)
        if found is not None:
            return found
    return None


def parse_toml_value(raw: str) -> Any:
    """A command-line value written in TOML (``2``, ``[2, 3]``, ``"x"``); a bare word is a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _type_ok(value: Any, kind: Any) -> bool:
    if isinstance(kind, tuple) and kind and isinstance(kind[0], str):
        return value in kind
    if kind is int or (isinstance(kind, tuple) and int in kind and float not in kind and bool not in kind):
        if isinstance(value, bool):
            return False
    if isinstance(kind, tuple) and float in kind and isinstance(value, bool):
        return False
    return isinstance(value, kind)


def _kind_name(kind: Any) -> str:
    if isinstance(kind, tuple) and kind and isinstance(kind[0], str):
        return "one of " + ", ".join(repr(k) for k in kind)
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    name = str(kind.__name__)
    return {"str": "a string", "int": "an integer", "bool": "true or false", "list": "a list",
            "dict": "a table"}.get(name, name)


def take(table: Any, spec: dict[str, tuple[Any, Any]], file: str, where: str) -> dict[str, Any]:
    """Check ``table`` against ``spec``; fill defaults; raise InvalidInput on the first problem."""
    if not isinstance(table, dict):
        raise InvalidInput(file, where, "must be a table")
    out: dict[str, Any] = {}
    for key, value in table.items():
        dotted = f"{where}.{key}" if where else key
        if key not in spec:
            raise InvalidInput(file, dotted, f"unknown key (known: {', '.join(sorted(spec))})")
        kind = spec[key][0]
        bad = not_finite(value, dotted)
        if bad is not None:
            raise InvalidInput(file, bad, "must be a finite number (not nan or inf)")
        if not _type_ok(value, kind):
            raise InvalidInput(file, dotted, f"must be {_kind_name(kind)}, not {value!r}")
        out[key] = value
    for key, (_, default) in spec.items():
        if key not in out:
            if default is REQUIRED:
                raise InvalidInput(file, f"{where}.{key}" if where else key, "required")
            out[key] = list(default) if isinstance(default, list) else default
    return out




def key(kind: Any, default: Any = None, *, between: tuple[float, float, str] | None = None) -> Any:
    """A configuration key declared once, as a dataclass field: its TOML ``kind`` (as in a ``Spec``),
    its default (a list or table default is copied for each instance) and, optionally, the closed
    range ``(lo, hi, unit)`` that ``out_of_range`` checks."""
    meta = {"kind": kind, "default": default, "between": between}
    if isinstance(default, (list, dict)):
        factory: Callable[[], Any] = lambda: type(default)(default)  # noqa: E731
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def spec_of(cls: type) -> Spec:
    """The ``Spec`` of a dataclass whose fields were declared with ``key``."""
    return {f.name: (f.metadata["kind"], f.metadata["default"]) for f in dataclasses.fields(cls)}


def build(cls: type[T], table: Any, file: str, where: str) -> T:
    """``take`` against the dataclass's own spec, then the dataclass."""
    return cls(**take(table, spec_of(cls), file, where))


def out_of_range(section: Any, file: str, where: str) -> None:
    """The first field outside its declared ``between`` range (in declaration order) → InvalidInput
    ``where.key: must be LO..HI UNIT, not VALUE``."""
    for f in dataclasses.fields(section):
        between = f.metadata.get("between")
        value = getattr(section, f.name)
        if between is not None and value is not None:
            lo, hi, unit = between
            if not lo <= value <= hi:
                raise InvalidInput(file, f"{where}.{f.name}", f"must be {lo}..{hi}{' ' + unit if unit else ''}, "
                                                             f"not {value}")
