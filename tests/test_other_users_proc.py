"""What other users' processes can make gpud believe (issue 38, items 4, 5, 6, 10, 11): a process's name
adding a ``Groups:`` line, cgroups a user names in their own systemd subtree, a reused pid, a rule
pattern that backtracks, and transient uids holding every per-user label."""

from __future__ import annotations

import grp
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_gpud
from tuning_helpers import fresh

from gpud import config as cfg
from gpud.config import Rule
from gpud.daemon import control
from gpud.daemon.rules import Jobs, groups, process_lists
from gpud.errors import InvalidInput
from gpud.model import GpuProcess, GpuSample, Snapshot, Versions
from gpud.procinfo import start_time, status_fields, status_ids, workload
from gpud.profiles import rules as tr
from gpud.profiles.rules import Job, choose, matches
from gpud.usage import OTHER, Accounting

POD = "1a2b3c4d-0000-4111-8222-123456789abc"
CID = "3f9c2a1b7d4e8f6a0b5c9d2e1f3a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a"
MINE = "/user.slice/user-1000.slice/user@1000.service"


def rule(name: str = "r", **kw: Any) -> Rule:
    return cfg.parse({"rules": [{"name": name, "profile": "max-performance", **kw}]}, "gpud.toml").rules[0]


def status(name: str, uid: int) -> str:
    """``/proc/PID/status`` as the kernel writes it for a process that named itself ``name``."""
    return (f"Name:\t{name}\nUmask:\t0022\nState:\tR (running)\nTgid:\t7\nPid:\t7\nPPid:\t1\n"
            f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\nFDSize:\t64\nGroups:\t{uid}\n")


# -- 4: a process's name is not a line of its status -------------------------------------------------

@pytest.mark.parametrize("sep", ["\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\r"])
def test_a_groups_line_in_a_process_name_is_not_read_as_its_groups(sep: str) -> None:
    m = fresh()
    m.simulation.machine.inject("process", gpu=0, pid=7200, user="dave", uid=1004, command="python train.py")
    root = m.simulation.refresh_root()
    # what the kernel shows after the process wrote "<sep>Groups:\t0 27" to /proc/self/comm
    (root / "proc/7200/status").write_bytes(status(f"{sep}Groups:\t0 27", 1004).encode())
    assert groups(m, 7200) == ("dave",)  # not root's group 0 nor 27
    assert not matches(rule(group="root"), Jobs(m).read(process_lists(m))[0])
    assert status_ids(status(f"{sep}Groups:\t0 27", 1004), "Groups") == [1004]
    (root / "proc/7200/status").write_bytes(status(f"{sep}Uid:\t0 0 0 0", 1004).encode())
    assert status_fields(status(f"{sep}Uid:\t0 0 0 0", 1004))["Uid"].split()[0] == "1004"
    assert m.host.process(7200)[0] == "dave"  # not root


@pytest.fixture
def own_comm() -> Any:
    """This process's name, put back after the test."""
    path = Path("/proc/self/comm")
    old = path.read_bytes().rstrip(b"\n")
    yield path
    path.write_bytes(old)


def test_the_control_socket_reads_no_groups_from_a_peers_name(own_comm: Path) -> None:
    mine = set(os.getgroups()) | {os.getgid(), 65534}
    other = next((g for g in grp.getgrall() if g.gr_gid not in mine), None)
    if other is None:
        pytest.skip("no group this process is not in")
    try:
        own_comm.write_bytes(f"\x1cGroups:\t{other.gr_gid}".encode())
    except OSError:
        pytest.skip("/proc/self/comm is not writable here")
    assert f"Groups:\t{other.gr_gid}" in Path("/proc/self/status").read_bytes().decode()  # the name says it
    assert other.gr_gid not in control.peer_groups(os.getpid())
    refusal = control.Access(other.gr_name).check(os.getpid(), 65534, 65534)  # neither root nor the daemon
    assert refusal is not None


# -- 5: cgroups a user named in their own systemd subtree ---------------------------------------------

@pytest.mark.parametrize("path", [
    f"{MINE}/app.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
    f"{MINE}/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/x.scope",
    f"{MINE}/kubepods/burstable/pod{POD}/{CID}",
    f"{MINE}/slurm/uid_1000/job_4242/step_0",
    f"{MINE}/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
    f"{MINE}/docker-{CID}.scope",
    f"{MINE}/system.slice/docker-{CID}.scope",
    f"{MINE}/docker/{CID}",
    f"{MINE}/machine.slice/libpod-{CID}.scope/container",
    f"{MINE}/inference.service",
    f"{MINE}/app.slice/inference.service",
    "/user.slice/user-1000.slice/inference.service",
    f"/system.slice/inference.service/kubepods-pod{POD.replace('-', '_')}.slice/job_4242/docker-{CID}.scope",
])
def test_a_user_slice_path_is_no_pod_job_container_or_system_unit(path: str) -> None:
    got = workload(f"0::{path}\n")
    if path.startswith("/user.slice/"):
        assert got is None or got.startswith("user-unit:"), got
    else:  # inside a delegated system unit: the unit, whatever its owner named below it
        assert got == "unit:inference.service"
    job = Job(0, 7, "mallory", ("mallory",), "python serve.py", got)
    for keys in ({"pod": True}, {"pod": POD}, {"slurm_job": True}, {"slurm_job": 4242}, {"container": True},
                 {"container": CID[:12]}, {"unit": f"docker-{CID}.scope"}, {"unit": "x"}):
        assert not matches(rule(**keys), job), (keys, got)
    assert matches(rule(unit="inference"), job) == (got == "unit:inference.service")


@pytest.mark.parametrize(("path", "expected"), [
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/x.scope",
     f"pod:{POD}"),
    (f"/kubepods/burstable/pod{POD}/{CID}", f"pod:{POD}"),
    ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", "slurm:4242"),
    ("/slurm/uid_1000/job_4242/step_batch", "slurm:4242"),
    (f"/system.slice/docker-{CID}.scope", f"docker:{CID[:12]}"),
    (f"/docker/{CID}", f"docker:{CID[:12]}"),
    (f"/machine.slice/libpod-{CID}.scope/container", f"podman:{CID[:12]}"),
    ("/system.slice/inference.service", "unit:inference.service"),
    (f"{MINE}/app.slice/inference.service", "user-unit:inference.service"),
])
def test_each_layout_at_its_system_root_is_still_recognised(path: str, expected: str) -> None:
    assert workload(f"0::{path}\n") == expected


def test_the_daemon_takes_a_user_named_cgroup_for_nobodys_pod() -> None:
    m = fresh()
    m.simulation.machine.inject("process", gpu=1, pid=7201, user="mallory", uid=1005, command="python x.py")
    root = m.simulation.refresh_root()
    (root / "proc/7201/cgroup").write_text(
        f"0::{MINE}/app.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/inference.service\n")
    [job] = Jobs(m).read(process_lists(m))
    assert job.workload == "user-unit:inference.service" and job.place("pod") is None and job.place("unit") is None
    assert job.describe() == "mallory, pid 7201, user unit inference.service"
    assert choose([rule("p", pod=POD), rule("u", unit="inference")], [job]) == {}


# -- 6: a reused pid ----------------------------------------------------------------------------------

def test_a_reused_pid_is_read_again_and_gives_the_new_owner() -> None:
    m = fresh()
    sim = m.simulation
    sim.machine.inject("process", gpu=0, pid=7400, user="alice", uid=1001, command="python train.py")
    sim.refresh_root()
    jobs = Jobs(m)
    alice = rule("alice", user="alice")
    [first] = jobs.read(process_lists(m))
    assert first.user == "alice" and choose([alice], [first])[0].job.user == "alice"
    path = sim.root / "proc/7400/stat"
    stat = path.read_text() if path.exists() else ""
    # alice's process exits and the kernel hands pid 7400 to bob's, between two polls
    sim.machine.inject("process", gpu=0, pid=7400, user="bob", uid=1002, command="python eval.py")
    sim.refresh_root()
    [second] = jobs.read(process_lists(m))
    assert (second.user, second.command, second.groups) == ("bob", "python eval.py", ("bob",))
    assert choose([alice], [second]) == {}  # alice's rule no longer stands on bob's process
    assert start_time((sim.root / "proc/7400/stat").read_text()) not in (None, start_time(stat))


def test_a_reused_pid_gives_the_snapshot_and_the_usage_metrics_the_new_owner() -> None:
    """The snapshot's owners (what `gpud ps`, the per-user metrics and the exporter read) are cached by pid
    with its start time: bob's process on alice's old pid is bob's."""
    m = fresh()
    sim = m.simulation
    sim.machine.inject("process", gpu=0, pid=7402, user="alice", uid=1001, command="python train.py")
    sim.refresh_root()
    [p] = m.snapshot().samples[0].processes
    assert (p.user, p.command) == ("alice", "python train.py")
    sim.machine.inject("process", gpu=0, pid=7402, user="bob", uid=1002, command="python eval.py")
    sim.refresh_root()
    [p] = m.snapshot().samples[0].processes
    assert (p.user, p.command) == ("bob", "python eval.py")


def test_a_process_whose_start_time_cannot_be_read_is_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    m = fresh()
    m.simulation.machine.inject("process", gpu=0, pid=7401, user="carol", uid=1003, command="python a.py")
    root = m.simulation.refresh_root()
    (root / "proc/7401/stat").unlink()
    looked: list[int] = []
    real = m.host.process
    monkeypatch.setattr(m.host, "process", lambda pid: (looked.append(pid), real(pid))[1])
    jobs = Jobs(m)
    for _ in range(3):
        assert [j.user for j in jobs.read(process_lists(m))] == ["carol"]
    assert looked == [7401] * 3 and jobs.known == {}


def test_start_time_is_read_after_the_last_parenthesis() -> None:
    fields = " ".join(["S"] + [str(n) for n in range(4, 22)] + ["987654"] + ["0"] * 30)
    assert start_time(f"7 (a) b) S 1 (x) {fields}") == 987654  # a name with ") S 1 (": the last ')' rules
    assert start_time(f"7 (evil) 1 2 3) {fields}") == 987654
    assert start_time(f"7 (x\ny) {fields}") == 987654
    assert start_time("7 (x") is None and start_time("") is None and start_time(None) is None


# -- 10: rule patterns ----------------------------------------------------------------------------------

def test_a_catastrophic_pattern_is_matched_quickly() -> None:
    """``(a+)+$`` against 40 ``a`` and a ``!``: Python's re backtracks 2^40 times (and holds the GIL, so
    it is run in a child that can be killed)."""
    code = ("import time; from gpud import config as cfg; from gpud.profiles.rules import Job, matches\n"
            "r = cfg.parse({'rules': [{'name': 'r', 'profile': 'quiet', 'command': '(a+)+$'}]}, 'f').rules[0]\n"
            "t = time.perf_counter(); hit = matches(r, Job(0, 1, 'u', (), 'a' * 40 + '!'))\n"
            "print(hit, time.perf_counter() - t)\n")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=REPO)
    except subprocess.TimeoutExpired:
        pytest.fail("matching (a+)+$ took more than 30 s")
    assert r.returncode == 0, r.stderr
    hit, took = r.stdout.split()
    assert hit == "False" and float(took) < 1.0


def test_a_long_command_line_is_matched_in_under_a_second_and_once(monkeypatch: pytest.MonkeyPatch) -> None:
    m = fresh()
    command = "python " + "train " * 16666  # 100 003 characters, no ".py": Python's re took about 4 s
    m.simulation.machine.inject("process", gpu=2, pid=7500, user="erin", uid=1006, command=command)
    m.simulation.refresh_root()
    rules = [rule("t", command=r".*python.*train.*\.py"), rule("u", command=r"train\s+train")]
    jobs = Jobs(m)
    t0 = time.perf_counter()
    got = choose(rules, jobs.read(process_lists(m)))
    assert time.perf_counter() - t0 < 1.0
    assert {g: c.rule.name for g, c in got.items()} == {2: "u"}
    searched: list[str] = []
    real = tr.command_pattern

    class Counting:
        def __init__(self, pattern: str) -> None:
            self.p = real(pattern)

        def search(self, text: str) -> Any:
            searched.append(text)
            return self.p.search(text)

    monkeypatch.setattr(tr, "command_pattern", Counting)
    for _ in range(3):  # three more polls: the process's results are kept with it
        assert {g: c.rule.name for g, c in choose(rules, jobs.read(process_lists(m))).items()} == {2: "u"}
    assert searched == []
    new_rule = rule("v", command="python")  # a pattern the process was not matched against yet: once
    for _ in range(3):
        choose([*rules, new_rule], jobs.read(process_lists(m)))
    assert len(searched) == 1


def test_a_command_line_is_read_up_to_linuxs_max_arg_strlen() -> None:
    from gpud.hw.host import MAX_CMDLINE

    m = fresh()
    m.simulation.machine.inject("process", gpu=0, pid=7501, user="erin", uid=1006, command="python x.py")
    root = m.simulation.refresh_root()
    (root / "proc/7501/cmdline").write_bytes(b"python\0" + b"a" * (4 * MAX_CMDLINE) + b"\0")
    _, cmd = m.host.process(7501)
    assert cmd is not None and cmd.startswith("python a") and len(cmd.encode()) <= MAX_CMDLINE == 128 * 1024


@pytest.mark.parametrize("pattern", [r"(\w+) \1", r"(?P<x>a)(?P=x)", r"train(?=\.py)", r"(?<!eval)\.py"])
def test_a_pattern_re2_cannot_take_is_refused_at_load(tmp_path: Path, pattern: str) -> None:
    conf = tmp_path / "gpud.toml"
    conf.write_text(f"[[rules]]\nname = \"a\"\nprofile = \"quiet\"\ncommand = '{pattern}'\n")
    with pytest.raises(InvalidInput) as err:
        cfg.load(str(conf))
    assert str(err.value).startswith(f"{conf}: rules[0].command: not a regular expression RE2 takes"), str(err.value)


def test_the_command_line_refuses_a_backreference_with_exit_2(tmp_path: Path) -> None:
    conf = tmp_path / "gpud.toml"
    conf.write_text("[[rules]]\nname = \"a\"\nprofile = \"quiet\"\ncommand = '(\\w+) \\1'\n")
    r = run_gpud("rules", "test", "--config", str(conf), env={"GPUD_SIMULATE": "z8-fury-4x-a6000"})
    assert r.returncode == 2, r.stderr
    assert f"{conf}: rules[0].command: not a regular expression RE2 takes" in r.stderr
    assert "re2.cc" not in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr  # gpud's line alone


# -- 11: the named users ----------------------------------------------------------------------------------

def _tick(acc: Accounting, t: float, *users: str | None) -> None:
    """One snapshot at ``t``: each user's process on a GPU of its own."""
    samples = tuple(GpuSample(k, f"GPU-{k}", t, processes=(GpuProcess(pid=100 + k, used_memory_bytes=1, user=u,
                                                                        command=None),))
                    for k, u in enumerate(users))
    acc.add(Snapshot(t, Versions(None, None, None), (), samples))


def test_17_transient_uids_do_not_push_out_a_busy_real_user() -> None:
    acc = Accounting(max_gap_s=10.0)
    transient = [str(100000 + k) for k in range(17)]  # a rootless container's subuids, for a minute
    for t in range(0, 60, 5):
        _tick(acc, float(t), *transient)
    assert len(acc.named) == 16 and "alice" not in acc.named
    seen: dict[str, float] = {}
    for t in range(60, 60 + 600, 5):  # then alice trains for ten minutes on one GPU
        _tick(acc, float(t), "alice")
        for user, total in acc.frozen().user_seconds.items():
            assert total >= seen.get(user, 0.0), user  # every exported series only grows
            seen[user] = total
    usage = acc.frozen()
    assert "alice" in usage.named and len(usage.named) <= 16
    assert usage.user_seconds["alice"] >= 400  # from the tick she took a name, on her own series
    assert set(usage.user_seconds) <= set(usage.named) | {OTHER, "unknown"}
    # and busy, she keeps it while 17 new uids come and go
    for t in range(660, 720, 5):
        _tick(acc, float(t), "alice", *[str(200000 + k) for k in range(17)])
    assert "alice" in acc.named


def test_a_user_who_loses_its_name_and_comes_back_continues_its_counter() -> None:
    acc = Accounting(max_users=1, max_gap_s=10.0, margin_s=10.0)
    for t in range(0, 100, 5):
        _tick(acc, float(t), "alice")
    before = acc.frozen().user_seconds["alice"]
    for t in range(100, 400, 5):
        _tick(acc, float(t), "bob")
    usage = acc.frozen()
    assert usage.named == ("bob",) and "alice" not in usage.user_seconds  # alice's series is no longer exported
    for t in range(400, 1000, 5):
        _tick(acc, float(t), "alice")
    usage = acc.frozen()
    assert usage.named == ("alice",) and usage.user_seconds["alice"] > before  # never below a scraped value
    total = sum(usage.user_seconds.values()) + sum(acc.retired.values())
    assert total == pytest.approx(995.0)  # every GPU-second counted once, under one label
