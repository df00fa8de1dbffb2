"""The Prometheus exporter: a custom collector over the latest observation.

A scrape never touches the hardware and never waits for the daemon's loop: the loop replaces
one immutable ``Observation`` per tick, and ``collect`` reads whichever is current. Metric names
follow Prometheus conventions (``gpud_`` prefix, base units in names, counters ``_total``,
identity in ``gpud_gpu_info``); per-GPU series carry ``gpu`` (index) and ``uuid``; a reading
NVML cannot give is absent, never 0.

Every family is declared once, in ``METRICS``: its name, help, type, labels, how to read its series
from the observation, and whether it is slow (changes at most every few seconds). The collector
builds and yields every family of the table, so adding a metric is adding one ``Spec``.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gpud import __version__
from gpud.doctor.health import RANK
from gpud.doctor.xid import describe
from gpud.model import CLOCK_EVENT_REASONS, STATUSES, GpuInfo, GpuSample
from gpud.observation import TICK_BUCKETS, Counters, Observation
from gpud.probe.report import ProbeReport
from gpud.usage import Usage, user_label

# Xids exported at 0 until they happen (the ones doctor knows; others appear when they occur).
WATCHED_XIDS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 69, 74, 79, 92, 94, 95, 119, 120, 140)
# -- the table ------------------------------------------------------------------------------------

Value = float | tuple[list[tuple[str, float]], float]  # a histogram's: (buckets, sum)
Series = tuple[Sequence[str], Value]  # label values, value
Kind = Literal["gauge", "counter", "histogram"]
GPU_LABELS = ("gpu", "uuid")


class Scope:
    """One observation as the specs read it: each GPU's labels, sample and static facts, worked out once."""

    def __init__(self, obs: Observation) -> None:
        self.obs = obs
        snap = obs.snapshot
        self.infos: dict[int, GpuInfo] = {g.index: g for g in snap.gpus} if snap is not None else {}
        self.gpus: list[tuple[list[str], GpuSample, GpuInfo | None]] = []
        for s in snap.samples if snap is not None else ():
            gi = self.infos.get(s.index)
            self.gpus.append(([str(s.index), s.uuid or (gi.uuid if gi else "")], s, gi))

    @cached_property
    def xid_counts(self) -> list[tuple[tuple[int, str, int], int]]:
        """(gpu, uuid, xid) → occurrences in the kernel log; doctor's watched Xids at 0 until they happen,
        so that the first one shows as an increase."""
        counts: Counter[tuple[int, str, int]] = Counter()
        for info in self.infos.values():
            for x in WATCHED_XIDS:
                counts[(info.index, info.uuid, x)] += 0
        by_bus = {info.pci_bus_id: info for info in self.infos.values()}
        for e in self.obs.xids:
            gi = by_bus.get(e.pci_bus_id)
            if gi is not None:
                counts[(gi.index, gi.uuid, e.xid)] += 1
        return sorted(counts.items())


Read = Callable[[Scope], Iterable[Series] | None]  # None: the family is absent from this observation


@dataclass(frozen=True)
class Spec:
    """One metric family: everything the exporter knows about it."""

    name: str  # a counter's without ``_total`` (prometheus_client adds it)
    help: str
    kind: Kind
    labels: tuple[str, ...]
    read: Read
    slow: bool = False  # changes at most every few seconds: the daemon renders it once per change

    def family(self, scope: Scope) -> Metric | None:
        series = self.read(scope)
        return None if series is None else self.build(series)

    def build(self, series: Iterable[Series]) -> Metric:
        """The family of these series."""
        labels = list(self.labels)
        if self.kind == "histogram":
            hist = HistogramMetricFamily(self.name, self.help, labels=labels)
            for values, value in series:
                assert isinstance(value, tuple)
                hist.add_metric(list(values), value[0], value[1])
            return hist
        fam = (GaugeMetricFamily if self.kind == "gauge" else CounterMetricFamily)(self.name, self.help, labels=labels)
        for values, value in series:
            assert not isinstance(value, tuple)
            fam.add_metric(list(values), value)
        return fam


GpuValue = Callable[[GpuSample, GpuInfo | None], float | None]
GpuSeries = Callable[[GpuSample, GpuInfo | None], Iterable[tuple[Sequence[str], float | None]]]


def gpu(name: str, help: str, value: GpuValue, *, kind: Kind = "gauge", slow: bool = False) -> Spec:
    """One series per GPU that answers: ``value`` of its sample and static facts (None: absent)."""
    return gpu_series(name, help, (), lambda s, g: (((), value(s, g)),), kind=kind, slow=slow)


def gpu_series(name: str, help: str, extra: tuple[str, ...], series: GpuSeries, *, kind: Kind = "gauge",
               slow: bool = False, lost: bool = False) -> Spec:
    """Series per GPU (``extra`` labels after gpu and uuid); a None value is absent, and so is a lost GPU
    unless ``lost``. The family is absent without a snapshot."""

    def read(scope: Scope) -> Iterable[Series] | None:
        if scope.obs.snapshot is None:
            return None
        return [([*lab, *more], float(v)) for lab, s, g in scope.gpus if lost or not s.lost
                for more, v in series(s, g) if v is not None]

    return Spec(name, help, kind, GPU_LABELS + extra, read, slow)


def _ratio(percent: float | None) -> float | None:
    return percent / 100 if percent is not None else None


def _flag(value: bool | None) -> float | None:
    return None if value is None else 1 if value else 0


def _mhz(value: float | None) -> float | None:
    return value * 1e6 if value is not None else None


def _known(g: GpuInfo | None, read: Callable[[GpuInfo], float | None]) -> float | None:
    return read(g) if g is not None else None


def _build_info(scope: Scope) -> Iterable[Series]:
    return [([__version__, platform.python_version()], 1)]


def _tick(scope: Scope) -> Iterable[Series] | None:
    t = scope.obs.tick
    if t is None:
        return None
    buckets: list[tuple[str, float]] = [(str(b), c) for b, c in zip(TICK_BUCKETS, t.counts, strict=True)]
    buckets.append(("+Inf", t.total))
    return [((), (buckets, t.sum))]


def _gpu_info(scope: Scope) -> Iterable[Series] | None:
    snap = scope.obs.snapshot
    if snap is None:
        return None
    driver = snap.versions.driver or ""
    return [([*lab, g.name, g.pci_bus_id, driver], 1) for lab, _, g in scope.gpus if g is not None]


def _xids(scope: Scope) -> Iterable[Series] | None:
    if scope.obs.snapshot is None:
        return None
    return [([str(i), uuid, str(x)], n) for (i, uuid, x), n in scope.xid_counts]


def _xid_info(scope: Scope) -> Iterable[Series] | None:
    if scope.obs.snapshot is None:
        return None
    return [([str(x), (d := describe(x)).kind, d.meaning], 1) for x in sorted({x for (_, _, x), _ in scope.xid_counts})]


def _ecc(aggregate: bool) -> GpuSeries:
    def series(s: GpuSample, g: GpuInfo | None) -> Iterable[tuple[Sequence[str], float | None]]:
        e = s.ecc_errors
        if e is None:
            return ()
        if aggregate:
            return ((["corrected"], e.aggregate_corrected), (["uncorrected"], e.aggregate_uncorrected))
        return ((["corrected"], e.volatile_corrected), (["uncorrected"], e.volatile_uncorrected))
    return series


def _clock_events(s: GpuSample, g: GpuInfo | None) -> Iterable[tuple[Sequence[str], float | None]]:
    if s.clock_events is None:
        return ()
    active = set(s.clock_events)
    return [([reason], 1 if reason in active else 0) for _, reason in CLOCK_EVENT_REASONS]


def _user_memory(scope: Scope) -> Iterable[Series]:
    """Per user, not per process (bounded cardinality: ``gpud.usage.MAX_USERS`` names, then ``other``)."""
    snap, usage = scope.obs.snapshot, scope.obs.usage
    out: list[Series] = []
    if snap is None:
        return out
    named = list(usage.named) if usage is not None else []
    for s in snap.samples:
        per: dict[str, int] = {}
        for p in s.processes or ():
            label = user_label(p.user, named)
            if label not in named and label not in ("other", "unknown"):
                named.append(label)
            per[label] = per.get(label, 0) + (p.used_memory_bytes or 0)
        out += [([str(s.index), s.uuid, user], n) for user, n in sorted(per.items())]
    return out


def _usage(read: Callable[[Usage], Mapping[Any, Any]]) -> Read:
    """The daemon's time accounting, one series per key (labels from the key's parts): absent without it."""

    def series(scope: Scope) -> Iterable[Series] | None:
        usage = scope.obs.usage
        if usage is None:
            return None
        return [([str(k) for k in (key if isinstance(key, tuple) else (key,))], t)
                for key, t in sorted(read(usage).items())]

    return series


def _checks(scope: Scope) -> Iterable[Series]:
    worst: dict[tuple[str, str], str] = {}
    rank = {s: i for i, s in enumerate(("skip", "pass", "warn", "fail"))}
    for r in scope.obs.checks:
        key = (r.id, "" if r.gpu is None else str(r.gpu))
        if key not in worst or rank[r.status] > rank[worst[key]]:
            worst[key] = r.status
    return [([cid, gpu_, st], 1 if st == status else 0) for (cid, gpu_), status in sorted(worst.items())
            for st in STATUSES]


def _profile_active(scope: Scope) -> Iterable[Series]:
    snap = scope.obs.snapshot
    uuids = {x.index: x.uuid for x in snap.samples} if snap is not None else {}
    return [([str(i), uuids.get(i, ""), name, rule], 1) for i, name, rule in scope.obs.profiles]


def _counter(read: Callable[[Counters], int]) -> Read:
    return lambda scope: [((), read(scope.obs.counters))]


def _probe(read: Callable[[ProbeReport], Iterable[tuple[Sequence[str], float | None]]]) -> Read:
    """A figure of the last probe; a history record from another version may lack one: absent, never a
    failed scrape. The family is there (empty) before any probe ran."""

    def series(scope: Scope) -> Iterable[Series]:
        p = scope.obs.probe
        return [(lab, v) for lab, v in read(p) if v is not None] if p else []

    return series


def _per_key(records: Mapping[Any, Any], key: str) -> Iterable[tuple[Sequence[str], float | None]]:
    """World sizes and stage counts in numeric order; a key that is no number sorts last."""
    return [([str(k)], _figure(r, key)) for k, r in sorted(records.items(), key=_numeric_first)]


def _p2p(p: ProbeReport) -> Iterable[tuple[Sequence[str], float | None]]:
    return [([str(pair["src"]), str(pair["dst"])], _figure(pair, "bandwidth_bytes_per_second"))
            for pair in p.p2p_pairs if isinstance(pair, dict) and "src" in pair and "dst" in pair]


def _burnin(read: Callable[[Mapping[str, Any]], Iterable[Series]]) -> Read:
    """The last burn-in (``gpud burnin``): empty until one has run."""
    return lambda scope: read(scope.obs.burnin) if scope.obs.burnin else []


def _burnin_gpus(b: Mapping[str, Any], failed: bool) -> Iterable[Series]:
    out: list[Series] = []
    for g in b.get("gpus") or []:
        labels = [str(g.get("index")), str(g.get("uuid") or "")]
        if failed:
            out.append((labels, sum(1 for v in b.get("verdicts") or []
                                    if v.get("gpu") == g.get("index") and v.get("status") == "fail")))
        else:
            out.append((labels, 0 if g.get("status") == "fail" else 1))
    return out


METRICS: tuple[Spec, ...] = (
    Spec("gpud_build_info", "gpud's version and Python", "gauge", ("version", "python"), _build_info, slow=True),
    Spec("gpud_nvml_errors", "NVML calls that failed, by function", "counter", ("call",),
         lambda sc: [([call], n) for call, n in sorted(sc.obs.nvml_errors.items())]),
    Spec("gpud_tick_duration_seconds", "Time one daemon tick took", "histogram", (), _tick),
    Spec("gpud_last_tick_timestamp_seconds", "When the daemon last read the GPUs", "gauge", (),
         lambda sc: None if sc.obs.last_tick is None else [((), sc.obs.last_tick)]),
    # -- per GPU (absent without a snapshot) --
    Spec("gpud_gpu_info", "GPU identity", "gauge", (*GPU_LABELS, "name", "pci_bus_id", "driver_version"), _gpu_info,
         slow=True),
    gpu_series("gpud_gpu_up", "1 if the GPU answers NVML, 0 if it is lost", (),
               lambda s, g: (((), 0 if s.lost else 1),), lost=True),
    gpu("gpud_gpu_temperature_celsius", "GPU temperature", lambda s, g: s.temperature_celsius),
    gpu("gpud_gpu_slowdown_temperature_celsius", "Temperature at which the GPU slows down",
        lambda s, g: _known(g, lambda i: i.temperature_slowdown_celsius), slow=True),
    gpu("gpud_gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down",
        lambda s, g: _known(g, lambda i: i.temperature_shutdown_celsius), slow=True),
    gpu_series("gpud_gpu_fan_speed_ratio", "Fan speed (0-1)", ("fan",),
               lambda s, g: [([str(f.fan)], _ratio(f.speed_percent)) for f in s.fans]),
    gpu_series("gpud_gpu_fan_target_ratio", "Fan target speed (0-1)", ("fan",),
               lambda s, g: [([str(f.fan)], _ratio(f.target_percent)) for f in s.fans]),
    gpu_series("gpud_gpu_fan_manual", "1 if the fan is in manual mode (gpud or another tool drives it)", ("fan",),
               lambda s, g: [([str(f.fan)], None if f.policy is None else 1 if f.policy == "manual" else 0)
                             for f in s.fans]),
    gpu("gpud_gpu_power_watts", "Power draw", lambda s, g: s.power_watts),
    gpu("gpud_gpu_power_limit_watts", "Enforced power limit", lambda s, g: s.power_limit_watts),
    gpu("gpud_gpu_power_default_limit_watts", "Default power limit",
        lambda s, g: _known(g, lambda i: i.power_default_limit_watts), slow=True),
    gpu("gpud_gpu_power_min_limit_watts", "Lowest settable power limit",
        lambda s, g: _known(g, lambda i: i.power_min_limit_watts), slow=True),
    gpu("gpud_gpu_power_max_limit_watts", "Highest settable power limit",
        lambda s, g: _known(g, lambda i: i.power_max_limit_watts), slow=True),
    gpu("gpud_gpu_energy_joules", "Energy used since the driver loaded", lambda s, g: s.energy_joules,
        kind="counter"),
    gpu_series("gpud_gpu_clock_hertz", "Current clock", ("clock",),
               lambda s, g: [([k], _mhz(v)) for k, v in s.clocks_mhz.items()]),
    gpu_series("gpud_gpu_max_clock_hertz", "Maximum clock", ("clock",),
               lambda s, g: [([k], _mhz(v)) for k, v in g.max_clocks_mhz.items()] if g is not None else (),
               slow=True),
    gpu("gpud_gpu_utilization_ratio", "GPU utilisation (0-1)", lambda s, g: _ratio(s.utilization_gpu_percent)),
    gpu("gpud_gpu_memory_utilization_ratio", "Memory controller utilisation (0-1)",
        lambda s, g: _ratio(s.utilization_memory_percent)),
    gpu("gpud_gpu_memory_used_bytes", "GPU memory used", lambda s, g: s.memory_used_bytes),
    gpu("gpud_gpu_memory_total_bytes", "GPU memory total", lambda s, g: s.memory_total_bytes),
    gpu_series("gpud_gpu_pcie_link_generation", "PCIe link generation", ("kind",),
               lambda s, g: [(["max"], _known(g, lambda i: i.pcie_max_generation)), (["current"], s.pcie_generation)]),
    gpu_series("gpud_gpu_pcie_link_width", "PCIe link width (lanes)", ("kind",),
               lambda s, g: [(["max"], _known(g, lambda i: i.pcie_max_width)), (["current"], s.pcie_width)]),
    gpu_series("gpud_gpu_pcie_throughput_bytes_per_second", "PCIe throughput", ("direction",),
               lambda s, g: [(["tx"], s.pcie_tx_bytes_per_second), (["rx"], s.pcie_rx_bytes_per_second)]),
    gpu("gpud_gpu_pcie_replay_errors", "PCIe replays since boot", lambda s, g: s.pcie_replay_errors, kind="counter"),
    gpu_series("gpud_gpu_nvlink_link_up", "1 if the NVLink is active", ("link",),
               lambda s, g: [([str(ln.link)], 1 if ln.up else 0) for ln in s.nvlinks]),
    gpu_series("gpud_gpu_nvlink_errors", "NVLink errors since the driver loaded (replay, recovery, crc_flit, "
               "crc_data)", ("link", "type"),
               lambda s, g: [([str(ln), kind], n) for ln, kind, n in s.nvlink_errors or ()], kind="counter"),
    gpu_series("gpud_gpu_nvlink_data_bytes", "NVLink data sent (tx) and received (rx) since the driver loaded, per "
               "link", ("link", "direction"),
               lambda s, g: [([str(ln), d], n) for ln, d, n in s.nvlink_data_bytes or ()], kind="counter"),
    gpu_series("gpud_gpu_clock_event_active", "1 while the clock-event reason is active", ("reason",), _clock_events),
    gpu("gpud_gpu_persistence_mode", "1 if persistence mode is on", lambda s, g: _flag(s.persistence_mode)),
    gpu_series("gpud_gpu_ecc_errors", "ECC errors since boot (volatile)", ("type",), _ecc(False), kind="counter"),
    gpu_series("gpud_gpu_ecc_errors_aggregate", "ECC errors over the GPU's lifetime (aggregate, kept across reboots)",
               ("type",), _ecc(True), kind="counter"),
    gpu_series("gpud_gpu_remapped_rows", "Rows remapped", ("type",),
               lambda s, g: [(["correctable"], s.remapped_rows_correctable),
                             (["uncorrectable"], s.remapped_rows_uncorrectable)]),
    gpu("gpud_gpu_remapped_rows_pending", "1 if a row remapping waits for a GPU reset",
        lambda s, g: _flag(s.remapped_rows_pending)),
    gpu("gpud_gpu_remapped_rows_failure", "1 if a row remapping failed", lambda s, g: _flag(s.remapped_rows_failure)),
    Spec("gpud_gpu_xid_errors", "Xid errors in the kernel log since boot", "counter", (*GPU_LABELS, "xid"), _xids,
         slow=True),
    Spec("gpud_xid_info", "What an Xid means (NVIDIA's Xid catalog) and its class: hardware, application, "
         "informational or unknown", "gauge", ("xid", "class", "meaning"), _xid_info, slow=True),
    gpu("gpud_gpu_processes", "Compute processes on the GPU",
        lambda s, g: len(s.processes) if s.processes is not None else None),
    # -- per user, and the time in each clock-event reason (the last five: the daemon's accounting) --
    Spec("gpud_user_gpu_memory_bytes", "GPU memory held by a user's processes", "gauge", (*GPU_LABELS, "user"),
         _user_memory),
    Spec("gpud_user_gpu_seconds", "GPU-seconds a user's processes occupied GPUs", "counter", ("user",),
         _usage(lambda u: u.user_seconds)),
    Spec("gpud_gpu_clock_event_seconds", "Time spent in each clock-event reason", "counter",
         (*GPU_LABELS, "reason"), _usage(lambda u: u.event_seconds)),
    Spec("gpud_gpu_clock_event_source_info", "Where gpud_gpu_clock_event_seconds_total comes from: NVML's violation "
         "counter (nvml) or gpud's per-tick count (tick)", "gauge", (*GPU_LABELS, "reason", "source"),
         _usage(lambda u: {(*k, v): 1 for k, v in u.event_source.items()})),
    Spec("gpud_gpu_throttled_seconds", "Time held below the requested clocks by power or thermal limits (any of "
         "them)", "counter", GPU_LABELS, _usage(lambda u: u.throttled_seconds)),
    Spec("gpud_gpu_watched_seconds", "Time the GPU's clock events were read (the denominator of the share of time "
         "throttled)", "counter", GPU_LABELS, _usage(lambda u: u.watched_seconds)),
    # -- checks and tuning --
    Spec("gpud_check_status", "Doctor check status: 1 on the current status", "gauge", ("check", "gpu", "status"),
         _checks, slow=True),
    Spec("gpud_profile_info", "The applied tuning profile (none: nothing applied)", "gauge", ("profile",),
         lambda sc: [([sc.obs.profile or "none"], 1)], slow=True),
    Spec("gpud_gpu_profile_active", "1 for the profile each GPU follows now and the rule that switched it (rule "
         "\"\": the base profile)", "gauge", (*GPU_LABELS, "profile", "rule"), _profile_active, slow=True),
    # The same meaning in the daemon and in `gpud metrics`: the setting differs from the applied
    # profile now (in the daemon: after this tick's re-apply), per GPU ("" for the host) and setting.
    Spec("gpud_profile_drift", "1 if the setting differs from the applied profile now", "gauge", ("gpu", "setting"),
         lambda sc: [(["" if i is None else str(i), setting], 1 if d else 0) for i, setting, d in sc.obs.drift]),
    Spec("gpud_profile_reapply", "Settings re-applied after a driver reload, reboot or change behind gpud's back",
         "counter", (), _counter(lambda c: c.reapply_total)),
    Spec("gpud_profile_reapply_failures", "Settings the daemon could not re-apply after they drifted from the "
         "applied profile", "counter", (), _counter(lambda c: c.reapply_failures_total)),
    Spec("gpud_fan_failsafe", "Fans handed back to the driver by the failsafe", "counter", (),
         _counter(lambda c: c.fan_failsafe_total)),
    # -- the last probe --
    Spec("gpud_probe_last_run_timestamp_seconds", "When the last training probe finished", "gauge", (),
         _probe(lambda p: [((), p.finished_at)]), slow=True),
    Spec("gpud_probe_success", "1 if the last probe ran and passed its thresholds", "gauge", (),
         _probe(lambda p: [((), 1 if p.ok else 0)]), slow=True),
    Spec("gpud_probe_ddp_samples_per_second", "DDP training throughput", "gauge", ("world_size",),
         _probe(lambda p: _per_key(p.ddp, "samples_per_second")), slow=True),
    Spec("gpud_probe_ddp_efficiency_ratio", "DDP scaling efficiency against one GPU", "gauge", ("world_size",),
         _probe(lambda p: _per_key(p.ddp, "efficiency")), slow=True),
    Spec("gpud_probe_allreduce_busbw_bytes_per_second", "All-reduce bus bandwidth (peak, nccl-tests' definition)",
         "gauge", ("world_size",), _probe(lambda p: _per_key(p.allreduce, "peak_busbw_bytes_per_second")), slow=True),
    Spec("gpud_probe_p2p_bandwidth_bytes_per_second", "Device-to-device copy bandwidth", "gauge", ("src", "dst"),
         _probe(_p2p), slow=True),
    Spec("gpud_probe_pipeline_speedup_ratio", "Pipeline-parallel throughput against one device", "gauge",
         ("stages",), _probe(lambda p: _per_key(p.pipeline, "speedup")), slow=True),
    # -- the last burn-in --
    Spec("gpud_burnin_last_run_timestamp_seconds", "When the last burn-in started", "gauge", (),
         _burnin(lambda b: [((), float(b.get("started") or 0))]), slow=True),
    Spec("gpud_burnin_success", "1 if the last burn-in passed (warnings allowed)", "gauge", ("level",),
         _burnin(lambda b: [([str(b.get("level"))], 0 if b.get("status") == "fail" else 1)]), slow=True),
    Spec("gpud_burnin_duration_seconds", "The GPUs' time the last burn-in covered", "gauge", ("level",),
         _burnin(lambda b: [([str(b.get("level"))], float(b.get("seconds") or 0))]), slow=True),
    Spec("gpud_burnin_gpu_passed", "1 if the GPU passed every test of the last burn-in", "gauge", GPU_LABELS,
         _burnin(lambda b: _burnin_gpus(b, failed=False)), slow=True),
    Spec("gpud_burnin_gpu_failed_tests", "Tests the GPU failed in the last burn-in", "gauge", GPU_LABELS,
         _burnin(lambda b: _burnin_gpus(b, failed=True)), slow=True),
    # -- health (gpud.doctor.health): gpu="host" and uuid="" for the machine's components --
    Spec("gpud_health_state", "Health per GPU and component: 0 healthy, 1 degraded, 2 unhealthy, -1 unknown (a "
         "source gpud could not read)", "gauge", (*GPU_LABELS, "component"),
         lambda sc: [([h.label, h.uuid, h.component], RANK[h.state]) for h in sc.obs.health], slow=True),
    # ``reason``: what found it (a check's id, ``Xid 48``), never its live figures: a label that carried
    # "94 °C, 1 °C below slowdown" made a new series at every degree (`gpud health` has the whole reason).
    Spec("gpud_health_info", "Health per GPU and component: its state, what found it (a check's id or the Xid) "
         "and the repair action (always 1)", "gauge",
         (*GPU_LABELS, "component", "state", "reason", "action"),
         lambda sc: [([h.label, h.uuid, h.component, h.state, _cause(h.reason), h.action], 1) for h in sc.obs.health],
         slow=True),
)

# Families that change at most every few seconds: the daemon renders them once per change (Renderer).
SLOW_FAMILIES = frozenset(s.name for s in METRICS if s.slow)


def _cause(reason: str) -> str:
    """A health reason's source, without its figures: ``health.thermal: 94 °C, …`` → ``health.thermal``."""
    head, sep, _ = reason.partition(": ")
    if sep:
        return head.strip()[:80]
    return "" if any(c.isdigit() for c in reason) else reason.strip()[:80]  # a figure without its source: left out


def _figure(record: object, key: str) -> float | None:
    """A probe figure from a history record: a number, else None (missing, or of another type)."""
    value = record.get(key) if isinstance(record, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _numeric_first(item: tuple[object, object]) -> tuple[int, str]:
    key = str(item[0])
    return (int(key), "") if key.isdigit() else (2**31, key)


# -- the collector --------------------------------------------------------------------------------

class GpudCollector(Collector):
    def __init__(self, source: Callable[[], Observation], part: str | None = None,
                 specs: Sequence[Spec] = METRICS) -> None:
        self.source = source
        self.part = part  # None: every family; "slow" or "fast": that share of them
        self.specs = [s for s in specs if part is None or s.slow == (part == "slow")]

    def collect(self) -> Iterator[Metric]:
        scope = Scope(self.source())
        for spec in self.specs:
            family = spec.family(scope)
            if family is not None:
                yield family


def registry(source: Callable[[], Observation], part: str | None = None,
             specs: Sequence[Spec] = METRICS) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpudCollector(source, part, specs))
    return reg


def exposition(obs: Observation) -> bytes:
    return generate_latest(registry(lambda: obs))
