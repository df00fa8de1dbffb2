"""The choke point: lazy ``nvmlInit`` under a lock, calls counted and their errors translated,
Not Supported remembered, handles and the versions cached.

``NvmlClient`` is what every reader of the package takes: the readers (``info``, ``processes``,
``counters``, ``pairs``, ``readings``, ``setters``) own their caches and call NVML through it only. What a
reader caches per GPU index it forgets when NVML numbers the GPUs anew (``on_renumber``).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Callable

from gpud.errors import (
    DriverMismatch,
    DriverNotLoaded,
    GpuLost,
    GpuUnusable,
    LibraryNotFound,
    NvmlError,
    PermissionDenied,
    Unsupported,
)
from gpud.hw.nvml.constants import (
    _GPU_LOST,
    _LIBRARY_NOT_FOUND,
    _NO_DRIVER,
    _NO_PERMISSION,
    _NOT_SUPPORTED,
    _RM_MISMATCH,
    _UNINITIALIZED,
    _UNUSABLE,
    CHANGING_SUPPORT,
    DIRECT_READINGS,
    FieldValue,
)
from gpud.hw.nvml.values import _hashable, _text
from gpud.model import Versions


class TickGate:
    """Keeps the sampler's blocking calls out of a tick. The driver serialises NVML calls on its RM lock, so
    a tick whose calls met the sampler's would wait for one slow call (20 ms of PCIe throughput, a process
    list) each. A snapshot holds ``tick()`` while it reads every GPU; each sampler call holds ``call()``:
    one at a time, none while a tick runs or waits, so a tick waits for at most the one in progress. A
    sampler call made inside a tick's own thread (a one-shot read before the sampler runs) passes.

    ``tick()`` and ``call()`` return one context manager each, made once: a gate is entered for every
    off-tick call (about 30 every 5 s, and the rules' poll twice a second), and a generator-based one is
    built anew each time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ticks: dict[int, int] = {}  # thread → snapshots it runs (running or waiting)
        self._calling = False
        self._tick = _Held(self._tick_enter, self._tick_exit)
        self._call = _Held(self._call_enter, self._call_exit)

    def tick(self) -> contextlib.AbstractContextManager[None]:
        return self._tick

    def call(self) -> contextlib.AbstractContextManager[None]:
        return self._call

    def _tick_enter(self) -> None:
        me = threading.get_ident()
        with self._cond:
            self._ticks[me] = self._ticks.get(me, 0) + 1
            while self._calling:
                self._cond.wait()

    def _tick_exit(self) -> None:
        me = threading.get_ident()
        with self._cond:
            self._ticks[me] -= 1
            if not self._ticks[me]:
                del self._ticks[me]
            self._cond.notify_all()

    def _call_enter(self) -> None:
        if threading.get_ident() in self._ticks:  # the tick's own thread: passes (and passes out below)
            return
        with self._cond:
            while self._ticks or self._calling:
                self._cond.wait()
            self._calling = True

    def _call_exit(self) -> None:
        if threading.get_ident() in self._ticks:  # only this thread changes its own entry: as on entering
            return
        with self._cond:
            self._calling = False
            self._cond.notify_all()


class _Held:
    """A context manager that calls ``enter`` and ``exit``; it keeps no state of one use, so one serves every
    thread (what differs between uses is in the gate, under its condition)."""

    __slots__ = ("_enter", "_exit")

    def __init__(self, enter: Callable[[], None], exit_: Callable[[], None]) -> None:
        self._enter, self._exit = enter, exit_

    def __enter__(self) -> None:
        self._enter()

    def __exit__(self, *exc: object) -> None:
        self._exit()


class NvmlClient:
    """The choke point: lazy ``nvmlInit`` under a lock, calls counted and their errors translated,
    Not Supported remembered, handles and the versions cached."""

    def __init__(self, module: Any = None) -> None:
        if module is None:
            import pynvml  # the one place gpud imports the real bindings

            module = pynvml
        self.module = module  # the bindings: the real ``pynvml`` or the simulator's stand-in
        self.lock = threading.RLock()  # gpud's calls one at a time; a tick's sample holds it whole
        self.gate = TickGate()  # the sampler's blocking calls only between ticks (the driver's RM lock)
        self._initialized = False
        self._handles: dict[int, Any] = {}
        self._open_seconds: dict[int, float] = {}  # how long this process's first handle lookup took, per GPU
        self._versions: Versions | None = None
        self._gone: set[str] = set()  # functions the driver or the bindings do not have
        self._unsupported: set[tuple[Any, ...]] = set()  # (function, GPU, arguments) that said NotSupported
        self._direct: dict[str, Any] = {}  # ``DIRECT_READINGS``' C entry points, resolved by ``raw`` once
        self._count: tuple[float, int] | None = None  # (monotonic, GPUs) as ``device_count`` last read
        self._renumbered: list[Callable[[], None]] = []  # the readers' caches keyed by a GPU's index
        self.calls = 0  # NVML calls made (for the benchmarks)
        self.errors: Counter[str] = Counter()  # NVML errors per function name

    def on_renumber(self, forget: Callable[[], None]) -> None:
        """``forget`` drops a reader's caches keyed by a GPU's index: called when NVML numbers the GPUs anew."""
        self._renumbered.append(forget)

    def unsupported(self, key: tuple[Any, ...]) -> bool:
        """Whether the reading ``key`` (function, GPU, arguments) said it is not supported here."""
        return key in self._unsupported

    def gone(self, name: str) -> bool:
        """Whether the driver or the bindings lack the function ``name`` (FUNCTION_NOT_FOUND)."""
        return name in self._gone

    def mark_gone(self, name: str) -> None:
        self._gone.add(name)

    def c_call(self, fn: Any, *args: Any) -> int:
        """One call of a C entry point (``c_function``), counted; its return code is the caller's to check."""
        self.calls += 1
        return int(fn(*args))

    # -- the choke point ---------------------------------------------------------------
    def translate(self, err: Exception, call: str, gpu: int | None) -> NvmlError:
        code = getattr(err, "value", None)
        where = f"GPU {gpu}: " if gpu is not None else ""
        msg = f"{where}{call}: {err}"
        if code in _NOT_SUPPORTED:
            return Unsupported(msg, call=call, gpu=gpu, code=code)
        if code in _NO_PERMISSION:
            return PermissionDenied(msg, call=call, gpu=gpu, code=code)
        if code in _GPU_LOST:
            return GpuLost(msg, call=call, gpu=gpu, code=code)
        if code in _UNUSABLE:
            return _UNUSABLE[code](msg, call=call, gpu=gpu, code=code)
        if code == _RM_MISMATCH:
            return DriverMismatch(f"NVML library and kernel module differ in version ({err})", call=call, gpu=gpu,
                                  code=code)
        if code == _LIBRARY_NOT_FOUND:
            return LibraryNotFound(f"NVIDIA driver/NVML not available: {LibraryNotFound.marker} ({err})", call=call,
                                   gpu=gpu, code=code)
        if code in _NO_DRIVER or (code == _UNINITIALIZED and call == "nvmlInit"):
            return DriverNotLoaded(
                f"NVIDIA driver/NVML not available ({err})", call=call, gpu=gpu, code=code
            )
        return NvmlError(msg, call=call, gpu=gpu, code=code)

    def raw(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        """One binding call. Nothing but gpud errors leaves here: an ``NVMLError`` is translated by
        its code; a binding that lacks the function, or whose wrapper does not fit the driver
        (``NVMLLibraryMismatchError``), is Unsupported; anything else the bindings raise (a
        ``TypeError`` from an argument list that changed between nvidia-ml-py releases, a ctypes
        error) is an NvmlError naming the call."""
        fn = getattr(self.module, name, None)
        if fn is None:
            raise Unsupported(f"{name}: not in these NVML bindings", call=name, gpu=gpu)
        spec = DIRECT_READINGS.get(name)
        if spec is not None and len(args) == 1 + spec[1]:
            return self._c_reading(name, self._direct.get(name) or self._resolve(name, gpu), spec[0], args, gpu)
        self.calls += 1
        try:
            return fn(*args)
        except self.module.NVMLError as err:
            self.errors[name] += 1
            raise self.translate(err, name, gpu) from err
        except Exception as err:  # noqa: BLE001 - the boundary: no binding exception escapes gpud.hw
            raise self._binding_error(err, name, gpu) from err

    def _resolve(self, name: str, gpu: int | None) -> Any:
        """One of ``DIRECT_READINGS``: its C entry point (a function the library lacks is FUNCTION_NOT_FOUND,
        Unsupported), kept."""
        try:
            fn = self._direct[name] = self.c_function(name, gpu)
        except NvmlError:
            self.errors[name] += 1
            raise
        return fn

    def _c_reading(self, name: str, fn: Any, out: Any, args: tuple[Any, ...], gpu: int | None) -> Any:
        """A reading of ``DIRECT_READINGS`` as the bindings' wrapper makes it, errors as in ``raw``."""
        cell = out()
        self.calls += 1
        try:
            ret = fn(*args, ctypes.byref(cell))
        except Exception as err:  # noqa: BLE001 - the boundary, as in ``raw``
            raise self._binding_error(err, name, gpu) from err
        if ret:
            self.c_check(ret, name, gpu)
        return cell if isinstance(cell, ctypes.Structure) else cell.value

    def _binding_error(self, err: Exception, name: str, gpu: int | None) -> NvmlError:
        self.errors[name] += 1
        where = f"GPU {gpu}: " if gpu is not None else ""
        if type(err).__name__ == "NVMLLibraryMismatchError":
            return Unsupported(f"{where}{name}: {err}", call=name, gpu=gpu)
        return NvmlError(f"{where}{name}: {type(err).__name__}: {err}", call=name, gpu=gpu)

    def init(self) -> None:
        """``nvmlInit`` once; raises DriverNotLoaded when there is no driver."""
        with self.lock:
            if not self._initialized:
                self.raw("nvmlInit")
                self._initialized = True

    def shutdown(self) -> None:
        with self.lock:
            if self._initialized:
                self._initialized = False
                self._handles.clear()
                try:
                    self.raw("nvmlShutdown")
                except NvmlError:
                    pass

    def call(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        """Call an NVML function; gpud errors only."""
        with self.lock:
            if not self._initialized:
                self.init()
            return self.raw(name, *args, gpu=gpu)

    def get(self, name: str, *args: Any, gpu: int | None = None) -> Any:
        """Like ``call`` for an optional reading: None when NVML cannot give it here.

        A lost GPU or a missing driver still raise: those are not "unsupported". What a GPU said
        it does not support is not asked again (a capability does not come back by itself): no
        wasted call and no error counted every tick for, say, page retirement on an Ampere card.
        """
        # args[0] of a GPU's reading is its handle, not part of the key: not worked out to be dropped. Plain
        # arguments (the tick's: ints) are their own key; others (a ctypes struct, a list) go through _hashable.
        rest = args[1:] if gpu is not None else args
        key: tuple[Any, ...] = (name, gpu, rest)
        try:
            if key in self._unsupported:
                return None
        except TypeError:
            key = (name, gpu, tuple(_hashable(a) for a in rest))
            if key in self._unsupported:
                return None
        fn = self._direct.get(name)
        try:
            with self.lock:  # ``call``, inline: this is every reading of every tick
                if not self._initialized:
                    self.init()
                if fn is not None:  # ``raw``'s C entry point, inline too
                    out, inputs = DIRECT_READINGS[name]
                    if len(args) == 1 + inputs:
                        return self._c_reading(name, fn, out, args, gpu)
                return self.raw(name, *args, gpu=gpu)
        except NvmlError as err:
            return self.not_read(key, err)

    def read_each(self, name: str, indices: Iterable[int]) -> dict[int, Any]:
        """``get(name, handle)`` of each GPU in ``indices``, for one of ``DIRECT_READINGS`` that takes no input: one
        pass with the entry point, the output's type and the handles looked up once, not per GPU through ``get``
        and ``raw`` (the rules' poll reads each GPU's memory in use twice a second). As ``get``, but a lost GPU
        or a missing driver reads as None here too, not raised."""
        out: dict[int, Any] = {}
        struct, inputs = DIRECT_READINGS[name]
        assert inputs == 0, name
        handles, unsupported = self._handles, self._unsupported
        fn = self._direct.get(name)
        for index in indices:
            key = (name, index, ())
            if key in unsupported:
                out[index] = None
                continue
            try:
                h = handles.get(index) or self.handle(index)
                if fn is None or not self._initialized:
                    got = self.raw(name, h, gpu=index)  # the first reading resolves the entry point
                    fn = self._direct.get(name)
                else:
                    got = self._c_reading(name, fn, struct, (h,), index)
            except NvmlError as err:
                got = None
                try:
                    self.not_read(key, err)  # remembered if not supported
                except NvmlError:
                    pass  # lost, or no driver
            out[index] = got
        return out

    def optional(self, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
        if key in self._unsupported:
            return None
        try:
            return read()
        except NvmlError as err:
            return self.not_read(key, err)

    def not_read(self, key: tuple[Any, ...], err: NvmlError) -> None:
        """An optional reading that failed: None, and what a GPU said it does not support is not asked again
        (but for ``CHANGING_SUPPORT``). A lost GPU or a missing driver still raise."""
        if isinstance(err, (GpuLost, DriverNotLoaded)):
            raise err
        if isinstance(err, Unsupported):
            name = key[0]
            if name not in CHANGING_SUPPORT:
                self._unsupported.add(key)
            if err.code in (13, None):  # FUNCTION_NOT_FOUND, or not in these bindings: gone for good
                self._gone.add(name)
        return None

    def field_values(self, h: Any, ids: Sequence[int | tuple[int, int]], gpu: int) -> ctypes.Array[FieldValue]:
        """``nvmlDeviceGetFieldValues`` for ``ids`` (a field id, or (id, scope): a link's field's link), each
        answer in its own ``nvmlReturn``; gpud errors when the call fails whole. Through the C entry point
        with gpud's struct (``FieldValue``): the bindings' reads each field through Python."""
        values = (FieldValue * len(ids))()
        for value, i in zip(values, ids, strict=True):
            value.fieldId, value.scopeId = i if isinstance(i, tuple) else (i, 0)
        name = "nvmlDeviceGetFieldValues"
        with self.lock:
            self.init()
            self.c_check(self.c_call(self.c_function(name, gpu), h, ctypes.c_int(len(ids)), values), name, gpu)
        return values

    def get_out(self, name: str, h: Any, *inputs: Any, outputs: int = 1, gpu: int,
                signed: bool = False) -> tuple[int, ...] | None:
        """An optional reading whose outputs gpud passes as pointers and reads back (unsigned ints).

        nvidia-ml-py 12.535–12.560 declare the outputs of ``nvmlDeviceGetMinMaxFanSpeed`` and
        ``nvmlDeviceGetFanControlPolicy_v2`` as required arguments and hand them to the C library as
        given; later releases accept the same pointers (and return NVML_SUCCESS). Passing
        ``byref(c_uint())`` works with both (``signed``: ``c_int``, for outputs nvml.h declares ``int *``).
        """
        cells = [(ctypes.c_int if signed else ctypes.c_uint)() for _ in range(outputs)]

        def read() -> tuple[int, ...]:
            self.call(name, h, *inputs, *(ctypes.byref(c) for c in cells), gpu=gpu)
            return tuple(int(c.value) for c in cells)

        out: tuple[int, ...] | None = self.optional((name, gpu, inputs), read)
        return out

    # -- system ------------------------------------------------------------------------
    def versions(self) -> Versions:
        if self._versions is None:
            cuda = self.get("nvmlSystemGetCudaDriverVersion_v2")
            drv = self.get("nvmlSystemGetDriverVersion")
            nvml = self.get("nvmlSystemGetNVMLVersion")
            self._versions = Versions(
                driver=_text(drv) if drv is not None else None,
                cuda_driver=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
                nvml=_text(nvml) if nvml is not None else None,
            )
        return self._versions

    def device_count(self) -> int:
        """NVML's GPU count. When it differs from the last one read, NVML has numbered the GPUs anew (a
        driver reload, a GPU taken out of service or brought back): what is cached per index is forgotten."""
        with self.lock:
            n = int(self.call("nvmlDeviceGetCount"))
            if self._count is not None and self._count[1] != n:
                self._forget_gpus()
            self._count = (time.monotonic(), n)
            return n

    def _forget_gpus(self) -> None:
        """Drop every cache keyed by a GPU's index: index 1 may be another GPU now. What a function said it
        does not support on a GPU is asked again too; the functions the driver lacks stay known."""
        self._handles.clear()
        self._open_seconds.clear()
        self._unsupported.difference_update([key for key in self._unsupported if key[1] is not None])
        for forget in self._renumbered:
            forget()

    def recent_count(self, within_s: float) -> int:
        """NVML's GPU count as read within the last ``within_s`` seconds (the daemon's whole snapshots read it
        every 5 s), else read now. The count changes only when the driver loads or a GPU is added or taken
        out of service; a GPU that fell off the bus stays counted and reads as lost."""
        got = self._count
        if got is not None and 0 <= time.monotonic() - got[0] < within_s:
            return got[1]
        return self.device_count()

    def reader(self, index: int) -> tuple[Any, Callable[..., Any]]:
        """The GPU's handle and its optional reading by name: ``get(name, *args)`` (``get`` on that handle)."""
        h = self.handle(index)

        def get(name: str, *args: Any) -> Any:
            return self.get(name, h, *args, gpu=index)

        return h, get

    def handle(self, index: int) -> Any:
        """The GPU's handle. A GPU that NVML counts but cannot open — a GPU fallen off the bus answers
        ``NVML_ERROR_UNKNOWN`` (999) or ``GPU_IS_LOST`` here, and ``nvidia-smi`` prints "Unable to
        determine the device handle for GPU …" — is lost, whatever the code; but for the answers that name
        another cause (no permission; its power cables, an interrupt problem: ``GpuUnusable``)."""
        with self.lock:
            h = self._handles.get(index)
            if h is None:
                started = time.perf_counter()
                try:
                    h = self.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
                except (GpuLost, DriverNotLoaded, PermissionDenied, GpuUnusable):
                    raise  # NO_PERMISSION: a device node this user may not open (nvml.h), not a lost GPU
                except NvmlError as err:
                    raise GpuLost(str(err), call=err.call, gpu=index, code=err.code) from err
                self._handles[index] = h
                # The first lookup initialises a GPU nobody holds open (persistence mode off): seconds.
                self._open_seconds.setdefault(index, time.perf_counter() - started)
            return h

    def open_bus(self, bus_id: str) -> int:
        """Open the GPU at PCI address ``bus_id`` (any spelling NVML takes) and return its NVML index.

        nvml.h recommends the PCI bus id for a stable lookup (the index order "has no guarantees of
        consistency between reboots"), and ``nvmlDeviceGetHandleByPciBusId_v2`` initialises the target
        GPU only (and an SLI slave with it): the way to open the one GPU worth reading first. Errors are
        gpud's (``NvmlError`` and its kinds); no GPU at that address is ``NOT_FOUND``."""
        with self.lock:
            started = time.perf_counter()
            h = self.call("nvmlDeviceGetHandleByPciBusId", bus_id.encode(), gpu=None)
            index = int(self.call("nvmlDeviceGetIndex", h, gpu=None))
            if index not in self._handles:
                self._handles[index] = h
                self._open_seconds.setdefault(index, time.perf_counter() - started)
            return index

    def open_seconds(self, index: int) -> float | None:
        """How long this process's first lookup of GPU ``index`` took (None: not opened yet)."""
        return self._open_seconds.get(index)

    def forget_handle(self, index: int) -> None:
        """Look GPU ``index`` up again next time (it was lost, and may come back)."""
        self._handles.pop(index, None)

    def c_function(self, name: str, gpu: int | None) -> Any:
        """An entry point of the C library itself, through the bindings' resolver (all versions)."""
        try:
            return self.module._nvmlGetFunctionPointer(name)
        except self.module.NVMLError as err:
            raise self.translate(err, name, gpu) from err
        except AttributeError as err:
            raise Unsupported(f"{name}: the bindings cannot resolve C functions", call=name, gpu=gpu) from err

    def c_check(self, ret: int, name: str, gpu: int | None) -> None:
        if ret != 0:
            self.errors[name] += 1
            err = self.module.NVMLError(ret)
            raise self.translate(err, name, gpu) from err  # the bindings' error as the cause, as in ``raw``
