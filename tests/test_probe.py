"""The training probe: a real CPU run (gloo processes), the plan, the diagnosis on real topologies."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import run_gpud

from gpud.hw.machine import open_machine
from gpud.probe import history
from gpud.probe.diagnose import bottleneck, explain, pair_link
from gpud.probe.runner import ProbeError, launch, make_plan, torch_available

needs_torch = pytest.mark.skipif(not torch_available() and os.environ.get("CI") != "true",
                                 reason="PyTorch not installed: pip install -e '.[probe]'")


@needs_torch
def test_cpu_probe_reports_every_section_with_correct_results(state_dir) -> None:
    t0 = time.monotonic()
    r = run_gpud("probe", "--device", "cpu", "--world-sizes", "1,2", "--json", timeout=180)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert elapsed < 90, f"{elapsed:.0f} s"
    ddp = res["ddp"]["by_world_size"]
    assert set(ddp) == {"1", "2"} and all(x["samples_per_second"] > 0 for x in ddp.values())
    assert ddp["2"]["speedup"] > 0 and 0 < ddp["2"]["efficiency"]
    assert ddp["2"]["ddp"] == {"bucket_cap_mb": 25, "gradient_as_bucket_view": True, "static_graph": True}
    # correctness: identical parameters on every rank; a DDP step equals one process's step on the global batch
    assert ddp["2"]["params_max_spread"] == 0.0
    assert ddp["2"]["reference"]["param_max_abs_diff"] < 1e-4 and ddp["2"]["reference"]["loss_abs_diff"] < 1e-4
    pipe = res["pipeline"]["by_stages"]["2"]
    assert pipe["output_max_abs_diff"] < 1e-4  # pipeline output equals the unsplit model's
    assert pipe["pipeline_samples_per_second"] > 0 and pipe["activation_bytes_per_second"] > 0
    ar = res["allreduce"]["by_world_size"]["2"]
    assert ar["peak_busbw_bytes_per_second"] > 0
    for row in ar["sizes"]:
        assert row["busbw_bytes_per_second"] == pytest.approx(row["algbw_bytes_per_second"] * 2 * (2 - 1) / 2)
        assert row["algbw_bytes_per_second"] == pytest.approx(row["bytes"] / row["seconds"])
    assert res["p2p"]["pairs"][0]["bandwidth_bytes_per_second"] > 0
    assert res["correctness"] == {"params_identical_across_ranks": True, "ddp_matches_one_process": True,
                                  "pipeline_matches_unsplit": True}
    assert res["note"] == "CPU run: these figures check function, not hardware."
    assert history.latest()["finished_at"] == res["finished_at"]


def test_plan_for_a_four_gpu_workstation() -> None:
    p = make_plan("cuda", 4, None, ["ddp", "pipeline", "allreduce", "p2p"], quick=False)
    assert p.world_sizes == [1, 2, 4]
    assert p.launches == [{"world_size": 1, "tasks": ["ddp", "p2p"]},
                          {"world_size": 2, "tasks": ["ddp", "allreduce", "pipeline"]},
                          {"world_size": 4, "tasks": ["ddp", "allreduce", "pipeline"]}]
    q = make_plan("cuda", 8, [2, 8], ["allreduce"], quick=True)
    assert q.launches == [{"world_size": 2, "tasks": ["allreduce"]}, {"world_size": 8, "tasks": ["allreduce"]}]
    with pytest.raises(Exception, match="world size 8"):
        make_plan("cuda", 4, [8], ["ddp"], quick=True)


@needs_torch
def test_a_launch_that_overruns_is_killed_at_its_timeout(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(ProbeError, match="timed out after 1 s"):
        launch({"device": "cpu", "tasks": ["ddp", "allreduce", "pipeline", "p2p"], "quick": False}, 2, 1.0, tmp_path)
    assert time.monotonic() - t0 < 10
    assert not any(p.name.endswith(".json") and not p.name.endswith(".spec.json") for p in tmp_path.iterdir())


def _synthetic(efficiency: float, busbw: float, n: int = 4) -> dict:
    return {"device": "cuda", "ddp": {"by_world_size": {"1": {"efficiency": 1.0}, str(n): {"efficiency": efficiency}}},
            "allreduce": {"by_world_size": {str(n): {"peak_busbw_bytes_per_second": busbw}}}, "p2p": {"pairs": []}}


def _topo(name: str):
    m = open_machine(name)
    snap = m.snapshot()
    return m.topology(snap), {g.index: g for g in snap.gpus}, {s.index: s for s in snap.samples}


def test_diagnosis_names_the_degraded_link(state_dir) -> None:
    t, infos, samples = _topo("z8-fury-4x-a6000-degraded")
    link = bottleneck(t, infos, samples, 4)
    assert (link.a, link.b, link.kind, link.text) == (2, 3, "pcie", "PCIe Gen4 x8")
    assert link.bandwidth == pytest.approx(12.5e9)
    d = explain(_synthetic(0.71, 11.8e9), t, infos, samples)
    assert d["verdicts"] == {"4": "fail"}
    assert d["sentences"] == ["4-GPU efficiency 71% (below 87.5%): all-reduce limited by GPU2↔GPU3 over PCIe Gen4 "
                              "x8 (11.8 GB/s measured; the link allows 12.5 GB/s); GPU2's NVLink bridge is down; "
                              "GPU2's link runs at x8 of x16; GPU3's NVLink bridge is down."]


def test_diagnosis_on_the_healthy_and_pcie_only_workstations(state_dir) -> None:
    t, infos, samples = _topo("z8-fury-4x-a6000")
    assert pair_link(t, infos, samples, 0, 1).text == "NVLink ×4"
    assert pair_link(t, infos, samples, 0, 1).bandwidth == pytest.approx(56.25e9)
    link = bottleneck(t, infos, samples, 4)
    assert link.text == "PCIe Gen4 x16" and link.notes == ()
    assert explain(_synthetic(0.93, 20e9), t, infos, samples)["verdicts"] == {"4": "pass"}
    t, infos, samples = _topo("z8-fury-4x-rtx6000ada")
    assert bottleneck(t, infos, samples, 2).text == "PCIe Gen4 x16"
    d = explain(_synthetic(0.80, 9e9, n=2), t, infos, samples)
    assert d["verdicts"] == {"2": "fail"} and "GPU0↔GPU1 over PCIe Gen4 x16" in d["sentences"][0]


def test_diagnosis_notes_the_socket_crossing_and_disabled_p2p(state_dir) -> None:
    t, infos, samples = _topo("2s-8x-a6000")
    link = bottleneck(t, infos, samples, 8)
    assert "the path crosses the CPU sockets' interconnect" in link.notes
    m = open_machine("z8-fury-4x-rtx6000ada")
    m.simulation.machine.inject("p2p", gpus=[1, 2], status="disabled_by_regkey")
    snap = m.snapshot()
    t = m.topology(snap)
    link = pair_link(t, {g.index: g for g in snap.gpus}, {s.index: s for s in snap.samples}, 1, 2)
    assert link.kind == "host" and link.bandwidth == pytest.approx(12.5e9)


def test_thresholds_are_the_seeds_and_configurable(state_dir) -> None:
    t, infos, samples = _topo("z8-fury-4x-a6000")
    assert explain(_synthetic(0.86, 20e9, n=2), t, infos, samples)["verdicts"] == {"2": "pass"}
    assert explain(_synthetic(0.86, 20e9, n=2), t, infos, samples, {2: 0.9})["verdicts"] == {"2": "fail"}
    assert explain(_synthetic(0.78, 20e9, n=8), t, infos, samples)["verdicts"] == {"8": "pass"}
    cpu = explain({**_synthetic(0.3, 1e9, n=2), "device": "cpu"}, None, {}, {})
    assert cpu["verdicts"] == {"2": "n/a"} and "say nothing about GPU hardware" in cpu["sentences"][0]


def test_regression_against_the_recent_best() -> None:
    def run(sps: float) -> dict:
        return {"device": "cuda", "host": "z8", "ddp": {"by_world_size": {"4": {"samples_per_second": sps}}}}

    assert history.regressions(run(910), [run(1000), run(950)]) == []  # 9 % below: not yet
    [msg] = history.regressions(run(850), [run(1000), run(950)])
    assert msg.startswith("ddp samples/s at world size 4: 850, 15 % below the recent best 1000")
    assert history.regressions(run(500), [{**run(1000), "host": "other"}]) == []


@needs_torch
def test_under_torchrun_every_rank_runs_and_rank_0_reports(state_dir, tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    from daemon_helpers import free_port

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun not installed beside this Python")
    r = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), "-m", "gpud", "probe",
                        "--quick", "--json"], capture_output=True, text=True, timeout=240,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)  # one report, from rank 0
    assert res["torchrun"] is True and set(res["ddp"]["by_world_size"]) == {"1", "2"}
    assert res["correctness"] == {"params_identical_across_ranks": True, "ddp_matches_one_process": True}
    assert res["allreduce"]["by_world_size"]["2"]["peak_busbw_bytes_per_second"] > 0
    assert res["note"].startswith("CPU run")
