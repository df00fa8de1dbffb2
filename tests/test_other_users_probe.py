"""The machine's other users and gpud's children (issue 38, items 1, 2 and 9): the probe's ranks meet
where no one else can listen, exchange JSON, not pickles; every Python child gpud starts is isolated
from the caller's directory; the probe's lock follows no symlink and lives where no one else writes."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO

from gpud import child
from gpud.doctor.checks_env import inspect_torch
from gpud.probe import launch as launcher
from gpud.probe.errors import ProbeBusy, ProbeError
from gpud.probe.launch import launch
from gpud.probe.lock import probe_lock
from gpud.probe.torchrun import torch_available

needs_torch = pytest.mark.skipif(not torch_available() and os.environ.get("CI") != "true",
                                 reason="PyTorch not installed: README, Run the tests, says how to add the CPU build")


def _listening(pids: set[int]) -> list[tuple[str, str]]:
    """(proc/net file, local address hex) of each TCP socket in LISTEN state that one of ``pids`` holds."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:
                found.append((table, cols[1].rsplit(":", 1)[0]))
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


@needs_torch
def test_a_listener_on_the_rendezvous_port_gets_no_rank_and_ranks_listen_on_loopback_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A local user who holds the port the ranks were to meet on (MASTER_PORT, or the one the launcher
    picked and closed) sees no connection: the ranks meet through a file in the launcher's private
    directory, and whatever sockets they open for their data listen on loopback alone."""
    trap = socket.socket()
    trap.bind(("127.0.0.1", 0))
    trap.listen(16)
    trap.settimeout(0.1)
    port = trap.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setattr(launcher, "_free_port", lambda: port, raising=False)  # the launcher's old pick
    caught: list[object] = []
    stop = threading.Event()
    pids: set[int] = set()
    listens: list[tuple[str, str]] = []

    def watch() -> None:
        while not stop.is_set():
            try:
                conn, peer = trap.accept()
                caught.append(peer)
                conn.close()
            except TimeoutError:
                pass
            listens.extend(_listening(set(pids)))

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        workdir = tmp_path / "work"
        workdir.mkdir(mode=0o700)
        res = launch({"device": "cpu", "tasks": ["allreduce"], "quick": True}, 2, 120.0, workdir, pids=pids)
    finally:
        stop.set()
        t.join(5)
        trap.close()
    assert caught == [], f"a rank connected to the port another user held: {caught}"
    assert res["world_size"] == 2 and len(res["ranks"]) == 2
    assert [r["rank"] for r in res["ranks"]] == [0, 1]
    assert listens, "the watcher saw no rank's listening socket (the data plane's): it looked at nothing"
    assert {addr for _, addr in listens} <= LOOPBACK, listens


@needs_torch
def test_ranks_exchange_json_so_a_pickle_on_the_wire_is_data(tmp_path: Path) -> None:
    """What the ranks exchange (their facts, the torchrun path's refusals) goes as JSON bytes: a value
    whose pickle would run code arrives as the text it is."""
    code = f"""
import json, os, sys, torch.distributed as dist
from gpud.probe import worker
dist.init_process_group("gloo", store=dist.FileStore({str(tmp_path / "store")!r}, 2),
                        rank=int(sys.argv[1]), world_size=2)
got = worker.gather({{"cos": "os.system", "rank": int(sys.argv[1]), "t": [1.5, None, "\\u2028"]}})
print(json.dumps(got))
dist.destroy_process_group()
"""
    import subprocess

    procs = [subprocess.Popen(child.python("-c", code, str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path, env=child.environment({"GLOO_SOCKET_IFNAME": "lo"}))
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert json.loads(out) == [{"cos": "os.system", "rank": r, "t": [1.5, None, "\u2028"]} for r in range(2)]
    source = (REPO / "gpud" / "probe" / "worker.py").read_text()
    assert "_object(" not in source, "a *_object collective unpickles what other processes sent"


def test_a_module_in_the_callers_directory_is_not_imported_by_gpuds_children(tmp_path: Path) -> None:
    """A ``json.py`` left where an admin runs gpud: doctor's torch question, the probe's ranks and the
    burn-in's kernels never import it (each is ``-I`` in a private directory)."""
    trap = tmp_path / "trap"
    trap.mkdir()
    marker = tmp_path / "imported"
    (trap / "json.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\nraise SystemExit(3)\n")
    (trap / "gpud").mkdir()
    (trap / "gpud" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    old = os.getcwd()
    os.chdir(trap)
    try:
        info = inspect_torch(sys.executable)  # as root (the suite runs as root in CI) or as a user
        for argv in (child.python("-c", "import json, gpud; print(gpud.__file__)"),
                     child.python("-m", "gpud", "--version")):
            import subprocess

            r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=child.environment())
            assert r.returncode == 0, r.stderr
            assert str(trap) not in r.stdout
    finally:
        os.chdir(old)
    assert not marker.exists(), "a child imported a module from the caller's directory"
    if torch_available():
        assert info is not None  # the torch of this interpreter found, from a directory of its own


def test_children_get_a_constructed_environment() -> None:
    env = child.environment({"X": "1"}, base={"PATH": "/usr/bin", "LD_PRELOAD": "/tmp/evil.so",
                                              "PYTHONPATH": "/tmp", "BASH_ENV": "/tmp/rc", "NCCL_DEBUG": "WARN",
                                              "GPUD_SIMULATE": "z8", "LC_ALL": "C", "TMPDIR": "/home/u/tmp"})
    assert env == {"PATH": "/usr/bin", "NCCL_DEBUG": "WARN", "GPUD_SIMULATE": "z8", "LC_ALL": "C", "X": "1"}
    assert child.environment(base={})["PATH"] == child.SAFE_PATH
    assert child.python("-m", "x")[1] == "-I"


def test_the_probe_lock_follows_no_symlink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A symlink planted where the lock goes (world-writable /run/lock with protected_symlinks off) would
    have had root truncate its target: refused, and the target untouched."""
    victim = tmp_path / "victim"
    victim.write_text("root's data\n")
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o755)
    (locks / "probe.lock").symlink_to(victim)
    monkeypatch.setenv("GPUD_PROBE_LOCK", str(locks / "probe.lock"))
    with pytest.raises(ProbeError, match="symlink"), probe_lock():
        pass
    assert victim.read_text() == "root's data\n"


def test_the_probe_lock_is_refused_in_a_directory_others_can_write(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """In a world-writable directory another user can pre-create the lock and hold it (every probe
    blocked) or swap it: not used."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("GPUD_PROBE_LOCK", str(shared / "probe.lock"))
    with pytest.raises(ProbeError, match="can be written by another user"), probe_lock():
        pass
    assert not (shared / "probe.lock").exists()


def test_the_default_probe_lock_is_in_roots_runtime_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUD_PROBE_LOCK", raising=False)
    monkeypatch.delenv("GPUD_STATE_DIR", raising=False)
    from gpud.paths import probe_lock_path

    assert probe_lock_path() == Path("/run/gpud/probe.lock")


def test_a_held_lock_still_says_who_holds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_PROBE_LOCK", str(tmp_path / "probe.lock"))
    with probe_lock():
        mode = stat.S_IMODE(os.stat(tmp_path / "probe.lock").st_mode)
        assert mode & 0o022 == 0
        assert (tmp_path / "probe.lock").read_text().strip() == str(os.getpid())
        with pytest.raises(ProbeBusy, match=f"pid {os.getpid()}"), probe_lock():  # at once, not waiting
            pass
