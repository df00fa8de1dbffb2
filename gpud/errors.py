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


class DriverMismatch(DriverNotLoaded):
    """The NVML library and the loaded kernel module come from different driver versions
    (NVML_ERROR_LIB_RM_VERSION_MISMATCH): a driver upgraded without a reboot."""

    remedy = (
        "the driver was upgraded but the old kernel module is still loaded: reboot; or stop everything "
        "that uses the GPUs (display manager, nvidia-persistenced, gpud) and reload the modules: `sudo rmmod "
        "nvidia_uvm nvidia_drm nvidia_modeset nvidia && sudo modprobe nvidia`; confirm with "
        "`cat /proc/driver/nvidia/version` and `nvidia-smi`"
    )


class LibraryNotFound(DriverNotLoaded):
    """NVML_ERROR_LIBRARY_NOT_FOUND ("NVML Shared Library Not Found"): no ``libnvidia-ml.so.1`` where
    the dynamic loader looks. In a container that is the container run without the NVIDIA runtime (the
    NVIDIA Container Toolkit mounts the driver's user-space libraries in); on a host, a driver without its
    user-space part, or no NVIDIA driver at all (a machine without one: the most common case on a host). The
    GPUs themselves may be fine: no reboot cures it."""

    marker = "libnvidia-ml.so.1 not found"
    remedy = (
        "in a container: run it with the NVIDIA runtime (`docker run --runtime=nvidia --gpus all`, or the "
        "Kubernetes RuntimeClass `nvidia`, from the NVIDIA Container Toolkit), or mount the host's driver "
        "libraries (libnvidia-ml.so.1) into it; on the host: install the NVIDIA driver with its user-space "
        "libraries (`ldconfig -p | grep libnvidia-ml`; `nvidia-smi` must run)"
    )


class GpuUnusable(NvmlError):
    """NVML counts the GPU but cannot open it for a reason of the GPU's own that is not loss: each
    subclass names the cause (an nvmlDeviceGetHandleByIndex answer) and its remedy."""

    cause = ""


class InsufficientPower(GpuUnusable):
    """NVML_ERROR_INSUFFICIENT_POWER: "a device's external power cables are not properly attached"."""

    cause = "insufficient_power"
    remedy = ("power the machine off and seat the GPU's auxiliary power cables (8-pin or 12VHPWR/12V-2x6) in the "
              "card and the supply; check the supply's rating; confirm with `nvidia-smi -q -d POWER`")


class IrqIssue(GpuUnusable):
    """NVML_ERROR_IRQ_ISSUE: "NVIDIA kernel detected an interrupt issue with a GPU"."""

    cause = "irq_issue"
    remedy = ("check `sudo dmesg | grep -iE 'NVRM|msi|irq'` and `cat /proc/interrupts | grep nvidia`; update the "
              "BIOS, enable MSI (`options nvidia NVreg_EnableMSI=1`), move the card to another slot; reboot")


class InvalidInput(GpudError):
    """A file (profile, configuration, workstation description) is invalid: exit code 2."""

    def __init__(self, file: str, key: str, reason: str):
        super().__init__(f"{file}: {key}: {reason}" if key else f"{file}: {reason}")
        self.file = file
        self.key = key
        self.reason = reason
