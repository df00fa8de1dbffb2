"""Health states: per GPU and component, healthy / degraded / unhealthy (or unknown), with a reason and a
repair action.

After NVIDIA/Lepton's gpud (components with states Healthy/Degraded/Unhealthy, each with a repair
action, and a local set-healthy) and NVIDIA's health validation levels (PASS/INFO/WARNING/CRITICAL:
healthy is PASS and INFO, degraded WARNING, unhealthy CRITICAL). Nothing here reads the hardware:
the states are derived from doctor's results, the kernel log's Xids of this boot and the health
journal (earlier boots' Xids, lost GPUs, reboots and set-healthy entries).

- A check's ``fail`` is unhealthy and its ``warn`` degraded, per component (``COMPONENTS``); the
  components that leave a GPU usable, only slower (configuration, host, PCIe link, NVLink, clocks),
  are at worst degraded.
- Xids follow ``XidPolicy``: each Xid's resolution bucket in NVIDIA's Xid catalog (``gpud.doctor.xid``,
  its version there), as an action (``BUCKET_ACTION``). RESTART_APP (and ``[health] application_xids``)
  is the application's: degraded, "check the application", never a drain. IGNORE ("No Action
  required") is informational: healthy with a note when the catalog names no follow-up either, else
  degraded (its investigatory action applies "if the issue reoccurs"); never unhealthy. RESET_GPU,
  RESTART_BM and CONTACT_SUPPORT/CHECK_MECHANICALS Xids of this boot are unhealthy, "reset the GPU",
  "reboot", "inspect the hardware"; the same hardware Xid on the same GPU in more than
  ``reboot_threshold`` boots is unhealthy, "inspect the hardware". An Xid of an earlier boot alone is
  healthy: the reboot was the repair. An Xid the catalog does not list is unhealthy, "reset the GPU"
  (the device plugin treats every Xid it does not list as fatal).
- No kernel log readable (``Host.read_xids``: /dev/kmsg, the journal and the syslog files each absent or refused):
  each GPU's Xid component is ``unknown``, "not judged: …" with what gpud needs to read one; never
  "no Xid since boot". Unknown is worse than healthy and better than any finding (``SEVERITY``).
- A GPU lost now, or lost earlier in this boot, is unhealthy, "reboot" (NVIDIA: Xid 79 needs a
  reboot); lost in more than ``reboot_threshold`` boots, "inspect the hardware".
- ``gpud health set-healthy GPU`` writes a ``set_healthy`` entry: events before it no longer count,
  and a check whose reason is the one it acknowledged stays healthy until its reason changes (one
  more ECC error, another throttle reason).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from gpud.config import Config, HealthSection
from gpud.doctor.xid import KIND, QUIET, XIDS, Bucket, describe, unreadable_summary
from gpud.errors import GpudError, InvalidInput, LibraryNotFound
from gpud.model import CheckResult, Snapshot, XidEvent

if TYPE_CHECKING:
    from pathlib import Path

    from gpud.hw.host import KernelLogUnreadable
    from gpud.hw.machine import Machine
    from gpud.journal import Event

State = Literal["healthy", "degraded", "unhealthy", "unknown"]
STATES: tuple[State, ...] = get_args(State)
# the metric's value: 0, 1, 2; unknown (not judged: what it is judged from could not be read) is -1,
# neither healthy nor a finding
RANK: dict[State, int] = {"healthy": 0, "degraded": 1, "unhealthy": 2, "unknown": -1}
# which state is worse: unknown is worse than healthy (it is no pass) and better than any finding
SEVERITY: dict[State, int] = {"healthy": 0, "unknown": 1, "degraded": 2, "unhealthy": 3}
Action = Literal["none", "check the application", "reset the GPU", "reboot", "inspect the hardware"]
ACTIONS: tuple[Action, ...] = get_args(Action)
HOST = "host"  # the gpu label of machine-wide components

# The Kubernetes device plugin's application Xids (NVIDIA/k8s-device-plugin, internal/rm/health.go:
# the Xids it skips because "they are application errors"). Not gpud's default: NVIDIA's catalog puts 43
# and 45 in IGNORE and 109 in RESET_GPU (docs/deployment.md, "Xid policy").
DEVICE_PLUGIN_APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
# The catalog's resolution buckets (gpud.doctor.xid.BUCKETS) as gpud's actions.
BUCKET_ACTION: dict[Bucket, Action] = {"IGNORE": "none", "RESTART_APP": "check the application",
                                       "RESET_GPU": "reset the GPU", "RESTART_BM": "reboot",
                                       "CONTACT_SUPPORT": "inspect the hardware",
                                       "CHECK_MECHANICALS": "inspect the hardware"}


@dataclass(frozen=True)
class XidPolicy:
    """Each Xid's bucket: NVIDIA's Xid catalog, with ``application`` as the Xids that are the application's
    (``[health] application_xids``; by default the catalog's RESTART_APP ones). The list replaces the
    catalog's RESTART_APP whole: an Xid listed is the application's whatever its bucket, and a RESTART_APP
    Xid not listed is taken as RESET_GPU (the stricter; the device plugin treats every Xid it does not list as
    fatal). After ``reboot_threshold`` boots a hardware Xid means the hardware."""

    application: frozenset[int]
    reboot_threshold: int = 1

    def bucket(self, xid: int) -> Bucket:
        if xid in self.application:
            return "RESTART_APP"
        b = describe(xid).bucket
        return "RESET_GPU" if b == "RESTART_APP" else b

    def kind(self, xid: int) -> str:
        """hardware | application | informational | unknown (not in the catalog, not listed)."""
        if xid not in self.application and xid not in XIDS:
            return "unknown"
        return KIND[self.bucket(xid)]


def default_application_xids() -> tuple[int, ...]:
    """NVIDIA's Xid catalog's RESTART_APP Xids."""
    return tuple(sorted(x for x, d in XIDS.items() if d.bucket == "RESTART_APP"))


def default_policy() -> XidPolicy:
    return XidPolicy(frozenset(default_application_xids()))


@dataclass(frozen=True)
class Health:
    """One component of one GPU (``gpu`` None: the machine's)."""

    gpu: int | None
    uuid: str
    component: str
    state: State
    reason: str
    action: Action
    remedy: str = ""  # what a person does, with the command that confirms it
    acknowledged: str | None = None  # the set-healthy entry that holds it healthy ("by WHO at TIME: WHY")

    @property
    def label(self) -> str:
        return HOST if self.gpu is None else str(self.gpu)


# doctor check id → (component, worst state, action on fail, action on warn). Checks not listed say
# nothing of health (the caller's environment, processes, the probe's figures; topo.numa: GPUs on two
# sockets are a dual-socket machine's normal layout, doctor's advice on placing ranks, not a fault).
Rule = tuple[str, State, Action, Action]
COMPONENTS: dict[str, Rule] = {
    "nvml.available": ("driver", "unhealthy", "reboot", "none"),
    "driver.nouveau": ("driver", "unhealthy", "reboot", "none"),
    "gpu.count": ("gpu", "unhealthy", "reboot", "inspect the hardware"),
    "health.ecc": ("memory", "unhealthy", "reset the GPU", "none"),
    "health.thermal": ("thermal", "unhealthy", "inspect the hardware", "none"),
    "health.fans": ("fans", "unhealthy", "inspect the hardware", "inspect the hardware"),
    "health.clock_events": ("clocks", "degraded", "inspect the hardware", "none"),
    "health.pcie_replay": ("pcie", "degraded", "inspect the hardware", "inspect the hardware"),
    "pcie.link_width": ("pcie", "degraded", "inspect the hardware", "inspect the hardware"),
    "pcie.link_gen": ("pcie", "degraded", "inspect the hardware", "inspect the hardware"),
    "gpu.p2p": ("pcie", "degraded", "none", "none"),
    "pcie.acs": ("pcie", "degraded", "none", "none"),
    "host.iommu": ("pcie", "degraded", "none", "none"),
    "nvlink.links": ("nvlink", "degraded", "inspect the hardware", "inspect the hardware"),
    "sli.disabled": ("config", "degraded", "none", "none"),
    "config.persistence_mode": ("config", "degraded", "none", "none"),
    "config.power_limit": ("config", "degraded", "none", "none"),
    "config.mig_mode": ("config", "degraded", "none", "none"),
    "config.compute_mode": ("config", "degraded", "none", "none"),
    "config.ecc": ("config", "degraded", "reset the GPU", "none"),
    "host.cpu_governor": ("host", "degraded", "none", "none"),
    "host.shm": ("host", "degraded", "none", "none"),
    "host.memlock": ("host", "degraded", "none", "none"),
    "host.memory": ("host", "degraded", "none", "none"),
    "host.psu": ("host", "degraded", "none", "none"),
}
# health.ecc's findings that a reset does not cure (NVIDIA's row-remapping guidance: a remapping
# failure, or retired pages at the limit, mean the board is replaced)
ECC_HARDWARE = ("row remapping failed", "retired pages (limit")
GPU_COMPONENTS = ("gpu", "xid", "memory", "thermal", "fans", "clocks", "pcie", "nvlink", "config")
HOST_COMPONENTS = ("driver", "gpu", "pcie", "config", "host")


@dataclass(frozen=True)
class Acknowledgement:
    """A set-healthy entry of the journal."""

    ts: float
    uuid: str
    who: str
    why: str
    reasons: Mapping[str, str] = field(default_factory=dict)  # component → the reason it acknowledged

    def says(self) -> str:
        return f"set healthy by {self.who} at {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.ts))}: {self.why}"


def acknowledgements(history: Iterable[Event]) -> dict[str, Acknowledgement]:
    """The last set-healthy entry per GPU UUID."""
    out: dict[str, Acknowledgement] = {}
    for e in history:
        if e.kind == "set_healthy" and e.uuid and e.ts is not None:
            reasons = e.data.get("acknowledged")
            out[e.uuid] = Acknowledgement(e.ts, e.uuid, str(e.data.get("who", "?")), str(e.data.get("reason", "")),
                                          {str(k): str(v) for k, v in reasons.items()}
                                          if isinstance(reasons, dict) else {})
    return out


def _worst(items: Sequence[Health]) -> Health:
    return max(items, key=lambda h: (SEVERITY[h.state], ACTIONS.index(h.action)))


def _from_checks(checks: Iterable[CheckResult], uuids: Mapping[int, str]) -> list[Health]:
    out = []
    for r in checks:
        rule = COMPONENTS.get(r.id)
        if rule is None or r.status not in ("warn", "fail"):
            continue
        component, cap, on_fail, on_warn = rule
        state: State = "degraded" if r.status == "warn" or cap == "degraded" else "unhealthy"
        action = on_fail if r.status == "fail" else on_warn
        if r.id == "health.ecc" and any(s in r.summary for s in ECC_HARDWARE):
            action = "inspect the hardware"
        if r.id == "nvml.available" and LibraryNotFound.marker in r.summary:
            action = "none"  # no libnvidia-ml.so.1 here (a container without the NVIDIA runtime): no reboot cures it
        out.append(Health(r.gpu, uuids.get(r.gpu, "") if r.gpu is not None else "", component, state,
                          f"{r.id}: {r.summary}", action, r.remedy))
    return out


@dataclass(frozen=True)
class SeenXid:
    uuid: str
    xid: int
    boot_id: str | None
    ts: float | None  # when it happened (this boot: from the kernel log's time; earlier: the journal's)
    this_boot: bool


def _xids(kernel: Sequence[XidEvent], boot_time: float | None, boot_id: str | None, bus_uuid: Mapping[str, str],
          history: Iterable[Event]) -> list[SeenXid]:
    """This boot's Xids from the kernel log, earlier boots' from the journal."""
    seen = []
    for x in kernel:
        uuid = bus_uuid.get(x.pci_bus_id.lower())
        if uuid is None:
            continue
        ts = boot_time + x.seconds_since_boot if boot_time is not None and x.seconds_since_boot is not None else None
        seen.append(SeenXid(uuid, x.xid, boot_id, ts, True))
    for e in history:
        xid = e.data.get("xid")
        if (e.kind == "xid" and e.uuid and isinstance(xid, int) and not isinstance(xid, bool)
                and e.boot_id != boot_id):
            seen.append(SeenXid(e.uuid, xid, e.boot_id, e.ts, False))
    return seen


def _xid_health(gpu: int, uuid: str, seen: Sequence[SeenXid], policy: XidPolicy,
                ack: Acknowledgement | None, unread: KernelLogUnreadable | None = None) -> Health:
    mine = [s for s in seen if s.uuid == uuid and (ack is None or s.ts is None or s.ts > ack.ts)]
    now = [s for s in mine if s.this_boot]
    if not now and unread is not None:  # no kernel log read: this boot's Xids are unknown, not absent
        reason, remedy = unreadable_summary(unread.tried, os.geteuid() == 0)
        return Health(gpu, uuid, "xid", "unknown", reason, "none", remedy)
    if not now:
        return Health(gpu, uuid, "xid", "healthy", "no Xid since boot" + (" (after set-healthy)" if ack else ""),
                      "none", acknowledged=ack.says() if ack else None)
    judged = []
    for x in sorted({s.xid for s in now}):
        d = describe(x)
        kind = policy.kind(x)
        bucket = policy.bucket(x)
        n = sum(1 for s in now if s.xid == x)
        listed = f"Xid {x}" + (f" ×{n}" if n > 1 else "")
        boots = len({s.boot_id for s in mine if s.xid == x and s.boot_id})
        if kind == "application":
            judged.append(Health(gpu, uuid, "xid", "degraded", f"{listed}: {d.meaning} (the application's)",
                                 "check the application", d.action))
        elif kind == "informational":  # the catalog's IGNORE: "No Action required"; never unhealthy
            state: State = "healthy" if x in QUIET else "degraded"
            judged.append(Health(gpu, uuid, "xid", state, f"{listed}: {d.meaning} (informational: NVIDIA's Xid "
                                 "catalog says no action is required)", "none", d.action))
        elif kind == "hardware" and boots > policy.reboot_threshold:
            judged.append(Health(gpu, uuid, "xid", "unhealthy",
                                 f"{listed}: {d.meaning}, in {boots} boots (a reboot did not cure it)",
                                 "inspect the hardware", f"`gpud events --dossier {gpu}`"))
        else:
            judged.append(Health(gpu, uuid, "xid", "unhealthy", f"{listed}: {d.meaning}", BUCKET_ACTION[bucket],
                                 d.action))
    worst = _worst(judged)
    others = [h for h in judged if h is not worst]
    reason = worst.reason + ("; also " + ", ".join(h.reason.split(":")[0] for h in others) if others else "")
    return Health(gpu, uuid, "xid", worst.state, reason, worst.action, worst.remedy)


def xid_action(xid: int, policy: XidPolicy | None = None) -> Action:
    """An Xid's immediate action: its bucket in NVIDIA's Xid catalog (``XidPolicy.bucket``) as gpud's
    action: IGNORE none, RESTART_APP the application, RESET_GPU a reset, RESTART_BM (79; 154, taken as the
    strictest) a reboot, CONTACT_SUPPORT and CHECK_MECHANICALS (54) the hardware."""
    return BUCKET_ACTION[(policy or default_policy()).bucket(xid)]


def _lost(gpu: int, uuid: str, lost_now: bool, error: str | None, history: Sequence[Event], boot_id: str | None,
          policy: XidPolicy, ack: Acknowledgement | None) -> Health | None:
    evs = [e for e in history if e.kind == "gpu_lost" and e.uuid == uuid and e.ts is not None
           and (ack is None or e.ts > ack.ts)]
    this_boot = [e for e in evs if e.boot_id == boot_id and boot_id is not None]
    if not lost_now and not this_boot:
        return None
    boots = len({e.boot_id for e in evs if e.boot_id} | ({boot_id} if lost_now and boot_id else set()))
    why = f"GPU lost: {error or 'no answer'}" if lost_now else "GPU was lost in this boot and answers again"
    if boots > policy.reboot_threshold:
        return Health(gpu, uuid, "gpu", "unhealthy", f"{why}; lost in {boots} boots", "inspect the hardware",
                      "check power cables, seating, riser and slot, and the power supply")
    return Health(gpu, uuid, "gpu", "unhealthy", why, "reboot", "reboot; if it recurs, check power cables, seating, "
                                                                 "riser and slot")


def assess(checks: Iterable[CheckResult], snapshot: Snapshot | None, *, xids: Sequence[XidEvent] = (),
           boot_time: float | None = None, boot_id: str | None = None, history: Sequence[Event] = (),
           policy: XidPolicy | None = None, unread: KernelLogUnreadable | None = None) -> tuple[Health, ...]:
    """Every component of every GPU and of the machine, worst first within each GPU's list order.
    ``unread``: no kernel log could be read (which sources, why), so each GPU's Xids are unknown."""
    policy = policy or default_policy()
    gpus = {g.index: g for g in snapshot.gpus} if snapshot is not None else {}
    samples = {s.index: s for s in snapshot.samples} if snapshot is not None else {}
    uuids = {i: g.uuid for i, g in gpus.items()}
    for i, s in samples.items():  # a GPU lost before gpud first read it has no known UUID: ""
        if i not in uuids:
            uuids[i] = s.uuid or ""
    acks = acknowledgements(history)
    derived = _from_checks(checks, uuids)
    seen = _xids(xids, boot_time, boot_id, {g.pci_bus_id.lower(): g.uuid for g in gpus.values()}, history)
    out: list[Health] = []
    for gpu in sorted(uuids):
        uuid = uuids[gpu]
        ack = acks.get(uuid)
        sample = samples.get(gpu)
        found: dict[str, list[Health]] = {c: [] for c in GPU_COMPONENTS}
        for h in derived:
            if h.gpu == gpu:
                found[h.component].append(h)
        lost = _lost(gpu, uuid, bool(sample and sample.lost), sample.error if sample else None, history, boot_id,
                     policy, ack)
        if lost is not None:
            found["gpu"].append(lost)
        for component in GPU_COMPONENTS:
            if component == "xid":
                out.append(_xid_health(gpu, uuid, seen, policy, ack, unread))
                continue
            out.append(_acknowledged(_judge(gpu, uuid, component, found[component]), ack))
    for component in HOST_COMPONENTS:
        out.append(_judge(None, "", component, [h for h in derived if h.gpu is None and h.component == component]))
    return tuple(out)


def _judge(gpu: int | None, uuid: str, component: str, found: Sequence[Health]) -> Health:
    if not found:
        return Health(gpu, uuid, component, "healthy", "no problem found", "none")
    worst = _worst(found)
    more = len(found) - 1
    return Health(gpu, uuid, component, worst.state, worst.reason + (f" (+{more} more)" if more else ""),
                  worst.action, worst.remedy)


def _acknowledged(h: Health, ack: Acknowledgement | None) -> Health:
    """A check's finding a person set healthy stays healthy while its reason is the same."""
    if ack is None or h.state == "healthy" or ack.reasons.get(h.component) != h.reason:
        return h
    return Health(h.gpu, h.uuid, h.component, "healthy", f"{h.reason} (acknowledged)", "none",
                  acknowledged=ack.says())


def worst_of(states: Iterable[Health]) -> State:
    return max((h.state for h in states), key=SEVERITY.__getitem__, default="healthy")


# Drain reasons (``one_line``): Slurm shows 20 characters of one by default (``sinfo -R``), so the most
# severe finding comes first and its first 20 characters say which GPU and what. Severity, most severe
# first: results silently wrong (uncorrectable ECC, its Xids), a GPU or the driver gone (Xid 79, lost,
# missing), any other hardware Xid, cooling that does not cool, thermal margins, the rest.
CORRUPTION_XIDS = frozenset({48, 63, 64, 94, 95, 140})
SHORT_XID: dict[int, str] = {
    48: "DBE ECC", 63: "row remap", 64: "row remap failed", 94: "contained ECC", 95: "uncontained ECC",
    140: "unrecovered ECC", 79: "off the bus", 74: "NVLink", 54: "aux power", 80: "PCIe data corrupt",
    92: "SBE rate", 119: "GSP timeout", 120: "GSP error", 154: "recovery", 61: "uC breakpoint", 62: "uC halt",
}
SHORT_ACTION: dict[Action, str] = {"none": "", "check the application": "check app", "reset the GPU": "reset GPU",
                                   "reboot": "reboot", "inspect the hardware": "inspect hw"}
ASCII = {"°": "", "×": "x", "…": "...", "–": "-", "—": "-", "→": "->", "≥": ">=", "≤": "<=", "µ": "u"}
PARTS = (120, 80, 52)  # characters of one finding: the longest that lets them all fit, else the shortest


def ascii_line(text: str) -> str:
    """One line of printable ASCII (Slurm's reason field, ``sinfo``'s columns): 94 °C → 94 C."""
    text = "".join(ASCII.get(c, c) for c in text)
    text = "".join(c if c.isascii() and c.isprintable() else (" " if not c.isprintable() else "?") for c in text)
    return " ".join(text.split())


def _xids_of(h: Health) -> list[int]:

    return [int(n) for n in re.findall(r"Xid (\d+)", h.reason)] if h.component == "xid" else []


def _tier(h: Health) -> int:
    xids = set(_xids_of(h))
    if h.component == "memory" or xids & CORRUPTION_XIDS:
        return 0
    if h.component in ("gpu", "driver") or 79 in xids:
        return 1
    if h.component == "xid":
        return 2
    return {"fans": 3, "thermal": 4}.get(h.component, 5)


def by_severity(states: Iterable[Health]) -> list[Health]:
    """The unhealthy findings, the most severe first (then the stricter action, then the GPU)."""
    bad = [h for h in states if h.state == "unhealthy"]
    return sorted(bad, key=lambda h: (_tier(h), -ACTIONS.index(h.action), -1 if h.gpu is None else h.gpu))


def _short(h: Health, part: int) -> str:
    """``GPU3 Xid48 DBE ECC -> reset GPU``, ``GPU1 fans: fan 0 asked for 100 % ... -> inspect hw``."""
    where = "host" if h.gpu is None else f"GPU{h.gpu}"
    xids = _xids_of(h)
    if xids:
        what = " ".join(f"Xid{n}" + (f" {SHORT_XID[n]}" if n in SHORT_XID else "") for n in [xids[0]])
        what += "".join(f", Xid{n}" for n in xids[1:])
    else:
        summary = h.reason.split(": ", 1)[1] if h.reason.split(": ", 1)[0] in COMPONENTS else h.reason
        what = f"{h.component}: {summary.split('; ')[0]}"
    action = SHORT_ACTION[h.action]
    text = ascii_line(f"{where} {what}")
    tail = f" -> {action}" if action else ""
    return (text if len(text) + len(tail) <= part else text[:part - len(tail) - 3].rstrip() + "...") + tail


def one_line(states: Sequence[Health], limit: int = 200) -> str:
    """The unhealthy findings as one ASCII line of at most ``limit`` characters (a Slurm drain reason),
    the most severe first: ``GPU3 Xid48 DBE ECC -> reset GPU; GPU3 memory: ...; ... [gpud]``."""
    bad = by_severity(states)
    if not bad:
        return ""
    tag = " [gpud]"
    for part in PARTS:
        text = "; ".join(_short(h, part) for h in bad) + tag
        if len(text) <= limit:
            return text
    parts = [_short(h, PARTS[-1]) for h in bad]
    for n in range(len(parts), 0, -1):
        more = len(parts) - n
        text = "; ".join(parts[:n]) + (f" (+{more} more)" if more else "") + tag
        if len(text) <= limit:
            return text
    text = parts[0] + (f" (+{len(parts) - 1} more)" if len(parts) > 1 else "")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def as_json(states: Iterable[Health]) -> list[dict[str, Any]]:
    return [{"gpu": h.gpu, "uuid": h.uuid or None, "component": h.component, "state": h.state, "reason": h.reason,
             "action": h.action, "remedy": h.remedy, "acknowledged": h.acknowledged} for h in states]


def policy_of(section: HealthSection) -> XidPolicy:
    """``[health]``'s Xid policy; without ``application_xids``, the default list."""
    xids = section.application_xids
    return XidPolicy(frozenset(default_application_xids() if xids is None else xids), section.reboot_threshold)


HISTORY_KINDS = ("xid", "gpu_lost", "set_healthy")


def journal_history(path: Path | None = None) -> list[Event]:
    """What the health states read of the journal; nothing without one (no daemon ever ran)."""
    from gpud import journal  # here: sqlite3 is 5-8 ms of every `gpud status`, which imports this module

    try:
        return journal.events(path, kinds=HISTORY_KINDS)
    except (GpudError, OSError):
        return []


def journal_version() -> tuple[int, ...] | None:
    from gpud import journal  # as in journal_history

    return journal.version()


def gather(machine: Machine, config: Config, checks: Iterable[CheckResult], snapshot: Snapshot | None, *,
           xids: Sequence[XidEvent] | None = None, history: Sequence[Event] | None = None,
           unread: KernelLogUnreadable | None = None) -> tuple[Health, ...]:
    """The states of ``machine`` from doctor's ``checks`` of ``snapshot``; the kernel log's Xids and
    the journal are read unless given (the daemon gives the Xids it already read). Given Xids without
    ``unread``: whether the kernel log could be read is asked of the host (an empty list read from no
    log is not "no Xid")."""
    host = machine.host
    if xids is None:
        read = host.read_xids()
        xids, unread = (read, None) if isinstance(read, list) else ((), read)
    elif unread is None and not xids:
        unread = host.kernel_log_unreadable()
    return assess(checks, snapshot, xids=xids, boot_time=host.boot_time(), boot_id=host.boot_id(),
                  history=journal_history() if history is None else history, policy=policy_of(config.health),
                  unread=unread)


MAX_REASON = 500


def check_reason(reason: str) -> str:
    """A set-healthy reason: one line of text, 1..500 characters (``InvalidInput`` otherwise)."""

    text = reason.strip()
    if not text:
        raise InvalidInput("--reason", "", "say why the GPU is healthy again (what was repaired or checked)")
    if len(text) > MAX_REASON or any(not c.isprintable() for c in text):
        raise InvalidInput("--reason", "", f"one line of at most {MAX_REASON} printable characters")
    return text


def set_healthy_entry(states: Iterable[Health], gpu: int, who: str, uid: int | None,
                      reason: str) -> tuple[str, dict[str, Any]]:
    """The journal's ``set_healthy`` entry (summary, data): who, why, and the reasons it acknowledges
    (every component of the GPU not healthy now)."""
    acknowledged = {h.component: h.reason for h in states if h.gpu == gpu and h.state not in ("healthy", "unknown")
                    and h.acknowledged is None}
    return (f"GPU {gpu} set healthy by {who}: {reason}",
            {"who": who, "uid": uid, "reason": reason, "acknowledged": acknowledged})


class Tracker:
    """The daemon's health states, worked out again only when an input changed (doctor's checks, the
    Xids, a GPU lost or back, the journal, read at most every ``JOURNAL_EVERY_S`` where it was written since,
    or after a set-healthy): a tick costs a comparison."""

    JOURNAL_EVERY_S = 10.0

    def __init__(self) -> None:
        self.states: tuple[Health, ...] = ()
        self._key: tuple[Any, ...] | None = None
        self._history: list[Event] | None = None
        self._version: tuple[int, ...] | None = None  # the journal's (``gpud.journal.version``) when last read
        self._read_at = 0.0

    def invalidate(self) -> None:
        self._history = None

    def update(self, machine: Machine, config: Config, checks: tuple[CheckResult, ...], snapshot: Snapshot | None,
               xids: tuple[XidEvent, ...], now: float) -> tuple[Health, ...]:
        if self._history is None or now - self._read_at >= self.JOURNAL_EVERY_S:
            version = journal_version()  # a stat and 4 bytes: the history is read again only if it was written
            if self._history is None or version is None or version != self._version:
                history = journal_history()
                if self._history is None or [e.id for e in history] != [e.id for e in self._history]:
                    self._history = history
                self._version = version
            self._read_at = now
        lost = frozenset(s.index for s in snapshot.samples if s.lost) if snapshot is not None else None
        # The inputs themselves, not their id()s: an id is reused once its object is freed, and these are
        # compared element by element, each the same object from tick to tick until it changes.
        gpus = snapshot.gpus if snapshot is not None else ()
        key = (checks, xids, lost, gpus, self._history, config.health)
        if key != self._key:
            self.states = gather(machine, config, checks, snapshot, xids=xids, history=self._history)
            self._key = key
        return self.states
