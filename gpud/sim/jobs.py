"""Processes on the simulated GPUs: the description's, and those injected while gpud runs.

``gpud sim inject process gpu=N pid=P user=U command=C [container=ID | pod=UID | slurm_job=J | unit=U]``
starts one (a ``process`` fault, persisted with the machine's state so the daemon sees it);
``gpud sim inject process_exit pid=P`` ends it (a description's process too). NVML's process lists
(``gpud.sim.libnvml``) and ``/proc/PID`` (``gpud.sim.rootfs``: status with its uid and gid, cmdline,
cgroup) both come from ``running``, so a process shows in both at once, as a real one does when it
creates its CUDA context.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpud.errors import InvalidInput
from gpud.schema import REQUIRED as _ANY


class Fault(Protocol):
    """A fault as this module reads it (``gpud.sim.faults.Fault``, which stands above it)."""

    @property
    def kind(self) -> str: ...

    @property
    def params(self) -> Mapping[str, Any]: ...


class GpuSpec(Protocol):
    @property
    def processes(self) -> tuple[Process, ...]: ...


class Description(Protocol):
    @property
    def gpus(self) -> Sequence[GpuSpec]: ...


class SimMachine(Protocol):
    """What the hooks and ``running`` read of the simulated machine (``SimMachine``, which stands above)."""

    state: dict[str, Any]

    @property
    def desc(self) -> Description: ...

    @property
    def faults(self) -> Sequence[Fault]: ...

# What a process holds on its GPU unless described: its CUDA context takes memory as it is created and
# gives it back at exit. The smallest compute-only ("C") process among the 17 with a figure in the real
# dumps of tests/fixtures/nvidia-smi holds 160 MiB (the largest 65710 MiB); a C+G desktop one 25 MiB.
CONTEXT_MIB = 160
PROCESS_KEYS: dict[str, tuple[Any, Any]] = {
    "pid": (int, _ANY),
    "used_mib": (int, CONTEXT_MIB),
    "user": (str, "researcher"),
    "uid": (int, 1000),
    "command": (str, "python train.py"),
    "graphics": (bool, False),  # a graphics process (nvmlDeviceGetGraphicsRunningProcesses), not compute
    "compute": (bool, None),  # in the compute list too (nvidia-smi's "C+G"); default: not graphics
    # Where the process runs, as /proc/PID/cgroup shows it (at most one of these): a container id
    # (container_runtime "docker" or "podman"), a Kubernetes pod uid, a Slurm job id, a systemd unit.
    "container": (str, None),
    "container_runtime": (("docker", "podman"), "docker"),
    "pod": (str, None),
    "slurm_job": (int, None),
    "unit": (str, None),
    # on a MIG-enabled GPU: the MIG instance the process runs in (nvmlProcessInfo_t's ids)
    "gpu_instance_id": (int, None),
    "compute_instance_id": (int, None),
}
PLACES = ("container", "pod", "slurm_job", "unit")
PROCESS_KINDS = ("process", "process_exit")  # the fault kinds that start and end processes


@dataclass(frozen=True)
class Process:
    """One process on a GPU (``PROCESS_KEYS``)."""

    pid: int
    used_mib: int
    user: str
    uid: int
    command: str
    graphics: bool
    compute: bool | None
    container: str | None
    container_runtime: str
    pod: str | None
    slurm_job: int | None
    unit: str | None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


def check_process(proc: dict[str, Any], file: str, where: str) -> None:
    """What the keys' types do not say: a positive pid, no negative uid or memory, one place at most, a user
    name that is one line (it goes into /etc/passwd). A command line may hold any character, as a real
    process's can (gpud must clean it for the terminal: tests/test_cli_output.py)."""
    if proc["pid"] < 1 or proc["uid"] < 0 or proc["used_mib"] < 0:
        raise InvalidInput(file, where, "pid must be positive, uid and used_mib not negative")
    if sum(proc[key] is not None for key in PLACES) > 1:
        raise InvalidInput(file, where, "at most one of container, pod, slurm_job, unit")
    if any(ord(c) < 32 for c in proc["user"]):
        raise InvalidInput(file, where, "user is one line of text")


def check_injected(fault: Fault, file: str, where: str) -> None:
    check_process({k: fault.params.get(k) for k in PROCESS_KEYS}, file, where)


def on_process(sim: SimMachine, fault: Fault) -> None:
    """A process starts: one injected earlier with the same pid is gone (its pid was reused)."""
    pid = fault.params["pid"]
    faults = sim.state["faults"]
    sim.state["faults"] = [f for f in faults[:-1] if not (f["kind"] in ("process", "process_exit")
                                                             and f["params"].get("pid") == pid)] + faults[-1:]


def on_exit(sim: SimMachine, fault: Fault) -> None:
    """A process exits: an injected one is forgotten (and so is this exit); a description's process
    stays gone while the exit is kept."""
    pid = fault.params["pid"]
    faults = sim.state["faults"][:-1]
    kept = [f for f in faults if not (f["kind"] == "process" and f["params"].get("pid") == pid)]
    described = any(p.pid == pid for g in sim.desc.gpus for p in g.processes)
    sim.state["faults"] = kept + (sim.state["faults"][-1:] if described else [])


def running(sim: SimMachine) -> list[tuple[int, Process]]:
    """(GPU, process) of every process running now: the description's not exited, then the injected."""
    gone = {f.params.get("pid") for f in sim.faults if f.kind == "process_exit"}
    out: list[tuple[int, Process]] = [(i, p) for i, g in enumerate(sim.desc.gpus) for p in g.processes
                                      if p.pid not in gone]
    for f in sim.faults:
        if f.kind == "process":
            params: dict[str, Any] = {k: f.params.get(k) for k in PROCESS_KEYS}
            out.append((int(f.params["gpu"]), Process(**params)))
    return out


def on_gpu(sim: SimMachine, gpu: int) -> list[Process]:
    """The processes running on ``gpu`` now."""
    return [p for g, p in running(sim) if g == gpu]


__all__ = ["PLACES", "PROCESS_KEYS", "Process", "check_injected", "check_process", "on_exit", "on_gpu",
           "on_process", "running"]
