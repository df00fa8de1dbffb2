"""The health journal: what happened to the GPUs, kept across reboots (stdlib ``sqlite3``).

The daemon writes it (``journal.db`` in the state directory); ``gpud events`` reads it without the
daemon. Retention is bounded by age and by row count. A journal that cannot be read as a database is
set aside (renamed ``journal.db.corrupt-TIME``) and a new one started, with an event that says so:
never a crash of the daemon.

Kinds: ``xid``, ``gpu_lost``, ``gpu_back``, ``fan_failsafe``, ``throttle`` (an episode, when it
ends), ``check`` (a doctor check's status changed), ``profile_apply``, ``profile_restore``,
``profile_drift``, ``profile_reapply``, ``probe``, ``ecc`` (ECC or row-remap counts changed),
``reboot``, ``journal_reset``.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpud.errors import GpudError
from gpud.paths import state_dir

log = logging.getLogger(__name__)

KINDS = ("xid", "gpu_lost", "gpu_back", "fan_failsafe", "throttle", "check", "profile_apply", "profile_restore",
         "profile_drift", "profile_reapply", "probe", "ecc", "reboot", "journal_reset", "burnin")
MAX_ROWS = 20_000  # the oldest events beyond this many go
MAX_AGE_S = 400 * 86400  # events older than this go (a year and a bit: a warranty claim's horizon)
SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, ts REAL NOT NULL, boot_id TEXT, kind TEXT NOT NULL, gpu INTEGER, uuid TEXT,
    serial TEXT, summary TEXT NOT NULL, data TEXT, key TEXT UNIQUE);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
CREATE TABLE IF NOT EXISTS gpus (
    uuid TEXT PRIMARY KEY, serial TEXT, name TEXT, vbios TEXT, pci_bus_id TEXT, gpu INTEGER,
    first_seen REAL, last_seen REAL);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);
"""


class JournalError(GpudError):
    remedy = "the daemon sets an unreadable journal aside at its next start (journal.db.corrupt-*)"


def journal_path() -> Path:
    return state_dir() / "journal.db"


@dataclass(frozen=True)
class Event:
    id: int
    ts: float
    boot_id: str | None
    kind: str
    gpu: int | None
    uuid: str | None
    serial: str | None
    summary: str
    data: dict[str, Any]


def _row(r: tuple[Any, ...]) -> Event:
    return Event(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], json.loads(r[8]) if r[8] else {})


class Journal:
    """The writer (the daemon). Every method logs and swallows database errors: the journal is a
    record, and losing an event must never stop the loop that drives the fans."""

    def __init__(self, path: Path | None = None, max_rows: int = MAX_ROWS, max_age_s: float = MAX_AGE_S) -> None:
        self.path = path or journal_path()
        self.max_rows, self.max_age_s = max_rows, max_age_s
        self.db: sqlite3.Connection | None = None
        self.set_aside: Path | None = None  # where a corrupt journal was moved, if one was
        self._writes = 0
        self._lock = threading.Lock()  # the tick and the doctor thread both write
        self._open()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        reason = None
        try:
            db = sqlite3.connect(self.path, timeout=5, check_same_thread=False)
            check = db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                reason = f"integrity check: {check[0] if check else 'no answer'}"
                db.close()
            else:
                db.executescript(SCHEMA)
                self.db = db
        except sqlite3.Error as err:
            reason = str(err)
        if reason is None:
            self.prune()
            return
        moved = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        log.error("health journal %s is unreadable (%s): set aside as %s, a new one started", self.path, reason,
                  moved.name)
        for suffix in ("", "-journal", "-wal", "-shm"):
            src = Path(str(self.path) + suffix)
            if src.exists():
                os.replace(src, Path(str(moved) + suffix))
        self.set_aside = moved
        try:
            self.db = sqlite3.connect(self.path, timeout=5, check_same_thread=False)
            self.db.executescript(SCHEMA)
        except sqlite3.Error as err:
            log.error("health journal %s cannot be created: %s (events are not kept)", self.path, err)
            self.db = None
            return
        self.record("journal_reset", f"the journal was unreadable ({reason}); set aside as {moved.name}",
                    data={"set_aside": str(moved), "reason": reason})

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def _do(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor | None:
        if self.db is None:
            return None
        try:
            with self._lock, self.db:
                return self.db.execute(sql, args)
        except sqlite3.Error as err:
            log.error("health journal: %s", err)
            return None

    def record(self, kind: str, summary: str, *, gpu: int | None = None, uuid: str | None = None,
               serial: str | None = None, boot_id: str | None = None, data: dict[str, Any] | None = None,
               key: str | None = None, ts: float | None = None) -> bool:
        """Add an event; with ``key``, only once (an Xid line read again is not a new Xid). True when added."""
        cur = self._do("INSERT OR IGNORE INTO events (ts, boot_id, kind, gpu, uuid, serial, summary, data, key) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (ts if ts is not None else time.time(), boot_id, kind, gpu, uuid, serial, summary,
                        json.dumps(data, default=str) if data else None, key))
        added = cur is not None and cur.rowcount > 0
        if added:
            self._writes += 1
            if self._writes % 500 == 0:
                self.prune()
        return added

    def prune(self, now: float | None = None) -> None:
        """Bounded retention: older than ``max_age_s`` or beyond the newest ``max_rows`` events go."""
        now = time.time() if now is None else now
        self._do("DELETE FROM events WHERE ts < ?", (now - self.max_age_s,))
        self._do("DELETE FROM events WHERE id <= (SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?)",
                 (self.max_rows,))

    def meta(self, key: str) -> str | None:
        cur = self._do("SELECT v FROM meta WHERE k = ?", (key,))
        row = cur.fetchone() if cur is not None else None
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._do("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", (key, value))

    def gpu_seen(self, uuid: str, serial: str | None, name: str | None, vbios: str | None, bus: str | None,
                 gpu: int | None, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self._do("INSERT INTO gpus (uuid, serial, name, vbios, pci_bus_id, gpu, first_seen, last_seen) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(uuid) DO UPDATE SET serial=excluded.serial, "
                 "name=excluded.name, vbios=excluded.vbios, pci_bus_id=excluded.pci_bus_id, gpu=excluded.gpu, "
                 "last_seen=excluded.last_seen", (uuid, serial, name, vbios, bus, gpu, now, now))

    def count(self) -> int:
        cur = self._do("SELECT COUNT(*) FROM events")
        return int(cur.fetchone()[0]) if cur is not None else 0


# -- reading (the CLI, without the daemon) -----------------------------------------------------------


def _reader(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise JournalError(f"no health journal at {path}: the daemon writes it (`systemctl start gpud`)")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        db.execute("SELECT COUNT(*) FROM events").fetchone()
    except sqlite3.Error as err:
        raise JournalError(f"health journal {path} is unreadable: {err}") from err
    return db


def events(path: Path | None = None, *, since: float | None = None, gpu: int | None = None,
           uuid: str | None = None, kinds: tuple[str, ...] = ()) -> list[Event]:
    """Events oldest first, filtered."""
    sql = "SELECT id, ts, boot_id, kind, gpu, uuid, serial, summary, data FROM events WHERE 1=1"
    args: list[Any] = []
    if since is not None:
        sql += " AND ts >= ?"
        args.append(since)
    if gpu is not None:
        sql += " AND gpu = ?"
        args.append(gpu)
    if uuid is not None:
        sql += " AND uuid = ?"
        args.append(uuid)
    if kinds:
        sql += f" AND kind IN ({','.join('?' * len(kinds))})"
        args.extend(kinds)
    try:
        with closing(_reader(path or journal_path())) as db:
            return [_row(r) for r in db.execute(sql + " ORDER BY ts, id", args)]
    except sqlite3.Error as err:
        raise JournalError(f"health journal {path or journal_path()} is unreadable: {err}") from err


def gpus(path: Path | None = None) -> list[dict[str, Any]]:
    try:
        with closing(_reader(path or journal_path())) as db:
            cols = ("uuid", "serial", "name", "vbios", "pci_bus_id", "gpu", "first_seen", "last_seen")
            return [dict(zip(cols, r, strict=True)) for r in db.execute(f"SELECT {', '.join(cols)} FROM gpus")]
    except sqlite3.Error as err:
        raise JournalError(f"health journal {path or journal_path()} is unreadable: {err}") from err


def repeated_hardware_xids(evs: list[Event]) -> Iterator[tuple[str, int, int]]:
    """(uuid, xid, boots) for each hardware Xid seen on the same GPU in more than one boot."""
    from gpud.doctor.xid import XIDS

    boots: dict[tuple[str, int], set[str]] = {}
    for e in evs:
        if e.kind == "xid" and e.uuid and e.boot_id:
            boots.setdefault((e.uuid, int(e.data.get("xid", 0))), set()).add(e.boot_id)
    for (uuid, xid), seen in sorted(boots.items()):
        info = XIDS.get(xid)
        if len(seen) > 1 and info is not None and info.kind == "hardware":
            yield uuid, xid, len(seen)
