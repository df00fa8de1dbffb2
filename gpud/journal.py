"""The health journal: what happened to the GPUs, kept across reboots (stdlib ``sqlite3``).

The daemon writes it (``journal.db`` in the state directory); ``gpud events`` reads it without the
daemon. Retention is bounded by age and by row count, per pool of kinds (``BUDGETS``): the kinds that
come often (throttle episodes, check changes, a profile's drift and its rules) are trimmed among
themselves and never push the evidence out; throttle episodes of one GPU and reasons that follow each
other closely share one row (a count, the first start, the last end, the time in all). A journal that
cannot be read as a database is set aside (renamed ``journal.db.corrupt-TIME``) and a new one started,
with an event that says so: never a crash of the daemon.

Kinds: ``xid``, ``gpu_lost``, ``gpu_back``, ``fan_failsafe``, ``throttle`` (an episode, when it
ends), ``check`` (a doctor check's status changed), ``profile_apply``, ``profile_restore``,
``profile_drift``, ``profile_reapply``, ``profile_rule`` (a rule switched a GPU, lost, or paused),
``probe``, ``ecc`` (ECC or row-remap counts changed), ``reboot``, ``journal_reset``, ``set_healthy``
(``gpud health set-healthy``: who and why), ``job_end`` (``gpud doctor --epilog``: the Xids a Slurm job saw).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from gpud.errors import GpudError
from gpud.paths import state_dir

log = logging.getLogger(__name__)

KINDS = ("xid", "gpu_lost", "gpu_back", "fan_failsafe", "throttle", "check", "profile_apply", "profile_restore",
         "profile_drift", "profile_reapply", "profile_rule", "probe", "ecc", "reboot", "journal_reset", "burnin",
         "set_healthy", "job_end")
MAX_ROWS = 20_000  # the evidence: the oldest beyond this many go (trimmed among themselves only)
# Kinds that come often, some of them at a user's will (a load toggled against the SW power cap, a job
# that starts and stops under a profile rule, a check that flips with the load): each pool has its own
# budget and is trimmed only among itself, so none of them ever pushes the evidence (an Xid, an ECC
# count, a GPU lost, who set a GPU healthy or applied a profile, a reboot) out of the journal.
POOLS: dict[str, tuple[str, ...]] = {
    "throttle": ("throttle",),
    "check": ("check",),
    "profile_auto": ("profile_drift", "profile_reapply", "profile_rule"),
}
EVIDENCE = "evidence"  # every other kind (one not known here too)
BUDGETS: dict[str, int] = {EVIDENCE: MAX_ROWS, "throttle": 2_000, "check": 5_000, "profile_auto": 2_000}
POOL_OF = {kind: pool for pool, kinds in POOLS.items() for kind in kinds}
THROTTLE_MERGE_GAP_S = 60.0  # an episode that starts within this of the last one's end (same GPU, reasons)…
THROTTLE_MERGE_SPAN_S = 3600.0  # …is merged into it, while the merged episode spans at most this
MAX_AGE_S = 400 * 86400  # events older than this go (a year and a bit: a warranty claim's horizon)
BUSY_WAIT_S = 10.0  # how long the daemon's start waits for another process's lock on the journal
RETRY_S = 30.0  # then opening is tried again this often, from the loop
BUSY_TIMEOUT_MS = 250  # once open, how long one write waits for another process's lock before it is held
BACKLOG = 1000  # events held in memory while the journal cannot be opened
SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, ts REAL NOT NULL, boot_id TEXT, kind TEXT NOT NULL, gpu INTEGER, uuid TEXT,
    serial TEXT, summary TEXT NOT NULL, data TEXT, key TEXT UNIQUE);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
CREATE INDEX IF NOT EXISTS events_kind ON events (kind, id);
CREATE TABLE IF NOT EXISTS gpus (
    uuid TEXT PRIMARY KEY, serial TEXT, name TEXT, vbios TEXT, pci_bus_id TEXT, gpu INTEGER,
    first_seen REAL, last_seen REAL);
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT);
"""


def _classify(err: sqlite3.Error) -> str:
    """"busy" (SQLITE_BUSY, SQLITE_LOCKED), "corrupt" (SQLITE_CORRUPT, SQLITE_NOTADB) or "error": sqlite's
    own result code (Python 3.11+), else its message."""
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        primary = code & 0xFF
        return "busy" if primary in (5, 6) else "corrupt" if primary in (11, 26) else "error"
    text = str(err).lower()
    if "locked" in text or "busy" in text:
        return "busy"
    return "corrupt" if "malformed" in text or "not a database" in text else "error"


class JournalError(GpudError):
    remedy = "the daemon sets an unreadable journal aside at its next start (journal.db.corrupt-*)"


def journal_path() -> Path:
    return state_dir() / "journal.db"


@dataclass(frozen=True)
class Event:
    id: int
    ts: float | None  # None: the row's time is not a time (shown as "?")
    boot_id: str | None
    kind: str
    gpu: int | None
    uuid: str | None
    serial: str | None
    summary: str
    data: dict[str, Any]


LATEST_TS = 1e11  # the year 5138: a later (or negative) time is not one the daemon wrote


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _row(r: tuple[Any, ...], problems: list[str] | None = None) -> Event:
    """An event from a row as stored; what cannot be shown is left out, one problem per bad row."""
    bad: list[str] = []
    ts = r[1]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or not 0 <= ts <= LATEST_TS:
        bad.append(f"time {str(ts)[:30]!r} is not a time")
        ts = None
    gpu = r[4]
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int)):
        bad.append(f"GPU {str(gpu)[:30]!r} is not an index")
        gpu = None
    data: dict[str, Any] = {}
    if r[8]:
        try:
            loaded = json.loads(r[8], parse_constant=_no_constant)  # NaN is no JSON
        except (ValueError, TypeError, RecursionError):
            loaded = None
        if isinstance(loaded, dict):
            data = loaded
        else:
            bad.append("its data is not a JSON object")
    fields = [_text(r[i]) for i in (2, 3, 5, 6, 7)]
    if any(isinstance(r[i], bytes) for i in (2, 3, 5, 6, 7)):
        bad.append("it holds bytes where text belongs")
    if bad and problems is not None:
        problems.append(f"event {r[0]}: " + "; ".join(bad) + " (shown without it)")
    return Event(int(r[0]), ts, fields[0], fields[1] or "?", gpu, fields[2], fields[3], fields[4] or "", data)


class Journal:
    """The writer (the daemon). Every method logs and swallows database errors: the journal is a
    record, and losing an event must never stop the loop that drives the fans."""

    def __init__(self, path: Path | None = None, max_rows: int = MAX_ROWS, max_age_s: float = MAX_AGE_S,
                 busy_wait_s: float = BUSY_WAIT_S, budgets: Mapping[str, int] | None = None) -> None:
        """``max_rows``: the evidence's budget; ``budgets``: any pool's (``BUDGETS``)."""
        self.path = path or journal_path()
        self.budgets = {**BUDGETS, EVIDENCE: max_rows, **(budgets or {})}
        self.max_rows, self.max_age_s = self.budgets[EVIDENCE], max_age_s
        self._counts: dict[str, int] = {}  # rows per pool, as the last trim counted them and writes since
        self.db: sqlite3.Connection | None = None
        self.set_aside: Path | None = None  # where a corrupt journal was moved, if one was
        self._writes = 0
        self._lock = threading.Lock()  # the tick and the doctor thread both write
        self._open_lock = threading.Lock()
        self._flushing = False
        self.busy_wait_s = busy_wait_s
        self._retry_at: float | None = None  # when to try opening again (the file was locked or unopenable)
        self._backlog: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque(maxlen=BACKLOG)
        self._open()

    def _try_open(self) -> tuple[str, str]:
        """("ok", ""), ("busy", why): another process holds a lock (a backup, an ``sqlite3`` shell);
        ("corrupt", why): sqlite itself says the file is not a sound database; ("error", why): anything
        else (permissions, I/O): the file is kept and opening is tried again."""
        db = None
        try:
            db = sqlite3.connect(self.path, timeout=min(5.0, self.busy_wait_s), check_same_thread=False)
            check = db.execute("PRAGMA quick_check").fetchone()
            if check is None or check[0] != "ok":
                db.close()
                return "corrupt", f"integrity check: {check[0] if check else 'no answer'}"
            db.executescript(SCHEMA)
            db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")  # a lock later on never stalls the tick long
            self.db = db
            return "ok", ""
        except sqlite3.Error as err:
            if db is not None:
                db.close()
            return _classify(err), str(err)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.busy_wait_s
        while True:
            outcome, reason = self._try_open()
            if outcome == "ok":
                self._retry_at = None
                self.prune()
                self._flush()
                return
            if outcome != "busy" or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if outcome != "corrupt":  # locked or unopenable now: kept as it is, opened again later
            if self._retry_at is None:
                log.warning("health journal %s cannot be opened now (%s): kept as it is and tried again every "
                            "%.0f s; up to %d events are held meanwhile", self.path, reason, RETRY_S, BACKLOG)
            self._retry_at = time.monotonic() + RETRY_S
            return
        self._retry_at = None
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
        self.prune()  # empty: it counts the pools
        self.record("journal_reset", f"the journal was unreadable ({reason}); set aside as {moved.name}",
                    data={"set_aside": str(moved), "reason": reason})
        self._flush()

    def _flush(self) -> None:
        """Write what was held while the journal could not be opened or was locked."""
        self._flushing = True
        try:
            for _ in range(len(self._backlog)):
                if self.db is None:
                    break
                sql, args = self._backlog.popleft()
                if self._do(sql, args) is None and self._backlog and self._backlog[-1] == (sql, args):
                    break  # still locked: kept (at the end), tried again with the next write
        finally:
            self._flushing = False

    def _reopen_if_due(self) -> None:
        if self._retry_at is None or time.monotonic() < self._retry_at:
            return
        with self._open_lock:
            if self.db is None and self._retry_at is not None and time.monotonic() >= self._retry_at:
                self._open()

    def close(self) -> None:
        self._retry_at = None
        if self.db is not None:
            self.db.close()
            self.db = None

    def _do(self, sql: str, args: tuple[Any, ...] = ()) -> sqlite3.Cursor | None:
        if self.db is None:
            self._reopen_if_due()
        if self.db is None:
            if self._retry_at is not None and not sql.startswith("SELECT"):
                self._backlog.append((sql, args))
            return None
        write = not sql.startswith("SELECT")
        try:
            with self._lock, self.db:
                cur = self.db.execute(sql, args)
        except sqlite3.Error as err:
            if write and _classify(err) == "busy":  # another process's transaction: held, written later
                if not self._backlog:
                    log.warning("health journal: %s: events held until the lock goes", err)
                self._backlog.append((sql, args))
            else:
                log.error("health journal: %s", err)
            return None
        if write and self._backlog and not self._flushing:
            self._flush()
        return cur

    def record(self, kind: str, summary: str, *, gpu: int | None = None, uuid: str | None = None,
               serial: str | None = None, boot_id: str | None = None, data: dict[str, Any] | None = None,
               key: str | None = None, ts: float | None = None) -> bool:
        """Add an event; with ``key``, only once (an Xid line read again is not a new Xid). True when added.
        A throttle episode that closely follows its GPU's last one, for the same reasons, is merged into
        that one's row (``_merged``)."""
        if kind == "throttle" and data is not None:
            merged = self._merged(gpu, uuid, boot_id, data, ts)
            if merged is not None:
                return merged
        cur = self._do("INSERT OR IGNORE INTO events (ts, boot_id, kind, gpu, uuid, serial, summary, data, key) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (ts if ts is not None else time.time(), boot_id, kind, gpu, uuid, serial, summary,
                        json.dumps(data, default=str) if data else None, key))
        added = cur is not None and cur.rowcount > 0
        if added:
            self._writes += 1
            pool = POOL_OF.get(kind, EVIDENCE)
            if pool in self._counts:
                self._counts[pool] += 1
                if self._counts[pool] > self.budgets[pool]:  # a flood of one pool is trimmed as it comes
                    self._trim(pool)
            if self._writes % 500 == 0:
                self.prune()
        return added

    def _merged(self, gpu: int | None, uuid: str | None, boot_id: str | None, data: dict[str, Any],
                ts: float | None) -> bool | None:
        """Merge a throttle episode into its GPU's last one when that one is of the same boot and
        reasons, ended at most ``THROTTLE_MERGE_GAP_S`` before this one began, and the two together
        span at most ``THROTTLE_MERGE_SPAN_S``: the row then counts the episodes (``count``), keeps
        the first one's start (``since``, ``first``), the last one's end (``last``) and the time
        throttled in all (``seconds``). None: not merged (write a row of its own); else whether the
        row was updated."""
        since, secs, reasons = data.get("since"), data.get("seconds"), data.get("reasons")
        if not (_number(since) and _number(secs) and isinstance(reasons, list)) or (gpu is None and uuid is None):
            return None
        cur = self._do("SELECT id, boot_id, data FROM events WHERE kind = 'throttle' AND gpu IS ? AND uuid IS ? "
                       "ORDER BY id DESC LIMIT 1", (gpu, uuid))
        row = cur.fetchone() if cur is not None else None
        if row is None or row[1] != boot_id or not isinstance(row[2], str):
            return None
        try:
            last = json.loads(row[2], parse_constant=_no_constant)
        except (ValueError, TypeError, RecursionError):
            return None
        if not isinstance(last, dict) or last.get("reasons") != reasons:
            return None
        first, before, count = last.get("first", last.get("since")), last.get("seconds"), last.get("count", 1)
        if not (_number(first) and _number(before)) or isinstance(count, bool) or not isinstance(count, int):
            return None
        end = last.get("last", first + before)
        if not _number(end) or not 0 <= since - end <= THROTTLE_MERGE_GAP_S \
                or since + secs - first > THROTTLE_MERGE_SPAN_S:
            return None
        total, count, span = before + secs, count + 1, since + secs - first
        merged = {**last, **data, "since": first, "first": first, "last": since + secs, "seconds": total,
                  "count": count}
        who = f"GPU {gpu}" if gpu is not None else str(uuid)
        summary = (f"{who} throttled {total:.0f} s in {count} episodes over {_span(span)} "
                   f"({', '.join(str(r) for r in reasons)})")
        cur = self._do("UPDATE events SET ts = ?, summary = ?, data = ? WHERE id = ?",
                       (ts if ts is not None else time.time(), summary, json.dumps(merged, default=str), row[0]))
        return cur is not None and cur.rowcount > 0

    def _trim(self, pool: str) -> None:
        """Keep a pool's newest rows within its budget, and count them."""
        where, args = _pool_where(pool)
        self._do(f"DELETE FROM events WHERE {where} AND id <= (SELECT id FROM events WHERE {where} "
                 "ORDER BY id DESC LIMIT 1 OFFSET ?)", (*args, *args, self.budgets[pool]))
        cur = self._do(f"SELECT COUNT(*) FROM events WHERE {where}", args)
        if cur is not None:
            self._counts[pool] = int(cur.fetchone()[0])

    def prune(self, now: float | None = None) -> None:
        """Bounded retention: older than ``max_age_s`` goes, and each pool keeps its newest rows within
        its budget (``BUDGETS``: throttle episodes never push an Xid out)."""
        now = time.time() if now is None else now
        self._do("DELETE FROM events WHERE ts < ?", (now - self.max_age_s,))
        for pool in self.budgets:
            if pool == EVIDENCE or pool in POOLS:
                self._trim(pool)

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


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _span(secs: float) -> str:
    return f"{secs:.0f} s" if secs < 120 else f"{secs / 60:.0f} min" if secs < 7200 else f"{secs / 3600:.1f} h"


def _pool_where(pool: str) -> tuple[str, tuple[str, ...]]:
    """The SQL condition (and its arguments) that picks a pool's rows."""
    if pool == EVIDENCE:
        others = tuple(POOL_OF)
        return f"kind NOT IN ({','.join('?' * len(others))})", others
    kinds = POOLS[pool]
    return f"kind IN ({','.join('?' * len(kinds))})", kinds


# -- reading (the CLI, without the daemon) -----------------------------------------------------------


def _reader(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise JournalError(f"no health journal at {path}: the daemon writes it (`systemctl start gpud`)")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        db.execute("SELECT COUNT(*) FROM events").fetchone()
    except sqlite3.Error as err:
        raise _unreadable(path, err) from err
    return db


def _unreadable(path: Path, err: sqlite3.Error) -> JournalError:
    if _classify(err) == "busy":
        e = JournalError(f"health journal {path} is locked by another process ({err})")
        e.remedy = "another process holds a transaction on it (a backup, an `sqlite3` shell): try again when it ends"
        return e
    return JournalError(f"health journal {path} is unreadable: {err}")


def events(path: Path | None = None, *, since: float | None = None, gpu: int | None = None,
           uuid: str | None = None, kinds: tuple[str, ...] = (), problems: list[str] | None = None) -> list[Event]:
    """Events oldest first, filtered; a row that cannot be shown whole is shown without what is wrong
    in it, and said once in ``problems``."""
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
            return [_row(r, problems) for r in db.execute(sql + " ORDER BY ts, id", args)]
    except sqlite3.Error as err:
        raise _unreadable(path or journal_path(), err) from err


def version(path: Path | None = None) -> tuple[int, ...] | None:
    """What changes whenever the journal is written: the file (inode, size, modification time) and SQLite's
    file change counter, "incremented whenever the database file is unlocked after having been modified"
    (sqlite.org/fileformat2.html, the database header, offset 24; the journal is not in WAL mode, where it
    need not be). None where it cannot be read. A read costs a stat and a 4-byte read, not a query: what the
    daemon asks every 10 s before reading the history again."""
    path = path or journal_path()
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            head = f.read(28)
    except OSError:
        return None
    if len(head) < 28:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, int.from_bytes(head[24:28], "big"))


def gpus(path: Path | None = None) -> list[dict[str, Any]]:
    try:
        with closing(_reader(path or journal_path())) as db:
            cols = ("uuid", "serial", "name", "vbios", "pci_bus_id", "gpu", "first_seen", "last_seen")
            return [dict(zip(cols, r, strict=True)) for r in db.execute(f"SELECT {', '.join(cols)} FROM gpus")]
    except sqlite3.Error as err:
        raise _unreadable(path or journal_path(), err) from err
