"""Choosing GPUs for a job: the idle ones, and among them the best-connected set.

Pure: works on one snapshot and its topology, so the CLI (``gpud select``) and tests share it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from gpud.model import GpuSample, MigInstance, Snapshot, Topology

# How far apart two GPUs are, by `nvidia-smi topo -m` level: an NVLink pair first, then the same
# PCIe switch (PIX, then several switches PXB), then the same host bridge, then the same NUMA node.
DISTANCE = {"NV": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
WORDS = {0: "NVLink", 1: "same PCIe switch", 2: "same PCIe switch tree", 3: "same host bridge",
         4: "same NUMA node", 5: "across NUMA nodes"}


@dataclass(frozen=True)
class Choice:
    gpus: tuple[int, ...]  # chosen GPU indices, ascending; () when nothing fits
    uuids: tuple[str, ...]
    reason: str  # why these, or why none
    # A MIG instance chosen instead of a whole GPU: its MIG-… UUID, which is what CUDA_VISIBLE_DEVICES must
    # name (an index names no instance); ``gpus`` then holds its GPU
    instances: tuple[str, ...] = ()


def distance(topo: Topology, i: int, j: int) -> int:
    level = topo.level[topo.gpus.index(i)][topo.gpus.index(j)]
    return 0 if level.startswith("NV") else DISTANCE.get(level, 5)


def pairs_of(topo: Topology, gpus: tuple[int, ...]) -> list[int]:
    """The distance of every pair of these GPUs."""
    return [distance(topo, a, b) for a, b in itertools.combinations(gpus, 2)]


# NVIDIA's MIG user guide ("Application Considerations"): no GPU-to-GPU P2P, over PCIe or NVLink, with MIG;
# CUDA enumerates the MIG devices, not their GPU, and a CUDA process uses one MIG device.
MIG_WHOLE = "MIG enabled: CUDA sees its instances, not the GPU"


def why_instance_busy(m: MigInstance, min_free_bytes: int) -> str | None:
    """Why this MIG instance cannot take a job; None when it can. An instance has no utilisation of its
    own (NVML answers it for the whole GPU only): its processes and memory decide."""
    if m.processes is None:
        return "process list unreadable"
    jobs = [p for p in m.processes if not p.graphics_only]
    if jobs:
        who = ", ".join(sorted({p.user or "?" for p in jobs}))
        return f"{len(jobs)} process(es) ({who})"
    free = m.memory_free_bytes
    if free is None and m.memory_total_bytes is not None and m.memory_used_bytes is not None:
        free = m.memory_total_bytes - m.memory_used_bytes
    if min_free_bytes and (free is None or free < min_free_bytes):
        have = "unknown" if free is None else f"{free / 2**30:.1f} GiB"
        return f"{have} free < {min_free_bytes / 2**30:.1f} GiB"
    return None


def _instance_name(m: MigInstance) -> str:
    ids = f"GI {m.gpu_instance_id}" + (f"/CI {m.compute_instance_id}" if m.compute_instance_id is not None else "")
    return f"{m.profile or 'MIG'} {ids}"


def free_instance(snap: Snapshot, min_free_bytes: int) -> tuple[GpuSample, MigInstance] | None:
    """The free MIG instance with the most free memory (then the lowest GPU and instance index)."""
    best: tuple[tuple[int, int, int], GpuSample, MigInstance] | None = None
    for s in snap.samples:
        if s.lost or not s.mig_mode:
            continue
        for m in s.mig_instances or ():
            if why_instance_busy(m, min_free_bytes) is None:
                key = (-(m.memory_free_bytes or 0), s.index, m.index)
                if best is None or key < best[0]:
                    best = (key, s, m)
    return None if best is None else (best[1], best[2])


def why_busy(s: GpuSample, min_free_bytes: int, max_utilization: int) -> str | None:
    """Why this GPU is not idle enough for a job; None when it is. The thresholds decide, not the
    presence of a process: an idle notebook holding memory or a desktop's display server leaves a GPU
    free for a job that fits beside it (``--min-free-memory`` says what must fit)."""
    if s.lost:
        return "lost"
    if s.mig_mode:
        # Its utilisation is Not Supported under MIG (nvml.h), which is not idle: the GPU is never given
        # whole, its instances are judged one by one (free_instance)
        if s.mig_instances is None:
            return f"{MIG_WHOLE}, and its instances could not be read"
        states = [f"{_instance_name(m)}: {why_instance_busy(m, min_free_bytes) or 'free'}" for m in s.mig_instances]
        return f"{MIG_WHOLE} ({'; '.join(states) or 'no instance created'})"
    util = s.utilization_gpu_percent
    if s.processes is None and (util is None or util > max_utilization):
        return "process list unreadable and not idle"
    who = f" ({', '.join(sorted({p.user or '?' for p in s.processes}))})" if s.processes else ""
    if util is not None and util > max_utilization:
        return f"utilisation {util} % > {max_utilization} %{who}"
    free = s.memory_free_bytes  # total - reserved - used (nvmlMemory_v2_t); v1's free where _v2 is missing
    if free is None and s.memory_total_bytes is not None and s.memory_used_bytes is not None:
        free = s.memory_total_bytes - s.memory_used_bytes
    if min_free_bytes and free is not None:
        if free < min_free_bytes:
            return f"{free / 2**30:.1f} GiB free < {min_free_bytes / 2**30:.1f} GiB{who}"
    return None


def choose(snap: Snapshot, topo: Topology, n: int, min_free_bytes: int = 0, max_utilization: int = 10) -> Choice:
    """The ``n`` idle GPUs closest to each other: the set whose farthest pair is nearest, then the
    smallest sum of distances, then the lowest indices."""
    busy = {s.index: why_busy(s, min_free_bytes, max_utilization) for s in snap.samples}
    idle = [i for i, why in sorted(busy.items()) if why is None and i in topo.gpus]
    if n == 1 and not idle:
        # No whole GPU: a free MIG instance takes a one-GPU job (CUDA_VISIBLE_DEVICES=MIG-…); instances
        # are never combined for a larger job, which would need P2P between them
        found = free_instance(snap, min_free_bytes)
        if found is not None:
            s, m = found
            free = "" if m.memory_free_bytes is None else f", {m.memory_free_bytes / 2**30:.1f} GiB free"
            return Choice((s.index,), (m.uuid,), f"MIG instance {_instance_name(m)} of GPU{s.index}{free}: the job "
                          "gets this instance, not the GPU (CUDA_VISIBLE_DEVICES must name its MIG UUID)",
                          instances=(m.uuid,))
    if len(idle) < n:
        notes = "; ".join(f"GPU{i}: {why}" for i, why in sorted(busy.items()) if why is not None)
        return Choice((), (), f"{len(idle)} of {len(snap.samples)} GPU(s) free, {n} needed"
                              + (f" ({notes})" if notes else ""))
    best: tuple[tuple[int, int, tuple[int, ...]], tuple[int, ...]] | None = None
    for combo in itertools.combinations(idle, n):
        pairs = pairs_of(topo, combo)
        key = (max(pairs, default=0), sum(pairs), combo)
        if best is None or key < best[0]:
            best = (key, combo)
    assert best is not None
    gpus = best[1]
    uuids = {s.index: s.uuid for s in snap.samples}
    near, far = min(pairs_of(topo, gpus), default=0), best[0][0]
    reason = f"{n} idle GPU(s)" + (f", best-connected pair: {WORDS[near]}" if n > 1 else "")
    if n > 2 and far != near:
        reason += f", farthest pair: {WORDS[far]}"
    return Choice(gpus, tuple(uuids[i] for i in gpus), reason)
