"""``gpud probe``: a short training run that measures scaling and says why it falls short."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
from typing import Annotated, Any, NoReturn

import typer

from gpud import __version__
from gpud.cli.common import Json, Simulate, machine
from gpud.cli.common import host as host_of
from gpud.cli.output import echo_wrapped, emit_json, is_tty, table
from gpud.errors import GpudError, InvalidInput
from gpud.model import host_json, probe_document
from gpud.probe.report import CORRECTNESS, Device, ProbeReport, by_node

GB = 1e9


class _Bar:
    """A progress bar on a terminal, started by the first step (a probe refused before it starts,
    torch missing, shows none) and always stopped: no bar is left behind an error."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, msg: str, k: int, n: int) -> None:
        if self.bar is None:
            from rich.console import Console
            from rich.progress import Progress

            # gpud's own cursor and line controls: straight to the terminal, past SafeStream
            self.bar = Progress(transient=True, console=Console(file=getattr(sys.stdout, "raw_stream", sys.stdout)))
            self.bar.start()
            self.task = self.bar.add_task("probe", total=n)
        self.bar.update(self.task, total=n, completed=k, description=msg)
        if msg == "done":
            self.stop()

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _progress(json: bool) -> Any:
    if json:
        return None
    if is_tty():
        return _Bar()

    def plain(msg: str, k: int, n: int) -> None:
        print(f"gpud probe: [{k}/{n}] {msg}", file=sys.stderr)

    return plain


def render(r: ProbeReport) -> None:
    out = sys.stdout
    cpu = r.device != "cuda"
    dev = r.gpu_name or "CPU"
    echo_wrapped(f"gpud probe — {r.host or 'this machine'} ({dev}, torch {r.torch}, {r.dtype}"
                 + (f", NCCL {r.nccl.version}" if r.nccl.version else "") + ")"
                 + (" — quick" if r.quick else ""))
    if r.note:
        echo_wrapped(r.note, indent="  ")
    for node, host, ranks in by_node(r.placement or []):
        held = [p.gpu_uuid for p in ranks if p.gpu_uuid]
        echo_wrapped(f"node {node} ({host}): rank{'s' if len(ranks) > 1 else ''} "
                     f"{', '.join(str(p.rank) for p in ranks)} on " + (", ".join(held) if held else "CPU"),
                     indent="    ", first="  ")
    env = r.nccl.env
    if env:
        echo_wrapped("NCCL settings: " + ", ".join(f"{k}={v}" for k, v in env.items()), indent="    ", first="  ")
    for line in r.busy_at_start or []:
        echo_wrapped(f"busy at start: {line}", indent="    ", first="  ")
    ddp = r.ddp
    verdicts = r.diagnosis.verdicts
    if ddp:
        any_r = next(iter(ddp.values()))
        m = any_r["model"]
        title = (f"\nDDP (transformer: {m['layers']} blocks × {m['dim']}, sequence {m['seq']}, batch "
                 f"{any_r['batch_per_rank']} per rank, {len(any_r.get('windows_seconds', [])) or 1} windows of "
                 f"{any_r['steps']} steps; median ± spread)")
        rows = []
        for n, x in sorted(ddp.items(), key=lambda kv: int(kv[0])):
            row = [n, f"{x['samples_per_second']:.1f}", f"±{x.get('spread', 0):.0%}"]
            if not cpu:  # a CPU run checks function: its ratios are not a result
                row += [f"{x['speedup']:.2f}×" if "speedup" in x else "", f"{x['efficiency']:.0%}"
                        if "efficiency" in x else "", verdicts.get(n, "")]
            rows.append(row)
        table(["world size", "samples/s", "spread"] + ([] if cpu else ["speedup", "efficiency", "verdict"]), rows,
              title=title)
    ar = r.allreduce
    if ar:
        rows = []
        for n, x in sorted(ar.items(), key=lambda kv: int(kv[0])):
            for s in x["sizes"]:
                rows.append([n, f"{s['bytes'] / 2**20:.2f} MiB", f"{s['algbw_bytes_per_second'] / GB:.2f}",
                             f"{s['busbw_bytes_per_second'] / GB:.2f}", f"±{s.get('spread', 0):.0%}"])
        table(["ranks", "size", "algbw GB/s", "busbw GB/s", "spread"], rows,
              title="\nAll-reduce (algbw = S/t, busbw = algbw·2(n−1)/n)")
    for k, p in sorted(r.pipeline.items()):
        text = (f"Pipeline, {k} stages of {'/'.join(map(str, p.get('stage_layers', [])))} blocks, "
                f"{p['micro_batches']} micro-batches: GPipe {p['pipeline_samples_per_second']:.1f} samples/s")
        if not cpu and "speedup" in p:
            text += f" ({p['speedup']:.2f}× one GPU, naive split {p['naive_speedup']:.2f}×)"
        text += (f"; activations {p['activation_bytes_per_second'] / GB:.2f} GB/s between stages (measured); "
                 f"output vs unsplit: max difference {p['output_max_abs_diff']:.2g}")
        out.write("\n")
        echo_wrapped(text)
    pairs = r.p2p_pairs
    if pairs:
        lat_key = "copy_latency_seconds" if "copy_latency_seconds" in pairs[0] else "one_way_latency_seconds"
        table(["pair", "one way GB/s", "both ways GB/s", "latency µs"],
              [[f"{p['src']}→{p['dst']}", f"{p['bandwidth_bytes_per_second'] / GB:.2f}",
                f"{p['bidirectional_bytes_per_second'] / GB:.2f}" if "bidirectional_bytes_per_second" in p else "—",
                f"{p.get(lat_key, 0) * 1e6:.1f}"]
               for p in pairs],
              title=f"\nP2P ({r.p2p.get('how', '')}; latency: {r.p2p.get('latency', '')})")
    out.write("\n")
    echo_wrapped("Correctness: " + "; ".join(f"{CORRECTNESS[k]}: {'yes' if v else 'NO'}"
                                             for k, v in r.correctness.items()), indent="  ")
    for s in r.diagnosis.sentences:
        echo_wrapped(s, indent="    ", first="  → ")
    for s in r.regressions:
        echo_wrapped(f"REGRESSION: {s}", indent="    ", first="  ")
    for s in r.failures or []:  # what was measured before is shown above
        echo_wrapped(f"FAILED: {s}", indent="    ", first="  ")
    out.write(f"\n{'OK' if r.ok else 'FAILED'}\n")


def probe(
    json: Json = False,
    gpus: Annotated[int | None, typer.Option("--gpus", min=1, help="Use the first N GPUs.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="cuda or cpu (default: cuda when torch sees "
                                                                   "a GPU)")] = None,
    suite: Annotated[str, typer.Option("--suite", help="Comma-separated: ddp, pipeline, allreduce, p2p.")
                     ] = "ddp,pipeline,allreduce,p2p",
    world_sizes: Annotated[str | None, typer.Option("--world-sizes", help="e.g. 1,2,4 (default: 1, 2, 4 … up "
                                                                             "to the GPU count)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Fewer steps and sizes (about a minute on 4 GPUs).")] = False,
    allow_busy: Annotated[bool, typer.Option("--allow-busy", help="Run on GPUs other processes use (the report "
                                                                 "names them).")] = False,
    simulate: Simulate = None,
    config: Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml")] = None,
    nnodes: Annotated[int | None, typer.Option("--nnodes", min=1, help="Machines in the probe: run the same "
                                                                       "command on each, under torchrun.")] = None,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="This machine's rank among --nnodes (0 "
                                                                      "hosts the rendezvous).")] = 0,
    rdzv_endpoint: Annotated[str | None, typer.Option("--rdzv-endpoint", metavar="HOST:PORT",
                                                      help="Node 0's address and a free port.")] = None,
    nproc_per_node: Annotated[int | None, typer.Option("--nproc-per-node", min=1, help="Ranks on this machine "
                                                                                      "(default: --gpus, else "
                                                                                      "the GPUs torch sees, "
                                                                                      "else 1).")] = None,
) -> None:
    """DDP scaling, pipeline parallelism, all-reduce and P2P bandwidth — and why scaling falls short.

    Each measurement runs in child processes with a timeout. Under torchrun (several machines),
    every rank runs it and rank 0 reports; --nnodes, --node-rank and --rdzv-endpoint start torchrun
    here (the same command on every machine, node 0's HOST:PORT as the rendezvous).
    """
    from gpud import config as cfg
    from gpud.probe import runner, torchrun
    from gpud.probe.plan import SUITES

    conf = cfg.load(config)
    suites = [s.strip() for s in suite.split(",") if s.strip()]
    for s in suites:
        if s not in SUITES:
            raise InvalidInput("--suite", s, f"unknown suite (known: {', '.join(SUITES)})")
    try:
        sizes = [int(x) for x in world_sizes.split(",")] if world_sizes else None
    except ValueError as err:
        raise InvalidInput("--world-sizes", world_sizes or "", "must be integers separated by commas") from err
    if device not in (None, "cuda", "cpu"):
        raise InvalidInput("--device", device, "must be cuda or cpu")
    if nnodes is None and (rdzv_endpoint or node_rank or nproc_per_node):
        raise InvalidInput("--nnodes", "", "needed with --node-rank, --rdzv-endpoint and --nproc-per-node")
    if nnodes is not None:
        if not rdzv_endpoint:
            raise InvalidInput("--rdzv-endpoint", "", "needed with --nnodes: node 0's HOST:PORT")
        if sizes is not None:
            raise InvalidInput("--world-sizes", world_sizes or "", "across machines the world size is --nnodes × "
                                                                   "--nproc-per-node")
        inner = ["--suite", ",".join(suites)] + ["--quick"] * quick + ["--allow-busy"] * allow_busy
        # torchrun starts its ranks with `python -m gpud`, which puts the working directory first on sys.path:
        # the ranks start in an empty directory of their own, so files named here are passed whole.
        inner += ["--json"] * json + (["--simulate", _whole(simulate)] if simulate else [])
        inner += ["--config", _whole(config)] if config else []
        cmd = torchrun.torchrun_command(nnodes=nnodes, node_rank=node_rank, endpoint=rdzv_endpoint,
                                        nproc_per_node=nproc_per_node or gpus, probe_args=inner)

        with tempfile.TemporaryDirectory(prefix="gpud-torchrun-") as cwd:
            code = subprocess.run(cmd, check=False, cwd=cwd).returncode
        raise typer.Exit(code)
    if torchrun.under_torchrun():

        try:
            node: Any = machine(simulate)
        except GpudError:
            node = None  # no NVML here: the GPUs are not checked for other jobs
        res = torchrun.run_distributed(quick=quick, suites=suites, host=socket.gethostname(),
                                       thresholds=conf.efficiency_thresholds(), machine=node, allow_busy=allow_busy)
        if res is None:
            _leave_rank(0)
    else:
        m = machine(simulate)
        have = torchrun.torch_gpus()
        dev: Device = "cuda" if device == "cuda" or (device is None and have) else "cpu"
        if dev == "cuda" and not have:
            raise InvalidInput("--device", "cuda", "torch sees no GPU here (a CPU build, or no driver)")
        n = min(have, gpus) if gpus and dev == "cuda" else have
        progress = _progress(json)
        try:
            res = runner.run_probe(device=dev, gpus=n, world_sizes=sizes, suites=suites, quick=quick, machine=m,
                                   host=m.label, thresholds=conf.efficiency_thresholds(), progress=progress,
                                   allow_busy=allow_busy)
        finally:
            if isinstance(progress, _Bar):
                progress.stop()
    if json:

        if torchrun.under_torchrun():
            where = host_json(res.host)
        else:
            try:
                where = host_of(m, m.snapshot())
            except GpudError:  # the probe ran without NVML (a CPU run on a machine without the driver)
                where = host_json(res.host)
        emit_json(probe_document(res.to_json(), __version__, where))
    else:
        render(res)
    if torchrun.under_torchrun():
        _leave_rank(0 if res.ok else 1)
    if not res.ok:
        raise typer.Exit(1)


def _leave_rank(code: int) -> NoReturn:
    """A torchrun rank's exit once its part is done (the group left, rank 0's report written): without the
    interpreter's teardown, whose C++ static destructors race the collective library's threads — "terminate
    called without an active exception" and SIGABRT after a run that succeeded, seen here in Gloo under load
    (pytorch/pytorch#65237 is the same race in PyTorch's own tests) — and which torchrun then reports as the
    rank's failure."""

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)


def register(app: typer.Typer) -> None:
    app.command("probe")(probe)


def _whole(path: str) -> str:
    """A file named on the command line as an absolute path (a name that is no file, as given)."""

    return os.path.abspath(path) if os.path.isfile(path) else path
