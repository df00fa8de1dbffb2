"""Logging: plain lines to stderr; under systemd (JOURNAL_STREAM set) no timestamps."""

from __future__ import annotations

import logging
import os
import sys


def setup(level: str = "INFO") -> None:
    fmt = "%(levelname)s %(name)s: %(message)s" if os.environ.get("JOURNAL_STREAM") else \
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger("gpud")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
