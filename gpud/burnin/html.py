"""The burn-in's HTML report: one self-contained file (inline CSS and SVG, no script, nothing fetched)
with the verdict table, then per GPU the charts of temperature, fan, SM clock, power and clock-event
reasons over time, with the thresholds drawn."""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from gpud.burnin.result import Result, shown_order
from gpud.burnin.telemetry import HW_REASONS, Point
from gpud.paths import atomic_write

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 720, 160, 56, 12, 18, 26
COLOURS = {"pass": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e", "skip": "#6e7781"}
REASON_ROWS = (("hw_slowdown", "#cf222e"), ("hw_thermal_slowdown", "#a40e26"), ("hw_power_brake_slowdown", "#8250df"),
               ("sw_thermal_slowdown", "#bc4c00"), ("sw_power_cap", "#0969da"))
CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1f2328;background:#fff}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left;
vertical-align:top}th{background:#f6f8fa}.s{font-weight:600}.small{color:#57606a;font-size:12px}
svg{display:block;margin:6px 0 14px;background:#fff;border:1px solid #d0d7de}
"""


def _scale(pts: list[tuple[float, float]], lo: float, hi: float, t0: float, t1: float) -> str:
    xs = (W - PAD_L - PAD_R) / ((t1 - t0) or 1.0)
    ys = (H - PAD_T - PAD_B) / ((hi - lo) or 1.0)
    return " ".join(f"{PAD_L + (t - t0) * xs:.1f},{H - PAD_B - (v - lo) * ys:.1f}" for t, v in pts)


def chart(title: str, unit: str, pts: list[tuple[float, float]], t0: float, t1: float,
          lines: list[tuple[str, float, str]], colour: str = "#0969da") -> str:
    """A line chart (SVG) with threshold lines (label, value, colour) and labelled axes."""
    values = [v for _, v in pts] + [v for _, v, _ in lines]
    if not values:
        return f"<p class=small>{escape(title)}: no readings</p>"
    lo, hi = min(values), max(values)
    floor = 0.0 if lo >= 0 else lo
    lo, hi = (lo - 1, hi + 1) if hi - lo < 2 else (max(floor, lo - (hi - lo) * 0.05), hi + (hi - lo) * 0.05)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           f'role="img" aria-label="{escape(title)}">',
           f'<text x="{PAD_L}" y="13" font-size="12" fill="#1f2328">{escape(title)} ({escape(unit)})</text>',
           f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#8c959f"/>',
           f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" stroke="#8c959f"/>']
    for v in (lo, (lo + hi) / 2, hi):
        y = H - PAD_B - (v - lo) * (H - PAD_T - PAD_B) / ((hi - lo) or 1.0)
        out.append(f'<text x="{PAD_L - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end" fill="#57606a">'
                   f'{v:.0f}</text>')
    for k in range(5):
        t = t0 + (t1 - t0) * k / 4
        x = PAD_L + (W - PAD_L - PAD_R) * k / 4
        out.append(f'<text x="{x:.1f}" y="{H - 8}" font-size="10" text-anchor="middle" fill="#57606a">'
                   f'{t / 60:.1f} min</text>')
    for k, (label, v, c) in enumerate(lines):
        anchor, x = ("end", W - PAD_R - 2) if k % 2 == 0 else ("start", PAD_L + 4)
        y = H - PAD_B - (v - lo) * (H - PAD_T - PAD_B) / ((hi - lo) or 1.0)
        out.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="{c}" '
                   'stroke-dasharray="5,4"/>'
                   f'<text x="{x}" y="{y - 3:.1f}" font-size="10" text-anchor="{anchor}" fill="{c}">'
                   f'{escape(label)} {v:g}</text>')
    if len(pts) > 1:
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" '
                   f'points="{_scale(pts, lo, hi, t0, t1)}"/>')
    out.append("</svg>")
    return "".join(out)


def reasons_chart(points: list[Point], t0: float, t1: float) -> str:
    """One row per clock-event reason: a bar wherever it was active."""
    row_h, pad_l = 14, 110
    h = PAD_T + row_h * len(REASON_ROWS) + PAD_B
    xs = (W - pad_l - PAD_R) / ((t1 - t0) or 1.0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" role="img" '
           f'aria-label="clock-event reasons">',
           f'<text x="{pad_l}" y="13" font-size="12" fill="#1f2328">clock-event reasons (HW ones must stay empty)'
           '</text>']
    for k, (name, c) in enumerate(REASON_ROWS):
        y = PAD_T + k * row_h
        out.append(f'<text x="{pad_l - 4}" y="{y + 10}" font-size="9" text-anchor="end" fill="#57606a">'
                   f'{escape(name)}</text>')
        out.append(f'<rect x="{pad_l}" y="{y + 1}" width="{W - pad_l - PAD_R}" height="{row_h - 2}" fill="#f6f8fa"/>')
        for a, b in zip(points, points[1:], strict=False):
            if name in a.reasons:
                out.append(f'<rect x="{pad_l + (a.t - t0) * xs:.1f}" y="{y + 1}" '
                           f'width="{max(0.8, (b.t - a.t) * xs):.1f}"'
                           f' height="{row_h - 2}" fill="{c}"/>')
    out.append("</svg>")
    return "".join(out)


def render(res: Result, doc: dict[str, Any]) -> str:
    title = f"gpud burn-in — {doc['host']['name']} — {doc['level']} — {doc['status'].upper()}"
    def row(v: dict[str, Any]) -> str:
        return (f"<tr><td class=s style='color:{COLOURS[v['status']]}'>{v['status'].upper()}</td>"
                f"<td>{'' if v['gpu'] is None else 'GPU' + str(v['gpu'])}</td><td>{escape(v['test'])}</td>"
                f"<td>{escape(v['summary'])}</td><td class=small>{escape(v['source'])}</td>"
                f"<td class=small>{escape(v['remedy'])}</td></tr>")

    head = ("<tr><th>status</th><th>GPU</th><th>test</th><th>figure</th><th>threshold and source</th>"
            "<th>what to do</th></tr>")
    ranked = sorted(doc["verdicts"], key=shown_order)  # hardware failures first, configuration after
    rows = [row(v) for v in ranked if v["status"] != "pass"]
    passed = [row(v) for v in ranked if v["status"] == "pass"]
    links = " ".join(f"<a href='#gpu{g}'>GPU{g}</a>" for g in res.gpus)
    parts = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
             f"<title>{escape(title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{escape(title)}</h1>",
             f"<p class=small>device {escape(doc['device'])}"
             + (" — the kernels ran on the CPU: CPU figures" if doc["figures"] == "cpu" else "")
             + (f" — {doc['seconds'] / 60:.1f} min of simulated time" if doc["simulated_time"]
                else f" — {doc['seconds'] / 60:.1f} min") + f" — gpud {escape(doc['gpud_version'])}</p>",
             f"<p>charts: {links}</p>",
             "<h2>Verdicts</h2>", f"<table>{head}{''.join(rows)}</table>" if rows else "<p>every test passed</p>",
             f"<details><summary>{len(passed)} passed</summary><table>{head}{''.join(passed)}</table></details>"]
    for g in res.gpus:
        s = res.series.get(g)
        info: dict[str, Any] = next((x for x in doc["gpus"] if x["index"] == g), {})
        parts.append(f"<h2 id=gpu{g}>GPU{g} {escape(str(info.get('name') or ''))} — "
                     f"<span style='color:{COLOURS.get(info.get('status', 'skip'), '#000')}'>"
                     f"{escape(str(info.get('status', '')).upper())}</span></h2>")
        if s is None or len(s.points) < 2:
            parts.append("<p class=small>no telemetry</p>")
            continue
        pts = s.points
        t0, t1 = pts[0].t, pts[-1].t
        lim = res.limits.get(g, {})

        def series(attr: str, pts: list[Point] = pts) -> list[tuple[float, float]]:
            return [(p.t, float(getattr(p, attr))) for p in pts if getattr(p, attr) is not None]

        temp_lines = [(label, float(v), c) for label, v, c in
                      (("max operating", lim.get("max_operating_c"), "#bc4c00"), ("slowdown", lim.get("slowdown_c"),
                                                                                  "#cf222e"),
                       # what the cooling promised under this load: the fan curve's equilibrium, else the
                       # driver's target temperature (the thermal verdict's figures)
                       ("fan curve's promise", lim.get("curve_promise_c"), "#1a7f37"),
                       ("driver's target", None if lim.get("curve_promise_c") is not None else lim.get("target_c"),
                        "#0969da")) if v is not None]
        parts.append(chart("temperature", "°C", series("temperature_c"), t0, t1, temp_lines, "#cf222e"))
        parts.append(chart("fan (as asked)", "%", series("fan_percent"), t0, t1, [], "#1a7f37"))
        parts.append(chart("SM clock", "MHz", series("sm_mhz"), t0, t1, [], "#0969da"))
        limit = next((p.limit_w for p in reversed(pts) if p.limit_w), None)
        power_lines = ([("limit", float(limit), "#57606a"),
                        ("95 % of limit", round(0.95 * float(limit), 1), "#9a6700")] if limit else [])
        parts.append(chart("power", "W", series("power_w"), t0, t1, power_lines, "#8250df"))
        parts.append(reasons_chart(pts, t0, t1))
    parts.append(f"<p class=small>HW reasons judged: {', '.join(HW_REASONS)}.</p></body></html>")
    return "\n".join(parts)


def write_report(path: Path, res: Result, doc: dict[str, Any]) -> None:
    atomic_write(path, render(res, doc))
