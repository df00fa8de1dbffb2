"""``gpud sim import``: a simulated twin of a real machine from its ``nvidia-smi`` output.

``read`` turns ``nvidia-smi -q`` (text or ``-x`` XML) into entries with their line numbers,
``fields`` knows the names drivers have printed each field under, ``topo`` reads ``nvidia-smi
topo -m``, ``place`` lays out root ports, switches, NUMA nodes and NVLinks, ``build`` makes the
description and notes what it inferred; ``render`` writes it as TOML. Bad input is
``file:line: reason`` (``InvalidInput``, exit code 2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gpud.sim.dump.build import Twin, build, check
from gpud.sim.dump.read import read_dump
from gpud.sim.dump.topo import read_topo

__all__ = ["Twin", "import_dump", "render"]


def import_dump(q: Path, topo: Path | None = None, xml: bool | None = None, name: str = "twin",
                shown_q: str | None = None, shown_topo: str | None = None) -> Twin:
    """Read the dump (and ``topo -m``), build the description and check that it loads."""
    dump = read_dump(q, shown_q or str(q), xml)
    matrix = read_topo(topo, shown_topo or str(topo)) if topo is not None else None
    twin = build(dump, matrix, machine_name(name))
    check(twin)
    return twin


def machine_name(stem: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")
    return name if name and name[0].isalnum() else f"twin-{name}".rstrip("-")


def render(twin: Twin) -> str:
    """The description as TOML, with a comment block naming the sources and what was inferred."""
    inferred, unread = twin.notes.lines(len(twin.data["gpu"]))
    head = [f"# A twin of a real machine, made by `gpud sim import` from {twin.dump.file}"
            + (f" and {twin.topo.file}" if twin.topo else "") + "."]
    head.append("# Inferred (the dump does not say it):")
    head += [f"#   {line}" for line in inferred] or ["#   nothing"]
    if unread:
        head.append("# In the dump but not reproduced:")
        head += [f"#   {line}" for line in unread]
    out = head + ["", "[machine]"] + [f"{k} = {_value(v)}" for k, v in twin.data["machine"].items()]
    for g in twin.data["gpu"]:
        out += ["", "[[gpu]]"] + [f"{k} = {_value(v, k)}" for k, v in g.items()]
    for table in ("nvlink", "fault"):
        for item in twin.data.get(table, []):
            out += ["", f"[[{table}]]"] + [f"{k} = {_value(v)}" for k, v in item.items()]
    return "\n".join(out) + "\n"


def _value(v: Any, key: str = "") -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int) and key.startswith("pci_"):
        return f"0x{v:08X}"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")
