"""How gpud starts a Python child (the probe's ranks, the burn-in's kernels, the daemon's probe, doctor's
torch question): an isolated interpreter in a private working directory with a constructed environment.

gpud runs as root where other people log in, and a child interpreter started the ordinary way trusts
what they can write:

- ``python -m MOD`` and ``python -c CODE`` put the working directory first on ``sys.path``: a ``json.py``
  left where an admin runs ``sudo gpud probe`` would be imported as root. ``-I`` (isolated mode) leaves
  the working directory and the script's directory off ``sys.path`` and ignores every ``PYTHON*``
  variable and the user's site-packages (Python's ``-I``: "Run Python in isolated mode"); the child's
  working directory is gpud's own private one as well, so even an interpreter without ``-I`` finds
  nothing there.
- The environment: only what a child needs is passed on (``KEEP``, ``KEEP_PREFIXES``: the locale, the
  CUDA/NCCL/Gloo/OpenMP settings a person sets for training on purpose, gpud's own ``GPUD_*``); the
  rest (``LD_PRELOAD``, ``PYTHONPATH``, ``BASH_ENV``, a user's ``TMPDIR``…) is not.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

KEEP = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH",
                  "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "JOURNAL_STREAM", "NO_COLOR"})
KEEP_PREFIXES = ("LC_", "GPUD_", "CUDA_", "NCCL_", "GLOO_", "TORCH_", "OMP_", "MKL_", "KMP_", "OPENBLAS_")
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def python(*args: str, interpreter: str | None = None) -> list[str]:
    """The command line of an isolated Python child: ``[python, "-I", *args]``."""
    return [interpreter or sys.executable, "-I", *args]


def environment(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's environment built from ``base`` (this process's by default): the kept names, a safe
    ``PATH`` where there is none, then ``extra``."""
    src = os.environ if base is None else base
    env = {k: v for k, v in src.items() if k in KEEP or k.startswith(KEEP_PREFIXES)}
    env.setdefault("PATH", SAFE_PATH)
    env.update(extra or {})
    return env
