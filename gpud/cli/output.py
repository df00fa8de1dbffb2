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
from gpud.text import ELLIPSIS, clean, cut, plural

__all__ = ["clean", "cut", "plural"]


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


_colour: dict[str, bool | None] = {"forced": None}  # --color / --no-color
_debug = {"on": bool(os.environ.get("GPUD_DEBUG"))}  # --debug: tracebacks with the errors


def set_debug(on: bool) -> None:
    _debug["on"] = on


def debug_enabled() -> bool:
    """``--debug`` or ``GPUD_DEBUG``: show tracebacks (and doctor's debug detail)."""
    return _debug["on"]


def set_colour(on: bool | None) -> None:
    """``--color`` (also through a pipe), ``--no-color``, or None: on a TTY unless ``NO_COLOR``."""
    _colour["forced"] = on


def colour_on() -> bool:
    forced = _colour["forced"]
    if forced is not None:
        return forced
    return is_tty() and not os.environ.get("NO_COLOR")


# What may reach a terminal from gpud's human output: text, newline, tab, carriage return (a
# progress line) and, when colour is on, gpud's own SGR colour sequences. Every other control
# character (a clear-screen or title escape in a profile description, a process name, a journal
# summary) is dropped on the way out, whatever the command forgot to clean.
_UNSAFE_COLOUR = re.compile("\x1b(?!\\[[0-9;]*m)|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f-\x9f"
                            "\u202a-\u202e\u2066-\u2069]")
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class SafeStream:
    """A text stream that drops control characters from what is written to it (see above)."""

    def __init__(self, stream: Any) -> None:
        self.raw_stream = stream

    def write(self, text: str) -> int:
        if isinstance(text, str):
            text = (_UNSAFE_COLOUR if colour_on() else _UNSAFE).sub("", text)
        return int(self.raw_stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw_stream, name)


def guard_streams() -> None:
    """Put SafeStream around stdout and stderr (once; the console script calls it)."""
    if not isinstance(sys.stdout, SafeStream):
        sys.stdout = SafeStream(sys.stdout)
    if not isinstance(sys.stderr, SafeStream):
        sys.stderr = SafeStream(sys.stderr)


def clear_screen() -> None:
    """Clear the terminal and home the cursor (``status --watch``): gpud's own escape, not data's."""
    raw = getattr(sys.stdout, "raw_stream", sys.stdout)
    sys.stdout.flush()
    raw.write("\033[2J\033[H")


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


def stderr_width() -> int:
    """As width(), for what goes to stderr (errors, doctor -q)."""
    if os.environ.get("COLUMNS", "").isdigit():
        return max(40, int(os.environ["COLUMNS"]))
    if not sys.stderr.isatty():
        return UNLIMITED
    return max(40, shutil.get_terminal_size((80, 24)).columns)


def echo_err(text: str, indent: str = "    ") -> None:
    """A message on stderr, wrapped between words to the terminal (one line through a pipe)."""
    sys.stderr.write("\n".join(wrap(text, stderr_width(), indent=indent, first="")) + "\n")


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
            parts = [_cell_lines(r[i], widths[i]) for i in cols]
            for j in range(max(len(p) for p in parts)):
                out.append("  ".join(_pad(p[j] if j < len(p) else "", widths[i])
                                     for p, i in zip(parts, cols, strict=True)).rstrip())
    return out


MAX_CELL_LINES = 6  # a longer cell (a journal summary of any length) ends with … on its sixth line


def _cell_lines(text: str, w: int) -> list[str]:
    if visible_len(text) <= w:
        return [text]
    text = text[:w * (MAX_CELL_LINES + 1)]  # wrapping more than can be shown is wasted work
    lines = wrap(text, w)
    lines = [cut(ln, w) if visible_len(ln) > w else ln for ln in lines]  # a word longer than the column
    if len(lines) > MAX_CELL_LINES:
        last = lines[MAX_CELL_LINES - 1]
        lines = lines[:MAX_CELL_LINES - 1] + [last + " " + ELLIPSIS if visible_len(last) + 2 <= w
                                              else cut(last, w - 1) + ELLIPSIS]
    return lines


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    sys.stdout.write("\n".join(table_lines(headers, rows, title)) + "\n")


_BACKTICKED = re.compile(r"`[^`]+`")


def _commands(para: str) -> list[tuple[int, int]]:
    """(start, end) of each `command` in ``para`` with the punctuation that touches it. Linear: the
    touching text is found by scanning out from each pair of backticks, not by a pattern that would
    backtrack over every long word (a 100 000-character argument took minutes)."""
    spans: list[tuple[int, int]] = []
    floor = 0
    for m in _BACKTICKED.finditer(para):
        if m.start() < floor:
            continue
        a, b = m.start(), m.end()
        while a > floor and not para[a - 1].isspace() and para[a - 1] != "`":
            a -= 1
        while b < len(para) and not para[b].isspace() and para[b] != "`":
            b += 1
        spans.append((a, b))
        floor = b
    return spans


def _command_lines(cmd: str, indent: str, limit: int) -> list[str]:
    """A command alone on its line(s): broken only between words, each break a shell continuation."""
    words, lines, line = cmd.split(" "), [], indent
    used, empty = visible_len(indent), True
    for w in words:
        if not empty and used + 1 + len(w) + 2 > limit:
            lines.append(line + " \\")
            line, used = indent + w, visible_len(indent) + len(w)
        else:
            line, used = line + ("" if empty else " ") + w, used + (0 if empty else 1) + len(w)
        empty = empty and not w.strip()
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
        for a, b in _commands(para):
            pieces += [(w, False) for w in para[pos:a].split()]
            pieces.append((para[a:b], True))
            pos = b
        pieces += [(w, False) for w in para[pos:].split()]
        used = visible_len(line)  # kept up to date: measuring the line for every word is quadratic
        for piece, is_cmd in pieces:
            glue = "" if line == lead or line == indent else " "
            size = visible_len(piece)
            if used + len(glue) + size <= limit:
                line += glue + piece
                used += len(glue) + size
                continue
            if line.strip():
                out.append(line)
            if is_cmd and len(indent) + len(piece) > limit:
                cmd_lines = _command_lines(piece, indent, limit)
                out.extend(cmd_lines[:-1])
                line = cmd_lines[-1]
            else:
                line = indent + piece
            used = visible_len(line)
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

