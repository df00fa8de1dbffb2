"""Unknown is not pass: a kernel log gpud cannot read leaves the Xids unknown, never "no Xid".

The Kubernetes DaemonSet without a /dev/kmsg mount, a journald-only node, a root-only
/var/log/messages: doctor's Xid check is "not judged" (skip), the health states' Xid component is
unknown, and the Slurm prolog answers as ``[doctor] unreadable_kernel_log`` says (fit with a warning
by default, unfit on request). A readable log with an Xid 79 still fails as before."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from conftest import run_gpud
from doctor_helpers import description, doctor, only
from prometheus_client.parser import text_string_to_metric_families

from gpud.backends import open_machine
from gpud.config import Config
from gpud.doctor import health as hl
from gpud.doctor.xid import unreadable_needs
from gpud.exporter import exposition
from gpud.hw.host import Host, KernelLogUnreadable
from gpud.json_schema import check
from gpud.observe import observe

HEALTHY = "z8-fury-4x-a6000"
UNREADABLE = '[[fault]]\nkind = "kernel_log_unreadable"\n'


def _unreadable(name: str = HEALTHY) -> None:
    """The shipped machine with its kernel log made unreadable, as `gpud sim inject` does (persisted in
    this test's state directory, so the gpud started next sees it)."""
    m = open_machine(name)
    assert m.simulation is not None
    m.simulation.machine.inject("kernel_log_unreadable")


def test_the_xid_check_on_an_unreadable_kernel_log_is_not_judged(tmp_path: Path) -> None:
    r = only(doctor(tmp_path, "health.xid", description(2, extra=UNREADABLE)))
    assert r.status == "skip", r
    assert r.summary.startswith("not judged:"), r.summary
    for text in ("/dev/kmsg absent", "/var/log/journal absent", "/run/log/journal absent", "/var/log/kern.log absent",
                 "/var/log/messages absent", "mount /dev/kmsg read-only into the container", "journald-only node",
                 "mount the host's /var/log/journal and /run/log/journal read-only"):
        assert text in r.summary, (text, r.summary)
    assert "no Xid" not in r.summary and r.remedy


def test_a_readable_log_with_xid_79_still_fails(tmp_path: Path) -> None:
    r = only(doctor(tmp_path, "health.xid", description(2, extra='[[fault]]\nkind = "xid"\ngpu = 1\nxid = 79\n')))
    assert (r.status, r.gpu) == ("fail", 1) and "Xid 79" in r.summary


def test_a_source_refused_is_named_with_what_gpud_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EACCES/EPERM take the path a real refusal takes: the reader's open raises PermissionError (the
    suite runs as root, which mode bits do not stop)."""
    for rel in ("dev/kmsg", "var/log/messages"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("6,1,4200000,-;NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.\n")
    refused = {tmp_path / "dev/kmsg": errno.EPERM, tmp_path / "var/log/messages": errno.EACCES}
    real = Path.read_text

    def read_text(self: Path, *args: object, **kwargs: object) -> str:
        if self in refused:
            raise PermissionError(refused[self], "Operation not permitted", str(self))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", read_text)
    h = Host(tmp_path)
    got = h.read_xids()
    assert got == KernelLogUnreadable((("/dev/kmsg", "permission denied"), ("/var/log/journal", "absent"),
                                       ("/run/log/journal", "absent"), ("/var/log/kern.log", "absent"),
                                       ("/var/log/messages", "permission denied")))
    assert h.xid_events() is None and h.kernel_log() is None and h.kernel_log_unreadable() == got
    as_root = " ".join(unreadable_needs(got.tried, root=True))
    assert "CAP_SYSLOG" in as_root and "grant read access to /var/log/messages" in as_root
    assert "run as root" in " ".join(unreadable_needs(got.tried, root=False))


def test_an_empty_readable_log_is_no_xid_not_unknown(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text("")
    h = Host(tmp_path)
    assert h.read_xids() == [] and h.kernel_log_unreadable() is None


def test_gpud_health_says_unknown_for_the_xid_component(state_dir: Path) -> None:
    _unreadable()
    r = run_gpud("health", "--json", "--simulate", HEALTHY)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert check(doc) == [] and doc["state"] == "unknown"
    xid = [c for c in doc["components"] if c["component"] == "xid"]
    assert len(xid) == 4 and all(c["state"] == "unknown" and c["reason"].startswith("not judged:") for c in xid)
    text = run_gpud("health", "--simulate", HEALTHY)
    assert text.returncode == 0, text.stderr
    assert "health: unknown" in text.stdout and "unknown" in text.stdout and "no Xid since boot" not in text.stdout
    assert "/dev/kmsg absent" in text.stdout


def test_unknown_is_worse_than_healthy_and_better_than_a_finding() -> None:
    m = open_machine(HEALTHY)
    unread = KernelLogUnreadable((("/dev/kmsg", "absent"),))
    snap = m.snapshot()
    states = hl.assess((), snap, unread=unread)
    assert {h.state for h in states if h.component == "xid"} == {"unknown"}
    assert hl.worst_of(states) == "unknown" and hl.one_line(states) == ""
    degraded = hl.Health(0, "", "config", "degraded", "x", "none")
    assert hl.worst_of((*states, degraded)) == "degraded"


def test_the_exporter_says_unknown_for_the_xid_component(state_dir: Path) -> None:
    _unreadable()
    obs = observe(open_machine(HEALTHY), Config())
    families = {f.name: f for f in text_string_to_metric_families(exposition(obs).decode())}
    xid = [s for s in families["gpud_health_state"].samples if s.labels["component"] == "xid"]
    assert len(xid) == 4 and {s.value for s in xid} == {-1}
    info = [s for s in families["gpud_health_info"].samples if s.labels["component"] == "xid"]
    assert {s.labels["state"] for s in info} == {"unknown"}


def test_the_prolog_is_fit_with_a_warning_by_default(state_dir: Path) -> None:
    _unreadable()
    r = run_gpud("doctor", "--prolog", "--simulate", HEALTHY, timeout=30)
    assert r.returncode == 0 and r.stdout == "", (r.stdout, r.stderr)
    warning = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "Xids not judged" in warning[0] and "/dev/kmsg absent" in warning[0]


def test_the_prolog_is_unfit_when_configured(state_dir: Path, tmp_path: Path) -> None:
    _unreadable()
    conf = tmp_path / "gpud.toml"
    conf.write_text('[doctor]\nunreadable_kernel_log = "unfit"\n')
    r = run_gpud("doctor", "--prolog", "--config", str(conf), "--simulate", HEALTHY, timeout=30)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stdout.count("\n") == 1 and len(r.stdout.rstrip("\n")) <= 200
    assert "/dev/kmsg absent" in r.stdout and "mount /dev/kmsg read-only into the container" in r.stdout


def test_the_prolog_still_fails_on_a_readable_xid_79(state_dir: Path) -> None:
    m = open_machine(HEALTHY)
    assert m.simulation is not None
    m.simulation.machine.inject("xid", gpu=1, xid=79)
    r = run_gpud("doctor", "--prolog", "--simulate", HEALTHY, timeout=30)
    assert r.returncode == 1 and r.stdout.startswith("GPU1 Xid79 off the bus"), (r.stdout, r.stderr)


def test_a_bad_unreadable_kernel_log_value_is_refused(tmp_path: Path) -> None:
    conf = tmp_path / "gpud.toml"
    conf.write_text('[doctor]\nunreadable_kernel_log = "maybe"\n')
    r = run_gpud("doctor", "--prolog", "--config", str(conf), "--simulate", HEALTHY, timeout=30)
    assert r.returncode == 2 and "doctor.unreadable_kernel_log" in r.stdout + r.stderr
