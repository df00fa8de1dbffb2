"""Files other users could change (issue 38, items 3 and 12): a root gpud reads what steers it through
one descriptor it checked (a symbolic link swapped while a profile is parsed changes nothing; a profile
in a directory others can write is refused), refuses an output path before any work, and runs a tune's
command as the user who ran sudo, in a clean environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from tuning_helpers import cli, fingerprint, fresh, to_toml

from gpud.errors import InvalidInput

SIM = "z8-fury-4x-a6000"
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the ownership and directory rules apply when gpud runs as root")


def _profile(path: Path, watts: int) -> Path:
    path.write_text(to_toml({"description": f"{watts} W", "all": {"power_limit": watts}}))
    path.chmod(0o644)
    return path


@pytest.fixture
def good_and_evil(tmp_path: Path) -> tuple[Path, Path]:
    """A vetted profile (root's, 200 W) and one another user wrote (uid 65534, 300 W), each in a
    directory only root can change."""
    good, evil = tmp_path / "good", tmp_path / "evil"
    for d in (good, evil):
        d.mkdir()
        d.chmod(0o755)
    _profile(good / "p.toml", 200)
    _profile(evil / "p.toml", 300)
    if ROOT:
        os.chown(evil / "p.toml", 65534, 65534)
    return good, evil


def _swap_while_parsing(monkeypatch: pytest.MonkeyPatch, link: Path, to: Path) -> list[str]:
    """Make the TOML parser point ``link`` at ``to`` before it parses: the attacker's swap, between the
    open (and its check) and the parse. Returns the texts parsed."""
    import tomllib

    from gpud import schema

    parsed: list[str] = []

    def loads(text: str) -> dict[str, Any]:
        if not parsed:
            tmp = link.with_name(link.name + ".new")
            tmp.symlink_to(to)
            os.replace(tmp, link)
        parsed.append(text)
        return tomllib.loads(text)

    monkeypatch.setattr(schema, "tomllib", types.SimpleNamespace(loads=loads, TOMLDecodeError=tomllib.TOMLDecodeError))
    return parsed


# -- item 3: what is checked is what is read ---------------------------------------------------------

@needs_root
def test_a_link_swapped_to_a_vetted_file_while_parsing_does_not_let_the_other_users_profile_in(
        tmp_path: Path, good_and_evil: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud.daemon.service import load_trusted_profile

    good, evil = good_and_evil
    link = tmp_path / "current"
    link.symlink_to(evil)  # the other user's file when it is opened, root's when a path would be checked
    parsed = _swap_while_parsing(monkeypatch, link, good)
    with pytest.raises(InvalidInput, match=r"not owned by root \(uid 65534\)"):
        load_trusted_profile(str(link / "p.toml"))
    assert not parsed  # refused on the descriptor, before anything of it was parsed


@needs_root
def test_the_content_parsed_is_that_of_the_file_whose_fstat_was_checked(
        tmp_path: Path, good_and_evil: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud.daemon.service import load_trusted_profile

    good, evil = good_and_evil
    link = tmp_path / "current"
    link.symlink_to(good)
    parsed = _swap_while_parsing(monkeypatch, link, evil)  # swapped after the open: too late to matter
    p = load_trusted_profile(str(link / "p.toml"))
    assert p.all["power_limit"] == 200 and len(parsed) == 1 and "200" in parsed[0]
    assert os.readlink(link) == str(evil)  # the swap did happen


@needs_root
def test_a_symlink_as_the_profile_itself_is_refused_as_root(good_and_evil: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    from gpud.profiles.profile import load

    good, _ = good_and_evil
    link = tmp_path / "link.toml"
    link.symlink_to(good / "p.toml")  # even to a vetted file: the link could be changed at any time
    with pytest.raises(InvalidInput, match="is a symbolic link: refused while running as root") as exc:
        load(str(link))
    assert exc.value.file == str(link)
    assert load(str(good / "p.toml")).all["power_limit"] == 200


@needs_root
@pytest.mark.parametrize(("mode", "owner", "why"), [
    (0o777, 0, "writable by group or others (mode 777)"),
    (0o775, 0, "writable by group or others (mode 775)"),
    (0o755, 65534, "is owned by uid 65534"),
])
def test_a_profile_in_a_directory_another_user_can_change_is_refused_as_root(
        tmp_path: Path, mode: int, owner: int, why: str) -> None:
    from gpud.profiles.profile import load

    d = tmp_path / "shared"
    d.mkdir()
    p = _profile(d / "p.toml", 200)  # root's own file, mode 644: only its directory is wrong
    os.chown(d, owner, owner)
    d.chmod(mode)
    with pytest.raises(InvalidInput, match="directory") as exc:
        load(str(p))
    assert why in exc.value.reason and str(d) in exc.value.reason


@needs_root
def test_a_profile_extending_one_in_a_writable_directory_is_refused(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    _profile(shared / "base.toml", 250)
    shared.chmod(0o777)
    child = tmp_path / "child.toml"
    child.write_text('extends = "shared/base.toml"\n[all]\npersistence_mode = true\n')
    before = fingerprint(fresh(SIM))
    code, _, err = cli(capsys, "apply", str(child), "--simulate", SIM)
    assert code == 2 and "writable by group or others (mode 777)" in err and len(err.strip().splitlines()) == 1
    assert fingerprint(fresh(SIM)) == before


@needs_root
def test_a_root_owned_file_in_a_sticky_directory_like_tmp_is_accepted(tmp_path: Path) -> None:
    from gpud.profiles.profile import load

    d = Path(tempfile.mkdtemp(prefix="gpud-sticky-", dir="/tmp"))
    try:
        d.chmod(0o1777)  # others may create, not rename or remove root's entries
        assert load(str(_profile(d / "p.toml", 200))).all["power_limit"] == 200
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_fifo_as_a_profile_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    from gpud.profiles.profile import load

    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with pytest.raises(InvalidInput, match="not a regular file"):
        load(str(fifo))
    assert time.monotonic() - t0 < 5


@needs_root
def test_the_state_file_configuration_and_web_configuration_follow_the_same_rules(
        tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud import config as cfg
    from gpud.daemon import http
    from gpud.profiles import state as st

    real = tmp_path / "real.json"
    real.write_text(json.dumps({"version": st.VERSION, "profile": "x", "desired": {}, "originals": {}}))
    st.path().parent.mkdir(parents=True, exist_ok=True)
    st.path().symlink_to(real)
    with pytest.raises(st.StateError, match="symbolic link"):
        st.read()
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "gpud.toml").write_text("")
    (shared / "web.yml").write_text("basic_auth_users:\n  prom: '$2b$04$" + "a" * 53 + "'\n")
    shared.chmod(0o777)
    with pytest.raises(InvalidInput, match="writable by group or others"):
        cfg.load(str(shared / "gpud.toml"))
    with pytest.raises(InvalidInput, match="writable by group or others"):
        http.load_web_config(str(shared / "web.yml"))


def test_as_a_user_links_are_followed_and_ownership_is_not_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud import paths
    from gpud.profiles.profile import load

    monkeypatch.setattr(paths.os, "geteuid", lambda: 1000)
    d = tmp_path / "mine"
    d.mkdir()
    p = _profile(d / "p.toml", 200)
    d.chmod(0o777)
    link = tmp_path / "link.toml"
    link.symlink_to(p)
    assert load(str(link)).all["power_limit"] == 200


# -- item 12: outputs refused before the work ------------------------------------------------------

def _never(*_: Any, **__: Any) -> Any:
    raise AssertionError("the work started")


@pytest.fixture
def outputs(tmp_path: Path) -> Iterator[dict[str, Path]]:
    a_dir = tmp_path / "d.toml"
    a_dir.mkdir()
    link = tmp_path / "link.toml"
    link.symlink_to(tmp_path / "elsewhere.toml")
    yield {"dir": a_dir, "link": link}


def test_tune_to_proc_exits_2_before_any_trial_and_fast() -> None:
    before = fingerprint(fresh(SIM))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gpud", "tune", "--simulate", SIM, "-o", "/proc/nope.toml"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "-o" in r.stderr and "/proc" in r.stderr
    assert "Traceback" not in r.stderr and took < 20
    assert fingerprint(fresh(SIM)) == before
    assert not Path("/proc/nope.toml").exists()


@pytest.mark.parametrize(("argv", "key"), [
    (["-o", "/proc/nope.toml"], "-o"),
    (["-o", "/sys/nope.toml"], "-o"),
    (["--report", "/proc/self/nope.html"], "--report"),
    (["-o", "{dir}"], "-o"),
    (["-o", "{link}"], "-o"),
    (["-o", "/nonexistent/x.toml"], "-o"),
])
def test_every_tune_output_is_refused_before_the_first_trial(
        argv: list[str], key: str, outputs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from gpud.autotune import run

    if "{link}" in argv and not ROOT:
        pytest.skip("a symbolic link is refused as root only")
    monkeypatch.setattr(run, "run_tune", _never)
    monkeypatch.setattr(run, "check_start", _never)
    args = [a.format(**{k: str(v) for k, v in outputs.items()}) for a in argv]
    code, _, err = cli(capsys, "tune", "--simulate", SIM, *args)
    assert code == 2 and key in err and len(err.strip().splitlines()) == 1, err
    assert not (outputs["link"].parent / "elsewhere.toml").exists()


@pytest.mark.parametrize(("argv", "patch"), [
    (["burnin", "--simulate", SIM, "--report", "/proc/nope.html"], ("gpud.burnin.run", "run_burnin")),
    (["burnin", "--simulate", SIM, "--report", "{dir}"], ("gpud.burnin.run", "run_burnin")),
    (["report", "--simulate", SIM, "-o", "/sys/nope.tar.gz"], ("gpud.cli.report", "_gather")),
    (["report", "--simulate", SIM, "-o", "{dir}"], ("gpud.cli.report", "_gather")),
    (["sim", "import", "DUMP", "-o", "/proc/nope.toml"], ("gpud.sim.dump", "import_dump")),
    (["sim", "import", "DUMP", "-o", "{link}"], ("gpud.sim.dump", "import_dump")),
])
def test_burnin_report_and_sim_import_outputs_are_refused_before_the_work(
        argv: list[str], patch: tuple[str, str], outputs: dict[str, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    if "{link}" in argv and not ROOT:
        pytest.skip("a symbolic link is refused as root only")
    monkeypatch.setattr(importlib.import_module(patch[0]), patch[1], _never)
    dump = tmp_path / "dump.txt"
    dump.write_text("")
    args = [a.format(**{k: str(v) for k, v in outputs.items()}).replace("DUMP", str(dump)) for a in argv]
    code, out, err = cli(capsys, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (outputs["link"].parent / "elsewhere.toml").exists()


# -- item 12: a tune's command under sudo ------------------------------------------------------------

def _workload_dir() -> Path:
    d = Path(tempfile.mkdtemp(prefix="gpud-workload-", dir="/tmp"))
    d.chmod(0o777)  # the user the command runs as can write its findings here
    return d


@pytest.mark.skipif(not ROOT, reason="needs root: gpud drops to SUDO_USER only when it runs as root")
def test_tune_workload_under_sudo_runs_as_the_invoking_user_in_a_clean_environment(tmp_path: Path) -> None:
    out = _workload_dir()
    private = tmp_path / "private"  # the directory sudo was run in: nobody cannot enter it
    private.mkdir(mode=0o700)
    try:
        cmd = f"sh -c 'id -u > {out}/uid; id -g > {out}/gid; env > {out}/env; pwd > {out}/pwd'"
        env = {**os.environ, "SUDO_USER": "nobody", "SUDO_UID": "65534", "SUDO_GID": "65534",
               "MY_SECRET": "1", "LD_PRELOAD_TEST": "x", "PYTHONPATH": str(REPO), "LC_ALL": "C"}
        r = subprocess.run([sys.executable, "-m", "gpud", "tune", "--simulate", SIM, "--workload", cmd, "--gpus", "0",
                            "--json"], capture_output=True, text=True, cwd=private, env=env, timeout=300)
        # a run this short is refused (too short to measure) once it has run: as the invoking user
        assert r.returncode == 1 and "must last" in r.stderr, r.stderr
        assert (out / "uid").read_text().strip() == "65534" and (out / "gid").read_text().strip() == "65534"
        seen = dict(line.split("=", 1) for line in (out / "env").read_text().splitlines() if "=" in line)
        assert "MY_SECRET" not in seen and "LD_PRELOAD_TEST" not in seen and "PYTHONPATH" not in seen
        assert seen["PATH"] == "/usr/local/bin:/usr/bin:/bin" and seen["USER"] == "nobody"
        assert seen["LOGNAME"] == "nobody" and seen["LC_ALL"] == "C" and "CUDA_VISIBLE_DEVICES" in seen
        assert (out / "pwd").read_text().strip() != str(private)  # not entered where nobody may not go
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.mark.skipif(not ROOT, reason="needs root: the clean environment is for a command root runs")
def test_a_root_login_runs_the_command_as_root_but_in_a_clean_environment_and_its_own_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud.autotune.workload import Command

    for k in ("SUDO_USER", "SUDO_UID", "SUDO_GID"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MY_SECRET", "1")
    cmd = Command(f"sh -c 'id -u > {tmp_path}/uid; env > {tmp_path}/env; ps -o pgid= -p $$ > {tmp_path}/pgid'",
                  "cpu", {0: "GPU-x"}, min_run_s=0.0)
    cmd.start([0])
    cmd.window(1.0)
    assert (tmp_path / "uid").read_text().strip() == "0"
    env = (tmp_path / "env").read_text()
    assert "MY_SECRET" not in env and "CUDA_VISIBLE_DEVICES=GPU-x" in env and "PATH=/usr/local/bin:/usr/bin:/bin" in env
    if (tmp_path / "pgid").read_text().strip():
        assert int((tmp_path / "pgid").read_text()) != os.getpgid(0)


def test_a_timeout_kills_the_commands_whole_process_group(tmp_path: Path) -> None:
    from gpud.autotune.workload import Command, WorkloadFailed

    pidfile = tmp_path / "pid"
    cmd = Command(f"sh -c 'sleep 60 & echo $! > {pidfile}; wait'", "cpu", {}, timeout_s=1.0)
    cmd.start([])
    t0 = time.monotonic()
    with pytest.raises(WorkloadFailed):
        cmd.window(1.0)
    assert time.monotonic() - t0 < 10
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the command's child outlived the timeout")
