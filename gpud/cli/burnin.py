"""``gpud burnin``: accept a workstation — stress, memory, bandwidth, and a thermal soak that proves
the cooling holds; a verdict per GPU and test, JSON, an HTML report."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from gpud import __version__
from gpud.backends import open_bench
from gpud.cli.common import Json, Simulate, host, machine
from gpud.cli.output import colour, echo_wrapped, emit_json
from gpud.errors import InvalidInput
from gpud.text import ranges

MARK = {"pass": ("ok", "32"), "warn": ("WARN", "33"), "fail": ("FAIL", "31"), "skip": ("skip", "2")}
# The soak runs 30 minutes to 24 hours: acceptance burns run 4–24 hours (the issue); DCGM's r4 is longer
# than r3 but fixed, gpu-burn runs as long as asked.
SOAK_MIN_S, SOAK_MAX_S = 1800.0, 86400.0


def parse_duration(text: str) -> float:
    """``30m``, ``45min``, ``1h``, ``2700s``, ``2700`` → seconds; the soak's range only."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", text)
    if m is None:
        raise InvalidInput("--duration", "", f"not a duration: {text!r} (e.g. 30m, 4h, 24h)")
    seconds = float(m.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, None: 1}[m.group(2)]
    if not SOAK_MIN_S <= seconds <= SOAK_MAX_S:
        raise InvalidInput("--duration", "", f"{text} is outside the soak's 30m..24h")
    return seconds


def parse_gpus(text: str, count: int) -> list[int]:
    """``0,2-3`` → [0, 2, 3]; each in 0..count-1."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if m is None:
            raise InvalidInput("--gpus", "", f"not a GPU list: {text!r} (e.g. 0,2-3)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo or hi >= count:
            raise InvalidInput("--gpus", "", f"{part.strip()}: this machine has GPUs 0..{count - 1}")
        out += [g for g in range(lo, hi + 1) if g not in out]
    return out


class Progress:
    """One line on a terminal's stderr: what runs now and the time left; nothing when not a terminal."""

    def __init__(self, simulated: bool) -> None:
        self.on = sys.stderr.isatty()
        self.simulated = simulated
        self.start = time.monotonic()

    def __call__(self, what: str, left_s: float) -> None:
        if not self.on:
            return
        clock = "simulated " if self.simulated else ""
        mins, secs = divmod(int(left_s), 60)
        sys.stderr.write(f"\r\033[Kgpud burnin: {what} — {clock}time left {mins}:{secs:02d}")
        sys.stderr.flush()

    def done(self) -> None:
        if self.on:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def render(doc: dict[str, Any]) -> None:
    """The verdicts that are not a pass (each with its threshold's source and the remedy), then one
    line per GPU and the overall verdict."""
    print(f"gpud burnin — {doc['host']['name']}, level {doc['level']}, device {doc['device']}"
          + (" (CPU figures)" if doc["figures"] == "cpu" else "")
          + (f", {doc['seconds'] / 60:.1f} min of simulated time" if doc["simulated_time"] else ""))
    from gpud.burnin.result import shown_order

    shown = sorted((v for v in doc["verdicts"] if v["status"] != "pass"), key=shown_order)
    doctor = [v for v in shown if v["test"].startswith("doctor.")]
    for v in shown:  # the hardware's failures first; doctor's configuration findings after them
        if v in doctor:
            continue
        word, code = MARK[v["status"]]
        gpu = f" GPU{v['gpu']}" if v["gpu"] is not None else ""
        echo_wrapped(f"{v['test']}: {v['summary']}", indent="      ", first=f"  {colour(word, code)}{gpu} ")
        if v["source"] and v["status"] != "skip":
            echo_wrapped(f"threshold: {v['source']}", indent="        ", first="      ")
        if v["remedy"]:
            echo_wrapped(f"do: {v['remedy']}", indent="        ", first="      ")
    if doctor:  # one line each: `gpud doctor` shows their remedies
        print("  doctor (remedies: gpud doctor):")
        for v in doctor:
            word, code = MARK[v["status"]]
            gpu = f" GPU{v['gpu']}" if v["gpu"] is not None else ""
            echo_wrapped(f"{v['test'][len('doctor.'):]}: {v['summary']}", indent="        ",
                         first=f"    {colour(word, code)}{gpu} ")
    passed = sum(1 for v in doc["verdicts"] if v["status"] == "pass")
    print(f"  {passed} test(s) passed")
    for g in doc["gpus"]:
        word, code = MARK[g["status"]] if g["status"] in MARK else ("skip", "2")
        print(f"  GPU{g['index']} {g['name'] or ''}: {colour(word, code)}")
    failed = [g["index"] for g in doc["gpus"] if g["status"] == "fail"]
    tests = sorted({v["test"] for v in doc["verdicts"] if v["status"] == "fail"})
    if doc["interrupted"]:
        print(f"burn-in interrupted after {doc['seconds'] / 60:.1f} min: the verdicts cover what ran")
    if doc["status"] == "fail":
        who = f"GPU {ranges(failed)}" if failed else "the machine"
        echo_wrapped(f"{who} — {', '.join(tests)}", indent="  ", first=colour("FAIL: ", "31"))
    elif doc.get("not_judged"):  # unknown is not pass: what was not judged is named, never "fit to train on"
        nj = doc["not_judged"]
        print(colour(f"{doc['status'].upper()} ({len(nj)} test(s) not judged: {', '.join(nj)}): fit to train on "
                     "only as far as judged", "33"))
    else:
        print(colour(f"{doc['status'].upper()}: fit to train on", "32" if doc["status"] == "pass" else "33"))


def burnin(
    level: Annotated[str, typer.Option(
        "--level", metavar="quick|standard|soak",
        help="quick (≤ 2 min), standard (about 16 min, a 10-minute memory test) or soak (+ 30 min–24 h).")] = "quick",
    duration: Annotated[str | None, typer.Option("--duration", metavar="30m",
                                                 help="The soak's length, 30m to 24h (default 30m).")] = None,
    memtest_minutes: Annotated[float | None, typer.Option(
        "--memtest-minutes", metavar="MIN", min=1.0, max=1440.0,
        help="The memory test's length (standard, soak; default 10, DCGM memtest's 600 s).")] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", metavar="LIST",
                                             help="GPUs to test: 0,2-3 (default all).")] = None,
    device: Annotated[str | None, typer.Option(
        "--device", metavar="cuda|cpu",
        help="Where the kernels run (default cuda; cpu on a simulated workstation: CPU figures).")] = None,
    report: Annotated[Path | None, typer.Option("--report", metavar="FILE.html",
                                                help="Write a self-contained HTML report with charts.")] = None,
    allow_busy: Annotated[bool, typer.Option("--allow-busy", help="Test GPUs other processes use.")] = False,
    target_power: Annotated[float | None, typer.Option(
        "--target-power", metavar="W", min=1.0,
        help="Targeted power's target in watts (default each GPU's enforced limit).")] = None,
    result: Annotated[Path | None, typer.Option(
        "--result", metavar="FILE.jsonl",
        help="Write the run to FILE as it goes (default burnin-run.jsonl in the state directory).")] = None,
    from_file: Annotated[Path | None, typer.Option(
        "--from", metavar="FILE.jsonl",
        help="Run nothing: show (and --report) the run a result file holds, also one cut short.")] = None,
    rehearsal: Annotated[bool, typer.Option(
        "--rehearsal", help="Allow --device cpu on a machine whose GPUs work: a rehearsal, its workload tests "
                            "not judged.")] = False,
    simulate: Simulate = None,
    json: Json = False,
) -> None:
    """Accept a workstation: doctor's checks, GEMM (bf16, tf32, fp32) compared bit for bit across
    GPUs, memory and host bandwidth, then (standard) a memory test, targeted power and load steps,
    and (soak) a thermal soak of up to 24 h; every load phase checks its results. A verdict per GPU and test,
    each with its threshold's source; what could not be measured is "not judged" and named. Exit 0 pass
    (tests not judged are listed, not failed), 1 a GPU failed, 2 invalid input, 130 interrupted."""
    from gpud import config as cfg
    from gpud.burnin.plan import LEVELS
    from gpud.burnin.run import run_burnin
    from gpud.burnin.store import record

    lv = level.lower()
    if lv not in LEVELS:
        raise InvalidInput("--level", "", f"must be one of {', '.join(LEVELS)}, not {level!r}")
    if duration is not None and lv != "soak":
        raise InvalidInput("--duration", "", "only the soak level takes a duration")
    seconds = parse_duration(duration) if duration is not None else None
    if memtest_minutes is not None and lv == "quick":
        raise InvalidInput("--memtest-minutes", "", "the quick level runs no memory test (--level standard or soak)")
    if device is not None and device not in ("cuda", "cpu"):
        raise InvalidInput("--device", "", f"must be cuda or cpu, not {device!r}")
    if report is not None:  # refused before any test runs
        from gpud.paths import check_output

        check_output(report, "--report", (".html", ".htm"), "FILE.html in an existing directory")
    if from_file is not None:
        _show(from_file, report, json)
    m = machine(simulate)
    snap = m.snapshot()
    chosen = parse_gpus(gpus, len(snap.samples)) if gpus is not None else None
    dev = device or ("cpu" if m.simulation is not None else "cuda")
    bench = open_bench(m, dev)
    if not bench.results_are_the_gpus and snap.samples and not rehearsal:
        raise InvalidInput("--device", "", f"cpu on a machine with {len(snap.samples)} GPU(s) runs the kernels on "
                                           "the host, which says nothing of the GPUs: --device cuda, or --rehearsal "
                                           "to rehearse (its workload tests are not judged)")
    progress = Progress(bench.simulated_time)
    config = cfg.load()
    from gpud.burnin.progress import ProgressLog
    from gpud.paths import burnin_run_path

    log = ProgressLog(result or burnin_run_path(), __version__, host(m, snap))
    try:
        res = run_burnin(m, bench, config, level=lv, gpus=chosen, device=dev, duration_s=seconds,
                         allow_busy=allow_busy, progress=progress, target_power_w=target_power, log=log,
                         memtest_s=None if memtest_minutes is None else memtest_minutes * 60.0)
    finally:
        log.close()
    progress.done()
    doc = res.json(__version__, host(m, snap))
    record(res, doc)
    _output(res, doc, report, json)
    if res.interrupted:
        raise typer.Exit(130)
    raise typer.Exit(res.exit_code())


def _output(res: Any, doc: dict[str, Any], report: Path | None, json: bool) -> None:
    """The run's HTML report where asked, then its document as JSON or as text."""
    if report is not None:
        from gpud.burnin.html import write_report

        write_report(report, res, doc)
    if json:
        emit_json(doc)
    else:
        render(doc)
        if report is not None:
            print(f"report: {report}")


def _show(path: Path, report: Path | None, json: bool) -> None:
    """``--from FILE``: the run a result file holds, as text or JSON, and its HTML report; exit as the run
    would have (130 for one cut short: what it measured is judged as far as its last verdicts so far)."""
    from gpud.burnin.progress import load

    try:
        res, env = load(path)
    except (OSError, ValueError) as err:
        raise InvalidInput("--from", "", f"{path}: {err}") from err
    doc = res.json(str(env["version"]), dict(env["host"]))
    _output(res, doc, report, json)
    raise typer.Exit(130 if res.interrupted else res.exit_code())


def register(app: Any) -> None:
    app.command("burnin")(burnin)
