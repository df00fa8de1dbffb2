"""Run the training probe: plan the launches, run each in child processes with a timeout,
check correctness, explain the figures, keep the history. torch is never imported here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.probe import history
from gpud.probe.diagnose import DEFAULT_THRESHOLDS, explain

SUITES = ("ddp", "pipeline", "allreduce", "p2p")
PARAM_TOLERANCE = {"cpu": 1e-4, "cuda": 1e-3}
CPU_NOTE = "CPU run: these figures check function, not hardware."


class ProbeError(GpudError):
    remedy = "run `gpud probe --debug` for the workers' output; check `gpud doctor`"


@dataclass
class Plan:
    device: str
    world_sizes: list[int]
    suites: list[str]
    quick: bool
    gpus: int
    launches: list[dict[str, Any]] = field(default_factory=list)


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def make_plan(device: str, gpus: int, world_sizes: list[int] | None, suites: list[str], quick: bool) -> Plan:
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
    biggest = max(plan.world_sizes)
    for n in plan.world_sizes:
        tasks = []
        if "ddp" in suites:
            tasks.append("ddp")
        if n >= 2 and "allreduce" in suites:
            tasks.append("allreduce")
        if "pipeline" in suites and n >= 2 and (n == 2 or (n == biggest and not quick)):
            tasks.append("pipeline")
        if "p2p" in suites and ((device == "cuda" and n == 1) or (device == "cpu" and n == 2)):
            tasks.append("p2p")
        if device == "cuda" and "p2p" in suites and 1 not in plan.world_sizes and n == plan.world_sizes[0]:
            tasks.append("p2p")
        if tasks:
            plan.launches.append({"world_size": n, "tasks": tasks})
    return plan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(spec: dict[str, Any], world: int, timeout: float, workdir: Path, gpus: int | None = None) -> dict[str, Any]:
    """Start one process per rank (loopback rendezvous), wait with a timeout, return rank 0's JSON."""
    out = workdir / f"ws{world}-{'-'.join(spec['tasks'])}.json"
    spec = {**spec, "out": str(out), "timeout": timeout}
    spec_file = out.with_suffix(".spec.json")
    spec_file.write_text(json.dumps(spec))
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    base |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world),
             "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "OMP_NUM_THREADS": str(spec.get("threads_per_rank", 1)),
             "PYTHONWARNINGS": "ignore"}
    if spec["device"] == "cuda" and gpus is not None and "CUDA_VISIBLE_DEVICES" not in os.environ:
        base["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
    for rank in range(world):
        log = open(workdir / f"ws{world}-rank{rank}.log", "wb")
        logs.append(log)
        env = base | {"RANK": str(rank), "LOCAL_RANK": str(rank)}
        procs.append(subprocess.Popen([sys.executable, "-m", "gpud.probe.worker", str(spec_file)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.monotonic() + timeout
    failed = None
    culprit = 0
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                failed = f"timed out after {timeout:.0f} s"
                break
            bad = [p for p in procs if p.poll() not in (None, 0)]
            if bad:
                time.sleep(0.2)  # let the other ranks notice, so the first failure is the one reported
                bad = sorted((p for p in procs if p.poll() not in (None, 0)), key=lambda p: -p.returncode)
                culprit = procs.index(bad[0])
                failed = f"rank {culprit} exited with {bad[0].returncode}"
                break
            time.sleep(0.05)
        if failed is None:
            bad = [p for p in procs if p.returncode != 0]
            if bad:
                culprit = procs.index(bad[0])
                failed = f"rank {culprit} exited with {bad[0].returncode}"
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for log in logs:
            log.close()
    if failed is not None or not out.is_file():
        tail = (workdir / f"ws{world}-rank{culprit}.log").read_text(errors="replace")[-2000:]
        raise ProbeError(f"world size {world} ({', '.join(spec['tasks'])}): {failed or 'no result written'}"
                         + (f"\n{tail}" if tail.strip() else ""))
    data: dict[str, Any] = json.loads(out.read_text())
    return data


class LoadMonitor:
    """Samples NVML while the probe runs: PCIe generation under load (doctor re-checks it)."""

    def __init__(self, machine: Machine | None) -> None:
        self.machine = machine
        self.max_gen: dict[int, int] = {}
        self.loaded: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LoadMonitor:
        if self.machine is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        assert self.machine is not None
        while not self._stop.wait(0.5):
            try:
                for s in self.machine.snapshot().samples:
                    if s.lost or s.pcie_generation is None:
                        continue
                    if (s.utilization_gpu_percent or 0) >= 50:
                        self.loaded.add(s.index)
                        self.max_gen[s.index] = max(self.max_gen.get(s.index, 0), s.pcie_generation)
            except GpudError:
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def assemble(plan: Plan, launches: list[dict[str, Any]]) -> dict[str, Any]:
    res: dict[str, Any] = {"device": plan.device, "quick": plan.quick, "world_sizes": plan.world_sizes,
                           "ddp": {"by_world_size": {}}, "allreduce": {"by_world_size": {}},
                           "pipeline": {"by_stages": {}}, "p2p": {"pairs": []}}
    for lr in launches:
        n = str(lr["world_size"])
        res.setdefault("torch", lr.get("torch"))
        if lr.get("gpu_name"):
            res["gpu_name"] = lr["gpu_name"]
        if "ddp" in lr:
            res["ddp"]["by_world_size"][n] = lr["ddp"]
        if "allreduce" in lr and "skipped" not in lr["allreduce"]:
            res["allreduce"]["by_world_size"][n] = lr["allreduce"]
        if "pipeline" in lr and "skipped" not in lr["pipeline"]:
            res["pipeline"]["by_stages"][n] = lr["pipeline"]
        if "p2p" in lr and lr["p2p"].get("pairs"):
            res["p2p"] = lr["p2p"]
    base = res["ddp"]["by_world_size"].get("1")
    for n, r in res["ddp"]["by_world_size"].items():
        if base:
            r["speedup"] = r["samples_per_second"] / base["samples_per_second"]
            r["efficiency"] = r["speedup"] / int(n)
    tol = PARAM_TOLERANCE[plan.device]
    checks: dict[str, Any] = {}
    ddp = list(res["ddp"]["by_world_size"].values())
    if ddp:
        checks["params_identical_across_ranks"] = all(r["params_max_spread"] == 0.0 for r in ddp)
        checks["ddp_matches_one_process"] = all(
            r["reference"]["param_max_abs_diff"] <= tol and r["reference"]["loss_abs_diff"] <= tol * max(
                1.0, abs(r["reference"]["loss"])) for r in ddp)
    pipes = list(res["pipeline"]["by_stages"].values())
    if pipes:
        checks["pipeline_matches_unsplit"] = all(p["output_max_abs_diff"] <= tol for p in pipes)
    res["correctness"] = checks
    return res


def run_probe(*, device: str, gpus: int, world_sizes: list[int] | None = None, suites: list[str] | None = None,
              quick: bool = False, machine: Machine | None = None, host: str = "",
              thresholds: dict[int, float] | None = None, progress: Callable[[str, int, int], None] | None = None,
              keep_history: bool = True, timeout: float | None = None) -> dict[str, Any]:
    if not torch_available():
        err = ProbeError("PyTorch is not installed for this Python")
        err.remedy = "install the probe extra: pip install 'gpud[probe]'"
        raise err
    plan = make_plan(device, gpus, world_sizes, list(suites or SUITES), quick)
    cores = os.cpu_count() or 1
    started = time.time()
    results = []
    workdir = Path(tempfile.mkdtemp(prefix="gpud-probe-"))
    monitor = LoadMonitor(machine if device == "cuda" else None)
    try:
        with monitor:
            for k, spec in enumerate(plan.launches):
                n = spec["world_size"]
                if progress:
                    progress(f"world size {n}: {', '.join(spec['tasks'])}", k, len(plan.launches))
                full = {"device": device, "tasks": spec["tasks"], "quick": quick,
                        "threads_per_rank": max(1, cores // n) if device == "cpu" else 1}
                limit = timeout or (60.0 if quick else 300.0) * (2 if device == "cpu" else 1)
                results.append(launch(full, n, limit, workdir, gpus if device == "cuda" else None))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if progress:
        progress("done", len(plan.launches), len(plan.launches))
    res = assemble(plan, results)
    res |= {"version": 1, "host": host, "started_at": started, "finished_at": time.time(), "gpus": gpus}
    if device == "cpu":
        res["note"] = CPU_NOTE
    t = infos = samples = None
    if machine is not None and device == "cuda":
        try:
            snap = machine.snapshot()
            t = machine.topology(snap)
            infos = {g.index: g for g in snap.gpus}
            samples = {s.index: s for s in snap.samples}
        except GpudError:
            t = None
    res["diagnosis"] = explain(res, t, infos or {}, samples or {}, thresholds or DEFAULT_THRESHOLDS)
    res["load"] = {"pcie_max_generation_under_load": {str(k): v for k, v in monitor.max_gen.items()}}
    verdicts = res["diagnosis"]["verdicts"]
    res["ok"] = all(res["correctness"].values()) and all(v != "fail" for v in verdicts.values())
    # CPU figures say nothing about the hardware: no regression is read into them.
    res["regressions"] = history.regressions(res, history.load()) if device == "cuda" else []
    if keep_history:
        history.append(res)
    return res


def torch_gpus() -> int:
    """GPUs torch sees (asked in a child process: the caller never imports torch); 0 without torch."""
    if not torch_available():
        return 0
    try:
        r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count() "
                                                  "if torch.cuda.is_available() else 0)"],
                           capture_output=True, text=True, timeout=120)
        return int(r.stdout.strip() or 0)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return 0


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")) and int(os.environ["WORLD_SIZE"]) > 1


def run_distributed(*, quick: bool, suites: list[str], host: str,
                    thresholds: dict[int, float] | None = None) -> dict[str, Any] | None:
    """Under torchrun (one or many machines): this process is one rank; rank 0 returns the report."""
    from gpud.probe import worker  # torch: only here, only under torchrun

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    device = "cuda" if worker.torch.cuda.is_available() else "cpu"
    tasks = [t for t in ("ddp", "allreduce") if t in suites]
    started = time.time()
    baseline = worker.run({"device": device, "tasks": ["ddp"], "quick": quick}, 0, 1, local) if rank == 0 else None
    full = worker.run({"device": device, "tasks": tasks, "quick": quick, "timeout": 600}, rank, world, local)
    if rank != 0:
        return None
    plan = Plan(device, [1, world], suites, quick, world)
    res = assemble(plan, [baseline or {}, full])
    res |= {"version": 1, "host": host, "started_at": started, "finished_at": time.time(), "gpus": world,
            "nodes": int(os.environ.get("GROUP_WORLD_SIZE", os.environ.get("NNODES", "1")) or 1), "torchrun": True}
    if device == "cpu":
        res["note"] = CPU_NOTE
    res["diagnosis"] = explain(res, None, {}, {}, thresholds or DEFAULT_THRESHOLDS)
    res["ok"] = all(res["correctness"].values()) and all(v != "fail" for v in res["diagnosis"]["verdicts"].values())
    res["regressions"] = history.regressions(res, history.load())
    history.append(res)
    return res
