"""One rank of a probe launch: the only gpud module that imports torch.

Run by the probe runner as ``python -m gpud.probe.worker SPEC.json`` (one process per rank, a
TCP rendezvous on loopback) or in-process under ``torchrun`` across machines. Rank 0 writes the
launch's results as JSON, then the ranks tear down. Every figure is measured here, each from at
least three timed windows (median and spread); interpretation is the runner's job.

Every tensor handed to ``torch.distributed`` lives on the rank's device (``ctx.device``), and
every tensor is made with an explicit device: the test suite runs this module with torch's
default device set to ``meta`` to prove it.

Why one module of 800-odd lines: it is the whole of what runs in a rank's interpreter, the one place (with
``gpud.probe.stress``) the import contracts let torch in, and it imports nothing of gpud that needs the
machine (it imports no gpud module at all). Split, each part would be one more module the torch contract has to
allow, and the rank's start-up would import them all anyway.
"""

from __future__ import annotations

import copy
import json
import math
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

CPU = torch.device("cpu")
PIPELINE_DTYPE = "fp32"  # the pipeline, its naive split and its one-GPU baseline: no autocast
WINDOWS = 3  # timed windows per figure: median and spread are reported
BUCKET_CAP_MB = 25  # DDP's bucket size (its default); the all-reduce sweep includes this size
BUCKET_BYTES = BUCKET_CAP_MB * 2**20  # DDP counts bucket_cap_mb in MiB (reducer: bucket_cap_mb * 1024 * 1024)
# P2P copies as nvbandwidth makes them (default_constants.h: a 64 MiB buffer, 16 copies per timed loop,
# 3 loops; its quick set 4 copies): the sweep's time is worked out in docs/probe.md
P2P_BYTES = 64 << 20
P2P_REPS = {True: 4, False: 16}  # by --quick
# A pair's deadline: its bytes at the slowest PCIe link there is (Gen1 x1, 0.25 GB/s), plus CUDA's set-up
SLOWEST_LINK = 0.25e9
PAIR_SETUP_SECONDS = 10.0

# -- the model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Size:
    dim: int
    heads: int
    layers: int
    seq: int
    batch: int  # per rank
    warmup: int
    steps: int  # per timed window


def size_for(device: str, quick: bool) -> Size:
    if device == "cuda":
        return Size(1024, 16, 4 if quick else 8, 512, 8, 3 if quick else 10, 5 if quick else 15)
    return Size(64, 4, 4, 32, 8, 2 if quick else 3, 2 if quick else 5)


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


def make_model(s: Size, layers: int | None = None) -> nn.Sequential:
    """The same weights on every rank: built on the CPU from one seed, moved by the caller."""
    torch.manual_seed(0)
    with CPU:
        return nn.Sequential(*(Block(s.dim, s.heads) for _ in range(layers or s.layers)))


def split(layers: int, stages: int) -> list[range]:
    """Consecutive layer ranges for ``stages`` stages whose sizes differ by at most one."""
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for k in range(stages):
        n = base + (1 if k < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


def batch(s: Size, n: int, seed: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=CPU).manual_seed(seed)
    x = torch.randn(n, s.seq, s.dim, generator=g, device=CPU)
    y = torch.randn(n, s.seq, s.dim, generator=g, device=CPU)
    if device.type == "cuda":  # the host is involved: copy from pinned memory
        x, y = x.pin_memory(), y.pin_memory()
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def precision(device: torch.device) -> tuple[str, torch.dtype | None]:
    """bf16 autocast where the GPU has bf16 (Ampere, compute capability 8, and newer), else fp16; CPU: fp32."""
    if device.type != "cuda":
        return "fp32", None
    if torch.cuda.get_device_capability(device)[0] >= 8:
        return "bf16", torch.bfloat16
    return "fp16", torch.float16


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, steps: int,
                amp: torch.dtype | None, scaler: Any = None, set_to_none: bool = True) -> torch.Tensor:
    """The timed loop: forward, loss, backward, step — nothing else per step. ``amp``: the autocast dtype
    (None: full precision); ``scaler``: a GradScaler where the dtype is fp16; ``set_to_none``: how the
    gradients are cleared (False under DDP's gradient_as_bucket_view, see ``ddp``)."""
    loss = torch.zeros((), device=x.device)
    for _ in range(steps):
        with torch.autocast(device_type=x.device.type, dtype=amp) if amp else nullcontext():
            loss = F.mse_loss(model(x).float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return loss


class Trainer:
    """A model, its optimizer and precision: ``steps`` runs the timed loop."""

    def __init__(self, model: nn.Module, params: Any, amp: torch.dtype | None, device: torch.device,
                 set_to_none: bool = True) -> None:
        self.model, self.amp, self.device, self.set_to_none = model, amp, device, set_to_none
        self.opt = torch.optim.SGD(params, lr=1e-3)
        self.scaler = torch.amp.GradScaler("cuda") if amp == torch.float16 else None

    def steps(self, x: torch.Tensor, y: torch.Tensor, n: int) -> torch.Tensor:
        return train_steps(self.model, self.opt, x, y, n, self.amp, self.scaler, self.set_to_none)


def windows(seconds: list[float]) -> dict[str, Any]:
    """Median and spread ((max − min) / median) of the timed windows."""
    med = statistics.median(seconds)
    return {"windows_seconds": seconds, "median_seconds": med,
            "spread": (max(seconds) - min(seconds)) / med if med > 0 else 0.0}


# -- tasks --------------------------------------------------------------------------------------

def ddp(ctx: Ctx) -> dict[str, Any]:
    """DDP with the same per-rank batch at every world size (weak scaling).

    Gradients are cleared with ``zero_grad(set_to_none=False)``: with ``gradient_as_bucket_view=True``
    the gradients are views into DDP's buckets, and setting them to None makes the reducer copy every
    gradient into its bucket on the next backward ("gradients will be copied into the bucket", reducer.cpp)
    — a cost the one-GPU baseline does not pay, charged to DDP's efficiency alone. The one-GPU run clears
    its gradients the same way."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    s, dev, n, r = ctx.size, ctx.device, ctx.world, ctx.rank
    model = make_model(s).to(dev)
    reference = copy.deepcopy(model) if r == 0 else None
    kwargs: dict[str, Any] = {"bucket_cap_mb": BUCKET_CAP_MB, "gradient_as_bucket_view": True, "static_graph": True}
    if dev.type == "cuda":
        kwargs["device_ids"] = [dev.index]
    net = DDP(model, **kwargs) if n > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)
    # Correctness: one step on shards of a global batch equals one step on the whole batch. Each rank makes
    # only its own shard; rank 0's reference takes the shards one at a time (gradients accumulated), so its
    # memory does not grow with the world size.
    x, y = shard(s, r, dev)
    loss = F.mse_loss(net(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    mean_loss = loss.detach().clone()
    if n > 1:
        dist.all_reduce(mean_loss)
        mean_loss /= n
    out: dict[str, Any] = {}
    if r == 0:
        assert reference is not None
        ropt = torch.optim.SGD(reference.parameters(), lr=1e-2)
        total = torch.zeros((), dtype=torch.float64, device=dev)
        for k in range(n):  # the mean over equal shards: each shard's loss / n
            xk, yk = shard(s, k, dev)
            part = F.mse_loss(reference(xk), yk) / n
            part.backward()
            total += part.detach().double()
            del xk, yk, part
        ropt.step()
        rloss = total.item()
        diff = max((p - q).abs().max().item() for p, q in zip(model.parameters(), reference.parameters(), strict=True))
        out["reference"] = {"loss": rloss, "ddp_loss": mean_loss.item(),
                            "loss_abs_diff": abs(rloss - mean_loss.item()), "param_max_abs_diff": diff,
                            "shards": n}
        del reference, ropt
    # Timed steps (weak scaling: the same per-rank batch at every world size).
    x, y = batch(s, s.batch, 2 + r, dev)
    trainer = Trainer(net, net.parameters(), ctx.amp, dev, set_to_none=False)
    trainer.steps(x, y, s.warmup)
    sync(dev)
    w = windows([_timed_max(ctx, lambda: trainer.steps(x, y, s.steps)) for _ in range(WINDOWS)])
    # Every rank holds identical parameters after the timed steps.
    flat = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    if n > 1:
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    step = w["median_seconds"] / s.steps
    out |= {"world_size": n, "steps": s.steps, "batch_per_rank": s.batch, **w,
            "seconds": w["median_seconds"], "step_seconds": step, "samples_per_second": n * s.batch / step,
            "params_max_spread": (hi - lo).abs().max().item(), "parameters": flat.numel(),
            "gradient_bytes": flat.numel() * 4, "dtype": ctx.dtype_name,
            "model": {"dim": s.dim, "layers": s.layers, "seq": s.seq, "heads": s.heads},
            "ddp": {k: v for k, v in kwargs.items() if k != "device_ids"}, "zero_grad_set_to_none": False}
    return out


def shard(s: Size, k: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Shard k of the correctness check's global batch (s.batch samples, its own seed)."""
    return batch(s, s.batch, 1000 + k, device)


def allreduce(ctx: Ctx) -> dict[str, Any]:
    """nccl-tests' definitions: algbw = S / t; busbw = algbw · 2(n − 1)/n."""
    n, dev = ctx.world, ctx.device
    if n < 2:
        return {"skipped": "one rank"}
    sizes = [1 << k for k in (range(20, 29, 2) if dev.type == "cuda" else range(16, 24, 2))]
    if ctx.quick:
        sizes = sizes[::2] + ([sizes[-1]] if len(sizes) % 2 == 0 else [])
    sizes = sorted({*sizes, BUCKET_BYTES})  # what DDP reduces: the prediction reads this size
    rows = []
    for size in sizes:
        t = torch.ones(size // 4, dtype=torch.float32, device=dev)
        for _ in range(2):
            dist.all_reduce(t)
        sync(dev)
        # Every rank must run the same number of collectives: the count comes from a calibration
        # reduced across ranks, never from one rank's own clock.
        once = _repeat(lambda: dist.all_reduce(t), 1)  # noqa: B023 - used within this iteration only
        iters = _agreed_iterations(ctx, once, 0.05 if ctx.quick else 0.2)
        w = windows([_timed_max(ctx, _repeat(once, iters)) / iters
                     for _ in range(WINDOWS)])
        sec = w["median_seconds"]
        algbw = size / sec
        rows.append({"bytes": size, "seconds": sec, "spread": w["spread"], "algbw_bytes_per_second": algbw,
                     "busbw_bytes_per_second": algbw * 2 * (n - 1) / n})
    peak = max(rows, key=lambda x: x["busbw_bytes_per_second"])
    bucket = next(x for x in rows if x["bytes"] == BUCKET_BYTES)
    return {"world_size": n, "sizes": rows, "peak_busbw_bytes_per_second": peak["busbw_bytes_per_second"],
            "peak_spread": peak["spread"], "bucket_bytes": BUCKET_BYTES,
            "bucket_busbw_bytes_per_second": bucket["busbw_bytes_per_second"]}


def _timed_max(ctx: Ctx, fn: Callable[[], Any]) -> float:
    """Seconds ``fn`` took on the slowest rank (every rank calls this, in step). As nccl-tests' BenchTime:
    the device idle and every rank past a barrier before the clock starts, the device synchronised before
    it stops."""
    ctx.barrier()
    t0 = time.perf_counter()
    fn()
    sync(ctx.device)
    spent = torch.full((1,), time.perf_counter() - t0, dtype=torch.float64, device=ctx.device)
    if ctx.world > 1:
        dist.all_reduce(spent, op=dist.ReduceOp.MAX)
    return float(spent.item())


def _repeat(fn: Callable[[], Any], k: int) -> Callable[[], None]:
    def go() -> None:
        for _ in range(k):
            fn()
    return go


def _agreed_iterations(ctx: Ctx, once: Callable[[], Any], target_seconds: float, cap: int = 200) -> int:
    """How many repetitions fill ``target_seconds``, the same on every rank (from 5 timed ones)."""
    per = _timed_max(ctx, lambda: [once() for _ in range(5)]) / 5
    return max(5, min(cap, math.ceil(target_seconds / per) if per > 0 else cap))


def p2p(ctx: Ctx) -> dict[str, Any]:
    """GPU: device-to-device copies for every ordered pair of distinct GPUs, one way and both ways at once,
    in one process that holds every GPU. CPU: send/recv between two ranks."""
    return _p2p_cuda(ctx) if ctx.device.type == "cuda" else _p2p_cpu(ctx)


def pair_deadline(reps: int, both: bool, size: int = P2P_BYTES) -> float:
    """Seconds one pair may take before it counts as hung: its bytes at the slowest PCIe link there is."""
    copies = (4 if both else 2) + WINDOWS * reps + (2 * WINDOWS * reps if both else 0)  # warm-up, one way, both
    moved = size * copies
    return PAIR_SETUP_SECONDS + moved / SLOWEST_LINK


def _p2p_cuda(ctx: Ctx) -> dict[str, Any]:
    """Every ordered pair one way; both ways at once once per pair of GPUs (the same experiment either way
    round), its figure on both rows. Before each pair its deadline is announced (``ctx.progress``): the
    runner kills a pair that hangs and starts again after it (``p2p_done``, ``p2p_skip``). Sizes: docs/probe.md."""
    count = torch.cuda.device_count()
    if count < 2:
        return {"skipped": "one GPU"}
    reps = P2P_REPS[ctx.quick]
    skip = {(int(a), int(b)) for a, b in ctx.spec.get("p2p_skip", [])}
    rows: list[dict[str, Any]] = list(ctx.spec.get("p2p_done", []))
    done = {(r["src"], r["dst"]) for r in rows}
    out = {"how": "device-to-device tensor copies in one process",
           "latency": "host-timed 4-byte copy plus synchronize: launch and sync overhead included",
           "bytes": P2P_BYTES, "repetitions": reps}
    for i in range(count):
        for j in range(count):
            if i == j or (i, j) in skip or (i, j) in done:
                continue
            both = i < j or (j, i) in skip  # measured with the first row of the two
            ctx.progress({"p2p_pair": [i, j], "src_uuid": ctx.uuid_of(i), "dst_uuid": ctx.uuid_of(j),
                          "deadline_seconds": pair_deadline(reps, both)})
            row = {"src": i, "dst": j, "src_uuid": ctx.uuid_of(i), "dst_uuid": ctx.uuid_of(j),
                   **_copy_pair(i, j, P2P_BYTES, reps, both)}
            if not both:
                twin = next((r for r in rows if (r["src"], r["dst"]) == (j, i)), None)
                if twin is not None and "bidirectional_bytes_per_second" in twin:
                    row |= {k: twin[k] for k in ("bidirectional_bytes_per_second", "bidirectional_spread")}
            rows.append(row)
            ctx.checkpoint("p2p", out | {"pairs": rows})
    return out | {"pairs": rows}


def _copy_pair(i: int, j: int, size: int, reps: int, both: bool = True) -> dict[str, Any]:
    """GPU i → GPU j copies alone, then (``both``) both directions at once on their own streams; a small
    copy's time."""
    di, dj = torch.device(f"cuda:{i}"), torch.device(f"cuda:{j}")
    a, b = torch.empty(size, dtype=torch.uint8, device=di), torch.empty(size, dtype=torch.uint8, device=dj)
    a2, b2 = torch.empty(size, dtype=torch.uint8, device=dj), torch.empty(size, dtype=torch.uint8, device=di)
    fwd = (torch.cuda.Stream(di), torch.cuda.Stream(dj))
    back = (torch.cuda.Stream(di), torch.cuda.Stream(dj))

    def on(streams: tuple[Any, Any], dst: torch.Tensor, src: torch.Tensor) -> None:
        with ExitStack() as st:
            for s in streams:
                st.enter_context(torch.cuda.stream(s))
            dst.copy_(src, non_blocking=True)

    def copies(two: bool, k: int) -> float:
        torch.cuda.synchronize(di)
        torch.cuda.synchronize(dj)
        t0 = time.perf_counter()
        for _ in range(k):
            on(fwd, b, a)
            if two:
                on(back, b2, a2)
        torch.cuda.synchronize(di)
        torch.cuda.synchronize(dj)
        return time.perf_counter() - t0

    copies(both, 2)
    one = windows([copies(False, reps) for _ in range(WINDOWS)])
    out: dict[str, Any] = {"bytes": size, "bandwidth_bytes_per_second": size * reps / one["median_seconds"],
                           "spread": one["spread"]}
    if both:
        two = windows([copies(True, reps) for _ in range(WINDOWS)])
        out |= {"bidirectional_bytes_per_second": 2 * size * reps / two["median_seconds"],
                "bidirectional_spread": two["spread"]}
    small_a = torch.empty(4, dtype=torch.uint8, device=di)
    small_b = torch.empty(4, dtype=torch.uint8, device=dj)
    lat = []
    for _ in range(WINDOWS):
        torch.cuda.synchronize(dj)
        t0 = time.perf_counter()
        for _ in range(50):
            small_b.copy_(small_a)
            torch.cuda.synchronize(dj)
        lat.append((time.perf_counter() - t0) / 50)
    return out | {"copy_latency_seconds": statistics.median(lat),
                  "peer_access": torch.cuda.can_device_access_peer(i, j)}


def _p2p_cpu(ctx: Ctx) -> dict[str, Any]:
    if ctx.world < 2:
        return {"skipped": "one rank"}
    dev = ctx.device
    size = 4 << 20
    buf = torch.ones(size // 4, device=dev)
    buf2 = torch.ones(size // 4, device=dev)
    small = torch.ones(1, device=dev)
    reps = 10 if ctx.quick else 30

    def pingpong(payload: torch.Tensor, n: int) -> None:
        """Rank 0 sends ``payload`` to rank 1, which answers with one float."""
        for _ in range(n):
            if ctx.rank == 0:
                dist.send(payload, 1)
                dist.recv(small, 1)
            elif ctx.rank == 1:
                dist.recv(payload, 0)
                dist.send(small, 0)

    def both_ways(n: int) -> None:
        """Ranks 0 and 1 send to each other at the same time."""
        if ctx.rank > 1:
            return
        peer = 1 - ctx.rank
        for _ in range(n):
            reqs = [dist.isend(buf, peer), dist.irecv(buf2, peer)]
            for q in reqs:
                if q is not None:
                    q.wait()

    one = windows([_timed_max(ctx, lambda: pingpong(buf, reps)) for _ in range(WINDOWS)])
    two = windows([_timed_max(ctx, lambda: both_ways(reps)) for _ in range(WINDOWS)])
    lat = windows([_timed_max(ctx, lambda: pingpong(small, 50)) / 100 for _ in range(WINDOWS)])
    if ctx.rank != 0:
        return {}
    return {"pairs": [{"src": 0, "dst": 1, "src_uuid": None, "dst_uuid": None, "bytes": size,
                       "bandwidth_bytes_per_second": size * reps / one["median_seconds"], "spread": one["spread"],
                       "bidirectional_bytes_per_second": 2 * size * reps / two["median_seconds"],
                       "bidirectional_spread": two["spread"],
                       "one_way_latency_seconds": lat["median_seconds"]}],
            "how": "gloo send/recv between two processes",
            "latency": "half the round trip of a 4-byte ping-pong"}


def pipeline_baseline(ctx: Ctx) -> dict[str, Any]:
    """In a launch of its own (one process): the unsplit model on one device, and the naive split over k
    devices (no micro-batches), for each stage count the plan measures. In the pipeline's precision
    (fp32, PIPELINE_DTYPE): a speedup compares like with like."""
    s, dev = ctx.size, ctx.device
    total = s.batch * 2
    x, y = batch(s, total, 7, CPU)
    if dev.type == "cuda":
        x, y = x.pin_memory(), y.pin_memory()
    out: dict[str, Any] = {}
    for k in ctx.stages:
        full = make_model(s, max(s.layers, k))
        single = _single(ctx, copy.deepcopy(full).to(dev), x, y)
        devices = [torch.device(f"cuda:{i}") for i in range(min(k, torch.cuda.device_count()))] \
            if dev.type == "cuda" else [dev]
        nw = _naive(ctx, full, k, devices, x, y)
        out[str(k)] = {"layers": len(full), "batch": total, "dtype": PIPELINE_DTYPE,
                       "single_samples_per_second": total * s.steps / single["median_seconds"],
                       "single_spread": single["spread"],
                       "naive_samples_per_second": total * s.steps / nw["median_seconds"], "naive_spread": nw["spread"],
                       "naive_devices": len(devices)}
    return {"by_stages": out}


def _single(ctx: Ctx, one: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """The unsplit model on one device, in the pipeline's precision (fp32: no autocast)."""
    s, dev = ctx.size, ctx.device
    tr = Trainer(one, one.parameters(), None, dev)
    xd, yd = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
    tr.steps(xd, yd, s.warmup)
    sync(dev)
    return windows([_timed_max(ctx, lambda: tr.steps(xd, yd, s.steps)) for _ in range(WINDOWS)])


def _naive(ctx: Ctx, full: nn.Sequential, k: int, devices: list[torch.device], x: torch.Tensor,
           y: torch.Tensor) -> dict[str, Any]:
    """The naive split: k consecutive parts on k devices, one batch at a time, no micro-batches."""
    s = ctx.size
    parts = [nn.Sequential(*(full[i] for i in rng)) for rng in split(len(full), k)]
    naive = [copy.deepcopy(c).to(devices[i % len(devices)]) for i, c in enumerate(parts)]
    opt = torch.optim.SGD([p for c in naive for p in c.parameters()], lr=1e-3)

    # The batch is on the first and last devices before the clock starts, as the single run's is.
    x0 = x.to(devices[0], non_blocking=True)
    y_last = y.to(devices[(len(naive) - 1) % len(devices)], non_blocking=True)

    def steps(n: int) -> None:
        for _ in range(n):
            h = x0
            for i, c in enumerate(naive):
                h = c(h.to(devices[i % len(devices)]))
            F.mse_loss(h, y_last).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        for d in devices:
            sync(d)

    steps(s.warmup)
    return windows([_timed_max(ctx, lambda: steps(s.steps)) for _ in range(WINDOWS)])


def pipeline(ctx: Ctx) -> dict[str, Any]:
    """The model split over k = world-size stages (sizes differ by at most one layer), a GPipe
    micro-batched pipeline; its output checked against the unsplit model on rank 0's device; the
    activation transfer between neighbouring stages measured."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    s, dev, k, r = ctx.size, ctx.device, ctx.world, ctx.rank
    if k < 2:
        return {"skipped": "needs two stages"}
    micro = 4
    full = make_model(s, max(s.layers, k))
    ranges = split(len(full), k)
    total = s.batch * 2  # the pipeline's batch, split into micro-batches
    mb = total // micro
    x, y = batch(s, total, 7, dev)
    out: dict[str, Any] = {"stages": k, "micro_batches": micro, "batch": total, "layers": len(full),
                           "stage_layers": [len(rg) for rg in ranges], "dtype": PIPELINE_DTYPE}
    reference_out = None
    if r == 0:
        with torch.no_grad():
            reference_out = copy.deepcopy(full).to(dev)(x)  # on the device, like the pipeline
    stage_mod = nn.Sequential(*(full[i] for i in ranges[r])).to(dev)
    stage = PipelineStage(stage_mod, r, k, dev)  # shapes inferred on the first step
    sched = ScheduleGPipe(stage, n_microbatches=micro, loss_fn=F.mse_loss)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=1e-3)

    def step(return_outputs: bool = False) -> Any:
        losses: list[torch.Tensor] = []
        if r == 0:
            res = sched.step(x)
        elif r == k - 1:
            res = sched.step(target=y, losses=losses, return_outputs=return_outputs)
        else:
            res = sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return res

    first = step(return_outputs=True)  # the first step's output: from the initial weights
    # Output equality: the pipeline's output equals the unsplit model's on the same input.
    if r == k - 1:
        dist.send(first.detach().contiguous(), 0)
    if r == 0:
        got = torch.empty(total, s.seq, s.dim, device=dev)
        dist.recv(got, k - 1)
        assert reference_out is not None
        out["output_max_abs_diff"] = (got - reference_out).abs().max().item()
    for _ in range(s.warmup):
        step()
    sync(dev)
    w = windows([_timed_max(ctx, lambda: [step() for _ in range(s.steps)]) for _ in range(WINDOWS)])
    # The activation transfer, measured: a micro-batch's activation from stage h to h + 1.
    act = torch.ones(mb, s.seq, s.dim, device=dev)
    ack = torch.ones(1, device=dev)
    reps = 10
    hops = []
    for h in range(k - 1):
        def send_hop(h: int = h) -> None:
            for _ in range(reps):
                if r == h:
                    dist.send(act, h + 1)
                elif r == h + 1:
                    dist.recv(act, h)
            if r == h + 1:
                dist.send(ack, h)
            elif r == h:
                dist.recv(ack, h + 1)
        send_hop()
        hw = windows([_timed_max(ctx, send_hop) for _ in range(WINDOWS)])
        hops.append({"src_stage": h, "dst_stage": h + 1, "bytes": act.numel() * 4 * reps,
                     "bytes_per_second": act.numel() * 4 * reps / hw["median_seconds"], "spread": hw["spread"]})
    sps = total * s.steps / w["median_seconds"]
    out |= {"pipeline_samples_per_second": sps, "spread": w["spread"], "seconds": w["median_seconds"],
            "activation_hops": hops,
            "activation_bytes_per_second": min(hp["bytes_per_second"] for hp in hops)}
    return out if r == 0 else {}


# -- the tune's workload ------------------------------------------------------------------------

# A paced job's stand-in runs a real step (forward, backward, all-reduce hooks, optimizer) on the first request
# and every tenth after it: the steps it reports are the model's (below), never the stand-in's, so more of them
# proved nothing more and cost the CPU 2 s a tune (5 ms each, one a simulated second).
STAND_IN_EVERY = 10


def train(ctx: Ctx) -> dict[str, Any]:
    """The probe's DDP training step as a job that runs until it is killed (``gpud tune``'s workload: the
    settings change under it, as Zeus profiles inside the real job). Rank 0 writes one JSON line per step
    on its standard output, the channel gpud reads: ``{"steps": k, "samples": k · world · batch, "t": the
    monotonic time the k-th step ended}``; gpud measures a window as the difference of two such lines.
    The first line (``{"ready": …}``) comes after the start-up (torch's import, the model, DDP, the first
    step), so no window includes it.

    ``paced`` (a simulated workstation): the CPU stands in for the GPUs, the performance model paces the
    steps. Each request on standard input (``{"t": now, "seconds": dt, "compute_s": [per rank],
    "allreduce_s": a}``) asks for the simulated job's steps in that interval as DDP takes them (the stand-in
    runs a real step on the CPU every ``STAND_IN_EVERY`` requests): every rank waits for the slowest at the
    all-reduce, so a step lasts the slowest rank's compute plus the all-reduce's exposed part; the answer is
    the line for the last step that ended by ``now``."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    s, dev, n = ctx.size, ctx.device, ctx.world
    model = make_model(s).to(dev)
    kwargs: dict[str, Any] = {"bucket_cap_mb": BUCKET_CAP_MB, "gradient_as_bucket_view": True, "static_graph": True}
    if dev.type == "cuda":
        kwargs["device_ids"] = [dev.index]
    net = DDP(model, **kwargs) if n > 1 else model
    x, y = batch(s, s.batch, 2 + ctx.rank, dev)
    trainer = Trainer(net, net.parameters(), ctx.amp, dev, set_to_none=False)
    trainer.steps(x, y, 1)
    sync(dev)
    batch_per_rank = int(ctx.spec.get("batch_per_rank") or s.batch)

    def emit(line: dict[str, Any]) -> None:
        if ctx.rank == 0:
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()

    emit({"ready": True, "world_size": n, "batch_per_rank": batch_per_rank, "dtype": ctx.dtype_name})
    steps = 0
    if not ctx.spec.get("paced"):
        every = int(ctx.spec.get("compute_every") or 20)
        compute: list[float] = []
        last = time.monotonic()
        while True:
            if n > 1 and steps % every == every - 1:
                # Which ranks wait for the others: one step in ``every`` runs without the all-reduce
                # (``no_sync``: its gradients join the next step's), timed on each rank and gathered as
                # floats in a CPU tensor (never torch's object collectives).
                t0 = time.perf_counter()
                with net.no_sync():
                    trainer.steps(x, y, 1)
                sync(dev)
                mine = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=CPU)
                parts = [torch.zeros(1, dtype=torch.float64, device=CPU) for _ in range(n)]
                dist.all_gather(parts, mine)
                compute = [float(p.item()) for p in parts]
            else:
                trainer.steps(x, y, 1)
                sync(dev)
            steps += 1
            now = time.monotonic()
            line: dict[str, Any] = {"steps": steps, "samples": steps * n * batch_per_rank, "t": now,
                                    "step_s": now - last}
            if compute:
                line["compute_s"] = compute
            last = now
            emit(line)
    progress, ended = 0.0, None  # the share of the current step done; when the last whole step ended
    for k, raw in enumerate(sys.stdin):
        req = json.loads(raw)
        if k % STAND_IN_EVERY == 0:
            trainer.steps(x, y, 1)  # the stand-in's step: the job's code runs, on the CPU
        compute = [float(v) for v in req["compute_s"]]
        ranks = len(compute)
        step_s = max(compute) + float(req.get("allreduce_s", 0.0))
        now = float(req["t"])
        at = now - float(req["seconds"])
        while progress + (now - at) / step_s >= 1.0:
            at += (1.0 - progress) * step_s
            progress, ended = 0.0, at
            steps += 1
        progress += (now - at) / step_s
        emit({"steps": steps, "samples": steps * ranks * batch_per_rank, "t": ended if ended is not None else at,
              "step_s": step_s, "compute_s": compute})
    return {}


TASKS = {"ddp": ddp, "allreduce": allreduce, "p2p": p2p, "pipeline": pipeline,
         "pipeline_baseline": pipeline_baseline, "train": train}


# -- ranks -------------------------------------------------------------------------------------

class Ctx:
    def __init__(self, rank: int, world: int, local_rank: int, device: str, quick: bool,
                 stages: list[int] | None = None, spec: dict[str, Any] | None = None) -> None:
        self.rank, self.world, self.quick = rank, world, quick
        self.stages = stages or []
        self.spec = spec or {}
        self.results: dict[str, Any] = {}  # rank 0: the launch's results so far
        if device == "cuda":
            torch.cuda.set_device(local_rank)
            self.device = torch.device(f"cuda:{local_rank}")
        else:
            self.device = CPU
        self.dtype_name, self.amp = precision(self.device)
        self.size = size_for(device, quick)

    def progress(self, line: dict[str, Any]) -> None:
        """Rank 0 tells the runner what it starts now (a P2P pair and its deadline): one JSON line."""
        path = self.spec.get("progress")
        if path and self.rank == 0:
            with open(path, "a") as f:
                f.write(json.dumps(line | {"at": time.time()}) + "\n")

    def checkpoint(self, task: str, partial: dict[str, Any]) -> None:
        """Rank 0 keeps what was measured so far: a launch that fails or times out still reports it."""
        if self.rank == 0 and self.spec.get("out"):
            _write_json(self.spec["out"] + ".partial", self.results | {task: partial | {"partial": True}})

    def uuid_of(self, index: int) -> str | None:
        """NVML's form of a CUDA device's UUID (``GPU-…``): how the runner maps a rank to an NVML GPU."""
        if self.device.type != "cuda":
            return None
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        return f"GPU-{uuid}" if uuid is not None else None  # none: the diagnosis maps by index

    def barrier(self) -> None:
        """Every rank here, with its device idle: the host returns only once the barrier's collective has
        completed on the device (an all-reduce alone returns at once on a GPU: the clock would start
        before the slowest rank arrived)."""
        sync(self.device)
        if self.world > 1:
            # A collective on a device tensor, not dist.barrier(): NCCL's barrier guesses the device.
            t = torch.zeros(1, device=self.device)
            dist.all_reduce(t)
            sync(self.device)


def init(spec: dict[str, Any], rank: int, world: int, local_rank: int) -> Ctx:
    device = spec["device"]
    if spec.get("cpus"):
        os.sched_setaffinity(0, spec["cpus"])  # the GPU's CPUs (multi-socket machines)
    if device == "cpu":
        torch.set_num_threads(max(1, int(spec.get("threads_per_rank", 1))))
    ctx = Ctx(rank, world, local_rank, device, bool(spec.get("quick")), spec.get("stages"), spec)
    if world > 1 and not dist.is_initialized():
        # CPU bookkeeping is legal on a GPU run too: one backend per device type. On one machine the ranks
        # meet through a file store in the launcher's private (0700) directory, not a TCP port another
        # user could take first (gpud.probe.launch.launch); under torchrun, through torchrun's rendezvous.
        file_store = dist.FileStore
        store = file_store(spec["store"], world) if spec.get("store") else None
        dist.init_process_group("cpu:gloo,cuda:nccl" if device == "cuda" else "gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=float(spec.get("collective_timeout", 60))),
                                device_id=ctx.device if device == "cuda" else None, store=store)
    if spec.get("default_device"):
        torch.set_default_device(spec["default_device"])  # tests: a tensor made without a device is caught
    return ctx


def run(spec: dict[str, Any], rank: int, world: int, local_rank: int) -> dict[str, Any]:
    ctx = init(spec, rank, world, local_rank)
    results: dict[str, Any] = {"world_size": world, "device": spec["device"], "torch": torch.__version__,
                               "dtype": ctx.dtype_name}
    me = {"rank": rank, "local_rank": local_rank, "uuid": ctx.uuid_of(ctx.device.index or 0),
          "cpus": sorted(os.sched_getaffinity(0)), "pid": os.getpid(), "host": socket.gethostname(),
          "node": int(os.environ.get("GROUP_RANK", "0") or 0)}  # torchrun's node rank
    results["ranks"] = gather(me) if world > 1 else [me]  # world 1 inside a group: torchrun's baseline, alone
    if ctx.device.type == "cuda" and rank == 0:
        results["gpu_name"] = torch.cuda.get_device_name(ctx.device)
        version = torch.cuda.nccl.version()  # a tuple; an int (2708 = 2.7.8) in older torch
        results["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    ctx.results = results
    hang = spec.get("test_hang")  # tests: a P2P pair that never finishes, after the pairs in "done"
    if hang and rank == 0 and hang["p2p_pair"] not in spec.get("p2p_skip", []):
        ctx.checkpoint("p2p", {"pairs": hang.get("done", [])})
        ctx.progress({k: v for k, v in hang.items() if k != "done"})
        time.sleep(3600)
    for task in spec["tasks"]:
        t0 = time.perf_counter()
        res = TASKS[task](ctx)
        if rank == 0:
            results[task] = res | {"wall_seconds": time.perf_counter() - t0}
            if spec.get("out"):
                _write_json(spec["out"] + ".partial", results)
    return results


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def teardown(spec: dict[str, Any], world: int) -> None:
    time.sleep(float(spec.get("test_teardown_hang_seconds", 0)))  # tests: a tear-down that hangs
    if world > 1 and dist.is_initialized():
        dist.destroy_process_group()


def main() -> int:
    spec = json.loads(open(sys.argv[1]).read())
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    res = run(spec, rank, world, local)
    if rank == 0:
        _write_json(spec["out"], res)
    teardown(spec, world)
    return 0


def cuda_available() -> bool:
    """For the torchrun path of the runner, which must not import torch itself."""
    return bool(torch.cuda.is_available())


def gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (JSON: the group made by ``init``), in rank order.

    As JSON bytes in a CPU tensor, never torch's object collectives: they load pickles the other ranks sent,
    and a process that got between them (a local user on the data plane's loopback port) would run code
    in every rank, as root under ``sudo gpud probe``."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [json.loads(json.dumps(value))]
    data = json.dumps(value).encode()
    world = dist.get_world_size()
    cpu = torch.device("cpu")  # Gloo's half of the group; explicit (the tests set another default device)
    sizes = [torch.zeros(1, dtype=torch.int64, device=cpu) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=cpu))
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=cpu)
    if data:
        mine[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    parts = [torch.zeros(longest, dtype=torch.uint8, device=cpu) for _ in range(world)]
    dist.all_gather(parts, mine)
    return [json.loads(bytes(p[:int(n.item())].tolist()).decode()) for p, n in zip(parts, sizes, strict=True)]


def finish_group() -> None:
    """Leave the process group together (the torchrun path), if one was made."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())

