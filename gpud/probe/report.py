"""The probe report as types: what the runner assembles, what the diagnosis adds, what the history
keeps, what ``gpud probe`` prints, what doctor's probe checks, the exporter and the daemon read.

No torch here. ``ProbeReport.to_json()`` is the report's JSON exactly as the history file and
``gpud probe --json`` (through ``gpud.model.probe_document``) have always written it;
``ProbeReport.from_json()`` reads any record the history holds: keys a record lacks take their
defaults (a torchrun report has no ``load``), keys this version does not know are kept in
``extra`` and written back unchanged.

The measurements themselves (one DDP world size, one all-reduce, one pipeline, the P2P copies)
stay the worker's JSON objects (``Figures``, documented in docs/probe.md): gpud passes them
through to the output and reads a few named figures from them, and their shape belongs to
``gpud.probe.worker``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Device = Literal["cuda", "cpu"]
Verdict = Literal["pass", "warn", "fail", "n/a"]  # n/a: not judged (a CPU run, no view of the links)
Figures = dict[str, Any]  # one measurement as the worker wrote it (docs/probe.md)
CORRECTNESS = {"params_identical_across_ranks": "parameters identical on every rank",
               "ddp_matches_one_process": "DDP step = one-process step on the global batch",
               "pipeline_matches_unsplit": "pipeline output = unsplit model output"}


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that are fields of ``cls`` (a record of another version may have more)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class Correctness:
    """What the probe checked about the results themselves; None where it was not measured."""

    params_identical_across_ranks: bool | None = None
    ddp_matches_one_process: bool | None = None
    pipeline_matches_unsplit: bool | None = None

    def items(self) -> Iterator[tuple[str, bool]]:
        """The checks made, in order, with their outcome."""
        for k in CORRECTNESS:
            v = getattr(self, k)
            if v is not None:
                yield k, v

    def ok(self) -> bool:
        return all(v for _, v in self.items())

    def to_json(self) -> dict[str, bool]:
        return dict(self.items())

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Correctness:
        return cls(**{k: data[k] for k in CORRECTNESS if k in data})


@dataclass
class Nccl:
    version: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # the NCCL_* variables the ranks inherited
    # per world size, NCCL's channels: {"channel", "src_rank", "dst_rank", "transport"[, "direction"]}
    transports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Nccl:
        return cls(data.get("version"), dict(data.get("env") or {}), dict(data.get("transports") or {}))


@dataclass
class Load:
    """What was seen on the GPUs while the probe ran, by NVML index (as a string, as in JSON)."""

    pcie_max_generation_under_load: dict[str, int] = field(default_factory=dict)
    clock_events: dict[str, list[str]] = field(default_factory=dict)
    other_processes: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Load:
        return cls(dict(data.get("pcie_max_generation_under_load") or {}), dict(data.get("clock_events") or {}),
                   dict(data.get("other_processes") or {}))


@dataclass
class PathSeen:
    """The slowest hop of a world size's ring."""

    gpus: list[int] = field(default_factory=list)
    transport: str = ""
    text: str = ""


@dataclass
class Scaling:
    """One world size judged: expected and measured bus bandwidth, DDP efficiency against its prediction."""

    gpus: list[int] = field(default_factory=list)
    expected_busbw_bytes_per_second: float = 0.0
    expected_now_busbw_bytes_per_second: float = 0.0
    measured_busbw_bytes_per_second: float | None = None
    path: PathSeen = field(default_factory=PathSeen)
    nccl_transports_seen: bool = False
    bus_ratio: float | None = None
    bus_verdict: Verdict | None = None
    predicted_efficiency: list[float] | None = None  # [low, high]
    efficiency: float | None = None
    efficiency_verdict: Verdict | None = None
    causes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        optional = ("bus_ratio", "bus_verdict", "predicted_efficiency", "efficiency", "efficiency_verdict")
        return {k: v for k, v in asdict(self).items() if v is not None or k not in optional}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Scaling:
        return cls(**{**_known(cls, data), "path": PathSeen(**_known(PathSeen, data.get("path") or {}))})


@dataclass
class LinkJudgement:
    """Device-to-device copies between two GPUs against what their link allows."""

    src: int
    dst: int
    link: str
    expected_bytes_per_second: float
    measured_bytes_per_second: float
    ratio: float
    # Both ways at once (absent in reports from before they were measured)
    expected_bidirectional_bytes_per_second: float | None = None
    measured_bidirectional_bytes_per_second: float | None = None
    bidirectional_ratio: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Seed:
    """The seeds' figures for a world size, shown for information only."""

    speedup: float | None
    seed_speedup: float
    seed_efficiency: float


@dataclass
class Diagnosis:
    sentences: list[str] = field(default_factory=list)
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # by world size
    details: dict[str, Scaling] = field(default_factory=dict)  # by world size, where judged
    links: list[LinkJudgement] = field(default_factory=list)
    seeds: dict[str, Seed] = field(default_factory=dict)

    def failed(self) -> bool:
        return any(v == "fail" for v in self.verdicts.values())

    def to_json(self) -> dict[str, Any]:
        return {"sentences": list(self.sentences), "verdicts": dict(self.verdicts),
                "details": {k: d.to_json() for k, d in self.details.items()},
                "links": [asdict(x) for x in self.links], "seeds": {k: asdict(s) for k, s in self.seeds.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Diagnosis:
        return cls(list(data.get("sentences") or []), dict(data.get("verdicts") or {}),
                   {k: Scaling.from_json(d) for k, d in (data.get("details") or {}).items()},
                   [LinkJudgement(**_known(LinkJudgement, x)) for x in data.get("links") or []],
                   {k: Seed(**_known(Seed, s)) for k, s in (data.get("seeds") or {}).items()})


# The report's keys in the order the runner writes them; ``None`` in an optional one means absent.
_KEYS = ("device", "quick", "world_sizes", "suites", "ddp", "allreduce", "pipeline", "p2p", "ranks", "nccl",
         "torch", "dtype", "gpu_name", "teardown_killed", "correctness", "workload", "version", "host",
         "started_at", "finished_at", "gpus", "nodes", "torchrun", "busy_at_start", "cpu_affinity", "nvml", "note",
         "diagnosis", "load", "ok", "regressions")


@dataclass
class ProbeReport:
    device: Device = "cpu"
    quick: bool = False
    world_sizes: list[int] = field(default_factory=list)
    suites: list[str] = field(default_factory=list)
    ddp: dict[str, Figures] = field(default_factory=dict)  # by world size (JSON: ddp.by_world_size)
    allreduce: dict[str, Figures] = field(default_factory=dict)  # by world size (JSON: allreduce.by_world_size)
    pipeline: dict[str, Figures] = field(default_factory=dict)  # by stage count (JSON: pipeline.by_stages)
    p2p: Figures = field(default_factory=lambda: {"pairs": []})  # the copies: pairs, how, latency
    ranks: dict[str, list[str | None]] = field(default_factory=dict)  # per world size, each rank's GPU UUID
    nccl: Nccl = field(default_factory=Nccl)
    torch: str | None = None
    dtype: str | None = None
    gpu_name: str | None = None
    teardown_killed: dict[str, list[int]] | None = None  # per world size, ranks killed after the result
    correctness: Correctness = field(default_factory=Correctness)
    workload: dict[str, Any] = field(default_factory=dict)  # gpud.probe.history.workload: what is compared
    version: int | None = None
    host: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    gpus: int = 0
    nodes: int | None = None  # torchrun only
    torchrun: bool | None = None  # torchrun only
    busy_at_start: list[str] | None = None
    cpu_affinity: list[list[int]] | None = None  # per rank
    nvml: str | None = None  # why NVML was not used
    note: str | None = None  # a CPU run's caveat
    diagnosis: Diagnosis = field(default_factory=Diagnosis)
    load: Load | None = None  # not under torchrun
    ok: bool = False
    regressions: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # keys of another gpud version, kept as they are

    @property
    def p2p_pairs(self) -> list[Figures]:
        return list(self.p2p.get("pairs") or [])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in _KEYS:
            v = getattr(self, k)
            if k == "ddp" or k == "allreduce":
                v = {"by_world_size": v}
            elif k == "pipeline":
                v = {"by_stages": v}
            elif k == "nccl":
                v = {"version": v.version, "env": v.env, "transports": v.transports}
            elif k in ("correctness", "diagnosis"):
                v = v.to_json()
            elif k == "load":
                v = asdict(v) if v is not None else None
            elif k in ("torch", "dtype"):
                out[k] = v  # always written (null when no launch said)
                continue
            if v is not None:
                out[k] = v
        return out | self.extra

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeReport:
        get = data.get
        load = get("load")
        return cls(
            device="cuda" if get("device") == "cuda" else "cpu", quick=bool(get("quick")),
            world_sizes=list(get("world_sizes") or []), suites=list(get("suites") or []),
            ddp=dict((get("ddp") or {}).get("by_world_size") or {}),
            allreduce=dict((get("allreduce") or {}).get("by_world_size") or {}),
            pipeline=dict((get("pipeline") or {}).get("by_stages") or {}),
            p2p=dict(get("p2p") or {"pairs": []}), ranks=dict(get("ranks") or {}),
            nccl=Nccl.from_json(get("nccl") or {}),
            torch=get("torch"), dtype=get("dtype"), gpu_name=get("gpu_name"), teardown_killed=get("teardown_killed"),
            correctness=Correctness.from_json(get("correctness") or {}), workload=dict(get("workload") or {}),
            version=get("version"), host=get("host") or "", started_at=get("started_at", 0.0),
            finished_at=get("finished_at", 0.0), gpus=get("gpus") or 0, nodes=get("nodes"), torchrun=get("torchrun"),
            busy_at_start=get("busy_at_start"), cpu_affinity=get("cpu_affinity"), nvml=get("nvml"), note=get("note"),
            diagnosis=Diagnosis.from_json(get("diagnosis") or {}),
            load=Load.from_json(load) if isinstance(load, dict) else None, ok=bool(get("ok")),
            regressions=list(get("regressions") or []),
            extra={k: v for k, v in data.items() if k not in _KEYS})
