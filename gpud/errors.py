"""gpud's own errors. Nothing above ``gpud.hw`` ever sees a ``pynvml.NVMLError``."""

from __future__ import annotations


class GpudError(Exception):
    """Base of every error gpud raises on purpose; ``remedy`` is what a person can do."""

    remedy: str = ""


class NvmlError(GpudError):
    """An NVML call failed. ``call`` is the NVML function, ``gpu`` the index (or None)."""

    def __init__(self, message: str, *, call: str = "", gpu: int | None = None, code: int | None = None):
        super().__init__(message)
        self.call = call
        self.gpu = gpu
        self.code = code


class Unsupported(NvmlError):
    """The GPU or driver cannot give or set this (NVML_ERROR_NOT_SUPPORTED, FUNCTION_NOT_FOUND)."""


class PermissionDenied(NvmlError):
    """NVML refused for lack of privileges (NVML_ERROR_NO_PERMISSION)."""

    remedy = "run as root (sudo), or through the gpud daemon's control socket"


class GpuLost(NvmlError):
    """The GPU fell off the bus or needs a reset (NVML_ERROR_GPU_IS_LOST, RESET_REQUIRED)."""

    remedy = "check `dmesg | grep -i xid` and `lspci -d 10de:`; a lost GPU needs a reboot or reseat"


class DriverNotLoaded(NvmlError):
    """No NVIDIA driver or no libnvidia-ml.so: NVML cannot start."""

    remedy = (
        "install the NVIDIA driver and check `nvidia-smi`; or try gpud on a simulated "
        "workstation: `gpud status --simulate z8-fury-4x-a6000` (`gpud sim list`)"
    )


class InvalidInput(GpudError):
    """A file (profile, configuration, workstation description) is invalid: exit code 2."""

    def __init__(self, file: str, key: str, reason: str):
        super().__init__(f"{file}: {key}: {reason}" if key else f"{file}: {reason}")
        self.file = file
        self.key = key
        self.reason = reason
