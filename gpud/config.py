"""``gpud.toml``: what the lab expects of a workstation, and doctor's thresholds.

Read from ``--config PATH``, ``GPUD_CONFIG``, or ``/etc/gpud/gpud.toml`` when present.
Every key is documented in ``docs/configuration.md``; an invalid file is rejected as a whole
(``file: key: reason``, exit 2) before anything else runs.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import re2

from gpud.errors import InvalidInput
from gpud.paths import CONFIG_DIR
from gpud.schema import REQUIRED, Spec, build, key, load_toml, out_of_range, spec_of

DEFAULT_PATH = CONFIG_DIR / "gpud.toml"
NUM = (int, float)
DEFAULT_PORT = 10909  # outside 9100-9999, the range Prometheus' default port allocations hand out
StatusProcesses = Literal["protected", "always", "never"]
UnreadableKernelLog = Literal["fit", "unfit"]

# Each section is a frozen dataclass; each key is declared once, as a field made by ``schema.key``
# (its TOML type, its default, and for doctor's plain thresholds its range). ``parse`` builds
# them through ``schema.build`` and checks what spans keys.


@dataclass(frozen=True)
class MachineSection:
    """``[machine]``: what the lab expects of this workstation."""

    expect_gpus: int | None = key(int)
    nvlink_pairs: list[list[int]] | None = key(list)
    psu_watts: float | None = key(NUM)
    cpu_tdp_watts: float | None = key(NUM)


@dataclass(frozen=True)
class DoctorSection:
    """``[doctor]``: doctor's thresholds."""

    python: str | None = key(str)
    skip: list[str] = key(list, [])
    thermal_margin_warn_celsius: float = key(NUM, 10, between=(0, 100, "°C"))
    thermal_margin_fail_celsius: float = key(NUM, 3)
    idle_temperature_warn_celsius: float = key(NUM, 60, between=(20, 120, "°C"))
    load_utilization_percent: int = key(int, 50)
    fan_check_min_celsius: float = key(NUM, 60, between=(20, 120, "°C"))
    fan_lag_percent: int = key(int, 25, between=(1, 100, "%"))
    shm_min_gib_per_gpu: float = key(NUM, 1, between=(0, 1024, "GiB"))
    memlock_min_mib: int = key(int, 64, between=(0, 1 << 20, "MiB"))
    psu_load_warn_ratio: float = key(NUM, 0.9)
    pcie_replay_warn: int = key(int, 100, between=(0, 1 << 31, ""))
    # the Slurm prolog's answer when no kernel log is readable (the Xids are unknown): "fit" (exit 0 and a
    # warning on stderr: a missing mount does not drain a cluster) or "unfit" (exit 1, saying what is missing)
    unreadable_kernel_log: UnreadableKernelLog = key(("fit", "unfit"), "fit")


@dataclass(frozen=True)
class DaemonSection:
    """``[daemon]``: the loop, its listeners and its schedules."""

    interval_seconds: float = key(NUM, 1.0)
    listen: str = key(str, f":{DEFAULT_PORT}")
    web_config: str | None = key(str)
    socket: str = key(str, "/run/gpud/gpud.sock")
    socket_group: str = key(str, "gpud")
    doctor_interval_seconds: float = key(NUM, 300)
    profile: str | None = key(str)
    restore_on_stop: bool = key(bool, False)
    probe_interval_hours: float = key(NUM, 0)
    probe_idle_minutes: float = key(NUM, 10)
    probe_world_sizes: list[int] | None = key(list)
    status_processes: StatusProcesses = key(("protected", "always", "never"), "protected")
    # [[rules]]: how long a GPU keeps a rule's profile after its last matching process left (a job that
    # restarts within it does not flap the settings), and how often the GPUs' process lists are polled.
    rules_hold_off_seconds: float = key(NUM, 3.0, between=(0, 3600, "s"))
    rules_poll_seconds: float = key(NUM, 0.5, between=(0.05, 10, "s"))


# What a rule matches on: present (true), absent (false) or equal to a value.
PRESENCE = ("container", "pod", "slurm_job", "unit")
RULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class Rule:
    """One ``[[rules]]`` table: which processes it matches (every key given must hold) and the profile
    the GPUs they use switch to. ``gpu_indices`` None: any GPU."""

    name: str = key(str, REQUIRED)
    profile: str = key(str, REQUIRED)
    user: str | None = key(str)
    group: str | None = key(str)
    command: str | None = key(str)  # a regular expression, searched in the command line
    container: str | bool | None = key((str, bool))
    pod: str | bool | None = key((str, bool))
    slurm_job: str | int | bool | None = key((str, int, bool))
    unit: str | bool | None = key((str, bool))
    any_compute: bool | None = key(bool)
    priority: int = key(int, 0, between=(-1000, 1000, ""))
    gpus: list[int] | None = key(list)

    @property
    def matchers(self) -> tuple[str, ...]:
        """The match keys this rule gives."""
        return tuple(k for k in ("user", "group", "command", *PRESENCE, "any_compute")
                     if getattr(self, k) is not None)


@dataclass(frozen=True)
class ProbeSection:
    """``[probe]``: the probe's thresholds."""

    min_efficiency: dict[str, float] = key(dict, {"2": 0.85, "4": 0.875, "8": 0.775})


@dataclass(frozen=True)
class HealthSection:
    """``[health]``: the Xid policy of the health states (gpud.doctor.health)."""

    application_xids: list[int] | None = key(list)  # None: the device plugin's list and the catalog's
    reboot_threshold: int = key(int, 1, between=(1, 100, "reboots"))


MACHINE: Spec = spec_of(MachineSection)
DOCTOR: Spec = spec_of(DoctorSection)
DAEMON: Spec = spec_of(DaemonSection)
PROBE: Spec = spec_of(ProbeSection)
HEALTH: Spec = spec_of(HealthSection)
RULE: Spec = spec_of(Rule)
SECTIONS: dict[str, Spec] = {"machine": MACHINE, "doctor": DOCTOR, "daemon": DAEMON, "probe": PROBE,
                             "health": HEALTH}
ARRAYS = ("rules",)  # arrays of tables


@dataclass(frozen=True)
class Config:
    path: str | None = None
    machine: MachineSection = field(default_factory=MachineSection)
    doctor: DoctorSection = field(default_factory=DoctorSection)
    daemon: DaemonSection = field(default_factory=DaemonSection)
    probe: ProbeSection = field(default_factory=ProbeSection)
    health: HealthSection = field(default_factory=HealthSection)
    rules: tuple[Rule, ...] = ()

    def efficiency_thresholds(self) -> dict[int, float]:
        return {int(k): float(v) for k, v in self.probe.min_efficiency.items()}

    def with_daemon(self, **changes: Any) -> Config:
        """This configuration with some ``[daemon]`` keys replaced (command-line options, what a reload
        could not bind)."""
        return replace(self, daemon=replace(self.daemon, **changes))


def parse(data: dict[str, Any], file: str) -> Config:
    for name in data:
        if name not in SECTIONS and name not in ARRAYS:
            raise InvalidInput(file, name, f"unknown section (known: {', '.join([*SECTIONS, *ARRAYS])})")
    machine = build(MachineSection, data.get("machine", {}), file, "machine")
    doctor = build(DoctorSection, data.get("doctor", {}), file, "doctor")
    if machine.expect_gpus is not None and not 0 <= machine.expect_gpus <= 64:
        raise InvalidInput(file, "machine.expect_gpus", "must be 0..64")
    pairs = machine.nvlink_pairs
    if pairs is not None:
        for k, p in enumerate(pairs):
            if (not isinstance(p, list) or len(p) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                  and x >= 0 for x in p) or p[0] == p[1]):
                raise InvalidInput(file, f"machine.nvlink_pairs[{k}]", f"must be two different GPU indices, not {p!r}")
    watts = (("psu_watts", machine.psu_watts), ("cpu_tdp_watts", machine.cpu_tdp_watts))
    for name, w in watts:
        if w is not None and w <= 0:
            raise InvalidInput(file, f"machine.{name}", "must be positive")
    seen: dict[tuple[int, int], int] = {}
    for k, p in enumerate(pairs or []):
        first = seen.setdefault((min(p), max(p)), k)
        if first != k:
            raise InvalidInput(file, f"machine.nvlink_pairs[{k}]", f"the pair {p!r} is already nvlink_pairs[{first}]")
    n = machine.expect_gpus
    for k, p in enumerate(pairs or []):
        if n is not None and max(p) >= n:
            raise InvalidInput(file, f"machine.nvlink_pairs[{k}]", f"GPU {max(p)} does not exist: expect_gpus = {n}")
        if max(p) >= 64:
            raise InvalidInput(file, f"machine.nvlink_pairs[{k}]", "GPU indices are 0..63")
    for name, w in watts:
        if w is not None and w > 100_000:
            raise InvalidInput(file, f"machine.{name}", "must be at most 100000 W")
    if not all(isinstance(s, str) for s in doctor.skip):
        raise InvalidInput(file, "doctor.skip", "must be a list of check ids or globs")
    out_of_range(doctor, file, "doctor")
    if not 0 < doctor.psu_load_warn_ratio <= 1:
        raise InvalidInput(file, "doctor.psu_load_warn_ratio", "must be in (0, 1]")
    if not 0 <= doctor.thermal_margin_fail_celsius < doctor.thermal_margin_warn_celsius:
        raise InvalidInput(file, "doctor.thermal_margin_fail_celsius",
                           "must be at least 0 and below thermal_margin_warn_celsius")
    if not 0 < doctor.load_utilization_percent <= 100:
        raise InvalidInput(file, "doctor.load_utilization_percent", "must be 1..100")
    daemon = build(DaemonSection, data.get("daemon", {}), file, "daemon")
    if not 0.05 <= daemon.interval_seconds <= 60:
        raise InvalidInput(file, "daemon.interval_seconds", "must be 0.05..60 s")
    try:
        parse_listen(daemon.listen)
    except ValueError as err:
        raise InvalidInput(file, "daemon.listen", str(err)) from err
    if daemon.doctor_interval_seconds < 10:
        raise InvalidInput(file, "daemon.doctor_interval_seconds", "must be at least 10 s")
    if daemon.doctor_interval_seconds > 86400:
        raise InvalidInput(file, "daemon.doctor_interval_seconds", "must be at most 86400 s (a day)")
    for name, v, hi in (("probe_interval_hours", daemon.probe_interval_hours, 24 * 365),
                        ("probe_idle_minutes", daemon.probe_idle_minutes, 24 * 60)):
        if not 0 <= v <= hi:
            raise InvalidInput(file, f"daemon.{name}", f"must be 0..{hi}, not {v}")
    sizes = daemon.probe_world_sizes
    if sizes is not None and (not sizes or not all(
            isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 64 for x in sizes)):
        raise InvalidInput(file, "daemon.probe_world_sizes", f"must be a list of world sizes 1..64, not {sizes!r}")
    for name, text in (("socket", daemon.socket), ("socket_group", daemon.socket_group),
                       ("web_config", daemon.web_config), ("profile", daemon.profile)):
        if text is not None and (not text or "\0" in text or len(text) > 4096):
            raise InvalidInput(file, f"daemon.{name}", "must be a non-empty string")
    if len(daemon.socket.encode()) > 107:
        raise InvalidInput(file, "daemon.socket", "a Unix socket path is at most 107 bytes")
    probe = build(ProbeSection, data.get("probe", {}), file, "probe")
    for ws, ratio in probe.min_efficiency.items():
        if not ws.isdigit() or int(ws) < 2:
            raise InvalidInput(file, f"probe.min_efficiency.{ws}", "keys are world sizes of 2 or more")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise InvalidInput(file, f"probe.min_efficiency.{ws}", f"must be a ratio in (0, 1], not {ratio!r}")
    health = build(HealthSection, data.get("health", {}), file, "health")
    out_of_range(health, file, "health")
    xids = health.application_xids
    if xids is not None and not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 1023 for x in xids):
        raise InvalidInput(file, "health.application_xids", f"must be a list of Xid numbers 1..1023, not {xids!r}")
    out_of_range(daemon, file, "daemon")
    return Config(file, machine, doctor, daemon, probe, health, parse_rules(data.get("rules", []), file))


@functools.lru_cache(maxsize=256)
def command_pattern(text: str) -> Any:
    """A rule's ``command``, compiled by RE2 (``google-re2``): matching takes time linear in the command
    line's length whatever the pattern, with no backtracking a crafted command line could set off (Python's
    ``re`` took minutes on ``(a+)+$`` and a command line of 40 ``a`` and a ``!``, holding the GIL). RE2 has no
    backreferences or lookaround (a pattern with them raises ``re2.error``: refused when the
    configuration loads), ``\\d``, ``\\w``, ``\\b`` are ASCII and the end of the text is ``\\z``, not ``\\Z``."""
    options = re2.Options()
    options.log_errors = False  # the refusal is gpud's one line, not RE2's log on stderr
    options.never_capture = True  # searched for a yes or no
    return re2.compile(text, options=options)


def parse_rules(raw: Any, file: str) -> tuple[Rule, ...]:
    """``[[rules]]``: each a table of known keys, at least one match key, a unique name, a command
    that compiles, GPU indices 0..63; ``file: rules[k].key: reason`` otherwise."""
    if not isinstance(raw, list):
        raise InvalidInput(file, "rules", "must be an array of tables ([[rules]])")
    rules: list[Rule] = []
    names: dict[str, int] = {}
    for k, table in enumerate(raw):
        where = f"rules[{k}]"
        rule = build(Rule, table, file, where)
        out_of_range(rule, file, where)
        if not RULE_NAME.match(rule.name):
            raise InvalidInput(file, f"{where}.name", "letters, digits, '.', '_' and '-' (at most 64), "
                                                      f"starting with a letter or digit, not {rule.name!r}")
        if rule.name in names:
            raise InvalidInput(file, f"{where}.name", f"{rule.name!r} is already rules[{names[rule.name]}]")
        names[rule.name] = k
        if not rule.profile or "\0" in rule.profile or len(rule.profile) > 4096:
            raise InvalidInput(file, f"{where}.profile", "must be a profile name or path")
        if not rule.matchers:
            raise InvalidInput(file, where, "matches nothing: give at least one of user, group, command, "
                                            "container, pod, slurm_job, unit, any_compute")
        if rule.any_compute is False:
            raise InvalidInput(file, f"{where}.any_compute", "only true means something (leave it out)")
        for name in ("user", "group", "command", *PRESENCE):
            value = getattr(rule, name)
            if isinstance(value, str) and (not value or any(ord(c) < 32 for c in value) or len(value) > 4096):
                raise InvalidInput(file, f"{where}.{name}", "must be a non-empty line of text")
        if isinstance(rule.slurm_job, int) and not isinstance(rule.slurm_job, bool) and rule.slurm_job < 0:
            raise InvalidInput(file, f"{where}.slurm_job", "a Slurm job id is at least 0")
        if isinstance(rule.slurm_job, str) and not rule.slurm_job.isdigit():
            raise InvalidInput(file, f"{where}.slurm_job", f"a Slurm job id is a number, not {rule.slurm_job!r}")
        if rule.command is not None:
            try:
                command_pattern(rule.command)
            except re2.error as err:
                why = err.args[0].decode(errors="replace") if err.args and isinstance(err.args[0], bytes) else err
                raise InvalidInput(file, f"{where}.command", f"not a regular expression RE2 takes (RE2 has no "
                                                             f"backreferences or lookaround): {why}") from None
        gpus = rule.gpus
        if gpus is not None and (not gpus or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 64
                                                     for g in gpus) or len(set(gpus)) != len(gpus)):
            raise InvalidInput(file, f"{where}.gpus", f"must be a list of different GPU indices 0..63, not {gpus!r}")
        rules.append(rule)
    return tuple(rules)


def parse_listen(text: str) -> tuple[str, int]:
    """``host:port``, ``:port`` (all interfaces) or ``[v6]:port`` → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 <= int(port) <= 65535 or any(
            c.isspace() for c in text):
        raise ValueError(f"must be HOST:PORT, :PORT or [V6]:PORT, not {text!r}")
    host = host.strip("[]")
    return host or "0.0.0.0", int(port)


def load(path: str | None = None) -> Config:
    """The configuration: an explicit path must exist; the default one may be absent."""
    explicit = path or os.environ.get("GPUD_CONFIG")
    p = Path(explicit) if explicit else DEFAULT_PATH
    if not explicit and not p.is_file():
        return Config()
    data, _ = load_toml(p, str(p), trust="configuration")  # as root: only a file root alone could write
    return parse(data, str(p))
