"""One rank of the probe-overhead benchmark (run by benchmarks/bench.py, two gloo ranks on loopback).

The same model, the same DDP options, the same data: gpud's timed loop (gpud.probe.worker.
train_steps) against a plain hand-written DDP loop, alternated in rounds so that both see the
same machine noise. Rank 0 prints the median step time of each as JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from gpud.probe.worker import batch, make_model, size_for, train_steps


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    s = size_for("cpu", quick=False)
    dev = torch.device("cpu")
    opts = {"bucket_cap_mb": 25, "gradient_as_bucket_view": True, "static_graph": True}
    probe_net = DDP(make_model(s), **opts)
    plain_net = DDP(make_model(s), **opts)
    probe_opt = torch.optim.SGD(probe_net.parameters(), lr=1e-3)
    plain_opt = torch.optim.SGD(plain_net.parameters(), lr=1e-3)
    x, y = batch(s, s.batch, 3 + rank, dev)

    def plain(steps: int, net: DDP = plain_net, opt: torch.optim.Optimizer = plain_opt) -> None:
        for _ in range(steps):  # the hand-written loop
            loss = F.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    aa = len(sys.argv) > 3 and sys.argv[3] == "aa"  # A/A: the plain loop on both sides (the noise floor)

    def probe(steps: int) -> None:
        if aa:
            plain(steps, probe_net, probe_opt)
        else:
            train_steps(probe_net, probe_opt, x, y, steps, False)

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    timed(lambda: probe(3))
    timed(lambda: plain(3))
    probe_t, plain_t = [], []
    for r in range(rounds):  # alternate, and alternate which goes first
        first, second = (("probe", "plain") if r % 2 == 0 else ("plain", "probe"))
        for which in (first, second):
            if which == "probe":
                probe_t.append(timed(lambda: probe(steps)) / steps)
            else:
                plain_t.append(timed(lambda: plain(steps)) / steps)
    if rank == 0:
        # Each round's pair ran back to back: the median of the per-round ratios cancels slow drifts.
        ratios = [a / b for a, b in zip(probe_t, plain_t, strict=True)]
        print(json.dumps({"mode": "a/a" if aa else "probe/plain", "probe_step_seconds": statistics.median(probe_t),
                          "plain_step_seconds": statistics.median(plain_t),
                          "median_ratio": statistics.median(ratios), "rounds": rounds, "steps": steps,
                          "model": {"dim": s.dim, "layers": s.layers, "seq": s.seq, "batch": s.batch}}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
