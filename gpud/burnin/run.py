"""The burn-in: doctor's checks, the kernels' figures per GPU, then the load held with telemetry
every second (targeted power, load steps, the soak), judged per GPU and against its siblings.

It composes the parts below it and touches no hardware of its own: readings through the NVML layer
(``Machine``), kernels through the probe's children (``gpud.probe.stress_run``), time and load
through a ``Bench`` (``gpud.backends.open_bench``). Whatever happens, Ctrl-C included, the load is
released and the GPUs are put back as they were (``Bench.release``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from gpud.burnin.judge import judge
from gpud.burnin.plan import Level, next_share, plan_for
from gpud.burnin.progress import ProgressLog
from gpud.burnin.result import Result, Verdict
from gpud.burnin.telemetry import Check, Series, point
from gpud.config import Config
from gpud.doctor import diagnose
from gpud.doctor.xid import unreadable_summary
from gpud.errors import GpudError
from gpud.hw.host import KernelLogUnreadable
from gpud.hw.machine import Machine
from gpud.model import Snapshot

# through their modules: tests stand in for the probe (it needs a GPU) and for the memory test's child
from gpud.probe import runner, stress_run
from gpud.probe.diagnose import BUS_WARN
from gpud.probe.errors import ProbeError
from gpud.probe.monitor import cpu_affinity
from gpud.profiles import state as tuning_state
from gpud.profiles.fancurve import Curve, policy_of

Progress = Callable[[str, float], None]  # what runs now, seconds of the GPUs' time left (estimated)

# Sizes of the measured kernels: a GPU gets work large enough to reach its peak; the CPU standing in
# for one (simulated workstations, --device cpu) small sizes, so its figures take seconds.
SIZES: dict[str, dict[str, float]] = {"cuda": {"gemm_n": 8192, "copy_mib": 1024, "memtest_share": 0.85},
                                      "cpu": {"gemm_n": 256, "copy_mib": 16, "memtest_mib": 1}}


class Bench(Protocol):
    simulated_time: bool
    # Whether the kernels' results are the GPUs' own: on GPUs (``cuda``), and on a simulated workstation,
    # whose stand-in computes what the simulated GPU does (its faults reach it); not on the host's CPU.
    results_are_the_gpus: bool
    check_every_s: float  # how often the load's checks are collected (seconds of the GPUs' time)

    def check_period(self, reading_s: float) -> float: ...

    def check(self, gpus: list[int], tag: Any = None) -> list[tuple[Any, dict[int, dict[str, Any]]]]: ...

    def size(self, gpu: int, share: float) -> None: ...

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...

    def load(self, gpus: list[int], busy: bool, seconds: float) -> None: ...

    def release(self) -> None: ...

    def device_faults(self, gpu: int) -> list[str]: ...

    def memtest_wall(self, seconds: float, fade_s: float) -> tuple[float, float]: ...


def _workload(machine: Machine, bench: Bench, snap: Snapshot, gpus: list[int], device: str,
              seconds: float) -> dict[int, dict[str, Any]]:
    specs = _specs(machine, bench, snap, gpus, device, ["gemm", "device_bandwidth", "host_bandwidth"],
                   {"seconds": seconds})
    return stress_run.run_children(specs, 300.0)


def _specs(machine: Machine, bench: Bench, snap: Snapshot, gpus: list[int], device: str, tasks: list[str],
           extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The children's specs: on ``cuda`` one a GPU (its CPUs on the GPU's NUMA node, only its GPU visible, the
    memory test over a share of its free memory), on the CPU one for every stand-in."""

    size = SIZES[device]
    faults = {str(g): f for g in gpus for f in [bench.device_faults(g)] if f}
    base: dict[str, Any] = {"device": device, "tasks": tasks, "faults": faults, **extra,
                            **{k: v for k, v in size.items() if k != "memtest_share"}}
    if device != "cuda":
        return [{**base, "gpus": gpus}]
    specs = []
    for g, cpus in zip(gpus, cpu_affinity(machine, gpus) or [[] for _ in gpus], strict=True):
        free = (snap.samples[g].memory_total_bytes or 0) - (snap.samples[g].memory_used_bytes or 0)
        uuid = snap.samples[g].uuid or None
        specs.append({**base, "gpus": [g], "cpus": cpus or None, "cuda_index": 0, "env": stress_run.gpu_env(uuid),
                      # cpus: host memory on the GPU's own NUMA node; env: the child sees its GPU only
                      "memtest_mib": max(64, int(free * float(size["memtest_share"]) / 2**20))})
    return specs


def _probe(machine: Machine, gpus: list[int], allow_busy: bool) -> list[Verdict]:
    """The probe's P2P and all-reduce on the GPUs, judged against what each path should carry
    (gpud.probe.diagnose and its expected bandwidths, docs/probe.md)."""

    source = "the probe's expected bandwidth for the path (gpud.probe.expect, docs/probe.md)"
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    uuids = [u for g in gpus for i in [machine.info(g)] if i is not None for u in [i.uuid]]
    try:
        if len(uuids) == len(gpus):  # the ranks run on the GPUs under test (the probe maps them by UUID)
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
        rep = runner.run_probe(device="cuda", gpus=len(gpus), suites=["allreduce", "p2p"], quick=True, machine=machine,
                        host=machine.label, keep_history=False, allow_busy=allow_busy)
    except ProbeError as err:
        return [Verdict("burnin.probe", "fail", f"the probe did not run: {str(err).splitlines()[0]}",
                        source=source, remedy="gpud probe --debug")]
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    out: list[Verdict] = []
    diag = rep.diagnosis
    for ws, v in (diag.verdicts.items() if diag else []):
        status = {"pass": "pass", "warn": "warn", "fail": "fail"}.get(v, "skip")
        out.append(Verdict("burnin.probe.allreduce", status,  # type: ignore[arg-type]
                           f"{ws} GPUs: " + (" ".join(diag.sentences) if diag.sentences else v), source=source))
    for link in diag.links if diag else []:
        status = "fail" if link.ratio < BUS_WARN else "pass"
        out.append(Verdict("burnin.probe.p2p", status,  # type: ignore[arg-type]
                           f"GPU{link.src}→GPU{link.dst}: {link.measured_bytes_per_second / 1e9:.1f} GB/s, "
                           f"{link.ratio:.0%} of what {link.link} should give", link.src, round(link.ratio, 3),
                           BUS_WARN, source, "gpud topo; gpud doctor (pcie.*, nvlink.*)" if status == "fail" else ""))
    return out


def _health(machine: Machine, gpus: list[int], at: float) -> dict[str, Any]:
    """The error counters per GPU (ECC, PCIe replays, NVLink errors, retired pages, remapped rows; None
    where NVML gives none) and the Xids in the kernel log (None and why, where none can be read), read
    afresh: compared at the end. ``at``: the GPUs' time of the reading (rates per minute and second)."""
    out: dict[str, Any] = {"at": at, "ecc": {}, "replay": {}, "nvlink": {}, "retired": {}, "remapped": {},
                           "aer": {}, "violations": {}, "xids": None, "xids_unread": None}
    for g in gpus:
        s = machine.nvml.fresh_sample(g)
        info = machine.info(g)
        out["aer"][g] = machine.host.aer_counts(info.pci_bus_id) if info is not None and info.pci_bus_id else None
        e = s.ecc_errors
        out["ecc"][g] = None if e is None or e.volatile_corrected is None and e.volatile_uncorrected is None else \
            (e.volatile_corrected or 0) + (e.volatile_uncorrected or 0)
        out["replay"][g] = s.pcie_replay_errors
        out["violations"][g] = dict(s.clock_event_nanoseconds) if s.clock_event_nanoseconds else None
        out["nvlink"][g] = None if s.nvlink_errors is None else {(link, c): n for link, c, n in s.nvlink_errors}
        pages = (s.retired_pages_single_bit, s.retired_pages_double_bit)
        out["retired"][g] = None if pages == (None, None) else (sum(p or 0 for p in pages), s.retired_pages_pending)
        rows = (s.remapped_rows_correctable, s.remapped_rows_uncorrectable)
        out["remapped"][g] = None if rows == (None, None) else (*rows, s.remapped_rows_pending,
                                                                 s.remapped_rows_failure)
    try:

        xids = machine.host.read_xids()
        if isinstance(xids, KernelLogUnreadable):

            out["xids_unread"] = unreadable_summary(xids.tried, os.geteuid() == 0)  # (summary, what gpud needs)
        else:
            out["xids"] = [(x.pci_bus_id, x.xid, x.raw or x.text) for x in xids]
    except OSError as err:
        out["xids_unread"] = (f"not judged: the kernel log could not be read ({err})", "a readable /dev/kmsg")
    return out


def run_burnin(machine: Machine, bench: Bench, config: Config, *, level: Level, gpus: list[int] | None,
               device: str, duration_s: float | None = None, allow_busy: bool = False,
               progress: Progress | None = None, fan_curves: dict[int, dict[str, Any]] | None = None,
               target_power_w: float | None = None, log: ProgressLog | None = None,
               memtest_s: float | None = None) -> Result:
    """``fan_curves``: each GPU's fan setting to hold it to (a profile's ``fan`` table, ``mode = "curve"``);
    by default the applied profile's, from the tuning state (the daemon drives them). ``target_power_w``:
    targeted power's target (default each GPU's enforced limit). ``log``: the result file written as the run
    goes (``gpud.burnin.progress``): every reading, and the verdicts so far every 10 minutes. ``memtest_s``: the
    memory test's time (default DCGM memtest's 600 s; standard and soak)."""
    plan = plan_for(level, duration_s, memtest_s)
    wall0 = time.monotonic()
    snap = machine.snapshot()
    chosen = list(range(len(snap.samples))) if gpus is None else gpus
    infos = {i.index: i for i in snap.gpus}
    res = Result(machine.label, level, device, chosen, {g: infos[g].name for g in chosen if g in infos}, time.time(),
                 simulated_time=bench.simulated_time, results_are_the_gpus=bench.results_are_the_gpus)
    res.uuids = {g: infos[g].uuid for g in chosen if g in infos}
    for g in chosen:
        i = infos.get(g)
        res.limits[g] = {"max_operating_c": i.temperature_max_operating_celsius if i else None,
                         "slowdown_c": i.temperature_slowdown_celsius if i else None,
                         "power_limit_w": snap.samples[g].power_limit_watts,
                         "target_c": i.temperature_target_celsius if i else None,
                         "power_max_w": i.power_max_limit_watts if i else None,
                         "target_power_w": target_power_w}
    curves = _applied_curves() if fan_curves is None else fan_curves
    res.fan_curves = {g: dict(f) for g, f in curves.items() if g in chosen and _is_curve(f)}
    say: Progress = progress or (lambda what, left: None)

    # 1. Doctor's checks, and GPUs other work is using.
    say("doctor's checks", _total(plan))

    report = diagnose(machine, config, snapshot=snap)
    for c in report.checks:
        if c.status in ("fail", "warn") and (c.gpu is None or c.gpu in chosen):
            res.verdicts.append(Verdict(f"doctor.{c.id}", c.status, c.summary, c.gpu, source="gpud doctor",
                                        remedy=c.remedy or ""))
    busy = [g for g in chosen if snap.samples[g].processes]
    for g in busy:
        procs = ", ".join(f"{p.pid} ({p.command or '?'})" for p in snap.samples[g].processes or ())
        res.verdicts.append(Verdict("burnin.idle", "warn" if allow_busy else "fail",
                                    f"in use by {procs}: its figures are not the GPU's alone", g,
                                    source="a burn-in needs the GPU to itself (DCGM refuses busy GPUs too)",
                                    remedy="stop the processes (gpud ps)" + ("" if allow_busy else
                                                                             ", or pass --allow-busy")))
    if busy and not allow_busy:
        res.wall_seconds = time.monotonic() - wall0
        return res

    if not bench.results_are_the_gpus:
        res.verdicts.append(Verdict("burnin.device", "skip", "not judged: a rehearsal on the host's CPU (--device cpu "
                                    "--rehearsal on a machine whose GPUs work): the GPUs' own results, memory and "
                                    "speed are not judged; the telemetry verdicts are", source="--rehearsal",
                                    remedy="gpud burnin --device cuda"))
    before = _health(machine, chosen, bench.now())
    series = {g: Series(g) for g in chosen}
    res.series = series
    t0 = bench.now()
    done = 0.0

    share = {g: 1.0 for g in chosen}

    def steer(g: int, p: Any) -> None:
        """Targeted power: size the GPU's load until its draw meets the target (``plan.next_share``)."""
        lim = res.limits[g]
        target = lim.get("target_power_w") or p.limit_w
        if not target:
            return
        new = next_share(share[g], p.power_w, float(target), lim.get("power_max_w"))
        p.load_share = round(new, 4)
        if abs(new - share[g]) > 1e-6:
            share[g] = new
            bench.size(g, new)

    def hold(phase: str, seconds: float, busy_now: bool, every: float = 1.0) -> None:
        nonlocal done
        bench.load(chosen, busy_now, seconds)
        end = done + seconds
        last = done
        while done < end - 1e-9:
            step = min(every, end - done)
            bench.sleep(step)
            done += step
            t = bench.now() - t0
            due = done - last >= bench.check_period(every) - 1e-9 or done >= end - 1e-9
            answered = bench.check(chosen, (t, phase)) if busy_now and due else []
            last = done if due else last
            temps: dict[int, int | None] = {}
            for g in chosen:
                p = point(t, phase, machine.nvml.telemetry(g))
                series[g].points.append(p)
                temps[g] = p.temperature_c
                if phase == "power":
                    steer(g, p)
            if busy_now and due:
                asked[(t, phase)] = temps
            new = collect(answered)
            if log is not None:
                log.reading({g: series[g].points[-1] for g in chosen}, new)
                if log.due(done):
                    res.seconds = done
                    log.so_far(res, res.verdicts + judge(res, infos, before, _health(machine, chosen, bench.now())),
                               done)
            if int(done) % 10 < every:
                say(phase, max(0.0, _total(plan) - done))
        new = collect(bench.check(chosen, None))  # the phase's last step
        if log is not None and new:
            log.reading({}, new)
        asked.clear()

    asked: dict[tuple[float, str], dict[int, int | None]] = {}  # each check's time and phase → temperatures

    def collect(answered: list[tuple[Any, dict[int, dict[str, Any]]]]) -> list[tuple[int, Check]]:
        """File each answered check under the reading it was asked at (its time, phase and temperature)."""
        out: list[tuple[int, Check]] = []
        for tag, got in answered:
            t, phase = tag if tag is not None else (bench.now() - t0, "?")
            temps = asked.pop(tag, {}) if tag is not None else {}
            for g, c in got.items():
                if g not in series:
                    continue
                if "error" in c:
                    series[g].check_error = str(c["error"])
                    continue
                series[g].checks.append(Check(t, phase, temps.get(g), int(c["iterations"]), int(c["wrong"]),
                                              int(c["words"]), c.get("checksum"), c.get("first"), c.get("n"),
                                              c.get("by_dtype")))
                out.append((g, series[g].checks[-1]))
                if series[g].reference is None and c.get("reference"):
                    series[g].reference = dict(c["reference"])
        return out

    def memtest(seconds: float, fade_s: float) -> None:
        """The memory test in children while telemetry is read each second (its own phase); on a simulated
        workstation its time is simulated and the stand-in runs one pass (``Bench.memtest_wall``)."""

        wall, fade = bench.memtest_wall(seconds, fade_s)
        kids = stress_run.Children(_specs(machine, bench, snap, chosen, device, ["memtest"],
                               {"memtest_seconds": wall, "memtest_fade_s": fade, "memtest_seed": int(time.time())}))
        try:
            hold("memtest", seconds, False)
            # A pass begun before the time was up runs to its end: an hour's margin on the largest memories.
            got = kids.collect(wall + 3600.0 if wall else 300.0)
        finally:
            kids.kill()
        for g, r in got.items():
            if g in res.workload and "memtest" in r:
                res.workload[g]["memtest"] = {**r["memtest"], "test_s": seconds}  # the GPUs' time it ran
            elif g in res.workload and "error" in r:
                res.workload[g]["memtest"] = {"error": r["error"]}
        if log is not None:
            log.memtest({g: w["memtest"] for g, w in res.workload.items() if "memtest" in w})

    try:
        say("GEMM, bandwidth", _total(plan))
        # On the CPU the kernels' speed is not judged (judge.py: CPU figures say nothing of the GPUs), only their
        # bits and the reference check: the fewest repetitions each measures (4 products, 3 copies), no timed run.
        res.workload = _workload(machine, bench, snap, chosen, device, plan.gemm_seconds if device == "cuda" else 0.0)
        if device == "cuda" and len(chosen) > 1:
            say("the probe's P2P and all-reduce", _total(plan))
            res.verdicts.extend(_probe(machine, chosen, allow_busy))
        elif len(chosen) > 1:
            res.verdicts.append(Verdict("burnin.probe", "skip", "not judged: the probe's P2P and all-reduce are "
                                        "judged on GPUs only (--device cuda): on the CPU they measure the host",
                                        source="gpud probe (docs/probe.md)", remedy="gpud burnin --device cuda"))
        if log is not None:
            log.start(res, _total(plan))
        if plan.memtest:
            memtest(plan.memtest_s, plan.memtest_fade_s)
        hold("load", plan.load_s, True)
        if plan.targeted_power_s:
            hold("power", plan.targeted_power_s, True)
            for g in chosen:  # the load steps and the soak run the largest load again
                if share[g] != 1.0:
                    share[g] = 1.0
                    bench.size(g, 1.0)
        for _ in range(plan.pulse_steps):
            hold("pulse_idle", plan.pulse_s, False)
            hold("pulse_full", plan.pulse_s, True)
        if plan.soak_s:
            hold("soak", plan.soak_s, True, plan.soak_sample_s)
    except KeyboardInterrupt:
        res.interrupted = True
    finally:
        bench.load(chosen, False, 0.0)
        bench.release()
    res.seconds = done
    after = _health(machine, chosen, bench.now())
    res.verdicts.extend(judge(res, infos, before, after))
    res.wall_seconds = time.monotonic() - wall0
    if log is not None:
        log.end(res)
    return res


def _applied_curves() -> dict[int, dict[str, Any]]:
    """The fan curves of the applied profile (the tuning state); none where no profile is applied or its
    state cannot be read (``gpud verify`` reports that)."""

    try:
        desired = tuning_state.profile_settings(tuning_state.load())
    except (GpudError, OSError):
        return {}
    return {g: s["fan"] for g, s in desired.items() if _is_curve(s.get("fan"))}


def _is_curve(fan: Any) -> bool:
    """Whether a fan setting is a curve (``mode = "curve"``): a fixed duty promises no temperature."""
    return isinstance(policy_of(fan), Curve)


def _total(plan: Any) -> float:
    return float(plan.load_s + plan.memtest_s + plan.targeted_power_s + 2 * plan.pulse_steps * plan.pulse_s
                 + plan.soak_s)
