"""One check of ``gpud.toml`` against this machine, for doctor and the daemon alike.

``gpud.config.parse`` checks what the file alone can say (types, ranges, duplicate pairs); this
checks what needs the machine or the rest of gpud: ``[doctor] skip`` globs that select no check,
``[machine] nvlink_pairs`` naming a GPU the machine does not have, a ``[daemon] socket_group`` that
does not exist, a ``[daemon] profile`` that cannot be loaded, and ``[[rules]]`` whose profile cannot be
loaded or whose ``gpus`` the machine does not have. Anything wrong is
``InvalidInput`` (``file: key: reason``, exit 2): the daemon does not start on a file doctor refuses.
"""

from __future__ import annotations

import fnmatch
import grp
from collections.abc import Sequence

from gpud.config import Config, DaemonSection
from gpud.doctor import CHECKS
from gpud.errors import GpudError, InvalidInput
from gpud.profiles.profile import load


def check_ids() -> list[str]:

    return [c.id for c in CHECKS]


def globs_match(conf: Config, only: Sequence[str] = (), skip: Sequence[str] = ()) -> None:
    """A --check/--skip (or [doctor] skip) that selects no check is a typo, not a silent pass."""
    ids = check_ids()
    for option, globs in (("--check", only), ("--skip", skip),
                          ((conf.path or "gpud.toml") + ": doctor.skip", conf.doctor.skip)):
        for g in globs:
            if not any(fnmatch.fnmatchcase(i, g) for i in ids):
                areas = sorted({i.split(".")[0] + ".*" for i in ids})
                raise InvalidInput(option, g, f"matches no check (ids look like pcie.link_width; areas: "
                                              f"{', '.join(areas)}; `gpud doctor --json` lists them)")


def pairs_exist(conf: Config, gpus: int) -> None:
    """[machine] nvlink_pairs naming a GPU this machine does not have is a wrong file."""
    for k, pair in enumerate(conf.machine.nvlink_pairs or []):
        if gpus and max(pair) >= gpus:
            raise InvalidInput(conf.path or "gpud.toml", f"machine.nvlink_pairs[{k}]",
                               f"GPU {max(pair)} does not exist: this machine has {gpus} GPU(s) on the PCI bus")


def group_note(conf: Config) -> str | None:
    """The default socket group missing: a warning (only root can use the socket), not an error."""
    g = conf.daemon.socket_group
    try:
        grp.getgrnam(g)
        return None
    except KeyError:
        return (f"group {g!r} does not exist: only root can use the control socket "
                f"(`sudo groupadd --system {g}`, or set [daemon] socket_group)")


def daemon_keys(conf: Config) -> None:
    """The daemon's own keys: a configured socket group must exist (else the socket would be left to
    root without a word) and a configured profile must load."""
    file = conf.path or "gpud.toml"
    d = conf.daemon
    if d.socket_group != DaemonSection().socket_group and group_note(conf) is not None:
        raise InvalidInput(file, "daemon.socket_group",
                           f"no group {d.socket_group!r} on this host (`getent group {d.socket_group}`; "
                           f"create it with `sudo groupadd --system {d.socket_group}` or name another)")
    if d.profile is not None:

        try:
            load(d.profile)
        except GpudError as err:
            raise InvalidInput(file, "daemon.profile", f"{d.profile!r} cannot be loaded: {err}") from err


def rules_valid(conf: Config, gpus: int) -> None:
    """Each ``[[rules]]`` profile must load, and a rule's ``gpus`` must exist on this machine."""

    file = conf.path or "gpud.toml"
    for k, rule in enumerate(conf.rules):
        try:
            load(rule.profile)
        except GpudError as err:
            raise InvalidInput(file, f"rules[{k}].profile", f"{rule.profile!r} cannot be loaded: {err}") from err
        for g in rule.gpus or []:
            if gpus and g >= gpus:
                raise InvalidInput(file, f"rules[{k}].gpus", f"GPU {g} does not exist: this machine has {gpus} "
                                                              "GPU(s) on the PCI bus")


def check(conf: Config, gpus: int, *, only: Sequence[str] = (), skip: Sequence[str] = ()) -> None:
    """Everything above, for doctor and the daemon alike; InvalidInput at the first problem."""
    globs_match(conf, only, skip)
    pairs_exist(conf, gpus)
    daemon_keys(conf)
    rules_valid(conf, gpus)


__all__ = ["check", "check_ids", "daemon_keys", "globs_match", "group_note", "pairs_exist", "rules_valid"]
