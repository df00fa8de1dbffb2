"""The training environment: variables that quietly break or slow training, and torch's CUDA."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpud import child
from gpud.doctor.registry import Context, Reporter, check
from gpud.model import CheckResult

TRUE = {"1", "true", "yes", "on"}
FLAGS = {
    "NCCL_P2P_DISABLE": "disables NVLink/PCIe peer-to-peer: all-reduce goes through host memory",
    "NCCL_SHM_DISABLE": "disables NCCL's shared-memory transport",
    "CUDA_LAUNCH_BLOCKING": "serialises every kernel launch (a debugging switch)",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "disables PyTorch's caching allocator (a debugging switch)",
}
VALUES = {
    "NCCL_P2P_LEVEL": ({"loc", "0"}, "restricts peer-to-peer to nothing"),
    "NCCL_DEBUG": ({"trace"}, "traces every NCCL call"),
    "TORCH_DISTRIBUTED_DEBUG": ({"detail"}, "adds collective consistency checks to every step"),
}
# CUDA debugger/profiler injection and core-dump switches (the list DCGM's diagnostics refuse to run with).
INJECTION = ("CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH", "CUDA_AUTO_BOOST", "CUDA_ENABLE_COREDUMP_ON_EXCEPTION",
             "CUDA_COREDUMP_FILE", "CUDA_DEVICE_WAITS_ON_EXCEPTION", "CUDA_PROFILE", "CUDA_PROFILE_CONFIG",
             "CUDA_PROFILE_LOG", "CUDA_PROFILE_CSV")


@check("env.cuda", "Environment", needs_nvml=False)
def env_cuda(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    found = []
    for var, why in FLAGS.items():
        if ctx.env.get(var, "").strip().lower() in TRUE:
            found.append(f"{var}={ctx.env[var]}: {why}")
    for var, (bad, why) in VALUES.items():
        if ctx.env.get(var, "").strip().lower() in bad:
            found.append(f"{var}={ctx.env[var]}: {why}")
    for var in INJECTION:
        if var in ctx.env:
            found.append(f"{var} is set: a debugger/profiler hook slows every CUDA call")
    visible = ctx.env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [v for v in visible.split(",") if v.strip()]
        total = len(ctx.snapshot.samples) if ctx.snapshot else None
        if not entries or entries[0].strip() == "-1":
            found.append("CUDA_VISIBLE_DEVICES hides every GPU")
        elif total is not None and len(entries) < total:
            found.append(f"CUDA_VISIBLE_DEVICES={visible} shows {len(entries)} of {total} GPUs")
    if found:
        yield r.warn(found[0] if len(found) == 1 else f"{len(found)} variables slow or restrict training: "
                     + found[0], detail="\n".join(found),
                     remedy="unset them in the job's environment (`env | grep -E 'NCCL|CUDA|TORCH'`) unless "
                            "debugging on purpose")
    else:
        yield r.ok("no variable that slows or restricts training")


FIND_TORCH = ("import importlib.util, json, sys; s = importlib.util.find_spec('torch'); "
              "print(json.dumps({'origin': s.origin if s else None, 'python': sys.executable}))")


def _python(ctx: Context) -> str:
    """The interpreter jobs use: [doctor] python, GPUD_PYTHON, python3 on PATH, else gpud's own."""
    return (ctx.config.doctor.python or ctx.env.get("GPUD_PYTHON") or shutil.which("python3", path=ctx.env.get(
        "PATH")) or sys.executable)


def _python_origin(ctx: Context) -> str:
    """Why that interpreter, and how to choose another — said in the line itself, not only under -v."""
    if ctx.config.doctor.python:
        return "[doctor] python in gpud.toml"
    if ctx.env.get("GPUD_PYTHON"):
        return "GPUD_PYTHON"
    return "python3 on PATH, the training environment's; GPUD_PYTHON or [doctor] python choose another"


def inspect_torch(python: str) -> dict[str, object] | None:
    """Where torch is and how it was built, without importing it (fast): None if absent.

    A child process asks the job's interpreter where torch lives; its ``version.py`` says the
    version and CUDA it was built for, its libraries whether NCCL is there.
    """
    # In an empty directory of its own: ``-c`` puts the working directory first on sys.path, where a user's
    # ``json.py`` would run (as root under ``sudo gpud doctor``); PYTHONSAFEPATH (Python 3.11+) leaves it
    # off altogether. As root with a constructed environment (no PYTHONPATH, LD_PRELOAD…); a user asking
    # about their own environment keeps theirs (their PYTHONPATH is part of how their jobs find torch). Not
    # ``-I``: this is the jobs' interpreter, not gpud's, and a wrapper it is (a module system's, a
    # container's) may set what its jobs import.
    root = os.geteuid() == 0
    env = {**(child.environment() if root else os.environ), "PYTHONSAFEPATH": "1"}
    question = [python, "-c", FIND_TORCH]
    try:
        with tempfile.TemporaryDirectory(prefix="gpud-doctor-") as cwd:
            r = subprocess.run(question, capture_output=True, text=True, timeout=20, cwd=cwd, env=env)
        info = json.loads(r.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    if not info.get("origin"):
        return None
    pkg = Path(info["origin"]).parent
    text = (pkg / "version.py").read_text() if (pkg / "version.py").is_file() else ""
    version = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)", text, re.M)
    hip = re.search(r"^hip\s*(?::[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
    nccl = any(pkg.glob("lib/libnccl*")) or any((pkg.parent / "nvidia").glob("nccl/lib/libnccl*"))
    return {"python": info["python"], "path": str(pkg), "version": version.group(1) if version else None,
            "cuda": cuda.group(1) if cuda and cuda.group(1) else None, "hip": hip.group(1) if hip else None,
            "nccl": nccl}


def _ver(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


@check("torch.cuda", "Environment", needs_nvml=False)
def torch_cuda(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    python = _python(ctx)
    t = inspect_torch(python)
    if t is None:
        yield r.skip(f"torch is not installed for {python} ({_python_origin(ctx)})",
                     remedy="set [doctor] python in gpud.toml (or GPUD_PYTHON) to your training environment's python; "
                            "to install torch there see the README's \"PyTorch for the probe\"")
        return
    name = f"torch {t['version']} ({t['python']}: {_python_origin(ctx)})"
    driver = ctx.snapshot.versions.cuda_driver if ctx.snapshot else None
    if t["hip"]:
        yield r.warn(f"{name} is a ROCm build: it cannot use NVIDIA GPUs",
                     remedy="install a CUDA build: https://pytorch.org/get-started/locally/")
    elif not t["cuda"]:
        yield r.warn(f"{name} is a CPU-only build: training will not use the GPUs",
                     remedy="install a CUDA build matching the driver's CUDA "
                            f"{driver or '?'}: https://pytorch.org/get-started/locally/")
    elif driver and _ver(str(t["cuda"]))[0] > _ver(driver)[0]:
        yield r.fail(f"{name} is built for CUDA {t['cuda']}, the driver supports CUDA {driver}: torch "
                     "cannot use the GPUs", remedy=f"update the NVIDIA driver, or install torch built for CUDA "
                     f"≤ {driver}")
    elif driver and _ver(str(t["cuda"])) > _ver(driver):
        yield r.warn(f"{name} is built for CUDA {t['cuda']}, newer than the driver's {driver}: it runs "
                     "through minor-version compatibility, but kernels JIT-compiled from PTX can fail",
                     remedy=f"update the NVIDIA driver, or install torch built for CUDA ≤ {driver}")
    elif not t["nccl"] and len(ctx.samples) > 1:
        yield r.warn(f"{name} (CUDA {t['cuda']}) has no NCCL: multi-GPU DDP falls back to gloo",
                     remedy="install torch's CUDA wheel with its nvidia-nccl dependency")
    else:
        yield r.ok(f"{name}, CUDA {t['cuda']} (driver {driver or '?'}), NCCL "
                   f"{'present' if t['nccl'] else 'absent'}")
