"""The burn-in's HTML report: one self-contained file (inline CSS and SVG, no script, nothing fetched).

What a person looks at first: the hardware's verdicts that did not pass (failures, warnings, what was not
judged), a table of each GPU's figures, then the configuration findings (doctor's), the passes folded. Then
per GPU the charts of temperature, fan, SM clock, power and the clock-event reasons on one time axis (the
same plot width and margins in every chart, so a moment lies at the same x in all of them), the run's
phases as bands, the soak's settle band, the GPU's siblings of its model overlaid in grey, the thresholds
labelled in the right margin (pushed apart where close, never over the title), the ticks inside the plot.
"""

from __future__ import annotations

import statistics
from html import escape
from pathlib import Path
from typing import Any

from gpud.burnin.plan import THRESHOLDS
from gpud.burnin.result import RANK, Result
from gpud.burnin.telemetry import HW_REASONS, Point, settle
from gpud.paths import atomic_write

W, H = 860, 170
PAD_L, PAD_R, PAD_T, PAD_B = 56, 150, 34, 24  # the right margin holds the threshold and reason labels
PLOT_W = W - PAD_L - PAD_R
COLOURS = {"pass": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e", "skip": "#6e7781"}
SIBLING = "#afb8c1"
REASON_ROWS = (("hw_slowdown", "HW slowdown", "#cf222e"), ("hw_thermal_slowdown", "HW thermal", "#a40e26"),
               ("hw_power_brake_slowdown", "HW power brake", "#8250df"),
               ("sw_thermal_slowdown", "SW thermal", "#bc4c00"), ("sw_power_cap", "SW power cap", "#0969da"))
# The run's phases as the charts band them (load steps: their idle and full halves together).
PHASES = {"load": ("load", "#f3f4f6"), "memtest": ("memory test", "#fff8c5"), "power": ("targeted power", "#ddf4ff"),
          "pulse_idle": ("load steps", "#fbefff"), "pulse_full": ("load steps", "#fbefff"),
          "soak": ("soak", "#e6f6ea")}
LOADED = ("load", "power", "pulse_full", "soak")
# Doctor's checks of the hardware itself (its health, links, the GPUs present, the supply): listed with the
# hardware's verdicts; its others are configuration (settings, host, driver, environment).
DOCTOR_HARDWARE = ("doctor.health.", "doctor.pcie.link_", "doctor.nvlink.", "doctor.gpu.count", "doctor.host.psu")
CHAR_W = 5.6  # a 10 px sans-serif character's width, about: labels that do not fit are left out
CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1f2328;background:#fff;max-width:1200px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}h3{font-size:14px;margin:18px 0 4px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f6f8fa}.s{font-weight:600}.small{color:#57606a;font-size:12px;overflow-wrap:anywhere}
td.s,td.k{white-space:nowrap}
td.n{text-align:right;font-variant-numeric:tabular-nums}th.f{font-size:12px;font-weight:600}
svg{display:block;margin:4px 0 10px;background:#fff;border:1px solid #d0d7de}
.key{display:inline-block;width:12px;height:10px;margin:0 4px 0 10px;border:1px solid #d0d7de}
"""


def _x(t: float, t0: float, t1: float) -> float:
    return PAD_L + (t - t0) * PLOT_W / ((t1 - t0) or 1.0)


def _step(span_s: float) -> float:
    """A tick step (seconds) that puts at most 8 ticks on the run: 10 s … 6 h."""
    for s in (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600):
        if span_s / s <= 8:
            return float(s)
    return 43200.0


def _clock(t: float) -> str:
    if t >= 3600:
        h, m = divmod(int(round(t / 60)), 60)
        return f"{h} h" + (f" {m:02d}" if m else "")
    return f"{t / 60:g} min" if t % 60 == 0 else f"{t:.0f} s"


def time_axis(t0: float, t1: float, y: float) -> str:
    """Ticks from the run's start at a step that fits; the last label anchored so it is never clipped."""
    step = _step(t1 - t0)
    out = [f'<line x1="{PAD_L}" y1="{y}" x2="{PAD_L + PLOT_W}" y2="{y}" stroke="#8c959f"/>']
    k = 0
    while k * step <= t1 - t0 + 1e-9:
        x = _x(t0 + k * step, t0, t1)
        anchor = "start" if k == 0 else "end" if x > PAD_L + PLOT_W - 24 else "middle"
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 3}" stroke="#8c959f"/>'
                   f'<text x="{x:.1f}" y="{y + 13}" font-size="10" text-anchor="{anchor}" fill="#57606a">'
                   f'{_clock(k * step)}</text>')
        k += 1
    return "".join(out)


def phase_spans(points: list[Point]) -> list[tuple[str, str, float, float]]:
    """(label, colour, start, end) of each run of readings in one phase group."""
    out: list[tuple[str, str, float, float]] = []
    prev = points[0].t if points else 0.0
    for p in points:
        label, colour = PHASES.get(p.phase, (p.phase, "#f6f8fa"))
        if out and out[-1][0] == label:
            out[-1] = (label, colour, out[-1][2], p.t)
        else:
            out.append((label, colour, prev, p.t))
        prev = p.t
    return out


def _bands(spans: list[tuple[str, str, float, float]], t0: float, t1: float, top: float, bottom: float,
           labels: bool) -> str:
    out = []
    for label, colour, a, b in spans:
        xa, xb = _x(a, t0, t1), _x(b, t0, t1)
        out.append(f'<rect x="{xa:.1f}" y="{top}" width="{max(0.5, xb - xa):.1f}" height="{bottom - top}" '
                   f'fill="{colour}"/>')
        if labels and xb - xa >= len(label) * CHAR_W + 6:  # a label only where it fits its band
            out.append(f'<text x="{(xa + xb) / 2:.1f}" y="{top - 4}" font-size="10" text-anchor="middle" '
                       f'fill="#57606a">{escape(label)}</text>')
    return "".join(out)


def _spread(ys: list[float], gap: float, lo: float, hi: float) -> list[float]:
    """Label positions pushed apart to at least ``gap`` (their order kept), within [lo, hi]."""
    order = sorted(range(len(ys)), key=lambda k: ys[k])
    out = list(ys)
    for n, k in enumerate(order):
        if n:
            out[k] = max(out[k], out[order[n - 1]] + gap)
    for n in range(len(order) - 1, -1, -1):
        k = order[n]
        cap = hi if n == len(order) - 1 else out[order[n + 1]] - gap
        out[k] = max(lo, min(out[k], cap))
    return out


def _thin(pts: list[tuple[float, float]], t0: float, t1: float) -> list[tuple[float, float]]:
    """At most two readings a pixel (its lowest and highest, in time order): a 24-hour soak's 7 200 readings
    draw as they look, spikes kept, in a file that stays small."""
    if len(pts) <= 2 * PLOT_W:
        return pts
    buckets: dict[int, list[tuple[float, float]]] = {}
    for t, v in pts:
        buckets.setdefault(int(_x(t, t0, t1)), []).append((t, v))
    out: list[tuple[float, float]] = []
    for b in sorted(buckets):
        group = buckets[b]
        lo, hi = min(group, key=lambda p: p[1]), max(group, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out


def chart(title: str, unit: str, pts: list[tuple[float, float]], t0: float, t1: float,
          lines: list[tuple[str, float, str]], colour: str = "#0969da", *,
          siblings: list[list[tuple[float, float]]] | None = None,
          spans: list[tuple[str, str, float, float]] | None = None, phase_labels: bool = False,
          band: tuple[float, float, float, float] | None = None) -> str:
    """A line chart (SVG): the GPU's readings in ``colour`` over its siblings' in grey, the phases as bands,
    ``band`` (t from, t to, low, high: the settle band) shaded, threshold lines (label, value, colour)
    labelled in the right margin."""
    sib = siblings or []
    values = [v for _, v in pts] + [v for s in sib for _, v in s] + [v for _, v, _ in lines]
    if band is not None:
        values += [band[2], band[3]]
    if not values:
        return f"<p class=small>{escape(title)}: no readings</p>"
    lo, hi = min(values), max(values)
    floor = 0.0 if lo >= 0 else lo
    lo, hi = (lo - 1, hi + 1) if hi - lo < 2 else (max(floor, lo - (hi - lo) * 0.05), hi + (hi - lo) * 0.05)
    bottom = H - PAD_B

    def y(v: float) -> float:
        return bottom - (v - lo) * (bottom - PAD_T) / ((hi - lo) or 1.0)

    def poly(p: list[tuple[float, float]], c: str, width: float) -> str:
        if len(p) < 2:
            return ""
        xy = " ".join(f"{_x(t, t0, t1):.1f},{y(v):.1f}" for t, v in _thin(p, t0, t1))
        return f'<polyline fill="none" stroke="{c}" stroke-width="{width}" points="{xy}"/>'

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'role="img" aria-label="{escape(title)}">',
           f'<text x="{PAD_L}" y="13" font-size="12" fill="#1f2328">{escape(title)} ({escape(unit)})'
           + ('<tspan fill="#6e7781"> — siblings of its model in grey</tspan>' if sib else "") + "</text>",
           _bands(spans or [], t0, t1, PAD_T, bottom, phase_labels)]
    if band is not None:
        xa, xb = _x(band[0], t0, t1), _x(band[1], t0, t1)
        out.append(f'<rect x="{xa:.1f}" y="{y(band[3]):.1f}" width="{max(0.5, xb - xa):.1f}" '
                   f'height="{max(0.5, y(band[2]) - y(band[3])):.1f}" fill="#cf222e" fill-opacity="0.12"/>')
    out.append(f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{bottom}" stroke="#8c959f"/>')
    for v in (lo, (lo + hi) / 2, hi):
        out.append(f'<text x="{PAD_L - 4}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end" fill="#57606a">'
                   f'{v:.0f}</text>')
    out += [poly(s, SIBLING, 1.0) for s in sib]
    out.append(poly(pts, colour, 1.6))
    labelled = [(label, v, c) for label, v, c in lines]
    if band is not None:
        labelled.append((f"settled {(band[2] + band[3]) / 2:.1f} ±{(band[3] - band[2]) / 2:g}",
                         (band[2] + band[3]) / 2, "#cf222e"))
    at = _spread([y(v) for _, v, _ in labelled], 11.0, PAD_T + 4, bottom)
    for k, ((label, v, c), ty) in enumerate(zip(labelled, at, strict=True)):
        if k < len(lines):
            out.append(f'<line x1="{PAD_L}" y1="{y(v):.1f}" x2="{PAD_L + PLOT_W}" y2="{y(v):.1f}" stroke="{c}" '
                       'stroke-dasharray="5,4"/>')
        text = f"{label} {v:.4g}" if k < len(lines) else label
        out.append(f'<text x="{PAD_L + PLOT_W + 6}" y="{ty + 3.5:.1f}" font-size="10" fill="{c}">'
                   f'{escape(text)}</text>')
    out.append(time_axis(t0, t1, bottom))
    out.append("</svg>")
    return "".join(out)


def reasons_chart(points: list[Point], t0: float, t1: float,
                  spans: list[tuple[str, str, float, float]] | None = None) -> str:
    """One row per clock-event reason, a bar wherever it was active, on the line charts' time axis (the same
    margins: a moment at the same x), with its own ticks."""
    row_h = 14
    top = 22
    h = top + row_h * len(REASON_ROWS) + PAD_B
    bottom = top + row_h * len(REASON_ROWS)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" role="img" '
           f'aria-label="clock-event reasons">',
           f'<text x="{PAD_L}" y="13" font-size="12" fill="#1f2328">clock-event reasons (the HW ones must stay '
           'empty)</text>', _bands(spans or [], t0, t1, top, bottom, False)]
    for k, (name, label, c) in enumerate(REASON_ROWS):
        y = top + k * row_h
        out.append(f'<text x="{PAD_L + PLOT_W + 6}" y="{y + 10}" font-size="10" fill="{c}">{escape(label)}</text>')
        start: float | None = None
        for a, b in zip(points, [*points[1:], None], strict=True):
            on = name in a.reasons
            if on and start is None:
                start = a.t
            end = b.t if b is not None else a.t
            if start is not None and (b is None or name not in b.reasons):
                xa, xb = _x(start, t0, t1), _x(end, t0, t1)
                out.append(f'<rect x="{xa:.1f}" y="{y + 2}" width="{max(0.8, xb - xa):.1f}" height="{row_h - 4}" '
                           f'fill="{c}"/>')
                start = None
        out.append(f'<line x1="{PAD_L}" y1="{y + row_h}" x2="{PAD_L + PLOT_W}" y2="{y + row_h}" stroke="#eaeef2"/>')
    out.append(time_axis(t0, t1, bottom))
    out.append("</svg>")
    return "".join(out)


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def _fmt(v: float | None, spec: str = ".0f", unit: str = "") -> str:
    return "—" if v is None else f"{v:{spec}}{unit}"


def figures(res: Result, g: int) -> list[str]:
    """The GPU's row of figures: what the verdicts judged, in one line."""
    s = res.series.get(g)
    pts = s.points if s is not None else []
    loaded = [p for p in pts if p.phase in LOADED and (p.utilization or 0) > 0]
    temps = [p.temperature_c for p in pts if p.temperature_c is not None]
    soak = [p for p in pts if p.phase == "soak"]
    settled, _ = settle(soak, THRESHOLDS["settle_band_c"].value) if soak else (None, None)
    power = _median([p.power_w for p in loaded if p.power_w is not None])
    limit = next((p.limit_w for p in reversed(pts) if p.limit_w), None)
    clock = _median([float(p.sm_mhz) for p in loaded if p.sm_mhz])
    hw = sum(1 for p in loaded if set(p.reasons) & set(HW_REASONS))
    w = res.workload.get(g, {})
    cpu = not res.device == "cuda"
    gemm = "CPU" if cpu and w.get("gemm") else " / ".join(f"{r['tflops']:.1f}" for r in w.get("gemm", [])) or "—"
    dev_bw = w.get("device_bandwidth", {}).get("gbps")
    host = w.get("host_bandwidth") or {}
    mem = w.get("memtest") or {}
    memtest = ("—" if not mem else "did not finish" if "error" in mem else
               f"{mem['total_errors']} in {mem.get('passes', 1)} pass(es)")
    checks = s.checks if s is not None else []
    wrong = [c for c in checks if c.wrong]
    checked = (f"{sum(c.products for c in checks)}, {sum(c.wrong for c in wrong)} wrong"
               + (f" from {wrong[0].temperature_c} °C" if wrong and wrong[0].temperature_c is not None else "")
               if checks else "—")
    hot = _fmt(float(max(temps)) if temps else None, ".0f", " °C")
    return [f"GPU{g}", hot + (f" / {settled:.1f} °C" if settled is not None else ""),
            f"{_fmt(power)} / {_fmt(limit)} W", _fmt(clock, ".0f", " MHz"),
            f"{hw} of {len(loaded)}" if loaded else "—", gemm,
            "CPU" if cpu and dev_bw else _fmt(dev_bw, ".0f", " GB/s"),
            "CPU" if cpu and host else (f"{host['h2d_gbps']:.1f} / {host['d2h_gbps']:.1f} GB/s" if host else "—"),
            memtest, checked]


FIGURE_HEAD = ("GPU", "hottest / settled (soak)", "power under load: median / limit",
               "SM clock under load: median", "loaded readings with HW slowdown", "GEMM TFLOP/s bf16 / tf32 / fp32",
               "memory bandwidth", "pinned host→device / device→host", "memory test: mismatches",
               "checked products")


def render(res: Result, doc: dict[str, Any]) -> str:
    title = f"gpud burn-in — {doc['host']['name']} — {doc['level']} — {doc['status'].upper()}"

    def row(v: dict[str, Any]) -> str:
        return (f"<tr><td class=s style='color:{COLOURS[v['status']]}'>{v['status'].upper()}</td>"
                f"<td class=k>{'' if v['gpu'] is None else 'GPU' + str(v['gpu'])}</td>"
                f"<td class=k>{escape(v['test'])}</td>"
                f"<td>{escape(v['summary'])}</td><td class=small>{escape(v['source'])}</td>"
                f"<td class=small>{escape(v['remedy'])}</td></tr>")

    head = ("<tr><th>status</th><th>GPU</th><th>test</th><th>figure</th><th>threshold and source</th>"
            "<th>what to do</th></tr>")

    def order(v: dict[str, Any]) -> tuple[int, int, int]:
        return (RANK.get(str(v["status"]), 3), 1 if str(v["test"]).startswith("doctor.") else 0,
                v["gpu"] if v["gpu"] is not None else -1)

    def configuration(v: dict[str, Any]) -> bool:
        test = str(v["test"])
        return test.startswith("doctor.") and not test.startswith(DOCTOR_HARDWARE)

    hardware = sorted((v for v in doc["verdicts"] if not configuration(v)), key=order)
    config = sorted((v for v in doc["verdicts"] if configuration(v)), key=order)
    shown = [v for v in hardware if v["status"] != "pass"]
    findings = [v for v in config if v["status"] != "pass"]
    passed = [v for v in hardware + config if v["status"] == "pass"]
    links = " ".join(f"<a href='#gpu{g}'>GPU{g}</a>" for g in res.gpus)
    counts = {s: sum(1 for v in hardware if v["status"] == s) for s in ("fail", "warn", "skip")}
    parts = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
             f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{escape(title)}</h1>",
             f"<p class=small>device {escape(doc['device'])}"
             + (" — the kernels ran on the CPU: CPU figures" if doc["figures"] == "cpu" else "")
             + (f" — {doc['seconds'] / 60:.1f} min of simulated time" if doc["simulated_time"]
                else f" — {doc['seconds'] / 60:.1f} min") + f" — gpud {escape(doc['gpud_version'])}</p>",
             f"<h2>The hardware: {counts['fail']} failed, {counts['warn']} warned, {counts['skip']} not judged</h2>",
             f"<table>{head}{''.join(row(v) for v in shown)}</table>" if shown else "<p>every test passed</p>",
             "<h2>Figures per GPU</h2>",
             "<div style='overflow-x:auto'><table><tr>" + "".join(f"<th class=f>{escape(h)}</th>" for h in FIGURE_HEAD)
             + "</tr>" + "".join("<tr>" + "".join(f"<td class=n>{c}</td>" for c in figures(res, g)) + "</tr>"
                                 for g in res.gpus) + "</table></div>",
             f"<h2>The configuration (gpud doctor): {len(findings)} finding(s)</h2>",
             f"<table>{head}{''.join(row(v) for v in findings)}</table>" if findings else
             "<p>doctor found nothing to change</p>",
             f"<details><summary>{len(passed)} passed</summary><table>{head}"
             f"{''.join(row(v) for v in passed)}</table></details>",
             f"<h2>Charts</h2><p>{links}<span class=small> — phases:"
             + "".join(f"<span class=key style='background:{c}'></span>{escape(label)}"
                       for label, c in dict(PHASES.values()).items())
             + "<span class=key style='background:#f5d5d8'></span>the soak's settle band (±2 °C)</span></p>"]
    everyone = [p.t for s in res.series.values() for p in s.points]
    t0, t1 = (min(everyone), max(everyone)) if everyone else (0.0, 1.0)
    for g in res.gpus:
        s = res.series.get(g)
        info: dict[str, Any] = next((x for x in doc["gpus"] if x["index"] == g), {})
        parts.append(f"<h3 id=gpu{g}>GPU{g} {escape(str(info.get('name') or ''))} — "
                     f"<span style='color:{COLOURS.get(info.get('status', 'skip'), '#000')}'>"
                     f"{escape(str(info.get('status', '')).upper())}</span></h3>")
        if s is None or len(s.points) < 2:
            parts.append("<p class=small>no telemetry</p>")
            continue
        pts = s.points
        spans = phase_spans(pts)
        lim = res.limits.get(g, {})
        mates = [res.series[o].points for o in res.gpus
                 if o != g and o in res.series and res.names.get(o) == res.names.get(g)]

        def series(attr: str, pts: list[Point] = pts) -> list[tuple[float, float]]:
            return [(p.t, float(getattr(p, attr))) for p in pts if getattr(p, attr) is not None]

        def theirs(attr: str, mates: list[list[Point]] = mates) -> list[list[tuple[float, float]]]:
            return [series(attr, m) for m in mates]

        temp_lines = [(label, float(v), c) for label, v, c in
                      (("max operating", lim.get("max_operating_c"), "#bc4c00"), ("slowdown", lim.get("slowdown_c"),
                                                                                  "#cf222e"),
                       # what the cooling promised under this load: the fan curve's equilibrium, else the
                       # driver's target temperature (the thermal verdict's figures)
                       ("fan curve's promise", lim.get("curve_promise_c"), "#1a7f37"),
                       ("driver's target", None if lim.get("curve_promise_c") is not None else lim.get("target_c"),
                        "#0969da")) if v is not None]
        soak = [p for p in pts if p.phase == "soak"]
        band = None
        settled, since = settle(soak, THRESHOLDS["settle_band_c"].value) if soak else (None, None)
        if settled is not None and since is not None:
            width = THRESHOLDS["settle_band_c"].value
            band = (soak[0].t + since, soak[-1].t, settled - width, settled + width)
        parts.append(chart("temperature", "°C", series("temperature_c"), t0, t1, temp_lines, "#cf222e",
                           siblings=theirs("temperature_c"), spans=spans, phase_labels=True, band=band))
        parts.append(chart("fan (as asked)", "%", series("fan_percent"), t0, t1, [], "#1a7f37",
                           siblings=theirs("fan_percent"), spans=spans))
        parts.append(chart("SM clock", "MHz", series("sm_mhz"), t0, t1, [], "#0969da", siblings=theirs("sm_mhz"),
                           spans=spans))
        limit = next((p.limit_w for p in reversed(pts) if p.limit_w), None)
        power_lines = ([("limit", float(limit), "#57606a"),
                        ("95 % of limit", round(0.95 * float(limit), 1), "#9a6700")] if limit else [])
        parts.append(chart("power", "W", series("power_w"), t0, t1, power_lines, "#8250df",
                           siblings=theirs("power_w"), spans=spans))
        parts.append(reasons_chart(pts, t0, t1, spans))
    parts.append(f"<p class=small>HW reasons judged: {', '.join(HW_REASONS)}.</p></body></html>")
    return "\n".join(parts)


def write_report(path: Path, res: Result, doc: dict[str, Any]) -> None:
    atomic_write(path, render(res, doc))
