"""``gpud tune``: measure which power and clock settings make this machine's training fastest or
cheapest, write them as a profile, apply it (docs/tune.md)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpud import __version__
from gpud.backends import open_training
from gpud.cli.apply import Config, Target, tuning_lock
from gpud.cli.common import Json, Simulate, host
from gpud.cli.output import clean, echo_wrapped, emit_json, plural, table
from gpud.errors import GpudError, InvalidInput
from gpud.model import document

if TYPE_CHECKING:
    from gpud.profiles.session import DaemonSession


class DaemonApplier:
    """Trials applied by the running daemon (it holds the tuning lock): each trial's settings as a profile
    file it loads, the originals saved by its engine; ``restore`` through its socket at the end."""

    def __init__(self, session: DaemonSession, workdir: Path) -> None:
        self.session = session
        self.workdir = workdir

    def apply(self, settings: dict[int, dict[str, Any]], label: str) -> None:
        from gpud.autotune.report import profile_toml
        from gpud.paths import atomic_write

        path = self.workdir / "gpud-tune-trial.toml"
        atomic_write(path, profile_toml(settings, f"gpud tune: {label}"))
        res = self.session.apply(str(path))
        if not res.ok:
            raise GpudError(str(res.error or "the daemon's apply failed"))

    def tick(self, now: float) -> None:
        """Nothing: the daemon's fan loop drives a trial's fan curve."""

    def restore(self) -> list[str]:
        from gpud.profiles.session import DaemonGone

        try:
            res = self.session.restore()
        except DaemonGone as err:  # nothing is known to be put back; a refusal or a timeout still raises
            return [f"NOT restored: {err}"]
        return list(res.restored) + [f"NOT restored: {x}" for x in res.failed]


def check_daemon_trusts(sock: str | Path) -> None:
    """Refuse before any trial when the daemon would refuse every trial: a daemon running as root loads
    only profiles root owns (``gpud.paths.open_trusted``), and a tune's trial profiles are its caller's. The
    daemon runs as the owner of its socket."""
    from gpud.autotune.run import TuneRefused

    euid = os.geteuid()
    try:
        owner = os.stat(sock).st_uid
    except OSError:
        return
    if euid == 0 or owner != 0:
        return
    err = TuneRefused(f"the gpud daemon runs as root and loads only profiles root owns: the trials of a tune "
                      f"run by uid {euid} would all be refused")
    err.remedy = ("tune as root through the daemon (sudo gpud tune …, with -o FILE to keep the profile), then "
                  "`gpud apply FILE` as a member of the socket's group")
    raise err


def _knobs(text: str) -> list[str]:
    from gpud.autotune.run import KNOBS

    out = [k.strip() for k in text.split(",") if k.strip()]
    for k in out:
        if k not in KNOBS:
            raise InvalidInput("--knobs", "", f"unknown knob {k!r} (knobs: {', '.join(KNOBS)})")
    if not out:
        raise InvalidInput("--knobs", "", "empty")
    return out


def _progress() -> Any:
    on = sys.stderr.isatty()

    def say(text: str) -> None:
        if on:
            sys.stderr.write(f"\r\033[Kgpud tune: {text}")
            sys.stderr.flush()
    return say


def render(doc: dict[str, Any]) -> None:
    from gpud.autotune.report import settings_text, summary, text_chart

    print(f"gpud tune — {clean(doc['host']['name'])}: goal {doc['goal']}, at most {doc['max_slowdown_percent']:g} % "
          f"slowdown, workload {clean(doc['workload'])}")
    echo_wrapped(f"figures {doc['figures_note']}", indent="  ")
    rows = []
    for t in doc["trials"]:
        rows.append([str(t["number"]), t["stage"], clean(settings_text(t["settings"])),
                     "" if t["samples_per_second"] is None else f"{t['samples_per_second']:.2f}",
                     "" if t["ci_percent"] is None else f"±{t['ci_percent']:.2f}%",
                     "" if t["joules_per_sample"] is None else f"{t['joules_per_sample']:.3f}",
                     "" if t["power_watts"] is None else f"{t['power_watts']:.0f}",
                     "/".join(str(v) for v in t["sm_mhz"].values()),
                     t["status"] + ("*" if t["frontier"] else "")])
    unit = doc["unit"]
    table(["#", "Stage", "Settings", f"{unit}/s", "95% CI", f"J/{unit[:-1]}", "W (all)", "SM MHz", "Status"], rows,
          title=f"{plural(doc['trial_count'], 'trial')} (Zeus's 25 W linear sweep: {doc['linear_sweep_trials']}); "
                "* on the frontier")
    for line in text_chart(doc):
        print(line)
    echo_wrapped(clean(summary(doc)))
    if not doc["confidence"]["reached"]:
        echo_wrapped(f"note: some trials did not reach ±{doc['confidence']['bound_percent']:g} % at 95 % confidence "
                     "in their windows (the table's CI column)")
    for note in doc["notes"]:
        echo_wrapped(f"note: {clean(note)}")
    print(f"GPUs put back: {plural(len(doc['restored']), 'setting')} restored")
    for line in doc["restored"]:
        if line.startswith("NOT"):
            sys.stderr.write(f"gpud: {clean(line)}\n")


def tune(
    goal: Annotated[str, typer.Option("--goal", metavar="throughput|energy|quiet",
                                      help="Maximise samples/s, minimise energy per sample, or minimise power "
                                           "(heat, so fan noise) within the slowdown.")] = "energy",
    max_slowdown: Annotated[float, typer.Option("--max-slowdown", metavar="PCT",
                                                help="Slowdown allowed against the GPUs as they are, %.")] = 5.0,
    workload: Annotated[str, typer.Option("--workload", metavar='probe|"COMMAND"',
                                          help="The probe's DDP training loop (one job, the settings changed "
                                               "under it), or your command (run to completion once per window, "
                                               "at least 10 s a run).")] = "probe",
    rate_from: Annotated[str | None, typer.Option("--rate-from", metavar="REGEX",
                                                  help="Run the command once and read its throughput from its "
                                                       "output: the first group of each matching line, e.g. "
                                                       "'([\\d.]+) it/s'.")] = None,
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS",
                                           help="A command's longest run; then its process group is killed "
                                                "(default 3600).")] = 3600.0,
    knobs: Annotated[str | None, typer.Option("--knobs", metavar="power,clocks,memclocks,fans",
                                              help="What the search sets: power limits, locked SM clocks, locked "
                                                   "memory clocks, the fan curve (default: power; power,fans for "
                                                   "--goal quiet).")] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", metavar="LIST", help="GPUs to tune: 0,2-3 (default all).")
                    ] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", metavar="PROFILE.toml",
                                                help="Write the chosen settings as a profile (with what was "
                                                     "measured).")] = None,
    apply_: Annotated[bool, typer.Option("--apply", help="Apply the chosen profile (through the daemon when one "
                                                         "runs).")] = False,
    report: Annotated[Path | None, typer.Option("--report", metavar="FILE.html",
                                                help="Write a self-contained HTML report with the chart.")] = None,
    allow_busy: Annotated[bool, typer.Option("--allow-busy", help="Tune GPUs other processes use.")] = False,
    json: Json = False,
    simulate: Simulate = None,
    config: Config = None,
) -> None:
    """Measure which power (and clock) settings make training fastest or cheapest here: a baseline,
    a bracketing search with every trial measured to a stated confidence, the GPUs put back at the
    end (and by `gpud restore` after a crash). Exit 0 done, 1 refused or failed, 2 invalid input."""
    from gpud.autotune import report as rep
    from gpud.autotune.run import LocalApplier, check_start, run_tune
    from gpud.autotune.search import GOALS
    from gpud.autotune.trial import Measure
    from gpud.autotune.workload import Command, RateCommand, Training, Workload
    from gpud.cli.burnin import parse_gpus

    if goal not in GOALS:
        raise InvalidInput("--goal", "", f"must be one of {', '.join(GOALS)}, not {goal!r}")
    if not timeout > 0:
        raise InvalidInput("--timeout", "", f"must be a number of seconds above 0, not {timeout:g}")
    if not 0.0 <= max_slowdown < 100.0:
        raise InvalidInput("--max-slowdown", "", f"must be a percentage from 0 to below 100, not {max_slowdown:g}")
    chosen_knobs = _knobs(knobs if knobs is not None else "power,fans" if goal == "quiet" else "power")
    from gpud.paths import check_output

    if report is not None:  # refused before any trial, not after minutes of them
        check_output(report, "--report", (".html", ".htm"), "FILE.html in an existing directory")
    if output is not None:
        check_output(output, "-o", (".toml",), "PROFILE.toml in an existing directory")
    t = Target(simulate, config)
    m = t.machine
    snap = m.snapshot()
    chosen = parse_gpus(gpus, len(snap.samples)) if gpus is not None else list(range(len(snap.samples)))
    infos = {i.index: i for i in snap.gpus}
    if workload == "probe":

        if rate_from is not None:
            raise InvalidInput("--rate-from", "", "reads a command's output: give --workload \"COMMAND\"")
        load: Workload = Training(open_training(m), {g: infos[g].uuid for g in chosen if g in infos})
    elif rate_from is not None:
        load = RateCommand(workload, "cpu" if m.simulation is not None else "gpu",
                           {g: infos[g].uuid for g in chosen if g in infos}, rate_from, timeout_s=timeout)
    else:
        load = Command(workload, "cpu" if m.simulation is not None else "gpu",
                       {g: infos[g].uuid for g in chosen if g in infos}, timeout_s=timeout)
    session = t.daemon_session()  # a daemon drives this machine: every write goes through it
    daemon = session is not None
    if session is not None:
        check_daemon_trusts(t.socket)
    say = _progress()
    with tempfile.TemporaryDirectory(prefix="gpud-tune-") as tmp:
        lock = None if daemon else tuning_lock("gpud tune")
        try:
            check_start(m, chosen, allow_busy)
            applier = DaemonApplier(session, Path(tmp)) if session is not None else LocalApplier(m)
            out = run_tune(m, load, applier, goal=goal, max_slowdown=max_slowdown / 100.0,  # type: ignore[arg-type]
                           knobs=chosen_knobs, gpus=chosen, measure=Measure(), say=say)
        finally:
            if lock is not None:
                lock.release()
            if sys.stderr.isatty():
                sys.stderr.write("\r\033[K")
    body = rep.body(out)
    body["gpu_names"] = [f"{infos[g].name} {infos[g].uuid}" for g in chosen if g in infos]
    body["profile"] = None
    body["applied"] = False
    doc = document("tune", __version__, host(m, snap), **body)
    changed = (out.chosen is not None and out.baseline is not None and out.chosen.stage != "baseline"
               and bool(out.chosen.settings))
    target_path = output
    if apply_ and target_path is None and changed:
        from gpud.paths import state_dir

        target_path = state_dir() / "tuned.toml"
    if target_path is not None and not out.interrupted:
        from gpud.paths import atomic_write

        settings = (out.chosen.settings if changed and out.chosen is not None else out.baseline_settings)
        comment = (f"Written by gpud tune on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} for "
                   f"{clean(str(doc['host']['name']))}: {rep.summary(doc)}\nFigures {doc['figures_note']}.")
        atomic_write(target_path, rep.profile_toml(
            settings, f"gpud tune, goal {goal}: {rep.summary(doc)}"[:200], rep.measured_record(doc), comment))
        doc["profile"] = str(target_path)
    if report is not None:
        from gpud.paths import atomic_write

        atomic_write(report, rep.html(doc))
    if apply_ and changed and out.gain_excludes_zero and target_path is not None and not out.interrupted:
        doc["applied"] = _apply(t, target_path, session)
    if json:

        emit_json(doc)
    else:
        render(doc)
        if doc["profile"]:
            print(f"profile: {doc['profile']}")
        if report is not None:
            print(f"report: {report}")
        if apply_:
            print("applied " + ("through the gpud daemon" if daemon else "") if doc["applied"] else
                  "not applied: nothing measured better than the GPUs as they were at 95 % confidence (the "
                  "saving's interval includes zero)")
    if out.interrupted:
        raise typer.Exit(130)


def _apply(t: Target, path: Path, session: DaemonSession | None) -> bool:
    if session is not None:
        res = session.apply(str(path.resolve()))
    else:
        from gpud.profiles.profile import load

        p = load(str(path.resolve()))
        with tuning_lock("gpud apply"):
            res = t.local().apply(p)
    if not res.ok:
        raise GpudError(f"the chosen profile {path} did not apply: {res.error}")
    return True


def register(app: Any) -> None:
    app.command("tune")(tune)

