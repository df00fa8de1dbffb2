"""What the daemon writes to the health journal: changes seen between ticks, not readings.

Every method is cheap when nothing changed (comparisons in memory) and never raises: a journal that
fails is logged by ``gpud.journal`` and the daemon goes on.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gpud.journal import Journal
from gpud.journal import events as read_events
from gpud.model import CheckResult, GpuInfo, Snapshot, XidEvent
from gpud.probe.report import ProbeReport
from gpud.usage import THROTTLE_REASONS

log = logging.getLogger(__name__)


def xid_line(x: XidEvent) -> str:
    """The kernel's line (``NVRM: Xid (PCI:0000:7c:00): 48, pid=…, text``) as the driver prints it."""
    return x.raw or f"NVRM: Xid (PCI:{x.pci_bus_id.rsplit('.', 1)[0]}): {x.xid}, {x.text}"


class Recorder:
    def __init__(self, journal: Journal | None, boot_id: str | None) -> None:
        self.journal = journal
        self.boot_id = boot_id
        self.infos: dict[int, GpuInfo] = {}
        self.lost: set[int] = set()
        self.throttle: dict[int, tuple[float, set[str]]] = {}  # GPU → (since, reasons seen)
        self.health: dict[int, tuple[Any, ...]] = {}
        self.checks: dict[tuple[str, int | None], str] = {}
        self.failsafes = 0
        self.xids: dict[tuple[Any, ...], XidEvent] = {}  # this boot's Xids, never fewer (ring buffer wraps)
        if journal is not None:
            self._start()

    def _start(self) -> None:
        j = self.journal
        assert j is not None
        last = j.meta("boot_id")
        if self.boot_id and last and last != self.boot_id:
            j.record("reboot", f"rebooted (boot id {last[:8]} → {self.boot_id[:8]})", boot_id=self.boot_id,
                     data={"previous_boot_id": last}, key=f"reboot:{self.boot_id}")
        if self.boot_id:
            j.set_meta("boot_id", self.boot_id)

            try:  # a daemon restarted within the same boot keeps counting the Xids it saw
                for e in read_events(j.path, kinds=("xid",)):
                    if e.boot_id == self.boot_id:
                        x = XidEvent(e.data["pci_bus_id"], int(e.data["xid"]), e.data.get("text", ""),
                                     e.data.get("seconds"), e.data.get("line", ""))
                        self.xids[self._xkey(x)] = x
            except Exception as err:  # noqa: BLE001 - the journal is a record, never a reason to stop
                log.warning("health journal: earlier Xids of this boot not read: %s", err)

    def _rec(self, kind: str, summary: str, gpu: int | None = None, **kw: Any) -> None:
        if self.journal is None:
            return
        info = self.infos.get(gpu) if gpu is not None else None
        self.journal.record(kind, summary, gpu=gpu, uuid=info.uuid if info else None,
                            serial=info.serial if info else None, boot_id=self.boot_id, **kw)

    def snapshot(self, snap: Snapshot, whole: bool = True) -> None:
        """A tick's snapshot: GPUs seen, lost and back, throttle episodes, ECC and row-remapping changes. A quick
        snapshot (``whole`` False) holds the last whole one's clock events and error counts: only a GPU lost
        can be new in it."""
        for g in snap.gpus:
            if self.infos.get(g.index) is not g:
                self.infos[g.index] = g
                if self.journal is not None:
                    self.journal.gpu_seen(g.uuid, g.serial, g.name, g.vbios_version, g.pci_bus_id, g.index)
        lost = {s.index for s in snap.samples if s.lost}
        for gpu in sorted(lost - self.lost):
            err = next((s.error for s in snap.samples if s.index == gpu), None)
            self._rec("gpu_lost", f"GPU {gpu} lost: {err or 'no answer'}", gpu, data={"error": err})
        for gpu in sorted(self.lost - lost):
            self._rec("gpu_back", f"GPU {gpu} answers again", gpu)
        self.lost = lost
        if not whole:
            return
        for s in snap.samples:
            if s.lost:
                continue
            active = THROTTLE_REASONS & set(s.clock_events or ())
            episode = self.throttle.get(s.index)
            if active and episode is None:
                self.throttle[s.index] = (snap.timestamp, set(active))
            elif active and episode is not None:
                episode[1].update(active)
            elif not active and episode is not None:
                del self.throttle[s.index]
                secs = snap.timestamp - episode[0]
                self._rec("throttle", f"GPU {s.index} throttled {secs:.0f} s ({', '.join(sorted(episode[1]))})",
                          s.index, data={"seconds": secs, "reasons": sorted(episode[1]), "since": episode[0]})
            health = (s.ecc_errors.aggregate_uncorrected if s.ecc_errors else None,
                      s.ecc_errors.aggregate_corrected if s.ecc_errors else None,
                      s.retired_pages_double_bit, s.remapped_rows_uncorrectable, s.remapped_rows_correctable,
                      s.remapped_rows_pending, s.remapped_rows_failure)
            before = self.health.get(s.index)
            self.health[s.index] = health
            if health != before and any(v for v in health):
                names = ("ecc_aggregate_uncorrected", "ecc_aggregate_corrected", "retired_pages_double_bit",
                         "remapped_rows_uncorrectable", "remapped_rows_correctable", "remapped_rows_pending",
                         "remapped_rows_failure")
                data = dict(zip(names, health, strict=True))
                key = f"ecc:{self.infos[s.index].uuid if s.index in self.infos else s.index}:{health}"
                self._rec("ecc", f"GPU {s.index} ECC / row remapping: " + ", ".join(
                    f"{k}={v}" for k, v in data.items() if v), s.index, data=data, key=key)

    @staticmethod
    def _xkey(x: XidEvent) -> tuple[Any, ...]:
        return (x.pci_bus_id, x.xid, x.seconds_since_boot, x.text)

    def xid_events(self, read: list[XidEvent] | None) -> tuple[XidEvent, ...]:
        """This boot's Xids so far: what the kernel log shows now joined with what it showed before
        (a wrapped ring buffer or a rotated log never takes one away); new ones are journalled."""
        by_bus = {g.pci_bus_id: g for g in self.infos.values()}
        for x in read or ():
            k = self._xkey(x)
            if k in self.xids:
                continue
            self.xids[k] = x
            g = by_bus.get(x.pci_bus_id)
            line = xid_line(x)
            if self.journal is not None:
                self.journal.record(
                    "xid", f"Xid {x.xid} on GPU {g.index if g else x.pci_bus_id}: {x.text}",
                    gpu=g.index if g else None, uuid=g.uuid if g else None, serial=g.serial if g else None,
                    boot_id=self.boot_id, key=f"xid:{self.boot_id}:{k}",
                    data={"xid": x.xid, "pci_bus_id": x.pci_bus_id, "text": x.text, "seconds": x.seconds_since_boot,
                          "line": line})
        return tuple(self.xids.values())

    def fan_failsafes(self, total: int, gpus: str = "") -> None:
        if total > self.failsafes:
            self._rec("fan_failsafe", f"fans handed back to the driver's automatic policy ({total - self.failsafes} "
                      f"time(s)){': ' + gpus if gpus else ''}", data={"total": total})
        self.failsafes = total

    def check_results(self, checks: tuple[CheckResult, ...]) -> None:
        for c in checks:
            key = (c.id, c.gpu)
            before = self.checks.get(key)
            self.checks[key] = c.status
            if before is not None and before != c.status:
                self._rec("check", f"{c.id}{'' if c.gpu is None else f' GPU {c.gpu}'}: {before} → {c.status}: "
                          f"{c.summary}", c.gpu, data={"check": c.id, "from": before, "to": c.status})

    def profile(self, kind: str, summary: str, gpu: int | None = None, **data: Any) -> None:
        self._rec(kind, summary, gpu, data=data)

    def probe(self, result: ProbeReport | None, ok: bool, why: str, error: str | None = None) -> None:
        """A probe that finished (``result``, the newest in the history), or one that failed (``error``,
        the last line it wrote)."""
        said = result.diagnosis.sentences if result is not None else [error] if error else []
        self._rec("probe", f"probe ({why}) {'passed' if ok else 'FAILED'}{': ' + said[0] if said else ''}",
                  data={"ok": ok, "why": why, "at": time.time(), "error": error,
                        "regressions": result.regressions if result is not None else None})
