"""The probe's robustness: world sizes without 1, uneven stages, a tear-down that hangs, a launch that
fails, a P2P pair that hangs, one probe per machine, busy GPUs and the desktop, CPU affinity, NCCL's
settings, the daemon's probe. The CUDA code paths themselves: tests/test_probe_cuda_paths.py."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_gpud
from daemon_helpers import RunningDaemon, free_port
from probe_helpers import XORG, desktop

from gpud.backends import open_machine
from gpud.daemon.control import request
from gpud.model import GpuProcess
from gpud.probe import history, runner
from gpud.probe import launch as launcher
from gpud.probe.assemble import assemble
from gpud.probe.errors import ProbeBusy, ProbeError
from gpud.probe.launch import launch, launch_kept, rank_env
from gpud.probe.lock import probe_lock
from gpud.probe.monitor import LoadMonitor, busy_gpus, cpu_affinity, visible_gpus
from gpud.probe.plan import make_plan
from gpud.probe.runner import run_probe
from gpud.probe.torchrun import torch_available

needs_torch = pytest.mark.skipif(not torch_available() and os.environ.get("CI") != "true",
                                 reason="PyTorch not installed: README, Run the tests, says how to add the CPU build")

# Runs a worker rank with torch's default device set to `meta`: a tensor made without an explicit device
# (on a GPU run: a CPU tensor handed to NCCL) cannot take part in any computation or collective. This
# runs the CPU path; where each tensor goes on the CUDA path is tests/test_probe_cuda_paths.py's.
META = """
import runpy, sys, torch
torch.set_default_device("meta")
sys.argv = sys.argv[1:]
runpy.run_module("gpud.probe.worker", run_name="__main__", alter_sys=True)
"""


def _ranks(tmp_path: Path, spec: dict, world: int) -> list[subprocess.CompletedProcess[str]]:
    script = tmp_path / "meta.py"
    script.write_text(META)
    spec_file = tmp_path / f"spec{world}.json"
    spec_file.write_text(json.dumps(spec))
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script), "worker", str(spec_file)], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(r),
                                   "WORLD_SIZE": str(world), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
             for r in range(world)]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=180)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, ""))
    return out


@needs_torch
def test_the_worker_makes_no_tensor_without_an_explicit_device(tmp_path: Path) -> None:
    multi = {"device": "cpu", "tasks": ["ddp", "allreduce", "p2p", "pipeline"], "quick": True, "stages": [2],
             "out": str(tmp_path / "two.json")}
    for r in _ranks(tmp_path, multi, 2):
        assert r.returncode == 0, r.stdout[-3000:]
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["ddp"]["params_max_spread"] == 0.0 and two["pipeline"]["output_max_abs_diff"] == 0.0
    single = {"device": "cpu", "tasks": ["ddp", "pipeline_baseline"], "quick": True, "stages": [3],
              "out": str(tmp_path / "one.json")}
    [r] = _ranks(tmp_path, single, 1)
    assert r.returncode == 0, r.stdout[-3000:]
    assert json.loads((tmp_path / "one.json").read_text())["pipeline_baseline"]["by_stages"]["3"]["naive_devices"] == 1


@needs_torch
def test_stages_differ_by_at_most_one_layer() -> None:
    from gpud.probe.worker import split

    assert [len(r) for r in split(4, 3)] == [2, 1, 1]
    for layers in range(1, 13):
        for stages in range(1, layers + 1):
            sizes = [len(r) for r in split(layers, stages)]
            assert sum(sizes) == layers and max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
            assert [i for r in split(layers, stages) for i in r] == list(range(layers))


@needs_torch
def test_bf16_only_from_ampere(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from gpud.probe.worker import precision

    assert precision(torch.device("cpu")) == ("fp32", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (7, 5))  # Turing: RTX 8000
    assert precision(torch.device("cuda:0")) == ("fp16", torch.float16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 6))  # Ampere: A6000
    assert precision(torch.device("cuda:0")) == ("bf16", torch.bfloat16)


@needs_torch
def test_ddp_at_world_size_2_without_1(state_dir) -> None:
    r = run_gpud("probe", "--device", "cpu", "--world-sizes", "2", "--suite", "ddp", "--quick", "--json",
                 "--simulate", "z8-fury-4x-a6000", timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["world_sizes"] == [2] and set(res["ddp"]["by_world_size"]) == {"1", "2"}
    assert res["ddp"]["by_world_size"]["2"]["efficiency"] > 0
    assert res["diagnosis"]["verdicts"] == {"2": "n/a"}
    out = io.StringIO()
    sys_stdout, sys.stdout = sys.stdout, out
    try:
        from gpud.cli.probe import render
        from gpud.probe.report import ProbeReport

        render(ProbeReport.from_json(res))
    finally:
        sys.stdout = sys_stdout
    text = out.getvalue()
    header = next(line for line in text.splitlines() if line.startswith("world size"))
    assert "functional check" in text and header.split() == ["world", "size", "samples/s", "spread"]
    assert not re.search(r"\d\.\d\d×", text)


@needs_torch
def test_pipeline_with_three_stages_over_four_layers(state_dir) -> None:
    r = run_gpud("probe", "--device", "cpu", "--world-sizes", "3", "--suite", "pipeline", "--quick", "--json",
                 env={"GPUD_SIMULATE": "z8-fury-4x-a6000"}, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    p = json.loads(r.stdout)["pipeline"]["by_stages"]["3"]
    assert p["stage_layers"] == [2, 1, 1] and p["output_max_abs_diff"] <= 1e-4
    assert p["naive_devices"] == 1 and p["single_samples_per_second"] > 0  # from the baseline launch
    hops = p["activation_hops"]
    assert [(h["src_stage"], h["dst_stage"]) for h in hops] == [(0, 1), (1, 2)]
    assert p["activation_bytes_per_second"] == min(h["bytes_per_second"] for h in hops) > 0


@needs_torch
def test_a_teardown_that_hangs_after_the_result_does_not_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "TEARDOWN_GRACE", 1.0)
    t0 = time.monotonic()
    res = launch({"device": "cpu", "tasks": ["allreduce"], "quick": True, "test_teardown_hang_seconds": 120}, 2,
                 90.0, tmp_path)
    assert time.monotonic() - t0 < 60
    assert res["teardown_killed_ranks"] == [0, 1] and res["allreduce"]["peak_busbw_bytes_per_second"] > 0
    spec = json.loads((tmp_path / "ws2-allreduce.spec.0.json").read_text())
    assert spec["collective_timeout"] < spec["timeout"]  # a hung collective fails inside the rank, named


@needs_torch
def test_ranks_are_pinned_to_their_cpus(tmp_path: Path) -> None:
    cpu = sorted(os.sched_getaffinity(0))[0]
    res = launch({"device": "cpu", "tasks": ["ddp"], "quick": True}, 1, 90.0, tmp_path, affinity=[[cpu]])
    assert res["ranks"][0]["cpus"] == [cpu]


def test_cpu_affinity_only_on_multi_socket_machines(state_dir) -> None:
    allowed = os.sched_getaffinity(0)
    two = open_machine("2s-8x-a6000")
    got = cpu_affinity(two, list(range(8)))
    want = [sorted(set(g.cpu_affinity or ()) & allowed) for g in sorted(two.snapshot().gpus, key=lambda g: g.index)]
    assert got == want and len(got) == 8
    assert cpu_affinity(open_machine("z8-fury-4x-a6000"), [0, 1, 2, 3]) == []


def test_visible_gpus_follow_cuda_visible_devices(state_dir) -> None:
    infos = list(open_machine("z8-fury-4x-a6000").snapshot().gpus)
    assert visible_gpus(infos, {}) == [0, 1, 2, 3]
    assert visible_gpus(infos, {"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
    assert visible_gpus(infos, {"CUDA_VISIBLE_DEVICES": f"{infos[3].uuid[:12]},0"}) == [3, 0]
    assert visible_gpus(infos, {"CUDA_VISIBLE_DEVICES": "1,9,2"}) == [1]  # CUDA stops at the first bad entry


@needs_torch
def test_one_probe_at_a_time(state_dir) -> None:
    with probe_lock(), pytest.raises(ProbeBusy, match=f"another probe is running on this machine \\(pid {os.getpid()}"):
        run_probe(device="cpu", gpus=0, world_sizes=[1], suites=["ddp"], quick=True, keep_history=False)


@needs_torch
def test_busy_gpus_are_refused_before_anything_starts(state_dir) -> None:
    m = open_machine("z8-fury-4x-a6000-degraded")  # GPU1 trains someone's model
    with pytest.raises(ProbeBusy, match=r"GPU1: 100 % busy, pid 48213 \(alice: python train_resnet.py --gpu 1\)"):
        run_probe(device="cuda", gpus=4, world_sizes=[2], suites=["ddp"], quick=True, machine=m, keep_history=False)


def test_a_desktops_display_server_is_not_a_job(tmp_path: Path, state_dir) -> None:
    m = open_machine(desktop(tmp_path))  # Xorg and gnome-shell on GPU0, nothing else
    assert busy_gpus(m, [0, 1, 2, 3]) == []
    mon = LoadMonitor(m)
    mon.sample()
    assert mon.seen.processes == {}  # not named as a cause with --allow-busy either
    # A job beside the desktop is one.
    job = open_machine(desktop(tmp_path, XORG + ', { pid = 2003, used_mib = 8192, user = "erin", uid = 1005, '
                                                 'command = "python -m jupyter lab" }'))
    assert busy_gpus(job, [0]) == ["GPU0: 0 % busy, pid 2003 (erin: python -m jupyter lab)"]


def test_in_a_container_the_probes_own_ranks_are_not_other_users(state_dir) -> None:
    # NVML reports host PIDs; the ranks' PIDs in the container differ and /proc here does not know them.
    mon = LoadMonitor(None)
    mon.ours, mon.before = {101}, {0: {900}}
    rank = GpuProcess(pid=48001, used_memory_bytes=1 << 30, user=None, command=None)
    stranger = GpuProcess(pid=900, used_memory_bytes=1 << 30, user=None, command=None)
    alice = GpuProcess(pid=48002, used_memory_bytes=1 << 30, user="alice", command="python train.py")
    assert mon.others(0, [rank, stranger, alice]) == [stranger, alice]
    assert mon.hidden == {0: {48001}}
    # Under torchrun the node's other ranks may hold their GPUs already when local rank 0 checks.
    import dataclasses
    import types

    from probe_helpers import gpu, sample

    now = dataclasses.replace(sample(gpu(0)), processes=(rank, alice), utilization_gpu_percent=0)
    m = types.SimpleNamespace(snapshot=lambda: types.SimpleNamespace(samples=[now]))
    assert busy_gpus(m, [0], unreadable_ours=True) == ["GPU0: 0 % busy, pid 48002 (alice: python train.py)"]
    assert busy_gpus(m, [0]) == ["GPU0: 0 % busy, pid 48001, pid 48002 (alice: python train.py)"]


@needs_torch
def test_a_failed_launch_keeps_what_it_measured_and_the_report_says_why(state_dir, monkeypatch) -> None:
    real = runner.make_plan

    def plan(*a, **kw):  # the one-GPU launch measures DDP, then meets a task that fails
        p = real(*a, **kw)
        p.launches = [{"world_size": 1, "tasks": ["ddp", "no_such_task"]}]
        return p
    monkeypatch.setattr(runner, "make_plan", plan)
    res = run_probe(device="cpu", gpus=0, world_sizes=[1], suites=["ddp"], quick=True)
    assert res.ddp["1"]["samples_per_second"] > 0  # measured before the failure: kept
    [failure] = res.failures
    assert failure.startswith("world size 1 (ddp, no_such_task): rank 0 exited with 1: KeyError: 'no_such_task'")
    assert "the ranks' logs: " in failure
    assert "--debug" not in ProbeError.remedy  # `gpud probe --debug` does not exist; the logs are kept
    assert res.ok is False and res.diagnosis.sentences  # diagnosed
    latest = history.latest()  # and kept in the history
    assert latest is not None and latest.failures == [failure] and latest.ddp["1"]


@needs_torch
def test_a_p2p_pair_that_hangs_is_killed_at_its_deadline_and_named_with_acs(tmp_path: Path, state_dir) -> None:
    m = open_machine("z8-fury-4x-a6000-degraded")  # ACS on the root ports above every GPU
    done = [{"src": 0, "dst": 1, "bandwidth_bytes_per_second": 1e9}]
    spec = {"device": "cpu", "tasks": ["ddp"], "quick": True,
            "test_hang": {"p2p_pair": [1, 2], "deadline_seconds": 2, "done": done}}
    failures: list[str] = []
    t0 = time.monotonic()
    kept = launch_kept(spec, 1, 120, tmp_path, None, [], LoadMonitor(None), failures, m)
    assert time.monotonic() - t0 < 60  # the pair's deadline, not the launch's 120 s
    assert failures[0].startswith("P2P GPU1→GPU2 hung: its copies did not finish within 2 s; ACS on a PCIe bridge "
                                  "above the GPUs redirects peer-to-peer requests through the root complex")
    assert "ACS is on above GPU1: " in failures[0] and len(failures) == 1
    # the pairs measured before the hang are kept; the launch started again after the pair and finished
    assert kept[0]["p2p"]["pairs"] == done and kept[0]["p2p"]["partial"] is True
    assert kept[1]["ddp"]["samples_per_second"] > 0


def test_the_pipeline_speedup_compares_one_precision_with_itself() -> None:
    plan = make_plan("cuda", 2, [2], ["pipeline"], True)
    base = {"world_size": 1, "pipeline_baseline": {"by_stages": {"2": {
        "single_samples_per_second": 100.0, "naive_samples_per_second": 60.0, "dtype": "bf16"}}}}
    pipe = {"world_size": 2, "pipeline": {"pipeline_samples_per_second": 150.0, "dtype": "fp32",
                                          "output_max_abs_diff": 0.0}}
    assert "speedup" not in assemble(plan, [base, pipe]).pipeline["2"]  # bf16 against fp32: no speedup
    base["pipeline_baseline"]["by_stages"]["2"]["dtype"] = "fp32"
    assert assemble(plan, [base, pipe]).pipeline["2"]["speedup"] == 1.5


def test_every_nccl_variable_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_P2P_LEVEL", "SYS")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    res = assemble(make_plan("cpu", 0, [1], ["ddp"], True), [])
    assert res.nccl.env == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}


@needs_torch
def test_the_daemons_probe_logs_its_result_and_leaves_no_zombie(tmp_path: Path, state_dir) -> None:
    d = RunningDaemon(tmp_path, sim="z8-fury-4x-a6000", config="probe_world_sizes = [2]\n")
    try:
        reply = request(d.sock, "probe-now")
        assert reply and reply["ok"], reply
        pid = int(reply["message"].rsplit(" ", 1)[1])
        d.wait_for(lambda: "probe finished (requested): OK" in d.logs(), 150, "the probe's result in the log")
        time.sleep(0.5)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(") ")[1][0] != "Z"
    finally:
        d.stop()


def test_gpu_ranks_write_nccls_transports_to_a_file_each(tmp_path: Path) -> None:
    spec = {"device": "cuda", "tasks": ["allreduce"]}
    env = rank_env(spec, 2, 1, tmp_path, 2, environ={"PATH": "/bin", "RANK": "7", "MASTER_PORT": "29500"})
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == ("1", "1", "2") and "MASTER_PORT" not in env
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl-ws2-rank1.log")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    mine = rank_env(spec, 2, 0, tmp_path, 2, environ={"NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert mine["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_SUBSYS" not in mine and mine["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert "NCCL_DEBUG" not in rank_env({"device": "cpu"}, 2, 0, tmp_path, None, environ={})


@needs_torch
def test_a_gpu_group_has_a_backend_per_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked without a GPU: the process group a GPU rank creates, recorded instead of created."""
    import torch
    import torch.distributed as dist

    from gpud.probe import worker

    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 6))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    ctx = worker.init({"device": "cuda", "collective_timeout": 30, "quick": True}, 1, 2, 1)
    [(backend, kw)] = calls
    assert backend == "cpu:gloo,cuda:nccl" and kw["device_id"] == torch.device("cuda:1") == ctx.device
    assert kw["timeout"].total_seconds() == 30 and (kw["rank"], kw["world_size"]) == (1, 2)
    assert ctx.dtype_name == "bf16"


def test_history_written_before_the_report_was_typed_still_loads(state_dir) -> None:
    """Records written by the dict-based runner (tests/fixtures/probe) load as ``ProbeReport``s that
    write back exactly the same JSON, and the daemon's, doctor's and the exporter's readings of them."""
    from gpud.exporter import exposition
    from gpud.observation import Observation
    from gpud.probe import history
    from gpud.probe.report import ProbeReport

    fixture = REPO / "tests" / "fixtures" / "probe" / "history-v2.jsonl"
    history.path().parent.mkdir(parents=True, exist_ok=True)
    history.path().write_text(fixture.read_text())
    records = history.load()
    assert len(records) == 2
    for rec in records:
        assert ProbeReport.from_json(rec).to_json() == rec
    cpu, gpu = (ProbeReport.from_json(r) for r in records)
    assert cpu.device == "cpu" and cpu.diagnosis.verdicts == {"2": "n/a"} and cpu.correctness.ok() and cpu.ok
    assert cpu.load is not None and cpu.nccl.version is None and cpu.ddp["2"]["efficiency"] > 0
    assert gpu.diagnosis.verdicts == {"4": "fail"} and gpu.diagnosis.failed() and not gpu.ok
    d = gpu.diagnosis.details["4"]
    assert d.bus_verdict and d.efficiency_verdict and d.predicted_efficiency and d.path.transport
    [link] = gpu.diagnosis.links
    assert (link.src, link.dst) == (2, 3) and link.bidirectional_ratio is not None
    assert gpu.diagnosis.seeds["4"].seed_speedup == 3.5
    latest = history.latest()
    assert latest is not None and latest.to_json() == records[-1]
    history.append(latest)  # written back unchanged
    assert history.load()[-1] == records[-1]
    text = exposition(Observation(None, probe=cpu)).decode()  # the synthetic one lacks samples/s
    assert 'gpud_probe_ddp_samples_per_second{world_size="2"}' in text and "gpud_probe_success 1.0" in text
    text = exposition(Observation(None, probe=gpu)).decode()  # a record lacking figures: absent, no KeyError
    assert "gpud_probe_success 0.0" in text
    # keys of another version survive a round trip
    other = {**records[0], "future_key": {"a": 1}}
    assert ProbeReport.from_json(other).to_json() == other


def _json_values():
    from hypothesis import strategies as hs

    scalars = hs.none() | hs.booleans() | hs.integers() | hs.floats(allow_nan=False) | hs.text(max_size=8)
    return hs.recursive(scalars, lambda inner: hs.lists(inner, max_size=4)
                        | hs.dictionaries(hs.text(max_size=8), inner, max_size=4), max_leaves=12)


def test_history_report_reading_never_raises_on_any_json_value() -> None:
    """``ProbeReport.from_json`` takes any JSON value, at the top level and under every key it knows
    (and under the keys of its parts): a value of the wrong type reads as absent, and is described."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    from gpud.probe.report import _KEYS, ProbeReport

    fixture = REPO / "tests" / "fixtures" / "probe" / "history-v2.jsonl"
    records = [json.loads(line) for line in fixture.read_text().splitlines()]
    inner = {"ddp": ["by_world_size"], "allreduce": ["by_world_size"], "pipeline": ["by_stages"], "p2p": ["pairs"],
             "nccl": ["version", "env", "transports"], "correctness": ["params_identical_across_ranks"],
             "load": ["pcie_max_generation_under_load", "clock_events", "other_processes"],
             "diagnosis": ["sentences", "verdicts", "details", "links", "seeds"]}
    paths = [(k,) for k in _KEYS] + [(k, sub) for k, subs in inner.items() for sub in subs]
    paths += [("diagnosis", "details", "4", k) for k in ("gpus", "path", "bus_verdict", "predicted_efficiency")]
    paths += [("diagnosis", "links", 0), ("diagnosis", "seeds", "4"), ("diagnosis", "verdicts", "4")]

    def put(rec: dict, path: tuple, value: object) -> dict:
        rec = json.loads(json.dumps(rec))
        at = rec
        for k in path[:-1]:
            at = at[k] if isinstance(at, dict) and k in at or isinstance(at, list) and at else None
            if at is None:
                return rec
        if isinstance(at, list):
            at[:1] = [value]
        else:
            at[path[-1]] = value
        return rec

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(value=_json_values(), path=hs.sampled_from(paths), base=hs.sampled_from(records))
    def check(value: object, path: tuple, base: dict) -> None:
        problems: list[str] = []
        report = ProbeReport.from_json(value, problems)
        report.to_json()
        problems = []
        report = ProbeReport.from_json(put(base, path, value), problems)
        json.dumps(report.to_json())
        report.p2p_pairs, report.diagnosis.failed(), report.correctness.ok()
        assert all(isinstance(p, str) and p for p in problems)

    check()
    for path, value in [(("diagnosis",), "x"), (("nccl",), "2.18"), (("world_sizes",), 4)]:
        problems = []
        ProbeReport.from_json(put(records[1], path, value), problems)
        assert len(problems) == 1 and problems[0].startswith(path[0]), problems
    assert ProbeReport.from_json({"diagnosis": "x"}).diagnosis.verdicts == {}
    assert ProbeReport.from_json({"nccl": "2.18"}).nccl.version is None
    assert ProbeReport.from_json({"world_sizes": 4}).world_sizes == []


BAD_LINES = ['{"diagnosis": "x"}', '{"nccl": "2.18"}', '{"world_sizes": 4}', "[1, 2]", "not json"]


def _history_with_bad_lines() -> dict:
    """The history: a valid CPU report, then lines that are not reports; the valid one returned."""
    from gpud.probe import history

    fixture = REPO / "tests" / "fixtures" / "probe" / "history-v2.jsonl"
    good = json.loads(fixture.read_text().splitlines()[0])  # the CPU report: its figures are complete
    history.path().parent.mkdir(parents=True, exist_ok=True)
    history.path().write_text(json.dumps(good) + "\n" + "\n".join(BAD_LINES) + "\n")
    return good


def test_history_lines_that_are_not_reports_are_skipped_and_named(state_dir, caplog) -> None:
    from gpud.probe import history

    good = _history_with_bad_lines()
    with caplog.at_level("WARNING", logger="gpud.probe"):
        assert history.load() == [good]
        assert history.load(limit=1) == [good]
        latest = history.latest()
    assert latest is not None and latest.to_json() == good
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == len(BAD_LINES), warned  # once each, however often the file is read
    for n, msg in enumerate(warned, start=2):
        assert msg.startswith(f"{history.path()} line {n} skipped: not ")
    assert "diagnosis" in warned[0] and "nccl" in warned[1] and "world_sizes" in warned[2]
    caplog.clear()
    history.append(latest)  # a change of the file: the lines left are valid, nothing more to say
    assert history.load() == [good, good] and not caplog.records


def test_history_lines_that_are_not_reports_leave_metrics_and_the_daemon_running(state_dir) -> None:
    from gpud import config as cfg
    from gpud.daemon.service import Daemon

    good = _history_with_bad_lines()
    r = run_gpud("metrics", "--simulate", "z8-fury-4x-a6000", env={"GPUD_STATE_DIR": str(state_dir)})
    assert r.returncode == 0, r.stderr
    assert "gpud_probe_success 1.0" in r.stdout
    assert 'gpud_probe_ddp_samples_per_second{world_size="2"}' in r.stdout
    [stamp] = re.findall(r"^gpud_probe_last_run_timestamp_seconds (\S+)$", r.stdout, re.M)
    assert float(stamp) == good["finished_at"]  # the newest valid record
    assert f"{state_dir / 'probe-history.jsonl'} line 2 skipped: not a probe report (diagnosis: " in r.stderr
    d = Daemon(open_machine("z8-fury-4x-a6000"), cfg.Config())
    d.tick()
    d.tick()
    text = d.metrics().decode()
    assert "gpud_probe_success 1.0" in text and 'gpud_probe_ddp_samples_per_second{world_size="2"}' in text
    probe = d.status()["probe"]
    assert probe is not None and probe["finished_at"] == good["finished_at"]
