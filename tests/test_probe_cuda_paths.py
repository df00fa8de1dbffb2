"""The probe's CUDA code paths without a GPU: torch's fake process group (``init_process_group("fake",
store=FakeStore())``) and ``FakeTensorMode`` on ``cuda:k`` devices run the worker's own task functions.
Every tensor that reaches a collective, a send/recv or a P2P copy must be on the rank's GPU, each
pipeline stage on its GPU, and every timed window must start and end with the device synchronised."""

from __future__ import annotations

import copy
import os
import types
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import pytest

from gpud.probe.torchrun import torch_available

pytestmark = pytest.mark.skipif(not torch_available() and os.environ.get("CI") != "true",
                                reason="PyTorch not installed: README, Run the tests, says how to add the CPU build")

GPUS = 4


class Recorder:
    """What the worker did, in order: ("sync", device), ("clock",), (collective, device), ("copy", src, dst)."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def devices(self, kind: str) -> set[str]:
        return {str(e[1]) for e in self.events if e[0] == kind}

    def windows(self) -> list[list[tuple[Any, ...]]]:
        """The events between each pair of clock readings (start, stop)."""
        clocks = [k for k, e in enumerate(self.events) if e[0] == "clock"]
        return [self.events[a:b + 1] for a, b in zip(clocks[::2], clocks[1::2], strict=False)]


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Recorder, Any]]:
    import time

    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from gpud.probe import worker

    rec = Recorder()
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "device_count", lambda: GPUS)
    monkeypatch.setattr(cuda, "set_device", lambda d: rec.events.append(("set_device", d)))
    monkeypatch.setattr(cuda, "synchronize", lambda d=None: rec.events.append(("sync", torch.device(d))))
    monkeypatch.setattr(cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(uuid=f"00000000-0000-0000-0000-00000000000{i}"))
    monkeypatch.setattr(cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    monkeypatch.setattr(cuda, "can_device_access_peer", lambda i, j: True)
    monkeypatch.setattr(cuda, "Stream", lambda d=None: types.SimpleNamespace(device=torch.device(d)))
    monkeypatch.setattr(cuda, "stream", lambda s: nullcontext())
    real_clock = time.perf_counter

    def clock() -> float:
        rec.events.append(("clock",))
        return real_clock()
    monkeypatch.setattr(worker, "time", types.SimpleNamespace(perf_counter=clock, time=time.time,
                                                               sleep=time.sleep))
    for name in ("all_reduce", "send", "recv", "isend", "irecv", "broadcast"):
        real = getattr(dist, name)

        def wrapped(tensor: Any, *a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
            rec.events.append((_name, tensor.device))
            return _real(tensor, *a, **kw)
        monkeypatch.setattr(dist, name, wrapped)
    real_to = torch.Tensor.to

    def to(self: Any, *a: Any, **kw: Any) -> Any:
        out = real_to(self, *a, **kw)
        if out.device != self.device:
            rec.events.append(("copy", self.device, out.device))
        return out
    monkeypatch.setattr(torch.Tensor, "to", to)
    real_copy = torch.Tensor.copy_

    def copy_(self: Any, src: Any, non_blocking: bool = False) -> Any:
        rec.events.append(("copy", src.device, self.device))
        if isinstance(self, FakeTensor) and self.device.type == "cuda" and src.device != self.device:
            return self  # a copy between two GPUs needs CUDA's device guard, which a CPU build lacks
        return real_copy(self, src, non_blocking)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    # Pinned host memory has no fake kernel: the host tensor stays what it is (the copy is what is checked).
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a: rec.events.append(("pin", self.device)) or self)
    real_item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda self: 1.0 if isinstance(self, FakeTensor) else real_item(self))
    real_make = worker.make_model
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def make_model(*a: Any, **kw: Any) -> Any:
        """Built on the host with real weights, as on a GPU machine. A CPU build of torch cannot make the
        autograd graph of a CUDA tensor (no device guard): the weights need no gradient here and
        ``backward`` records where the loss is instead of running."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return real_make(*a, **kw).requires_grad_(False)
    monkeypatch.setattr(worker, "make_model", make_model)

    def deepcopy(obj: Any) -> Any:  # a copy of a host model stays on the host, as it does without the fake mode
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        host = isinstance(obj, torch.nn.Module) and not any(isinstance(p, FakeTensor) for p in obj.parameters())
        with unset_fake_temporarily() if host else nullcontext():
            return copy.deepcopy(obj)
    monkeypatch.setattr(worker, "copy", types.SimpleNamespace(deepcopy=deepcopy))
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *a, **kw: rec.events.append(("backward", self.device)))
    with mode:
        yield rec, worker
    if dist.is_initialized():
        dist.destroy_process_group()


def _group(world: int, rank: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)


def test_allreduce_tensors_are_on_the_ranks_gpu(fake_gpus) -> None:
    rec, worker = fake_gpus
    _group(4, 2)
    ctx = worker.Ctx(2, 4, 2, "cuda", True, spec={})
    out = worker.allreduce(ctx)
    assert out["bucket_bytes"] == 25 << 20
    assert rec.devices("all_reduce") == {"cuda:2"}


def assert_windows_synchronised(rec: Recorder, devices: set[str], barrier: bool) -> None:
    """Each timed window: the clock starts right after the device was synchronised (after the barrier's
    collective, with more than one rank) and stops right after it was synchronised again."""
    events = rec.events
    clocks = [k for k, e in enumerate(events) if e[0] == "clock"]
    assert clocks, "no timed window"
    for start, stop in zip(clocks[::2], clocks[1::2], strict=True):
        assert events[start - 1][0] == "sync" and str(events[start - 1][1]) in devices, events[start - 3:start + 1]
        if barrier:
            assert events[start - 2][0] == "all_reduce", events[start - 3:start + 1]
        assert events[stop - 1][0] == "sync" and str(events[stop - 1][1]) in devices, events[stop - 3:stop + 1]


def test_allreduce_windows_start_after_the_barrier_completed(fake_gpus) -> None:
    rec, worker = fake_gpus
    _group(2, 1)
    worker.allreduce(worker.Ctx(1, 2, 1, "cuda", True, spec={}))
    assert_windows_synchronised(rec, {"cuda:1"}, barrier=True)


def test_ddp_wraps_a_model_on_the_ranks_gpu_and_reduces_there(fake_gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    rec, worker = fake_gpus

    class Ddp(torch.nn.Module):
        """DDP as far as placement goes: where the module's parameters are, and device_ids."""

        def __init__(self, module: Any, device_ids: list[int] | None = None, **kw: Any) -> None:
            super().__init__()
            self.module = module
            rec.events.append(("ddp", {str(p.device) for p in module.parameters()}, device_ids))

        def forward(self, x: Any) -> Any:
            return self.module(x)
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", Ddp)
    _group(4, 3)
    out = worker.ddp(worker.Ctx(3, 4, 3, "cuda", True, spec={}))
    assert out["dtype"] == "bf16"
    [ddp] = [e for e in rec.events if e[0] == "ddp"]
    assert ddp[1:] == ({"cuda:3"}, [3])
    assert rec.devices("all_reduce") == {"cuda:3"}  # the loss, the barriers, the timings, the parameter checks
    assert rec.devices("backward") == {"cuda:3"}
    assert_windows_synchronised(rec, {"cuda:3"}, barrier=True)


def test_rank_0s_ddp_reference_takes_the_shards_on_its_gpu(fake_gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    rec, worker = fake_gpus
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", lambda module, **kw: module)
    _group(8, 0)
    out = worker.ddp(worker.Ctx(0, 8, 0, "cuda", True, spec={}))
    assert out["reference"]["shards"] == 8
    # the reference's backward runs once per shard (each of one rank's batch), on rank 0's GPU
    backward = [e for e in rec.events if e[0] == "backward"]
    size = worker.size_for("cuda", True)
    timed = size.warmup + 3 * size.steps
    assert len(backward) == 1 + 8 + timed and rec.devices("backward") == {"cuda:0"}


def test_p2p_copies_go_between_the_two_gpus_of_each_pair(fake_gpus) -> None:
    rec, worker = fake_gpus
    ctx = worker.Ctx(0, 1, 0, "cuda", True, spec={})
    out = worker.p2p(ctx)
    pairs = {(p["src"], p["dst"]) for p in out["pairs"]}
    assert pairs == {(i, j) for i in range(GPUS) for j in range(GPUS) if i != j}
    copies = {(str(e[1]), str(e[2])) for e in rec.events if e[0] == "copy"}
    assert copies == {(f"cuda:{i}", f"cuda:{j}") for i, j in pairs}  # no copy through the host
    # both ways at once once per pair of GPUs, its figure on both rows
    rows = {(p["src"], p["dst"]): p for p in out["pairs"]}
    assert rows[(2, 1)]["bidirectional_bytes_per_second"] == rows[(1, 2)]["bidirectional_bytes_per_second"]
    assert_windows_synchronised(rec, {f"cuda:{i}" for i in range(GPUS)}, barrier=False)


def test_the_naive_split_puts_each_stage_on_its_gpu_and_the_batch_there_before_the_clock(fake_gpus) -> None:
    import torch

    rec, worker = fake_gpus
    seen: list[tuple[str, str]] = []
    real = torch.nn.Module.__call__

    def call(self: Any, x: Any, *a: Any, **kw: Any) -> Any:
        if isinstance(self, torch.nn.Sequential):
            seen.append((str(next(self.parameters()).device), str(x.device)))
        return real(self, x, *a, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.Module, "__call__", call)
        out = worker.pipeline_baseline(worker.Ctx(0, 1, 0, "cuda", True, stages=[4], spec={}))
    assert out["by_stages"]["4"]["dtype"] == "fp32" and out["by_stages"]["4"]["naive_devices"] == 4
    # every part runs on its own GPU with its input there; the unsplit model on GPU0
    assert {(w, x) for w, x in seen} == {(f"cuda:{i}", f"cuda:{i}") for i in range(4)}
    # inside the timed windows nothing comes from the host
    for window in rec.windows():
        assert not [e for e in window if e[0] == "copy" and str(e[1]) == "cpu"], window
    assert_windows_synchronised(rec, {f"cuda:{i}" for i in range(4)}, barrier=False)


def test_gpipe_puts_each_stage_on_its_ranks_gpu_and_sends_from_there(fake_gpus, monkeypatch) -> None:
    import torch
    import torch.distributed.pipelining as pipelining

    rec, worker = fake_gpus
    stages: list[tuple[Any, ...]] = []

    class Stage:
        def __init__(self, module: Any, index: int, count: int, device: Any) -> None:
            stages.append((index, {str(p.device) for p in module.parameters()}, str(device)))
            self.module = module

    class GPipe:
        """Runs the stage's module on what it is given: the schedule's own sends are torch's."""

        def __init__(self, stage: Stage, n_microbatches: int, loss_fn: Any) -> None:
            self.stage = stage

        def step(self, x: Any = None, target: Any = None, losses: Any = None, return_outputs: bool = True) -> Any:
            dev = next(self.stage.module.parameters()).device
            h = x if x is not None else torch.empty(16, 64, 1024, device=dev)
            assert h.device == dev
            return self.stage.module(h)
    monkeypatch.setattr(pipelining, "PipelineStage", Stage)
    monkeypatch.setattr(pipelining, "ScheduleGPipe", GPipe)
    for rank in (0, 3):
        _group(4, rank)
        rec.events.clear()
        worker.pipeline(worker.Ctx(rank, 4, rank, "cuda", True, spec={}))
        assert stages[-1] == (rank, {f"cuda:{rank}"}, f"cuda:{rank}")
        sent = rec.devices("send") | rec.devices("recv") | rec.devices("all_reduce")
        assert sent == {f"cuda:{rank}"}
        assert_windows_synchronised(rec, {f"cuda:{rank}"}, barrier=True)


def test_ddp_clears_gradients_in_place_under_its_bucket_views(fake_gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``gradient_as_bucket_view=True`` the gradients are views into DDP's buckets; setting them to
    None makes the reducer copy every gradient into its bucket on each step (its own comment), a cost
    that would be charged to DDP's efficiency only. Both the DDP run and the one-GPU run it is compared
    with clear in place."""
    import torch

    rec, worker = fake_gpus
    wrapped: list[dict[str, Any]] = []

    def ddp(module: Any, **kw: Any) -> Any:
        wrapped.append(kw)
        return module

    cleared: list[bool] = []
    real = torch.optim.Optimizer.zero_grad

    def zero_grad(self: Any, set_to_none: bool = True) -> None:
        cleared.append(set_to_none)
        real(self, set_to_none=set_to_none)

    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", ddp)
    monkeypatch.setattr(torch.optim.Optimizer, "zero_grad", zero_grad)
    _group(2, 1)
    worker.ddp(worker.Ctx(1, 2, 1, "cuda", True, spec={}))
    assert wrapped and all(kw.get("gradient_as_bucket_view") for kw in wrapped)
    assert cleared and not any(cleared)
