"""The suite's runs of the real command line, each in a child process of its own, started without paying
for an interpreter and gpud's imports every time.

Most of the suite's CPU is in child processes (the "CPU by test file" section of every run), and about 560
of them are ``python -m gpud ...``: 0.40–0.46 s of CPU each, of which about 0.30 s is the interpreter's
start and the imports of gpud, typer, pynvml and the simulator, the same in every run. Here one process per
pytest process (the *fork server*, this file run as a script) imports them once; each run is a fork of it
that takes the run's environment, working directory, arguments and output files, and runs ``gpud`` as
``python -m gpud`` would (``runpy``), then exits through the interpreter's own shutdown (threads joined,
``atexit`` handlers, buffers flushed). Every run is a fresh process still: nothing a run does reaches another
or the suite, and the server runs no gpud code itself, it only imports modules (no module of gpud reads the
environment when imported but ``gpud.cli.output``'s ``GPUD_DEBUG``, listed below).

A run starts a plain interpreter instead (``python -m gpud``, as before) where a fork could differ from it:
an environment that changes what the interpreter or an imported module decided at its start (``PYTHON*``,
the locale, ``TZ``, ``GPUD_DEBUG``, typer's and prometheus-client's import-time switches); a second run
while one is in progress (another thread); no ``fork``; a fork server that could not start; or
``GPUD_TESTS_FORK=0``.

The output goes to files, read once the run has ended; its CPU (``wait4``, its reaped children included)
comes back with its exit status and is counted as the test's children's (``tests/conftest.py``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# What the fork server imports before it forks: the command line, every command's module, and what a run on a
# simulated workstation imports (from `python -X importtime -m gpud status|doctor|apply|metrics|ps|events`).
# Not typer.rich_utils or rich, whose imports read the environment (a run imports them itself when it needs
# them), nor anything that imports torch.
PRELOAD = ("gpud.cli", "gpud.cli.common", "gpud.cli.output", "gpud.cli.complete", "gpud.backends",
           "gpud.hw.machine", "gpud.sim.machine", "gpud.sim.libnvml.library", "gpud.doctor.checks_env",
           "gpud.doctor.checks_gpu", "gpud.doctor.checks_host", "gpud.doctor.checks_pcie",
           "gpud.doctor.checks_probe", "gpud.doctor.checks_system", "gpud.doctor.configcheck", "gpud.exporter",
           "gpud.journal", "gpud.profiles.session", "gpud.probe.report", "gpud.daemon.control", "pynvml",
           "prometheus_client", "shellingham")

# Variables read when the interpreter starts or when a preloaded module is imported: a run that sets one to
# other than the fork server has starts a plain interpreter.
_AT_START = ("PYTHON", "LC_", "LANG", "LANGUAGE", "TZ", "GPUD_DEBUG", "TYPER_", "_TYPER_STANDARD_TRACEBACK",
             "PROMETHEUS_")


def _read_at_start(name: str) -> bool:
    return any(name == p or (p.endswith(("_", "PYTHON")) and name.startswith(p)) for p in _AT_START)


FORKED_CPU = [0.0]  # CPU seconds of the runs the fork server started (reaped by it, not by this process)
RUNS = {"forked": 0, "plain": 0}  # the runs of this process, each way (the suite's summary prints them)


class _NotStarted(Exception):
    """The fork server did not answer a request: the run did not start."""


class _Server:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.sock: socket.socket | None = None
        self.buf = b""
        self.env: dict[str, str] = {}
        self.dir = ""
        self.broken = False

    def _start(self) -> None:
        import atexit
        import shutil

        self.dir = tempfile.mkdtemp(prefix="gpud-forkserver-")
        atexit.register(shutil.rmtree, self.dir, True)
        mine, theirs = socket.socketpair()
        self.env = dict(os.environ)
        log = open(Path(self.dir) / "server.log", "wb")
        try:
            self.proc = subprocess.Popen([sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, cwd=REPO,
                                         env=self.env)
        finally:
            log.close()
            theirs.close()
        self.sock = mine

    def usable(self, env: dict[str, str]) -> bool:
        if self.broken or os.environ.get("GPUD_TESTS_FORK") == "0" or not hasattr(os, "fork"):
            return False
        base = self.env or os.environ
        return not any(_read_at_start(k) and base.get(k) != env.get(k) for k in {*env, *base})

    def _line(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next answer (one JSON line); None if none came within ``timeout`` seconds."""
        assert self.sock is not None
        while b"\n" not in self.buf:
            if timeout is not None and not select.select([self.sock], [], [], timeout)[0]:
                return None
            data = self.sock.recv(65536)
            if not data:
                raise OSError("the fork server exited: " + (Path(self.dir) / "server.log").read_text(errors="replace"))
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def run(self, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
        if self.proc is None:
            try:
                self._start()
            except OSError as failed:
                raise _NotStarted from failed
        assert self.sock is not None
        out, err = tempfile.mkstemp(dir=self.dir), tempfile.mkstemp(dir=self.dir)
        for fd, _ in (out, err):
            os.close(fd)
        try:
            try:
                self.sock.sendall((json.dumps({"argv": argv, "env": env, "cwd": str(REPO), "stdout": out[1],
                                               "stderr": err[1]}) + "\n").encode())
                pid = self._line(None)["pid"]  # type: ignore[index]
            except OSError as gone:  # before any fork: nothing of this run happened
                raise _NotStarted from gone
            done = self._line(timeout)
            timed_out = done is None
            if timed_out:
                os.kill(pid, signal.SIGKILL)  # as subprocess.run does on a timeout: the child, not its children
                done = self._line(None)
            assert done is not None
            FORKED_CPU[0] += done["cpu"]
            stdout, stderr = (_text(Path(p).read_bytes()) for p in (out[1], err[1]))
        finally:
            for p in (out[1], err[1]):
                os.unlink(p)
        args = [sys.executable, "-m", "gpud", *argv]
        if timed_out:
            raise subprocess.TimeoutExpired(args, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(args, os.waitstatus_to_exitcode(done["status"]), stdout, stderr)


def _text(data: bytes) -> str:
    """As ``subprocess.run(..., text=True)`` decodes: the locale's encoding, universal newlines."""
    import locale

    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


_SERVER = _Server()


def run_gpud(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the real command line in a child process, as a user would: a fork of the fork server where it can
    stand for a plain ``python -m gpud`` (above), else that."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("GPUD_DEBUG", None)
    if _SERVER.usable(full_env) and _SERVER.lock.acquire(blocking=False):
        try:
            done = _SERVER.run(list(args), full_env, timeout)
            RUNS["forked"] += 1
            return done
        except _NotStarted:
            _SERVER.broken = True  # the server is gone: this run and every later one start a plain interpreter
        except subprocess.TimeoutExpired:
            raise  # the run was killed and answered for: the server goes on
        except BaseException:
            _SERVER.broken = True  # cut off mid-run (Ctrl-C, the server gone): its next answer is not the next run's
            raise
        finally:
            _SERVER.lock.release()
    RUNS["plain"] += 1
    return plain(*args, env=full_env, timeout=timeout)


def plain(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m gpud ARGS`` in a plain interpreter, in ``env`` as given."""
    return subprocess.run([sys.executable, "-m", "gpud", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)


# -- the fork server ---------------------------------------------------------------------------------

def _serve(fd: int) -> dict[str, Any]:
    """Import, then fork a child per request; return the request in the child (which runs it)."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from gpud.cli import COMMANDS

    for module, _ in COMMANDS.values():
        importlib.import_module(f"gpud.cli.{module}")
    sock = socket.socket(fileno=fd)
    reader = sock.makefile("rb")
    while line := reader.readline():
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            reader.close()
            sock.close()
            return req  # type: ignore[no-any-return]
        sock.sendall((json.dumps({"pid": pid}) + "\n").encode())
        _, status, usage = os.wait4(pid, 0)
        sock.sendall((json.dumps({"status": status, "cpu": usage.ru_utime + usage.ru_stime}) + "\n").encode())
    sys.exit(0)


def _child(req: dict[str, Any]) -> None:
    """Become ``python -m gpud ARGS`` in the request's directory, environment and output files."""
    import runpy

    for target, path in ((1, req["stdout"]), (2, req["stderr"])):
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    tempfile.tempdir = None  # TMPDIR as the run has it
    sys.argv = ["-m", *req["argv"]]
    runpy.run_module("gpud", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    sys.path[0] = str(REPO)  # as `python -m gpud` from the repository has it: the working directory first
    _child(_serve(int(sys.argv[1])))
