"""The probe's DDP training loop as a long-running job (``gpud.probe.worker``'s ``train`` task): one process
per rank, started once for a whole tune, whose rank 0 reports every step on its standard output (the
channel gpud reads: steps, samples, the time the step ended). No torch here: the ranks import it.

On GPUs the ranks run free and a reader thread keeps the newest line. On a simulated workstation one
rank runs ``paced``: the CPU stands in for the GPUs, and each request on its standard input (the
channel ``gpud.backends`` uses for the burn-in's faults) says how long each simulated rank's step
takes now, from the performance model; the answer is the step counter as DDP advanced it.

The ranks run in their own process group, in a private directory, as isolated interpreters
(``gpud.child``); ``stop`` kills the group, so nothing outlives the tune.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpud.child import python
from gpud.errors import GpudError
from gpud.probe.launch import rank_env

START_TIMEOUT_S = 600.0  # torch's import, the model, NCCL's set-up and the first step


class TrainingFailed(GpudError):
    """The training job did not start, or a rank exited."""


@dataclass(frozen=True)
class Steps:
    """One line of the channel: ``steps`` done, ``samples`` done, ``t`` when the last of them ended (the
    job's clock: the monotonic clock on GPUs, simulated time on a simulated workstation)."""

    steps: int
    samples: float
    t: float
    step_s: float | None = None
    compute_s: tuple[float, ...] = ()


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        got = json.loads(raw)
    except ValueError:
        return None
    return got if isinstance(got, dict) else None


def _steps(d: dict[str, Any]) -> Steps:
    return Steps(int(d["steps"]), float(d["samples"]), float(d["t"]),
                 float(d["step_s"]) if d.get("step_s") is not None else None,
                 tuple(float(v) for v in d.get("compute_s") or ()))


class TrainingJob:
    """The ranks of one ``train`` job. ``device`` ``cuda`` (one rank per GPU, each seeing the GPUs by UUID)
    or ``cpu``; ``paced``: one rank whose steps the caller paces (``pace``)."""

    def __init__(self, device: str, ranks: int, uuids: list[str] | None = None, paced: bool = False,
                 batch_per_rank: int | None = None) -> None:
        self.device, self.ranks, self.uuids, self.paced = device, ranks, list(uuids or []), paced
        self.batch_per_rank = batch_per_rank
        self._procs: list[subprocess.Popen[bytes]] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._latest: Steps | None = None
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._error = ""

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> dict[str, Any]:
        """Start the ranks and wait for rank 0's ``ready`` line (the start-up over): its fields."""
        self._tmp = tempfile.TemporaryDirectory(prefix="gpud-train-")
        work = Path(self._tmp.name)
        world = 1 if self.paced else self.ranks
        spec: dict[str, Any] = {"device": self.device, "tasks": ["train"], "quick": True, "paced": self.paced,
                                "store": str(work / "store"), "collective_timeout": 600,
                                "batch_per_rank": self.batch_per_rank, "threads_per_rank": 1}
        for rank in range(world):
            spec_file = work / f"rank{rank}.json"
            spec_file.write_text(json.dumps(spec | {"out": str(work / "out.json")}))
            env = rank_env(spec, world, rank, work, None if self.device != "cuda" else world)
            if self.device == "cuda" and self.uuids:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(self.uuids)
            log = open(work / f"rank{rank}.log", "wb")
            try:
                self._procs.append(subprocess.Popen(
                    python("-W", "ignore", "-m", "gpud.probe.worker", str(spec_file)), env=env, cwd=work,
                    stdin=subprocess.PIPE if self.paced else subprocess.DEVNULL,
                    stdout=subprocess.PIPE if rank == 0 else log, stderr=log, start_new_session=True))
            finally:
                log.close()
        ready = self._read_line(START_TIMEOUT_S)
        if ready is None or not ready.get("ready"):
            why = self._why()
            self.stop()
            raise TrainingFailed(f"the training job did not start: {why}")
        if not self.paced:
            self._reader = threading.Thread(target=self._follow, name="gpud-train-steps", daemon=True)
            self._reader.start()
        return ready

    def _out(self) -> IO[bytes]:
        out = self._procs[0].stdout if self._procs else None
        if out is None:
            raise TrainingFailed("the training job is not running")
        return out

    def _read_line(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line of rank 0 within ``timeout`` (a rank that exits ends the wait)."""
        out = self._out()
        got: list[bytes] = []
        th = threading.Thread(target=lambda: got.append(out.readline()), daemon=True)
        th.start()
        deadline = time.monotonic() + timeout
        while th.is_alive() and time.monotonic() < deadline:
            th.join(0.1)
            if any(p.poll() not in (None, 0) for p in self._procs) and not got:
                break
        return _parse(got[0]) if got and got[0] else None

    def _follow(self) -> None:
        out = self._out()
        for raw in out:
            d = _parse(raw)
            if d is not None and "steps" in d:
                with self._lock:
                    self._latest = _steps(d)
        self._error = self._why()

    def _why(self) -> str:
        for k, p in enumerate(self._procs):
            code = p.poll()
            if code not in (None, 0):
                tail = ""
                if self._tmp is not None:
                    log = Path(self._tmp.name) / f"rank{k}.log"
                    lines = log.read_text(errors="replace").strip().splitlines() if log.is_file() else []
                    tail = f": {lines[-1]}" if lines else ""
                return f"rank {k} exited with {code}{tail}"
        return "no answer from rank 0"

    def latest(self) -> Steps | None:
        """The newest step line (None before the first step); a rank that exited is an error."""
        if any(p.poll() is not None for p in self._procs):
            raise TrainingFailed(f"the training job stopped: {self._error or self._why()}")
        with self._lock:
            return self._latest

    def pace(self, now: float, seconds: float, compute_s: list[float], allreduce_s: float) -> Steps:
        """One paced interval (``paced`` jobs): the simulated ranks' compute time per step and the
        all-reduce's exposed part over the ``seconds`` up to ``now``; the step counter as the job advanced it."""
        proc = self._procs[0] if self._procs else None
        if proc is None or proc.stdin is None:
            raise TrainingFailed("the training job is not running")
        try:
            proc.stdin.write((json.dumps({"t": now, "seconds": seconds, "compute_s": compute_s,
                                          "allreduce_s": allreduce_s}) + "\n").encode())
            proc.stdin.flush()
            raw = self._out().readline()
        except OSError as err:
            raise TrainingFailed(f"the training job stopped: {err}: {self._why()}") from None
        d = _parse(raw) if raw else None
        if d is None or "steps" not in d:
            raise TrainingFailed(f"the training job stopped: {self._why()}")
        self._latest = _steps(d)
        return self._latest

    def stop(self) -> None:
        """Kill every rank with its process group and reap it: nothing keeps running."""
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self._procs:
            p.wait()
            for f in (p.stdin, p.stdout):
                if f is not None:
                    f.close()
        self._procs = []
        if self._reader is not None:
            self._reader.join(5)
            self._reader = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
