"""Per-GPU configuration and health: persistence, power limit, compute mode, ECC, Xids, clock
events, temperature, fans (``gpud.doctor.fans``), PCIe replays, processes."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from gpud.doctor import fans
from gpud.doctor.registry import Context, Reporter, check
from gpud.doctor.xid import describe, escalated, unreadable_summary
from gpud.hw.host import KernelLogUnreadable
from gpud.model import CheckResult, GpuSample, MigInstance, slow_open
from gpud.text import plural

HW_EVENTS = {"hw_slowdown": "HW slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
             "hw_power_brake_slowdown": "HW power brake"}


@check("config.persistence_mode", "Configuration")
def persistence(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    for s in ctx.samples:
        if s.persistence_mode is None:
            yield r.skip("persistence mode not reported", gpu=s.index)
        elif s.persistence_mode:
            yield r.ok("persistence mode on", gpu=s.index)
        else:
            slow = slow_open(ctx.infos.get(s.index))
            yield r.warn("persistence mode off: the driver unloads between jobs "
                         "(slow start, settings lost)" + (f"; {slow}" if slow else ""), gpu=s.index,
                         remedy="`sudo systemctl enable --now nvidia-persistenced` (or `sudo nvidia-smi -pm 1`, "
                                "or a gpud profile); confirm with "
                                "`nvidia-smi --query-gpu=persistence_mode --format=csv`")


@check("config.power_limit", "Configuration")
def power_limit(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    for s in ctx.samples:
        g = ctx.infos[s.index]
        limit = s.power_management_limit_watts or s.power_limit_watts
        default = g.power_default_limit_watts
        if limit is None or default is None:
            yield r.skip("power limit not reported", gpu=s.index)
            continue
        asked = ctx.profile_settings.get(s.index, {}).get("power_limit_watts")
        if limit < default - 1 and (asked is None or abs(asked - limit) > 1):
            yield r.warn(f"power limit {limit:.0f} W, below the default {default:.0f} W, and no "
                         "active gpud profile asks for it", gpu=s.index,
                         remedy=f"`sudo nvidia-smi -i {s.index} -pl {default:.0f}` (or apply a gpud profile); "
                                "confirm with `nvidia-smi -q -d POWER`")
        elif s.power_limit_watts is not None and s.power_limit_watts < limit - 1:
            # not lowered by anyone: the limit set is the default (or asked for); something else holds it
            yield r.warn(f"enforced limit {s.power_limit_watts:.0f} W below the set "
                         f"{limit:.0f} W: another limiter holds it (a board or module power budget, an "
                         "out-of-band limit)", gpu=s.index,
                         remedy="compare Current/Enforced with Requested Power Limit and the Module Power Readings "
                                "in `nvidia-smi -q -d POWER`; on a GH200 the module's budget is shared with its CPU")
        else:
            note = " (asked by the active profile)" if asked is not None and limit < default - 1 else ""
            yield r.ok(f"power limit {limit:.0f} W (default {default:.0f} W){note}", gpu=s.index)


@check("config.mig_mode", "Configuration")
def mig_mode(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    """MIG partitions a GPU: CUDA sees its instances, not the GPU (NVIDIA's MIG user guide: one
    instance per CUDA process, no P2P over PCIe or NVLink between instances or GPUs). The finding
    lists the instances: which job can go where."""
    for s in ctx.samples:
        if s.mig_mode is None:
            continue  # a GPU without MIG: nothing to say
        if not s.mig_mode:
            yield r.ok("MIG disabled: the whole GPU", gpu=s.index)
            continue
        if s.mig_instances is None:
            listed = "its instances could not be read"
        elif not s.mig_instances:
            listed = "no instance created: no CUDA process can run on it"
        else:
            listed = f"{len(s.mig_instances)} instance(s): " + "; ".join(_instance(m) for m in s.mig_instances)
        yield r.warn(f"MIG enabled, {listed}. A job gets one instance (CUDA_VISIBLE_DEVICES="
                     "MIG-…), not the GPU; instances have no P2P (NVLink or PCIe) to each other or to other GPUs, "
                     "so DDP and pipeline jobs across them fall back to host copies", gpu=s.index,
                     detail="\n".join(f"{m.uuid}: {_instance(m)}" for m in s.mig_instances or ()),
                     remedy=f"list the instances with `nvidia-smi -L` and `nvidia-smi mig -lgi`; for whole-GPU "
                            f"training disable MIG: `sudo nvidia-smi -i {s.index} -mig 0` (the GPU must be idle; "
                            "then reset it)")


def _instance(m: MigInstance) -> str:
    """``3g.40gb GI 2/CI 0, 11.1 of 39.5 GiB used, 3 processes``."""
    ids = f"GI {'?' if m.gpu_instance_id is None else m.gpu_instance_id}/CI " + (
        "?" if m.compute_instance_id is None else str(m.compute_instance_id))
    mem = ("" if m.memory_total_bytes is None or m.memory_used_bytes is None
           else f", {m.memory_used_bytes / 2**30:.1f} of {m.memory_total_bytes / 2**30:.1f} GiB used")
    jobs = "processes unreadable" if m.processes is None else (
        f"{len(m.processes)} process(es)" if m.processes else "free")
    return f"{m.profile or 'MIG device'} {ids}{mem}, {jobs}"


@check("config.compute_mode", "Configuration")
def compute_mode(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    for s in ctx.samples:
        if s.compute_mode is None:
            yield r.skip("compute mode not reported", gpu=s.index)
        elif s.compute_mode != "default":
            yield r.warn(f"compute mode {s.compute_mode}: DDP and other multi-process jobs "
                         "may fail to open the GPU", gpu=s.index,
                         remedy=f"`sudo nvidia-smi -i {s.index} -c DEFAULT`")
        else:
            yield r.ok("compute mode Default", gpu=s.index)


@check("config.ecc", "Configuration")
def ecc_config(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    pending = [s.index for s in ctx.samples if s.ecc_enabled is not None and s.ecc_pending is not None
               and s.ecc_pending != s.ecc_enabled]
    if pending:
        yield r.warn(f"ECC mode change pending on GPU {', '.join(map(str, pending))}: applies at the "
                     "next reboot or GPU reset", remedy="reboot (or, with the GPU idle, "
                     + " and ".join(f"`sudo nvidia-smi -r -i {i}`" for i in pending) + ")")
    modes: dict[str, set[bool]] = {}
    for s in ctx.samples:
        if s.ecc_enabled is not None:
            modes.setdefault(ctx.infos[s.index].name, set()).add(s.ecc_enabled)
    mixed = [name for name, m in modes.items() if len(m) > 1]
    if mixed:
        yield r.warn(f"ECC on for some {mixed[0]} GPUs and off for others: memory and speed differ "
                     "between ranks", remedy="`sudo nvidia-smi -e 0|1` on all, then reboot")
    if not pending and not mixed:
        if not modes:
            yield r.skip("ECC not supported on these GPUs")
        else:
            state = {"on" if True in m else "off" for m in modes.values()}
            yield r.ok(f"ECC {'/'.join(sorted(state))} on all GPUs, nothing pending")


@check("health.xid", "Health", needs_nvml=False)
def xid(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    events = ctx.host.read_xids()
    if isinstance(events, KernelLogUnreadable):  # not read is not "no Xid": not judged, with what gpud needs
        summary, remedy = unreadable_summary(events.tried, os.geteuid() == 0)
        yield r.skip(summary, remedy=remedy)
        return
    if not events:
        yield r.ok("no Xid in the kernel log since boot")
        return
    bus = ctx.by_bus()
    by_gpu: dict[int | None, list[Any]] = {}
    for e in events:
        by_gpu.setdefault(bus.get(e.pci_bus_id), []).append(e)
    for gpu, evs in sorted(by_gpu.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        kinds = {describe(e.xid).kind for e in evs}
        worst = max(evs, key=lambda e: (describe(e.xid).kind == "hardware", e.seconds_since_boot or 0))
        info = ctx.infos.get(gpu) if gpu is not None else None
        d = escalated(worst.xid, ctx.xid_boots(info.uuid, worst.xid) if info is not None else 0)
        counts: dict[int, int] = {}
        for e in evs:
            counts[e.xid] = counts.get(e.xid, 0) + 1
        listed = ", ".join(f"Xid {x}" + (f" ×{n}" if n > 1 else "") for x, n in sorted(counts.items()))
        where = "" if gpu is not None else f" (PCI {worst.pci_bus_id}, not an NVML GPU)"
        boot = ctx.host.boot_time()
        detail = "\n".join(f"Xid {e.xid} at {_clock(boot, e.seconds_since_boot)}: {describe(e.xid).meaning}"
                           f" — {e.text}" for e in evs[-10:])
        make = r.fail if "hardware" in kinds else r.warn
        yield make(f"{listed} since boot{where}: {d.meaning}", gpu=gpu, detail=detail,
                   remedy=f"{d.action.replace('-i N', f'-i {gpu if gpu is not None else worst.pci_bus_id}')}; "
                          "read them with "
                          "`sudo dmesg -T | grep -i xid`")


def _clock(boot: float | None, since_boot: float | None) -> str:
    """A kernel-log time as a clock time (local), as ``dmesg -T`` shows it; seconds after boot without btime."""

    if since_boot is None:
        return "an unknown time"
    if boot is None:
        return f"{since_boot:.0f} s after boot"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(boot + since_boot))


# Xids that report an uncorrectable memory error (NVIDIA's Xid catalogue: 48 DBE, 63/64 row remapping, 94/95
# contained/uncontained ECC error).
ECC_XIDS = (48, 63, 64, 94, 95)


@check("health.ecc", "Health")
def ecc_health(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    read = ctx.host.xid_events()
    events = read or []
    sources = "since boot, lifetime, kernel log" if read is not None else \
        "since boot, lifetime; kernel log not readable, its ECC Xids not judged"
    bus = ctx.by_bus()
    for s in ctx.samples:
        problems = []
        history = ""  # a lifetime error the GPU has already repaired
        e = s.ecc_errors
        lifetime = (e.aggregate_uncorrected or 0) if e else 0
        if e and (e.volatile_uncorrected or 0) > 0:
            problems.append(f"{plural(e.volatile_uncorrected or 0, 'uncorrectable (double-bit) ECC error')} "
                            "since boot")
        elif lifetime and (s.remapped_rows_uncorrectable or 0) >= lifetime and s.remapped_rows_pending is False \
                and s.remapped_rows_failure is False:
            # NVIDIA's row-remapping guidance: an uncorrectable error remaps its row at the next reset; with
            # nothing pending and no remapping failure the memory is repaired (RMA only on a failure)
            history = (f"{plural(lifetime, 'uncorrectable ECC error')} in the GPU's lifetime, "
                       f"{plural(s.remapped_rows_uncorrectable or 0, 'row')} remapped for it; nothing pending, "
                       "no remapping failure")
        elif lifetime:
            problems.append(f"{plural(lifetime, 'uncorrectable (double-bit) ECC error')} "
                            "in the GPU's lifetime (aggregate count)")
        xids = sorted({x.xid for x in events if x.xid in ECC_XIDS and bus.get(x.pci_bus_id) == s.index})
        if xids:
            problems.append("kernel log: " + ", ".join(f"Xid {x}" for x in xids) + " (uncorrectable memory error)")
        retired = (s.retired_pages_single_bit or 0) + (s.retired_pages_double_bit or 0)
        if retired >= 63:
            problems.append(f"{retired} retired pages (limit 63)")
        if s.retired_pages_pending:
            problems.append("page retirement pending")
        if s.remapped_rows_failure:
            problems.append("row remapping failed")
        if s.remapped_rows_pending:
            problems.append("row remapping pending")
        known = [s.ecc_enabled, s.retired_pages_pending, s.remapped_rows_pending]
        if problems:
            yield r.fail("; ".join(problems), gpu=s.index,
                         remedy=f"drain the GPU and reset it (`sudo nvidia-smi -r -i {s.index}`) or reboot; a failed "
                                "remapping or retired pages at the limit mean RMA; confirm with "
                                f"`nvidia-smi -i {s.index} -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT`")
        elif history:
            yield r.warn(history, gpu=s.index,
                         remedy="repaired by row remapping: watch for more (`nvidia-smi -i "
                                f"{s.index} -q -d ECC,ROW_REMAPPER`: a pending remap needs a reset, a remapping "
                                "failure or an exhausted Bank Remap Availability Histogram means RMA)")
        elif all(k is None for k in known):
            yield r.skip("no ECC or memory-repair data on this GPU", gpu=s.index)
        else:
            ecc = {True: f"ECC on, no uncorrectable error ({sources})", False: "ECC off",
                   None: "ECC not reported"}[s.ecc_enabled]
            yield r.ok(f"{ecc}; nothing pending", gpu=s.index)


THROTTLE_SHARE_WARN = 0.10  # of the last hour, from the health journal's throttle episodes


@check("health.clock_events", "Health")
def clock_events(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    for s in ctx.samples:
        if s.clock_events is None:
            yield r.skip("clock events not reported", gpu=s.index)
            continue
        ev = set(s.clock_events)
        hw = [label for key, label in HW_EVENTS.items() if key in ev]
        if hw:
            remedy = ("the board is throttling: check cooling (fans, airflow, dust, health.thermal) and the power "
                      "cables and supply" + (" (power brake: the supply or a cable asserted it)"
                                             if "hw_power_brake_slowdown" in ev else "")
                      + f"; confirm with `nvidia-smi -i {s.index} -q -d PERFORMANCE`")
            yield r.fail(f"{', '.join(hw)} active: clocks cut", gpu=s.index, remedy=remedy)
        elif "sw_thermal_slowdown" in ev:
            yield r.warn("SW thermal slowdown active: the driver lowers clocks to stay cool",
                         gpu=s.index, remedy="improve cooling or a steeper fan curve (`gpud apply training`)")
        elif "sw_power_cap" in ev and ctx.loaded(s):
            yield r.ok("at its power limit under load (SW power cap): expected", gpu=s.index)
        elif "sw_power_cap" in ev and _far_below_limit(s):
            # idle GPUs list SW Power Cap with the draw a fraction of the limit (real dumps: A40, A10, A6000,
            # RTX 5090 at 8-30 % of it): the driver's power management at idle, not a limit holding it back
            yield r.ok(f"SW power cap listed at low load with the draw ({s.power_watts:.0f} W) "
                       f"far below the limit ({s.power_limit_watts:.0f} W): not a limit holding the GPU back",
                       gpu=s.index)
        elif "sw_power_cap" in ev:
            yield r.warn("SW power cap active at low load", gpu=s.index,
                         remedy="check the power limit (config.power_limit)")
        elif (share := ctx.throttled_share(s.uuid, s.timestamp)) >= THROTTLE_SHARE_WARN:
            yield r.warn(f"GPU{s.index} throttled {share:.0%} of the last hour (not now)",
                         gpu=s.index, remedy="try the `training` profile (`gpud apply training`: a steeper fan curve); "
                                             "`gpud events --kind throttle --gpu " f"{s.index}` lists the episodes")
        else:
            yield r.ok("no throttling" + (" (idle)" if "gpu_idle" in ev else ""), gpu=s.index)


def _far_below_limit(s: GpuSample) -> bool:
    """The draw is under half the enforced limit: the power cap cannot be what holds the clocks."""
    draw, limit = s.power_watts, s.power_limit_watts
    return draw is not None and limit is not None and draw < 0.5 * limit


@check("health.thermal", "Health")
def thermal(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    warn_margin = ctx.config.doctor.thermal_margin_warn_celsius
    fail_margin = ctx.config.doctor.thermal_margin_fail_celsius
    idle_max = ctx.config.doctor.idle_temperature_warn_celsius
    for s in ctx.samples:
        g = ctx.infos[s.index]
        t, slow = s.temperature_celsius, g.temperature_slowdown_celsius
        if t is None:
            yield r.skip("temperature not reported", gpu=s.index)
            continue
        remedy = ("improve airflow (clear intakes, dust, spacing between cards), check the fans (health.fans), or "
                  "apply a steeper fan curve; confirm with `nvidia-smi -q -d TEMPERATURE`")
        margin = slow - t if slow is not None else None
        if margin is not None and margin < fail_margin:
            yield r.fail(f"{t} °C, {margin} °C below slowdown ({slow} °C)", gpu=s.index, remedy=remedy)
        elif margin is not None and margin < warn_margin:
            yield r.warn(f"{t} °C, only {margin} °C below slowdown ({slow} °C)", gpu=s.index,
                         remedy=remedy)
        elif ctx.idle(s) and t > idle_max:
            yield r.warn(f"{t} °C at idle (above {idle_max} °C)", gpu=s.index, remedy=remedy)
        else:
            rest = f", {margin} °C below slowdown" if margin is not None else ""
            yield r.ok(f"{t} °C{rest}", gpu=s.index)


# The fans' check lives in gpud.doctor.fans; registered here, in the place doctor runs it.
check("health.fans", "Health")(fans.health_fans)


@check("health.pcie_replay", "Health")
def pcie_replay(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    limit = ctx.config.doctor.pcie_replay_warn
    for s in ctx.samples:
        if s.pcie_replay_errors is None:
            yield r.skip("PCIe replay counter not reported", gpu=s.index)
        elif s.pcie_replay_errors > limit:
            yield r.warn(f"{s.pcie_replay_errors} PCIe replays since boot: a marginal link",
                         gpu=s.index, remedy="reseat the card and riser; check the slot; watch "
                         f"`nvidia-smi -i {s.index} -q -d PCIE` (Replays)")
        else:
            yield r.ok(f"{s.pcie_replay_errors} PCIe replays", gpu=s.index)


@check("gpu.processes", "Health")
def processes(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    """Jobs on the GPUs (NVML's compute list) warn; a desktop's display server and shell (the graphics list
    alone) are named, not warned about: they are the workstation's desktop, and what they do shows in the
    GPU's utilisation and memory, which other checks and `gpud select`'s thresholds judge."""
    if all(s.processes is None for s in ctx.samples):
        yield r.skip("process list not reported")
        return
    rows: list[str] = []
    desktop: list[str] = []
    for s in ctx.samples:
        for p in s.processes or ():
            mem = f"{p.used_memory_bytes / 2**30:.1f} GiB" if p.used_memory_bytes is not None else "? GiB"
            row = f"GPU{s.index}: pid {p.pid} {p.user or '?'} {mem} {p.command or ''}".rstrip()
            (desktop if p.graphics_only else rows).append(row)
    if rows:
        gpus = sorted({int(r[3:r.index(':')]) for r in rows})
        yield r.warn(f"{plural(len(rows), 'process', 'processes')} on "
                     f"{'GPU' if len(gpus) == 1 else 'GPUs'} {', '.join(map(str, gpus))}: {rows[0]}",
                     detail="\n".join(rows + [f"{d} (graphics)" for d in desktop]),
                     remedy="wait for them or stop them before a benchmark or a job that needs whole GPUs; see "
                            "`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`")
    elif desktop:
        yield r.ok(f"no compute process on the GPUs (the desktop: "
                   f"{plural(len(desktop), 'graphics process', 'graphics processes')})", detail="\n".join(desktop))
    else:
        yield r.ok("no compute process on the GPUs")
