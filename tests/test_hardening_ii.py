"""Issue 23 (hardening II) and issue 24's events and report items: what a user puts in a file, in
the journal or on a GPU must not stop gpud or lose data."""

from __future__ import annotations

import json

import pytest
from tuning_helpers import RICH, cli, fingerprint, fresh, write_profile

from gpud.profiles import state as st

SIM = "z8-fury-4x-a6000"


# -- item 2: the whole state file is validated before any write -----------------------------

BAD_VALUES = [
    ("originals", "0", "power_limit_watts", "lots"),
    ("originals", "2", "applications_clocks", [1, "x"]),
    ("originals", "host", "cpu_governor", 5),
    ("desired", "1", "fan", {"mode": "curve", "points": "hot"}),
    ("desired", "0", "power_limit_watts", float("nan")),
    ("originals", "3", "compute_mode", "turbo"),
]


@pytest.mark.parametrize(("section", "where", "key", "value"), BAD_VALUES)
def test_a_wrong_typed_state_value_stops_verify_restore_and_apply_before_any_write(
        capsys, tmp_path, state_dir, section, where, key, value) -> None:
    code, _, err = cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    assert code == 0, err
    data = json.loads(st.path().read_text())
    data[section].setdefault(where, {})[key] = value
    raw = json.dumps(data)
    st.path().write_text(raw)
    before = fingerprint(fresh())
    for argv in (("verify",), ("restore",), ("apply", str(write_profile(tmp_path, RICH)))):
        code, out, err = cli(capsys, *argv, "--simulate", SIM)
        assert code == 1, (argv, out, err)
        assert f"'{section}.{where}.{key}'" in err and "Traceback" not in err, (argv, err)
        assert "drifted" not in out, (argv, out)
    assert fingerprint(fresh()) == before  # restore wrote nothing (the fans aside: they were auto)
    assert st.path().read_text() == raw


# -- item 3: a locked journal is waited for, never set aside ---------------------------------

def _journal_with_history(path) -> None:
    from gpud.journal import Journal

    j = Journal(path)
    j.record("xid", "Xid 79 on GPU 1", gpu=1, uuid="GPU-1", boot_id="b1", data={"xid": 79})
    j.record("ecc", "GPU 1 ECC", gpu=1, uuid="GPU-1", boot_id="b1", data={"uncorrected": 2})
    j.close()


def test_a_journal_locked_by_another_process_is_kept_and_opened_when_the_lock_goes(tmp_path, caplog) -> None:
    import sqlite3

    from gpud import journal as jn

    path = tmp_path / "journal.db"
    _journal_with_history(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # a backup, an sqlite3 shell in a transaction
    try:
        j = jn.Journal(path, busy_wait_s=0.5)
        assert j.set_aside is None and not list(tmp_path.glob("journal.db.corrupt-*"))
        assert "tried again" in caplog.text
        j.record("gpu_lost", "GPU 2 lost", gpu=2)  # held while the journal is locked
    finally:
        other.rollback()
        other.close()
    j._retry_at = 0.0  # the retry is due
    j.record("gpu_back", "GPU 2 answers again", gpu=2)
    j.close()
    kinds = [e.kind for e in jn.events(path)]
    assert kinds == ["xid", "ecc", "gpu_lost", "gpu_back"]


def test_a_lock_released_while_the_daemon_waits_opens_the_journal_at_once(tmp_path) -> None:
    import sqlite3
    import threading

    from gpud import journal as jn

    path = tmp_path / "journal.db"
    _journal_with_history(path)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    threading.Timer(1.0, other.rollback).start()
    j = jn.Journal(path, busy_wait_s=8)
    assert j.db is not None and j.set_aside is None
    j.close()
    other.close()
    assert len(jn.events(path)) == 2


def test_a_file_sqlite_reports_corrupt_is_still_set_aside(tmp_path) -> None:
    from gpud import journal as jn

    path = tmp_path / "journal.db"
    path.write_bytes(b"not a database at all" * 200)
    j = jn.Journal(path, busy_wait_s=0.5)
    assert j.set_aside is not None and j.db is not None
    j.close()


# -- item 4: odd journal rows ---------------------------------------------------------------

def test_odd_journal_rows_are_shown_with_one_warning_each(state_dir) -> None:
    import sqlite3

    from conftest import run_gpud

    from gpud.journal import Journal

    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "journal.db"
    j = Journal(path)
    j.record("xid", "a good one", gpu=0, uuid="GPU-0", boot_id="b", data={"xid": 79})
    j.gpu_seen("GPU-0", "1320000000001", "NVIDIA RTX A6000", "94.02", "00000000:17:00.0", 0)
    j.close()
    db = sqlite3.connect(path)
    rows = [(-1e18, "check", "minus a lot", None), (1e300, "check", "far future", None),
            ("yesterday", "check", "a string time", None), (1.7e9, "check", "data not JSON", "{oops"),
            (1.7e9, "check", sqlite3.Binary(b"\xffblob summary"), None), (1.7e9, "xid", "xid text", '{"xid": "79"}'),
            (1.7e9, "throttle", "odd throttle", '{"since": "a while"}'), (1.7e9, "check", "a list", "[1, 2]"),
            (1.7e9, "check", "not a number", '{"x": NaN}')]
    db.executemany("INSERT INTO events (ts, kind, summary, data, uuid, boot_id) VALUES (?, ?, ?, ?, 'GPU-0', 'b')",
                   rows)
    db.commit()
    db.close()
    env = {"GPUD_STATE_DIR": str(state_dir)}
    for args in (("events",), ("events", "--json"), ("events", "--dossier", "GPU-0"),
                 ("events", "--dossier", "GPU-0", "--json"), ("doctor", "--simulate", SIM, "--json")):
        r = run_gpud(*args, env=env)
        assert "Traceback" not in r.stderr and r.returncode in (0, 1), (args, r.stderr)
        if args[0] == "events" and "--dossier" not in args:
            assert r.returncode == 0
            assert r.stderr.count("warning") == 7, r.stderr  # the bad times, data and blob: once each
            if "--json" in args:
                evs = json.loads(r.stdout)["events"]
                assert len(evs) == 10 and {e["summary"] for e in evs} >= {"\ufffdblob summary", "far future"}
            else:
                assert "minus a lot" in r.stdout and "data not JSON" in r.stdout


# -- issue 24: events before any daemon, --since "", --simulate, the probe's reason ---------

def test_events_before_any_daemon_says_there_are_none_yet_and_who_writes_them(state_dir) -> None:
    from conftest import run_gpud

    env = {"GPUD_STATE_DIR": str(state_dir)}
    r = run_gpud("events", env=env)
    assert r.returncode == 0 and "no events yet" in r.stdout and "daemon" in r.stdout, r
    assert "corrupt" not in r.stdout + r.stderr
    r = run_gpud("events", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["events"] == []
    r = run_gpud("events", "--simulate", SIM, env=env)
    assert r.returncode == 0 and "no events yet" in r.stdout, r.stderr


@pytest.mark.parametrize("since", ["", " ", "-5m", "1e400", "99999999999d"])
def test_events_refuses_a_since_that_is_not_a_duration(state_dir, since) -> None:
    from conftest import run_gpud

    r = run_gpud("events", "--since", since, env={"GPUD_STATE_DIR": str(state_dir)})
    assert r.returncode == 2 and "--since" in r.stderr and "Traceback" not in r.stderr, r


def test_a_failed_probe_keeps_its_reason_in_the_journal_and_the_dossier(state_dir, tmp_path) -> None:
    import subprocess
    import sys
    import time as _time

    from gpud import journal
    from gpud.daemon.recorder import Recorder
    from gpud.daemon.schedule import Schedule
    from gpud.paths import probe_output_path

    state_dir.mkdir(parents=True, exist_ok=True)
    rec = Recorder(journal.Journal(), "boot")
    sched = Schedule(fresh(), lambda: None, lambda: rec)  # type: ignore[arg-type,return-value]
    out = probe_output_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("gpud: error: PyTorch is not installed for this Python\n"
                   "  remedy: pip install torch\n")
    sched.last_probe_start = _time.time()
    sched.probe_proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    sched.probe_proc.wait()
    sched.probe_why = "requested"
    sched.reap_probe()
    (e,) = journal.events(kinds=("probe",))
    assert "PyTorch is not installed" in e.summary and "PyTorch" in e.data["error"], e


# -- item 5 and issue 24: the report is redacted whole, and holds the journal ---------------

PLANTED = {"user": ["alice", "bob", "carol", "dave", "erin"],
           "id": ["3f9c2a1b7d4e", "session-1.scope", "4711", "0d3c7f5e-1a2b-4c3d-9e8f-7a6b5c4d3e2f"],
           "name": ["lab-gpu-07", "dave_job.py", "train_resnet.py", "finetune.py", "alice_train"]}


def _planted_description(tmp_path):
    from conftest import REPO

    text = (REPO / "gpud/sim/descriptions/z8-fury-4x-a6000-degraded.toml").read_text()
    text = text.replace('name = "z8-fury-4x-a6000-degraded"', 'name = "lab-gpu-07"')
    text = text.replace('command = "python finetune.py" }]',
                        'command = "python finetune.py", unit = "session-1.scope" },'
                        ' { pid = 51900, used_mib = 100, user = "dave", uid = 1004, '
                        'command = "python /home/dave/dave_job.py --out /home/dave", slurm_job = 4711 },'
                        ' { pid = 51901, used_mib = 100, user = "erin", uid = 1005, command = "python serve.py",'
                        ' pod = "0d3c7f5e-1a2b-4c3d-9e8f-7a6b5c4d3e2f" }]')
    text = text.replace("xid = 48\n", 'xid = 48\ntext = "pid=48213, name=alice_train, Ch 00000008"\n')
    path = tmp_path / "lab-gpu-07.toml"
    path.write_text(text)
    return path


def test_the_report_redacts_every_name_and_id_found_on_the_machine_wherever_it_stands(tmp_path, state_dir) -> None:
    import tarfile

    from conftest import run_gpud

    from gpud.journal import Journal

    desc = _planted_description(tmp_path)
    env = {"GPUD_SIM_EUID": "0"}
    (tmp_path / "bob").mkdir()
    prof = tmp_path / "bob" / "alice-quiet.toml"
    prof.write_text('description = "quiet nights for alice and dave_job.py (docker:3f9c2a1b7d4e)"\n'
                    "[all]\npower_limit = 250\n")
    r = run_gpud("apply", str(prof), "--simulate", str(desc), env=env)
    assert r.returncode == 0, r.stderr
    j = Journal()
    j.record("profile_apply", "alice-quiet applied by alice", gpu=0, uuid="GPU-x", boot_id="b",
             data={"user": "carol", "unit": "session-1.scope", "job": "slurm:4711"})
    j.record("probe", "probe (requested) FAILED: /home/erin/x: no such file", boot_id="b")
    j.gpu_seen("GPU-x", "1320", "NVIDIA RTX A6000", "94", "00000000:17:00.0", 0)
    j.close()
    out = tmp_path / "r.tar.gz"
    r = run_gpud("report", "--simulate", str(desc), "-o", str(out), env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as tar:
        files = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert {"gpud-report/events.json", "gpud-report/dossiers.json"} <= set(files)
    assert len(json.loads(files["gpud-report/dossiers.json"])) == 1
    assert "FAILED" in files["gpud-report/events.json"]
    everything = "\n".join([*files.values(), *files]) + r.stdout
    for kind, secrets in PLANTED.items():
        for secret in secrets:
            assert secret not in everything, (kind, secret)
    assert "-quiet" in files["gpud-report/tuning.json"]  # the rest of the word is kept
    assert "name=<process>" in files["gpud-report/kernel-nvidia.log"]


# -- item 7: one validator for the daemon's configuration and doctor's ----------------------

BAD_CONFIGS = [
    ('[daemon]\nsocket_group = "no-such-group-here"\n', "daemon.socket_group", "no group"),
    ('[doctor]\nskip = ["envv.*"]\n', "doctor.skip", "matches no check"),
    ("[machine]\nnvlink_pairs = [[0, 9]]\n", "machine.nvlink_pairs[0]", "GPU 9 does not exist"),
    ("[machine]\nnvlink_pairs = [[0, 1], [1, 0]]\n", "machine.nvlink_pairs[1]", "already"),
    ('[daemon]\nprofile = "no-such-profile"\n', "daemon.profile", "no-such-profile"),
]


@pytest.mark.parametrize(("body", "key", "why"), BAD_CONFIGS)
def test_the_daemon_refuses_what_doctor_refuses_with_exit_2(tmp_path, state_dir, body, key, why) -> None:
    from conftest import run_gpud

    p = tmp_path / "gpud.toml"
    sock = f'socket = "{tmp_path}/s.sock"\n'
    p.write_text(body.replace("[daemon]\n", "[daemon]\n" + sock) if "[daemon]" in body else body + "[daemon]\n" + sock)
    env = {"GPUD_STATE_DIR": str(state_dir)}
    for cmd in (("daemon", "--listen", "127.0.0.1:0"), ("doctor",)):
        r = run_gpud(*cmd, "--config", str(p), "--simulate", SIM, env=env, timeout=30)
        assert r.returncode == 2, (cmd, r.returncode, r.stderr[-2000:])
        assert f"{p}: {key}" in r.stderr and why in r.stderr and "Traceback" not in r.stderr, (cmd, r.stderr)
    assert not state_dir.exists() or not (state_dir / "tuning.json").exists()


# -- item 11: fan curves taken back after a driver reload; verify counts what it cannot read -

def test_fan_curves_are_taken_back_after_a_driver_reload_counted_and_logged(tmp_path, state_dir) -> None:
    import signal

    from daemon_helpers import RunningDaemon

    from gpud import journal
    from gpud.backends import open_machine

    def policies() -> list[int]:
        sim = open_machine(SIM).simulation.machine
        return [sim.settings(i)["fans"][0]["policy"] for i in range(4)]

    d = RunningDaemon(tmp_path, config='profile = "training"\n')
    try:
        d.wait_for(lambda: policies() == [1, 1, 1, 1], 10, "fans on gpud's curve")
        before = d.value("gpud_profile_reapply_total") or 0
        m = open_machine(SIM)
        for gpu in range(4):  # what a driver reload does to the fans: back to the automatic policy
            m.nvml.set_fan_auto(gpu, 0)
        assert policies() == [0, 0, 0, 0]
        d.wait_for(lambda: policies() == [1, 1, 1, 1], 15, "curves re-applied")  # policies read every 10 s
        d.wait_for(lambda: (d.value("gpud_profile_reapply_total") or 0) >= before + 4, 5, "re-applies counted")
        assert "curve re-applied" in d.logs()
        d.wait_for(lambda: any("curve re-applied" in e.summary for e in journal.events(kinds=("profile_reapply",))),
                   5, "the re-apply journalled")
    finally:
        d.stop(signal.SIGKILL)


def test_verify_counts_settings_it_cannot_read_back_and_strict_fails_on_them(capsys, tmp_path, state_dir) -> None:
    code, _, err = cli(capsys, "apply", str(write_profile(tmp_path, RICH)), "--simulate", SIM)
    assert code == 0, err
    fresh().simulation.machine.reboot()  # drops the locked clocks, which NVML cannot read back
    code, out, _ = cli(capsys, "verify", "--simulate", SIM)
    assert "8 that cannot be read back" in out, out
    code, out, _ = cli(capsys, "verify", "--json", "--simulate", SIM)
    assert json.loads(out)["unverifiable"] == 8
    code, out, _ = cli(capsys, "verify", "--strict", "--simulate", SIM)
    assert code == 1


# -- item 12: the control socket and the HTTP endpoint at their edges ----------------------

def _control(tmp_path):
    from gpud.daemon import control

    path = str(tmp_path / "c.sock")
    srv, _ = control.serve(path, lambda req, peer: {"ok": True, "cmd": req["cmd"]}, None)
    return srv, path


@pytest.mark.parametrize("close_write", [False, True])
def test_a_control_request_without_its_newline_is_answered(tmp_path, close_write) -> None:
    import socket

    srv, path = _control(tmp_path)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(path)
        s.sendall(b'{"cmd": "ping", "args": {}}')
        if close_write:
            s.shutdown(socket.SHUT_WR)
        reply = json.loads(s.makefile("rb").readline())
        s.close()
        assert reply == {"ok": True, "cmd": "ping"}, reply
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_control_request_that_is_too_large_says_so(tmp_path) -> None:
    import socket

    srv, path = _control(tmp_path)
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(path)
        try:
            s.sendall(b'{"cmd": "ping", "args": {"x": "' + b"a" * 70000 + b'"}}\n')
        except OSError:
            pass
        reply = json.loads(s.makefile("rb").readline())
        s.close()
        assert not reply["ok"] and "larger than 65536" in reply["error"]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(("raw", "status"), [
    (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"b" * 20000 + b"\r\n\r\n", 431),
    (b"GET /metrics\r\n", 505),
])
def test_oversized_heads_and_http09_get_a_status_line_not_the_exposition(raw, status) -> None:
    import socket

    from gpud.daemon import http

    ep = http.Endpoints(lambda: b"gpud_up 1\n", lambda: (True, "ok"), lambda: {"ok": True}, None)
    srv, _ = http.serve("127.0.0.1", 0, ep)
    try:
        s = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=5)
        try:
            s.sendall(raw)
        except OSError:
            pass
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            data += chunk
        s.close()
        assert data.startswith(f"HTTP/1.0 {status} ".encode()), data[:200]
        assert b"gpud_up" not in data
    finally:
        srv.shutdown()
        srv.server_close()


XML_HEAD = '<?xml version="1.0" ?>\n'
XML_BODY = ('<nvidia_smi_log><driver_version>550.127.05</driver_version><attached_gpus>1</attached_gpus>'
            '<gpu id="00000000:17:00.0"><product_name>{name}</product_name></gpu></nvidia_smi_log>\n')


@pytest.mark.parametrize("doctype", [
    '<!DOCTYPE nvidia_smi_log [<!ENTITY n "NVIDIA RTX A6000">]>\n',
    '<!DOCTYPE nvidia_smi_log [<!ENTITY n SYSTEM "file:///etc/hostname">]>\n',
    '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n',  # nvidia-smi's own: the entity is undefined
])
def test_an_xml_dump_with_a_dtd_or_entity_is_refused_with_a_clear_error(capsys, tmp_path, doctype) -> None:
    p = tmp_path / "dump.xml"
    p.write_text(XML_HEAD + doctype + XML_BODY.format(name="&n;"))
    code, out, err = cli(capsys, "sim", "import", str(p), "-o", str(tmp_path / "out.toml"))
    assert code == 2 and "DTD" in err and str(p) in err and "Traceback" not in err, (out, err)
    assert not (tmp_path / "out.toml").exists()


# -- item 8: descriptions and profiles refuse garbage; extends is relative to its file -------

def _description(tmp_path, machine: str = "", gpu: str = "", tail: str = ""):
    from conftest import MINIMAL

    text = MINIMAL.format(name="box").replace("[machine]\n", "[machine]\n" + machine)
    p = tmp_path / "box.toml"
    p.write_text(text + gpu + tail)
    return p


BAD_DESCRIPTIONS = [
    ("", "pcie_max_width = 3\n", "", "gpu[0].pcie_max_width"),
    ("", "pcie_max_generation = 9\n", "", "gpu[0].pcie_max_generation"),
    ("", "slot_width = 5\n", "", "gpu[0].slot_width"),
    ("", "", '[xorg]\nfiles = {"a.conf" = 5}\n', "xorg.files.a.conf"),
    ("", "", '[xorg]\nfiles = {"../../etc/passwd" = "x"}\n', "xorg.files"),
    ('kernel_cmdline = "quiet\\nnvidia-drm.modeset=1"\n', "", "", "machine.kernel_cmdline"),
    ("", "", '[[fault]]\nkind = "xid"\ngpu = 0\nxid = 79\ntext = "fell off\\nthe bus"\n', "fault[0].text"),
    ("", "ecc_supported = false\necc_enabled = true\n", "", "gpu[0].ecc_enabled"),
    ("", "ecc_supported = false\necc_aggregate_uncorrected = 3\n", "", "gpu[0].ecc_aggregate_uncorrected"),
    ("modules = [1, 2]\n", "", "", "machine.modules"),
    ("", "", '[[fault]]\nkind = "link_degraded"\ngpu = 0\nwidth = 3\n', "fault[0].width"),
    ("", "", '[[fault]]\nkind = "link_degraded"\ngpu = 0\ngeneration = 9\n', "fault[0].generation"),
]


@pytest.mark.parametrize(("machine", "gpu", "tail", "key"), BAD_DESCRIPTIONS)
def test_a_description_with_garbage_is_refused_with_its_key(capsys, tmp_path, state_dir, machine, gpu, tail,
                                                            key) -> None:
    p = _description(tmp_path, machine, gpu, tail)
    code, _, err = cli(capsys, "status", "--simulate", str(p))
    assert code == 2 and f"{p}: {key}" in err and "Traceback" not in err, err


BAD_FANS = [
    ('[all.fan]\nmode = "fixed"\npercent = 60\npoints = [[40, 30], [80, 90]]\n', "all.fan.points"),
    ('[all.fan]\nmode = "curve"\npercent = 60\npoints = [[40, 30], [80, 90]]\n', "all.fan.percent"),
    ('[all.fan]\nmode = "curve"\npoints = [[40, 30], [99, 90], [105, 100]]\n', "all.fan.points[1]"),
]


@pytest.mark.parametrize(("text", "key"), BAD_FANS)
def test_a_fan_setting_that_cannot_mean_anything_is_refused(capsys, tmp_path, state_dir, text, key) -> None:
    p = tmp_path / "f.toml"
    p.write_text(text)
    before = fingerprint(fresh())
    code, _, err = cli(capsys, "apply", str(p), "--simulate", SIM)
    assert code == 2 and f"{p}: {key}" in err, err
    assert fingerprint(fresh()) == before


def test_a_relative_extends_is_found_beside_the_profile_and_errors_name_that_file(capsys, tmp_path, state_dir,
                                                                                  monkeypatch) -> None:
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "base.toml").write_text("[all]\npower_limit = 250\n")
    (d / "child.toml").write_text('extends = "base.toml"\n[all]\npersistence_mode = true\n')
    (d / "broken.toml").write_text('extends = "./missing.toml"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "base.toml").write_text("[all]\npower_limit = 1\n")  # the current directory's: not this one
    monkeypatch.chdir(elsewhere)
    code, out, err = cli(capsys, "apply", str(d / "child.toml"), "--dry-run", "--simulate", SIM)
    assert code == 0 and "250 W" in out, (out, err)
    code, _, err = cli(capsys, "apply", str(d / "broken.toml"), "--dry-run", "--simulate", SIM)
    assert code == 2 and f"{d / 'broken.toml'}: extends" in err and "missing.toml" in err, err


# -- item 9: a full or read-only state directory reaches gpud, not a simulator traceback -----

@pytest.mark.parametrize("code", ["ENOSPC", "EROFS"])
def test_a_full_or_read_only_state_directory_reaches_gpuds_own_handling(capsys, tmp_path, state_dir, monkeypatch,
                                                                       code) -> None:
    import builtins
    import errno
    import os

    import gpud.paths

    number = getattr(errno, code)
    under = str(state_dir)
    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir

    def refuse(path) -> None:  # type: ignore[no-untyped-def]
        if str(path).startswith(under):
            raise OSError(number, os.strerror(number), str(path))

    def fake_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        refuse(path)
        return real_mkdir(path, *args, **kwargs)

    p = write_profile(tmp_path, RICH)
    state_dir.mkdir(parents=True)  # it exists; nothing can be written in it
    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "open", fake_os_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(gpud.paths.os, "open", fake_os_open)
    rc, out, err = cli(capsys, "status", "--simulate", SIM)
    assert rc == 0 and "Traceback" not in err, err
    rc, out, err = cli(capsys, "apply", str(p), "--simulate", SIM)
    assert rc == 1 and os.strerror(number) in err and "Traceback" not in err, (out, err)
    rc, out, err = cli(capsys, "doctor", "--simulate", SIM)
    assert rc in (0, 1) and "Traceback" not in err, err


# -- item 10: a stuck fan is judged by its effect, against an identical sibling --------------

def _pair(t0: int, t1: int, stuck: bool) -> str:
    from doctor_helpers import description

    fault = '[[fault]]\nkind = "fan_stuck"\ngpu = 0\nfan = 0\npercent = 0\n' if stuck else ""
    return description(2, defaults="utilization_percent = 100\npower_watts = 280",
                       gpu_extra={0: f"temperature_celsius = {t0}", 1: f"temperature_celsius = {t1}"}, extra=fault)


@pytest.mark.parametrize(("t0", "t1", "stuck", "want"), [(88, 72, True, "fail"), (78, 72, False, "pass"),
                                                          (72, 72, False, "pass")])
def test_a_stuck_fan_beside_an_identical_cooler_gpu_under_the_same_load_fails(tmp_path, state_dir, t0, t1, stuck,
                                                                              want) -> None:
    from doctor_helpers import doctor

    r = doctor(tmp_path, "health.fans", _pair(t0, t1, stuck))
    by_gpu = {c.gpu: c for c in r.checks}
    assert by_gpu[0].status == want, by_gpu[0]
    assert by_gpu[1].status == "pass", by_gpu[1]
    if want == "fail":
        assert "GPU 1" in by_gpu[0].summary and "cannot be cooling" in by_gpu[0].summary


def test_events_on_a_locked_journal_says_it_is_locked_not_corrupt(state_dir) -> None:
    import sqlite3

    from conftest import run_gpud

    state_dir.mkdir(parents=True, exist_ok=True)
    _journal_with_history(state_dir / "journal.db")
    other = sqlite3.connect(state_dir / "journal.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        r = run_gpud("events", env={"GPUD_STATE_DIR": str(state_dir)})
    finally:
        other.rollback()
        other.close()
    assert r.returncode == 1 and "locked by another process" in r.stderr and "set" not in r.stderr, r.stderr
    assert not list(state_dir.glob("journal.db.corrupt-*"))


def test_a_lock_taken_while_the_daemon_runs_holds_events_without_stalling_the_tick(tmp_path) -> None:
    import sqlite3
    import time as _time

    from gpud import journal as jn

    path = tmp_path / "journal.db"
    _journal_with_history(path)
    j = jn.Journal(path)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        t0 = _time.monotonic()
        j.record("gpu_lost", "GPU 2 lost", gpu=2)
        assert _time.monotonic() - t0 < 2.0  # held, not waited for
    finally:
        other.rollback()
        other.close()
    j.record("gpu_back", "GPU 2 answers again", gpu=2)
    j.close()
    assert sorted(e.kind for e in jn.events(path)) == ["ecc", "gpu_back", "gpu_lost", "xid"]


def test_gpud_sim_inject_on_a_full_state_directory_says_the_fault_was_not_saved(capsys, state_dir,
                                                                                  monkeypatch) -> None:
    import errno
    import os

    import gpud.paths
    from gpud.backends import open_machine

    open_machine(SIM)  # the machine's state exists; now the directory fills up
    real = os.open

    def full(path, flags, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path).startswith(str(state_dir)) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(gpud.paths.os, "open", full)
    import builtins

    real_open = builtins.open

    def full_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(file).startswith(str(state_dir)) and any(c in mode for c in "wax+"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full_open)
    code, out, err = cli(capsys, "sim", "inject", "xid", "gpu=0", "xid=79", "--simulate", SIM)
    assert code == 1 and "could not be saved" in err and "Traceback" not in err, (out, err)
