"""Helpers for the tuning tests: a tiny TOML writer, machine fingerprints, an in-process CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpud.backends import open_machine
from gpud.hw.machine import Machine


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")  # JSON escapes suit TOML
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f'"{k}" = {_value(x)}' for k, x in v.items()) + " }"
    raise TypeError(v)


def to_toml(data: dict[str, Any]) -> str:
    """Enough TOML for profiles: top-level scalars, tables, arrays of tables (inline sub-tables)."""
    lines = [f'"{k}" = {_value(v)}' for k, v in data.items() if not isinstance(v, dict) and not (
        isinstance(v, list) and v and all(isinstance(x, dict) for x in v))]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f'["{k}"]')
            lines += [f'"{kk}" = {_value(vv)}' for kk, vv in v.items()]
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for item in v:
                lines.append(f'[["{k}"]]')
                lines += [f'"{kk}" = {_value(vv)}' for kk, vv in item.items()]
    return "\n".join(lines) + "\n"


def fingerprint(m: Machine) -> dict[str, Any]:
    """Everything tuning may touch, as the hardware holds it (NVML readings + what has no getter)."""
    snap = m.snapshot()
    sim = m.simulation.machine
    out: dict[str, Any] = {"governors": sorted(set(m.host.cpu_governors().values()))}
    for s in snap.samples:
        st = sim.settings(s.index)
        out[str(s.index)] = {
            "power": s.power_management_limit_watts, "persistence": s.persistence_mode, "compute": s.compute_mode,
            "app_clocks": s.applications_clocks_mhz, "locked_gpu": st["locked_gpu"], "locked_mem": st["locked_mem"],
            "fans": [(f.policy, f.target_percent if f.policy == "manual" else None) for f in s.fans],
            "offsets": dict(s.clock_offsets_mhz),
        }
    return out


def fresh(name: str = "z8-fury-4x-a6000") -> Machine:
    return open_machine(name)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the real CLI entry point in this process; (exit code, stdout, stderr)."""
    from gpud.cli import main

    code = 0
    try:
        main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


RICH = {
    "description": "touches every tunable",
    "all": {"persistence_mode": True, "compute_mode": "exclusive_process", "power_limit": 250,
            "applications_clocks": [8001, 2100], "gpu_clocks": [1500, 2000], "memory_clocks": "max"},
    "host": {"cpu_governor": "powersave"},
}


def write_profile(tmp_path: Path, data: dict[str, Any], name: str = "p.toml") -> Path:
    p = tmp_path / name
    p.write_text(to_toml(data))
    return p
