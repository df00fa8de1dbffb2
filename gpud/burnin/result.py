"""The burn-in's result: verdicts (which GPU, which test, the figure, the threshold and its source,
what to do), the workload's figures and the telemetry; its JSON (``kind: burnin``, docs/json.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gpud.burnin.telemetry import Series
from gpud.model import document

Status = Literal["pass", "warn", "fail", "skip"]


@dataclass(frozen=True)
class Verdict:
    test: str  # dotted id: burnin.gemm.digest, burnin.thermal.settle …
    status: Status
    summary: str  # one line: the figure against the threshold
    gpu: int | None = None
    figure: float | None = None
    threshold: float | None = None
    source: str = ""  # where the threshold comes from
    remedy: str = ""

    def json(self) -> dict[str, Any]:
        return {"test": self.test, "gpu": self.gpu, "status": self.status, "summary": self.summary,
                "figure": self.figure, "threshold": self.threshold, "source": self.source, "remedy": self.remedy}


def not_judged(test: str, gpu: int | None, why: str, needs: str, source: str = "") -> Verdict:
    """A test that could not measure what it judges: "not judged", with the reason and what gpud needs;
    never a pass (``Result.not_judged`` lists them, the overall verdict names them)."""
    return Verdict(test, "skip", f"not judged: {why}", gpu, source=source, remedy=needs)


@dataclass
class Result:
    machine: str
    level: str
    device: str
    gpus: list[int]
    names: dict[int, str]
    started: float  # wall clock, seconds since the epoch
    seconds: float = 0.0  # the GPUs' time the run covered
    wall_seconds: float = 0.0
    simulated_time: bool = False
    verdicts: list[Verdict] = field(default_factory=list)
    workload: dict[int, dict[str, Any]] = field(default_factory=dict)  # each GPU's child's figures
    series: dict[int, Series] = field(default_factory=dict)
    uuids: dict[int, str] = field(default_factory=dict)
    limits: dict[int, dict[str, float | None]] = field(default_factory=dict)  # temperatures drawn on the charts
    # Each GPU's fan setting from the applied profile (``mode: curve``, its points): the curve the thermal
    # verdict holds the GPU to; a GPU without one is held to the driver's target temperature.
    fan_curves: dict[int, dict[str, Any]] = field(default_factory=dict)
    interrupted: bool = False
    results_are_the_gpus: bool = True  # the kernels ran on the GPUs (or a simulated GPU's stand-in), not the host

    def not_judged(self) -> list[Verdict]:
        """The tests that could not measure what they judge ("not judged: …"): never a pass."""
        return [v for v in self.verdicts if v.status == "skip" and v.summary.startswith("not judged")]

    @property
    def status(self) -> Status:
        if any(v.status == "fail" for v in self.verdicts) or self.interrupted:
            return "fail"
        return "warn" if any(v.status == "warn" for v in self.verdicts) else "pass"

    def failed_gpus(self) -> list[int]:
        return sorted({v.gpu for v in self.verdicts if v.status == "fail" and v.gpu is not None})

    def exit_code(self) -> int:
        return 1 if self.status == "fail" else 0

    def json(self, version: str, host: dict[str, Any], telemetry: bool = False) -> dict[str, Any]:
        """The ``burnin`` document (docs/json.md): the envelope of every gpud document, then the run."""
        return document("burnin", version, host, **self.body(telemetry))

    def body(self, telemetry: bool = False) -> dict[str, Any]:
        return {
            "level": self.level, "device": self.device, "figures": "cpu" if self.device == "cpu" else "gpu",
            "simulated_time": self.simulated_time, "started": self.started, "seconds": round(self.seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3), "interrupted": self.interrupted, "status": self.status,
            "exit_code": self.exit_code(),
            "not_judged": sorted({v.test for v in self.not_judged()}),
            "gpus": [{"index": g, "name": self.names.get(g), "uuid": self.uuids.get(g),
                      "status": _worst(self.verdicts, g), "limits": self.limits.get(g, {}),
                      "workload": self.workload.get(g, {})} for g in self.gpus],
            "verdicts": [v.json() for v in self.verdicts],
            "telemetry": ({str(g): [p.json() for p in s.points] for g, s in self.series.items()} if telemetry
                          else None),
            "checks": ({str(g): [c.json() for c in s.checks] for g, s in self.series.items()} if telemetry
                       else None),
        }


RANK = {"fail": 0, "warn": 1, "skip": 2, "pass": 3}


def shown_order(v: dict[str, Any]) -> tuple[int, int, int]:
    """How a report lists verdicts: failures first, then warnings, then what was not judged, then passes;
    within each, the GPU's and the burn-in's own tests (hardware) before doctor's (configuration: /dev/shm,
    the governor), the machine's before a GPU's."""
    return (RANK.get(str(v["status"]), 3), 1 if str(v["test"]).startswith("doctor.") else 0,
            v["gpu"] if v["gpu"] is not None else -1)


def _worst(verdicts: list[Verdict], gpu: int) -> Status:
    mine = [v.status for v in verdicts if v.gpu == gpu]
    for s in ("fail", "warn", "pass"):
        if s in mine:
            return s
    return "skip"
