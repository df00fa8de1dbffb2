"""The composition root: real NVML and ``/``, or a simulated workstation.

The only module above ``gpud.hw`` that imports the simulator, and only when simulation is asked
for; everything else receives a ``Machine`` and cannot tell which it is.
"""

from __future__ import annotations

import os
import socket

from gpud.hw.host import Host
from gpud.hw.machine import Machine
from gpud.hw.nvml import Nvml


def open_machine(simulate: str | None = None) -> Machine:
    """Real NVML and ``/``, or the simulated workstation ``simulate`` (a name or a path)."""
    if simulate:
        from gpud.sim import open_simulation  # the simulator is never imported otherwise

        sim = open_simulation(simulate)
        return Machine(Nvml(sim.module), Host(sim.root), sim.description.name, simulation=sim)
    return Machine(Nvml(), Host(os.environ.get("GPUD_ROOT", "/")), socket.gethostname())
