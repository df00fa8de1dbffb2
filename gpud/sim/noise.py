"""Reproducible noise for the simulated GPUs (docs/simulation.md, "Noise and spread").

Several processes read one simulated machine (its state persists in files; each recomputes the physics
from the clock), so a noisy reading must not depend on which process asks or how often: every draw here
is a pure function of (seed, GPU identity, quantity, time bucket), a counter-based generator over
BLAKE2b, never a stateful ``random.Random`` consumed in call order. Two processes that read the same GPU
at the same simulated time see the same value.

``GPUD_SIM_SEED=N`` fixes the realisation; without it each simulated machine draws a seed when its state
is created and keeps it (``SimMachine.seed``). ``GPUD_SIM_NOISE=0`` turns noise and the random per-GPU
variation off: the flat figures of the model, for a test that needs exact ones.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os

OFF = ("0", "off", "false", "no")


def enabled() -> bool:
    """Whether noise and per-GPU variation are on (``GPUD_SIM_NOISE``; on unless it says 0/off)."""
    return os.environ.get("GPUD_SIM_NOISE", "1").strip().lower() not in OFF


def env_seed() -> int | None:
    """``GPUD_SIM_SEED`` as an integer (None: not set, or not a number, which then seeds by its text)."""
    raw = os.environ.get("GPUD_SIM_SEED", "").strip()
    if not raw:
        return None
    try:
        return int(raw, 0)
    except ValueError:
        return int.from_bytes(hashlib.blake2b(raw.encode(), digest_size=8).digest(), "big")


def new_seed() -> int:
    """A fresh seed for a new simulated machine (kept in its state, so all its processes share it)."""
    return int.from_bytes(os.urandom(6), "big")


@functools.lru_cache(maxsize=1 << 16)
def uniform(seed: int, *key: object) -> float:
    """A number in (0, 1), the same for the same seed and key in every process."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / 2.0**64


def gauss(seed: int, *key: object) -> float:
    """A standard normal deviate for (seed, key): Box–Muller over two ``uniform`` draws."""
    u1, u2 = uniform(seed, *key, "u1"), uniform(seed, *key, "u2")
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def bucket(t: float, period: float) -> int:
    """The index of the ``period``-long interval of simulated time that ``t`` falls in."""
    return int(math.floor(t / period))
