"""The JSON schema every ``--json`` output and the daemon's ``/status`` follow (docs/json.md).

A JSON Schema (draft 2020-12 subset) as data, and a small validator for that subset — ``type``,
``enum``, ``const``, ``properties``, ``required``, ``additionalProperties``, ``items``, ``$ref`` —
so that the tests need no extra package. Bump ``SCHEMA_VERSION`` (gpud.model) when a field changes
meaning or shape; adding a field does not.
"""

from __future__ import annotations

from typing import Any

from gpud.model import CLOCK_EVENT_REASONS, SCHEMA_VERSION, STATUSES

Schema = dict[str, Any]


def _n(*types: str) -> Schema:
    """These JSON types, or null."""
    return {"type": [*types, "null"]}


INT, NUM, STR, BOOL = _n("integer"), _n("number"), _n("string"), _n("boolean")
INTS = {"type": ["array", "null"], "items": {"type": "integer"}}
CLOCKS = {"type": "object", "additionalProperties": INT}


def _obj(props: dict[str, Schema], nullable: bool = False, extra: bool = False) -> Schema:
    return {"type": ["object", "null"] if nullable else "object", "properties": props, "required": list(props),
            "additionalProperties": extra}


HOST = _obj({"name": STR, "driver_version": STR, "cuda_driver_version": STR, "nvml_version": STR,
             "gpu_count": INT, "cpu": STR, "sockets": INT, "memory_bytes": INT})

GPU_INFO = _obj({
    "index": {"type": "integer"}, "uuid": {"type": "string"}, "name": {"type": "string"}, "serial": STR,
    "pci_bus_id": {"type": "string"}, "pci_device_id": INT, "architecture": STR, "vbios_version": STR,
    "memory_total_bytes": INT, "pcie_max_generation": INT, "pcie_max_width": INT,
    "power_default_limit_watts": NUM, "power_min_limit_watts": NUM, "power_max_limit_watts": NUM,
    "temperature_slowdown_celsius": INT, "temperature_shutdown_celsius": INT, "max_clocks_mhz": CLOCKS,
    "fan_count": INT, "fan_min_speed_percent": INT, "fan_max_speed_percent": INT,
    "nvlink_count": {"type": "integer"}, "numa_node": INT, "cpu_affinity": INTS,
    "pcie_gpu_max_generation": INT, "temperature_max_operating_celsius": INT,
    "temperature_target_celsius": INT, "default_applications_clocks_mhz": CLOCKS, "open_seconds": NUM,
    # domain (graphics, memory) → [min, max] MHz of the clock offsets the driver allows
    "clock_offset_ranges_mhz": {"type": "object", "additionalProperties": {
        "type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}},
}, nullable=True)

FAN = _obj({"fan": {"type": "integer"}, "speed_percent": INT, "target_percent": INT,
            "policy": {"enum": ["auto", "manual", None]}})
NVLINK = _obj({"link": {"type": "integer"}, "up": {"type": "boolean"}, "remote_pci_bus_id": STR,
               "sli_bridge": BOOL, "remote_is_switch": BOOL})
PROCESS = _obj({"pid": {"type": "integer"}, "used_memory_bytes": INT, "user": STR, "command": STR,
                "kind": {"enum": ["compute", "graphics", "compute+graphics"]}, "container": STR,
                "sm_utilization_percent": INT, "gpu_instance_id": INT, "compute_instance_id": INT})
# A MIG device of a MIG-enabled GPU: its ids, profile, memory and its own processes
MIG_INSTANCE = _obj({"index": {"type": "integer"}, "uuid": {"type": "string"}, "gpu_instance_id": INT,
                     "compute_instance_id": INT, "profile": STR, "memory_total_bytes": INT, "memory_used_bytes": INT,
                     "memory_reserved_bytes": INT, "memory_free_bytes": INT,
                     "processes": {"type": ["array", "null"], "items": PROCESS}})
# NVLink error counters read every 10 s: [link, counter name, count]
NVLINK_ERRORS = {"type": ["array", "null"],
                 "items": {"type": "array", "items": {"type": ["integer", "string"]}}}
# NVLink data counters read every 10 s: [link, "tx" | "rx", bytes since the driver loaded]
NVLINK_DATA = NVLINK_ERRORS
# NVML's violation counters read every 10 s: clock-event reason → ns since the driver loaded
VIOLATIONS = {"type": ["object", "null"], "additionalProperties": {"type": "integer"}}
ECC = _obj({"volatile_corrected": INT, "volatile_uncorrected": INT, "aggregate_corrected": INT,
            "aggregate_uncorrected": INT}, nullable=True)

GPU_SAMPLE = _obj({
    "index": {"type": "integer"}, "uuid": {"type": "string"}, "timestamp": {"type": "number"},
    "lost": {"type": "boolean"}, "error": STR, "inaccessible": {"type": "boolean"},
    "cause": {"enum": [None, "insufficient_power", "irq_issue"]},
    "temperature_celsius": INT, "fans": {"type": "array", "items": FAN},
    "power_watts": NUM, "power_limit_watts": NUM, "power_management_limit_watts": NUM, "energy_joules": NUM,
    "clocks_mhz": CLOCKS, "applications_clocks_mhz": CLOCKS,
    "utilization_gpu_percent": INT, "utilization_memory_percent": INT,
    "memory_used_bytes": INT, "memory_total_bytes": INT,
    "memory_reserved_bytes": INT, "memory_free_bytes": INT, "pcie_generation": INT, "pcie_width": INT,
    "pcie_tx_bytes_per_second": INT, "pcie_rx_bytes_per_second": INT, "pcie_replay_errors": INT,
    "clock_event_mask": INT,
    "clock_events": {"type": ["array", "null"], "items": {"enum": [n for _, n in CLOCK_EVENT_REASONS]}},
    "persistence_mode": BOOL, "compute_mode": {"enum": ["default", "exclusive_process", "prohibited", None]},
    "mig_mode": BOOL, "mig_instances": {"type": ["array", "null"], "items": MIG_INSTANCE},
    "ecc_enabled": BOOL, "ecc_pending": BOOL, "ecc_errors": ECC,
    "retired_pages_single_bit": INT, "retired_pages_double_bit": INT, "retired_pages_pending": BOOL,
    "remapped_rows_correctable": INT, "remapped_rows_uncorrectable": INT, "remapped_rows_pending": BOOL,
    "remapped_rows_failure": BOOL, "nvlinks": {"type": "array", "items": NVLINK},
    "processes": {"type": ["array", "null"], "items": PROCESS}, "ecc_enabled_after_reboot": BOOL,
    "nvlink_errors": NVLINK_ERRORS, "nvlink_data_bytes": NVLINK_DATA, "clock_event_nanoseconds": VIOLATIONS,
    "clock_offsets_mhz": CLOCKS,
})

GPU = _obj({"info": GPU_INFO, "sample": GPU_SAMPLE})
CHECK = _obj({"id": {"type": "string"}, "status": {"enum": list(STATUSES)}, "gpu": INT,
              "summary": {"type": "string"}, "detail": {"type": "string"}, "remedy": {"type": "string"}})
MATRIX = {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}

ENVELOPE: dict[str, Schema] = {"schema_version": {"const": SCHEMA_VERSION}, "kind": {"type": "string"},
                               "gpud_version": {"type": "string"}, "host": HOST}


def _document(kind: str, body: dict[str, Schema], extra: bool = False) -> Schema:
    return _obj({**ENVELOPE, "kind": {"const": kind}, **body}, extra=extra)


PROBE = _document("probe", {
    "ok": {"type": "boolean"}, "device": {"enum": ["cuda", "cpu"]}, "quick": {"type": "boolean"},
    "world_sizes": {"type": "array", "items": {"type": "integer"}}, "suites": {"type": "array"},
    "gpu_count": {"type": "integer"}, "torch": STR, "dtype": STR, "started_at": {"type": "number"},
    "finished_at": {"type": "number"}, "ddp": {"type": "object"}, "allreduce": {"type": "object"},
    "pipeline": {"type": "object"}, "p2p": {"type": "object"}, "correctness": {"type": "object"},
    "diagnosis": {"type": "object"}, "regressions": {"type": "array", "items": {"type": "string"}},
    "cpu_affinity_by_rank": {"type": "array", "items": INTS}, "busy_at_start": {"type": "array"},
}, extra=True)  # measurement details (docs/probe.md) may grow without a schema change

STRS_EARLY: Schema = {"type": "array", "items": {"type": "string"}}
BURNIN_VERDICT = _obj({"test": {"type": "string"}, "gpu": INT, "status": {"enum": list(STATUSES)},
                       "summary": {"type": "string"}, "figure": NUM, "threshold": NUM, "source": {"type": "string"},
                       "remedy": {"type": "string"}})
BURNIN = _document("burnin", {
    "level": {"enum": ["quick", "standard", "soak"]}, "device": {"enum": ["cuda", "cpu"]},
    "figures": {"enum": ["gpu", "cpu"]}, "simulated_time": {"type": "boolean"}, "started": {"type": "number"},
    "seconds": {"type": "number"}, "wall_seconds": {"type": "number"}, "interrupted": {"type": "boolean"},
    "status": {"enum": ["pass", "warn", "fail"]}, "exit_code": {"enum": [0, 1]},
    "gpus": {"type": "array", "items": _obj({"index": {"type": "integer"}, "name": STR, "uuid": STR,
                                             "status": {"enum": list(STATUSES)}, "limits": {"type": "object"},
                                             "workload": {"type": "object"}})},
    "verdicts": {"type": "array", "items": BURNIN_VERDICT},
    "not_judged": STRS_EARLY,
    "telemetry": {"type": ["object", "null"]}, "checks": {"type": ["object", "null"]},
})
ANY: Schema = {}
STRS = {"type": "array", "items": {"type": "string"}}
# Per GPU index (a string): profile keys of the settings (power_limit W, gpu_clocks [min, max] MHz or "reset").
TUNE_SETTINGS = {"type": "object", "additionalProperties": {"type": "object"}}
TUNE_POINT = _obj({"trial": {"type": "integer"}, "samples_per_second": NUM, "joules_per_sample": NUM,
                   "power_watts": NUM, "settings": TUNE_SETTINGS}, nullable=True)
PER_GPU_NUM = {"type": "object", "additionalProperties": {"type": "number"}}
TUNE_TRIAL = _obj({
    "number": {"type": "integer"},
    "stage": {"enum": ["baseline", "pergpu", "power", "clocks", "match", "memclocks", "fans", "confirm"]},
    "settings": TUNE_SETTINGS, "status": {"enum": ["ok", "throttled", "xid", "failed"]}, "note": {"type": "string"},
    "samples_per_second": NUM, "ci_percent": NUM, "ci_reached": {"type": "boolean"}, "joules_per_sample": NUM,
    "joules_ci_percent": NUM, "baseline_trial": INT, "settle_seconds": NUM,
    "power_watts": NUM, "windows": {"type": "integer"}, "sm_mhz": PER_GPU_NUM, "temperature_c": PER_GPU_NUM,
    "fan_percent": PER_GPU_NUM, "waiting_percent": PER_GPU_NUM,
    "reasons": {"type": "array", "items": {"enum": [n for _, n in CLOCK_EVENT_REASONS]}},
    "soak_seconds": NUM, "settled": {"type": ["boolean", "null"]}, "frontier": {"type": "boolean"}})
TUNE = _document("tune", {
    "goal": {"enum": ["throughput", "energy", "quiet"]}, "max_slowdown_percent": {"type": "number"},
    "knobs": STRS, "gpus": {"type": "array", "items": {"type": "integer"}}, "gpu_names": STRS,
    "workload": {"type": "string"}, "unit": {"enum": ["samples", "runs"]}, "figures": {"enum": ["gpu", "model", "cpu"]},
    "figures_note": {"type": "string"}, "baseline": TUNE_POINT, "chosen": TUNE_POINT,
    "energy_saving_percent": NUM, "slowdown_percent": NUM, "energy_saving_ci_percent": NUM,
    "slowdown_ci_percent": NUM, "confirmed": {"type": ["boolean", "null"]}, "gain_excludes_zero": {"type": "boolean"},
    "trials": {"type": "array", "items": TUNE_TRIAL},
    "trial_count": {"type": "integer"}, "search_trials": {"type": "integer"},
    "linear_sweep_trials": {"type": "integer"},
    "confidence": _obj({"level_percent": {"type": "number"}, "bound_percent": {"type": "number"},
                        "reached": {"type": "boolean"}}),
    "restored": STRS, "interrupted": {"type": "boolean"}, "notes": STRS, "profile": STR, "applied": {"type": "boolean"},
})
PLAN_ROW = _obj({"gpu": INT, "setting": {"type": "string"}, "current": ANY, "desired": ANY,
                 "action": {"enum": ["change", "ok", "skip", "daemon"]}, "note": STR})
PS_ROW = _obj({"gpu": {"type": "integer"}, "uuid": STR, "pid": {"type": "integer"}, "user": STR,
               "kind": {"enum": ["compute", "graphics", "compute+graphics"]}, "used_memory_bytes": INT,
               "container": STR, "sm_utilization_percent": INT, "gpu_instance_id": INT, "compute_instance_id": INT,
               "mig_uuid": STR, "command": STR})
EVENT = _obj({"id": {"type": "integer"}, "time": {"type": "number"}, "boot_id": STR, "kind": {"type": "string"},
              "gpu": INT, "uuid": STR, "serial": STR, "summary": ANY, "data": ANY})

HEALTH_COMPONENT = _obj({"gpu": INT, "uuid": STR, "component": {"type": "string"},
                         "state": {"enum": ["healthy", "degraded", "unhealthy", "unknown"]},
                         "reason": {"type": "string"},
                         "action": {"enum": ["none", "check the application", "reset the GPU", "reboot",
                                             "inspect the hardware"]},
                         "remedy": {"type": "string"}, "acknowledged": STR})
HEALTH_PART = _obj({"state": {"enum": ["healthy", "degraded", "unhealthy", "unknown"]},
                    "components": {"type": "array", "items": HEALTH_COMPONENT}})


def _some(kind: str, required: dict[str, Schema], optional: dict[str, Schema]) -> Schema:
    """A document whose ``optional`` fields appear in some of its forms (an apply refused before planning)."""
    doc = _document(kind, {**required, **optional}, extra=True)
    doc["required"] = [k for k in doc["required"] if k not in optional]
    return doc


# each GPU's active profile and the rule that switched it (null: the base profile), from the state file
ACTIVE_PROFILES = {"type": "array", "items": _obj({"gpu": {"type": "integer"}, "profile": {"type": "string"},
                                                   "rule": STR})}

SCHEMAS: dict[str, Schema] = {
    "status": _document("status", {"timestamp": {"type": "number"}, "gpus": {"type": "array", "items": GPU},
                                   "profiles": ACTIVE_PROFILES}),
    "topo": _document("topo", {
        "gpus": {"type": "array", "items": _obj({
            "index": {"type": "integer"}, "uuid": STR, "name": STR, "pci_bus_id": STR, "lost": {"type": "boolean"},
            "numa_node": INT, "cpu_affinity": INTS, "pcie_generation": INT, "pcie_width": INT,
            "pcie_max_generation": INT, "pcie_max_width": INT, "nvlinks_up": {"type": "integer"},
            "nvlink_count": INT})},
        "matrix": MATRIX, "pcie_level": MATRIX,
        "nvlinks": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "p2p": _obj({"read": MATRIX, "write": MATRIX, "nvlink": MATRIX}),
    }),
    "doctor": _document("doctor", {
        "checks": {"type": "array", "items": CHECK},
        "counts": _obj({s: {"type": "integer"} for s in STATUSES}),
        "exit_code": {"enum": [0, 1]},
    }),
    "probe": PROBE,
    "burnin": BURNIN,
    "tune": TUNE,
    "daemon_status": _document("daemon_status", {
        "uptime_seconds": {"type": "number"}, "ticks": {"type": "integer"}, "last_tick": NUM,
        "profile": STR, "timestamp": NUM, "gpus": {"type": "array", "items": GPU},
        "checks": {"type": "array", "items": CHECK},
        "drift": {"type": "array", "items": _obj({"gpu": INT, "setting": {"type": "string"},
                                                  "drift": {"type": "boolean"}})},
        "reapply_total": {"type": "integer"}, "fan_failsafe_total": {"type": "integer"},
        "probe": {"anyOf": [PROBE, {"type": "null"}]}, "probe_running": {"type": "boolean"},
        "tick": {"type": "object"}, "health": HEALTH_PART, "profiles": ACTIVE_PROFILES,
    }, extra=True),  # the control socket's status adds "ok"
    "ps": _document("ps", {"processes": {"type": "array", "items": PS_ROW},
                           "unreadable_gpus": {"type": "array", "items": {"type": "integer"}}}),
    "select": _document("select", {"cuda_visible_devices": STR, "gpus": {"type": "array", "items": {"type": "integer"}},
                                   "uuids": STRS, "mig_instances": STRS, "reason": {"type": "string"}}),
    "apply": _some("apply", {"ok": {"type": "boolean"}}, {
        "profile": STR, "chain": STRS, "source": STR, "dry_run": {"type": "boolean"}, "daemon": {"type": "boolean"},
        "target": STR, "plan": {"type": "array", "items": PLAN_ROW}, "skipped": {"type": "array", "items": PLAN_ROW},
        "applied": {"type": "boolean"}, "error": STR, "rolled_back": STRS, "not_restored": STRS,
        "written": {"type": "integer"}, "messages": STRS}),
    "verify": _document("verify", {"profile": STR, "drift": {"type": "integer"}, "unverifiable": {"type": "integer"},
                                    "settings": {
        "type": "array", "items": {
            "type": "object", "properties": {"gpu": INT, "setting": {"type": "string"}, "status": {"type": "string"}},
            "required": ["gpu", "setting", "current", "desired", "status"]}}}),
    "restore": _document("restore", {"restored": STRS, "failed": STRS, "target": STR}),
    "rules_test": _document("rules_test", {
        "base": STR, "rules": STRS,
        "gpus": {"type": "array", "items": _obj({"gpu": {"type": "integer"}, "profile": STR, "rule": STR, "pid": INT,
                                                 "lost": {"type": "array", "items": _obj({
                                                     "rule": {"type": "string"}, "profile": {"type": "string"},
                                                     "pid": {"type": "integer"}})}})},
        "processes": {"type": "array", "items": _obj({
            "gpu": {"type": "integer"}, "pid": {"type": "integer"}, "user": STR, "groups": STRS, "command": STR,
            "container": STR, "kind": {"type": "string"}, "rules": STRS})}}),
    "profile_list": _document("profile_list", {"profiles": {"type": "array", "items": _obj({
        "name": {"type": "string"}, "path": {"type": "string"}, "description": {"type": "string"}})}}),
    "profile": _document("profile", {"name": {"type": "string"}, "source": STR, "chain": STRS, "description": STR,
                                     "all": {"type": "object"}, "gpus": {"type": "array"},
                                     "host_settings": {"type": "object"}, "resolved": {"type": "object"}}),
    "sim_list": _document("sim_list", {"machines": {"type": "array", "items": _obj({
        "name": {"type": "string"}, "gpus": {"type": "integer"}, "summary": {"type": "string"}})}}),
    "events": _document("events", {"events": {"type": "array", "items": EVENT}}),
    "health": _some("health", {"state": {"enum": ["healthy", "degraded", "unhealthy", "unknown"]},
                               "components": {"type": "array", "items": HEALTH_COMPONENT},
                               "exit_code": {"enum": [0, 1]}},
                    {"set_healthy": _obj({"gpu": {"type": "integer"}, "uuid": {"type": "string"},
                                          "via": {"enum": ["daemon", "journal"]}, "summary": {"type": "string"}})}),
    "daemon_reply": _some("daemon_reply", {"request": {"type": "string"}, "ok": {"type": "boolean"}},
                          {"message": STR, "error": STR, "remedy": STR}),
    "dossier": _document("dossier", {
        "gpu": {"type": "object"}, "boots_with_events": {"type": "integer"}, "xids": {"type": "array"},
        "ecc": {"type": "array"}, "lost": {"type": "array"}, "probe": {"type": "array"},
        "repeated_hardware_xids": {"type": "array"}, "verdict": {"type": "string"}}, extra=True),
}

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, t: str) -> bool:
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[t])


def validate(value: Any, schema: Schema, where: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``path: reason`` lines (empty: it conforms)."""
    errs: list[str] = []
    if "anyOf" in schema:
        tries = [validate(value, s, where) for s in schema["anyOf"]]
        if all(tries):
            errs.append(f"{where}: matches none of the allowed shapes ({tries[0][0]})")
        return errs
    if "const" in schema and value != schema["const"]:
        return [f"{where}: {value!r} is not {schema['const']!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} is not one of {schema['enum']}"]
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_is(value, t) for t in types):
            return [f"{where}: {type(value).__name__} where {'/'.join(types)} was expected"]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errs += [f"{where}: {k!r} missing" for k in schema.get("required", []) if k not in value]
        extra = schema.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                errs += validate(v, props[k], f"{where}.{k}")
            elif extra is False:
                errs.append(f"{where}: {k!r} is not in the schema")
            elif isinstance(extra, dict):
                errs += validate(v, extra, f"{where}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errs += validate(v, schema["items"], f"{where}[{i}]")
    return errs


def check(document: Any) -> list[str]:
    """Validate a document against the schema its ``kind`` names."""
    kind = document.get("kind") if isinstance(document, dict) else None
    if kind not in SCHEMAS:
        return [f"$.kind: {kind!r} is not one of {sorted(SCHEMAS)}"]
    return validate(document, SCHEMAS[kind])
