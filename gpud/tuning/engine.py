"""Plan, apply, verify, restore — each tunable a get/set pair (after TuneD's plugins).

*Plan* = desired − current. *Apply* = save the originals (state file first), write, read back;
on any failure roll back what this apply wrote, in reverse order. *Verify* = current against
desired, per GPU and setting. *Restore* = originals back: fans to the automatic policy, clocks
reset, power to the saved limit, persistence and compute mode as saved, CPU governor as saved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gpud.errors import GpudError, GpuLost, InvalidInput, Unsupported
from gpud.hw.machine import Machine
from gpud.hw.nvml import ARCHITECTURES
from gpud.model import GpuInfo, GpuSample, Snapshot
from gpud.tuning import state as st
from gpud.tuning.profile import Profile, resolve

ORDER = ("persistence_mode", "compute_mode", "power_limit_watts", "applications_clocks", "gpu_clocks",
         "memory_clocks", "fan")
RESET = "reset"
UNKNOWN = "unknown"  # NVML has no getter (locked clocks)
_ARCH_RANK = {name: code for code, name in ARCHITECTURES.items()}
# Lost when the last NVML client exits and the driver deinitialises the GPU, unless persistence
# mode is on or nvidia-persistenced runs (NVIDIA's "Driver Persistence" documentation).
NEED_PERSISTENCE = ("compute_mode", "power_limit_watts", "applications_clocks")
PERSISTENCE_REMEDY = ("`sudo nvidia-smi -pm 1`, or enable nvidia-persistenced "
                      "(`systemctl enable --now nvidia-persistenced`)")


class TargetMismatch(GpudError):
    """tuning.json belongs to another machine than the one this command acts on."""


def target(machine: Machine) -> str:
    """The machine a command acts on, as people read it (every hardware-changing command says it)."""
    return f"simulated workstation {machine.label}" if machine.simulation is not None else f"host {machine.label}"


def read_state(machine: Machine) -> dict[str, Any] | None:
    """The state file for ``machine``: StateError when unusable, TargetMismatch when another machine's."""
    data = st.read()
    if data is not None and data.get("target") not in (None, target(machine)):
        err = TargetMismatch(f"{st.path()} records profile {data.get('profile')!r} applied to {data['target']}, "
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
    gpu: int | None  # None: the host
    setting: str
    current: Any
    desired: Any
    action: str  # set | none | skip | daemon
    note: str = ""
    required: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "setting": self.setting, "current": self.current, "desired": self.desired,
                "action": self.action, "note": self.note}


@dataclass
class Outcome:
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


# -- reading current values ------------------------------------------------------------------

def current_value(setting: str, s: GpuSample, tuned: dict[str, Any] | None) -> Any:
    if setting == "persistence_mode":
        return s.persistence_mode
    if setting == "compute_mode":
        return s.compute_mode
    if setting == "power_limit_watts":
        return s.power_management_limit_watts
    if setting == "applications_clocks":
        mem, gfx = s.applications_clocks_mhz.get("memory"), s.applications_clocks_mhz.get("graphics")
        return [mem, gfx] if mem is not None and gfx is not None else None
    if setting in ("gpu_clocks", "memory_clocks"):
        # No NVML getter: what gpud itself set, if it did; else unknown.
        return (tuned or {}).get(setting, UNKNOWN)
    if setting == "fan":
        return [f.policy for f in s.fans]
    raise KeyError(setting)


def same(setting: str, current: Any, desired: Any) -> bool:
    if setting == "power_limit_watts":
        return current is not None and abs(float(current) - float(desired)) <= 1.0
    return bool(current == desired)


def _fan_plan(g: GpuInfo, s: GpuSample, fan: dict[str, Any], daemon: bool) -> tuple[str, str]:
    if not s.fans or not g.fan_count:
        return "skip", "no fan control on this GPU (passive card cooled by the chassis)"
    policies = [f.policy for f in s.fans]
    if fan["mode"] == "auto":
        return ("none", "") if all(p == "auto" for p in policies) else ("set", "")
    if not daemon:
        return "daemon", "needs the gpud daemon to drive it: fans stay on the automatic policy"
    return "daemon", "handed to the running gpud daemon's fan controller"


def plan(machine: Machine, profile: Profile, daemon: bool = False) -> tuple[list[Change], dict[int, dict[str, Any]]]:
    """What applying ``profile`` would change, per GPU; validates against the machine first."""
    snap = machine.snapshot()
    infos = {g.index: g for g in snap.gpus}
    desired = resolve(profile, [infos[i] for i in sorted(infos)])
    tuned = st.profile_settings(read_state(machine))
    changes: list[Change] = []
    daemon_keeps = daemon  # a running daemon is an NVML client that never exits: nothing is deinitialised
    persistenced = None
    for s in snap.samples:
        if s.lost:
            raise GpuLost(f"GPU {s.index} is lost: cannot tune it", gpu=s.index)
        g = infos[s.index]
        want = desired[s.index]
        required = set(want.get("required", []))
        persistent = want.get("persistence_mode", s.persistence_mode) is True or daemon_keeps
        if not persistent:
            if persistenced is None:
                persistenced = persistenced_running(machine)
            persistent = persistenced
        for setting in ORDER:
            if setting not in want:
                continue
            value = want[setting]
            name = "power_limit" if setting == "power_limit_watts" else setting
            req = name in required
            if setting == "fan":
                action, note = _fan_plan(g, s, value, daemon)
                changes.append(Change(s.index, setting, current_value(setting, s, None), value["mode"], action, note,
                                      req))
                continue
            cur = current_value(setting, s, tuned.get(s.index))
            skip = _unsupported(setting, g, value, cur)
            if not skip and setting in NEED_PERSISTENCE and not persistent and not same(setting, cur, value) \
                    and value != RESET:
                skip = ("persistence mode is off: the driver would forget it when the last NVML client exits; "
                        f"{PERSISTENCE_REMEDY}, or set persistence_mode = true in the profile")
            if skip:
                changes.append(Change(s.index, setting, cur, value, "skip", skip, req))
            elif same(setting, cur, value):
                changes.append(Change(s.index, setting, cur, value, "none", "", req))
            else:
                changes.append(Change(s.index, setting, cur, value, "set", "", req))
    gov = profile.host.get("cpu_governor")
    if gov is not None:
        avail = machine.host.cpu_governors_available()
        govs = machine.host.cpu_governors()
        if avail and gov not in avail:
            raise InvalidInput(profile.source, "host.cpu_governor",
                               f"{gov!r} not available here (available: {', '.join(sorted(avail))})")
        now = sorted(set(govs.values()))
        if not govs:
            changes.append(Change(None, "cpu_governor", None, gov, "skip", "no cpufreq on this host"))
        else:
            changes.append(Change(None, "cpu_governor", "/".join(now), gov, "none" if now == [gov] else "set"))
    return changes, desired


def _unsupported(setting: str, g: GpuInfo, value: Any, cur: Any) -> str:
    if value is None or value == "unsupported":
        return "not supported by this GPU"
    if setting == "gpu_clocks" and g.architecture in _ARCH_RANK and _ARCH_RANK[g.architecture] < _ARCH_RANK["volta"]:
        return f"locked GPU clocks need Volta or newer ({g.name} is {g.architecture.title()})"
    if setting == "memory_clocks" and g.architecture in _ARCH_RANK and \
            _ARCH_RANK[g.architecture] < _ARCH_RANK["ampere"]:
        return f"locked memory clocks need Ampere or newer ({g.name} is {g.architecture.title()})"
    if setting in ("persistence_mode", "compute_mode", "applications_clocks", "power_limit_watts") and cur is None:
        return "not reported by this GPU"
    return ""


# -- writing ------------------------------------------------------------------------------

def write(machine: Machine, gpu: int | None, setting: str, value: Any) -> Any:
    """Write one setting and return what was read back (None where NVML has no getter)."""
    n = machine.nvml
    if gpu is None:
        try:
            return machine.host.set_cpu_governor(value) if isinstance(value, str) else _governors_back(machine, value)
        except OSError as err:
            e = GpudError(f"cannot write the CPU governor ({err.strerror or err}: {err.filename or ''})")
            e.remedy = "run as root; check `lsattr` and `cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor`"
            raise e from err
    if setting == "persistence_mode":
        return n.set_persistence_mode(gpu, bool(value))
    if setting == "compute_mode":
        return n.set_compute_mode(gpu, value)
    if setting == "power_limit_watts":
        return n.set_power_limit(gpu, float(value))
    if setting == "applications_clocks":
        if value in (RESET, UNKNOWN, None):
            n.reset_applications_clocks(gpu)
            return None
        return list(n.set_applications_clocks(gpu, value[0], value[1]))
    if setting in ("gpu_clocks", "memory_clocks"):
        lock, reset = ((n.set_locked_gpu_clocks, n.reset_locked_gpu_clocks) if setting == "gpu_clocks"
                       else (n.set_locked_memory_clocks, n.reset_locked_memory_clocks))
        if value in (RESET, UNKNOWN, None):
            reset(gpu)
        else:
            lock(gpu, value[0], value[1])
        return None
    if setting == "fan":
        info = machine.info(gpu)
        return [n.set_fan_auto(gpu, f) for f in range(info.fan_count or 0)] if info else None
    raise KeyError(setting)


def _governors_back(machine: Machine, per_cpu: dict[str, str]) -> dict[int, str]:
    """Each CPU back to its own saved governor; CPUs already there are not written (a CPU whose
    file could never be written was never changed, and must not stop the others)."""
    now = machine.host.cpu_governors()
    failed: OSError | None = None
    for cpu, gov in per_cpu.items():
        if now.get(int(cpu)) != gov:
            try:
                machine.host.set_cpu_governor(gov, [int(cpu)])
            except OSError as err:
                failed = err
    back = machine.host.cpu_governors()
    if failed is not None and any(back.get(int(c)) != g for c, g in per_cpu.items()):
        raise failed
    return back


def _read_back_ok(setting: str, wanted: Any, got: Any) -> bool:
    if got is None or setting in ("gpu_clocks", "memory_clocks", "fan"):
        return True  # nothing to compare (no getter) — recorded, not verified
    if setting == "cpu_governor":
        return set(got.values()) == {wanted} if isinstance(wanted, str) else True
    return same(setting, got, wanted)


def _original(change: Change) -> Any:
    """What restore writes back for this setting."""
    if change.setting in ("gpu_clocks", "memory_clocks", "applications_clocks"):
        return RESET  # clocks → reset (the driver's defaults)
    if change.setting == "fan":
        return "auto"
    return change.current


def apply(machine: Machine, profile: Profile, changes: list[Change], desired: dict[int, dict[str, Any]],
          host_before: dict[int, str] | None = None) -> Outcome:
    """Save originals, write, read back; roll back this apply's writes on any failure.

    The caller holds the tuning lock (``paths.TuningLock``) from the plan to the end.
    """
    out = Outcome(plan=changes)
    missing = [c for c in changes if c.action == "skip" and c.required]
    if missing:
        c = missing[0]
        out.error = f"GPU {c.gpu}: required setting {c.setting} cannot be applied ({c.note}); nothing was written"
        return out
    todo = [c for c in changes if c.action == "set"]
    previous = read_state(machine)  # corrupt or another machine's: refuse before anything is written
    originals: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (previous or {}).get("originals", {}).items()}
    for c in todo:
        key = "host" if c.gpu is None else str(c.gpu)
        if c.gpu is None:
            originals.setdefault(key, {}).setdefault(c.setting, {str(k): v for k, v in
                                                                 (host_before or {}).items()})
        else:
            originals.setdefault(key, {}).setdefault(c.setting, _original(c))
    wanted: dict[str, dict[str, Any]] = {str(i): {k: v for k, v in d.items() if k != "required"}
                                         for i, d in desired.items()}
    for c in changes:  # what is skipped is neither enforced nor verified
        if c.action == "skip" and c.gpu is not None and c.setting in wanted.get(str(c.gpu), {}):
            wanted[str(c.gpu)][c.setting] = "unsupported"
    if profile.host:
        wanted["host"] = dict(profile.host)
    record = {"profile": profile.name, "source": profile.source, "chain": list(profile.chain),
              "desired": wanted, "originals": originals, "pending": True, "started_at": time.time(),
              "target": target(machine)}
    try:
        st.save(record)  # before the first write: a crash from here on is undone by `gpud restore`
    except st.StateError as err:
        out.error = f"{err}; nothing was written to the hardware"
        return out
    for c in todo:
        where = "host" if c.gpu is None else f"GPU {c.gpu}"
        try:
            got = write(machine, c.gpu, c.setting, c.desired)
        except Unsupported as err:
            if c.required:
                out.error = f"{where}: required setting {c.setting}: not supported by this GPU ({err})"
                _fail(machine, out, host_before, previous, None)
                return out
            skipped = Change(c.gpu, c.setting, c.current, c.desired, "skip", f"not supported by this GPU ({err})")
            out.skipped.append(skipped)
            if c.gpu is not None:
                wanted[str(c.gpu)][c.setting] = "unsupported"
            continue
        except GpudError as err:
            out.error = f"{where}: {c.setting}: {err}"
            # A host write can fail half-way (some CPUs written): undo it with the rest.
            _fail(machine, out, host_before, previous, c if c.gpu is None else None)
            return out
        if not _read_back_ok(c.setting, c.desired, got):
            out.error = f"{where}: {c.setting}: read back {show(got)}, wanted {show(c.desired)}"
            _fail(machine, out, host_before, previous, c)  # it was written: undo it too
            return out
        out.written.append(c)
    record["pending"] = False
    record["applied_at"] = time.time()
    try:
        st.save(record)
    except st.StateError as err:  # the pending record already saved is enough for restore
        out.messages.append(f"{err} (the record saved before writing still holds the originals)")
    return out


def _fail(machine: Machine, out: Outcome, host_before: dict[int, str] | None, previous: dict[str, Any] | None,
          also: Change | None) -> None:
    """Roll back, then put the state file back as it was before this apply."""
    _rollback(machine, out, host_before, also)
    try:
        if previous is None:
            why = st.clear()
            if why:
                out.messages.append(why)
        else:
            st.save(previous)
    except st.StateError as err:
        out.messages.append(str(err))


def _rollback(machine: Machine, out: Outcome, host_before: dict[int, str] | None, also: Change | None = None) -> None:
    for c in reversed(out.written + ([also] if also is not None else [])):
        where = "host" if c.gpu is None else f"GPU {c.gpu}"
        back = c.current if c.setting not in ("gpu_clocks", "memory_clocks") or c.current != UNKNOWN else RESET
        if c.setting == "cpu_governor":
            back = {str(k): v for k, v in (host_before or {}).items()}
        try:
            write(machine, c.gpu, c.setting, back)
            out.rolled_back.append(f"{where}: {c.setting} → {show(back)}")
        except GpudError as err:
            out.not_restored.append(f"{where}: {c.setting}: {err}")


def show(v: Any) -> str:
    """A setting's value for people: 300 W, on/off, 2100,2100 (clocks), powersave (governors)."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):  # only power limits are floats
        return f"{v:.0f} W"
    if isinstance(v, dict):
        return "/".join(sorted(set(map(str, v.values()))))
    if isinstance(v, list):
        return ",".join(map(str, v))
    return str(v)


# -- verify ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Drift:
    gpu: int | None
    setting: str
    current: Any
    desired: Any
    status: str  # drift | ok | unverifiable | daemon


def verify(machine: Machine, daemon: bool = False, snapshot: Snapshot | None = None
           ) -> tuple[dict[str, Any] | None, list[Drift]]:
    """Drift of the applied profile; ``snapshot`` (a reading already taken) saves reading the GPUs again."""
    data = read_state(machine)
    if not data:
        return None, []
    snap = snapshot if snapshot is not None else machine.snapshot()
    samples = {s.index: s for s in snap.samples}
    out: list[Drift] = []
    for key, want in sorted(data.get("desired", {}).items()):
        if key == "host":
            gov = want.get("cpu_governor")
            if gov is not None:
                now = sorted(set(machine.host.cpu_governors().values()))
                out.append(Drift(None, "cpu_governor", "/".join(now), gov, "ok" if now == [gov] else "drift"))
            continue
        gpu = int(key)
        s = samples.get(gpu)
        if s is None or s.lost:
            out.append(Drift(gpu, "gpu", "lost" if s else "absent", "present", "drift"))
            continue
        for setting in ORDER:
            if setting not in want or want[setting] in (None, "unsupported"):
                continue
            value = want[setting]
            if setting in ("gpu_clocks", "memory_clocks"):
                out.append(Drift(gpu, setting, UNKNOWN, value, "unverifiable"))
                continue
            if setting == "fan":
                out.append(_fan_drift(gpu, s, value, daemon))
                continue
            cur = current_value(setting, s, None)
            if value == RESET:
                out.append(Drift(gpu, setting, cur, value, "unverifiable"))
                continue
            out.append(Drift(gpu, setting, cur, value, "ok" if same(setting, cur, value) else "drift"))
    return data, out


def _fan_drift(gpu: int, s: GpuSample, fan: dict[str, Any], daemon: bool) -> Drift:
    policies = [f.policy for f in s.fans]
    if not s.fans:
        return Drift(gpu, "fan", None, fan["mode"], "unverifiable")
    if fan["mode"] == "auto":
        return Drift(gpu, "fan", policies, "auto", "ok" if all(p == "auto" for p in policies) else "drift")
    if not daemon:
        return Drift(gpu, "fan", policies, fan["mode"], "daemon")  # needs the daemon: not drift
    if fan["mode"] == "fixed":
        targets = [f.target_percent for f in s.fans]
        good = all(p == "manual" for p in policies) and all(t == fan["percent"] for t in targets)
        return Drift(gpu, "fan", targets, fan["percent"], "ok" if good else "drift")
    return Drift(gpu, "fan", policies, "curve", "ok" if all(p == "manual" for p in policies) else "drift")


# -- restore ---------------------------------------------------------------------------------

def restore(machine: Machine, fans_only: bool = False) -> tuple[list[str], list[str]]:
    """Write the originals back (reverse order). Returns (done, failed). Safe to run twice.

    Fans go back to the automatic policy first, whatever the state file says (or if it is
    unusable: then StateError follows, after the fans are safe)."""
    try:
        data = read_state(machine)
        problem: GpudError | None = None
    except GpudError as err:
        data, problem = None, err
    done: list[str] = []
    failed: list[str] = []
    originals = (data or {}).get("originals", {})
    # Fans first, whatever the state says: no fan stays manual when gpud is not driving it.
    try:
        machine.nvml.init()
        count = machine.nvml.device_count()
    except GpudError as err:
        return done, [f"NVML: {err}"]
    for gpu in range(count):
        try:
            s = machine.nvml.sample(gpu)
            if s.lost:
                if str(gpu) in originals:
                    failed.append(f"GPU {gpu}: lost: cannot restore it (a reset returns it to driver defaults)")
                continue
            for f in s.fans:
                if f.policy == "manual" or "fan" in originals.get(str(gpu), {}):
                    machine.nvml.set_fan_auto(gpu, f.fan)
                    done.append(f"GPU {gpu}: fan {f.fan} → auto")
        except GpudError as err:
            failed.append(f"GPU {gpu}: fan: {err}")
    if problem is not None:
        raise problem
    if data is None:
        return done, failed
    if fans_only:
        for key in list(originals):
            originals[key].pop("fan", None)
        for key in list(data.get("desired", {})):
            data["desired"][key].pop("fan", None)
        try:
            st.save(data)
        except st.StateError as err:
            failed.append(str(err))
        return done, failed
    keep: dict[str, dict[str, Any]] = {}
    for key, settings in sorted(originals.items()):
        target = None if key == "host" else int(key)
        for setting in reversed(ORDER + ("cpu_governor",)):
            if setting not in settings or setting == "fan":
                continue
            value = settings[setting]
            where = "host" if target is None else f"GPU {target}"
            try:
                write(machine, target, setting, value)
                done.append(f"{where}: {setting} → {show(value)}")
            except GpudError as err:
                failed.append(f"{where}: {setting}: {err}")
                keep.setdefault(key, {})[setting] = value
    if keep:
        data["originals"] = keep
        try:
            st.save(data)
        except st.StateError as err:
            failed.append(str(err))
    else:
        why = st.clear()
        if why:
            failed.append(why)
    return done, failed


__all__ = ["Change", "Drift", "Outcome", "apply", "plan", "restore", "verify"]
