"""One way to tune: ``apply``, ``verify`` and ``restore`` through a ``Session``, with typed results.

``LocalSession`` acts on this machine through the engine (``gpud.profiles.engine``): the daemon does so, and the
command line where no daemon drives the machine (its caller holds the tuning lock; the daemon holds its own).
``DaemonSession`` asks a running daemon over its control socket and reads the replies back into the same
results. Its transport is the caller's (``Ask``): the profiles layer does not reach up into the daemon. The
daemon's replies are its local session's results as JSON (``to_json``), so what the two say cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.model import to_jsonable
from gpud.profiles import engine
from gpud.profiles import profile as profiles
from gpud.profiles.engine import Change, Desired, Drift, Outcome
from gpud.profiles.profile import Profile
from gpud.profiles.switch import blank, switch


class DaemonGone(GpudError):
    """The daemon answered the ping and then no request: it stopped (its caller may act here instead)."""


Ask = Callable[..., "dict[str, Any] | None"]  # a control request (command, keyword arguments) → the reply, None: gone


def _change(row: Mapping[str, Any]) -> Change:
    return Change(row.get("gpu"), str(row.get("setting", "")), row.get("current"), row.get("desired"),
                  row.get("action", "none"), str(row.get("note") or ""))


@dataclass(frozen=True)
class ApplyResult:
    """What an apply said: the plan, and unless a dry run, what it wrote, what it undid on failure. ``planned``
    False: refused before any plan (``error`` says why). ``desired`` and ``host`` are what the daemon then
    enforces: the GPUs' and the host's settings less those the driver said it cannot take (not on the wire)."""

    ok: bool
    profile: str | None
    chain: tuple[str, ...] = ()
    source: str | None = None
    target: str = ""
    dry_run: bool = False
    daemon: bool = False
    planned: bool = True
    plan: tuple[Change, ...] = ()
    skipped: tuple[Change, ...] = ()
    written: int = 0
    error: str | None = None
    rolled_back: tuple[str, ...] = ()
    not_restored: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()
    remedy: str | None = None  # a refusal's (before planning)
    desired: Desired = field(default_factory=dict, compare=False)
    host: dict[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, p: Profile, target: str, plan: list[Change], dry_run: bool, out: Outcome | None = None,
           daemon: bool = False) -> ApplyResult:
        base = cls(ok=True, profile=p.name, chain=tuple(p.chain), source=p.source, target=target, dry_run=dry_run,
                   daemon=daemon, plan=tuple(plan))
        if out is None:
            return base
        return replace(base, ok=out.ok, skipped=tuple(out.skipped), written=len(out.written), error=out.error,
                       rolled_back=tuple(out.rolled_back), not_restored=tuple(out.not_restored),
                       messages=tuple(out.messages))

    def to_json(self) -> dict[str, Any]:
        """The reply and ``gpud apply --json``'s fields (an apply that ran adds its outcome to the plan's)."""
        if not self.planned:
            return {"ok": self.ok, "error": self.error, **({"remedy": self.remedy} if self.remedy else {}),
                    "target": self.target, "daemon": self.daemon}
        doc: dict[str, Any] = {"ok": self.ok, "profile": self.profile, "chain": list(self.chain),
                               "source": self.source, "dry_run": self.dry_run, "daemon": self.daemon,
                               "target": self.target, "plan": [c.as_dict() for c in self.plan]}
        if not self.dry_run:
            doc |= {"applied": self.ok, "error": self.error, "rolled_back": list(self.rolled_back),
                    "not_restored": list(self.not_restored), "written": self.written,
                    "messages": list(self.messages), "skipped": [c.as_dict() for c in self.skipped]}
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], daemon: bool = True) -> ApplyResult:
        if "plan" not in doc:
            return cls(ok=bool(doc.get("ok")), profile=doc.get("profile"), target=str(doc.get("target") or ""),
                       daemon=daemon, planned=False, error=doc.get("error"), remedy=doc.get("remedy"))
        return cls(ok=bool(doc.get("ok")), profile=doc.get("profile"), chain=tuple(doc.get("chain") or ()),
                   source=doc.get("source"), target=str(doc.get("target") or ""), dry_run=bool(doc.get("dry_run")),
                   daemon=daemon, plan=tuple(_change(c) for c in doc.get("plan") or ()),
                   skipped=tuple(_change(c) for c in doc.get("skipped") or ()), written=int(doc.get("written") or 0),
                   error=doc.get("error"), rolled_back=tuple(map(str, doc.get("rolled_back") or ())),
                   not_restored=tuple(map(str, doc.get("not_restored") or ())),
                   messages=tuple(map(str, doc.get("messages") or ())))


@dataclass(frozen=True)
class VerifyResult:
    """The applied profile (None: none) and each of its settings against the machine now."""

    profile: str | None
    applied: bool
    settings: tuple[Drift, ...] = ()

    @property
    def drifted(self) -> list[Drift]:
        return [d for d in self.settings if d.status == "drift"]

    @property
    def unverifiable(self) -> list[Drift]:
        return [d for d in self.settings if d.status == "unverifiable"]

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "profile": self.profile, "applied": self.applied,
                "settings": [to_jsonable(d) for d in self.settings]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> VerifyResult:
        rows = doc.get("settings") or ()
        return cls(doc.get("profile"), bool(doc.get("applied", False)), tuple(
            Drift(r.get("gpu"), str(r.get("setting", "")), r.get("current"), r.get("desired"), r.get("status", ""))
            for r in rows))


@dataclass(frozen=True)
class RestoreResult:
    """What was put back, and what could not be (each a line people read)."""

    restored: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    target: str = ""

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "restored": list(self.restored), "failed": list(self.failed)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], target: str = "") -> RestoreResult:
        failed = [str(x) for x in doc.get("failed") or ()]
        if doc.get("error") and not doc.get("ok"):
            failed.append(str(doc["error"]))  # refused whole (no reply's list says why)
        return cls(tuple(str(x) for x in doc.get("restored") or ()), tuple(failed), str(doc.get("target") or target))


@dataclass(frozen=True)
class Planned:
    """A profile's plan on this machine (``LocalSession.plan``): each change, and every GPU's desired settings."""

    profile: Profile
    changes: list[Change]
    desired: Desired


class Session(Protocol):
    """Apply, verify and restore on one machine: here (``LocalSession``) or through its daemon."""

    daemon: bool

    @property
    def target(self) -> str: ...

    def apply(self, profile: str, dry_run: bool = False) -> ApplyResult: ...

    def verify(self) -> VerifyResult: ...

    def restore(self, fans_only: bool = False, gpus: list[int] | None = None) -> RestoreResult: ...


class LocalSession:
    """The engine on ``machine``, from this process: plan, save the originals, write, read back, roll back on a
    failure (``engine.apply``); drift (``engine.verify``); the originals back (``engine.restore``). The caller
    holds the tuning lock."""

    daemon = False

    def __init__(self, machine: Machine, in_daemon: bool = False) -> None:
        self.machine = machine
        self.in_daemon = in_daemon  # the daemon's own session: its reading of drift knows it holds NVML open

    @property
    def target(self) -> str:
        return engine.target(self.machine)

    def apply(self, profile: str | Profile, dry_run: bool = False) -> ApplyResult:
        """Apply ``profile`` (a loaded one, or a name or path: loaded here, invalid → InvalidInput before
        anything is read or written)."""
        planned = self.plan(profile)
        return ApplyResult.of(planned.profile, self.target, planned.changes, True) if dry_run else self.write(planned)

    def plan(self, profile: str | Profile) -> Planned:
        """What applying ``profile`` would change (``engine.plan``), to look at before ``write``."""
        p = profiles.load(profile) if isinstance(profile, str) else profile
        changes, desired = engine.plan(self.machine, p)
        return Planned(p, changes, desired)

    def write(self, planned: Planned) -> ApplyResult:
        """Apply a plan: the originals saved, every change written and read back, this apply's writes rolled
        back on a failure (``engine.apply``)."""
        p = planned.profile
        out = engine.apply(self.machine, p, planned.changes, planned.desired)
        result = ApplyResult.of(p, self.target, planned.changes, False, out)
        if not out.ok:
            return result
        return replace(result, desired=engine.unsupported_removed(planned.desired, out),
                       host=engine.host_unsupported_removed(p.host, out))

    def switch(self, base: Profile | None, targets: Mapping[int, Profile | None],
               rules: Mapping[int, dict[str, str]]) -> ApplyResult:
        """Some GPUs to another profile (None: none) while the others keep theirs: the daemon's rules
        (``gpud.profiles.switch``; ``rules``: the state file's new record of the GPUs a rule holds). ``desired``:
        every GPU's settings after it (before it, on a failure)."""
        out, desired = switch(self.machine, base, targets, rules)
        p = blank(base)
        return replace(ApplyResult.of(p, self.target, out.plan, False, out), desired=desired)

    def verify(self) -> VerifyResult:
        return self.verify_on(None)

    def verify_on(self, snapshot: Any) -> VerifyResult:
        """``verify`` on a reading already taken (the daemon's latest snapshot), else a new one."""
        data, drifts = engine.verify(self.machine, daemon=self.in_daemon, snapshot=snapshot)
        return VerifyResult(data.profile if data else None, data is not None, tuple(drifts))

    def restore(self, fans_only: bool = False, gpus: list[int] | None = None) -> RestoreResult:
        done, failed = engine.restore(self.machine, fans_only=fans_only, gpus=gpus)
        return RestoreResult(tuple(done), tuple(failed), self.target)


class DaemonSession:
    """The running daemon's session, asked over its control socket (``ask``). A daemon that stops answering is
    a GpudError; a refusal is a result (``ok`` False) with the daemon's reason."""

    daemon = True

    def __init__(self, ask: Ask, target: str) -> None:
        self._ask = ask
        self._target = target

    @property
    def target(self) -> str:
        return self._target

    def _reply(self, cmd: str, **args: Any) -> dict[str, Any]:
        reply = self._ask(cmd, **args)
        if reply is None:
            raise DaemonGone("the gpud daemon stopped answering")
        reply.setdefault("target", self._target)
        return reply

    def apply(self, profile: str, dry_run: bool = False) -> ApplyResult:
        return ApplyResult.from_json(self._reply("apply", profile=profile, dry_run=dry_run))

    def resume_rules(self, profile: str | None = None) -> ApplyResult:
        """``gpud apply --rules [PROFILE]``: the daemon's rules switch again, from PROFILE as the base."""
        return ApplyResult.from_json(self._reply("rules-resume", **({"profile": profile} if profile else {})))

    def verify(self) -> VerifyResult:
        """The daemon's verify; its refusal (an unusable state file, say) is the error it names, never "no profile
        applied": what could not be read was not verified."""
        reply = self._reply("verify")
        if not reply.get("ok"):
            err = GpudError(str(reply.get("error") or "the gpud daemon refused to verify"))
            err.remedy = str(reply.get("remedy") or "")
            raise err
        return VerifyResult.from_json(reply)

    def restore(self, fans_only: bool = False, gpus: list[int] | None = None) -> RestoreResult:
        args: dict[str, Any] = {"fans_only": fans_only} | ({"gpus": gpus} if gpus is not None else {})
        return RestoreResult.from_json(self._reply("restore", **args), self._target)


__all__ = ["ApplyResult", "Ask", "DaemonGone", "DaemonSession", "LocalSession", "Planned", "RestoreResult", "Session",
           "VerifyResult"]
