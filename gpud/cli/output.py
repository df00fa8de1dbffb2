"""Human and machine output: a rich table on a TTY, aligned plain text otherwise, JSON on request."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Sequence

from gpud.model import to_jsonable


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2) + "\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    if is_tty():
        from rich.console import Console  # only when a person is looking
        from rich.table import Table

        t = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
        for h in headers:
            t.add_column(h)
        for row in cells:
            t.add_row(*row)
        Console(no_color=bool(os.environ.get("NO_COLOR")), highlight=False).print(t)
        return
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    out = [title] if title else []
    out.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    out.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)
    sys.stdout.write("\n".join(out) + "\n")


def fmt(value: Any, unit: str = "", none: str = "n/a") -> str:
    if value is None:
        return none
    if isinstance(value, float):
        value = f"{value:.0f}"
    return f"{value}{unit}"
