"""Driver and display: nvml.available, driver.nouveau, gpu.count, sli.disabled."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpud.doctor.registry import Context, Reporter, check
from gpud.errors import DriverNotLoaded, InsufficientPower, IrqIssue, PermissionDenied
from gpud.model import CheckResult, GpuSample
from gpud.text import plural

OFF = {"off", "false", "0", "no", "disable", "disabled"}
SLI_OPTIONS = {"sli", "basemosaic", "multigpu", "mosaic"}
SLI_LOG = re.compile(r"\b(SLI|Mosaic|BaseMosaic|MultiGPU)\b", re.IGNORECASE)
SLI_LOG_ON = re.compile(r"\b(enabled|is on|\"on\"|\"true\"|\"auto\"|\"mosaic\"|\"afr\"|\"sfr\")", re.IGNORECASE)
SLI_REMEDY = ("remove the line (or set it \"Off\"), then restart X (`sudo systemctl restart display-manager`) or "
              "reboot; confirm with `nvidia-settings -q SLIMode -t` and `grep -i sli /var/log/Xorg.0.log`")


@check("nvml.available", "Driver", needs_nvml=False)
def nvml_available(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    if ctx.error is not None or ctx.snapshot is None:
        err = ctx.error
        remedy = err.remedy if err is not None else DriverNotLoaded.remedy
        yield r.fail(str(err) if err else "NVML not available", remedy=remedy)
        return
    v = ctx.snapshot.versions
    yield r.ok(f"driver {v.driver}, CUDA {v.cuda_driver} (NVML {v.nvml})")


@check("driver.nouveau", "Driver", needs_nvml=False)
def driver_nouveau(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    mods = ctx.host.loaded_modules()
    if "nouveau" in mods:
        yield r.fail("the nouveau driver is loaded: it competes with the NVIDIA driver",
                     remedy="blacklist it: `printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' | sudo tee "
                            "/etc/modprobe.d/blacklist-nouveau.conf && sudo update-initramfs -u`, reboot; "
                            "confirm with `lsmod | grep nouveau`")
    elif not mods:
        yield r.ok("module list not readable; nouveau not seen")
    else:
        yield r.ok("nouveau not loaded")


@check("gpu.count", "Driver", needs_nvml=False)
def gpu_count(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    expect = ctx.expect_gpus if ctx.expect_gpus is not None else ctx.config.machine.expect_gpus
    pci = {d.address: d for d in ctx.host.nvidia_gpus()}
    problems: list[CheckResult] = []
    nvml_count = None
    if ctx.snapshot is not None:
        nvml_count = len(ctx.snapshot.samples)
        nvml_bus = set(ctx.by_bus())
        for s in ctx.snapshot.samples:
            if s.lost:
                problems.append(_unreadable(r, s))
        lost_known = sum(1 for s in ctx.snapshot.samples if s.lost)
        for addr, dev in sorted(pci.items()):
            if addr in nvml_bus:
                continue
            if dev.driver not in (None, "nvidia") and not lost_known:
                problems.append(r.warn(f"{addr} is bound to {dev.driver}, not the NVIDIA driver",
                                       detail="intended for a VM (vfio-pci)?",
                                       remedy=f"if not intended: `sudo driverctl unset-override {addr}` and reboot"))
            elif len(nvml_bus) + lost_known < len(pci):
                problems.append(r.fail(f"{addr} is on the PCI bus but NVML does not see it",
                                       detail="fallen off the bus, or failed to initialise",
                                       remedy="check `sudo dmesg | grep -iE 'NVRM|xid'` and `lspci -d 10de:`; "
                                              "reseat the card and its power cables; reboot"))
    seen = nvml_count if nvml_count is not None else len(pci)
    if expect is not None and seen != expect:
        problems.append(r.fail(f"{plural(seen, 'GPU')} found, {expect} expected",
                               remedy="check `nvidia-smi -L` and `lspci -d 10de:`; reseat missing cards"))
    if problems:
        yield from problems
        return
    parts = [f"NVML {nvml_count}" if nvml_count is not None else "NVML n/a", f"PCI {len(pci)}"]
    if expect is not None:
        parts.append(f"expected {expect}")
    yield r.ok(f"{plural(seen, 'GPU')}: {', '.join(parts)}")


# A GPU NVML counts but cannot open, by the handle lookup's answer (nvml.h): (summary, remedy).
UNUSABLE = {
    "insufficient_power": ("its external power cables are not properly attached (NVML: Insufficient External "
                           "Power)", InsufficientPower.remedy),
    "irq_issue": ("the NVIDIA kernel module detected an interrupt problem with it (NVML: IRQ issue)",
                  IrqIssue.remedy),
}


def _unreadable(r: Reporter, s: GpuSample) -> CheckResult:
    """Why NVML could not open the GPU: its own finding for each cause NVML names, "lost" otherwise."""
    if s.cause in UNUSABLE:
        summary, remedy = UNUSABLE[s.cause]
        return r.fail(f"GPU {s.index} cannot be used: {summary}", gpu=s.index, detail=s.error or "",
                      remedy=remedy)
    if s.inaccessible:
        return r.fail(f"GPU {s.index}: NVML refused this user the device", gpu=s.index,
                      detail=s.error or "", remedy=PermissionDenied.remedy + "; check `ls -l /dev/nvidia*`")
    return r.fail(f"GPU {s.index} is lost (fallen off the bus)", gpu=s.index,
                  remedy="check `sudo dmesg | grep -i xid` (Xid 79), power cables and seating; reboot")


def xorg_name(name: str) -> str:
    """An option name as Xorg compares it (xf86NameCmp): case, spaces, tabs and '_' ignored."""
    return re.sub(r"[\s_]", "", name).lower()


@check("sli.disabled", "Display", needs_nvml=False)
def sli_disabled(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    found = []
    for o in ctx.host.xorg_options():
        if xorg_name(o.name) in SLI_OPTIONS and (o.value is None or o.value.strip().lower() not in OFF):
            value = f' "{o.value}"' if o.value is not None else ""
            found.append(f'{o.file}:{o.line}: Option "{o.name}"{value}')
    for file, line, text in ctx.host.xorg_log():
        if SLI_LOG.search(text) and SLI_LOG_ON.search(text) and not re.search(r"disabled|not ", text, re.I):
            found.append(f"{file}:{line}: {text.strip()}")
    mode = ctx.host.nvidia_settings_query("SLIMode")
    if mode is not None and mode.strip().lower() not in OFF:
        found.append(f"nvidia-settings: SLIMode = {mode}")
    if found:
        yield r.fail(f"SLI/Mosaic enabled: {found[0]}", detail="\n".join(found), remedy=SLI_REMEDY)
        return
    files = len(ctx.host.xorg_files())
    yield r.ok("no SLI, Mosaic or MultiGPU in the Xorg configuration" +
               ("" if files else " (no Xorg configuration file)"))
