"""``gpud sim import``: twins of real machines from their ``nvidia-smi -q`` / ``-q -x`` / ``topo -m``.

The fixtures in ``tests/fixtures/nvidia-smi/`` are real outputs (the first line or comment names
the source). The expected values here are read from the dumps by this file's own small readers,
not by the importer, and compared with what gpud reads back from the twin.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_gpud
from tuning_helpers import cli

from gpud.sim.presets import GPU_MODELS
from gpud.text import ranges

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
REASONS = {"Idle": "gpu_idle", "Applications Clocks Setting": "applications_clocks_setting",
           "SW Power Cap": "sw_power_cap", "HW Slowdown": "hw_slowdown", "HW Thermal Slowdown": "hw_thermal_slowdown",
           "HW Power Brake Slowdown": "hw_power_brake_slowdown", "Sync Boost": "sync_boost",
           "SW Thermal Slowdown": "sw_thermal_slowdown", "Display Clock Setting": "display_clock_setting"}


# -- the test's own readers of the dumps --------------------------------------------------------------

def text_gpus(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi -q`` as one dict per GPU: "Section/Sub/Key" → value (first occurrence), plus the
    active clock-event reasons and the processes."""
    gpus: list[dict[str, Any]] = []
    stack: list[tuple[int, str]] = []
    for raw in text.splitlines():
        if raw.startswith("GPU 0000"):
            gpus.append({"bus": raw[4:].strip(), "reasons": set(), "pids": {}, "reasons_seen": False,
                         "migs": [], "pid_instances": {}})
            stack = []
            continue
        if not gpus or not raw.strip() or raw.startswith("```"):
            continue
        indent = len(raw) - len(raw.lstrip())
        if raw.strip() == "MIG Device":
            gpus[-1]["migs"].append({})
        key, sep, value = raw.strip().partition(":")
        key, value = key.strip(), value.strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([s for _, s in stack] + [key])
        g = gpus[-1]
        if sep and value and path.startswith("MIG Device/"):
            g["migs"][-1][path.removeprefix("MIG Device/")] = value
        if sep and value and path in ("Processes/GPU instance ID", "Processes/Compute instance ID"):
            g["_instance"] = {**g.get("_instance", {}), path: value}
        if path == "Processes/Process ID" and value.isdigit():
            ids = g.pop("_instance", {})
            g["pid_instances"][int(value)] = (_int(ids.get("Processes/GPU instance ID")),
                                              _int(ids.get("Processes/Compute instance ID")))
        if sep and value:
            g.setdefault(path, value)
            if path.split("/")[0] in ("Clocks Event Reasons", "Clocks Throttle Reasons") and "/" in path:
                g["reasons_seen"] = True
                if value == "Active":
                    g["reasons"].add(REASONS[key])
            if path == "Processes/Process ID" and value.isdigit():
                g["pids"][int(value)] = "C"
                g["_pid"] = int(value)
            if path == "Processes/Type" and "_pid" in g:
                g["pids"][g["_pid"]] = value
        else:
            stack.append((indent, key))
    return gpus


TEXT_KEYS = {  # our names → the paths in text dumps (new, then old drivers)
    "name": ["Product Name"], "total": ["FB Memory Usage/Total"],
    "default": ["GPU Power Readings/Default Power Limit", "Power Readings/Default Power Limit"],
    "min": ["GPU Power Readings/Min Power Limit", "Power Readings/Min Power Limit"],
    "max": ["GPU Power Readings/Max Power Limit", "Power Readings/Max Power Limit"],
    "limit": ["GPU Power Readings/Current Power Limit", "Power Readings/Power Limit"],
    "max_graphics": ["Max Clocks/Graphics"], "max_sm": ["Max Clocks/SM"], "max_memory": ["Max Clocks/Memory"],
    "app_graphics": ["Default Applications Clocks/Graphics"], "app_memory": ["Default Applications Clocks/Memory"],
    "sm": ["Clocks/SM"], "memory": ["Clocks/Memory"],
    "shutdown": ["Temperature/GPU Shutdown Temp"], "slowdown": ["Temperature/GPU Slowdown Temp"],
    "max_operating": ["Temperature/GPU Max Operating Temp"],
    "tl_shutdown": ["Temperature/GPU Shutdown T.Limit Temp"], "tl_slowdown": ["Temperature/GPU Slowdown T.Limit Temp"],
    "temp": ["Temperature/GPU Current Temp"],
    "gen": ["PCI/GPU Link Info/PCIe Generation/Current"], "gen_max": ["PCI/GPU Link Info/PCIe Generation/Max"],
    "width": ["PCI/GPU Link Info/Link Width/Current"], "width_max": ["PCI/GPU Link Info/Link Width/Max"],
    "persistence": ["Persistence Mode"], "ecc": ["ECC Mode/Current", "Ecc Mode/Current"],
    "util": ["Utilization/Gpu", "Utilization/GPU"], "fan": ["Fan Speed"], "compute": ["Compute Mode"],
    "draw": ["GPU Power Readings/Power Draw", "GPU Power Readings/Average Power Draw", "Power Readings/Power Draw",
             "GPU Power Readings/Instantaneous Power Draw"],  # Turing: Average N/A, the instantaneous draw
}
XML_KEYS = {
    "name": ["product_name"], "total": ["fb_memory_usage/total"],
    "default": ["gpu_power_readings/default_power_limit"], "min": ["gpu_power_readings/min_power_limit"],
    "max": ["gpu_power_readings/max_power_limit"], "limit": ["gpu_power_readings/current_power_limit"],
    "max_graphics": ["max_clocks/graphics_clock"], "max_sm": ["max_clocks/sm_clock"],
    "max_memory": ["max_clocks/mem_clock"], "app_graphics": ["default_applications_clocks/graphics_clock"],
    "app_memory": ["default_applications_clocks/mem_clock"], "sm": ["clocks/sm_clock"], "memory": ["clocks/mem_clock"],
    "shutdown": ["temperature/gpu_temp_max_threshold"], "slowdown": ["temperature/gpu_temp_slow_threshold"],
    "max_operating": ["temperature/gpu_temp_max_gpu_threshold"],
    "tl_shutdown": ["temperature/gpu_temp_max_tlimit_threshold"],
    "tl_slowdown": ["temperature/gpu_temp_slow_tlimit_threshold"], "temp": ["temperature/gpu_temp"],
    "gen": ["pci/pci_gpu_link_info/pcie_gen/current_link_gen"],
    "gen_max": ["pci/pci_gpu_link_info/pcie_gen/max_link_gen"],
    "width": ["pci/pci_gpu_link_info/link_widths/current_link_width"],
    "width_max": ["pci/pci_gpu_link_info/link_widths/max_link_width"],
    "persistence": ["persistence_mode"], "ecc": ["ecc_mode/current_ecc"], "util": ["utilization/gpu_util"],
    "fan": ["fan_speed"], "compute": ["compute_mode"], "draw": ["gpu_power_readings/average_power_draw",
                                                                          "gpu_power_readings/power_draw",
                                                                          "gpu_power_readings/instant_power_draw"],
}


def xml_gpus(text: str) -> list[dict[str, Any]]:
    root = ET.fromstring(text)
    gpus = []
    for gpu in root.findall("gpu"):
        migs = [{"GPU Instance ID": m.findtext("gpu_instance_id"),
                 "Compute Instance ID": m.findtext("compute_instance_id"),
                 **{f"Shared FB Memory Usage/{k.capitalize()}": m.findtext(f"fb_memory_usage/{k}")
                    for k in ("total", "reserved", "used", "free")}} for m in gpu.findall("mig_devices/mig_device")]
        g: dict[str, Any] = {"bus": gpu.get("id"), "reasons": set(), "pids": {}, "reasons_seen": False,
                             "migs": migs, "pid_instances": {
                                 int(p.findtext("pid") or 0): (_int(p.findtext("gpu_instance_id")),
                                                                _int(p.findtext("compute_instance_id")))
                                 for p in gpu.iter("process_info") if (p.findtext("pid") or "").strip().isdigit()}}

        stack = [(gpu, "")]
        while stack:
            el, path = stack.pop(0)
            for child in el:
                p = f"{path}/{child.tag}" if path else child.tag
                if len(child):
                    stack.append((child, p))
                else:
                    g.setdefault(p, (child.text or "").strip())
        for section, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                                ("clocks_throttle_reasons", "clocks_throttle_reason_")):
            for el in gpu.find(section) or []:
                g["reasons_seen"] = True
                if (el.text or "").strip() == "Active":
                    g["reasons"].add(el.tag.removeprefix(prefix).replace("display_clocks", "display_clock"))
        for p in gpu.iter("process_info"):
            if (p.findtext("pid") or "").strip().isdigit():
                g["pids"][int(p.findtext("pid") or 0)] = p.findtext("type")
        gpus.append(g)
    return gpus


def _int(v: str | None) -> int | None:
    return int(v.strip()) if v is not None and v.strip().isdigit() else None


def dump_instances(g: dict[str, Any]) -> list[tuple[int | None, ...]]:
    """The dump's MIG devices as (GI, CI, total, reserved, used, free MiB), sorted."""
    def mib(m: dict[str, Any], leaf: str) -> int | None:
        return _int((m.get(f"Shared FB Memory Usage/{leaf}") or "").removesuffix("MiB"))
    return sorted((_int(m.get("GPU Instance ID")), _int(m.get("Compute Instance ID")), mib(m, "Total"),
                   mib(m, "Reserved"), mib(m, "Used"), mib(m, "Free")) for m in g["migs"])


def want(g: dict[str, Any], keys: dict[str, list[str]], name: str) -> str | None:
    """The dump's value for ``name``, None where the dump has none (N/A, deprecated, absent)."""
    for path in keys[name]:
        v = g.get(path)
        if v is not None and re.match(r"^-?\d", v) or (v and name in ("name", "persistence", "ecc", "compute")):
            return v
    return None


def num(v: str | None) -> float | None:
    return None if v is None else float(re.match(r"-?\d+(\.\d+)?", v).group(0))  # type: ignore[union-attr]


def bus(b: str) -> str:
    dom, rest = b.split(":", 1)
    return f"{int(dom, 16):04x}:{rest.lower()}"


def import_and_status(capsys: pytest.CaptureFixture[str], tmp_path: Path, dump: Path, *extra: str
                      ) -> tuple[dict[str, Any], str]:
    twin = tmp_path / "twin.toml"
    code, _, err = cli(capsys, "sim", "import", str(dump), "-o", str(twin), *extra)
    assert code == 0, err
    code, out, err = cli(capsys, "status", "--json", "--simulate", str(twin))
    assert code == 0, err
    return json.loads(out), twin.read_text()


# -- the round trip ----------------------------------------------------------------------------------

def test_the_output_names_what_was_inferred(capsys, tmp_path) -> None:
    twin = tmp_path / "ada.toml"
    code, _, err = cli(capsys, "sim", "import", str(FIXTURES / "rtx-6000-ada-550.txt"), "-o", str(twin))
    assert code == 0
    head = [line for line in twin.read_text().splitlines() if line.startswith("#")]
    assert "# Inferred (the dump does not say it):" in head
    # the absolute T.Limit is not printed: it is the current temperature plus the "GPU T.Limit Temp"
    # margin (27 + 61 C on GPU 0), not the preset's, so it is not listed as inferred
    assert not any("max_operating_celsius" in line for line in head)
    assert "gpu[*].memory_ecc_mib" in err and "inferred" in err
    data = tomllib.loads(twin.read_text())
    assert data["machine"]["name"] == "ada" and len(data["gpu"]) == 8
    assert data["gpu"][3]["uuid"] == "GPU-" + text_gpus((FIXTURES / "rtx-6000-ada-550.txt").read_text())[3][
        "GPU UUID"].removeprefix("GPU-")


def test_stdout_without_output_file_is_a_loadable_description(capsys, tmp_path) -> None:
    code, out, err = cli(capsys, "sim", "import", str(FIXTURES / "h200-590-idle.txt"))
    assert code == 0 and "stdout: 1 GPU(s)" in err
    (tmp_path / "h200.toml").write_text(out)
    from gpud.sim.description import load

    desc = load(tmp_path / "h200.toml")
    g = desc.gpus[0]
    assert g.model == "H200" and g.tlimit_thresholds and g.fans == 0
    assert g.vbios == "96.00.A5.00.03" and g.pci_subsystem_id == 0x18BE10DE  # this board, not the preset's


def test_an_unknown_model_is_generic_from_its_own_numbers(capsys, tmp_path) -> None:
    status, text = import_and_status(capsys, tmp_path, FIXTURES / "rtx-3090-525.txt")
    info = status["gpus"][0]["info"]
    assert info["name"] == "NVIDIA GeForce RTX 3090" and info["pci_device_id"] == 0x220410DE
    assert info["power_max_limit_watts"] == 385.0 and info["architecture"] == "ampere"
    assert "no preset for 'NVIDIA GeForce RTX 3090'" in text
    assert "graphics process" not in text  # kept, as graphics (the round trip below reads it back)


# -- topo -m ----------------------------------------------------------------------------------------

def first_gpus(text: str, k: int) -> str:
    """The dump of its first ``k`` GPUs (as `nvidia-smi -q -i 0,1,…` would print)."""
    starts = [m.start() for m in re.finditer(r"^GPU 0000", text, re.M)]
    return re.sub(r"(Attached GPUs\s*:\s*)\d+", rf"\g<1>{k}", text[:starts[k]] if k < len(starts) else text)


def matrix_of(topo_text: str) -> list[list[str]]:
    rows = [line.split() for line in topo_text.splitlines() if re.match(r"^GPU\d+\s", line)]
    n = len(rows)
    return [row[1:n + 1] for row in rows]


def topo_roundtrip(capsys, tmp_path: Path, q: Path, topo: Path) -> dict[str, Any]:
    twin = tmp_path / "twin.toml"
    code, _, err = cli(capsys, "sim", "import", str(q), "--topo", str(topo), "-o", str(twin))
    assert code == 0, err
    code, out, err = cli(capsys, "topo", "--json", "--simulate", str(twin))
    assert code == 0, err
    return json.loads(out)


def test_nvlink_pair_numa_and_cpus_from_topo(capsys, tmp_path) -> None:
    q = tmp_path / "q.txt"
    q.write_text(first_gpus((FIXTURES / "rtx-a6000-linux-550.txt").read_text(), 3))
    topo_text = (FIXTURES / "topo-a6000-nvlink-pair.txt").read_text()
    got = topo_roundtrip(capsys, tmp_path, q, FIXTURES / "topo-a6000-nvlink-pair.txt")
    assert got["matrix"] == matrix_of(topo_text)
    assert [ranges(g["cpu_affinity"]) for g in got["gpus"]] == ["0-31,64-95"] * 3
    assert [g["numa_node"] for g in got["gpus"]] == [0, 0, 0]
    assert [g["nvlinks_up"] for g in got["gpus"]] == [4, 4, 0]


def test_hgx_every_pair_nv18_is_an_nvswitch_fabric(capsys, tmp_path) -> None:
    topo = FIXTURES / "topo-hgx-h100.txt"
    got = topo_roundtrip(capsys, tmp_path, FIXTURES / "h100-sxm-565-hgx.txt", topo)
    assert got["matrix"] == matrix_of(topo.read_text())
    assert [g["numa_node"] for g in got["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [ranges(g["cpu_affinity"]) for g in got["gpus"]] == ["0-51,104-155"] * 4 + ["52-103,156-207"] * 4
    data = tomllib.loads((tmp_path / "twin.toml").read_text())
    assert len(data["machine"]["nvswitches"]) == 4 and all(g["nvswitch"] for g in data["gpu"])
    assert "nvlink" not in data


def test_newer_topo_with_nic_columns_and_gpu_numa_id(capsys, tmp_path) -> None:
    """Drivers since 535 add NIC columns and rows, a GPU NUMA ID column and a NIC legend (the layout
    of the HGX matrix above with two NICs added, as such machines print it)."""
    hgx = (FIXTURES / "topo-hgx-h100.txt").read_text()
    rows = [line.split() for line in hgx.splitlines() if re.match(r"^GPU\d\s", line)]
    nic = ["PXB", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS"]
    lines = ["\t" + "\t".join([f"GPU{i}" for i in range(8)] + ["NIC0", "NIC1", "CPU Affinity", "NUMA Affinity",
                                                                "GPU NUMA ID"])]
    for i, r in enumerate(rows):
        lines.append("\t".join(r[:9] + [nic[i], nic[7 - i], r[9], r[10], "N/A"]))
    lines += ["NIC0\t" + "\t".join(nic) + "\t X \tSYS", "NIC1\t" + "\t".join(nic[::-1]) + "\tSYS\t X ",
              "", "Legend:", "", "  X    = Self", "", "NIC Legend:", "", "  NIC0: mlx5_0", "  NIC1: mlx5_1"]
    topo = tmp_path / "topo.txt"
    topo.write_text("\n".join(lines) + "\n")
    got = topo_roundtrip(capsys, tmp_path, FIXTURES / "h100-sxm-565-hgx.txt", topo)
    assert got["matrix"] == [r[1:9] for r in rows]
    assert [g["numa_node"] for g in got["gpus"]] == [0] * 4 + [1] * 4


def test_pcie_levels_make_switches_root_ports_and_host_bridges(capsys, tmp_path) -> None:
    """A matrix with every PCIe level (written for this test over a real 5-GPU dump)."""
    q = tmp_path / "q.txt"
    q.write_text(first_gpus((FIXTURES / "rtx-a6000-linux-550.txt").read_text(), 5))
    rows = [["X", "PIX", "PXB", "PHB", "SYS"], ["PIX", "X", "PXB", "PHB", "SYS"], ["PXB", "PXB", "X", "PHB", "SYS"],
            ["PHB", "PHB", "PHB", "X", "SYS"], ["SYS", "SYS", "SYS", "SYS", "X"]]
    cpus = ["0-15,32-47"] * 4 + ["16-31,48-63"]
    lines = ["\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tCPU Affinity\tNUMA Affinity"]
    lines += [f"GPU{i}\t" + "\t".join(r) + f"\t{cpus[i]}\t{0 if i < 4 else 1}" for i, r in enumerate(rows)]
    topo = tmp_path / "topo.txt"
    topo.write_text("\n".join(lines) + "\n\nLegend:\n\n  X    = Self\n")
    got = topo_roundtrip(capsys, tmp_path, q, topo)
    assert got["matrix"] == rows
    assert [ranges(g["cpu_affinity"]) for g in got["gpus"]] == cpus
    data = tomllib.loads((tmp_path / "twin.toml").read_text())
    g = data["gpu"]
    assert g[0]["switch"] == g[1]["switch"] and "switch" not in g[2]
    assert g[0]["root_port"] == g[2]["root_port"] != g[3]["root_port"]
    assert g[0]["root_port"].rsplit(":", 1)[0] == g[3]["root_port"].rsplit(":", 1)[0]
    assert data["machine"]["sockets"] == 2 and data["machine"]["cores_per_socket"] == 16


# -- doctor on a twin reports what a person reading the dump would ---------------------------------------

def doctor(capsys, tmp_path: Path, q_text: str, name: str = "twin") -> tuple[int, list[dict[str, Any]]]:
    q = tmp_path / f"{name}.txt"
    q.write_text(q_text)
    twin = tmp_path / f"{name}.toml"
    code, _, err = cli(capsys, "sim", "import", str(q), "-o", str(twin))
    assert code == 0, err
    code, out, _ = cli(capsys, "doctor", "--json", "--simulate", str(twin))
    return code, json.loads(out)["checks"]


def by_id(checks: list[dict[str, Any]], check_id: str) -> dict[int | None, str]:
    return {c["gpu"]: c["status"] for c in checks if c["id"] == check_id}


def in_gpu(text: str, k: int, old: str, new: str) -> str:
    """Replace ``old`` with ``new`` in the k-th GPU's section only."""
    starts = [m.start() for m in re.finditer(r"^GPU 0000", text, re.M)] + [len(text)]
    part = text[starts[k]:starts[k + 1]]
    assert old in part
    return text[:starts[k]] + part.replace(old, new, 1) + text[starts[k + 1]:]


def test_doctor_on_the_a6000_twin_finds_idle_gen1_fine(capsys, tmp_path) -> None:
    code, checks = doctor(capsys, tmp_path, (FIXTURES / "rtx-a6000-linux-550.txt").read_text())
    assert set(by_id(checks, "pcie.link_gen").values()) == {"pass"}  # Gen1 beside Max 4, idle: power saving
    assert set(by_id(checks, "pcie.link_width").values()) == {"pass"}
    assert set(by_id(checks, "health.ecc").values()) == {"pass"}
    assert set(by_id(checks, "config.persistence_mode").values()) == {"pass"}
    assert not [c for c in checks if c["status"] == "fail"]
    assert code == 0
    # the dump shows SW Power Cap active on three idle GPUs drawing a tenth of their limit: the driver's
    # power management at idle, not a limit holding them back (issue 21)
    assert set(by_id(checks, "health.clock_events").values()) == {"pass"}
    summaries = {c["gpu"]: c["summary"] for c in checks if c["id"] == "health.clock_events"}
    text = text_gpus((FIXTURES / "rtx-a6000-linux-550.txt").read_text())
    capped = {i for i, g in enumerate(text) if "sw_power_cap" in g["reasons"]}
    assert capped == {2, 3, 8} and all("far below the limit" in summaries[i] for i in capped)


def test_doctor_fails_a_remapping_failure_and_a_pending_remap(capsys, tmp_path) -> None:
    text = (FIXTURES / "rtx-a6000-linux-550.txt").read_text()
    text = in_gpu(text, 4, "Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes")
    text = in_gpu(text, 6, "        Pending                           : No\n        Remapping",
                  "        Pending                           : Yes\n        Remapping")
    code, checks = doctor(capsys, tmp_path, text)
    ecc = by_id(checks, "health.ecc")
    assert ecc[4] == "fail" and ecc[6] == "fail"
    assert {s for i, s in ecc.items() if i not in (4, 6)} == {"pass"}
    summaries = {c["gpu"]: c["summary"] for c in checks if c["id"] == "health.ecc"}
    assert "row remapping failed" in summaries[4] and "row remapping pending" in summaries[6]
    assert code == 1


def test_doctor_flags_a_link_trained_down_and_ecc_errors(capsys, tmp_path) -> None:
    text = (FIXTURES / "rtx-a6000-linux-550.txt").read_text()
    pad = " " * 19
    text = in_gpu(text, 2, f"Current{pad}: 16x", f"Current{pad}: 8x")
    text = in_gpu(text, 5, "DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : 2")
    code, checks = doctor(capsys, tmp_path, text)
    width = by_id(checks, "pcie.link_width")
    assert width[2] in ("warn", "fail") and {s for i, s in width.items() if i != 2} == {"pass"}
    assert by_id(checks, "health.ecc")[5] == "fail"
    assert code == 1


def test_a_gen3_slot_and_retired_pages_reach_doctor(capsys, tmp_path) -> None:
    """"Host Max: 3" beside "Device Max: 4" is an older slot, not a link that trained down; 70 retired
    pages are past the limit of 63 (the counts as a card with page retirement prints them)."""
    text = (FIXTURES / "rtx-a6000-linux-550.txt").read_text()
    gen_max = " " * 16 + "Max" + " " * 23 + ": "
    text = in_gpu(text, 0, f"{gen_max}4\n", f"{gen_max}3\n")
    text = in_gpu(text, 0, "Host Max                  : 4", "Host Max                  : 3")
    text = in_gpu(text, 1, "Single Bit ECC                    : N/A", "Single Bit ECC                    : 40")
    text = in_gpu(text, 1, "Double Bit ECC                    : N/A", "Double Bit ECC                    : 30")
    code, checks = doctor(capsys, tmp_path, text)
    gen = by_id(checks, "pcie.link_gen")
    assert gen[0] == "warn" and "Gen3 slot" in next(c["summary"] for c in checks
                                                   if c["id"] == "pcie.link_gen" and c["gpu"] == 0)
    assert {s for i, s in gen.items() if i} == {"pass"}
    ecc = by_id(checks, "health.ecc")
    assert ecc[1] == "fail" and ecc[0] == "pass" and code == 1
    data = tomllib.loads((tmp_path / "twin.toml").read_text())
    assert data["gpu"][0]["slot_generation"] == 3 and "slot_generation" not in data["gpu"][2]


def test_doctor_on_an_idle_h200_at_gen5_and_a_busy_l40s(capsys, tmp_path) -> None:
    _, checks = doctor(capsys, tmp_path, (FIXTURES / "h200-590-idle.txt").read_text(), "h200")
    assert by_id(checks, "pcie.link_gen") == {0: "pass"} and by_id(checks, "health.ecc") == {0: "pass"}
    _, checks = doctor(capsys, tmp_path, (FIXTURES / "l40s-595-load.txt").read_text(), "l40s")
    assert by_id(checks, "config.persistence_mode")[0] != "pass"  # the dump says Disabled
    assert by_id(checks, "pcie.link_gen")[0] == "pass"


# -- the presets against every fixture of their model ---------------------------------------------------

PRESET_KEYS = ("slowdown_celsius", "shutdown_celsius", "max_operating_celsius", "memory_mib", "memory_ecc_mib",
               "power_default_watts", "power_min_watts", "power_max_watts", "max_graphics_mhz", "max_sm_mhz",
               "max_memory_mhz", "default_app_graphics_mhz", "default_app_memory_mhz", "pci_device_id",
               "pcie_max_generation", "idle_memory_mhz")


def preset_disagreements(capsys, tmp_path: Path, dump: str) -> list[str]:
    """Model keys the twin had to override because the dump differs from the preset."""
    twin = tmp_path / f"{dump}.toml"
    code, _, err = cli(capsys, "sim", "import", str(FIXTURES / dump), "-o", str(twin))
    assert code == 0, err
    data = tomllib.loads(twin.read_text())
    out = []
    for i, g in enumerate(data["gpu"]):
        preset = GPU_MODELS[g["model"]]
        keys = [k for k in PRESET_KEYS if k in g and "name" not in g]
        if g.get("tlimit_thresholds", preset.tlimit_thresholds) and "max_operating_celsius" in g:
            # T.Limit is this GPU's reading plus its margin (it differs by a degree or two between GPUs of
            # one machine): the preset must agree on the offsets the dump prints, not on the absolute value
            top = g["max_operating_celsius"]
            keys = [k for k in keys if k not in ("max_operating_celsius", "slowdown_celsius", "shutdown_celsius")]
            for k in ("slowdown_celsius", "shutdown_celsius"):
                if top - g.get(k, getattr(preset, k)) != preset.max_operating_celsius - getattr(preset, k):
                    out.append(f"gpu[{i}].T.Limit - {k} = {top - g.get(k, getattr(preset, k))} (preset "
                               f"{preset.max_operating_celsius - getattr(preset, k)})")
        out += [f"gpu[{i}].{k} = {g[k]!r} (preset {getattr(preset, k)!r})" for k in keys]
    return out


@pytest.mark.parametrize("dump", ["rtx-a6000-linux-550.txt", "rtx-a6000-windows-537.txt", "rtx-6000-ada-550.txt",
                                  "h200-590-idle.txt", "h200-mig-590-idle.txt"])
def test_presets_agree_with_every_gpu_of_every_dump_of_their_model(capsys, tmp_path, dump: str) -> None:
    assert preset_disagreements(capsys, tmp_path, dump) == []


def test_a_wrong_preset_threshold_fails(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(GPU_MODELS, "RTX A6000", replace(GPU_MODELS["RTX A6000"], slowdown_celsius=93))
    wrong = preset_disagreements(capsys, tmp_path, "rtx-a6000-linux-550.txt")
    assert wrong and all(".slowdown_celsius = 95 (preset 93)" in w for w in wrong) and len(wrong) == 9


# -- bad input ------------------------------------------------------------------------------------

def bad(capsys, tmp_path: Path, text: str | bytes, *extra: str, name: str = "q.txt") -> str:
    """Import that must be refused: exit 2, one line ``gpud: error: FILE:LINE: reason``."""
    q = tmp_path / name
    q.write_bytes(text if isinstance(text, bytes) else text.encode())
    code, out, err = cli(capsys, "sim", "import", str(q), *extra, "-o", str(tmp_path / "twin.toml"))
    assert code == 2, err
    assert "Traceback" not in err and not (tmp_path / "twin.toml").exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpud: error: "), err
    return lines[0].removeprefix("gpud: error: ")


def test_a_dump_cut_off_inside_a_gpu_names_the_line(capsys, tmp_path) -> None:
    text = (FIXTURES / "rtx-a6000-linux-550.txt").read_text()
    cut = text[:text.index("    Temperature", text.index("GPU 00000000:D6:00.0"))]
    msg = bad(capsys, tmp_path, cut)
    last = len(cut.rstrip("\n").splitlines())
    assert msg.startswith(f"{tmp_path / 'q.txt'}:{last}: the dump ends inside GPU 00000000:D6:00.0")
    assert "truncated" in msg


def test_a_single_gpu_dump_cut_short_imports_and_names_what_it_could_not_read(capsys, tmp_path) -> None:
    text = (FIXTURES / "h200-590-idle.txt").read_text()
    q = tmp_path / "q.txt"
    q.write_text(text[:text.index("    Temperature")])
    code, _, err = cli(capsys, "sim", "import", str(q), "-o", str(tmp_path / "t.toml"))
    assert code == 0, err
    for missing in ("temperature_celsius: no GPU Current Temp", "power_watts: no Power Draw",
                    "power_limit_watts: no Current Power Limit", "max_graphics_mhz: max graphics clock not in"):
        assert missing in err, missing


def test_truncated_xml_names_the_line(capsys, tmp_path) -> None:
    text = (FIXTURES / "a100-sxm4-535.xml").read_text()
    cut = text[:text.index("<temperature>")]
    msg = bad(capsys, tmp_path, cut, name="q.xml")
    assert re.match(rf"{re.escape(str(tmp_path / 'q.xml'))}:\d+: not well-formed XML", msg), msg


@pytest.mark.parametrize("other, reason", [
    ("rtx-a6000-linux-550-summary.txt", "nvidia-smi's summary table"),
    ("topo-hgx-h100.txt", "pass it with --topo"),
    ("empty", "not the output of `nvidia-smi -q`"),
    ("lspci", "lspci output"),
    ("no-driver", "could not reach the driver"),
])
def test_another_tools_output_is_refused_with_the_reason(capsys, tmp_path, other: str, reason: str) -> None:
    texts = {"empty": "\n\n", "lspci": "17:00.0 VGA compatible controller: NVIDIA Corporation GA102GL [RTX A6000]\n",
             "no-driver": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                          "that the latest NVIDIA driver is installed and running.\n"}
    text = texts.get(other) or (FIXTURES / other).read_text()
    msg = bad(capsys, tmp_path, text)
    assert re.match(rf"{re.escape(str(tmp_path / 'q.txt'))}:\d+: ", msg) and reason in msg, msg


def test_xml_asked_for_a_text_dump(capsys, tmp_path) -> None:
    msg = bad(capsys, tmp_path, (FIXTURES / "h200-590-idle.txt").read_text(), "--xml")
    assert msg.endswith(":1: --xml given but this is not XML (`nvidia-smi -q -x` starts with '<?xml')")


def test_two_gpus_with_one_bus_id(capsys, tmp_path) -> None:
    text = (FIXTURES / "rtx-6000-ada-550.txt").read_text()
    first = re.search(r"^GPU (0000\S+)", text, re.M).group(1)  # type: ignore[union-attr]
    second = re.findall(r"^GPU (0000\S+)", text, re.M)[1]
    text = text.replace(f"GPU {second}", f"GPU {first}")
    msg = bad(capsys, tmp_path, text)
    line = text.splitlines().index(f"GPU {first}", text.splitlines().index(f"GPU {first}") + 1) + 1
    assert msg == (f"{tmp_path / 'q.txt'}:{line}: GPU {first} appears twice (first at line "
                   f"{text.splitlines().index(f'GPU {first}') + 1}): two GPUs cannot share a bus id")


def test_an_older_driver_with_other_field_names_imports(capsys, tmp_path) -> None:
    """Driver 525: "Clocks Throttle Reasons", "Power Readings" / "Power Limit", "Ecc Mode", "Remapped
    Rows: N/A" — read under their old names, as the round trip above shows; here the names it
    could not find are said, and a value it cannot parse is refused with its line."""
    text = (FIXTURES / "rtx-3090-525.txt").read_text()
    renamed = text.replace("    FB Memory Usage\n", "    Framebuffer Memory\n")
    q = tmp_path / "renamed.txt"
    q.write_text(renamed)
    code, _, err = cli(capsys, "sim", "import", str(q), "-o", str(tmp_path / "t.toml"))
    assert code == 0 and "memory_mib: no FB Memory Usage Total" in err, err
    broken = text.replace("Max Power Limit                   : 385.00 W", "Max Power Limit                   : lots")
    msg = bad(capsys, tmp_path, broken)
    line = broken.splitlines().index("        Max Power Limit                   : lots") + 1
    assert msg == f"{tmp_path / 'q.txt'}:{line}: max power limit: expected a number in W, found 'lots'"


def test_text_pasted_after_the_dump_is_ignored_but_not_inside_it(capsys, tmp_path) -> None:
    text = (FIXTURES / "h200-590-idle.txt").read_text()
    q = tmp_path / "pasted.txt"
    q.write_text(text + "user@node17:~$ nvidia-smi topo -m\n\tGPU0\tCPU Affinity\n")
    code, _, err = cli(capsys, "sim", "import", str(q), "-o", str(tmp_path / "t.toml"))
    assert code == 0, err
    ada = (FIXTURES / "rtx-6000-ada-550.txt").read_text()
    at = ada.index("    Temperature")
    msg = bad(capsys, tmp_path, ada[:at] + "oops\n" + ada[at:])
    line = (ada[:at] + "oops\n").count("\n")
    assert msg.endswith(f":{line}: expected an indented field of GPU 00000000:01:00.0, found 'oops'"), msg


def test_a_huge_or_binary_file_is_refused_without_reading_it_whole(capsys, tmp_path) -> None:
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(250 << 20)  # sparse: 250 MB
    code, _, err = cli(capsys, "sim", "import", str(huge))
    assert code == 2 and "huge.txt:1: larger than 16 MiB" in err
    assert "binary data" in bad(capsys, tmp_path, b"\x7fELF\x02\x01\x00\x00" * 16)


@pytest.mark.parametrize("change, reason", [
    (lambda t: t.replace("GPU0\t X \tNV4", "GPU0\t X \tPIX"), "GPU1–GPU0 is NV4 but GPU0–GPU1 is PIX"),
    (lambda t: t.replace("GPU2\tNODE\tNODE\t X", "GPU2\tNODE\tNODE\t Q"), "against itself is 'Q'"),
    (lambda t: t.replace("GPU1\tNV4\t X \tNODE", "GPU1\tNV4\t X \tFAST"), "unknown level 'FAST'"),
    (lambda t: "\n".join(t.splitlines()[:5]), "no row for GPU2"),
])
def test_a_malformed_topo_is_refused_with_the_line(capsys, tmp_path, change, reason: str) -> None:
    q = tmp_path / "q.txt"
    q.write_text(first_gpus((FIXTURES / "rtx-a6000-linux-550.txt").read_text(), 3))
    topo = tmp_path / "topo.txt"
    topo.write_text(change((FIXTURES / "topo-a6000-nvlink-pair.txt").read_text()))
    code, _, err = cli(capsys, "sim", "import", str(q), "--topo", str(topo))
    assert code == 2 and reason in err and re.search(rf"{re.escape(str(topo))}:\d+: ", err), err


def test_a_topo_of_another_machine_is_refused(capsys, tmp_path) -> None:
    code, _, err = cli(capsys, "sim", "import", str(FIXTURES / "rtx-a6000-linux-550.txt"), "--topo",
                       str(FIXTURES / "topo-a6000-nvlink-pair.txt"))
    assert code == 2 and "3 GPUs in topo -m but 9 in" in err


def test_bad_input_never_shows_a_traceback_in_a_child_process(tmp_path) -> None:
    q = tmp_path / "q.txt"
    q.write_text("==============NVSMI LOG==============\n\nAttached GPUs : 1\nGPU 00000000:01:00.0\n"
                 "    Product Name : NVIDIA RTX A6000\n    FB Memory Usage\n        Total : 12 GiB\n")
    r = run_gpud("sim", "import", str(q))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"gpud: error: {q}:7: total: expected a number in MiB, found '12 GiB'"


# -- the round trip, field by field, over every fixture ----------------------------------------------

ALL_DUMPS = sorted(p.name for p in FIXTURES.iterdir()
                   if p.suffix in (".txt", ".xml") and not p.name.startswith("topo-") and "summary" not in p.name)
FIELD_KEYS: dict[str, tuple[list[str], list[str]]] = {  # name → (text paths, XML paths), beyond TEXT_/XML_KEYS
    "used": (["FB Memory Usage/Used"], ["fb_memory_usage/used"]),
    "reserved": (["FB Memory Usage/Reserved"], ["fb_memory_usage/reserved"]),
    "free": (["FB Memory Usage/Free"], ["fb_memory_usage/free"]),
    "requested": (["GPU Power Readings/Requested Power Limit"], ["gpu_power_readings/requested_power_limit"]),
    "graphics": (["Clocks/Graphics"], ["clocks/graphics_clock"]),
    "margin": (["Temperature/GPU T.Limit Temp", "Temperature/GPU Current T.Limit Temp"],
               ["temperature/gpu_temp_tlimit"]),
    "mig": (["MIG Mode/Current"], ["mig_mode/current_mig"]),
    "replays": (["PCI/Replays Since Reset"], ["pci/replay_counter"]),
    "remap_corr": (["Remapped Rows/Correctable Error"], ["remapped_rows/remapped_row_corr"]),
    "remap_unc": (["Remapped Rows/Uncorrectable Error"], ["remapped_rows/remapped_row_unc"]),
    "remap_pending": (["Remapped Rows/Pending"], ["remapped_rows/remapped_row_pending"]),
    "remap_failure": (["Remapped Rows/Remapping Failure Occurred"], ["remapped_rows/remapped_row_failure"]),
    "retired_sbe": (["Retired Pages/Single Bit ECC"],
                    ["retired_pages/multiple_single_bit_retirement/retired_count"]),
    "retired_dbe": (["Retired Pages/Double Bit ECC"], ["retired_pages/double_bit_retirement/retired_count"]),
    "retired_pending": (["Retired Pages/Pending Page Blacklist"], ["retired_pages/pending_blacklist"]),
}
YES_NO = ("remap_pending", "remap_failure", "retired_pending")


def dump_value(g: dict[str, Any], xml: bool, name: str) -> str | None:
    if name in FIELD_KEYS:
        for path in FIELD_KEYS[name][1 if xml else 0]:
            v = g.get(path)
            if v is not None and (re.match(r"^-?\d", v) or name == "mig" and v in ("Enabled", "Disabled")
                                  or name in YES_NO and v in ("Yes", "No")):
                return v
        return None
    return want(g, XML_KEYS if xml else TEXT_KEYS, name)


def differences(status: dict[str, Any], gpus: list[dict[str, Any]], xml: bool) -> list[str]:
    """Every field the dump prints whose reading through ``gpud status --json`` differs, as
    ``gpu[i].field: dump D, twin T``."""
    out: list[str] = []
    for i, (g, got) in enumerate(zip(gpus, status["gpus"], strict=True)):
        out += gpu_differences(i, g, got, xml)
    return out


def gpu_differences(i: int, g: dict[str, Any], got: dict[str, Any], xml: bool) -> list[str]:
    out: list[str] = []
    info, s = got["info"], got["sample"]

    def w(name: str) -> float | None:
        return num(dump_value(g, xml, name))

    def same(field: str, dump: Any, twin: Any) -> None:
        if dump is not None and dump != twin and not (isinstance(dump, float) and isinstance(twin, (int, float))
                                                        and abs(dump - twin) <= 0.01):
            out.append(f"gpu[{i}].{field}: dump {dump!r}, twin {twin!r}")

    def na(name: str, twin: Any) -> None:
        """The dump prints the field as N/A (or Not Supported): the twin must not make a value up."""
        paths = FIELD_KEYS[name][1 if xml else 0] if name in FIELD_KEYS else (XML_KEYS if xml else TEXT_KEYS)[name]
        printed = [g[p] for p in paths if p in g]
        if printed and all(re.fullmatch(r"N/A|\[.*\]|Not Supported", v, re.I) for v in printed) \
                and twin is not None:
            out.append(f"gpu[{i}].{name}: dump N/A, twin {twin!r}")

    for key, field in (("default", "power_default_limit_watts"), ("min", "power_min_limit_watts"),
                       ("max", "power_max_limit_watts")):
        na(key, info[field])
    na("limit", s["power_limit_watts"])
    na("draw", s["power_watts"])
    na("util", s["utilization_gpu_percent"])  # a MIG-enabled GPU
    na("fan", s["fans"][0]["speed_percent"] if s["fans"] else None)
    na("shutdown", info["temperature_shutdown_celsius"] if w("tl_shutdown") is None else None)
    na("slowdown", info["temperature_slowdown_celsius"] if w("tl_slowdown") is None else None)
    for key in ("graphics", "sm", "memory"):
        na(f"max_{key}", info["max_clocks_mhz"][key])
    same("name", dump_value(g, xml, "name"), info["name"])
    same("pci_bus_id", bus(g["bus"]), info["pci_bus_id"])
    mib = 1 << 20
    same("memory_total", w("total"), (info["memory_total_bytes"] or 0) / mib)
    same("memory_used", w("used"), (s["memory_used_bytes"] or 0) / mib if s["memory_used_bytes"] is not None
         else None)
    same("memory_reserved", w("reserved"), (s.get("memory_reserved_bytes") or 0) / mib
         if s.get("memory_reserved_bytes") is not None else None)
    free = w("free")  # nvidia-smi rounds total, reserved, used and free to MiB each: free is within 2 MiB
    twin_free = s["memory_free_bytes"] / mib if s.get("memory_free_bytes") is not None else None
    same("memory_free", free, twin_free if twin_free is None or free is None or abs(free - twin_free) > 2
         else free)
    for key, field in (("default", "power_default_limit_watts"), ("min", "power_min_limit_watts"),
                       ("max", "power_max_limit_watts")):
        same(field, w(key), info[field])
    same("power_limit", w("limit"), s["power_limit_watts"])
    same("power_requested_limit", w("requested"), s["power_management_limit_watts"])
    same("power_draw", w("draw"), s["power_watts"])
    for key in ("graphics", "sm", "memory"):
        same(f"max_clocks.{key}", w(f"max_{key}"), info["max_clocks_mhz"][key])
        same(f"clocks.{key}", w(key), s["clocks_mhz"][key])
    same("default_applications_clocks.graphics", w("app_graphics"),
         info["default_applications_clocks_mhz"]["graphics"])
    same("default_applications_clocks.memory", w("app_memory"), info["default_applications_clocks_mhz"]["memory"])
    same("temperature", w("temp"), s["temperature_celsius"])
    for key, field in (("shutdown", "temperature_shutdown_celsius"), ("slowdown", "temperature_slowdown_celsius"),
                       ("max_operating", "temperature_max_operating_celsius")):
        same(field, w(key), info[field])
    if w("margin") is not None and w("temp") is not None and w("shutdown") is None:
        # thresholds printed only relative to T.Limit: T.Limit = current temperature + its margin
        same("t_limit", w("temp") + w("margin"), info["temperature_max_operating_celsius"])  # type: ignore[operator]
    top = info["temperature_max_operating_celsius"]
    if w("shutdown") is None and top is not None:
        same("tlimit_shutdown", w("tl_shutdown"), top - info["temperature_shutdown_celsius"])
        same("tlimit_slowdown", w("tl_slowdown"), top - info["temperature_slowdown_celsius"])
    same("pcie_generation", w("gen"), s["pcie_generation"])
    same("pcie_width", w("width"), s["pcie_width"])
    same("pcie_max_generation", w("gen_max"), info["pcie_max_generation"])
    same("pcie_max_width", w("width_max"), info["pcie_max_width"])
    same("pcie_replay_errors", w("replays"), s["pcie_replay_errors"])
    yes = {"Yes": True, "No": False}
    same("remapped_rows_correctable", w("remap_corr"), s["remapped_rows_correctable"])
    same("remapped_rows_uncorrectable", w("remap_unc"), s["remapped_rows_uncorrectable"])
    same("remapped_rows_pending", yes.get(dump_value(g, xml, "remap_pending") or ""), s["remapped_rows_pending"])
    same("remapped_rows_failure", yes.get(dump_value(g, xml, "remap_failure") or ""), s["remapped_rows_failure"])
    same("retired_pages_single_bit", w("retired_sbe"), s["retired_pages_single_bit"])
    same("retired_pages_double_bit", w("retired_dbe"), s["retired_pages_double_bit"])
    same("retired_pages_pending", yes.get(dump_value(g, xml, "retired_pending") or ""), s["retired_pages_pending"])
    if s["ecc_enabled"]:
        for scope in ("volatile", "aggregate"):
            for kind in ("corrected", "uncorrected"):
                same(f"ecc_errors.{scope}_{kind}", ecc_count(g, xml, scope, kind),
                     (s["ecc_errors"] or {}).get(f"{scope}_{kind}"))
    for key, field in (("remap_corr", "remapped_rows_correctable"), ("retired_sbe", "retired_pages_single_bit")):
        na(key, s[field])
    flag = {"Enabled": True, "Disabled": False}
    same("persistence_mode", flag.get(dump_value(g, xml, "persistence") or ""), s["persistence_mode"])
    same("ecc_enabled", flag.get(dump_value(g, xml, "ecc") or ""), s["ecc_enabled"])
    compute = dump_value(g, xml, "compute")
    same("compute_mode", compute.lower() if compute else None, s["compute_mode"])
    same("utilization", w("util"), s["utilization_gpu_percent"])
    fan = w("fan")
    same("fan_speed", fan, s["fans"][0]["speed_percent"] if s["fans"] else None)
    if fan is None and dump_value(g, xml, "name"):
        same("fans", 0, len(s["fans"]))
    same("mig_mode", flag.get(dump_value(g, xml, "mig") or ""), s.get("mig_mode"))
    # MIG devices: ids and memory, read back through their own NVML handles (free within 2 MiB, as the GPU's:
    # nvidia-smi rounds each figure); each process in its instance
    dumped = dump_instances(g)
    twin_migs = sorted((m["gpu_instance_id"], m["compute_instance_id"], *(
        None if m[f"memory_{k}_bytes"] is None else m[f"memory_{k}_bytes"] >> 20
        for k in ("total", "reserved", "used", "free"))) for m in s.get("mig_instances") or ())
    if len(dumped) == len(twin_migs):
        twin_migs = [t[:5] + (d[5],) if d[5] is not None and t[5] is not None and abs(d[5] - t[5]) <= 2 else t
                     for d, t in zip(dumped, twin_migs, strict=True)]
    same("mig_instances", dumped, twin_migs)
    same("process_instances", {pid: ids for pid, ids in g["pid_instances"].items() if ids != (None, None)},
         {p["pid"]: (p["gpu_instance_id"], p["compute_instance_id"]) for p in s["processes"] or ()
          if p["gpu_instance_id"] is not None})
    kinds = {"C": "compute", "G": "graphics", "C+G": "compute+graphics"}
    same("processes", {pid: kinds.get(str(k), str(k)) for pid, k in g["pids"].items()},
         {p["pid"]: p["kind"] for p in s["processes"] or ()})
    if g["reasons_seen"]:
        same("clock_events", sorted(g["reasons"]), sorted(s["clock_events"] or ()))
    if g["counters"]:  # "Clocks Event Reasons Counters" (drivers from 580): NVML's violation counters
        same("violation_counters", True, "sw_power_cap" in (s["clock_event_nanoseconds"] or {}))
    return out


def ecc_count(g: dict[str, Any], xml: bool, scope: str, kind: str) -> float | None:
    """The dump's ECC error count of ``scope`` summed over SRAM and DRAM (old drivers: Single/Double Bit
    Total); None where it prints none."""
    total, seen = 0, False
    prefix = f"ecc_errors/{scope}/" if xml else f"ECC Errors/{scope.capitalize()}/"
    for path, v in g.items():
        if not isinstance(path, str) or not path.startswith(prefix) or not str(v).isdigit():
            continue
        leaf = path[len(prefix):].lower().replace("_", " ")
        if leaf.startswith(("single bit", "double bit")) and not leaf.endswith("/total"):
            continue  # old drivers: per memory kind, then their total
        unc = "uncorrectable" in leaf or leaf.startswith("double bit")
        cor = not unc and ("correctable" in leaf or leaf.startswith("single bit"))
        if (kind == "uncorrected" and unc) or (kind == "corrected" and cor):
            total, seen = total + int(v), True
    return float(total) if seen else None


# Differences that cannot be helped, per fixture (each is in the twin's header too).
DEVIATIONS: dict[str, dict[str, str]] = {
    "grid-p4-1q-vgpu-guest-513.xml": {
        r"gpu\[0\]\.max_clocks\.(graphics|sm|memory): dump 0\.0, twin None$": "a vGPU guest prints Max Clocks 0 MHz: "
        "imported as Not Supported (a maximum of 0 is no maximum), as the twin's header says",
    },
    "rtx-3080-windows-536.xml": {
        r"gpu\[0\]\.memory_(used|free): ": "Windows (WDDM) lists processes with 1347 MiB in all, more than FB "
                                          "Used (1128 MiB); the twin's Used includes its processes' memory",
    },
}


@pytest.mark.parametrize("dump", ALL_DUMPS)
def test_every_fixture_round_trips_field_by_field(capsys, tmp_path, dump: str, monkeypatch) -> None:
    # field by field, digit for digit: the twin's readings must be the dump's, without the sensors' noise
    monkeypatch.setenv("GPUD_SIM_NOISE", "0")
    path = FIXTURES / dump
    text = path.read_text()
    xml = dump.endswith(".xml")
    gpus = xml_gpus(text) if xml else text_gpus(text)
    counters = "Clocks Event Reasons Counters" in text or "<clocks_event_reasons_counters>" in text
    for g in gpus:
        g["counters"] = counters
    status, header = import_and_status(capsys, tmp_path, path)
    got = differences(status, gpus, xml)
    driver = re.search(r"^Driver Version\s*:\s*(\S+)|<driver_version>([^<]+)<", text, re.M)
    if driver and re.match(r"\d", driver.group(1) or driver.group(2)):
        if status["host"]["driver_version"] != (driver.group(1) or driver.group(2)):
            got.append(f"driver_version: dump {driver.group(1) or driver.group(2)!r}, "
                       f"twin {status['host']['driver_version']!r}")
    declared = DEVIATIONS.get(dump, {})
    undeclared = [d for d in got if not any(re.match(pat, d) for pat in declared)]
    assert undeclared == []
    unused = [pat for pat in declared if not any(re.match(pat, d) for d in got)]
    assert unused == []


# -- what the issue found wrong, one test each ------------------------------------------------------

def twin_machine(capsys, tmp_path: Path, dump: str) -> Any:
    """The twin of ``dump`` opened as a machine (the simulation under the real bindings)."""
    from gpud.backends import open_machine

    twin = tmp_path / "twin.toml"
    code, _, err = cli(capsys, "sim", "import", str(FIXTURES / dump), "-o", str(twin))
    assert code == 0, err
    return open_machine(str(twin))


def test_a_gpu_colder_than_the_room_imports_and_evolves_from_its_reading(capsys, tmp_path) -> None:
    """A10G at 17 °C (telegraf's a10g.xml) and A100s at 21–25 °C: the ambient is no floor."""
    m = twin_machine(capsys, tmp_path, "a10g-515.xml")
    sim = m.simulation.machine

    def reading() -> float:  # the sensor scatters by a degree: the median of a minute's readings
        temps = []
        for _ in range(60):
            sim.advance(1)
            temps.append(float(m.snapshot().samples[0].temperature_celsius))
        return statistics.median(temps)

    assert reading() == 17
    sim.advance(600)  # idle: the described reading is the equilibrium
    assert reading() == 17
    sim.set_load(0, 100, 150)
    sim.advance(600)
    assert m.snapshot().samples[0].temperature_celsius > 30  # load heats it from there


def test_memory_keeps_reserved_used_and_free_apart(capsys, tmp_path) -> None:
    """nvml.h: v1's ``used`` is reserved + allocated; ``_v2`` keeps them apart, as nvidia-smi prints
    them (A10, driver 550: Total 23028, Reserved 526, Used 1, Free 22503 MiB)."""
    m = twin_machine(capsys, tmp_path, "a10-550.txt")
    s = m.snapshot().samples[0]
    assert (s.memory_reserved_bytes, s.memory_used_bytes) == (526 << 20, 1 << 20)
    assert s.memory_free_bytes == s.memory_total_bytes - (527 << 20)
    v1 = m.nvml.call("nvmlDeviceGetMemoryInfo", m.nvml.handle(0), gpu=0)
    assert v1.used == 527 << 20 and v1.free == s.memory_free_bytes


def test_a_power_limit_held_below_the_requested_one_by_the_module_budget(capsys, tmp_path) -> None:
    """GH200: Requested 900 W, Current (enforced) 700 W: the twin keeps both; doctor does not say the
    limit was lowered below the default, it names the other limiter."""
    m = twin_machine(capsys, tmp_path, "gh200-550.txt")
    s = m.snapshot().samples[0]
    assert (s.power_management_limit_watts, s.power_limit_watts) == (900.0, 700.0)
    code, out, _ = cli(capsys, "doctor", "--json", "--simulate", str(tmp_path / "twin.toml"))
    check = next(c for c in json.loads(out)["checks"] if c["id"] == "config.power_limit")
    assert "below the default" not in check["summary"] and "700 W" in check["summary"], check


def test_one_lifetime_uncorrectable_error_with_its_row_remapped_is_a_warning(capsys, tmp_path) -> None:
    """GH200: DRAM Uncorrectable 1 (aggregate), Remapped Rows Uncorrectable 1, nothing pending, no failure:
    repaired by row remapping (NVIDIA's guidance), a warning with its history; the same error not
    remapped, or pending, stays a failure."""
    text = (FIXTURES / "gh200-550.txt").read_text()
    _, checks = doctor(capsys, tmp_path, text, "gh200")
    ecc = next(c for c in checks if c["id"] == "health.ecc")
    assert ecc["status"] == "warn" and "1 row remapped" in ecc["summary"], ecc
    unremapped = text.replace("Uncorrectable Error               : 1", "Uncorrectable Error               : 0")
    assert by_id(doctor(capsys, tmp_path, unremapped, "gh200b")[1], "health.ecc") == {0: "fail"}


TOPO_WITH = {  # topo -m fixture → the dump it goes with (the same machine, or a dump cut to its GPU count)
    "topo-h100-mig-590-escapes.txt": ("h100-mig-590-load.txt", 1),  # the header underlined: ESC[4m … ESC[0m
    "topo-h800-x8-clipped.txt": ("a100-sxm4-535-x8-cold.txt", 8),  # clipped at the terminal's width
    "topo-a100-x8-17nic.txt": ("a100-sxm4-535-x8-cold.txt", 8),  # NIC rows beyond the header's columns
    "topo-gtx-1080ti-pair.txt": ("rtx-4090-550-x8.txt", 2),  # the older legend, NUMA Affinity N/A
    "topo-a10-x4.txt": ("a40-550-x10.txt", 4),  # all SYS, a GPU NUMA ID column
    "topo-hgx-h100.txt": ("h100-sxm-565-hgx.txt", 8),
    "topo-a6000-nvlink-pair.txt": ("rtx-a6000-linux-550.txt", 3),
}


@pytest.mark.parametrize("topo", sorted(TOPO_WITH))
def test_every_topo_fixture_reads_back_its_matrix(capsys, tmp_path, topo: str) -> None:
    dump, k = TOPO_WITH[topo]
    q = tmp_path / "q.txt"
    q.write_text(first_gpus((FIXTURES / dump).read_text(), k))
    got = topo_roundtrip(capsys, tmp_path, q, FIXTURES / topo)
    want = matrix_of((FIXTURES / topo).read_text())
    if topo in TOPO_DEVIATIONS:  # declared: the twin's header says so
        old, new, why = TOPO_DEVIATIONS[topo]
        assert why in (tmp_path / "twin.toml").read_text()
        want = [[new if c == old else c for c in row] for row in want]
    assert got["matrix"] == want


# A VM shows GPUs of one NUMA node at SYS (each behind a host bridge of its own across the hypervisor's
# interconnect); the simulated PCIe tree has SYS only between NUMA nodes.
TOPO_DEVIATIONS = {"topo-a10-x4.txt": ("SYS", "NODE", "GPU0-GPU1: topo -m says SYS, the twin has NODE")}


def test_a_vgpu_guest_with_zero_readings_imports_them_as_not_supported(capsys, tmp_path) -> None:
    """A vGPU guest reads 0 °C and prints 0 for power limits and max clocks (the H200 dump edited so):
    it imports (exit 0) and the twin's NVML answers Not Supported for them, not the preset's values."""
    text = (FIXTURES / "h200-590-idle.txt").read_text()
    text = text.replace("GPU Current Temp                               : 28 C",
                        "GPU Current Temp                               : 0 C")
    for key in ("Current", "Requested", "Default", "Min", "Max"):
        text = re.sub(rf"({key} Power Limit\s+: )\d+\.\d+ W", r"\g<1>0.00 W", text, count=1)
    at = text.index("    Max Clocks")
    text = text[:at] + re.sub(r": \d+ MHz", ": 0 MHz", text[at:text.index("\n    ", at + 20) + 200], count=3) + \
        text[text.index("\n    ", at + 20) + 200:]
    q = tmp_path / "vgpu.txt"
    q.write_text(text)
    status, twin = import_and_status(capsys, tmp_path, q)
    info, s = status["gpus"][0]["info"], status["gpus"][0]["sample"]
    assert s["temperature_celsius"] == 0
    assert (info["power_default_limit_watts"], info["power_max_limit_watts"], s["power_limit_watts"]) == (
        None, None, None)
    assert info["max_clocks_mhz"] == {"graphics": None, "sm": None, "memory": None}
    assert "Not Supported" in twin


def documented_verdicts() -> dict[str, set[tuple[str, int | None, str]]]:
    """docs/simulation.md's "Doctor on the twins": fixture → {(check, gpu, status)}; "all" → every GPU."""
    doc = (REPO / "docs" / "simulation.md").read_text()
    table = doc[doc.index("### Doctor on the twins"):]
    out: dict[str, set[tuple[str, int | None, str]]] = {}
    for line in table.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        fixtures, check, gpus, status = re.findall(r"`([^`]+)`", cells[0]), cells[1].strip("`"), cells[2], cells[3]
        for f in fixtures:
            n = len(text_gpus((FIXTURES / f).read_text()) if f.endswith(".txt") else
                     xml_gpus((FIXTURES / f).read_text()))
            which: list[int | None] = ([None] if gpus == "-" else list(range(n)) if gpus == "all"
                                       else [int(x) for x in gpus.split(",")])
            out.setdefault(f, set()).update((check, g, status) for g in which)
    return out


@pytest.mark.parametrize("dump", ALL_DUMPS)
def test_doctor_on_every_twin_gives_the_documented_verdicts(capsys, tmp_path, dump: str) -> None:
    twin = tmp_path / "twin.toml"
    code, _, err = cli(capsys, "sim", "import", str(FIXTURES / dump), "-o", str(twin))
    assert code == 0, err
    _, out, _ = cli(capsys, "doctor", "--json", "--simulate", str(twin))
    got = {(c["id"], c["gpu"], c["status"]) for c in json.loads(out)["checks"] if c["status"] not in ("pass", "skip")}
    assert got == documented_verdicts().get(dump, set())


def test_the_picker_judges_a_gpu_by_its_free_memory_not_total_minus_used() -> None:
    """With the driver's reservation apart (``_v2``), total − used overstates what a job can get."""
    from gpud.model import GpuSample
    from gpud.picker import why_busy

    gib = 1 << 30
    s = GpuSample(index=0, uuid="GPU-0", timestamp=0.0, utilization_gpu_percent=0, memory_total_bytes=48 * gib,
                  memory_used_bytes=10 * gib, memory_reserved_bytes=20 * gib, memory_free_bytes=18 * gib)
    assert why_busy(s, 30 * gib, 10) == "18.0 GiB free < 30.0 GiB"
