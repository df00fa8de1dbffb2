"""``gpud.toml``: what the lab expects of a workstation, and doctor's thresholds.

Read from ``--config PATH``, ``GPUD_CONFIG``, or ``/etc/gpud/gpud.toml`` when present.
Every key is documented in ``docs/configuration.md``; an invalid file is rejected as a whole
(``file: key: reason``, exit 2) before anything else runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpud.errors import InvalidInput
from gpud.paths import CONFIG_DIR
from gpud.schema import Spec, load_toml, take

DEFAULT_PATH = CONFIG_DIR / "gpud.toml"
NUM = (int, float)

MACHINE: Spec = {
    "expect_gpus": (int, None),
    "nvlink_pairs": (list, None),
    "psu_watts": (NUM, None),
    "cpu_tdp_watts": (NUM, None),
}
DOCTOR: Spec = {
    "python": (str, None),
    "skip": (list, []),
    "thermal_margin_warn_celsius": (NUM, 10),
    "thermal_margin_fail_celsius": (NUM, 3),
    "idle_temperature_warn_celsius": (NUM, 60),
    "load_utilization_percent": (int, 50),
    "fan_check_min_celsius": (NUM, 60),
    "fan_lag_percent": (int, 25),
    "shm_min_gib_per_gpu": (NUM, 1),
    "memlock_min_mib": (int, 64),
    "psu_load_warn_ratio": (NUM, 0.9),
    "pcie_replay_warn": (int, 100),
}
DEFAULT_PORT = 10909  # outside 9100-9999, the range Prometheus' default port allocations hand out
DAEMON: Spec = {
    "interval_seconds": (NUM, 1.0),
    "listen": (str, f":{DEFAULT_PORT}"),
    "web_config": (str, None),
    "socket": (str, "/run/gpud/gpud.sock"),
    "socket_group": (str, "gpud"),
    "doctor_interval_seconds": (NUM, 300),
    "profile": (str, None),
    "restore_on_stop": (bool, False),
    "probe_interval_hours": (NUM, 0),
    "probe_idle_minutes": (NUM, 10),
    "probe_world_sizes": (list, None),
    "status_processes": (("protected", "always", "never"), "protected"),
}
PROBE: Spec = {"min_efficiency": (dict, {"2": 0.85, "4": 0.875, "8": 0.775})}
SECTIONS: dict[str, Spec] = {"machine": MACHINE, "doctor": DOCTOR, "daemon": DAEMON, "probe": PROBE}


@dataclass(frozen=True)
class Config:
    path: str | None = None
    machine: dict[str, Any] = field(default_factory=lambda: take({}, MACHINE, "", "machine"))
    doctor: dict[str, Any] = field(default_factory=lambda: take({}, DOCTOR, "", "doctor"))
    daemon: dict[str, Any] = field(default_factory=lambda: take({}, DAEMON, "", "daemon"))
    probe: dict[str, Any] = field(default_factory=lambda: take({}, PROBE, "", "probe"))

    def efficiency_thresholds(self) -> dict[int, float]:
        return {int(k): float(v) for k, v in self.probe["min_efficiency"].items()}


def parse(data: dict[str, Any], file: str) -> Config:
    for key in data:
        if key not in SECTIONS:
            raise InvalidInput(file, key, f"unknown section (known: {', '.join(SECTIONS)})")
    machine = take(data.get("machine", {}), MACHINE, file, "machine")
    doctor = take(data.get("doctor", {}), DOCTOR, file, "doctor")
    if machine["expect_gpus"] is not None and not 0 <= machine["expect_gpus"] <= 64:
        raise InvalidInput(file, "machine.expect_gpus", "must be 0..64")
    pairs = machine["nvlink_pairs"]
    if pairs is not None:
        for k, p in enumerate(pairs):
            if (not isinstance(p, list) or len(p) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                  and x >= 0 for x in p) or p[0] == p[1]):
                raise InvalidInput(file, f"machine.nvlink_pairs[{k}]", f"must be two different GPU indices, not {p!r}")
    for key in ("psu_watts", "cpu_tdp_watts"):
        if machine[key] is not None and machine[key] <= 0:
            raise InvalidInput(file, f"machine.{key}", "must be positive")
    n = machine["expect_gpus"]
    for k, p in enumerate(pairs or []):
        if n is not None and max(p) >= n:
            raise InvalidInput(file, f"machine.nvlink_pairs[{k}]", f"GPU {max(p)} does not exist: expect_gpus = {n}")
        if max(p) >= 64:
            raise InvalidInput(file, f"machine.nvlink_pairs[{k}]", "GPU indices are 0..63")
    for key in ("psu_watts", "cpu_tdp_watts"):
        if machine[key] is not None and machine[key] > 100_000:
            raise InvalidInput(file, f"machine.{key}", "must be at most 100000 W")
    if not all(isinstance(s, str) for s in doctor["skip"]):
        raise InvalidInput(file, "doctor.skip", "must be a list of check ids or globs")
    for key, lo, hi, unit in (("thermal_margin_warn_celsius", 0, 100, "°C"),
                              ("idle_temperature_warn_celsius", 20, 120, "°C"),
                              ("fan_check_min_celsius", 20, 120, "°C"),
                              ("fan_lag_percent", 1, 100, "%"),
                              ("shm_min_gib_per_gpu", 0, 1024, "GiB"),
                              ("memlock_min_mib", 0, 1 << 20, "MiB"),
                              ("pcie_replay_warn", 0, 1 << 31, "")):
        if not lo <= doctor[key] <= hi:
            raise InvalidInput(file, f"doctor.{key}", f"must be {lo}..{hi}{' ' + unit if unit else ''}, "
                                                      f"not {doctor[key]}")
    if not 0 < doctor["psu_load_warn_ratio"] <= 1:
        raise InvalidInput(file, "doctor.psu_load_warn_ratio", "must be in (0, 1]")
    if not 0 <= doctor["thermal_margin_fail_celsius"] < doctor["thermal_margin_warn_celsius"]:
        raise InvalidInput(file, "doctor.thermal_margin_fail_celsius",
                           "must be at least 0 and below thermal_margin_warn_celsius")
    if not 0 < doctor["load_utilization_percent"] <= 100:
        raise InvalidInput(file, "doctor.load_utilization_percent", "must be 1..100")
    daemon = take(data.get("daemon", {}), DAEMON, file, "daemon")
    if not 0.05 <= daemon["interval_seconds"] <= 60:
        raise InvalidInput(file, "daemon.interval_seconds", "must be 0.05..60 s")
    try:
        parse_listen(daemon["listen"])
    except ValueError as err:
        raise InvalidInput(file, "daemon.listen", str(err)) from err
    if daemon["doctor_interval_seconds"] < 10:
        raise InvalidInput(file, "daemon.doctor_interval_seconds", "must be at least 10 s")
    if daemon["doctor_interval_seconds"] > 86400:
        raise InvalidInput(file, "daemon.doctor_interval_seconds", "must be at most 86400 s (a day)")
    for key, hi in (("probe_interval_hours", 24 * 365), ("probe_idle_minutes", 24 * 60)):
        if not 0 <= daemon[key] <= hi:
            raise InvalidInput(file, f"daemon.{key}", f"must be 0..{hi}, not {daemon[key]}")
    sizes = daemon["probe_world_sizes"]
    if sizes is not None and (not sizes or not all(
            isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 64 for x in sizes)):
        raise InvalidInput(file, "daemon.probe_world_sizes", f"must be a list of world sizes 1..64, not {sizes!r}")
    for key in ("socket", "socket_group", "web_config", "profile"):
        v = daemon[key]
        if v is not None and (not v or "\0" in v or len(v) > 4096):
            raise InvalidInput(file, f"daemon.{key}", "must be a non-empty string")
    if len(daemon["socket"].encode()) > 107:
        raise InvalidInput(file, "daemon.socket", "a Unix socket path is at most 107 bytes")
    probe = take(data.get("probe", {}), PROBE, file, "probe")
    for k, v in probe["min_efficiency"].items():
        if not k.isdigit() or int(k) < 2:
            raise InvalidInput(file, f"probe.min_efficiency.{k}", "keys are world sizes of 2 or more")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise InvalidInput(file, f"probe.min_efficiency.{k}", f"must be a ratio in (0, 1], not {v!r}")
    return Config(file, machine, doctor, daemon, probe)


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
    data, _ = load_toml(p, str(p))
    return parse(data, str(p))
