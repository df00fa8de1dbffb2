"""MIG instances of a simulated GPU: the ``[[gpu]] mig_instances`` key and what NVML's MIG device
handles answer (docs/simulation.md, "Fidelity").

A MIG device is one compute instance (CI) in a GPU instance (GI). NVML hands it out as a device handle
of its own (``nvmlDeviceGetMigDeviceHandleByIndex``) that answers a few calls for the instance — its
UUID (``MIG-…``), its name (the GPU's name and ``MIG <profile>``), its memory, its processes, its GI and
CI ids — and Not Supported for what belongs to the GPU (utilisation, clocks, power, temperature, fans,
PCIe). ``nvidia-smi -q`` shows the same split: a ``MIG Device`` section holds ids, attributes, ECC and
memory only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from gpud.errors import InvalidInput
from gpud.schema import REQUIRED as _ANY
from gpud.schema import take

# How many MIG devices a GPU can hold at most (nvmlDeviceGetMaxMigDeviceCount): 7 on every MIG GPU the
# simulator has a model of (NVIDIA MIG user guide, "Supported GPUs": A100, H100, H200 "Max Number of
# Instances" 7).
MAX_MIG_DEVICES = 7
# nvml.h, nvmlProcessInfo_t: gpuInstanceId / computeInstanceId are 0xFFFFFFFF when MIG is not enabled.
NOT_IN_AN_INSTANCE = 0xFFFFFFFF

MIG_INSTANCE_KEYS: dict[str, tuple[Any, Any]] = {
    "gpu_instance_id": (int, _ANY),
    "compute_instance_id": (int, 0),
    # The MIG profile as nvidia-smi -L names it ("3g.40gb"); None: not known (`nvidia-smi -q` does not
    # print it), and the MIG device's name is then its GPU's name and "MIG"
    "profile": (str, None),
    "memory_mib": (int, _ANY),  # the instance's memory (its GPU instance's, shared by its compute instances)
    "used_mib": (int, None),  # memory in use besides its processes' (default 0)
    "reserved_mib": (int, 0),
    "multiprocessor_count": (int, None),  # the compute instance's SMs (nvidia-smi's Device Attributes)
    "uuid": (str, None),  # MIG-…; default: derived from the GPU's UUID and the ids
}
PROFILE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb(\+me)?$")


@dataclass(frozen=True)
class MigSpec:
    """One MIG device of a simulated GPU (``MIG_INSTANCE_KEYS``)."""

    gpu_instance_id: int
    compute_instance_id: int
    profile: str | None
    memory_mib: int
    used_mib: int | None
    reserved_mib: int
    multiprocessor_count: int | None
    uuid: str


def mig_uuid(gpu_uuid: str, gi: int, ci: int) -> str:
    """A stable ``MIG-`` UUID (the R470+ form: ``MIG-`` and a UUID) for this instance of this GPU."""
    h = hashlib.sha256(f"{gpu_uuid}/mig/{gi}/{ci}".encode()).hexdigest()
    return f"MIG-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def validate_instances(raw: Any, gpu: dict[str, Any], file: str, where: str) -> tuple[MigSpec, ...]:
    """``mig_instances`` of one ``[[gpu]]`` (its other keys already checked), and the instance each of its
    processes names: instances only with MIG enabled, ids unique, each process of a MIG GPU in one of
    its instances, as a compute process (MIG does not support graphics contexts: NVIDIA MIG user guide,
    "Application Considerations")."""
    if not isinstance(raw, list):
        raise InvalidInput(file, f"{where}.mig_instances", "must be a list of tables")
    if raw and not gpu.get("mig_mode"):
        raise InvalidInput(file, f"{where}.mig_instances", "needs mig_mode = true")
    specs: list[MigSpec] = []
    seen: set[tuple[int, int]] = set()
    for k, item in enumerate(raw):
        at = f"{where}.mig_instances[{k}]"
        m = take(item, MIG_INSTANCE_KEYS, file, at)
        ids = (m["gpu_instance_id"], m["compute_instance_id"])
        if min(ids) < 0:
            raise InvalidInput(file, at, "gpu_instance_id and compute_instance_id must not be negative")
        if ids in seen:
            raise InvalidInput(file, at, f"GPU instance {ids[0]}, compute instance {ids[1]} is listed twice")
        seen.add(ids)
        if m["profile"] is not None and not PROFILE.match(m["profile"]):
            raise InvalidInput(file, f"{at}.profile", f"not a MIG profile name: {m['profile']!r} (e.g. 3g.40gb)")
        if m["memory_mib"] <= 0 or m["reserved_mib"] < 0 or (m["used_mib"] or 0) < 0:
            raise InvalidInput(file, at, "memory_mib must be positive, used_mib and reserved_mib not negative")
        if m["memory_mib"] > int(gpu["memory_mib"]):
            raise InvalidInput(file, f"{at}.memory_mib", f"more than the GPU's {gpu['memory_mib']} MiB")
        if len(specs) >= MAX_MIG_DEVICES:
            raise InvalidInput(file, at, f"at most {MAX_MIG_DEVICES} MIG devices on a GPU")
        specs.append(MigSpec(m["gpu_instance_id"], m["compute_instance_id"], m["profile"], m["memory_mib"],
                             m["used_mib"], m["reserved_mib"], m["multiprocessor_count"],
                             m["uuid"] or mig_uuid(str(gpu["uuid"]), *ids)))
    for k, proc in enumerate(gpu["processes"]):
        at = f"{where}.processes[{k}]"
        ids = (proc["gpu_instance_id"], proc["compute_instance_id"])
        if not gpu.get("mig_mode"):
            if ids != (None, None):
                raise InvalidInput(file, at, "gpu_instance_id and compute_instance_id need mig_mode = true")
            continue
        if proc["graphics"]:
            raise InvalidInput(file, f"{at}.graphics", "MIG does not support graphics processes")
        if specs and (ids[0], ids[1] or 0) not in seen:
            raise InvalidInput(file, at, f"no MIG instance with gpu_instance_id {ids[0]} and compute_instance_id "
                                         f"{ids[1] or 0} (processes of a MIG GPU run in one of its mig_instances)")
    return tuple(specs)
