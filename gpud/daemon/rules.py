"""The daemon's profile rules: a poll of the GPUs' compute-process lists that matches the ``[[rules]]`` of
``gpud.toml`` (``gpud.profiles.rules``) and asks the daemon to switch the GPUs whose rule changed.

Why a poll of its own: the tick reads the GPUs once per ``interval_seconds`` and the process lists only
every 5 s (``OFFTICK_EVERY_S``, off the tick), both too slow for a switch within 1 s. The daemon's loop
polls every ``[daemon] rules_poll_seconds`` (0.5 s by default) on the tick's grid (``gpud.daemon.tick.Pace``:
a tick's wake-up also polls), and not at all without rules. A poll reads each GPU's memory in use and its
compute list only where that changed (``Lists``), through the same gate as the off-tick readings
(``TickGate``). Only when a process is new is ``/proc/PID`` read (owner, groups, command line, cgroup); a
process is kept while NVML lists it, and is its pid with its start time (``/proc/PID/stat``, read each
poll), so a reused pid is read again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpud.config import Config, Rule
from gpud.daemon.recorder import Recorder
from gpud.errors import GpudError
from gpud.hw.machine import COUNT_HELD_S, Machine
from gpud.procinfo import status_ids
from gpud.profiles import engine
from gpud.profiles.enforce import Enforcer
from gpud.profiles.engine import Change, Desired
from gpud.profiles.fanloop import FanControl
from gpud.profiles.profile import Profile
from gpud.profiles.rules import Arbiter, Choice, Job, choose
from gpud.profiles.session import ApplyResult, LocalSession
from gpud.profiles.switch import drop_if_empty, switched

log = logging.getLogger("gpud.daemon")

# (GPU → new choice or None) → whether it switched; the daemon switches the GPUs under its tuning lock.
Switch = Callable[[dict[int, Choice | None]], bool]


def groups(machine: Machine, pid: int) -> tuple[str, ...]:
    """The names of a process's real group and supplementary groups (``/proc/PID/status`` ``Gid:`` and
    ``Groups:``, parsed by ``gpud.procinfo``: split on newlines alone, each key once, so a process's name
    adds no line; names from ``/etc/group`` under the machine's root; a gid without a name as a number)."""
    status = machine.host.proc_status(pid) or ""
    gids = [str(g) for g in status_ids(status, "Gid")[:1] + status_ids(status, "Groups")]
    names: dict[str, str] = {}
    for line in (machine.host.read("/etc/group") or "").split("\n"):
        parts = line.split(":")
        if len(parts) > 2:
            names.setdefault(parts[2], parts[0])
    return tuple(dict.fromkeys(names.get(g, g) for g in gids))


@dataclass
class Jobs:
    """The GPU processes as the rules see them: ``/proc/PID`` read once per process while NVML lists it
    (again while its owner could not be read: a process just starting). A process is its pid *and* its
    start time (``/proc/PID/stat``, read on every poll): a pid the kernel handed to another process is a
    new job, read again, never the previous owner's. A process whose start time cannot be read, or
    changes while it is read, is read again on every poll (nothing cached). Each job keeps the results
    of the rules' command patterns on its command line (``Job.memo``): a process is matched once per
    pattern, not once per poll."""

    machine: Machine
    known: dict[tuple[int, int], Job] = field(default_factory=dict)

    def read(self, lists: dict[int, list[tuple[int, str]]]) -> list[Job]:
        """``lists``: GPU → (pid, kind) as NVML lists them."""
        out: list[Job] = []
        seen: dict[tuple[int, int], Job] = {}
        fresh: dict[int, Job] = {}  # read this poll, not cached (no start time)
        for gpu, procs in lists.items():
            for pid, kind in procs:
                start = self.machine.host.start_time(pid)
                key = (pid, start) if start is not None else None
                job = (seen.get(key) or self.known.get(key)) if key is not None else fresh.get(pid)
                if job is None or job.user is None:
                    job = self._read(gpu, pid)
                    if key is not None and self.machine.host.start_time(pid) != start:
                        job, key = Job(gpu, pid), None  # the pid changed hands while read: nobody's yet
                if key is not None:
                    seen[key] = job
                else:
                    fresh[pid] = job
                out.append(Job(gpu, pid, job.user, job.groups, job.command, job.workload, kind, job.memo))
        self.known = seen
        return out

    def _read(self, gpu: int, pid: int) -> Job:
        user, command = self.machine.host.process(pid)
        return Job(gpu, pid, user, groups(self.machine, pid), command, self.machine.host.workload(pid))


def process_lists(machine: Machine) -> dict[int, list[tuple[int, str]]]:
    """GPU → (pid, kind) of each process on NVML's compute list (a lost GPU: none)."""
    return {gpu: _compute_list(machine, gpu) for gpu in range(machine.nvml.device_count())}


def _compute_list(machine: Machine, gpu: int) -> list[tuple[int, str]]:
    try:
        return [(p.pid, "compute") for p in machine.nvml.running_processes(gpu)]
    except GpudError:
        return []


# The longest a GPU's compute list is taken as unchanged while its memory in use is: a process that
# holds no memory (none does once its CUDA context exists) or one that starts as another of the same
# size exits in one poll is seen this late. The off-tick sampler reads the lists this often anyway.
LIST_AT_LEAST_EVERY_S = 5.0


@dataclass
class Lists:
    """The compute lists as the poll reads them: each GPU's list again only where its memory in use changed
    since (a CUDA context takes memory as it is created and gives it back at exit), or after
    ``LIST_AT_LEAST_EVERY_S``; otherwise the list read last. One 20 µs reading per GPU and poll instead of a
    4.5 ms one while jobs run steadily (docs/performance.md, "The daemon's footprint"). The periodic read is
    the off-tick sampler's list where the sampler asked NVML for it after the list held here was read (the
    memory in use the same at every poll since): the same list, without asking the driver twice."""

    machine: Machine
    seen: dict[int, tuple[float, int | None, list[tuple[int, str]]]] = field(default_factory=dict)
    lists_read: int = 0  # NVML compute lists asked for
    lists_kept: int = 0  # polls of a GPU answered from its last list
    lists_sampled: int = 0  # periodic reads answered by the off-tick sampler's list
    read_at: dict[int, float] = field(default_factory=dict)  # GPU → when its list held here was read (monotonic)

    def read(self, now: float) -> dict[int, list[tuple[int, str]]]:
        out: dict[int, list[tuple[int, str]]] = {}
        nvml = self.machine.nvml
        try:
            memory = nvml.memory_in_use(range(nvml.recent_count(COUNT_HELD_S)))
        except GpudError:
            memory = {}  # no driver: every list reads as empty below
        for gpu, used in memory.items():  # used None: lost, its list reads as empty below
            last = self.seen.get(gpu)
            if last is not None and used is not None and last[1] == used:
                if 0 <= now - last[0] < LIST_AT_LEAST_EVERY_S:
                    self.lists_kept += 1
                    out[gpu] = last[2]
                    continue
                # Due again. The memory in use read the same at every poll since this GPU's list was read (else it
                # would have been read again): a list the sampler read after it is as good as one read now.
                sampled = nvml.sampled_compute(gpu, self.read_at.get(gpu, math.inf))
                if sampled is not None:
                    self.lists_sampled += 1
                    out[gpu] = [(pid, "compute") for pid in sampled[1]]
                    self.seen[gpu] = (now - max(0.0, time.monotonic() - sampled[0]), used, out[gpu])
                    self.read_at[gpu] = sampled[0]
                    continue
            self.lists_read += 1
            self.read_at[gpu] = time.monotonic()
            out[gpu] = _compute_list(self.machine, gpu)  # read after the memory: a change between is seen next poll
            self.seen[gpu] = (now, used, out[gpu])
        return out


class RuleRunner:
    """Polls, matches and asks ``switch`` for the GPUs whose rule changed. ``paused`` (a person
    applied a profile): it keeps reading but switches nothing; ``resume`` starts from scratch, so every
    GPU with a matching job is switched again."""

    def __init__(self, machine: Machine, rules: Callable[[], Sequence[Rule]], hold_off_s: Callable[[], float],
                 switch: Switch, clock: Callable[[], float] = time.monotonic) -> None:
        self.machine = machine
        self.rules = rules
        self.hold_off_s = hold_off_s
        self.switch = switch
        self.clock = clock
        self.jobs = Jobs(machine)
        self.lists = Lists(machine)
        self.arbiter = Arbiter(hold_off_s())
        self.paused = False
        self.lock = threading.Lock()
        self.choices: dict[int, Choice] = {}  # the latest matches, per GPU (held or not)

    def poll(self) -> None:
        """One round: read, match, step the hold-off, switch what changed."""
        with self.lock:
            rules = list(self.rules())
            jobs = self.jobs.read(self.lists.read(self.clock())) if rules else []
            choices = choose(rules, jobs)
            self.arbiter.hold_off_s = self.hold_off_s()
            self.choices = choices
            if self.paused:
                return
            changed = self.arbiter.step(choices, self.clock())
        if changed:
            self.switch(changed)

    def active(self) -> dict[int, Choice]:
        """The rule each GPU follows now (held within the hold-off included)."""
        with self.lock:
            return {g: h.choice for g, h in self.arbiter.active.items()}

    def pause(self) -> dict[int, Choice]:
        """Stop switching; returns the GPUs a rule held (the daemon puts them back first)."""
        with self.lock:
            self.paused = True
            held = {g: h.choice for g, h in self.arbiter.active.items()}
            self.arbiter.active.clear()
            return held

    def resume(self) -> None:
        with self.lock:
            self.paused = False
            self.arbiter.active.clear()

    def wanted(self) -> bool:
        """Whether a poll has anything to do: rules to match, or a GPU a rule held (a reload that dropped the
        rules steps it back to the base after the hold-off). Without either the daemon does not poll."""
        return bool(self.rules()) or bool(self.arbiter.active)

__all__ = ["Jobs", "Lists", "RuleRunner", "groups", "process_lists"]


class ProfileRules:
    """The daemon's side of the rules: the base profile, the GPUs a rule switched, the switch itself
    (under the daemon's tuning lock, with the enforcement and the fan loop following), the journal
    lines, pausing while a person's profile stands."""

    def __init__(self, session: LocalSession, lock: threading.RLock, enforcer: Enforcer, fans: FanControl,
                 recorder: Callable[[], Recorder], config: Callable[[], Config],
                 load: Callable[[str], Profile]) -> None:
        self.session = session  # the daemon's: the switches go through it
        self.machine = machine = session.machine
        self.lock = lock
        self.enforcer = enforcer
        self.fans = fans
        self.recorder = recorder
        self.config = config
        self.load = load
        self.base: str | None = None  # the base profile's name, as the daemon applied it
        self.held: dict[int, Choice] = {}  # the GPUs a rule switched (applied)
        self.switches = 0
        self.runner = RuleRunner(machine, lambda: self.config().rules,
                                 lambda: float(self.config().daemon.rules_hold_off_seconds), self.switch)

    @property
    def paused(self) -> bool:
        return self.runner.paused

    def poll(self) -> None:
        """One poll, on the daemon's loop (``gpud.daemon.tick.Pace``); a failure is logged and the next tries again."""
        try:
            self.runner.poll()
        except Exception:  # noqa: BLE001 - logged; the next poll tries again
            log.exception("profile rules: poll failed")

    def poll_every(self) -> float | None:
        """Seconds between polls, or None while there is nothing to poll for (``RuleRunner.wanted``)."""
        return float(self.config().daemon.rules_poll_seconds) if self.runner.wanted() else None

    def profiles(self) -> tuple[tuple[int, str, str], ...]:
        """(gpu, profile, rule) per GPU with a profile: a rule's, else the base profile (rule "")."""
        state = self.enforcer.state
        gpus = state.gpu_indices() if state is not None else set()
        out = []
        for gpu in sorted(gpus | set(self.held)):
            choice = self.held.get(gpu)
            if choice is not None:
                out.append((gpu, choice.rule.profile, choice.rule.name))
            elif self.base:
                out.append((gpu, self.base, ""))
        return tuple(out)

    def switch(self, changed: dict[int, Choice | None], why: str = "") -> bool:
        """Switch each GPU of ``changed`` to its rule's profile, or back to the base (None)."""
        with self.lock:
            if self.runner.paused and why != "release":
                return False
            held = dict(self.held)
            targets: dict[int, Profile | None] = {}
            out: ApplyResult | None = None
            desired: Desired = {}
            try:
                base = self.load(self.base) if self.base else None
                for gpu, choice in sorted(changed.items()):
                    targets[gpu] = self.load(choice.rule.profile) if choice is not None else base
                    if choice is not None:
                        held[gpu] = choice
                    else:
                        held.pop(gpu, None)
                record = {g: {"profile": c.rule.profile, "rule": c.rule.name} for g, c in held.items()}
                out = self.session.switch(base, targets, record)
                desired, error = out.desired, out.error or ""
            except GpudError as err:
                error = str(err)
            if out is None or not out.ok:
                for gpu, choice in sorted(changed.items()):
                    what = choice.describe() if choice is not None else f"back to {self.base or 'no profile'}"
                    log.error("GPU%d: %s not applied: %s", gpu, what, error)
                    self.recorder().profile("profile_rule", f"GPU{gpu}: {what} not applied: {error}", gpu,
                                            ok=False, rule=choice.rule.name if choice else None)
                return False
            self.held = held
            self.switches += 1
            host = dict(self.enforcer.state.desired.get("host", {})) if self.enforcer.state is not None else {}
            if desired or host or self.base:
                self.enforcer.follow(self.base or "", desired, host)
            else:
                self.enforcer.follow(None, {})
                drop_if_empty(self.machine)
            self.fans.configure(desired)
            for gpu, choice in sorted(changed.items()):
                self._journal(gpu, choice, out.skipped)
            return True

    def _journal(self, gpu: int, choice: Choice | None, skipped: Sequence[Change]) -> None:
        record = self.recorder()
        left = [c.setting for c in skipped if c.gpu == gpu]
        note = f"; skipped (this GPU cannot take them): {', '.join(left)}" if left else ""
        if choice is None:
            summary = f"GPU{gpu}: {self.base or 'no profile'} (no rule matches any more)"
            log.info("%s%s", summary, note)
            record.profile("profile_rule", summary + note, gpu, ok=True, rule=None, profile=self.base)
            return
        summary = f"GPU{gpu}: {choice.describe()}"
        log.info("%s%s", summary, note)
        record.profile("profile_rule", summary + note, gpu, ok=True, rule=choice.rule.name,
                       profile=choice.rule.profile, pid=choice.job.pid, user=choice.job.user)
        for rule, job in choice.lost:
            line = (f"GPU{gpu}: rule {rule.name} ({rule.profile}; {job.describe()}) lost to rule "
                    f"{choice.rule.name} (priority {choice.rule.priority} against {rule.priority})")
            log.info("%s", line)
            record.profile("profile_rule", line, gpu, ok=True, rule=rule.name, lost_to=choice.rule.name)

    def release(self) -> None:
        """Every GPU a rule holds back to the base profile (before a person's apply, at start)."""
        with self.lock:
            if self.held:
                self.switch({g: None for g in self.held}, why="release")

    def at_start(self) -> None:
        """GPUs the state file says a rule switched (a daemon that was killed): back to their originals
        first, before the base profile is applied to every GPU (so nothing the rule's profile set and
        the base does not mention stays)."""
        try:
            held = switched(self.machine)
            data = engine.read_state(self.machine)
        except GpudError as err:
            log.error("profile rules: %s", err)
            return
        if not held or data is None:
            return
        log.warning("GPU(s) %s were left on a rule's profile by an earlier daemon: putting them back",
                    ",".join(map(str, sorted(held))))
        with self.lock:
            name = data.source or data.profile
            try:
                base = self.load(name) if name else None
            except GpudError:
                base = None
            out = self.session.switch(base, {g: None for g in held}, {})
            if not out.ok:
                log.error("profile rules: GPUs left by an earlier daemon not put back: %s", out.error)
            elif base is None:
                drop_if_empty(self.machine)

    def stop(self) -> None:
        """The daemon stops: nothing will switch the GPUs back, so a rule's GPUs go back to the base now."""
        self.runner.pause()
        try:
            self.release()
        except Exception:  # noqa: BLE001 - logged; the fans are handed back next, whatever happened
            log.exception("profile rules: GPUs not put back at stop")

    def pause(self, who: str) -> None:
        """A person applied a profile: the rules' GPUs go back to the base, and nothing switches until
        ``gpud restore`` or ``gpud apply --rules``."""
        if not self.config().rules:
            return
        self.release()
        self.runner.pause()
        log.info("profile rules paused: %s", who)
        self.recorder().profile("profile_rule", f"rules paused: {who}", None, ok=True, paused=True)

    def resume(self, who: str) -> None:
        was = self.runner.paused
        self.held = {}
        self.runner.resume()
        if was and self.config().rules:
            log.info("profile rules resumed: %s", who)
            self.recorder().profile("profile_rule", f"rules resumed: {who}", None, ok=True, paused=False)
