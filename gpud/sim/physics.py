"""The simulated workstation's physics: heat, fans, power, clocks and clock-event reasons, and
the counters that advance with time (energy, PCIe bytes, the violation counters, NVLink data).

``Physics`` is the half of ``SimMachine`` that turns the persisted settings and faults (its other
half, ``gpud.sim.machine``) and simulated time into readings: a first-order thermal model per GPU
integrated in 1 s steps, the driver's automatic fan curve, the power cap and its clocks (``gpud.sim.perf``: ``f·V²``),
and the clock-event reasons NVML reports (one set, from ``clock_event_reasons``, gives both the mask and
the violation counters it advances). It holds no state of its own but the integrated ``Thermal``
values; the settings it reads are the machine's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from gpud.sim import noise, perf

if TYPE_CHECKING:
    from gpud.sim.description import Description
    from gpud.sim.faults import Fault

# Effective cooling keeps 30 % with the fan stopped (chassis airflow, heatsink).
PASSIVE_SHARE = 0.3
TIME_CONSTANT_S = 30.0
# A GPU reading below the ambient is taken to sit this far above the (colder) air at its inlet: an
# assumption (nvidia-smi prints no inlet temperature), so that its load heats it as a warmer one's does.
COLD_RISE_K = 10.0
AUTO_FAN_T0, AUTO_FAN_T1 = 40.0, 87.0  # driver curve: minimum duty at T0, 100 % at T1
# Above the model's target temperature the automatic policy adds this much duty per kelvin (a model of the
# driver's controller holding "GPU Target Temperature"; its gain is not published)
TARGET_FAN_GAIN = 10.0
CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM = 0, 1, 2  # nvmlClockType_t
EVENT_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8,
              "sync_boost": 0x10, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40,
              "hw_power_brake_slowdown": 0x80, "display_clock_setting": 0x100}  # nvmlClocksEventReasons
# Clock-event reasons with an NVML violation counter (nvml.h: NVML_FI_DEV_CLOCKS_EVENT_REASON_*, in ns).
VIOLATION_REASONS = ("sw_power_cap", "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                     "hw_power_brake_slowdown")
NVLINK_LINK_BYTES_S = 25e9  # one NVLink 4 link, one direction (HGX H200: 18 links, 450 GB/s each way)
# A GEMM stress (gpu-burn, DCGM's targeted stress) asks more power than the board may draw, so the
# power cap binds and NVML reports SW Power Cap (docs/simulation.md, "Load from the burn-in").
STRESS_DEMAND_SHARE = 1.1  # demand as a share of the board's maximum power limit
NVLINK_LOAD_SHARE = 0.5  # share of a link's bandwidth a fully busy GPU moves (a model, not a measurement)
# Thermal protection (docs/simulation.md, "Thermal protection"). HW slowdown "reduc[es] the core clocks by
# a factor of 2 or more" (nvml.h): the least cut, a half, leaves the GPU hottest, the stricter model.
HW_SLOWDOWN_SHARE = 0.5
# SW thermal slowdown lowers the clocks from the max operating temperature on; by how much the driver's
# controller goes is not published: a mild cut (a model), so a stalled fan still climbs to HW slowdown.
SW_THERMAL_SHARE = 0.85
# A GPU at its shutdown temperature powers off and falls off the bus: Xid 79, whose causes NVIDIA's Xid
# documentation lists as hardware, driver, system-memory, bus "or thermal" issues.
THERMAL_SHUTDOWN_XID = 79
# -- noise and spread (docs/simulation.md, "Noise and spread"; off with GPUD_SIM_NOISE=0) -----------------
# GPU Boost's table moves the clock in bins of 15 MHz on Turing, Ampere, Ada and Hopper (nvidia-smi -q -d
# SUPPORTED_CLOCKS lists the graphics clocks 15 MHz apart: 2100, 2085, … on an RTX A6000).
CLOCK_STEP_MHZ = 15
# Same-model GPUs differ: 8 % (max 22 %) average performance variation across the V100s of four clusters,
# outliers 1.5x slower (Sinha et al., SC22), from manufacturing variability under power management. The
# default here is modest: each GPU's draw at a given clock differs from its model's by a normal share of
# sigma 2 % (so a power cap leaves each its own clock), cut at 3 sigma; a description sets it per GPU.
SILICON_SIGMA = 0.02
# Coolers differ from card to card (heatsink contact, paste, fan unit): sigma 2 % of the conductance (an
# assumption; no measurement of it was found), so siblings under one load read different temperatures.
COOLER_SIGMA = 0.02
# A load's draw at a given clock moves from second to second with what its kernels do (an assumption:
# 1 % per second); under a cap the clock follows it, so it dithers across the bins around the limit.
DEMAND_CV = 0.01
# What the power sensor reads beside the true draw: a sample's ripple, sigma 2 % of the draw (an assumption
# of the size; Yang, Adamek, Armour, SC24, show readings of steady kernels scatter), one sample per 100 ms;
# an averaged sensor (nvmlDeviceGetPowerUsage on Ampere except GA100 and newer: "averaged over 1 sec")
# averages 10 of them, a partial one (A100/H100: only 25 % of the runtime is sampled, SC24) 2.5.
POWER_RIPPLE = 0.02
POWER_SAMPLES_PER_S = 10.0
PARTIAL_COVERAGE = 0.25
# The sensor's update period: 1 s (torch.cuda.power_draw: "each sample period may be between 1 second and
# 1/6 second, depending on the product"; the slower end, the stricter), and the temperature sensor's
# noise before NVML's whole degrees: sigma 0.3 K (an assumption), so a steady GPU flickers a degree.
SENSOR_PERIOD_S = 1.0
TEMP_SIGMA_K = 0.3
# Cards that breathe a neighbour's exhaust run hotter: a GPU's intake air warms by 0.3 K per 100 W its
# neighbours (the GPUs next to it in index order, taken to sit in the adjacent slots) draw above their
# described draw. Only cards with fans (workstation blowers); an assumption of the size.
SLOT_PREHEAT_K_PER_100W = 0.3


def auto_fan_percent(temp: float, minimum: int) -> int:
    """The driver's automatic fan policy, as the simulator models it."""
    frac = (temp - AUTO_FAN_T0) / (AUTO_FAN_T1 - AUTO_FAN_T0)
    return int(round(min(100.0, max(float(minimum), minimum + frac * (100 - minimum)))))


def _cooling(duty: float) -> float:
    return PASSIVE_SHARE + (1 - PASSIVE_SHARE) * duty / 100.0


@dataclass
class Thermal:
    temperature: float
    conductance: float  # W/K at full fan
    capacity: float  # J/K
    energy_mj: float
    ambient: float = 25.0  # the air the GPU sheds heat to (below the room's for a GPU that reads colder)
    pcie_tx_bytes: float = 0.0  # cumulative, as NVML_FI_DEV_PCIE_COUNT_TX_BYTES
    pcie_rx_bytes: float = 0.0
    violation_ns: dict[str, float] = field(default_factory=dict)  # per reason since boot (field values 74…271)
    nvlink_kib: dict[int, float] = field(default_factory=dict)  # data per link and direction since start, KiB
    intake: float | None = None  # the air the GPU's cooler takes in, °C (None: the machine's ambient)
    described_draw: float = 0.0  # the draw of the described state (the slot's preheat counts from it)
    recent: list[tuple[float, float]] = field(default_factory=list)  # (seconds, W) of the last second's steps


class Physics:
    """Time, load, heat, fans, power and clocks of a ``SimMachine`` (mixed into it)."""

    desc: Description
    clock: Callable[[], float]
    offset: float  # simulated seconds added by advance()
    thermal: list[Thermal]
    _last: float
    state: dict[str, Any]  # the machine's persisted state (its boot number here)
    _boot_seen: int
    noisy: bool  # noise and random per-GPU variation on (GPUD_SIM_NOISE)
    _env_seed: int | None  # GPUD_SIM_SEED
    _t0: float  # noise buckets count from it: the physics' start, then this process's first nvmlInit
    # Whether an NVLink is up (the NVML library sets it: link state is its business).
    nvlink_up: Callable[[int, int], bool]

    def settings(self, gpu: int) -> dict[str, Any]:  # pragma: no cover - SimMachine's
        raise NotImplementedError

    def boot_time(self) -> int:  # pragma: no cover - SimMachine's
        raise NotImplementedError

    def faults_of(self, kind: str, gpu: int | None = None) -> list[Fault]:  # pragma: no cover
        raise NotImplementedError

    def lost(self, gpu: int) -> bool:  # pragma: no cover - SimMachine's
        raise NotImplementedError

    def inject(self, kind: str, **params: Any) -> Fault:  # pragma: no cover - SimMachine's
        raise NotImplementedError

    def start_physics(self) -> None:
        """Calibrate each GPU's thermal model to its described state; simulated time starts now."""
        self.nvlink_up = lambda gpu, link: True
        self.noisy = noise.enabled()
        self._env_seed = noise.env_seed()
        self._t0 = self.clock() + self.offset
        self.thermal = [self._calibrate(i) for i in range(len(self.desc.gpus))]
        self._boot_seen = int(self.state.get("boot", 0))
        self._last = self.now()

    # -- noise and spread -------------------------------------------------------------------
    @property
    def seed(self) -> int:
        """The realisation: ``GPUD_SIM_SEED``, else the one the machine drew when its state was created
        (so every process of one machine shares it), else one derived from the description."""
        if self._env_seed is not None:
            return self._env_seed
        kept = self.state.get("seed")
        return int(kept) if kept is not None else int(self.desc.digest or "0", 16)

    def gauss(self, gpu: int, quantity: str, *key: object) -> float:
        """A standard normal deviate for this GPU and quantity: a pure function of the seed, the GPU's UUID
        and ``key`` (a time bucket), the same in every process (``gpud.sim.noise``)."""
        return noise.gauss(self.seed, self.desc.gpus[gpu].uuid, quantity, *key)

    def bucket(self, at: float | None = None, period: float = SENSOR_PERIOD_S) -> int:
        """The interval of this process's simulated time (since its physics started) ``at`` falls in."""
        return noise.bucket((self.now() if at is None else at) - self._t0, period)

    def power_factor(self, gpu: int) -> float:
        """This GPU's draw at a given clock against its model's: the description's ``power_variation``, else
        drawn from the seed (``SILICON_SIGMA``, cut at 3 sigma), else 1 with noise off."""
        g = self.desc.gpus[gpu]
        if g.power_variation is not None:
            return 1.0 + float(g.power_variation)
        if not self.noisy:
            return 1.0
        return 1.0 + SILICON_SIGMA * max(-3.0, min(3.0, self.gauss(gpu, "silicon")))

    def boost_mhz(self, gpu: int) -> float:
        """The clock a loaded GPU's performance model counts from: the rated boost (at most the maximum)."""
        g = self.desc.gpus[gpu]
        return float(min(g.boost_sm_mhz or g.max_sm_mhz, g.max_sm_mhz) or g.max_sm_mhz)

    # -- load and thermal model ----------------------------------------------------------
    def now(self) -> float:
        return self.clock() + self.offset

    def advance(self, seconds: float) -> None:
        """Move simulated time forward (tests, closed-loop fan control)."""
        self.offset += seconds
        self.step()

    def utilization(self, gpu: int) -> int:
        load = self.settings(gpu).get("load")
        return int(load[0]) if load else int(self.desc.gpus[gpu].utilization_percent)

    def demand_watts(self, gpu: int, at: float | None = None) -> float:
        """What the load draws at its full clock: the load set, or the described draw, which a GPU read
        in thermal slowdown drew at its cut clock (the full-clock demand is then that much higher). A load
        set at run time draws this GPU's own share (``power_factor``) and, under noise, moves from second
        to second (``DEMAND_CV``) around it."""
        load = self.settings(gpu).get("load")
        if load:
            demand = float(load[1]) * self.power_factor(gpu)
            if self.noisy and int(load[0]) > 0:
                demand *= 1.0 + DEMAND_CV * max(-4.0, min(4.0, self.gauss(gpu, "demand", self.bucket(at))))
            return demand
        g = self.desc.gpus[gpu]
        cut = self.thermal_share(gpu, float(g.temperature_celsius), described=True)
        return float(g.power_watts) / perf.power_share(cut)

    def stress_demand_watts(self, gpu: int) -> float:
        """What a GEMM stress asks of the board: more than its maximum limit (``STRESS_DEMAND_SHARE``)."""
        return float(self.desc.gpus[gpu].power_max_watts) * STRESS_DEMAND_SHARE

    def enforced_limit_watts(self, gpu: int) -> float:
        """The limit the GPU holds to: the one set, or lower where the board's or module's power budget
        holds it (a GH200 set to 900 W enforces 700 W: ``power_enforced_watts``)."""
        limit = float(self.settings(gpu)["power_limit_mw"]) / 1000.0
        budget = self.desc.gpus[gpu].power_enforced_watts
        return min(limit, float(budget)) if budget is not None else limit

    def thermal_share(self, gpu: int, temp: float, described: bool = False, faults: bool = True) -> float:
        """The share of its clock ceiling a GPU at ``temp`` keeps: half in HW slowdown (from the slowdown
        temperature), ``SW_THERMAL_SHARE`` in SW thermal slowdown (from the max operating one), else all.
        A ``clock_events`` fault's HW or SW thermal slowdown cuts it as well (``described``: only the
        description's own faults, the state its readings were taken in; not ``faults``: none)."""
        g = self.desc.gpus[gpu]
        found = ([] if not faults else
                 [f for f in self.desc.faults if f.kind == "clock_events" and f.gpu == gpu] if described
                 else self.faults_of("clock_events", gpu))
        reasons = {r for f in found for r in f.reasons}
        if temp >= g.slowdown_celsius or reasons & {"hw_slowdown", "hw_thermal_slowdown"}:
            return HW_SLOWDOWN_SHARE
        hot = g.max_operating_celsius is not None and temp >= g.max_operating_celsius
        if hot or "sw_thermal_slowdown" in reasons:
            return SW_THERMAL_SHARE
        return 1.0

    def power_state(self, gpu: int, temp: float | None = None, at: float | None = None) -> tuple[float, float, bool]:
        """(SM clock share, draw in W, whether the power cap binds), from the performance model
        (``gpud.sim.perf``): a loaded GPU's locked clock caps the share and lowers the draw; a thermal
        slowdown at ``temp`` (the current temperature) lowers that ceiling, and the draw falls with the
        clock: in SW thermal slowdown the driver takes the clock down as far as holds the temperature
        (the draw the cooling sheds there), no further than ``SW_THERMAL_SHARE``; HW slowdown halves it.
        A limit below the draw at the clock left lowers the clock until the draw meets it: the lowest
        limiter wins, as in GPU Boost. A GPU lost (shut down, off the bus) draws nothing. Shares count from
        the rated boost clock (``boost_mhz``). Under noise the clock sits in the boost table's bins: under a
        cap it dithers between the bins either side of where the draw meets the limit (the time spent in
        the upper one is the fraction that keeps the mean draw at the limit), held lower by a thermal
        slowdown it takes the bin below; ``at``: the time whose second's noise applies (default now)."""
        g, s = self.desc.gpus[gpu], self.settings(gpu)
        if self.lost(gpu):
            return 0.0, 0.0, False
        top = 1.0
        ref = self.boost_mhz(gpu)
        if s["locked_gpu"] and self.utilization(gpu) > 0 and g.max_sm_mhz:
            top = min(1.0, float(s["locked_gpu"][1]) / ref)
        mem = 1.0  # a locked memory clock below the maximum saves the DRAM interface's share (gpud.sim.perf)
        if s["locked_mem"] and self.utilization(gpu) > 0 and g.max_memory_mhz:
            mem = min(1.0, float(s["locked_mem"][1]) / float(g.max_memory_mhz))
        t = self.temperature(gpu) if temp is None else temp
        cut = self.thermal_share(gpu, t, faults=False)
        demand = self.demand_watts(gpu, at)
        ceiling = top * cut
        if gpu < len(getattr(self, "thermal", [])) and cut < 1.0 and t >= (g.max_operating_celsius or t):
            held = perf.capped_share(top, demand, self.heat_loss(gpu, t), mem)[0]  # the clock that holds t
            if cut == SW_THERMAL_SHARE:  # the driver goes no lower than its floor
                ceiling = max(ceiling, held)
            elif t >= g.slowdown_celsius:  # half, "or more": as far as holds it, down to the idle clock
                floor = top * float(g.idle_sm_mhz or 0) / (ref or 1.0)
                ceiling = min(ceiling, max(held, floor))
        share, draw, capped = perf.capped_share(ceiling, demand, self.enforced_limit_watts(gpu), mem)
        # a clock_events fault's slowdown: that much slower than the limiters leave it (beyond the cut its
        # temperature already makes)
        injected = self.thermal_share(gpu, float("-inf"))
        if injected < cut:
            share *= injected / cut
            draw = demand * (perf.power_share(share) - perf.memory_saving(mem))
            # the injected cut is then the lowest limiter: the draw is below the limit, and the power cap,
            # which would let the clock rise to meet it, holds nothing back (GPU Boost: the lowest wins)
            capped = capped and draw >= self.enforced_limit_watts(gpu)
        if self.noisy and ref and 0 < share < top - 1e-9:
            share = self._binned(gpu, share, capped, ref, at)
            draw = demand * (perf.power_share(share) - perf.memory_saving(mem))
        return share, draw, capped

    def _binned(self, gpu: int, share: float, capped: bool, ref: float, at: float | None) -> float:
        """``share`` in the boost table's bins: under a cap one of the two either side, the upper one with
        the probability of its distance (so the clock's mean is where the draw meets the limit); otherwise
        the bin below (a thermal limit is not exceeded)."""
        mhz = share * ref
        lo = math.floor(mhz / CLOCK_STEP_MHZ + 1e-9) * CLOCK_STEP_MHZ
        frac = (mhz - lo) / CLOCK_STEP_MHZ
        up = capped and noise.uniform(self.seed, self.desc.gpus[gpu].uuid, "dither", self.bucket(at)) < frac
        return float(lo + (CLOCK_STEP_MHZ if up else 0)) / ref

    def heat_loss(self, gpu: int, temp: float) -> float:
        """What the GPU's cooling sheds at ``temp``, W (its fans as they turn)."""
        th = self.thermal[gpu]
        return max(0.0, (temp - self.intake(gpu)) * th.conductance * _cooling(self._mean_duty(gpu, temp)))

    def intake(self, gpu: int) -> float:
        """The air the GPU's cooler takes in, °C: the machine's (or its calibrated intake), warmed under
        noise by its neighbours' exhaust (``SLOT_PREHEAT_K_PER_100W``)."""
        th = self.thermal[gpu]
        base = th.ambient if th.intake is None else th.intake
        if not self.noisy or not self.desc.gpus[gpu].fans:
            return base
        extra = 0.0
        for j in (gpu - 1, gpu + 1):
            if 0 <= j < len(self.thermal) and self.desc.gpus[j].fans:
                extra += max(0.0, self.recent_draw(j) - self.thermal[j].described_draw)
        return base + SLOT_PREHEAT_K_PER_100W * extra / 100.0

    def recent_draw(self, gpu: int) -> float:
        """The mean draw over the last second of integrated steps, W (the described draw before any)."""
        th = self.thermal[gpu]
        secs = sum(dt for dt, _ in th.recent)
        return sum(dt * w for dt, w in th.recent) / secs if secs > 0 else th.described_draw

    def draw_watts(self, gpu: int, temp: float | None = None) -> float:
        return self.power_state(gpu, temp)[1]

    def intended_duty(self, gpu: int, fan: int, temp: float | None = None) -> int:
        """What the fan is asked to do: the manual target, or the driver's curve. This is what NVML
        reports as the fan's speed, whether or not the fan turns."""
        f = self.settings(gpu)["fans"][fan]
        if f["policy"] == 1 and f["target"] is not None:
            return int(f["target"])
        t = self.temperature(gpu) if temp is None else temp
        return self.auto_duty(gpu, t)

    def auto_duty(self, gpu: int, temp: float) -> int:
        """The driver's automatic policy at ``temp``: the curve, or, where the description gives the speed
        a real GPU showed (``fan_percent``), the curve moved to pass through it at the described
        temperature (a zero-RPM fan stays stopped until the GPU warms past its reading)."""
        g = self.desc.gpus[gpu]
        curve = auto_fan_percent(temp, g.fan_min_percent or 0)
        if g.fan_percent is not None:
            shift = int(g.fan_percent) - auto_fan_percent(float(g.temperature_celsius), g.fan_min_percent or 0)
            curve = max(min(int(g.fan_percent), int(g.fan_min_percent or 0)), min(100, curve + shift))
        if g.target_celsius is not None and temp > g.target_celsius:
            # above its "GPU Target Temperature" the driver speeds the fan up to hold it there (what the
            # target is for), so a card a little warmer than its model (cooler, slot) still holds it
            curve = min(100, int(round(curve + TARGET_FAN_GAIN * (temp - g.target_celsius))))
        return curve

    def fan_duty(self, gpu: int, fan: int, temp: float | None = None) -> int:
        """What the fan really does (cools with): the stuck value of a failed fan, else as asked."""
        for p in self.faults_of("fan_stuck", gpu):
            if p.fan == fan:
                return int(p.percent)
        t = self.thermal[gpu].temperature if temp is None else temp
        return self.intended_duty(gpu, fan, t)

    def pcie_rates(self, gpu: int) -> tuple[float, float]:
        """(TX, RX) bytes per second on the GPU's PCIe link now: proportional to utilisation."""
        u = self.utilization(gpu)
        return u * 40960 * 1024.0, u * 81920 * 1024.0

    def pcie_counters(self, gpu: int) -> tuple[int, int]:
        self.step()
        th = self.thermal[gpu]
        return int(th.pcie_tx_bytes), int(th.pcie_rx_bytes)

    def _mean_duty(self, gpu: int, temp: float | None = None) -> float:
        n = self.desc.gpus[gpu].fans
        if not n:
            return 100.0  # passive card: the chassis fans do the work
        return float(sum(self.fan_duty(gpu, f, temp) for f in range(n))) / int(n)

    def _calibrate(self, gpu: int) -> Thermal:
        """Choose conductance so the described temperature is the equilibrium as described."""
        g = self.desc.gpus[gpu]
        amb = float(self.desc.machine.ambient_celsius)
        temp = float(g.temperature_celsius)
        draw = min(float(g.power_watts), float(g.power_limit_watts))
        # A GPU that reads below the room's temperature (an idle GPU in a cold machine room, a vGPU
        # guest's 0 °C) sheds its heat to colder air than the description's ambient: the described
        # temperature stays the equilibrium, COLD_RISE_K above that air.
        if temp < amb:
            amb = temp - COLD_RISE_K
        rise = max(temp - amb, 1.0)
        # Calibrate against the described state (faults from the description apply; a fan
        # settings written later change the equilibrium, as they would on real hardware).
        duty = self._described_duty(gpu, temp)
        conductance = draw / (rise * _cooling(duty))
        intake = None
        fit = self._two_point(gpu, temp, draw, duty)
        if fit is not None:
            conductance, intake = fit
        if self.noisy and draw > 0:
            # this card's cooler against its model's (COOLER_SIGMA); its intake is what keeps the described
            # reading the equilibrium (a twin still reads its dump), the spread shows as the load heats it
            conductance *= 1.0 + COOLER_SIGMA * max(-3.0, min(3.0, self.gauss(gpu, "cooler")))
            intake = temp - draw / (conductance * _cooling(duty))
        th = Thermal(temp, conductance, conductance * TIME_CONSTANT_S, 3.6e9 + gpu * 1.1e8, amb,
                     intake=intake, described_draw=draw)
        # The violation counters count from boot: the machine has been in its described state since, so
        # every process (and every reader) starts from the same totals, and a reboot starts them again.
        since_boot = max(0.0, time.time() - float(self.state.get("counters_since") or self.boot_time()))
        active = self.clock_event_reasons(gpu, temp)
        th.violation_ns = {r: since_boot * 1e9 if r in active else 0.0 for r in VIOLATION_REASONS}
        return th

    def _two_point(self, gpu: int, temp: float, draw: float, duty: float) -> tuple[float, float] | None:
        """For an idle GPU of a model whose target temperature is known: the conductance and intake air
        temperature that make both the described state and the target temperature at the default power
        limit (with the automatic fan) equilibria (docs/simulation.md, "Thermal model"). None otherwise."""
        g = self.desc.gpus[gpu]
        target = g.target_celsius
        if target is None or draw > 1.5 * float(g.idle_power_watts) or temp >= target:
            return None
        loaded = float(g.power_default_watts) / _cooling(auto_fan_percent(float(target), g.fan_min_percent or 0)
                                                          if g.fans else 100.0)
        idle = draw / _cooling(duty)
        conductance = (loaded - idle) / (target - temp)
        if conductance <= 0:
            return None
        return conductance, temp - idle / conductance

    def _described_duty(self, gpu: int, temp: float) -> float:
        g = self.desc.gpus[gpu]
        n = g.fans
        if not n:
            return 100.0
        duties = []
        for fan in range(n):
            stuck = [f for f in self.desc.faults if f.kind == "fan_stuck" and f.gpu == gpu and f.fan == fan]
            duties.append(stuck[0].percent if stuck else self.auto_duty(gpu, temp))
        return float(sum(duties)) / int(n)

    def step(self) -> None:
        """Integrate the thermal model up to now (1 s steps; calls closer than 50 ms apart do nothing)."""
        now = self.now()
        if int(self.state.get("boot", 0)) != self._boot_seen:  # rebooted (here or by another process)
            self._boot_seen = int(self.state.get("boot", 0))
            for gpu, th in enumerate(self.thermal):  # the driver's counters start again
                fresh = self._calibrate(gpu)
                th.violation_ns, th.nvlink_kib = fresh.violation_ns, {}
        dt_total = now - self._last
        if dt_total < 0.05:
            return
        self._last = now
        remaining = dt_total
        while remaining > 1e-9:  # each 1 s step for every GPU (a neighbour's exhaust is of the same step)
            dt = min(1.0, remaining)
            at = now - remaining
            intakes = [self.intake(gpu) for gpu in range(len(self.thermal))]
            for gpu, th in enumerate(self.thermal):
                draw = self.power_state(gpu, th.temperature, at)[1]
                loss = (th.temperature - intakes[gpu]) * th.conductance * _cooling(self._mean_duty(gpu))
                th.temperature += (draw - loss) / th.capacity * dt
                th.energy_mj += draw * dt * 1000.0
                th.recent.append((dt, draw))
                while len(th.recent) > 1 and sum(d for d, _ in th.recent[1:]) >= SENSOR_PERIOD_S:
                    th.recent.pop(0)
                tx, rx = self.pcie_rates(gpu)
                th.pcie_tx_bytes += tx * dt
                th.pcie_rx_bytes += rx * dt
                self._count_violations_and_links(gpu, th, dt)
                if th.temperature >= self.desc.gpus[gpu].shutdown_celsius and not self.lost(gpu):
                    self._thermal_shutdown(gpu, now - remaining + dt)
            remaining -= dt

    def _thermal_shutdown(self, gpu: int, at: float) -> None:
        """The GPU reached its shutdown temperature: it powers off and is lost to the driver until the
        machine reboots (as an injected ``gpu_lost`` is), and the kernel logs Xid 79 at that moment."""
        since_boot = time.time() + (at - self.now()) + self.offset - float(self.boot_time())
        self.inject("gpu_lost", gpu=gpu)
        self.inject("xid", gpu=gpu, xid=THERMAL_SHUTDOWN_XID, seconds=round(max(0.0, since_boot), 1))

    def _count_violations_and_links(self, gpu: int, th: Thermal, dt: float) -> None:
        """The same physics that sets the clock-event reasons advances their violation counters; a busy
        GPU moves data over each NVLink that is up."""
        g = self.desc.gpus[gpu]
        if g.violation_counters:
            active = self.clock_event_reasons(gpu, th.temperature)
            for r in VIOLATION_REASONS:
                if r in active:
                    th.violation_ns[r] = th.violation_ns.get(r, 0.0) + dt * 1e9
        if g.nvlink_throughput:
            kib_s = self.utilization(gpu) / 100.0 * NVLINK_LOAD_SHARE * NVLINK_LINK_BYTES_S / 1024.0
            for link in range(int(g.nvlinks or 0)):
                if kib_s and self.nvlink_up(gpu, link):
                    th.nvlink_kib[link] = th.nvlink_kib.get(link, 0.0) + kib_s * dt

    def temperature(self, gpu: int) -> float:
        self.step()
        return self.thermal[gpu].temperature

    def temperature_reading(self, gpu: int) -> int:
        """What NVML's sensor reads, in whole degrees (``nvmlDeviceGetTemperature``): under noise with the
        sensor's scatter (``TEMP_SIGMA_K``), one reading per ``SENSOR_PERIOD_S``."""
        t = self.temperature(gpu)
        if self.noisy:
            t += TEMP_SIGMA_K * self.gauss(gpu, "temperature", self.bucket())
        return int(round(t))

    def power_reading_mw(self, gpu: int) -> int:
        """What ``nvmlDeviceGetPowerUsage`` reads, mW. Without noise the draw now. With it, as the model's
        sensor gives it (``power_sensor``): an instantaneous sample with its ripple, or the mean of the last
        second (which lags a change of load by up to that second) with the ripple of its samples averaged:
        10 of them, or a quarter of that where only part of each interval is sampled (SC24)."""
        if not self.noisy:
            return int(self.draw_watts(gpu) * 1000)
        kind = self.desc.gpus[gpu].power_sensor
        if kind == "instant":
            draw, sigma = self.draw_watts(gpu), POWER_RIPPLE
        else:
            self.step()
            draw = self.recent_draw(gpu) if self.thermal[gpu].recent else self.draw_watts(gpu)
            if self.lost(gpu):
                draw = 0.0
            samples = POWER_SAMPLES_PER_S * SENSOR_PERIOD_S * (PARTIAL_COVERAGE if kind == "partial" else 1.0)
            sigma = POWER_RIPPLE / math.sqrt(samples)
        ripple = 1.0 + sigma * max(-4.0, min(4.0, self.gauss(gpu, "power", self.bucket())))
        return int(max(0.0, draw * ripple) * 1000)

    def violation_ns(self, gpu: int) -> dict[str, int]:
        """Time in each reason with a violation counter since boot, ns (``VIOLATION_REASONS``)."""
        self.step()
        return {r: int(v) for r, v in self.thermal[gpu].violation_ns.items()}

    def nvlink_kib(self, gpu: int, link: int) -> int:
        """Data over NVLink ``link`` since the driver started, KiB (either direction)."""
        self.step()
        return int(self.thermal[gpu].nvlink_kib.get(link, 0.0))

    def clock_event_reasons(self, gpu: int, temp: float | None = None) -> set[str]:
        """The active clock-event reasons: injected ones, idle at 0 % utilisation, the SW power cap when
        the load wants more than the limit, SW thermal slowdown at the max operating temperature, HW
        slowdown and HW thermal slowdown at the slowdown temperature (``temp``: the current one)."""
        g = self.desc.gpus[gpu]
        out = {r for p in self.faults_of("clock_events", gpu) for r in p.reasons}
        described = g.idle_reason if not self.settings(gpu).get("load") else None
        if described if described is not None else self.utilization(gpu) == 0:
            out.add("gpu_idle")
        t = self.temperature(gpu) if temp is None else temp
        if self.power_state(gpu, t)[2]:
            out.add("sw_power_cap")
        if g.max_operating_celsius is not None and t >= g.max_operating_celsius:
            out.add("sw_thermal_slowdown")  # the driver holds the GPU at its target temperature
        if t >= g.slowdown_celsius:
            out |= {"hw_slowdown", "hw_thermal_slowdown"}
        return out

    def clock_events(self, gpu: int) -> int:
        """The clock-event reasons mask (``nvmlDeviceGetCurrentClocksEventReasons``), built from
        ``clock_event_reasons``: the same set the violation counters advance with."""
        mask = 0
        for r in self.clock_event_reasons(gpu):
            mask |= EVENT_BITS[r]
        return mask

    def clock_mhz(self, gpu: int, clock: int) -> int:
        """The current clock (graphics, SM or memory): idle clocks or the locked minimum when idle,
        else GPU Boost up to the maximum (or the locked maximum), lowered by the power cap and the
        thermal slowdowns. A clock offset (``gpud.sim.libnvml.offsets``) moves a loaded GPU's clock by as
        much, up to a locked maximum."""
        g, s = self.desc.gpus[gpu], self.settings(gpu)
        idle = self.utilization(gpu) == 0
        described = g.memory_mhz if clock == CLOCK_MEM else g.sm_mhz
        if described is not None and not s.get("load") and not s["locked_mem" if clock == CLOCK_MEM else "locked_gpu"]:
            return int(described)  # the described moment, as a real GPU showed it (until load or a lock changes it)
        if clock == CLOCK_MEM:
            if idle:
                return int(s["locked_mem"][0]) if s["locked_mem"] else int(g.idle_memory_mhz)
            return int(s["locked_mem"][1] if s["locked_mem"] else g.max_memory_mhz + self._offset(gpu, "memory"))
        if idle:
            return int(s["locked_gpu"][0]) if s["locked_gpu"] else int(g.idle_sm_mhz)
        mhz = self._boosted_mhz(gpu) + self._offset(gpu, "graphics")
        return min(mhz, int(s["locked_gpu"][1])) if s["locked_gpu"] else mhz

    def _offset(self, gpu: int, domain: str) -> int:
        return int((self.settings(gpu).get("clock_offsets") or {}).get(domain, 0))

    def _boosted_mhz(self, gpu: int) -> int:
        """A loaded GPU's SM clock before any offset."""
        g, s = self.desc.gpus[gpu], self.settings(gpu)
        top = float(s["locked_gpu"][1] if s["locked_gpu"] else g.max_sm_mhz)
        t = self.temperature(gpu)
        if not g.max_sm_mhz:
            return int(top * self.thermal_share(gpu, t))
        # the clock the power cap and the thermal slowdowns leave: the one the draw follows (power_state)
        share = self.power_state(gpu, t)[0]
        ref = self.boost_mhz(gpu)
        top = min(top, ref)  # GPU Boost holds a loaded GPU at its rated boost (the lock's maximum, if lower)
        if self.noisy:  # in the table's bins (power_state)
            return int(round(share * ref)) if share * ref < top - 0.5 else int(top)
        return int(share * ref) if share * ref < top - 0.5 else int(top)
