"""Slurm on a shared node (issue 37): the prolog judges the job's GPUs (``SLURM_JOB_GPUS``, else
``CUDA_VISIBLE_DEVICES``), the epilog charges the job only its GPUs' Xids and losses, and every reason gpud
gives Slurm ends with ``[gpud]`` (the health check lifts only its own drains: tests/test_slurm_real.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import run_gpud
from test_health import inject_now

from gpud.backends import open_machine
from gpud.cli.slurm import LINE, TAG, epilog, job_gpus, ours, reason_line

DEGRADED = "z8-fury-4x-a6000-degraded"  # GPU3: Xid 48 and an uncorrectable ECC error; GPU1: a fan that fails
HEALTHY = "z8-fury-4x-a6000"


@pytest.mark.parametrize(("slurm", "cuda", "want"), [
    ("0,2", None, ([0, 2], "SLURM_JOB_GPUS")),
    ("1-3", "0", ([1, 2, 3], "SLURM_JOB_GPUS")),  # Slurm's id list wins over what the job was shown
    (None, "3", ([3], "CUDA_VISIBLE_DEVICES")),
    (None, None, (None, "all")),
    ("9", None, (None, "all")),  # no GPU 9 here: the whole machine, said on stderr
    (None, "GPU-5e2f", (None, "all")),  # a UUID: the whole machine rather than every GPU opened to match it
])
def test_the_jobs_gpus_come_from_slurm_then_cuda(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                                 slurm: str | None, cuda: str | None,
                                                 want: tuple[list[int] | None, str]) -> None:
    for var, value in (("SLURM_JOB_GPUS", slurm), ("CUDA_VISIBLE_DEVICES", cuda)):
        if value is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, value)
    assert job_gpus(4) == want
    err = capsys.readouterr().err
    assert ("the whole machine is judged" in err) == (want[0] is None and (slurm or cuda) is not None), err


@pytest.mark.parametrize(("gpus", "code", "starts"), [
    ("2", 0, ""),  # GPU2 is healthy: a neighbour's faulty GPU3 and GPU1 do not fail this job's prolog
    ("3", 1, "GPU3 Xid48 DBE ECC"),
    ("0,1", 1, "GPU1 fans: "),
    ("", 1, "GPU3 Xid48 DBE ECC"),  # no GPU named: the whole machine, the worst first
])
def test_the_prolog_judges_the_jobs_gpus(gpus: str, code: int, starts: str) -> None:
    r = run_gpud("doctor", "--prolog", "--simulate", DEGRADED, env={"SLURM_JOB_GPUS": gpus}, timeout=60)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert r.stdout.startswith(starts), r.stdout
    if code:
        assert r.stdout.rstrip("\n").endswith(TAG) and len(r.stdout.rstrip("\n")) <= LINE, r.stdout


def test_the_epilog_charges_the_job_only_its_gpus_xids_and_losses(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 state_dir: Path) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_START_TIME", "1")  # since long ago: only the GPUs sort the Xids
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,1")
    m = open_machine(HEALTHY)
    inject_now(m, "xid", gpu=2, xid=79)  # the neighbour's GPU fell off the bus: not this job's loss
    inject_now(m, "xid", gpu=0, xid=13)
    assert epilog(HEALTHY, None) == 0
    out = capsys.readouterr()
    assert out.out == "" and "GPU0 Xid 13" in out.err and "Xid 79" not in out.err, out
    with sqlite3.connect(state_dir / "journal.db") as db:
        (data,), = db.execute("SELECT data FROM events WHERE kind = 'job_end'").fetchall()
    job = json.loads(data)
    assert [x["xid"] for x in job["xids"]] == [13] and job["lost"] == []
    monkeypatch.setenv("SLURM_JOB_GPUS", "2")  # the neighbour's epilog: its GPU was lost during its job
    assert epilog(HEALTHY, None) == 1
    out = capsys.readouterr()
    assert out.out.startswith("GPU2 lost during job 77") and out.out.rstrip("\n").endswith(TAG), out.out


def test_every_reason_is_ascii_what_first_and_gpuds_tag_last() -> None:
    assert reason_line("gpud: NVML did not answer within 9 s") == "NVML did not answer within 9 s [gpud]"
    assert reason_line("GPU3 thermal: 94 °C [gpud]") == "GPU3 thermal: 94 C [gpud]"  # the tag once
    long = reason_line("GPU0 " + "x" * 400)
    assert len(long) == LINE and long.startswith("GPU0 xxx") and long.endswith("... [gpud]")
    assert ours("GPU3 Xid48 DBE ECC -> reset GPU [gpud] [root@2026-12-01T23:59:01]")  # scontrol's addition
    assert ours("no answer from gpud in 30 s [gpud]")
    assert not ours("admin: new PSU [root@2026-12-01T23:59:01]") and not ours("")


def test_the_epilog_puts_back_the_jobs_gpus_only(monkeypatch: pytest.MonkeyPatch, state_dir: Path) -> None:
    """Two jobs on a node, each with a profile for its GPUs: the first job's epilog restores GPU0 and GPU1;
    GPU2 and GPU3 keep theirs, in the state file too (a later restore still knows their originals)."""
    from tuning_helpers import fingerprint

    from gpud.profiles import engine
    from gpud.profiles import state as st
    from gpud.profiles.profile import load as load_profile

    m = open_machine(HEALTHY)
    before = fingerprint(m)
    changes, desired = engine.plan(m, load_profile("quiet"))
    assert engine.apply(m, load_profile("quiet"), changes, desired).ok
    applied = fingerprint(m)
    assert all(applied[g] != before[g] for g in "0123")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,1")
    assert epilog(HEALTHY, None) == 0
    now = fingerprint(open_machine(HEALTHY))
    assert now["0"] == before["0"] and now["1"] == before["1"]  # the job's GPUs: back
    assert now["2"] == applied["2"] and now["3"] == applied["3"]  # the neighbour's: as applied
    left = st.load()
    assert left is not None and set(left.originals) <= {"2", "3", "host"} and set(left.gpu_desired()) == {2, 3}
    done, failed = engine.restore(open_machine(HEALTHY))  # the neighbour's epilog without a scope: the rest
    assert not failed and fingerprint(open_machine(HEALTHY)) == before and st.load() is None


def test_a_daemon_restores_the_gpus_asked_and_keeps_enforcing_the_others() -> None:
    from tuning_helpers import fingerprint

    from gpud import config as cfg
    from gpud.daemon.service import Daemon

    m = open_machine(HEALTHY)
    before = fingerprint(m)
    d = Daemon(m, cfg.Config())
    assert d.handle({"cmd": "apply", "args": {"profile": "quiet"}})["ok"]
    assert "list of GPU indices" in d.handle({"cmd": "restore", "args": {"gpus": ["0"]}})["error"]
    reply = d.handle({"cmd": "restore", "args": {"gpus": [3]}})
    assert reply["ok"] and reply["restored"], reply
    now = fingerprint(m)
    assert now["3"] == before["3"] and now["0"] != before["0"]
    assert d.enforcer.state is not None and set(d.enforcer.state.desired) >= {"0", "1", "2"}
    assert "3" not in d.enforcer.state.desired  # GPU3 is no longer enforced, the others are
