"""The probe's report from its launches: each rank 0's figures in one ``ProbeReport``, speedups
against the baselines, the correctness checks."""

from __future__ import annotations

from typing import Any

from gpud.probe import history
from gpud.probe.nccl import nccl_env
from gpud.probe.plan import Plan
from gpud.probe.report import Nccl, ProbeReport

PARAM_TOLERANCE = {"cpu": 1e-4, "cuda": 1e-3}
CPU_NOTE = "CPU run: a functional check of DDP, the pipeline, all-reduce and P2P — not a measure of hardware."
VERSION = 2  # of the report's format


def assemble(plan: Plan, launches: list[dict[str, Any]]) -> ProbeReport:
    """The launches' figures (each rank 0's JSON) in one report: speedups against the baselines, and
    the correctness checks."""
    res = ProbeReport(device=plan.device, quick=plan.quick, world_sizes=plan.world_sizes,
                      suites=sorted(plan.suites), nccl=Nccl(env=nccl_env()))
    baselines: dict[str, Any] = {}
    for i, lr in enumerate(launches):
        n = str(lr["world_size"])
        if i == 0:  # the first launch says
            res.torch, res.dtype = lr.get("torch"), lr.get("dtype")
        if lr.get("gpu_name"):
            res.gpu_name = lr["gpu_name"]
        if lr.get("nccl"):
            res.nccl.version = lr["nccl"]
        res.ranks[n] = [r.get("uuid") for r in lr.get("ranks") or []]
        if lr.get("nccl_transports"):
            res.nccl.transports[n] = lr["nccl_transports"]
        if lr.get("teardown_killed_ranks"):
            res.teardown_killed = (res.teardown_killed or {}) | {n: lr["teardown_killed_ranks"]}
        if "ddp" in lr:
            res.ddp[n] = lr["ddp"]
        if "allreduce" in lr and "skipped" not in lr["allreduce"]:
            res.allreduce[n] = lr["allreduce"]
        if "pipeline_baseline" in lr:
            baselines |= lr["pipeline_baseline"]["by_stages"]
        if "pipeline" in lr and "skipped" not in lr["pipeline"]:
            res.pipeline[n] = lr["pipeline"]
        if "p2p" in lr and lr["p2p"].get("pairs"):
            res.p2p = lr["p2p"]
    for k, p in res.pipeline.items():
        b = baselines.get(k)
        if b and b.get("dtype", "fp32") == p.get("dtype"):  # a speedup compares one precision with itself
            p |= b | {"speedup": p["pipeline_samples_per_second"] / b["single_samples_per_second"],
                      "naive_speedup": b["naive_samples_per_second"] / b["single_samples_per_second"]}
    base = res.ddp.get("1")
    for n, r in res.ddp.items():
        if base:
            r["speedup"] = r["samples_per_second"] / base["samples_per_second"]
            r["efficiency"] = r["speedup"] / int(n)
    tol = PARAM_TOLERANCE[plan.device]
    ddp = list(res.ddp.values())
    if ddp:
        res.correctness.params_identical_across_ranks = all(r["params_max_spread"] == 0.0 for r in ddp)
        res.correctness.ddp_matches_one_process = all(
            r["reference"]["param_max_abs_diff"] <= tol and r["reference"]["loss_abs_diff"] <= tol * max(
                1.0, abs(r["reference"]["loss"])) for r in ddp)
    pipes = list(res.pipeline.values())
    if pipes:
        res.correctness.pipeline_matches_unsplit = all(p["output_max_abs_diff"] <= tol for p in pipes)
    model = next((r.get("model") for r in ddp), None)
    # The GPU count is set after the launches: the workload has always recorded it as null.
    res.workload = history.workload({**res.to_json(), "gpus": None}, model)
    return res
