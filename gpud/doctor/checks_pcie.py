"""PCIe and topology: link width and generation, ACS, IOMMU, P2P, NVLink, NUMA."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

from gpud.doctor.registry import Context, Reporter, check
from gpud.model import ACS_BITS, CheckResult
from gpud.text import plural, ranges

ACS_P2P_BITS = 0x01 | 0x04 | 0x08  # SrcValid, ReqRedir, CmpltRedir: what breaks or detours P2P


def _lspci(ctx: Context, gpu: int) -> str:
    bus = ctx.infos[gpu].pci_bus_id
    return f"`nvidia-smi -i {gpu} -q -d PCIE`, `sudo lspci -vv -s {bus} | grep -E 'LnkCap|LnkSta'`"


def _port(ctx: Context, gpu: int) -> tuple[int | None, int | None, int | None, int | None]:
    """(GPU's own max width, its slot's max width, GPU's own max generation, slot's max generation).

    NVML's ``GetMaxPcieLinkWidth/Generation`` give the maximum of the GPU *in this slot* (the lower
    of the two), so they cannot tell a narrow slot from the card's limit; sysfs can: a device's
    ``max_link_*`` is its own Link Capabilities, the port above it is the slot.
    """
    g = ctx.infos[gpu]
    dev = ctx.host.pci_device(g.pci_bus_id)
    port = ctx.host.pci_device(dev.parents[-1]) if dev is not None and dev.parents else None
    gpu_w = dev.max_link_width if dev is not None and dev.max_link_width else g.pcie_max_width
    slot_w = port.max_link_width if port is not None and port.max_link_width else None
    gpu_g = g.pcie_gpu_max_generation or (_gen(dev.max_link_speed) if dev is not None else None) \
        or g.pcie_max_generation
    slot_g = _gen(port.max_link_speed) if port is not None else None
    return gpu_w, slot_w, gpu_g, slot_g


def _gen(speed: str | None) -> int | None:
    """sysfs ``16.0 GT/s PCIe`` → 4."""
    gts = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
    return gts.get((speed or "").split(" ")[0])


@check("pcie.link_width", "PCIe and topology")
def link_width(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    for s in ctx.samples:
        g = ctx.infos[s.index]
        gpu_w, slot_w, _, _ = _port(ctx, s.index)
        best = min(w for w in (gpu_w, slot_w, g.pcie_max_width) if w) if (gpu_w or g.pcie_max_width) else None
        if s.pcie_width is None or best is None:
            yield r.skip("link width not reported", gpu=s.index)
        elif s.pcie_width < best:
            yield r.fail(f"link trained to x{s.pcie_width}, though the GPU and its slot do "
                         f"x{best}", gpu=s.index,
                         detail="a narrower link halves host↔GPU and P2P-over-PCIe bandwidth; GPU and slot both "
                                "support the full width, so the card, its riser or the slot contacts are at fault",
                         remedy="power off; reseat the card (and its riser), check for a damaged or dirty edge "
                                f"connector; confirm with {_lspci(ctx, s.index)}")
        elif gpu_w and slot_w and slot_w < gpu_w:
            yield r.warn(f"x{gpu_w} GPU in an x{slot_w} slot: link x{s.pcie_width}", gpu=s.index,
                         detail="the slot (or its BIOS bifurcation) is wired narrower than the card",
                         remedy="move the card to a full x16 slot, or set the slot's bifurcation to x16 in the "
                                f"BIOS; confirm with {_lspci(ctx, s.index)} (LnkCap of the bridge above the GPU)")
        else:
            yield r.ok(f"x{s.pcie_width} of x{best}", gpu=s.index)


@check("pcie.link_gen", "PCIe and topology")
def link_gen(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    for s in ctx.samples:
        g = ctx.infos[s.index]
        _, _, gpu_g, slot_g = _port(ctx, s.index)
        best = g.pcie_max_generation  # what this GPU can reach in this slot (NVML)
        if s.pcie_generation is None or best is None:
            yield r.skip("link generation not reported", gpu=s.index)
        elif s.pcie_generation < best and ctx.loaded(s):
            yield r.fail(f"Gen{s.pcie_generation} under load ({s.utilization_gpu_percent} %), "
                         f"max Gen{best}", gpu=s.index,
                         remedy="set the slot to Gen4/Auto in the BIOS, check the riser; confirm with "
                                + _lspci(ctx, s.index))
        elif gpu_g and slot_g and slot_g < gpu_g and s.pcie_generation <= slot_g:
            # (a link running faster than the port's reported maximum shows the port under-reports: no slot limit)
            yield r.warn(f"Gen{gpu_g} GPU in a Gen{slot_g} slot (link Gen{s.pcie_generation})",
                         gpu=s.index, remedy="the slot or a riser limits the generation: use a slot wired to the "
                         f"CPU at Gen{gpu_g}, or set it to Auto in the BIOS; confirm with {_lspci(ctx, s.index)}")
        elif s.pcie_generation < best:
            yield r.ok(f"Gen{s.pcie_generation} at idle (power saving), max "
                       f"Gen{best}; re-checked under load by the probe", gpu=s.index)
        else:
            yield r.ok(f"Gen{s.pcie_generation} of Gen{best}", gpu=s.index)


@check("pcie.acs", "PCIe and topology", needs_nvml=False)
def acs(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    flagged, unreadable, bridges, without = {}, set(), set(), set()
    for gpu in ctx.host.nvidia_gpus():
        for addr in gpu.parents:
            bridges.add(addr)
            dev = ctx.host.pci_device(addr)
            if dev is None or dev.acs_capable is None:
                unreadable.add(addr)
            elif not dev.acs_capable:
                without.add(addr)  # no ACS capability: nothing on this port can redirect P2P
            elif dev.acs_ctrl is not None and dev.acs_ctrl & ACS_P2P_BITS:
                flagged[addr] = ", ".join(name for bit, name in ACS_BITS if dev.acs_ctrl & bit)
    if flagged:
        detail = "\n".join(f"{a}: {flags}" for a, flags in sorted(flagged.items()))
        first = sorted(flagged)[0]
        if ctx.host.iommu()["enabled"]:
            remedy = ("the kernel itself enables ACS on every capable port when an IOMMU is on (the IOMMU driver "
                      "requests it at boot), so the BIOS switch alone does not help: if no VM needs device "
                      "isolation, boot without the IOMMU (`intel_iommu=off` or `amd_iommu=off` in "
                      "GRUB_CMDLINE_LINUX); else clear the redirect bits at boot for these bridges with "
                      f"`pci=disable_acs_redir={';'.join(sorted(flagged))}` on the kernel command line; "
                      "confirm with `sudo lspci -vvv | grep ACSCtl`")
        else:
            remedy = ("disable ACS (often \"PCIe ACS\" or \"IO virtualization / VT-d\") in the BIOS, or per bridge "
                      f"after each boot, as NCCL's documentation shows: `sudo setpci -s {first} "
                      "ECAP_ACS+0x6.w=0000`; confirm with `sudo lspci -vvv | grep ACSCtl`")
        yield r.warn(f"ACS enabled on {plural(len(flagged), 'bridge')} above the GPUs: peer-to-peer traffic "
                     "is "
                     "redirected through the root complex (slow, or hangs NCCL)", detail=detail, remedy=remedy)
    elif not bridges:
        yield r.ok("no PCIe bridge above the GPUs" if ctx.host.nvidia_gpus() else "no GPU on the PCI bus")
    elif unreadable == bridges:
        yield r.skip("PCIe config space not readable", remedy="run gpud doctor as root to check ACS")
    else:
        checked = len(bridges) - len(unreadable)
        none = f" ({len(without)} without an ACS capability)" if without else ""
        yield r.ok(f"no P2P redirection on the {plural(checked, 'bridge')} above the GPUs{none}")


@check("host.iommu", "PCIe and topology", needs_nvml=False)
def iommu(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    io = ctx.host.iommu()
    if not io["enabled"]:
        yield r.ok("IOMMU off")
    elif io["passthrough"]:
        yield r.ok("IOMMU in passthrough (iommu=pt)")
    else:
        types = ", ".join(cast("list[str]", io["domain_types"])) or "translated"  # Host.iommu's sorted list
        yield r.warn(f"IOMMU translating DMA ({types}): peer-to-peer may fail or slow down",
                     remedy="add `iommu=pt` to GRUB_CMDLINE_LINUX (then `sudo update-grub` and reboot); confirm with "
                            "`cat /sys/kernel/iommu_groups/*/type` (identity)")


@check("gpu.p2p", "PCIe and topology")
def p2p(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    t = ctx.topology
    assert t is not None
    n = len(t.gpus)
    if n < 2:
        yield r.skip("one GPU: no pair to check")
        return
    lost = _lost(ctx)
    bad: list[str] = []
    with_lost: list[str] = []
    for a in range(n):
        for b in range(a + 1, n):
            rd, wr = t.p2p_read[a][b], t.p2p_write[a][b]
            if rd != "OK" or wr != "OK":
                pair = f"GPU{t.gpus[a]}↔GPU{t.gpus[b]}: read {rd}, write {wr}"
                (with_lost if {t.gpus[a], t.gpus[b]} & lost else bad).append(pair)
    if with_lost:  # not ACS's doing: the GPU itself is gone
        gone = ", ".join(f"GPU{i}" for i in sorted(lost))
        yield r.warn(f"P2P not available for {plural(len(with_lost), 'pair')} with {gone}, which is lost "
                     "(see gpu.count)", detail="\n".join(with_lost),
                     remedy="bring the lost GPU back first (`sudo dmesg | grep -i xid`, reseat, reboot); then check "
                            "P2P again with `nvidia-smi topo -p2p rw`")
    if bad:
        yield r.warn(f"P2P not available for {len(bad)} of {n * (n - 1) // 2} pairs: NCCL will fall back "
                     "to host memory for them", detail="\n".join(bad),
                     remedy="check ACS and IOMMU (pcie.acs, host.iommu), the BIOS (Above 4G decoding, "
                            "Resizable BAR); confirm with `nvidia-smi topo -p2p rw`")
    elif not with_lost:
        yield r.ok(f"P2P read/write OK for all {n * (n - 1) // 2} pairs")


def _lost(ctx: Context) -> set[int]:
    return {s.index for s in ctx.snapshot.samples if s.lost} if ctx.snapshot else set()


def _unseen(ctx: Context) -> list[str]:
    """NVIDIA GPUs on the PCI bus that NVML does not enumerate (off the bus for the driver)."""
    seen = set(ctx.by_bus())
    return [d.address for d in ctx.host.nvidia_gpus() if d.address not in seen]


def _expected_pairs(ctx: Context, up: dict[tuple[int, int], int]) -> set[tuple[int, int]]:
    """Bridged pairs the machine should have: from gpud.toml, else seen, else inferred."""
    configured = ctx.config.machine.nvlink_pairs
    if configured is not None:
        return {(min(p), max(p)) for p in configured}
    pairs = set(up)
    bridged = {i for p in pairs for i in p}
    # Lab layout: bridges in pairs. Same-model GPUs with NVLinks but none up, on a machine where
    # that model is bridged elsewhere, are expected to be bridged too, in index order.
    by_model: dict[str, list[int]] = {}
    for i, g in sorted(ctx.infos.items()):
        if g.nvlink_count:
            by_model.setdefault(g.name, []).append(i)
    for gpus in by_model.values():
        if not any(i in bridged for i in gpus):
            continue
        lone = [i for i in gpus if i not in bridged]
        pairs |= {(lone[k], lone[k + 1]) for k in range(0, len(lone) - 1, 2)}
    return pairs


@check("nvlink.links", "PCIe and topology")
def nvlink_links(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    bus = ctx.by_bus()
    links_up: dict[tuple[int, int], int] = {}
    for s in ctx.samples:
        for ln in s.nvlinks:
            j = bus.get(ln.remote_pci_bus_id or "")
            if ln.up and j is not None:
                key = (min(s.index, j), max(s.index, j))
                links_up[key] = max(links_up.get(key, 0), sum(
                    1 for x in s.nvlinks if x.up and x.remote_pci_bus_id == ln.remote_pci_bus_id))
    capable = [s for s in ctx.samples if ctx.infos[s.index].nvlink_count]
    if not capable:
        yield r.skip("no NVLink on these GPUs")
        return
    expected = _expected_pairs(ctx, links_up)
    source = "gpud.toml" if ctx.config.machine.nvlink_pairs is not None else "seen"
    lost, unseen = _lost(ctx), _unseen(ctx)
    for s in capable:
        total = ctx.infos[s.index].nvlink_count
        partners = [b if a == s.index else a for a, b in expected if s.index in (a, b)]
        up = [ln for ln in s.nvlinks if ln.up]
        if not partners:
            yield r.ok(f"no bridge expected ({len(up)}/{total} links up)", gpu=s.index)
            continue
        j = partners[0]
        to_j = [ln.link for ln in up if bus.get(ln.remote_pci_bus_id or "") == j]
        down = [ln.link for ln in s.nvlinks if not ln.up]
        remedy = (f"power off and reseat the NVLink bridge GPU{min(s.index, j)}↔GPU{max(s.index, j)} (the cards must "
                  "sit in the slots the bridge spans); confirm with `nvidia-smi nvlink -s` and `nvidia-smi topo -m`")
        if not to_j and (j in lost or j not in ctx.infos or unseen):
            # The partner is gone (or NVML numbers the GPUs differently while one is missing): the
            # bridge cannot be judged, and reseating it is not the fix.
            why = f"GPU{j} is lost" if j in lost else \
                f"a GPU is off the bus: {', '.join(unseen)}" if unseen else f"GPU{j} does not exist"
            yield r.fail(f"0/{total} NVLinks up: the bridge partner is not answering ({why})",
                         gpu=s.index, detail=f"bridge expected ({source}); see gpu.count",
                         remedy="bring the missing GPU back first (`sudo dmesg | grep -iE 'NVRM|xid'`, "
                                "`lspci -d 10de:`; reseat it and its power cables, reboot), then check the bridge with "
                                "`nvidia-smi nvlink -s`")
        elif not to_j:
            yield r.fail(f"0/{total} NVLinks up: the bridge to GPU{j} is down or missing", gpu=s.index,
                         detail=f"bridge expected ({source}); all-reduce between GPU{s.index} and GPU{j} goes over "
                                "PCIe",
                         remedy=remedy)
        elif down:
            yield r.fail(f"{len(to_j)}/{total} NVLinks up to GPU{j}; link(s) "
                         f"{', '.join(map(str, down))} down", gpu=s.index, remedy=remedy)
        else:
            yield r.ok(f"{len(to_j)}/{total} NVLinks up to GPU{j} (NV{len(to_j)})", gpu=s.index)


@check("topo.numa", "PCIe and topology")
def numa(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    nodes: dict[int | None, list[int]] = {}
    for i, g in sorted(ctx.infos.items()):
        nodes.setdefault(g.numa_node, []).append(i)
    known = {n for n in nodes if n is not None}
    if len(known) <= 1:
        where = f"NUMA node {known.pop()}" if known else "one NUMA domain"
        yield r.ok(f"all GPUs on {where}")
        return
    detail = "\n".join(f"GPU{i}: NUMA node {ctx.infos[i].numa_node}, CPUs {ranges(ctx.infos[i].cpu_affinity)}"
                       for i in sorted(ctx.infos))
    yield r.warn(f"GPUs span {len(known)} NUMA nodes: traffic between them crosses the CPU interconnect",
                 detail=detail,
                 remedy="pin each rank to its GPU's node (" + ", ".join(
                     f"GPU{ranges(gpus)}: `numactl --cpunodebind={node} --membind={node}`"
                     for node, gpus in sorted(nodes.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
                     if node is not None) + "; or torchrun with per-rank affinity); keep each job's GPUs on one "
                     "node; see `nvidia-smi topo -m`")
