"""Verdicts from the burn-in's figures: each names the GPU, the test, the figure, the threshold and
its source (``gpud.burnin.plan.THRESHOLDS``), and what to do."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from gpud.burnin.phases import hold, load_steps, targeted_power, thermal
from gpud.burnin.plan import THRESHOLDS
from gpud.burnin.result import Result, Status, Verdict, not_judged
from gpud.burnin.telemetry import HW_REASONS
from gpud.model import GpuInfo
from gpud.probe import expect
from gpud.profiles.fancurve import curve_of

LOADED = ("load", "power", "pulse_full", "soak")


def _groups(res: Result) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for g in res.gpus:
        out.setdefault(res.names.get(g) or "?", []).append(g)
    return out


def robust_z(vals: list[float]) -> list[float]:
    """Each value's modified z-score, 0.6745 (x − median) / MAD (Iglewicz and Hoaglin, "How to Detect and
    Handle Outliers", 1993): the median and the median absolute deviation, which one outlier cannot drag
    as it drags the mean and σ. With σ of the values themselves no value of n lies more than (n − 1)/√n σ
    from their mean, so "> 3σ" could not fire on fewer than 11 GPUs. Zeros where the MAD is 0."""
    med = statistics.median(vals)
    mad = statistics.median(abs(v - med) for v in vals)
    return [0.6745 * (v - med) / mad if mad > 0 else 0.0 for v in vals]


# A power limit this far below its siblings' median is a setting of its own: the GPU runs slower because it is
# asked to draw less, which the spread must not read as slow silicon (NVML's power readings: 1 % of a 300 W limit).
LIMIT_BELOW_SIBLINGS = 0.01


def _spread(res: Result, test: str, figures: dict[int, float], unit: str, remedy: str,
            capped_at: dict[int, float] | None = None) -> list[Verdict]:
    """Each GPU against the median of its model's siblings; an outlier by its modified z-score is named.
    ``capped_at``: GPU → the power limit the SW power cap held it at under load. A GPU short of its
    siblings whose limit is below theirs (``LIMIT_BELOW_SIBLINGS``) is slower by its setting, not its
    silicon: a warning naming the limit, never a hardware failure (the siblings compared at one limit
    would say whether the GPU itself is slow)."""
    out: list[Verdict] = []
    limit, cut = THRESHOLDS["spread"], THRESHOLDS["outlier_z"]
    capped_at = capped_at or {}
    for _model, members in _groups(res).items():
        vals = {g: figures[g] for g in members if g in figures}
        if len(vals) < 2:
            out += [not_judged(test, g, f"no other {_model} under test to compare it with (the rule compares "
                               "siblings of one model)", "burn in two or more GPUs of one model together (no --gpus)",
                               limit.source) for g in vals]
            continue
        med = statistics.median(vals.values())
        zs = dict(zip(vals, robust_z(list(vals.values())), strict=True))
        for g, v in vals.items():
            short = (med - v) / med if med else 0.0
            outlier = len(vals) >= 3 and abs(zs[g]) > cut.value
            status: Status = "fail" if short > limit.value else "pass"
            text = (f"{v:.4g} {unit}, {short * 100:.1f} % below its siblings' median {med:.4g} {unit}"
                    if short > 0 else f"{v:.4g} {unit}, siblings' median {med:.4g} {unit}")
            if outlier:
                text += f"; an outlier (modified z-score {zs[g]:.1f}: median and MAD of its siblings)"
            why = remedy
            others = [capped_at[o] for o in vals if o != g and o in capped_at]
            if status == "fail" and g in capped_at and others:
                theirs = statistics.median(others)
                if capped_at[g] < theirs * (1 - LIMIT_BELOW_SIBLINGS):
                    status = "warn"
                    text += (f"; held by its power limit {capped_at[g]:.0f} W, below its siblings' "
                             f"{theirs:.0f} W (SW power cap): its setting, not its silicon")
                    why = (f"set the limit its siblings have (gpud restore, or nvidia-smi -i {g} -pl {theirs:.0f}) "
                           "and burn in again to compare the GPU itself")
            out.append(Verdict(test, status, text, g, round(short, 4), limit.value, limit.source,
                               why if status != "pass" else ""))
    return out


def _memtest(g: int, mem: dict[str, Any], rehearsal: tuple[str, str] | None) -> Verdict:
    """The memory test: any mismatching word fails, with the patterns that found it and where it lies."""
    th = THRESHOLDS["memtest"]
    if "error" in mem:
        return Verdict("burnin.memtest", "fail", f"the memory test did not finish: {mem['error']}", g,
                       source=th.source, remedy="run again with --debug; check the driver and dmesg for Xids")
    bad = int(mem["total_errors"])
    ran = (f"{mem['mib']} MiB in {mem.get('word_bits', 32)}-bit words, {mem.get('passes', 1)} pass(es)"
           + (f" over {mem['test_s'] / 60:.0f} min" if mem.get("test_s") else "")
           + (f" and a bit-fade pass ({mem['fade_s']:.0f} s a pattern)" if mem.get("fade_s") else ""))
    if rehearsal is not None and not bad:
        return not_judged("burnin.memtest", g, f"0 mismatching words in {ran} of host memory: " + rehearsal[0],
                          rehearsal[1], th.source)
    if not bad:
        return Verdict("burnin.memtest", "pass", f"0 mismatching words: {ran} ("
                       + ", ".join(k.replace("_", " ") for k in mem["errors"]) + ")", g, 0.0, th.value, th.source)
    found = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in mem["errors"].items() if v)
    where = "; ".join(f"{lo:#x}" + (f"–{hi:#x}" if hi != lo else "") + f" ({n} word(s))"
                      for lo, hi, n in mem.get("ranges") or [])
    return Verdict("burnin.memtest", "fail",
                   f"{bad} mismatching word(s) in {ran} ({found})"
                   + (f", at byte offset(s) {where} of the block tested from {mem.get('base')}" if where else ""),
                   g, float(bad), th.value, th.source,
                   "memory errors: check ECC counts and row remaps (nvidia-smi -q -d ECC,ROW_REMAPPER), reset the "
                   "GPU and run the memory test again; replace it if they return at the same place")


def _workload(res: Result, infos: dict[int, GpuInfo]) -> list[Verdict]:
    out: list[Verdict] = []
    work = res.workload
    for g in res.gpus:
        if "error" in work.get(g, {"error": "no result"}):
            out.append(Verdict("burnin.workload", "fail", f"the kernels did not finish: {work.get(g, {}).get('error')}",
                               g, source="the burn-in's child process", remedy="run again with --debug; check the "
                               "driver and dmesg for Xids"))
    ok = {g: w for g, w in work.items() if "error" not in w}
    host = not res.results_are_the_gpus  # a rehearsal on the host's CPU: what passes there says nothing of a GPU
    rehearsal = ("the kernels ran on the host's CPU (--device cpu): a pass there says nothing of the GPU",
                 "run on the GPUs: gpud burnin --device cuda")
    # Bit-for-bit: every GPU of one model computed the same product.
    for model, members in _groups(res).items():
        for k, dtype in enumerate(("bf16", "tf32", "fp32")):
            digests = {g: ok[g]["gemm"][k]["digest"] for g in members if g in ok and len(ok[g].get("gemm", [])) > k}
            if len(digests) < 2:
                out += [not_judged(f"burnin.gemm.{dtype}.digest", g, f"no other {model} under test to compare its "
                                   "product with", "burn in two or more GPUs of one model together (no --gpus)",
                                   THRESHOLDS["gemm.digest"].source) for g in digests]
                continue
            common, n = Counter(digests.values()).most_common(1)[0]
            for g, d in digests.items():
                same = d == common and n > len(digests) / 2
                if same and host:
                    out.append(not_judged(f"burnin.gemm.{dtype}.digest", g, rehearsal[0], rehearsal[1],
                                          THRESHOLDS["gemm.digest"].source))
                    continue
                out.append(Verdict(f"burnin.gemm.{dtype}.digest", "pass" if same else "fail",
                                   "the same bits as its siblings" if same else
                                   f"its {dtype} product differs from {n} of its {len(digests)} siblings' bit for bit",
                                   g, 0.0 if same else 1.0, THRESHOLDS["gemm.digest"].value,
                                   THRESHOLDS["gemm.digest"].source,
                                   "" if same else "the GPU computes wrong results: reseat it, check its cooling and "
                                   "Xids (gpud events), and replace it if it persists"))
    for g, w in ok.items():
        for r in w.get("gemm", []):
            if not r["reference_ok"]:
                out.append(Verdict(f"burnin.gemm.{r['dtype']}.reference", "fail",
                                   f"an element off the host's float64 product by {r['reference_error']:.3g}× "
                                   f"Higham's bound (allowed {r['reference_rtol']:.3g}×)", g, r["reference_error"],
                                   r["reference_rtol"],
                                   THRESHOLDS["gemm.reference"].source, "the GPU computes wrong results: replace it"))
        mem = w.get("memtest")
        if mem is not None:
            out.append(_memtest(g, mem, rehearsal if host else None))
    if res.device == "cuda":
        for k, dtype in enumerate(("bf16", "tf32", "fp32")):
            figs = {g: float(w["gemm"][k]["tflops"]) for g, w in ok.items() if len(w.get("gemm", [])) > k}
            out += _spread(res, f"burnin.gemm.{dtype}.throughput", figs, "TFLOP/s",
                           "slower than its siblings: check its clocks and throttle reasons (nvidia-smi -q -d "
                           "PERFORMANCE), its power limit and cooling")
        figs = {g: float(w["device_bandwidth"]["gbps"]) for g, w in ok.items() if "device_bandwidth" in w}
        out += _spread(res, "burnin.memory_bandwidth", figs, "GB/s",
                       "memory bandwidth below its siblings': check memory clocks (nvidia-smi -q -d CLOCK)")
        th = THRESHOLDS["host_bandwidth"]
        for g, w in ok.items():
            i = infos.get(g)
            hb = w.get("host_bandwidth")
            if i is None or hb is None:
                continue
            want = expect.pcie(i.pcie_max_generation, i.pcie_max_width, model=True)  # NCCL's figure (plan.py)
            got = min(float(hb["h2d_gbps"]), float(hb["d2h_gbps"]))
            ratio = got / want if want else 1.0
            out.append(Verdict("burnin.host_bandwidth", "fail" if ratio < th.value else "pass",
                               f"pinned host↔device {got:.1f} GB/s, {ratio * 100:.0f} % of the {want:.1f} GB/s a "
                               f"healthy Gen{i.pcie_max_generation} x{i.pcie_max_width} link carries (NCCL's model)",
                               g, round(ratio, 3),
                               th.value, th.source,
                               ("check the link (gpud doctor: pcie.*, lspci -vv) and the CPU affinity"
                                if ratio < th.value else "")))
    elif ok:
        out.append(not_judged("burnin.workload.figures", None,
                              "CPU figures (--device cpu): the kernels ran on the CPU and their speed says nothing of "
                              "the GPUs (GEMM throughput, memory and host bandwidth); the telemetry verdicts apply",
                              "run on the GPUs: gpud burnin --device cuda", "the workload ran on the CPU"))
    return out


def _telemetry(res: Result, infos: dict[int, GpuInfo]) -> list[Verdict]:
    out: list[Verdict] = []
    sustained: dict[int, float] = {}
    capped_at: dict[int, float] = {}  # GPU → the limit the SW power cap held it at under load
    for g, s in res.series.items():
        loaded = s.of(*LOADED)
        if len(loaded) < 2:
            continue
        span = loaded[-1].t - loaded[0].t or 1.0
        hw = {r: s.seconds_in(r, loaded) for r in HW_REASONS}
        bad = {r: v for r, v in hw.items() if v > 0}
        th = THRESHOLDS["hw_slowdown_s"]
        out.append(Verdict("burnin.clocks.hw_slowdown", "fail" if bad else "pass",
                           ("; ".join(f"{r} {v:.0f} s" for r, v in bad.items()) + f" of {span:.0f} s under load")
                           if bad else f"0 s of HW slowdown, HW thermal slowdown or power brake in {span:.0f} s",
                           g, sum(bad.values()), th.value, th.source,
                           ("the hardware slowed down: power brake means the PSU or its cables (check the 12V "
                            "connectors); HW thermal means cooling (fans, airflow); nvidia-smi -q -d PERFORMANCE")
                           if bad else ""))
        sw = s.seconds_in("sw_thermal_slowdown", loaded) / span
        th = THRESHOLDS["sw_thermal_share"]
        out.append(Verdict("burnin.thermal.sw_slowdown", "fail" if sw >= th.value else "pass",
                           f"SW thermal slowdown {sw * 100:.1f} % of the time under load", g, round(sw, 4), th.value,
                           th.source, "the cooling does not keep up: check the fans (a stalled fan reads as asked), "
                           "airflow and the fan curve" if sw >= th.value else ""))
        i = infos.get(g)
        busy = [p for p in loaded if p.utilization]
        if i is not None and busy:
            gens = [p.pcie_gen for p in busy if p.pcie_gen is not None]
            widths = [p.pcie_width for p in busy if p.pcie_width is not None]
            gen, width = (min(gens) if gens else None), (min(widths) if widths else None)
            short = ((gen is not None and i.pcie_max_generation is not None and gen < i.pcie_max_generation)
                     or (width is not None and i.pcie_max_width is not None and width < i.pcie_max_width))
            out.append(Verdict("burnin.pcie.link_under_load", "fail" if short else "pass",
                               f"Gen{gen} x{width} under load (its maximum Gen{i.pcie_max_generation} "
                               f"x{i.pcie_max_width})", g, float(width or 0), float(i.pcie_max_width or 0),
                               THRESHOLDS["link"].source,
                               "reseat the GPU or its riser, try another slot; lspci -vv shows LnkSta"
                               if short else ""))
        clocks = [p.sm_mhz for p in loaded if p.sm_mhz and p.utilization]  # not while the load starts
        if clocks:
            sustained[g] = statistics.fmean(clocks)
        at_cap = [p.limit_w for p in busy if p.limit_w and "sw_power_cap" in p.reasons]
        if busy and len(at_cap) >= len(busy) / 2:  # the SW power cap held it most of the time: at this limit
            capped_at[g] = statistics.median(at_cap)
        out += targeted_power(g, s.of("power")[10:], res.limits.get(g, {}))
        out += load_steps(g, s.points)
        soak = s.of("soak")
        if len(soak) >= 10:
            out += thermal(g, soak, res.limits.get(g, {}))
            curve = curve_of(res.fan_curves.get(g))
            held, promise = hold(g, soak, res.limits.get(g, {}), curve)
            out += held
            if promise is not None:
                res.limits.setdefault(g, {})["curve_promise_c"] = round(promise, 1)
    out += _spread(res, "burnin.performance.spread", sustained, "MHz sustained SM clock",
                   "slower than its siblings under the same load: check its throttle reasons, power limit and cooling",
                   capped_at)
    return out


def _errors(res: Result, infos: dict[int, GpuInfo], before: dict[str, Any], after: dict[str, Any]) -> list[Verdict]:
    """New errors during the run, from what could be read: Xids, ECC, PCIe replays (DCGM's rate), NVLink
    errors (DCGM's limits); the state at the end: retired pages (DCGM's limits), remapped rows. A source
    that could not be read is "not judged" (what gpud needs), never "no errors"."""
    out: list[Verdict] = []
    th = THRESHOLDS["new_errors"]
    buses = {g: (infos[g].pci_bus_id if g in infos else "") for g in res.gpus}
    old = set(before.get("xids") or [])
    new_xids = [x for x in (after.get("xids") or []) if x not in old]
    minutes = max(1e-9, (float(after.get("at", 0.0)) - float(before.get("at", 0.0))) / 60.0)
    unread_log = before.get("xids_unread") or after.get("xids_unread")
    for g in res.gpus:
        found, warned, read, unread = [], [], [], []

        def delta(kind: str, g: int = g) -> Any:
            b, a = before.get(kind, {}).get(g), after.get(kind, {}).get(g)
            return None if a is None or b is None else (b, a)

        ecc = delta("ecc")
        if ecc is None:
            unread.append(("ecc", "no ECC error counters (ECC off or not supported: NVML gives none)",
                           "ECC on (nvidia-smi -e 1, then a reboot) where the GPU has it"))
        else:
            read.append("ECC")
            if ecc[1] > ecc[0]:
                found.append(f"{ecc[1] - ecc[0]} new ECC errors")
        rep = delta("replay")
        if rep is None:
            unread.append(("pcie_replay", "no PCIe replay counter", "a driver whose NVML gives the replay counter"))
        else:
            read.append("PCIe replays")
            n, limit = rep[1] - rep[0], THRESHOLDS["pcie_replay_rate"]
            if n > 0 and n / minutes > limit.value:
                found.append(f"{n} new PCIe replays ({n / minutes:.1f} a minute, above DCGM's {limit.value:g})")
            elif n > 0:
                warned.append(f"{n} new PCIe replays ({n / minutes:.1f} a minute)")
        links = delta("nvlink")
        if links is None and g in infos and infos[g].nvlink_count:
            unread.append(("nvlink", f"no NVLink error counters for its {infos[g].nvlink_count} links",
                           "a driver whose NVML gives nvmlDeviceGetNvLinkErrorCounter"))
        if links is not None:
            read.append("NVLink errors")
            seconds = minutes * 60.0
            for key, a in sorted(links[1].items()):
                n = a - links[0].get(key, a)
                link, counter = key
                if n <= 0:
                    continue
                if counter.startswith("crc"):
                    rate, lim = n / seconds, THRESHOLDS["nvlink_crc_rate"]
                    (found if rate > lim.value else warned).append(f"NVLink {link} {counter}: {n} ({rate:.1f}/s)")
                else:  # replay, recovery
                    found.append(f"NVLink {link} {counter}: {n} new")
        aer = delta("aer")
        if aer is None:
            unread.append(("aer", "no PCIe AER counters in sysfs (aer_dev_*: no AER capability, or a kernel "
                           "without CONFIG_PCIEAER)", "a kernel with AER (CONFIG_PCIEAER) and the GPU's "
                           "/sys/bus/pci/devices/*/aer_dev_* readable"))
        else:
            read.append("PCIe AER")
            grew = {k: aer[1].get(k, 0) - aer[0].get(k, 0) for k in ("correctable", "nonfatal", "fatal")}
            if grew["fatal"] > 0 or grew["nonfatal"] > 0:
                found.append(f"PCIe AER: {grew['fatal']} fatal, {grew['nonfatal']} non-fatal uncorrectable errors")
            elif grew["correctable"] > 0:  # the link corrected them (replays): as the replay counter, a warning
                warned.append(f"PCIe AER: {grew['correctable']} correctable errors")
        bus = buses[g].lower()
        if unread_log is None:
            read.append("Xids")
            xids = [x for x in new_xids if bus and str(x[0]).lower() == bus]
            if xids:
                found.append("Xid " + ", ".join(str(x[1]) for x in xids))
        status: Status = "fail" if found else "warn" if warned else "pass"
        if read:
            text = "; ".join(found + warned) if found or warned else f"no new error ({', '.join(read)} read)"
            out.append(Verdict("burnin.errors", status, text, g, float(len(found)), th.value,
                               th.source + "; " + THRESHOLDS["pcie_replay_rate"].source,
                               "gpud events --dossier; nvidia-smi -q -d ECC; dmesg | grep Xid" if found else ""))
        else:
            out.append(not_judged("burnin.errors", g, "no error source could be read", "see burnin.errors.*",
                                  th.source))
        for what, why, needs in unread:
            out.append(not_judged(f"burnin.errors.{what}", g, why, needs, th.source))
        if unread_log is not None:
            out.append(Verdict("burnin.errors.xid", "skip", str(unread_log[0]), g, source=th.source,
                               remedy=str(unread_log[1])))
        out += _memory_health(g, after)
    return out


def _memory_health(g: int, after: dict[str, Any]) -> list[Verdict]:
    """Retired pages (GPUs before Ampere) and remapped rows (Ampere on) at the end of the run."""
    out: list[Verdict] = []
    pages, rows = after.get("retired", {}).get(g), after.get("remapped", {}).get(g)
    if pages is not None:
        n, pending = pages
        hard, soft = THRESHOLDS["retired_pages"], THRESHOLDS["retired_pages_soft"]
        status: Status = "fail" if n >= hard.value or pending else "warn" if n >= soft.value else "pass"
        out.append(Verdict("burnin.memory.retired_pages", status, f"{n} retired pages"
                           + ("; a retirement pending (applied at the next reset)" if pending else ""), g, float(n),
                           hard.value, hard.source, "" if status == "pass" else
                           "reset the GPU (nvidia-smi -r) to retire the pending pages; replace it at DCGM's limit"))
    if rows is not None:
        corr, uncorr, pending, failure = rows
        status = "fail" if failure else "warn" if pending else "pass"
        out.append(Verdict("burnin.memory.remapped_rows", status,
                           f"{corr or 0} correctable and {uncorr or 0} uncorrectable rows remapped"
                           + ("; a remap pending (applied at the next reset)" if pending else "")
                           + ("; a remap failed (no spare row left)" if failure else ""), g,
                           float(bool(failure)), 0.0, THRESHOLDS["remapped_rows"].source,
                           "" if status == "pass" else "a failed remap: replace the GPU" if failure else
                           "reset the GPU (nvidia-smi -r) to apply the pending remap"))
    if pages is None and rows is None:
        out.append(not_judged("burnin.memory.retired_pages", g, "neither retired pages nor remapped rows readable",
                              "a GPU and driver that report them (nvidia-smi -q -d PAGE_RETIREMENT,ROW_REMAPPER)",
                              THRESHOLDS["retired_pages"].source))
    return out


def _checked(res: Result) -> list[Verdict]:
    """The load's checked products (every load phase): each against the GPU's first product of the same
    inputs bit for bit, the first product's rows against the host's float64 product, and the products'
    checksums against the siblings' of the same model at each reading."""
    out: list[Verdict] = []
    th = THRESHOLDS["checked"]
    cpu = not res.results_are_the_gpus
    why_cpu = ("the load ran on the host's CPU (--device cpu): its results say nothing of the GPU",
               "run on the GPUs: gpud burnin --device cuda")
    for g in res.gpus:
        s = res.series.get(g)
        checks = s.checks if s else []
        if not checks:
            why = (s.check_error if s and s.check_error else "no load phase ran") if s else "no load phase ran"
            out.append(not_judged("burnin.gemm.load", g, f"no checked product under load ({why})",
                                  "gpud burnin --debug; the driver and dmesg for Xids", th.source))
            continue
        products = sum(c.products for c in checks)
        temps = [c.temperature_c for c in checks if c.temperature_c is not None]
        hottest = max(temps) if temps else None
        bad = [c for c in checks if c.wrong]
        upto = f"results checked only up to {hottest} °C" if hottest is not None else "temperatures unknown"
        if bad:
            first = bad[0]
            clean = [c.temperature_c for c in checks if c.t < first.t and c.temperature_c is not None]
            wrong = sum(c.wrong for c in bad)
            per_min: Counter[int] = Counter()
            for c in bad:
                per_min[int(c.t // 60)] += c.wrong
            by: Counter[str] = Counter()
            for c in bad:
                by.update(c.by_dtype or {})
            kinds = ", ".join(f"{d} {n}" for d, n in by.items() if n)
            text = (f"{wrong} of {products} products differed from its first bit for bit"
                    + (f" ({kinds})" if kinds else "") + ", the first at "
                    f"{first.temperature_c} °C ({first.phase}, {first.t:.0f} s in)"
                    + (f"; right up to {max(clean)} °C before" if clean else "")
                    + f"; wrong in {len(per_min)} minute(s), at most {max(per_min.values())} a minute")
            out.append(Verdict("burnin.gemm.load", "fail", text, g, float(wrong), th.value, th.source,
                               f"the GPU computes wrong results from {first.temperature_c} °C on: check its "
                               "cooling (fans, airflow, paste), reseat it and replace it if it persists"))
        elif cpu:
            out.append(not_judged("burnin.gemm.load", g, f"{products} products checked, {why_cpu[0]}",
                                  why_cpu[1], th.source))
        else:
            kinds = "fp32, tf32 and bf16 " if any(c.by_dtype for c in checks) else ""
            out.append(Verdict("burnin.gemm.load", "pass", f"{products} {kinds}products under load the same bits as "
                               f"its first of their dtype; {upto}", g, 0.0, th.value, th.source))
        ref = s.reference if s else None
        if ref is not None and not ref.get("ok", True):
            out.append(Verdict("burnin.gemm.load.reference", "fail",
                               f"its first product's {ref.get('rows')} leading rows off the host's float64 product "
                               f"by {float(ref.get('worst_share_of_bound', 0)):.3g}× Higham's bound", g,
                               float(ref.get("worst_share_of_bound", 0)), 1.0, THRESHOLDS["load.reference"].source,
                               "the GPU computes wrong results: replace it"))
    out += _sibling_checksums(res, cpu, why_cpu)
    return out


def _sibling_checksums(res: Result, cpu: bool, why_cpu: tuple[str, str]) -> list[Verdict]:
    """At each reading, the checksums of the last products of a model's GPUs (the same inputs) against their
    majority: a GPU that disagrees computed something else, also one wrong from its first product on."""
    out: list[Verdict] = []
    th = THRESHOLDS["gemm.digest"]
    for model, members in _groups(res).items():
        have = [g for g in members if res.series.get(g) and res.series[g].checks]
        if len(have) < 2:
            for g in have:
                out.append(not_judged("burnin.gemm.load.siblings", g, f"no other {model} to compare its products "
                                      "with", "burn in two or more GPUs of one model together (all GPUs: no --gpus)",
                                      th.source))
            continue
        by_t: dict[tuple[float, int | None], dict[int, int | None]] = {}  # (reading, matrix size) → checksums
        for g in have:
            for c in res.series[g].checks:
                by_t.setdefault((round(c.t, 3), c.n), {})[g] = c.checksum
                by_t.setdefault((-1.0, c.n), {})[g] = c.first
        differs: Counter[int] = Counter()
        compared = 0
        for sums in by_t.values():
            vals = [v for v in sums.values() if v is not None]
            if len(vals) < 2:
                continue
            common, n = Counter(vals).most_common(1)[0]
            if n <= len(vals) / 2:
                continue  # no majority: which one is right is not known from these
            compared += 1
            for g, v in sums.items():
                if v is not None and v != common:
                    differs[g] += 1
        for g in have:
            if differs[g]:
                out.append(Verdict("burnin.gemm.load.siblings", "fail",
                                   f"its products differed from its siblings' (the same inputs) at {differs[g]} of "
                                   f"{compared} comparisons", g, float(differs[g]), th.value, th.source,
                                   "the GPU computes wrong results: reseat it, check its cooling, replace it if it "
                                   "persists"))
            elif cpu:
                out.append(not_judged("burnin.gemm.load.siblings", g, why_cpu[0], why_cpu[1], th.source))
            else:
                out.append(Verdict("burnin.gemm.load.siblings", "pass", f"the same products as its {len(have) - 1} "
                                   f"sibling(s) at {compared} comparisons", g, 0.0, th.value, th.source))
    return out


def _violations(res: Result, before: dict[str, Any], after: dict[str, Any]) -> list[Verdict]:
    """NVML's violation counters (nanoseconds in each clock-event reason, counted by the driver) over the run,
    where the GPU keeps them: HW thermal slowdown or power brake between two readings (a long soak reads every
    12 s) is counted there. Nothing where the GPU keeps none: the readings' verdict stands alone."""
    out: list[Verdict] = []
    th = THRESHOLDS["hw_slowdown_s"]
    for g in res.gpus:
        a, b = (before.get("violations") or {}).get(g), (after.get("violations") or {}).get(g)
        if not a or not b:
            continue
        hw = {r: (int(b[r]) - int(a[r])) / 1e9 for r in HW_REASONS if r in a and r in b}
        if not hw:
            continue
        bad = {r: v for r, v in hw.items() if v > 0}
        span = float(after.get("at", 0.0)) - float(before.get("at", 0.0))
        out.append(Verdict("burnin.clocks.hw_slowdown.counters", "fail" if bad else "pass",
                           ("NVML's violation counters: " + "; ".join(f"{r} {v:.1f} s" for r, v in bad.items())
                            + f" in the run's {span:.0f} s (every nanosecond counted, between readings too)") if bad
                           else f"NVML's violation counters: 0 s of {' or '.join(hw)} in the run's {span:.0f} s",
                           g, round(sum(bad.values()), 3), th.value,
                           th.source + "; NVML's violation counters (field values 251-253/269-271)",
                           ("the hardware slowed down: power brake means the PSU or its cables (check the 12V "
                            "connectors); HW thermal means cooling (fans, airflow); nvidia-smi -q -d PERFORMANCE")
                           if bad else ""))
    return out


def judge(res: Result, infos: dict[int, GpuInfo], before: dict[str, Any], after: dict[str, Any]) -> list[Verdict]:
    return (_workload(res, infos) + _checked(res) + _telemetry(res, infos) + _errors(res, infos, before, after)
            + _violations(res, before, after))
