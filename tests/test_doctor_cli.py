"""`gpud doctor` as users run it: the acceptance cases on the shipped workstations."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import run_gpud
from test_cli import _real_nvml_present

# torch.cuda inspects the Python environment running the tests (CPU torch in CI, none elsewhere),
# env.cuda the variables of the shell: neither says anything about the simulated workstation.
ENV_DEPENDENT = ["--skip", "torch.cuda"]
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "CUDA_", "TORCH_", "PYTORCH_"))}


def doctor_json(*args: str) -> tuple[int, dict]:
    r = run_gpud("doctor", "--json", *ENV_DEPENDENT, *args, env=CLEAN_ENV)
    assert r.stderr == "", r.stderr
    return r.returncode, json.loads(r.stdout)


def by_status(data: dict, status: str) -> set[tuple[str, int | None]]:
    return {(c["id"], c["gpu"]) for c in data["checks"] if c["status"] == status}


def test_degraded_workstation_fails_exactly_what_is_broken(state_dir) -> None:
    code, data = doctor_json("--simulate", "z8-fury-4x-a6000-degraded")
    assert code == 1
    # GPU1 and GPU3 both show thermal slowdown with their fans asked for 100 %: NVML reports the speed
    # asked for, not the real one, so a stalled fan (GPU3) and starved airflow (GPU1) look alike and
    # health.fans names both; GPU3 at 94 °C is 1 °C from slowdown.
    assert by_status(data, "fail") == {
        ("pcie.link_width", 2), ("nvlink.links", 2), ("nvlink.links", 3), ("health.clock_events", 1),
        ("health.xid", 3), ("health.fans", 3), ("health.fans", 1), ("health.thermal", 3),
        ("health.ecc", 3)}  # Xid 48 and an uncorrected aggregate count: not "no uncorrectable error"
    warns = by_status(data, "warn")
    asked = {("pcie.acs", None), ("host.cpu_governor", None), ("host.shm", None), ("config.power_limit", 0)}
    assert asked <= warns
    assert {("config.persistence_mode", i) for i in (1, 2, 3)} <= warns
    # the other warnings are warranted by the description too: GPU1 at 89 °C (6 °C from slowdown),
    # GPU3 held down by SW thermal slowdown, training processes on GPU1 and GPU3
    assert warns - asked - {("config.persistence_mode", i) for i in (1, 2, 3)} == {
        ("health.thermal", 1), ("health.clock_events", 3), ("gpu.processes", None)}
    for c in data["checks"]:
        if c["status"] in ("warn", "fail"):
            assert c["remedy"], c
    assert data["counts"]["fail"] == 9 and sum(data["counts"].values()) == len(data["checks"])


def test_healthy_workstation_passes(state_dir) -> None:
    code, data = doctor_json("--simulate", "z8-fury-4x-a6000")
    assert code == 0
    assert by_status(data, "fail") == set()
    assert by_status(data, "warn") == set()  # the description warrants none
    assert data["host"]["gpu_count"] == 4 and data["host"]["driver_version"] == "550.127.05"
    assert {c["status"] for c in data["checks"]} <= {"pass", "warn", "fail", "skip"}


def test_server_warns_about_numa_only(state_dir) -> None:
    code, data = doctor_json("--simulate", "2s-8x-a6000")
    assert code == 0
    assert by_status(data, "warn") == {("topo.numa", None)}  # 2 sockets: warranted
    numa = next(c for c in data["checks"] if c["id"] == "topo.numa")
    assert "GPU4: NUMA node 1, CPUs 32-63,96-127" in numa["detail"]
    code, _ = doctor_json("--simulate", "2s-8x-a6000", "--strict")
    assert code == 1


def test_sli_workstation_names_file_and_line(state_dir) -> None:
    code, data = doctor_json("--simulate", "z8-g4-2x-rtx8000-sli")
    assert code == 1
    sli = next(c for c in data["checks"] if c["id"] == "sli.disabled")
    assert sli["status"] == "fail"
    assert '/etc/X11/xorg.conf:19: Option "SLI" "On"' in sli["summary"]
    assert "/var/log/Xorg.0.log" in sli["detail"] and sli["remedy"]


def test_no_driver_fails_nvml_available(state_dir) -> None:
    if _real_nvml_present():
        pytest.skip("this machine has a working NVIDIA driver")
    r = run_gpud("doctor", env=CLEAN_ENV)
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr
    assert "[FAIL] nvml.available" in r.stdout and "install the NVIDIA driver" in r.stdout


def test_invalid_config_is_exit_2_and_nothing_runs(tmp_path: Path, state_dir) -> None:
    conf = tmp_path / "gpud.toml"
    conf.write_text("[machine]\nexpect_gpus = \"four\"\n")
    r = run_gpud("doctor", "--simulate", "z8-fury-4x-a6000", "--config", str(conf))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"gpud: error: {conf}: machine.expect_gpus: must be an integer, not 'four'"
    conf.write_text("[doctor]\nthermal_margin_fail_celsius = 20\n")
    r = run_gpud("doctor", "--simulate", "z8-fury-4x-a6000", "--config", str(conf))
    assert r.returncode == 2 and "doctor.thermal_margin_fail_celsius" in r.stderr
    conf.write_text("[machine\n")
    r = run_gpud("doctor", "--simulate", "z8-fury-4x-a6000", "--config", str(conf))
    assert r.returncode == 2 and "not valid TOML" in r.stderr
    r = run_gpud("doctor", "--simulate", "z8-fury-4x-a6000", "--config", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_config_expectations_apply(tmp_path: Path, state_dir) -> None:
    conf = tmp_path / "gpud.toml"
    conf.write_text("[machine]\nexpect_gpus = 4\nnvlink_pairs = [[0, 1], [2, 3]]\n\n[doctor]\nskip = ['host.*']\n")
    r = run_gpud("doctor", "--json", "--simulate", "z8-fury-4x-a6000", "--config", str(conf), *ENV_DEPENDENT)
    data = json.loads(r.stdout)
    assert r.returncode == 0 and not any(c["id"].startswith("host.") for c in data["checks"])
    r = run_gpud("doctor", "--json", "--simulate", "z8-fury-4x-a6000", "--config", str(conf), "--expect-gpus", "8")
    data = json.loads(r.stdout)
    assert r.returncode == 1 and by_status(data, "fail") == {("gpu.count", None)}


def test_quiet_prints_only_failures(state_dir) -> None:
    r = run_gpud("doctor", "--quiet", "--simulate", "z8-fury-4x-a6000", *ENV_DEPENDENT, env=CLEAN_ENV)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == ""
    r = run_gpud("doctor", "-q", "--simulate", "z8-fury-4x-a6000-degraded", env=CLEAN_ENV)
    assert r.returncode == 1 and r.stdout == ""
    assert ("gpud doctor: fail: pcie.link_width GPU2: link trained to x8, though the GPU and its slot do x16"
            in r.stderr.splitlines())


def test_check_and_skip_globs(state_dir) -> None:
    r = run_gpud("doctor", "--json", "--simulate", "z8-fury-4x-a6000-degraded", "--check", "pcie.*",
                 "--skip", "pcie.acs")
    ids = {c["id"] for c in json.loads(r.stdout)["checks"]}
    assert ids == {"pcie.link_width", "pcie.link_gen"} and r.returncode == 1


def test_human_output_groups_and_counts(state_dir) -> None:
    r = run_gpud("doctor", "--simulate", "z8-fury-4x-a6000-degraded", *ENV_DEPENDENT, env=CLEAN_ENV)
    out = r.stdout.splitlines()
    assert out[0] == "gpud doctor — z8-fury-4x-a6000-degraded (driver 550.127.05, CUDA 12.4, 4 GPUs)"
    assert out.index("Driver") < out.index("PCIe and topology") < out.index("Health") < out.index("Host")
    shown = [line for line in out if re.match(r"^  \[(  ok|WARN|FAIL|skip)\] ", line)]
    # counts results, as --json does (GPU0-3 on one line is four), and says how many lines it showed
    n = json.loads(run_gpud("doctor", "--json", "--simulate", "z8-fury-4x-a6000-degraded", *ENV_DEPENDENT,
                            env=CLEAN_ENV).stdout)["counts"]
    assert out[-1] == (f"{n['pass']} passed, {n['warn']} warnings, {n['fail']} failed, {n['skip']} skipped "
                       f"({len(shown)} lines above)")
    fail = next(i for i, line in enumerate(out) if "[FAIL] pcie.link_width" in line)
    assert "GPU2" in out[fail] and any(line.strip().startswith("→ power off") for line in out[fail + 1:fail + 3])
    assert any("config.persistence_mode GPU1-3" in line for line in out)
