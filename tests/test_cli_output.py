"""Human output under hostile data (issue 23 items 1 and 6): every renderer linear in its input, long
fields cut where the width is fixed, and no control character from data reaching the terminal."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from conftest import REPO, run_gpud

from gpud.cli.output import UNLIMITED, table_lines, wrap

LONG = 100_000
ESC = "\x1b"


def _desc(tmp_path: Path, processes: str) -> str:
    text = (REPO / "gpud/sim/descriptions/z8-fury-4x-a6000.toml").read_text()
    marker = 'bus_id = "0000:16:00.0"'
    text = text.replace('name = "z8-fury-4x-a6000"', 'name = "z8-long"').replace(
        marker, f"{marker}\nprocesses = [{processes}]")
    path = tmp_path / "z8-long.toml"
    path.write_text(text)
    return str(path)


def test_wrapping_is_linear_in_the_text() -> None:
    # Before: one 20 000-character word took 6 s to wrap (a pattern backtracking over every long word),
    # so a 100 000-character command line took minutes; 50 000 short words through a pipe measured the
    # growing line for every word.
    word = "python " + "x" * LONG
    words = "python " + "ab " * (LONG // 3)
    t = time.perf_counter()
    assert wrap(word, 80)[-1].endswith("x")
    assert len(wrap(words, UNLIMITED)) == 11
    lines = table_lines(["GPU", "Command"], [["0", word], ["1", words]], max_width=80)
    assert time.perf_counter() - t < 2.0
    assert all(len(ln) <= 80 for ln in lines) and len(lines) == 1 + 2 + 6  # header, "python" and the word, 6 lines
    assert lines[2].endswith("x…") and lines[-1].endswith("…")


def test_ps_and_doctor_with_a_100k_command_line_at_80_columns(tmp_path: Path) -> None:
    cmd = "python train.py --config " + "a" * LONG + " " + "--lr 0.1 " * 2000
    desc = _desc(tmp_path, f'{{ pid = 4242, used_mib = 9000, user = "eve", uid = 1005, command = "{cmd}" }}')
    env = {"GPUD_SIMULATE": desc, "COLUMNS": "80"}
    t = time.perf_counter()
    ps = run_gpud("ps", env=env)
    assert ps.returncode == 0, ps.stderr
    row = [ln for ln in ps.stdout.splitlines() if "4242" in ln]
    assert len(row) == 1 and len(row[0]) <= 80 and row[0].endswith("…"), ps.stdout[:400]
    assert "python train.py" in row[0]
    wide = run_gpud("ps", "--wide", env=env)
    assert cmd.strip() in wide.stdout  # whole with --wide
    assert json.loads(run_gpud("ps", "--json", env=env).stdout)["processes"][0]["command"] == cmd.strip()
    doc = run_gpud("doctor", "--check", "gpu.processes", "--verbose", env=env)
    assert "pid 4242" in doc.stdout and "…" in doc.stdout
    assert max(len(ln) for ln in doc.stdout.splitlines()) <= 80
    assert len(doc.stdout) < 20_000, len(doc.stdout)  # the command is cut, not printed in 1 300 lines
    assert time.perf_counter() - t < 30  # four commands; before: 22-30 s each


def _toml(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" if ord(c) < 32 or 0x7F <= ord(c) <= 0x9F or c == "\u202e" else c for c in text)


def test_no_control_character_from_data_reaches_the_terminal(tmp_path: Path, state_dir: Path) -> None:
    from gpud import journal

    evil = "\x1b[2J\x1b]0;pwned\x07\x1b[31mred\u202etxt.exe\x08\x9b"
    prof = tmp_path / "evil.toml"
    prof.write_text(f'description = "clears {_toml(evil)}"\nextends = "quiet"\n')
    desc = _desc(tmp_path, f'{{ pid = 4243, used_mib = 900, user = "eve", uid = 1005, command = "{_toml(evil)}" }}')
    j = journal.Journal(journal.journal_path())
    j.gpu_seen("GPU-0", "1320", "RTX A6000", "94.02", "0000:17:00.0", 0)
    j.record("xid", f"Xid 13 {evil}", gpu=0, uuid="GPU-0", data={"xid": 13, "line": evil})
    j.close()
    env = {"GPUD_SIMULATE": desc}
    outs = [run_gpud("profile", "show", str(prof), env=env), run_gpud("ps", env=env), run_gpud("ps", "--wide", env=env),
            run_gpud("events", env=env), run_gpud("events", "--dossier", "0", env=env),
            run_gpud("--color", "ps", env=env), run_gpud("ps", "--color", env=env)]
    for r in outs:
        assert r.returncode == 0, (r.args, r.stderr)
        text = r.stdout + r.stderr
        if "--color" in r.args:
            assert "\x1b[1m" in text  # gpud's own colour stays
            text = re.sub(r"\x1b\[[0-9;]*m", "", text.replace("\x1b[31mred", "red"))
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]", text), (r.args, text)
    assert "clears" in outs[0].stdout and "eve" in outs[1].stdout and "Xid 13" in outs[3].stdout
    # --json keeps the data as it is (JSON escapes it)
    assert json.loads(run_gpud("ps", "--json", env=env).stdout)["processes"][0]["command"] == evil


def test_events_with_a_long_journal_summary_at_80_columns(state_dir: Path) -> None:
    from gpud import journal

    j = journal.Journal(journal.journal_path())
    j.record("check", "health.fans changed: " + "fan 0 stalled " * 8000 + "x" * LONG, gpu=0, uuid="GPU-0")
    j.record("xid", "Xid 79", gpu=1, uuid="GPU-1")
    j.close()
    t = time.perf_counter()
    r = run_gpud("events", env={"COLUMNS": "80"})
    assert time.perf_counter() - t < 10 and r.returncode == 0, r.stderr  # before: over a minute
    lines = r.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80 and len(lines) <= 1 + 1 + 6 + 1, len(lines)
    assert any(ln.endswith("…") for ln in lines) and "Xid 79" in r.stdout
    whole = json.loads(run_gpud("events", "--json").stdout)["events"][0]["summary"]
    assert len(whole) > LONG
