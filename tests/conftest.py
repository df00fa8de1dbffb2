"""Shared fixtures: every test gets its own state directory, so simulated writes never leak."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpud.backends import open_machine
from gpud.hw.machine import Machine
from gpud.sim.description import shipped_names

REPO = Path(__file__).resolve().parent.parent
# Simulated NVML setters need root, as real ones do: the suite (and every gpud it starts) writes as
# if under sudo, whoever runs it; the test of the refusal sets another uid.
os.environ["GPUD_SIM_EUID"] = "0"
# Opening a GPU without persistence mode lasts 3 s in the simulator (as on hardware); the suite opens such
# GPUs hundreds of times, so it shortens that. The test of it (test_fidelity.py,
# test_without_persistence_the_first_lookup_initialises_the_gpu) runs with the real figure.
os.environ["GPUD_SIM_GPU_INIT_S"] = "0.05"
SHIPPED = shipped_names()


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("GPUD_STATE_DIR", str(d))
    monkeypatch.setenv("GPUD_SOCKET", str(tmp_path / "no-daemon.sock"))  # never a real daemon's socket
    monkeypatch.delenv("GPUD_SIMULATE", raising=False)
    monkeypatch.delenv("GPUD_CONFIG", raising=False)
    return d


@pytest.fixture
def open_sim():
    """open_sim(name) → a Machine on that simulated workstation (a fresh NVML layer)."""

    def _open(name: str) -> Machine:
        return open_machine(name)

    return _open


def run_gpud(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a child process, as a user would."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("GPUD_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "gpud", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, cwd=REPO)


def write_description(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


MINIMAL = """
[machine]
name = "{name}"

[[gpu]]
model = "RTX A6000"
bus_id = "0000:17:00.0"
root_port = "0000:16:01.0"
"""
