"""The simulated workstation's hardware state: settings, faults and a thermal model.

What tuning writes is persisted under the state directory (``sim/<name>.json``) so that it
survives across CLI invocations, like real hardware does until a reboot. Faults injected while
running are persisted there too, so that another process (the daemon) sees them.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpud.paths import atomic_write
from gpud.sim.description import Description, Fault, validate_fault

# Effective cooling keeps 30 % with the fan stopped (chassis airflow, heatsink).
PASSIVE_SHARE = 0.3
TIME_CONSTANT_S = 30.0
AUTO_FAN_T0, AUTO_FAN_T1 = 40.0, 87.0  # driver curve: minimum duty at T0, 100 % at T1
# Clock-event reasons with an NVML violation counter (nvml.h: NVML_FI_DEV_CLOCKS_EVENT_REASON_*, in ns).
VIOLATION_REASONS = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                     "hw_power_brake_slowdown")
NVLINK_LINK_BYTES_S = 25e9  # one NVLink 4 link, one direction (HGX H200: 18 links, 450 GB/s each way)
NVLINK_LOAD_SHARE = 0.5  # share of a link's bandwidth a fully busy GPU moves (a model, not a measurement)

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


def auto_fan_percent(temp: float, minimum: int) -> int:
    """The driver's automatic fan policy, as the simulator models it."""
    frac = (temp - AUTO_FAN_T0) / (AUTO_FAN_T1 - AUTO_FAN_T0)
    return int(round(min(100.0, max(float(minimum), minimum + frac * (100 - minimum)))))


def _cooling(duty: float) -> float:
    return PASSIVE_SHARE + (1 - PASSIVE_SHARE) * duty / 100.0


@dataclass
class Thermal:
    temperature: float
    conductance: float  # W/K at full fan
    capacity: float  # J/K
    energy_mj: float
    pcie_tx_bytes: float = 0.0  # cumulative, as NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    pcie_rx_bytes: float = 0.0
    violation_ns: dict[str, float] = field(default_factory=dict)  # per reason since boot (field values 74…271)
    nvlink_kib: dict[int, float] = field(default_factory=dict)  # data per link and direction since start, KiB


class SimMachine:
    """One simulated workstation. Not thread-safe: the NVML layer serialises calls."""

    def __init__(self, desc: Description, state_file: Path, clock: Callable[[], float] = time.monotonic):
        self.desc = desc
        self.state_file = state_file
        self.clock = clock
        self.offset = 0.0  # simulated seconds added by advance()
        self._state_mtime = 0.0
        self._checked = 0.0
        self.state: dict[str, Any] = {}
        self._faults_key: tuple[int, int] | None = None
        self._generation = 0
        self._faults: list[Fault] = []
        self._lost: set[int] = set()
        self._refused: set[tuple[str, Any, Any]] = set()
        self._load_state()
        # Whether an NVLink is up (the NVML library sets it: link state is its business).
        self.nvlink_up: Callable[[int, int], bool] = lambda gpu, link: True
        self.thermal = [self._calibrate(i) for i in range(len(desc.gpus))]
        self._boot_seen = self.state.get("boot", 0)
        self._last = self.now()

    # -- persisted state ---------------------------------------------------------------
    def _initial(self) -> dict[str, Any]:
        gpus = {}
        for i, g in enumerate(self.desc.gpus):
            gpus[str(i)] = {
                "power_limit_mw": int(g["power_limit_watts"] * 1000),
                "persistence": 1 if g["persistence_mode"] else 0,
                "compute_mode": {"default": 0, "prohibited": 2, "exclusive_process": 3}[g["compute_mode"]],
                "locked_gpu": None,
                "locked_mem": None,
                "app_clocks": None,
                "fans": [{"policy": 0, "target": None} for _ in range(g["fans"])],
                "load": None,
            }
        # This boot began long enough ago for the description's kernel-log times (Xid seconds since boot).
        latest = max([float(f.params.get("seconds") or 0) for f in self.desc.faults if f.kind == "xid"] + [0.0])
        boot_time = int(time.time() - max(86400.0, latest + 3600.0))
        return {"digest": self.desc.digest, "gpus": gpus, "faults": [], "writes": 0, "boot_time": boot_time}

    def _load_state(self) -> None:
        self._generation += 1  # the fault index below is rebuilt for each state read from disk
        try:
            st = os.stat(self.state_file)
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            self.state = self._initial()
            return
        if data.get("digest") != self.desc.digest:
            data = self._initial()  # the description changed: old writes no longer apply
        self.state = data
        self._state_mtime = st.st_mtime

    def refresh(self) -> None:
        """Pick up writes and faults made by another process (checked at most 4× a second)."""
        t = time.monotonic()
        if t - self._checked < 0.25:
            return
        self._checked = t
        try:
            mtime = os.stat(self.state_file).st_mtime
        except OSError:
            return
        if mtime != self._state_mtime:
            self._load_state()

    @contextmanager
    def mutate(self) -> Iterator[None]:
        """Change the hardware state under an exclusive lock, from the freshest copy on disk.

        Several processes (the daemon, a CLI, a test) may write to the same simulated GPUs, as
        they may to real ones; without this, one process's stale copy would undo another's write.
        """
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.state_file.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._load_state()
                try:
                    yield
                finally:
                    self.save()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def save(self) -> None:
        atomic_write(self.state_file, json.dumps(self.state, indent=1, sort_keys=True))
        try:
            self._state_mtime = os.stat(self.state_file).st_mtime
        except OSError:
            pass

    def settings(self, gpu: int) -> dict[str, Any]:
        settings: dict[str, Any] = self.state["gpus"][str(gpu)]
        return settings

    def count_write(self) -> int:
        """Count a hardware write (kept in the state file, under ``mutate``); returns its number, from 1."""
        self.state["writes"] = int(self.state.get("writes", 0)) + 1
        return int(self.state["writes"])

    def write_fault(self, number: int) -> str | None:
        """The one-shot fault armed for write number ``number``: crash, gpu_lost or no_permission."""
        for f in self.faults:
            if f.params.get("at_write") == number:
                return f.kind
        return None

    # -- faults -----------------------------------------------------------------------
    @property
    def faults(self) -> list[Fault]:
        key = self._generation, len(self.state.get("faults", []))
        if self._faults_key != key:  # rebuilt only when the state was reloaded or faults added
            self._faults_key = key
            self._faults = list(self.desc.faults) + [Fault(f["kind"], f["params"])
                                                     for f in self.state.get("faults", [])]
            self._lost = {f.params["gpu"] for f in self._faults if f.kind == "gpu_lost"
                          and f.params.get("at_write") is None}
            self._refused = {(f.kind, f.params["call"], f.params.get("gpu")) for f in self._faults
                             if f.kind in ("unsupported", "no_permission") and f.params.get("at_write") is None}
        return self._faults

    def _indexed(self) -> None:
        if self._faults_key != (self._generation, len(self.state.get("faults", []))):
            self.faults  # noqa: B018 - rebuilds the index

    def inject(self, kind: str, **params: Any) -> Fault:
        """Add a fault while running (validated like one in the description); persisted."""
        fault = validate_fault({"kind": kind, **params}, len(self.desc.gpus), "inject", "fault")
        with self.mutate():
            self.state.setdefault("faults", []).append({"kind": fault.kind, "params": fault.params})
            if kind in ("gpu_lost", "off_bus") and fault.params.get("at_write") is None:
                # A GPU that falls off the bus stops listening to the driver: its board firmware runs
                # the fans on their own automatic curve again.
                for f in self.settings(fault.params["gpu"])["fans"]:
                    f["policy"], f["target"] = 0, None
        return fault

    def reboot(self) -> int:
        """A reboot: every setting back to the description's (nothing NVML sets survives one), the
        faults injected at run time gone (a kernel log starts empty; the description's own faults are
        the machine's and come back), and a new boot id. Returns the new boot number."""
        with self.mutate():
            boot = int(self.state.get("boot", 0)) + 1
            self.state = self._initial()
            self.state["boot"] = boot
            self.state["counters_since"] = time.time()  # the driver's counters start at this reboot
        return boot

    def boot_time(self) -> int:
        """``btime`` of ``/proc/stat``: when this boot began (seconds since the epoch)."""
        return int(self.state.get("boot_time") or self._initial()["boot_time"])

    def boot_id(self) -> str:
        """``/proc/sys/kernel/random/boot_id`` of this boot: a random UUID per boot on Linux; here
        derived from the machine's name and boot number, so that it changes exactly at a reboot."""
        import uuid

        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpud-sim:{self.desc.name}:{self.state.get('boot', 0)}"))

    def clear_faults(self) -> None:
        with self.mutate():
            self.state["faults"] = []

    def faults_of(self, kind: str, gpu: int | None = None) -> list[dict[str, Any]]:
        out = []
        for f in self.faults:
            if f.kind != kind:
                continue
            g = f.params.get("gpu")
            pair = f.params.get("gpus")
            if gpu is None or g == gpu or (pair is not None and gpu in pair) or ("gpu" in f.params and g is None):
                out.append(f.params)
        return out

    def lost(self, gpu: int) -> bool:
        self._indexed()
        return gpu in self._lost

    def refused(self, kind: str, call: str, gpu: int | None) -> bool:
        self._indexed()
        if not self._refused:
            return False
        return (kind, call, None) in self._refused or (gpu is not None and (kind, call, gpu) in self._refused)

    # -- load and thermal model ----------------------------------------------------------
    def now(self) -> float:
        return self.clock() + self.offset

    def advance(self, seconds: float) -> None:
        """Move simulated time forward (tests, closed-loop fan control)."""
        self.offset += seconds
        self.step()

    def set_load(self, gpu: int, utilization: int, power_watts: float) -> None:
        self.step()
        with self.mutate():
            self.settings(gpu)["load"] = [int(utilization), float(power_watts)]

    def utilization(self, gpu: int) -> int:
        load = self.settings(gpu).get("load")
        return int(load[0]) if load else int(self.desc.gpus[gpu]["utilization_percent"])

    def demand_watts(self, gpu: int) -> float:
        load = self.settings(gpu).get("load")
        return float(load[1]) if load else float(self.desc.gpus[gpu]["power_watts"])

    def draw_watts(self, gpu: int) -> float:
        return min(self.demand_watts(gpu), float(self.settings(gpu)["power_limit_mw"]) / 1000.0)

    def intended_duty(self, gpu: int, fan: int, temp: float | None = None) -> int:
        """What the fan is asked to do: the manual target, or the driver's curve. This is what NVML
        reports as the fan's speed, whether or not the fan turns."""
        g = self.desc.gpus[gpu]
        f = self.settings(gpu)["fans"][fan]
        if f["policy"] == 1 and f["target"] is not None:
            return int(f["target"])
        t = self.temperature(gpu) if temp is None else temp
        return auto_fan_percent(t, g["fan_min_percent"] or 0)

    def fan_duty(self, gpu: int, fan: int, temp: float | None = None) -> int:
        """What the fan really does (cools with): the stuck value of a failed fan, else as asked."""
        for p in self.faults_of("fan_stuck", gpu):
            if p["fan"] == fan:
                return int(p["percent"])
        t = self.thermal[gpu].temperature if temp is None else temp
        return self.intended_duty(gpu, fan, t)

    def pcie_rates(self, gpu: int) -> tuple[float, float]:
        """(TX, RX) bytes per second on the GPU's PCIe link now: proportional to utilisation."""
        u = self.utilization(gpu)
        return u * 40960 * 1024.0, u * 81920 * 1024.0

    def pcie_counters(self, gpu: int) -> tuple[int, int]:
        self.step()
        th = self.thermal[gpu]
        return int(th.pcie_tx_bytes), int(th.pcie_rx_bytes)

    # -- NVML clients and persistence mode --------------------------------------------------
    def _live_clients(self) -> dict[str, int]:
        out = {}
        for pid, n in self.state.get("clients", {}).items():
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                continue  # exited without nvmlShutdown: the driver counts it gone
            except PermissionError:
                pass
            out[pid] = int(n)
        return out

    def _deinitialise(self) -> None:
        """The last NVML client has gone: a GPU without persistence mode is torn down, and what was set
        on it (power limit, clocks, compute mode, fan control) is lost (NVIDIA driver-persistence
        documentation)."""
        for i, g in enumerate(self.desc.gpus):
            s = self.settings(i)
            if s["persistence"]:
                continue
            s["power_limit_mw"] = int(g["power_default_watts"] * 1000)
            s["compute_mode"] = 0
            s["locked_gpu"] = s["locked_mem"] = s["app_clocks"] = None
            for f in s["fans"]:
                f["policy"], f["target"] = 0, None

    def client_attach(self) -> None:
        """``nvmlInit`` from this process. If every earlier client has exited since, the GPUs without
        persistence mode were deinitialised in between."""
        with self.mutate():
            clients = self._live_clients()
            if not clients and self.state.get("clients"):
                self._deinitialise()
            pid = str(os.getpid())
            clients[pid] = clients.get(pid, 0) + 1
            self.state["clients"] = clients

    def client_detach(self) -> None:
        """``nvmlShutdown``: the last client leaving deinitialises GPUs without persistence mode."""
        with self.mutate():
            clients = self._live_clients()
            pid = str(os.getpid())
            if clients.get(pid, 0) > 1:
                clients[pid] -= 1
            else:
                clients.pop(pid, None)
            self.state["clients"] = clients
            if not clients:
                self._deinitialise()

    def _mean_duty(self, gpu: int, temp: float | None = None) -> float:
        n = self.desc.gpus[gpu]["fans"]
        if not n:
            return 100.0  # passive card: the chassis fans do the work
        return float(sum(self.fan_duty(gpu, f, temp) for f in range(n))) / int(n)

    def _calibrate(self, gpu: int) -> Thermal:
        """Choose conductance so the described temperature is the equilibrium as described."""
        g = self.desc.gpus[gpu]
        amb = float(self.desc.machine["ambient_celsius"])
        temp = float(g["temperature_celsius"])
        draw = min(float(g["power_watts"]), float(g["power_limit_watts"]))
        rise = max(temp - amb, 1.0)
        # Calibrate against the described state (faults from the description apply; a fan
        # settings written later change the equilibrium, as they would on real hardware).
        duty = self._described_duty(gpu, temp)
        conductance = draw / (rise * _cooling(duty))
        th = Thermal(temp, conductance, conductance * TIME_CONSTANT_S, 3.6e9 + gpu * 1.1e8)
        # The violation counters count from boot: the machine has been in its described state since, so
        # every process (and every reader) starts from the same totals, and a reboot starts them again.
        since_boot = max(0.0, time.time() - float(self.state.get("counters_since") or self.boot_time()))
        active = self.clock_event_reasons(gpu, temp)
        th.violation_ns = {r: since_boot * 1e9 if r in active else 0.0 for r in VIOLATION_REASONS}
        return th

    def clock_event_reasons(self, gpu: int, temp: float | None = None) -> set[str]:
        """The active clock-event reasons: injected ones, idle at 0 % utilisation, the SW power cap when
        the load wants more than the limit, SW thermal slowdown at the max operating temperature, HW
        slowdown and HW thermal slowdown at the slowdown temperature."""
        g = self.desc.gpus[gpu]
        out = {r for p in self.faults_of("clock_events", gpu) for r in p["reasons"]}
        if self.utilization(gpu) == 0:
            out.add("gpu_idle")
        if self.demand_watts(gpu) > self.settings(gpu)["power_limit_mw"] / 1000.0:
            out.add("sw_power_cap")
        t = self.temperature(gpu) if temp is None else temp
        if g.get("max_operating_celsius") is not None and t >= g["max_operating_celsius"]:
            out.add("sw_thermal_slowdown")  # the driver holds the GPU at its target temperature
        if t >= g["slowdown_celsius"]:
            out |= {"hw_slowdown", "hw_thermal_slowdown"}
        return out

    def violation_ns(self, gpu: int) -> dict[str, int]:
        self.step()
        return {r: int(v) for r, v in self.thermal[gpu].violation_ns.items()}

    def nvlink_kib(self, gpu: int, link: int) -> int:
        self.step()
        return int(self.thermal[gpu].nvlink_kib.get(link, 0.0))

    def _described_duty(self, gpu: int, temp: float) -> float:
        g = self.desc.gpus[gpu]
        n = g["fans"]
        if not n:
            return 100.0
        duties = []
        for fan in range(n):
            stuck = [f.params for f in self.desc.faults if f.kind == "fan_stuck"
                     and f.params["gpu"] == gpu and f.params["fan"] == fan]
            duties.append(stuck[0]["percent"] if stuck else auto_fan_percent(temp, g["fan_min_percent"] or 0))
        return float(sum(duties)) / int(n)

    def step(self) -> None:
        """Integrate the thermal model up to now (1 s steps; calls closer than 50 ms apart do nothing)."""
        now = self.now()
        if self.state.get("boot", 0) != self._boot_seen:  # rebooted (here or by another process)
            self._boot_seen = self.state.get("boot", 0)
            for gpu, th in enumerate(self.thermal):  # the driver's counters start again
                fresh = self._calibrate(gpu)
                th.violation_ns, th.nvlink_kib = fresh.violation_ns, {}
        dt_total = now - self._last
        if dt_total < 0.05:
            return
        self._last = now
        amb = float(self.desc.machine["ambient_celsius"])
        for gpu, th in enumerate(self.thermal):
            remaining = dt_total
            while remaining > 1e-9:
                dt = min(1.0, remaining)
                draw = self.draw_watts(gpu)
                loss = (th.temperature - amb) * th.conductance * _cooling(self._mean_duty(gpu))
                th.temperature += (draw - loss) / th.capacity * dt
                th.energy_mj += draw * dt * 1000.0
                tx, rx = self.pcie_rates(gpu)
                th.pcie_tx_bytes += tx * dt
                th.pcie_rx_bytes += rx * dt
                self._count_violations_and_links(gpu, th, dt)
                remaining -= dt

    def _count_violations_and_links(self, gpu: int, th: Thermal, dt: float) -> None:
        """The same physics that sets the clock-event reasons advances their violation counters; a busy
        GPU moves data over each NVLink that is up."""
        g = self.desc.gpus[gpu]
        if g.get("violation_counters"):
            active = self.clock_event_reasons(gpu, th.temperature)
            for r in VIOLATION_REASONS:
                if r in active:
                    th.violation_ns[r] = th.violation_ns.get(r, 0.0) + dt * 1e9
        if g.get("nvlink_throughput"):
            kib_s = self.utilization(gpu) / 100.0 * NVLINK_LOAD_SHARE * NVLINK_LINK_BYTES_S / 1024.0
            for link in range(int(g["nvlinks"] or 0)):
                if kib_s and self.nvlink_up(gpu, link):
                    th.nvlink_kib[link] = th.nvlink_kib.get(link, 0.0) + kib_s * dt

    def temperature(self, gpu: int) -> float:
        self.step()
        return self.thermal[gpu].temperature
