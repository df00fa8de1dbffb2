"""The commands at an 80-column terminal (a pseudo-terminal), on every shipped description: no line
wider than the terminal, no value cut short, doctor's commands whole; colour on a TTY, none with
NO_COLOR or through a pipe."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_gpud
from pty_helpers import plain, run_in_pty, too_wide

NAMES = [d["name"] for d in json.loads(run_gpud("sim", "list", "--json").stdout)["machines"]]
COLUMNS = 80


def _fits(out: str) -> None:
    assert not too_wide(out, COLUMNS), too_wide(out, COLUMNS)
    # no ellipsis for a cut value (rich's "…", click's "word,..."); usage's "[ARGS]..." is not one
    assert "…" not in out and not re.search(r"[\w,]\.\.\.", plain(out)), re.findall(r".{20}[\w,]\.\.\.", plain(out))


@pytest.fixture(autouse=True)
def _flat(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests find each figure of one run's JSON in another run's table, digit for digit: the figures
    must not move between the two runs (the simulator's noise off)."""
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")


def _json(*args: str) -> dict:
    return json.loads(run_gpud(*args, "--json").stdout)


def _unwrapped(text: str) -> str:
    """Doctor's output with wrapped lines joined: a command continued with `` \\`` reads as one."""
    text = re.sub(r" \\\n\s+", " ", plain(text))
    return re.sub(r"\n\s+", " ", text)


@pytest.mark.parametrize("desc", NAMES)
def test_status_fits_and_cuts_nothing(desc: str, state_dir) -> None:
    code, out = run_in_pty("status", "--simulate", desc, "--wide")  # every column, in column groups
    _fits(out)
    doc = _json("status", "--simulate", desc)
    lost = any(g["sample"]["lost"] for g in doc["gpus"])
    assert code == (1 if lost else 0)
    text = plain(out)
    assert "\x1b[" in out  # a TTY gets colour
    for g in doc["gpus"]:
        s, info = g["sample"], g["info"]
        assert info["name"].replace("NVIDIA ", "") in text
        if s["lost"]:
            continue
        assert f"{s['temperature_celsius']} °C" in text
        for event in s["clock_events"] or []:
            if event != "gpu_idle":
                assert event in text, event
        if s["power_limit_watts"] is not None:
            assert f"{s['power_watts']:.0f} / {s['power_limit_watts']:.0f} W" in text
    assert "Legend:" in text and "! outside its limit" in text and "* fan under manual control" in text


@pytest.mark.parametrize("desc", NAMES)
def test_status_is_one_line_per_gpu_where_the_table_would_split(desc: str, state_dir) -> None:
    code, out = run_in_pty("status", "--simulate", desc)
    _fits(out)
    doc = _json("status", "--simulate", desc)
    lines = plain(out).splitlines()
    h = next(i for i, line in enumerate(lines) if line.startswith("GPU "))  # after the (wrapped) title
    assert lines[h].split() == ["GPU", "Temp", "Fan", "Power", "Util", "Memory", "Processes"], lines[:3]
    rows = lines[h + 1:h + 1 + len(doc["gpus"])]
    for g, row in zip(doc["gpus"], rows, strict=True):
        s = g["sample"]
        assert re.match(rf"{s['index']}!?\s", row), row
        if not s["lost"]:
            assert f"{s['temperature_celsius']} °C" in row
            if s["power_limit_watts"] is not None and s["power_watts"] is not None:
                assert f"{s['power_watts']:.0f}/{s['power_limit_watts']:.0f} W" in row
    assert lines[h + 1 + len(doc["gpus"])] == ""  # one line each: an HGX in 10 lines, not 20
    assert "Compact view" in plain(out) and g["info"]["name"].replace("NVIDIA ", "") in " ".join(lines[:h])
    _, wide = run_in_pty("status", "--simulate", desc, columns=250)
    assert re.search(r"^GPU .*Clock events$", plain(wide), re.M)  # where the whole table fits, it is the table
    _, asked = run_in_pty("status", "--simulate", desc, "--compact", columns=250)
    assert "Processes" in plain(asked) and "Clock events  " not in plain(asked) and "Compact view" in plain(asked)


@pytest.mark.parametrize("desc", NAMES)
def test_topo_fits_and_cuts_nothing(desc: str, state_dir) -> None:
    code, out = run_in_pty("topo", "--simulate", desc)
    assert code == 0
    _fits(out)
    text = plain(out)
    doc = _json("topo", "--simulate", desc)
    for g in doc["gpus"]:
        assert g["pci_bus_id"] in text
    rows = [line for line in text.splitlines() if re.match(r"^GPU\d+\s+(X|NV|PIX|PXB|PHB|NODE|SYS)", line)]
    # every level of the matrix is printed whole, in the right row (column groups repeat the row name)
    for i, levels in enumerate(doc["matrix"]):
        printed = " ".join(line.split(None, 1)[1] for line in text.splitlines()
                           if line.startswith(f"GPU{i} ") and re.search(r"\b(X|NV\d+|PIX|PXB|PHB|NODE|SYS)\b", line))
        for level in set(levels):
            assert re.search(rf"(^|\s){level}(\s|$)", printed), (i, level)
    assert rows


@pytest.mark.parametrize("desc", NAMES)
def test_doctor_fits_and_keeps_commands_whole(desc: str, state_dir) -> None:
    for extra in ((), ("-v",)):
        code, out = run_in_pty("doctor", "--simulate", desc, *extra)
        _fits(out)
        doc = _json("doctor", "--simulate", desc)
        assert code == doc["exit_code"]
        joined = _unwrapped(out)
        for c in doc["checks"]:
            assert c["id"] in joined
            if c["status"] in ("warn", "fail"):
                for cmd in re.findall(r"`[^`]+`", c["remedy"]):
                    assert cmd in joined, cmd  # whole, on a line of its own or continued as a shell reads it


@pytest.mark.parametrize("args", [("--help",), ("status", "--help"), ("doctor", "--help"), ("sim", "list"),
                                  ("profile", "list"), ("profile", "show", "training", "--simulate", NAMES[0]),
                                  ("apply", "training", "--dry-run", "--simulate", "z8-fury-4x-a6000-degraded")])
def test_other_commands_fit(args: tuple[str, ...], state_dir) -> None:
    code, out = run_in_pty(*args)
    assert code == 0, plain(out)
    _fits(out)


def test_probe_fits(state_dir) -> None:
    code, out = run_in_pty("probe", "--quick", "--device", "cpu", "--simulate", NAMES[0])
    assert code == 0
    _fits(out)
    assert "Correctness:" in plain(out)


def test_colour_only_on_a_terminal_and_never_with_no_color(state_dir) -> None:
    for cmd in ("status", "doctor", "topo"):
        _, coloured = run_in_pty(cmd, "--simulate", "z8-fury-4x-a6000-degraded")
        _, bare = run_in_pty(cmd, "--simulate", "z8-fury-4x-a6000-degraded", env={"NO_COLOR": "1"})
        piped = run_gpud(cmd, "--simulate", "z8-fury-4x-a6000-degraded")
        assert "\x1b[" in coloured and "\x1b[" not in bare and "\x1b[" not in piped.stdout
        assert plain(coloured) == bare


def test_wider_terminals_use_the_room(state_dir) -> None:
    _, out = run_in_pty("status", "--simulate", "2s-8x-a6000", columns=200)
    assert not too_wide(out, 200)
    header = next(line for line in plain(out).splitlines() if line.startswith("GPU "))
    assert "Clock events" in header  # one table, no column groups at 200 columns


def test_lost_gpu_makes_status_exit_1(state_dir) -> None:
    env = {"GPUD_SIMULATE": "z8-fury-4x-a6000"}
    assert run_gpud("status", env=env).returncode == 0
    assert run_gpud("sim", "inject", "gpu_lost", "gpu=2", env=env).returncode == 0
    r = run_gpud("status", env=env)
    assert r.returncode == 1, r.stderr
    assert "LOST!" in r.stdout and "GPU2  GPU: lost" in r.stdout
    assert run_gpud("status", "--json", env=env).returncode == 1


def test_doctor_probe_lists_each_check_once(state_dir) -> None:
    from collections import Counter

    r = run_gpud("doctor", "--probe", "--json", "--simulate", "z8-fury-4x-a6000", timeout=300)
    doc = json.loads(r.stdout)
    link_gen = [c for c in doc["checks"] if c["id"] == "pcie.link_gen"]
    assert Counter(c["gpu"] for c in link_gen) == Counter({0: 1, 1: 1, 2: 1, 3: 1}), link_gen
    assert all("re-checked under load by the probe" not in c["summary"] for c in link_gen)
    assert {c["id"] for c in doc["checks"]} >= {"probe.ddp_scaling", "probe.allreduce"}


def test_shell_completion_is_installable() -> None:
    r = run_gpud("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert r.returncode == 0 and "_gpud_completion" in r.stdout and "complete " in r.stdout
    assert "--install-completion" in run_gpud("--help").stdout


def test_watch_shows_the_time_of_each_refresh(state_dir) -> None:
    import subprocess
    import sys

    from conftest import REPO

    p = subprocess.Popen([sys.executable, "-m", "gpud", "status", "--watch", "--interval", "1.1",
                          "--simulate", "z8-fury-4x-a6000"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert p.stdout is not None
        heads = []
        while len(heads) < 2:
            line = p.stdout.readline()
            if line.startswith("z8-fury-4x-a6000 — "):
                heads.append(line)
    finally:
        p.kill()
        p.wait()
    times = [re.search(r"— (\d\d:\d\d:\d\d)$", h.strip()) for h in heads]
    assert all(times) and times[0].group(1) != times[1].group(1)  # type: ignore[union-attr]


def test_no_progress_bar_is_left_behind_the_missing_torch_error(tmp_path, state_dir) -> None:
    # Before: the bar started before the probe looked for torch, and the error left it on screen
    # without a newline.
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util as u\n_find = u.find_spec\n"
        "u.find_spec = lambda name, *a, **k: None if name == 'torch' else _find(name, *a, **k)\n")
    code, out = run_in_pty("probe", "--quick", "--device", "cpu", "--simulate", NAMES[0],
                           env={"PYTHONPATH": str(tmp_path)})
    assert code == 1, out
    text = plain(out)
    assert text.endswith("\n")
    assert "\r" not in out and "━" not in text and text.startswith("gpud: error: PyTorch is not installed"), repr(out)
    assert not too_wide(out, COLUMNS)


def test_ps_keeps_a_process_on_one_line_at_80_columns(state_dir) -> None:
    code, out = run_in_pty("ps", "--simulate", "z8-fury-4x-a6000-degraded")
    assert code == 0 and not too_wide(out, 80)
    lines = plain(out).splitlines()
    assert lines[1].split() == ["GPU", "PID", "User", "Type", "Memory", "SM", "Container", "/", "job", "Command"]
    for pid, user in (("48213", "alice"), ("60112", "carol"), ("51877", "bob")):
        row = [ln for ln in lines if pid in ln]
        assert len(row) == 1 and user in row[0] and "python" in row[0], out
    code, out = run_in_pty("ps", "--simulate", "z8-fury-4x-a6000-degraded", "--wide")
    assert "python train_resnet.py --gpu 1" in plain(out)
