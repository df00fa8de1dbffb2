"""The suite's runs of the command line (``run_gpud``, tests/gpud_runs.py): a fork of a server that imported gpud
once stands for ``python -m gpud``; a run through it prints, exits and sees its environment as a plain
interpreter's run does, each run is a process of its own, and a run the fork could get wrong starts a plain
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import gpud_runs
import pytest
from conftest import run_gpud

pytestmark = pytest.mark.skipif(os.environ.get("GPUD_TESTS_FORK") == "0", reason="GPUD_TESTS_FORK=0: no fork server")


@pytest.mark.parametrize("args", [
    ("sim", "list"), ("profile", "show", "quiet", "--json"), ("apply", "nosuch", "--simulate", "z8-fury-4x-a6000"),
    ("topo", "--simulate", "z8-fury-4x-a6000-degraded"), ("doctor", "--simulate", "z8-fury-4x-a6000-degraded", "-q"),
    ("--no-such-option",)])
def test_a_forked_run_prints_and_exits_as_a_plain_interpreters_run(args: tuple[str, ...]) -> None:
    before = gpud_runs.FORKED_CPU[0]
    env = {"COLUMNS": "100", "GPUD_SIM_NOISE": "0"}  # noise-free: the readings do not depend on when they are made
    forked, plain = run_gpud(*args, env=env), gpud_runs.plain(*args, env={**os.environ, **env})
    assert gpud_runs.FORKED_CPU[0] > before  # it went through the fork server, and its CPU was counted
    assert (forked.returncode, forked.stdout, forked.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert forked.args == [sys.executable, "-m", "gpud", *args]


def test_each_run_has_the_environment_it_was_given_and_no_other(tmp_path) -> None:
    """A variable a run was given reaches it and not the next run: GPUD_SIMULATE picks the machine."""
    a = run_gpud("status", "--json", env={"GPUD_SIMULATE": "z8-fury-4x-a6000-degraded"})
    b = run_gpud("status", "--json")
    assert a.returncode == 0 and '"z8-fury-4x-a6000-degraded"' in a.stdout
    assert b.returncode != 0 and "z8-fury" not in b.stdout  # no NVML here, nothing simulated: not the last run's
    wide = run_gpud("status", "--simulate", "z8-fury-4x-a6000", env={"COLUMNS": "200"}).stdout
    narrow = run_gpud("status", "--simulate", "z8-fury-4x-a6000", env={"COLUMNS": "60"}).stdout
    assert max(map(len, narrow.splitlines())) <= 60 < max(map(len, wide.splitlines()))


def test_what_the_interpreter_reads_at_its_start_gets_a_plain_interpreter() -> None:
    assert not gpud_runs._SERVER.usable({**os.environ, "PYTHONWARNINGS": "error"})
    assert not gpud_runs._SERVER.usable({**os.environ, "LC_ALL": "de_DE.UTF-8"})
    assert not gpud_runs._SERVER.usable({**os.environ, "GPUD_DEBUG": "1"})
    assert gpud_runs._SERVER.usable({**os.environ, "GPUD_SIMULATE": "z8-fury-4x-a6000", "COLUMNS": "80"})
    before = gpud_runs.FORKED_CPU[0]
    r = run_gpud("status", "--simulate", "z8-fury-4x-a6000", env={"PYTHONWARNINGS": "error::DeprecationWarning"})
    assert r.returncode == 0 and gpud_runs.FORKED_CPU[0] == before  # a plain interpreter, reaped here


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_run_does() -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as got:
        run_gpud("status", "--watch", "--interval", "0.2", "--simulate", "z8-fury-4x-a6000", timeout=2)
    assert time.monotonic() - started < 30 and got.value.timeout == 2
    assert run_gpud("sim", "list").returncode == 0  # the server goes on


def test_a_fork_server_that_is_gone_leaves_the_runs_to_plain_interpreters(monkeypatch: pytest.MonkeyPatch) -> None:
    server = gpud_runs._Server()
    monkeypatch.setattr(gpud_runs, "_SERVER", server)  # this test's own server: the suite's goes on
    assert run_gpud("sim", "list").returncode == 0 and server.proc is not None
    server.proc.kill()
    server.proc.wait()
    plain = gpud_runs.RUNS["plain"]
    r = run_gpud("sim", "list")
    assert r.returncode == 0 and "z8-fury-4x-a6000" in r.stdout  # the run did not start there: it ran plain
    assert server.broken and gpud_runs.RUNS["plain"] == plain + 1
    assert run_gpud("sim", "list").returncode == 0 and gpud_runs.RUNS["plain"] == plain + 2
