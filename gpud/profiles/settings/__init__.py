"""Every tunable as one object: how it is read, written, compared, restored and supported.

After TuneD's plugins, where a tunable's get and set live together: a ``Setting`` holds its key
(the one name used in the state file, plans, ``gpud verify`` and metrics), its scope (one GPU or
the host), its reader, its writer (which returns what the hardware reads back), its comparison,
what restore and rollback write back, why a GPU cannot take it, whether it can be verified at all,
whether the driver forgets it without persistence mode, and whether the daemon re-applies it.

A setting also owns its value's whole life outside the hardware: its type in a profile (``spec``), the
checks of the file alone (``parse``), the value for one GPU in absolute units (``resolve``), its typed value
(``from_json`` reads the JSON form plans, the state file and the socket carry, ``to_json`` writes it) and how
people read it (``shown``); ``gpud.profiles.profile``, ``gpud.profiles.state`` and the engine loop over the
registry and know no setting by name. The host's settings take the same calls as a GPU's (``At`` holds what
either reads), so nothing above this package branches on a GPU or the host.

``REGISTRY`` is the one ordered list: its order is the apply order (per GPU, then the host), its
reverse the rollback and restore order. Adding a tunable means one module here
(its ``Setting[T]``) and its line in ``GPU_SETTINGS`` or ``HOST_SETTINGS``.
"""

from __future__ import annotations

from typing import Any

from gpud.profiles.settings.base import (
    HOST,
    At,
    Checked,
    DriftStatus,
    Gpu,
    Host,
    PlanAction,
    Planned,
    Scope,
    Setting,
    Target,
    show,
    target_at,
    target_keyed,
)
from gpud.profiles.settings.fan import Fan
from gpud.profiles.settings.gpu import ApplicationsClocks, ComputeMode, LockedClocks, PersistenceMode, PowerLimit
from gpud.profiles.settings.host import CpuGovernor
from gpud.profiles.settings.offsets import ClockOffset
from gpud.profiles.settings.values import RESET, UNKNOWN, UNSUPPORTED, AppClocks, ClockRange

PERSISTENCE = PersistenceMode()
COMPUTE = ComputeMode()
POWER = PowerLimit()
APP_CLOCKS = ApplicationsClocks()
GPU_CLOCKS = LockedClocks("gpu_clocks", "sm", "volta")
MEMORY_CLOCKS = LockedClocks("memory_clocks", "memory", "ampere")
GPU_CLOCK_OFFSET = ClockOffset("gpu_clock_offset", "graphics")
MEMORY_CLOCK_OFFSET = ClockOffset("memory_clock_offset", "memory")
FAN = Fan()
GOVERNOR = CpuGovernor()

AnySetting = Setting[Any]
# The apply order per GPU (persistence first: the settings after it need it), then the host.
GPU_SETTINGS: tuple[AnySetting, ...] = (PERSISTENCE, COMPUTE, POWER, APP_CLOCKS, GPU_CLOCKS, MEMORY_CLOCKS,
                                        GPU_CLOCK_OFFSET, MEMORY_CLOCK_OFFSET, FAN)
HOST_SETTINGS: tuple[AnySetting, ...] = (GOVERNOR,)
REGISTRY: tuple[AnySetting, ...] = (*GPU_SETTINGS, *HOST_SETTINGS)
BY_KEY: dict[str, AnySetting] = {s.key: s for s in GPU_SETTINGS}
HOST_BY_KEY: dict[str, AnySetting] = {s.key: s for s in HOST_SETTINGS}
KEYS: tuple[str, ...] = tuple(s.key for s in REGISTRY)
BY_PROFILE_KEY: dict[str, AnySetting] = {s.profile_key: s for s in GPU_SETTINGS}  # profile name → setting


def settings_of(target: Target) -> tuple[AnySetting, ...]:
    """The registry's settings of ``target``'s kind (a GPU's or the host's), in apply order."""
    return HOST_SETTINGS if isinstance(target, Host) else GPU_SETTINGS


def setting_for(target: Target, key: str) -> AnySetting | None:
    """The registry's setting ``key`` of ``target``'s kind (a GPU's or the host's); None when it has none."""
    return HOST_BY_KEY.get(key) if isinstance(target, Host) else BY_KEY.get(key)


def shown(key: str, value: Any) -> str:
    """Setting ``key``'s value for people (an unknown key's plainly)."""
    setting = BY_KEY.get(key) or HOST_BY_KEY.get(key)
    return setting.shown(value) if setting is not None else show(value)


__all__ = ["BY_KEY", "BY_PROFILE_KEY", "GOVERNOR", "GPU_SETTINGS", "HOST", "HOST_BY_KEY", "HOST_SETTINGS", "KEYS",
           "REGISTRY", "RESET", "UNKNOWN", "UNSUPPORTED", "AnySetting", "AppClocks", "At", "Checked", "ClockRange",
           "CpuGovernor", "DriftStatus", "Gpu", "Host", "PlanAction", "Planned", "Scope", "Setting", "Target",
           "setting_for", "settings_of", "show", "shown", "target_at", "target_keyed"]
