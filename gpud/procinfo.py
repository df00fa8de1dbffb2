"""Where a process runs, from its ``/proc/PID/cgroup``: a container, a Kubernetes pod, a Slurm job or
a systemd unit. Pure text parsing (``gpud.hw.host`` reads the file); no hardware, no imports of it.

Layouts recognised (cgroup v2 ``0::PATH`` and the v1 ``N:controllers:PATH`` lines alike):

- Docker: ``/system.slice/docker-<id>.scope`` (systemd driver), ``/docker/<id>`` (cgroupfs driver)
- Podman: ``/machine.slice/libpod-<id>.scope[/container]``, ``…/user@UID.service/…/libpod-<id>.scope``
- Kubernetes: ``/kubepods.slice/…/kubepods-<qos>-pod<uid with _>.slice/…`` (systemd driver),
  ``/kubepods/<qos>/pod<uid>/<id>`` (cgroupfs driver)
- Slurm: ``/system.slice/slurmstepd.scope/job_<N>/…`` (cgroup/v2 plugin), ``/slurm/uid_<U>/job_<N>/…`` (v1)
- otherwise the innermost systemd unit (``*.service``, ``*.scope``), e.g. ``jupyter.service``
"""

from __future__ import annotations

import re

_DOCKER = re.compile(r"(?:/docker-|/docker/)([0-9a-f]{12,64})(?:\.scope)?(?:/|$)")
_PODMAN = re.compile(r"/libpod-(?:conmon-)?([0-9a-f]{12,64})\.scope(?:/|$)")
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"(?:-pod|/pod)({_UID})(?:\.slice)?(?:/|$)")
_SLURM = re.compile(r"/job_(\d+)(?:/|$)")
_UNIT = re.compile(r"/([^/]+\.(?:service|scope))(?:/|$)")
SHORT_ID = 12  # container ids shown as docker ps shows them


def cgroup_paths(text: str) -> list[str]:
    """The cgroup paths of a ``/proc/PID/cgroup`` file (v2 line first where there is one)."""
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            if parts[0] == "0" and parts[1] == "":
                paths.insert(0, parts[2])
            else:
                paths.append(parts[2])
    return paths


def workload(text: str | None) -> str | None:
    """``docker:ID``, ``podman:ID``, ``pod:UID``, ``slurm:JOB`` or ``unit:NAME``; None when unknown."""
    if not text:
        return None
    paths = cgroup_paths(text)
    for path in paths:
        if "slurm" in path:
            m = _SLURM.search(path)
            if m:
                return f"slurm:{m.group(1)}"
        if "kubepods" in path:
            m = _POD.search(path)
            if m:
                return f"pod:{m.group(1).replace('_', '-')}"
        m = _PODMAN.search(path)
        if m:
            return f"podman:{m.group(1)[:SHORT_ID]}"
        m = _DOCKER.search(path)
        if m:
            return f"docker:{m.group(1)[:SHORT_ID]}"
    for path in paths:
        units = _UNIT.findall(path)
        if units:
            return f"unit:{units[-1]}"
    return None
