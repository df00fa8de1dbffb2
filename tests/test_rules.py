"""Profile rules: ``[[rules]]`` validation, matching, the hold-off, the daemon's switches (in process,
on a simulated workstation whose processes are injected), and one end-to-end run of a real daemon."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from daemon_helpers import RunningDaemon

from gpud import config as cfg
from gpud.config import Rule
from gpud.daemon.service import Daemon
from gpud.doctor import configcheck
from gpud.errors import InvalidInput
from gpud.tuning import engine
from gpud.tuning import state as st
from gpud.tuning.rules import Arbiter, Job, choose, matches

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
