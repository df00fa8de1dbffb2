"""Plan, apply, verify, restore — loops over the registry of settings (``gpud.profiles.settings``).

*Plan* = desired − current. *Apply* = save the originals (state file first), write, read back;
on any failure roll back what this apply wrote, in reverse order. *Drift* = current against
desired, per GPU and setting (one function for ``gpud verify``, the daemon's enforcement and
``gpud_profile_drift``). *Restore* = originals back in reverse registry order, the fans first.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpud.errors import GpudError, GpuLost, InvalidInput, Unsupported
from gpud.hw.machine import Machine
from gpud.model import Snapshot
from gpud.profiles import state as st
from gpud.profiles.profile import Profile, resolve
from gpud.profiles.settings import (
    GPU_SETTINGS,
    HOST,
    HOST_SETTINGS,
    KEYS,
    RESET,
    UNKNOWN,
    UNSUPPORTED,
    AnySetting,
    At,
    DriftStatus,
    Gpu,
    Host,
    PlanAction,
    Target,
    setting_for,
    settings_of,
    shown,
    target_at,
)
from gpud.profiles.state import TuningState

ORDER = tuple(s.key for s in GPU_SETTINGS)  # per GPU; the host's settings follow
PERSISTENCE_REMEDY = ("`sudo nvidia-smi -pm 1`, or enable nvidia-persistenced "
                      "(`systemctl enable --now nvidia-persistenced`)")
Desired = dict[int, dict[str, Any]]  # per GPU index: setting key → value (and "required")


class TargetMismatch(GpudError):
    """tuning.json belongs to another machine than the one this command acts on."""


def target(machine: Machine) -> str:
    """The machine a command acts on, as people read it (every hardware-changing command says it)."""
    return f"simulated workstation {machine.label}" if machine.simulation is not None else f"host {machine.label}"


def read_state(machine: Machine) -> TuningState | None:
    """The state file for ``machine``: StateError when unusable, TargetMismatch when another machine's."""
    data = st.read()
    if data is not None and data.target not in (None, target(machine)):
        err = TargetMismatch(f"{st.path()} records profile {data.profile!r} applied to {data.target}, "
                             f"not to {target(machine)}")
        err.remedy = ("restore that machine first (`gpud restore` with the same --simulate), or use another "
                      "GPUD_STATE_DIR")
        raise err
    return data


def persistenced_running(machine: Machine) -> bool:
    """Whether nvidia-persistenced runs (it keeps every GPU initialised, like persistence mode)."""
    proc = machine.host.path("/proc")
    try:
        pids = [d.name for d in proc.iterdir() if d.name.isdigit()]
    except OSError:
        return False
    return any((machine.host.read(f"/proc/{pid}/comm") or "").strip() == "nvidia-persistenced" for pid in pids)


@dataclass(frozen=True)
class Change:
    """One line of a plan: one setting of one GPU (``gpu`` None: the host), its values in their JSON form.
    ``original`` and ``undo``: what restore and a rollback of this change write back (a plan's own; a change
    read back from JSON has none, and is not applied)."""

    gpu: int | None
    setting: str  # a registry key
    current: Any
    desired: Any
    action: PlanAction
    note: str = ""
    required: bool = False
    original: Any = field(default=None, compare=False, repr=False)
    undo: Any = field(default=None, compare=False, repr=False)

    @property
    def target(self) -> Target:
        return target_at(self.gpu)

    @property
    def where(self) -> str:
        return self.target.where

    def as_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "setting": self.setting, "current": self.current, "desired": self.desired,
                "action": self.action, "note": self.note}


@dataclass
class Outcome:
    """What an apply did: the plan, what it wrote (in order), and on failure what it undid."""

    plan: list[Change]
    written: list[Change] = field(default_factory=list)
    error: str | None = None
    rolled_back: list[str] = field(default_factory=list)
    not_restored: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    skipped: list[Change] = field(default_factory=list)  # NVML said NOT_SUPPORTED when writing

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        """The result fields of an apply reply (CLI and daemon alike)."""
        return {"ok": self.ok, "applied": self.ok, "error": self.error, "rolled_back": self.rolled_back,
                "not_restored": self.not_restored, "written": len(self.written), "messages": self.messages,
                "skipped": [c.as_dict() for c in self.skipped]}


@dataclass(frozen=True)
class Drift:
    """One setting of one GPU (``gpu`` None: the host) against the applied profile, now."""

    gpu: int | None
    setting: str  # a registry key, or "gpu" for a lost or absent GPU
    current: Any
    desired: Any
    status: DriftStatus

    @property
    def target(self) -> Target:
        return target_at(self.gpu)

    @property
    def drifted(self) -> bool:
        return self.status == "drift"

    @property
    def measured(self) -> bool:
        """Compared with a reading (what ``gpud_profile_drift`` exports: 0 or 1)."""
        return self.status in ("ok", "drift")


# -- plan ------------------------------------------------------------------------------------

def plan(machine: Machine, profile: Profile, daemon: bool = False, snap: Snapshot | None = None
         ) -> tuple[list[Change], Desired]:
    """What applying ``profile`` would change, per GPU; validates against the machine first.
    ``snap``: a reading just taken (the daemon's rules plan several profiles on one)."""
    snap = snap if snap is not None else machine.snapshot()
    infos = {g.index: g for g in snap.gpus}
    desired = resolve(profile, [infos[i] for i in sorted(infos)])
    tuned = st.profile_settings(read_state(machine))
    changes: list[Change] = []
    daemon_keeps = daemon  # a running daemon is an NVML client that never exits: nothing is deinitialised
    persistenced = None
    for s in snap.samples:
        if s.lost:
            raise GpuLost(f"GPU {s.index} is lost: cannot tune it", gpu=s.index)
        at = At(machine, Gpu(s.index), infos[s.index], s)
        want = desired[s.index]
        required = set(want.get("required", []))
        persistent = want.get("persistence_mode", s.persistence_mode) is True or daemon_keeps
        if not persistent:
            if persistenced is None:
                persistenced = persistenced_running(machine)
            persistent = persistenced
        for setting in GPU_SETTINGS:
            if setting.key not in want:
                continue
            value = want[setting.key]
            recorded = tuned.get(s.index, {}).get(setting.key)
            change = _planned(at, setting, value, recorded, daemon, setting.profile_key in required)
            if change.action == "set" and setting.forgotten(value) and not persistent:
                change = dataclasses.replace(
                    change, action="skip", note=("persistence mode is off: the driver would forget it when the last "
                                                 f"NVML client exits; {PERSISTENCE_REMEDY}, or set persistence_mode = "
                                                 "true in the profile"))
            changes.append(change)
    host = At(machine, HOST)
    for setting in HOST_SETTINGS:
        value = profile.host.get(setting.key)
        if value is None:
            continue
        why = setting.accepts(host, value)
        if why:
            raise InvalidInput(profile.source, f"host.{setting.profile_key}", why)
        changes.append(_planned(host, setting, value, None, daemon, False))
    return changes, desired


def typed(setting: AnySetting, raw: Any) -> Any:
    """A JSON-form value (a profile's, or the state file's record of what gpud set) as the setting's own type;
    what a plan skips (None, unsupported) as it is."""
    return raw if raw is None or raw == UNSUPPORTED else setting.from_json(raw)


def _planned(at: At, setting: AnySetting, value: Any, recorded: Any, daemon: bool, required: bool) -> Change:
    """One setting's line of a plan, its values in their JSON form."""
    p = setting.plan(at, typed(setting, value), typed(setting, recorded), daemon)
    return Change(at.target.gpu, setting.key, setting.to_json(p.current), setting.to_json(p.desired), p.action,
                  p.note, required, p.original, p.undo)


# -- writing ------------------------------------------------------------------------------

def _setting(target: Target, key: str) -> AnySetting:
    setting = setting_for(target, key)
    if setting is None:
        raise GpudError(f"{target.where}: {key} is not a setting this gpud knows")
    return setting


def write(machine: Machine, target: Target, setting: str, value: Any) -> Any:
    """Write one setting of ``target`` (``value`` in its JSON form, as the state file and plans hold it) and
    return what was read back (None where NVML has no getter)."""
    s = _setting(target, setting)
    try:
        typed = s.from_json(value)
    except ValueError as err:  # a value no plan or state file should hold (a GPU lost before its reading)
        raise GpudError(f"{target.where}: cannot write {setting} {value!r}: {err}") from err
    return s.write(machine, target, typed)


def read_back_ok(target: Target, setting: str, wanted: Any, got: Any) -> bool:
    """Whether ``got``, read back after writing ``wanted`` (its JSON form), is what was asked."""
    s = _setting(target, setting)
    return s.read_back_ok(s.from_json(wanted), got)


def apply(machine: Machine, profile: Profile, changes: list[Change], desired: Desired,
          extra: Mapping[str, Any] | None = None) -> Outcome:
    """Save originals, write, read back; roll back this apply's writes on any failure.

    The caller holds the tuning lock (``paths.TuningLock``) from the plan to the end. ``extra``: more
    keys for the state file (the daemon's rules record which GPUs they switched).
    """
    out = Outcome(plan=changes)
    missing = [c for c in changes if c.action == "skip" and c.required]
    if missing:
        c = missing[0]
        out.error = f"GPU {c.gpu}: required setting {c.setting} cannot be applied ({c.note}); nothing was written"
        return out
    todo = [c for c in changes if c.action == "set"]
    previous = read_state(machine)  # corrupt or another machine's: refuse before anything is written
    originals: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (previous.originals if previous else {}).items()}
    for c in todo:
        if c.original is None:  # a change no plan made (one read back from JSON): nothing to restore it to
            raise TypeError(f"{c.where}: {c.setting}: a change to write needs its original")
        originals.setdefault(c.target.key, {}).setdefault(c.setting, c.original)
    wanted = keyed(desired, profile.host)
    _mark_skipped(wanted, changes)  # what is skipped is neither enforced nor verified
    record = TuningState(profile=profile.name, source=profile.source, chain=tuple(profile.chain), desired=wanted,
                         originals=originals, pending=True, started_at=time.time(), target=target(machine),
                         extra=dict(extra or {}))
    try:
        st.save(record)  # before the first write: a crash from here on is undone by `gpud restore`
    except st.StateError as err:
        out.error = f"{err}; nothing was written to the hardware"
        return out
    for c in todo:
        try:
            got = write(machine, c.target, c.setting, c.desired)
        except Unsupported as err:
            if c.required:
                out.error = f"{c.where}: required setting {c.setting}: not supported by this GPU ({err})"
                _fail(machine, out, previous, None)
                return out
            skipped = Change(c.gpu, c.setting, c.current, c.desired, "skip", f"not supported by this GPU ({err})")
            out.skipped.append(skipped)
            _mark_skipped(wanted, [skipped])
            continue
        except GpudError as err:
            out.error = f"{c.where}: {c.setting}: {err}"
            # A host write can fail half-way (some CPUs written): undo it with the rest.
            _fail(machine, out, previous, c if isinstance(c.target, Host) else None)
            return out
        if not read_back_ok(c.target, c.setting, c.desired, got):
            out.error = (f"{c.where}: {c.setting}: read back {shown(c.setting, got)}, "
                         f"wanted {shown(c.setting, c.desired)}")
            _fail(machine, out, previous, c)  # it was written: undo it too
            return out
        out.written.append(c)
    try:
        st.save(dataclasses.replace(record, desired=wanted, pending=False, applied_at=time.time()))
    except st.StateError as err:  # the pending record already saved is enough for restore
        out.messages.append(f"{err} (the record saved before writing still holds the originals)")
    return out


def keyed(desired: Desired, host: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """``desired`` (per GPU index) and the host's settings keyed as the state file keys them (``Target.key``),
    less the profile's list of required settings."""
    out = {Gpu(i).key: {k: v for k, v in d.items() if k != "required"} for i, d in desired.items()}
    if host:
        out[HOST.key] = dict(host)
    return out


def unsupported_removed(desired: Desired, out: Outcome) -> Desired:
    """``desired`` with what the plan or the writes skipped marked unsupported (neither enforced nor
    verified), as the state file records it."""
    marked = {Gpu(gpu).key: dict(want) for gpu, want in desired.items()}
    _mark_skipped(marked, [*out.plan, *out.skipped])
    return {gpu: marked[Gpu(gpu).key] for gpu in desired}


def host_unsupported_removed(host: Mapping[str, Any], out: Outcome) -> dict[str, Any]:
    """The profile's host settings with what the plan or the writes skipped (no cpufreq on this
    host) marked unsupported, as the state file records them."""
    marked = {HOST.key: dict(host)}
    _mark_skipped(marked, [*out.plan, *out.skipped])
    return marked[HOST.key]


def _mark_skipped(wanted: dict[str, dict[str, Any]], changes: Iterable[Change]) -> None:
    """Mark unsupported, in ``wanted`` (keyed as the state file, ``Target.key``), every setting a change skipped."""
    for c in changes:
        key = c.target.key
        if c.action == "skip" and c.setting in wanted.get(key, {}):
            wanted[key][c.setting] = UNSUPPORTED


def _fail(machine: Machine, out: Outcome, previous: TuningState | None, also: Change | None) -> None:
    """Roll back, then put the state file back as it was before this apply."""
    _rollback(machine, out, also)
    try:
        if previous is None:
            why = st.clear()
            if why:
                out.messages.append(why)
        else:
            st.save(previous)
    except st.StateError as err:
        out.messages.append(str(err))


def _rollback(machine: Machine, out: Outcome, also: Change | None = None) -> None:
    for c in reversed(out.written + ([also] if also is not None else [])):
        back = c.undo
        try:
            write(machine, c.target, c.setting, back)
            out.rolled_back.append(f"{c.where}: {c.setting} → {shown(c.setting, back)}")
        except GpudError as err:
            out.not_restored.append(f"{c.where}: {c.setting}: {err}")


# -- drift and verify ------------------------------------------------------------------------

def drift(machine: Machine, data: TuningState, snapshot: Snapshot, daemon: bool = False) -> list[Drift]:
    """Every setting of the applied profile against ``snapshot`` (and the host now), in registry
    order per GPU then the host. ``daemon``: a running daemon drives the fans (curves are checked)."""
    samples = {s.index: s for s in snapshot.samples}
    out: list[Drift] = []
    for t, want in st.by_target(data.desired).items():
        at = At(machine, t)
        if isinstance(t, Gpu):
            s = samples.get(t.index)
            if s is None or s.lost:
                out.append(Drift(t.index, "gpu", "lost" if s else "absent", "present", "drift"))
                continue
            at = At(machine, t, None, s)
        for setting in settings_of(t):
            value = want.get(setting.key)
            if value is None or value == UNSUPPORTED:
                continue
            c = setting.check(at, setting.from_json(value), daemon)
            out.append(Drift(t.gpu, setting.key, setting.to_json(c.current), setting.to_json(c.desired), c.status))
    return out


def verify(machine: Machine, daemon: bool = False, snapshot: Snapshot | None = None
           ) -> tuple[TuningState | None, list[Drift]]:
    """Drift of the applied profile; ``snapshot`` (a reading already taken) saves reading the GPUs again."""
    data = read_state(machine)
    if not data:
        return None, []
    return data, drift(machine, data, snapshot if snapshot is not None else machine.snapshot(), daemon)


# -- restore ---------------------------------------------------------------------------------

def restore(machine: Machine, fans_only: bool = False,
            gpus: Collection[int] | None = None) -> tuple[list[str], list[str]]:
    """Write the originals back (reverse order). Returns (done, failed). Safe to run twice.

    Fans go back to the automatic policy first, whatever the state file says (or if it is
    unusable: then StateError follows, after the fans are safe). ``gpus``: those GPUs only (a Slurm job's);
    the other GPUs' and the host's settings stay applied and in the state file."""
    try:
        data = read_state(machine)
        problem: GpudError | None = None
    except GpudError as err:
        data, problem = None, err
    done: list[str] = []
    failed: list[str] = []
    originals = {k: dict(v) for k, v in (data.originals if data else {}).items()}
    first = [s.key for s in GPU_SETTINGS if s.restored_first]
    # Fans first, whatever the state says: no fan stays manual when gpud is not driving it.
    try:
        machine.nvml.init()
        count = machine.nvml.device_count()
    except GpudError as err:
        return done, [f"NVML: {err}"]
    for gpu in range(count):
        if gpus is not None and gpu not in gpus:
            continue
        try:
            s = machine.nvml.sample(gpu)
            if s.lost:
                if Gpu(gpu).key in originals:
                    failed.append(f"GPU {gpu}: lost: cannot restore it (a reset returns it to driver defaults)")
                continue
            for f in s.fans:
                if f.policy == "manual" or any(k in originals.get(Gpu(gpu).key, {}) for k in first):
                    machine.nvml.set_fan_auto(gpu, f.fan)
                    done.append(f"GPU {gpu}: fan {f.fan} → auto")
        except GpudError as err:
            failed.append(f"GPU {gpu}: fan: {err}")
    if problem is not None:
        raise problem
    if data is None:
        return done, failed
    if fans_only:
        desired = {k: {s: v for s, v in want.items() if s not in first} for k, want in data.desired.items()}
        originals = {k: {s: v for s, v in was.items() if s not in first} for k, was in originals.items()}
        try:
            st.save(dataclasses.replace(data, desired=desired, originals=originals))
        except st.StateError as err:
            failed.append(str(err))
        return done, failed
    keep: dict[str, dict[str, Any]] = {}
    others: dict[str, dict[str, Any]] = {}  # what ``gpus`` leaves out: kept applied, and in the state file

    def left_out(t: Target) -> bool:
        return gpus is not None and (isinstance(t, Host) or t.index not in gpus)

    if gpus is not None:
        others = {t.key: v for t, v in st.by_target(originals).items() if left_out(t)}
        originals = {k: v for k, v in originals.items() if k not in others}
    for t, settings in sorted(st.by_target(originals).items(), key=lambda kv: kv[0].key):
        for setting in reversed(KEYS):
            if setting not in settings or setting in first:
                continue
            value = settings[setting]
            try:
                write(machine, t, setting, value)
                done.append(f"{t.where}: {setting} → {shown(setting, value)}")
            except GpudError as err:
                failed.append(f"{t.where}: {setting}: {err}")
                keep.setdefault(t.key, {})[setting] = value
    if gpus is not None and others:
        left = {t.key: v for t, v in st.by_target(data.desired).items() if left_out(t) or t.key in keep}
        try:
            st.save(dataclasses.replace(data, originals={**others, **keep}, desired=left))
        except st.StateError as err:
            failed.append(str(err))
    elif keep:
        try:
            st.save(dataclasses.replace(data, originals=keep))
        except st.StateError as err:
            failed.append(str(err))
    else:
        why = st.clear()
        if why:
            failed.append(why)
    return done, failed


__all__ = ["Change", "Drift", "Outcome", "RESET", "UNKNOWN", "apply", "drift", "host_unsupported_removed", "plan",
           "read_back_ok", "restore", "typed", "unsupported_removed", "verify", "write"]
