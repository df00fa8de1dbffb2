"""The simulated workstation: a stand-in NVML C library under the real ``pynvml``, and a root tree
for ``gpud.hw.host``.

Imported only when ``--simulate`` / ``GPUD_SIMULATE`` asks for it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from gpud.paths import state_dir
from gpud.sim.bindings import bindings_over
from gpud.sim.description import Description, load, resolve, shipped_names
from gpud.sim.libnvml import SimLibrary
from gpud.sim.machine import SimMachine
from gpud.sim.rootfs import ensure_root

__all__ = ["Simulation", "open_simulation", "reset", "shipped", "sim_dir"]


@dataclass
class Simulation:
    description: Description
    machine: SimMachine
    library: SimLibrary
    module: ModuleType  # the installed pynvml, over ``library``
    root: Path

    def refresh_root(self) -> Path:
        """Rebuild the root tree after faults were injected (xid, link width…)."""
        return ensure_root(self.machine, self.root)


def sim_dir() -> Path:
    return state_dir() / "sim"


def open_simulation(name_or_path: str) -> Simulation:
    path, shown = resolve(name_or_path)
    desc = load(path, shown)
    base = sim_dir()
    machine = SimMachine(desc, base / f"{desc.name}.json")
    root = ensure_root(machine, base / desc.name / "root")
    library = SimLibrary(machine)
    return Simulation(desc, machine, library, bindings_over(library), root)


def reset(name_or_path: str) -> list[Path]:
    """Forget what was written to the simulated hardware and the injected faults."""
    path, shown = resolve(name_or_path)
    name = load(path, shown).name
    removed = []
    for p in (sim_dir() / f"{name}.json", sim_dir() / name):
        if p.is_dir():
            shutil.rmtree(p)
            removed.append(p)
        elif p.exists():
            p.unlink()
            removed.append(p)
    return removed


def shipped() -> list[Description]:
    return [load(resolve(n)[0], n) for n in shipped_names()]
