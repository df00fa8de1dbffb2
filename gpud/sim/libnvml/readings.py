"""Entry points that read a GPU: temperatures and thresholds, fans, power, clocks, modes."""

from __future__ import annotations

import ctypes
from typing import Any

from gpud.sim.entries import entry
from gpud.sim.libnvml.library import MARGIN_FROM_DRIVER, SimLibrary, driver_major
from gpud.sim.libnvml.returns import (
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    THRESHOLD_ACOUSTIC_CURR,
    THRESHOLD_GPU_MAX,
    THRESHOLD_MEM_MAX,
    THRESHOLD_SHUTDOWN,
    THRESHOLD_SLOWDOWN,
    _target,
    fail,
)
from gpud.sim.physics import CLOCK_GRAPHICS, CLOCK_MEM, CLOCK_SM

# -- thermal and fans ---------------------------------------------------------------------------


@entry("nvmlDeviceGetTemperature")
def _temperature(lib: SimLibrary, i: int, sensor: int) -> int:
    if sensor != 0:  # NVML_TEMPERATURE_GPU is the only sensor
        fail(INVALID_ARGUMENT)
    return lib.sim.temperature_reading(i)  # whole degrees, with the sensor's scatter under noise


@entry("nvmlDeviceGetTemperatureThreshold")
def _threshold(lib: SimLibrary, i: int, threshold: int) -> int:
    g = lib.gpu(i)
    if (g.tlimit_thresholds and threshold in (THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN, THRESHOLD_GPU_MAX)
            and driver_major(lib) >= MARGIN_FROM_DRIVER):
        # Ada and later: nvidia-smi prints these only relative to T.Limit ("GPU Slowdown T.Limit Temp: -2 C").
        # Whether the call still answers once nvmlDeviceGetMarginTemperature exists (R570) is not documented:
        # Not Supported, the stricter reading. Before R570 there is no margin call, and nvml.h documents
        # this one: it answers there.
        fail(NOT_SUPPORTED)
    key = {THRESHOLD_SHUTDOWN: "shutdown_celsius", THRESHOLD_SLOWDOWN: "slowdown_celsius",
           THRESHOLD_GPU_MAX: "max_operating_celsius", THRESHOLD_MEM_MAX: "memory_max_celsius",
           # the model's target where its dumps give one ("GPU Target Temperature: 84 C"); N/A there: Not Supported
           THRESHOLD_ACOUSTIC_CURR: "target_celsius"}.get(threshold)
    if key is None or getattr(g, key) is None:
        fail(NOT_SUPPORTED)
    return int(getattr(g, str(key)))


MARGIN_V1 = 8 | 1 << 24  # nvmlMarginTemperature_v1 = NVML_STRUCT_VERSION(MarginTemperature, 1): 8 bytes
ARGUMENT_VERSION_MISMATCH = 25


@entry("nvmlDeviceGetMarginTemperature", outs="raw")
def _margin(lib: SimLibrary, i: int, out: Any) -> None:
    """Degrees left before T.Limit (the max operating temperature): "GPU T.Limit Temp: 61 C". The struct's
    ``version`` must be nvmlMarginTemperature_v1 (nvml.h: ARGUMENT_VERSION_MISMATCH otherwise)."""
    target = _target(out)
    if int(getattr(target, "version", 0)) != MARGIN_V1 or ctypes.sizeof(target) < 8:
        fail(ARGUMENT_VERSION_MISMATCH)
    g = lib.gpu(i)
    if not g.tlimit_thresholds:
        fail(NOT_SUPPORTED)
    limit = g.max_operating_celsius  # a model with T.Limit thresholds has a max operating temperature
    target.marginTemperature = int(limit) - lib.sim.temperature_reading(i)  # type: ignore[arg-type]


@entry("nvmlDeviceGetNumFans")
def _num_fans(lib: SimLibrary, i: int) -> int:
    if not lib.gpu(i).fans:
        fail(NOT_SUPPORTED)  # passive cards (H200 SXM): nvidia-smi prints "Fan Speed: N/A"
    return int(lib.gpu(i).fans)


def _fan(lib: SimLibrary, i: int, fan: int) -> dict[str, Any]:
    fans = lib.settings(i)["fans"]
    if not fans:
        fail(NOT_SUPPORTED)
    if not 0 <= fan < len(fans):
        fail(INVALID_ARGUMENT)
    return fans[fan]  # type: ignore[no-any-return,unused-ignore]


@entry("nvmlDeviceGetFanSpeed")
def _fan_speed_v1(lib: SimLibrary, i: int) -> int:
    return int(_fan_speed(lib, i, 0))


@entry("nvmlDeviceGetFanSpeed_v2")
def _fan_speed(lib: SimLibrary, i: int, fan: int) -> int:
    """The *intended* duty (NVML: "if the fan is physically blocked … the output will not match
    the actual fan speed"): a stalled fan still reads what it was asked to do."""
    _fan(lib, i, fan)
    return lib.sim.intended_duty(i, fan)


@entry("nvmlDeviceGetTargetFanSpeed")
def _target_fan(lib: SimLibrary, i: int, fan: int) -> int:
    _fan(lib, i, fan)
    return lib.sim.intended_duty(i, fan)


@entry("nvmlDeviceGetMinMaxFanSpeed", outs=2)
def _fan_range(lib: SimLibrary, i: int) -> tuple[int, int]:
    g = lib.gpu(i)
    if not g.fans:
        fail(NOT_SUPPORTED)
    return int(g.fan_min_percent), int(g.fan_max_percent)  # type: ignore[arg-type]


@entry("nvmlDeviceGetFanControlPolicy_v2")
def _fan_policy(lib: SimLibrary, i: int, fan: int) -> int:
    return int(_fan(lib, i, fan)["policy"])


# -- power ------------------------------------------------------------------------------------


@entry("nvmlDeviceGetPowerUsage")
def _power(lib: SimLibrary, i: int) -> int:
    """The sensor's reading: instantaneous, or averaged over 1 s on Ampere (but GA100) and newer (nvml.h),
    with its ripple under noise (``Physics.power_reading_mw``)."""
    return lib.sim.power_reading_mw(i)


@entry("nvmlDeviceGetPowerManagementLimit")
def _power_limit(lib: SimLibrary, i: int) -> int:
    """The limit as set ("Requested Power Limit")."""
    return int(lib.settings(i)["power_limit_mw"])


@entry("nvmlDeviceGetEnforcedPowerLimit")
def _power_enforced(lib: SimLibrary, i: int) -> int:
    """The limit held ("Current Power Limit"): the one set, or a lower board/module power budget."""
    return int(round(lib.sim.enforced_limit_watts(i) * 1000))


@entry("nvmlDeviceGetPowerManagementDefaultLimit")
def _power_default(lib: SimLibrary, i: int) -> int:
    return int(lib.gpu(i).power_default_watts * 1000)


@entry("nvmlDeviceGetPowerManagementLimitConstraints", outs=2)
def _power_constraints(lib: SimLibrary, i: int) -> tuple[int, int]:
    g = lib.gpu(i)
    return int(g.power_min_watts * 1000), int(g.power_max_watts * 1000)


@entry("nvmlDeviceGetTotalEnergyConsumption")
def _energy(lib: SimLibrary, i: int) -> int:
    lib.sim.step()
    return int(lib.sim.thermal[i].energy_mj)


# -- clocks -----------------------------------------------------------------------------------


def events(lib: SimLibrary, i: int) -> int:
    return lib.sim.clock_events(i)  # the mask of the reasons the violation counters count too


@entry("nvmlDeviceGetCurrentClocksEventReasons")
@entry("nvmlDeviceGetCurrentClocksThrottleReasons")
def _events(lib: SimLibrary, i: int) -> int:
    return events(lib, i)


@entry("nvmlDeviceGetMaxClockInfo")
def _max_clock(lib: SimLibrary, i: int, clock: int) -> int:
    g = lib.gpu(i)
    key = {CLOCK_GRAPHICS: "max_graphics_mhz", CLOCK_SM: "max_sm_mhz", CLOCK_MEM: "max_memory_mhz"}.get(clock)
    if key is None:
        fail(INVALID_ARGUMENT)
    return int(getattr(g, str(key)))


@entry("nvmlDeviceGetSupportedMemoryClocks", outs="raw")
def _supported_memory_clocks(lib: SimLibrary, i: int, count: Any, out: Any) -> None:
    """``*count`` in: the room the caller has; out: the number of clocks, written highest first, as
    ``nvmlDeviceGetSupportedMemoryClocks`` does (INSUFFICIENT_SIZE with the count when the room is too
    small). The clocks are those a dump of the model shows: its maximum, its default application clock
    and its idle clock. Hardware lists intermediate P-state clocks too (``nvidia-smi -q -d
    SUPPORTED_CLOCKS``), which the dumps do not give: fewer candidates, never more."""
    g = lib.gpu(i)
    clocks = sorted({int(c) for c in (g.max_memory_mhz, g.default_app_memory_mhz, g.idle_memory_mhz)
                     if c}, reverse=True)
    n = _target(count)
    if out is None or n.value < len(clocks):
        n.value = len(clocks)
        fail(INSUFFICIENT_SIZE)
    target = _target(out)
    for k, c in enumerate(clocks):
        target[k] = c
    n.value = len(clocks)


@entry("nvmlDeviceGetClockInfo")
def _clock(lib: SimLibrary, i: int, clock: int) -> int:
    if clock not in (CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM):
        fail(INVALID_ARGUMENT)
    return lib.sim.clock_mhz(i, clock)


DEPRECATED = 26  # NVML_ERROR_DEPRECATED


def app_clocks_gone(lib: SimLibrary) -> None:
    """Drivers from 590 answer the application-clock calls with Deprecated (nvml.h marks them
    DEPRECATED(13.0); an H200 on 590.48.01 prints "Requested functionality has been deprecated")."""
    major = str(lib.sim.desc.machine.driver_version).split(".")[0]
    if major.isdigit() and int(major) >= 590:
        fail(DEPRECATED)


@entry("nvmlDeviceGetApplicationsClock")
def _app_clock(lib: SimLibrary, i: int, clock: int) -> int:
    app_clocks_gone(lib)
    g, s = lib.gpu(i), lib.settings(i)
    if s["app_clocks"]:
        return int(s["app_clocks"][0] if clock == CLOCK_MEM else s["app_clocks"][1])
    return int(g.default_app_memory_mhz if clock == CLOCK_MEM else g.default_app_graphics_mhz)


@entry("nvmlDeviceGetDefaultApplicationsClock")
def _default_app_clock(lib: SimLibrary, i: int, clock: int) -> int:
    app_clocks_gone(lib)
    g = lib.gpu(i)
    return int(g.default_app_memory_mhz if clock == CLOCK_MEM else g.default_app_graphics_mhz)


# -- modes ------------------------------------------------------------------------------------


@entry("nvmlDeviceGetPersistenceMode")
def _persistence(lib: SimLibrary, i: int) -> int:
    return int(lib.settings(i)["persistence"])


@entry("nvmlDeviceGetComputeMode")
def _compute_mode(lib: SimLibrary, i: int) -> int:
    return int(lib.settings(i)["compute_mode"])
