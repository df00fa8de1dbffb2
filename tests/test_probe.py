"""The training probe: a real CPU run (gloo processes), the plan, the diagnosis on real topologies."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import run_gpud

from gpud.model import GpuSample
from gpud.probe import history
from gpud.probe.errors import ProbeError
from gpud.probe.launch import launch
from gpud.probe.plan import SUITES, make_plan, restrict_to_mig
from gpud.probe.torchrun import torch_available

needs_torch = pytest.mark.skipif(not torch_available() and os.environ.get("CI") != "true",
                                 reason="PyTorch not installed: README, Run the tests, says how to add the CPU build")


@needs_torch
@pytest.mark.long
def test_cpu_probe_reports_every_section_with_correct_results(state_dir) -> None:
    """Every section of a full CPU run, with correct results. It is also CI's acceptance run on the torch
    pyproject's [test] extra pins (the oldest the probe allows: torch 2.4 and 2.5 crashed in PipelineStage),
    which CI installs; it was a second, smaller run of its own (pipeline and DDP at world size 2), a subset
    of this one. No timed assertion: the machine is shared (the wall time is a benchmark's)."""
    import re

    import tomllib
    import torch

    r = run_gpud("probe", "--device", "cpu", "--world-sizes", "1,2", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["ok"] is True
    extra = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
    [pin] = [d for d in extra["project"]["optional-dependencies"]["test"] if d.startswith("torch")]
    version = re.fullmatch(r"torch==([\d.]+)", pin.replace(" ", ""))
    assert version is not None, pin
    if torch.__version__.split("+")[0] == version.group(1):  # CI: the pinned torch ran it
        assert res["torch"].split("+")[0] == version.group(1)
    ddp = res["ddp"]["by_world_size"]
    assert set(ddp) == {"1", "2"} and all(x["samples_per_second"] > 0 for x in ddp.values())
    assert ddp["2"]["speedup"] > 0 and 0 < ddp["2"]["efficiency"]
    assert ddp["2"]["ddp"] == {"bucket_cap_mb": 25, "gradient_as_bucket_view": True, "static_graph": True}
    # gradients stay DDP's bucket views: cleared in place, never set to None (the reducer would copy them)
    assert ddp["2"]["zero_grad_set_to_none"] is False and ddp["1"]["zero_grad_set_to_none"] is False
    assert ddp["2"]["reference"]["shards"] == 2  # rank 0's reference takes one shard at a time
    # correctness: identical parameters on every rank; a DDP step equals one process's step on the global batch
    assert ddp["2"]["params_max_spread"] == 0.0
    assert ddp["2"]["reference"]["param_max_abs_diff"] < 1e-4 and ddp["2"]["reference"]["loss_abs_diff"] < 1e-4
    pipe = res["pipeline"]["by_stages"]["2"]
    assert pipe["output_max_abs_diff"] < 1e-4  # pipeline output equals the unsplit model's
    assert pipe["pipeline_samples_per_second"] > 0 and pipe["activation_bytes_per_second"] > 0
    assert pipe["dtype"] == "fp32" and pipe["speedup"] > 0  # against a baseline in the same precision
    ar = res["allreduce"]["by_world_size"]["2"]
    assert ar["peak_busbw_bytes_per_second"] > 0
    # DDP's 25 MiB bucket is one of the sizes swept: the prediction reads its bus bandwidth
    assert ar["bucket_bytes"] == 25 << 20 and 25 << 20 in [row["bytes"] for row in ar["sizes"]]
    assert ar["bucket_busbw_bytes_per_second"] > 0
    for row in ar["sizes"]:
        assert row["busbw_bytes_per_second"] == pytest.approx(row["algbw_bytes_per_second"] * 2 * (2 - 1) / 2)
        assert row["algbw_bytes_per_second"] == pytest.approx(row["bytes"] / row["seconds"])
    pair = res["p2p"]["pairs"][0]
    assert pair["bandwidth_bytes_per_second"] > 0 and pair["bidirectional_bytes_per_second"] > 0
    assert res["p2p"]["latency"] == "half the round trip of a 4-byte ping-pong" and pair["one_way_latency_seconds"] > 0
    for x in ddp.values():  # three timed windows, median and spread
        assert len(x["windows_seconds"]) == 3 and x["median_seconds"] == sorted(x["windows_seconds"])[1]
        w = x["windows_seconds"]
        assert x["spread"] == pytest.approx((max(w) - min(w)) / x["median_seconds"])
    assert res["workload"]["quick"] is False and res["workload"]["model"]["dim"] == 64
    assert res["correctness"] == {"params_identical_across_ranks": True, "ddp_matches_one_process": True,
                                  "pipeline_matches_unsplit": True}
    assert res["note"].startswith("CPU run: a functional check")
    latest = history.latest()
    assert latest is not None and latest.finished_at == res["finished_at"]


@needs_torch
def test_the_p2p_sweep_fits_its_share_of_the_probes_time() -> None:
    """docs/probe.md, "P2P sizing": every copy the sweep makes, timed at 6 GB/s (a Gen3 x16 link through
    host memory: NCCL's PCI_BW 12 GB/s, halved), both-ways copies no faster than one-way ones."""
    from gpud.probe.worker import P2P_BYTES, P2P_REPS, WINDOWS, pair_deadline

    def seconds(gpus: int, quick: bool) -> float:
        r = P2P_REPS[quick]
        per_pair = (4 + WINDOWS * r + 2 * WINDOWS * r) + (2 + WINDOWS * r)  # the first row both ways, then back
        return gpus * (gpus - 1) // 2 * per_pair * P2P_BYTES / 6e9
    assert seconds(4, quick=True) < 10  # of --quick's 60 s on 4 GPUs
    assert seconds(8, quick=False) < 90  # of the full probe's 5 minutes on 8 GPUs
    assert round(seconds(8, quick=False)) == 62 and round(seconds(4, quick=True)) == 4
    # a pair that hangs costs its deadline: its bytes at a Gen1 x1 link (0.25 GB/s) and 10 s
    assert round(pair_deadline(P2P_REPS[False], both=True)) == 50


def test_plan_for_a_four_gpu_workstation() -> None:
    p = make_plan("cuda", 4, None, ["ddp", "pipeline", "allreduce", "p2p"], quick=False)
    assert p.world_sizes == [1, 2, 4] and p.stages == [2, 4]
    # the baselines (one GPU, the naive split) in a launch of their own; the copies between GPU pairs in
    # another, so that a pair that hangs costs no baseline
    assert p.launches == [{"world_size": 1, "tasks": ["ddp", "pipeline_baseline"]},
                          {"world_size": 1, "tasks": ["p2p"]},
                          {"world_size": 2, "tasks": ["ddp", "allreduce", "pipeline"]},
                          {"world_size": 4, "tasks": ["ddp", "allreduce", "pipeline"]}]
    q = make_plan("cuda", 8, [2, 8], ["allreduce"], quick=True)
    assert q.launches == [{"world_size": 2, "tasks": ["allreduce"]}, {"world_size": 8, "tasks": ["allreduce"]}]
    with pytest.raises(Exception, match="world size 8"):
        make_plan("cuda", 4, [8], ["ddp"], quick=True)


def test_plan_without_world_size_1_still_has_its_baseline() -> None:
    p = make_plan("cuda", 4, [2, 4], ["ddp"], quick=True)
    assert p.launches == [{"world_size": 1, "tasks": ["ddp"]}, {"world_size": 2, "tasks": ["ddp"]},
                          {"world_size": 4, "tasks": ["ddp"]}]
    p = make_plan("cpu", 0, [3], ["pipeline"], quick=True)
    assert p.stages == [3]
    assert p.launches == [{"world_size": 1, "tasks": ["pipeline_baseline"]}, {"world_size": 3, "tasks": ["pipeline"]}]


def test_no_p2p_row_from_a_gpu_to_itself() -> None:
    assert all("p2p" not in launch_["tasks"] for launch_ in make_plan("cuda", 1, None, list(SUITES), False).launches)


@needs_torch
def test_a_launch_that_overruns_is_killed_at_its_timeout(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(ProbeError, match="timed out after 1 s"):
        launch({"device": "cpu", "tasks": ["ddp", "allreduce", "pipeline", "p2p"], "quick": False}, 2, 1.0, tmp_path)
    assert time.monotonic() - t0 < 10
    assert not any(p.name.endswith(".json") and ".spec." not in p.name for p in tmp_path.iterdir())


def test_regression_against_the_recent_best_of_the_same_workload() -> None:
    def run(sps: float, spread: float = 0.01, quick: bool = False) -> dict:
        return {"device": "cuda", "host": "z8", "quick": quick, "suites": ["ddp"],
                "ddp": {"by_world_size": {"4": {"samples_per_second": sps, "spread": spread}}}}

    assert history.regressions(run(910), [run(1000), run(950)]) == []  # 9 % below: not yet
    [msg] = history.regressions(run(850), [run(1000), run(950)])
    assert msg.startswith("ddp samples/s at world size 4: 850, 15 % below the recent best 1000")
    assert history.regressions(run(500), [{**run(1000), "host": "other"}]) == []
    # a quick run is never compared with a full one
    assert history.regressions(run(500, quick=True), [run(1000)]) == []
    # the threshold exceeds the measured spread: a figure that varies by 10 % needs a 30 % drop
    assert history.regressions(run(800, spread=0.10), [run(1000)]) == []
    assert history.regressions(run(650, spread=0.10), [run(1000)])
    # a record of another version lacking a figure is left out of the comparison, not a KeyError
    lacking = {**run(1000), "ddp": {"by_world_size": {"4": {"spread": 0.01}}}}
    assert history.regressions(run(850), [lacking]) == [] and history.regressions(lacking, [run(1000)]) == []


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


class _Ranks:
    """The worker as run_distributed sees it, without torch: canned CPU figures, one rank's group."""

    def __init__(self, sps: float, cuda: bool = False) -> None:
        self.gathered: list = []
        self.sps, self.cuda = sps, cuda

    def cuda_available(self) -> bool:
        return self.cuda

    def init(self, *a) -> None:
        pass

    def gather(self, value):
        self.gathered.append(value)
        return [value]

    def finish_group(self) -> None:
        pass

    def run(self, spec, rank, world, local):
        ddp = {"samples_per_second": self.sps * world, "spread": 0.01, "params_max_spread": 0.0,
               "reference": {"param_max_abs_diff": 0.0, "loss_abs_diff": 0.0, "loss": 1.0},
               "model": {"dim": 64, "layers": 4, "seq": 32, "heads": 4}}
        return {"world_size": world, "device": spec["device"], "torch": "2.13.0", "dtype": "fp32", "ddp": ddp}


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch):
    import sys

    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(k, v)

    def install(ranks: _Ranks) -> None:
        import gpud.probe

        monkeypatch.setitem(sys.modules, "gpud.probe.worker", ranks)
        monkeypatch.setattr(gpud.probe, "worker", ranks, raising=False)
    return install


def test_under_torchrun_a_cpu_run_gets_no_regression_verdict(state_dir, torchrun_env) -> None:
    from gpud.probe.torchrun import run_distributed

    torchrun_env(_Ranks(100.0))
    first = run_distributed(quick=True, suites=["ddp"], host="z8")
    torchrun_env(_Ranks(10.0))  # a tenth of the figures: on CPU, other load, not the hardware
    second = run_distributed(quick=True, suites=["ddp"], host="z8")
    assert first is not None and second is not None and len(history.load()) == 2
    assert second.regressions == []


def test_under_torchrun_local_rank_0_takes_the_lock_and_checks_the_gpus(state_dir, torchrun_env) -> None:
    from gpud.backends import open_machine
    from gpud.probe.errors import ProbeBusy
    from gpud.probe.lock import probe_lock
    from gpud.probe.torchrun import run_distributed

    ranks = _Ranks(100.0)
    torchrun_env(ranks)
    with probe_lock(), pytest.raises(ProbeBusy, match="another probe is running on this machine"):
        run_distributed(quick=True, suites=["ddp"], host="z8")
    assert ranks.gathered and "another probe is running" in ranks.gathered[0]  # every rank learns it
    gpus = _Ranks(100.0, cuda=True)
    torchrun_env(gpus)
    m = open_machine("z8-fury-4x-a6000-degraded")  # alice trains on GPU1, one of this node's two GPUs
    with pytest.raises(ProbeBusy, match=r"z8: GPUs in use.*GPU1: 100 % busy, pid 48213 \(alice"):
        run_distributed(quick=True, suites=["ddp"], host="z8", machine=m)
    assert history.load() == []  # nothing measured, nothing kept


def test_under_torchrun_the_report_names_each_ranks_node_and_host(state_dir, torchrun_env, capsys) -> None:
    from gpud.cli.probe import render
    from gpud.probe.report import Placement, ProbeReport, by_node
    from gpud.probe.torchrun import run_distributed

    class TwoHosts(_Ranks):
        def run(self, spec, rank, world, local):
            out = super().run(spec, rank, world, local)
            if world > 1:
                out["ranks"] = [{"rank": 0, "node": 0, "host": "z8-01", "uuid": "GPU-aaa"},
                                {"rank": 1, "node": 1, "host": "z8-02", "uuid": "GPU-bbb"}]
            return out

    torchrun_env(TwoHosts(100.0))
    res = run_distributed(quick=True, suites=["ddp"], host="z8-01")
    assert res is not None and res.nodes == 2
    assert by_node(res.placement or []) == [(0, "z8-01", [Placement(0, 0, "z8-01", "GPU-aaa")]),
                                            (1, "z8-02", [Placement(1, 1, "z8-02", "GPU-bbb")])]
    assert ProbeReport.from_json(res.to_json()).placement == res.placement  # the history reads it back
    assert history.latest() is not None and history.latest().placement == res.placement  # type: ignore[union-attr]
    render(ProbeReport(host="z8-01", placement=res.placement))  # the fake ranks' figures are not renderable
    out = capsys.readouterr().out
    assert "node 0 (z8-01): rank 0 on GPU-aaa" in out and "node 1 (z8-02): rank 1 on GPU-bbb" in out


def test_on_a_mig_gpu_the_probe_keeps_one_process_on_one_instance_and_says_why() -> None:
    """NVIDIA's MIG user guide: no P2P (PCIe or NVLink) under MIG, one MIG device per CUDA process. The
    multi-rank launches and the P2P copies are dropped, the one-device DDP baseline stays, and the note
    says which GPU and what was skipped; a machine without MIG keeps its plan."""
    plan = make_plan("cuda", 4, None, ["ddp", "pipeline", "allreduce", "p2p"], quick=False)
    whole = [GpuSample(index=i, uuid=f"GPU-{i}", timestamp=0.0, mig_mode=False) for i in range(4)]
    assert restrict_to_mig(plan, whole) is None and len(plan.launches) == 4
    mig = [*whole[:1], GpuSample(index=1, uuid="GPU-1", timestamp=0.0, mig_mode=True), *whole[2:]]
    note = restrict_to_mig(plan, mig)
    assert plan.launches == [{"world_size": 1, "tasks": ["ddp"]}] and plan.world_sizes == [1]
    assert note is not None and note.startswith("GPU1 in MIG mode: NCCL and P2P between MIG instances")
    assert "skipped: pipeline_baseline, p2p, ddp (2 ranks), allreduce (2 ranks), pipeline (2 ranks)" in note
    assert "one process training on one MIG instance" in note
    only = make_plan("cuda", 2, None, ["allreduce"], quick=True)
    assert restrict_to_mig(only, mig) is not None and only.launches == []  # _run stops with the note
