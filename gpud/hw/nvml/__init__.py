"""The one choke point for NVML: the only package that touches ``pynvml``.

``Nvml`` takes the NVML module as a parameter — the real ``pynvml`` (nvidia-ml-py) or the
simulator's stand-in with the same function names, constants and ``NVMLError_*`` classes — so
the code below is the code that runs on a real workstation. Every call goes through
``Nvml.call``: lazy ``nvmlInit`` under a lock, a call counter, and translation of
``NVMLError_*`` into gpud's own errors. Reads of optional fields give ``None`` when NVML cannot
give them (Unsupported is not zero); a lost GPU is never hidden.

The package, each module one concern, each class building on the one before (arrows point down
the list): ``constants`` (NVML's codes and ids), ``values`` (turning answers into gpud's values),
``handles`` (the choke point: init, calls, errors, handles, versions), ``info`` (static
information), ``processes``, ``counters`` (the slow readings: ECC, violations, NVLink counters),
``pairs`` (NVLinks, P2P, topology), ``readings`` (a tick's sample, telemetry, the off-tick sampler)
and ``setters``. ``Nvml`` is the whole.
"""

from __future__ import annotations

from gpud.hw.nvml.constants import ARCHITECTURES, FI_NVLINK_DATA, NVLINK_DATA_RETRY_S, TEMPERATURE_GPU
from gpud.hw.nvml.setters import NvmlSetters

__all__ = ["ARCHITECTURES", "FI_NVLINK_DATA", "NVLINK_DATA_RETRY_S", "TEMPERATURE_GPU", "Nvml"]


class Nvml(NvmlSetters):
    """NVML behind a lock, with gpud errors, call counting and static caching.

    ``nvidia-smi`` equivalents are given per reading in ``docs/architecture.md``.
    """
