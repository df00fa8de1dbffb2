"""Run the training probe: plan the launches, run each in child processes with a timeout,
check correctness, explain the figures, keep the history. torch is never imported here.

One probe at a time per machine (a lock shared by the CLI and the daemon); busy GPUs are refused
before anything starts; every launch runs with NCCL's debug output in a file, read back for the
transport each channel used. The parts: ``plan`` (the launches), ``lock``, ``monitor`` (the machine
before and during the run), ``launch`` (one launch), ``nccl`` (its log), ``assemble`` (the report),
``torchrun`` (torch from outside, and the probe across machines).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.probe import history
from gpud.probe.assemble import CPU_NOTE, VERSION, assemble
from gpud.probe.diagnose import DEFAULT_THRESHOLDS, explain
from gpud.probe.errors import ProbeBusy, ProbeError
from gpud.probe.launch import launch_kept
from gpud.probe.lock import probe_lock
from gpud.probe.monitor import LoadMonitor, busy_gpus, cpu_affinity, machine_view, visible_gpus
from gpud.probe.plan import SUITES, Plan, make_plan, restrict_to_mig
from gpud.probe.report import Device, Load, ProbeReport
from gpud.probe.torchrun import torch_available


def run_probe(*, device: Device, gpus: int, world_sizes: list[int] | None = None, suites: list[str] | None = None,
              quick: bool = False, machine: Machine | None = None, host: str = "",
              thresholds: dict[int, float] | None = None, progress: Callable[[str, int, int], None] | None = None,
              keep_history: bool = True, timeout: float | None = None, allow_busy: bool = False) -> ProbeReport:
    if not torch_available():
        err = ProbeError("PyTorch is not installed for this Python")
        err.remedy = (f"install a PyTorch build matching the driver's CUDA into {sys.executable}'s environment "
                      "(a CPU build is enough to try the probe): see the README, \"PyTorch for the probe\"")
        raise err
    plan = make_plan(device, gpus, world_sizes, list(suites or SUITES), quick)
    with probe_lock():
        return _run(plan, machine, host, thresholds, progress, keep_history, timeout, allow_busy)


def _run(plan: Plan, machine: Machine | None, host: str, thresholds: dict[int, float] | None,
         progress: Callable[[str, int, int], None] | None, keep_history: bool, timeout: float | None,
         allow_busy: bool) -> ProbeReport:
    device = plan.device
    gpu_machine = machine if device == "cuda" else None
    used: list[int] = []
    busy: list[str] = []
    affinity: list[list[int]] = []
    unseen = None
    mig_note: str | None = None
    monitor = LoadMonitor(gpu_machine)
    if gpu_machine is not None:
        try:
            snap = gpu_machine.snapshot()
            used = visible_gpus(list(snap.gpus))[:plan.gpus]
            monitor.before = {s.index: {p.pid for p in s.processes or ()} for s in snap.samples}
            mig_note = restrict_to_mig(plan, snap.samples)
            busy = busy_gpus(gpu_machine, used)
            affinity = cpu_affinity(gpu_machine, used)
        except GpudError as err:  # no NVML: the probe still runs, unjudged
            gpu_machine, unseen = None, f"NVML unavailable ({err}): busy GPUs not checked, links not judged"
    if busy and not allow_busy:
        raise ProbeBusy("GPUs in use, the probe's figures would be wrong: " + "; ".join(busy))
    if mig_note is not None and not plan.launches:
        nothing = ProbeError(mig_note)
        nothing.remedy = ("add the ddp suite (one MIG instance alone), or disable MIG for the probe: "
                          "`sudo nvidia-smi -mig 0`")
        raise nothing
    cores = os.cpu_count() or 1
    started = time.time()
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="gpud-probe-"))
    monitor.machine = gpu_machine
    try:
        with monitor:
            for k, spec in enumerate(plan.launches):
                n = spec["world_size"]
                if progress:
                    progress(f"world size {n}: {', '.join(spec['tasks'])}", k, len(plan.launches))
                full = {"device": device, "tasks": spec["tasks"], "quick": plan.quick, "stages": plan.stages,
                        "threads_per_rank": max(1, cores // n) if device == "cpu" else 1}
                limit = timeout or (90.0 if plan.quick else 300.0) * (2 if device == "cpu" else 1)
                results.extend(launch_kept(full, n, limit, workdir, plan.gpus if device == "cuda" else None,
                                            affinity[:n] if n > 1 else affinity[:1], monitor, failures,
                                            gpu_machine))
            if gpu_machine is not None:
                try:
                    monitor.sample()
                except GpudError:
                    pass
    finally:
        if not failures:
            shutil.rmtree(workdir, ignore_errors=True)
    if progress:
        progress("done", len(plan.launches), len(plan.launches))
    res = assemble(plan, results)
    res.version, res.host, res.started_at, res.finished_at, res.gpus = VERSION, host, started, time.time(), plan.gpus
    res.busy_at_start, res.cpu_affinity = busy, affinity
    res.nvml = unseen or None
    if device == "cpu":
        res.note = CPU_NOTE
    elif mig_note is not None:
        res.note = mig_note
    view = machine_view(gpu_machine, monitor.seen, res.nccl.env) if gpu_machine is not None else None
    res.diagnosis = explain(res, view, thresholds or DEFAULT_THRESHOLDS)
    res.load = Load({str(k): v for k, v in monitor.max_gen.items()},
                    {str(k): sorted(v) for k, v in monitor.seen.clock_events.items()},
                    {str(k): v for k, v in monitor.seen.processes.items()})
    res.failures = failures or None
    res.ok = res.correctness.ok() and not res.diagnosis.failed() and not failures
    # CPU figures say nothing about the hardware: no regression is read into them.
    res.regressions = history.regressions(res.to_json(), history.load()) if device == "cuda" else []
    if keep_history:
        history.append(res)
    return res
