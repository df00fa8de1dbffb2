"""The control socket's requests: one table from a request's name to its arguments and its handler.

Every request needs the control socket's access (root, the daemon's own user or a member of
``[daemon] socket_group``: ``control.Access``). The socket server checks each request's shape against
``args``; the daemon's ``handle`` dispatches to ``handler`` and turns gpud's errors into replies.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpud import __version__
from gpud.profiles import engine
from gpud.profiles.session import LocalSession

if TYPE_CHECKING:
    from gpud.daemon.peer import Peer
    from gpud.hw.machine import Machine
    from gpud.model import Snapshot

Reply = dict[str, Any]


class Served(Protocol):
    """What the handlers use of the daemon."""

    @property
    def machine(self) -> Machine: ...

    @property
    def snapshot(self) -> Snapshot | None: ...

    def status(self, full: bool = False) -> Reply: ...

    def apply(self, name: str, dry_run: bool = False, peer: Peer | None = None) -> Reply: ...

    def restore(self, fans_only: bool = False, peer: Peer | None = None, gpus: list[int] | None = None) -> Reply: ...

    def resume_rules(self, profile: str | None = None, peer: Peer | None = None) -> Reply: ...

    def reload(self) -> Reply: ...

    def start_probe(self, why: str) -> Reply: ...

    def set_healthy(self, gpu: str, reason: str, peer: Peer | None = None) -> Reply: ...


Handler = Callable[[Served, dict[str, Any], "Peer | None"], Reply]


@dataclass(frozen=True)
class Request:
    args: dict[str, type | tuple[type, ...]]  # argument → type(s); checked before the handler runs
    handler: Handler
    required: tuple[str, ...] = ()


def _ping(d: Served, args: dict[str, Any], peer: Peer | None) -> Reply:
    return {"ok": True, "pid": os.getpid(), "version": __version__, "target": engine.target(d.machine)}


def _verify(d: Served, args: dict[str, Any], peer: Peer | None) -> Reply:
    return LocalSession(d.machine, in_daemon=True).verify_on(d.snapshot).to_json()


def _gpus(value: Any) -> list[int] | None:
    """``restore``'s ``gpus``: GPU indices (a Slurm job's; ``check_request`` checked them), or absent: all."""
    return None if value is None else sorted({int(g) for g in value})


# The order is the one "unknown command (known: …)" names.
REQUESTS: dict[str, Request] = {
    "ping": Request({}, _ping),
    "status": Request({}, lambda d, args, peer: {"ok": True, **d.status(full=True)}),
    "verify": Request({}, _verify),
    "reload": Request({}, lambda d, args, peer: d.reload()),
    "probe-now": Request({}, lambda d, args, peer: d.start_probe("requested")),
    "apply": Request({"profile": str, "dry_run": bool},
                     lambda d, args, peer: d.apply(str(args["profile"]), bool(args.get("dry_run")), peer),
                     required=("profile",)),
    "restore": Request({"fans_only": bool, "gpus": list},
                       lambda d, args, peer: d.restore(bool(args.get("fans_only")), peer, _gpus(args.get("gpus")))),
    "set-healthy": Request({"gpu": str, "reason": str},
                           lambda d, args, peer: d.set_healthy(str(args["gpu"]), str(args["reason"]), peer),
                           required=("gpu", "reason")),
    # `gpud apply --rules [PROFILE]`: the [[rules]] switch again (a person's apply paused them)
    "rules-resume": Request({"profile": str}, lambda d, args, peer: d.resume_rules(args.get("profile"), peer)),
}
