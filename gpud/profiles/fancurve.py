"""The fan-curve controller: temperature samples and time in, a duty (or a failsafe) out.

Pure: no NVML here, so the daemon drives it and tests feed it. Behaviour (after LACT):

- piecewise-linear interpolation between the curve's (°C, %) points, flat beyond the ends;
- hysteresis on the way down: the duty only falls once the temperature has dropped
  ``hysteresis`` °C below the temperature that set it (rising is immediate);
- a floor: never below the profile's ``minimum`` nor the GPU's minimum fan speed;
- a ramp limit of ``max_ramp`` %/s both ways, except at or above the curve's last point, where
  the fan goes straight to the curve's maximum (never slow down cooling in an emergency);
- failsafe: an unreadable temperature (None) gives ``FAILSAFE``: the caller hands the fan back
  to the driver's automatic policy at once (also on a failed write or a lost GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FAILSAFE = -1


@dataclass(frozen=True)
class FanCurve:
    points: tuple[tuple[float, float], ...]
    hysteresis: float = 3.0
    minimum: float = 0.0
    max_ramp: float = 10.0  # %/s

    @classmethod
    def from_profile(cls, fan: Mapping[str, Any]) -> FanCurve:
        """A profile's (or the state file's) ``fan`` table as a curve: ``fixed`` a flat one at its
        ``percent``, ``curve`` its points. ``ValueError`` where it is none: see ``curve_of``."""
        try:
            if fan["mode"] == "fixed":
                pts: tuple[tuple[float, float], ...] = ((0.0, float(fan["percent"])), (110.0, float(fan["percent"])))
            elif fan["mode"] == "curve":
                pts = tuple((float(t), float(d)) for t, d in fan["points"])
            else:
                raise ValueError(f"mode {fan['mode']!r} is not a curve")
            if not pts:
                raise ValueError("a curve without points")
            return cls(pts, float(fan.get("hysteresis", 3)), float(fan.get("minimum", 0)),
                       float(fan.get("max_ramp", 10)))
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a fan curve: {err!r}") from err

    def duty_at(self, temp: float) -> float:
        pts = self.points
        if temp <= pts[0][0]:
            return pts[0][1]
        for (t0, d0), (t1, d1) in zip(pts, pts[1:], strict=False):
            if temp <= t1:
                return d0 + (d1 - d0) * (temp - t0) / (t1 - t0)
        return pts[-1][1]

    def target_temperature(self) -> float:
        """The temperature at which the curve reaches its maximum duty."""
        top = self.points[-1][1]
        return next(t for t, d in self.points if d >= top)


def curve_of(fan: object) -> FanCurve | None:
    """The curve a fan setting asks gpud to drive, or None: ``auto``, a setting a plan skipped
    (``"unsupported"``), or one that cannot be read as a curve (a state file ``gpud verify`` reports as
    such). The one reading of a fan setting, for the fan loop, doctor's ``health.fans`` and the burn-in."""
    if not isinstance(fan, Mapping) or fan.get("mode") not in ("fixed", "curve"):
        return None
    try:
        return FanCurve.from_profile(fan)
    except ValueError:
        return None


@dataclass
class FanController:
    curve: FanCurve
    fan_min: float = 0.0
    fan_max: float = 100.0
    duty: float | None = field(default=None, init=False)  # last duty commanded
    _ref_temp: float | None = field(default=None, init=False)
    _last_time: float | None = field(default=None, init=False)

    def update(self, temp: float | None, now: float) -> int:
        """The duty to command now (an integer %), or FAILSAFE."""
        if temp is None:
            self.reset()
            return FAILSAFE
        if self._ref_temp is None or temp > self._ref_temp or temp <= self._ref_temp - self.curve.hysteresis:
            self._ref_temp = temp
        target = self.curve.duty_at(self._ref_temp)
        target = min(self.fan_max, max(target, self.curve.minimum, self.fan_min))
        if self.duty is None:  # first command: straight to the curve
            duty = target
        elif temp >= self.curve.points[-1][0]:  # at or past the last point: full cooling at once
            duty = max(target, self.duty)
        else:
            duty = self._ramp(target, now)
        self.duty = duty
        self._last_time = now
        return int(round(duty))

    def _ramp(self, target: float, now: float) -> float:
        assert self.duty is not None
        dt = max(0.0, now - (self._last_time if self._last_time is not None else now))
        step = self.curve.max_ramp * dt
        if target > self.duty:
            return min(target, self.duty + step)
        return max(target, self.duty - step)

    def reset(self) -> None:
        """Forget the state (after a failsafe: the fan is the driver's again)."""
        self.duty = None
        self._ref_temp = None
        self._last_time = None
