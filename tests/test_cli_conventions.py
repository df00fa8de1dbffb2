"""Issue 24: the conventions people already type (-h, -i/--id, --color/--no-color) and outputs that
agree with each other (doctor's text summary and JSON counts)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_gpud
from pty_helpers import plain, run_in_pty, too_wide

DEGRADED = "z8-fury-4x-a6000-degraded"


@pytest.mark.parametrize("args", [(), ("status",), ("doctor",), ("profile",), ("profile", "show"), ("sim", "list"),
                                  ("events",), ("apply",), ("ps",)])
def test_dash_h_is_help_everywhere(args: tuple[str, ...]) -> None:
    r = run_gpud(*args, "-h")
    assert r.returncode == 0 and r.stdout.startswith("Usage: gpud"), (args, r.stderr)
    assert r.stdout == run_gpud(*args, "--help").stdout


def test_id_selects_gpus_by_index_uuid_or_bus_id(state_dir) -> None:
    sim = ("--simulate", DEGRADED)
    full = json.loads(run_gpud("status", "--json", *sim).stdout)["gpus"]
    uuid3, bus2 = full[3]["info"]["uuid"], full[2]["info"]["pci_bus_id"]
    nvsmi_bus2 = "0000" + bus2.upper()  # nvidia-smi's spelling: 00000000:5A:00.0
    pick = f"1,{uuid3},{nvsmi_bus2}"
    st = json.loads(run_gpud("status", "--json", "-i", pick, *sim).stdout)
    assert [g["info"]["index"] for g in st["gpus"]] == [1, 2, 3]
    assert [p["gpu"] for p in json.loads(run_gpud("ps", "--json", "--id", "1", *sim).stdout)["processes"]] == [1]
    topo = json.loads(run_gpud("topo", "--json", "-i", "2,3", *sim).stdout)
    assert [g["index"] for g in topo["gpus"]] == [2, 3] and len(topo["matrix"]) == 2 == len(topo["matrix"][0])
    doc = json.loads(run_gpud("doctor", "--json", "-i", "3", *sim).stdout)
    assert {c["gpu"] for c in doc["checks"]} <= {None, 3} and any(c["gpu"] == 3 for c in doc["checks"])
    assert doc["counts"]["fail"] == sum(c["status"] == "fail" for c in doc["checks"])
    text = run_gpud("status", "-i", "1", *sim, env={"COLUMNS": "200"}).stdout
    assert re.search(r"^1 ", text, re.M) and not re.search(r"^0 ", text, re.M)
    bad = run_gpud("status", "-i", "9", *sim)
    assert bad.returncode == 2 and bad.stderr.startswith("gpud: error: --id: 9: no such GPU"), bad.stderr
    assert bad.stderr.count("\n") == 1


def test_id_on_events(state_dir) -> None:
    from gpud import journal

    j = journal.Journal(journal.journal_path())
    for i in range(2):
        j.gpu_seen(f"GPU-{i}", None, "RTX A6000", None, f"0000:1{i}:00.0", i)
        j.record("xid", f"Xid 13 on GPU {i}", gpu=i, uuid=f"GPU-{i}", data={"xid": 13})
    j.close()
    evs = json.loads(run_gpud("events", "--json", "-i", "0000:11:00.0").stdout)["events"]
    assert [e["gpu"] for e in evs] == [1]


def test_color_and_no_color(state_dir) -> None:
    piped = run_gpud("status", "--simulate", DEGRADED, "--color")
    assert piped.returncode == 0 and "\x1b[1m" in piped.stdout  # forced through a pipe (gpustat's --color)
    assert "\x1b[" in run_gpud("--color", "doctor", "--simulate", DEGRADED).stdout
    code, out = run_in_pty("status", "--simulate", DEGRADED, "--no-color")
    assert code == 0 and "\x1b[" not in out and "GPU" in out
    code, out = run_in_pty("--no-color", "doctor", "--simulate", DEGRADED)
    assert "\x1b[" not in out


def test_doctor_text_summary_counts_as_json_does(state_dir) -> None:
    doc = json.loads(run_gpud("doctor", "--json", "--simulate", DEGRADED).stdout)
    text = run_gpud("doctor", "--simulate", DEGRADED).stdout.strip().splitlines()[-1]
    n = doc["counts"]
    assert text.startswith(f"{n['pass']} passed, {n['warn']} warnings, {n['fail']} failed, {n['skip']} skipped"), text


def test_applying_the_same_profile_twice_is_a_no_op(state_dir) -> None:
    # Before: right after `gpud apply quiet` a dry run still planned 4 changes: application clocks
    # "reset" against the default clocks they read back as.
    sim = ("--simulate", "z8-fury-4x-a6000")
    first = json.loads(run_gpud("apply", "quiet", "--json", *sim).stdout)
    assert first["ok"] and any(c["action"] == "change" for c in first["plan"])
    again = json.loads(run_gpud("apply", "quiet", "--dry-run", "--json", *sim).stdout)
    assert [c for c in again["plan"] if c["action"] == "change"] == []
    clocks = [c for c in again["plan"] if c["setting"] == "applications_clocks"]
    assert clocks and all(c["action"] == "ok" and c["desired"] == "reset" for c in clocks)


def test_the_plan_groups_identical_rows_as_doctor_does(state_dir) -> None:
    out = run_gpud("apply", "quiet", "--dry-run", "--simulate", DEGRADED, env={"COLUMNS": "80"}).stdout
    rows = [ln.split()[:2] for ln in out.splitlines() if ln.startswith("GPU")]
    assert ["GPU0-3", "fan"] in rows and ["GPU1-3", "persistence_mode"] in rows
    assert ["GPU0", "power_limit_watts"] in rows
    assert out.count("needs the gpud daemon") == 1  # once, not once per GPU
    assert len(rows) <= 10, out


def test_docs_say_where_gpud_has_run_and_install_once() -> None:
    from conftest import REPO

    readme = (REPO / "README.md").read_text()
    top = readme[:readme.index("\n- `gpud status`")]  # before the first command is described
    assert "Not yet run on NVIDIA hardware" in top and "docs/hardware-runs.md" in top
    runs = (REPO / "docs" / "hardware-runs.md").read_text()
    assert not re.search(r"^\| [0-9-]+[^|]*\| (?!—)", runs, re.M), "a hardware run is recorded: update README's top"
    assert "pip install ." not in readme and "docs/deployment.md" in readme  # one recipe, in deployment.md
    deploy = (REPO / "docs" / "deployment.md").read_text()
    assert deploy.count("python3 -m venv /opt/gpud") == 1
    assert "rule_files:" in deploy and "gpud-rules.yml" in deploy and "promtool check rules" in deploy


def test_status_and_doctor_judge_power_limit_and_fans_alike(state_dir) -> None:
    def marked(args: tuple[str, ...], gpu: int) -> dict[str, str]:
        out = run_gpud("status", *args, env={"COLUMNS": "250"}).stdout
        return dict(re.findall(rf"^  GPU{gpu}  ([^:]+): (.*)$", out, re.M))

    def verdict(args: tuple[str, ...], check: str, gpu: int) -> str:
        doc = json.loads(run_gpud("doctor", "--json", "--check", check, *args).stdout)
        return next(c["status"] for c in doc["checks"] if c["gpu"] == gpu)

    degraded = ("--simulate", DEGRADED)
    # GPU3's fan has stalled: NVML says 100 %, the GPU is at 94 °C. Before: doctor failed it, status
    # showed an unmarked 100 %.
    assert verdict(degraded, "health.fans", 3) == "fail" and "Fan" in marked(degraded, 3)
    assert verdict(degraded, "health.fans", 0) == "pass" and "Fan" not in marked(degraded, 0)
    # A limit below the default that the active profile asked for: doctor passes it, and now status
    # does not mark it either; one nobody asked for is marked by both.
    assert verdict(degraded, "config.power_limit", 0) == "warn" and "Power / limit" in marked(degraded, 0)
    healthy = ("--simulate", "z8-fury-4x-a6000")
    assert run_gpud("apply", "quiet", *healthy).returncode == 0
    assert verdict(healthy, "config.power_limit", 0) == "pass"
    assert "Power / limit" not in marked(healthy, 0)


def test_without_root_apply_and_restore_say_so_once_before_anything_else(state_dir) -> None:
    sim = ("--simulate", "z8-fury-4x-a6000")
    assert run_gpud("apply", "quiet", *sim).returncode == 0  # as root
    user = {"GPUD_SIM_EUID": "1000"}  # NVML's setters then answer NO_PERMISSION, as for a user
    for args in (("restore", *sim), ("apply", "balanced", *sim)):
        r = run_gpud(*args, env=user)
        assert r.returncode == 1 and r.stdout == "", (args, r.stdout)
        assert r.stderr.count("\n") == 1 and "Insufficient Permissions" not in r.stderr, r.stderr
        assert f"gpud {args[0]} needs root" in r.stderr and "sudo" in r.stderr and "group 'gpud'" in r.stderr
    assert run_gpud("restore", *sim).returncode == 0  # nothing was changed: root can still restore


def test_nothing_breaks_inside_a_word_at_80_columns(state_dir) -> None:
    from pty_helpers import run_in_pty

    from gpud import journal

    # doctor -q, an error message, select --help's example, the dossier: at 80 columns each wraps
    # between words (a command continued with " \\"), never where the terminal would cut it.
    code, out = run_in_pty("doctor", "-q", "--simulate", DEGRADED)
    assert code == 1 and not too_wide(out, 80) and "gpud doctor: fail:" in out
    code, out = run_in_pty("status", "-i", "0000:99:00.0,nine", "--simulate", DEGRADED)
    assert code == 2 and not too_wide(out, 80) and out.startswith("gpud: error: --id:"), out
    code, out = run_in_pty("select", "--help")
    assert not too_wide(out, 80) and "$(gpud select -n 2 \\\n" in plain(out)
    j = journal.Journal(journal.journal_path())
    j.gpu_seen("GPU-" + "a1b2c3d4-" * 4 + "e5f6", "1324021012345", "NVIDIA RTX A6000 " * 2, "94.02.5C.00.01",
               "0000:17:00.0", 0)
    j.record("xid", "Xid 79", gpu=0, uuid="GPU-" + "a1b2c3d4-" * 4 + "e5f6", data={"xid": 79, "line": "NVRM: " * 30})
    j.close()
    code, out = run_in_pty("events", "--dossier", "0")
    assert code == 0 and not too_wide(out, 80) and "1324021012345" in out, out


def _complete(tmp_path, *words: str) -> list[str]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "_GPUD_COMPLETE": "complete_bash", "COMP_WORDS": " ".join(["gpud", *words]),
           "COMP_CWORD": str(len(words))}
    r = subprocess.run([sys.executable, "-m", "gpud"], env=env, capture_output=True, text=True, cwd=tmp_path,
                       timeout=60)
    return r.stdout.split()


def test_completion_of_values(tmp_path) -> None:
    (tmp_path / "lab-quiet.toml").write_text('description = "x"\nextends = "quiet"\n')
    assert _complete(tmp_path, "apply", "q") == ["quiet"]
    assert "lab-quiet.toml" in _complete(tmp_path, "apply", "lab")  # a profile file in the directory
    assert _complete(tmp_path, "profile", "show", "tr") == ["training"]
    assert _complete(tmp_path, "status", "--simulate", "z8-fury-4x-a6000-") == ["z8-fury-4x-a6000-degraded"]
    assert "hgx-8x-h200" in _complete(tmp_path, "doctor", "--simulate", "")
    assert _complete(tmp_path, "events", "--kind", "gpu_") == ["gpu_lost", "gpu_back"]
    checks = _complete(tmp_path, "doctor", "--check", "pcie.")
    assert "pcie.*" in checks and "pcie.link_width" in checks and len(checks) == len(set(checks))
    assert "health.fans" in _complete(tmp_path, "doctor", "--skip", "health.f")


def test_id_names_a_lost_gpu_too(state_dir) -> None:
    # A GPU lost before gpud started has no UUID or bus id NVML will give: its index still names it.
    env = {"GPUD_SIMULATE": "z8-fury-4x-a6000"}
    assert run_gpud("sim", "inject", "gpu_lost", "gpu=2", env=env).returncode == 0
    r = run_gpud("status", "-i", "2", "--json", env=env)
    assert r.returncode == 1 and [g["sample"]["index"] for g in json.loads(r.stdout)["gpus"]] == [2], r.stderr
    assert "LOST" in run_gpud("status", "-i", "2", env=env).stdout
