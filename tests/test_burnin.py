"""``gpud burnin`` on the simulated workstations: the quick level's verdicts, a 30-minute soak in
simulated time with every listed fault detected, interruption, bad input, and the HTML report in a
real headless browser."""

from __future__ import annotations

import copy
import json
import os
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_gpud

from gpud.backends import SimBench, open_bench, open_machine
from gpud.burnin.result import Result, Verdict
from gpud.burnin.run import SIZES, run_burnin
from gpud.config import Config
from gpud.json_schema import check
from gpud.sim.physics import TEMP_SIGMA_K

# The burn-in's pass/fail is a verdict a person relies on: judged under the simulator's noise and spread in
# several realisations (docs/simulation.md, "Noise and spread"), no false alarm on the healthy machine and
# every fault found on the faulty one in each.
SEEDS = (1, 2, 3)


def _failing(doc: dict[str, Any]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for v in doc["verdicts"]:
        if v["status"] == "fail" and v["gpu"] is not None:
            out.setdefault(v["gpu"], set()).add(v["test"])
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_quick_on_the_healthy_z8_passes_within_two_minutes(state_dir: Path, tmp_path: Path, seed: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    report = tmp_path / "report.html"
    r = run_gpud("burnin", "--simulate", "z8-fury-4x-a6000", "--level", "quick", "--json", "--report", str(report),
                 timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    doc = json.loads(r.stdout)
    assert check(doc) == [] and doc["kind"] == "burnin" and doc["status"] == "pass"
    assert doc["figures"] == "cpu" and doc["simulated_time"] and doc["seconds"] >= 60
    assert [g["status"] for g in doc["gpus"]] == ["pass"] * 4
    tests = {v["test"] for v in doc["verdicts"]}
    assert {"burnin.gemm.bf16.digest", "burnin.clocks.hw_slowdown", "burnin.pcie.link_under_load",
            "burnin.performance.spread", "burnin.errors"} <= tests
    assert all(v["source"] for v in doc["verdicts"] if v["status"] != "skip")
    # what a simulated workstation's CPU cannot measure is said, and nothing else: every counter is read
    assert doc["not_judged"] == ["burnin.probe", "burnin.workload.figures"], doc["not_judged"]
    assert report.read_text().count("<svg") == 4 * 5
    # the last result is kept for doctor --burnin and the exporter, the journal has an entry
    last = json.loads((state_dir / "burnin.json").read_text())
    assert last["status"] == "pass" and last["level"] == "quick"
    ev = run_gpud("events", "--kind", "burnin", "--json")
    assert ev.returncode == 0 and "burn-in quick: pass" in ev.stdout


@pytest.mark.parametrize("seed", SEEDS)
def test_quick_on_the_degraded_z8_fails_naming_its_gpus_and_tests(state_dir: Path, seed: int,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    r = run_gpud("burnin", "--simulate", "z8-fury-4x-a6000-degraded", "--allow-busy", "--json", timeout=120)
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    failing = _failing(doc)
    assert "burnin.clocks.hw_slowdown" in failing[1]  # HW slowdown fault
    assert "burnin.pcie.link_under_load" in failing[2]  # trained to x8
    # stalled fan: SW thermal slowdown holds it at 94 °C, as described, under the stress too
    assert "burnin.thermal.sw_slowdown" in failing[3]
    # GPU0 is held at 200 W (described: a limit someone lowered) while its siblings draw up to 300 W: slower
    # than their median by its setting, which the spread names as a warning; nothing of the burn-in fails on it
    assert not {t for t in failing.get(0, set()) if t.startswith("burnin.")}
    spread0 = next(v for v in doc["verdicts"] if v["test"] == "burnin.performance.spread" and v["gpu"] == 0)
    assert spread0["status"] == "warn" and "power limit 200 W, below its siblings' 300 W" in spread0["summary"]
    # doctor --burnin shows the last result; the exporter exports it
    dr = json.loads(run_gpud("doctor", "--simulate", "z8-fury-4x-a6000-degraded", "--burnin", "--json").stdout)
    mine = {c["gpu"]: c for c in dr["checks"] if c["id"] == "burnin.gpu"}
    assert {g for g, c in mine.items() if c["status"] == "fail"} == set(failing)
    assert "burnin.pcie.link_under_load" in mine[2]["summary"]
    assert next(c for c in dr["checks"] if c["id"] == "burnin.last")["status"] == "fail"
    metrics = run_gpud("metrics", "--simulate", "z8-fury-4x-a6000-degraded").stdout
    assert 'gpud_burnin_success{level="quick"} 0.0' in metrics
    assert any(line.startswith('gpud_burnin_gpu_passed{gpu="2"') and line.endswith(" 0.0")
               for line in metrics.splitlines())
    text = run_gpud("burnin", "--simulate", "z8-fury-4x-a6000-degraded", timeout=120)
    assert text.returncode == 1
    assert "burnin.idle" in text.stdout and "--allow-busy" in text.stdout  # busy GPUs refused without it


@pytest.fixture(scope="module", params=SEEDS)
def soak(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> tuple[Result, dict[str, Any]]:
    """One 30-minute soak (simulated time) on the Z8 with a fault on each of GPUs 1–3: GPU1's fan
    stalled; GPU2 in power brake and trained to x8; GPU3 slower (a 200 W limit), computing wrong
    results and with memory errors. GPU0 stays healthy."""
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUD_STATE_DIR", str(tmp_path_factory.mktemp("soak")))
    mp.setenv("GPUD_SIM_SEED", str(request.param))
    try:
        m = open_machine("z8-fury-4x-a6000")
        sim = m.simulation.machine
        sim.inject("fan_stuck", gpu=1)
        sim.inject("clock_events", gpu=2, reasons=["hw_power_brake_slowdown"])
        sim.inject("link_degraded", gpu=2, width=8)
        sim.inject("wrong_results", gpu=3)
        sim.inject("memory_errors", gpu=3)
        sim.inject("wrong_results", gpu=1, above_celsius=75)  # the stalled fan's GPU errs once hot
        m.nvml.set_power_limit(3, 200)
        res = run_burnin(m, open_bench(m, "cpu"), Config(), level="soak", gpus=None, device="cpu",
                         duration_s=1800.0)
        loads = [sim.settings(g)["load"] for g in range(4)]
        doc = res.json("test", {"name": "z8"})
        return res, {"doc": doc, "loads_after": loads}
    finally:
        mp.undo()


def test_a_30_minute_soak_runs_in_simulated_time(soak: tuple[Result, dict[str, Any]]) -> None:
    res, got = soak
    assert res.seconds >= 1800 and res.simulated_time  # its wall time is the machine's: not judged here
    assert len(res.series[0].of("soak")) >= 1800  # telemetry every second
    assert got["loads_after"] == [None] * 4  # the load put back
    v = {(x.test, x.gpu): x for x in res.verdicts}
    assert v[("burnin.thermal.settle", 0)].status == "pass"  # settles at the driver's target (84 °C)
    assert v[("burnin.clocks.stability", 0)].status == "pass"
    assert v[("burnin.memtest", 0)].status == "pass"
    assert "fp32, tf32 and bf16 products" in v[("burnin.gemm.load", 0)].summary
    assert not [x for x in res.verdicts if x.gpu == 0 and x.status == "fail"]


def test_the_soak_detects_each_fault(soak: tuple[Result, dict[str, Any]]) -> None:
    failing = _failing(soak[1]["doc"])
    assert {"burnin.thermal.settle", "burnin.thermal.sw_slowdown"} <= failing[1]  # stalled fan
    assert "burnin.clocks.hw_slowdown" in failing[2]  # power brake
    assert "burnin.pcie.link_under_load" in failing[2]  # an x8 link
    # slower than its siblings, by its 200 W limit (theirs 300 W): named as its setting, a warning
    spread3 = next(x for x in soak[0].verdicts if x.test == "burnin.performance.spread" and x.gpu == 3)
    assert spread3.status == "warn" and "power limit 200 W" in spread3.summary, spread3
    assert {"burnin.gemm.fp32.digest", "burnin.gemm.fp32.reference"} <= failing[3]  # wrong results
    assert "burnin.memtest" in failing[3]  # memory errors
    mem = next(x for x in soak[0].verdicts if x.test == "burnin.memtest" and x.gpu == 3)
    assert "walking zeros" in mem.summary and "bit fade" in mem.summary and "over 10 min" in mem.summary
    weak = SIZES["cpu"]["memtest_mib"] * 2**20 * 5 // 8  # the stand-in's weak cell: 5/8 into its block
    assert f"at byte offset(s) {int(weak):#x} (1 word(s))" in mem.summary  # located
    assert len(soak[0].series[3].of("memtest")) == 600  # DCGM memtest's 600 s, in simulated time, read each second
    # wrong only from 75 °C: the load's checked products name the temperature their errors began at
    hot = next(x for x in soak[0].verdicts if x.test == "burnin.gemm.load" and x.gpu == 1)
    began = next(c for c in soak[0].series[1].checks if c.wrong).temperature_c
    # as NVML's sensor reads it: whole degrees, scattered by TEMP_SIGMA_K, so a GPU at 75 °C may read 74
    # (and reads lower only past 5 σ)
    lowest = int(75 - 5 * TEMP_SIGMA_K + 0.5)
    assert hot.status == "fail" and began is not None and began >= lowest and hot.remedy and hot.figure
    assert f"the first at {began} °C" in hot.summary and "a minute" in hot.summary
    # wrong from the first product on: the same wrong bits each time, which only the siblings show
    assert "burnin.gemm.load.siblings" in failing[3] and "burnin.gemm.load" not in failing[3]
    brake = next(x for x in soak[0].verdicts if x.test == "burnin.clocks.hw_slowdown" and x.gpu == 2)
    assert "hw_power_brake_slowdown" in brake.summary and brake.source and brake.remedy



def test_without_a_curve_the_gpu_is_held_to_the_drivers_target(soak: tuple[Result, dict[str, Any]]) -> None:
    """No profile applied: the automatic fan policy holds a loaded RTX A6000 at its "GPU Target Temperature"
    (84 °C, NVML's acoustic threshold); the stalled fan (GPU1) leaves it far above, with the figures."""
    res = soak[0]
    v = {(x.test, x.gpu): x for x in res.verdicts}
    healthy, stalled = v[("burnin.thermal.target", 0)], v[("burnin.thermal.target", 1)]
    assert healthy.status == "pass" and healthy.threshold == 86 and healthy.figure is not None
    assert abs(healthy.figure - 84) <= 2 and "the driver's target 84 °C" in healthy.summary
    assert stalled.status == "fail" and stalled.figure is not None and stalled.figure > 86
    assert "fan at 100 %" in stalled.summary and stalled.remedy and "ACOUSTIC_CURR" in stalled.source
    assert res.limits[0]["target_c"] == 84 and not res.fan_curves


HOLDS = {"mode": "curve", "points": [[40, 40], [70, 70], [90, 100]], "hysteresis": 3}
TOO_WEAK = {"mode": "curve", "points": [[40, 30], [90, 50]], "hysteresis": 3}
TRAINING = {"mode": "curve", "points": [[30, 50], [45, 65], [60, 85], [70, 100]], "hysteresis": 3}


@pytest.fixture(scope="module", params=SEEDS)
def curve_soak(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Result:
    """A 15-minute soak (simulated time) on the Z8 with a profile's fan curves applied (the tuning state)
    and driven each simulated second by the daemon's fan control: GPU0 a curve that holds the load, GPU1
    the same curve with its fan stalled, GPU2 a curve capped at 50 %, GPU3 the `training` profile's
    curve (100 % from 70 °C)."""
    from gpud.profiles import state as tuning_state
    from gpud.profiles.fanloop import FanControl

    mp = pytest.MonkeyPatch()
    mp.setenv("GPUD_STATE_DIR", str(tmp_path_factory.mktemp("curve")))
    mp.setenv("GPUD_SIM_SEED", str(request.param))
    try:
        m = open_machine("z8-fury-4x-a6000")
        m.simulation.machine.inject("fan_stuck", gpu=1)
        desired = {"0": {"fan": HOLDS}, "1": {"fan": HOLDS}, "2": {"fan": TOO_WEAK}, "3": {"fan": TRAINING}}
        tuning_state.save(tuning_state.TuningState(profile="test", desired=desired))
        fans = FanControl.from_profile(m, tuning_state.profile_settings(tuning_state.load()))
        bench = open_bench(m, "cpu")
        sleep = bench.sleep

        def tick(seconds: float) -> None:  # the daemon's tick, once a simulated second
            sleep(seconds)
            fans.step([m.nvml.telemetry(g) for g in range(4)], bench.now())

        bench.sleep = tick  # type: ignore[method-assign]
        # no memory test (memtest_s 0): what this judges is the cooling, and the daemon's ticks cost time
        return run_burnin(m, bench, Config(), level="soak", gpus=None, device="cpu", duration_s=900.0,
                          memtest_s=0.0)
    finally:
        mp.undo()


def test_under_a_fan_curve_a_healthy_gpu_settles_at_the_curves_promise(curve_soak: Result) -> None:
    from gpud.burnin.html import render

    v = {(x.test, x.gpu): x for x in curve_soak.verdicts}
    held = v[("burnin.thermal.curve", 0)]
    assert curve_soak.fan_curves[0]["points"] == HOLDS["points"]  # read from the applied profile
    assert held.status == "pass" and held.figure is not None and held.threshold is not None
    # at its promise within 2 °C, or below it by up to the curve's hysteresis (3 °C) more: the flickering
    # reading's peaks set the duty, which the hysteresis holds
    assert -2 - HOLDS["hysteresis"] <= held.figure - held.threshold <= 2 and 80 <= held.threshold <= 90
    assert "the curve asks" in held.summary and "its promise under this load" in held.summary
    assert ("burnin.thermal.target", 0) not in v  # the curve, not the driver's target
    assert curve_soak.limits[0]["curve_promise_c"] == held.threshold
    # the training curve is at 100 % from 70 °C: its equilibrium is where 100 % holds the load
    spent = v[("burnin.thermal.curve", 3)]
    assert spent.status == "pass" and "maximum holds" in spent.summary
    doc = curve_soak.json("test", {"name": "z8"}, telemetry=False)
    assert "fan curve&#x27;s promise" in render(curve_soak, doc) or "fan curve's promise" in render(curve_soak, doc)


def test_a_fan_curve_too_weak_for_the_load_fails_and_says_so(curve_soak: Result) -> None:
    weak = next(x for x in curve_soak.verdicts if x.test == "burnin.thermal.curve" and x.gpu == 2)
    assert weak.status == "fail" and "too weak for this load" in weak.summary and "50 %" in weak.summary
    assert weak.figure is not None and weak.threshold == 90 and weak.figure > weak.threshold + 2
    assert "sw_thermal_slowdown" in weak.summary and weak.remedy


def test_a_stalled_fan_under_a_fan_curve_fails(curve_soak: Result) -> None:
    stalled = next(x for x in curve_soak.verdicts if x.test == "burnin.thermal.curve" and x.gpu == 1)
    assert stalled.status == "fail" and "does not turn" in stalled.summary and "100 %" in stalled.summary
    assert stalled.figure is not None and stalled.threshold is not None and stalled.figure > stalled.threshold + 2


def test_ctrl_c_stops_cleanly_and_puts_the_load_back(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud.burnin import run as burnin_run

    m = open_machine("z8-fury-4x-a6000")
    bench = open_bench(m, "cpu")
    monkeypatch.setattr(burnin_run, "_workload", lambda *a, **k: {})  # the kernels are not what is tested here
    calls = {"n": 0}
    real_sleep = bench.sleep

    def sleep(seconds: float) -> None:
        calls["n"] += 1
        if calls["n"] == 30:
            raise KeyboardInterrupt
        real_sleep(seconds)

    monkeypatch.setattr(bench, "sleep", sleep)
    res = run_burnin(m, bench, Config(), level="standard", gpus=[0, 1], device="cpu")
    assert res.interrupted and res.status == "fail" and 25 <= res.seconds <= 35
    sim = open_machine("z8-fury-4x-a6000").simulation.machine  # what another process sees
    assert [sim.settings(g)["load"] for g in range(4)] == [None] * 4


@pytest.mark.parametrize("args, message", [
    (["--level", "hot"], "--level"),
    (["--memtest-minutes", "5"], "--memtest-minutes"), (["--level", "soak", "--duration", "10m"], "--duration"),
    (["--duration", "30m"], "only the soak"), (["--gpus", "0,9"], "--gpus"), (["--device", "tpu"], "--device"),
    (["--report", "/nonexistent/dir/r.html"], "--report")])
def test_bad_input_is_one_line_exit_2_and_nothing_written(args: list[str], message: str, state_dir: Path) -> None:
    r = run_gpud("burnin", "--simulate", "z8-fury-4x-a6000", *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (state_dir / "burnin.json").exists()


def test_the_memory_test_runs_every_pattern_for_its_time_and_locates_a_weak_cell(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel itself (the same function on a GPU): 64-bit words, passes repeated until the time is up,
    a bit-fade pass that waits, every pattern finding a cell that does not hold bit 0, located."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from gpud.probe import stress

    clean = stress.memtest(torch.device("cpu"), 1, seconds=0.0)
    assert clean["total_errors"] == 0 and clean["passes"] == 1 and clean["ranges"] == []
    assert set(clean["errors"]) == set(stress.MEMTEST_PATTERNS)
    # Its clock, not the machine's load, decides how many passes fit: each reading of it one second on, so
    # a pass lasts a second and 5 s leave room for exactly two (a third would end past the budget).
    ticks = iter(range(10_000))
    monkeypatch.setattr(stress, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks)), sleep=time.sleep))
    stress._FAULTS["now"] = ["memory_errors"]
    try:
        bad = stress.memtest(torch.device("cpu"), 1, seconds=5 + 2 * 0.1, fade_s=0.1, seed=7)
        assert bad["passes"] == 2  # passes until the time is up, none begun that would end after it
    finally:
        stress._FAULTS["now"] = []
    assert all(bad["errors"][k] for k in stress.MEMTEST_PATTERNS)  # each pattern finds the stuck bit
    weak = (2**17 * 5) // 8 * 8
    assert bad["ranges"] == [[weak, weak, 1]] and bad["word_bits"] == 64


# -- the HTML report in a real browser -----------------------------------------------------------

def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Rows of RGB(A) bytes of an 8-bit PNG (what Chromium writes), filters undone."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    h = channels = 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8
            channels = {2: 3, 6: 4}[colour]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, channels, rows


# In the browser once, on the first realisation: what it checks (a self-contained page, its charts drawn) is the
# report's rendering, the same code for every seed; the verdicts it shows are judged on each seed above.
@pytest.mark.parametrize("soak", SEEDS[:1], indirect=True)
def test_the_html_report_renders_in_a_headless_browser(soak: tuple[Result, dict[str, Any]], tmp_path: Path) -> None:
    from gpud.burnin.html import write_report

    browser = _chromium()
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed (.ci/run installs Debian's chromium)")
        pytest.skip("chromium is not installed: apt-get install chromium")
    res, got = soak
    report = tmp_path / "burnin.html"
    write_report(report, res, got["doc"])
    html = report.read_text()
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html
    assert "<script" not in html and html.count("<svg") == 4 * 5
    profile = tmp_path / "profile"
    profile.mkdir()
    shot = tmp_path / "shot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]
    r = subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=900,2400",
                        f"file://{report}"], capture_output=True, text=True, timeout=90)
    assert shot.is_file(), r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    dom = subprocess.run([browser, *flags, "--dump-dom", f"file://{report}"], capture_output=True, text=True,
                         timeout=90)
    assert dom.stdout.count("<svg") == 20 and "polyline" in dom.stdout and "GPU1" in dom.stdout
    # A screenshot is not blank: the report of the healthy GPU alone (every test passed, so its charts
    # come after the verdicts and the figures) shows the charts' lines in their colours.
    one = copy.copy(res)
    one.gpus = [0]
    one_doc = {**got["doc"], "gpus": got["doc"]["gpus"][:1],
               "verdicts": [v for v in got["doc"]["verdicts"] if v["gpu"] == 0]}
    write_report(report, one, one_doc)
    subprocess.run([browser, *flags, f"--screenshot={shot}", "--window-size=900,2000", f"file://{report}"],
                   capture_output=True, text=True, timeout=90)
    w, ch, rows = _png_pixels(shot)
    colours = {row[i:i + 3] for row in rows[::2] for i in range(0, w * ch, ch)}

    def shown(hex_colour: str) -> bool:
        r, g, b = (int(hex_colour[k:k + 2], 16) for k in (1, 3, 5))
        return any(abs(c[0] - r) < 20 and abs(c[1] - g) < 20 and abs(c[2] - b) < 20 for c in colours)

    lines = ["#cf222e", "#1a7f37", "#0969da", "#8250df"]  # temperature, fan, SM clock, power
    assert all(shown(c) for c in lines), [c for c in lines if not shown(c)]


def test_the_reports_charts_share_one_time_axis_and_no_label_covers_another(
        soak: tuple[Result, dict[str, Any]]) -> None:
    """Every chart (the clock-event strip too) has the same plot margins and its own time axis; the phases are
    bands, the soak's settle band is drawn, the siblings of the model are overlaid; the threshold labels sit
    apart in the right margin, and no label runs past the chart's edge (the last tick included)."""
    import re

    from gpud.burnin import html

    res, got = soak
    page = html.render(res, got["doc"])
    svgs = re.findall(r"<svg .*?</svg>", page, flags=re.S)
    assert len(svgs) == 4 * 5
    for svg in svgs:
        width = float(re.search(r'width="(\d+)"', svg).group(1))
        assert re.search(rf'<line x1="{html.PAD_L}" y1="[\d.]+" x2="{html.PLOT_W + html.PAD_L}"', svg)  # one axis
        assert " min</text>" in svg  # a time axis in every chart, the clock-event strip included
        for attrs, text in re.findall(r"<text ([^>]*)>([^<]*)", svg):
            x = float(re.search(r'x="([\d.]+)"', attrs).group(1))
            found = re.search(r'text-anchor="(\w+)"', attrs)
            anchor = found.group(1) if found else "start"
            span = len(text) * html.CHAR_W
            left = {"end": x - span, "middle": x - span / 2}.get(anchor, x)
            assert 0 <= left and left + span <= width + 1, (text, x, anchor)
    gpu0 = svgs[:5]
    assert all(html.PHASES["memtest"][1] in s and html.PHASES["soak"][1] in s for s in gpu0)  # phase bands
    assert all(s.count(f'stroke="{html.SIBLING}"') == 3 for s in gpu0[:4])  # its three siblings overlaid
    assert 'fill-opacity="0.12"' in gpu0[0] and "settled " in gpu0[0]  # the settle band
    labels = [float(y) for y in re.findall(rf'<text x="{html.PAD_L + html.PLOT_W + 6}" y="([\d.]+)"',
                                           gpu0[0])]
    assert len(labels) >= 3 and all(abs(a - b) >= 11 - 1e-6 for k, a in enumerate(labels) for b in labels[k + 1:])
    title_y = 13
    assert all(y > title_y + 8 for y in labels)  # never over the title


def test_progress_on_a_terminal_says_what_runs_and_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from gpud.cli.burnin import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    monkeypatch.setattr("sys.stderr", err)
    p = Progress(simulated=True)
    p("soak", 754.0)
    p.done()
    assert "soak — simulated time left 12:34" in err.getvalue()
    quiet = io.StringIO()  # not a terminal: nothing
    monkeypatch.setattr("sys.stderr", quiet)
    Progress(simulated=False)("soak", 10.0)
    assert quiet.getvalue() == ""


def test_the_load_on_real_gpus_is_a_child_that_stop_kills() -> None:
    from gpud.probe.stress_run import HardwareLoad

    load = HardwareLoad("cpu")
    load.start([0], 600.0)
    procs = list(load._procs)
    assert procs and procs[0].poll() is None

    def state() -> str:
        for _ in range(50):
            s = Path(f"/proc/{procs[0].pid}/stat").read_text().split(")")[-1].split()[0]
            if s in "Tt":
                return "stopped"
            time.sleep(0.02)
        return "running"

    got: dict[int, dict[str, Any]] = {}
    for _ in range(300):  # the child checks every product and reports each second (after torch's import)
        got = load.checks()
        if got:
            break
        time.sleep(0.1)
    assert got[0]["iterations"] > 0 and got[0]["wrong"] == 0 and got[0]["checksum"] == got[0]["first"]
    assert got[0]["reference"]["ok"]  # its first product's rows within Higham's bound of the host's
    load.pause()  # an idle step: paused, not restarted
    assert state() == "stopped"
    load.start([0], 600.0)
    assert load._procs == procs and state() == "running"
    load.pause()
    load.stop()  # a paused child is killed too
    assert all(p.poll() is not None for p in procs) and load._procs == []


def test_new_xids_ecc_errors_and_replays_during_the_run_fail_that_gpu(state_dir: Path) -> None:
    from gpud.burnin.judge import judge

    m = open_machine("z8-fury-4x-a6000")
    infos = {i: m.info(i) for i in range(2)}
    res = Result("z8", "quick", "cpu", [0, 1], {0: "A", 1: "A"}, 0.0)
    bus1 = infos[1].pci_bus_id
    before = {"ecc": {0: 0, 1: 0}, "replay": {0: 3, 1: 0}, "xids": [("0000:16:00.0", 13, "old")]}
    after = {"ecc": {0: 0, 1: 2}, "replay": {0: 3, 1: 0}, "xids": [("0000:16:00.0", 13, "old"), (bus1, 79, "new")]}
    got = {v.gpu: v for v in judge(res, infos, before, after) if v.test == "burnin.errors"}  # type: ignore[arg-type]
    assert got[0].status == "pass"  # an Xid from before the run is not new
    assert got[1].status == "fail" and "2 new ECC errors" in got[1].summary and "Xid 79" in got[1].summary


def test_the_probes_p2p_and_allreduce_are_judged_on_the_gpus_under_test(state_dir: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On GPUs the quick level runs the probe's P2P and all-reduce on the GPUs under test (named by
    UUID) and turns its judgements into verdicts; the probe itself needs a GPU, so it is stood in for."""
    from types import SimpleNamespace

    from gpud.burnin.run import _probe
    from gpud.probe import runner
    from gpud.probe.report import Diagnosis, LinkJudgement

    m = open_machine("z8-fury-4x-a6000")
    seen = {}

    def fake(**kw: Any) -> Any:
        seen["env"], seen["gpus"] = os.environ.get("CUDA_VISIBLE_DEVICES"), kw["gpus"]
        diag = Diagnosis(sentences=["all-reduce at 40 % of NVLink"], verdicts={"2": "fail"},
                         links=[LinkJudgement(2, 3, "NVLink 3 ×4", 100e9, 30e9, 0.3)])
        return SimpleNamespace(diagnosis=diag)

    monkeypatch.setattr(runner, "run_probe", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    got = _probe(m, [2, 3], allow_busy=False)
    assert seen == {"env": f"{m.info(2).uuid},{m.info(3).uuid}", "gpus": 2}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # put back
    by = {(v.test, v.gpu): v for v in got}
    assert by[("burnin.probe.allreduce", None)].status == "fail"
    p2p = by[("burnin.probe.p2p", 2)]
    assert p2p.status == "fail" and "30%" in p2p.summary and p2p.source


def test_an_outlier_among_four_siblings_is_named_by_median_and_mad() -> None:
    """With sigma of the values themselves no value of four lies more than 1.5 sigma from their mean, so
    the former '> 3 sigma' never named one; the modified z-score (median, MAD) does, and not a noisy spread."""
    from gpud.burnin.judge import robust_z

    assert max(abs(z) for z in robust_z([1700.0, 1710.0, 1720.0, 1500.0])) > 3.5
    assert max(abs(z) for z in robust_z([1708.0, 1718.0, 1722.0, 1710.0])) < 3.5


class _NoChildren:
    def __init__(self, specs: list[dict[str, Any]]) -> None:
        pass

    def collect(self, timeout: float) -> dict[int, dict[str, Any]]:
        return {}

    def kill(self) -> None:
        pass


def _run(monkeypatch: pytest.MonkeyPatch, name: str, level: str, gpus: list[int] | None = None,
         faults: list[dict[str, Any]] = (), largest_share: float | None = None) -> Result:  # type: ignore[assignment]
    """A burn-in in simulated time without the short kernels' child (what is tested is the load and the
    verdicts)."""
    from gpud.burnin import run as burnin_run
    from gpud.probe import stress_run

    m = open_machine(name)
    for f in faults:
        m.simulation.machine.inject(**f)
    m = open_machine(name)  # as the next command sees it (the kernel log's fault is the root tree's)
    monkeypatch.setattr(burnin_run, "_workload", lambda *a, **k: {g: {} for g in a[3]})
    monkeypatch.setattr(stress_run, "Children", _NoChildren)  # the memory test's phase is held, its child not run
    bench = SimBench(m.simulation, largest_share)
    return run_burnin(m, bench, Config(), level=level, gpus=gpus, device="cpu")  # type: ignore[arg-type]


def test_wrong_only_hot_fails_a_standard_burnin_naming_the_temperature(
        state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUD_SIM_SEED", "4")
    hot = [{"kind": "wrong_results", "gpu": 1, "above_celsius": 75},
           {"kind": "wrong_results", "gpu": 2, "above_celsius": 95}]  # 95 °C: beyond what the load heats it to
    res = _run(monkeypatch, "z8-fury-4x-a6000", "standard", faults=hot)
    v = {(x.test, x.gpu): x for x in res.verdicts}
    bad = v[("burnin.gemm.load", 1)]
    first = next(c for c in res.series[1].checks if c.wrong)
    assert bad.status == "fail" and first.temperature_c is not None and first.temperature_c >= 75
    assert f"the first at {first.temperature_c} °C" in bad.summary and bad.figure == sum(c.wrong for c in
                                                                                       res.series[1].checks)
    assert all(not c.wrong for c in res.series[1].checks if c.t < first.t)
    assert all(f"{d} " in bad.summary for d in ("fp32", "tf32", "bf16"))  # each training dtype checked hot
    assert v[("burnin.gemm.load.siblings", 1)].status == "fail"
    spared = v[("burnin.gemm.load", 2)]
    hottest = max(c.temperature_c or 0 for c in res.series[2].checks)
    assert spared.status == "pass" and hottest < 95 and f"results checked only up to {hottest} °C" in spared.summary
    checked = {c.phase for c in res.series[0].checks}
    assert {"load", "power", "pulse_full"} <= checked and "pulse_idle" not in checked  # every load phase
    assert res.status == "fail" and res.failed_gpus() == [1]


def test_what_could_not_be_measured_is_not_judged_never_a_pass(state_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """One GPU of an RTX 6000 Ada Z8 (ECC off: no counters), its kernel log unreadable: the siblings'
    comparisons, ECC and Xids are "not judged" with what gpud needs, and the last line says so."""
    import io
    from contextlib import redirect_stdout

    from gpud.cli.burnin import render

    res = _run(monkeypatch, "z8-fury-4x-rtx6000ada", "quick", gpus=[0], faults=[{"kind": "kernel_log_unreadable"}])
    doc = res.json("test", {"name": "z8"})
    nj = set(doc["not_judged"])
    assert {"burnin.errors.xid", "burnin.errors.ecc", "burnin.performance.spread", "burnin.gemm.load.siblings",
            "burnin.workload.figures"} <= nj, nj
    by = {v.test: v for v in res.not_judged()}
    assert "/dev/kmsg" in by["burnin.errors.xid"].summary + by["burnin.errors.xid"].remedy
    assert by["burnin.errors.ecc"].remedy and by["burnin.gemm.load.siblings"].remedy
    assert all(v.status != "pass" for v in res.verdicts if v.test in nj)
    out = io.StringIO()
    with redirect_stdout(out):
        render(doc)
    last = out.getvalue().strip().splitlines()[-1]
    assert "not judged" in last and "PASS: fit to train on" not in out.getvalue() and res.exit_code() == 0
    from gpud.burnin.store import as_checks

    gpu = next(c for c in as_checks(doc) if c.id == "burnin.gpu")  # gpud doctor --burnin says so too
    assert "not judged: " in gpu.summary and "burnin.errors.xid" in gpu.summary


def test_a_cpu_rehearsal_judges_no_workload_test_of_the_gpus() -> None:
    """--device cpu on a machine whose GPUs work: what passed on the host's CPU is not judged; an error
    found there still fails (the host computes wrong)."""
    from gpud.backends import RealBench
    from gpud.burnin.judge import judge

    assert RealBench("cpu").results_are_the_gpus is False and RealBench("cuda").results_are_the_gpus
    res = Result("ws", "standard", "cpu", [0, 1], {0: "A", 1: "A"}, 0.0, results_are_the_gpus=False)
    gemm = [{"dtype": d, "digest": "x", "reference_ok": True, "reference_error": 0.0, "reference_rtol": 1.0,
             "tflops": 1.0} for d in ("bf16", "tf32", "fp32")]
    res.workload = {g: {"gemm": gemm, "memtest": {"mib": 8, "errors": {"random": 0}, "total_errors": g}}
                    for g in (0, 1)}
    health = {"at": 0.0, "ecc": {}, "replay": {}, "xids": []}
    got = {(v.test, v.gpu): v for v in judge(res, {}, health, health)}
    assert got[("burnin.gemm.fp32.digest", 0)].summary.startswith("not judged")
    assert got[("burnin.memtest", 0)].status == "skip" and got[("burnin.memtest", 1)].status == "fail"
    assert not [v for v in got.values() if v.status == "pass" and v.test.startswith(("burnin.gemm", "burnin.mem"))]


def test_one_gpu_per_model_compares_nothing_and_passes_nothing_it_did_not_compare() -> None:
    """Two GPUs of two models (one of each): every comparison with siblings is not judged, with its remedy."""
    from gpud.burnin.judge import judge

    res = Result("ws", "quick", "cuda", [0, 1], {0: "NVIDIA RTX A6000", 1: "NVIDIA RTX 6000 Ada"}, 0.0)
    gemm = [{"dtype": d, "digest": "x", "reference_ok": True, "reference_error": 0.0, "reference_rtol": 1.0,
             "tflops": 50.0 + g} for g, d in enumerate(("bf16", "tf32", "fp32"))]
    res.workload = {g: {"gemm": gemm, "device_bandwidth": {"gbps": 700.0}} for g in (0, 1)}
    health = {"at": 0.0, "ecc": {}, "replay": {}, "xids": []}
    got = judge(res, {}, health, health)
    compared = [v for v in got if v.test.endswith((".digest", ".throughput")) or v.test == "burnin.memory_bandwidth"]
    assert len(compared) == 2 * 7 and all(v.status == "skip" and v.summary.startswith("not judged") and v.remedy
                                          for v in compared)


def test_nvmls_violation_counters_catch_hw_slowdown_between_readings() -> None:
    """A long soak reads every 12 s: a power brake between two readings shows in NVML's violation counters (where
    the GPU keeps them), which fail the GPU; a GPU that keeps none gets no such verdict (its readings judge)."""
    from gpud.burnin.judge import judge

    res = Result("ws", "soak", "cuda", [0, 1, 2], {g: "H200" for g in range(3)}, 0.0)
    zero = {"hw_thermal_slowdown": 0, "hw_power_brake_slowdown": 10**9, "sw_power_cap": 0}
    before = {"at": 0.0, "ecc": {}, "replay": {}, "xids": [], "violations": {0: zero, 1: zero, 2: None}}
    after = {"at": 86400.0, "ecc": {}, "replay": {}, "xids": [],
             "violations": {0: {**zero, "sw_power_cap": 5 * 10**12},
                            1: {**zero, "hw_power_brake_slowdown": 10**9 + 2_500_000_000}, 2: None}}
    got = {v.gpu: v for v in judge(res, {}, before, after) if v.test == "burnin.clocks.hw_slowdown.counters"}
    assert got[0].status == "pass" and "0 s of" in got[0].summary
    assert got[1].status == "fail" and got[1].figure == 2.5 and "hw_power_brake_slowdown 2.5 s" in got[1].summary
    assert got[1].remedy and 2 not in got


def test_targeted_power_closes_the_loop_and_names_why_a_gpu_stays_short(state_dir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A workload whose largest load asks 80 % of what the GEMM stress does (less than the 300 W limit): GPU0
    stays short because of the load, which is not judged, never a pass nor the power cables; GPU1 in HW
    slowdown is held down by it, named, with its remedy."""
    from gpud.burnin.plan import next_share

    monkeypatch.setenv("GPUD_SIM_SEED", "2")
    res = _run(monkeypatch, "z8-fury-4x-a6000", "standard", gpus=[0, 1], largest_share=0.8,
               faults=[{"kind": "clock_events", "gpu": 1, "reasons": ["hw_slowdown"]}])
    v = {(x.test, x.gpu): x for x in res.verdicts}
    short, slow = v[("burnin.targeted_power", 0)], v[("burnin.targeted_power", 1)]
    assert short.status == "skip" and short.summary.startswith("not judged")
    assert "the load at its largest" in short.summary
    assert "cable" not in short.remedy and "burnin.targeted_power" in res.json("t", {"name": "z8"})["not_judged"]
    assert slow.status == "fail" and "held down by HW slowdown" in slow.summary and "cooling" in slow.remedy
    assert [p.load_share for p in res.series[0].of("power")][-1] == 1.0  # the loop went to the largest load
    # below 90 % of the board's maximum the loop sizes the load to the target (DCGM's RecalcMatrixDim)
    assert next_share(1.0, 300.0, 200.0, 300.0) == pytest.approx(200 / 300)
    assert next_share(0.5, 100.0, 200.0, 300.0) == 1.0 and next_share(0.6, 201.0, 200.0, 300.0) == 0.6
    assert next_share(0.3, 100.0, 290.0, 300.0) == 1.0  # a target near the maximum takes the largest at once


def test_a_24_hour_soak_runs_in_simulated_time_and_writes_its_result_as_it_goes(
        state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud.burnin import run as burnin_run
    from gpud.burnin.progress import ProgressLog, load

    monkeypatch.setenv("GPUD_SIM_SEED", "5")
    monkeypatch.setattr(burnin_run, "_workload", lambda *a, **k: {g: {} for g in a[3]})
    # a workstation with one RTX 6000 Ada: the Z8's description cut after its first GPU (the physics steps
    # every GPU of a machine each simulated second, so a 24-hour soak costs per GPU it has)
    src = (REPO / "gpud/sim/descriptions/z8-fury-4x-rtx6000ada.toml").read_text()
    one = tmp_path / "one-ada.toml"
    one.write_text(src[:src.index("[[gpu]]", src.index("[[gpu]]") + 1)].replace(
        'name = "z8-fury-4x-rtx6000ada"', 'name = "one-ada"'))
    m = open_machine(str(one))
    assert m.nvml.device_count() == 1
    path = tmp_path / "run.jsonl"
    res = run_burnin(m, open_bench(m, "cpu"), Config(), level="soak", gpus=None, device="cpu", duration_s=86400.0,
                     log=ProgressLog(path, "test", {"name": "z8"}))
    soak = res.series[0].of("soak")
    assert res.seconds >= 86400 + 330 and res.wall_seconds < res.seconds / 1000
    assert 7100 <= len(soak) <= 7300 and soak[1].t - soak[0].t == pytest.approx(12.0, abs=0.5)  # 7 200 readings
    assert max(c.t for c in res.series[0].checks) > 86000  # checked to the end
    v = {x.test: x for x in res.verdicts if x.gpu == 0}
    assert v["burnin.thermal.settle"].status == "pass" and v["burnin.gemm.load"].status == "pass"
    lines = path.read_text().splitlines()
    assert sum('"so_far"' in line for line in lines) >= 47 and '"end"' in lines[-1]  # every 30 min of 24 h
    back, env = load(path)
    assert not back.interrupted and [x.json() for x in back.verdicts] == [x.json() for x in res.verdicts]
    assert len(back.series[0].points) == len(res.series[0].points) and env["host"] == {"name": "z8"}
    from gpud.journal import events

    hourly = [e for e in events(kinds=("burnin",)) if "so far" in e.summary]
    assert len(hourly) >= 23 and "nothing failed yet" in hourly[-1].summary  # the journal, every hour


KILLED = """
import os, signal, sys
from pathlib import Path
from gpud.backends import open_bench, open_machine
from gpud.burnin import run as burnin_run
from gpud.burnin.progress import ProgressLog
from gpud.config import Config
burnin_run._workload = lambda *a, **k: {g: {} for g in a[3]}
m = open_machine("z8-fury-4x-a6000")
m.simulation.machine.inject("clock_events", gpu=1, reasons=["hw_power_brake_slowdown"])
m = open_machine("z8-fury-4x-a6000")
bench = open_bench(m, "cpu")
sleep, start = bench.sleep, bench.now()
def dying(seconds):
    sleep(seconds)
    if bench.now() - start > 700:  # soaking, past its first verdicts so far: the power goes (SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
bench.sleep = dying
burnin_run.run_burnin(m, bench, Config(), level="soak", gpus=[0, 1], device="cpu", duration_s=1800.0,
                      log=ProgressLog(Path(sys.argv[1]), "test", {"name": "z8"}), memtest_s=60.0)
"""


def test_a_burnin_killed_in_its_middle_keeps_its_results_so_far(state_dir: Path, tmp_path: Path) -> None:
    import sys

    from gpud.burnin.progress import load

    path, report = tmp_path / "run.jsonl", tmp_path / "r.html"
    r = subprocess.run([sys.executable, "-c", KILLED, str(path)], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "GPUD_SIM_SEED": "6"})
    assert r.returncode == -9, r.stderr[-2000:]
    res, _ = load(path)
    assert res.interrupted and 650 <= res.seconds <= 720  # what was measured up to the kill
    assert len(res.series[1].of("soak")) > 250 and res.series[1].of("soak")[-1].t > 690 and res.series[1].checks
    assert res.workload[1]["memtest"]["passes"] >= 1 and len(res.series[1].of("memtest")) == 60  # its line kept
    so_far = {(v.test, v.gpu): v for v in res.verdicts}
    assert so_far[("burnin.clocks.hw_slowdown", 1)].status == "fail"  # judged as far as it ran
    assert so_far[("burnin.clocks.hw_slowdown", 0)].status == "pass"
    shown = run_gpud("burnin", "--from", str(path), "--report", str(report))
    assert shown.returncode == 130 and "interrupted after" in shown.stdout
    assert "burnin.clocks.hw_slowdown" in shown.stdout
    assert report.read_text().count("<svg") == 2 * 5


@pytest.mark.parametrize("seed", SEEDS)
def test_a_gpu_a_few_percent_slower_than_its_three_siblings_is_named(state_dir: Path, seed: int, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the simulator's noise and spread (silicon, coolers, dithering clocks): GPU2's silicon draws 10 %
    more at a given clock than its model's (Sinha et al., SC22: 8 % average variation on one SKU), so at the
    same 300 W limit as its siblings it runs about 4 % slower and fails the spread, named; its siblings raise
    no alarm (the healthy Z8 raises none: test_quick_on_the_healthy_z8_passes_within_two_minutes)."""
    from gpud.burnin import run as burnin_run

    monkeypatch.setenv("GPUD_SIM_SEED", str(seed))
    monkeypatch.setattr(burnin_run, "_workload", lambda *a, **k: {g: {} for g in a[3]})
    desc = tmp_path / "z8-slow-gpu2.toml"
    desc.write_text((REPO / "gpud/sim/descriptions/z8-fury-4x-a6000.toml").read_text().replace(
        'bus_id = "0000:5a:00.0"', 'bus_id = "0000:5a:00.0"\npower_variation = 0.10'))
    m = open_machine(str(desc))
    res = run_burnin(m, open_bench(m, "cpu"), Config(), level="quick", gpus=None, device="cpu")
    spread = {v.gpu: v for v in res.verdicts if v.test == "burnin.performance.spread"}
    assert spread[2].status == "fail" and spread[2].figure is not None and 0.03 < spread[2].figure < 0.08
    assert "below its siblings' median" in spread[2].summary and spread[2].remedy
    assert "power limit" not in spread[2].summary  # the same limit: its silicon, not its setting
    assert [spread[g].status for g in (0, 1, 3)] == ["pass"] * 3
    assert res.failed_gpus() == [2]


def test_a_gpu_slower_only_by_a_lower_power_limit_is_named_a_setting_not_a_failure(
        state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU2 at a 273 W limit while its siblings keep 300 W runs slower under the same load, held by the SW power
    cap at its own limit: a configuration (doctor's config.power_limit), not a slow GPU. The spread warns,
    naming the limit and its siblings', and the GPU does not fail (an admin would otherwise return a healthy
    card); compared at one limit it would be judged as silicon (the test above)."""
    from gpud.burnin import run as burnin_run

    monkeypatch.setattr(burnin_run, "_workload", lambda *a, **k: {g: {} for g in a[3]})
    m = open_machine("z8-fury-4x-a6000")
    m.nvml.set_power_limit(2, 273)
    res = run_burnin(m, open_bench(m, "cpu"), Config(), level="quick", gpus=None, device="cpu")
    spread = {v.gpu: v for v in res.verdicts if v.test == "burnin.performance.spread"}
    assert spread[2].status == "warn" and spread[2].figure is not None and spread[2].figure > 0.03
    assert "power limit 273 W, below its siblings' 300 W" in spread[2].summary
    assert "-pl 300" in spread[2].remedy
    assert [spread[g].status for g in (0, 1, 3)] == ["pass"] * 3
    assert 2 not in res.failed_gpus()


def test_error_counters_are_judged_with_dcgms_limits_and_unread_ones_are_not_judged(state_dir: Path) -> None:
    """PCIe replays above DCGM's 8 a minute fail (fewer warn), AER uncorrectable errors fail, NVLink replay
    errors fail and CRC errors below 100 a second warn; retired pages at DCGM's 60 fail; a GPU whose sysfs
    has no AER counters and whose NVML has no replay counter is not judged for them. The counts come from the
    simulated root tree and NVML as the burn-in reads them (Host.aer_counts, fresh samples)."""
    from gpud.burnin.judge import judge
    from gpud.burnin.run import _health

    m = open_machine("z8-fury-4x-a6000")
    infos = {i: m.info(i) for i in range(3)}
    before = _health(m, [0, 1, 2], 0.0)
    assert before["aer"][0] == {"correctable": 0, "nonfatal": 0, "fatal": 0}  # the root tree's sysfs
    after = copy.deepcopy(before)
    after["at"] = 600.0  # ten minutes later
    after["replay"][0] = (before["replay"][0] or 0) + 200  # 20 a minute
    after["aer"][1] = {"correctable": 3, "nonfatal": 0, "fatal": 1}
    after["nvlink"][2] = {**(before["nvlink"][2] or {}), (0, "replay"): 2, (1, "crc_flit"): 50}
    before["nvlink"][2] = {**(before["nvlink"][2] or {}), (0, "replay"): 0, (1, "crc_flit"): 0}
    after["retired"][2] = (60, False)
    res = Result("z8", "quick", "cuda", [0, 1, 2], {g: "A" for g in range(3)}, 0.0)
    got = {(v.test, v.gpu): v for v in judge(res, infos, before, after)}  # type: ignore[arg-type]
    assert got[("burnin.errors", 0)].status == "fail" and "above DCGM's 8" in got[("burnin.errors", 0)].summary
    assert got[("burnin.errors", 1)].status == "fail" and "1 fatal" in got[("burnin.errors", 1)].summary
    assert got[("burnin.errors", 2)].status == "fail" and "NVLink 0 replay: 2" in got[("burnin.errors", 2)].summary
    assert "crc_flit: 50" in got[("burnin.errors", 2)].summary
    assert got[("burnin.memory.retired_pages", 2)].status == "fail"
    # a source that could not be read
    for h in (before, after):
        h["aer"][0], h["replay"][0] = None, None
    got = {(v.test, v.gpu): v for v in judge(res, infos, before, after)}  # type: ignore[arg-type]
    assert got[("burnin.errors.aer", 0)].summary.startswith("not judged") and got[("burnin.errors.aer", 0)].remedy
    assert got[("burnin.errors.pcie_replay", 0)].status == "skip"
    assert "PCIe replays" not in got[("burnin.errors", 0)].summary


def test_reports_list_hardware_failures_before_configuration_warnings() -> None:
    import io
    from contextlib import redirect_stdout

    from gpud.burnin.html import render as html
    from gpud.cli.burnin import render

    res = Result("z8", "quick", "cuda", [0], {0: "A"}, 0.0)
    res.verdicts = [Verdict("doctor.host.shm", "warn", "/dev/shm is 64 MiB", source="gpud doctor"),
                    Verdict("doctor.host.governor", "fail", "governor powersave", source="gpud doctor"),
                    Verdict("burnin.errors.ecc", "skip", "not judged: no ECC counters", 0, remedy="ECC on"),
                    Verdict("burnin.gemm.load", "fail", "3 of 60 products differed", 0, source="s", remedy="r"),
                    Verdict("burnin.thermal.sw_slowdown", "warn", "SW thermal 0.5 %", 0, source="s"),
                    Verdict("doctor.health.xid", "fail", "Xid 48 since boot", 0, source="gpud doctor")]
    doc = res.json("test", {"name": "z8"})
    out = io.StringIO()
    with redirect_stdout(out):
        render(doc)
    text = out.getvalue()
    order = [text.index(t) for t in ("burnin.gemm.load", "burnin.thermal.sw_slowdown", "burnin.errors.ecc",
                                      "host.governor", "host.shm")]
    assert order == sorted(order), text
    page = html(res, doc)
    # the hardware's verdicts (failed, warned, not judged; doctor's of the hardware among them), then the
    # configuration's (doctor's other findings)
    rows = [page.index(t) for t in ("burnin.gemm.load", "doctor.health.xid", "burnin.thermal.sw_slowdown",
                                    "burnin.errors.ecc", "Figures per GPU", "doctor.host.governor", "doctor.host.shm")]
    assert rows == sorted(rows)


def test_a_cpu_run_on_a_machine_whose_gpus_work_needs_rehearsal(state_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The command refuses --device cpu where NVML sees GPUs and the kernels would run on the host (a real
    machine's RealBench, stood in here on a simulated one), unless --rehearsal; nothing runs or is written."""
    import gpud.cli.burnin
    from gpud.backends import RealBench
    from gpud.cli.burnin import burnin
    from gpud.errors import InvalidInput

    monkeypatch.setattr(gpud.cli.burnin, "open_bench", lambda m, dev: RealBench(dev))
    with pytest.raises(InvalidInput, match="--rehearsal"):
        burnin(level="quick", device="cpu", simulate="z8-fury-4x-a6000")
    assert not (state_dir / "burnin.json").exists() and not (state_dir / "burnin-run.jsonl").exists()
