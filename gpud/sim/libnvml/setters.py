"""Entry points that change a GPU (``setter=True``: root only, under the simulator's state lock,
counted as a write): fans, power limit, clocks, persistence and compute mode.
"""

from __future__ import annotations

from gpud.sim.entries import entry
from gpud.sim.libnvml.library import SimLibrary
from gpud.sim.libnvml.readings import _fan, app_clocks_gone
from gpud.sim.libnvml.returns import ARCH_CODES, INVALID_ARGUMENT, NOT_SUPPORTED, fail


@entry("nvmlDeviceSetFanSpeed_v2", outs=0, setter=True)
def _set_fan(lib: SimLibrary, i: int, fan: int, speed: int) -> None:
    lib.write()
    f = _fan(lib, i, fan)
    g = lib.gpu(i)
    if not g.fan_min_percent <= speed <= g.fan_max_percent:  # type: ignore[operator]
        fail(INVALID_ARGUMENT)
    lib.sim.step()
    f["policy"], f["target"] = 1, int(speed)


@entry("nvmlDeviceSetDefaultFanSpeed_v2", outs=0, setter=True)
def _set_fan_default(lib: SimLibrary, i: int, fan: int) -> None:
    lib.write()
    f = _fan(lib, i, fan)
    lib.sim.step()
    f["policy"], f["target"] = 0, None


@entry("nvmlDeviceSetFanControlPolicy", outs=0, setter=True)
def _set_fan_policy(lib: SimLibrary, i: int, fan: int, policy: int) -> None:
    lib.write()
    f = _fan(lib, i, fan)
    if policy not in (0, 1):
        fail(INVALID_ARGUMENT)
    lib.sim.step()
    f["policy"] = int(policy)
    if policy == 0:
        f["target"] = None


@entry("nvmlDeviceSetPowerManagementLimit", outs=0, setter=True)
def _set_power(lib: SimLibrary, i: int, limit_mw: int) -> None:
    lib.write()
    g = lib.gpu(i)
    if not g.power_min_watts * 1000 <= limit_mw <= g.power_max_watts * 1000:
        fail(INVALID_ARGUMENT)
    lib.sim.step()
    lib.settings(i)["power_limit_mw"] = int(limit_mw)


def _clock_write(lib: SimLibrary, i: int, key: str, value: list[int] | None, limit_key: str | None = None,
                 since: str | None = None) -> None:
    """A locked range (min ≤ max ≤ the model's maximum), application clocks, or None to reset."""
    if since is not None and ARCH_CODES.get(lib.gpu(i).architecture, 0) < ARCH_CODES[since]:
        fail(NOT_SUPPORTED)
    lib.write()
    if value is not None and limit_key is not None:
        g = lib.gpu(i)
        if value[0] > value[1] or value[0] < 0 or value[1] > getattr(g, limit_key):
            fail(INVALID_ARGUMENT)
    lib.settings(i)[key] = value


@entry("nvmlDeviceSetGpuLockedClocks", outs=0, setter=True)
def _lock_gpu(lib: SimLibrary, i: int, lo: int, hi: int) -> None:
    _clock_write(lib, i, "locked_gpu", [int(lo), int(hi)], "max_sm_mhz", since="volta")


@entry("nvmlDeviceResetGpuLockedClocks", outs=0, setter=True)
def _reset_gpu(lib: SimLibrary, i: int) -> None:
    _clock_write(lib, i, "locked_gpu", None, since="volta")


@entry("nvmlDeviceSetMemoryLockedClocks", outs=0, setter=True)
def _lock_mem(lib: SimLibrary, i: int, lo: int, hi: int) -> None:
    _clock_write(lib, i, "locked_mem", [int(lo), int(hi)], "max_memory_mhz", since="ampere")


@entry("nvmlDeviceResetMemoryLockedClocks", outs=0, setter=True)
def _reset_mem(lib: SimLibrary, i: int) -> None:
    _clock_write(lib, i, "locked_mem", None, since="ampere")


@entry("nvmlDeviceSetApplicationsClocks", outs=0, setter=True)
def _set_app(lib: SimLibrary, i: int, mem: int, gfx: int) -> None:
    app_clocks_gone(lib)
    g = lib.gpu(i)
    if mem > g.max_memory_mhz or gfx > g.max_graphics_mhz:
        lib.write()
        fail(INVALID_ARGUMENT)
    _clock_write(lib, i, "app_clocks", [int(mem), int(gfx)])


@entry("nvmlDeviceResetApplicationsClocks", outs=0, setter=True)
def _reset_app(lib: SimLibrary, i: int) -> None:
    app_clocks_gone(lib)
    _clock_write(lib, i, "app_clocks", None)


@entry("nvmlDeviceSetPersistenceMode", outs=0, setter=True)
def _set_persistence(lib: SimLibrary, i: int, mode: int) -> None:
    lib.write()
    lib.settings(i)["persistence"] = 1 if mode else 0
    lib.settings(i)["initialised"] = True  # the GPU was opened to set it: it stays initialised now


@entry("nvmlDeviceSetComputeMode", outs=0, setter=True)
def _set_compute_mode(lib: SimLibrary, i: int, mode: int) -> None:
    lib.write()
    if mode not in (0, 2, 3):
        fail(INVALID_ARGUMENT)
    lib.settings(i)["compute_mode"] = int(mode)
