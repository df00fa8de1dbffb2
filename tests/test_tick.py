"""The daemon's tick reads a whole snapshot every few ticks and, between, only what the fan loop and the
power figures need (gpud/daemon/tick.py): the calls each kind of tick makes, what a quick tick holds and
what it reads afresh, and that the applied profile is compared with readings of that tick only."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from gpud import config as cfg
from gpud.backends import open_machine
from gpud.daemon.service import Daemon
from gpud.daemon.tick import WHOLE_EVERY_TICKS, Pace
from gpud.daemon.wake import Stop
from gpud.hw.machine import Machine
from gpud.hw.nvml.constants import DIRECT_READINGS

QUICK_CALLS = {"nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage"}


def counting(m: Machine) -> list[Counter[str]]:
    """Each NVML call the tick's thread makes (not the doctor run the first tick starts), by entry point, into
    the last Counter of the list returned."""
    ticks: list[Counter[str]] = [Counter()]
    client = m.nvml.client
    raw, c_reading = client.raw, client._c_reading
    me = threading.get_ident()

    def counted(name: str, *args: Any, gpu: int | None = None) -> Any:
        direct = DIRECT_READINGS.get(name)
        if threading.get_ident() == me and (direct is None or len(args) != 1 + direct[1]):
            ticks[-1][name] += 1  # (a reading ``raw`` hands to the C entry point is counted there)
        return raw(name, *args, gpu=gpu)

    def counted_c(name: str, *args: Any) -> Any:  # DIRECT_READINGS, from ``raw`` or inline from ``get``
        if threading.get_ident() == me:
            ticks[-1][name] += 1
        return c_reading(name, *args)

    client.raw = counted  # type: ignore[method-assign]
    client._c_reading = counted_c  # type: ignore[method-assign]
    return ticks


def test_a_whole_snapshot_every_fifth_tick_and_two_calls_a_gpu_between(state_dir) -> None:
    m = open_machine("2s-8x-a6000")
    d = Daemon(m, cfg.Config())
    ticks = counting(m)
    samples = []
    for _ in range(2 * WHOLE_EVERY_TICKS + 1):
        d.tick()
        assert d.ticker.snapshot is not None
        samples.append(d.ticker.snapshot.samples)
        ticks.append(Counter())
    ticks.pop()
    gpus = len(samples[0])
    whole = [i for i, c in enumerate(ticks) if c["nvmlDeviceGetClockInfo"]]
    assert whole == [0, WHOLE_EVERY_TICKS, 2 * WHOLE_EVERY_TICKS]
    for i, calls in enumerate(ticks):
        if i in whole:
            assert sum(calls.values()) >= 10 * gpus
            continue
        # the fan loop's and the power figures' readings, each GPU's once: its temperature and its draw (the fans'
        # speeds, 137 µs a reading, are held); the GPU count is the whole snapshot's (``COUNT_HELD_S``), not asked
        # each tick
        assert dict(calls) == dict.fromkeys(QUICK_CALLS, gpus)
        before, now = samples[i - 1], samples[i]
        for a, b in zip(before, now, strict=True):  # the rest is held from the whole sample, the time is this tick's
            assert b.timestamp > a.timestamp
            assert (b.power_limit_watts, b.clocks_mhz, b.processes, b.ecc_errors, b.fans) == (
                a.power_limit_watts, a.clocks_mhz, a.processes, a.ecc_errors, a.fans)


def test_the_profile_is_enforced_on_whole_snapshots_only(state_dir) -> None:
    """The applied profile is compared with whole snapshots only, never with a quick tick's held limits and
    clocks; an apply (gpud's own writes) makes the next tick whole, so its settings are compared at once with
    fresh readings, and the fan loop's duty writes do not read as fans handed back to the driver.
    (tests/test_daemon.py: a limit changed behind gpud's back is re-applied, end to end.)"""
    m = open_machine("z8-fury-4x-a6000")
    d = Daemon(m, cfg.Config())
    d.tick()
    assert d.apply("training")["ok"]
    ticks = counting(m)
    compared: list[bool] = []
    enforce = d.enforcer.enforce

    def counted(snap: Any) -> Any:
        compared.append(bool(ticks[-1]["nvmlDeviceGetClockInfo"]))
        return enforce(snap)

    d.enforcer.enforce = counted  # type: ignore[method-assign]
    d.tick()
    assert compared == [True], "the tick after an apply reads whole and compares"
    reapplied = d.enforcer.reapply_total
    kinds = []
    for _ in range(3 * WHOLE_EVERY_TICKS):
        ticks.append(Counter())
        d.tick()
        kinds.append(bool(ticks[-1]["nvmlDeviceGetClockInfo"]))
    assert kinds.count(False) >= 2 * (WHOLE_EVERY_TICKS - 1)
    assert compared[1:] == [True] * kinds.count(True)  # one comparison per whole tick, none on a quick one
    assert d.enforcer.reapply_total == reapplied  # the fans on the curve (manual): nothing re-applied


def rounds(interval: float, poll: float | None, seconds: float) -> list[tuple[float, bool, bool]]:
    """(when, tick, poll) of each wake-up of the daemon's loop over ``seconds``, on a clock only its sleeps move."""
    now = 100.0
    pace = Pace(now, interval)
    out = []
    while now < 100.0 + seconds:
        now += pace.sleep_s(now, poll)
        tick, polls = pace.due(now, interval, poll)
        out.append((round(now - 100.0, 6), tick, polls))
    return out


def test_the_rules_poll_rides_on_the_ticks_wake_ups() -> None:
    """1 s ticks and 0.5 s polls: two wake-ups a second, every other one a tick that also polls; a round
    that does nothing is never woken for."""
    got = rounds(1.0, 0.5, 3.0)
    assert got == [(0.5, False, True), (1.0, True, True), (1.5, False, True), (2.0, True, True),
                   (2.5, False, True), (3.0, True, True)]
    assert all(tick or polls for _, tick, polls in rounds(1.0, 0.3, 10.0))
    assert [w for w, tick, _ in rounds(1.0, 0.3, 10.0) if tick] == [float(i) for i in range(1, 11)]


def test_without_rules_the_loop_wakes_only_to_tick() -> None:
    got = rounds(1.0, None, 5.0)
    assert got == [(float(i), True, False) for i in range(1, 6)]


def test_a_round_that_overran_starts_the_grid_again_without_bunching() -> None:
    """A round of 2.5 s at 1 s ticks: the next tick comes one interval after it ends, not three at once."""
    now = 100.0
    pace = Pace(now, 1.0)
    now += pace.sleep_s(now, 0.5)
    assert pace.due(now, 1.0, 0.5) == (False, True)
    now += pace.sleep_s(now, 0.5)
    assert pace.due(now, 1.0, 0.5) == (True, True)
    now += 2.5  # the tick and the poll took 2.5 s
    waits = []
    for _ in range(4):
        wait = pace.sleep_s(now, 0.5)
        waits.append(wait)
        now += wait
        pace.due(now, 1.0, 0.5)
    assert waits[0] == 0.0  # late: one round now
    assert all(w >= 0.5 - 1e-9 for w in waits[1:])  # then on the new grid, none bunched


def test_the_stop_flag_wakes_every_waiter_once_set_however_often() -> None:
    stop = Stop()
    assert not stop.wait(0.01) and not stop.is_set()
    woke: list[bool] = []
    waiters = [threading.Thread(target=lambda: woke.append(stop.wait(30))) for _ in range(4)]
    for t in waiters:
        t.start()
    stop.set()
    stop.set()  # a second signal: nothing released twice
    for t in waiters:
        t.join(5)
    assert woke == [True] * 4
    assert stop.wait(0) and stop.wait() and stop.is_set()


def test_a_throttle_episode_over_quick_ticks_is_journaled_once_with_its_length(state_dir) -> None:
    """The recorder looks at clock events on whole snapshots only (a quick one holds them): an episode that
    begins and ends across quick ticks is one journal line, timed from whole snapshot to whole snapshot; a GPU
    lost in a quick snapshot is journaled at once."""
    import dataclasses

    from gpud import journal
    from gpud.daemon.recorder import Recorder
    from gpud.model import held_over

    state_dir.mkdir(parents=True, exist_ok=True)
    rec = Recorder(journal.Journal(), "boot")
    snap = open_machine("z8-fury-4x-a6000").snapshot()

    def at(t: float, events: tuple[str, ...] | None, lost: int | None = None) -> Any:
        samples = tuple(held_over(s, timestamp=t, clock_events=events if s.index == 0 else (),
                                  lost=s.index == lost) for s in snap.samples)
        return dataclasses.replace(snap, timestamp=t, samples=samples)

    rec.snapshot(at(100.0, ("sw_thermal_slowdown",)), True)
    for t in (101.0, 102.0, 103.0):
        rec.snapshot(at(t, ("sw_thermal_slowdown",)), False)
    rec.snapshot(at(105.0, ()), True)
    rec.snapshot(at(106.0, ()), False)
    rec.snapshot(at(107.0, (), lost=2), False)
    rec.journal.close()  # type: ignore[union-attr]
    evs = journal.events(kinds=("throttle", "gpu_lost"))
    assert [(e.kind, e.gpu) for e in evs] == [("throttle", 0), ("gpu_lost", 2)]
    assert evs[0].data["seconds"] == 5.0 and evs[0].data["reasons"] == ["sw_thermal_slowdown"]


def test_healthz_answers_ok_only_once_the_ticks_figures_are_served(state_dir, monkeypatch) -> None:
    """``/healthz`` judged by the tick's timing answered "ok" while ``/metrics`` still served the empty observation
    from before the first tick (under load, the Kubernetes test's scrape found no GPU at all). It is judged by
    the tick whose figures are served: "no tick yet" until the tick has left what its observation is made of,
    which the next scrape then shows. And it makes no observation itself (a kubelet asks every 5 s)."""
    from gpud.daemon import tick

    m = open_machine("z8-fury-4x-a6000")
    d = Daemon(m, cfg.Config())
    during: list[tuple[bool, str]] = []
    made: list[int] = []
    observe, update = tick.observe, d.ticker.health.update

    def watched(*args: Any, **kwargs: Any) -> Any:
        during.append(d.healthy())  # the tick's last step before it swaps its figures in
        return update(*args, **kwargs)

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return observe(*args, **kwargs)

    monkeypatch.setattr(d.ticker.health, "update", watched)
    monkeypatch.setattr(tick, "observe", counted)
    assert d.healthy() == (False, "no tick yet")
    d.tick()
    assert during == [(False, "no tick yet")]
    ok, why = d.healthy()
    assert ok and why.startswith("ok: last tick"), why
    assert made == [], "healthz made an observation"
    assert d.observation.snapshot is not None and len(d.observation.snapshot.samples) == 4
    assert d.observation is d.observation and made == [1], "made once for the tick, not for every reader"
    d.tick()
    assert d.observation.last_tick == d.ticker.last_tick and made == [1, 1]
