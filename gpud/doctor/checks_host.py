"""The host around the GPUs: CPU governor, /dev/shm, memlock, RAM, power supply."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator

from gpud.doctor.registry import Context, Reporter, check
from gpud.model import CheckResult
from gpud.text import plural

# Supplies of workstations that ship with one rating only (DMI product name prefix → watts).
KNOWN_SUPPLIES = {
    "HP Z8 Fury G5": 2250,
}


def _gpu_count(ctx: Context) -> int:
    return len(ctx.snapshot.samples) if ctx.snapshot else len(ctx.host.nvidia_gpus())


@check("host.cpu_governor", "Host", needs_nvml=False)
def cpu_governor(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    govs = ctx.host.cpu_governors()
    if not govs:
        yield r.skip("no cpufreq governor (a VM, or no frequency driver)")
        return
    counts = Counter(govs.values())
    others = {g: n for g, n in counts.items() if g != "performance"}
    if others:
        desc = ", ".join(f"{n}/{len(govs)} CPUs on {g}" for g, n in sorted(others.items()))
        yield r.warn(f"{desc}: data loading and kernel launches run slower",
                     remedy="`sudo cpupower frequency-set -g performance` (persist it with a gpud profile's "
                            "[host] cpu_governor); confirm with `cat /sys/devices/system/cpu/cpu*/cpufreq/"
                            "scaling_governor | sort | uniq -c`")
    else:
        yield r.ok(f"all {len(govs)} CPUs on performance")


@check("host.shm", "Host", needs_nvml=False)
def shm(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    size = ctx.host.shm_bytes()
    n = _gpu_count(ctx)
    want = ctx.config.doctor.shm_min_gib_per_gpu * n * 2**30
    if size is None:
        yield r.skip("/dev/shm not found")
    elif size < want:
        yield r.warn(f"/dev/shm is {size / 2**20:.0f} MiB for {plural(n, 'GPU')} "
                     f"(want ≥ {want / 2**30:.0f} GiB): "
                     "DataLoader workers and NCCL's shared-memory transport fail or fall back",
                     remedy="`sudo mount -o remount,size=32G /dev/shm` (and in /etc/fstab); in containers "
                            "`--shm-size=32g` or `--ipc=host`; confirm with `df -h /dev/shm`")
    else:
        yield r.ok(f"/dev/shm is {size / 2**30:.0f} GiB")


@check("host.memlock", "Host", needs_nvml=False)
def memlock(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    limit = ctx.host.memlock_bytes()
    want = ctx.config.doctor.memlock_min_mib * 2**20
    if limit is None:
        yield r.skip("locked-memory limit not readable")
    elif limit < want:
        yield r.warn(f"locked-memory limit {limit / 2**20:.0f} MiB: pinned buffers and NCCL's "
                     "network transports need more", remedy="`ulimit -l unlimited` for the job (limits.conf: "
                     "`* - memlock unlimited`; systemd: LimitMEMLOCK=infinity); confirm with `ulimit -l`")
    else:
        yield r.ok("locked-memory limit " + ("unlimited" if math.isinf(limit)
                                                             else f"{limit / 2**30:.1f} GiB"))


@check("host.memory", "Host")
def memory(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    ram = ctx.host.memory_total_bytes()
    vram = sum(g.memory_total_bytes or 0 for g in ctx.infos.values())
    if ram is None:
        yield r.skip("/proc/meminfo not readable")
    elif ram < vram:
        yield r.warn(f"{ram / 2**30:.0f} GiB of RAM for {vram / 2**30:.0f} GiB of GPU memory: "
                     "checkpoints, pinned buffers and data loading will swap",
                     remedy="add RAM (at least the GPUs' total memory), or use fewer DataLoader workers")
    else:
        yield r.ok(f"{ram / 2**30:.0f} GiB of RAM for {vram / 2**30:.0f} GiB of GPU memory")


def dmi_supply_watts(ctx: Context) -> int | None:
    """The largest power supply SMBIOS reports (type 39, "System Power Supply": Max Power Capacity,
    a WORD in watts at offset 0x0C, 0x8000 = unknown), from /sys/firmware/dmi/entries/39-*/raw."""
    base = ctx.host.path("/sys/firmware/dmi/entries")
    best = None
    for entry in sorted(base.glob("39-*")) if base.is_dir() else []:
        try:
            raw = (entry / "raw").read_bytes()[:256]
        except OSError:
            continue
        if len(raw) >= 0x0E and raw[0] == 39 and raw[1] >= 0x0E:
            watts = raw[0x0C] | raw[0x0D] << 8
            if watts != 0x8000 and 0 < watts < 0x8000:
                best = max(best or 0, watts)
    return best


@check("host.psu", "Host")
def psu(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    product = ctx.host.product_name() or ""
    supply = ctx.config.machine.psu_watts
    if supply is None:
        supply = dmi_supply_watts(ctx)
    if supply is None:
        supply = next((w for prefix, w in KNOWN_SUPPLIES.items() if product.startswith(prefix)), None)
    cpu = ctx.config.machine.cpu_tdp_watts or ctx.host.cpu_power_limit_watts()
    if supply is None or cpu is None:
        missing = " and ".join(k for k, v in (("psu_watts", supply), ("cpu_tdp_watts", cpu)) if v is None)
        yield r.skip(f"power budget unknown ({missing})",
                     remedy=f"set [machine] {missing} in /etc/gpud/gpud.toml")
        return
    gpus = sum(s.power_limit_watts or 0 for s in ctx.samples)
    total = gpus + cpu
    ratio = ctx.config.doctor.psu_load_warn_ratio
    text = f"GPU limits {gpus:.0f} W + CPU {cpu:.0f} W = {total:.0f} W of a {supply:.0f} W supply"
    if total > ratio * supply:
        yield r.warn(f"{text} (over {ratio:.0%}): a full load can trip the supply or brake the GPUs",
                     remedy="lower the GPUs' power limits (`gpud apply quiet`, or `sudo nvidia-smi -pl W`)")
    else:
        yield r.ok(f"{text} ({total / supply:.0%})")
