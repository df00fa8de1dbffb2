"""Issue 13, tuning state (one lock, corrupt files, rollback of every write, unsaveable state) and
issue 11's two tuning items (settings the driver forgets without persistence; unsupported settings)."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from tuning_helpers import RICH, cli, fingerprint, fresh, write_profile

from gpud.profiles import engine
from gpud.profiles import state as st
from gpud.profiles.profile import load

SIM = "z8-fury-4x-a6000"
DEGRADED = "z8-fury-4x-a6000-degraded"  # persistence mode off


def _gpud(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpud", *args], env={**os.environ, "GPUD_SIMULATE": SIM},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def test_apply_waits_for_the_machine_wide_tuning_lock(tmp_path: Path, state_dir) -> None:
    from gpud.paths import TuningLock

    original = fingerprint(fresh())
    p = write_profile(tmp_path, RICH)
    lock = TuningLock("gpud apply")
    lock.acquire()
    try:
        proc = _gpud("apply", str(p))
        time.sleep(2.0)
        assert proc.poll() is None  # waiting
        assert fingerprint(fresh()) == original  # and nothing written meanwhile
    finally:
        lock.release()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert fingerprint(fresh())["0"]["power"] == 250


def test_two_applies_at_once_then_restore_brings_back_the_true_originals(tmp_path: Path, state_dir) -> None:
    original = fingerprint(fresh())
    a = write_profile(tmp_path, RICH, "a.toml")
    b = write_profile(tmp_path, {"all": {"persistence_mode": True, "power_limit": 200,
                                         "applications_clocks": "max"}}, "b.toml")
    procs = [_gpud("apply", str(a)), _gpud("apply", str(b))]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    r = _gpud("restore")
    out, err = r.communicate(timeout=60)
    assert r.returncode == 0, err
    assert fingerprint(fresh()) == original


CORRUPT = {
    "truncated": b'{"profile": "p", "originals": {"0": {"power_limit_watts": 3',
    "empty": b"",
    "not-json": b"\x00\x01garbage",
    "wrong-version": json.dumps({"version": 99, "profile": "p", "originals": {}}).encode(),
    "not-an-object": b"[1, 2, 3]",
}


@pytest.mark.parametrize("kind", [*CORRUPT, "unreadable"])
def test_a_corrupt_state_file_is_an_error_and_apply_refuses_over_it(capsys, tmp_path, state_dir, kind) -> None:
    path = st.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "unreadable":
        path.mkdir()  # unreadable for root too
    else:
        path.write_bytes(CORRUPT[kind])
    before = fingerprint(fresh())
    for argv in (("verify",), ("restore",), ("apply", str(write_profile(tmp_path, RICH)))):
        code, out, err = cli(capsys, *argv, "--simulate", SIM)
        assert code == 1, (argv, out, err)
        assert str(path) in err and "mv " in err and "Traceback" not in err, (argv, err)
    assert fingerprint(fresh()) == before
    if kind != "unreadable":
        assert path.read_bytes() == CORRUPT[kind]  # kept for the person to look at


def test_originals_survive_a_second_apply_until_a_restore_completes(capsys, tmp_path, state_dir) -> None:
    original = fingerprint(fresh())
    cli(capsys, "apply", str(write_profile(tmp_path, RICH, "a.toml")), "--simulate", SIM)
    code, _, err = cli(capsys, "apply", str(write_profile(tmp_path, {"all": {"power_limit": 200}}, "b.toml")),
                       "--simulate", SIM)
    assert code == 0, err
    assert st.read().originals["0"]["power_limit_watts"] == original["0"]["power"]
    code, _, err = cli(capsys, "restore", "--simulate", SIM)
    assert code == 0, err
    assert fingerprint(fresh()) == original and st.read() is None


def _refuse_cpu(monkeypatch, bad: int) -> None:
    """Writing CPU ``bad``'s governor fails (EPERM, as an immutable file does), after the CPUs before it."""
    from gpud.hw.host import Host

    real = Host.set_cpu_governor

    def write(self, governor: str, cpus: list[int] | None = None) -> dict[int, str]:
        for cpu in cpus if cpus is not None else list(self.cpu_governors()):
            if cpu == bad:
                raise PermissionError(errno.EPERM, "Operation not permitted",
                                      f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")
            real(self, governor, [cpu])
        return self.cpu_governors()

    monkeypatch.setattr(Host, "set_cpu_governor", write)


def test_a_failing_cpu_governor_write_rolls_everything_back(capsys, tmp_path, state_dir, monkeypatch) -> None:
    original = fingerprint(fresh())
    _refuse_cpu(monkeypatch, 3)
    code, _, err = cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    assert code == 1 and "cannot write the CPU governor" in err and "Traceback" not in err, err
    assert "rolled back: host: cpu_governor" in err and "NOT restored" not in err
    assert fingerprint(fresh()) == original  # GPUs and the CPUs written before the failure
    assert st.read() is None


def test_restore_finishes_when_one_cpu_governor_cannot_be_written(capsys, tmp_path, state_dir, monkeypatch) -> None:
    original = fingerprint(fresh())
    code, _, err = cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    assert code == 0, err
    fresh().host.set_cpu_governor("performance", [5])  # someone put CPU 5 back by hand, then it became immutable
    _refuse_cpu(monkeypatch, 5)
    code, _, err = cli(capsys, "restore", "--simulate", SIM)
    assert code == 0, err
    assert fingerprint(fresh()) == original and st.read() is None


def test_a_state_file_that_cannot_be_saved_stops_apply_before_any_write(tmp_path, state_dir, monkeypatch) -> None:
    m = fresh()
    original = fingerprint(m)
    p = load(str(write_profile(tmp_path, RICH)))
    changes, desired = engine.plan(m, p)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("gpud.paths.os.fsync", full)
    out = engine.apply(m, p, changes, desired)
    monkeypatch.undo()
    assert not out.ok and "cannot save" in out.error and "nothing was written" in out.error
    assert out.written == []
    assert fingerprint(fresh()) == original
    assert [x.name for x in st.path().parent.iterdir() if x.name.endswith(".tmp")] == []


def test_restore_completes_when_the_state_file_cannot_be_removed(capsys, tmp_path, state_dir, monkeypatch) -> None:
    original = fingerprint(fresh())
    cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    real = pathlib.Path.unlink

    def refuse(self: Path, missing_ok: bool = False) -> None:
        if self.name == "tuning.json":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        real(self, missing_ok)

    monkeypatch.setattr(pathlib.Path, "unlink", refuse)
    code, _, err = cli(capsys, "restore", "--simulate", SIM)
    assert code == 0, err
    assert fingerprint(fresh()) == original
    assert st.read() is None  # emptied in place: nothing applied
    code, out, _ = cli(capsys, "verify", "--simulate", SIM)
    assert code == 0 and "no profile applied" in out


# -- issue 11: persistence, unsupported settings -----------------------------------------------

def test_settings_the_driver_forgets_need_persistence_mode(capsys, tmp_path, state_dir) -> None:
    before = fingerprint(fresh(DEGRADED))
    # GPU0 of the degraded workstation keeps persistence on (its lowered limit survives only so)
    assert [x.persistence_mode for x in fresh(DEGRADED).snapshot().samples] == [True, False, False, False]
    p = write_profile(tmp_path, {"all": {"power_limit": 250, "compute_mode": "exclusive_process"}})
    code, out, err = cli(capsys, "apply", str(p), "--simulate", DEGRADED)
    assert code == 0, err
    assert "persistence mode is off" in out and "nvidia-smi -pm 1" in out and "nvidia-persistenced" in out
    after = fingerprint(fresh(DEGRADED))
    assert all(after[str(i)] == before[str(i)] for i in (1, 2, 3))  # nothing the driver would drop was written
    assert after["0"]["power"] == 250  # GPU0 has persistence on: applied there
    required = write_profile(tmp_path, {"all": {"power_limit": 250, "required": ["power_limit"]}}, "r.toml")
    code, _, err = cli(capsys, "apply", str(required), "--simulate", DEGRADED)
    assert code == 1 and "persistence mode is off" in err and "nothing was written" in err
    with_pm = write_profile(tmp_path, {"all": {"persistence_mode": True, "power_limit": 250}}, "pm.toml")
    code, _, err = cli(capsys, "apply", str(with_pm), "--simulate", DEGRADED)
    assert code == 0, err
    after = fingerprint(fresh(DEGRADED))
    assert all(after[str(i)]["persistence"] is True and after[str(i)]["power"] == 250 for i in range(4)), after


def test_a_running_nvidia_persistenced_satisfies_the_precondition(capsys, tmp_path, state_dir) -> None:
    m = fresh(DEGRADED)
    proc = m.host.path("/proc/4242")
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "comm").write_text("nvidia-persistenced\n")
    code, _, err = cli(capsys, "apply", str(write_profile(tmp_path, {"all": {"power_limit": 250}})),
                       "--simulate", DEGRADED)
    assert code == 0, err
    assert fingerprint(fresh(DEGRADED))["0"]["power"] == 250


def test_a_setting_nvml_does_not_support_is_skipped_not_rolled_back(capsys, tmp_path, state_dir) -> None:
    fresh().simulation.machine.inject("unsupported", call="nvmlDeviceSetMemoryLockedClocks", gpu=2)
    code, out, err = cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [(c["gpu"], c["setting"]) for c in result["skipped"]] == [(2, "memory_clocks")]
    assert "not supported" in result["skipped"][0]["note"] and result["rolled_back"] == []
    assert fingerprint(fresh())["2"]["power"] == 250
    assert st.read().desired["2"]["memory_clocks"] == "unsupported"  # not verified, not enforced


def test_locked_memory_clocks_need_ampere(capsys, tmp_path, state_dir) -> None:
    d = tmp_path / "turing.toml"
    d.write_text('[machine]\nname = "turing-box"\n[[gpu]]\nmodel = "Quadro RTX 8000"\n'
                 'bus_id = "0000:17:00.0"\nroot_port = "0000:16:01.0"\n')
    p = write_profile(tmp_path, {"all": {"gpu_clocks": "max", "memory_clocks": "max"}})
    code, out, err = cli(capsys, "apply", str(p), "--simulate", str(d), "--json")
    assert code == 0, err
    plan = {c["setting"]: c for c in json.loads(out)["plan"]}
    assert plan["memory_clocks"]["action"] == "skip" and "Ampere or newer" in plan["memory_clocks"]["note"]
    assert plan["gpu_clocks"]["action"] == "change"


def test_every_tuning_command_says_which_machine_it_acts_on(capsys, tmp_path, state_dir) -> None:
    code, out, _ = cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    assert code == 0 and f"on simulated workstation {SIM}" in out
    code, out, _ = cli(capsys, "restore", "--simulate", SIM)
    assert code == 0 and f"restoring simulated workstation {SIM}" in out


def test_state_of_another_machine_is_not_restored_here(capsys, tmp_path, state_dir) -> None:
    cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    code, _, err = cli(capsys, "restore", "--simulate", DEGRADED)
    assert code == 1 and f"applied to simulated workstation {SIM}" in err
    assert st.read().profile == "p"


def test_a_read_only_state_directory_stops_apply_before_any_write(tmp_path: Path, monkeypatch, capsys) -> None:
    """The state directory exists but nothing can be created in it (as a read-only mount): the lock
    falls back to the directory itself and apply stops before the first write, one line, exit 1."""
    import gpud.paths

    original = fingerprint(fresh())
    p = write_profile(tmp_path, RICH)
    real_open = gpud.paths.os.open

    def read_only(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]  # dir_fd= too (open_trusted)
        if str(path).startswith(str(st.path().parent)) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(gpud.paths.os, "open", read_only)
    monkeypatch.setattr("builtins.open", _ro_builtin_open(st.path().parent))
    code, _, err = cli(capsys, "apply", str(p), "--simulate", SIM)
    monkeypatch.undo()
    assert code == 1 and "cannot save" in err and "Read-only file system" in err and "Traceback" not in err, err
    assert fingerprint(fresh()) == original


def _ro_builtin_open(directory: Path):  # type: ignore[no-untyped-def]
    import builtins

    real = builtins.open

    def ro(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(file).startswith(str(directory) + "/.tuning.json") and any(c in mode for c in "wax+"):
            raise OSError(errno.EROFS, "Read-only file system", str(file))
        return real(file, mode, *args, **kwargs)

    return ro
