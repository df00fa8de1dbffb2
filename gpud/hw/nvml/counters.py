"""The slow readings: ECC, retired pages, remapped rows, PCIe replays, violation counters, NVLink
states and counters (field values).
"""

from __future__ import annotations

import ctypes
import math
import time
from typing import Any

from gpud.errors import (
    DriverNotLoaded,
    GpuLost,
    GpuUnusable,
    NvmlError,
)
from gpud.hw.nvml.constants import (
    CLOCK_TYPES,
    ECC_TOTALS,
    FI_NVLINK_DATA,
    FI_NVLINK_ERROR_LINKS,
    FI_NVLINK_ERRORS,
    NVLINK_DATA_RETRY_S,
    NVLINK_DEVICE_SWITCH,
    NVLINK_ERROR_COUNTERS,
    OFFSET_DOMAINS,
    PERF_POLICIES,
    RETIRE_DBE,
    RETIRE_SBE,
    SLOW_EVERY_S,
    FieldValue,
)
from gpud.hw.nvml.handles import NvmlClient
from gpud.hw.nvml.info import Info
from gpud.hw.nvml.values import SlowFields, field_int, normalize_bus_id, violation_fields
from gpud.model import (
    EccCounts,
    GpuInfo,
    NvLinkInfo,
)


class Counters:
    """The slow readings: ECC, retired pages, remapped rows, PCIe replays, violation counters, NVLink
    counters (field values)."""

    def __init__(self, client: NvmlClient, info: Info) -> None:
        self._c = client
        self._info = info
        self._slow: dict[int, tuple[float, SlowFields]] = {}  # (when, fields) read every SLOW_EVERY_S
        self._remotes: dict[int, dict[int, tuple[str, bool | None]]] = {}  # an NVLink's remote end, per link
        self._fields_retry: dict[tuple[int, str], float] = {}  # (GPU, field group) → when to ask it again
        client.on_renumber(self._forget)

    def _forget(self) -> None:
        for cache in (self._slow, self._remotes, self._fields_retry):
            cache.clear()

    def drop(self, index: int) -> None:
        """Read GPU ``index``'s slow fields afresh at its next sample (gpud wrote a setting, or a burn-in's
        before and after)."""
        self._slow.pop(index, None)

    def held(self, index: int) -> bool:
        """Whether GPU ``index``'s slow fields as last read still stand (none written since)."""
        return index in self._slow

    def slow_fields(self, index: int, h: Any, info: GpuInfo, now: float) -> SlowFields:
        """What changes only when someone sets it, or slowly: health counters (ECC, page retirement, row
        remapping, PCIe replays), modes, the management power limit, application clocks, fan policies
        the trained link width and the NVLink states. Read every SLOW_EVERY_S seconds, not every tick; gpud's
        own setters read them afresh (the enforced limit, clocks and link generation stay per tick).

        An NVLink's state was read every tick: four calls a GPU, a fifth of the tick's (32.6 calls/s on
        eight bridged A6000s, benchmarks/footprint.py). A link that goes down is also an Xid 74 in the
        kernel log (read every 10 s, gpud/daemon/tick.py) and moves its error counters, both read at this
        cadence; dcgm-exporter collects its NVLink fields every 30 s by default."""
        cached = self._slow.get(index)
        if cached is not None and now - cached[0] < SLOW_EVERY_S:
            return cached[1]

        c = self._c

        def get(name: str, *args: Any) -> Any:
            return c.get(name, h, *args, gpu=index)

        policies = []
        for fan in range(info.fan_count or 0):
            out = c.get_out("nvmlDeviceGetFanControlPolicy_v2", h, fan, gpu=index)
            policies.append(out[0] if out is not None else None)
        ecc_mode = get("nvmlDeviceGetEccMode")
        ecc, nvlink_errors = self._health_counters(index, h, info, ecc_mode is not None and bool(ecc_mode[0]))
        fields = SlowFields(  # in this order: the calls are made as the arguments are read
            ecc_mode=ecc_mode, ecc=ecc, sbe=get("nvmlDeviceGetRetiredPages", RETIRE_SBE),
            dbe=get("nvmlDeviceGetRetiredPages", RETIRE_DBE),
            retired_pending=get("nvmlDeviceGetRetiredPagesPendingStatus"),
            remap=get("nvmlDeviceGetRemappedRows"), replay=get("nvmlDeviceGetPcieReplayCounter"),
            fan_policies=policies, persistence=get("nvmlDeviceGetPersistenceMode"),
            compute=get("nvmlDeviceGetComputeMode"), mig=get("nvmlDeviceGetMigMode"),
            management_limit=get("nvmlDeviceGetPowerManagementLimit"),
            applications_clocks={k: get("nvmlDeviceGetApplicationsClock", CLOCK_TYPES[k])
                                 for k in ("graphics", "memory")},
            pcie_width=get("nvmlDeviceGetCurrPcieLinkWidth"),
            clock_offsets={d: o for d in OFFSET_DOMAINS if (o := self._info.clock_offset_now(index, h, d)) is not None},
            nvlink_errors=nvlink_errors, nvlinks=self._nvlinks(index, h),
            violations=self._violations(index, h), nvlink_data=self.nvlink_data(index, h, info))
        self._slow[index] = (now, fields)
        return fields

    def _nvlinks(self, index: int, h: Any) -> tuple[NvLinkInfo, ...]:
        """Link states (a slow field: ``_slow_fields``); a link's remote end is read when it comes up, then kept."""
        out = []
        remotes = self._remotes.setdefault(index, {})
        for link, sli in enumerate(self._info.sli_links(index)):
            state = self._c.get("nvmlDeviceGetNvLinkState", h, link, gpu=index)
            up = bool(state)
            remote: str | None = None
            switch: bool | None = None
            if up:
                known = remotes.get(link)
                if known is None:
                    pci = self._c.get("nvmlDeviceGetNvLinkRemotePciInfo", h, link, gpu=index)
                    if pci is not None:
                        kind = self._c.get("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, gpu=index)
                        known = (normalize_bus_id(pci.busId), kind == NVLINK_DEVICE_SWITCH if kind is not None
                                 else None)
                        remotes[link] = known
                if known is not None:
                    remote, switch = known
            else:
                remotes.pop(link, None)
            out.append(NvLinkInfo(link=link, up=up, remote_pci_bus_id=remote, sli_bridge=sli,
                                  remote_is_switch=switch))
        return tuple(out)

    def violations(self, index: int) -> dict[str, int] | None:
        """NVML's violation counters now, ns per clock-event reason since the driver loaded (``sample``'s
        are up to ``SLOW_EVERY_S`` old): what a tune reads every second of a window, so a hardware slowdown
        between two readings of the clock-event reasons is seen all the same."""
        with self._c.lock:
            return self._violations(index, self._c.handle(index))

    def _violations(self, index: int, h: Any) -> dict[str, int] | None:
        """NVML's violation counters, ns per clock-event reason: one field-value call for every id; a
        reason no field gives (a driver that does not know the id) from nvmlDeviceGetViolationStatus
        where a policy counts it. None when the GPU keeps none (the caller counts per tick then)."""
        out: dict[str, int] = {}
        ids = violation_fields(self._c.versions().driver)
        # every id Not Supported: a capability, not asked again
        for v in self.field_values(index, h, list(ids), "violations", retry_s=None) or ():
            got = field_int(v)
            if got is not None and int(v.fieldId) in ids:
                out[ids[int(v.fieldId)]] = got[0]
        for policy, reason in PERF_POLICIES.items():
            if reason not in out:
                t = self._c.get("nvmlDeviceGetViolationStatus", h, policy, gpu=index)
                if t is not None:
                    out[reason] = int(t.violationTime)
        return out or None

    def nvlink_data(self, index: int, h: Any, info: GpuInfo) -> tuple[tuple[int, str, int], ...] | None:
        """Data bytes each link sent and received since the driver loaded (field values 138/139 per link,
        KiB); None where the GPU gives none."""
        if not info.nvlink_count:
            return None
        ids = [(fid, link) for link in range(info.nvlink_count) for fid in FI_NVLINK_DATA]
        # No link counts data (a workstation bridge, or links not trained yet): asked again later.
        values = self.field_values(index, h, ids, "nvlink_data", retry_s=NVLINK_DATA_RETRY_S)
        out = []
        for v in values or ():
            got = field_int(v)
            if got is not None and int(v.fieldId) in FI_NVLINK_DATA:
                out.append((int(v.scopeId), FI_NVLINK_DATA[int(v.fieldId)], got[0] * 1024))
        return tuple(out) if out else None

    def field_values(self, index: int, h: Any, ids: list[Any], what: str, retry_s: float | None
                     ) -> ctypes.Array[FieldValue] | None:
        """One ``nvmlDeviceGetFieldValues`` call for ``ids``; None when it cannot be read. A GPU that
        answers every id Not Supported is not asked again for ``retry_s`` seconds (None: never)."""
        if time.monotonic() < self._fields_retry.get((index, what), 0.0):
            return None
        try:
            values = self._c.field_values(h, ids, gpu=index)
        except (GpuLost, DriverNotLoaded, GpuUnusable):
            raise
        except NvmlError as err:
            # The call failed whole: nvml.h gives each field its own answer (nvmlReturn), so this says
            # nothing about the fields (asked again next time) unless the function itself is missing.
            if err.code in (13, None):
                self._c.mark_gone("nvmlDeviceGetFieldValues")
                self._fields_retry[(index, what)] = math.inf
            return None
        if all(int(v.nvmlReturn) == 3 for v in values):
            self._fields_retry[(index, what)] = math.inf if retry_s is None else time.monotonic() + retry_s
            return None
        return values

    def never_ask(self, index: int, what: str) -> None:
        """Ask GPU ``index``'s field group ``what`` no more (one of its fields is Not Supported)."""
        self._fields_retry[(index, what)] = math.inf

    def _health_counters(self, index: int, h: Any, info: GpuInfo, ecc_on: bool
                         ) -> tuple[EccCounts | None, tuple[tuple[int, str, int], ...] | None]:
        """The ECC totals (where ECC is on) and each NVLink's error counters (``nvidia-smi nvlink -e``; None where
        the GPU gives none) in one ``nvmlDeviceGetFieldValues`` call, where they took 4 calls and 4 a link: a
        bridged A6000's four links made 16 of them, 8.5 of the daemon's 82 calls a second on eight GPUs
        (benchmarks/footprint.py). What no field answers (a link above 11, an id the driver does not know, a
        driver without field values) is asked through its own call, as before."""
        wanted: dict[int, tuple[str, Any]] = {f: ("ecc", name) for name, (f, _, _) in ECC_TOTALS.items()
                                              } if ecc_on else {}
        links = info.nvlink_count or 0
        for link in range(min(links, FI_NVLINK_ERROR_LINKS)):
            for name, (first, sixth) in FI_NVLINK_ERRORS.items():
                wanted[first + link if link < 6 else sixth + link - 6] = ("nvlink", (link, name))
        # every id Not Supported: a capability, not asked again (each counter's own call is, below)
        values = self.field_values(index, h, list(wanted), "health", retry_s=None) if wanted else None
        got: dict[tuple[str, Any], int] = {}
        for v in values or ():
            if (value := field_int(v)) is not None:
                got[wanted[int(v.fieldId)]] = value[0]

        def ask(key: tuple[str, Any], name: str, *args: Any) -> int | None:
            if key in got:
                return got[key]
            n = self._c.get(name, h, *args, gpu=index)
            return int(n) if n is not None else None

        ecc = EccCounts(**{name: ask(("ecc", name), "nvmlDeviceGetTotalEccErrors", error, counter)
                           for name, (_, error, counter) in ECC_TOTALS.items()}) if ecc_on else None
        out = []
        for link in range(links):
            for name, counter in NVLINK_ERROR_COUNTERS.items():
                n = ask(("nvlink", (link, name)), "nvmlDeviceGetNvLinkErrorCounter", link, counter)
                if n is not None:
                    out.append((link, name, n))
        return ecc, tuple(out) if out else None
