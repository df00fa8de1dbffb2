"""What the daemon tells about itself: tick timing, ``/healthz``, ``/status``, ``/metrics`` bytes.

Read by the HTTP and control-socket threads; none of it touches the hardware.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString as _go_float

from gpud import __version__
from gpud.doctor.health import as_json, worst_of
from gpud.exporter import METRICS, Scope, Series, Spec, Value, registry
from gpud.hw.machine import Machine
from gpud.model import document, host_json, probe_document, sample_json, to_jsonable
from gpud.observation import Counters, Observation, TickStats
from gpud.probe import history


def health_part(obs: Observation) -> dict[str, Any]:
    """``/status``'s ``health``: the worst state and every component (gpud.doctor.health)."""

    return {"state": worst_of(obs.health), "components": as_json(obs.health)}


class Renderer:
    """Renders expositions for the daemon: the slow families are formatted again only when the
    observation's ``version`` changes (a doctor run, new Xids, a profile switch, a probe result); each other
    family is read from every observation and formatted again only when its series differ from the ones
    formatted last (NVLink states and counters, ECC, clock events, limits: most of them stay the same between
    two scrapes). Formatting is most of a scrape's cost (prometheus_client escapes every label of every
    sample); reading a family's series is a fraction of it. The bytes are those of formatting everything at
    once: the slow families, then the others in the table's order."""

    def __init__(self, specs: Sequence[Spec] = METRICS) -> None:
        self.specs = specs
        self._version: int | None = None
        self._slow = b""
        self._fast = [s for s in specs if not s.slow]
        self._formatted: dict[str, tuple[list[Series], bytes]] = {}  # family → the series last formatted, text
        # family → (HELP and TYPE, the text before each value) of a gauge or counter as prometheus_client wrote
        # it for the label values of the series in ``_formatted``
        self._lines: dict[str, tuple[bytes, list[bytes]]] = {}

    def render(self, obs: Observation) -> bytes:
        if obs.version != self._version:
            self._slow = generate_latest(registry(lambda: obs, "slow", self.specs))
            self._version = obs.version
        scope = Scope(obs)
        parts = [self._slow]
        for spec in self._fast:
            read = spec.read(scope)
            if read is None:
                self._formatted.pop(spec.name, None)
                self._lines.pop(spec.name, None)
                continue
            series = list(read)
            last = self._formatted.get(spec.name)
            if last is None or last[0] != series:
                last = (series, self._format(spec, series, last[0] if last is not None else None))
                self._formatted[spec.name] = last
            parts.append(last[1])
        return b"".join(parts)

    def _format(self, spec: Spec, series: list[Series], last: list[Series] | None = None) -> bytes:
        """The family's text. Where only values changed since ``last`` (the same label values in the same order:
        a gauge's or a counter's readings between two scrapes), the lines are the ones prometheus_client wrote
        up to each value, and each value is formatted as it formats one (``floatToGoString``): escaping and
        sorting every label of every sample is most of a render's cost."""
        go_float: Callable[[Value], str] = _go_float  # untyped in prometheus_client
        known = self._lines.get(spec.name)
        if known is not None and last is not None and len(last) == len(series) and all(
                a[0] == b[0] for a, b in zip(last, series, strict=True)):
            return known[0] + b"".join(b"%s%s\n" % (head, go_float(value).encode())
                                       for head, (_, value) in zip(known[1], series, strict=True))
        text = generate_latest(One(spec.build(series)))
        self._lines.pop(spec.name, None)
        if spec.kind != "histogram":
            lines = text.split(b"\n")
            samples = lines[2:-1]  # HELP and TYPE, then one line per series, then the final newline's ""
            if len(samples) == len(series) and lines[-1] == b"":
                self._lines[spec.name] = (b"\n".join(lines[:2]) + b"\n",
                                          [line[:line.rindex(b" ") + 1] for line in samples])
        return text


class One:
    """One family, as prometheus_client's ``generate_latest`` reads a registry."""

    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> Iterator[Metric]:
        yield self.family


def healthy(last: float | None, interval: float) -> tuple[bool, str]:
    """``/healthz``'s answer. ``last``: when the tick whose observation the daemon serves began (None: none yet)."""
    if last is None:
        return False, "no tick yet"
    age = time.time() - last
    limit = max(3 * interval, 5.0)
    if age > limit:
        return False, f"last tick {age:.1f} s ago (limit {limit:.0f} s)"
    return True, f"ok: last tick {age:.2f} s ago"


class TickTiming:
    """How many ticks, when the last one was, how long they take, how regular they come."""

    def __init__(self) -> None:
        self.stats = TickStats()
        self.periods: deque[float] = deque(maxlen=2000)  # recent tick start-to-start periods (jitter)
        self.last: float | None = None
        self.ticks = 0

    def begin(self, now: float) -> None:
        if self.last is not None:
            self.periods.append(now - self.last)

    def end(self, now: float, seconds: float) -> None:
        self.last = now
        self.ticks += 1
        self.stats.observe(seconds)

    def copy(self) -> TickStats:
        t = self.stats
        return TickStats(list(t.counts), t.total, t.sum)

    def summary(self, interval: float) -> dict[str, Any]:
        """Tick period error (actual start-to-start minus the interval): the jitter scrapers cause."""
        errors = sorted(abs(p - interval) for p in self.periods)
        if not errors:
            return {}

        def pct(q: float) -> float:
            return errors[min(len(errors) - 1, int(q * len(errors)))]

        return {"periods": len(errors), "interval_seconds": interval, "recent_periods": list(self.periods)[-300:],
                "period_error_p50_seconds": pct(0.5),
                "period_error_p99_seconds": pct(0.99), "period_error_max_seconds": errors[-1],
                "duration_mean_seconds": self.stats.sum / max(1, self.stats.total)}


class Report:
    """``/metrics`` (rendered once per observation) and the ``/status`` document."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.started = time.time()
        self.renderer = Renderer()
        self._rendered: tuple[Observation, bytes] | None = None
        self._render_lock = threading.Lock()
        self._host_facts: tuple[Any, ...] | None = None

    def metrics(self, obs: Observation) -> bytes:
        """The exposition of ``obs``, rendered once per observation however many scrapers ask
        (rendering ~1000 series costs milliseconds; the observation changes once a tick)."""
        cached = self._rendered
        if cached is not None and cached[0] is obs:
            return cached[1]
        with self._render_lock:
            cached = self._rendered
            if cached is None or cached[0] is not obs:
                cached = (obs, self.renderer.render(obs))
                self._rendered = cached
        return cached[1]

    def status(self, obs: Observation, timing: TickTiming, tick: dict[str, Any], *, show_processes: bool,
               profile: str | None, counters: Counters, probe_running: bool
               ) -> dict[str, Any]:
        snap = obs.snapshot
        infos = {g.index: g for g in snap.gpus} if snap is not None else {}
        gpus = [{"info": to_jsonable(infos.get(x.index)), "sample": sample_json(x)}
                for x in (snap.samples if snap is not None else ())]
        if not show_processes:
            for g in gpus:
                for proc in g["sample"].get("processes") or []:
                    proc["user"] = proc["command"] = proc["container"] = None
        if self._host_facts is None:  # read once: /status never reads files per request
            self._host_facts = (self.machine.host.cpu_info(), self.machine.host.memory_total_bytes())
        where = host_json(self.machine.label, snap.versions if snap is not None else None,
                          len(snap.samples) if snap is not None else None, *self._host_facts)
        last = history.latest()
        return document("daemon_status", __version__, where, uptime_seconds=time.time() - self.started,
                        ticks=timing.ticks, last_tick=timing.last, profile=profile,
                        timestamp=snap.timestamp if snap is not None else None, gpus=gpus,
                        checks=[to_jsonable(c) for c in obs.checks],
                        drift=[{"gpu": g, "setting": s, "drift": d} for g, s, d in obs.drift],
                        reapply_total=counters.reapply_total, fan_failsafe_total=counters.fan_failsafe_total,
                        probe=probe_document(last.to_json(), __version__, host_json(last.host)) if last else None,
                        probe_running=probe_running, tick=tick, health=health_part(obs),
                        profiles=[{"gpu": g, "profile": p, "rule": r or None} for g, p, r in obs.profiles])
