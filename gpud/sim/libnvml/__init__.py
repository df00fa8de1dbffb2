"""The simulated NVML C library: what ``libnvidia-ml.so.1`` exports, over a ``SimMachine``.

The real ``pynvml`` (nvidia-ml-py, whatever version is installed) runs unchanged on top of it:
``gpud.sim.bindings`` loads a private copy of that module whose ``nvmlLib`` is a ``SimLibrary``
instead of the driver's ``CDLL``. ``pynvml`` resolves each entry point by name
(``getattr(nvmlLib, "nvmlDeviceGetTemperature")``); a name this library does not export raises
``AttributeError``, which ``pynvml`` turns into ``NVML_ERROR_FUNCTION_NOT_FOUND`` as it does for
an old driver. Each entry point takes the C arguments ``pynvml`` passes (``c_uint`` values,
``byref(...)`` pointers, structures, arrays and string buffers), writes its outputs through the
pointers and returns an ``nvmlReturn_t`` code, as the C library does (nvml.h).

Every call costs at least the latency the ``LatencyModel`` gives it (docs/simulation.md, "Call
latency"), so a tick that makes blocking calls is as slow here as on real hardware.

The library is a package, each module one concern (arrows point down the list):
``returns`` (return codes, the constants the entry points share, the C calling convention),
``library`` (``SimLibrary`` and its ``LatencyModel``), then the entry points grouped as NVML's
callers see them: ``handles`` (initialisation, versions, handle lookup, identity), ``readings``
(temperatures, fans, power, clocks, modes), ``usage`` (utilisation, memory, processes, PCIe, field
values, ECC), ``pairs`` (NVLink and topology), ``setters`` and ``offsets`` (a
tunable's getters and setters together). Each registers its entry points in
``gpud.sim.entries`` as it loads; importing this package loads them all.
"""

from __future__ import annotations

from gpud.sim.libnvml import handles, offsets, pairs, readings, setters, usage
from gpud.sim.libnvml.library import LatencyModel, SimLibrary

__all__ = ["LatencyModel", "SimLibrary", "handles", "offsets", "pairs", "readings", "setters", "usage"]
