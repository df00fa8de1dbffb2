"""Every doctor check, both ways: a minimal machine that passes it and one that does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from doctor_helpers import description as d
from doctor_helpers import doctor, only, statuses

from gpud.doctor import CHECKS
from gpud.probe.report import ProbeReport

TWO_BRIDGED = '[[nvlink]]\ngpus = [0, 1]\n'

# (check, passing description, failing description, expected status of the failing one, GPU it names)
CASES = [
    ("driver.nouveau", d(), d(machine='modules = ["nvidia", "nouveau"]'), "fail", None),
    ("gpu.count", d(2), d(2, extra='[[fault]]\nkind = "gpu_lost"\ngpu = 1\n'), "fail", 1),
    ("sli.disabled", d(),
     d(extra='[xorg]\nconf = """\nSection "Device"\n  Option "BaseMosaic" "on"\nEndSection\n"""\n'), "fail", None),
    ("pcie.link_width", d(), d(extra='[[fault]]\nkind = "link_degraded"\ngpu = 0\nwidth = 8\n'), "fail", 0),
    ("pcie.link_gen", d(defaults="utilization_percent = 90\npower_watts = 250"),
     d(defaults="utilization_percent = 90\npower_watts = 250",
       extra='[[fault]]\nkind = "link_degraded"\ngpu = 0\ngeneration = 1\n'), "fail", 0),
    ("pcie.acs", d(), d(defaults="acs = true"), "warn", None),
    ("host.iommu", d(machine='iommu = "passthrough"'), d(machine='iommu = "translated"'), "warn", None),
    ("gpu.p2p", d(2), d(2, extra='[[fault]]\nkind = "p2p"\ngpus = [0, 1]\nstatus = "chipset_not_supported"\n'),
     "warn", None),
    ("nvlink.links", d(2, extra=TWO_BRIDGED),
     d(2, extra=TWO_BRIDGED + '[[fault]]\nkind = "nvlink_down"\ngpus = [0, 1]\nlinks = [2]\n'), "fail", 0),
    ("topo.numa", d(2, machine="sockets = 2"), d(2, machine="sockets = 2", numa=[0, 1]), "warn", None),
    ("config.persistence_mode", d(), d(defaults="persistence_mode = false"), "warn", 0),
    ("config.power_limit", d(), d(defaults="power_limit_watts = 200"), "warn", 0),
    ("config.compute_mode", d(), d(defaults='compute_mode = "exclusive_process"'), "warn", 0),
    ("config.mig_mode", d(defaults="mig_mode = false"), d(defaults="mig_mode = true"), "warn", 0),
    ("config.ecc", d(2, defaults="ecc_enabled = true"),
     d(2, defaults="ecc_enabled = true", gpu_extra={1: "ecc_pending_enabled = false"}), "warn", None),
    ("health.xid", d(), d(extra='[[fault]]\nkind = "xid"\ngpu = 0\nxid = 79\n'), "fail", 0),
    ("health.ecc", d(defaults="ecc_enabled = true"), d(defaults="ecc_enabled = true\necc_volatile_uncorrected = 2"),
     "fail", 0),
    ("health.clock_events", d(), d(extra='[[fault]]\nkind = "clock_events"\ngpu = 0\nreasons = '
                                        '["hw_power_brake_slowdown"]\n'), "fail", 0),
    ("health.thermal", d(), d(defaults="temperature_celsius = 93\nutilization_percent = 100\npower_watts = 290"),
     "fail", 0),
    # A stalled fan reads as the speed asked for (NVML): found by its effect, the GPU at its operating
    # limit with the fan asked for 100 %.
    ("health.fans", d(), d(defaults="temperature_celsius = 94\nutilization_percent = 100\npower_watts = 250",
                           extra='[[fault]]\nkind = "fan_stuck"\ngpu = 0\n'), "fail", 0),
    ("health.pcie_replay", d(), d(defaults="pcie_replay_errors = 5000"), "warn", 0),
    # A desktop's display server and shell (graphics processes) are not jobs: the check passes with them.
    ("gpu.processes", d(defaults='processes = [{ pid = 2001, used_mib = 300, user = "root", uid = 0, command = '
                                 '"/usr/lib/xorg/Xorg :0", graphics = true }, { pid = 2002, used_mib = 200, '
                                 'command = "/usr/bin/gnome-shell", graphics = true }]'),
     d(defaults='processes = [{ pid = 4242, used_mib = 1000 }]'), "warn", None),
    ("host.cpu_governor", d(), d(machine='cpu_governor = "powersave"'), "warn", None),
    ("host.shm", d(), d(machine="shm_mib = 512"), "warn", None),
    ("host.memlock", d(), d(machine="memlock_kib = 8192"), "warn", None),
    ("host.memory", d(), d(machine="memory_gib = 32"), "warn", None),
    ("host.psu", d(4), d(4, machine="cpu_tdp_watts = 900"), "warn", None),
]


@pytest.mark.parametrize(("check", "good", "bad", "status", "gpu"), CASES, ids=[c[0] for c in CASES])
def test_check_both_ways(tmp_path: Path, check: str, good: str, bad: str, status: str, gpu: int | None) -> None:
    passed = doctor(tmp_path, check, good)
    assert passed.checks and all(r.status == "pass" for r in passed.checks), passed.checks
    failed = doctor(tmp_path, check, bad)
    hits = [r for r in failed.checks if r.status == status]
    assert hits, failed.checks
    assert hits[0].gpu == gpu
    assert hits[0].remedy, f"{check} {status} without a remedy"
    assert "\n" not in hits[0].summary


def test_every_check_has_a_both_ways_test() -> None:
    covered = {c[0] for c in CASES} | {"nvml.available", "env.cuda", "torch.cuda", "probe.ddp_scaling",
                                       "probe.pipeline", "probe.p2p", "probe.allreduce"}
    assert {c.id for c in CHECKS} <= covered


def test_nvml_available_both_ways(tmp_path: Path) -> None:
    assert only(doctor(tmp_path, "nvml.available", d())).status == "pass"
    r = only(doctor(tmp_path, "nvml.available", d(machine="driver_loaded = false")))
    assert r.status == "fail" and "nvidia-smi" in r.remedy


def test_gpu_count_expected_and_off_the_bus(tmp_path: Path) -> None:
    r = doctor(tmp_path, "gpu.count", d(2), expect_gpus=4)
    assert statuses(r) == [("fail", None)] and "4 expected" in r.checks[0].summary
    r = doctor(tmp_path, "gpu.count", d(3, extra='[[fault]]\nkind = "off_bus"\ngpu = 1\n'))
    assert [x.status for x in r.checks] == ["fail"] and "0000:37:00.0" in r.checks[0].summary
    assert only(doctor(tmp_path, "gpu.count", d(2), config={"machine": {"expect_gpus": 2}})).status == "pass"


def test_sli_from_the_xorg_log_alone(tmp_path: Path) -> None:
    text = d(extra='[xorg]\nlog = """\n[  10.2] (II) NVIDIA(0): SLI is enabled (mode: AFR)\n"""\n')
    r = only(doctor(tmp_path, "sli.disabled", text))
    assert r.status == "fail" and r.summary.endswith("/var/log/Xorg.0.log:1: [  10.2] (II) NVIDIA(0): SLI is "
                                                       "enabled (mode: AFR)")
    off = d(extra='[xorg]\nconf = """\nSection "Screen"\n  Option "SLI" "Off"\nEndSection\n"""\n')
    assert only(doctor(tmp_path, "sli.disabled", off)).status == "pass"


def test_link_gen_below_max_at_idle_is_power_saving(tmp_path: Path) -> None:
    r = only(doctor(tmp_path, "pcie.link_gen", d(extra='[[fault]]\nkind = "link_degraded"\ngpu = 0\ngeneration = 1\n')))
    assert r.status == "pass" and "re-checked under load by the probe" in r.summary


def test_nvlink_bridge_missing_when_configured(tmp_path: Path) -> None:
    r = doctor(tmp_path, "nvlink.links", d(2), config={"machine": {"nvlink_pairs": [[0, 1]]}})
    assert statuses(r) == [("fail", 0), ("fail", 1)]
    r = doctor(tmp_path, "nvlink.links", d(2))
    assert statuses(r) == [("pass", 0), ("pass", 1)]  # no bridge seen, none configured
    assert only(doctor(tmp_path, "nvlink.links", d(model="RTX 6000 Ada"))).status == "skip"


def test_power_limit_asked_by_a_profile_is_fine(tmp_path: Path) -> None:
    from gpud.backends import open_machine
    from gpud.config import Config
    from gpud.doctor.registry import CHECKS, Context, run

    p = tmp_path / "b.toml"
    p.write_text(d(defaults="power_limit_watts = 200"))
    m = open_machine(str(p))
    ctx = Context(m, Config(), {}, snapshot=m.snapshot(), profile_settings={0: {"power_limit_watts": 200}})
    [r] = run(ctx, [c for c in CHECKS if c.id == "config.power_limit"])
    assert r.status == "pass" and "asked by the active profile" in r.summary


def test_clock_events_warn_and_power_cap_under_load(tmp_path: Path) -> None:
    sw = d(extra='[[fault]]\nkind = "clock_events"\ngpu = 0\nreasons = ["sw_thermal_slowdown"]\n')
    assert only(doctor(tmp_path, "health.clock_events", sw)).status == "warn"
    capped = d(defaults="utilization_percent = 100\npower_watts = 400")
    r = only(doctor(tmp_path, "health.clock_events", capped))
    assert r.status == "pass" and "power limit under load" in r.summary


def test_thermal_warn_margin_and_hot_idle(tmp_path: Path) -> None:
    r = only(doctor(tmp_path, "health.thermal", d(defaults="temperature_celsius = 88\nutilization_percent = 100\n"
                                                           "power_watts = 290")))
    assert r.status == "warn" and "7 °C below slowdown (95 °C)" in r.summary
    assert only(doctor(tmp_path, "health.thermal", d(defaults="temperature_celsius = 65"))).status == "warn"


def test_fan_left_manual_without_daemon_warns(tmp_path: Path) -> None:
    r = only(doctor(tmp_path, "health.fans", d(), before=lambda m: m.nvml.set_fan_speed(0, 0, 70)))
    assert r.status == "warn" and "manual" in r.summary and "gpud restore --fans-only" in r.remedy
    assert only(doctor(tmp_path, "health.fans", d(model="H200"))).status == "skip"


def test_ecc_row_remapping_and_retired_pages(tmp_path: Path) -> None:
    assert only(doctor(tmp_path, "health.ecc", d(defaults="remapped_rows_pending = true"))).status == "fail"
    r = only(doctor(tmp_path, "health.ecc", d(model="Quadro RTX 8000", defaults="retired_pages_dbe = 63")))
    assert r.status == "fail" and "63 retired pages" in r.summary


def test_xid_application_errors_warn(tmp_path: Path) -> None:
    r = only(doctor(tmp_path, "health.xid", d(extra='[[fault]]\nkind = "xid"\ngpu = 0\nxid = 13\n')))
    assert r.status == "warn" and r.gpu == 0


def test_psu_needs_a_rating(tmp_path: Path) -> None:
    text = d(machine='vendor_model = "Custom tower"').replace('vendor_model = "HP Z8 Fury G5 Workstation Desktop PC"\n',
                                                               "")
    r = only(doctor(tmp_path, "host.psu", text))
    assert r.status == "skip" and "psu_watts" in r.remedy
    assert only(doctor(tmp_path, "host.psu", text, config={"machine": {"psu_watts": 500}})).status == "warn"


@pytest.mark.parametrize(("env", "needle"), [
    ({"NCCL_P2P_DISABLE": "1"}, "NCCL_P2P_DISABLE"),
    ({"CUDA_LAUNCH_BLOCKING": "1"}, "CUDA_LAUNCH_BLOCKING"),
    ({"CUDA_VISIBLE_DEVICES": "0"}, "shows 1 of 2 GPUs"),
    ({"CUDA_INJECTION64_PATH": "/opt/x.so"}, "debugger/profiler"),
    ({"NCCL_DEBUG": "TRACE"}, "traces every NCCL call"),
])
def test_env_cuda_both_ways(tmp_path: Path, env: dict[str, str], needle: str) -> None:
    assert only(doctor(tmp_path, "env.cuda", d(2), env={"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO"})
                ).status == "pass"
    r = only(doctor(tmp_path, "env.cuda", d(2), env=env))
    assert r.status == "warn" and needle in r.detail


def _fake_python(tmp_path: Path, cuda: str | None, nccl: bool) -> str:
    site = tmp_path / "site"
    torch = site / "torch"
    torch.mkdir(parents=True)
    (torch / "__init__.py").write_text("")
    (torch / "version.py").write_text(f"__version__ = '2.5.1'\ndebug = False\ncuda: Optional[str] = "
                                      f"{repr(cuda)}\nhip: Optional[str] = None\n")
    if nccl:
        (site / "nvidia" / "nccl" / "lib").mkdir(parents=True)
        (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_text("")
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    return str(py)


@pytest.mark.parametrize(("cuda", "nccl", "status", "needle"), [
    ("12.4", True, "pass", "CUDA 12.4"),
    ("12.1", True, "pass", "NCCL present"),
    (None, False, "warn", "CPU-only"),
    ("12.6", True, "warn", "minor-version compatibility"),
    ("13.0", True, "fail", "cannot use the GPUs"),
    ("12.4", False, "warn", "no NCCL"),
])
def test_torch_cuda_against_the_driver(tmp_path: Path, cuda, nccl, status, needle) -> None:
    py = _fake_python(tmp_path, cuda, nccl)
    r = only(doctor(tmp_path, "torch.cuda", d(2), config={"doctor": {"python": py}}))
    assert r.status == status and needle in r.summary, r


def test_torch_absent_is_a_skip(tmp_path: Path) -> None:
    py = tmp_path / "python"
    py.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")  # -S: no site-packages, so no torch
    py.chmod(0o755)
    r = only(doctor(tmp_path, "torch.cuda", d(), config={"doctor": {"python": str(py)}}))
    assert r.status == "skip" and "not installed" in r.summary


def test_a_crashing_check_is_reported_not_fatal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud.doctor import registry

    def boom(ctx, r):  # type: ignore[no-untyped-def]
        raise RuntimeError("kaput")

    check = next(c for c in registry.CHECKS if c.id == "host.shm")
    monkeypatch.setattr(registry, "CHECKS", [registry.Check("host.shm", "Host", boom, False)])
    from gpud.doctor import registry as reg

    p = tmp_path / "b.toml"
    p.write_text(d())
    from gpud.backends import open_machine
    from gpud.config import Config

    ctx = reg.Context(open_machine(str(p)), Config(), {})
    [r] = reg.run(ctx, reg.CHECKS)
    assert r.status == "skip" and "kaput" in r.summary and check.id == r.id


def _probe_result(eff: float = 0.95, pipeline_ok: bool = True, p2p_bw: float = 40e9, gen: int = 4) -> ProbeReport:
    return ProbeReport.from_json({
        "device": "cuda",
        "ddp": {"by_world_size": {"1": {"efficiency": 1.0, "speedup": 1.0, "samples_per_second": 100.0},
                                  "2": {"efficiency": eff, "speedup": 2 * eff, "samples_per_second": 200 * eff}}},
        "allreduce": {"by_world_size": {"2": {"peak_busbw_bytes_per_second": 20e9}}},
        "pipeline": {"by_stages": {"2": {"speedup": 1.6, "naive_speedup": 0.9, "activation_bytes_per_second": 3e9,
                                         "output_max_abs_diff": 0.0 if pipeline_ok else 0.5}}},
        "p2p": {"pairs": [{"src": 0, "dst": 1, "bandwidth_bytes_per_second": p2p_bw}]},
        "correctness": {"params_identical_across_ranks": True, "ddp_matches_one_process": True,
                        "pipeline_matches_unsplit": pipeline_ok},
        "diagnosis": {"sentences": [f"2 GPUs ({'pass' if eff >= 0.85 else 'fail'}): DDP efficiency {eff:.0%} …"],
                      "verdicts": {"2": "pass" if eff >= 0.85 else "fail"},
                      "links": [{"src": 0, "dst": 1, "link": "NVLink ×4", "expected_bytes_per_second": 56.25e9,
                                 "measured_bytes_per_second": p2p_bw, "ratio": p2p_bw / 56.25e9, "notes": []}]},
        "load": {"pcie_max_generation_under_load": {"0": gen, "1": 4}},
    })


@pytest.mark.parametrize(("check", "bad", "status"), [
    ("probe.ddp_scaling", {"eff": 0.7}, "fail"),
    ("probe.pipeline", {"pipeline_ok": False}, "fail"),
    ("probe.p2p", {"p2p_bw": 10e9}, "warn"),
    ("pcie.link_gen", {"gen": 2}, "fail"),
    ("probe.allreduce", None, None),
])
def test_probe_checks_both_ways(tmp_path: Path, check: str, bad: dict | None, status: str | None) -> None:
    from gpud.backends import open_machine
    from gpud.config import Config
    from gpud.doctor import diagnose

    p = tmp_path / "two.toml"
    p.write_text(d(2, extra=TWO_BRIDGED))
    m = open_machine(str(p))
    good = diagnose(m, Config(), only=[check], env={}, probe=_probe_result())
    assert good.checks and all(r.status == "pass" for r in good.checks), good.checks
    if bad is None:
        none = diagnose(m, Config(), only=[check], env={}, probe=ProbeReport(device="cuda"))
        assert [r.status for r in none.checks] == ["skip"]
        return
    worse = diagnose(m, Config(), only=[check], env={}, probe=_probe_result(**bad))
    hit = [r for r in worse.checks if r.status == status]
    assert hit and hit[0].remedy, worse.checks
    assert not diagnose(m, Config(), only=[check], env={}).checks or check == "pcie.link_gen"


def test_a_link_faster_than_the_ports_reported_maximum_is_no_slot_problem(tmp_path: Path, monkeypatch) -> None:
    """An HGX A100 prints Host Max 3 beside a live Gen4 link (a100-sxm4-535-x8-cold.txt): the port
    under-reports its capability; the link proves the slot carries Gen4. A Gen3 link there is a Gen3 slot."""
    import gpud.doctor.checks_pcie as pcie

    monkeypatch.setattr(pcie, "_port", lambda ctx, index: (16, 16, 4, 3))  # GPU Gen4, its port says Gen3
    loaded = d(defaults="utilization_percent = 90\npower_watts = 250")
    assert only(doctor(tmp_path, "pcie.link_gen", loaded)).status == "pass"  # the A6000 twin runs at Gen4
    slow = d(defaults="utilization_percent = 0\nidle_pcie_generation = 3")
    assert only(doctor(tmp_path, "pcie.link_gen", slow)).status == "warn"


def test_mig_mode_lists_the_instances_and_what_a_job_gets(tmp_path: Path) -> None:
    """MIG enabled: the finding names each instance (profile, GI/CI, memory, processes) and says that a job
    gets one instance by its MIG UUID; a MIG GPU without instances says nothing can run on it."""
    gpu = ('mig_mode = true\nmemory_mib = 81559\nmig_instances = [{ gpu_instance_id = 2, profile = "3g.40gb", '
           'memory_mib = 40448 }, { gpu_instance_id = 9, profile = "1g.10gb", memory_mib = 9856 }]\n'
           'processes = [{ pid = 4242, used_mib = 2048, gpu_instance_id = 2, compute_instance_id = 0 }]')
    r = only(doctor(tmp_path, "config.mig_mode", d(model="H200", gpu_extra={0: gpu})))
    assert r.status == "warn" and "MIG enabled, 2 instance(s): 3g.40gb GI 2/CI 0" in r.summary
    assert "2.0 of 39.5 GiB used, 1 process(es)" in r.summary and "1g.10gb GI 9/CI 0" in r.summary
    assert "free" in r.summary and "CUDA_VISIBLE_DEVICES=MIG-" in r.summary and "MIG-" in r.detail
    empty = only(doctor(tmp_path, "config.mig_mode", d(model="H200", defaults="mig_mode = true")))
    assert "no instance created: no CUDA process can run on it" in empty.summary
