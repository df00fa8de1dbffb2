"""``gpud doctor``: pre-flight checks, grouped by area, remedies under each warn and fail."""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from typing import TYPE_CHECKING, Annotated, List

import typer

from gpud import __version__
from gpud.cli import complete
from gpud.cli.common import GpuIds, Json, Simulate, gpu_ids, gpus_of, machine
from gpud.cli.output import clean, colour, cut, debug_enabled, echo_err, emit_json, plural, stderr_width, width, wrap
from gpud.errors import InvalidInput
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
            out += wrap(fit(f"{r.id}{gpu}: {r.summary}", limit), limit, indent=" " * 9, first=f"  {mark} ")
            if r.status in ("warn", "fail") or verbose:
                for line in r.detail.splitlines() if r.detail and (verbose or r.status == "fail") else []:
                    out += wrap(fit(line, limit), limit, indent=" " * 9)
                if r.remedy and r.status != "pass":
                    out += _remedy(clean(r.remedy), limit)
    n = report.counts  # per result, as --json counts them: GPU0-3 on one line is four results
    out += ["", ", ".join([plural(n["pass"], "passed", "passed"), plural(n["warn"], "warning"),
                           plural(n["fail"], "failed", "failed"), plural(n["skip"], "skipped", "skipped")])
            + (f" ({plural(sum(shown.values()), 'line')} above)" if sum(shown.values()) != sum(n.values()) else "")]
    sys.stdout.write("\n".join(out) + "\n")


MAX_LINES = 4  # a summary or detail line from data (a process's command line) is cut at 4 lines


def fit(text: str, limit: int) -> str:
    """One line of a check's text as the terminal gets it: controls out, cut with … where it would
    run past MAX_LINES lines (at most 1000 characters through a pipe); --json keeps it whole."""
    text = cut(clean(text), min(1000, MAX_LINES * (limit - 10)))
    longest = limit - 12  # within the indent: a word longer than that (a 100 000-character argument) is cut too
    return " ".join(cut(w, longest) if len(w) > longest else w for w in text.split(" "))


def _remedy(text: str, limit: int) -> list[str]:
    """→ the remedy, wrapped; each `command` that does not fit the line starts a line of its own."""
    return wrap(text, limit, indent=" " * 11, first=" " * 9 + "→ ")


def doctor(
    simulate: Simulate = None,
    json: Json = False,
    ids: GpuIds = None,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only failures (to stderr); "
                                                              "for job scripts: `gpud doctor -q || exit 1`.")] = False,
    only: Annotated[List[str] | None, typer.Option("--check", metavar="GLOB", autocompletion=complete.check_ids,
                                                      help="Run only checks matching (repeatable).")] = None,
    skip: Annotated[List[str] | None, typer.Option("--skip", metavar="GLOB", autocompletion=complete.check_ids,
                                                      help="Leave out checks matching (repeatable).")] = None,
    expect_gpus: Annotated[int | None, typer.Option("--expect-gpus", min=0, help="GPUs this machine must "
                                                                                    "have.")] = None,
    config: Annotated[str | None, typer.Option("--config", metavar="PATH", help="gpud.toml (default "
                                                  "/etc/gpud/gpud.toml if present).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Details of every check.")] = False,
    probe: Annotated[bool, typer.Option("--probe", help="Also run the quick training probe (DDP, pipeline, "
                                                         "all-reduce, P2P) and re-check PCIe under load.")] = False,
    burnin: Annotated[bool, typer.Option("--burnin", help="Also show the last `gpud burnin` result.")] = False,
    prolog: Annotated[bool, typer.Option("--prolog", help="Slurm's Prolog and HealthCheckProgram: within 10 s, "
                                         "exit 1 with one line (the drain reason) when something is unhealthy.")]
    = False,
    epilog: Annotated[bool, typer.Option("--epilog", help="Slurm's Epilog: restore the job's profile, journal "
                                         "the job's Xids, exit 1 with one line if a GPU was lost.")] = False,
    health_check: Annotated[bool, typer.Option("--health-check", help="Slurm's HealthCheckProgram: drain the "
                                               "node when a GPU is unfit (not over someone else's drain), "
                                               "lift gpud's own drain when it is fit again.")] = False,
) -> None:
    """Pre-flight checks: driver, SLI, PCIe/NVLink topology, P2P, configuration, health, host, environment.

    Exit 0 when nothing fails (warnings allowed unless --strict), 1 when a check fails, 2 on bad
    usage or an invalid configuration file.
    """
    if prolog or epilog or health_check:
        from gpud.cli import slurm

        if prolog + epilog + health_check > 1:

            raise InvalidInput("--prolog", "", "--prolog, --epilog and --health-check are different moments: "
                                               "give one")
        raise typer.Exit(slurm.prolog(simulate, config) if prolog else slurm.epilog(simulate, config) if epilog
                         else slurm.health_check(simulate, config))
    from gpud import config as cfg
    from gpud.doctor import configcheck, diagnose

    conf = cfg.load(config)  # an invalid file stops here: exit 2, nothing else runs
    configcheck.globs_match(conf, only or [], skip or [])
    m = machine(simulate)
    configcheck.check(conf, len(m.host.nvidia_gpus()))  # the same check as the daemon's
    picked = None if ids is None else gpu_ids(ids, gpus_of(m.snapshot()))  # a wrong id: exit 2 before any check
    result = None
    if probe:
        from gpud.probe import runner, torchrun

        have = torchrun.torch_gpus()
        result = runner.run_probe(device="cuda" if have else "cpu", gpus=have, quick=True, machine=m, host=m.label,
                                  thresholds=conf.efficiency_thresholds())
    report = diagnose(m, conf, only=only, skip=skip, expect_gpus=expect_gpus, debug=debug_enabled(), probe=result)
    if burnin:
        from gpud.burnin.store import as_checks, last

        report = dataclasses.replace(report, checks=(*report.checks, *as_checks(last())))
    if picked is not None:  # per-GPU results of the GPUs named; machine-wide ones stay
        report = dataclasses.replace(report, checks=tuple(r for r in report.checks if r.gpu is None or r.gpu in picked))
    code = report.exit_code(strict)
    if json:
        emit_json(document("doctor", __version__, report.host, checks=[
            {"id": r.id, "status": r.status, "gpu": r.gpu, "summary": r.summary, "detail": r.detail,
             "remedy": r.remedy} for r in report.checks], counts=report.counts, exit_code=code))
    elif quiet:
        for r in report.checks:
            if r.status == "fail" or (strict and r.status == "warn"):
                gpu = f" GPU{r.gpu}" if r.gpu is not None else ""
                echo_err(f"gpud doctor: {r.status}: {r.id}{gpu}: {fit(r.summary, stderr_width())}")
    else:
        render(report, verbose)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
