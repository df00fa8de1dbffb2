"""The registry of settings: every tunable writes, reads back and restores; the state file's format
from before the registry still loads; the daemon's enforcement re-applies a drifted CPU governor."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from tuning_helpers import cli, fingerprint, fresh, write_profile

from gpud.hw.machine import Machine
from gpud.model import GpuInfo, GpuSample
from gpud.profiles import engine
from gpud.profiles import state as st
from gpud.profiles.enforce import BACKOFF_FIRST_S, BACKOFF_MAX_S, HOST_EVERY_S, Enforcer, exported
from gpud.profiles.profile import load
from gpud.profiles.settings import (
    BY_KEY,
    GOVERNOR,
    GPU_SETTINGS,
    HOST,
    KEYS,
    REGISTRY,
    UNKNOWN,
    At,
    Checked,
    Gpu,
    setting_for,
    target_at,
    target_keyed,
)

# Per setting: a value an RTX A6000 takes that differs from the simulated workstation's own, and
# what a profile asks for to see it (``Setting.check``).
Value = tuple[Any, Any]
VALUES: dict[str, Any] = {
    "persistence_mode": lambda g, s: (not s.persistence_mode, not s.persistence_mode),
    "compute_mode": lambda g, s: ("exclusive_process", "exclusive_process"),
    "power_limit_watts": lambda g, s: (g.power_min_limit_watts, g.power_min_limit_watts),
    "applications_clocks": lambda g, s: ([g.max_clocks_mhz["memory"], g.max_clocks_mhz["graphics"]],) * 2,
    "gpu_clocks": lambda g, s: ([1500, 1800], [1500, 1800]),
    "memory_clocks": lambda g, s: ([g.max_clocks_mhz["memory"]] * 2,) * 2,
    "gpu_clock_offset": lambda g, s: (120, 120),
    "memory_clock_offset": lambda g, s: (-300, -300),
    "fan": lambda g, s: ("auto", {"mode": "auto"}),  # apply only ever writes the automatic policy
}


class Clock:
    """The enforcer's monotonic clock, moved by hand (no sleeps)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _value(key: str, g: GpuInfo, s: GpuSample) -> Value:
    v: Value = VALUES[key](g, s)
    return v


def test_the_registry_is_one_ordered_list_with_a_round_trip_for_each() -> None:
    assert KEYS == ("persistence_mode", "compute_mode", "power_limit_watts", "applications_clocks", "gpu_clocks",
                    "memory_clocks", "gpu_clock_offset", "memory_clock_offset", "fan", "cpu_governor")
    assert REGISTRY[0].key == "persistence_mode"  # first: the settings after it need it
    assert set(VALUES) == set(BY_KEY)  # a new setting needs its round trip below
    assert {s.key for s in GPU_SETTINGS if s.needs_persistence} == {"compute_mode", "power_limit_watts",
                                                                     "applications_clocks", "gpu_clock_offset",
                                                                     "memory_clock_offset"}
    assert [s.key for s in GPU_SETTINGS if not s.verifiable] == ["gpu_clocks", "memory_clocks"]
    assert BY_KEY["power_limit_watts"].profile_key == "power_limit"  # the one rename, said once


@pytest.mark.parametrize("undo", [False, True], ids=["restore", "rollback"])
@pytest.mark.parametrize("key", list(VALUES))
def test_each_setting_writes_reads_back_and_goes_back(key: str, undo: bool, state_dir) -> None:
    m = fresh()
    before = fingerprint(m)
    setting = BY_KEY[key]
    if key == "fan":
        m.nvml.set_fan_speed(1, 0, 80)  # manual, as a daemon driving a curve leaves it
    g, s = m.info(1), m.snapshot().samples[1]
    assert g is not None
    raw, raw_asked = _value(key, g, s)
    value, asked = setting.from_json(raw), setting.from_json(raw_asked)  # typed, as the engine hands them over
    at = At(m, Gpu(1), g, s)
    current = setting.read(at)
    assert not setting.unsupported(at, value, current)
    assert setting.check(at, asked, daemon=False).status in ("drift", "unverifiable")  # it differs now

    got = setting.write(m, Gpu(1), value)
    assert setting.read_back_ok(value, got)
    after = At(m, Gpu(1), g, m.snapshot().samples[1])
    if setting.verifiable:
        assert setting.check(after, asked, daemon=False).status == "ok"
        if key != "fan":
            assert setting.same(setting.read(after), value) and setting.same(got, value)
    else:  # no getter: what gpud set is what it records and shows; the hardware holds it
        assert got is None and setting.read(after) == UNKNOWN and setting.read(after, value) == value
        held = m.simulation.machine.settings(1)["locked_gpu" if key == "gpu_clocks" else "locked_mem"]
        assert list(held) == raw
    # the JSON form the state file and plans carry reads back as the same value
    assert setting.from_json(json.loads(json.dumps(setting.to_json(value)))) == value
    assert fingerprint(fresh()) != before or key == "fan" and fingerprint(m) == before

    back = setting.undo(current) if undo else setting.original(current)  # the state file's form
    json.dumps(back)
    setting.write(m, Gpu(1), setting.from_json(back))
    assert fingerprint(fresh()) == before


@pytest.mark.parametrize("undo", [False, True], ids=["restore", "rollback"])
def test_the_cpu_governor_writes_reads_back_and_goes_back(undo: bool, state_dir) -> None:
    m = fresh()
    before = fingerprint(m)
    host = At(m, HOST)
    now = GOVERNOR.read(host)
    other = sorted(m.host.cpu_governors_available() - set(now.values()))[0]
    planned = GOVERNOR.plan(host, other, None, daemon=False)
    assert planned.action == "set"
    got = GOVERNOR.write(m, HOST, other)
    assert GOVERNOR.read_back_ok(other, got) and GOVERNOR.same(GOVERNOR.read(host), other)
    assert GOVERNOR.check(host, other, False).status == "ok"
    assert GOVERNOR.plan(host, other, None, False).action == "none"
    back = planned.original if not undo else planned.undo  # restore and rollback both write each CPU's own back
    assert back == {str(cpu): gov for cpu, gov in now.items()}
    GOVERNOR.write(m, HOST, GOVERNOR.from_json(back))
    assert fingerprint(fresh()) == before and GOVERNOR.read(host) == now


# What gpud wrote before the registry (``sort_keys``, ``indent=1``): a profile with a power limit,
# persistence, locked clocks and a governor, applied to GPU 0 of the simulated workstation.
OLD_STATE = {
    "applied_at": 1767225601.5, "chain": ["p"],
    "desired": {"0": {"gpu_clocks": [1500, 2000], "persistence_mode": True, "power_limit_watts": 250.0},
                "host": {"cpu_governor": "powersave"}},
    "originals": {"0": {"gpu_clocks": "reset", "power_limit_watts": 300.0},
                  "host": {"cpu_governor": {"0": "performance", "1": "performance"}}},
    "pending": False, "profile": "p", "source": "/etc/gpud/profiles/p.toml", "started_at": 1767225600.25,
    "target": "simulated workstation z8-fury-4x-a6000", "version": 1,
}


def test_a_state_file_written_before_the_registry_still_loads_verifies_and_restores(state_dir) -> None:
    st.path().parent.mkdir(parents=True, exist_ok=True)
    st.path().write_text(json.dumps(OLD_STATE, indent=1, sort_keys=True))
    data = st.read()
    assert data is not None and data.profile == "p" and data.chain == ("p",) and not data.pending
    assert data.gpu_desired() == {0: OLD_STATE["desired"]["0"]} == st.profile_settings(data)
    assert data.to_json() == OLD_STATE  # written back the same
    st.save(data)
    assert json.loads(st.path().read_text()) == OLD_STATE

    m = fresh()
    m.nvml.set_power_limit(0, 250)
    m.nvml.set_locked_gpu_clocks(0, 1500, 2000)
    m.host.set_cpu_governor("powersave")
    _, drifts = engine.verify(m)
    assert {(d.gpu, d.setting): d.status for d in drifts} == {
        (0, "persistence_mode"): "ok", (0, "power_limit_watts"): "ok", (0, "gpu_clocks"): "unverifiable",
        (None, "cpu_governor"): "ok"}
    done, failed = engine.restore(m)
    assert not failed and "GPU 0: power_limit_watts → 300 W" in done and "GPU 0: gpu_clocks → reset" in done
    assert m.snapshot().samples[0].power_management_limit_watts == 300.0
    govs = m.host.cpu_governors()  # the CPUs the file names are back; the others were not gpud's
    assert (govs[0], govs[1]) == ("performance", "performance") and st.read() is None


def test_a_state_file_without_target_or_applied_at_loads(state_dir) -> None:
    older = {k: v for k, v in OLD_STATE.items() if k not in ("target", "applied_at")} | {"pending": True}
    st.path().parent.mkdir(parents=True, exist_ok=True)
    st.path().write_text(json.dumps(older))
    data = st.read()
    assert data is not None and data.target is None and data.applied_at is None and data.pending
    assert engine.read_state(fresh()) == data  # no target: any machine's
    assert data.to_json() == older


WRONG_TYPES = [("chain", "p", "'chain' is a string, not a list of profile names"),
               ("chain", ["p", 3], "'chain' is a list, not a list of profile names"),
               ("started_at", "yesterday", "'started_at' is a string, not a time (seconds since 1970)"),
               ("applied_at", {"t": 1}, "'applied_at' is a table, not a time (seconds since 1970)"),
               ("applied_at", True, "'applied_at' is a boolean, not a time (seconds since 1970)"),
               ("pending", "false", "'pending' is a string, not true or false"),
               ("profile", ["p"], "'profile' is a list, not a profile name"),
               ("source", 7, "'source' is a number, not a file name"),
               ("target", {}, "'target' is a table, not a machine's name")]


@pytest.mark.parametrize(("key", "value", "reason"), WRONG_TYPES)
def test_a_state_file_with_a_value_of_the_wrong_type_is_a_state_error(state_dir, capsys, key, value, reason) -> None:
    """A hand-edited file is never misread (a string chain is not a chain of its characters): one
    line naming the file, the key and what is wrong."""
    st.path().parent.mkdir(parents=True, exist_ok=True)
    st.path().write_text(json.dumps(OLD_STATE | {key: value}))
    with pytest.raises(st.StateError) as err:
        st.read()
    assert str(err.value).startswith(f"{st.path()}: {reason}: ") and "\n" not in str(err.value)
    assert st.load() is None  # readers that only report: as if unusable
    code, _, stderr = cli(capsys, "verify", "--simulate", "z8-fury-4x-a6000")
    assert code == 1 and f"{st.path()}: {reason}: " in stderr and "Traceback" not in stderr
    for absent in (None, "missing"):  # null or no key: as before
        data = {k: v for k, v in OLD_STATE.items() if k != key} | ({key: None} if absent is None else {})
        st.path().write_text(json.dumps(data))
        assert st.read() is not None


def _enforcing(tmp_path: Path, profile: dict[str, Any]) -> tuple[Machine, Enforcer, Clock, list[tuple[str, str]]]:
    """The profile applied to a fresh simulated machine, and an enforcer following it on a test clock;
    the events it journals are collected."""
    m = fresh()
    p = load(str(write_profile(tmp_path, profile)))
    changes, desired = engine.plan(m, p, daemon=True)
    out = engine.apply(m, p, changes, desired)
    assert out.ok, out.error
    events: list[tuple[str, str]] = []
    clock = Clock()
    enforcer = Enforcer(m, lambda kind, summary, **kw: events.append((kind, summary)), clock)
    enforcer.follow(p.name, engine.unsupported_removed(desired, out), engine.host_unsupported_removed(p.host, out))
    return m, enforcer, clock, events


def test_enforcement_reapplies_a_drifted_cpu_governor(tmp_path: Path, state_dir) -> None:
    m, enforcer, clock, events = _enforcing(tmp_path, {"description": "governor", "all": {"power_limit": 250},
                                                       "host": {"cpu_governor": "powersave"}})
    assert (None, "cpu_governor", False) in enforcer.enforce(m.snapshot()) and enforcer.reapply_total == 0

    m.host.set_cpu_governor("performance", [1])  # one CPU, behind gpud's back
    clock.now += HOST_EVERY_S  # the governors are read again
    drift = enforcer.enforce(m.snapshot())
    assert set(m.host.cpu_governors().values()) == {"powersave"}  # written again
    assert (None, "cpu_governor", False) in drift and not any(d for _, _, d in drift)  # what differs now: nothing
    assert enforcer.reapply_total == 1 and enforcer.reapply_failures_total == 0
    assert events == [("profile_reapply", "host: cpu_governor drifted from profile p: re-applied")]
    assert engine.verify(m)[1] and all(d.status == "ok" for d in engine.verify(m)[1])


def test_a_failed_reapply_is_still_drift_and_counted(tmp_path: Path, state_dir) -> None:
    m = fresh()
    p = load(str(write_profile(tmp_path, {"description": "power", "all": {"power_limit": 250}})))
    changes, desired = engine.plan(m, p, daemon=True)
    out = engine.apply(m, p, changes, desired)
    assert out.ok, out.error
    enforcer = Enforcer(m)
    enforcer.follow(p.name, engine.unsupported_removed(desired, out), p.host)
    m.nvml.set_power_limit(2, 300)
    m.simulation.machine.inject("no_permission", gpu=2, call="nvmlDeviceSetPowerManagementLimit")
    snap = m.snapshot()
    drift = enforcer.enforce(snap)
    assert (2, "power_limit_watts", True) in drift and (1, "power_limit_watts", False) in drift
    assert enforcer.reapply_total == 1 and enforcer.reapply_failures_total == 1
    # the same drift as `gpud verify` and `gpud metrics` see it (the write failed: the reading stands)
    assert drift == exported(engine.verify(m, snapshot=snap)[1])


def _no_cpufreq(m: Machine) -> None:
    """An HGX server whose BIOS keeps the P-states, or a VM: no CPU has a cpufreq directory."""
    for d in m.host.path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq"):
        shutil.rmtree(d)
    assert m.host.cpu_governors() == {}


def test_a_cpu_governor_on_a_host_without_cpufreq_is_unsupported_not_drift(tmp_path: Path, state_dir, caplog) -> None:
    m = fresh()
    _no_cpufreq(m)
    p = load(str(write_profile(tmp_path, {"description": "governor", "all": {"power_limit": 250},
                                          "host": {"cpu_governor": "performance"}})))
    changes, desired = engine.plan(m, p, daemon=True)
    host = [c for c in changes if c.gpu is None]
    assert [(c.setting, c.action, c.note) for c in host] == [("cpu_governor", "skip", "no cpufreq on this host")]
    out = engine.apply(m, p, changes, desired)
    assert out.ok, out.error
    assert st.read().desired["host"] == {"cpu_governor": "unsupported"}  # neither enforced nor verified
    assert engine.host_unsupported_removed(p.host, out) == {"cpu_governor": "unsupported"}
    events: list[tuple[str, str]] = []
    clock = Clock()
    enforcer = Enforcer(m, lambda kind, summary, **kw: events.append((kind, summary)), clock)
    enforcer.follow(p.name, engine.unsupported_removed(desired, out), engine.host_unsupported_removed(p.host, out))
    with caplog.at_level(logging.WARNING, logger="gpud.daemon"):
        for _ in range(3):
            clock.now += HOST_EVERY_S
            drift = enforcer.enforce(m.snapshot())
            assert not any(d for _, _, d in drift) and not any(s == "cpu_governor" for _, s, _ in drift)
    assert enforcer.reapply_total == 0 and enforcer.reapply_failures_total == 0 and events == []
    assert not caplog.records
    _, drifts = engine.verify(m)
    assert drifts and not [d for d in drifts if d.drifted]

    # A state file saying "performance" (written by an older gpud, or cpufreq gone since): skip, not drift.
    assert GOVERNOR.check(At(m, HOST), "performance", False) == Checked(None, "performance", "skip")
    enforcer.follow(p.name, engine.unsupported_removed(desired, out), dict(p.host))
    for _ in range(3):
        clock.now += HOST_EVERY_S
        assert not any(d for _, _, d in enforcer.enforce(m.snapshot()))
    assert enforcer.reapply_total == 0 and enforcer.reapply_failures_total == 0 and events == []


def _failing_power(tmp_path: Path) -> tuple[Machine, Enforcer, Clock, list[tuple[str, str]]]:
    """GPU 2's power limit changed behind gpud's back, and gpud not allowed to write it back."""
    m, enforcer, clock, events = _enforcing(tmp_path, {"description": "power", "all": {"power_limit": 250}})
    m.nvml.set_power_limit(2, 300)
    m.simulation.machine.inject("no_permission", gpu=2, call="nvmlDeviceSetPowerManagementLimit")
    return m, enforcer, clock, events


def test_a_reapply_that_keeps_failing_backs_off(tmp_path: Path, state_dir, caplog) -> None:
    m, enforcer, clock, events = _failing_power(tmp_path)
    attempts = []
    with caplog.at_level(logging.WARNING, logger="gpud.daemon"):
        for _ in range(5):  # five ticks of a second: one attempt
            assert (2, "power_limit_watts", True) in enforcer.enforce(m.snapshot())  # still drift
            clock.now += 1
        attempts.append(enforcer.reapply_failures_total)
        assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]  # when the failure starts
        assert [k for k, _ in events] == ["profile_drift"]
        # then 10 s, 20 s, 40 s … between attempts, up to 10 min
        t0 = clock.now - 5
        delay, at = BACKOFF_FIRST_S, t0
        for _ in range(8):
            at += delay
            clock.now = at - 0.5
            assert (2, "power_limit_watts", True) in enforcer.enforce(m.snapshot())
            attempts.append(enforcer.reapply_failures_total)
            clock.now = at
            assert (2, "power_limit_watts", True) in enforcer.enforce(m.snapshot())
            attempts.append(enforcer.reapply_failures_total)
            delay = min(delay * 2, BACKOFF_MAX_S)
        assert delay == BACKOFF_MAX_S
        assert len(caplog.records) == 2 and len(events) == 1  # the retries are counted, not logged again
    assert attempts == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9]

    # it clears: the next attempt writes it, and says so once
    m.simulation.machine.clear_faults()
    clock.now += BACKOFF_MAX_S
    assert (2, "power_limit_watts", False) in enforcer.enforce(m.snapshot())
    assert m.snapshot().samples[2].power_management_limit_watts == 250
    assert events[1:] == [("profile_reapply", "GPU 2: power_limit_watts re-applied after 9 failure(s) (profile p)")]
    assert enforcer.reapply_failures_total == 9 and not enforcer.failing
    # and a new drift is re-applied at once again
    m.nvml.set_power_limit(2, 300)
    clock.now += 1
    assert (2, "power_limit_watts", False) in enforcer.enforce(m.snapshot())
    assert events[-1] == ("profile_reapply", "GPU 2: power_limit_watts drifted from profile p: re-applied")


def test_a_new_profile_ends_the_back_off(tmp_path: Path, state_dir) -> None:
    m, enforcer, clock, events = _failing_power(tmp_path)
    enforcer.enforce(m.snapshot())
    assert enforcer.reapply_failures_total == 1
    clock.now += 1
    enforcer.enforce(m.snapshot())
    assert enforcer.reapply_failures_total == 1  # backing off
    assert enforcer.state is not None
    enforcer.follow("q", {int(k): dict(v) for k, v in enforcer.state.desired.items() if k.isdigit()})
    enforcer.enforce(m.snapshot())
    assert enforcer.reapply_failures_total == 2 and [k for k, _ in events] == ["profile_drift", "profile_drift"]


def test_the_enforcer_reads_the_cpu_governors_at_most_every_10_s(tmp_path: Path, state_dir, monkeypatch) -> None:
    m = fresh()
    p = load(str(write_profile(tmp_path, {"description": "governor", "host": {"cpu_governor": "powersave"}})))
    changes, desired = engine.plan(m, p, daemon=True)
    assert engine.apply(m, p, changes, desired).ok
    clock = Clock()
    enforcer = Enforcer(m, clock=clock)
    enforcer.follow(p.name, engine.unsupported_removed(desired, engine.Outcome(changes)), p.host)
    reads = []
    real = m.host.cpu_governors
    monkeypatch.setattr(m.host, "cpu_governors", lambda: reads.append(clock.now) or real())
    for _ in range(11):  # ticks of a second
        assert (None, "cpu_governor", False) in enforcer.enforce(m.snapshot())
        clock.now += 1
    assert reads == [1000.0, 1010.0]
    m.host.set_cpu_governor("performance", [0])  # seen at the next reading, and written back
    clock.now += HOST_EVERY_S
    assert (None, "cpu_governor", False) in enforcer.enforce(m.snapshot())
    assert set(real().values()) == {"powersave"} and enforcer.reapply_total == 1


def test_the_daemon_does_not_enforce_a_cpu_governor_this_host_cannot_take(tmp_path: Path, state_dir) -> None:
    from gpud import config as cfg
    from gpud.daemon.service import Daemon

    m = fresh()
    _no_cpufreq(m)
    profile = write_profile(tmp_path, {"description": "governor", "all": {"power_limit": 250},
                                       "host": {"cpu_governor": "performance"}})
    d = Daemon(m, cfg.Config())
    d.schedule.checks_at = 2e9
    reply = d.apply(str(profile))
    assert reply["ok"], reply
    assert d.enforcer.state is not None and d.enforcer.state.desired["host"] == {"cpu_governor": "unsupported"}
    for _ in range(3):
        d.tick()
    assert d.enforcer.reapply_total == 0 and d.enforcer.reapply_failures_total == 0


def test_a_target_is_named_once_for_the_state_file_the_plan_and_people() -> None:
    """A GPU or the host: the state file's key, the plan's ``gpu`` (None for the host) and "GPU 3" / "host"
    come from one place, and a state file's sections read back keyed by target, GPUs in index order first."""
    assert [target_keyed(k) for k in ("3", "host", "fans")] == [Gpu(3), HOST, None]
    assert target_at(None) is HOST and target_at(10) == Gpu(10) and Gpu(10).key == "10"
    assert (Gpu(3).where, HOST.where, Gpu(3).gpu, HOST.gpu) == ("GPU 3", "host", 3, None)
    section = {"host": {"cpu_governor": "performance"}, "10": {"power_limit": 250.0}, "2": {"power_limit": 200.0}}
    assert list(st.by_target(section)) == [Gpu(2), Gpu(10), HOST]  # by index, not as text ("10" < "2")
    assert engine.keyed({2: {"power_limit": 200.0, "required": ["power_limit"]}}, {"cpu_governor": "performance"}) \
        == {"2": {"power_limit": 200.0}, "host": {"cpu_governor": "performance"}}
    assert setting_for(HOST, "cpu_governor") is GOVERNOR and setting_for(Gpu(0), "cpu_governor") is None
    assert setting_for(Gpu(0), "power_limit_watts") is BY_KEY["power_limit_watts"]


def test_a_setting_a_plan_skipped_plans_again_as_unsupported(state_dir) -> None:
    """Locked memory clocks need Ampere: on Turing the plan skips them and the state file records them
    "unsupported". The next plan reads that record as what gpud set (no getter), and does not fail on it."""
    m = fresh("z8-g4-2x-rtx8000-sli")
    p = load("max-performance")
    changes, desired = engine.plan(m, p)
    skipped = [c for c in changes if c.setting == "memory_clocks"]
    assert skipped and all(c.action == "skip" and "Ampere" in c.note for c in skipped)
    assert engine.apply(m, p, changes, desired).ok
    assert st.read().desired["0"]["memory_clocks"] == "unsupported"
    again, _ = engine.plan(m, p)
    assert [c.action for c in again if c.setting == "memory_clocks"] == ["skip"] * len(skipped)


def test_clocks_read_back_are_shown_as_the_state_file_lists_them() -> None:
    from gpud.profiles.settings import AppClocks, ClockRange, shown

    assert shown("applications_clocks", AppClocks(7901, 2100)) == shown("applications_clocks", [7901, 2100]) \
        == "7901,2100"
    assert shown("gpu_clocks", ClockRange(1500, 1800)) == "1500,1800"


def test_an_empty_cpu_governor_is_bad_input(tmp_path: Path, state_dir, capsys) -> None:
    f = write_profile(tmp_path, {"host": {"cpu_governor": ""}})
    code, _, err = cli(capsys, "apply", str(f), "--simulate", "z8-fury-4x-a6000")
    assert code == 2 and "host.cpu_governor" in err and "must name a CPU governor" in err, err
