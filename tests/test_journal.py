"""The health journal: written by the daemon, read by `gpud events` without it, kept across a
(simulated) reboot, bounded, and set aside when corrupt; per-user and throttle accounting."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

from conftest import run_gpud
from daemon_helpers import RunningDaemon

from gpud.journal import Journal, events
from gpud.model import GpuProcess, GpuSample, Snapshot, Versions
from gpud.usage import Accounting, user_label

DEGRADED = "z8-fury-4x-a6000-degraded"


def _events(state: Path, *args: str) -> list[dict]:
    r = run_gpud("events", "--json", *args, env={"GPUD_STATE_DIR": str(state)})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["events"]


def test_journal_survives_a_reboot_and_shows_the_xid_from_before(tmp_path: Path, state_dir: Path) -> None:
    env = {"GPUD_STATE_DIR": str(state_dir)}
    d = RunningDaemon(tmp_path, sim=DEGRADED, env=env)
    try:
        inj = run_gpud("sim", "inject", "xid", "gpu=2", "xid=79", "seconds=7000.5", "--simulate", DEGRADED)
        assert inj.returncode == 0, inj.stderr
        d.wait_for(lambda: any(e["data"].get("xid") == 79 for e in _events(state_dir, "--kind", "xid")),
                   timeout=30, what="Xid 79 in the journal")
        # the users' memory per GPU, and GPU-seconds per user, with bounded labels
        assert d.value("gpud_user_gpu_memory_bytes", gpu="2", user="carol") == 8192 * 2**20
        assert d.value("gpud_user_gpu_memory_bytes", gpu="1", user="alice") == 40960 * 2**20
        d.wait_for(lambda: (d.value("gpud_user_gpu_seconds_total", user="bob") or 0) > 0, what="bob's GPU-seconds")
        d.wait_for(lambda: (d.value("gpud_gpu_throttled_seconds_total", gpu="1") or 0) > 0, what="GPU1 throttled")
        assert d.value("gpud_gpu_throttled_seconds_total", gpu="0") == 0
        assert (d.value("gpud_gpu_clock_event_seconds_total", gpu="1", reason="hw_slowdown") or 0) > 0
        assert d.value("gpud_gpu_clock_event_seconds_total", gpu="1", reason="sw_power_cap") == 0
        promtool = shutil.which("promtool")
        if promtool:  # the new families, with users on them, pass promtool's lint
            r = subprocess.run([promtool, "check", "metrics"], input=d.metrics(), capture_output=True, text=True)
            assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr
        before_xids = d.value("gpud_gpu_xid_errors_total", gpu="2", xid="79")
        assert before_xids == 1
    finally:
        d.stop()
    first = _events(state_dir, "--kind", "xid")
    xid79 = next(e for e in first if e["data"]["xid"] == 79)
    assert xid79["gpu"] == 2 and xid79["uuid"].startswith("GPU-") and xid79["serial"]
    assert xid79["data"]["line"].startswith("NVRM: Xid (PCI:0000:5a:00): 79,")
    boot1 = xid79["boot_id"]

    r = run_gpud("sim", "reboot", "--simulate", DEGRADED)
    assert r.returncode == 0 and "boot 1" in r.stdout, r.stderr
    d2 = RunningDaemon(tmp_path, sim=DEGRADED, env=env)
    try:
        d2.wait_for(lambda: _events(state_dir, "--kind", "reboot"), what="the reboot event")
        # after the reboot the injected Xid is no longer in the kernel log: not counted in this boot
        d2.wait_for(lambda: d2.value("gpud_gpu_xid_errors_total", gpu="3", xid="48") == 1, what="Xid 48 again")
        assert d2.value("gpud_gpu_xid_errors_total", gpu="2", xid="79") in (None, 0)
    finally:
        d2.stop()
    after = _events(state_dir, "--kind", "xid")
    assert any(e["data"]["xid"] == 79 and e["boot_id"] == boot1 for e in after)  # from before the reboot
    boots = {e["boot_id"] for e in after if e["data"]["xid"] == 48}
    assert len(boots) == 2 and boot1 in boots
    table = run_gpud("events", "--gpu", "2", env=env)
    assert "Xid 79" in table.stdout, table.stdout
    # Xid 48 (hardware) on GPU3 in two boots: escalated
    every = run_gpud("events", env=env)
    assert "inspect the hardware" in every.stdout, every.stdout
    dossier = run_gpud("events", "--dossier", "3", "--json", env=env)
    assert dossier.returncode == 0, dossier.stderr
    doc = json.loads(dossier.stdout)
    assert doc["gpu"]["serial"] and doc["gpu"]["vbios"] and doc["repeated_hardware_xids"] == [{"xid": 48, "boots": 2}]
    assert any(e.get("ecc_aggregate_uncorrected") == 1 for e in doc["ecc"])
    assert "inspect the hardware" in doc["verdict"]


def test_xid_counters_never_go_backwards_when_the_log_wraps(tmp_path: Path, state_dir: Path) -> None:
    d = RunningDaemon(tmp_path, sim=DEGRADED, env={"GPUD_STATE_DIR": str(state_dir)})
    try:
        d.wait_for(lambda: d.value("gpud_gpu_xid_errors_total", gpu="3", xid="48") == 1, what="Xid 48")
        kmsg = state_dir / "sim" / DEGRADED / "root" / "dev" / "kmsg"
        kmsg.write_text("".join(ln + "\n" for ln in kmsg.read_text().splitlines() if "Xid" not in ln))  # wrapped
        time.sleep(11)  # the kernel log is read every 10 s
        assert d.value("gpud_gpu_xid_errors_total", gpu="3", xid="48") == 1
    finally:
        d.stop()


def test_a_corrupt_journal_is_set_aside_and_the_daemon_runs(tmp_path: Path, state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "journal.db").write_bytes(b"this is not a database" * 100)
    bad = run_gpud("events", env={"GPUD_STATE_DIR": str(state_dir)})
    assert bad.returncode == 1 and "unreadable" in bad.stderr and "Traceback" not in bad.stderr
    d = RunningDaemon(tmp_path, sim="z8-fury-4x-a6000", env={"GPUD_STATE_DIR": str(state_dir)})
    try:
        assert d.get("/healthz")[0] == 200
        assert "set aside" in d.logs()
    finally:
        d.stop()
    assert list(state_dir.glob("journal.db.corrupt-*"))
    reset = _events(state_dir, "--kind", "journal_reset")
    assert len(reset) == 1 and "set aside" in reset[0]["summary"]


def test_retention_is_bounded(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db", max_rows=100, max_age_s=3600, budgets={"check": 30})
    now = time.time()
    j.record("reboot", "old", ts=now - 7200)
    for k in range(250):
        j.record("ecc", f"change {k}", ts=now)
        j.record("check", f"check change {k}", ts=now)  # its own pool: trimmed among the checks only
    j.prune()
    evs = events(tmp_path / "j.db")
    ecc, checks = [e for e in evs if e.kind == "ecc"], [e for e in evs if e.kind == "check"]
    assert len(ecc) == 100 and ecc[-1].summary == "change 249" and all(e.summary != "old" for e in evs)
    assert len(checks) == 30 and checks[-1].summary == "check change 249" and len(evs) == 130
    assert j.record("xid", "once", key="k") is True
    assert j.record("xid", "again", key="k") is False  # a key is recorded once


def test_a_journal_deleted_under_the_daemon_is_not_a_crash(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.db")
    j.close()
    assert j.record("check", "nothing to write to") is False  # logged, not raised


def test_events_without_a_journal_says_so(state_dir: Path) -> None:
    r = run_gpud("events")
    assert r.returncode == 0 and "no events yet" in r.stdout and "daemon writes them" in r.stdout


def test_user_labels_are_bounded_with_an_other_bucket() -> None:
    acc = Accounting(max_users=2)
    procs = tuple(GpuProcess(pid=k, used_memory_bytes=1, user=u, command=None)
                  for k, u in enumerate(["alice", "bob", "carol", None]))
    v = Versions(None, None, None)
    for t in (0.0, 1.0, 3.0):
        acc.add(Snapshot(t, v, (), (GpuSample(0, "GPU-0", t, processes=procs, clock_events=("sw_power_cap",)),)))
    assert acc.user_seconds == {"alice": 3.0, "bob": 3.0, "other": 3.0, "unknown": 3.0}
    assert acc.throttled_seconds == {(0, "GPU-0"): 3.0} and acc.watched_seconds == {(0, "GPU-0"): 3.0}
    assert user_label("dave", ["alice", "bob"], 2) == "other" and user_label("bob", ["alice", "bob"], 2) == "bob"


def test_doctor_advises_on_throttling_of_the_last_hour_and_escalates_repeated_xids(state_dir: Path) -> None:
    from gpud.backends import open_machine
    from gpud.journal import journal_path

    m = open_machine(DEGRADED)
    snap = m.snapshot()
    uuid0, uuid3 = snap.samples[0].uuid, snap.samples[3].uuid
    j = Journal(journal_path())
    now = time.time()
    j.record("throttle", "GPU 0 throttled 648 s", gpu=0, uuid=uuid0, ts=now - 60,
             data={"seconds": 648, "since": now - 708, "reasons": ["sw_thermal_slowdown"]})
    for boot in ("b1", "b2"):
        j.record("xid", "Xid 48", gpu=3, uuid=uuid3, boot_id=boot, data={"xid": 48})
    j.close()
    r = run_gpud("doctor", "--json", "--check", "health.*", env={"GPUD_SIMULATE": DEGRADED})
    results = json.loads(r.stdout)["checks"]
    clock0 = next(c for c in results if c["id"] == "health.clock_events" and c["gpu"] == 0)
    assert clock0["status"] == "warn" and "throttled 18% of the last hour" in clock0["summary"], clock0
    assert "training" in clock0["remedy"]
    xid3 = next(c for c in results if c["id"] == "health.xid" and c["gpu"] == 3)
    assert xid3["status"] == "fail" and "inspect the hardware" in xid3["remedy"], xid3


def test_xid_meaning_travels_as_an_info_metric(state_dir: Path) -> None:
    r = run_gpud("metrics", "--simulate", DEGRADED)
    assert r.returncode == 0, r.stderr
    assert 'gpud_xid_info{class="hardware",meaning="double-bit ECC error (DBE)",xid="48"} 1.0' in r.stdout
    assert 'gpud_xid_info{class="application",meaning="graphics engine exception",xid="13"} 1.0' in r.stdout
    promtool = shutil.which("promtool")
    if promtool:
        p = subprocess.run([promtool, "check", "metrics"], input=r.stdout, capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout + p.stderr == "", p.stdout + p.stderr


def test_a_hardware_xid_in_two_boots_escalates_and_an_application_one_does_not() -> None:
    from gpud.doctor.xid import INSPECT, describe, escalated

    assert escalated(79, 1).action == describe(79).action and escalated(79, 2).action == INSPECT
    assert escalated(13, 3).action == describe(13).action  # a program's fault is not the board's
    assert describe(54).kind == "hardware" and "power" in describe(54).action  # from NVIDIA's catalog
    assert describe(999).kind == "unknown"


def test_the_daemon_reads_the_history_again_only_when_the_journal_was_written(state_dir: Path, monkeypatch) -> None:
    """``Tracker`` asks the journal's version (a stat and SQLite's file change counter) every 10 s and reads the
    history only when it moved: a write by another writer is seen at the next look, and a quiet journal is not
    queried again."""
    from gpud.backends import open_machine
    from gpud.config import Config
    from gpud.doctor import health
    from gpud.journal import journal_path, version

    reads: list[int] = []
    real = health.journal_history

    def counted() -> list:
        reads.append(1)
        return real()

    monkeypatch.setattr(health, "journal_history", counted)
    j = Journal(journal_path())
    j.record("xid", "Xid 48", gpu=0, uuid="GPU-0", boot_id="b1", data={"xid": 48})
    j.close()
    m = open_machine(DEGRADED)
    snap = m.snapshot()
    tracker = health.Tracker()
    tracker.update(m, Config(), (), snap, (), 0.0)
    first = version()
    assert len(reads) == 1 and first is not None
    for now in (11.0, 22.0, 33.0):
        tracker.update(m, Config(), (), snap, (), now)
    assert len(reads) == 1 and version() == first  # nothing written: never read again
    other = Journal(journal_path())
    other.record("xid", "Xid 79", gpu=1, uuid="GPU-1", boot_id="b1", data={"xid": 79})
    other.close()
    assert version() != first
    tracker.update(m, Config(), (), snap, (), 40.0)
    assert len(reads) == 1  # within 10 s of the last look
    tracker.update(m, Config(), (), snap, (), 44.0)
    assert len(reads) == 2 and any(e.data.get("xid") == 79 for e in tracker._history or [])
