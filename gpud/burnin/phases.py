"""Verdicts of one GPU's loaded phases, from its telemetry: the targeted-power phase (its cause named where the
draw stays short), the load steps, the thermal soak and whether the fan curve held the temperature it promises.
``gpud.burnin.judge`` calls them per GPU; each names the figure, the threshold and its source
(``gpud.burnin.plan.THRESHOLDS``), and what to do."""

from __future__ import annotations

import statistics
from typing import Any

from gpud.burnin.plan import THRESHOLDS
from gpud.burnin.result import Verdict, not_judged
from gpud.burnin.telemetry import cv, settle
from gpud.profiles.fancurve import FanCurve

THERMAL_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown")  # the driver, not the fan, holds the GPU


# Why a GPU's draw stays below the target, in the order the cause is named (the first one active for a
# tenth of the phase or more), and what to do for each (nvml.h's clock-event reasons).
POWER_CAUSES = (
    ("hw_power_brake_slowdown", "HW power brake: the power supply or a cable asserts it",
     "check the 12V connectors and cables (one per connector, no daisy chain) and the PSU's capacity"),
    ("hw_thermal_slowdown", "HW thermal slowdown: the GPU is at its slowdown temperature",
     "check the cooling: fans turn, airflow, dust, the fan curve"),
    ("hw_slowdown", "HW slowdown (the hardware cut the clocks: power or temperature)",
     "check power delivery (cables, PSU) and cooling; nvidia-smi -q -d PERFORMANCE names which"),
    ("sw_thermal_slowdown", "SW thermal slowdown: the driver holds the GPU at its operating limit",
     "check the cooling: fans turn, airflow, the fan curve"),
)


def targeted_power(g: int, power: list[Any], limits: dict[str, float | None]) -> list[Verdict]:
    """Did the closed-loop load bring the draw to the target (the enforced limit, or ``--target-power``)?
    If not, why: a hardware or thermal clock-event reason named (the remedy follows it), the load at its
    largest asking less than the target (not judged: the load, not the GPU), or the enforced limit below
    the target (the SW power cap holds it there: fine, with headroom in the load)."""
    draws = [p.power_w for p in power if p.power_w is not None]
    limit = next((p.limit_w for p in reversed(power) if p.limit_w), None)
    target = limits.get("target_power_w") or limit
    th = THRESHOLDS["targeted_power"]
    if not draws or not target:
        return [not_judged("burnin.targeted_power", g, "no power readings under the load", "a GPU and driver that "
                           "report the power draw (nvidia-smi -q -d POWER)", th.source)] if power else []
    mean = statistics.fmean(draws)
    share = mean / target
    span = len(power)
    active = {r: sum(1 for p in power if r in p.reasons) / span for r in
              ("sw_power_cap", *(c[0] for c in POWER_CAUSES))}
    load = [p.load_share for p in power if p.load_share is not None]
    largest = not load or load[-1] >= 0.999
    text = f"{mean:.0f} W, {share * 100:.0f} % of its {target:.0f} W target"
    if limits.get("target_power_w"):
        text += f" (--target-power; enforced limit {limit:.0f} W)" if limit else " (--target-power)"
    else:
        text += " (its enforced limit)"
    if load:
        text += f"; the load at {load[-1] * 100:.0f} % of its largest"
    if share >= th.value:
        capped = active["sw_power_cap"] >= 0.1
        return [Verdict("burnin.targeted_power", "pass", text + ("; the SW power cap holds it there (the load "
                        "asks more)" if capped else ""), g, round(share, 3), th.value, th.source)]
    cause = next((c for c in POWER_CAUSES if active[c[0]] >= 0.1), None)
    if cause is not None:
        return [Verdict("burnin.targeted_power", "fail", f"{text}; held down by {cause[1]} "
                        f"({active[cause[0]] * 100:.0f} % of the time)", g, round(share, 3), th.value, th.source,
                        cause[2])]
    if limit and target > limit * 1.001 and active["sw_power_cap"] >= 0.1:
        return [Verdict("burnin.targeted_power", "warn", f"{text}; the enforced limit {limit:.0f} W is below the "
                        "target: the SW power cap holds it there, the load asks more", g, round(share, 3), th.value,
                        th.source, "raise the power limit (gpud apply) or lower --target-power")]
    if largest and active["sw_power_cap"] < 0.1:
        return [not_judged("burnin.targeted_power", g, f"{text}: the load at its largest asks less than the target "
                           "(no SW power cap reached), so the GPU's power delivery was not pushed to it",
                           "a heavier load than this GEMM (or --target-power at what it draws)", th.source)]
    return [Verdict("burnin.targeted_power", "fail", f"{text}; no clock-event reason says why", g, round(share, 3),
                    th.value, th.source, "check the power cables and the PSU, and its clocks (nvidia-smi -q -d "
                    "PERFORMANCE,POWER)")]


STEP_END_READINGS = 5  # the readings (seconds) a load step's end clock is the median of


def load_steps(g: int, points: list[Any]) -> list[Verdict]:
    """Idle→full→idle steps (as DCGM's pulse test): the SM clock reached at the end of each full step
    stays within 3 % of the best step's, and each idle step lets the GPU idle. A step's end is the median
    of its last ``STEP_END_READINGS`` readings: under a power cap GPU Boost dithers between clock bins
    from one reading to the next (docs/simulation.md, "Noise and spread"), so one instant of each step
    would compare dither, not steps (a healthy GPU failed so, 1665–1725 MHz, on one seed in four runs)."""
    steps: list[list[Any]] = []
    prev = None
    for p in points:
        if p.phase == "pulse_full":
            if prev != "pulse_full":
                steps.append([])
            steps[-1].append(p)
        prev = p.phase
    ends = []
    for st in steps:
        clocks = sorted(p.sm_mhz for p in st[-STEP_END_READINGS:] if p.sm_mhz)
        if clocks:
            ends.append(clocks[len(clocks) // 2])
    if len(ends) < 2:
        return []
    th = THRESHOLDS["spread"]
    worst = min(ends) / max(ends)
    idled = all("gpu_idle" in p.reasons for p in points if p.phase == "pulse_idle" and p.utilization == 0)
    ok = 1 - worst <= th.value and idled
    return [Verdict("burnin.load_steps", "pass" if ok else "fail",
                    f"{len(ends)} steps: SM clock at the end of each (median of its last {STEP_END_READINGS} s) "
                    f"{min(ends)}–{max(ends)} MHz "
                    f"({(1 - worst) * 100:.1f} % apart)" + ("" if idled else "; it did not idle between steps"),
                    g, round(1 - worst, 4), th.value, "each step within 3 % of the best one (DCGM's pulse test "
                    "checks that the GPU follows load steps)",
                    "" if ok else "the GPU does not come back to the same clocks after a load step: check power "
                    "delivery (cables, PSU) and nvidia-smi -q -d PERFORMANCE")]


def thermal(g: int, soak: list[Any], limits: dict[str, float | None]) -> list[Verdict]:
    out: list[Verdict] = []
    band, settle_s = THRESHOLDS["settle_band_c"], THRESHOLDS["settle_s"]
    final, took = settle(soak, band.value)
    target = limits.get("max_operating_c") or limits.get("slowdown_c")
    held = final is not None and took is not None and took <= settle_s.value and (target is None or final < target)
    if final is None:
        text = "no temperature readings"
    elif took is None:
        text = f"never settled within ±{band.value:g} °C (last {final:.1f} °C)"
    else:
        text = f"settled at {final:.1f} °C ±{band.value:g} °C after {took:.0f} s"
        if target is not None:
            text += f" ({'below' if final < target else 'at or above'} its {target:g} °C max operating temperature)"
    out.append(Verdict("burnin.thermal.settle", "pass" if held else "fail", text, g, took, settle_s.value,
                       settle_s.source + "; below its max operating temperature (NVML_TEMPERATURE_THRESHOLD_GPU_MAX)",
                       "" if held else "the cooling does not hold the temperature: check the fans turn "
                       "(a stalled fan still reads as asked), the airflow and the fan curve"))
    if took is not None:
        after = [p.sm_mhz for p in soak if p.sm_mhz and p.t - soak[0].t >= took]
        v = cv([float(x) for x in after])
        if v is not None:
            th = THRESHOLDS["clock_cv"]
            out.append(Verdict("burnin.clocks.stability", "fail" if v > th.value else "pass",
                               f"SM clock varies {v * 100:.2f} % (coefficient of variation) after settling", g,
                               round(v, 5), th.value, th.source,
                               "clocks swing under a steady load: check power and thermal reasons "
                               "(nvidia-smi -q -d PERFORMANCE)" if v > th.value else ""))
    return out


def curve_temperature(curve: FanCurve, duty: float) -> float:
    """The lowest temperature at which ``curve`` asks ``duty`` (its points interpolated as the
    controller does); the first point's temperature below the curve's first duty."""
    pts = curve.points
    if duty <= max(pts[0][1], curve.minimum):
        return pts[0][0]
    for (t0, d0), (t1, d1) in zip(pts, pts[1:], strict=False):
        if d1 >= duty > d0:
            return t0 + (t1 - t0) * (duty - d0) / (d1 - d0)
    return pts[-1][0]


def hold(g: int, soak: list[Any], limits: dict[str, float | None],
          curve: FanCurve | None) -> tuple[list[Verdict], float | None]:
    """Does the cooling hold the temperature it promises under the soak's load? With a fan curve: the
    curve's equilibrium, the temperature at which the curve asks the duty that held the load (measured:
    the fan's mean duty over the settled tail of the soak), within ±2 °C; a curve at its maximum holds
    only if the temperature settled there without thermal slowdown. Without one: the driver's target
    temperature (NVML's acoustic threshold), at or below it + 2 °C. Returns the verdicts and the curve's
    promise (drawn on the report's chart)."""
    band, settle_s = THRESHOLDS["settle_band_c"], THRESHOLDS["settle_s"]
    final, took = settle(soak, band.value)
    if final is None:
        return [], None
    tail = soak[-max(1, len(soak) // 10):]
    duties = [p.fan_percent for p in tail if p.fan_percent is not None]
    duty = statistics.fmean(duties) if duties else None
    throttled = sorted({r for p in tail for r in p.reasons if r in THERMAL_REASONS})
    settled = took is not None and took <= settle_s.value
    temp = f"{final:.1f} °C" + ("" if settled else f" and still moving (not within ±{band.value:g} °C for "
                                                       f"{settle_s.value / 60:.0f} minutes)")
    slow = f"; {', '.join(throttled)} while settled: the driver, not the fan, held it" if throttled else ""
    if curve is not None:
        th = THRESHOLDS["curve_equilibrium_c"]
        top = max(d for _, d in curve.points)
        if duty is None:
            return [Verdict("burnin.thermal.curve", "skip", "the fan's duty was not readable", g,
                            source=th.source)], None
        spent = duty >= top - 1
        promise = curve.target_temperature() if spent else curve_temperature(curve, duty)
        if spent:
            ok = settled and not throttled and final >= promise - band.value
            text = (f"settled at {temp} with the fan at {duty:.0f} %, the curve's maximum from "
                    f"{promise:g} °C on{slow}")
            if ok:
                text += ": its equilibrium under this load is where its maximum holds the GPU"
            elif top < 100:
                text += f"; the curve is too weak for this load (its maximum is {top:g} %)"
            else:
                text += ("; the fan reports the 100 % the curve asks while the temperature climbed past the curve: "
                         "a fan that does not turn (it reads as asked) or blocked airflow")
            promise = final if ok else promise
        else:
            off = final - promise
            # The curve's hysteresis holds the duty a rising reading set until the temperature falls that far
            # below it: a sensor that flickers by a degree (as NVML's does) leaves the fan a little above the
            # curve and the GPU up to the hysteresis below its promise, with the fan healthy.
            low = th.value + curve.hysteresis
            ok = settled and not throttled and -low <= off <= th.value
            text = (f"settled at {temp} with the fan at {duty:.0f} %; the curve asks {duty:.0f} % at {promise:.1f} °C, "
                    f"its promise under this load ({off:+.1f} °C){slow}")
            if not ok and not -low <= off <= th.value:
                text += "; the fan does not follow the curve (is gpud's daemon driving it? gpud status)"
        remedy = "" if ok else ("a steeper curve (its maximum earlier) or a lighter load (power limit)"
                                if spent and top < 100 else
                                "check the fans turn, the airflow, and that the daemon drives the curve")
        return [Verdict("burnin.thermal.curve", "pass" if ok else "fail", text, g, round(final, 1),
                        round(promise, 1), th.source, remedy)], promise
    target = limits.get("target_c")
    if target is None:
        return [Verdict("burnin.thermal.target", "skip", "no fan curve applied and the driver reports no target "
                        "temperature (Not Supported): only the settling is judged", g,
                        source=THRESHOLDS["target_c"].source)], None
    th = THRESHOLDS["target_c"]
    ok = settled and final <= target + th.value
    fan = f"the fan at {duty:.0f} %" if duty is not None else "the fan's duty unknown"
    text = f"settled at {temp} with {fan}; the driver's target {target:g} °C ({final - target:+.1f} °C){slow}"
    if not ok and duty is not None and duty >= 99:
        text += "; above the target with the fan at 100 % (as reported): a fan that does not turn or blocked airflow"
    return [Verdict("burnin.thermal.target", "pass" if ok else "fail", text, g, round(final, 1),
                    round(target + th.value, 1), th.source,
                    "" if ok else "the automatic fan policy does not hold the target: check the fans turn and the "
                    "airflow")], None
