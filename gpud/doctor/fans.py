"""``health.fans``: whether each GPU's fans cool it, judged by what NVML can show.

NVML reports the speed a fan is asked for, not the real one, so a stalled fan is found by its effect:
the fan asked hard and the GPU at its limit or in thermal slowdown; hotter than an identical sibling
under the same load; against gpud's own fan curve; and, in the daemon, its own response over time
(Newton's cooling fitted to the newest stretch at a steady draw: ``not_cooling_over_time`` and the
pure functions below it, which take the history's points and nothing else). The check is registered
in ``gpud.doctor.checks_gpu``, where doctor's order puts it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from gpud.doctor.registry import Context, Reporter
from gpud.model import CheckResult, GpuSample, ThermalPoint
from gpud.profiles.fancurve import Curve, FanCurve, policy_of

# NVML reports the speed a fan is *asked* for, not a measurement ("if the fan is physically blocked
# and unable to spin, the output will not match the actual fan speed", nvml.h): a stalled fan reads
# as healthy. What real NVML does show is its effect: the fan asked hard and the GPU still at its
# limit, or thermal clock events. A fan asked for this much is "asked hard".
FAN_HARD_PERCENT = 80
THERMAL_EVENTS = ("sw_thermal_slowdown", "hw_thermal_slowdown")


def health_fans(ctx: Context, r: Reporter) -> Iterator[CheckResult]:
    hot = ctx.config.doctor.fan_check_min_celsius
    lag = ctx.config.doctor.fan_lag_percent
    for s in ctx.samples:
        if not s.fans:
            yield r.skip("no fan reported (passive card cooled by the chassis)", gpu=s.index)
            continue
        g = ctx.infos[s.index]
        t = s.temperature_celsius
        limit = g.temperature_max_operating_celsius or (
            g.temperature_slowdown_celsius - 5 if g.temperature_slowdown_celsius is not None else None)
        thermal = [e for e in (s.clock_events or ()) if e in THERMAL_EVENTS]
        bad, manual = [], []
        for f in s.fans:
            if f.speed_percent is None:
                continue
            if t is not None and t >= hot and (f.speed_percent == 0 or
                                               (f.target_percent is not None and
                                                f.target_percent - f.speed_percent >= lag)):
                target = f" (target {f.target_percent} %)" if f.target_percent is not None else ""
                bad.append(f"fan {f.fan} at {f.speed_percent} %{target} at {t} °C")
            elif f.speed_percent >= FAN_HARD_PERCENT and t is not None and (
                    (limit is not None and t >= limit) or thermal):
                why = (f"{', '.join(e.replace('_', ' ') for e in thermal)} active" if thermal
                       else f"at or above its {limit} °C operating limit")
                bad.append(f"fan {f.fan} asked for {f.speed_percent} % and the GPU is still at {t} °C ({why}): "
                           "the fan is not cooling")
            if f.policy == "manual" and not ctx.daemon_running:
                manual.append(f"fan {f.fan} at {f.speed_percent} %")
        if not bad:
            bad += _hotter_than_siblings(ctx, s, limit)
        if not bad and limit is not None:
            bad += not_cooling_over_time(ctx.thermal.get(s.uuid, ()), limit, throttled=bool(thermal))
        curve_warning = None
        if not bad:
            failed, curve_warning = _against_the_curve(ctx, s)
            bad += failed
        if bad:
            yield r.fail("; ".join(bad), gpu=s.index,
                         remedy="NVML reports the speed asked for, not the real one: look at the fan (stalled, "
                                "blocked, cable) and the airflow; until then keep the GPU idle; watch "
                                f"`nvidia-smi -i {s.index} --query-gpu=fan.speed,temperature.gpu,"
                                "clocks_event_reasons.active --format=csv -l 1`")
        elif manual:
            yield r.warn(f"{', '.join(manual)} in manual mode while no gpud daemon runs", gpu=s.index,
                         remedy="`gpud restore --fans-only` hands the fans back to the driver's automatic policy")
        elif curve_warning is not None:
            yield r.warn(curve_warning[0], gpu=s.index, remedy=curve_warning[1])
        else:
            speeds = "/".join(f"{f.speed_percent} %" for f in s.fans if f.speed_percent is not None)
            yield r.ok(f"fan {speeds or 'n/a'} at {t} °C", gpu=s.index)


def _curve_of(ctx: Context, gpu: int) -> FanCurve | None:
    """gpud's own fan curve on this GPU (the applied profile's ``mode = "curve"``); None for a fixed duty
    (it promises no temperature), no profile, or a setting that is no fan policy (verify reports it)."""
    policy = policy_of(ctx.profile_settings.get(gpu, {}).get("fan"))
    return policy.curve() if isinstance(policy, Curve) else None


def _against_the_curve(ctx: Context, s: GpuSample) -> tuple[list[str], tuple[str, str] | None]:
    """Judged against gpud's own fan curve, in one reading (no history needed). The curve promises to
    hold the GPU at or below the temperature where it reaches its full duty (its "target"), give or take
    its hysteresis. Above that:

    - the fans read less than the curve's full duty while the daemon drives them: they do not follow the
      curve (another tool sets them, or the fan loop stopped) — a warning;
    - the fans read the full duty: either the fans cannot be cooling (an identical sibling under the same
      load, on the same curve, holds its promise — a failure), or the curve's full duty is too little for
      this load (no such sibling — a warning).

    (failures, warning and its remedy)."""
    curve = _curve_of(ctx, s.index)
    t, duty = s.temperature_celsius, _duty(s)
    if curve is None or t is None or duty is None:
        return [], None
    promise = curve.target_temperature()
    full = max(d for _, d in curve.points)
    if t <= promise + curve.hysteresis:
        return [], None
    if duty < full - 1:  # whole percents: the curve asks its full duty at once past its last point
        if not ctx.daemon_running:
            return [], None  # no fan loop: the manual-mode warning says it
        return [], (f"fans read {duty:.0f} % at {t} °C where gpud's curve asks {full:.0f} % (full duty from "
                    f"{promise:.0f} °C): the fans do not follow the curve",
                    "`gpud verify` shows who changed them; the daemon's journal (`gpud events`) says whether "
                    "its fan loop handed the fans back (failsafe)")
    u, name = s.utilization_gpu_percent, ctx.infos[s.index].name
    for o in ctx.samples:
        if o.index == s.index or o.lost or ctx.infos.get(o.index) is None or ctx.infos[o.index].name != name:
            continue
        oc, ot, ou = _curve_of(ctx, o.index), o.temperature_celsius, o.utilization_gpu_percent
        if (oc is None or oc.points != curve.points or ot is None or u is None or ou is None
                or not (ctx.loaded(s) and ctx.loaded(o)) or abs(ou - u) > SAME_LOAD_POINTS):
            continue
        if ot <= promise + curve.hysteresis:
            return [f"fans read {duty:.0f} %, the full duty of gpud's curve, yet the GPU is at {t} °C, above the "
                    f"{promise:.0f} °C the curve holds with it; GPU {o.index} on the same curve under the same load "
                    f"holds {ot} °C: the fans cannot be cooling it"], None
    return [], (f"at {t} °C with the fans at {duty:.0f} %, the full duty of gpud's curve, the GPU is above the "
                f"{promise:.0f} °C the curve promises: the curve's full duty does not hold this load",
                "improve the airflow, or lower the power limit for this workload (`gpud tune --goal quiet`); "
                "no identical GPU here under the same load holds it, so the fans are not shown to be at fault")


def _duty(s: GpuSample) -> float | None:
    duties = [f.speed_percent for f in s.fans if f.speed_percent is not None]
    return sum(duties) / len(duties) if duties else None


SAME_LOAD_POINTS = 10  # utilization within this many points: the same work


def _hotter_than_siblings(ctx: Context, s: GpuSample, limit: int | None) -> list[str]:
    """Judged by effect against the machine itself: an identical GPU doing the same work whose fans
    read no higher runs much cooler. Then this GPU's fans, whatever NVML says they do, cannot be
    cooling it (a stalled fan reads as the duty asked for: nvml.h, nvmlDeviceGetFanSpeed_v2).

    "Much" is this GPU's own headroom: the gap to the sibling is at least what it has left below its
    operating limit (NVML's max operating temperature, else 5 °C below slowdown), so the difference in
    cooling alone is what brings it near the limit. Nearer the limit a smaller gap counts."""
    t, duty, u = s.temperature_celsius, _duty(s), s.utilization_gpu_percent
    if t is None or duty is None or u is None or limit is None or not ctx.loaded(s):
        return []
    name = ctx.infos[s.index].name
    for o in ctx.samples:
        if o.index == s.index or o.lost or ctx.infos.get(o.index) is None or ctx.infos[o.index].name != name:
            continue
        ot, oduty, ou = o.temperature_celsius, _duty(o), o.utilization_gpu_percent
        if ot is None or oduty is None or ou is None or not ctx.loaded(o) or abs(ou - u) > SAME_LOAD_POINTS:
            continue
        if t > ot and t - ot >= limit - t and duty >= oduty:
            return [f"fans read {duty:.0f} % but the GPU runs {t - ot:.0f} °C hotter ({t} °C) than GPU {o.index} "
                    f"({ot} °C with fans at {oduty:.0f} %) under the same load, more than the {max(limit - t, 0)} °C "
                    f"it has left below its {limit} °C limit: the fans cannot be cooling it"]
    return []


# The draw counts as steady within NVML's stated accuracy of the reading: "accurate to within +/- 5% of
# current power draw" (nvml.h, nvmlDeviceGetPowerUsage). Temperatures are whole degrees (nvml.h,
# nvmlDeviceGetTemperature), so a rise is one only from 2 °C.
POWER_ACCURACY = 0.05
TEMPERATURE_STEP_C = 1.0


def not_cooling_over_time(points: Sequence[ThermalPoint], limit: int, throttled: bool = False) -> list[str]:
    """Judged by the temperature's response over time (the daemon's history of this GPU, empty in a
    one-shot `gpud doctor`). Over the newest stretch at a steady draw, its later half (the step's first
    transient left out) with the fans asked for no less than at its start:

    - the temperature still rises at the same rate or faster (the later quarter no slower than the
      earlier one, both by more than a reading's step): nothing is taking the added heat away; or
    - fitted to Newton's cooling (the rate falls linearly as the GPU warms), the GPU's own response
      says it settles at or above its operating limit, and the stretch is at least one of its own
      time constants long, or as long as that response takes from now to the limit (so the fit rests on
      the response, not on the first seconds, and is not extrapolated further ahead than it was
      watched; a fan that cannot be cooling then fails before the GPU reaches its slowdown).

    A GPU the driver slows now to hold its temperature (``throttled``: thermal slowdown active) draws
    less than its load asks, so its newest stretch is the slowdown's, not the load's: then the stretch
    before the slowdown, the newest long enough at a higher draw, is judged the same way (a stalled fan
    under load is caught by what the GPU did before the driver had to step in).
    """
    runs = stretches(points)
    if not runs:
        return []
    bad = judge_stretch(runs[-1], limit)
    if bad or not throttled:
        return bad
    now = runs[-1][-1].power_watts
    for run in reversed(runs[:-1]):
        if len(run) >= 10 and run[-1].power_watts > now * (1 + POWER_ACCURACY):
            before = judge_stretch(run, limit)
            return [f"before the driver slowed it to hold its temperature (thermal slowdown now active, "
                    f"{now:.0f} W): {before[0]}"] if before else []
    return []


def stretches(points: Sequence[ThermalPoint]) -> list[list[ThermalPoint]]:
    """The history cut into runs at a steady draw, oldest first: walking back from the newest point, a
    run holds the points whose draw is within NVML's stated accuracy of its own newest one."""
    runs: list[list[ThermalPoint]] = []
    for p in reversed(points):
        ref = runs[-1][0] if runs else None  # the run's newest point (each run is built newest first)
        if ref is not None and abs(p.power_watts - ref.power_watts) <= POWER_ACCURACY * max(ref.power_watts, 1.0):
            runs[-1].append(p)
        else:
            runs.append([p])
    return [list(reversed(run)) for run in reversed(runs)]


def judge_stretch(stretch: Sequence[ThermalPoint], limit: int) -> list[str]:
    """The verdict on one run at a steady draw (see ``not_cooling_over_time``): [] unless it shows fans
    that cannot be cooling."""
    if len(stretch) < 2:
        return []
    last = stretch[-1]
    recent = stretch[len(stretch) // 2:]
    if len(recent) < 5 or recent[-1].fan_percent < recent[0].fan_percent:
        return []
    first = recent[0]
    if last.temperature_celsius - first.temperature_celsius <= TEMPERATURE_STEP_C:
        return []  # not rising
    span = last.timestamp - first.timestamp
    head = (f"fans asked for {first.fan_percent:.0f} → {last.fan_percent:.0f} % at a steady {last.power_watts:.0f} W "
            f"and the GPU went {first.temperature_celsius:.0f} → {last.temperature_celsius:.0f} °C in {span:.0f} s")
    fit = newton_fit(recent)
    if fit is None:
        return []
    settle, tau = fit
    if settle < limit:
        return []
    # The fit is trusted as far ahead as the GPU was watched: once the stretch spans one of its own time
    # constants, or the time the response takes from here to the limit (so a fan that cannot be cooling
    # fails before the GPU gets there, not a time constant later).
    now = last.temperature_celsius
    if now >= limit:
        to_limit = 0.0
    elif settle > limit:
        to_limit = tau * math.log((settle - now) / (settle - limit))  # Newton's response from now to the limit
    else:  # it settles at the limit itself: only a time constant observed will do
        to_limit = tau
    if span >= min(tau, to_limit):
        return [f"{head}; at that rate it settles near {settle:.0f} °C (time constant {tau:.0f} s), at or above "
                f"its {limit} °C limit: the fans cannot be cooling it (stalled, blocked, or asked for too little)"]
    return []


def newton_fit(points: Sequence[ThermalPoint]) -> tuple[float, float] | None:
    """Least squares of the heating rate on the temperature, the rate taken between points a quarter of
    the stretch apart: Newton's cooling at a steady draw gives dT/dt = (T_settle - T) / tau (over a lag
    as well: rate and mid-temperature are both linear in T_settle - T, so the settling point stays where
    it is). Consecutive whole-degree readings, a second apart, would give rates of 0 or ±1 °C/s that a
    flickering sensor decides, not the GPU. (T_settle, tau), or None when the rate does not fall as the
    GPU warms (no settling to project)."""
    lag = max(1, len(points) // 4)
    xs, ys = [], []
    for p, q in zip(points, points[lag:], strict=False):
        dt = q.timestamp - p.timestamp
        if dt > 0:
            xs.append((p.temperature_celsius + q.temperature_celsius) / 2)
            ys.append((q.temperature_celsius - p.temperature_celsius) / dt)
    if len(xs) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    if slope >= 0:
        return None
    return mx - my / slope, -1 / slope
