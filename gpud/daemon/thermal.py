"""A short history of each GPU's cooling, filled on the tick from the snapshot it already took (no
NVML call of its own): (time, temperature, fan duty, power draw) per GPU, for ``health.fans`` to judge
a fan by the temperature's response over time (a stalled fan reads as the duty asked for). The duty is the
one the last whole snapshot read (every ``WHOLE_EVERY_S``, and at the tick after gpud writes one): what the
fans are asked for changes only by such a write or the driver's policy, and the judgement asks only whether
it fell over a stretch."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from gpud.model import Snapshot, ThermalPoint

# Ten minutes at one point a second: two doctor runs (every 300 s by default) and several thermal time
# constants of a GPU under load; ticks closer than a second add nothing (a fast tick cannot grow it).
SPAN_S = 600.0
EVERY_S = 1.0
MAX_POINTS = int(SPAN_S / EVERY_S)


class ThermalHistory:
    def __init__(self) -> None:
        self._rings: dict[str, deque[ThermalPoint]] = {}

    def add(self, snap: Snapshot) -> None:
        """One point per GPU that gave a temperature, fan duty and draw in this snapshot; a GPU that is
        lost or missing a reading breaks its history (what came before no longer follows on)."""
        for s in snap.samples:
            duties = [f.speed_percent for f in s.fans if f.speed_percent is not None]
            ring = self._rings.setdefault(s.uuid, deque(maxlen=MAX_POINTS))
            if s.lost or s.temperature_celsius is None or s.power_watts is None or not duties:
                ring.clear()
                continue
            if ring and s.timestamp < ring[-1].timestamp:  # the clock went back: start again
                ring.clear()
            if ring and s.timestamp - ring[-1].timestamp < EVERY_S:
                continue
            ring.append(ThermalPoint(s.timestamp, float(s.temperature_celsius), sum(duties) / len(duties),
                                     float(s.power_watts)))
            while ring and s.timestamp - ring[0].timestamp > SPAN_S:
                ring.popleft()

    def points(self) -> Mapping[str, tuple[ThermalPoint, ...]]:
        """A copy by GPU UUID (the doctor thread reads it while the tick goes on)."""
        return {uuid: tuple(ring) for uuid, ring in self._rings.items() if ring}
