"""What a tune shows: the JSON body (``kind: tune``), the frontier, a plain-text chart of throughput
against energy, the HTML report (one self-contained file with an SVG chart, as the burn-in's), and
the profile file that records what was measured."""

from __future__ import annotations

import json
import math
import time
from html import escape
from typing import Any

from gpud.autotune.run import Outcome
from gpud.autotune.trial import Settings, Trial
from gpud.autotune.workload import FIGURES
from gpud.burnin.html import CSS
from gpud.profiles.fancurve import Curve, policy_of
from gpud.text import ranges

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 720, 360, 64, 16, 24, 40


def frontier(trials: list[Trial]) -> list[Trial]:
    """The trials no other beats on both throughput and energy per sample (more samples/s, fewer J)."""
    ok = [t for t in trials if t.ok]
    out = []
    for t in ok:
        assert t.samples_per_second is not None and t.joules_per_sample is not None
        dominated = any(o is not t and o.samples_per_second is not None and o.joules_per_sample is not None
                        and o.samples_per_second >= t.samples_per_second and o.joules_per_sample <= t.joules_per_sample
                        and (o.samples_per_second > t.samples_per_second or o.joules_per_sample < t.joules_per_sample)
                        for o in ok)
        if not dominated:
            out.append(t)
    return sorted(out, key=lambda t: t.joules_per_sample or 0.0)


def _point(t: Trial | None, settings: Settings | None = None) -> dict[str, Any] | None:
    if t is None:
        return None
    s = settings if settings is not None else t.settings
    return {"trial": t.number, "samples_per_second": None if t.samples_per_second is None else round(
        t.samples_per_second, 3), "joules_per_sample": None if t.joules_per_sample is None else round(
        t.joules_per_sample, 4), "power_watts": None if t.power_w is None else round(t.power_w, 1),
        "settings": {str(g): v for g, v in sorted(s.items())}}


def _pct(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v * 100, 2)


def body(out: Outcome) -> dict[str, Any]:
    """The ``tune`` document's fields after the envelope (docs/json.md)."""
    saving, slow = out.energy_saving, out.slowdown
    chosen_settings = out.chosen.settings if out.chosen is not None and out.chosen.settings else out.baseline_settings
    front = {t.number for t in frontier(out.trials)}
    return {"goal": out.goal, "max_slowdown_percent": round(out.max_slowdown * 100, 3), "knobs": out.knobs,
            "gpus": out.gpus, "workload": out.workload, "unit": out.unit, "figures": out.figures,
            "figures_note": FIGURES[out.figures],
            "baseline": _point(out.baseline, out.baseline_settings), "chosen": _point(out.chosen, chosen_settings),
            "energy_saving_percent": None if saving is None else round(saving * 100, 2),
            "slowdown_percent": None if slow is None else round(slow * 100, 2),
            "energy_saving_ci_percent": _pct(out.energy_saving_ci), "slowdown_ci_percent": _pct(out.slowdown_ci),
            "confirmed": out.confirmed, "gain_excludes_zero": out.gain_excludes_zero,
            "trials": [t.json() | {"frontier": t.number in front} for t in out.trials],
            "trial_count": len(out.trials), "search_trials": out.search_trials,
            "linear_sweep_trials": out.zeus_trials,
            "confidence": {"level_percent": 95, "bound_percent": round(out.measure.ci_bound * 100, 3),
                           "reached": all(t.ci_reached for t in out.trials if t.ok)},
            "restored": out.restored, "interrupted": out.interrupted, "notes": out.notes}


def text_chart(doc: dict[str, Any], width: int = 60, height: int = 14) -> list[str]:
    """Samples per second (up) against joules per sample (right): ``o`` a trial, ``*`` on the frontier,
    ``B`` the baseline, ``C`` the chosen point."""
    pts = [t for t in doc["trials"] if t["status"] == "ok" and t["samples_per_second"] and t["joules_per_sample"]]
    if not pts:
        return ["(no trial measured)"]
    xs = [t["joules_per_sample"] for t in pts]
    ys = [t["samples_per_second"] for t in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    grid = [[" "] * width for _ in range(height)]
    base = (doc["baseline"] or {}).get("trial")
    chosen = (doc["chosen"] or {}).get("trial")
    for t in sorted(pts, key=lambda t: (t["number"] == chosen, t["number"] == base)):
        c = round((t["joules_per_sample"] - x0) / ((x1 - x0) or 1) * (width - 1))
        r = height - 1 - round((t["samples_per_second"] - y0) / ((y1 - y0) or 1) * (height - 1))
        mark = "C" if t["number"] == chosen else "B" if t["number"] == base else "*" if t["frontier"] else "o"
        grid[r][c] = mark
    unit = doc["unit"]
    lines = [f"{unit}/s"]
    for r, row in enumerate(grid):
        label = f"{y1:10.1f} " if r == 0 else f"{y0:10.1f} " if r == height - 1 else " " * 11
        lines.append(label + "|" + "".join(row).rstrip())
    lines.append(" " * 11 + "+" + "-" * width)
    lines.append(" " * 12 + f"{x0:<.4g}".ljust(width - 10) + f"{x1:.4g}".rjust(10) + f"  J/{unit[:-1]}")
    lines.append(" " * 12 + "B baseline, C chosen, * frontier, o other trials")
    return lines


def html(doc: dict[str, Any]) -> str:
    """One self-contained page: the figures, an SVG chart of every trial (frontier and chosen point
    marked), the trial table. No script, nothing fetched."""
    title = f"gpud tune — {doc['host']['name']} — goal {doc['goal']}"
    pts = [t for t in doc["trials"] if t["status"] == "ok" and t["samples_per_second"] and t["joules_per_sample"]]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" id="tune-chart" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'role="img" aria-label="throughput against energy per sample">']
    unit = doc["unit"]
    if pts:
        xs = [float(t["joules_per_sample"]) for t in pts]
        ys = [float(t["samples_per_second"]) for t in pts]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        dx, dy = (x1 - x0) or x1 * 0.1 or 1.0, (y1 - y0) or y1 * 0.1 or 1.0
        x0, x1, y0, y1 = x0 - dx * 0.05, x1 + dx * 0.05, y0 - dy * 0.05, y1 + dy * 0.05

        def px(x: float) -> float:
            return PAD_L + (x - x0) / (x1 - x0) * (W - PAD_L - PAD_R)

        def py(y: float) -> float:
            return H - PAD_B - (y - y0) / (y1 - y0) * (H - PAD_T - PAD_B)

        svg.append(f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#8c959f"/>')
        svg.append(f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" stroke="#8c959f"/>')
        for k in range(5):
            xv, yv = x0 + (x1 - x0) * k / 4, y0 + (y1 - y0) * k / 4
            svg.append(f'<text x="{px(xv):.1f}" y="{H - PAD_B + 14}" font-size="10" text-anchor="middle" '
                       f'fill="#57606a">{xv:.4g}</text>')
            svg.append(f'<text x="{PAD_L - 4}" y="{py(yv) + 3:.1f}" font-size="10" text-anchor="end" '
                       f'fill="#57606a">{yv:.4g}</text>')
        svg.append(f'<text x="{W / 2}" y="{H - 6}" font-size="11" text-anchor="middle" fill="#1f2328">'
                   f'joules per {escape(unit[:-1])}</text>')
        svg.append(f'<text x="12" y="{PAD_T - 8}" font-size="11" fill="#1f2328">{escape(unit)} per second</text>')
        front = sorted((t for t in pts if t["frontier"]), key=lambda t: t["joules_per_sample"])
        if len(front) > 1:
            svg.append('<polyline fill="none" stroke="#1a7f37" stroke-width="1.5" stroke-dasharray="4,3" points="'
                       + " ".join(f"{px(t['joules_per_sample']):.1f},{py(t['samples_per_second']):.1f}"
                                  for t in front) + '"/>')
        base, chosen = (doc["baseline"] or {}).get("trial"), (doc["chosen"] or {}).get("trial")
        for t in pts:
            x, y = px(t["joules_per_sample"]), py(t["samples_per_second"])
            colour = "#cf222e" if t["number"] == chosen else "#0969da" if t["number"] == base else (
                "#1a7f37" if t["frontier"] else "#6e7781")
            r = 6 if t["number"] in (base, chosen) else 4
            svg.append(f'<circle class="trial" cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{colour}">'
                       f'<title>trial {t["number"]} ({escape(t["stage"])})</title></circle>')
            if t["number"] in (base, chosen):
                svg.append(f'<text x="{x + 8:.1f}" y="{y - 6:.1f}" font-size="11" fill="{colour}">'
                           f'{"chosen" if t["number"] == chosen else "baseline"}</text>')
    else:
        svg.append('<text x="20" y="40" font-size="12">no trial measured</text>')
    svg.append("</svg>")
    head = ("<tr><th>#</th><th>stage</th><th>settings</th><th>samples/s</th><th>±95 %</th><th>J/sample</th>"
            "<th>power W</th><th>SM MHz</th><th>°C</th><th>status</th></tr>")
    rows = []
    for t in doc["trials"]:
        rows.append("<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
            t["number"], t["stage"], settings_text(t["settings"]), _fmt(t["samples_per_second"], ".2f"),
            _fmt(t["ci_percent"], ".2f", "%"), _fmt(t["joules_per_sample"], ".3f"), _fmt(t["power_watts"], ".0f"),
            "/".join(str(v) for v in t["sm_mhz"].values()), "/".join(f"{v:.0f}" for v in t["temperature_c"].values()),
            t["status"] + (f": {t['note']}" if t["note"] else ""))) + "</tr>")
    parts = ["<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
             f"<title>{escape(title)}</title><style>{CSS}</style></head><body>", f"<h1>{escape(title)}</h1>",
             f"<p class=small>workload {escape(doc['workload'])} — figures {escape(doc['figures_note'])} — "
             f"gpud {escape(doc['gpud_version'])}</p>", f"<p>{escape(summary(doc))}</p>", "".join(svg),
             f"<h2>Trials</h2><table>{head}{''.join(rows)}</table>",
             f"<p class=small>{doc['trial_count']} trials; Zeus's 25 W linear sweep would take "
             f"{doc['linear_sweep_trials']}.</p></body></html>"]
    return "\n".join(parts)


def _fmt(v: Any, spec: str, suffix: str = "") -> str:
    return "" if v is None else f"{v:{spec}}{suffix}"


def settings_text(settings: dict[str, Any]) -> str:
    """``GPU0-3 255 W, locked 1500 MHz`` style: GPUs with the same settings together."""

    if not settings:
        return "as found"
    groups: dict[str, list[int]] = {}
    for g, s in settings.items():
        parts = []
        if s.get("power_limit") is not None:
            parts.append(f"{float(s['power_limit']):.0f} W")
        clocks = s.get("gpu_clocks")
        if isinstance(clocks, list):
            parts.append(f"SM locked {clocks[0]}" + ("" if clocks[0] == clocks[1] else f"-{clocks[1]}") + " MHz")
        mem = s.get("memory_clocks")
        if isinstance(mem, list):
            parts.append(f"memory locked {mem[0]}" + ("" if mem[0] == mem[1] else f"-{mem[1]}") + " MHz")
        fan = s.get("fan")
        policy = policy_of(fan) if isinstance(fan, dict) else None
        if isinstance(policy, Curve):
            parts.append("fans " + " ".join(f"{t:g}°C:{d:g}%" for t, d in policy.points))
        groups.setdefault(", ".join(parts) or "as found", []).append(int(g))
    return "; ".join(f"GPU{ranges(sorted(gs))} {text}" for text, gs in groups.items())


def summary(doc: dict[str, Any]) -> str:
    c, b = doc["chosen"], doc["baseline"]
    if c is None or b is None:
        return "no setting was measured"
    if c["trial"] == b["trial"]:
        return "no setting measured better than the GPUs as they were: nothing to change"

    def pm(key: str) -> str:
        hw = doc.get(f"{key}_ci_percent")
        return f" ± {hw:.1f}" if hw is not None else ""

    sure = ("the saving's 95 % interval excludes zero" if doc.get("gain_excludes_zero")
            else "the saving's 95 % interval includes zero: not sure it saves")
    return (f"chosen: {settings_text(c['settings'])} — {doc['energy_saving_percent']:+.1f}{pm('energy_saving')} % "
            f"energy per {doc['unit'][:-1]} saved, {doc['slowdown_percent']:+.1f}{pm('slowdown')} % slowdown "
            f"(allowed {doc['max_slowdown_percent']:g} %; 95 % intervals, against a fresh baseline; {sure})")


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table: the fan curve
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items() if x is not None) + " }"
    raise TypeError(v)


def profile_toml(settings: Settings, description: str, measured: dict[str, Any] | None = None,
                 comment: str = "") -> str:
    """A profile ``gpud apply`` takes: persistence on (the driver keeps the settings), one selection per
    GPU, and the ``[measured]`` table (docs/profiles.md)."""
    lines = [f"# {line}" for line in comment.splitlines()]
    lines.append(f"description = {_toml(description)}")
    for g, s in sorted(settings.items()):
        lines += ["", "[[gpus]]", f"select = [{g}]", "persistence_mode = true"]
        lines += [f"{k} = {_toml(v)}" for k, v in s.items() if v is not None]
    if measured:
        lines += ["", "[measured]"] + [f"{k} = {_toml(v)}" for k, v in measured.items() if v is not None]
    return "\n".join(lines) + "\n"


def measured_record(doc: dict[str, Any]) -> dict[str, Any]:
    """The ``[measured]`` table of a tune's profile: what was measured, how, on what."""
    c, b = doc["chosen"] or {}, doc["baseline"] or {}
    host = doc["host"]
    return {"tool": f"gpud tune {doc['gpud_version']}", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": host.get("name"), "driver": host.get("driver_version"), "gpus": doc["gpu_names"],
            "goal": doc["goal"], "max_slowdown_percent": doc["max_slowdown_percent"], "workload": doc["workload"],
            "figures": doc["figures"], "baseline_samples_per_second": b.get("samples_per_second"),
            "baseline_joules_per_sample": b.get("joules_per_sample"),
            "samples_per_second": c.get("samples_per_second"), "joules_per_sample": c.get("joules_per_sample"),
            "energy_saving_percent": doc["energy_saving_percent"], "slowdown_percent": doc["slowdown_percent"],
            "trials": doc["trial_count"]}
