"""Completion of values, not only of commands (``gpud --install-completion``): profile names and
files, simulated workstations, event kinds, check ids. Each looks things up only when the shell asks."""

from __future__ import annotations

from pathlib import Path

from gpud.backends import simulated_workstations


def _files(incomplete: str, suffix: str = ".toml") -> list[str]:
    """Files (and directories, to go on into) that start with ``incomplete``."""
    base = Path(incomplete).parent if "/" in incomplete else Path(".")
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    out = []
    for p in entries:
        shown = str(p) if "/" in incomplete else p.name
        if shown.startswith(incomplete) and (p.is_dir() or p.name.endswith(suffix)):
            out.append(shown + ("/" if p.is_dir() else ""))
    return out


def profiles(incomplete: str) -> list[str]:
    from gpud.profiles.profile import available

    names = [n for n, _ in available() if n.startswith(incomplete)]
    return names + (_files(incomplete) if "/" in incomplete or "." in incomplete or not names else [])


def machines(incomplete: str) -> list[str]:

    names = [n for n in simulated_workstations() if n.startswith(incomplete)]
    return names + (_files(incomplete) if "/" in incomplete else [])


def event_kinds(incomplete: str) -> list[str]:
    from gpud.journal import KINDS

    return [k for k in KINDS if k.startswith(incomplete)]


def check_ids(incomplete: str) -> list[str]:
    """Check ids and their areas' globs (``pcie.*``)."""
    from gpud.doctor import CHECKS

    ids = [c.id for c in CHECKS]
    areas = sorted({i.split(".")[0] + ".*" for i in ids})
    return [x for x in dict.fromkeys([*areas, *ids]) if x.startswith(incomplete)]
