"""Drive fan curves on real (or simulated) GPUs, one step per daemon tick.

For each GPU whose profile asks for a fan curve (or a fixed duty), a ``FanController`` turns the
tick's temperature into a duty, written only when it changes. Failsafe: an unreadable
temperature, a failed write or a lost GPU hands that GPU's fans back to the driver's automatic
policy at once; the event is logged and counted (``failsafes``), and control resumes on the next
good reading.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.hw.nvml import TEMPERATURE_GPU
from gpud.model import GpuSample
from gpud.profiles.fancurve import FAILSAFE, FanController, FanCurve, FanPolicy, policy_of

log = logging.getLogger("gpud.fans")


@dataclass
class FanEvent:
    gpu: int
    kind: str  # duty | failsafe | reapply
    detail: str


@dataclass
class FanControl:
    machine: Machine
    controllers: dict[int, FanController] = field(default_factory=dict)
    commanded: dict[int, int] = field(default_factory=dict)  # last duty written per GPU
    failsafes: int = 0
    in_failsafe: set[int] = field(default_factory=set)
    unreleased: set[int] = field(default_factory=set)  # GPUs whose fans could not be handed back yet
    settings: dict[int, FanPolicy] = field(default_factory=dict)  # the fan policy each controller follows

    @classmethod
    def from_profile(cls, machine: Machine, desired: dict[int, dict[str, Any]]) -> FanControl:
        fc = cls(machine)
        fc.configure(desired)
        return fc

    def configure(self, desired: dict[int, dict[str, Any]]) -> None:
        """(Re)build the controllers from a profile's per-GPU settings; fans no longer asked for go auto."""
        # A fan setting the plan skipped (a GPU without fans) is "unsupported", not a curve; one that cannot
        # be read as a curve is driven by no one here (`gpud verify` reports the state file).
        wanted: dict[int, tuple[FanPolicy, FanCurve]] = {
            gpu: (policy, curve) for gpu, s in desired.items()
            if (policy := policy_of(s.get("fan"))) is not None and (curve := policy.curve()) is not None}
        for gpu in set(self.controllers) - set(wanted):
            self._to_auto(gpu, "no longer controlled")
            self.controllers.pop(gpu, None)
            self.commanded.pop(gpu, None)
            self.settings.pop(gpu, None)
        for gpu, (fan, curve) in wanted.items():
            if gpu in self.controllers and self.settings.get(gpu) == fan:
                continue  # the same curve: its state (hysteresis, the duty written) stands, nothing is rewritten
            info = self.machine.info(gpu)
            if info is None or not info.fan_count:
                continue
            self.controllers[gpu] = FanController(curve, float(info.fan_min_speed_percent or 0),
                                                  float(info.fan_max_speed_percent or 100))
            self.settings[gpu] = fan
            self.commanded.pop(gpu, None)

    def step(self, samples: tuple[GpuSample, ...] | list[GpuSample], now: float) -> list[FanEvent]:
        events: list[FanEvent] = []
        by_index = {s.index: s for s in samples}
        for gpu, ctl in self.controllers.items():
            s = by_index.get(gpu)
            if s is None or s.lost:
                events.append(self._failsafe(gpu, ctl, "GPU lost"))
                continue
            temp: float | None = s.temperature_celsius
            if temp is None:
                temp = self._read_temperature(gpu)
            duty = ctl.update(None if temp is None else float(temp), now)
            if duty == FAILSAFE:
                events.append(self._failsafe(gpu, ctl, "temperature unreadable"))
                continue
            if gpu in self.in_failsafe:
                log.warning("GPU %d: temperature readable again (%s °C): fans back on the curve", gpu, temp)
            # A driver reload (or another tool) hands the fans back to the automatic policy; NVML then
            # reports them "auto" while gpud believes its duty stands: take them back at once.
            ours = gpu in self.commanded and gpu not in self.in_failsafe
            seen = [f.policy for f in s.fans]
            if ours and self.commanded.get(gpu) != duty and not any(p not in ("manual", None) for p in seen):
                # The sample's policies are up to 10 s old (slow fields), and a speed write takes the fan back
                # to manual (nvml.h, nvmlDeviceSetFanSpeed_v2): asked afresh before one, so a reset the write
                # would undo unseen is still counted and logged.
                seen = [self._fan_policy(gpu, fan) for fan in range(len(s.fans))]
            taken = ours and any(p not in ("manual", None) for p in seen)
            if taken:
                policies = "/".join(sorted({str(p) for p in seen if p not in ("manual", None)}))
                log.warning("GPU %d: fans found on the %s policy, not gpud's curve (a driver reload or another "
                            "tool): curve re-applied", gpu, policies)
                events.append(FanEvent(gpu, "reapply", f"fans were on the {policies} policy: curve re-applied"))
            elif self.commanded.get(gpu) == duty and gpu not in self.in_failsafe:
                continue
            try:
                for fan in range(len(s.fans)):
                    self.machine.nvml.set_fan_speed(gpu, fan, duty)
            except GpudError as err:
                events.append(self._failsafe(gpu, ctl, f"fan write failed: {err}"))
                continue
            self.commanded[gpu] = duty
            self.in_failsafe.discard(gpu)
            events.append(FanEvent(gpu, "duty", f"{duty} % at {temp} °C"))
        return events

    def failsafe_all(self, why: str) -> list[FanEvent]:
        """No reading at all this tick (the driver or NVML failed): every controlled fan back to the
        driver's automatic policy, each counted and logged once, as for a single lost GPU."""
        return [self._failsafe(gpu, ctl, why) for gpu, ctl in self.controllers.items()]

    def _fan_policy(self, gpu: int, fan: int) -> str | None:
        try:
            return self.machine.nvml.fan_policy(gpu, fan)
        except GpudError:
            return None

    def _read_temperature(self, gpu: int) -> float | None:
        """Ask NVML again, past its cache of what a GPU "does not support": a GPU whose curve was
        configured did report its temperature, so a failure now is a fault that may clear."""
        n = self.machine.nvml
        try:
            value = n.call("nvmlDeviceGetTemperature", n.handle(gpu), TEMPERATURE_GPU, gpu=gpu)
        except GpudError:
            return None
        return float(value) if isinstance(value, (int, float)) else None

    def _failsafe(self, gpu: int, ctl: FanController, why: str) -> FanEvent:
        ctl.reset()
        self.commanded.pop(gpu, None)
        if gpu not in self.in_failsafe:
            self.failsafes += 1
            self.in_failsafe.add(gpu)
            log.warning("GPU %d: fan failsafe (%s): handing the fans back to the driver's automatic policy", gpu, why)
            self._to_auto(gpu, why)
        elif gpu in self.unreleased:
            self._to_auto(gpu, why)  # tried again every tick, logged only when the outcome changes
        return FanEvent(gpu, "failsafe", why)

    def _to_auto(self, gpu: int, why: str) -> None:
        info = self.machine.info(gpu)
        failed = None
        for fan in range(info.fan_count or 0 if info else 0):
            try:
                self.machine.nvml.set_fan_auto(gpu, fan)
            except GpudError as err:
                failed = (fan, err)
        if failed is not None and gpu not in self.unreleased:
            log.error("GPU %d: fan %d could not be handed back (%s): %s", gpu, failed[0], why, failed[1])
            self.unreleased.add(gpu)
        elif failed is None and gpu in self.unreleased:
            log.warning("GPU %d: fans handed back to the driver's automatic policy", gpu)
            self.unreleased.discard(gpu)

    def release(self) -> None:
        """Every controlled fan back to the automatic policy (shutdown)."""
        for gpu in list(self.controllers):
            self._to_auto(gpu, "gpud stopping")
        self.commanded.clear()
