"""What another user of the machine can do to gpud's records (security review, issue 38, items 7 and 8):
a throttle flood must not push the evidence out of the health journal, and a command line must not
break the support archive's files."""

from __future__ import annotations

import json
import sqlite3
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conftest import run_gpud

from gpud.journal import BUDGETS, EVIDENCE, KINDS, MAX_ROWS, POOL_OF, Journal, events
from gpud.model import GpuSample, Snapshot, Versions

# -- item 7: per-pool budgets, and throttle episodes merged -------------------------------------


def _throttle_rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT COUNT(*) FROM events WHERE kind = 'throttle'").fetchone()[0])


def test_a_throttle_flood_keeps_an_early_xid_and_stays_within_its_budget(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = Journal(path, max_rows=100, budgets={"throttle": 40})
    t0 = time.time() - 10 * 86400  # within the 400 days kept
    assert j.record("xid", "Xid 79 on GPU 2: GPU has fallen off the bus", gpu=2, uuid="GPU-2", boot_id="b",
                    key="xid:b:79", data={"xid": 79}, ts=t0)
    j.record("set_healthy", "GPU 2 set healthy by root: reseated", gpu=2, uuid="GPU-2", boot_id="b", ts=t0 + 1)
    for k in range(600):  # far apart (no merge), two GPUs, reasons in turn: 15 times the budget
        gpu = k % 2
        since = t0 + 10 + k * 600
        j.record("throttle", f"GPU {gpu} throttled 5 s", gpu=gpu, uuid=f"GPU-{gpu}", boot_id="b", ts=since + 5,
                 data={"seconds": 5.0, "since": since, "reasons": ["sw_power_cap"]})
        assert _throttle_rows(path) <= 40  # trimmed as it comes, not only now and then
    j.prune()
    j.close()
    evs = events(path)
    assert [e.data.get("xid") for e in evs if e.kind == "xid"] == [79]  # written first, still there
    assert [e.kind for e in evs].count("set_healthy") == 1
    throttle = [e for e in evs if e.kind == "throttle"]
    assert len(throttle) == 40 and throttle[-1].data["since"] == t0 + 10 + 599 * 600  # the newest kept


def test_evidence_has_the_large_budget_and_chatter_pools_their_own() -> None:
    evidence = ("xid", "ecc", "gpu_lost", "gpu_back", "set_healthy", "profile_apply", "profile_restore", "reboot",
                "fan_failsafe", "journal_reset", "burnin", "job_end", "probe")
    assert all(POOL_OF.get(k, EVIDENCE) == EVIDENCE for k in evidence)
    assert {POOL_OF[k] for k in ("throttle", "check", "profile_drift", "profile_reapply", "profile_rule")} \
        == {"throttle", "check", "profile_auto"}
    assert set(KINDS) == set(evidence) | set(POOL_OF)
    assert BUDGETS[EVIDENCE] == MAX_ROWS and all(BUDGETS[p] < MAX_ROWS for p in BUDGETS if p != EVIDENCE)


def _snap(t: float, reasons: dict[int, tuple[str, ...]]) -> Snapshot:
    return Snapshot(t, Versions(None, None, None), (),
                    tuple(GpuSample(i, f"GPU-{i}", t, clock_events=r) for i, r in sorted(reasons.items())))


def test_consecutive_throttle_episodes_of_one_gpu_and_reason_become_one_row(state_dir: Path) -> None:
    from gpud.daemon.recorder import Recorder
    from gpud.journal import journal_path

    j = Journal(journal_path())
    rec = Recorder(j, "boot-1")
    t = 1.7e9
    for _ in range(7):  # GPU 0: 3 s at its power cap, 2 s not, seven times; GPU 1 throttled thermally once
        for _ in range(3):
            rec.snapshot(_snap(t, {0: ("sw_power_cap",), 1: ("sw_thermal_slowdown",)}))
            t += 1
        for _ in range(2):
            rec.snapshot(_snap(t, {0: (), 1: ("sw_thermal_slowdown",)}))
            t += 1
    rec.snapshot(_snap(t, {0: (), 1: ()}))
    t += 300  # a pause longer than the merge gap: a new episode
    rec.snapshot(_snap(t, {0: ("sw_power_cap",), 1: ()}))
    rec.snapshot(_snap(t + 4, {0: (), 1: ()}))
    rec.snapshot(_snap(t + 10, {0: ("hw_slowdown",), 1: ()}))  # another reason: a new episode
    rec.snapshot(_snap(t + 12, {0: (), 1: ()}))
    j.close()
    rows = [e for e in events() if e.kind == "throttle"]
    gpu0 = [e for e in rows if e.gpu == 0]
    assert len(gpu0) == 3, [e.summary for e in gpu0]
    merged = gpu0[0].data
    assert merged["count"] == 7 and merged["seconds"] == 7 * 3 and merged["reasons"] == ["sw_power_cap"]
    assert merged["since"] == merged["first"] == 1.7e9 and merged["last"] == 1.7e9 + 6 * 5 + 3
    assert "in 7 episodes over 33 s" in gpu0[0].summary and "sw_power_cap" in gpu0[0].summary
    assert "count" not in gpu0[1].data and gpu0[2].data["reasons"] == ["hw_slowdown"]
    gpu1 = [e for e in rows if e.gpu == 1]
    assert len(gpu1) == 1 and gpu1[0].data["seconds"] == 35 and "count" not in gpu1[0].data
    shown = run_gpud("events", "--kind", "throttle", "--gpu", "0")
    assert shown.returncode == 0 and "in 7 episodes over 33 s" in shown.stdout, shown.stdout + shown.stderr


def test_an_older_journal_opens_and_is_trimmed_by_pool(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the schema before the pools: no index on the kind
        db.executescript("CREATE TABLE events (id INTEGER PRIMARY KEY, ts REAL NOT NULL, boot_id TEXT, kind TEXT "
                         "NOT NULL, gpu INTEGER, uuid TEXT, serial TEXT, summary TEXT NOT NULL, data TEXT, key TEXT "
                         "UNIQUE); CREATE INDEX events_ts ON events (ts);")
        now = time.time()
        db.execute("INSERT INTO events (ts, kind, gpu, summary, data) VALUES (?, 'xid', 2, 'Xid 79', ?)",
                   (now - 86400, json.dumps({"xid": 79})))
        db.executemany("INSERT INTO events (ts, kind, gpu, summary, data) VALUES (?, 'throttle', 0, 'old', ?)",
                       [(now - 3600 + k, json.dumps({"seconds": 1, "since": now - 3601 + k,
                                                     "reasons": ["sw_power_cap"]})) for k in range(1, 60)])
    db.close()
    j = Journal(path, budgets={"throttle": 10})
    j.close()
    evs = events(path)
    assert [e.kind for e in evs].count("throttle") == 10 and any(e.data.get("xid") == 79 for e in evs)


# -- item 8: redaction on values: every file of the archive still parses -------------------------

SIM = "z8-fury-4x-a6000-degraded"
HOSTILE = ['":', 'python -c "print(1)\nprint(2)"', "run.bat C:\\jobs\\x \\\\share", "node app.js </script><b>",
           "python train.py --tag a\u2028b"]


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)


def test_hostile_command_lines_leave_every_archive_file_parseable_and_redacted(tmp_path: Path,
                                                                               state_dir: Path) -> None:
    for k, command in enumerate(HOSTILE):
        r = run_gpud("sim", "inject", "process", f"gpu={k % 4}", f"pid={9100 + k}", "user=mallory", "uid=1009",
                     f"command={json.dumps(command)}", "--simulate", SIM)
        assert r.returncode == 0, r.stderr
    j = Journal()  # the journal quotes them too (events.json, dossiers.json)
    j.record("probe", f"probe (requested) FAILED: {HOSTILE[1]}", boot_id="b", data={"command": HOSTILE[0]})
    j.record("check", f'{HOSTILE[3]}": {HOSTILE[2]}', gpu=0, uuid="GPU-x", data={HOSTILE[4]: HOSTILE[0]})
    j.gpu_seen("GPU-x", "1320", "NVIDIA RTX A6000", "94", "00000000:17:00.0", 0)
    j.close()
    out = tmp_path / "r.tar.gz"
    r = run_gpud("report", "--simulate", SIM, "-o", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert "gpud-report/events.json" in files and "gpud-report/dossiers.json" in files
    seen = []
    for name, text in files.items():
        if name.endswith(".json"):
            doc = json.loads(text)  # every JSON file parses
            values = list(_strings(doc))
        else:
            values = text.split("\n")
        for command in HOSTILE:
            for piece in [command, *command.split("\n")]:
                assert not any(piece in v for v in values), (name, piece)
        seen.append(name)
    status = json.loads(files["gpud-report/status.json"])
    commands = [p["command"] for g in status["gpus"] for p in g["sample"]["processes"] or []]
    assert commands.count("<command>") == len(commands) >= len(HOSTILE)
    assert "mallory" not in "\n".join(files.values())
    assert "<command>" in files["gpud-report/events.json"]
    assert len(seen) >= 10


def test_a_merged_episode_counts_only_its_throttled_seconds_in_doctors_share() -> None:
    """A merged row spans its first start to its last end with gaps between: a GPU throttled 1 s in every
    60 for an hour is throttled about 1/60 of it, not all of it."""
    from types import SimpleNamespace

    from gpud.doctor.registry import Context
    from gpud.journal import Event

    now = 10_000.0
    merged = Event(1, now, None, "throttle", 0, "GPU-a", None, "", {"since": now - 3600, "seconds": 60.0,
                                                                     "count": 60})
    single = Event(2, now, None, "throttle", 1, "GPU-b", None, "", {"since": now - 600, "seconds": 600.0})
    ctx = SimpleNamespace(history=[merged, single])
    assert abs(Context.throttled_share(ctx, "GPU-a", now) - 60 / 3600) < 1e-9  # type: ignore[arg-type]
    assert abs(Context.throttled_share(ctx, "GPU-b", now) - 600 / 3600) < 1e-9  # type: ignore[arg-type]
