"""torch from outside (never imported here but under torchrun): whether it is installed, the GPUs it
sees, and the probe across machines, which is torchrun's: the command each machine runs, and a
rank's part when gpud runs under it (the lock and busy check on each node's local rank 0)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from gpud.child import environment, python
from gpud.errors import GpudError, InvalidInput
from gpud.hw.machine import Machine
from gpud.probe import history
from gpud.probe.assemble import CPU_NOTE, VERSION, assemble
from gpud.probe.diagnose import DEFAULT_THRESHOLDS, explain
from gpud.probe.errors import ProbeBusy, ProbeError
from gpud.probe.lock import probe_lock
from gpud.probe.monitor import busy_gpus, visible_gpus
from gpud.probe.plan import Plan
from gpud.probe.report import Device, Placement, ProbeReport


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def torch_gpus() -> int:
    """GPUs torch sees (asked in a child process: the caller never imports torch); 0 without torch."""
    if not torch_available():
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="gpud-torch-") as cwd:
            r = subprocess.run(python("-c", "import torch; print(torch.cuda.device_count() "
                                            "if torch.cuda.is_available() else 0)"),
                               capture_output=True, text=True, timeout=120, cwd=cwd, env=environment())
        return int(r.stdout.strip() or 0)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0


def torchrun_command(*, nnodes: int, node_rank: int, endpoint: str, nproc_per_node: int | None,
                     probe_args: list[str]) -> list[str]:
    """This machine's part of a probe across ``nnodes`` machines: torchrun (this Python's
    ``torch.distributed.run``) with its static rendezvous at ``endpoint`` (node 0's address and a free
    port, which node 0's agent listens on), ``nproc_per_node`` ranks here (None: one per GPU torch sees,
    at least one), each running ``gpud probe
    probe_args``. Every machine runs the same command but for ``node_rank``; a rank that fails ends the
    run (no restarts: a probe measures, it does not recover)."""
    if under_torchrun():
        raise InvalidInput("--nnodes", str(nnodes), "already under torchrun: give torchrun its --nnodes, not gpud")
    if not 0 <= node_rank < nnodes:
        raise InvalidInput("--node-rank", str(node_rank), f"must be between 0 and {nnodes - 1} (--nnodes {nnodes})")
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput("--rdzv-endpoint", endpoint, "must be HOST:PORT (node 0's address and a free port)")
    if not torch_available():
        err = ProbeError("PyTorch is not installed for this Python (torchrun is part of it)")
        err.remedy = f"install PyTorch into {sys.executable}'s environment on every machine of the probe"
        raise err
    nproc = nproc_per_node or max(1, torch_gpus())
    return [*python("-m", "torch.distributed.run"), "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--nproc-per-node", str(nproc), "--rdzv-backend", "static", "--rdzv-endpoint", endpoint,
            "--max-restarts", "0", "-m", "gpud", "probe", *probe_args]


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) and int(os.environ["WORLD_SIZE"]) > 1


def siblings() -> set[int]:
    """PIDs of this process's siblings (torchrun's other local ranks: children of the same agent)."""
    parent, out = os.getppid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                    out.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return out


def placement(ranks: list[Any]) -> list[Placement]:
    """Each rank's node, host and GPU, from what the ranks said of themselves (``worker.run``)."""
    out = []
    for r in ranks:
        if isinstance(r, dict) and isinstance(r.get("rank"), int):
            out.append(Placement(rank=r["rank"], node=int(r.get("node") or 0), host=str(r.get("host") or "?"),
                                 gpu_uuid=r.get("uuid") if isinstance(r.get("uuid"), str) else None))
    return out


def run_distributed(*, quick: bool, suites: list[str], host: str, thresholds: dict[int, float] | None = None,
                    machine: Machine | None = None, allow_busy: bool = False) -> ProbeReport | None:
    """Under torchrun (one or many machines): this process is one rank; rank 0 returns the report.

    Each node's local rank 0 takes the machine's probe lock and checks its GPUs for other jobs (its
    node's own ranks excepted) before anything is measured; a refusal on any node ends every rank."""
    from gpud.probe import worker  # torch: only here, only under torchrun

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    device: Device = "cuda" if worker.cuda_available() else "cpu"
    tasks = [t for t in ("ddp", "allreduce") if t in suites]
    started = time.time()
    spec = {"device": device, "tasks": tasks, "quick": quick, "collective_timeout": 300}
    with ExitStack() as held:
        refusal = None
        if local == 0:
            try:
                held.enter_context(probe_lock())
                if machine is not None and device == "cuda" and not allow_busy:
                    used = visible_gpus(list(machine.snapshot().gpus))[:local_world]
                    # the node's other ranks: the agent's children here, PIDs /proc cannot read in a container
                    busy = busy_gpus(machine, used, ours=siblings() | {os.getpid()}, unreadable_ours=True)
                    if busy:
                        refusal = "GPUs in use, the probe's figures would be wrong: " + "; ".join(busy)
            except ProbeBusy as err:
                refusal = str(err)
            except GpudError:
                pass  # no NVML on this node: not checked, as without torchrun
        worker.init(spec, rank, world, local)
        refusals = [r for r in worker.gather(f"{host}: {refusal}" if refusal else None) if r]
        if refusals:
            worker.finish_group()
            raise ProbeBusy("; ".join(refusals))
        full = worker.run(spec, rank, world, local)
        # The one-GPU baseline after the group's run, on rank 0's GPU alone, while the others wait.
        baseline = worker.run({"device": device, "tasks": ["ddp"], "quick": quick}, 0, 1, local) if rank == 0 else None
        worker.finish_group()
    if rank != 0:
        return None
    plan = Plan(device, [1, world], suites, quick, world)
    res = assemble(plan, [baseline or {}, full])
    res.version, res.host, res.started_at, res.finished_at, res.gpus = VERSION, host, started, time.time(), world
    res.placement = placement(full.get("ranks") or [])
    # the nodes that ran (each rank says its torchrun node rank); the agent's count where none did
    res.nodes = (len({p.node for p in res.placement}) if res.placement
                 else int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("NNODES", "1")) or 1))
    res.torchrun = True
    if device == "cpu":
        res.note = CPU_NOTE
    res.diagnosis = explain(res, None, thresholds or DEFAULT_THRESHOLDS)
    res.ok = res.correctness.ok() and not res.diagnosis.failed()
    # CPU figures say nothing about the hardware: no regression is read into them.
    res.regressions = history.regressions(res.to_json(), history.load()) if device == "cuda" else []
    history.append(res)
    return res
