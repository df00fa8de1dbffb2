"""The probe report as types: what the runner assembles, what the diagnosis adds, what the history
keeps, what ``gpud probe`` prints, what doctor's probe checks, the exporter and the daemon read.

No torch here. ``ProbeReport.to_json()`` is the report's JSON exactly as the history file and
``gpud probe --json`` (through ``gpud.model.probe_document``) have always written it;
``ProbeReport.from_json()`` reads any record the history holds: keys a record lacks take their
defaults (a torchrun report has no ``load``), keys this version does not know are kept in
``extra`` and written back unchanged. It never raises, whatever JSON value it is given: a value of
the wrong type (a hand-edited or damaged file) is read as if it were absent, and described in
``problems`` when the caller passes a list (``gpud.probe.history`` skips such records).

The measurements themselves (one DDP world size, one all-reduce, one pipeline, the P2P copies)
stay the worker's JSON objects (``Figures``, documented in docs/probe.md): gpud passes them
through to the output and reads a few named figures from them, and their shape belongs to
``gpud.probe.worker``.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

Device = Literal["cuda", "cpu"]
Verdict = Literal["pass", "warn", "fail", "n/a"]  # n/a: not judged (a CPU run, no view of the links)
Figures = dict[str, Any]  # one measurement as the worker wrote it (docs/probe.md)
CORRECTNESS = {"params_identical_across_ranks": "parameters identical on every rank",
               "ddp_matches_one_process": "DDP step = one-process step on the global batch",
               "pipeline_matches_unsplit": "pipeline output = unsplit model output"}


T = TypeVar("T")
Problems = list[str] | None  # where from_json describes the values it could not use; None: not wanted


class _Bad(Exception):
    """A value of the wrong type (internal to the reading; from_json never lets it out)."""


_HINTS: dict[str, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The field types of a dataclass of this module (resolved once)."""
    if cls.__name__ not in _HINTS:
        _HINTS[cls.__name__] = get_type_hints(cls)
    return _HINTS[cls.__name__]


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _as(tp: Any, value: Any, where: str) -> Any:
    """``value`` checked against the field type ``tp`` (the JSON shapes: bool, int, float, str,
    Literal, ``X | None``, list[X], dict[str, X], a dataclass of this module, Any); _Bad naming
    ``where`` when it does not fit. Integers are kept as integers in float fields (the JSON
    written back stays the same)."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is not type(None):
                try:
                    return _as(a, value, where)
                except _Bad:
                    pass
        raise _Bad(f"{where}: {_kind(value)} is not what it should be")
    if origin is Literal:
        if value in args and isinstance(value, str):
            return value
        raise _Bad(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    elif origin is list:
        if not isinstance(value, list):
            raise _Bad(f"{where}: {_kind(value)}, not a list")
        return [_as(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    elif origin is dict:
        if not isinstance(value, dict):
            raise _Bad(f"{where}: {_kind(value)}, not an object")
        return {k: _as(args[1], v, f"{where}.{k}") for k, v in value.items()}
    elif isinstance(tp, type) and is_dataclass(tp):
        if not isinstance(value, dict):
            raise _Bad(f"{where}: {_kind(value)}, not an object")
        problems: list[str] = []
        out = _read(tp, value, problems, f"{where}.")
        if problems:
            raise _Bad(problems[0])
        return out
    else:  # pragma: no cover - a field type this reader does not know
        raise TypeError(f"cannot read {tp!r}")
    if not ok:
        raise _Bad(f"{where}: {_kind(value)}, not {_kind(tp()) if tp is not float else 'a number'}")
    return value


def _field(tp: Any, data: dict[str, Any], key: str, default: Any, problems: Problems, where: str) -> Any:
    """``data[key]`` read as ``tp``; ``default`` when absent or of the wrong type (then described in ``problems``)."""
    if key not in data:
        return default
    try:
        return _as(tp, data[key], f"{where}{key}")
    except _Bad as err:
        if problems is not None:
            problems.append(str(err))
        return default


def _obj(data: Any, problems: Problems, where: str) -> dict[str, Any]:
    """``data`` when it is a JSON object; otherwise empty (and described in ``problems`` unless null)."""
    if isinstance(data, dict):
        return data
    if data is not None and problems is not None:
        problems.append(f"{where.rstrip('.') or 'the record'}: {_kind(data)}, not an object")
    return {}


def _read(cls: Any, data: dict[str, Any], problems: Problems, where: str = "") -> Any:
    """A dataclass of this module from the keys of ``data`` that are its fields (a record of another
    version may have more), each checked against the field's type; a field without a default that is
    missing or unusable makes the whole object unusable (_Bad)."""
    hints = _hints(cls)
    kw: dict[str, Any] = {}
    for f in fields(cls):
        required = f.default is MISSING and f.default_factory is MISSING
        if f.name not in data:
            if required:
                raise _Bad(f"{where}{f.name}: missing")
            continue
        try:
            kw[f.name] = _as(hints[f.name], data[f.name], f"{where}{f.name}")
        except _Bad as err:
            if required:
                raise
            if problems is not None:
                problems.append(str(err))
    return cls(**kw)


def _part(cls: type[T], data: Any, problems: Problems, where: str) -> T:
    """A part of the report from a JSON value of any kind (a non-object reads as empty)."""
    got: T = _read(cls, _obj(data, problems, where), problems, where)
    return got


def _items(tp: Any, value: Any, problems: Problems, where: str, kind: type = dict) -> Any:
    """A JSON object (``kind`` dict) or list read item by item as ``tp``: an unusable item is left
    out, a value of another kind reads as empty (both described in ``problems``)."""
    if not isinstance(value, kind):
        if value is not None and problems is not None:
            problems.append(f"{where}: {_kind(value)}, not {'a list' if kind is list else 'an object'}")
        return kind()
    out: Any = kind()
    container: Any = value
    pairs = container.items() if kind is dict else enumerate(container)
    for k, v in pairs:
        try:
            item = _as(tp, v, f"{where}[{k}]" if kind is list else f"{where}.{k}")
        except _Bad as err:
            if problems is not None:
                problems.append(str(err))
            continue
        if isinstance(out, list):
            out.append(item)
        else:
            out[k] = item
    return out


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
    def from_json(cls, data: Any, problems: Problems = None, where: str = "correctness.") -> Correctness:
        return _part(cls, data, problems, where)


@dataclass
class Nccl:
    version: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # the NCCL_* variables the ranks inherited
    # per world size, NCCL's channels: {"channel", "src_rank", "dst_rank", "transport"[, "direction"]}
    transports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, problems: Problems = None, where: str = "nccl.") -> Nccl:
        return _part(cls, data, problems, where)


@dataclass
class Load:
    """What was seen on the GPUs while the probe ran, by NVML index (as a string, as in JSON)."""

    pcie_max_generation_under_load: dict[str, int] = field(default_factory=dict)
    clock_events: dict[str, list[str]] = field(default_factory=dict)
    other_processes: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any, problems: Problems = None, where: str = "load.") -> Load:
        return _part(cls, data, problems, where)


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
    def from_json(cls, data: Any, problems: Problems = None, where: str = "") -> Scaling:
        return _part(cls, data, problems, where)


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
    def from_json(cls, data: Any, problems: Problems = None, where: str = "diagnosis.") -> Diagnosis:
        data = _obj(data, problems, where)
        return cls(_field(list[str], data, "sentences", [], problems, where),
                   _items(Verdict, data.get("verdicts"), problems, f"{where}verdicts"),
                   _items(Scaling, data.get("details"), problems, f"{where}details"),
                   _items(LinkJudgement, data.get("links"), problems, f"{where}links", list),
                   _items(Seed, data.get("seeds"), problems, f"{where}seeds"))


@dataclass
class Placement:
    """Where one rank of a torchrun probe ran: its node (torchrun's ``GROUP_RANK``), that node's host
    name and the GPU it held (None on a CPU rank)."""

    rank: int
    node: int
    host: str
    gpu_uuid: str | None = None


def by_node(placement: list[Placement]) -> list[tuple[int, str, list[Placement]]]:
    """(node, host, its ranks) in node order: which node's GPUs ran which ranks."""
    nodes: dict[int, list[Placement]] = {}
    for p in sorted(placement, key=lambda p: (p.node, p.rank)):
        nodes.setdefault(p.node, []).append(p)
    return [(n, ps[0].host, ps) for n, ps in nodes.items()]


# The report's keys in the order the runner writes them; ``None`` in an optional one means absent.
_KEYS = ("device", "quick", "world_sizes", "suites", "ddp", "allreduce", "pipeline", "p2p", "ranks", "nccl",
         "torch", "dtype", "gpu_name", "teardown_killed", "failures", "correctness", "workload", "version", "host",
         "started_at", "finished_at", "gpus", "nodes", "torchrun", "placement", "busy_at_start", "cpu_affinity", "nvml",
         "note", "diagnosis", "load", "ok", "regressions")


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
    failures: list[str] | None = None  # launches that failed or timed out: what and why (their figures kept)
    correctness: Correctness = field(default_factory=Correctness)
    workload: dict[str, Any] = field(default_factory=dict)  # gpud.probe.history.workload: what is compared
    version: int | None = None
    host: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    gpus: int = 0
    nodes: int | None = None  # torchrun only
    torchrun: bool | None = None  # torchrun only
    placement: list[Placement] | None = None  # torchrun only: each rank's node, host and GPU
    busy_at_start: list[str] | None = None
    cpu_affinity: list[list[int]] | None = None  # per rank
    nvml: str | None = None  # why NVML was not used
    note: str | None = None  # a CPU run's caveat, or what MIG mode left out
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
            elif k == "placement":
                v = [asdict(p) for p in v] if v is not None else None
            elif k in ("torch", "dtype"):
                out[k] = v  # always written (null when no launch said)
                continue
            if v is not None:
                out[k] = v
        return out | self.extra

    @classmethod
    def from_json(cls, data: Any, problems: Problems = None) -> ProbeReport:
        """The report a record holds. Never raises: a record that is not an object reads as an empty
        report, a value of the wrong type as if it were absent; both are described in ``problems``
        (one line each, naming the key) when a list is given."""
        data = _obj(data, problems, "")
        if (load := data.get("load")) is not None:
            _obj(load, problems, "load.")  # not an object: as if absent (a torchrun report has none)
        hints = _hints(cls)
        kw: dict[str, Any] = {}
        for f in fields(cls):
            k = f.name
            if k in ("extra", "nccl", "correctness", "diagnosis", "load") or data.get(k) is None:
                continue  # null: as if absent (torch and dtype are written as null)
            if k in ("ddp", "allreduce", "pipeline"):
                inner = "by_stages" if k == "pipeline" else "by_world_size"
                outer = _obj(data[k], problems, f"{k}.")
                if outer.get(inner) is not None:
                    kw[k] = _items(Figures, outer[inner], problems, f"{k}.{inner}")
            elif k == "p2p":
                p2p = _obj(data[k], problems, "p2p.")
                pairs = _field(list[Figures], p2p, "pairs", None, problems, "p2p.")
                if p2p and (pairs is not None or "pairs" not in p2p):
                    kw[k] = p2p
            elif k == "device":
                kw[k] = "cuda" if data[k] == "cuda" else "cpu"
            else:
                v = _field(hints[k], data, k, MISSING, problems, "")
                if v is not MISSING:
                    kw[k] = v
        return cls(**kw, nccl=Nccl.from_json(data.get("nccl"), problems),
                   correctness=Correctness.from_json(data.get("correctness"), problems),
                   diagnosis=Diagnosis.from_json(data.get("diagnosis"), problems),
                   load=Load.from_json(load, problems) if isinstance(load, dict) else None,
                   extra={k: v for k, v in data.items() if k not in _KEYS})
