"""Profile rules, the pure part: which ``[[rules]]`` match which GPU process, which rule wins on each
GPU, and how long a GPU keeps a rule's profile after its job left (the hold-off).

No hardware here: the daemon (``gpud.daemon.rules``) reads the processes (NVML's lists and
``/proc/PID``) into ``Job``s and applies what ``Arbiter.step`` decides; ``gpud rules test`` calls
``choose`` on the processes running now.

- A rule matches a process when every match key it gives holds: ``user``, ``group`` (the process's
  primary or supplementary groups), ``command`` (an RE2 regular expression searched in the command line:
  linear time, each process's command line searched once per pattern, ``Job.memo``),
  ``container``, ``pod``, ``slurm_job``, ``unit`` (true: present, false: absent, else equal — a
  container id also by its first 12 characters, as ``docker ps`` shows it; a unit with or without
  ``.service``; only a system unit, never a ``user-unit:`` inside a user's own systemd manager, whose
  names the user chooses: ``gpud.procinfo``), ``any_compute`` (any process on NVML's compute list).
  A rule limited to ``gpus`` matches only processes on those GPUs. Processes on the graphics list
  alone (a desktop) are no job.
- On one GPU the highest ``priority`` wins; among equal priorities the rule first in the file.
  The others that matched there are the losers, which the journal names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpud.config import Rule, command_pattern
from gpud.procinfo import SHORT_ID


@dataclass(frozen=True)
class Job:
    """One process on one GPU, as the rules see it."""

    gpu: int
    pid: int
    user: str | None = None
    groups: tuple[str, ...] = ()
    command: str | None = None
    workload: str | None = None  # docker:ID, podman:ID, pod:UID, slurm:JOB, unit:NAME, user-unit:NAME
    kind: str = "compute"  # NVML's list: compute, graphics, compute+graphics
    # pattern → whether it is found in the command line: each process's command line is searched once per
    # pattern (the daemon's Jobs hand the same dict to every Job of one process, poll after poll)
    memo: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)

    def place(self, what: str) -> str | None:
        """The process's container id, pod uid, Slurm job id or unit name; None when it has none."""
        if self.workload is None:
            return None
        kind, _, ident = self.workload.partition(":")
        wanted = {"container": ("docker", "podman"), "pod": ("pod",), "slurm_job": ("slurm",), "unit": ("unit",)}
        return ident if kind in wanted[what] else None

    def describe(self) -> str:
        """``alice, pid 7001, job 1234``: who and what, for the journal."""
        parts = [self.user or "unknown user", f"pid {self.pid}"]
        labels = {"docker": "container", "podman": "container", "pod": "pod", "slurm": "job", "unit": "unit",
                  "user-unit": "user unit"}
        if self.workload:
            kind, _, ident = self.workload.partition(":")
            parts.append(f"{labels.get(kind, kind)} {ident}")
        return ", ".join(parts)


def _equal(what: str, want: str | int, have: str) -> bool:
    text = str(want)
    if what == "container":
        return have.startswith(text[:SHORT_ID]) if len(text) >= SHORT_ID else have.startswith(text)
    if what == "unit":
        return have in (text, f"{text}.service")
    return have == text


MEMO_MAX = 256  # patterns remembered per process (rules reloaded with ever new patterns start it again)


def _command_matches(pattern: str, job: Job) -> bool:
    """Whether RE2 finds ``pattern`` in the job's command line, once per process and pattern."""
    hit = job.memo.get(pattern)
    if hit is None:
        if len(job.memo) >= MEMO_MAX:
            job.memo.clear()
        hit = job.memo[pattern] = command_pattern(pattern).search(job.command or "") is not None
    return hit


def matches(rule: Rule, job: Job) -> bool:
    """Whether every match key of ``rule`` holds for ``job`` (and the job is on one of its GPUs)."""
    if job.kind == "graphics":
        return False
    if rule.gpus is not None and job.gpu not in rule.gpus:
        return False
    if rule.user is not None and job.user != rule.user:
        return False
    if rule.group is not None and rule.group not in job.groups:
        return False
    if rule.command is not None and (job.command is None or not _command_matches(rule.command, job)):
        return False
    for what in ("container", "pod", "slurm_job", "unit"):
        want = getattr(rule, what)
        if want is None:
            continue
        have = job.place(what)
        if isinstance(want, bool):
            if want != (have is not None):
                return False
        elif have is None or not _equal(what, want, have):
            return False
    return True


@dataclass(frozen=True)
class Choice:
    """The rule that won a GPU, the job it matched, and the (rule, job) pairs that lost there."""

    gpu: int
    rule: Rule
    job: Job
    lost: tuple[tuple[Rule, Job], ...] = ()

    def describe(self) -> str:
        """``max-performance (rule alice-trains: alice, pid 7001, job 1234)``."""
        return f"{self.rule.profile} (rule {self.rule.name}: {self.job.describe()})"


def choose(rules: Sequence[Rule], jobs: Iterable[Job]) -> dict[int, Choice]:
    """Per GPU with a matching job: the winning rule (highest priority, then first in the file; its
    job the lowest pid, so the same job keeps winning) and the others that matched there."""
    order = {r.name: k for k, r in enumerate(rules)}
    hits: dict[int, list[tuple[Rule, Job]]] = {}
    for job in sorted(jobs, key=lambda j: (j.gpu, j.pid)):
        for rule in rules:
            if matches(rule, job):
                hits.setdefault(job.gpu, []).append((rule, job))
    out: dict[int, Choice] = {}
    for gpu, pairs in hits.items():
        pairs.sort(key=lambda rj: (-rj[0].priority, order[rj[0].name], rj[1].pid))
        rule, job = pairs[0]
        seen = {rule.name}
        lost = []
        for r, j in pairs[1:]:
            if r.name not in seen:  # one line per losing rule, with the first job it matched
                seen.add(r.name)
                lost.append((r, j))
        out[gpu] = Choice(gpu, rule, job, tuple(lost))
    return out


@dataclass
class Held:
    """A GPU's active rule: the choice that set it and when a matching job was last seen."""

    choice: Choice
    seen_at: float


@dataclass
class Arbiter:
    """Which rule each GPU follows, with the hold-off: a GPU keeps its rule for ``hold_off_s`` after the
    last matching process left, so a job that restarts does not flap the settings. A job matching
    another rule switches the GPU at once (a job present wins over one held)."""

    hold_off_s: float
    active: dict[int, Held] = field(default_factory=dict)

    def step(self, choices: dict[int, Choice], now: float) -> dict[int, Choice | None]:
        """The GPUs whose rule changes now: GPU → the new choice, or None (back to the base profile)."""
        changed: dict[int, Choice | None] = {}
        for gpu, choice in choices.items():
            held = self.active.get(gpu)
            if held is None or held.choice.rule.name != choice.rule.name:
                changed[gpu] = choice
            self.active[gpu] = Held(choice, now)
        for gpu in [g for g in self.active if g not in choices]:
            if now - self.active[gpu].seen_at >= self.hold_off_s:
                del self.active[gpu]
                changed[gpu] = None
        return changed


__all__ = ["Arbiter", "Choice", "Held", "Job", "choose", "matches"]
