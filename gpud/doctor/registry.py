"""The check registry and the context every check reads (one snapshot, cached host facts)."""

from __future__ import annotations

import fnmatch
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, get_args

from gpud.config import Config
from gpud.errors import GpudError
from gpud.hw.host import Host
from gpud.hw.machine import Machine
from gpud.model import CheckResult, GpuInfo, GpuSample, Snapshot, Status, ThermalPoint, Topology
from gpud.probe.report import ProbeReport

if TYPE_CHECKING:
    from gpud.journal import Event

# The areas doctor's human output groups checks under, in this order.
Area = Literal["Driver", "Display", "PCIe and topology", "Configuration", "Health", "Host", "Environment", "Probe",
               "Burn-in"]  # the last: `gpud doctor --burnin` shows the last burn-in there (not a registered check)
AREAS: tuple[Area, ...] = get_args(Area)
CheckFn = Callable[["Context", "Reporter"], Iterable[CheckResult]]


@dataclass(frozen=True)
class Check:
    id: str
    area: Area
    fn: CheckFn
    needs_nvml: bool
    probe: bool = False  # runs only with `gpud doctor --probe`


CHECKS: list[Check] = []


def check(check_id: str, area: Area, needs_nvml: bool = True, probe: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register a check: its id said once, here. The check is called with the ``Context`` and a ``Reporter``
    bound to this id, which makes its results. ``needs_nvml`` checks are skipped (with the reason) when NVML
    is down."""

    def deco(fn: CheckFn) -> CheckFn:
        assert area in AREAS and all(c.id != check_id or c.probe != probe for c in CHECKS), check_id
        CHECKS.append(Check(check_id, area, fn, needs_nvml, probe))
        return fn

    return deco


@dataclass(frozen=True)
class Reporter:
    """The results of one check, each under the check's own id (the one its ``@check`` registers)."""

    id: str

    def result(self, status: Status, summary: str, gpu: int | None = None, detail: str = "",
               remedy: str = "") -> CheckResult:
        return CheckResult(self.id, status, summary, gpu, detail, remedy)

    def ok(self, summary: str, gpu: int | None = None, detail: str = "", remedy: str = "") -> CheckResult:
        return self.result("pass", summary, gpu, detail, remedy)

    def warn(self, summary: str, gpu: int | None = None, detail: str = "", remedy: str = "") -> CheckResult:
        return self.result("warn", summary, gpu, detail, remedy)

    def fail(self, summary: str, gpu: int | None = None, detail: str = "", remedy: str = "") -> CheckResult:
        return self.result("fail", summary, gpu, detail, remedy)

    def skip(self, summary: str, gpu: int | None = None, detail: str = "", remedy: str = "") -> CheckResult:
        return self.result("skip", summary, gpu, detail, remedy)


@dataclass
class Context:
    """What the checks look at. Everything hardware is read once, here."""

    machine: Machine
    config: Config
    env: Mapping[str, str]
    expect_gpus: int | None = None
    snapshot: Snapshot | None = None
    error: GpudError | None = None  # why NVML could not be read
    daemon_running: bool = False
    # Settings the active tuning profile asks for, per GPU (e.g. {"power_limit_watts": 240}):
    # a lowered power limit asked for by a profile is not a misconfiguration.
    profile_settings: dict[int, dict[str, Any]] = field(default_factory=dict)
    probe: ProbeReport | None = None  # the probe's result, with --probe
    # The daemon's recent (time, temperature, fan duty, draw) per GPU UUID (gpud.daemon.thermal); a
    # one-shot run has none, and the checks that need it judge without it.
    thermal: Mapping[str, Sequence[ThermalPoint]] = field(default_factory=dict)

    @property
    def host(self) -> Host:
        return self.machine.host

    @cached_property
    def history(self) -> list[Event]:
        """The health journal's Xid and throttle events (the daemon writes it; empty without one)."""
        from gpud import journal

        try:
            return journal.events(kinds=("xid", "throttle"))
        except (GpudError, OSError):
            return []

    def xid_boots(self, uuid: str, xid: int) -> int:
        """In how many boots the journal saw this Xid on this GPU."""
        return len({e.boot_id for e in self.history if e.kind == "xid" and e.uuid == uuid
                    and e.data.get("xid") == xid and e.boot_id})

    def throttled_share(self, uuid: str, now: float, window: float = 3600.0) -> float:
        """Share of the last ``window`` seconds this GPU spent in throttle episodes that have ended."""
        secs = 0.0
        for e in self.history:
            since = e.data.get("since", e.ts)
            if e.kind == "throttle" and e.uuid == uuid and e.ts is not None and isinstance(since, int | float):
                start, end = float(since), e.ts  # a row the journal could not read whole is left out
                overlap = max(0.0, min(end, now) - max(start, now - window))
                # merged episodes (gpud.journal): the row spans its first start to its last end, with gaps
                # between; only ``seconds`` of that span were throttled, spread over it
                total = e.data.get("seconds")
                if e.data.get("count", 1) != 1 and isinstance(total, int | float) and end > start:
                    overlap *= min(1.0, max(0.0, float(total)) / (end - start))
                secs += overlap
        return min(1.0, secs / window)

    @cached_property
    def infos(self) -> dict[int, GpuInfo]:
        return {g.index: g for g in self.snapshot.gpus} if self.snapshot else {}

    @cached_property
    def samples(self) -> list[GpuSample]:
        """Samples of the GPUs that answered (lost ones are gpu.count's business)."""
        return [s for s in self.snapshot.samples if not s.lost] if self.snapshot else []

    @cached_property
    def topology(self) -> Topology | None:
        return self.machine.topology(self.snapshot) if self.snapshot else None

    def loaded(self, s: GpuSample) -> bool:
        return bool((s.utilization_gpu_percent or 0) >= self.config.doctor.load_utilization_percent)

    def idle(self, s: GpuSample) -> bool:
        return (s.utilization_gpu_percent or 0) < 10 and not s.processes

    def by_bus(self) -> dict[str, int]:
        return {g.pci_bus_id: i for i, g in self.infos.items()}


def selected(checks: Iterable[Check], only: list[str], skip_globs: list[str], probe: bool = False) -> list[Check]:
    out = []
    for c in checks:
        if c.probe and not probe:
            continue
        if only and not any(fnmatch.fnmatchcase(c.id, g) for g in only):
            continue
        if any(fnmatch.fnmatchcase(c.id, g) for g in skip_globs):
            continue
        out.append(c)
    return out


def run(ctx: Context, checks: list[Check], debug: bool = False) -> list[CheckResult]:
    """Run the checks in order; one check's crash is reported, never the end of the run, and so is a result
    under another id than the check's (made without its ``Reporter``)."""
    results: list[CheckResult] = []
    for c in checks:
        r = Reporter(c.id)
        if c.needs_nvml and ctx.snapshot is None:
            results.append(r.skip("NVML not available (see nvml.available)"))
            continue
        try:
            for x in c.fn(ctx, r):
                if x.id != c.id:
                    raise ValueError(f"reported under the id {x.id!r}")
                results.append(x)
        except Exception as err:  # noqa: BLE001 - a broken check must not hide the others
            if debug:
                traceback.print_exc()
            results.append(r.skip(f"could not run: {err}", remedy="run with --debug and report it"))
    return results
