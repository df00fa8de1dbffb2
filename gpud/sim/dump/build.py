"""From a parsed dump (and ``topo -m``) to a description: what each key is set from, and what was
inferred because the dump does not say it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from gpud.errors import InvalidInput
from gpud.sim.description import parse
from gpud.sim.dump.fields import Reader
from gpud.sim.dump.mig import instances, process_instances
from gpud.sim.dump.notes import Notes
from gpud.sim.dump.place import Placement, place
from gpud.sim.dump.read import Dump, GpuDump, fail
from gpud.sim.dump.topo import Topo
from gpud.sim.presets import GPU_MODELS, Preset

ARCHITECTURES = ("kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
# A model the presets do not know starts from the preset of its architecture (or the nearest
# one), and every model key the dump gives replaces the preset's value.
BASE_BY_ARCH = {"turing": "Quadro RTX 8000", "ampere": "RTX A6000", "ada": "RTX 6000 Ada", "hopper": "H200"}
COMPUTE_MODES = {"default": "default", "exclusive_process": "exclusive_process", "prohibited": "prohibited",
                 "exclusive process": "exclusive_process"}


@dataclass
class Twin:
    data: dict[str, Any]  # the description, as TOML tables
    notes: Notes
    dump: Dump
    topo: Topo | None


def architecture(text: str | None) -> str | None:
    if not text:
        return None
    low = text.strip().lower().split()[0]
    return low if low in ARCHITECTURES else None


def match_preset(name: str) -> str | None:
    """The preset whose NVML name is the dump's Product Name (with or without "NVIDIA ")."""
    bare = name.strip().removeprefix("NVIDIA ").lower()
    for key, preset in GPU_MODELS.items():
        if bare in (key.lower(), str(preset.name).removeprefix("NVIDIA ").lower()):
            return key
    return None


def base_preset(arch: str | None, passive: bool) -> str:
    if arch in BASE_BY_ARCH:
        return BASE_BY_ARCH[arch]
    order = ARCHITECTURES.index(arch) if arch else ARCHITECTURES.index("ampere")
    if order > ARCHITECTURES.index("hopper") or passive:
        return "H200" if passive else "RTX 6000 Ada"
    return "Quadro RTX 8000" if order < ARCHITECTURES.index("ampere") else "RTX A6000"


def build(dump: Dump, topo: Topo | None, name: str) -> Twin:
    notes = Notes()
    readers = [Reader(g, dump.file) for g in dump.gpus]
    _check_complete(dump)
    _check_bus_ids(dump)
    n = len(readers)
    if topo is not None and topo.n != n:
        raise fail(topo.file, topo.line.get(0, 1),
                   f"{topo.n} GPUs in topo -m but {n} in {dump.file}: not the same machine")
    placement = place([_bus(g.bus_id, dump.file, g.line) for g in dump.gpus], topo, notes)
    gpus = [_gpu(i, r, placement, notes) for i, r in enumerate(readers)]
    machine = _machine(dump, name, gpus, placement, notes)
    data: dict[str, Any] = {"machine": machine, "gpu": gpus}
    if placement.bridges:
        data["nvlink"] = [{"gpus": [a, b], "links": k} for a, b, k in placement.bridges]
    faults = [f for g in gpus for f in g.pop("_faults")]
    if faults:
        data["fault"] = faults
    _raise_nvlinks(data, placement, notes)
    if topo is None:
        for i, g in enumerate(gpus):
            if g.get("nvlinks", GPU_MODELS[g["model"]].nvlinks):
                notes.gpu(i, "nvlinks", "`nvidia-smi -q` does not show NVLinks and no topo -m was given: "
                                        "the model's links, none bridged")
    if dump.attached and dump.attached.value.isdigit() and int(dump.attached.value) > n:
        notes.unread.append(f"the dump shows {n} of {dump.attached.value} attached GPUs (nvidia-smi -i?): "
                            f"the twin has {n}")
    return Twin(data, notes, dump, topo)


def _bus(bus: str, file: str, line: int) -> str:
    dom, rest = bus.split(":", 1)
    if int(dom, 16) > 0xFFFF:
        raise fail(file, line, f"PCI domain {dom} does not fit in 4 hex digits")
    return f"{int(dom, 16):04x}:{rest.lower()}"


def _check_bus_ids(dump: Dump) -> None:
    first: dict[str, int] = {}
    for g in dump.gpus:
        key = _bus(g.bus_id, dump.file, g.line)
        if key in first:
            raise fail(dump.file, g.line, f"GPU {g.bus_id} appears twice (first at line {first[key]}): "
                                          "two GPUs cannot share a bus id")
        first[key] = g.line


def _check_complete(dump: Dump) -> None:
    """A dump cut off inside its last GPU: that GPU lacks sections the one before it has."""
    for g in dump.gpus:
        if not any(e.path in ("product name", "product_name") for e in g.entries):
            raise fail(dump.file, g.line, f"GPU {g.bus_id} has no Product Name: a truncated or filtered dump "
                                          "(give the whole `nvidia-smi -q`)")
    if len(dump.gpus) < 2:
        return
    last, before = dump.gpus[-1], dump.gpus[-2]
    have = {e.path.split("/")[0] for e in last.entries}
    sections = [e for e in before.entries if "/" not in e.path]
    lacking = [e for e in sections if e.path not in have]
    # the same model prints the same sections; cut off, the last GPU lacks at least the final one
    if lacking and _product(last) == _product(before) and sections[-1] in lacking:
        end = last.entries[-1].line if last.entries else last.line
        raise fail(dump.file, end, f"the dump ends inside GPU {last.bus_id}: it lacks '{lacking[0].path}' and "
                                   f"{len(lacking) - 1} more section(s) the GPU before it has (truncated?)")


def _product(g: GpuDump) -> str:
    e = g.find("product name") or g.find("product_name")
    return e.value if e else ""


def _gpu(i: int, r: Reader, placement: Placement, notes: Notes) -> dict[str, Any]:
    product = r.text("name") or ""
    arch = architecture(r.text("architecture"))
    fan = r.integer("fan", "%")
    model = match_preset(product)
    generic = model is None
    if model is None:
        model = base_preset(arch, passive=fan is None)
        notes.not_shown(i, f"no preset for {product!r}: a generic model from the dump's numbers, "
                            f"the rest from the {model} preset")
    preset = GPU_MODELS[model]
    g: dict[str, Any] = {"model": model, **placement.gpu(i)}
    own: dict[str, Any] = {}  # model keys the dump gives

    def model_key(key: str, value: Any, why: str) -> None:
        if value is None:
            notes.gpu(i, key, f"{why} ({model} preset)" if not generic else f"{why} (from the {model} preset)")
        else:
            own[key] = value

    if generic:
        own["name"] = product
        model_key("architecture", arch, "the dump has no Product Architecture")
    model_key("pci_device_id", r.hex_id("device_id"), "no Device Id")
    model_key("pci_subsystem_id", r.hex_id("subsystem_id"), "no Sub System Id")
    model_key("vbios", r.text("vbios"), "no VBIOS Version")
    _memory(i, r, g, own, preset, generic, notes)
    for key, src in (("power_default_watts", "power_default"), ("power_min_watts", "power_min"),
                     ("power_max_watts", "power_max")):
        model_key(key, r.number(src, "W") or None, f"no {src.replace('_', ' ')} limit")  # 0: a vGPU's N/A
    for key, src in (("max_graphics_mhz", "max_graphics"), ("max_sm_mhz", "max_sm"),
                     ("max_memory_mhz", "max_memory"), ("default_app_graphics_mhz", "default_app_graphics"),
                     ("default_app_memory_mhz", "default_app_memory")):
        model_key(key, r.integer(src, "MHz") or None, f"{src.replace('_', ' ')} clock not in the dump")
    _thresholds(i, r, own, preset, model, notes)
    if r.integer("violation_power", "us") is not None:  # the dump shows NVML's violation counters
        own["violation_counters"] = True
    _pcie(i, r, g, own, preset, generic, notes)
    if fan is None:
        own["fans"] = 0
    else:
        own["fans"] = max(1, int(preset.fans or 0))
        g["fan_percent"] = fan  # what the driver's policy shows at this temperature (0 % on zero-RPM fans)
        if not preset.fans:
            own.update(fan_min_percent=min(fan, 30), fan_max_percent=100)
            notes.gpu(i, "fan_min_percent", "nvidia-smi does not print the fan range (assumed)")
        else:
            notes.gpu(i, "fan_min_percent", f"nvidia-smi does not print the fan range ({model} preset)")
    mig = r.flag("mig_mode", ("enabled",), ("disabled",))
    if mig is not None:
        g["mig_mode"] = mig
    _state(i, r, g, own, preset, notes)
    if mig:
        _mig(i, r, g, notes)
    _not_supported(i, r, g, notes)
    g.update(_changed(own, preset))
    return g


# Readings the dump prints as N/A (or 0, as vGPU guests do for limits and max clocks): the twin's NVML
# answers Not Supported for them, rather than a preset's value the GPU never showed.
NOT_SUPPORTED_CALLS = {
    "power_default": ("nvmlDeviceGetPowerManagementDefaultLimit",),
    "power_max": ("nvmlDeviceGetPowerManagementLimitConstraints",),
    "power_limit": ("nvmlDeviceGetPowerManagementLimit", "nvmlDeviceGetEnforcedPowerLimit"),
    "power_draw": ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption"),
    "shutdown": ("nvmlDeviceGetTemperatureThreshold",),
    "max_graphics": ("nvmlDeviceGetMaxClockInfo",),
    "utilization": ("nvmlDeviceGetUtilizationRates",),
}
_UNITS = {"max_graphics": "MHz", "shutdown": "C", "utilization": "%"}


def _mig(i: int, r: Reader, g: dict[str, Any], notes: Notes) -> None:
    """A MIG-enabled GPU's MIG devices (ids, memory, SMs) and the instance each process runs in, as the
    dump's ``MIG Device`` sections and process table show them; an instance's Used beyond its processes'
    memory is kept as its own ``used_mib``."""
    ids = process_instances(r.gpu, r.file)
    procs = g.get("processes", [])
    for p in procs:
        gi, ci = ids.get(int(p["pid"]), (None, None))
        if gi is not None:
            p["gpu_instance_id"], p["compute_instance_id"] = gi, ci or 0
    out = []
    for m in instances(r.gpu, r.file):
        if "memory_mib" not in m:
            raise fail(r.file, m["line"], "MIG device without its memory total (Shared FB Memory Usage, "
                                          "fb_memory_usage)")
        item: dict[str, Any] = {"gpu_instance_id": m["gpu_instance_id"],
                                "compute_instance_id": m.get("compute_instance_id", 0), "memory_mib": m["memory_mib"]}
        theirs = sum(int(p["used_mib"]) for p in procs if (p.get("gpu_instance_id"), p.get("compute_instance_id"))
                     == (item["gpu_instance_id"], item["compute_instance_id"]))
        if m.get("used_mib") is not None:
            item["used_mib"] = max(0, m["used_mib"] - theirs)
        if m.get("reserved_mib"):
            item["reserved_mib"] = m["reserved_mib"]
        if m.get("multiprocessor_count") is not None:
            item["multiprocessor_count"] = m["multiprocessor_count"]
        out.append(item)
    if out:
        g["mig_instances"] = out
        notes.gpu(i, "mig_instances", "MIG profile names and MIG UUIDs are not in `nvidia-smi -q` (no profile; "
                                      "UUIDs derived)")


def _not_supported(i: int, r: Reader, g: dict[str, Any], notes: Notes) -> None:
    faults = g.setdefault("_faults", [])
    for name, calls in NOT_SUPPORTED_CALLS.items():
        printed = r.has_section(name)
        value = r.number(name, _UNITS.get(name, "W"))
        if not printed or value not in (None, 0):
            continue
        if name == "shutdown" and (r.entry("tlimit_shutdown") or r.entry("slowdown")):
            continue  # thresholds given another way
        if name == "power_max" and r.number("power_min", "W") or name == "utilization" and value == 0:
            continue  # (0 % is a reading; a MIG GPU's N/A is the simulator's own answer)
        if name == "utilization" and (r.text("mig_mode") or "").lower() == "enabled":
            continue
        for call in calls:
            faults.append({"kind": "unsupported", "gpu": i, "call": call})
        notes.not_shown(i, f"{name.replace('_', ' ')} {'0' if value == 0 else 'N/A'} in the dump: Not Supported "
                           f"({', '.join(calls)})")


def _changed(own: dict[str, Any], preset: Preset) -> dict[str, Any]:
    """Model keys whose value differs from the preset (the others need not be written)."""
    return {k: v for k, v in own.items() if getattr(preset, k, None) != v}


def _memory(i: int, r: Reader, g: dict[str, Any], own: dict[str, Any], preset: Preset,
            generic: bool, notes: Notes) -> None:
    total = r.integer("memory_total", "MiB")
    ecc = r.flag("ecc_current", ("enabled",), ("disabled",))
    pending = r.flag("ecc_pending", ("enabled",), ("disabled",))
    if ecc is None:
        own["ecc_supported"] = False if generic else preset.ecc_supported
        if not generic:
            notes.gpu(i, "ecc_enabled", "ECC Mode not in the dump (off)")
    else:
        own["ecc_supported"] = True
        g["ecc_enabled"] = ecc
        if pending is not None and pending != ecc:
            g["ecc_pending_enabled"] = pending
    if total is None:
        notes.gpu(i, "memory_mib", "no FB Memory Usage Total (preset)")
        return
    if ecc:
        if generic or preset.memory_ecc_mib is not None or total != preset.memory_mib:
            own["memory_ecc_mib"] = total  # (a preset without it reports memory_mib with ECC on)
        if generic:
            own["memory_mib"] = total
            notes.gpu(i, "memory_mib", "the total with ECC off is not in a dump taken with ECC on (assumed equal)")
        else:
            notes.gpu(i, "memory_mib", "the total with ECC off is not in a dump taken with ECC on (preset)")
    else:
        own["memory_mib"] = total
        if generic:
            own["memory_ecc_mib"] = total
        notes.gpu(i, "memory_ecc_mib", "the total with ECC on is not in a dump taken with ECC off "
                                       + ("(assumed equal)" if generic else "(preset)"))


def _thresholds(i: int, r: Reader, own: dict[str, Any], preset: Preset, model: str,
                notes: Notes) -> None:
    absolute = {k: r.integer(src, "C") for k, src in (("shutdown_celsius", "shutdown"),
                                                      ("slowdown_celsius", "slowdown"),
                                                      ("max_operating_celsius", "max_operating"),
                                                      ("memory_max_celsius", "memory_max"))}
    offsets = {k: r.integer(src, "C") for k, src in (("shutdown_celsius", "tlimit_shutdown"),
                                                     ("slowdown_celsius", "tlimit_slowdown"),
                                                     ("max_operating_celsius", "tlimit_max_operating"))}
    if absolute["shutdown_celsius"] is not None or absolute["slowdown_celsius"] is not None:
        own["tlimit_thresholds"] = False
        for key, value in absolute.items():
            if value is not None:
                own[key] = value
            elif key != "memory_max_celsius":
                notes.gpu(i, key, f"not in the dump ({model} preset)")
        return
    if offsets["shutdown_celsius"] is None and offsets["slowdown_celsius"] is None:
        for key in ("shutdown_celsius", "slowdown_celsius", "max_operating_celsius"):
            notes.gpu(i, key, f"no temperature thresholds in the dump ({model} preset)")
        return
    # Ada, Hopper on drivers >= 550: "GPU Shutdown T.Limit Temp: -7 C" is max operating - shutdown
    own["tlimit_thresholds"] = True
    margin, temp = r.integer("tlimit_margin", "C"), r.integer("temperature", "C")
    if margin is not None and temp is not None:  # "GPU T.Limit Temp" is the margin from the current reading
        tlimit = temp + margin
    else:
        tlimit = preset.max_operating_celsius or (preset.slowdown_celsius - 2)
        notes.gpu(i, "max_operating_celsius", f"the dump gives thresholds only relative to T.Limit and no "
                                              f"current margin; T.Limit {tlimit} C ({model} preset)")
    own["max_operating_celsius"] = tlimit
    if offsets["max_operating_celsius"] not in (None, 0):
        notes.not_shown(i, f"Max Operating T.Limit offset {offsets['max_operating_celsius']} C "
                            "(the simulator's is 0)")
    for key in ("shutdown_celsius", "slowdown_celsius"):
        off = offsets[key]
        if off is None:
            notes.gpu(i, key, f"no T.Limit offset in the dump ({model} preset)")
        else:
            own[key] = tlimit - off


def _pcie(i: int, r: Reader, g: dict[str, Any], own: dict[str, Any], preset: Preset, generic: bool,
          notes: Notes) -> None:
    gen_max, gen_cur = r.integer("gen_max"), r.integer("gen_current")
    dev_max, host_max = r.integer("gen_device_max"), r.integer("gen_host_max")
    width_max, width_cur = r.integer("width_max", "x"), r.integer("width_current", "x")
    busy = (r.integer("utilization", "%") or 0) > 0
    # "Max" is the lower of the GPU's and the slot's; a model without a preset is taken at "Max"
    known_gen = 0 if generic else int(preset.pcie_max_generation)
    own_gen = dev_max or (max(gen_max, known_gen) if gen_max else None)
    if dev_max is None:
        notes.gpu(i, "pcie_max_generation", "no Device Max in the dump: the GPU's own maximum is the larger of "
                                            "Max and the preset's" if not generic else "no Device Max (Max)")
    if own_gen:
        own["pcie_max_generation"] = own_gen
    own_width = max(width_max or 0, 0 if generic and width_max else int(preset.pcie_max_width))
    own["pcie_max_width"] = own_width
    notes.gpu(i, "pcie_max_width", "the GPU's own width is not printed (the larger of Max and the preset's)"
              if not generic else "the GPU's own width is not printed (Max)")
    slot_gen = host_max if host_max is not None else gen_max
    live = max(x for x in (gen_cur, gen_max, 0) if x is not None)
    if host_max is not None and live > host_max:  # a link that runs faster than "Host Max" is not held by it
        notes.not_shown(i, f"Host Max {host_max} below the link's Gen{live}: the host under-reports its port; "
                           f"the twin's slot is Gen{live}")
        slot_gen = live
    if slot_gen is not None and own_gen and slot_gen < own_gen:
        g["slot_generation"] = slot_gen
    elif host_max is None:
        notes.gpu(i, "slot_generation", "no Host Max in the dump (taken as the GPU's)")
    if width_max is not None and width_max < own_width:
        g["slot_width"] = width_max
    faults = g.setdefault("_faults", [])
    trained = min(x for x in (own_gen, slot_gen, gen_max) if x) if own_gen else None
    if width_cur is not None and width_max is not None and width_cur < width_max:
        faults.append({"kind": "link_degraded", "gpu": i, "width": width_cur})
    if gen_cur is not None and trained:
        if not busy:
            own["idle_pcie_generation"] = gen_cur  # an idle GPU's link: Gen1 on workstation cards
        elif gen_cur < trained:
            faults.append({"kind": "link_degraded", "gpu": i, "generation": gen_cur})
            own["idle_pcie_generation"] = preset.idle_pcie_generation
        if busy:
            notes.gpu(i, "idle_pcie_generation", "the GPU was busy: its idle link generation is the preset's")


def _state(i: int, r: Reader, g: dict[str, Any], own: dict[str, Any], preset: Preset,
           notes: Notes) -> None:
    def put(key: str, value: Any, why: str) -> None:
        if value is None:
            notes.gpu(i, key, why)
        else:
            g[key] = value

    uuid, serial = r.text("uuid"), r.text("serial")
    put("uuid", uuid, "no GPU UUID (derived)")
    put("serial", serial, "no Serial Number (derived)")
    temp = r.integer("temperature", "C")
    put("temperature_celsius", temp, "no GPU Current Temp (32 C)")
    util = r.integer("utilization", "%")
    put("utilization_percent", util, "no Utilization (0 %)")
    draw = r.number("power_draw", "W")
    put("power_watts", draw, "no Power Draw (the model's idle power)")
    if draw is not None and not util:
        own["idle_power_watts"] = draw
    limit, requested = r.number("power_limit", "W") or None, r.number("power_requested", "W") or None
    if requested is not None and limit is not None and requested > limit:
        # "Requested 900 W" held at "Current 700 W" (GH200): the module's power budget, not a limit set lower
        g["power_enforced_watts"] = limit
        limit = requested
    put("power_limit_watts", limit, "no Current Power Limit (the default)")
    persistence = r.flag("persistence", ("enabled",), ("disabled",))
    if persistence is None and not r.has_section("persistence"):
        notes.gpu(i, "persistence_mode", "no Persistence Mode in the dump (on)")
    elif persistence is None:
        g["persistence_mode"] = False
        g.setdefault("_faults", []).append({"kind": "unsupported", "gpu": i, "call": "nvmlDeviceGetPersistenceMode"})
        notes.not_shown(i, "Persistence Mode N/A (Windows): the twin's NVML says Not Supported")
    else:
        g["persistence_mode"] = persistence
    mode = r.text("compute_mode")
    if mode is not None:
        key = mode.strip().lower().replace(" ", "_")
        if key == "exclusive_thread":
            key = "exclusive_process"
            notes.not_shown(i, "compute mode Exclusive_Thread (modelled as exclusive_process)")
        if key not in COMPUTE_MODES:
            e = r.entry("compute_mode")
            raise fail(r.file, e.line if e else r.gpu.line, f"compute mode: unknown value {mode!r}")
        g["compute_mode"] = COMPUTE_MODES[key]
    _health(i, r, g, own, preset, notes)
    _clocks(i, r, g, own, util, notes)
    procs = r.processes()
    kept = []
    for p in procs:
        kind = str(p["type"]).replace(" ", "").upper()
        proc: dict[str, Any] = {"pid": p["pid"], "used_mib": p["used_mib"], "command": str(p["name"]) or "python"}
        if "G" in kind:  # "G" graphics, "C+G" in both of NVML's lists
            proc["graphics"] = True
            if "C" in kind:
                proc["compute"] = True
        kept.append(proc)
    if kept:
        g["processes"] = kept
    used = r.integer("memory_used", "MiB")
    if used is not None:
        g["memory_used_mib"] = max(0, used - sum(int(p["used_mib"]) for p in kept))
        if sum(int(p["used_mib"]) for p in kept) > used:  # Windows (WDDM) counts a process's memory otherwise
            notes.not_shown(i, f"the processes use {sum(int(p['used_mib']) for p in kept)} MiB, more than FB Used "
                               f"{used} MiB (WDDM): the twin's Used includes the processes' memory")
    reserved = r.integer("memory_reserved", "MiB")
    if reserved:  # drivers from R510 print the driver's reservation apart from Used (nvmlMemory_v2_t)
        g["memory_reserved_mib"] = reserved
    active, seen = r.reasons()
    if not seen:
        notes.gpu(i, "clock_events", "no Clocks Event Reasons section (derived from the load)")
    extra = [a for a in active if a != "gpu_idle"]
    if extra:
        g.setdefault("_faults", []).append({"kind": "clock_events", "gpu": i, "reasons": extra})
    if seen and ("gpu_idle" in active) != (not util):  # the dump, not the 0 % rule: Idle as it was listed
        g["idle_reason"] = "gpu_idle" in active


def _health(i: int, r: Reader, g: dict[str, Any], own: dict[str, Any], preset: Preset,
            notes: Notes) -> None:
    if g.get("ecc_enabled"):
        for scope in ("volatile", "aggregate"):
            corrected, uncorrected = r.ecc_counts(scope)
            if corrected:
                g[f"ecc_{scope}_corrected"] = corrected
            if uncorrected:
                g[f"ecc_{scope}_uncorrected"] = uncorrected
    sbe, dbe = r.integer("retired_sbe"), r.integer("retired_dbe")
    pending = r.flag("retired_pending", ("yes",), ("no",))
    own["retired_pages_supported"] = sbe is not None or dbe is not None
    if sbe:
        g["retired_pages_sbe"] = sbe
    if dbe:
        g["retired_pages_dbe"] = dbe
    if pending:
        g["retired_pages_pending"] = True
    corr, unc = r.integer("remap_correctable"), r.integer("remap_uncorrectable")
    remap_pending = r.flag("remap_pending", ("yes",), ("no",))
    failure = r.flag("remap_failure", ("yes",), ("no",))
    if any(v is not None for v in (corr, unc, remap_pending, failure)):
        own["remapped_rows_supported"] = True
    elif r.has_section("remapped_rows"):
        own["remapped_rows_supported"] = False
    else:
        notes.gpu(i, "remapped_rows_supported", "no Remapped Rows section (preset)")
    for key, value in (("remapped_rows_correctable", corr), ("remapped_rows_uncorrectable", unc),
                       ("remapped_rows_pending", remap_pending), ("remapped_rows_failure", failure)):
        if value:
            g[key] = value
    replays = r.integer("replays")
    if replays:
        g["pcie_replay_errors"] = replays


def _clocks(i: int, r: Reader, g: dict[str, Any], own: dict[str, Any], util: int | None, notes: Notes) -> None:
    sm, mem = r.integer("clock_sm", "MHz"), r.integer("clock_memory", "MHz")
    if not util:
        if sm is not None:
            own["idle_sm_mhz"] = sm
        if mem is not None:
            own["idle_memory_mhz"] = mem
    else:  # the clocks of this moment (an idle desktop at 2 % stays at idle clocks; boost under load)
        if sm is not None:
            g["sm_mhz"] = sm
        if mem is not None:
            g["memory_mhz"] = mem
    app = (r.integer("app_graphics", "MHz"), r.integer("app_memory", "MHz"))
    default = (r.integer("default_app_graphics", "MHz"), r.integer("default_app_memory", "MHz"))
    if None not in app and None not in default and app != default:
        notes.not_shown(i, f"application clocks {app[0]}/{app[1]} MHz differ from the default; the "
                            "twin starts at the default (apply them with a profile)")


def _machine(dump: Dump, name: str, gpus: list[dict[str, Any]], placement: Placement,
             notes: Notes) -> dict[str, Any]:
    names = sorted({str(g.get("name") or GPU_MODELS[g["model"]].name) for g in gpus})
    m: dict[str, Any] = {"name": name,
                         "summary": f"twin of {dump.file}: {len(gpus)}x {', '.join(names)}"}
    # driver 610: "610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]"
    driver = _version(dump.driver_version.value) if dump.driver_version else None
    cuda = _version(dump.cuda_version.value) if dump.cuda_version else None
    if driver and not driver.lower().startswith(("n/a", "[")):
        m["driver_version"] = driver
        major = cuda.split(".")[0] if cuda and cuda[:1].isdigit() else "12"
        m["nvml_version"] = f"{major}.{driver}"
    else:
        notes.machine.append("machine.driver_version: not in the dump (550.54.15)")
    if cuda and cuda[:1].isdigit():
        m["cuda_driver_version"] = cuda
    m.update(placement.machine)
    vram = sum(int(g.get("memory_ecc_mib" if g.get("ecc_enabled") else "memory_mib")
                   or GPU_MODELS[g["model"]].memory_mib) for g in gpus) / 1024
    m["memory_gib"] = max(128, 1 << max(0, math.ceil(math.log2(max(vram, 1)))))
    notes.machine.append(f"machine.memory_gib: not in the dump; {m['memory_gib']} GiB, at least the GPUs' "
                         f"{vram:.0f} GiB, so that host checks judge the GPUs rather than a guess")
    notes.machine.append("machine: CPU model, PSU, kernel command line, governor: nvidia-smi does not print "
                         "them (defaults)")
    return m


def _version(text: str) -> str | None:
    """The version number at the start of a version field (drivers from 610 append a deprecation note)."""
    m = re.match(r"\s*(\d+(?:\.\d+)+)", text)
    return m.group(1) if m else None


def _raise_nvlinks(data: dict[str, Any], placement: Placement, notes: Notes) -> None:
    """A GPU needs at least the links its bridge or the NVSwitch fabric uses."""
    need: dict[int, int] = {}
    for a, b, k in placement.bridges:
        need[a] = max(need.get(a, 0), k)
        need[b] = max(need.get(b, 0), k)
    for i, k in placement.switch_links.items():
        need[i] = k
    for i, k in need.items():
        g = data["gpu"][i]
        have = g.get("nvlinks", GPU_MODELS[g["model"]].nvlinks)
        if have != k and (i in placement.switch_links or have < k):
            g["nvlinks"] = k
            notes.gpu(i, "nvlinks", "from topo -m")


def check(twin: Twin) -> None:
    """The twin must load like any description; a failure here is the dump's inconsistency."""

    try:
        parse(twin.data, twin.dump.file)
    except InvalidInput as err:
        raise InvalidInput(twin.dump.file, "", f"the dump does not make a consistent workstation: {err.reason} "
                                               f"({err.key})") from err
