"""Run the command line in a pseudo-terminal of a given size, as a person at a terminal would."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_in_pty(*args: str, columns: int = 80, env: dict[str, str] | None = None,
               timeout: float = 240) -> tuple[int, str]:
    """(exit status, output with \\r\\n made \\n); colour codes kept."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    full = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR", "GPUD_DEBUG")}
    full |= {"TERM": "xterm-256color", **(env or {})}
    p = subprocess.Popen([sys.executable, "-m", "gpud", *args], stdin=slave, stdout=slave, stderr=slave,
                         env=full, cwd=REPO, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed its side
                    break
                if not data:
                    break
                chunks.append(data)
            elif p.poll() is not None:
                break
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
        p.wait()
    return p.returncode, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


def plain(text: str) -> str:
    return ANSI.sub("", text)


def screen_lines(text: str) -> list[str]:
    """The lines as the terminal shows them: a carriage return starts the line over (progress bars)."""
    return [line.split("\r")[-1] if line.split("\r")[-1] else line.rstrip("\r").split("\r")[-1]
            for line in plain(text).split("\n")]


def too_wide(text: str, columns: int = 80) -> list[str]:
    return [line for line in plain(text).split("\n") if any(len(seg) > columns for seg in line.split("\r"))]
