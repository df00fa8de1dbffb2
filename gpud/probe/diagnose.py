"""Why scaling is below what the hardware allows: measurements against the expected bandwidth.

No torch here: the inputs are the probe's figures, gpud's own view of the machine (NVML topology,
link widths and generations, NVLink state, ACS), what was seen while the probe ran (clock events,
link generation under load, other processes) and the transports NCCL reported. Each link is
judged by measured against expected bandwidth on the path NCCL actually takes (gpud.probe.expect);
DDP efficiency is judged against a prediction from one GPU's step time and the measured bus
bandwidth; the seeds' 1.7×/3.5×/6.2× are compared for information only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpud.model import GpuInfo, GpuSample, Topology
from gpud.probe import expect
from gpud.probe.expect import GB
from gpud.probe.report import Diagnosis, LinkJudgement, PathSeen, ProbeReport, Scaling, Seed, Verdict

DEFAULT_THRESHOLDS = {2: 0.85, 4: 0.875, 8: 0.775}  # the seeds' figures: 1.7×/2, 3.5×/4, 6.2×/8
BUS_PASS, BUS_WARN = 0.75, 0.5  # measured / expected bus bandwidth
EFF_PASS, EFF_WARN = 0.9, 0.75  # measured / predicted DDP efficiency
SLOWDOWNS = {"sw_power_cap": "power cap", "hw_slowdown": "hardware slowdown",
             "sw_thermal_slowdown": "thermal slowdown", "hw_thermal_slowdown": "thermal slowdown",
             "hw_power_brake_slowdown": "power brake"}
RANK: dict[Verdict, int] = {"pass": 0, "n/a": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class Path:
    a: int
    b: int
    transport: str  # P2P/NVLink | P2P/PCIe | SHM | NET
    bandwidth: float  # bytes/s per direction NCCL's model expects
    nominal: float  # the datasheet rate of the slowest link on the path
    text: str
    notes: tuple[str, ...] = ()


@dataclass
class Seen:
    """What was observed while the probe ran (gpud.probe.monitor.LoadMonitor), by NVML index."""

    clock_events: dict[int, set[str]] = field(default_factory=dict)
    pcie_generation: dict[int, int] = field(default_factory=dict)  # highest seen under load
    processes: dict[int, list[str]] = field(default_factory=dict)  # other processes: "pid 1 (alice: cmd)"


@dataclass
class View:
    """The machine as the diagnosis sees it: topology, GPUs, samples, host facts, NCCL's settings."""

    t: Topology
    infos: dict[int, GpuInfo]
    samples: dict[int, GpuSample]
    seen: Seen = field(default_factory=Seen)
    cpu_vendor: str = "intel"
    acs: dict[int, list[str]] = field(default_factory=dict)  # GPU → bridges above it with ACS P2P bits set
    nccl_env: dict[str, str] = field(default_factory=dict)
    cpu_link: float | None = None  # NCCL's inter-socket figure (expect.cpu_link); None: the vendor's oldest

    def __post_init__(self) -> None:
        self.pairs = self._bridged_pairs()

    def _bridged_pairs(self) -> dict[tuple[int, int], int]:
        """NVLink pairs the machine should have: those up now, plus NVLink-capable GPUs left without a
        partner paired in bus order (bridges join neighbouring slots)."""
        pairs: dict[tuple[int, int], int] = {}
        for ia, a in enumerate(self.t.gpus):
            for ib, b in enumerate(self.t.gpus):
                if a < b and self.t.nvlinks[ia][ib]:
                    pairs[(a, b)] = self.t.nvlinks[ia][ib]
        paired = {g for p in pairs for g in p}
        alone = [g for g in self.t.gpus if g in self.infos and self.infos[g].nvlink_count and g not in paired]
        for a, b in zip(alone[::2], alone[1::2], strict=False):
            pairs[(a, b)] = min(self.infos[a].nvlink_count, self.infos[b].nvlink_count)
        return pairs

    def expected_links(self, a: int, b: int) -> int:
        return self.pairs.get((min(a, b), max(a, b)), 0)

    def links_now(self, a: int, b: int) -> int:
        return self.t.nvlinks[self.t.gpus.index(a)][self.t.gpus.index(b)]

    def gen_width(self, g: int, healthy: bool) -> tuple[int | None, int | None]:
        info, s = self.infos[g], self.samples.get(g)
        if healthy:
            return info.pcie_max_generation, info.pcie_max_width
        gen = self.seen.pcie_generation.get(g) or info.pcie_max_generation  # idle samples drop the generation
        return gen, (s.pcie_width if s and s.pcie_width else info.pcie_max_width)

    def path(self, a: int, b: int, healthy: bool, transport: str | None = None) -> Path:
        """The path NCCL takes between two GPUs and what it should deliver; ``healthy``: as the machine
        should be (full links, bridges up), else as it is now. ``transport``: what NCCL reported."""
        ia, ib = self.t.gpus.index(a), self.t.gpus.index(b)
        ga = self.infos[a]
        links = self.expected_links(a, b) if healthy else self.links_now(a, b)
        notes = [] if healthy else self._notes(a, b, transport == "P2P" if transport else None)
        rate = expect.nvlink_rate(ga.name, ga.architecture)
        if links and rate and transport in (None, "P2P"):
            return Path(a, b, "P2P/NVLink", links * rate.model, links * rate.nominal,
                        f"{rate.generation} ×{links}", tuple(notes))
        (gen_a, w_a), (gen_b, w_b) = self.gen_width(a, healthy), self.gen_width(b, healthy)
        slow = min(((gen_a, w_a), (gen_b, w_b)), key=lambda gw: expect.pcie(*gw))
        pcie_bw, pcie_nominal = expect.pcie(*slow), expect.pcie(*slow, model=False)
        link_text = f"PCIe Gen{slow[0] or '?'} x{slow[1] or '?'}"
        level = self.t.pcie_level[ia][ib]
        p2p_ok = healthy or (self.t.p2p_read[ia][ib] == "OK" and self.t.p2p_write[ia][ib] == "OK")
        allowed = expect.LEVEL_RANK.get(level, 4) <= expect.p2p_level(self.nccl_env, self.cpu_vendor,
                                                                       len(self.t.gpus))
        chosen = transport or ("P2P" if p2p_ok and allowed else "NET" if self.nccl_env.get(
            "NCCL_SHM_DISABLE", "0") not in ("", "0") else "SHM")
        if chosen == "P2P":
            if self.cpu_vendor == "intel" and level in ("PHB", "NODE"):
                # P2P forwarded by an Intel root complex travels as 64-byte TLPs: 5/6 of the link (topo.h)
                pcie_bw /= expect.INTEL_P2P_OVERHEAD
                link_text += " through the CPU's root complex"
            return Path(a, b, "P2P/PCIe", pcie_bw, pcie_nominal, f"{link_text} P2P", tuple(notes))
        bw = pcie_bw * expect.HOST_BOUNCE
        if level == "SYS":
            bw = min(bw, self.cpu_link if self.cpu_link is not None else expect.cpu_link(self.cpu_vendor))
        why = "NCCL does not use P2P across the CPU's host bridges by default (NCCL_P2P_LEVEL)" if not allowed \
            else "P2P is not available"
        text = f"host memory ({chosen}) over {link_text}" + (" and the CPU sockets' link" if level == "SYS" else "")
        if chosen == "NET":
            notes.append("NCCL used its network transport between GPUs of one machine (NCCL_SHM_DISABLE?)")
        return Path(a, b, chosen, bw, pcie_nominal, text, tuple(dict.fromkeys([*notes, why] if not healthy
                                                                                   else notes)))

    def _notes(self, a: int, b: int, pcie_p2p: bool | None = None) -> list[str]:
        """What is wrong on the path between a and b now (empty on a healthy path). ACS matters where
        the traffic is PCIe P2P (``pcie_p2p``; None: where NCCL's default path is)."""
        if pcie_p2p is None:
            pcie_p2p = self.nccl_p2p_over_pcie(a, b)
        ia, ib = self.t.gpus.index(a), self.t.gpus.index(b)
        notes: list[str] = []
        want, have = self.expected_links(a, b), self.links_now(a, b)
        if want and not have:
            notes.append(f"the NVLink bridge GPU{min(a, b)}↔GPU{max(a, b)} is down")
        elif want and have < want:
            notes.append(f"NVLink GPU{min(a, b)}↔GPU{max(a, b)}: {have} of {want} links up")
        for g in (a, b):
            info, s = self.infos[g], self.samples.get(g)
            if info.nvlink_count and not self.expected_links(a, b) and not any(
                    self.expected_links(g, o) for o in self.t.gpus if o != g):
                notes.append(f"GPU{g} has NVLink but no bridge")
            if s and s.pcie_width and info.pcie_max_width and s.pcie_width < info.pcie_max_width:
                notes.append(f"GPU{g}'s link runs at x{s.pcie_width} of x{info.pcie_max_width}")
            gen = self.seen.pcie_generation.get(g)
            if gen and info.pcie_max_generation and gen < info.pcie_max_generation:
                notes.append(f"GPU{g}'s link ran at Gen{gen} of Gen{info.pcie_max_generation} under load")
        if self.t.p2p_read[ia][ib] != "OK" or self.t.p2p_write[ia][ib] != "OK":
            notes.append(f"P2P GPU{a}↔GPU{b} is not available (read {self.t.p2p_read[ia][ib]}, write "
                         f"{self.t.p2p_write[ia][ib]})")
        if pcie_p2p and not self.links_now(a, b):
            for g in (a, b):
                if self.acs.get(g):
                    notes.append(f"ACS is on above GPU{g} ({', '.join(self.acs[g])}): P2P requests detour "
                                 "through the root complex")
        if self.t.pcie_level[ia][ib] == "SYS":
            notes.append("the path crosses the CPU sockets' interconnect")
        return notes

    def nccl_p2p_over_pcie(self, a: int, b: int) -> bool:
        """Whether NCCL's default path between a and b is PCIe P2P (no NVLink, within its P2P level)."""
        ia, ib = self.t.gpus.index(a), self.t.gpus.index(b)
        level = expect.LEVEL_RANK.get(self.t.pcie_level[ia][ib], 4)
        return not self.links_now(a, b) and level <= expect.p2p_level(self.nccl_env, self.cpu_vendor, len(self.t.gpus))

    def during_run(self, gpus: list[int]) -> list[str]:
        """What the run itself ran into on these GPUs: clock slowdowns, other processes."""
        out = []
        for g in gpus:
            events = set(self.seen.clock_events.get(g, set()))
            s = self.samples.get(g)
            events |= set((s.clock_events or ()) if s else ())
            kinds = sorted({SLOWDOWNS[e] for e in events if e in SLOWDOWNS})
            if kinds:
                out.append(f"GPU{g} in {' and '.join(kinds)} during the run "
                           f"({', '.join(sorted(e for e in events if e in SLOWDOWNS))})")
            procs = self.seen.processes.get(g)
            if procs is None and s and s.processes:
                procs = [f"pid {p.pid}" + (f" ({p.user}: {p.command})" if p.user or p.command else "")
                         for p in s.processes if not p.graphics_only]
            if procs:
                out.append(f"GPU{g} was shared with other processes: {', '.join(procs)}")
        return out

    def ring(self, gpus: list[int], healthy: bool) -> tuple[float, list[Path]]:
        """NCCL's best ring over these GPUs and its paths (the slowest hop limits the bus bandwidth)."""
        bw = {(i, j): self.path(gpus[i], gpus[j], healthy).bandwidth
              for i in range(len(gpus)) for j in range(len(gpus)) if i != j}
        best, order = expect.best_ring(len(gpus), bw)
        return best, [self.path(gpus[order[k]], gpus[order[(k + 1) % len(order)]], healthy)
                      for k in range(len(order))]


def threshold(thresholds: dict[int, float], n: int) -> float:
    """The seeds' efficiency for n GPUs: its own, else the next larger world size's, else the largest's."""
    keys = sorted(thresholds)
    for k in keys:
        if n <= k:
            return thresholds[k]
    return thresholds[keys[-1]]


def _verdict(ratio: float, good: float, poor: float) -> Verdict:
    return "pass" if ratio >= good else "warn" if ratio >= poor else "fail"


def rank_gpus(view: View, uuids: list[str | None] | None, n: int) -> list[int]:
    """NVML indices of the ranks' GPUs, by UUID (CUDA_VISIBLE_DEVICES, or a GPU CUDA does not see, make
    rank k differ from NVML GPU k); the first n GPUs when the ranks reported none."""
    by_uuid = {g.uuid: g.index for g in view.infos.values()}
    if uuids and all(u in by_uuid for u in uuids):
        return [by_uuid[u] for u in uuids if u is not None]
    return [g for g in view.t.gpus if g in view.infos][:n]


def nccl_device(view: View, dev: str | None, version: str | None) -> int | None:
    """The NVML index of the GPU in a transport line's bracket: the index itself from NCCL 2.18.3 on,
    the PCI bus id in hex (``5a000`` = 0000:5a:00.0) before; None when it names no GPU of the view."""
    if dev is None:
        return None
    if _version(version) >= (2, 18, 3):
        return int(dev) if dev.isdigit() and int(dev) in view.infos else None
    try:
        bus = int(dev, 16)
    except ValueError:
        return None
    for g in view.infos.values():
        domain, rest = (g.pci_bus_id.lower().split(":", 1) + [""])[:2]
        parts = rest.replace(".", ":").split(":")
        try:
            code = (int(domain, 16) << 20) | (int(parts[0], 16) << 12) | (int(parts[1], 16) << 4) | int(parts[2], 16)
        except (ValueError, IndexError):
            continue
        if code == bus:
            return g.index
    return None


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in (text or "").split(".")[:3])
    except ValueError:
        return ()


def _observed_hops(view: View, gpus: list[int], transports: list[dict[str, Any]],
                   version: str | None = None) -> list[Path]:
    """Paths NCCL reported ("Channel 00/0 : 0[0] -> 1[1] via P2P/IPC") between these GPUs: each line's GPUs
    from its brackets (a send/recv communicator numbers its two ranks 0 and 1 whatever GPUs they hold);
    from the ranks only where the brackets name no GPU of this machine."""
    seen: dict[tuple[int, int], str] = {}
    for row in transports:
        a, b = nccl_device(view, row.get("src_dev"), version), nccl_device(view, row.get("dst_dev"), version)
        if a is None or b is None:
            s, d = row["src_rank"], row["dst_rank"]
            if not (s < len(gpus) and d < len(gpus)):
                continue
            a, b = gpus[s], gpus[d]
        if a != b and a in gpus and b in gpus:
            seen.setdefault((a, b), row["transport"].split("/")[0])
    return [view.path(a, b, False, kind) for (a, b), kind in sorted(seen.items())]


def explain(result: ProbeReport, view: View | None, thresholds: dict[int, float] | None = None) -> Diagnosis:
    """Verdicts per world size and a plain sentence for each."""
    thresholds = thresholds or DEFAULT_THRESHOLDS
    cpu = result.device != "cuda"
    out = Diagnosis()
    if cpu:
        out.sentences.append("CPU run: a functional check of DDP, the pipeline, all-reduce and P2P; the figures "
                                "say nothing about GPU hardware and no speedup is claimed.")
    ddp, ar = result.ddp, result.allreduce
    base = ddp.get("1")
    sizes = sorted({int(n) for n in (*ddp, *ar) if int(n) >= 2})
    for n in sizes:
        ws = str(n)
        if cpu:
            out.verdicts[ws] = "n/a"
            continue
        r, a = ddp.get(ws), ar.get(ws)
        measured = a.get("peak_busbw_bytes_per_second") if a else None
        if view is None:
            out.verdicts[ws] = "n/a"
            out.sentences.append(f"{n} GPUs: no view of the machine's links (NVML unavailable): not judged.")
            continue
        gpus = rank_gpus(view, result.ranks.get(ws), n)
        expected, healthy = view.ring(gpus, healthy=True)
        observed = _observed_hops(view, gpus, result.nccl.transports.get(ws, []), result.nccl.version)
        now_bw, now_ring = view.ring(gpus, healthy=False)
        hops = observed or now_ring
        worst = min(hops, key=lambda p: (p.bandwidth, -len(p.notes)))
        d = Scaling(gpus, expected, min(p.bandwidth for p in hops), measured,
                    PathSeen([worst.a, worst.b], worst.transport, worst.text), bool(observed))
        verdicts: list[Verdict] = []
        parts = []
        if measured:
            ratio = measured / expected if expected else 0.0
            d.bus_ratio, d.bus_verdict = ratio, _verdict(ratio, BUS_PASS, BUS_WARN)
            verdicts.append(d.bus_verdict)
            parts.append(f"all-reduce bus bandwidth {measured / GB:.1f} GB/s, {ratio:.0%} of the "
                         f"{expected / GB:.1f} GB/s expected ({healthy_text(healthy)})")
        if r and base and r.get("efficiency") is not None and base.get("step_seconds"):
            # DDP reduces buckets of bucket_cap_mb: the sweep's figure at that size, where it was measured
            at_bucket = a.get("bucket_busbw_bytes_per_second") if a else None
            bus = at_bucket or measured or min(p.bandwidth for p in hops)
            t1 = base["step_seconds"]
            comm = r.get("gradient_bytes", 4 * r.get("parameters", 0)) * 2 * (n - 1) / n / bus
            lo, hi = t1 / (t1 + comm), t1 / max(t1, comm)
            eff = r["efficiency"]
            d.predicted_efficiency, d.efficiency = [lo, hi], eff
            d.efficiency_verdict = _verdict(eff / lo if lo else 0.0, EFF_PASS, EFF_WARN)
            verdicts.append(d.efficiency_verdict)
            if at_bucket and a and a.get("bucket_bytes"):
                source = f"the bus bandwidth measured at DDP's {a['bucket_bytes'] / 2**20:.0f} MiB buckets"
            else:
                source = "the measured bus bandwidth" if measured else "the expected bus bandwidth"
            parts.append(f"DDP efficiency {eff:.0%} against {lo:.0%}–{hi:.0%} predicted from one GPU's "
                         f"{t1 * 1e3:.1f} ms step and {source}")
            seed = threshold(thresholds, n)
            out.seeds[ws] = Seed(r.get("speedup"), seed * n, seed)
            out.sentences.append(f"{n} GPUs: {r.get('speedup', 0):.2f}× one GPU against the seeds' "
                                    f"{seed * n:.1f}× (informational: the seeds' workload differs).")
        verdict: Verdict = max(verdicts, key=lambda v: RANK[v]) if verdicts else "n/a"
        out.verdicts[ws], out.details[ws] = verdict, d
        pair_notes = [note for i, x in enumerate(gpus) for y in gpus[i + 1:] for note in view._notes(x, y)]
        causes = list(dict.fromkeys([*(note for note in (*worst.notes, *pair_notes) if _hardware_note(note)),
                                     *view.during_run(gpus)]))
        d.causes = causes
        sentence = f"{n} GPUs ({verdict}): " + "; ".join(parts)
        if verdict != "pass":
            sentence += f"; limited by GPU{worst.a}↔GPU{worst.b} over {worst.text}"
        if causes:
            sentence += "; seen: " + "; ".join(causes)
        out.sentences.append(sentence + ".")
    if view is not None and not cpu:
        _judge_p2p(result, view, out)
    return out


def healthy_text(ring: list[Path]) -> str:
    worst = min(ring, key=lambda p: p.bandwidth)
    return f"the best ring's slowest hop, GPU{worst.a}↔GPU{worst.b} over {worst.text}"


def _hardware_note(note: str) -> bool:
    return not note.startswith(("NCCL does not use P2P", "P2P is not available"))


def _judge_p2p(result: ProbeReport, view: View, out: Diagnosis) -> None:
    """Device-to-device copies: P2P where CUDA has peer access (NVLink or PCIe), else staged in host memory."""
    by_uuid = {g.uuid: g.index for g in view.infos.values()}
    for pair in result.p2p_pairs:
        a, b = by_uuid.get(pair.get("src_uuid") or ""), by_uuid.get(pair.get("dst_uuid") or "")
        if a is None or b is None or a == b:
            continue
        links = view.expected_links(a, b)
        rate = expect.nvlink_rate(view.infos[a].name, view.infos[a].architecture)
        if links and rate:
            want, text = links * rate.model, f"{rate.generation} ×{links}"
        else:
            gw = min((view.gen_width(g, True) for g in (a, b)), key=lambda gw: expect.pcie(*gw))
            want, text = expect.pcie(*gw), f"PCIe Gen{gw[0]} x{gw[1]}"
            if pair.get("peer_access") is False:
                want, text = want * expect.HOST_BOUNCE, text + " through host memory (no peer access)"
        got = pair["bandwidth_bytes_per_second"]
        both = pair.get("bidirectional_bytes_per_second")
        notes = view._notes(a, b, pcie_p2p=bool(pair.get("peer_access", True)))
        row = LinkJudgement(a, b, text, want, got, got / want, 2 * want, both, both / (2 * want) if both else None,
                            notes)
        out.links.append(row)
        bidir = row.bidirectional_ratio
        if row.ratio < BUS_WARN or (bidir is not None and bidir < BUS_WARN):
            out.sentences.append(f"P2P GPU{a}→GPU{b}: {got / GB:.1f} GB/s one way"
                                    + (f", {both / GB:.1f} GB/s both ways" if both else "")
                                    + f", {row.ratio:.0%} of what {text} should give"
                                    + ("; " + "; ".join(notes) if notes else "") + ".")
