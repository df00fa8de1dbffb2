"""The Prometheus exporter: a custom collector over the latest observation.

A scrape never touches the hardware and never waits for the daemon's loop: the loop replaces
one immutable ``Observation`` per tick, and ``collect`` reads whichever is current. Metric names
follow Prometheus conventions (``gpud_`` prefix, base units in names, counters ``_total``,
identity in ``gpud_gpu_info``); per-GPU series carry ``gpu`` (index) and ``uuid``; a reading
NVML cannot give is absent, never 0.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gpud import __version__
from gpud.doctor.health import RANK, Health
from gpud.doctor.xid import describe
from gpud.model import CLOCK_EVENT_REASONS, STATUSES, CheckResult, GpuInfo, Snapshot, XidEvent
from gpud.probe.report import ProbeReport
from gpud.usage import Usage, user_label

# Xids exported at 0 until they happen (the ones doctor knows; others appear when they occur).
WATCHED_XIDS = (13, 31, 43, 45, 48, 61, 62, 63, 64, 69, 74, 79, 92, 94, 95, 119, 120, 140)
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class TickStats:
    """Tick durations as a cumulative histogram (the daemon adds one per tick)."""

    counts: list[int] = field(default_factory=lambda: [0] * len(TICK_BUCKETS))
    total: int = 0
    sum: float = 0.0

    def observe(self, seconds: float) -> None:
        for i, bound in enumerate(TICK_BUCKETS):
            if seconds <= bound:
                self.counts[i] += 1
        self.total += 1
        self.sum += seconds


@dataclass(frozen=True)
class Observation:
    """Everything one scrape exposes; replaced whole, never mutated."""

    snapshot: Snapshot | None
    xids: tuple[XidEvent, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    profile: str | None = None
    drift: tuple[tuple[int | None, str, bool], ...] = ()  # (gpu, setting, differs from the profile now)
    reapply_total: int = 0
    reapply_failures_total: int = 0  # the daemon's re-applies that failed (0 for a one-shot `gpud metrics`)
    fan_failsafe_total: int = 0
    probe: ProbeReport | None = None
    nvml_errors: dict[str, int] = field(default_factory=dict)
    tick: TickStats | None = None
    last_tick: float | None = None
    usage: Usage | None = None  # the daemon's time accounting (None for a one-shot `gpud metrics`)
    burnin: Mapping[str, Any] | None = None  # the last `gpud burnin` document (docs/json.md), or None
    health: tuple[Health, ...] = ()  # gpud.doctor.health: per GPU and component
    # (gpu, profile, rule) of each GPU with a profile: the rule that switched it, "" for the base profile
    profiles: tuple[tuple[int, str, str], ...] = ()


def _gpu_labels(i: int, uuid: str) -> list[str]:
    return [str(i), uuid]


# Families that change at most every few seconds (identity, limits, checks, Xids, profile, probe):
# the daemon renders them once per change, not once per scrape (see Renderer).
SLOW_FAMILIES = {
    "gpud_build_info", "gpud_gpu_info", "gpud_gpu_slowdown_temperature_celsius",
    "gpud_gpu_shutdown_temperature_celsius", "gpud_gpu_power_default_limit_watts", "gpud_gpu_power_min_limit_watts",
    "gpud_gpu_power_max_limit_watts", "gpud_gpu_max_clock_hertz", "gpud_gpu_xid_errors", "gpud_xid_info",
    "gpud_check_status",
    "gpud_profile_info", "gpud_health_state", "gpud_health_info", "gpud_gpu_profile_active",
}


def _slow(name: str) -> bool:
    return name in SLOW_FAMILIES or name.startswith(("gpud_probe_", "gpud_burnin_"))


class GpudCollector(Collector):
    def __init__(self, source: Callable[[], Observation], part: str | None = None) -> None:
        self.source = source
        self.part = part  # None: every family; "slow" or "fast": that share of them

    def collect(self) -> Iterator[Metric]:
        obs = self.source()
        for family in (*self._build(obs), *self._gpus(obs), *self._users(obs), *self._checks_and_tuning(obs),
                       *self._probe(obs), *self._burnin(obs), *_health_families(obs)):
            if self.part is None or _slow(family.name) == (self.part == "slow"):
                yield family

    @staticmethod
    def _build(obs: Observation) -> Iterator[Metric]:
        m = GaugeMetricFamily("gpud_build_info", "gpud's version and Python", labels=["version", "python"])
        m.add_metric([__version__, platform.python_version()], 1)
        yield m
        errs = CounterMetricFamily("gpud_nvml_errors", "NVML calls that failed, by function", labels=["call"])
        for call, n in sorted(obs.nvml_errors.items()):
            errs.add_metric([call], n)
        yield errs
        if obs.tick is not None:
            t = obs.tick
            h = HistogramMetricFamily("gpud_tick_duration_seconds", "Time one daemon tick took")
            buckets = [(str(b), c) for b, c in zip(TICK_BUCKETS, t.counts, strict=True)] + [("+Inf", t.total)]
            h.add_metric([], buckets, t.sum)
            yield h
        if obs.last_tick is not None:
            last = GaugeMetricFamily("gpud_last_tick_timestamp_seconds", "When the daemon last read the GPUs")
            last.add_metric([], obs.last_tick)
            yield last

    @staticmethod
    def _gpus(obs: Observation) -> Iterator[Metric]:  # noqa: C901
        snap = obs.snapshot
        if snap is None:
            return
        infos: dict[int, GpuInfo] = {g.index: g for g in snap.gpus}
        L = ["gpu", "uuid"]

        def g(name: str, doc: str, extra: list[str] | None = None) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=L + (extra or []))

        info = g("gpud_gpu_info", "GPU identity", ["name", "pci_bus_id", "driver_version"])
        up = g("gpud_gpu_up", "1 if the GPU answers NVML, 0 if it is lost")
        temp = g("gpud_gpu_temperature_celsius", "GPU temperature")
        slow = g("gpud_gpu_slowdown_temperature_celsius", "Temperature at which the GPU slows down")
        shut = g("gpud_gpu_shutdown_temperature_celsius", "Temperature at which the GPU shuts down")
        fan = g("gpud_gpu_fan_speed_ratio", "Fan speed (0-1)", ["fan"])
        fan_target = g("gpud_gpu_fan_target_ratio", "Fan target speed (0-1)", ["fan"])
        fan_manual = g("gpud_gpu_fan_manual", "1 if the fan is in manual mode (gpud or another tool drives it)",
                       ["fan"])
        power = g("gpud_gpu_power_watts", "Power draw")
        limit = g("gpud_gpu_power_limit_watts", "Enforced power limit")
        default = g("gpud_gpu_power_default_limit_watts", "Default power limit")
        pmin = g("gpud_gpu_power_min_limit_watts", "Lowest settable power limit")
        pmax = g("gpud_gpu_power_max_limit_watts", "Highest settable power limit")
        energy = CounterMetricFamily("gpud_gpu_energy_joules", "Energy used since the driver loaded", labels=L)
        clock = g("gpud_gpu_clock_hertz", "Current clock", ["clock"])
        max_clock = g("gpud_gpu_max_clock_hertz", "Maximum clock", ["clock"])
        util = g("gpud_gpu_utilization_ratio", "GPU utilisation (0-1)")
        mem_util = g("gpud_gpu_memory_utilization_ratio", "Memory controller utilisation (0-1)")
        used = g("gpud_gpu_memory_used_bytes", "GPU memory used")
        total = g("gpud_gpu_memory_total_bytes", "GPU memory total")
        gen = g("gpud_gpu_pcie_link_generation", "PCIe link generation", ["kind"])
        width = g("gpud_gpu_pcie_link_width", "PCIe link width (lanes)", ["kind"])
        thr = g("gpud_gpu_pcie_throughput_bytes_per_second", "PCIe throughput", ["direction"])
        replay = CounterMetricFamily("gpud_gpu_pcie_replay_errors", "PCIe replays since boot", labels=L)
        nvl = g("gpud_gpu_nvlink_link_up", "1 if the NVLink is active", ["link"])
        nvl_err = CounterMetricFamily("gpud_gpu_nvlink_errors", "NVLink errors since the driver loaded "
                                      "(replay, recovery, crc_flit, crc_data)", labels=L + ["link", "type"])
        events = g("gpud_gpu_clock_event_active", "1 while the clock-event reason is active", ["reason"])
        nvl_data = CounterMetricFamily("gpud_gpu_nvlink_data_bytes", "NVLink data sent (tx) and received (rx) "
                                       "since the driver loaded, per link", labels=L + ["link", "direction"])
        persistence = g("gpud_gpu_persistence_mode", "1 if persistence mode is on")
        ecc = CounterMetricFamily("gpud_gpu_ecc_errors", "ECC errors since boot (volatile)", labels=L + ["type"])
        ecc_life = CounterMetricFamily("gpud_gpu_ecc_errors_aggregate", "ECC errors over the GPU's lifetime "
                                       "(aggregate, kept across reboots)", labels=L + ["type"])
        rows = g("gpud_gpu_remapped_rows", "Rows remapped", ["type"])
        rows_pending = g("gpud_gpu_remapped_rows_pending", "1 if a row remapping waits for a GPU reset")
        rows_failed = g("gpud_gpu_remapped_rows_failure", "1 if a row remapping failed")
        xid = CounterMetricFamily("gpud_gpu_xid_errors", "Xid errors in the kernel log since boot",
                                  labels=L + ["xid"])
        procs = g("gpud_gpu_processes", "Compute processes on the GPU")
        driver = snap.versions.driver or ""
        by_bus = {gi.pci_bus_id: gi for gi in infos.values()}
        for s in snap.samples:
            gi = infos.get(s.index)
            uuid = s.uuid or (gi.uuid if gi else "")
            lab = _gpu_labels(s.index, uuid)
            up.add_metric(lab, 0 if s.lost else 1)
            if gi is not None:
                info.add_metric(lab + [gi.name, gi.pci_bus_id, driver], 1)
            if s.lost:
                continue
            _opt(temp, lab, s.temperature_celsius)
            if gi is not None:
                _opt(slow, lab, gi.temperature_slowdown_celsius)
                _opt(shut, lab, gi.temperature_shutdown_celsius)
                _opt(default, lab, gi.power_default_limit_watts)
                _opt(pmin, lab, gi.power_min_limit_watts)
                _opt(pmax, lab, gi.power_max_limit_watts)
                for k, v in gi.max_clocks_mhz.items():
                    _opt(max_clock, lab + [k], v * 1e6 if v is not None else None)
                _opt(gen, lab + ["max"], gi.pcie_max_generation)
                _opt(width, lab + ["max"], gi.pcie_max_width)
            for f in s.fans:
                _opt(fan, lab + [str(f.fan)], f.speed_percent / 100 if f.speed_percent is not None else None)
                _opt(fan_target, lab + [str(f.fan)], f.target_percent / 100 if f.target_percent is not None else None)
                if f.policy is not None:
                    fan_manual.add_metric(lab + [str(f.fan)], 1 if f.policy == "manual" else 0)
            _opt(power, lab, s.power_watts)
            _opt(limit, lab, s.power_limit_watts)
            if s.energy_joules is not None:
                energy.add_metric(lab, s.energy_joules)
            for k, v in s.clocks_mhz.items():
                _opt(clock, lab + [k], v * 1e6 if v is not None else None)
            _opt(util, lab, s.utilization_gpu_percent / 100 if s.utilization_gpu_percent is not None else None)
            _opt(mem_util, lab, s.utilization_memory_percent / 100 if s.utilization_memory_percent is not None
                 else None)
            _opt(used, lab, s.memory_used_bytes)
            _opt(total, lab, s.memory_total_bytes)
            _opt(gen, lab + ["current"], s.pcie_generation)
            _opt(width, lab + ["current"], s.pcie_width)
            _opt(thr, lab + ["tx"], s.pcie_tx_bytes_per_second)
            _opt(thr, lab + ["rx"], s.pcie_rx_bytes_per_second)
            if s.pcie_replay_errors is not None:
                replay.add_metric(lab, s.pcie_replay_errors)
            for ln in s.nvlinks:
                nvl.add_metric(lab + [str(ln.link)], 1 if ln.up else 0)
            for link, kind, n in s.nvlink_errors or ():
                nvl_err.add_metric(lab + [str(link), kind], n)
            for link, direction, n in s.nvlink_data_bytes or ():
                nvl_data.add_metric(lab + [str(link), direction], n)
            if s.clock_events is not None:
                active = set(s.clock_events)
                for _, reason in CLOCK_EVENT_REASONS:
                    events.add_metric(lab + [reason], 1 if reason in active else 0)
            if s.persistence_mode is not None:
                persistence.add_metric(lab, 1 if s.persistence_mode else 0)
            if s.ecc_errors is not None:
                for kind, v in (("corrected", s.ecc_errors.volatile_corrected),
                                ("uncorrected", s.ecc_errors.volatile_uncorrected)):
                    if v is not None:
                        ecc.add_metric(lab + [kind], v)
                for kind, v in (("corrected", s.ecc_errors.aggregate_corrected),
                                ("uncorrected", s.ecc_errors.aggregate_uncorrected)):
                    if v is not None:
                        ecc_life.add_metric(lab + [kind], v)
            _opt(rows, lab + ["correctable"], s.remapped_rows_correctable)
            _opt(rows, lab + ["uncorrectable"], s.remapped_rows_uncorrectable)
            if s.remapped_rows_pending is not None:
                rows_pending.add_metric(lab, 1 if s.remapped_rows_pending else 0)
            if s.remapped_rows_failure is not None:
                rows_failed.add_metric(lab, 1 if s.remapped_rows_failure else 0)
            if s.processes is not None:
                procs.add_metric(lab, len(s.processes))
        counts: Counter[tuple[int, str, int]] = Counter()
        for gi in infos.values():  # known Xids start at 0, so that the first one shows as an increase
            for x in WATCHED_XIDS:
                counts[(gi.index, gi.uuid, x)] += 0
        for e in obs.xids:
            gi = by_bus.get(e.pci_bus_id)
            if gi is not None:
                counts[(gi.index, gi.uuid, e.xid)] += 1
        for (i, uuid, x), n in sorted(counts.items()):
            xid.add_metric(_gpu_labels(i, uuid) + [str(x)], n)
        xinfo = GaugeMetricFamily("gpud_xid_info", "What an Xid means (NVIDIA's Xid catalog) and its class: "
                                  "hardware, application, informational or unknown", labels=["xid", "class", "meaning"])
        for x in sorted({x for _, _, x in counts}):
            d = describe(x)
            xinfo.add_metric([str(x), d.kind, d.meaning], 1)
        yield from (info, up, temp, slow, shut, fan, fan_target, fan_manual, power, limit, default, pmin, pmax,
                    energy, clock, max_clock, util, mem_util, used, total, gen, width, thr, replay, nvl, nvl_err,
                    nvl_data, events, persistence, ecc, ecc_life, rows, rows_pending, rows_failed, xid, xinfo, procs)

    @staticmethod
    def _users(obs: Observation) -> Iterator[Metric]:
        """Per user, not per process (bounded cardinality: ``gpud.usage.MAX_USERS`` names, then ``other``),
        and the time in each clock-event reason."""
        snap, usage = obs.snapshot, obs.usage
        mem = GaugeMetricFamily("gpud_user_gpu_memory_bytes", "GPU memory held by a user's processes",
                                labels=["gpu", "uuid", "user"])
        if snap is not None:
            named = list(usage.named) if usage is not None else []
            for s in snap.samples:
                per: dict[str, int] = {}
                for p in s.processes or ():
                    label = user_label(p.user, named)
                    if label not in named and label not in ("other", "unknown"):
                        named.append(label)
                    per[label] = per.get(label, 0) + (p.used_memory_bytes or 0)
                for user, n in sorted(per.items()):
                    mem.add_metric([str(s.index), s.uuid, user], n)
        yield mem
        if usage is None:
            return
        secs = CounterMetricFamily("gpud_user_gpu_seconds", "GPU-seconds a user's processes occupied GPUs",
                                   labels=["user"])
        for user, t in sorted(usage.user_seconds.items()):
            secs.add_metric([user], t)
        yield secs
        ev = CounterMetricFamily("gpud_gpu_clock_event_seconds", "Time spent in each clock-event reason",
                                 labels=["gpu", "uuid", "reason"])
        for (gpu, uuid, reason), t in sorted(usage.event_seconds.items()):
            ev.add_metric([str(gpu), uuid, reason], t)
        yield ev
        src = GaugeMetricFamily("gpud_gpu_clock_event_source_info", "Where gpud_gpu_clock_event_seconds_total "
                                "comes from: NVML's violation counter (nvml) or gpud's per-tick count (tick)",
                                labels=["gpu", "uuid", "reason", "source"])
        for (gpu, uuid, reason), source in sorted(usage.event_source.items()):
            src.add_metric([str(gpu), uuid, reason, source], 1)
        yield src
        thr = CounterMetricFamily("gpud_gpu_throttled_seconds", "Time held below the requested clocks by power or "
                                  "thermal limits (any of them)", labels=["gpu", "uuid"])
        for (gpu, uuid), t in sorted(usage.throttled_seconds.items()):
            thr.add_metric([str(gpu), uuid], t)
        yield thr
        watched = CounterMetricFamily("gpud_gpu_watched_seconds", "Time the GPU's clock events were read (the "
                                      "denominator of the share of time throttled)", labels=["gpu", "uuid"])
        for (gpu, uuid), t in sorted(usage.watched_seconds.items()):
            watched.add_metric([str(gpu), uuid], t)
        yield watched

    @staticmethod
    def _checks_and_tuning(obs: Observation) -> Iterator[Metric]:
        checks = GaugeMetricFamily("gpud_check_status", "Doctor check status: 1 on the current status",
                                   labels=["check", "gpu", "status"])
        worst: dict[tuple[str, str], str] = {}
        rank = {s: i for i, s in enumerate(("skip", "pass", "warn", "fail"))}
        for r in obs.checks:
            key = (r.id, "" if r.gpu is None else str(r.gpu))
            if key not in worst or rank[r.status] > rank[worst[key]]:
                worst[key] = r.status
        for (cid, gpu), status in sorted(worst.items()):
            for st in STATUSES:
                checks.add_metric([cid, gpu, st], 1 if st == status else 0)
        yield checks
        prof = GaugeMetricFamily("gpud_profile_info", "The applied tuning profile (none: nothing applied)",
                                 labels=["profile"])
        prof.add_metric([obs.profile or "none"], 1)
        yield prof
        uuids = {x.index: x.uuid for x in obs.snapshot.samples} if obs.snapshot is not None else {}
        active = GaugeMetricFamily("gpud_gpu_profile_active", "1 for the profile each GPU follows now and the rule "
                                   "that switched it (rule \"\": the base profile)",
                                   labels=["gpu", "uuid", "profile", "rule"])
        for gpu_index, name, rule in obs.profiles:
            active.add_metric([*_gpu_labels(gpu_index, uuids.get(gpu_index, "")), name, rule], 1)
        yield active
        # The same meaning in the daemon and in `gpud metrics`: the setting differs from the applied
        # profile now (in the daemon: after this tick's re-apply), per GPU ("" for the host) and setting.
        drift = GaugeMetricFamily("gpud_profile_drift", "1 if the setting differs from the applied profile now",
                                  labels=["gpu", "setting"])
        for index, setting, drifted in obs.drift:
            drift.add_metric(["" if index is None else str(index), setting], 1 if drifted else 0)
        yield drift
        re = CounterMetricFamily("gpud_profile_reapply", "Settings re-applied after a driver reload, reboot or "
                                                         "change behind gpud's back")
        re.add_metric([], obs.reapply_total)
        yield re
        ref = CounterMetricFamily("gpud_profile_reapply_failures", "Settings the daemon could not re-apply "
                                                                   "after they drifted from the applied profile")
        ref.add_metric([], obs.reapply_failures_total)
        yield ref
        fs = CounterMetricFamily("gpud_fan_failsafe", "Fans handed back to the driver by the failsafe")
        fs.add_metric([], obs.fan_failsafe_total)
        yield fs

    @staticmethod
    def _burnin(obs: Observation) -> Iterator[Metric]:
        return _burnin_families(obs)

    @staticmethod
    def _probe(obs: Observation) -> Iterator[Metric]:
        p = obs.probe
        last = GaugeMetricFamily("gpud_probe_last_run_timestamp_seconds", "When the last training probe finished")
        ok = GaugeMetricFamily("gpud_probe_success", "1 if the last probe ran and passed its thresholds")
        sps = GaugeMetricFamily("gpud_probe_ddp_samples_per_second", "DDP training throughput", labels=["world_size"])
        eff = GaugeMetricFamily("gpud_probe_ddp_efficiency_ratio", "DDP scaling efficiency against one GPU",
                                labels=["world_size"])
        busbw = GaugeMetricFamily("gpud_probe_allreduce_busbw_bytes_per_second", "All-reduce bus bandwidth (peak, "
                                  "nccl-tests' definition)", labels=["world_size"])
        p2p = GaugeMetricFamily("gpud_probe_p2p_bandwidth_bytes_per_second", "Device-to-device copy bandwidth",
                                labels=["src", "dst"])
        pipe = GaugeMetricFamily("gpud_probe_pipeline_speedup_ratio", "Pipeline-parallel throughput against one "
                                 "device", labels=["stages"])
        if p:
            last.add_metric([], p.finished_at)
            ok.add_metric([], 1 if p.ok else 0)
            # A history record from another version may lack a figure: absent, never a failed scrape.
            for ws, r in sorted(p.ddp.items(), key=_numeric_first):
                _opt(sps, [str(ws)], _figure(r, "samples_per_second"))
                _opt(eff, [str(ws)], _figure(r, "efficiency"))
            for ws, r in sorted(p.allreduce.items(), key=_numeric_first):
                _opt(busbw, [str(ws)], _figure(r, "peak_busbw_bytes_per_second"))
            for pair in p.p2p_pairs:
                if isinstance(pair, dict) and "src" in pair and "dst" in pair:
                    _opt(p2p, [str(pair["src"]), str(pair["dst"])], _figure(pair, "bandwidth_bytes_per_second"))
            for stages, r in sorted(p.pipeline.items(), key=_numeric_first):
                _opt(pipe, [str(stages)], _figure(r, "speedup"))
        yield from (last, ok, sps, eff, busbw, p2p, pipe)


def _burnin_families(obs: Observation) -> Iterator[Metric]:
    """The last burn-in (``gpud burnin``): when, its verdict, and per GPU whether it passed and how many
    of its tests failed. Absent until a burn-in has run."""
    b = obs.burnin
    last = GaugeMetricFamily("gpud_burnin_last_run_timestamp_seconds", "When the last burn-in started")
    ok = GaugeMetricFamily("gpud_burnin_success", "1 if the last burn-in passed (warnings allowed)",
                           labels=["level"])
    secs = GaugeMetricFamily("gpud_burnin_duration_seconds", "The GPUs' time the last burn-in covered",
                             labels=["level"])
    gpu_ok = GaugeMetricFamily("gpud_burnin_gpu_passed", "1 if the GPU passed every test of the last burn-in",
                               labels=["gpu", "uuid"])
    failed = GaugeMetricFamily("gpud_burnin_gpu_failed_tests", "Tests the GPU failed in the last burn-in",
                               labels=["gpu", "uuid"])
    if b:
        level = str(b.get("level"))
        last.add_metric([], float(b.get("started") or 0))
        ok.add_metric([level], 0 if b.get("status") == "fail" else 1)
        secs.add_metric([level], float(b.get("seconds") or 0))
        for g in b.get("gpus") or []:
            labels = [str(g.get("index")), str(g.get("uuid") or "")]
            gpu_ok.add_metric(labels, 0 if g.get("status") == "fail" else 1)
            failed.add_metric(labels, sum(1 for v in b.get("verdicts") or []
                                          if v.get("gpu") == g.get("index") and v.get("status") == "fail"))
    yield from (last, ok, secs, gpu_ok, failed)


def _health_families(obs: Observation) -> Iterator[Metric]:
    """Health states (gpud.doctor.health): one series per GPU and component, ``gpu="host"`` and
    ``uuid=""`` for the machine's; the reason and repair action in the info family."""
    state = GaugeMetricFamily("gpud_health_state", "Health per GPU and component: 0 healthy, 1 degraded, "
                              "2 unhealthy, -1 unknown (a source gpud could not read)",
                              labels=["gpu", "uuid", "component"])
    info = GaugeMetricFamily("gpud_health_info", "Health per GPU and component: its state, reason and repair "
                             "action (always 1)", labels=["gpu", "uuid", "component", "state", "reason", "action"])
    for h in obs.health:
        labels = [h.label, h.uuid, h.component]
        state.add_metric(labels, RANK[h.state])
        info.add_metric([*labels, h.state, h.reason[:300], h.action], 1)
    yield from (state, info)


def _figure(record: object, key: str) -> float | None:
    """A probe figure from a history record: a number, else None (missing, or of another type)."""
    value = record.get(key) if isinstance(record, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _numeric_first(item: tuple[object, object]) -> tuple[int, str]:
    """World sizes and stage counts in numeric order; a key that is no number sorts last."""
    key = str(item[0])
    return (int(key), "") if key.isdigit() else (2**31, key)


def _opt(family: GaugeMetricFamily, labels: list[str], value: float | int | None) -> None:
    """Unsupported is not zero: a None reading is simply absent."""
    if value is not None:
        family.add_metric(labels, float(value))


def registry(source: Callable[[], Observation], part: str | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GpudCollector(source, part))
    return reg


def exposition(obs: Observation) -> bytes:
    return generate_latest(registry(lambda: obs))


class Renderer:
    """Renders expositions for the daemon: the slow families are formatted again only when their
    inputs changed (a doctor run, new Xids, a profile switch, a probe result), the rest each time.
    Formatting is most of a scrape's cost (prometheus_client escapes every label of every sample)."""

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._slow = b""

    def render(self, obs: Observation) -> bytes:
        snap = obs.snapshot
        key = (tuple(id(g) for g in snap.gpus) if snap else (), snap.versions if snap else None, id(obs.checks),
               obs.xids, id(obs.probe), obs.profile, id(obs.burnin), id(obs.health), obs.profiles)
        if key != self._key:
            self._slow = generate_latest(registry(lambda: obs, "slow"))
            self._key = key
        return self._slow + generate_latest(registry(lambda: obs, "fast"))
