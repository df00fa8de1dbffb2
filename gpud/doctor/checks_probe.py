"""`gpud doctor --probe`: the training probe's verdicts, and PCIe generation re-checked under load."""

from __future__ import annotations

from collections.abc import Iterator

from gpud.doctor.registry import Context, Reporter, check
from gpud.model import CheckResult
from gpud.probe.report import ProbeReport
from gpud.text import plural

GB = 1e9
REMEDY = "run `gpud probe` for the full report; check the links it names (`gpud topo`, `nvidia-smi topo -m`)"


def _report(ctx: Context) -> ProbeReport:
    return ctx.probe or ProbeReport()


def _cpu(ctx: Context) -> bool:
    return _report(ctx).device != "cuda"


@check("probe.ddp_scaling", "Probe", needs_nvml=False, probe=True)
def ddp_scaling(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    report = _report(ctx)
    by = report.ddp
    corr = report.correctness
    if not by:
        yield r.skip("DDP not measured")
        return
    if corr.params_identical_across_ranks is False or corr.ddp_matches_one_process is False:
        yield r.fail("DDP is wrong: ranks disagree, or a DDP step differs from one process's",
                     remedy="check the NCCL/gloo set-up and the environment (env.cuda); " + REMEDY)
        return
    diag = report.diagnosis
    sentences = diag.sentences
    for n, x in sorted(by.items(), key=lambda kv: int(kv[0])):
        if int(n) < 2:
            continue
        if _cpu(ctx):  # a functional check: no ratio is a result
            yield r.ok(f"{n} CPU ranks: DDP works (a functional check, not a measure of hardware)")
            continue
        verdict = diag.verdicts.get(n, "n/a")
        why = next((s for s in sentences if s.startswith(f"{n} GPUs (")), "")
        d = diag.details.get(n)
        text = f"{n} GPUs: {x.get('efficiency', 0):.0%} efficiency"
        if d is not None and d.predicted_efficiency:
            lo, hi = d.predicted_efficiency
            text += f" (predicted {lo:.0%}–{hi:.0%})"
        if d is not None and d.bus_ratio is not None:
            text += f", bus bandwidth {d.bus_ratio:.0%} of expected"
        if verdict == "fail":
            yield r.fail(text, detail=why, remedy=REMEDY)
        elif verdict == "warn":
            yield r.warn(text, detail=why, remedy=REMEDY)
        else:
            yield r.ok(text, detail=why)


@check("probe.pipeline", "Probe", needs_nvml=False, probe=True)
def pipeline(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    by = _report(ctx).pipeline
    if not by:
        yield r.skip("pipeline not measured (needs 2 GPUs, or 2 CPU ranks)")
        return
    for k, p in sorted(by.items()):
        if _report(ctx).correctness.pipeline_matches_unsplit is False:
            yield r.fail(f"{k}-stage pipeline output differs from the unsplit model's "
                         f"(max difference {p['output_max_abs_diff']:.3g})", remedy=REMEDY)
        elif _cpu(ctx):
            yield r.ok(f"{k} stages: output matches the unsplit model (CPU: a functional check)")
        else:
            yield r.ok(f"{k} stages: GPipe {p.get('speedup', 0):.2f}× one GPU, naive split "
                       f"{p.get('naive_speedup', 0):.2f}×; activations "
                       f"{p['activation_bytes_per_second'] / GB:.2f} GB/s (measured); output matches the unsplit model")


@check("probe.allreduce", "Probe", needs_nvml=False, probe=True)
def allreduce(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    by = _report(ctx).allreduce
    if not by:
        yield r.skip("all-reduce not measured (one GPU)")
        return
    unit = "CPU ranks" if _cpu(ctx) else "GPUs"
    peaks = ", ".join(f"{n} {unit} {x['peak_busbw_bytes_per_second'] / GB:.1f} GB/s"
                      for n, x in sorted(by.items(), key=lambda kv: int(kv[0])))
    yield r.ok(f"peak busbw: {peaks}" + (" (CPU: function only)" if _cpu(ctx) else ""))


@check("probe.p2p", "Probe", needs_nvml=False, probe=True)
def p2p(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    report = _report(ctx)
    pairs = report.p2p_pairs
    if not pairs:
        yield r.skip("P2P not measured")
        return
    slow = [x for x in report.diagnosis.links if x.ratio < 0.5]
    if slow:
        detail = "\n".join(f"GPU{x.src}→GPU{x.dst}: {x.measured_bytes_per_second / GB:.1f} GB/s of "
                           f"{x.expected_bytes_per_second / GB:.1f} ({x.link}) {'; '.join(x.notes)}"
                           for x in slow)
        yield r.warn(f"{plural(len(slow), 'pair')} below half of what their link allows", detail=detail,
                     remedy=REMEDY)
    else:
        best = max((x.get("bandwidth_bytes_per_second") or 0.0 for x in pairs), default=0.0)
        yield r.ok(f"{plural(len(pairs), 'pair')}, up to {best / GB:.1f} GB/s" +
                   (" (CPU: function only)" if _cpu(ctx) else ""))


@check("pcie.link_gen", "PCIe and topology", needs_nvml=True, probe=True)
def link_gen_under_load(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    load = _report(ctx).load
    seen = load.pcie_max_generation_under_load if load is not None else {}
    if not seen:
        yield r.skip("not re-checked under load (no GPU load seen during the probe)")
        return
    for gpu, gen in sorted(seen.items()):
        g = ctx.infos.get(int(gpu))
        top = g.pcie_max_generation if g else None
        if top and gen < top:
            yield r.fail(f"Gen{gen} under the probe's load, max Gen{top}", gpu=int(gpu),
                         remedy="set the slot to its full generation (or Auto) in the BIOS, check the riser; confirm "
                                f"with `nvidia-smi -i {gpu} -q -d PCIE` under load")
        else:
            yield r.ok(f"Gen{gen} under load (max Gen{top})", gpu=int(gpu))
