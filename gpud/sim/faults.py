"""Simulated faults: every kind in one registry, ``FAULTS``.

A fault is a ``kind`` and its parameters, from a description's ``[[fault]]`` tables or injected
while running (``gpud sim inject``, ``SimMachine.inject``). Each ``FaultKind`` holds its keys (types,
defaults, required), the checks beyond their types, what happens at the moment it is injected, and
where its effect is modelled: the effect itself reads the machine's faults (``SimMachine.faults_of``,
``lost``, ``refused``, ``write_fault``) in the module named by ``acts_in``. Adding a kind starts
here (docs/architecture.md, "Adding a new simulated fault").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpud.errors import InvalidInput
from gpud.model import CLOCK_EVENT_REASONS, P2P_STATUSES
from gpud.schema import REQUIRED as _ANY
from gpud.schema import take
from gpud.sim import jobs
from gpud.sim.entries import ENTRIES, base_name
from gpud.sim.jobs import PROCESS_KEYS, check_injected, on_exit, on_process


class Machine(Protocol):
    """What a fault's injection hook changes: the simulator's settings, its persisted state (the faults
    injected so far), its description (``SimMachine``; the faults stand below the machine, which imports
    them)."""

    state: dict[str, Any]

    def settings(self, gpu: int) -> dict[str, Any]: ...

    @property
    def desc(self) -> jobs.Description: ...

    @property
    def faults(self) -> Sequence[jobs.Fault]: ...


class Gpu(Protocol):
    """What a fault's check reads of a described GPU (``GpuSpec``; the faults stand below the description)."""

    @property
    def fans(self) -> int: ...


EVENT_NAMES = tuple(name for _, name in CLOCK_EVENT_REASONS)

# The kernel-log text of an ``xid`` fault without its own ``text`` (what drivers print for each).
DEFAULT_XID_TEXT = {
    13: "Graphics Exception: ESR 0x404600=0x80000002",
    31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_00000000",
    43: "pid=4242, name=python, Ch 00000008",
    45: "pid=4242, name=python, Ch 00000008",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
    "subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row.",
    74: "NVLink: fatal error detected on link 2(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected.",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
    120: "GSP task error.",
}


@dataclass(frozen=True)
class Fault:
    """One fault. ``params`` holds its kind's validated keys as given (defaults filled): the form
    persisted in the state file and shown by ``gpud sim inject``. The attributes read them; each is
    meaningful for the kinds that have that key (``FAULTS[kind].keys``, whose defaults are filled
    in by validation), and empty or zero for the others."""

    kind: str
    params: Mapping[str, Any]

    @property
    def gpu(self) -> int | None:
        """The GPU (description index); None for kinds without one, or "every GPU" where optional."""
        return self.params.get("gpu")

    @property
    def every_gpu(self) -> bool:
        """A kind whose ``gpu`` is optional, given without one: it applies to every GPU."""
        return "gpu" in self.params and self.params["gpu"] is None

    @property
    def gpus(self) -> tuple[int, ...]:
        """The pair of GPUs (kinds with ``gpus``); empty for the others."""
        return tuple(self.params.get("gpus") or ())

    @property
    def at_write(self) -> int | None:
        """One-shot: fires at this hardware write (counted from 1), not from the start."""
        return self.params.get("at_write")

    @property
    def call(self) -> str | None:
        return self.params.get("call")

    @property
    def handle_error(self) -> str:
        return str(self.params.get("handle_error", ""))

    @property
    def error(self) -> str:
        return str(self.params.get("error", ""))

    @property
    def width(self) -> int | None:
        return self.params.get("width")

    @property
    def generation(self) -> int | None:
        return self.params.get("generation")

    @property
    def links(self) -> tuple[int, ...] | None:
        links = self.params.get("links")
        return None if links is None else tuple(links)

    @property
    def status(self) -> str:
        return str(self.params.get("status", ""))

    @property
    def caps(self) -> str:
        return str(self.params.get("caps", ""))

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(self.params.get("reasons") or ())

    @property
    def xid(self) -> int:
        return int(self.params.get("xid") or 0)

    @property
    def text(self) -> str | None:
        return self.params.get("text")

    @property
    def seconds(self) -> float:
        return float(self.params.get("seconds") or 0)

    @property
    def fan(self) -> int:
        return int(self.params.get("fan") or 0)

    @property
    def percent(self) -> int:
        return int(self.params.get("percent") or 0)

    @property
    def link(self) -> int | None:
        return self.params.get("link")

    @property
    def counter(self) -> str:
        return str(self.params.get("counter", ""))

    @property
    def above_celsius(self) -> float | None:
        """A condition: the fault acts only while the GPU is at or above this temperature (None: always)."""
        v = self.params.get("above_celsius")
        return None if v is None else float(v)

    @property
    def per_second(self) -> float:
        return float(self.params.get("per_second", 0.0))


@dataclass(frozen=True)
class FaultKind:
    keys: dict[str, tuple[Any, Any]]  # key: (type or allowed values, default; _ANY = required), for take()
    acts_in: str  # where the effect is modelled (it reads the machine's faults there)
    check: Callable[[Fault, str, str], None] | None = None  # beyond the keys' types: (fault, file, where)
    on_inject: Callable[[Machine, Fault], None] | None = None  # at injection, under the state lock
    check_gpus: Callable[[Fault, Sequence[Gpu], str, str], None] | None = None  # against a description's GPUs


def _fans_to_auto(sim: Machine, fault: Fault) -> None:
    """A GPU that falls off the bus stops listening to the driver: its board firmware runs the fans
    on their own automatic curve again."""
    if fault.at_write is None and fault.gpu is not None:
        for f in sim.settings(fault.gpu)["fans"]:
            f["policy"], f["target"] = 0, None


def _call_or_write(fault: Fault, file: str, where: str) -> None:
    if fault.call is None and fault.at_write is None:
        raise InvalidInput(file, f"{where}.call", "required (or at_write)")


def _fan_stuck(fault: Fault, file: str, where: str) -> None:
    if fault.percent > 100:
        raise InvalidInput(file, f"{where}.percent", "must be 0..100")


def _fan_exists(fault: Fault, gpus: Sequence[Gpu], file: str, where: str) -> None:
    gpu = int(fault.gpu or 0)
    if fault.fan >= gpus[gpu].fans:
        raise InvalidInput(file, f"{where}.fan", f"GPU {gpu} has {gpus[gpu].fans} fan(s): the fault could never fire")


def _above(fault: Fault, file: str, where: str) -> None:
    t = fault.above_celsius
    if t is not None and not -40 <= t <= 150:
        raise InvalidInput(file, f"{where}.above_celsius", f"must be a GPU temperature, -40..150 °C, not {t}")


def _clock_events(fault: Fault, file: str, where: str) -> None:
    for r in fault.reasons:
        if r not in EVENT_NAMES:
            raise InvalidInput(file, f"{where}.reasons", f"unknown reason {r!r} (known: {', '.join(EVENT_NAMES)})")


FAULTS: dict[str, FaultKind] = {
    "gpu_lost": FaultKind(
        {"gpu": (int, _ANY), "at_write": (int, None), "handle_error": (("unknown", "gpu_is_lost"), "unknown")},
        "libnvml (GPU_IS_LOST on every call, its handle lookup; at_write: SimLibrary.write)",
        on_inject=_fans_to_auto),
    "off_bus": FaultKind({"gpu": (int, _ANY)}, "libnvml (SimLibrary.visible: not enumerated, still on PCI)",
                         on_inject=_fans_to_auto),
    "unsupported": FaultKind({"gpu": (int, None), "call": (str, _ANY)}, "libnvml (SimLibrary.guard)"),
    "no_permission": FaultKind({"gpu": (int, None), "call": (str, None), "at_write": (int, None)},
                               "libnvml (SimLibrary.guard; at_write: SimLibrary.write)", check=_call_or_write),
    # crash: the process is killed at the N-th hardware write (at_write), or as it calls ``call`` (on ``gpu``),
    # before the call acts: a call names one step of a sequence that other writers (a fan loop) cannot reach
    "crash": FaultKind({"at_write": (int, None), "call": (str, None), "gpu": (int, None)},
                       "libnvml (SimLibrary.write; call: SimLibrary.guard: SIGKILL)", check=_call_or_write),
    "link_degraded": FaultKind({"gpu": (int, _ANY), "width": (int, None), "generation": (int, None)},
                               "topology (link_state), and so libnvml and rootfs"),
    "nvlink_down": FaultKind({"gpus": (list, _ANY), "links": (list, None)}, "topology (nvlink_peer)"),
    "p2p": FaultKind({"gpus": (list, _ANY), "status": (P2P_STATUSES, _ANY),
                      "caps": (("read", "write", "all"), "all")}, "libnvml (nvmlDeviceGetP2PStatus)"),
    "clock_events": FaultKind({"gpu": (int, _ANY), "reasons": (list, _ANY)}, "physics (clock_events)",
                              check=_clock_events),
    "xid": FaultKind({"gpu": (int, _ANY), "xid": (int, _ANY), "text": (str, None), "seconds": ((int, float), 5123.4)},
                     "rootfs (the kernel log); machine (the boot began before its time)"),
    "kernel_log_unreadable": FaultKind({}, "rootfs (no /dev/kmsg, no journal, no /var/log/kern.log or "
                                           "/var/log/messages: a container without the /dev/kmsg and journal "
                                           "mounts on a journald-only node)"),
    "fan_stuck": FaultKind({"gpu": (int, _ANY), "fan": (int, 0), "percent": (int, 0)},
                           "physics (fan_duty: cools with the stuck duty, reads as asked)",
                           check=_fan_stuck, check_gpus=_fan_exists),
    "driver_mismatch": FaultKind({}, "libnvml (nvmlInit: LIB_RM_VERSION_MISMATCH; a process that initialised "
                                     "before keeps its library)"),
    "handle_refused": FaultKind({"gpu": (int, _ANY), "error": (("insufficient_power", "irq_issue"), _ANY)},
                                "libnvml (nvmlDeviceGetHandleByIndex answers INSUFFICIENT_POWER or IRQ_ISSUE)"),
    "nvlink_errors": FaultKind({"gpu": (int, _ANY), "link": (int, None),
                                "counter": (("replay", "recovery", "crc_flit", "crc_data"), "crc_flit"),
                                "per_second": ((int, float), 1.0)},
                               "libnvml (nvmlDeviceGetNvLinkErrorCounter and its field values)"),
    # above_celsius: a marginal GPU that errs only while it is at or above that temperature (it passes cold)
    "wrong_results": FaultKind({"gpu": (int, _ANY), "above_celsius": ((int, float), None)},
                               "backends (SimBench.device_faults: the CPU standing in for the GPU alters its GEMM "
                               "results, while the GPU is at or above above_celsius)", check=_above),
    "memory_errors": FaultKind({"gpu": (int, _ANY), "above_celsius": ((int, float), None)},
                               "backends (SimBench.device_faults: the CPU standing in for the GPU flips a bit in "
                               "the memory test, while the GPU is at or above above_celsius)", check=_above),
}
FAULTS["process"] = FaultKind({"gpu": (int, _ANY), **PROCESS_KEYS},
                              "jobs (running: libnvml's process lists, rootfs's /proc/PID)",
                              check=check_injected, on_inject=on_process)
FAULTS["process_exit"] = FaultKind({"pid": (int, _ANY)}, "jobs (running: the process is gone from both)",
                                   on_inject=on_exit)
FAULT_KEYS: dict[str, dict[str, tuple[Any, Any]]] = {name: kind.keys for name, kind in FAULTS.items()}


def gpu_pair(value: Any, n: int, file: str, where: str) -> list[int]:
    if (not isinstance(value, list) or len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                                                 for v in value)):
        raise InvalidInput(file, where, f"must be two GPU indices, not {value!r}")
    if value[0] == value[1] or not all(0 <= v < n for v in value):
        raise InvalidInput(file, where, f"GPU indices must differ and be in 0..{n - 1}")
    return value


# What the PCIe specification allows a link to train to (x1..x32; PCI Express Base Specification,
# "Link Width"), and the generations there are (1 to 6: 2.5 to 64 GT/s).
PCIE_WIDTHS = (1, 2, 4, 8, 12, 16, 32)
PCIE_GENERATIONS = 6


def validate_fault(raw: Any, n: int, file: str, where: str) -> Fault:
    if not isinstance(raw, dict):
        raise InvalidInput(file, where, "must be a table")
    kind = raw.get("kind")
    if kind not in FAULTS:
        raise InvalidInput(file, f"{where}.kind", f"must be one of {', '.join(FAULTS)}, not {kind!r}")
    spec = FAULTS[kind]
    params = take({k: v for k, v in raw.items() if k != "kind"}, spec.keys, file, where)
    gpu = params.get("gpu")
    if gpu is not None and not 0 <= gpu < n:
        raise InvalidInput(file, f"{where}.gpu", f"no GPU {gpu} (this machine has {n})")
    if "gpus" in params:
        gpu_pair(params["gpus"], n, file, f"{where}.gpus")
    if params.get("call") is not None and not _nvml_call(params["call"]):
        raise InvalidInput(file, f"{where}.call", f"{params['call']!r} is not an NVML function: the fault could never "
                                                  "fire (names look like nvmlDeviceSetGpuLockedClocks)")
    for key in ("at_write", "width", "generation", "percent", "fan", "xid"):
        v = params.get(key)
        if v is not None and v < (1 if key in ("at_write", "width", "generation", "xid") else 0):
            raise InvalidInput(file, f"{where}.{key}", f"must be {'positive' if key != 'fan' else 'at least 0'}")
    if params.get("width") is not None and params["width"] not in PCIE_WIDTHS:
        raise InvalidInput(file, f"{where}.width", f"must be a PCIe link width ({', '.join(map(str, PCIE_WIDTHS))})")
    if params.get("generation") is not None and not 1 <= params["generation"] <= PCIE_GENERATIONS:
        raise InvalidInput(file, f"{where}.generation", f"must be a PCIe generation, 1..{PCIE_GENERATIONS}")
    text = params.get("text")
    if text is not None and any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise InvalidInput(file, f"{where}.text", "one kernel log line: no newline or control character")
    fault = Fault(kind, params)
    if spec.check is not None:
        spec.check(fault, file, where)
    return fault


def _nvml_call(name: str) -> bool:
    """An entry point the simulated library exports, named with or without its ``_vN`` suffix (the
    registry ``gpud.sim.libnvml`` fills as it loads; the ``gpud.sim`` package loads it first)."""
    return name in ENTRIES or name in {base_name(e) for e in ENTRIES}
