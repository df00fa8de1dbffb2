"""Human and machine output: tables and text that fit the terminal, colour on a TTY, JSON on request.

Nothing is ever cut: a table wider than the terminal is split into column groups (the first column
repeated), long text wraps with a hanging indent, and a `command` in backticks is never split across
words — a command longer than the line goes on lines of its own, continued with `` \\`` as a shell
reads it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from typing import Any, Sequence

from gpud.model import to_jsonable
from gpud.text import plural

__all__ = ["plural"]


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def colour_on() -> bool:
    return is_tty() and not os.environ.get("NO_COLOR")


def colour(text: str, code: str) -> str:
    """SGR ``code`` around ``text`` on a colour terminal; the text alone otherwise."""
    return f"\033[{code}m{text}\033[0m" if colour_on() and text else text


UNLIMITED = 10_000


def width() -> int:
    """Columns to fill: $COLUMNS, else the terminal's (at least 40). Through a pipe without $COLUMNS
    nothing is wrapped: one line per row and per check, for grep and awk."""
    if os.environ.get("COLUMNS", "").isdigit():
        return max(40, int(os.environ["COLUMNS"]))
    if not sys.stdout.isatty():
        return UNLIMITED
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def emit_json(obj: Any, *, compact: bool = False) -> None:
    data = to_jsonable(obj)
    sys.stdout.write((json.dumps(data, separators=(",", ":")) if compact else json.dumps(data, indent=2)) + "\n")
    sys.stdout.flush()


_ANSI = re.compile(r"\033\[[0-9;]*m")


def visible_len(text: str) -> int:
    return len(_ANSI.sub("", text))


def _pad(text: str, n: int) -> str:
    return text + " " * max(0, n - visible_len(text))


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None,
                max_width: int | None = None) -> list[str]:
    """Aligned columns two spaces apart, never wider than ``max_width``.

    Too wide: when the last column can shrink to a readable width its text wraps inside the column;
    otherwise the table splits into column groups, each repeating the first column; a cell still too
    long for its group wraps inside its column.
    """
    limit = max_width or width()
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max([visible_len(h)] + [visible_len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    n = len(headers)
    others = sum(widths[:-1]) + 2 * (n - 1)
    if n > 1 and others + widths[-1] > limit and limit - others >= 20:
        widths[-1] = limit - others
    else:
        cap = max(12, limit - widths[0] - 2) if n > 1 else limit
        widths = [min(w, cap) for w in widths]
    groups: list[list[int]] = []
    current: list[int] = [0]
    used = widths[0]
    for i in range(1, n):
        if used + 2 + widths[i] > limit and len(current) > 1:
            groups.append(current)
            current, used = [0], widths[0]
        current.append(i)
        used += 2 + widths[i]
    groups.append(current)
    out = wrap(title, limit) if title else []
    for k, cols in enumerate(groups):
        if k:
            out.append("")
        out.append(colour("  ".join(_pad(headers[i], widths[i]) for i in cols).rstrip(), "1"))
        for r in cells:
            parts = [wrap(r[i], widths[i]) if visible_len(r[i]) > widths[i] else [r[i]] for i in cols]
            for j in range(max(len(p) for p in parts)):
                out.append("  ".join(_pad(p[j] if j < len(p) else "", widths[i])
                                     for p, i in zip(parts, cols, strict=True)).rstrip())
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    sys.stdout.write("\n".join(table_lines(headers, rows, title)) + "\n")


_COMMAND = re.compile(r"[^\s`]*`[^`]+`[^\s`]*")  # with the punctuation that touches it


def _command_lines(cmd: str, indent: str, limit: int) -> list[str]:
    """A command alone on its line(s): broken only between words, each break a shell continuation."""
    words, lines, line = cmd.split(" "), [], indent
    for w in words:
        if line.strip() and visible_len(line) + 1 + len(w) + 2 > limit:
            lines.append(line + " \\")
            line = indent + w
        else:
            line = line + (" " if line.strip() else "") + w
    lines.append(line)
    return lines


def wrap(text: str, limit: int | None = None, indent: str = "", first: str | None = None) -> list[str]:
    """Wrap ``text`` to ``limit`` columns; ``first`` prefixes line one (``indent`` the rest).

    A `command` that does not fit on the current line starts a line of its own; one longer than a
    whole line is continued with `` \\`` between words, never split inside a word.
    """
    limit = limit or width()
    first = indent if first is None else first
    out: list[str] = []
    for para in text.split("\n"):
        lead = first if not out else indent
        line = lead
        pieces: list[tuple[str, bool]] = []
        pos = 0
        for m in _COMMAND.finditer(para):
            pieces += [(w, False) for w in para[pos:m.start()].split()]
            pieces.append((m.group(0), True))
            pos = m.end()
        pieces += [(w, False) for w in para[pos:].split()]
        for piece, is_cmd in pieces:
            glue = "" if line == lead or line == indent else " "
            if visible_len(line) + len(glue) + len(piece) <= limit:
                line += glue + piece
                continue
            if line.strip():
                out.append(line)
            if is_cmd and len(indent) + len(piece) > limit:
                cmd_lines = _command_lines(piece, indent, limit)
                out.extend(cmd_lines[:-1])
                line = cmd_lines[-1]
            else:
                line = indent + piece
        out.append(line)
    return [ln.rstrip() for ln in out]


def echo_wrapped(text: str, indent: str = "", first: str | None = None) -> None:
    sys.stdout.write("\n".join(wrap(text, None, indent, first)) + "\n")




def fmt(value: Any, unit: str = "", none: str = "n/a") -> str:
    if value is None:
        return none
    if isinstance(value, float):
        value = f"{value:.0f}"
    return f"{value}{unit}"

