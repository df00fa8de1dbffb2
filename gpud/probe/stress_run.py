"""Starting the burn-in's kernels (``gpud.probe.stress``) in child processes, one per GPU, with a
hard timeout; and the sustained load the burn-in holds on real GPUs (``HardwareLoad``).

No torch here: the children import it. A child's process group is killed on a timeout, on an
error and on Ctrl-C, so no kernel outlives the burn-in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from gpud.child import environment, python
from gpud.errors import GpudError


class StressError(GpudError):
    pass


# cuBLAS is deterministic only with a fixed workspace (PyTorch, "Reproducibility"): the bit-for-bit
# comparison across GPUs needs it.
CHILD_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


def gpu_env(uuid: str | None) -> dict[str, str]:
    """The child sees only its GPU, named by UUID (NVML's index and CUDA's order may differ)."""
    return {"CUDA_VISIBLE_DEVICES": uuid} if uuid else {}


def _start(spec: dict[str, Any], workdir: Path, name: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    out = workdir / f"{name}.json"
    spec_file = workdir / f"{name}.spec.json"
    spec_file.write_text(json.dumps({**spec, "out": str(out)}))
    log = open(workdir / f"{name}.log", "wb")
    try:
        proc = subprocess.Popen(python("-m", "gpud.probe.stress", str(spec_file)), cwd=workdir,
                                env=environment({**CHILD_ENV, "TMPDIR": str(workdir), **env}),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()
    return proc, out


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


class Children:
    """Children started at once, one per spec (each measures the GPUs of its ``gpus`` in turn); ``collect``
    waits for them. The memory test's run while the burn-in reads telemetry."""

    def __init__(self, specs: list[dict[str, Any]]) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="gpud-burnin-")
        self.workdir = Path(self._tmp.name)
        self.procs = [(spec, *_start(spec, self.workdir, f"child{k}", dict(spec.get("env") or {})))
                      for k, spec in enumerate(specs)]

    def collect(self, timeout: float) -> dict[int, dict[str, Any]]:
        """Each GPU's result, or ``{"error": …}`` with the last line of its log. Children still running at
        the timeout or at an interrupt are killed with their process group."""
        results: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        try:
            while any(p.poll() is None for _, p, _ in self.procs) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            self.kill()
        for k, (spec, p, out) in enumerate(self.procs):
            if out.is_file():
                got = json.loads(out.read_text())["gpus"]
                results.update({int(g): r for g, r in got.items()})
                continue
            why = (f"exited with {p.returncode}" if p.returncode not in (None, -9)
                   else f"timed out after {timeout:.0f} s")
            tail = (self.workdir / f"child{k}.log").read_text(errors="replace").strip()
            for g in spec["gpus"]:
                results[int(g)] = {"error": why + (f": {tail.splitlines()[-1]}" if tail else "")}
        self._tmp.cleanup()
        return results

    def kill(self) -> None:
        for _, p, _ in self.procs:
            _kill(p)


def run_children(specs: list[dict[str, Any]], timeout: float) -> dict[int, dict[str, Any]]:
    """Run one child per spec, all at once, and collect them (``Children``)."""
    return Children(specs).collect(timeout)


class HardwareLoad:
    """A sustained GEMM load on real GPUs: one ``burn`` child per GPU. Between load steps the
    children are paused (SIGSTOP: the GPU finishes the few products queued and idles) and resumed
    (SIGCONT), so a step starts at once instead of after another torch import; ``stop`` kills them."""

    def __init__(self, device: str, gemm_n: int = 8192, uuids: dict[int, str] | None = None) -> None:
        self.device = device
        self.uuids = uuids or {}
        self.gemm_n = gemm_n
        self._procs: list[subprocess.Popen[bytes]] = []
        self._gpus: list[int] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._read: dict[int, int] = {}  # bytes of each GPU's report already read

    def _signal(self, sig: int) -> None:
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def start(self, gpus: list[int], seconds: float) -> None:
        if self._procs and self._gpus == gpus and all(p.poll() is None for p in self._procs):
            self._signal(signal.SIGCONT)
            return
        self.stop()
        self._gpus = list(gpus)
        self._tmp = tempfile.TemporaryDirectory(prefix="gpud-burn-")
        for g in gpus:
            spec = {"device": self.device, "gpus": [g], "cuda_index": 0, "tasks": ["burn"], "burn_seconds": 25 * 3600.0,
                    "gemm_n": self.gemm_n if self.device == "cuda" else 256,
                    "report": str(Path(self._tmp.name) / f"burn{g}.checks"),
                    "size": str(Path(self._tmp.name) / f"burn{g}.size")}
            env = gpu_env(self.uuids.get(g)) if self.device == "cuda" else {}
            proc, _ = _start(spec, Path(self._tmp.name), f"burn{g}", env)
            self._procs.append(proc)

    def size(self, gpu: int, share: float) -> None:
        """Size the GPU's load to ``share`` of its largest (targeted power's closed loop): the matrix
        dimension whose n² is that share of the largest's (DCGM's targeted power sizes its load by n² too),
        in multiples of 64; the child reads it within a second."""
        if self._tmp is None:
            return
        n = max(64, int(round(self.gemm_n * max(0.0, min(1.0, share)) ** 0.5 / 64)) * 64)
        atomic = Path(self._tmp.name) / f"burn{gpu}.size"
        tmp = atomic.with_suffix(".tmp")
        tmp.write_text(str(n))
        os.replace(tmp, atomic)

    def checks(self) -> dict[int, dict[str, Any]]:
        """What each GPU's child checked since the last call (its report's new lines, summed): products,
        how many differed from its first, the last product's checksum, the host reference's verdict."""
        out: dict[int, dict[str, Any]] = {}
        if self._tmp is None:
            return out
        for g in self._gpus:
            path = Path(self._tmp.name) / f"burn{g}.checks"
            try:
                with open(path, "rb") as f:
                    f.seek(self._read.get(g, 0))
                    data = f.read()
            except OSError:
                continue
            whole = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next call
            self._read[g] = self._read.get(g, 0) + len(whole)
            for line in whole.decode(errors="replace").splitlines():
                try:
                    got = json.loads(line)
                except ValueError:
                    continue
                out[g] = _merge(out.get(g), got)
        return out

    def stop(self) -> None:
        for p in self._procs:
            _kill(p)  # SIGKILL ends a stopped process too
        self._read = {}
        self._procs, self._gpus = [], []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _merge(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    if a is None:
        return dict(b)
    by = {d: int((a.get("by_dtype") or {}).get(d, 0)) + int(v) for d, v in (b.get("by_dtype") or {}).items()}
    return {**b, **{k: int(a.get(k, 0)) + int(b.get(k, 0)) for k in ("iterations", "wrong", "words")}, "by_dtype": by}


class SteppedChecks:
    """The checked load paced by its caller (a simulated workstation: simulated time): one child
    (``gpud.probe.stress`` ``serve``) with a ``Checked`` per GPU, asked for each check with the faults each
    GPU has then, answering what it computed. Started on the first check; ``stop`` ends it. Its products are
    64 × 64 by default: on a CPU without bfloat16 instructions a 128 × 128 bf16 product takes 1.9 ms (25 times
    fp32's), a 30-minute soak's 360 checks of four stand-ins 4 s of CPU; what a check shows (a product differing
    from its first, the host's reference) does not depend on the size."""

    def __init__(self, device: str, gpus: list[int], gemm_n: int = 64, timeout: float = 120.0) -> None:
        self.device, self.gpus, self.gemm_n, self.timeout = device, list(gpus), gemm_n, timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._pending: Any = None  # the tag of the step asked and not yet collected

    def _open(self) -> subprocess.Popen[bytes]:
        self._tmp = tempfile.TemporaryDirectory(prefix="gpud-check-")
        spec_file = Path(self._tmp.name) / "serve.spec.json"
        spec_file.write_text(json.dumps({"device": self.device, "gpus": self.gpus, "tasks": ["serve"],
                                         "gemm_n": self.gemm_n}))
        log = open(Path(self._tmp.name) / "serve.log", "wb")
        try:
            return subprocess.Popen(python("-m", "gpud.probe.stress", str(spec_file)), cwd=self._tmp.name,
                                    env=environment({**CHILD_ENV, "TMPDIR": self._tmp.name}),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                    start_new_session=True)
        finally:
            log.close()

    def check(self, faults: dict[int, list[str]] | None, tag: Any = None,
              iterations: int = 1) -> list[tuple[Any, dict[int, dict[str, Any]]]]:
        """Ask for one step (``iterations`` checked products per GPU with ``faults``, tagged ``tag``) and
        collect the step asked before: the child computes while the caller reads its telemetry, so one
        request is outstanding at a time. ``faults`` None asks nothing: the outstanding answer only (the end
        of a phase). Returns (tag, each GPU's answer) of the steps answered; ``{"error": …}`` for every
        GPU when the child is gone."""
        out: list[tuple[Any, dict[int, dict[str, Any]]]] = []
        try:
            if self._pending is not None:
                out.append((self._pending, self._read_answer()))
                self._pending = None
            if faults is not None:
                if self._proc is None:
                    self._proc = self._open()
                assert self._proc.stdin is not None
                req = {"iterations": iterations, "faults": {str(g): f for g, f in faults.items() if f}}
                self._proc.stdin.write((json.dumps(req) + "\n").encode())
                self._proc.stdin.flush()
                self._pending = tag
        except (OSError, ValueError, StressError) as err:
            log = Path(self._tmp.name) / "serve.log" if self._tmp is not None else None
            lines = log.read_text(errors="replace").strip().splitlines() if log and log.is_file() else []
            tail = lines[-1] if lines else ""
            self.stop()
            out.append((tag, {g: {"error": f"{err}" + (f": {tail}" if tail else "")} for g in self.gpus}))
        return out

    def _read_answer(self) -> dict[int, dict[str, Any]]:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise StressError("the checked load's child exited")
        return {int(g): r for g, r in json.loads(line)["gpus"].items()}

    def stop(self) -> None:
        self._pending = None
        if self._proc is not None:
            _kill(self._proc)
            for f in (self._proc.stdin, self._proc.stdout):
                if f is not None:
                    f.close()
            self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
