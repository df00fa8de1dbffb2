"""The suite reads nothing of the caller's shell (issue 32): tests/conftest.py builds the environment
every test and every gpud the suite starts sees. Proved by running part of the suite from a shell a
researcher would have: a torch-bearing ``python3`` first on PATH, a terminal width, a locale, colour
settings, CUDA and NCCL variables, a home with its own gpud configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

POLLUTED = {"COLUMNS": "37", "LINES": "9", "NO_COLOR": "1", "FORCE_COLOR": "1", "CLICOLOR_FORCE": "1",
            "LC_ALL": "de_DE.UTF-8", "LANG": "de_DE.UTF-8", "TERM": "xterm-256color",
            "CUDA_VISIBLE_DEVICES": "1", "NCCL_P2P_LEVEL": "LOC", "NCCL_DEBUG": "TRACE",
            "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "CUDA_LAUNCH_BLOCKING": "1", "GPUD_DEBUG": "1",
            "GPUD_SIMULATE": "z8-fury-4x-a6000-degraded", "GPUD_CONFIG": "/nonexistent/gpud.toml",
            "PYTHONWARNINGS": "error"}


def test_the_suite_environment_is_its_own() -> None:
    """What every test sees, whatever the caller's shell held (run alone and from the polluted shell below)."""
    env = os.environ
    for name in POLLUTED:
        if name not in ("LC_ALL", "LANG"):
            assert name not in env, name
    assert env["LC_ALL"] == env["LANG"] == "C.UTF-8"
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert Path(env["HOME"]).name == "home" and Path(env["HOME"]).parent.name.startswith("gpud-tests-")
    python = env["GPUD_PYTHON"]
    found = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
                           capture_output=True, text=True, timeout=60)
    assert found.stdout.strip() == "True", found.stderr  # doctor's training environment: no torch, ever


def test_a_researchers_shell_changes_no_verdict(tmp_path: Path) -> None:
    """README's test command from an activated environment whose python3 has torch failed 65 tests (doctor's
    torch.cuda check asked that python3 and warned of a CPU build). Here a part of the suite whose verdicts
    that changed — doctor on imported twins, through the real CLI — and the check of the environment itself
    run from such a shell, and pass."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python3", "python", "gpud"):  # torch-bearing (this venv's, not a symlink: a venv is
        target = sys.executable if name != "gpud" else "/bin/false"  # found beside the path run), a gpud
        (bin_dir / name).write_text(f"#!/bin/sh\nexec {target} \"$@\"\n")
        (bin_dir / name).chmod(0o755)
    home = tmp_path / "home"
    (home / ".config" / "gpud").mkdir(parents=True)
    (home / ".config" / "gpud" / "gpud.toml").write_text("[doctor]\nexpect_gpus = 99\n")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(home), **POLLUTED}
    env.pop("GPUD_TESTS_ENV", None)
    for k in ("TMPDIR", "CI", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if k in os.environ:
            env[k] = os.environ[k]
    tests = ["tests/test_hermetic.py::test_the_suite_environment_is_its_own",
             "tests/test_sim_import.py::test_doctor_on_every_twin_gives_the_documented_verdicts"]
    # Its own --basetemp: a nested pytest's default one is a new /tmp/pytest-of-USER/pytest-N, and making it
    # deletes all but the three newest there, the tests' files of earlier runs (seconds to minutes of disk).
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                        "--basetemp", str(tmp_path / "inner"),
                        "-k", "own or rtx-a6000-linux-550 or rtx-6000-ada-550 or h200-550", *tests],
                       capture_output=True, text=True, timeout=900, cwd=REPO, env=env)  # a hang guard: ~15 s
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "5 passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]
