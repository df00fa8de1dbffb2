"""MIG devices and the instance of each process, as ``nvidia-smi -q`` prints them.

Text: a ``MIG Device`` section per MIG device (``Index``, ``GPU Instance ID``, ``Compute Instance ID``,
``Device Attributes/Shared/Multiprocessor count``, ``Shared FB Memory Usage``), and in ``Processes``
a ``GPU instance ID`` / ``Compute instance ID`` pair before each ``Process ID``. XML:
``mig_devices/mig_device`` (``index``, ``gpu_instance_id``, ``compute_instance_id``,
``fb_memory_usage``) and ``processes/process_info`` (``gpu_instance_id``, ``compute_instance_id``,
``pid``). Neither names the MIG profile (``3g.40gb``: ``nvidia-smi -L`` does) nor the MIG device's UUID.
"""

from __future__ import annotations

import re
from typing import Any

from gpud.sim.dump.read import GpuDump, fail

# the leaf names of a MIG device's fields, text and XML
_ID = {"index": "index", "gpu instance id": "gpu_instance_id", "gpu_instance_id": "gpu_instance_id",
       "compute instance id": "compute_instance_id", "compute_instance_id": "compute_instance_id",
       "multiprocessor count": "multiprocessor_count", "multiprocessor_count": "multiprocessor_count"}
_MEMORY = {"total": "memory_mib", "reserved": "reserved_mib", "used": "used_mib", "free": "free_mib"}
_SECTIONS = ("mig device/", "mig_devices/mig_device/")
_FB = ("shared fb memory usage/", "fb_memory_usage/")


def _number(file: str, line: int, what: str, value: str, unit: str = "") -> int | None:
    text = value.strip()
    if text in ("N/A", "", "[N/A]"):
        return None
    m = re.fullmatch(r"(\d+)" + (rf"\s*{unit}" if unit else ""), text)
    if m is None:
        raise fail(file, line, f"{what}: expected a number{' of ' + unit if unit else ''}, found {value!r}")
    return int(m.group(1))


def instances(gpu: GpuDump, file: str) -> list[dict[str, Any]]:
    """One dict per MIG device, in the dump's order: ``index``, ``gpu_instance_id``,
    ``compute_instance_id``, ``multiprocessor_count``, ``memory_mib``, ``reserved_mib``, ``used_mib``,
    ``free_mib`` (what is N/A or not printed is absent) and ``line``."""
    out: list[dict[str, Any]] = []
    for e in gpu.entries:
        section = next((s for s in _SECTIONS if e.path.startswith(s)), None)
        if section is None:
            continue
        rest = e.path[len(section):]
        if rest == "index" or (not out and rest):  # a new MIG device starts at its Index
            out.append({"line": e.line})
        leaf = rest.rsplit("/", 1)[-1]
        if leaf in _ID and "/" not in rest.replace("device attributes/shared/", "").replace(
                "device_attributes/shared/", ""):
            value = _number(file, e.line, f"MIG device {leaf}", e.value)
            if value is not None:
                out[-1][_ID[leaf]] = value
        elif any(rest.startswith(fb) for fb in _FB) and leaf in _MEMORY:
            value = _number(file, e.line, f"MIG device memory {leaf}", e.value, "MiB")
            if value is not None:
                out[-1][_MEMORY[leaf]] = value
    return [m for m in out if "gpu_instance_id" in m]


def process_instances(gpu: GpuDump, file: str) -> dict[int, tuple[int | None, int | None]]:
    """pid → (GPU instance id, compute instance id) where the dump names them (a MIG GPU's processes;
    ``N/A`` on a GPU without MIG gives None)."""
    out: dict[int, tuple[int | None, int | None]] = {}
    gi: int | None = None
    ci: int | None = None
    for e in gpu.entries:
        low = e.path.lower()
        if not low.startswith("processes/"):
            continue
        leaf = low.rsplit("/", 1)[-1]
        if leaf in ("gpu instance id", "gpu_instance_id"):
            gi = _number(file, e.line, "process GPU instance id", e.value)
        elif leaf in ("compute instance id", "compute_instance_id"):
            ci = _number(file, e.line, "process compute instance id", e.value)
        elif leaf in ("process id", "pid") and e.value.strip().isdigit():
            out[int(e.value)] = (gi, ci)
            gi = ci = None
    return out
