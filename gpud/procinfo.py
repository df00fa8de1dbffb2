"""What ``/proc/PID`` says about a process, as pure text parsing (``gpud.hw.host`` reads the files; no
hardware, no imports of it): its ``status`` fields, its start time (``stat``), and where it runs (its
``cgroup``: a container, a Kubernetes pod, a Slurm job or a systemd unit).

``/proc/PID/status`` is split on ``"\\n"`` alone, never with ``str.splitlines``: that also splits on
``\\x1c``, ``\\x1d``, ``\\x1e``, ``\\x85``, ``\\u2028`` and more, and a process chooses its own name
(``Name:``, from ``/proc/self/comm``, where the kernel escapes only ``\\n`` and ``\\\\``): a name
``"\\x1cGroups:\\t0 27"`` would otherwise add a ``Groups:`` line of the process's choosing. Each key is
taken once, its first occurrence (``Name`` is the first line, before every key that says who a process
is). Every reader of ``status`` goes through ``status_fields``.

Where a process runs is judged by *who could have made its cgroup*. Any user can create cgroups of
any name in their own delegated systemd subtree (``/user.slice/user-UID.slice/user@UID.service/…``),
and a delegated unit (``Delegate=yes``, a container) below its own cgroup. So each layout is
recognised only at its system root, where only root (systemd, dockerd, the kubelet, slurmd) creates
cgroups (cgroup v2 ``0::PATH`` and the v1 ``N:controllers:PATH`` lines alike):

- Docker: ``/system.slice/docker-<id>.scope`` (systemd driver), ``/docker/<id>`` (cgroupfs driver)
  → ``docker:ID``
- Podman, rootful: ``/machine.slice/libpod-<id>.scope[/container]`` → ``podman:ID``
- Kubernetes: ``/kubepods.slice/[kubepods-<qos>.slice/]kubepods[-<qos>]-pod<uid with _>.slice/…``
  (systemd driver), ``/kubepods/[<qos>/]pod<uid>/<id>`` (cgroupfs driver) → ``pod:UID``
- Slurm: ``/system.slice/slurmstepd.scope/job_<N>/…`` (cgroup/v2 plugin), ``/slurm/uid_<U>/job_<N>/…``
  (v1) → ``slurm:JOB``
- a system unit: the first ``*.service`` or ``*.scope`` below the root and its ``*.slice``\\ s, outside
  ``/user.slice`` (``/system.slice/jupyterhub.service``, ``/init.scope``) → ``unit:NAME``. The first,
  not the innermost: below a delegated unit the names are its owner's.
- inside a user's own systemd manager (``/user.slice/user-UID.slice/user@UID.service/…``): the first
  unit there, rootless Podman's ``libpod-<id>.scope`` included, → ``user-unit:NAME``: what that user
  calls it, never a container, pod, job or system unit (the rules' ``unit`` key does not match it; a
  rule matches such a process by its ``user``). A login session's scope right under the user's slice
  (``/user.slice/user-UID.slice/session-N.scope``) is logind's, a system unit: ``unit:session-N.scope``;
  anything else under ``/user.slice``: None.

A cgroup path read from inside a cgroup namespace (gpud in a container) is relative to the reader's
own cgroup, ``/../../kubepods-besteffort.slice/…``: the path below the common ancestor. Its first
element was made where gpud's own cgroup hangs (never a user's subtree), so there a layout may also
start part-way down its system prefix (``kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice``,
``docker-<id>.scope``), but never further down than the element that names the workload.
"""

from __future__ import annotations

import re

SHORT_ID = 12  # container ids shown as docker ps shows them

_HEX_ID = r"[0-9a-f]{12,64}"
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_QOS = r"(?:besteffort|burstable)"
_UNIT = re.compile(r"[^/]+\.(?:service|scope)")
_SLICE = re.compile(r"[^/]+\.slice")
_SESSION = re.compile(r"session-[A-Za-z0-9]+\.scope")


def status_fields(text: str) -> dict[str, str]:
    """``/proc/PID/status`` as key → value (stripped): lines split on ``"\\n"`` only, each key's first
    occurrence (see the module's docstring: a process's name must not add lines)."""
    out: dict[str, str] = {}
    for line in text.split("\n"):
        key, sep, value = line.partition(":")
        if sep and key not in out:
            out[key] = value.strip()
    return out


def status_ids(text: str, key: str) -> list[int]:
    """The numbers of a ``status`` line (``Uid``: real, effective, saved, filesystem; ``Gid`` alike;
    ``Groups``: the supplementary groups); an entry that is not a number ends the list."""
    out: list[int] = []
    for word in status_fields(text).get(key, "").split():
        if not (word.isascii() and word.isdigit()):
            break
        out.append(int(word))
    return out


def start_time(stat: str | None) -> int | None:
    """A process's start time (``/proc/PID/stat`` field 22, clock ticks after boot); None when unreadable.

    The fields are read after the *last* ``)``: field 2 is the process's name in parentheses, which the
    process chooses and the kernel writes unescaped (spaces, parentheses, newlines and all)."""
    if not stat:
        return None
    close = stat.rfind(")")
    if close < 0:
        return None
    fields = stat[close + 1:].split()  # field 3 (state) on
    try:
        return int(fields[22 - 3])
    except (IndexError, ValueError):
        return None


def cgroup_paths(text: str) -> list[str]:
    """The cgroup paths of a ``/proc/PID/cgroup`` file (v2 line first where there is one). Lines are
    split on ``"\\n"`` only (the kernel refuses a cgroup name with a newline, not one with ``\\x1c``)."""
    paths: list[str] = []
    for line in text.split("\n"):
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2]:
            if parts[0] == "0" and parts[1] == "":
                paths.insert(0, parts[2])
            else:
                paths.append(parts[2])
    return paths


def _parts(path: str) -> tuple[bool, list[str]]:
    """(relative to a cgroup namespace's root: began with ``/..``, the elements after those ``..``)."""
    elems = [e for e in path.split("/") if e and e != "."]
    up = 0
    while up < len(elems) and elems[up] == "..":
        up += 1
    return up > 0, elems[up:]


# (kind, the layout's elements from its system root to the one naming the workload (its group 1),
#  how many of them a path relative to a cgroup namespace must still show: the naming one, and its
#  parents where that one alone says too little)
_LAYOUTS: tuple[tuple[str, tuple[re.Pattern[str], ...], int], ...] = tuple(
    (kind, tuple(re.compile(e) for e in elems), keep) for kind, elems, keep in (
        ("pod", (r"kubepods\.slice", rf"kubepods-pod({_UID})\.slice"), 1),  # Guaranteed
        ("pod", (r"kubepods\.slice", rf"kubepods-{_QOS}\.slice", rf"kubepods-{_QOS}-pod({_UID})\.slice"), 1),
        ("pod", (r"kubepods", rf"pod({_UID})"), 1),  # cgroupfs driver, Guaranteed
        ("pod", (r"kubepods", _QOS, rf"pod({_UID})"), 1),
        ("docker", (r"system\.slice", rf"docker-({_HEX_ID})\.scope"), 1),
        ("docker", (r"docker", rf"({_HEX_ID})"), 2),
        ("podman", (r"machine\.slice", rf"libpod-(?:conmon-)?({_HEX_ID})\.scope"), 1),
        ("slurm", (r"system\.slice", r"slurmstepd\.scope", r"job_(\d+)"), 2),
        ("slurm", (r"slurm", r"uid_\d+", r"job_(\d+)"), 2),
    ))


def _placed(elems: list[str], relative: bool) -> str | None:
    """``kind:ID`` of the first layout the path follows from its system root (or, relative to a cgroup
    namespace, from part-way down: the module's docstring)."""
    for kind, layout, keep in _LAYOUTS:
        for skip in range(len(layout) - keep + 1) if relative else (0,):
            pats = layout[skip:]
            if len(elems) < len(pats) or not all(p.fullmatch(e) for p, e in zip(pats, elems[:len(pats)], strict=True)):
                continue
            m = pats[-1].fullmatch(elems[len(pats) - 1])
            ident = m.group(1) if m else ""
            if kind == "pod":
                return f"pod:{ident.replace('_', '-')}"
            return f"{kind}:{ident[:SHORT_ID] if kind in ('docker', 'podman') else ident}"
    return None


def _first_unit(elems: list[str]) -> str | None:
    """The first unit after nothing but slices."""
    for e in elems:
        if _UNIT.fullmatch(e):
            return e
        if not _SLICE.fullmatch(e):
            return None
    return None


def _unit(elems: list[str]) -> str | None:
    """``unit:NAME`` of a system unit, ``user-unit:NAME`` inside a user's own manager, else None."""
    if elems[:1] == ["user.slice"]:
        m = re.fullmatch(r"user-(\d+)\.slice", elems[1]) if len(elems) > 1 else None
        if m and len(elems) > 3 and elems[2] == f"user@{m.group(1)}.service":
            name = _first_unit(elems[3:])
            return f"user-unit:{name}" if name else None
        if m and len(elems) > 2 and _SESSION.fullmatch(elems[2]):  # logind's scope, made by systemd
            return f"unit:{elems[2]}"
        return None
    name = _first_unit(elems)
    return f"unit:{name}" if name else None


def workload(text: str | None) -> str | None:
    """``docker:ID``, ``podman:ID``, ``pod:UID``, ``slurm:JOB``, ``unit:NAME`` or ``user-unit:NAME``;
    None when unknown (the layouts: the module's docstring)."""
    if not text:
        return None
    parsed = [_parts(p) for p in cgroup_paths(text)]
    for relative, elems in parsed:
        got = _placed(elems, relative)
        if got:
            return got
    for _, elems in parsed:
        got = _unit(elems)
        if got:
            return got
    return None
