"""Tuning profiles: TOML files, ``extends`` inheritance, validation, resolution per GPU.

Validation happens in two steps, both before anything touches the hardware: the file alone
(keys, types, curve shape, ranges), then against the machine (selectors that match no GPU,
power outside the GPU's constraints, clocks above its maximum, fan duty below its minimum).
Every error names the file and the dotted key (``InvalidInput``: exit 2).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpud.errors import InvalidInput
from gpud.model import GpuInfo
from gpud.paths import CONFIG_DIR
from gpud.profiles.settings import GPU_SETTINGS, PROFILE_KEYS
from gpud.schema import Spec, load_toml, take

USER_DIR = CONFIG_DIR / "profiles"
# Shipped profiles: package data beside this module, as the simulated workstations' descriptions are.
SHIPPED = Path(__file__).resolve().parent / "builtin"
NUM = (int, float)
SETTINGS = tuple(s.profile_key for s in GPU_SETTINGS)  # the names profiles use (and `required` lists)
COMPUTE_MODES = ("default", "exclusive_process", "prohibited")
FAN_MODES = ("auto", "fixed", "curve")

TOP: Spec = {"description": (str, ""), "extends": (str, None), "all": (dict, {}), "gpus": (list, []),
             "host": (dict, {}), "measured": (dict, {})}
# What `gpud tune` measured for a profile it wrote (docs/profiles.md, "[measured]"): a record, never applied.
MEASURED: Spec = {
    "tool": (str, None), "date": (str, None), "machine": (str, None), "driver": (str, None), "gpus": (list, None),
    "goal": (("throughput", "energy", "quiet"), None), "max_slowdown_percent": (NUM, None), "workload": (str, None),
    "figures": (("gpu", "model", "cpu"), None), "baseline_samples_per_second": (NUM, None),
    "baseline_joules_per_sample": (NUM, None), "samples_per_second": (NUM, None), "joules_per_sample": (NUM, None),
    "energy_saving_percent": (NUM, None), "slowdown_percent": (NUM, None), "trials": (int, None),
}
GPU: Spec = {
    "persistence_mode": (bool, None),
    "compute_mode": (COMPUTE_MODES, None),
    "power_limit": ((int, float, str), None),  # watts, "80%", "default", "min", "max"
    "applications_clocks": ((list, str), None),  # [memory MHz, graphics MHz], "max", "reset"
    "gpu_clocks": ((list, str), None),  # locked [min, max] MHz, "max", "reset"
    "memory_clocks": ((list, str), None),
    "fan": (dict, None),
    "required": (list, []),
}
SELECTION: Spec = {**GPU, "select": ((int, str, list), None)}
FAN: Spec = {
    "mode": (FAN_MODES, None),
    "percent": (int, None),
    "points": (list, None),
    "hysteresis": (NUM, 3),
    "minimum": (int, 0),
    "max_ramp": (NUM, 10),
}
HOST: Spec = {"cpu_governor": (str, None)}


@dataclass(frozen=True)
class Profile:
    name: str
    source: str  # the file (or files, for a chain) it came from
    description: str
    all: dict[str, Any]
    gpus: tuple[dict[str, Any], ...]
    host: dict[str, Any]
    chain: tuple[str, ...] = field(default=())
    files: tuple[str, ...] = field(default=())  # every file of the chain
    measured: dict[str, Any] = field(default_factory=dict)  # the file's own [measured] record (gpud tune)


def profile_dirs() -> list[Path]:
    """Users' profiles first, then the shipped ones."""
    return [USER_DIR, SHIPPED]


def find(name_or_path: str) -> Path:
    if "/" in name_or_path or name_or_path.endswith(".toml"):
        return Path(name_or_path)
    for d in profile_dirs():
        p = d / f"{name_or_path}.toml"
        if p.is_file():
            return p
    known = ", ".join(sorted({p.stem for d in profile_dirs() if d.is_dir() for p in d.glob("*.toml")}))
    raise InvalidInput(name_or_path, "", f"no such profile (known: {known})")


def available() -> list[tuple[str, Path]]:
    seen: dict[str, Path] = {}
    for d in profile_dirs():
        for p in sorted(d.glob("*.toml")) if d.is_dir() else []:
            seen.setdefault(p.stem, p)
    return sorted(seen.items())


def _check_fan(fan: dict[str, Any], file: str, where: str) -> dict[str, Any]:
    fan = take(fan, FAN, file, where)
    mode = fan["mode"]
    if mode is None:
        raise InvalidInput(file, f"{where}.mode", f"required: one of {', '.join(FAN_MODES)}")
    for key, belongs in (("points", "curve"), ("percent", "fixed")):
        if fan[key] is not None and mode != belongs:
            raise InvalidInput(file, f"{where}.{key}", f"belongs to mode = \"{belongs}\", not \"{mode}\" "
                                                       "(remove it, or change the mode)")
    if mode == "fixed":
        if fan["percent"] is None:
            raise InvalidInput(file, f"{where}.percent", "required for mode = \"fixed\"")
        if not 0 <= fan["percent"] <= 100:
            raise InvalidInput(file, f"{where}.percent", f"duty must be 0..100 %, not {fan['percent']}")
    if mode == "curve":
        pts = fan["points"]
        if not pts or len(pts) < 2:
            raise InvalidInput(file, f"{where}.points", "a curve needs at least two [°C, %] points")
        prev = None
        for k, p in enumerate(pts):
            key = f"{where}.points[{k}]"
            if (not isinstance(p, list) or len(p) != 2
                    or not all(isinstance(x, NUM) and not isinstance(x, bool) for x in p)):
                raise InvalidInput(file, key, f"must be [temperature °C, duty %], not {p!r}")
            t, duty = p
            if not 0 <= t <= 110:
                raise InvalidInput(file, key, f"temperature {t} °C outside 0..110")
            if not 0 <= duty <= 100:
                raise InvalidInput(file, key, f"duty {duty} % outside 0..100")
            if prev is not None and (t <= prev[0] or duty < prev[1]):
                raise InvalidInput(file, key, "not monotonic: temperatures must rise and duties must not fall "
                                              f"({prev} then {p})")
            prev = p
    if not 0 <= fan["hysteresis"] <= 20:
        raise InvalidInput(file, f"{where}.hysteresis", "must be 0..20 °C")
    if not 0 <= fan["minimum"] <= 100:
        raise InvalidInput(file, f"{where}.minimum", "must be 0..100 %")
    if not 0 < fan["max_ramp"] <= 100:
        raise InvalidInput(file, f"{where}.max_ramp", "must be in (0, 100] %/s")
    return fan


def _check_clocks(value: Any, file: str, key: str, keywords: tuple[str, ...]) -> None:
    if isinstance(value, str):
        if value not in keywords:
            raise InvalidInput(file, key, f"must be [low, high] MHz or one of {', '.join(keywords)}, not {value!r}")
        return
    if (len(value) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in value)
            or (key.endswith("_clocks") and not key.endswith("applications_clocks") and value[0] > value[1])):
        raise InvalidInput(file, key, f"must be two positive MHz values{' [min, max]' if 'appl' not in key else ''}"
                                      f", not {value!r}")


def _check_gpu_settings(table: dict[str, Any], file: str, where: str, spec: Spec) -> dict[str, Any]:
    out = take(table, spec, file, where)
    out = {k: v for k, v in out.items() if v is not None and not (k == "required" and not v)}
    p = out.get("power_limit")
    if isinstance(p, str) and p not in ("default", "min", "max") and not re.fullmatch(r"\d+(\.\d+)?%", p):
        raise InvalidInput(file, f"{where}.power_limit", f"must be watts, \"NN%\" of the default, \"default\", "
                                                         f"\"min\" or \"max\", not {p!r}")
    if isinstance(p, (int, float)) and p <= 0:
        raise InvalidInput(file, f"{where}.power_limit", "must be positive")
    for key, words in (("gpu_clocks", ("max", "reset")), ("memory_clocks", ("max", "reset")),
                       ("applications_clocks", ("max", "reset"))):
        if key in out:
            _check_clocks(out[key], file, f"{where}.{key}", words)
    if "fan" in out:
        out["fan"] = _check_fan(out["fan"], file, f"{where}.fan")
    for r in out.get("required", []):
        if r not in SETTINGS:
            raise InvalidInput(file, f"{where}.required", f"unknown setting {r!r} (settings: {', '.join(SETTINGS)})")
    return out


def _read(path: Path) -> tuple[dict[str, Any], str]:
    # Opened once and checked on that descriptor (as root: owned by root, not writable by others, no
    # symbolic link, directories only root can change): what is parsed is what was checked.
    data, _ = load_toml(path, str(path), trust="profile")
    return data, str(path)


def parse(data: dict[str, Any], file: str) -> dict[str, Any]:
    """One file's own content, validated (before inheritance)."""
    top = take(data, TOP, file, "")
    top["all"] = _check_gpu_settings(top["all"], file, "all", GPU)
    gpus = []
    for k, sel in enumerate(top["gpus"]):
        if not isinstance(sel, dict):
            raise InvalidInput(file, f"gpus[{k}]", "must be a table")
        entry = _check_gpu_settings(sel, file, f"gpus[{k}]", SELECTION)
        if "select" not in entry:
            raise InvalidInput(file, f"gpus[{k}].select", "required: GPU indices, UUIDs or a model name")
        entry["_where"] = f"gpus[{k}]"
        entry["_file"] = file
        gpus.append(entry)
    top["gpus"] = gpus
    top["host"] = {k: v for k, v in take(top["host"], HOST, file, "host").items() if v is not None}
    top["measured"] = {k: v for k, v in take(top["measured"], MEASURED, file, "measured").items() if v is not None}
    if any(not isinstance(g, str) for g in top["measured"].get("gpus", [])):
        raise InvalidInput(file, "measured.gpus", "must be a list of strings (each GPU's model and UUID)")
    return top


def load(name_or_path: str) -> Profile:
    """Load a profile and its ``extends`` chain (cycles refused). Each file of the chain is read as
    ``gpud.paths.read_trusted`` reads: as root, one another user could have written is refused."""
    chain: list[tuple[Path, dict[str, Any]]] = []
    seen: list[str] = []
    current: str | None = name_or_path
    child_file = None
    while current is not None:
        try:
            if child_file is not None and ("/" in current or current.endswith(".toml")):
                path = Path(child_file).parent / Path(current).expanduser()  # relative to the file that extends
            else:
                path = find(current)
        except InvalidInput as err:
            if child_file is None:
                raise
            raise InvalidInput(child_file, "extends", f"no profile named {current!r}") from err
        if child_file is not None and not path.is_file():
            raise InvalidInput(child_file, "extends", f"no profile file {current!r} (looked for {path})")
        key = str(path.resolve())
        if key in seen:
            raise InvalidInput(str(path), "extends", "inheritance cycle: " + " → ".join(
                [Path(s).stem for s in seen] + [path.stem]))
        seen.append(key)
        data, file = _read(path)
        own = parse(data, file)
        chain.append((path, own))
        child_file = file
        current = own["extends"]
    merged: dict[str, Any] = {"all": {}, "gpus": [], "host": {}}
    for _, own in reversed(chain):  # the root first; children override
        for k, v in own["all"].items():
            merged["all"][k] = copy.deepcopy(v)
        merged["gpus"].extend(copy.deepcopy(own["gpus"]))
        merged["host"].update(own["host"])
    first_path, first = chain[0]
    return Profile(name=first_path.stem, source=str(first_path), description=first["description"] or next(
        (own["description"] for _, own in chain if own["description"]), ""), all=merged["all"],
        gpus=tuple(merged["gpus"]), host=merged["host"], chain=tuple(p.stem for p, _ in chain),
        files=tuple(str(p) for p, _ in chain), measured=first["measured"])


# -- against the machine --------------------------------------------------------------------


def _matches(selector: Any, g: GpuInfo) -> bool:
    items = selector if isinstance(selector, list) else [selector]
    for s in items:
        if isinstance(s, bool):
            continue
        if isinstance(s, int) and s == g.index:
            return True
        if isinstance(s, str) and (s == g.uuid or s.lower() in g.name.lower()):
            return True
    return False


def resolve(profile: Profile, gpus: list[GpuInfo]) -> dict[int, dict[str, Any]]:
    """Desired settings per GPU index, in absolute units, checked against each GPU's limits."""
    for sel in profile.gpus:
        if not any(_matches(sel["select"], g) for g in gpus):
            raise InvalidInput(sel["_file"], f"{sel['_where']}.select",
                               f"{sel['select']!r} matches no GPU (GPUs: "
                               + ", ".join(f"{g.index} {g.name}" for g in gpus) + ")")
    out: dict[int, dict[str, Any]] = {}
    for g in gpus:
        wanted: dict[str, Any] = {k: v for k, v in profile.all.items()}
        where = {k: (profile.source, f"all.{k}") for k in wanted}
        for sel in profile.gpus:
            if _matches(sel["select"], g):
                for k, v in sel.items():
                    if not k.startswith("_") and k != "select":
                        wanted[k] = v
                        where[k] = (sel["_file"], f"{sel['_where']}.{k}")
        out[g.index] = _absolute(g, wanted, where)
    return out


def _absolute(g: GpuInfo, wanted: dict[str, Any], where: dict[str, tuple[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {"required": list(wanted.pop("required", []))}
    for key, value in wanted.items():
        file, dotted = where[key]
        if key == "power_limit":  # watts, a share of the default, default/min/max → watts
            out[PROFILE_KEYS[key]] = _watts(g, value, file, dotted)
        elif key in ("gpu_clocks", "memory_clocks"):
            top = g.max_clocks_mhz.get("sm" if key == "gpu_clocks" else "memory")
            if value == "reset":
                out[key] = "reset"
            elif top is None:
                out[key] = "unsupported"
            else:
                lo, hi = (top, top) if value == "max" else value
                if hi > top:
                    raise InvalidInput(file, dotted, f"{hi} MHz is above GPU {g.index}'s maximum {top} MHz")
                out[key] = [lo, hi]
        elif key == "applications_clocks":
            mem, gfx = g.max_clocks_mhz.get("memory"), g.max_clocks_mhz.get("graphics")
            if value == "reset":
                out[key] = "reset"
            elif mem is None or gfx is None:
                out[key] = "unsupported"
            else:
                pair = [mem, gfx] if value == "max" else value
                if pair[0] > mem or pair[1] > gfx:
                    raise InvalidInput(file, dotted, f"{pair} MHz is above GPU {g.index}'s maximum [{mem}, {gfx}]")
                out[key] = pair
        elif key == "fan":
            out["fan"] = _fan_for(g, value, file, dotted)
        else:
            out[key] = value
    return out


def _watts(g: GpuInfo, value: Any, file: str, dotted: str) -> float | None:
    lo, hi, default = g.power_min_limit_watts, g.power_max_limit_watts, g.power_default_limit_watts
    if lo is None or hi is None or default is None:
        return None  # power management not supported: the plan skips it
    if value == "default":
        w = default
    elif value == "max":
        w = hi
    elif value == "min":
        w = lo
    elif isinstance(value, str):
        w = default * float(value[:-1]) / 100.0
    else:
        w = float(value)
    w = round(w)
    if not lo <= w <= hi:
        raise InvalidInput(file, dotted, f"{w:.0f} W is outside GPU {g.index}'s limits {lo:.0f}..{hi:.0f} W "
                                         f"({g.name})")
    return float(w)


def _fan_for(g: GpuInfo, fan: dict[str, Any], file: str, dotted: str) -> dict[str, Any]:
    shutdown = g.temperature_shutdown_celsius
    if fan["mode"] == "curve" and shutdown is not None:
        for k, (t, _) in enumerate(fan["points"]):
            if t >= shutdown:
                raise InvalidInput(file, f"{dotted}.points[{k}]",
                                   f"{t} °C is at or above GPU {g.index}'s shutdown temperature ({shutdown} °C, "
                                   "NVML's NVML_TEMPERATURE_THRESHOLD_SHUTDOWN): the GPU is off before it applies")
    fmin = g.fan_min_speed_percent
    if fan["mode"] != "auto" and fmin is not None:
        duties = [fan["percent"]] if fan["mode"] == "fixed" else [d for _, d in fan["points"]]
        if fan["minimum"]:
            duties.append(fan["minimum"])
        low = min(duties)
        if low < fmin:
            raise InvalidInput(file, dotted, f"duty {low} % is below GPU {g.index}'s minimum fan speed {fmin} %")
    return dict(fan)
