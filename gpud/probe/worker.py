"""One rank of a probe launch: the only gpud module that imports torch.

Run by the probe runner as ``python -m gpud.probe.worker SPEC.json`` (one process per rank, a
TCP rendezvous on loopback) or in-process under ``torchrun`` across machines. Rank 0 writes the
launch's results as JSON. Every figure is measured here; interpretation is the runner's job.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# -- the model --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Size:
    dim: int
    heads: int
    layers: int
    seq: int
    batch: int  # per rank
    warmup: int
    steps: int


def size_for(device: str, quick: bool) -> Size:
    if device == "cuda":
        return Size(1024, 16, 4 if quick else 8, 512, 8, 3 if quick else 10, 10 if quick else 40)
    return Size(64, 4, 4, 32, 8, 2 if quick else 3, 5 if quick else 15)


class Block(nn.Module):
    """A pre-LayerNorm transformer block: self-attention and an MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def make_model(s: Size) -> nn.Sequential:
    torch.manual_seed(0)  # every rank builds the same weights
    return nn.Sequential(*(Block(s.dim, s.heads) for _ in range(s.layers)))


def batch(s: Size, n: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, s.seq, s.dim, generator=g)
    y = torch.randn(n, s.seq, s.dim, generator=g)
    return x.to(device), y.to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, steps: int,
                autocast: bool) -> torch.Tensor:
    """The timed loop: forward, loss, backward, step — nothing else per step."""
    loss = torch.zeros(())
    for _ in range(steps):
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16) if autocast else nullcontext():
            loss = F.mse_loss(model(x), y)  # bf16 on GPUs
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss


# -- tasks --------------------------------------------------------------------------------------

def ddp(ctx: Ctx) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    s, dev, n, r = ctx.size, ctx.device, ctx.world, ctx.rank
    model = make_model(s).to(dev)
    reference = copy.deepcopy(model) if r == 0 else None
    kwargs: dict[str, Any] = {"bucket_cap_mb": 25, "gradient_as_bucket_view": True, "static_graph": True}
    if dev.type == "cuda":
        kwargs["device_ids"] = [dev.index]
    net = DDP(model, **kwargs) if n > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)
    # Correctness: one step on shards of a global batch equals one step on the whole batch.
    xg, yg = batch(s, n * s.batch, 1, dev)
    x, y = xg[r * s.batch:(r + 1) * s.batch], yg[r * s.batch:(r + 1) * s.batch]
    loss = F.mse_loss(net(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    mean_loss = loss.detach().clone()
    if n > 1:
        dist.all_reduce(mean_loss)
        mean_loss /= n
    out: dict[str, Any] = {}
    if r == 0:
        assert reference is not None
        ropt = torch.optim.SGD(reference.parameters(), lr=1e-2)
        rloss = F.mse_loss(reference(xg), yg)
        rloss.backward()
        ropt.step()
        diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters(), strict=True))
        out["reference"] = {"loss": rloss.item(), "ddp_loss": mean_loss.item(),
                            "loss_abs_diff": abs(rloss.item() - mean_loss.item()), "param_max_abs_diff": diff}
        del reference, ropt
    # Timed steps (weak scaling: the same per-rank batch at every world size).
    x, y = batch(s, s.batch, 2 + r, dev)
    autocast = dev.type == "cuda"
    train_steps(net, opt, x, y, s.warmup, autocast)
    sync(dev)
    seconds = _timed_max(ctx, lambda: train_steps(net, opt, x, y, s.steps, autocast))
    # Every rank holds identical parameters after the timed steps.
    flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    if n > 1:
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    out |= {"world_size": n, "seconds": seconds, "steps": s.steps, "batch_per_rank": s.batch,
            "samples_per_second": n * s.batch * s.steps / seconds,
            "step_seconds": seconds / s.steps,
            "params_max_spread": (hi - lo).abs().max().item(), "parameters": flat.numel(),
            "model": {"dim": s.dim, "layers": s.layers, "seq": s.seq, "heads": s.heads},
            "ddp": {k: v for k, v in kwargs.items() if k != "device_ids"}}
    return out


def allreduce(ctx: Ctx) -> dict[str, Any]:
    """nccl-tests' definitions: algbw = S / t; busbw = algbw · 2(n − 1)/n."""
    n, dev = ctx.world, ctx.device
    if n < 2:
        return {"skipped": "one rank"}
    sizes = [1 << k for k in (range(20, 29, 2) if dev.type == "cuda" else range(16, 24, 2))]
    if ctx.quick:
        sizes = sizes[::2] + ([sizes[-1]] if len(sizes) % 2 == 0 else [])
    rows = []
    for size in sizes:
        t = torch.ones(size // 4, dtype=torch.float32, device=dev)
        for _ in range(2):
            dist.all_reduce(t)
        sync(dev)
        # Every rank must run the same number of collectives: the count comes from a calibration
        # reduced across ranks, never from one rank's own clock.
        iters = _agreed_iterations(ctx, lambda t=t: dist.all_reduce(t), 0.05 if ctx.quick else 0.2)
        sec = _timed_max(ctx, lambda t=t, k=iters: [dist.all_reduce(t) for _ in range(k)]) / iters
        algbw = size / sec
        rows.append({"bytes": size, "seconds": sec, "algbw_bytes_per_second": algbw,
                     "busbw_bytes_per_second": algbw * 2 * (n - 1) / n})
    return {"world_size": n, "sizes": rows,
            "peak_busbw_bytes_per_second": max(r["busbw_bytes_per_second"] for r in rows)}


def _timed_max(ctx: Ctx, fn: Any) -> float:
    """Seconds ``fn`` took on the slowest rank (every rank calls this, in step)."""
    ctx.barrier()
    t0 = time.perf_counter()
    fn()
    sync(ctx.device)
    spent = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    if ctx.world > 1:
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
    return spent.item()


def _agreed_iterations(ctx: Ctx, once: Any, target_seconds: float, cap: int = 200) -> int:
    """How many repetitions fill ``target_seconds``, the same on every rank (from 5 timed ones)."""
    per = _timed_max(ctx, lambda: [once() for _ in range(5)]) / 5
    return max(5, min(cap, math.ceil(target_seconds / per) if per > 0 else cap))


def p2p(ctx: Ctx) -> dict[str, Any]:
    """GPU: device-to-device copies for every ordered pair, in one process. CPU: send/recv between two ranks."""
    dev = ctx.device
    if dev.type == "cuda":
        if ctx.rank != 0:
            return {}
        count = torch.cuda.device_count()
        pairs = [(i, j) for i in range(count) for j in range(count) if i != j] or [(0, 0)]
        size = (64 if ctx.quick else 256) << 20
        out = []
        for i, j in pairs:
            a = torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}")
            b = torch.empty(size, dtype=torch.uint8, device=f"cuda:{j}")
            small_a, small_b = a[:4], b[:4]
            for _ in range(3):
                b.copy_(a)
            torch.cuda.synchronize(i)
            torch.cuda.synchronize(j)
            reps = 10 if ctx.quick else 30
            t0 = time.perf_counter()
            for _ in range(reps):
                b.copy_(a)
            torch.cuda.synchronize(i)
            torch.cuda.synchronize(j)
            bw = size * reps / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(100):
                small_b.copy_(small_a)
                torch.cuda.synchronize(j)
            lat = (time.perf_counter() - t0) / 100
            out.append({"src": i, "dst": j, "bandwidth_bytes_per_second": bw, "latency_seconds": lat,
                        "bytes": size, "peer_access": torch.cuda.can_device_access_peer(i, j) if i != j else None})
            del a, b
        return {"pairs": out, "how": "device-to-device tensor copies"}
    if ctx.world < 2:
        return {"skipped": "one rank"}
    size = 4 << 20
    buf = torch.ones(size // 4)
    small = torch.ones(1)
    reps = 10 if ctx.quick else 30

    def pingpong(payload: torch.Tensor, n: int) -> float:
        """Rank 0 sends ``payload`` to rank 1, which answers with one float; seconds for n rounds."""
        t0 = time.perf_counter()
        for _ in range(n):
            if ctx.rank == 0:
                dist.send(payload, 1)
                dist.recv(small, 1)
            elif ctx.rank == 1:
                dist.recv(payload, 0)
                dist.send(small, 0)
        return time.perf_counter() - t0

    ctx.barrier()
    bw = size * reps / pingpong(buf, reps)
    lat = pingpong(small, 50) / 100  # one way
    if ctx.rank != 0:
        return {}
    return {"pairs": [{"src": 0, "dst": 1, "bandwidth_bytes_per_second": bw, "latency_seconds": lat, "bytes": size}],
            "how": "gloo send/recv between two processes"}


def pipeline(ctx: Ctx) -> dict[str, Any]:
    """The model split over k = world-size stages: naive split, then a GPipe micro-batched pipeline."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    s, dev, k, r = ctx.size, ctx.device, ctx.world, ctx.rank
    if k < 2 or s.layers < k:
        return {"skipped": "needs two stages"}
    micro = 4
    full = make_model(s)
    per = math.ceil(s.layers / k)
    chunks = [nn.Sequential(*list(full)[i * per:(i + 1) * per]) for i in range(k)]
    total = s.batch * 2  # the pipeline's batch, split into micro-batches
    x, y = batch(s, total, 7, torch.device("cpu"))
    out: dict[str, Any] = {"stages": k, "micro_batches": micro, "batch": total}
    if r == 0:
        # One device, unsplit; then the naive split (k devices, no micro-batches) in this process.
        one = copy.deepcopy(full).to(dev)
        opt = torch.optim.SGD(one.parameters(), lr=1e-3)
        xd, yd = x.to(dev), y.to(dev)
        train_steps(one, opt, xd, yd, s.warmup, False)
        sync(dev)
        t0 = time.perf_counter()
        train_steps(one, opt, xd, yd, s.steps, False)
        sync(dev)
        out["single_samples_per_second"] = total * s.steps / (time.perf_counter() - t0)
        devices = [torch.device(f"cuda:{i}") for i in range(min(k, torch.cuda.device_count()))] \
            if dev.type == "cuda" else [dev]
        naive = [copy.deepcopy(c).to(devices[i % len(devices)]) for i, c in enumerate(chunks)]
        nopt = torch.optim.SGD([p for c in naive for p in c.parameters()], lr=1e-3)

        def naive_step() -> None:
            h = x.to(devices[0])
            for i, c in enumerate(naive):
                h = c(h.to(devices[i % len(devices)]))
            F.mse_loss(h, y.to(h.device)).backward()
            nopt.step()
            nopt.zero_grad(set_to_none=True)

        for _ in range(s.warmup):
            naive_step()
        for d in devices:
            sync(d)
        t0 = time.perf_counter()
        for _ in range(s.steps):
            naive_step()
        for d in devices:
            sync(d)
        out["naive_samples_per_second"] = total * s.steps / (time.perf_counter() - t0)
        out["naive_devices"] = len(devices)
        with torch.no_grad():
            reference_out = copy.deepcopy(full)(x)
        del one, naive
    else:
        reference_out = None
    # The micro-batched pipeline: one stage per rank.
    stage_mod = chunks[r].to(dev)
    mb = total // micro
    stage = PipelineStage(stage_mod, r, k, dev)  # shapes inferred on the first step
    sched = ScheduleGPipe(stage, n_microbatches=micro, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=1e-3)
    xd, yd = x.to(dev), y.to(dev)

    def step(return_outputs: bool = False) -> Any:
        losses: list[torch.Tensor] = []
        if r == 0:
            res = sched.step(xd)
        elif r == k - 1:
            res = sched.step(target=yd, losses=losses, return_outputs=return_outputs)
        else:
            res = sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return res

    first = step(return_outputs=True)  # the first step's output: from the initial weights
    # Output equality: the pipeline's output equals the unsplit model's on the same input.
    if r == k - 1:
        dist.send(first.detach().to("cpu").contiguous(), 0)
    if r == 0:
        got = torch.empty(total, s.seq, s.dim)
        dist.recv(got, k - 1)
        assert reference_out is not None
        out["output_max_abs_diff"] = (got - reference_out).abs().max().item()
    for _ in range(s.warmup):
        step()
    sync(dev)
    sec = _timed_max(ctx, lambda: [step() for _ in range(s.steps)])
    act_bytes = mb * s.seq * s.dim * 4 * micro * (k - 1) * 2 * s.steps  # activations forward, gradients back
    out |= {"pipeline_samples_per_second": total * s.steps / sec, "activation_bytes_per_second": act_bytes / sec,
            "seconds": sec}
    if r == 0:
        out["speedup"] = out["pipeline_samples_per_second"] / out["single_samples_per_second"]
        out["naive_speedup"] = out["naive_samples_per_second"] / out["single_samples_per_second"]
    return out if r == 0 else {}


TASKS = {"ddp": ddp, "allreduce": allreduce, "p2p": p2p, "pipeline": pipeline}


# -- ranks -------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, rank: int, world: int, local_rank: int, device: str, quick: bool) -> None:
        self.rank, self.world, self.quick = rank, world, quick
        if device == "cuda":
            torch.cuda.set_device(local_rank)
            self.device = torch.device(f"cuda:{local_rank}")
        else:
            self.device = torch.device("cpu")
        self.size = size_for(device, quick)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()


def run(spec: dict[str, Any], rank: int, world: int, local_rank: int) -> dict[str, Any]:
    device = spec["device"]
    if device == "cpu":
        torch.set_num_threads(max(1, int(spec.get("threads_per_rank", 1))))
    ctx = Ctx(rank, world, local_rank, device, bool(spec.get("quick")))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=float(spec.get("timeout", 120))))
    results: dict[str, Any] = {"world_size": world, "device": device, "torch": torch.__version__}
    if device == "cuda" and rank == 0:
        results["gpu_name"] = torch.cuda.get_device_name(0)
        results["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if world > 1 else None
    for task in spec["tasks"]:
        t0 = time.perf_counter()
        res = TASKS[task](ctx)
        if rank == 0:
            results[task] = res | {"wall_seconds": time.perf_counter() - t0}
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return results


def main() -> int:
    spec = json.loads(open(sys.argv[1]).read())
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    res = run(spec, rank, world, local)
    if rank == 0:
        tmp = spec["out"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f)
        os.replace(tmp, spec["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
