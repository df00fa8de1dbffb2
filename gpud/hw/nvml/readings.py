"""A GPU's sample (one tick's readings), the burn-in's telemetry and the off-tick sampler."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

from gpud.errors import (
    DriverNotLoaded,
    GpuUnusable,
    NvmlError,
    PermissionDenied,
)
from gpud.hw.nvml.constants import (
    CLOCK_TYPES,
    COMPUTE_MODES,
    FAN_POLICY,
    FI_PCIE_RX_BYTES,
    FI_PCIE_TX_BYTES,
    OFFTICK_EVERY_S,
    PCIE_RX,
    PCIE_SAMPLE_EVERY_S,
    PCIE_TX,
    log,
)
from gpud.hw.nvml.counters import Counters
from gpud.hw.nvml.handles import NvmlClient
from gpud.hw.nvml.info import Info
from gpud.hw.nvml.processes import Processes
from gpud.hw.nvml.values import field_int, watts
from gpud.model import (
    FanReading,
    GpuInfo,
    GpuProcess,
    GpuSample,
    decode_clock_events,
    held_over,
)

# A sampled PCIe throughput older than this reads as unknown: one sample missed, and a round's delay besides.
PCIE_SAMPLE_STALE_S = 2 * PCIE_SAMPLE_EVERY_S + OFFTICK_EVERY_S


class Readings:
    """A GPU's sample (one tick's readings), the burn-in's telemetry and the off-tick sampler."""

    def __init__(self, client: NvmlClient, info: Info, processes: Processes, counters: Counters) -> None:
        self._c = client
        self._info = info
        self._processes = processes
        self._counters = counters
        self._pcie_counts: dict[int, tuple[float, int, int]] = {}  # cumulative byte counters, last tick
        self._pcie_sampled: dict[int, tuple[float, int, int]] = {}  # (when, TX B/s, RX B/s) off the tick
        self._pcie_counter_ok: set[int] = set()  # GPUs whose cumulative PCIe byte counters answer
        self.offtick = False  # a sampler thread reads the blocking readings; the tick uses its results
        client.on_renumber(self._forget)

    def _forget(self) -> None:
        for cache in (self._pcie_counts, self._pcie_sampled, self._pcie_counter_ok):
            cache.clear()

    # -- one reading per tick ---------------------------------------------------------
    def sample(self, index: int) -> GpuSample:
        """Read one GPU's telemetry. A lost GPU gives a sample with ``lost=True``."""
        with self._c.lock:  # once for the whole sample: the calls inside re-enter it cheaply
            return self._sample_locked(index)

    def reading_all(self) -> contextlib.AbstractContextManager[None]:
        """Held while a snapshot reads every GPU (``Machine.snapshot``): the sampler's blocking calls wait."""
        return self._c.gate.tick()

    def _sample_locked(self, index: int, read: Callable[[int, GpuInfo, float], GpuSample] | None = None) -> GpuSample:
        """``read`` (default: the whole ``_sample``) under the one translation of a lost or unusable GPU."""
        now = time.time()
        cached = self._info.cached(index)
        try:
            info = self._info.info(index)
            return (read or self._sample)(index, info, now)
        except DriverNotLoaded:
            raise
        except NvmlError as err:  # lost, or a reading every GPU must give failed: this GPU only
            self._c.forget_handle(index)  # look the GPU up again next time: it may come back
            if cached is None:
                self._info.drop(index)
            return GpuSample(index=index, uuid=cached.uuid if cached else "", timestamp=now, lost=True,
                             error=str(err), inaccessible=isinstance(err, PermissionDenied),
                             cause=err.cause if isinstance(err, GpuUnusable) else None)

    def _sample(self, index: int, info: GpuInfo, now: float) -> GpuSample:
        c = self._c
        h, get = c.reader(index)

        slow = self._counters.slow_fields(index, h, info, now)
        fans: list[FanReading] = []
        if info.fan_count is not None:
            for fan in range(info.fan_count):
                policy = slow.fan_policies[fan]
                fans.append(
                    FanReading(
                        fan=fan,
                        speed_percent=get("nvmlDeviceGetFanSpeed_v2", fan),
                        target_percent=get("nvmlDeviceGetTargetFanSpeed", fan),
                        policy=FAN_POLICY.get(policy) if policy is not None else None,
                    )
                )
        else:
            speed = get("nvmlDeviceGetFanSpeed")
            if speed is not None:
                fans.append(FanReading(0, speed, None, None))
        util = get("nvmlDeviceGetUtilizationRates")
        used, total, reserved, free = self._memory(index, h)
        tx, rx = self.pcie_rates(index, h, now)
        events = self._clock_event_mask(get)
        persistence, compute = slow.persistence, slow.compute
        ecc_mode, ecc, sbe, dbe, retired_pending, remap, replay = (
            slow.ecc_mode, slow.ecc, slow.sbe, slow.dbe, slow.retired_pending, slow.remap, slow.replay)
        ecc_on = bool(ecc_mode[0]) if ecc_mode is not None else None
        procs = self._processes.offtick(index, now) if self.offtick else self._processes.read(index, h)
        processes = tuple(
            GpuProcess(pid=p.pid, used_memory_bytes=p.usedGpuMemory, user=None, command=None,
                       kind=getattr(p, "kind", "compute"), sm_utilization_percent=getattr(p, "sm", None),
                       gpu_instance_id=getattr(p, "gi", None), compute_instance_id=getattr(p, "ci", None))
            for p in procs
        ) if procs is not None else None
        mig_on = bool(slow.mig[0]) if slow.mig is not None else None
        return GpuSample(
            index=index,
            uuid=info.uuid,
            timestamp=now,
            temperature_celsius=self._info.temperature(h, index),
            fans=tuple(fans),
            power_watts=watts(get("nvmlDeviceGetPowerUsage")),
            power_limit_watts=watts(get("nvmlDeviceGetEnforcedPowerLimit")),
            power_management_limit_watts=watts(slow.management_limit),
            energy_joules=watts(get("nvmlDeviceGetTotalEnergyConsumption")),
            clocks_mhz={k: get("nvmlDeviceGetClockInfo", v) for k, v in CLOCK_TYPES.items()},
            applications_clocks_mhz=slow.applications_clocks,
            utilization_gpu_percent=util.gpu if util is not None else None,
            utilization_memory_percent=util.memory if util is not None else None,
            memory_used_bytes=used,
            memory_total_bytes=total,
            memory_reserved_bytes=reserved,
            memory_free_bytes=free,
            pcie_generation=get("nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_width=slow.pcie_width,
            pcie_tx_bytes_per_second=tx,
            pcie_rx_bytes_per_second=rx,
            pcie_replay_errors=replay,
            clock_event_mask=events,
            clock_events=decode_clock_events(events) if events is not None else None,
            persistence_mode=bool(persistence) if persistence is not None else None,
            compute_mode=COMPUTE_MODES.get(compute, str(compute)) if compute is not None else None,
            mig_mode=mig_on,
            mig_instances=self._processes.mig_instances(index, h, processes) if mig_on else None,
            ecc_enabled=ecc_on,
            ecc_pending=bool(ecc_mode[1]) if ecc_mode is not None else None,
            ecc_errors=ecc,
            retired_pages_single_bit=len(sbe) if sbe is not None else None,
            retired_pages_double_bit=len(dbe) if dbe is not None else None,
            retired_pages_pending=bool(retired_pending) if retired_pending is not None else None,
            remapped_rows_correctable=remap[0] if remap is not None else None,
            remapped_rows_uncorrectable=remap[1] if remap is not None else None,
            remapped_rows_pending=bool(remap[2]) if remap is not None else None,
            remapped_rows_failure=bool(remap[3]) if remap is not None else None,
            nvlinks=slow.nvlinks,
            nvlink_errors=slow.nvlink_errors,
            clock_event_nanoseconds=slow.violations,
            nvlink_data_bytes=slow.nvlink_data,
            clock_offsets_mhz=slow.clock_offsets,
            processes=processes,
        )

    def settings_held(self, index: int) -> bool:
        """Whether this GPU's settings as last read still stand: False after gpud wrote one (a write drops
        the slow fields, so the next ``sample`` reads them afresh) until a whole sample reads them again."""
        return self._counters.held(index)

    def quick_sample(self, index: int, whole: GpuSample) -> GpuSample:
        """``whole`` (this GPU's latest ``sample``) with what the daemon's fan loop and the power figures
        need each second read afresh: the temperature and the power draw (2 plain calls where ``sample``
        makes about 16). The rest stays as ``whole`` read it, the fans' speeds included: a speed reading is
        the slowest plain one (137 µs, docs/simulation.md, "Call latency") and says what the fan is asked
        for (nvml.h, ``nvmlDeviceGetFanSpeed_v2``), which gpud's curve wrote itself (a write makes the next
        tick whole) or the driver's policy sets; the daemon reads a whole sample every few ticks
        (``gpud.daemon.tick.WHOLE_EVERY_S``). A lost GPU reads as in ``sample``."""

        c = self._c

        def read(i: int, info: GpuInfo, now: float) -> GpuSample:
            h = c.handle(i)
            power = c.get("nvmlDeviceGetPowerUsage", h, gpu=i)
            return held_over(whole, timestamp=now, temperature_celsius=self._info.temperature(h, i),
                             power_watts=power / 1000.0 if power is not None else None)

        with c.lock:
            return self._sample_locked(index, read)

    def _memory(self, index: int, h: Any) -> tuple[int | None, int | None, int | None, int | None]:
        """(used, total, reserved, free) bytes: ``nvmlDeviceGetMemoryInfo_v2`` keeps the driver's
        reservation apart (nvml.h: v1's ``used`` is reserved + allocated); v1 where the driver or the
        bindings lack it (reserved unknown)."""
        version = getattr(self._c.module, "nvmlMemory_v2", None)
        v2 = self._c.get("nvmlDeviceGetMemoryInfo", h, version, gpu=index) if version is not None else None
        if v2 is not None:
            return int(v2.used), int(v2.total), int(v2.reserved), int(v2.free)
        mem = self._c.get("nvmlDeviceGetMemoryInfo", h, gpu=index)
        if mem is None:
            return None, None, None, None
        return int(mem.used), int(mem.total), None, int(mem.free)

    def pcie_rates(self, index: int, h: Any, now: float) -> tuple[int | None, int | None]:
        """PCIe TX/RX bytes per second without blocking the tick: from NVML's cumulative byte counters
        (two ticks apart) where the GPU has them, else the latest off-tick ``sample_pcie`` result."""
        # Every id Not Supported: no counters, not asked again (a call that fails whole is asked again).
        values = self._counters.field_values(index, h, [FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES], "pcie_bytes", retry_s=None)
        if values is not None:
            counts = [field_int(v) for v in values]
            if None not in counts:
                self._pcie_counter_ok.add(index)
                (tx, bits), (rx, _) = counts  # type: ignore[misc]
                last = self._pcie_counts.get(index)
                self._pcie_counts[index] = (now, tx, rx)
                if last is not None and now > last[0]:
                    dt, wrap = now - last[0], 1 << bits  # "Value can be wrapped" (nvml.h): modulo its width
                    return int((tx - last[1]) % wrap / dt), int((rx - last[2]) % wrap / dt)
            elif any(int(v.nvmlReturn) == 3 for v in values):  # one of the pair missing: no use either
                self._counters.never_ask(index, "pcie_bytes")
        sampled = self._pcie_sampled.get(index)  # no counters, or no earlier count yet
        if sampled is None or now - sampled[0] > PCIE_SAMPLE_STALE_S:
            return None, None
        return sampled[1], sampled[2]

    def needs_pcie_sampling(self, index: int) -> bool:
        """No working byte counters (yet) and a throughput call that answers."""
        return (index not in self._pcie_counter_ok
                and not self._c.unsupported(("nvmlDeviceGetPcieThroughput", index, (PCIE_TX,))))

    def pcie_counters_work(self, index: int) -> bool:
        """Whether the GPU's cumulative PCIe byte counters answered (no throughput call needed)."""
        return index in self._pcie_counter_ok

    def sample_pcie(self, index: int) -> None:
        """Read ``nvmlDeviceGetPcieThroughput`` (each call counts bytes over 20 ms, NVML reference) for
        one GPU *without* holding gpud's NVML lock, so a tick never waits for it. NVML itself is
        thread-safe. Meant for a sampler thread (the daemon) or a one-shot read of all GPUs at once."""
        c = self._c
        try:
            h = c.handle(index)
        except NvmlError:
            return
        rates: list[int] = []
        for counter in (PCIE_TX, PCIE_RX):
            key = ("nvmlDeviceGetPcieThroughput", index, (counter,))

            def read(which: int = counter) -> Any:
                with c.gate.call():
                    return c.raw("nvmlDeviceGetPcieThroughput", h, which, gpu=index)

            kbs = c.optional(key, read)
            if kbs is None:
                return
            rates.append(int(kbs) * 1024)
        self._pcie_sampled[index] = (time.time(), rates[0], rates[1])

    def pcie_due(self, index: int, now: float) -> bool:
        """Whether the sampler's PCIe throughput of this GPU is due (``PCIE_SAMPLE_EVERY_S``, within half a round:
        a round that finds it a little early takes it rather than the next, a round later)."""
        sampled = self._pcie_sampled.get(index)
        return sampled is None or not 0 <= now - sampled[0] < PCIE_SAMPLE_EVERY_S - OFFTICK_EVERY_S / 2

    def sample_offtick(self, index: int, processes: bool = False, pcie_when_due: bool = False) -> None:
        """The blocking readings of one GPU, without gpud's lock: PCIe throughput where there are no
        byte counters (``pcie_when_due``, the sampler's rounds: only when ``pcie_due``; else now), and
        (``processes``) the process list. Never raises an NvmlError: the sampler runs it."""
        try:
            if self.needs_pcie_sampling(index) and (not pcie_when_due or self.pcie_due(index, time.time())):
                self.sample_pcie(index)
            if processes:
                self._processes.read_offtick(index)
        except NvmlError as err:  # a lost GPU or a missing driver: the tick reports it
            log.debug("off-tick readings of GPU %d: %s", index, err)

    def fresh_sample(self, index: int) -> GpuSample:
        """``sample`` with the health counters (ECC, retired pages, remapped rows, replays, NVLink errors)
        read now rather than up to ``SLOW_EVERY_S`` ago: a burn-in's before and after."""
        self._counters.drop(index)
        return self.sample(index)

    def telemetry(self, index: int) -> GpuSample:
        """The readings a load test follows each second, and nothing else (about 10 plain calls, none
        blocking): temperature, fans (as asked), power and its enforced limit, SM and memory clocks,
        utilisation, clock-event reasons, the PCIe link's generation and width. ``sample`` gives the
        whole picture (health counters, processes) at 10× the cost; a lost GPU reads as it does there."""
        with self._c.lock:
            return self._sample_locked(index, self._telemetry)

    def _telemetry(self, index: int, info: GpuInfo, now: float) -> GpuSample:
        c = self._c
        h = c.handle(index)

        def get(name: str, *args: Any) -> Any:
            return c.get(name, h, *args, gpu=index)

        fans = tuple(FanReading(f, get("nvmlDeviceGetFanSpeed_v2", f), None, None) for f in range(info.fan_count or 0))
        events = self._clock_event_mask(get)
        power, limit = get("nvmlDeviceGetPowerUsage"), get("nvmlDeviceGetEnforcedPowerLimit")
        util = get("nvmlDeviceGetUtilizationRates")
        return GpuSample(
            index=index, uuid=info.uuid, timestamp=now, temperature_celsius=self._info.temperature(h, index),
            fans=fans, power_watts=power / 1000.0 if power is not None else None,
            power_limit_watts=limit / 1000.0 if limit is not None else None,
            clocks_mhz={k: get("nvmlDeviceGetClockInfo", CLOCK_TYPES[k]) for k in ("sm", "memory")},
            utilization_gpu_percent=util.gpu if util is not None else None,
            pcie_generation=get("nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_width=get("nvmlDeviceGetCurrPcieLinkWidth"),
            clock_event_mask=events,
            clock_events=decode_clock_events(events) if events is not None else None)

    @staticmethod
    def _clock_event_mask(get: Callable[..., Any]) -> Any:
        """The clock-event reasons bitmask: the R535+ name, else the older "throttle" one."""
        events = get("nvmlDeviceGetCurrentClocksEventReasons")
        return events if events is not None else get("nvmlDeviceGetCurrentClocksThrottleReasons")

    def sample_pcie_all(self, indices: list[int], processes: bool = False, pcie_when_due: bool = False) -> None:
        """Every GPU's blocking readings, one GPU after the other in the calling thread. The driver
        serialises NVML calls on its RM lock and ``TickGate`` lets one sampler call through at a time, so a
        thread per GPU bought no overlap (about 40 ms of PCIe throughput per GPU all the same): it cost a
        thread start per GPU per round and woke every waiting thread at each call's end."""
        for i in indices:
            try:
                self.sample_offtick(i, processes, pcie_when_due)
            except Exception:  # noqa: BLE001 - as a thread of its own did: this GPU's round lost, not the rest's
                log.exception("off-tick readings of GPU %d failed", i)

    def start_sampler(self, stop: threading.Event, every_s: float = OFFTICK_EVERY_S) -> threading.Thread:
        """Serve the tick's blocking readings from a thread, every ``every_s``; the first round is read
        here, before the first tick. Until it runs (NVML not ready at start), the tick reads them."""

        def round_() -> None:
            try:
                self.sample_pcie_all(list(range(self._c.device_count())), processes=True, pcie_when_due=True)
            except NvmlError as err:
                log.debug("off-tick sampler: %s", err)
                return
            self.offtick = True  # from the first round that could read, the tick uses these

        round_()

        def loop() -> None:
            while not stop.wait(every_s):
                round_()

        thread = threading.Thread(target=loop, name="gpud-offtick-sampler", daemon=True)
        thread.start()
        return thread
