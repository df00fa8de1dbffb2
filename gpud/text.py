"""Small text helpers shared by the commands and the checks."""

from __future__ import annotations

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
