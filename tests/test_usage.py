"""Clock-event time: NVML's violation counters where the GPU keeps them, gpud's per-tick count otherwise,
and which of the two each series is (``gpud_gpu_clock_event_source_info``)."""

from __future__ import annotations

from conftest import run_gpud

from gpud.backends import open_machine
from gpud.exporter import exposition
from gpud.model import GpuSample, Snapshot, Versions
from gpud.observation import Observation
from gpud.usage import Accounting

V = Versions(None, None, None)


def _snap(t: float, events: tuple[str, ...], ns: dict[str, int] | None) -> Snapshot:
    return Snapshot(t, V, (), (GpuSample(0, "GPU-0", t, clock_events=events, clock_event_nanoseconds=ns),))


def test_nvml_counter_is_preferred_and_never_goes_backwards() -> None:
    acc = Accounting()
    # The mask says sw_power_cap all along; NVML's counter says how long it really held.
    acc.add(_snap(0.0, ("sw_power_cap", "hw_slowdown"), {"sw_power_cap": 500_000_000_000}))
    k = (0, "GPU-0", "sw_power_cap")
    assert acc.event_seconds[k] == 500.0  # NVML's total since the driver loaded, not 0
    acc.add(_snap(2.0, ("sw_power_cap", "hw_slowdown"), {"sw_power_cap": 500_300_000_000}))
    assert acc.event_seconds[k] == 500.3  # NVML's 0.3 s, not the two ticked seconds
    acc.add(_snap(4.0, ("sw_power_cap", "hw_slowdown"), {"sw_power_cap": 1_000_000_000}))  # driver reloaded
    assert acc.event_seconds[k] == 501.3  # counted again from the reset, never down
    assert acc.event_seconds[(0, "GPU-0", "hw_slowdown")] == 4.0  # no NVML counter: per tick
    assert acc.event_source[k] == "nvml" and acc.event_source[(0, "GPU-0", "hw_slowdown")] == "tick"
    assert acc.throttled_seconds[(0, "GPU-0")] == 4.0  # the throttled share stays per tick (alert, doctor)
    text = exposition(Observation(snapshot=None, usage=acc.frozen())).decode()
    assert 'gpud_gpu_clock_event_seconds_total{gpu="0",reason="sw_power_cap",uuid="GPU-0"} 501.3' in text
    assert ('gpud_gpu_clock_event_source_info{gpu="0",reason="sw_power_cap",source="nvml",uuid="GPU-0"} 1.0'
            in text)
    assert ('gpud_gpu_clock_event_source_info{gpu="0",reason="hw_slowdown",source="tick",uuid="GPU-0"} 1.0'
            in text)


def test_a_series_counted_per_tick_continues_from_there_when_nvml_starts_answering() -> None:
    acc = Accounting()
    acc.add(_snap(0.0, ("sw_power_cap",), None))
    acc.add(_snap(3.0, ("sw_power_cap",), None))
    acc.add(_snap(4.0, ("sw_power_cap",), {"sw_power_cap": 900_000_000_000}))
    acc.add(_snap(5.0, ("sw_power_cap",), {"sw_power_cap": 901_000_000_000}))
    assert acc.event_seconds[(0, "GPU-0", "sw_power_cap")] == 4.0  # 3 ticked, then NVML's 1 s: no jump
    acc.add(_snap(6.0, ("sw_power_cap",), None))  # NVML stops answering: per tick again, from there
    acc.add(_snap(7.0, ("sw_power_cap",), {"sw_power_cap": 990_000_000_000}))  # and back: no 89 s jump
    assert acc.event_seconds[(0, "GPU-0", "sw_power_cap")] == 5.0
    assert acc.event_source[(0, "GPU-0", "sw_power_cap")] == "nvml"


def test_simulated_gpus_each_source(state_dir) -> None:
    h200 = open_machine("hgx-8x-h200")  # driver 570: ids 74/76 and GetViolationStatus(THERMAL)
    acc = Accounting()
    acc.add(h200.snapshot())
    srcs = {r: s for (g, _, r), s in acc.event_source.items() if g == 0}
    assert srcs["sw_power_cap"] == srcs["sw_thermal_slowdown"] == srcs["sync_boost"] == "nvml"
    assert srcs["hw_thermal_slowdown"] == srcs["hw_slowdown"] == "tick"
    a6000 = Accounting()
    a6000.add(open_machine("z8-fury-4x-a6000").snapshot())
    assert set(a6000.event_source.values()) == {"tick"}


def test_nvlink_data_is_exported_in_bytes_per_link(state_dir) -> None:
    r = run_gpud("metrics", "--simulate", "hgx-8x-h200")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("gpud_gpu_nvlink_data_bytes_total{")]
    assert len(lines) == 8 * 18 * 2
    assert any('direction="rx"' in ln and 'link="17"' in ln for ln in lines)
    bridged = run_gpud("metrics", "--simulate", "z8-fury-4x-a6000")
    assert "gpud_gpu_nvlink_data_bytes_total{" not in bridged.stdout  # not given: absent, not 0
