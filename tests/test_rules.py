"""Profile rules: ``[[rules]]`` validation, matching, the hold-off, the daemon's switches (in process,
on a simulated workstation whose processes are injected), and one end-to-end run of a real daemon."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from daemon_helpers import RunningDaemon
from tuning_helpers import cli, fingerprint, fresh

from gpud import config as cfg
from gpud.config import Rule
from gpud.daemon.peer import Peer
from gpud.daemon.service import Daemon
from gpud.doctor import configcheck
from gpud.errors import InvalidInput
from gpud.json_schema import check
from gpud.profiles import engine
from gpud.profiles import state as st
from gpud.profiles.profile import load
from gpud.profiles.rules import Arbiter, Job, choose, matches

POD = "0b6c1d2e-3f4a-5b6c-7d8e-9f0a1b2c3d4e"
ALICE = Job(2, 7001, "alice", ("alice", "ml"), "python train.py --epochs 90", "slurm:1234")


def rule(name: str = "r", **kw: Any) -> Rule:
    return cfg.parse({"rules": [{"name": name, "profile": "max-performance", **kw}]}, "gpud.toml").rules[0]


# -- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize("table, where, reason", [
    ({"profile": "quiet", "user": "a"}, "rules[0].name", "required"),
    ({"name": "a", "user": "a"}, "rules[0].profile", "required"),
    ({"name": "a", "profile": "quiet"}, "rules[0]", "matches nothing"),
    ({"name": "a b", "profile": "quiet", "user": "a"}, "rules[0].name", "letters, digits"),
    ({"name": "a", "profile": "quiet", "command": "(train"}, "rules[0].command", "not a regular expression"),
    ({"name": "a", "profile": "quiet", "user": 3}, "rules[0].user", "must be a string"),
    ({"name": "a", "profile": "quiet", "any_compute": False}, "rules[0].any_compute", "only true"),
    ({"name": "a", "profile": "quiet", "slurm_job": "12x"}, "rules[0].slurm_job", "a number"),
    ({"name": "a", "profile": "quiet", "user": "a", "gpus": [0, 0]}, "rules[0].gpus", "different GPU indices"),
    ({"name": "a", "profile": "quiet", "user": "a", "priority": 5000}, "rules[0].priority", "-1000..1000"),
    ({"name": "a", "profile": "quiet", "user": "a", "colour": "red"}, "rules[0].colour", "unknown key"),
])
def test_invalid_rules_are_refused_with_file_key_and_reason(table: dict[str, Any], where: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as err:
        cfg.parse({"rules": [table]}, "gpud.toml")
    assert str(err.value).startswith(f"gpud.toml: {where}: "), str(err.value)
    assert reason in str(err.value)


def test_rule_names_are_unique_and_rules_an_array() -> None:
    with pytest.raises(InvalidInput, match=r"rules\[1\]\.name: 'a' is already rules\[0\]"):
        cfg.parse({"rules": [{"name": "a", "profile": "q", "user": "x"}, {"name": "a", "profile": "q", "user": "y"}]},
                  "f")
    with pytest.raises(InvalidInput, match="rules: must be an array of tables"):
        cfg.parse({"rules": {"name": "a"}}, "f")


def test_doctor_and_the_daemon_refuse_a_rule_whose_profile_or_gpu_is_missing(tmp_path: Path) -> None:
    conf = tmp_path / "gpud.toml"
    conf.write_text('[[rules]]\nname = "a"\nuser = "alice"\nprofile = "no-such-profile"\n')
    with pytest.raises(InvalidInput, match=r"rules\[0\]\.profile: 'no-such-profile' cannot be loaded"):
        configcheck.check(cfg.load(str(conf)), 4)  # the one check doctor and the daemon share
    conf.write_text('[[rules]]\nname = "a"\nuser = "alice"\nprofile = "quiet"\ngpus = [7]\n')
    with pytest.raises(InvalidInput, match=r"rules\[0\]\.gpus: GPU 7 does not exist"):
        configcheck.check(cfg.load(str(conf)), 4)
    env = {**os.environ, "GPUD_SIMULATE": "z8-fury-4x-a6000"}  # the daemon: exit 2, nothing written
    r = subprocess.run([sys.executable, "-m", "gpud", "daemon", "--config", str(conf)], capture_output=True,
                       text=True, timeout=60, cwd=REPO, env=env)
    assert r.returncode == 2 and f"{conf}: rules[0].gpus: GPU 7 does not exist" in r.stderr, r.stderr


# -- matching -------------------------------------------------------------------------------------

@pytest.mark.parametrize("keys, job, hit", [
    ({"user": "alice"}, ALICE, True),
    ({"user": "bob"}, ALICE, False),
    ({"group": "ml"}, ALICE, True),
    ({"group": "ops"}, ALICE, False),
    ({"command": r"train\.py"}, ALICE, True),
    ({"command": r"^jupyter"}, ALICE, False),
    ({"slurm_job": True}, ALICE, True),
    ({"slurm_job": 1234}, ALICE, True),
    ({"slurm_job": "1235"}, ALICE, False),
    ({"container": True}, ALICE, False),
    ({"container": False}, ALICE, True),
    ({"container": "3f9c2a1b7d4e8f6a0b5c"}, Job(0, 9, "c", (), "jupyter", "docker:3f9c2a1b7d4e"), True),
    ({"container": "3f9c"}, Job(0, 9, "c", (), "jupyter", "podman:3f9c2a1b7d4e"), True),
    ({"container": "aaaa"}, Job(0, 9, "c", (), "jupyter", "docker:3f9c2a1b7d4e"), False),
    ({"pod": POD}, Job(0, 9, "c", (), "x", f"pod:{POD}"), True),
    ({"pod": True}, ALICE, False),
    ({"unit": "jupyter"}, Job(0, 9, "c", (), "x", "unit:jupyter.service"), True),
    ({"unit": True}, ALICE, False),
    ({"any_compute": True}, ALICE, True),
    ({"any_compute": True}, Job(0, 9, "c", (), "Xorg", None, "graphics"), False),  # a desktop is no job
    ({"user": "alice", "gpus": [0, 1]}, ALICE, False),
    ({"user": "alice", "gpus": [2]}, ALICE, True),
    ({"user": "alice", "command": "finetune"}, ALICE, False),  # every key must hold
])
def test_each_match_kind(keys: dict[str, Any], job: Job, hit: bool) -> None:
    assert matches(rule(**keys), job) is hit


def test_two_rules_on_one_gpu_the_higher_priority_wins_and_the_loser_is_named() -> None:
    rules = cfg.parse({"rules": [
        {"name": "anyone", "profile": "quiet", "any_compute": True},
        {"name": "alice-trains", "profile": "max-performance", "user": "alice", "priority": 10},
        {"name": "jobs", "profile": "training", "slurm_job": True, "priority": 10},
    ]}, "f").rules
    bob = Job(2, 7002, "bob", (), "python eval.py", None)
    got = choose(rules, [bob, ALICE, Job(0, 7100, "bob", (), "python x.py", None)])
    assert got[2].rule.name == "alice-trains"  # priority 10 beats 0; of the two at 10, the first in the file
    assert [(r.name, j.pid) for r, j in got[2].lost] == [("jobs", 7001), ("anyone", 7001)]
    assert got[0].rule.name == "anyone" and not got[0].lost
    assert got[2].describe() == "max-performance (rule alice-trains: alice, pid 7001, job 1234)"


def test_hold_off_keeps_a_restarting_job_and_ends_after_it() -> None:
    r = rule(user="alice")
    arb = Arbiter(hold_off_s=3.0)
    assert arb.step(choose([r], [ALICE]), 0.0) == {2: choose([r], [ALICE])[2]}
    assert arb.step({}, 1.0) == {}  # left: held
    restarted = Job(2, 7009, "alice", (), "python train.py --resume", None)
    assert arb.step(choose([r], [restarted]), 2.5) == {}  # back within the hold-off: no switch at all
    assert arb.step({}, 5.0) == {}
    assert arb.step({}, 5.6) == {2: None}  # 3 s after it was last seen
    other = rule("bob-evaluates", user="bob")
    arb.step(choose([r], [ALICE]), 10.0)
    bob = Job(2, 7002, "bob", (), "python eval.py", None)
    switched = arb.step(choose([other], [bob]), 10.5)  # another rule's job: at once, no hold-off
    assert switched[2] is not None and switched[2].job.pid == 7002


# -- the daemon's switches, in process (the rules' poll driven by hand, a simulated clock) --------

SIM = "z8-fury-4x-a6000"
UIDS = {"alice": 1001, "bob": 1002, "carol": 1003}
RULES = """
[[rules]]
name = "alice-trains"
user = "alice"
profile = "max-performance"
priority = 10

[[rules]]
name = "batch"
slurm_job = true
profile = "training"

[[rules]]
name = "notebooks"
container = true
command = "jupyter"
profile = "balanced"
"""


class Rig:
    """A daemon (not started: no sockets) on a simulated workstation, its rules polled by hand."""

    def __init__(self, tmp_path: Path, rules: str = RULES, base: str | None = "quiet") -> None:
        conf = tmp_path / "gpud.toml"
        conf.write_text((f'[daemon]\nprofile = "{base}"\n' if base else "") + rules)
        self.m = fresh()
        self.sim = self.m.simulation
        self.d = Daemon(self.m, cfg.load(str(conf)), str(conf))
        self.d.rules.at_start()
        self.d._load_profile_at_start()
        self.now = 0.0
        self.d.rules.runner.clock = lambda: self.now

    def start(self, gpu: int, pid: int, user: str = "alice", command: str = "python train.py", **kw: Any) -> None:
        self.sim.machine.inject("process", gpu=gpu, pid=pid, user=user, uid=UIDS[user], command=command, **kw)
        self.sim.refresh_root()

    def stop(self, pid: int) -> None:
        self.sim.machine.inject("process_exit", pid=pid)
        self.sim.refresh_root()

    def poll(self, at: float) -> None:
        self.now = at
        self.d.rules.runner.poll()

    def power(self) -> list[float | None]:
        return [s.power_management_limit_watts for s in self.m.snapshot().samples]


def watts(m: Any, profile: str) -> list[float]:
    """Each GPU's power limit under ``profile`` (max: the board's maximum; quiet: 80 % of the default)."""
    snap = m.snapshot()
    return [float(engine.plan(m, load(profile), snap=snap)[1][g.index]["power_limit_watts"]) for g in snap.gpus]


def test_each_gpu_follows_its_own_job_and_goes_back_to_the_base(tmp_path: Path, caplog: Any, capsys: Any) -> None:
    caplog.set_level(logging.INFO, logger="gpud.daemon")
    rig = Rig(tmp_path)
    quiet, maxp, training = watts(rig.m, "quiet"), watts(rig.m, "max-performance"), watts(rig.m, "training")
    balanced = watts(rig.m, "balanced")
    assert rig.power() == quiet
    rig.start(2, 7001, slurm_job=1234)  # alice's Slurm job: both rules match, alice-trains has the priority
    rig.start(0, 7100, user="bob", command="srun python eval.py", slurm_job=88)
    rig.start(1, 7200, user="carol", command="python -m jupyter lab", container="3f9c2a1b7d4e8f6a0b5c9d2e")
    rig.poll(0.0)
    assert rig.power() == [training[0], balanced[1], maxp[2], quiet[3]]
    log = caplog.text
    assert "GPU2: max-performance (rule alice-trains: alice, pid 7001, job 1234)" in log
    assert "GPU2: rule batch (training; alice, pid 7001, job 1234) lost to rule alice-trains" in log
    assert "GPU0: training (rule batch: bob, pid 7100, job 88)" in log
    assert "GPU1: balanced (rule notebooks: carol, pid 7200, container 3f9c2a1b7d4e)" in log
    assert rig.d.rules.profiles() == ((0, "training", "batch"), (1, "balanced", "notebooks"),
                                      (2, "max-performance", "alice-trains"), (3, "quiet", ""))
    assert st.load().extra["rules"]["2"] == {"profile": "max-performance", "rule": "alice-trains"}
    code, out, _ = cli(capsys, "status", "--simulate", SIM)
    assert ("Profiles: GPU0 training (rule batch); GPU1 balanced (rule notebooks); GPU2 max-performance "
            "(rule alice-trains); GPU3 quiet") in out, out
    code, out, _ = cli(capsys, "rules", "test", "--simulate", SIM, "--config", str(tmp_path / "gpud.toml"))
    assert code == 0 and "GPU2  max-performance (rule alice-trains: alice, pid 7001, job 1234)" in out, out
    assert rig.d.rules.fans.controllers[2].curve.points != rig.d.rules.fans.controllers[3].curve.points
    for pid in (7001, 7100, 7200):
        rig.stop(pid)
    rig.poll(1.0)
    assert rig.power()[2] == maxp[2]  # within the hold-off (3 s): kept
    rig.poll(3.1)
    assert rig.power() == quiet
    assert "GPU2: quiet (no rule matches any more)" in caplog.text
    assert rig.d.rules.profiles() == tuple((g, "quiet", "") for g in range(4))
    assert "rules" not in st.load().extra


def test_a_job_restarting_within_the_hold_off_does_not_flap(tmp_path: Path, caplog: Any) -> None:
    caplog.set_level(logging.INFO, logger="gpud.daemon")
    rig = Rig(tmp_path)
    rig.start(2, 7001)
    rig.poll(0.0)
    switches = rig.d.rules.switches
    rig.stop(7001)
    rig.poll(0.5)
    rig.start(2, 7002, command="python train.py --resume")
    rig.poll(2.0)
    rig.stop(7002)
    rig.poll(4.5)  # 2.5 s after it was last seen
    assert rig.d.rules.switches == switches and "no rule matches" not in caplog.text
    rig.poll(5.0)
    assert rig.d.rules.switches == switches + 1 and "GPU2: quiet (no rule matches any more)" in caplog.text


def test_the_poll_reads_a_gpus_process_list_only_when_its_memory_in_use_changed(tmp_path: Path) -> None:
    """The compute list is 4.5 ms of the driver's lock per GPU; the memory in use 20 µs. A steady job's GPUs
    are polled on their memory alone; a job that starts or ends (its CUDA context's memory) is seen at the
    next poll, on its GPU only; every list is read again after LIST_AT_LEAST_EVERY_S regardless, which is
    how a process holding no memory (used_mib = 0) is found at all."""
    from gpud.daemon.rules import LIST_AT_LEAST_EVERY_S

    rig = Rig(tmp_path)
    lists = rig.d.rules.runner.lists
    rig.start(2, 7001)
    rig.poll(0.0)
    assert lists.lists_read == 4 and rig.d.rules.profiles()[2][2] == "alice-trains"
    for k in range(1, 6):
        rig.poll(0.5 * k)
    assert (lists.lists_read, lists.lists_kept) == (4, 20)  # nothing changed: no list read
    rig.start(1, 7002)
    rig.poll(3.0)
    assert lists.lists_read == 5 and rig.d.rules.profiles()[1][2] == "alice-trains"  # GPU1's list alone
    rig.stop(7001)
    rig.poll(3.5)
    assert lists.lists_read == 6
    rig.start(3, 7003, used_mib=0)  # holds nothing: only the periodic read finds it
    rig.poll(4.0)
    assert rig.d.rules.profiles()[3][2] == ""
    rig.poll(LIST_AT_LEAST_EVERY_S + 0.1)
    assert rig.d.rules.profiles()[3][2] == "alice-trains"


def test_the_periodic_read_takes_the_samplers_list_read_since(tmp_path: Path, monkeypatch: Any) -> None:
    """The off-tick sampler asks every GPU's compute list every 5 s for the snapshot; where it asked after the
    poll's own list was read (the memory in use the same since), the poll's periodic read takes that list
    instead of asking NVML again; a list it did not ask since is asked for as before."""
    from gpud.daemon.rules import LIST_AT_LEAST_EVERY_S
    from gpud.hw.nvml import processes

    monkeypatch.setattr(processes, "POLLED_REUSE_S", -1.0)  # the sampler asks NVML itself (not the poll's list)
    rig = Rig(tmp_path)
    lists = rig.d.rules.runner.lists
    rig.poll(0.0)
    assert lists.lists_read == 4
    rig.start(3, 7003, used_mib=0)  # holds no memory: only a list read later shows it
    rig.m.nvml.sample_pcie_all([0, 1, 3], processes=True)  # the sampler's round (GPU 2's skipped here)
    rig.poll(LIST_AT_LEAST_EVERY_S + 0.1)
    assert (lists.lists_read, lists.lists_sampled) == (5, 3)  # GPU 2's own read; the rest the sampler's
    assert rig.d.rules.profiles()[3][2] == "alice-trains"  # the sampler's list showed the new process
    rig.poll(LIST_AT_LEAST_EVERY_S + 0.6)
    assert (lists.lists_read, lists.lists_sampled) == (5, 3)  # the sampler's lists are as recent as a read
    rig.poll(2 * LIST_AT_LEAST_EVERY_S + 0.6)  # due again, and the sampler has not asked since: read
    assert (lists.lists_read, lists.lists_sampled) == (9, 3)


def test_without_a_base_profile_a_gpu_goes_back_to_its_originals(tmp_path: Path) -> None:
    rig = Rig(tmp_path, base=None)
    before = fingerprint(rig.m)
    rig.start(3, 7001)
    rig.poll(0.0)
    assert rig.power()[3] == watts(rig.m, "max-performance")[3]
    assert fingerprint(rig.m)["2"] == before["2"]  # only the job's GPU
    rig.stop(7001)
    rig.poll(10.0)
    assert fingerprint(rig.m) == before
    assert st.load() is None  # nothing applied any more
    rig.start(1, 7002)
    rig.poll(11.0)
    assert fingerprint(rig.m) != before and st.load().extra["rules"] == {
        "1": {"profile": "max-performance", "rule": "alice-trains"}}
    again = Rig(tmp_path, base=None)  # a daemon killed with GPU1 switched, started again: GPU1 put back first
    assert fingerprint(again.m) == before and st.load() is None


def test_a_profile_applied_by_a_person_pauses_the_rules_until_apply_rules(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.start(2, 7001)
    rig.poll(0.0)
    person = Peer(pid=4242, uid=0, gid=0)
    assert rig.d.apply("balanced", peer=person)["ok"]
    balanced = rig.power()
    assert balanced[2] == balanced[0] and rig.d.rules.paused
    rig.start(3, 7002)
    rig.poll(1.0)
    assert rig.power() == balanced  # paused: nothing follows the jobs
    assert rig.d.resume_rules(peer=person)["ok"]  # gpud apply --rules: the configured base, then the rules
    assert not rig.d.rules.paused and rig.d.profile == "quiet"
    rig.poll(2.0)
    quiet, maxp = watts(rig.m, "quiet"), watts(rig.m, "max-performance")
    assert rig.power() == [quiet[0], quiet[1], maxp[2], maxp[3]]
    assert rig.d.restore(peer=person)["ok"]  # gpud restore: the originals, and the rules switch from none
    rig.poll(3.0)
    assert rig.power()[2] == maxp[2] and rig.d.rules.base is None


# -- end to end: a real daemon, processes injected from outside, SIGKILL mid-switch, restore -----

def test_daemon_follows_injected_jobs_and_a_sigkill_mid_switch_is_undone_by_restore(tmp_path: Path) -> None:
    original = fingerprint(fresh())
    env = {**os.environ, "GPUD_SIMULATE": SIM}

    def gpud(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpud", *args], env={**env, "GPUD_SOCKET": d.sock},
                              capture_output=True, text=True, timeout=60, cwd=REPO)

    d = RunningDaemon(tmp_path, SIM, 'profile = "quiet"\nrules_hold_off_seconds = 0.5\nrules_poll_seconds = 0.1\n'
                      '[[rules]]\nname = "alice-trains"\nuser = "alice"\nprofile = "max-performance"\n')
    try:
        r = gpud("sim", "inject", "process", "gpu=2", "pid=7001", "user=alice", "command='python train.py'",
                 "slurm_job=1234")
        assert r.returncode == 0, r.stderr
        d.wait_for(lambda: d.value("gpud_gpu_profile_active", gpu="2", rule="alice-trains") == 1, 20,
                   "GPU2 on alice's rule")
        assert d.value("gpud_gpu_profile_active", gpu="1", profile="quiet", rule="") == 1
        code, body = d.get("/status")  # the daemon's /status names each GPU's active profile too
        status = json.loads(body)
        assert code == 200 and check(status) == [], check(status)
        profiles = {p["gpu"]: (p["profile"], p["rule"]) for p in status["profiles"]}
        assert profiles[2] == ("max-performance", "alice-trains") and profiles[1] == ("quiet", None), profiles
        r = gpud("rules", "test", "--json", "--config", str(d.config))
        doc = json.loads(r.stdout)
        assert doc["kind"] == "rules_test" and check(doc) == [], check(doc)
        assert doc["gpus"][2] == {"gpu": 2, "profile": "max-performance", "rule": "alice-trains", "pid": 7001,
                                  "lost": []}
        r = gpud("sim", "inject", "process_exit", "pid=7001")
        d.wait_for(lambda: d.value("gpud_gpu_profile_active", gpu="2", profile="quiet") == 1, 20, "GPU2 back")
        r = gpud("apply", "balanced")  # a person's apply: the rules pause
        assert r.returncode == 0, r.stderr
        r = gpud("apply", "--rules")  # handed back, from the configured base: its plan, exit 0
        assert r.returncode == 0 and "applied quiet by the gpud daemon" in r.stdout, r.stdout + r.stderr
        sim = fresh().simulation.machine
        # the daemon dies between two writes of the switch: after GPU3's power limit, before its memory clocks
        # (a call, not a write's number: the fan loop's writes would take that number first under load)
        sim.inject("crash", call="nvmlDeviceSetMemoryLockedClocks", gpu=3)
        gpud("sim", "inject", "process", "gpu=3", "pid=7002", "user=alice", "command=python")
        try:
            d.proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("the daemon was not killed at its switch's second write:\n" + d.logs()[-4000:])
        assert d.proc.returncode == -signal.SIGKILL, d.logs()
    finally:
        d.stop()
    events = gpud("events", "--kind", "profile_rule")
    assert "GPU2: max-performance (rule alice-trains: alice, pid 7001, job 1234)" in events.stdout, events.stdout
    assert "GPU2: quiet (no rule matches any more)" in events.stdout
    assert st.load().pending is True  # the switch saved the originals before its first write
    crashed = fresh().simulation.machine
    assert crashed.settings(3)["power_limit_mw"] == crashed.desc.gpus[3].power_max_watts * 1000  # written
    crashed.clear_faults()
    r = gpud("restore")
    assert r.returncode == 0, r.stderr
    assert fingerprint(fresh()) == original and st.load() is None


def test_the_daemon_reads_each_identity_a_rule_matches_on_from_nvml_and_proc() -> None:
    """What the rules' poll reads of each GPU process: NVML's compute list, then /proc/PID once."""
    from gpud.daemon.rules import Jobs, process_lists

    m = fresh()
    sim = m.simulation
    sim.machine.inject("process", gpu=0, pid=7300, user="dave", uid=1004, command="python serve.py",
                       pod="0b6c1d2e-3f4a-5b6c-7d8e-9f0a1b2c3d4e")
    sim.machine.inject("process", gpu=1, pid=7301, user="erin", uid=1005, command="python nb.py",
                       unit="jupyter.service")
    sim.machine.inject("process", gpu=3, pid=7302, user="xorg", uid=0, command="Xorg :0", graphics=True)
    sim.refresh_root()
    jobs = {j.pid: j for j in Jobs(m).read(process_lists(m))}
    assert set(jobs) == {7300, 7301}  # the compute list: a graphics-only process is no job
    assert jobs[7300] == Job(0, 7300, "dave", ("dave",), "python serve.py", f"pod:{POD}")
    assert jobs[7301].workload == "unit:jupyter.service" and jobs[7301].groups == ("erin",)
    for keys, pid in (({"group": "dave"}, 7300), ({"pod": POD}, 7300), ({"unit": "jupyter"}, 7301),
                      ({"any_compute": True, "gpus": [1]}, 7301)):
        assert [j.pid for j in jobs.values() if matches(rule(**keys), j)] == [pid], keys


def test_the_polls_memory_reading_gives_none_for_a_lost_gpu_and_asks_no_more_where_it_is_unsupported() -> None:
    """``memory_in_use`` (the poll's cue, one pass through ``NvmlClient.read_each``): a GPU off the bus and one
    whose memory reading NVML does not support read as None, and the other GPUs as the whole snapshot reads
    them; what said it is not supported is not asked again (``get``'s rule)."""
    from gpud.backends import open_machine

    m = open_machine("z8-fury-4x-a6000")
    sim = m.simulation.machine
    m.snapshot()
    used = {s.index: s.memory_used_bytes for s in m.snapshot().samples}
    got = m.nvml.memory_in_use(range(4))
    assert set(got) == {0, 1, 2, 3} and all(isinstance(v, int) for v in got.values())
    # used (v1) is reserved + allocated: at least what v2 calls used
    assert all(got[i] >= used[i] for i in range(4)), (got, used)
    sim.inject("gpu_lost", gpu=1)
    sim.inject("unsupported", call="nvmlDeviceGetMemoryInfo", gpu=3)
    got = m.nvml.memory_in_use(range(4))
    assert got[1] is None and got[3] is None and isinstance(got[0], int) and isinstance(got[2], int)
    asked = m.simulation.library.called["nvmlDeviceGetMemoryInfo"]
    assert m.nvml.memory_in_use(range(4))[3] is None
    assert m.simulation.library.called["nvmlDeviceGetMemoryInfo"] == asked + 3  # GPUs 0 to 2 (a lost one is asked)
