"""The probe's errors: a launch that failed (with what it had measured), and a probe refused because
another one, or a job, holds the machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpud.errors import GpudError


class ProbeError(GpudError):
    remedy = "the failing rank's last output is above (all ranks' logs: the directory named); check `gpud doctor`"

    def __init__(self, message: str, partial: dict[str, Any] | None = None, hung: dict[str, Any] | None = None,
                 logs: Path | None = None) -> None:
        super().__init__(message)
        self.partial = partial  # what rank 0 had measured before the launch failed
        self.hung = hung  # the P2P pair that passed its deadline: its progress line
        self.logs = logs


class ProbeBusy(ProbeError):
    remedy = "wait for the other probe or job to finish (`gpud status`, `nvidia-smi`), or pass --allow-busy"
