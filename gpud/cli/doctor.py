"""``gpud doctor``: pre-flight checks, grouped by area, remedies under each warn and fail."""

from __future__ import annotations

import sys
from collections import Counter
from typing import TYPE_CHECKING, Annotated, List

import typer

from gpud import __version__
from gpud.cli.common import Json, Simulate, machine
from gpud.cli.output import colour, emit_json, plural, width, wrap
from gpud.model import CheckResult, document
from gpud.text import ranges

if TYPE_CHECKING:  # the checks load only when doctor runs
    from gpud.doctor import Report

MARK = {"pass": ("ok", "32"), "warn": ("WARN", "33"), "fail": ("FAIL", "31"), "skip": ("skip", "2")}


def _collapse(rows: list[CheckResult]) -> list[tuple[CheckResult, list[int]]]:
    """Consecutive per-GPU results that say the same thing become one line: GPU0-3."""
    out: list[tuple[CheckResult, list[int]]] = []
    for r in rows:
        prev = out[-1][0] if out else None
        if (prev is not None and r.gpu is not None and prev.gpu is not None and out[-1][1]
                and (prev.id, prev.status, prev.summary, prev.detail, prev.remedy)
                == (r.id, r.status, r.summary, r.detail, r.remedy)):
            out[-1][1].append(r.gpu)
        else:
            out.append((r, [r.gpu] if r.gpu is not None else []))
    return out


def render(report: Report, verbose: bool = False) -> None:
    """Areas, one line per (collapsed) result, wrapped to the terminal; details and remedies under
    each warn and fail with an indent, every `command` whole on its own line."""
    from gpud.doctor import AREAS, area_of

    h = report.host
    head = f"gpud doctor — {h['name']}"
    if h.get("gpu_count") is not None:
        head += (f" (driver {h['driver_version']}, CUDA {h['cuda_driver_version']}, "
                 f"{plural(int(h['gpu_count']), 'GPU')})")
    out = wrap(head)
    limit = width()
    shown: Counter[str] = Counter()
    for area in AREAS:
        rows = [r for r in report.checks if area_of(r.id) == area]
        if not rows:
            continue
        out.append("")
        out.append(colour(area, "1"))
        for r, gpus in _collapse(rows):
            shown[r.status] += 1
            word, code = MARK[r.status]
            gpu = f" GPU{ranges(gpus)}" if gpus else ""
            mark = colour(f"[{word:>4}]", code)
            out += wrap(f"{r.id}{gpu}: {r.summary}", limit, indent=" " * 9, first=f"  {mark} ")
            if r.status in ("warn", "fail") or verbose:
                for line in r.detail.splitlines() if r.detail and (verbose or r.status == "fail") else []:
                    out += wrap(line, limit, indent=" " * 9)
                if r.remedy and r.status != "pass":
                    out += _remedy(r.remedy, limit)
    out += ["", ", ".join([plural(shown["pass"], "passed", "passed"), plural(shown["warn"], "warning"),
                           plural(shown["fail"], "failed", "failed"), plural(shown["skip"], "skipped", "skipped")])]
    sys.stdout.write("\n".join(out) + "\n")


def _remedy(text: str, limit: int) -> list[str]:
    """→ the remedy, wrapped; each `command` that does not fit the line starts a line of its own."""
    return wrap(text, limit, indent=" " * 11, first=" " * 9 + "→ ")


def doctor(
    simulate: Simulate = None,
    json: Json = False,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only failures (to stderr); "
                                                              "for job scripts: `gpud doctor -q || exit 1`.")] = False,
    only: Annotated[List[str] | None, typer.Option("--check", metavar="GLOB",
                                                      help="Run only checks matching (repeatable).")] = None,
    skip: Annotated[List[str] | None, typer.Option("--skip", metavar="GLOB",
                                                      help="Leave out checks matching (repeatable).")] = None,
    expect_gpus: Annotated[int | None, typer.Option("--expect-gpus", min=0, help="GPUs this machine must "
                                                                                    "have.")] = None,
    config: Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml (default "
                                                  "/etc/gpud/gpud.toml if present).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Details of every check.")] = False,
    probe: Annotated[bool, typer.Option("--probe", help="Also run the quick training probe (DDP, pipeline, "
                                                         "all-reduce, P2P) and re-check PCIe under load.")] = False,
) -> None:
    """Pre-flight checks: driver, SLI, PCIe/NVLink topology, P2P, configuration, health, host, environment.

    Exit 0 when nothing fails (warnings allowed unless --strict), 1 when a check fails, 2 on bad
    usage or an invalid configuration file.
    """
    from gpud import config as cfg
    from gpud.cli import debug_enabled
    from gpud.doctor import configcheck, diagnose

    conf = cfg.load(config)  # an invalid file stops here: exit 2, nothing else runs
    configcheck.globs_match(conf, only or [], skip or [])
    m = machine(simulate)
    configcheck.check(conf, len(m.host.nvidia_gpus()))  # the same check as the daemon's
    result = None
    if probe:
        from gpud.probe import runner

        have = runner.torch_gpus()
        result = runner.run_probe(device="cuda" if have else "cpu", gpus=have, quick=True, machine=m, host=m.label,
                                  thresholds=conf.efficiency_thresholds())
    report = diagnose(m, conf, only=only, skip=skip, expect_gpus=expect_gpus, debug=debug_enabled(), probe=result)
    code = report.exit_code(strict)
    if json:
        emit_json(document("doctor", __version__, report.host, checks=[
            {"id": r.id, "status": r.status, "gpu": r.gpu, "summary": r.summary, "detail": r.detail,
             "remedy": r.remedy} for r in report.checks], counts=report.counts, exit_code=code))
    elif quiet:
        for r in report.checks:
            if r.status == "fail" or (strict and r.status == "warn"):
                gpu = f" GPU{r.gpu}" if r.gpu is not None else ""
                print(f"gpud doctor: {r.status}: {r.id}{gpu}: {r.summary}", file=sys.stderr)
    else:
        render(report, verbose)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
