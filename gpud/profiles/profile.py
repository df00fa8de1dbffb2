"""Tuning profiles: TOML files, ``extends`` inheritance, validation, resolution per GPU.

Validation happens in two steps, both before anything touches the hardware: the file alone
(keys, types, curve shape, ranges), then against the machine (selectors that match no GPU,
power outside the GPU's constraints, clocks above its maximum, fan duty below its minimum).
Every error names the file and the dotted key (``InvalidInput``: exit 2).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpud.errors import InvalidInput
from gpud.model import GpuInfo
from gpud.paths import CONFIG_DIR
from gpud.profiles.settings import BY_PROFILE_KEY, GPU_SETTINGS, HOST_SETTINGS
from gpud.schema import Spec, load_toml, take

USER_DIR = CONFIG_DIR / "profiles"
# Shipped profiles: package data beside this module, as the simulated workstations' descriptions are.
SHIPPED = Path(__file__).resolve().parent / "builtin"
NUM = (int, float)
SETTINGS = tuple(s.profile_key for s in GPU_SETTINGS)  # the names profiles use (and `required` lists)

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
# A GPU's settings: each tunable's own type (``Setting.spec``), then its checks (``Setting.parse``).
GPU: Spec = {**{s.profile_key: (s.spec, None) for s in GPU_SETTINGS}, "required": (list, [])}
SELECTION: Spec = {**GPU, "select": ((int, str, list), None)}
HOST: Spec = {s.profile_key: (s.spec, None) for s in HOST_SETTINGS}


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


def _check_gpu_settings(table: dict[str, Any], file: str, where: str, spec: Spec) -> dict[str, Any]:
    out = take(table, spec, file, where)
    out = {k: v for k, v in out.items() if v is not None and not (k == "required" and not v)}
    for setting in GPU_SETTINGS:
        if setting.profile_key in out:
            out[setting.profile_key] = setting.parse(out[setting.profile_key], file, f"{where}.{setting.profile_key}")
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
    host = {k: v for k, v in take(top["host"], HOST, file, "host").items() if v is not None}
    top["host"] = {s.profile_key: s.parse(host[s.profile_key], file, f"host.{s.profile_key}")
                   for s in HOST_SETTINGS if s.profile_key in host}
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
    """GPU ``g``'s settings keyed as the state file and plans key them, each in its absolute units."""
    out: dict[str, Any] = {"required": list(wanted.pop("required", []))}
    for name, value in wanted.items():
        setting = BY_PROFILE_KEY[name]
        out[setting.key] = setting.resolve(g, value, *where[name])
    return out
