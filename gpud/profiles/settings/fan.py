"""The fan policy: automatic, a fixed duty or a curve. Apply writes only the automatic policy; a curve
or a fixed duty is the daemon's fan loop's to drive (``gpud.profiles.fanloop``)."""

from __future__ import annotations

from typing import Any

from gpud.errors import InvalidInput
from gpud.hw.machine import Machine
from gpud.model import GpuInfo
from gpud.profiles.fancurve import FAN_MODES, FAN_SPEC, Auto, Curve, FanPolicy, Fixed, fan_policy, read_policy
from gpud.profiles.settings.base import At, Checked, Planned, Setting, Target, gpu_index, show

__all__ = ["FAN_MODES", "FAN_SPEC", "Fan"]


class Fan(Setting[FanPolicy]):
    """The fan policy. Apply only ever writes the automatic policy; curves and fixed duties are
    driven by the daemon's fan loop (``gpud.profiles.fanloop``), never by enforcement."""

    key = profile_key = "fan"
    enforced = False
    restored_first = True
    spec = dict
    stored_as = "a fan policy (auto, fixed with a percent, curve with points)"

    def parse(self, value: Any, file: str, where: str) -> Any:
        return fan_policy(value, file, where).to_json()

    def resolve(self, g: GpuInfo, value: Any, file: str, where: str) -> Any:
        """Checked against the GPU: a curve point at or above its shutdown temperature, a duty below its
        minimum fan speed."""
        policy = read_policy(value)
        shutdown = g.temperature_shutdown_celsius
        if isinstance(policy, Curve) and shutdown is not None:
            for k, (t, _) in enumerate(policy.points):
                if t >= shutdown:
                    raise InvalidInput(file, f"{where}.points[{k}]",
                                       f"{t} °C is at or above GPU {g.index}'s shutdown temperature ({shutdown} °C, "
                                       "NVML's NVML_TEMPERATURE_THRESHOLD_SHUTDOWN): the GPU is off before it applies")
        fmin = g.fan_min_speed_percent
        duties = policy.duties()
        if duties and fmin is not None and min(duties) < fmin:
            raise InvalidInput(file, where, f"duty {min(duties)} % is below GPU {g.index}'s minimum fan speed {fmin} %")
        return policy.to_json()

    def from_json(self, raw: Any) -> FanPolicy:
        return read_policy(raw)

    def to_json(self, value: Any) -> Any:
        return value.to_json() if isinstance(value, Auto | Fixed | Curve) else value

    def shown(self, value: Any) -> str:
        try:
            policy = read_policy(value)
        except ValueError:
            return show(value)
        if isinstance(policy, Curve):
            pts = ", ".join(f"{t} °C → {d} %" for t, d in policy.points)
            return (f"curve {pts} (hysteresis {policy.hysteresis} °C, minimum {policy.minimum} %, "
                    f"ramp {policy.max_ramp} %/s)")
        return f"fixed {policy.percent} %" if isinstance(policy, Fixed) else "auto"

    def read(self, at: At, recorded: Any = None) -> list[str | None]:
        return [f.policy for f in at.sample.fans]

    def write(self, machine: Machine, target: Target, value: Any) -> Any:
        info = machine.info(gpu_index(target))
        return [machine.nvml.set_fan_auto(gpu_index(target), f) for f in range(info.fan_count or 0)] if info else None

    def read_back_ok(self, wanted: Any, got: Any) -> bool:
        return True  # the policy write is read back by Nvml itself

    def original(self, current: Any) -> Any:
        return "auto"

    def undo(self, current: Any) -> Any:
        return "auto"  # whatever drove the fans before, a rollback hands them to the driver

    def plan(self, at: At, value: FanPolicy, recorded: Any, daemon: bool) -> Planned:
        cur = self.read(at)
        s, g = at.sample, at.info
        if not s.fans or not g.fan_count:
            return Planned(cur, value.mode, "skip", "no fan control on this GPU (passive card cooled by the chassis)")
        if isinstance(value, Auto):
            return Planned(cur, "auto", "none" if all(p == "auto" for p in cur) else "set", original=self.original(cur),
                           undo=self.undo(cur))
        if not daemon:
            return Planned(cur, value.mode, "daemon", "needs the gpud daemon to drive it: fans stay on the automatic "
                                                      "policy")
        return Planned(cur, value.mode, "daemon", "handed to the running gpud daemon's fan controller")

    def check(self, at: At, value: FanPolicy, daemon: bool) -> Checked:
        policies = self.read(at)
        s = at.sample
        if not s.fans:
            return Checked(None, value.mode, "unverifiable")
        if isinstance(value, Auto):
            return Checked(policies, "auto", "ok" if all(p == "auto" for p in policies) else "drift")
        if not daemon:
            return Checked(policies, value.mode, "daemon")  # needs the daemon: not drift
        if isinstance(value, Fixed):
            targets = [f.target_percent for f in s.fans]
            good = all(p == "manual" for p in policies) and all(t == value.percent for t in targets)
            return Checked(targets, value.percent, "ok" if good else "drift")
        return Checked(policies, "curve", "ok" if all(p == "manual" for p in policies) else "drift")
