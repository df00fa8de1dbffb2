"""Shared fixtures: every test gets its own state directory, so simulated writes never leak."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

import pytest
from gpud_runs import FORKED_CPU, RUNS, run_gpud  # noqa: F401  (the tests import run_gpud from here)

from gpud.backends import open_machine
from gpud.hw.machine import Machine
from gpud.sim.description import shipped_names

REPO = Path(__file__).resolve().parent.parent


def _hermetic_environment() -> None:
    """The suite runs in an environment it builds, not the caller's: a researcher's shell (an activated
    environment whose ``python3`` has torch, ``CUDA_VISIBLE_DEVICES``, ``NCCL_*``, ``COLUMNS``, a locale,
    ``NO_COLOR``, a home with a gpud configuration, an installed ``/usr/local/bin/gpud`` first on PATH)
    changes no verdict. Kept from outside: ``CI`` (missing tools fail instead of skipping), pytest's own
    variables, ``TMPDIR``, OpenBLAS's processor settings (older builds crash without them), and
    ``GPUD_TESTS_FORK`` (``0``: every gpud run a plain interpreter, ``tests/gpud_runs.py``). Then:
    PATH = this interpreter's directory and the system's; HOME a directory of the suite's own; the C
    locale in UTF-8; and doctor's training environment (``GPUD_PYTHON``) an interpreter the suite makes,
    which sees no site-packages (so no torch, whatever the caller has installed)."""
    import atexit
    import shutil
    import tempfile

    outside = ("CI", "TMPDIR", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "GPUD_TESTS_FORK")
    keep = {k: v for k, v in os.environ.items() if k in outside or k.startswith("PYTEST")}
    own = Path(tempfile.mkdtemp(prefix="gpud-tests-"))
    atexit.register(shutil.rmtree, own, True)
    (own / "home").mkdir()
    python = own / "python-without-torch"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # -S: no site-packages
    python.chmod(0o755)
    user = _user_name()
    os.environ.clear()
    os.environ.update(keep)
    os.environ.update({"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/local/sbin", "/usr/local/bin",
                                                "/usr/sbin", "/usr/bin", "/sbin", "/bin"]),
                       "HOME": str(own / "home"), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "USER": user,
                       "LOGNAME": user, "GPUD_PYTHON": str(python),
                       # what runs before a test's own state_dir (a module's fixture) writes here, never to
                       # the machine's /var/lib/gpud (as root) or a user's ~/.local/state/gpud
                       "GPUD_STATE_DIR": str(own / "state"), "GPUD_SOCKET": str(own / "no-daemon.sock")})


def _user_name() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


if "GPUD_TESTS_ENV" not in os.environ:  # once, in the process that starts the session; its workers inherit it
    _hermetic_environment()
    os.environ["GPUD_TESTS_ENV"] = "1"
# Simulated NVML setters need root, as real ones do: the suite (and every gpud it starts) writes as
# if under sudo, whoever runs it; the test of the refusal sets another uid.
os.environ["GPUD_SIM_EUID"] = "0"
# Opening a GPU without persistence mode lasts 3 s in the simulator (as on hardware); the suite opens such
# GPUs hundreds of times, so it shortens that. The test of it (test_fidelity.py,
# test_without_persistence_the_first_lookup_initialises_the_gpu) runs with the real figure.
os.environ["GPUD_SIM_GPU_INIT_S"] = "0.05"
# Noise on, with a fixed seed: each test sets its own (the ``state_dir`` fixture); this one is what a module's
# fixture set up before any test's (a soak run once for a module) sees, so the suite stays deterministic.
os.environ["GPUD_SIM_SEED"] = "34"
os.environ.pop("GPUD_SIM_NOISE", None)
# Every gpud the suite starts writes as through a pipe, with no terminal size from outside: pytest-xdist's
# workers start with COLUMNS=80 and LINES=24, which would wrap each one-line error (a test that wants a
# width gives COLUMNS itself). Here, before the test modules copy the environment.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
SHIPPED = shipped_names()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile gpud once, before any test: the suite starts gpud in child processes hundreds of
    times, and where PYTHONDONTWRITEBYTECODE is set (as in many container images) each of them would
    otherwise compile every module it imports from source again (about 0.2 s of CPU of the 0.8 s a
    `gpud status --simulate` takes). Only the process that runs the session does it, not each worker."""
    if not hasattr(session.config, "workerinput"):
        import compileall

        compileall.compile_dir(REPO / "gpud", quiet=2)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """In parallel by default: two pytest-xdist workers per CPU with ``--dist loadgroup``, unless the command
    line says otherwise (``-n 0``: one process) or xdist is not there (``-p no:xdist``). Two per CPU, as most
    of the suite's time is gpud's children starting and waiting: 8 min against 11 with one per CPU. (Under
    that load a torchrun rank once aborted at exit in Gloo, "terminate called without an active exception":
    a rank now leaves without the interpreter's teardown, ``gpud.cli.probe._leave_rank``.)
    Here rather than in pyproject's addopts, which would make ``-n`` an error without the plugin."""
    if (config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput")
            and config.option.numprocesses is None):
        config.option.numprocesses = 2 * len(os.sched_getaffinity(0))
        if config.option.dist == "no":
            config.option.dist = "loadgroup"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """A worker parses the command line again and so never sees the ``--dist`` set above: it would not mark
    its tests' nodeids with their group, and the scheduler would split every group (a module fixture set up
    once per worker its tests land on: the Grafana lab twice, the burn-in soaks four times). Tell it."""
    node.workerinput["gpud_dist"] = node.config.option.dist


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """For running in parallel (pytest-xdist, ``-n auto`` in pyproject.toml): the tests marked ``long``
    go first, so that none of them starts last and holds the run up alone; and the tests that share a
    fixture set up once per module (a lab of daemons, a soak in simulated time) run in one worker, as a
    group, so the fixture is not set up again in another (before xdist reads the groups, hence tryfirst)."""
    on_worker = getattr(config, "workerinput", {}).get("gpud_dist") == "loadgroup"
    if on_worker:
        config.option.loadgroup = True  # what xdist's worker reads to add the group to each nodeid
    grouped = set()
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        for name in info.names_closure if info is not None else ():
            for fdef in info.name2fixturedefs.get(name, ()):
                if fdef.scope != "function" and fdef.baseid.endswith(".py"):  # a test module's own fixture
                    group = f"{fdef.baseid}::{name}"
                    item.add_marker(pytest.mark.xdist_group(group))
                    if on_worker:
                        _add_group_to_nodeid(item, group)
                    grouped.add(item.nodeid)
    # Stable: otherwise as collected. A group counts as long: its tests run one after another.
    items.sort(key=lambda item: item.get_closest_marker("long") is None and item.nodeid not in grouped)


# -- where the suite's CPU goes -----------------------------------------------------------------
# On two cores the suite is CPU-bound (95 % of both busy over a whole run, 2026-12-07): its wall time is at least
# its CPU time over the cores. The terminal summary splits that CPU by test file, into the test process's own
# (gpud and its simulator in-process, fixtures included) and its child processes' (gpud's CLI, daemons, probe
# ranks, torch's import in each): what a change must cut for the suite to finish sooner.
_CPU: dict[str, list[float]] = {}


def _cpu_now() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime + FORKED_CPU[0]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Each test's CPU (set-up, call and tear-down), counted against its file. A child is counted once it is
    reaped (waited for), with the children it reaped in turn."""
    own0, kids0 = _cpu_now()
    try:
        return (yield)
    finally:
        own1, kids1 = _cpu_now()
        _count_cpu(item.nodeid.split("::")[0], own1 - own0, kids1 - kids0)


def _count_cpu(path: str, own: float, kids: float) -> None:
    got = _CPU.setdefault(path, [0.0, 0.0])
    got[0] += own
    got[1] += kids


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)
    if output is not None:  # a pytest-xdist worker: its figures go to the controller (pytest_testnodedown)
        output["gpud_cpu"] = json.dumps(_CPU)
        output["gpud_runs"] = json.dumps(RUNS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", {})
    for path, (own, kids) in json.loads(output.get("gpud_cpu", "{}")).items():
        _count_cpu(path, own, kids)
    for way, n in json.loads(output.get("gpud_runs", "{}")).items():
        RUNS[way] += n


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not _CPU:
        return
    cores = len(os.sched_getaffinity(0))
    own, kids = sum(v[0] for v in _CPU.values()), sum(v[1] for v in _CPU.values())
    tr = terminalreporter
    tr.section("CPU by test file")
    tr.write_line(f"{own + kids:.0f} s of CPU: {own:.0f} s in the tests' processes, {kids:.0f} s in their children; "
                  f"over {cores} CPU(s), at least {(own + kids) / cores:.0f} s of wall time")
    tr.write_line(f"runs of gpud's command line (tests/gpud_runs.py): {RUNS['forked']} forked, "
                  f"{RUNS['plain']} in a plain interpreter")
    tr.write_line(f"{'CPU s':>8} {'own':>7} {'children':>9}  file")
    for path, (o, k) in sorted(_CPU.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:15]:
        tr.write_line(f"{o + k:8.1f} {o:7.1f} {k:9.1f}  {path}")


def _add_group_to_nodeid(item: pytest.Item, group: str) -> None:
    """What pytest-xdist's worker does for ``--dist loadgroup`` (``nodeid@group``, which its scheduler splits
    on), done here where xdist's own cannot: it assigns ``item._nodeid``, which pytest 9 no longer reads (a
    node's id is ``item._id``, a ``NodeId``), so under pytest 9 every group was split across the workers.
    Before pytest 9 xdist's assignment works and nothing is done here."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:  # pytest before 9
        return
    if isinstance(getattr(item, "_id", None), NodeId) and not item.nodeid.endswith("@" + group):
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


def seed_of(nodeid: str) -> int:
    """The simulator's seed for a test: from its node id, so each test has its own realisation of noise
    and spread and the same one on every run (docs/simulation.md, "Noise and spread"), in one process or
    under pytest-xdist (whose ``--dist loadgroup`` appends ``@group`` to a grouped test's id: left out)."""
    import hashlib

    base = nodeid.split("@", 1)[0]
    return int.from_bytes(hashlib.blake2b(base.encode(), digest_size=4).digest(), "big")


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("GPUD_STATE_DIR", str(d))
    # The suite runs under noise (the simulator's default), each test with its own fixed seed; a test that
    # needs exact figures sets GPUD_SIM_NOISE=0 itself, one that needs several realisations GPUD_SIM_SEED.
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed_of(request.node.nodeid)))
    monkeypatch.delenv("GPUD_SIM_NOISE", raising=False)
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
