"""The fan policy: automatic, a fixed duty or a curve. Apply writes only the automatic policy; a curve
or a fixed duty is the daemon's fan loop's to drive (``gpud.profiles.fanloop``)."""

from __future__ import annotations

from typing import Any

from gpud.errors import InvalidInput
from gpud.hw.machine import Machine
from gpud.model import GpuInfo, GpuSample
from gpud.profiles.settings.base import NUM, Checked, Planned, Setting, _finite, show
from gpud.schema import Spec, take

FAN_MODES = ("auto", "fixed", "curve")
FAN_SPEC: Spec = {
    "mode": (FAN_MODES, None),
    "percent": (int, None),
    "points": (list, None),
    "hysteresis": (NUM, 3),
    "minimum": (int, 0),
    "max_ramp": (NUM, 10),
}


def _parse_fan(table: Any, file: str, where: str) -> dict[str, Any]:
    """A profile's ``fan`` table: its mode, the keys that belong to it, a curve's shape, the ranges."""
    fan = take(table, FAN_SPEC, file, where)
    mode = fan["mode"]
    if mode is None:
        raise InvalidInput(file, f"{where}.mode", f"required: one of {', '.join(FAN_MODES)}")
    for key, belongs in (("points", "curve"), ("percent", "fixed")):
        if fan[key] is not None and mode != belongs:
            raise InvalidInput(file, f"{where}.{key}", f"belongs to mode = \"{belongs}\", not \"{mode}\" "
                                                       "(remove it, or change the mode)")
    if mode == "fixed":
        if fan["percent"] is None:
            raise InvalidInput(file, f"{where}.percent", "required for mode = \"fixed\"")
        if not 0 <= fan["percent"] <= 100:
            raise InvalidInput(file, f"{where}.percent", f"duty must be 0..100 %, not {fan['percent']}")
    if mode == "curve":
        pts = fan["points"]
        if not pts or len(pts) < 2:
            raise InvalidInput(file, f"{where}.points", "a curve needs at least two [°C, %] points")
        prev = None
        for k, p in enumerate(pts):
            key = f"{where}.points[{k}]"
            if (not isinstance(p, list) or len(p) != 2
                    or not all(isinstance(x, NUM) and not isinstance(x, bool) for x in p)):
                raise InvalidInput(file, key, f"must be [temperature °C, duty %], not {p!r}")
            t, duty = p
            if not 0 <= t <= 110:
                raise InvalidInput(file, key, f"temperature {t} °C outside 0..110")
            if not 0 <= duty <= 100:
                raise InvalidInput(file, key, f"duty {duty} % outside 0..100")
            if prev is not None and (t <= prev[0] or duty < prev[1]):
                raise InvalidInput(file, key, "not monotonic: temperatures must rise and duties must not fall "
                                              f"({prev} then {p})")
            prev = p
    if not 0 <= fan["hysteresis"] <= 20:
        raise InvalidInput(file, f"{where}.hysteresis", "must be 0..20 °C")
    if not 0 <= fan["minimum"] <= 100:
        raise InvalidInput(file, f"{where}.minimum", "must be 0..100 %")
    if not 0 < fan["max_ramp"] <= 100:
        raise InvalidInput(file, f"{where}.max_ramp", "must be in (0, 100] %/s")
    return fan


class Fan(Setting):
    """The fan policy. Apply only ever writes the automatic policy; curves and fixed duties are
    driven by the daemon's fan loop (``gpud.profiles.fanloop``), never by enforcement."""

    key = profile_key = "fan"
    enforced = False
    restored_first = True
    spec = dict
    stored_as = "a fan policy (auto, fixed with a percent, curve with points)"

    def parse(self, value: Any, file: str, where: str) -> Any:
        return _parse_fan(value, file, where)

    def resolve(self, g: GpuInfo, value: Any, file: str, where: str) -> Any:
        """Checked against the GPU: a curve point at or above its shutdown temperature, a duty below its
        minimum fan speed."""
        shutdown = g.temperature_shutdown_celsius
        if value["mode"] == "curve" and shutdown is not None:
            for k, (t, _) in enumerate(value["points"]):
                if t >= shutdown:
                    raise InvalidInput(file, f"{where}.points[{k}]",
                                       f"{t} °C is at or above GPU {g.index}'s shutdown temperature ({shutdown} °C, "
                                       "NVML's NVML_TEMPERATURE_THRESHOLD_SHUTDOWN): the GPU is off before it applies")
        fmin = g.fan_min_speed_percent
        if value["mode"] != "auto" and fmin is not None:
            duties = [value["percent"]] if value["mode"] == "fixed" else [d for _, d in value["points"]]
            if value["minimum"]:
                duties.append(value["minimum"])
            low = min(duties)
            if low < fmin:
                raise InvalidInput(file, where, f"duty {low} % is below GPU {g.index}'s minimum fan speed {fmin} %")
        return dict(value)

    def stored(self, value: Any) -> bool:
        v = value
        if v == "auto":
            return True
        if not isinstance(v, dict) or v.get("mode") not in FAN_MODES:
            return False
        if any(v.get(k) is not None and not _finite(v[k], 0, 1000) for k in ("hysteresis", "max_ramp", "minimum")):
            return False
        if v["mode"] == "fixed":
            return _finite(v.get("percent"), 0, 100)
        if v["mode"] == "curve":
            pts = v.get("points")
            return isinstance(pts, list) and bool(pts) and all(
                isinstance(p, list) and len(p) == 2 and _finite(p[0], -50, 200) and _finite(p[1], 0, 100) for p in pts)
        return True

    def shown(self, value: Any) -> str:
        if isinstance(value, dict) and value.get("mode") == "curve":
            pts = ", ".join(f"{t} °C → {d} %" for t, d in value["points"])
            return (f"curve {pts} (hysteresis {value['hysteresis']} °C, minimum {value['minimum']} %, "
                    f"ramp {value['max_ramp']} %/s)")
        if isinstance(value, dict):
            return f"fixed {value['percent']} %" if value["mode"] == "fixed" else "auto"
        return show(value)

    def read(self, s: GpuSample, recorded: Any = None) -> Any:
        return [f.policy for f in s.fans]

    def write(self, machine: Machine, gpu: int, value: Any) -> Any:
        info = machine.info(gpu)
        return [machine.nvml.set_fan_auto(gpu, f) for f in range(info.fan_count or 0)] if info else None

    def read_back_ok(self, wanted: Any, got: Any) -> bool:
        return True  # the policy write is read back by Nvml itself

    def original(self, current: Any) -> Any:
        return "auto"

    def plan(self, g: GpuInfo, s: GpuSample, value: Any, recorded: Any, daemon: bool) -> Planned:
        cur = self.read(s)
        if not s.fans or not g.fan_count:
            return Planned(cur, value["mode"], "skip",
                           "no fan control on this GPU (passive card cooled by the chassis)")
        if value["mode"] == "auto":
            return Planned(cur, "auto", "none" if all(p == "auto" for p in cur) else "set")
        if not daemon:
            return Planned(cur, value["mode"], "daemon",
                           "needs the gpud daemon to drive it: fans stay on the automatic policy")
        return Planned(cur, value["mode"], "daemon", "handed to the running gpud daemon's fan controller")

    def check(self, s: GpuSample, value: Any, daemon: bool) -> Checked:
        policies = self.read(s)
        if not s.fans:
            return Checked(None, value["mode"], "unverifiable")
        if value["mode"] == "auto":
            return Checked(policies, "auto", "ok" if all(p == "auto" for p in policies) else "drift")
        if not daemon:
            return Checked(policies, value["mode"], "daemon")  # needs the daemon: not drift
        if value["mode"] == "fixed":
            targets = [f.target_percent for f in s.fans]
            good = all(p == "manual" for p in policies) and all(t == value["percent"] for t in targets)
            return Checked(targets, value["percent"], "ok" if good else "drift")
        return Checked(policies, "curve", "ok" if all(p == "manual" for p in policies) else "drift")
