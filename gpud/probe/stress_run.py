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


def run_children(specs: list[dict[str, Any]], timeout: float) -> dict[int, dict[str, Any]]:
    """Run one child per spec (each measures the GPUs of its ``gpus`` in turn), all at once; each
    GPU's result, or ``{"error": …}`` with the last line of its log. Children still running at the
    timeout or at an interrupt are killed with their process group."""
    results: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpud-burnin-") as tmp:
        workdir = Path(tmp)
        procs = [(spec, *_start(spec, workdir, f"child{k}", dict(spec.get("env") or {})))
                 for k, spec in enumerate(specs)]
        deadline = time.monotonic() + timeout
        try:
            while any(p.poll() is None for _, p, _ in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            for _, p, _ in procs:
                _kill(p)
        for k, (spec, p, out) in enumerate(procs):
            if out.is_file():
                got = json.loads(out.read_text())["gpus"]
                results.update({int(g): r for g, r in got.items()})
                continue
            why = (f"exited with {p.returncode}" if p.returncode not in (None, -9)
                   else f"timed out after {timeout:.0f} s")
            tail = (workdir / f"child{k}.log").read_text(errors="replace").strip()
            for g in spec["gpus"]:
                results[int(g)] = {"error": why + (f": {tail.splitlines()[-1]}" if tail else "")}
    return results


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
            spec = {"device": self.device, "gpus": [g], "cuda_index": 0, "tasks": ["burn"], "burn_seconds": 4 * 3600.0,
                    "gemm_n": self.gemm_n if self.device == "cuda" else 256}
            env = gpu_env(self.uuids.get(g)) if self.device == "cuda" else {}
            proc, _ = _start(spec, Path(self._tmp.name), f"burn{g}", env)
            self._procs.append(proc)

    def stop(self) -> None:
        for p in self._procs:
            _kill(p)  # SIGKILL ends a stopped process too
        self._procs, self._gpus = [], []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
