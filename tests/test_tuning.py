"""Tuning: apply → verify → drift → restore, rollback at every write, crash recovery, validation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SHIPPED
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from tuning_helpers import RICH, cli, fingerprint, fresh, write_profile

from gpud.backends import open_machine
from gpud.errors import InvalidInput
from gpud.profiles import engine
from gpud.profiles import state as st
from gpud.profiles.profile import available, load, resolve

SIM = "z8-fury-4x-a6000"


def test_shipped_profiles_load_and_resolve_on_every_shipped_workstation() -> None:
    names = {n for n, _ in available()}
    assert {"balanced", "quiet", "max-performance", "training", "z8-fury-4x-a6000-example"} <= names
    assert load("training").chain == ("training", "max-performance")
    for desc in SHIPPED:
        gpus = list(open_machine(desc).snapshot().gpus)
        for name in names - {"z8-fury-4x-a6000-example"}:
            resolved = resolve(load(name), gpus)
            assert set(resolved) == {g.index for g in gpus}
    example = resolve(load("z8-fury-4x-a6000-example"), list(fresh().snapshot().gpus))
    assert [example[i]["power_limit_watts"] for i in range(4)] == [280, 280, 300, 300]
    assert example[0]["fan"]["points"][-1] == [68, 100]
    q = resolve(load("quiet"), list(fresh().snapshot().gpus))
    assert q[0]["power_limit_watts"] == 240 and q[0]["gpu_clocks"] == "reset"


def test_apply_verify_drift_restore(capsys, state_dir) -> None:
    before = fingerprint(fresh())
    code, out, _ = cli(capsys, "apply", "max-performance", "--simulate", SIM)
    assert code == 0 and "applied max-performance" in out
    assert "Fan curves need the gpud daemon" in out
    m = fresh()
    assert all(m.simulation.machine.settings(i)["locked_gpu"] == [2100, 2100] for i in range(4))
    code, out, _ = cli(capsys, "verify", "--simulate", SIM, "--json")
    data = json.loads(out)
    assert code == 0 and data["drift"] == 0 and data["profile"] == "max-performance"
    assert {s["status"] for s in data["settings"]} == {"ok", "unverifiable", "daemon"}
    fresh().nvml.set_persistence_mode(2, False)  # behind gpud's back
    code, out, _ = cli(capsys, "verify", "--simulate", SIM, "--json")
    drift = [s for s in json.loads(out)["settings"] if s["status"] == "drift"]
    assert code == 1 and drift == [{"gpu": 2, "setting": "persistence_mode", "current": False, "desired": True,
                                    "status": "drift"}]
    code, out, _ = cli(capsys, "restore", "--simulate", SIM)
    assert code == 0 and "restored GPU 0: gpu_clocks → reset" in out
    after = fingerprint(fresh())
    after["2"]["persistence"] = before["2"]["persistence"]  # the drift was not gpud's: restore leaves it
    assert after == before
    assert st.load() is None
    code, out, _ = cli(capsys, "restore", "--simulate", SIM)
    assert code == 0 and out == "nothing to restore\n"


def test_power_drift_is_reported_and_restore_brings_originals(capsys, tmp_path, state_dir) -> None:
    before = fingerprint(fresh())
    p = write_profile(tmp_path, RICH)
    code, _, err = cli(capsys, "apply", str(p), "--simulate", SIM)
    assert code == 0, err
    m = fresh()
    assert fingerprint(m)["1"]["power"] == 250 and m.host.cpu_governors()[0] == "powersave"
    m.nvml.set_power_limit(1, 270)
    code, out, _ = cli(capsys, "verify", "--simulate", SIM)
    assert code == 1 and "270 W" in out
    code, _, _ = cli(capsys, "restore", "--simulate", SIM)
    assert code == 0 and fingerprint(fresh()) == before


def test_dry_run_writes_nothing(capsys, tmp_path, state_dir) -> None:
    m = fresh()
    writes = m.simulation.machine.state["writes"]
    code, out, _ = cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--dry-run", "--json", "--simulate", SIM)
    plan = json.loads(out)["plan"]
    assert code == 0 and fresh().simulation.machine.state["writes"] == writes and st.load() is None
    power = next(c for c in plan if c["gpu"] == 0 and c["setting"] == "power_limit_watts")
    assert (power["current"], power["desired"], power["action"]) == (300.0, 250.0, "change")


def _n_writes(tmp_path: Path) -> int:
    """How many hardware writes RICH makes on the healthy Z8 (counted by the simulator)."""
    m = fresh()
    start = m.simulation.machine.state["writes"]
    p = load(str(write_profile(tmp_path, RICH)))
    changes, desired = engine.plan(m, p)
    out = engine.apply(m, p, changes, desired)
    assert out.ok
    n = fresh().simulation.machine.state["writes"] - start
    engine.restore(fresh())
    return n


@pytest.mark.parametrize("fault", ["no_permission", "gpu_lost"])
def test_rollback_at_every_write_position(tmp_path: Path, state_dir, fault: str) -> None:
    n = _n_writes(tmp_path)
    assert n == 5 * 4  # 5 settings × 4 GPUs (persistence is on already; the governor is a host file)
    original = fingerprint(fresh())
    profile = load(str(write_profile(tmp_path, RICH)))
    for k in range(1, n + 1):
        m = fresh()
        sim = m.simulation.machine
        params = {"at_write": sim.state["writes"] + k}
        if fault == "gpu_lost":
            params["gpu"] = (k - 1) // 5
        sim.inject(fault, **params)
        changes, desired = engine.plan(m, profile)
        out = engine.apply(m, profile, changes, desired)
        assert not out.ok and out.error and len(out.written) == k - 1, (k, out.error)
        assert out.not_restored == [], (k, out.not_restored)
        assert len(out.rolled_back) == k - 1
        sim.clear_faults()
        assert fingerprint(fresh()) == original, f"write {k} of {n}"
        assert st.load() is None


def test_rollback_through_the_cli_reports_and_exits_1(capsys, tmp_path, state_dir) -> None:
    m = fresh()
    m.simulation.machine.inject("no_permission", call="nvmlDeviceSetGpuLockedClocks", gpu=3)
    original = fingerprint(fresh())
    code, _, err = cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    assert code == 1
    assert err.startswith("gpud: apply failed: GPU 3: gpu_clocks: GPU 3: nvmlDeviceSetGpuLockedClocks")
    assert "rolled back: GPU 3: applications_clocks → 8001,1800" in err
    assert fingerprint(fresh()) == original


@pytest.mark.parametrize("k", [1, 7, 20])
def test_crash_between_writes_then_restore_in_a_new_process(tmp_path: Path, state_dir, k: int) -> None:
    env = {**os.environ, "GPUD_SIMULATE": SIM}
    m = fresh()
    original = fingerprint(m)
    m.nvml.set_fan_speed(1, 0, 80)  # as a daemon driving a curve would have it when it is killed
    m.simulation.machine.inject("crash", at_write=m.simulation.machine.state["writes"] + k)
    p = write_profile(tmp_path, RICH)
    r = subprocess.run([sys.executable, "-m", "gpud", "apply", str(p)], env=env, capture_output=True, text=True,
                       cwd=REPO)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert st.load().pending is True  # the originals were saved before the first write
    fresh().simulation.machine.clear_faults()
    r = subprocess.run([sys.executable, "-m", "gpud", "restore"], env=env, capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "GPU 1: fan 0 → auto" in r.stdout
    assert fingerprint(fresh()) == original
    assert st.load() is None


def test_restore_fans_only_keeps_the_rest(capsys, tmp_path, state_dir) -> None:
    cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    fresh().nvml.set_fan_speed(0, 0, 90)
    code, out, _ = cli(capsys, "restore", "--fans-only", "--simulate", SIM)
    assert code == 0 and out.splitlines() == [f"restoring simulated workstation {SIM}", "restored GPU 0: fan 0 → auto"]
    fp = fingerprint(fresh())
    assert fp["0"]["fans"] == [("auto", None)] and fp["0"]["power"] == 250
    assert st.load().profile == "p"


def test_required_unsupported_setting_writes_nothing(capsys, tmp_path, state_dir) -> None:
    p = write_profile(tmp_path, {"all": {"gpu_clocks": "max", "required": ["gpu_clocks"]}})
    # Turing supports locked clocks: make the GPU a Pascal one, which does not
    d = tmp_path / "pascal.toml"
    d.write_text('[machine]\nname = "pascal-box"\n[[gpu]]\nmodel = "Quadro RTX 8000"\narchitecture = "pascal"\n'
                 'bus_id = "0000:17:00.0"\nroot_port = "0000:16:01.0"\n')
    code, out, err = cli(capsys, "apply", str(p), "--simulate", str(d))
    assert code == 1 and "required setting gpu_clocks cannot be applied (locked GPU clocks need Volta or newer" in err
    assert open_machine(str(d)).simulation.machine.state["writes"] == 0
    code, out, _ = cli(capsys, "apply", str(write_profile(tmp_path, {"all": {"gpu_clocks": "max"}}, "q.toml")),
                       "--simulate", str(d))
    assert code == 0 and "skip: locked GPU clocks need Volta or newer" in out
    assert open_machine(str(d)).simulation.machine.state["writes"] == 0


def test_passive_card_fan_setting_is_skipped(capsys, tmp_path, state_dir) -> None:
    d = tmp_path / "h200.toml"
    d.write_text('[machine]\nname = "h200"\n[[gpu]]\nmodel = "H200"\nbus_id = "0000:17:00.0"\n'
                 'root_port = "0000:16:01.0"\n')
    code, out, _ = cli(capsys, "apply", "training", "--dry-run", "--simulate", str(d))
    assert code == 0 and "skip: no fan control on this GPU" in out


# -- validation: exit 2, file and key named, nothing written ------------------------------------

BAD = [
    ({"all": {"power_limt": 250}}, "all.power_limt", "unknown key"),
    ({"all": {"power_limit": "lots"}}, "all.power_limit", "must be watts"),
    ({"all": {"power_limit": 900}}, "all.power_limit", "outside GPU 0's limits 100..300 W"),
    ({"all": {"persistence_mode": "yes"}}, "all.persistence_mode", "must be true or false"),
    ({"all": {"fan": {"mode": "curve", "points": [[30, 50], [20, 60]]}}}, "all.fan.points[1]", "not monotonic"),
    ({"all": {"fan": {"mode": "curve", "points": [[30, 60], [50, 40]]}}}, "all.fan.points[1]", "not monotonic"),
    ({"all": {"fan": {"mode": "curve", "points": [[30, 50], [120, 100]]}}}, "all.fan.points[1]", "outside 0..110"),
    ({"all": {"fan": {"mode": "curve", "points": [[30, 50], [80, 130]]}}}, "all.fan.points[1]", "outside 0..100"),
    ({"all": {"fan": {"mode": "fixed", "percent": 20}}}, "all.fan", "below GPU 0's minimum fan speed 30 %"),
    ({"all": {"gpu_clocks": [2000, 1500]}}, "all.gpu_clocks", "[min, max]"),
    ({"all": {"gpu_clocks": [1500, 9000]}}, "all.gpu_clocks", "above GPU 0's maximum 2100 MHz"),
    ({"gpus": [{"select": 7, "power_limit": 250}]}, "gpus[0].select", "matches no GPU"),
    ({"gpus": [{"select": "RTX 9000"}]}, "gpus[0].select", "matches no GPU"),
    ({"extends": "no-such-profile"}, "extends", "no profile named"),
    ({"host": {"cpu_governor": "turbo"}}, "host.cpu_governor", "not available here"),
    ({"all": {"required": ["fan_speed"]}}, "all.required", "unknown setting"),
]


@pytest.mark.parametrize(("data", "key", "reason"), BAD, ids=[b[1] + ":" + b[2][:20] for b in BAD])
def test_bad_profile_is_exit_2_with_file_key_reason(capsys, tmp_path, state_dir, data, key, reason) -> None:
    writes = fresh().simulation.machine.state["writes"]
    p = write_profile(tmp_path, data)
    code, out, err = cli(capsys, "apply", str(p), "--simulate", SIM)
    assert code == 2, (out, err)
    assert err.startswith(f"gpud: error: {p}: {key}: ") and reason in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert fresh().simulation.machine.state["writes"] == writes and st.load() is None


def test_inheritance_cycle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text('extends = "' + str(tmp_path / "b.toml") + '"\n')
    (tmp_path / "b.toml").write_text('extends = "' + str(tmp_path / "a.toml") + '"\n')
    with pytest.raises(InvalidInput) as exc:
        load(str(tmp_path / "a.toml"))
    assert exc.value.key == "extends" and "cycle: a → b → a" in exc.value.reason


def test_unknown_profile_name_lists_the_known_ones(capsys, state_dir) -> None:
    code, _, err = cli(capsys, "apply", "turbo", "--simulate", SIM)
    assert code == 2 and "no such profile" in err and "max-performance" in err


def test_malformed_toml_is_exit_2(capsys, tmp_path, state_dir) -> None:
    p = tmp_path / "x.toml"
    p.write_text("[all\n")
    code, _, err = cli(capsys, "apply", str(p), "--simulate", SIM)
    assert code == 2 and str(p) in err and "not valid TOML" in err


# A valid base profile and one mutation that breaks it: hypothesis picks where and how.
SETTING_KEYS = ["persistence_mode", "compute_mode", "power_limit", "applications_clocks", "gpu_clocks",
                "memory_clocks", "fan", "required"]
junk = hs.one_of(hs.integers(-10**6, 10**6), hs.floats(allow_nan=False, allow_infinity=False), hs.text(max_size=8),
                 hs.booleans(), hs.lists(hs.integers(-500, 500), max_size=3))


@hs.composite
def malformed(draw: hs.DrawFn) -> tuple[dict, str]:
    base = {"description": "x", "all": {"persistence_mode": True, "power_limit": 250,
                                        "fan": {"mode": "curve", "points": [[30, 40], [60, 70], [80, 100]]}}}
    kind = draw(hs.sampled_from(["unknown_top", "unknown_all", "unknown_fan", "type_all", "curve_order",
                                 "curve_temp", "curve_duty", "power_range", "selector", "below_min_fan"]))
    if kind == "unknown_top":
        top = ("description", "extends", "all", "gpus", "host")
        k = draw(hs.text("abcdefghij_", min_size=3, max_size=10).filter(lambda s: s not in top))
        base[k] = draw(junk)
        return base, k
    if kind == "unknown_all":
        k = draw(hs.text("klmnopqrstuvwxyz_", min_size=3, max_size=10).filter(lambda s: s not in SETTING_KEYS))
        base["all"][k] = draw(junk)
        return base, f"all.{k}"
    if kind == "unknown_fan":
        k = draw(hs.text("qrstuvwxyz", min_size=3, max_size=8))
        base["all"]["fan"][k] = draw(junk)
        return base, f"all.fan.{k}"
    if kind == "type_all":
        key = draw(hs.sampled_from(["persistence_mode", "compute_mode", "power_limit", "gpu_clocks"]))
        bad = {"persistence_mode": hs.one_of(hs.integers(), hs.text(max_size=5)),
               "compute_mode": hs.text(max_size=6).filter(lambda s: s not in ("default", "exclusive_process",
                                                                              "prohibited")),
               "power_limit": hs.one_of(hs.booleans(), hs.text("xyz", min_size=1, max_size=4)),
               "gpu_clocks": hs.one_of(hs.integers(), hs.lists(hs.integers(-5, 0), min_size=2, max_size=2))}[key]
        base["all"][key] = draw(bad)
        return base, f"all.{key}"
    pts = base["all"]["fan"]["points"]
    i = draw(hs.integers(0, 2))
    if kind == "curve_order":
        pts[i] = [pts[i][0], pts[i][1]]
        j = (i + 1) % 3
        pts[i], pts[j] = pts[j], pts[i]
        return base, "all.fan.points"
    if kind == "curve_temp":
        pts[i][0] = draw(hs.one_of(hs.integers(111, 10**4), hs.integers(-10**4, -1)))
        return base, "all.fan.points"
    if kind == "curve_duty":
        pts[i][1] = draw(hs.one_of(hs.integers(101, 10**4), hs.integers(-10**4, -1)))
        return base, "all.fan.points"
    if kind == "power_range":
        base["all"]["power_limit"] = draw(hs.one_of(hs.integers(301, 5000), hs.integers(1, 99)))
        return base, "all.power_limit"
    if kind == "selector":
        base["gpus"] = [{"select": draw(hs.integers(4, 64)), "power_limit": 200}]
        return base, "gpus[0].select"
    base["all"]["fan"] = {"mode": "fixed", "percent": draw(hs.integers(0, 29))}
    return base, "all.fan"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=malformed())
def test_malformed_profiles_always_exit_2_never_write(capsys, tmp_path, state_dir, case) -> None:
    data, key = case
    writes = fresh().simulation.machine.state["writes"]
    p = write_profile(tmp_path, data, "fuzz.toml")
    code, out, err = cli(capsys, "apply", str(p), "--simulate", SIM)
    assert code == 2, (data, out, err)
    assert err.startswith(f"gpud: error: {p}: {key}"), (err, key)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert fresh().simulation.machine.state["writes"] == writes and st.load() is None
