"""``SimLibrary``, the simulated ``libnvidia-ml.so.1``: binds the registered entry points as C functions
(the RM lock, the ``LatencyModel``'s cost, return codes), resolves handles, applies injected faults.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpud.sim.description import GpuSpec
from gpud.sim.entries import ENTRIES, Entry, base_name
from gpud.sim.libnvml.returns import (
    ERROR_TEXT,
    GPU_IS_LOST,
    INVALID_ARGUMENT,
    NO_PERMISSION,
    NOT_SUPPORTED,
    SUCCESS,
    UNINITIALIZED,
    NvmlReturn,
    _is_handle,
    _target,
    fail,
    store_into,
    store_text,
    value_of,
)
from gpud.sim.machine import SimMachine
from gpud.sim.topology import nvlink_peer


@dataclass
class LatencyModel:
    """How long each entry point takes on real hardware, at least (seconds).

    Sources are in docs/simulation.md. A call that the simulator answers faster is made to wait
    the rest, so tick times measured here are not kinder than the hardware's.
    """

    # A plain reading: about 22 µs a call measured on an RTX 5080 (4 readings in 0.09 ms), 11.6 µs
    # for GetMemoryInfo on an RTX 4090 laptop.
    default_s: float = 20e-6
    # Opening a GPU that is not initialised (persistence mode off, no other client): "order of 1-3 second
    # startup cost per GPU due to ECC scrubbing" (NVIDIA driver-persistence documentation); the upper end.
    # GPUD_SIM_GPU_INIT_S overrides it (the test suite shortens it; tests of it use the default).
    gpu_init_s: float = field(default_factory=lambda: float(os.environ.get("GPUD_SIM_GPU_INIT_S") or 3.0))
    per_call: dict[str, float] = field(default_factory=lambda: {
        # "… sampled over a 20 ms interval" (NVML reference, nvmlDeviceGetPcieThroughput).
        "nvmlDeviceGetPcieThroughput": 20e-3,
        # Measured on an RTX 4090 laptop (median): the process lists talk to the GPU's firmware.
        "nvmlDeviceGetComputeRunningProcesses_v3": 4.5e-3,
        "nvmlDeviceGetComputeRunningProcesses_v2": 4.5e-3,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": 4.5e-3,  # the same list, of graphics clients
        "nvmlDeviceGetGraphicsRunningProcesses_v2": 4.5e-3,
        # Not measured anywhere we found; it reads the same per-process accounting as the lists.
        "nvmlDeviceGetProcessUtilization": 4.5e-3,
        "nvmlDeviceGetFanSpeed": 137e-6,
        "nvmlDeviceGetFanSpeed_v2": 137e-6,
    })

    def of(self, name: str, args: tuple[Any, ...] = ()) -> float:
        if name == "nvmlDeviceGetFieldValues" and len(args) >= 2:
            # No measurement of how its cost grows with the ids asked was found: each id is taken
            # to cost a plain reading (the stricter; an H200 asks 36 NVLink ids in one call).
            return self.default_s * max(1, int(value_of(args[1])))
        return self.per_call.get(name, self.default_s)


def effective_uid() -> int:
    """The caller's uid as the driver sees it. ``GPUD_SIM_EUID`` stands in for running under sudo
    (the test suite sets 0); unset, it is the process's own."""
    value = os.environ.get("GPUD_SIM_EUID", "")
    return int(value) if value.isdigit() else os.geteuid()


SPIN_UP_TO_S = 2e-3  # a wait this short is spun: ``time.sleep`` overshoots it by a large part


def wait_until(deadline: float) -> None:
    """Spin through a short wait (a plain reading's 20 µs, the fan's 137 µs), which stands for the CPU
    that NVML's ioctl costs; sleep through a long one (a blocking call's 4.5–20 ms, a GPU's start-up)
    whole: the sources give those calls' time, not their CPU (docs/simulation.md, "Call latency"). The
    sleep's overshoot (the timer's slack, tens of µs) only lengthens the call, never shortens it."""
    left = deadline - time.perf_counter()
    if left > SPIN_UP_TO_S:
        time.sleep(left)
        return
    while time.perf_counter() < deadline:
        pass


# Entry points a driver exports only from a release on (nvml.h of the first CUDA toolkit that declares them).
ENTRY_FROM_DRIVER = {"nvmlDeviceGetMarginTemperature": 570,  # nvml.h 12.8 (R570)
                     "nvmlDeviceGetClockOffsets": 555, "nvmlDeviceSetClockOffsets": 555}  # nvml.h 12.5 (R555)
MARGIN_FROM_DRIVER = ENTRY_FROM_DRIVER["nvmlDeviceGetMarginTemperature"]


@dataclass(frozen=True)
class MigRef:
    """A MIG device's handle, resolved: its GPU (description index) and its place in the GPU's
    ``mig_instances``. Entry points registered with ``mig=True`` get it in place of a GPU index."""

    gpu: int
    k: int


def parent(i: int | MigRef) -> int:
    """The GPU a handle belongs to."""
    return i.gpu if isinstance(i, MigRef) else i


class SimLibrary:
    """The simulated ``libnvidia-ml.so.1``: ``getattr(lib, name)`` gives a C entry point."""

    def __init__(self, sim: SimMachine, latency: LatencyModel | None = None) -> None:
        self.sim = sim
        self.latency = latency or LatencyModel()
        self._lock = threading.RLock()  # the RM lock: every entry point holds it for its whole duration
        self._init_count = 0
        self._handle_of: dict[int, int] = {}  # address of the handle's struct → description index
        self._structs: dict[int, Any] = {}  # index → the struct a handle points at (kept alive)
        self._mig_of: dict[int, MigRef] = {}  # address of a MIG device handle's struct → its MIG device
        self._mig_structs: dict[MigRef, Any] = {}
        self.spent_s = 0.0  # wall time inside this library (the simulator's own cost and the waits)
        self.modelled_s = 0.0  # the latency model's total for the calls made: what hardware would take
        self.called: Counter[str] = Counter()  # calls per entry point
        self.internal_errors = 0  # Python exceptions inside an entry point: simulator bugs
        lacks = set(sim.desc.machine.driver_lacks)  # an older driver exports fewer entry points
        major = str(sim.desc.machine.driver_version).split(".")[0]
        lacks |= {name for name, first in ENTRY_FROM_DRIVER.items() if not major.isdigit() or int(major) < first}
        self._functions: dict[str, Callable[..., Any]] = {
            name: self._bind(name, e) for name, e in ENTRIES.items() if name not in lacks}
        self._functions["nvmlErrorString"] = self._error_string

        sim.nvlink_up = lambda gpu, link: peer(self, gpu, link)[1]

    def __getattr__(self, name: str) -> Any:
        functions = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(name)  # pynvml: NVML_ERROR_FUNCTION_NOT_FOUND

    @staticmethod
    def _error_string(code: Any) -> bytes:
        return ERROR_TEXT.get(int(value_of(code)), "Unknown Error").encode()

    def exported(self) -> list[str]:
        return sorted(self._functions)

    # -- the C calling convention ----------------------------------------------------------
    def _bind(self, name: str, e: Entry) -> Callable[..., int]:
        names = {name, base_name(name)}  # a fault names the call with or without its _vN suffix
        before_init = name in ("nvmlInitWithFlags", "nvmlInit_v2", "nvmlShutdown")

        def c_function(*args: Any) -> int:
            entered = time.perf_counter()
            latency = self.latency.of(name, args)
            # The driver's resource-manager lock: a call holds it for all of its time, so a slow call
            # (20 ms of PCIe throughput) makes every other thread's call wait (docs/simulation.md).
            with self._lock:
                start = time.perf_counter()
                try:
                    code = self._invoke(names, before_init, e, args)
                finally:
                    wait_until(start + latency)
                    self.spent_s += time.perf_counter() - entered
                    self.modelled_s += latency
                    self.called[name] += 1
            return code

        c_function.__name__ = name
        return c_function

    def _invoke(self, names: set[str], before_init: bool, e: Entry, args: tuple[Any, ...]) -> int:
        try:
            if not before_init and self._init_count <= 0:
                fail(UNINITIALIZED)
            gpus = [self._gpu_of(a) for a in args[:e.handles]]
            self.guard(names, [parent(g) for g in gpus])
            if not e.mig and any(isinstance(g, MigRef) for g in gpus):
                fail(NOT_SUPPORTED)  # the GPU's reading, not a MIG device's
            rest = args[e.handles:]
            if e.setter:
                if effective_uid() != 0:
                    fail(NO_PERMISSION)  # NVML's setters need root ("Requires root/admin permissions", nvml.h)
                with self.sim.mutate():
                    self._run(e, gpus, rest)
            else:
                self._run(e, gpus, rest)
            return SUCCESS
        except NvmlReturn as r:
            return r.code
        except Exception:  # a C library cannot raise: a bug of the simulator, counted and shown
            self.internal_errors += 1
            raise

    def _run(self, e: Entry, gpus: list[int | MigRef], rest: tuple[Any, ...]) -> None:
        if e.outs == "raw":
            e.impl(self, *gpus, *rest)
        elif e.outs == "text":
            inputs, (buf, size) = rest[:-2], rest[-2:]
            store_text(buf, size, e.impl(self, *gpus, *map(value_of, inputs)))
        else:
            n = int(e.outs)
            inputs, ptrs = (rest[:-n], rest[-n:]) if n else (rest, ())
            if len(ptrs) != n:
                fail(INVALID_ARGUMENT)
            targets = [_target(p) for p in ptrs]  # a NULL output pointer is INVALID_ARGUMENT before anything runs
            result = e.impl(self, *gpus, *map(value_of, inputs))
            if n == 1:
                store_into(targets[0], result)
            elif n:
                for t, v in zip(targets, result, strict=True):
                    store_into(t, v)

    def _gpu_of(self, handle: Any) -> int | MigRef:
        if not _is_handle(handle) or not handle:
            fail(INVALID_ARGUMENT)
        address = ctypes.addressof(handle.contents)
        index = self._handle_of.get(address)
        if index is None:
            mig = self._mig_of.get(address)
            if mig is None:
                fail(INVALID_ARGUMENT)
            return mig  # type: ignore[return-value]
        return index

    def guard(self, names: set[str], gpus: list[int]) -> None:
        """Lost GPUs, the injected NotSupported / NoPermission answers and crashes (matched on ``names``: the
        call's name with and without its ``_vN`` suffix)."""
        self.sim.refresh()
        lost, refused = self.sim.fault_index()  # every call passes here: most machines have neither
        if lost:
            for g in gpus:
                if g in lost:
                    fail(GPU_IS_LOST)
        if not refused:
            return
        gpu = gpus[0] if gpus else None
        for call in names:
            if self.sim.refused("crash", call, gpu):
                os.kill(os.getpid(), signal.SIGKILL)  # the process dies as it makes that call
            if self.sim.refused("unsupported", call, gpu):
                fail(NOT_SUPPORTED)
            if self.sim.refused("no_permission", call, gpu):
                fail(NO_PERMISSION)

    def new_handle(self, out: Any, index: int) -> None:
        target = _target(out)  # a c_nvmlDevice_t (pointer to an opaque struct)
        struct = self._structs.get(index)
        if struct is None:
            struct = type(target)._type_()
            self._structs[index] = struct
            self._handle_of[ctypes.addressof(struct)] = index
        target.contents = struct

    def new_mig_handle(self, out: Any, ref: MigRef) -> None:
        """A MIG device's handle: a struct of its own, so that NVML tells it from its GPU's."""
        target = _target(out)
        struct = self._mig_structs.get(ref)
        if struct is None:
            struct = type(target)._type_()
            self._mig_structs[ref] = struct
            self._mig_of[ctypes.addressof(struct)] = ref
        target.contents = struct

    def write(self) -> None:
        """Every setter starts here: count the write, fire a fault armed for this write number."""
        kind = self.sim.write_fault(self.sim.count_write())
        if kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)  # the process dies between two writes
        if kind == "gpu_lost":
            fail(GPU_IS_LOST)
        if kind == "no_permission":
            fail(NO_PERMISSION)

    def gpu(self, i: int) -> GpuSpec:
        return self.sim.desc.gpus[i]

    def settings(self, i: int) -> dict[str, Any]:
        return self.sim.settings(i)

    def visible(self) -> list[int]:
        """Description indices NVML enumerates: a GPU off the bus stays on PCI but not here."""
        gone = {p.gpu for p in self.sim.faults_of("off_bus")}
        return [i for i in range(len(self.sim.desc.gpus)) if i not in gone]


def driver_release(lib: SimLibrary) -> tuple[int, int]:
    """The driver's (major, minor): ``580.65.06`` → (580, 65); (0, 0) when it does not parse."""
    parts = [*str(lib.sim.desc.machine.driver_version).split("."), "", ""]
    return (int(parts[0]) if parts[0].isdigit() else 0, int(parts[1]) if parts[1].isdigit() else 0)


def driver_major(lib: SimLibrary) -> int:
    return driver_release(lib)[0]


# -- NVLink peers (SimLibrary reports a link's state through the machine) -------------------------


def peer(lib: SimLibrary, i: int, link: int) -> tuple[int | None, bool]:
    """(GPU at the other end of this link — or -1 for an NVSwitch —, is it up)."""
    if not 0 <= link < lib.gpu(i).nvlinks:
        fail(INVALID_ARGUMENT)
    return nvlink_peer(lib.sim, i, link)
