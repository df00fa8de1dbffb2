"""What a twin built from a dump took from elsewhere than the dump, and what the dump says that the twin
cannot show: kept by ``build`` and ``place`` as they go, printed with the description."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Notes:
    """What the twin took from elsewhere than the dump, grouped by key across GPUs."""

    inferred: dict[str, list[int]] = field(default_factory=dict)  # "key: why" → GPU indices
    machine: list[str] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # what the dump says that the twin cannot show
    unread_by: dict[str, list[int]] = field(default_factory=dict)  # the same, per GPU

    def gpu(self, i: int, key: str, why: str) -> None:
        self.inferred.setdefault(f"{key}: {why}", []).append(i)

    def not_shown(self, i: int, what: str) -> None:
        self.unread_by.setdefault(what, []).append(i)

    def lines(self, n: int) -> tuple[list[str], list[str]]:
        inferred = list(self.machine)
        for what, gpus in self.inferred.items():
            key, _, why = what.partition(": ")
            inferred.append(f"{_gpus(gpus, n)}.{key}: {why}")
        return inferred, self.unread + [f"{_gpus(g, n)}: {what}" for what, g in self.unread_by.items()]


def _gpus(indices: list[int], n: int) -> str:
    if len(indices) == n and n > 1:
        return "gpu[*]"
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"gpu[{indices[0]}-{indices[-1]}]"
    return "gpu[" + ",".join(map(str, indices)) + "]"
