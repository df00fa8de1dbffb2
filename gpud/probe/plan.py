"""What a probe runs: the launches (a one-process baseline, P2P on its own, one launch per world size)
and what a machine with MIG leaves of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpud.errors import GpudError
from gpud.model import GpuSample
from gpud.probe.report import Device

SUITES = ("ddp", "pipeline", "allreduce", "p2p")


@dataclass
class Plan:
    device: Device
    world_sizes: list[int]
    suites: list[str]
    quick: bool
    gpus: int
    stages: list[int] = field(default_factory=list)  # pipeline stage counts
    launches: list[dict[str, Any]] = field(default_factory=list)


# NVIDIA's MIG user guide, "Application Considerations": with MIG, no GPU-to-GPU P2P (PCIe or NVLink) is
# supported, and a CUDA process enumerates a single MIG device ("CUDA Device Enumeration"); NCCL between
# instances can then only go through host memory, which measures nothing of the hardware the probe judges.
MIG_SKIPPED = ("NCCL and P2P between MIG instances are not supported (NVIDIA MIG user guide: no P2P over PCIe "
               "or NVLink under MIG, one MIG device per CUDA process)")


def restrict_to_mig(plan: Plan, samples: Iterable[GpuSample]) -> str | None:
    """On a machine with a MIG-enabled GPU, keep only what one process on one MIG instance measures: the
    one-process DDP baseline (training on one device). The multi-rank launches
    (DDP scaling, all-reduce, the pipeline) and the P2P copies are dropped. Returns the sentence saying
    so, or None when no GPU has MIG enabled. CUDA enumerates the instances instead of their GPUs then, so
    NVML's GPU indices name no CUDA device either."""
    mig = [s.index for s in samples if s.mig_mode and not s.lost]
    if not mig or plan.device != "cuda":
        return None
    skipped: list[str] = []
    kept: list[dict[str, Any]] = []
    for launch in plan.launches:
        # the pipeline's baselines only compare with a pipeline run, which is not made
        tasks = [t for t in launch["tasks"] if launch["world_size"] == 1 and t not in ("p2p", "pipeline_baseline")]
        skipped += [f"{t} ({launch['world_size']} ranks)" if launch["world_size"] > 1 else t
                    for t in launch["tasks"] if t not in tasks]
        if tasks:
            kept.append({**launch, "tasks": tasks})
    plan.launches = kept
    plan.world_sizes = [1]
    plan.stages = []
    gpus = ", ".join(f"GPU{i}" for i in mig)
    measured = ("measured: one process training on one MIG instance (the one-device DDP baseline)" if kept
                else "nothing left to measure")
    what = (f"skipped: {', '.join(skipped)}; " if skipped else "") + measured
    return f"{gpus} in MIG mode: {MIG_SKIPPED}; {what}."


def make_plan(device: Device, gpus: int, world_sizes: list[int] | None, suites: list[str], quick: bool) -> Plan:
    """A baseline launch of one process (one-GPU DDP, the pipeline's unsplit and naive-split baselines,
    device-to-device copies between every GPU pair), then one launch per world size of two or more."""
    if device == "cuda":
        most = max(1, gpus)
        sizes = world_sizes or sorted({1, *[2 ** k for k in range(1, 8) if 2 ** k <= most], most})
    else:
        sizes = world_sizes or [1, 2]
    for n in sizes:
        if n < 1 or (device == "cuda" and n > gpus):
            raise GpudError(f"world size {n} is not possible with {gpus} GPU(s)" if device == "cuda"
                            else f"world size {n} must be at least 1")
    plan = Plan(device, sorted(set(sizes)), suites, quick, gpus)
    multi = [n for n in plan.world_sizes if n >= 2]
    if "pipeline" in suites and multi:
        plan.stages = [multi[0]] if quick else sorted({multi[0], multi[-1]})
    base = []
    if "ddp" in suites:
        base.append("ddp")
    if plan.stages:
        base.append("pipeline_baseline")
    if base:
        plan.launches.append({"world_size": 1, "tasks": base})
    if "p2p" in suites and device == "cuda" and gpus >= 2:
        # A launch of its own: a pair that hangs (ACS) costs its own deadline, not the baselines' figures.
        plan.launches.append({"world_size": 1, "tasks": ["p2p"]})
    cpu_p2p = "p2p" in suites and device == "cpu"
    for n in multi:
        tasks: list[str] = [t for t in ("ddp", "allreduce") if t in suites]
        if n in plan.stages:
            tasks.append("pipeline")
        if cpu_p2p:
            tasks.append("p2p")
            cpu_p2p = False
        if tasks:
            plan.launches.append({"world_size": n, "tasks": tasks})
    return plan
