"""The command line, run as a user runs it (child processes)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO, run_gpud

from gpud.errors import GpudError
from gpud.hw.nvml import Nvml

STATUS_INFO_FIELDS = {"index", "uuid", "name", "serial", "architecture", "pci_bus_id", "vbios_version",
                      "memory_total_bytes",
                      "pcie_max_generation", "pcie_max_width", "power_default_limit_watts", "power_min_limit_watts",
                      "power_max_limit_watts", "temperature_slowdown_celsius", "temperature_shutdown_celsius",
                      "max_clocks_mhz", "fan_count", "fan_min_speed_percent", "fan_max_speed_percent",
                      "nvlink_count", "numa_node", "cpu_affinity"}
STATUS_SAMPLE_FIELDS = {"temperature_celsius", "fans", "power_watts", "power_limit_watts", "energy_joules",
                        "clocks_mhz", "utilization_gpu_percent", "memory_used_bytes", "memory_total_bytes",
                        "pcie_generation", "pcie_width", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second",
                        "pcie_replay_errors", "clock_events", "persistence_mode", "compute_mode", "ecc_enabled",
                        "ecc_pending", "ecc_errors", "retired_pages_single_bit", "retired_pages_double_bit",
                        "retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure", "nvlinks",
                        "processes"}


def test_topo_shows_nv4_pairs_and_pcie_between(state_dir) -> None:
    r = run_gpud("topo", env={"GPUD_SIMULATE": "z8-fury-4x-a6000"})
    assert r.returncode == 0, r.stderr
    rows: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():  # the first table is the matrix
        if re.match(r"^GPU\d\s", line):
            rows.setdefault(line.split()[0], line.split()[1:5])
    assert rows["GPU0"] == ["X", "NV4", "NODE", "NODE"]
    assert rows["GPU1"] == ["NV4", "X", "NODE", "NODE"]
    assert rows["GPU2"] == ["NODE", "NODE", "X", "NV4"]
    assert rows["GPU3"] == ["NODE", "NODE", "NV4", "X"]
    j = run_gpud("topo", "--json", env={"GPUD_SIMULATE": "z8-fury-4x-a6000"})
    data = json.loads(j.stdout)
    assert data["matrix"] == [[c for c in rows[f"GPU{i}"]] for i in range(4)]
    assert data["gpus"][0]["cpu_affinity"] == list(range(112)) and data["gpus"][2]["numa_node"] == 0
    assert data["p2p"]["nvlink"][0][1] == "OK" and data["p2p"]["nvlink"][0][2] == "not_supported"


def test_status_json_lists_8_gpus_with_every_field(state_dir) -> None:
    r = run_gpud("status", "--simulate", "2s-8x-a6000", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["host"]["driver_version"] == "550.127.05"
    assert len(data["gpus"]) == 8
    for g in data["gpus"]:
        assert STATUS_INFO_FIELDS <= set(g["info"])
        assert STATUS_SAMPLE_FIELDS <= set(g["sample"])
        s = g["sample"]
        assert s["ecc_enabled"] is True and s["ecc_errors"]["volatile_uncorrected"] == 0
        assert s["retired_pages_double_bit"] is None  # Ampere: unsupported → null, not 0
        assert s["remapped_rows_pending"] is False
        assert len(s["nvlinks"]) == 4 and all(ln["up"] for ln in s["nvlinks"])
        assert s["fans"][0]["policy"] == "auto"


def test_status_table_plain_when_piped(state_dir) -> None:
    r = run_gpud("status", "--simulate", "z8-fury-4x-a6000-degraded")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].startswith("z8-fury-4x-a6000-degraded — driver 550.127.05")
    assert "\x1b[" not in r.stdout
    gpu2 = next(line for line in lines if line.startswith("2 "))
    assert "x8/16" in gpu2


def _real_nvml_present() -> bool:
    try:
        Nvml().init()
        return True
    except GpudError:
        return False


def test_no_driver_no_simulation_is_one_line_exit_1(state_dir) -> None:
    if _real_nvml_present():
        pytest.skip("this machine has a working NVIDIA driver")
    r = run_gpud("status")
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "NVIDIA driver/NVML not available" in lines[0] and "remedy:" in lines[0]
    assert "Traceback" not in r.stderr


def test_bad_simulation_name_is_exit_2(state_dir) -> None:
    r = run_gpud("status", "--simulate", "no-such-box")
    assert r.returncode == 2
    assert "no-such-box" in r.stderr and "z8-fury-4x-a6000" in r.stderr and "Traceback" not in r.stderr


def test_bad_description_file_is_exit_2_naming_file_and_key(tmp_path, state_dir) -> None:
    p = tmp_path / "broken.toml"
    p.write_text('[machine]\nname = "x"\n[[gpu]]\nmodel = "RTX A6000"\nbus_id = "nope"\nroot_port = "0000:16:01.0"\n')
    r = run_gpud("topo", "--simulate", str(p))
    assert r.returncode == 2
    assert r.stderr.strip() == f"gpud: error: {p}: gpu[0].bus_id: must be a PCI address like 0000:17:00.0, not 'nope'"


def test_version_and_sim_list(state_dir) -> None:
    r = run_gpud("--version")
    assert r.returncode == 0 and re.fullmatch(r"gpud \d+\.\d+\.\d+\n", r.stdout)
    r = run_gpud("sim", "list", "--json")
    names = [d["name"] for d in json.loads(r.stdout)["machines"]]
    assert "z8-fury-4x-a6000-degraded" in names and len(names) == 6


def test_sim_inject_reset_round_trip(state_dir) -> None:
    env = {"GPUD_SIMULATE": "z8-fury-4x-a6000"}
    r = run_gpud("sim", "inject", "gpu_lost", "gpu=2", env=env)
    assert r.returncode == 0, r.stderr
    s = json.loads(run_gpud("status", "--json", env=env).stdout)
    assert [g["sample"]["lost"] for g in s["gpus"]] == [False, False, True, False]
    assert "LOST" in run_gpud("status", env=env).stdout
    r = run_gpud("sim", "inject", "gpu_lost", "gpu=9", env=env)
    assert r.returncode == 2 and "fault.gpu" in r.stderr
    assert run_gpud("sim", "reset", env=env).returncode == 0
    s = json.loads(run_gpud("status", "--json", env=env).stdout)
    assert not any(g["sample"]["lost"] for g in s["gpus"])


def test_importing_the_cli_loads_neither_torch_nor_the_simulator() -> None:
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import gpud.cli"], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 0
    modules = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")}
    assert "gpud.cli" in modules
    assert not any(m == "torch" or m.startswith("torch.") for m in modules)
    assert not any(m == "gpud.sim" or m.startswith("gpud.sim.") for m in modules)
    assert "pynvml" not in modules  # the bindings load when a command needs them


def test_a_misspelt_command_is_named_with_the_nearest_ones() -> None:
    """The commands are built only when one runs (``gpud.cli.Commands``); a misspelt one still gets typer's hint."""
    r = run_gpud("staus")
    assert r.returncode == 2 and "No such command 'staus'. Did you mean 'status'?" in r.stderr


def test_the_command_table_names_every_command_each_module_registers() -> None:
    """``gpud.cli.COMMANDS`` is how a command is found without building the others: a command a module
    registers and the table lacks could never run, and one the table names that no module registers would list
    in `gpud --help` and fail."""
    import typer

    from gpud.cli import COMMANDS

    registered: dict[str, str] = {}
    for module in sorted({m for m, _ in COMMANDS.values()}):
        sub = typer.Typer()
        __import__(f"gpud.cli.{module}", fromlist=["register"]).register(sub)
        names = [c.name for c in sub.registered_commands] + [g.name for g in sub.registered_groups]
        registered.update({str(n): module for n in names})
    assert registered == {name: module for name, (module, _) in COMMANDS.items()}
