"""The fan policy a profile asks for (``FanPolicy = Auto | Fixed | Curve``, read by ``fan_policy`` from a
profile and by ``read_policy`` from the state file: one parser for both), and the fan-curve controller:
temperature samples and time in, a duty (or a failsafe) out.

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

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from gpud.errors import InvalidInput
from gpud.schema import Spec, take

FAILSAFE = -1
FanMode = Literal["auto", "fixed", "curve"]
FAN_MODES: tuple[FanMode, ...] = ("auto", "fixed", "curve")
NUM = (int, float)
FAN_SPEC: Spec = {
    "mode": (FAN_MODES, None),
    "percent": (int, None),
    "points": (list, None),
    "hysteresis": (NUM, 3),
    "minimum": (int, 0),
    "max_ramp": (NUM, 10),
}


@dataclass(frozen=True)
class FanCurve:
    points: tuple[tuple[float, float], ...]
    hysteresis: float = 3.0
    minimum: float = 0.0
    max_ramp: float = 10.0  # %/s

    @classmethod
    def from_profile(cls, fan: Any) -> FanCurve:
        """A profile's (or the state file's) ``fan`` table as a curve: ``fixed`` a flat one at its
        ``percent``, ``curve`` its points. ``ValueError`` where it is none: see ``curve_of``."""
        curve = read_policy(fan).curve()
        if curve is None:
            raise ValueError(f"mode {fan.get('mode') if isinstance(fan, dict) else fan!r} is not a curve")
        return curve

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


# -- the fan policy a profile asks for: automatic, a fixed duty, a curve ------------------------------

@dataclass(frozen=True, kw_only=True)
class _Policy:
    """What every policy carries (a profile may give them with any mode): the controller's hysteresis (°C),
    its floor (%) and its ramp limit (%/s)."""

    mode: ClassVar[FanMode]
    hysteresis: float = 3
    minimum: int = 0
    max_ramp: float = 10

    def duties(self) -> list[float]:
        """The duties it can command (what a GPU's minimum fan speed bounds)."""
        return []

    def curve(self) -> FanCurve | None:
        """The curve gpud's fan loop drives (None: the driver's automatic policy)."""
        return None

    def _through(self, points: Any) -> FanCurve:
        """The controller's curve through ``points`` (°C, %), with this policy's hysteresis, floor and ramp."""
        return FanCurve(tuple((float(t), float(d)) for t, d in points), float(self.hysteresis),
                        float(self.minimum), float(self.max_ramp))

    def to_json(self) -> dict[str, Any]:
        """The state file's and plans' form: every key, ``null`` where the mode has none."""
        return {"mode": self.mode, "percent": None, "points": None, "hysteresis": self.hysteresis,
                "minimum": self.minimum, "max_ramp": self.max_ramp}


@dataclass(frozen=True, kw_only=True)
class Auto(_Policy):
    """The driver's automatic policy: what apply writes, and what restore puts back."""

    mode: ClassVar[FanMode] = "auto"


@dataclass(frozen=True, kw_only=True)
class Fixed(_Policy):
    """One duty, whatever the temperature, driven by the daemon's fan loop."""

    mode: ClassVar[FanMode] = "fixed"
    percent: int

    def duties(self) -> list[float]:
        out: list[float] = [self.percent]
        return out + ([self.minimum] if self.minimum else [])

    def curve(self) -> FanCurve:
        return self._through(((0, self.percent), (110, self.percent)))

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "percent": self.percent}


@dataclass(frozen=True, kw_only=True)
class Curve(_Policy):
    """Temperature (°C) to duty (%) points, interpolated, driven by the daemon's fan loop."""

    mode: ClassVar[FanMode] = "curve"
    points: tuple[tuple[float, float], ...]

    def duties(self) -> list[float]:
        return [d for _, d in self.points] + ([self.minimum] if self.minimum else [])

    def curve(self) -> FanCurve:
        return self._through(self.points)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "points": [list(p) for p in self.points]}


FanPolicy = Auto | Fixed | Curve


def fan_policy(table: Any, file: str, where: str) -> FanPolicy:
    """The one reading of a ``fan`` table, a profile's or the state file's: its mode, the keys that belong
    to it, a curve's shape, the ranges; ``InvalidInput`` naming ``file`` and the dotted key ``where``."""
    fan = take(table, FAN_SPEC, file, where)
    mode = fan["mode"]
    if mode is None:
        raise InvalidInput(file, f"{where}.mode", f"required: one of {', '.join(FAN_MODES)}")
    for key, belongs in (("points", "curve"), ("percent", "fixed")):
        if fan[key] is not None and mode != belongs:
            raise InvalidInput(file, f"{where}.{key}", f"belongs to mode = \"{belongs}\", not \"{mode}\" "
                                                       "(remove it, or change the mode)")
    common = {"hysteresis": fan["hysteresis"], "minimum": fan["minimum"], "max_ramp": fan["max_ramp"]}
    policy: FanPolicy
    if mode == "fixed":
        if fan["percent"] is None:
            raise InvalidInput(file, f"{where}.percent", "required for mode = \"fixed\"")
        if not 0 <= fan["percent"] <= 100:
            raise InvalidInput(file, f"{where}.percent", f"duty must be 0..100 %, not {fan['percent']}")
        policy = Fixed(percent=fan["percent"], **common)
    elif mode == "curve":
        policy = Curve(points=_points(fan["points"], file, f"{where}.points"), **common)
    else:
        policy = Auto(**common)
    if not 0 <= fan["hysteresis"] <= 20:
        raise InvalidInput(file, f"{where}.hysteresis", "must be 0..20 °C")
    if not 0 <= fan["minimum"] <= 100:
        raise InvalidInput(file, f"{where}.minimum", "must be 0..100 %")
    if not 0 < fan["max_ramp"] <= 100:
        raise InvalidInput(file, f"{where}.max_ramp", "must be in (0, 100] %/s")
    return policy


def _points(pts: Any, file: str, where: str) -> tuple[tuple[float, float], ...]:
    if not pts or len(pts) < 2:
        raise InvalidInput(file, where, "a curve needs at least two [°C, %] points")
    prev = None
    for k, p in enumerate(pts):
        key = f"{where}[{k}]"
        if not isinstance(p, list | tuple) or len(p) != 2 or not all(
                isinstance(x, NUM) and not isinstance(x, bool) for x in p):
            raise InvalidInput(file, key, f"must be [temperature °C, duty %], not {p!r}")
        t, duty = p
        if not 0 <= t <= 110:
            raise InvalidInput(file, key, f"temperature {t} °C outside 0..110")
        if not 0 <= duty <= 100:
            raise InvalidInput(file, key, f"duty {duty} % outside 0..100")
        if prev is not None and (t <= prev[0] or duty < prev[1]):
            raise InvalidInput(file, key, "not monotonic: temperatures must rise and duties must not fall "
                                          f"({list(prev)} then {list(p)})")
        prev = p
    return tuple((p[0], p[1]) for p in pts)


def read_policy(raw: Any) -> FanPolicy:
    """The state file's fan setting (or a plan's, a trial's) as a policy: a table as ``fan_policy`` reads it,
    or "auto" (what older files hold); ``ValueError`` with the reason otherwise."""
    if raw == "auto":
        return Auto()
    if isinstance(raw, _Policy):
        return raw  # type: ignore[return-value]  # one of the three: the only subclasses
    # The daemon's enforcement reads every GPU's policy from its state at each whole snapshot: a policy read
    # once is kept (it is frozen), keyed by the table's text (3 and 3.0 apart, as their JSON forms are).
    key = repr(raw) if isinstance(raw, dict) else None
    known = _READ.get(key) if key is not None else None  # one lookup: another thread may clear the table
    if known is not None:
        return known
    table = {k: v for k, v in raw.items() if v is not None} if isinstance(raw, dict) else raw  # null: none
    try:
        policy = fan_policy(table, "", "fan")
    except InvalidInput as err:
        raise ValueError(f"not a fan policy ({err.key}: {err.reason})") from err
    if key is not None:
        if len(_READ) >= 256:  # a bound: a rule switching among many profiles reads a few policies each
            _READ.clear()
        _READ[key] = policy
    return policy


_READ: dict[str, FanPolicy] = {}


def policy_of(fan: object) -> FanPolicy | None:
    """``read_policy``, or None where the setting is no policy (a plan skipped it: "unsupported"; a state file
    ``gpud verify`` reports)."""
    try:
        return read_policy(fan)
    except ValueError:
        return None


def curve_of(fan: object) -> FanCurve | None:
    """The curve a fan setting asks gpud to drive, or None: ``auto``, a setting a plan skipped
    (``"unsupported"``), or one that cannot be read as a policy (a state file ``gpud verify`` reports as
    such). The one reading of a fan setting, for the fan loop, doctor's ``health.fans`` and the burn-in."""
    policy = policy_of(fan)
    return policy.curve() if policy is not None else None


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
