"""The simulated workstation: a stand-in for ``pynvml`` and a root tree for ``gpud.hw.host``.

Imported only when ``--simulate`` / ``GPUD_SIMULATE`` asks for it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from gpud.paths import state_dir
from gpud.sim.description import Description, load, resolve, shipped_names
from gpud.sim.fake_nvml import FakeNvml
from gpud.sim.machine import SimMachine
from gpud.sim.rootfs import ensure_root

__all__ = ["Simulation", "open_simulation", "reset", "shipped", "sim_dir"]


@dataclass
class Simulation:
    description: Description
    machine: SimMachine
    module: FakeNvml
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
    return Simulation(desc, machine, FakeNvml(machine), root)


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
