"""``gpud report``: one archive with everything support asks for, redacted unless asked."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from conftest import run_gpud

from gpud.json_schema import check

SIM = "z8-fury-4x-a6000-degraded"
SECRETS = ("alice", "bob", "train_resnet.py", SIM)  # the degraded twin's process users and command lines


def _archive(path: Path) -> dict[str, str]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}  # type: ignore[union-attr]


def _report(tmp_path: Path, *args: str) -> dict[str, str]:
    out = tmp_path / "r.tar.gz"
    r = run_gpud("report", "--simulate", SIM, "-o", str(out), *args, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout
    return _archive(out)


def test_report_holds_every_part_and_redacts(tmp_path: Path, state_dir: Path) -> None:
    probe = run_gpud("probe", "--quick", "--device", "cpu", "--suite", "ddp", "--world-sizes", "1",
                     "--simulate", SIM, timeout=240)
    assert probe.returncode == 0, probe.stderr
    files = _report(tmp_path)
    names = {n.removeprefix("gpud-report/") for n in files}
    assert {"status.json", "topo.json", "doctor.json", "probe-history.json", "versions.json", "tuning.json",
            "kernel-nvidia.log", "MANIFEST.txt", "host.json"} <= names
    docs = {n: json.loads(files[f"gpud-report/{n}.json"]) for n in ("status", "topo", "doctor")}
    for doc in docs.values():
        assert check(doc) == []
    history = json.loads(files["gpud-report/probe-history.json"])
    assert len(history) == 1 and check(history[0]) == []
    versions = json.loads(files["gpud-report/versions.json"])
    assert versions["driver"] == "550.127.05" and versions["cuda_driver"] == "12.4"
    assert versions["torch"] and versions["nvidia-ml-py"] and versions["kernel"] and versions["gpud"]
    assert "Xid" in files["gpud-report/kernel-nvidia.log"] and "NVRM" in files["gpud-report/kernel-nvidia.log"]
    assert all("NVRM" in ln or "nvidia" in ln.lower() or "xid" in ln.lower() or "nvlink" in ln.lower()
               for ln in files["gpud-report/kernel-nvidia.log"].splitlines())
    assert json.loads(files["gpud-report/tuning.json"])["state"] is None  # nothing applied
    everything = "\n".join(files.values())
    for secret in SECRETS:
        assert secret not in everything, secret
    procs = [p for g in docs["status"]["gpus"] for p in g["sample"]["processes"] or []]
    assert procs and all(p["user"].startswith("<user") and p["command"] == "<command>" for p in procs)
    assert docs["status"]["host"]["name"] == "<host>" and history[0]["host"]["name"] == "<host>"
    assert "redacted" in files["gpud-report/MANIFEST.txt"]


def test_no_redact_keeps_names(tmp_path: Path, state_dir: Path) -> None:
    files = _report(tmp_path, "--no-redact")
    everything = "\n".join(files.values())
    for secret in SECRETS:
        assert secret in everything, secret
    assert "not redacted" in files["gpud-report/MANIFEST.txt"]


def test_report_records_an_applied_profile(tmp_path: Path, state_dir: Path) -> None:
    env = {"GPUD_SIM_EUID": "0"}
    r = run_gpud("apply", "balanced", "--simulate", SIM, env=env)
    assert r.returncode == 0, r.stderr
    files = _report(tmp_path)
    tuning = json.loads(files["gpud-report/tuning.json"])
    assert tuning["state"]["profile"] == "balanced"


def test_unwritable_target_is_one_line(tmp_path: Path, state_dir: Path) -> None:
    r = run_gpud("report", "--simulate", SIM, "-o", str(tmp_path / "no" / "such" / "dir" / "r.tar.gz"))
    # refused before anything is gathered: a bad output path is bad input (exit 2), one line
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--output" in r.stderr
