"""Small text helpers shared by the commands and the checks."""

from __future__ import annotations

import re
from typing import Sequence


def ranges(ids: Sequence[int] | None) -> str:
    """(0,1,2,3,8,9) → "0-3,8-9"."""
    if not ids:
        return "n/a"
    out, start, prev = [], ids[0], ids[0]
    for i in list(ids[1:]) + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev != start else str(start))
        if i is not None:
            start = prev = i
    return ",".join(out)


def plural(n: int, word: str, words: str | None = None) -> str:
    """1 warning, 2 warnings; 1 process, 3 processes (``words`` for irregular plurals)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


# C0 and C1 control characters (ESC, BEL, backspace, carriage return…), DEL, and the Unicode
# bidirectional overrides that reorder what a terminal shows (CVE-2021-42574's "Trojan Source").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean(text: str, keep_newlines: bool = False) -> str:
    """``text`` from data (a process name, a profile description, a journal summary) as it may reach
    a terminal: control characters removed, tabs (and newlines unless kept) as spaces. Linear."""
    text = _CONTROL.sub("", text.replace("\t", " ").replace("\r", ""))
    return text if keep_newlines else text.replace("\n", " ")


ELLIPSIS = "…"


def cut(text: str, n: int) -> str:
    """``text`` in at most ``n`` characters: cut with … when longer."""
    if len(text) <= n:
        return text
    return text[:max(0, n - 1)] + ELLIPSIS if n > 0 else ""
