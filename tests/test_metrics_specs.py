"""Each metric is declared once, in ``gpud.exporter.METRICS``: the collector yields every family of the
table, the slow ones are the table's, and the daemon's renderer formats them again only when the
observation's version says their inputs changed."""

from __future__ import annotations

import dataclasses

from prometheus_client.parser import text_string_to_metric_families

from gpud.backends import open_machine
from gpud.config import Config
from gpud.daemon.status import Renderer
from gpud.exporter import METRICS, SLOW_FAMILIES, Spec, exposition, registry
from gpud.hw.machine import Machine
from gpud.model import CheckResult
from gpud.observation import Observation, TickStats
from gpud.observe import Running, observe
from gpud.usage import Accounting


def _daemon_like(m: Machine) -> Observation:
    """An observation with what only a running daemon has (ticks, accounting), as the daemon's tick makes it."""
    snap = m.snapshot()
    acc = Accounting()
    acc.add(snap)
    ticks = TickStats()
    ticks.observe(0.01)
    return observe(m, Config(), snapshot=snap, running=Running(tick=ticks, last_tick=snap.timestamp,
                                                                   usage=acc.frozen()))


def exposition_of(obs: Observation) -> bytes:
    """The renderer's order: the slow families, then the others."""
    from prometheus_client import generate_latest

    return generate_latest(registry(lambda: obs, "slow")) + generate_latest(registry(lambda: obs, "fast"))


def _families(body: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_every_spec_family_appears_for_the_four_gpu_workstation(state_dir) -> None:
    obs = _daemon_like(open_machine("z8-fury-4x-a6000"))
    families = _families(exposition(obs))
    names = [s.name for s in METRICS]
    assert len(names) == len(set(names)), "a family declared twice"
    assert [n for n in names if n not in families] == []
    assert set(families) == set(names)  # nothing yielded that the table does not declare
    for spec in METRICS:
        if spec.labels[:2] == ("gpu", "uuid") and spec.name.startswith("gpud_gpu_"):
            gpus = {s.labels["gpu"] for s in families[spec.name].samples}  # type: ignore[attr-defined]
            assert gpus <= {"0", "1", "2", "3"}, (spec.name, gpus)
    assert families["gpud_gpu_up"].samples and len(families["gpud_gpu_up"].samples) == 4  # type: ignore[attr-defined]


def test_slow_families_are_the_tables() -> None:
    assert SLOW_FAMILIES == {s.name for s in METRICS if s.slow}
    assert "gpud_gpu_info" in SLOW_FAMILIES and "gpud_gpu_temperature_celsius" not in SLOW_FAMILIES
    assert all(s.slow for s in METRICS if s.name.startswith(("gpud_probe_", "gpud_burnin_")))


def test_a_new_spec_needs_nothing_else(state_dir) -> None:
    """One Spec more in the table: the collector yields it, in the share its ``slow`` says, through the
    renderer too; no yield list, no slow list to keep in step."""
    obs = _daemon_like(open_machine("z8-fury-4x-a6000"))
    n_gpus = len(obs.snapshot.samples) if obs.snapshot else 0
    fast = Spec("gpud_test_answers", "GPUs that answer", "gauge", (),
                lambda sc: [((), sum(not s.lost for _, s, _ in sc.gpus))])
    slow = dataclasses.replace(fast, name="gpud_test_known", help="GPUs known", slow=True)
    specs = (*METRICS, fast, slow)
    from prometheus_client import generate_latest

    everything = _families(generate_latest(registry(lambda: obs, None, specs)))
    assert everything["gpud_test_answers"].samples[0].value == n_gpus  # type: ignore[attr-defined]
    assert "gpud_test_known" in everything
    slow_part = _families(generate_latest(registry(lambda: obs, "slow", specs)))
    fast_part = _families(generate_latest(registry(lambda: obs, "fast", specs)))
    assert "gpud_test_known" in slow_part and "gpud_test_known" not in fast_part
    assert "gpud_test_answers" in fast_part and "gpud_test_answers" not in slow_part
    assert set(slow_part) | set(fast_part) == set(everything) and not set(slow_part) & set(fast_part)
    rendered = _families(Renderer(specs).render(obs))
    assert {"gpud_test_answers", "gpud_test_known"} <= set(rendered)


def test_the_renderer_follows_the_observations_version(state_dir) -> None:
    """The daemon's observation keeps its predecessor's version while the slow families' inputs stay the
    same, and takes a new one when they change: the renderer formats the slow families again then."""
    m = open_machine("z8-fury-4x-a6000")
    first = _daemon_like(m)
    running = Running(counters=first.counters, tick=first.tick, last_tick=first.last_tick, usage=first.usage)
    again = observe(m, None, snapshot=first.snapshot, checks=first.checks, xids=first.xids,
                    tuning=(first.profile, first.drift), probe=lambda: first.probe, running=running,
                    health=first.health, profiles=first.profiles, previous=first)
    assert again.version == first.version and again is not first
    failed = CheckResult("gpu.test", "fail", "a test check failed", gpu=0)
    changed = observe(m, None, snapshot=first.snapshot, checks=(*first.checks, failed), xids=first.xids,
                      tuning=(first.profile, first.drift), probe=lambda: first.probe, running=running,
                      health=first.health, profiles=first.profiles, previous=again)
    assert changed.version != first.version
    renderer = Renderer()
    before = renderer.render(first)
    assert b'check="gpu.test"' not in before and renderer.render(again) == before == exposition_of(first)
    assert b'gpud_check_status{check="gpu.test",gpu="0",status="fail"} 1.0' in renderer.render(changed)
    # The version is the cache's key: the same version is taken to mean the same slow families.
    stale = dataclasses.replace(changed, checks=first.checks)
    assert stale.version == changed.version and b'check="gpu.test"' in renderer.render(stale)
    assert b'check="gpu.test"' not in renderer.render(stale.following(first))
    # Observations made by hand (no predecessor) never share a version.
    assert Observation(None).version != Observation(None).version


def test_the_renderer_formats_again_only_the_families_whose_series_changed(state_dir) -> None:
    """Across a daemon's ticks (whole and quick) the renderer's bytes are those of formatting every family
    afresh; a family whose series are the ones formatted last is not formatted again (its bytes are the
    same object), one whose series changed is."""
    from gpud import config as cfg
    from gpud.daemon.service import Daemon

    d = Daemon(open_machine("2s-8x-a6000"), cfg.Config())
    renderer = Renderer()
    texts: list[dict[str, bytes]] = []
    for _ in range(7):
        d.tick()
        obs = d.observation
        assert renderer.render(obs) == exposition_of(obs)
        texts.append({name: text for name, (_, text) in renderer._formatted.items()})
    kept = [name for name in texts[-1] if texts[-1][name] is texts[-2][name]]
    assert "gpud_gpu_nvlink_link_up" in kept and "gpud_gpu_ecc_errors" in kept
    assert "gpud_last_tick_timestamp_seconds" not in kept and "gpud_tick_duration_seconds" not in kept
    # the readings' families changed values only: their lines were kept up to each value
    assert {"gpud_gpu_power_watts", "gpud_gpu_temperature_celsius"} <= renderer._lines.keys()


def test_a_family_whose_values_alone_changed_reads_as_prometheus_client_formats_it() -> None:
    """Values prometheus_client spells its own way (NaN, infinities, integers, exponents) and label values that
    need escaping (quotes, backslashes, newlines, spaces), formatted again from the kept lines: the same bytes as
    formatting the family whole; a changed label set, or a histogram, is formatted whole."""
    from prometheus_client import generate_latest

    from gpud.daemon.status import One

    labels = [("0", 'a "quoted" \\ path\nwith lines'), ("1", "two words"), ("2", "ü")]
    rounds = [[1.0, 2.5, 3.0], [float("nan"), float("inf"), -float("inf")], [1e21, 1e-7, 0.0], [12345678.0, -2.0, 1.5]]
    now: list[list[float]] = [rounds[0]]
    spec = Spec("gpud_test_family", "A test family", "gauge", ("gpu", "who"),
                lambda scope: [(lab, v) for lab, v in zip(labels, now[0], strict=True)])
    counter = dataclasses.replace(spec, name="gpud_test_counter", kind="counter")
    for values in rounds:  # each spelling formatted whole, then again from the kept lines
        now[0] = values
        for s in (spec, counter):
            renderer = Renderer((s,))
            prev = None
            for _ in range(2):
                series = list(s.read(None))  # type: ignore[arg-type]
                assert renderer._format(s, series, prev) == generate_latest(One(s.build(series)))
                prev = series
    r = Renderer((spec,))  # one renderer through every round: values alone change
    now[0] = rounds[0]
    prev = list(spec.read(None))  # type: ignore[arg-type]
    r._format(spec, prev)
    for values in rounds[1:]:
        now[0] = values
        series = list(spec.read(None))  # type: ignore[arg-type]
        assert r._format(spec, series, prev) == generate_latest(One(spec.build(series)))
        prev = series
    labels.append(("3", "new"))
    now[0] = [*rounds[0], 4.0]
    series = list(spec.read(None))  # type: ignore[arg-type]
    assert r._format(spec, series, prev) == generate_latest(One(spec.build(series)))
    heads = r._lines["gpud_test_family"][1]  # the kept lines follow the new label set
    assert len(heads) == len(series) and b'who="new"' in heads[-1]
