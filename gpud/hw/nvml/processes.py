"""The processes on a GPU: compute and graphics lists, per-process SM use."""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Sequence
from typing import Any, Callable

from gpud.errors import DriverNotLoaded, GpuLost, NvmlError
from gpud.hw.nvml.constants import (
    GRAPHICS_CALLS,
    INSUFFICIENT_SIZE,
    NOT_AVAILABLE_ULL,
    NOT_FOUND,
    OFFTICK_EVERY_S,
    PROCESS_CALLS,
    PROCESS_ENTRY_MAX,
    SENTINEL,
    ProcessUtilizationSample,
    T,
)
from gpud.hw.nvml.handles import NvmlClient
from gpud.hw.nvml.values import GpuProcessEntry
from gpud.model import GpuProcess, MigInstance, mig_profile

# A compute list the profile rules' poll read this recently (seconds) is the off-tick sampler's for that GPU
# (at most once): the same entry point asked again would give the same list, for 4.5 ms of RM lock.
POLLED_REUSE_S = 1.0
NO_INSTANCE = 0xFFFFFFFF  # nvml.h, nvmlProcessInfo_t: gpuInstanceId / computeInstanceId without MIG


class Processes:
    """The processes on a GPU: compute and graphics lists, per-process SM use, MIG devices."""

    def __init__(self, client: NvmlClient) -> None:
        self._c = client
        self._procs: dict[int, tuple[float, Any]] = {}  # (when, processes) read off the tick
        self._polled: dict[int, tuple[float, Any]] = {}  # (monotonic, compute list) the rules' poll read
        self._sampled: dict[int, tuple[float, tuple[int, ...]]] = {}  # (monotonic, pids) of the sampler's compute list
        self._util_seen: dict[int, int] = {}  # newest process-utilisation sample read per GPU (µs)
        client.on_renumber(self._forget)

    def _forget(self) -> None:
        for cache in (self._procs, self._polled, self._sampled, self._util_seen):
            cache.clear()

    def read(self, index: int, h: Any, locked: bool = True) -> Any:
        """The GPU's compute and graphics processes (one entry per pid: a process in both lists is
        ``compute+graphics``, as nvidia-smi's "C+G"). None when the compute list cannot be read."""
        compute = None if locked else self._polled_compute(index)
        if compute is None:
            read_at = time.monotonic()
            compute = self._process_list(index, h, locked, PROCESS_CALLS)
            if compute is not None and not locked:  # for the rules' poll (``sampled_compute``)
                self._sampled[index] = (read_at, tuple(p.pid for p in compute))
        if compute is None:
            return None
        graphics = self._process_list(index, h, locked, GRAPHICS_CALLS) or []
        by_pid = {p.pid: p for p in compute}
        # MIG: the GPU's own list is aggregate only with privileges (nvml.h); each MIG device lists its own
        try:
            migs = self._mig_handles(index, h, locked)
        except (GpuLost, DriverNotLoaded):
            raise
        except NvmlError:
            return None  # MIG devices there but unreadable: the list would be incomplete
        for k, mh in migs or ():
            own = self._process_list(index, mh, locked, PROCESS_CALLS, scope=("mig", k))
            if own is None:
                return None
            for p in own:
                seen = by_pid.setdefault(p.pid, p)
                if seen.gi is None:
                    seen.gi, seen.ci = p.gi, p.ci
        for g in graphics:
            seen = by_pid.get(g.pid)
            if seen is not None:
                seen.kind = "compute+graphics"
            else:
                g.kind = "graphics"
                by_pid[g.pid] = g
        sm = self._process_sm(index, h, locked) if by_pid else None  # no process: nothing to ask
        for p in by_pid.values():
            # NVML samples only processes with non-zero use: in a window that has samples, a process
            # without one used no SM (0); with no sample at all (NOT_FOUND) there is no figure.
            p.sm = None if not sm else sm.get(p.pid, 0)
        return list(by_pid.values())

    def _process_sm(self, index: int, h: Any, locked: bool) -> dict[int, int] | None:
        """Each process's SM use over the samples since the last read (the mean of its samples); empty
        when NVML has no newer sample. None when the GPU does not give it."""
        name = "nvmlDeviceGetProcessUtilization"

        out: dict[int, int] | None = self._c.optional(
            (name, index, ()), lambda: self._maybe_locked(locked, self._utilization_samples, name, h, index))
        return out

    def _utilization_samples(self, name: str, h: Any, index: int) -> dict[int, int]:
        """``nvmlDeviceGetProcessUtilization`` with gpud's own buffer: the bindings' wrapper raises on the
        size call's SUCCESS and NOT_FOUND answers (nvidia-ml-py 12.535 and 13.x alike). NOT_FOUND ("no
        valid sample entries are found since the lastSeenTimeStamp", nvml.h) means no figure, not 0."""
        c = self._c
        fn = c.c_function(name, index)
        last = ctypes.c_ulonglong(self._util_seen.get(index, 0))
        count = ctypes.c_uint(0)
        ret = c.c_call(fn, h, None, ctypes.byref(count), last)
        if ret in (0, NOT_FOUND):
            return {}
        if ret != INSUFFICIENT_SIZE:
            c.c_check(ret, name, index)
        room = count.value * 2 + 5  # processes may start between the two calls
        buf = (ProcessUtilizationSample * room)()
        count.value = room
        ret = c.c_call(fn, h, buf, ctypes.byref(count), last)
        if ret == NOT_FOUND:
            return {}
        c.c_check(ret, name, index)
        samples = buf[:min(count.value, room)]
        per: dict[int, list[int]] = {}
        for smp in samples:
            per.setdefault(int(smp.pid), []).append(min(int(smp.smUtil), 100))
        if samples:
            self._util_seen[index] = max(int(smp.timeStamp) for smp in samples)
        return {pid: round(sum(v) / len(v)) for pid, v in per.items()}

    def _maybe_locked(self, locked: bool, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` under gpud's NVML lock, or without it (the off-tick sampler: NVML is thread-safe),
        between two ticks' reads."""
        if not locked:
            with self._c.gate.call():
                return fn(*args)
        with self._c.lock:
            return fn(*args)

    def _process_list(self, index: int, h: Any, locked: bool, calls: tuple[str, ...],
                      scope: tuple[Any, ...] = ()) -> Any:
        """One of NVML's process lists, from the newest entry point the driver exports (``scope``: a MIG
        device's, whose answers are remembered apart from its GPU's)."""
        for name in calls:
            if self._c.unsupported((name, index, scope)):
                continue

            procs = self._c.optional((name, index, scope),
                                   functools.partial(self._maybe_locked, locked, self._process_entries, name, h, index))
            if procs is not None:
                return procs
        return None

    def _process_entries(self, name: str, h: Any, index: int) -> list[GpuProcessEntry]:
        """Call the process-list entry point with gpud's own buffer: sized for the largest entry any
        driver writes and filled with a sentinel, so the entry size the driver used is seen in the
        bytes it left untouched (a pid or a memory size is never 0xA5A5…)."""
        c = self._c
        fn = c.c_function(name, index)
        count = ctypes.c_uint(0)
        ret = c.c_call(fn, h, ctypes.byref(count), None)
        if ret == 0:
            return []
        if ret != INSUFFICIENT_SIZE:
            c.c_check(ret, name, index)
        room = count.value * 2 + 5  # processes may start between the two calls
        buf = (ctypes.c_ubyte * (room * PROCESS_ENTRY_MAX))()
        ctypes.memset(buf, SENTINEL, ctypes.sizeof(buf))
        count.value = room
        c.c_check(c.c_call(fn, h, ctypes.byref(count), buf), name, index)
        n = count.value
        raw = bytes(buf)
        size = 24 if n == 0 or raw[24 * n:32 * n] == bytes([SENTINEL]) * (8 * n) else 32
        out = []
        for k in range(n):
            pid = int.from_bytes(raw[k * size:k * size + 4], "little")
            mem = int.from_bytes(raw[k * size + 8:k * size + 16], "little")
            gi = int.from_bytes(raw[k * size + 16:k * size + 20], "little")
            ci = int.from_bytes(raw[k * size + 20:k * size + 24], "little")
            out.append(GpuProcessEntry(pid, None if mem == NOT_AVAILABLE_ULL else mem, gi=None if gi == NO_INSTANCE
                                       else gi, ci=None if gi == NO_INSTANCE or ci == NO_INSTANCE else ci))
        return out

    def running_processes(self, index: int) -> list[GpuProcessEntry]:
        """The GPU's compute processes now (``nvmlDeviceGetComputeRunningProcesses``, gpud's own buffer: one
        call when there are none), without gpud's lock and never while a tick reads (``TickGate``): what
        the daemon's profile rules poll. Empty when the list cannot be read."""
        procs = self._process_list(index, self._c.handle(index), False, PROCESS_CALLS)
        if procs is not None:
            self._polled[index] = (time.monotonic(), procs)  # for the sampler's next round (``_polled_compute``)
        return list(procs or [])

    def memory_in_use(self, indices: Sequence[int]) -> dict[int, int | None]:
        """Each GPU's memory in use, bytes (``nvmlDeviceGetMemoryInfo``'s ``used``: reserved + allocated), read
        like ``running_processes`` (no gpud lock, between ticks; the GPUs one after the other in one pass of
        the gate, 20 µs each): the profile rules' cue that a compute list changed, for a 20 µs reading
        instead of a 4.5 ms one (docs/simulation.md, "Call latency"). A CUDA context takes memory as it is
        created and gives it back at exit. None where it cannot be read, a lost GPU included."""
        with self._c.gate.call():
            read = self._c.read_each("nvmlDeviceGetMemoryInfo", indices)
        return {index: None if mem is None else int(mem.used) for index, mem in read.items()}

    def sampled_compute(self, index: int, after: float) -> tuple[float, tuple[int, ...]] | None:
        """(when, pids) of the GPU's compute list as the off-tick sampler last asked NVML for it itself, if it
        asked after ``after`` (``time.monotonic``); else None. What the profile rules' poll takes in place of
        asking again (``gpud.daemon.rules.Lists``): the same entry point, 4.5 ms of the driver's lock."""
        got = self._sampled.get(index)
        return got if got is not None and got[0] > after else None

    def _polled_compute(self, index: int) -> list[GpuProcessEntry] | None:
        """Copies of the compute list the rules' poll read within ``POLLED_REUSE_S`` (then forgotten), or
        None: the off-tick sampler then asks NVML itself."""
        got = self._polled.pop(index, None)
        if got is None or time.monotonic() - got[0] > POLLED_REUSE_S:
            return None
        return [GpuProcessEntry(p.pid, p.usedGpuMemory, p.kind, p.gi, p.ci) for p in got[1]]

    def _mig_handles(self, index: int, h: Any, locked: bool = True) -> list[tuple[int, Any]] | None:
        """(index, handle) of each MIG device of a MIG-enabled GPU; None without MIG (no count, or 0).
        nvml.h: every index below nvmlDeviceGetMaxMigDeviceCount is asked; NOT_FOUND is a free slot."""
        count_call = "nvmlDeviceGetMaxMigDeviceCount"
        count = self._c.optional((count_call, index, ()), lambda: self._maybe_locked(
            locked, functools.partial(self._c.raw, count_call, h, gpu=index)))
        if not count:
            return None
        out = []
        for k in range(int(count)):
            try:
                out.append((k, self._maybe_locked(locked, functools.partial(
                    self._c.raw, "nvmlDeviceGetMigDeviceHandleByIndex", h, k, gpu=index))))
            except NvmlError as err:
                if err.code != NOT_FOUND or isinstance(err, (GpuLost, DriverNotLoaded)):
                    raise
        return out

    def mig_instances(self, index: int, h: Any,
                       processes: tuple[GpuProcess, ...] | None) -> tuple[MigInstance, ...] | None:
        """A MIG-enabled GPU's MIG devices through their own handles: UUID, profile (from the name), GPU and
        compute instance ids, memory (``_v2`` where there is one), and the processes whose ids are theirs.
        None where they cannot be read."""
        try:
            migs = self._mig_handles(index, h)
        except (GpuLost, DriverNotLoaded):
            raise
        except NvmlError:
            return None
        out = []
        for k, mh in migs or ():
            def read(name: str, *args: Any, k: int = k, mh: Any = mh) -> Any:
                key = tuple(repr(a) for a in args)
                c = self._c
                return c.optional((name, index, ("mig", k, *key)), lambda: c.call(name, mh, *args, gpu=index))

            uuid = read("nvmlDeviceGetUUID")
            gi, ci = read("nvmlDeviceGetGpuInstanceId"), read("nvmlDeviceGetComputeInstanceId")
            version = getattr(self._c.module, "nvmlMemory_v2", None)
            mem = read("nvmlDeviceGetMemoryInfo", version) if version is not None else None
            used, reserved = (int(mem.used), int(mem.reserved)) if mem is not None else (None, None)
            if mem is None:
                mem = read("nvmlDeviceGetMemoryInfo")
                used = int(mem.used) if mem is not None else None
            mine = None if processes is None else tuple(
                p for p in processes if gi is not None and (p.gpu_instance_id, p.compute_instance_id) == (gi, ci))
            out.append(MigInstance(
                index=k, uuid=str(uuid or ""), gpu_instance_id=gi, compute_instance_id=ci,
                profile=mig_profile(read("nvmlDeviceGetName")), memory_total_bytes=int(mem.total) if mem else None,
                memory_used_bytes=used, memory_reserved_bytes=reserved,
                memory_free_bytes=int(mem.free) if mem else None, processes=mine))
        return tuple(out)

    def read_offtick(self, index: int) -> None:
        """Read the GPU's processes without gpud's lock (the off-tick sampler), for the ticks that follow."""
        procs = self.read(index, self._c.handle(index), locked=False)
        self._procs[index] = (time.time(), procs)

    def offtick(self, index: int, now: float) -> Any:
        """The processes the off-tick sampler read last, if recent enough; else None."""
        got = self._procs.get(index)
        return got[1] if got is not None and now - got[0] <= 3 * OFFTICK_EVERY_S else None
