"""The machine before and during a probe: which GPUs CUDA will number, which are busy, each rank's
CPUs, ACS above the GPUs, the load monitor (PCIe generation under load, clock events, other jobs)
and the view the diagnosis judges."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.model import ACS_BITS, GpuInfo, GpuProcess
from gpud.probe.diagnose import Seen, View
from gpud.probe.expect import cpu_link, cpu_vendor

ACS_P2P_BITS = 0x01 | 0x04 | 0x08  # SrcValid, ReqRedir, CmpltRedir (as gpud doctor's pcie.acs)
BUSY_UTILIZATION = 5  # percent: a GPU above it (or running a job) is busy


def visible_gpus(infos: list[GpuInfo], env: dict[str, str] | None = None) -> list[int]:
    """NVML indices of the GPUs CUDA will number 0, 1, … (CUDA_DEVICE_ORDER=PCI_BUS_ID): all, in bus
    order, or those CUDA_VISIBLE_DEVICES names (indices or UUID prefixes), in its order. The ranks'
    reported UUIDs are what the diagnosis maps by; this is the guess made before the launch."""
    ordered = sorted(infos, key=lambda g: g.pci_bus_id)
    spec = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return [g.index for g in ordered]
    out = []
    for item in (x.strip() for x in spec.split(",")):
        if not item:
            break
        if item.isdigit():
            if int(item) >= len(ordered):
                break
            out.append(ordered[int(item)].index)
        else:
            match = [g for g in ordered if g.uuid.startswith(item) or g.uuid.startswith("GPU-" + item)]
            if len(match) != 1:
                break  # CUDA stops at the first entry it cannot resolve
            out.append(match[0].index)
    return out


def _named(p: GpuProcess) -> str:
    return f"pid {p.pid}" + (f" ({p.user}: {p.command})" if p.user or p.command else "")


def busy_gpus(machine: Machine, indices: list[int], ours: set[int] | None = None,
              unreadable_ours: bool = False) -> list[str]:
    """GPUs in use by others now: a job (a process on NVML's compute list) or utilisation above
    BUSY_UTILIZATION %. A desktop's display server and shell (the graphics list alone) are not jobs:
    what they draw shows in the utilisation. ``ours``: the probe's own PIDs; ``unreadable_ours``: a
    process whose /proc entry cannot be read (a host PID seen from a container) counts as the probe's."""
    out = []
    for s in machine.snapshot().samples:
        if s.index not in indices or s.lost:
            continue
        jobs = [_named(p) for p in s.processes or () if not p.graphics_only and p.pid not in (ours or ())
                and not (unreadable_ours and p.user is None and p.command is None)]
        util = s.utilization_gpu_percent or 0
        if jobs or util > BUSY_UTILIZATION:
            out.append(f"GPU{s.index}: {util} % busy" + (f", {', '.join(jobs)}" if jobs else ""))
    return out


def cpu_affinity(machine: Machine | None, gpus: list[int]) -> list[list[int]]:
    """Each rank's CPUs: its GPU's CPU affinity (NVML), where the machine has more than one NUMA node,
    restricted to the CPUs this process may use. Empty lists where nothing is to be pinned."""
    if machine is None or not gpus:
        return []
    infos = {i: machine.info(i) for i in gpus}
    nodes = {g.numa_node for g in infos.values() if g is not None}
    if len(nodes) < 2 and machine.host.cpu_info().numa_nodes < 2:
        return []
    allowed = os.sched_getaffinity(0)
    out = []
    for i in gpus:
        g = infos[i]
        cpus = sorted(set(g.cpu_affinity or ()) & allowed) if g is not None else []
        out.append(cpus)
    return out


def acs_above(machine: Machine) -> dict[int, list[str]]:
    """NVML index → PCIe bridges above that GPU with ACS bits set that redirect or block P2P."""
    by_bus = {g.pci_bus_id.lower(): g.index for g in machine.snapshot().gpus}
    out: dict[int, list[str]] = {}
    for dev in machine.host.nvidia_gpus():
        idx = by_bus.get(dev.address.lower())
        if idx is None:
            continue
        for addr in dev.parents:
            bridge = machine.host.pci_device(addr)
            if bridge is not None and bridge.acs_ctrl is not None and bridge.acs_ctrl & ACS_P2P_BITS:
                flags = ",".join(n for bit, n in ACS_BITS if bridge.acs_ctrl & bit)
                out.setdefault(idx, []).append(f"{addr} {flags}")
    return out


class LoadMonitor:
    """Samples NVML while the probe runs: PCIe generation under load, clock events (thermal, power),
    and processes on the GPUs that are not the probe's ranks."""

    def __init__(self, machine: Machine | None, period: float = 0.5) -> None:
        self.machine = machine
        self.period = period
        self.seen = Seen()
        self.ours: set[int] = set()
        self.before: dict[int, set[int]] = {}  # GPU → PIDs on it before the probe started
        self.hidden: dict[int, set[int]] = {}  # GPU → PIDs taken for the probe's ranks (see ``others``)
        self.loaded: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def others(self, gpu: int, procs: Iterable[GpuProcess]) -> list[GpuProcess]:
        """The jobs on a GPU that are not the probe's ranks. In a container NVML reports the host's PIDs,
        which this PID namespace does not know (no /proc entry: neither user nor command), so the ranks'
        own PIDs do not match: a process unknown here that was not on the GPU when the probe started is
        taken for one of its ranks (kept in ``hidden``)."""
        out = []
        for p in procs:
            if p.graphics_only or p.pid in self.ours:
                continue
            if p.user is None and p.command is None and p.pid not in self.before.get(gpu, set()):
                self.hidden.setdefault(gpu, set()).add(p.pid)
                continue
            out.append(p)
        return out

    @property
    def max_gen(self) -> dict[int, int]:
        return self.seen.pcie_generation

    def __enter__(self) -> LoadMonitor:
        if self.machine is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def sample(self) -> None:
        assert self.machine is not None
        for s in self.machine.snapshot().samples:
            if s.lost:
                continue
            if s.clock_events:
                self.seen.clock_events.setdefault(s.index, set()).update(s.clock_events)
            others = [_named(p) for p in self.others(s.index, s.processes or ())]
            if others:
                known = self.seen.processes.setdefault(s.index, [])
                known.extend(o for o in others if o not in known)
            if (s.utilization_gpu_percent or 0) >= 50 and s.pcie_generation is not None:
                self.loaded.add(s.index)
                gens = self.seen.pcie_generation
                gens[s.index] = max(gens.get(s.index, 0), s.pcie_generation)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sample()
            except GpudError:
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def machine_view(machine: Machine, seen: Seen, env: dict[str, str]) -> View | None:
    try:
        snap = machine.snapshot()
        cpuinfo = machine.host.read("/proc/cpuinfo")
        vendor = cpu_vendor(machine.host.cpu_info().model, cpuinfo)
        return View(machine.topology(snap), {g.index: g for g in snap.gpus}, {s.index: s for s in snap.samples},
                    seen, vendor, acs_above(machine), env, cpu_link(vendor, cpuinfo))
    except GpudError:
        return None
