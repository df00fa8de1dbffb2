"""The simulated workstation's state: persisted settings and faults, NVML clients, boots.

``SimMachine`` is one workstation: what NVML setters wrote, the faults (the description's and those
injected while running), the NVML clients attached (a GPU without persistence mode forgets its
settings when the last one leaves) and the boot id. Its readings come from ``gpud.sim.physics``
(mixed in), where it is, from ``gpud.sim.topology``; ``gpud.sim.libnvml`` answers NVML calls over it.

What tuning writes is persisted under the state directory (``sim/<name>.json``) so that it
survives across CLI invocations, like real hardware does until a reboot. Faults injected while
running are persisted there too, so that another process (the daemon) sees them.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Callable

from gpud.paths import atomic_write
from gpud.sim import noise
from gpud.sim.description import Description
from gpud.sim.faults import FAULTS, Fault, validate_fault
from gpud.sim.physics import Physics

log = logging.getLogger("gpud.sim")


class SimMachine(Physics):
    """One simulated workstation. Not thread-safe: the NVML layer serialises calls."""

    def __init__(self, desc: Description, state_file: Path, clock: Callable[[], float] = time.monotonic):
        self.desc = desc
        self.state_file = state_file
        self.clock = clock
        self.offset = 0.0  # simulated seconds added by advance()
        self._state_mtime = 0.0
        self._checked = 0.0
        self._unsaved = False  # the state in hand exists only in this process (no file yet, or a new description)
        self.in_memory = False  # the state directory could not be written: this process's state is the newest
        self.state: dict[str, Any] = {}
        self._faults_key: tuple[int, int] | None = None
        self._generation = 0
        self._faults: list[Fault] = []
        self._lost: set[int] = set()
        self._refused: set[tuple[str, Any, Any]] = set()
        self._mutating = False
        self._load_state()
        if self._unsaved:
            # A state only this process holds would give each process its own boot time (and so its
            # own kernel-log clock and counters since boot): the first to open the machine saves it.
            with self.mutate():
                pass
        self.start_physics()

    # -- persisted state ---------------------------------------------------------------
    def _initial(self) -> dict[str, Any]:
        gpus = {}
        for i, g in enumerate(self.desc.gpus):
            gpus[str(i)] = {
                "power_limit_mw": int(g.power_limit_watts * 1000),
                "persistence": 1 if g.persistence_mode else 0,
                # Initialised by the driver: kept so by persistence mode; otherwise the first client to open
                # the GPU initialises it (seconds), and the last one leaving tears it down.
                "initialised": bool(g.persistence_mode),
                "compute_mode": {"default": 0, "prohibited": 2, "exclusive_process": 3}[g.compute_mode],
                "locked_gpu": None,
                "locked_mem": None,
                "app_clocks": None,
                "clock_offsets": {"graphics": 0, "memory": 0},
                "fans": [{"policy": 0, "target": None} for _ in range(g.fans)],
                "load": None,
            }
        # This boot began long enough ago for the description's kernel-log times (Xid seconds since boot).
        latest = max([f.seconds for f in self.desc.faults if f.kind == "xid"] + [0.0])
        boot_time = int(time.time() - max(86400.0, latest + 3600.0))
        # The machine's realisation of noise and spread (docs/simulation.md, "Noise and spread"): drawn once,
        # kept with its state, so every process that reads it sees one machine (GPUD_SIM_SEED overrides it).
        return {"digest": self.desc.digest, "gpus": gpus, "faults": [], "writes": 0, "boot_time": boot_time,
                "seed": noise.new_seed()}

    def _load_state(self) -> None:
        self._generation += 1  # the fault index below is rebuilt for each state read from disk
        try:
            st = os.stat(self.state_file)
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            self.state = self._initial()
            self._unsaved = True
            return
        self._unsaved = data.get("digest") != self.desc.digest
        if self._unsaved:
            data = self._initial()  # the description changed: old writes no longer apply
        self.state = data
        self._state_mtime = st.st_mtime

    def refresh(self) -> None:
        """Pick up writes and faults made by another process (checked at most 4× a second)."""
        if self.in_memory:
            return  # what this process holds is newer than the file it could not write
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
        if self._mutating:  # already held by this process (a setter whose reading shut a GPU down)
            yield
            return
        try:
            self.state_file.parent.mkdir(parents=True, exist_ok=True)
            lock: IO[str] | None = open(self.state_file.with_suffix(".lock"), "a")  # noqa: SIM115
        except OSError as err:  # a full or read-only state directory: the GPUs keep their state in memory
            self._disk_error(err)
            lock = None
        try:
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.in_memory:
                self._load_state()
            self._mutating = True
            try:
                yield
            finally:
                self._mutating = False
                self.save()
        finally:
            if lock is not None:
                fcntl.flock(lock, fcntl.LOCK_UN)
                lock.close()

    def save(self) -> None:
        """Persist the state for the other processes. A state directory that is full or read-only is
        the simulator's problem, not the simulated hardware's: the GPUs keep what was written to them
        (in this process) and gpud meets the error in its own writes, as on a real machine."""
        try:
            # no fsync: the processes sharing these GPUs need a whole file, not one that outlives a power loss
            # (two fsyncs a write were 4-10 ms each, and a daemon's fan loop writes every tick)
            atomic_write(self.state_file, json.dumps(self.state, indent=1, sort_keys=True), durable=False)
        except OSError as err:
            self._disk_error(err)
            return
        self.in_memory = False
        try:
            self._state_mtime = os.stat(self.state_file).st_mtime
        except OSError:
            pass

    def _disk_error(self, err: OSError) -> None:
        if not self.in_memory:
            log.warning("simulated workstation %s: cannot save its state in %s (%s): kept in this process only",
                        self.desc.name, self.state_file.parent, err.strerror or err)
        self.in_memory = True

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
            if f.at_write == number:
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
            self._lost = {int(f.gpu or 0) for f in self._faults if f.kind == "gpu_lost" and f.at_write is None}
            self._refused = {(f.kind, f.call, f.gpu) for f in self._faults
                             if f.kind in ("unsupported", "no_permission", "crash") and f.at_write is None}
        return self._faults

    def _indexed(self) -> None:
        if self._faults_key != (self._generation, len(self.state.get("faults", []))):
            self.faults  # noqa: B018 - rebuilds the index

    def inject(self, kind: str, **params: Any) -> Fault:
        """Add a fault while running (validated like one in the description); persisted."""
        fault = validate_fault({"kind": kind, **params}, len(self.desc.gpus), "inject", "fault")
        with self.mutate():
            self.state.setdefault("faults", []).append({"kind": fault.kind, "params": dict(fault.params)})
            hook = FAULTS[fault.kind].on_inject  # e.g. a GPU off the bus: its fans back on their own curve
            if hook is not None:
                hook(self, fault)
        return fault

    def reboot(self) -> int:
        """A reboot: every setting back to the description's (nothing NVML sets survives one), the
        faults injected at run time gone (a kernel log starts empty; the description's own faults are
        the machine's and come back), and a new boot id. Returns the new boot number."""
        with self.mutate():
            boot = int(self.state.get("boot", 0)) + 1
            seed = self.state.get("seed")
            self.state = self._initial()
            self.state["boot"] = boot
            if seed is not None:  # the same silicon after a reboot
                self.state["seed"] = seed
            self.state["counters_since"] = time.time()  # the driver's counters start at this reboot
        return boot

    def boot_time(self) -> int:
        """``btime`` of ``/proc/stat``: when this boot began (seconds since the epoch)."""
        return int(self.state.get("boot_time") or self._initial()["boot_time"])

    def boot_id(self) -> str:
        """``/proc/sys/kernel/random/boot_id`` of this boot: a random UUID per boot on Linux; here
        derived from the machine's name and boot number, so that it changes exactly at a reboot."""

        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpud-sim:{self.desc.name}:{self.state.get('boot', 0)}"))

    def clear_faults(self) -> None:
        with self.mutate():
            self.state["faults"] = []

    def faults_of(self, kind: str, gpu: int | None = None) -> list[Fault]:
        """The faults of ``kind`` (on ``gpu``: its own, a pair's it is in, and those for every GPU)."""
        out = []
        for f in self.faults:
            if f.kind != kind:
                continue
            if gpu is None or f.gpu == gpu or gpu in f.gpus or f.every_gpu:
                out.append(f)
        return out

    def fault_index(self) -> tuple[set[int], set[tuple[str, Any, Any]]]:
        """(the lost GPUs, the refused (kind, call, GPU)) as the faults stand now: what every call checks."""
        self._indexed()
        return self._lost, self._refused

    def lost(self, gpu: int) -> bool:
        self._indexed()
        return gpu in self._lost

    def refused(self, kind: str, call: str, gpu: int | None) -> bool:
        self._indexed()
        if not self._refused:
            return False
        return (kind, call, None) in self._refused or (gpu is not None and (kind, call, gpu) in self._refused)

    # -- load ---------------------------------------------------------------------------------
    def set_load(self, gpu: int, utilization: int, power_watts: float) -> None:
        self.step()
        with self.mutate():
            self.settings(gpu)["load"] = [int(utilization), float(power_watts)]

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
            s["initialised"] = False
            s["power_limit_mw"] = int(g.power_default_watts * 1000)
            s["compute_mode"] = 0
            s["locked_gpu"] = s["locked_mem"] = s["app_clocks"] = None
            s["clock_offsets"] = {"graphics": 0, "memory": 0}
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
            if not clients.get(pid):  # this process's first nvmlInit: its noise counts seconds from here, so two
                self._t0 = self.now()  # runs of one command read alike however long opening the machine took
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
