"""The probe across machines: `gpud probe --nnodes 2` on each node starts torchrun with a static
rendezvous; the report says which node (and host) ran each rank. Two nodes on loopback, CPU ranks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_gpud
from daemon_helpers import free_port
from test_probe import needs_torch


@needs_torch
def test_two_nodes_on_loopback_run_one_probe_and_name_each_ranks_node(tmp_path: Path) -> None:
    port = free_port()
    procs = []
    for node in (0, 1):
        # two machines: each its own state directory and probe lock (one machine's lock would refuse the other)
        env = {**os.environ, "GPUD_STATE_DIR": str(tmp_path / f"node{node}"), "PYTHONWARNINGS": "ignore",
               "GPUD_PROBE_LOCK": str(tmp_path / f"node{node}.lock"), "GPUD_SOCKET": str(tmp_path / "none.sock")}
        env.pop("GPUD_SIMULATE", None)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "gpud", "probe", "--nnodes", "2", "--node-rank", str(node), "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--nproc-per-node", "1", "--suite", "ddp,allreduce", "--quick", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    assert outs[1][0].strip() == ""  # only rank 0 (on node 0) reports
    res = json.loads(outs[0][0])
    import socket

    assert res["torchrun"] is True and res["nodes"] == 2 and set(res["ddp"]["by_world_size"]) == {"1", "2"}
    assert res["placement"] == [{"rank": 0, "node": 0, "host": socket.gethostname(), "gpu_uuid": None},
                                {"rank": 1, "node": 1, "host": socket.gethostname(), "gpu_uuid": None}]
    assert res["correctness"] == {"params_identical_across_ranks": True, "ddp_matches_one_process": True}
    assert res["allreduce"]["by_world_size"]["2"]["peak_busbw_bytes_per_second"] > 0
    assert (tmp_path / "node0" / "probe-history.jsonl").exists()  # kept where rank 0 ran, once
    assert not (tmp_path / "node1" / "probe-history.jsonl").exists()


@pytest.mark.parametrize("options, message", [
    ({"nnodes": 2, "node_rank": 2, "rdzv_endpoint": "127.0.0.1:29500"}, "--node-rank: 2: must be between 0 and 1"),
    ({"nnodes": 2, "rdzv_endpoint": "node0"}, "--rdzv-endpoint: node0: must be HOST:PORT"),
    ({"nnodes": 2, "rdzv_endpoint": "node0:0"}, "--rdzv-endpoint: node0:0: must be HOST:PORT"),
    ({"nnodes": 2}, "--rdzv-endpoint: needed with --nnodes"),
    ({"node_rank": 1}, "--nnodes: needed with --node-rank"),
    ({"nnodes": 2, "rdzv_endpoint": "h:1", "world_sizes": "1,2"}, "--world-sizes: 1,2: across machines"),
])
def test_bad_multi_node_options_are_refused_before_anything_starts(state_dir, monkeypatch, options,
                                                                   message) -> None:
    import subprocess as sp

    from gpud.cli.probe import probe
    from gpud.errors import InvalidInput

    monkeypatch.setattr(sp, "run", lambda *a, **k: pytest.fail("torchrun started"))
    with pytest.raises(InvalidInput, match="^" + re.escape(message)):
        probe(**{"json": False, "suite": "ddp", "quick": False, "allow_busy": False, "gpus": None, "device": None,
                 "world_sizes": None, "simulate": None, "config": None, "nnodes": None, "node_rank": 0,
                 "rdzv_endpoint": None, "nproc_per_node": None, **options})


def test_the_cli_exits_2_with_one_line_on_a_bad_node_rank(state_dir) -> None:
    r = run_gpud("probe", "--nnodes", "2", "--node-rank", "5", "--rdzv-endpoint", "127.0.0.1:29500")
    assert r.returncode == 2 and "--node-rank: 5: must be between 0 and 1" in r.stderr, r.stderr


def test_under_torchrun_already_gpud_does_not_start_another(state_dir, monkeypatch) -> None:
    from gpud.errors import InvalidInput
    from gpud.probe.torchrun import torchrun_command

    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(InvalidInput, match="already under torchrun"):
        torchrun_command(nnodes=2, node_rank=0, endpoint="h:1", nproc_per_node=1, probe_args=[])
