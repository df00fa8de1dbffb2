"""One JSON schema (docs/json.md) for every command's --json and the daemon's /status, checked on
every shipped description."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_gpud

from gpud.json_schema import SCHEMAS, check, validate
from gpud.model import SCHEMA_VERSION

DESCRIPTIONS = [d["name"] for d in json.loads(run_gpud("sim", "list", "--json").stdout)["machines"]]  # all shipped


def _doc(*args: str) -> dict:
    r = run_gpud(*args, "--json", timeout=240)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("desc", DESCRIPTIONS)
def test_status_topo_doctor_and_the_daemons_status_follow_the_schema(desc: str, state_dir: Path) -> None:
    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.service import Daemon

    docs = {cmd: _doc(cmd, "--simulate", desc) for cmd in ("status", "topo", "doctor")}
    for cmd, doc in docs.items():
        assert doc["kind"] == cmd and doc["schema_version"] == SCHEMA_VERSION == 2
        assert check(doc) == [], (desc, cmd)
    # the same facts have the same names and values in every document
    hosts = [d["host"] for d in docs.values()]
    assert hosts[0] == hosts[1] == hosts[2] and hosts[0]["name"] == desc
    status, topo = docs["status"], docs["topo"]
    for g, t in zip(status["gpus"], topo["gpus"], strict=True):
        assert g["info"]["cpu_affinity"] == t["cpu_affinity"]
        assert g["info"]["pcie_max_width"] == t["pcie_max_width"] and g["info"]["nvlink_count"] == t["nvlink_count"]
    # the daemon's /status and socket answer follow it too, with the host and GPU facts `gpud status` gives
    d = Daemon(open_machine(desc), cfg.Config())
    d.tick()
    for doc in (d.status(), d.status(full=True), d.handle({"cmd": "status"})):
        doc = json.loads(json.dumps(doc))  # as /status and the socket send it
        assert check(doc) == [], desc
    assert status["host"] == json.loads(json.dumps(d.status()))["host"]
    assert [g["info"] for g in status["gpus"]] == [g["info"] for g in json.loads(json.dumps(d.status()))["gpus"]]


# A CPU probe's document has the same shape on every description (its figures come from CPU ranks;
# the diagnosis per topology is tested in test_probe_diagnosis.py): one NVLink-pair workstation with
# a fault and the NVSwitch board cover both kinds of topology section, at a third of the cost.
@pytest.mark.parametrize("desc", ["z8-fury-4x-a6000-degraded", "hgx-8x-h200"])
def test_probe_json_follows_the_schema(desc: str, state_dir: Path) -> None:
    doc = _doc("probe", "--quick", "--device", "cpu", "--suite", "ddp,allreduce", "--world-sizes", "1,2",
               "--simulate", desc)
    assert check(doc) == [], desc
    assert doc["host"]["name"] == desc and isinstance(doc["cpu_affinity_by_rank"], list)


def test_daemon_status_with_a_profile_follows_the_schema(state_dir: Path) -> None:
    from gpud import config as cfg
    from gpud.backends import open_machine
    from gpud.daemon.service import Daemon

    d = Daemon(open_machine("z8-fury-4x-a6000"), cfg.Config())
    assert d.apply("quiet")["ok"]
    d.tick()
    doc = json.loads(json.dumps(d.status(full=True)))
    assert check(doc) == []
    assert {"gpu": 0, "setting": "power_limit_watts", "drift": False} in doc["drift"]  # differs now: no


def test_watch_json_writes_one_document_per_line(state_dir: Path) -> None:
    p = subprocess.Popen([sys.executable, "-m", "gpud", "status", "--watch", "--json", "--interval", "0.2",
                          "--simulate", "z8-fury-4x-a6000"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert p.stdout is not None
        lines = [p.stdout.readline() for _ in range(3)]
    finally:
        p.kill()
        p.wait()
    docs = [json.loads(line) for line in lines]
    assert all(check(d) == [] for d in docs)
    assert docs[0]["timestamp"] < docs[1]["timestamp"] < docs[2]["timestamp"]


def test_ecc_pending_means_a_change_waits_for_reboot(state_dir: Path) -> None:
    doc = _doc("status", "--simulate", "z8-fury-4x-a6000")
    for g in doc["gpus"]:
        s = g["sample"]
        assert s["ecc_enabled"] is True and s["ecc_enabled_after_reboot"] is True
        assert s["ecc_pending"] is False  # ECC on now and after reboot: nothing pending


@pytest.mark.parametrize("desc", DESCRIPTIONS)
def test_every_other_json_output_has_the_envelope_and_follows_the_schema(desc: str, state_dir: Path) -> None:
    """Issue 24: ps, select, verify, apply (and --dry-run), restore, profile list/show, sim list, events
    and the dossier are documents of the one schema too, with the same host as status (those that read no
    machine: the next test)."""
    host = _doc("status", "--simulate", desc)["host"]
    sim = ("--simulate", desc)
    docs = {
        "ps": _doc("ps", *sim), "select": _doc("select", *sim), "apply": _doc("apply", "quiet", "--dry-run", *sim),
        "profile": _doc("profile", "show", "quiet", *sim), "verify": _doc("verify", *sim),
        "restore": _doc("restore", *sim), "rules_test": _doc("rules", "test", *sim),
    }
    for kind, doc in docs.items():
        assert doc["kind"] == kind and check(doc) == [], (desc, kind, check(doc))
    for kind in ("ps", "select", "apply", "profile", "verify", "restore", "rules_test"):
        assert docs[kind]["host"] == host, kind
    applied = _doc("apply", "quiet", *sim)
    assert applied["dry_run"] is False and check(applied) == [], check(applied)
    assert check(_doc("verify", *sim)) == [] and check(_doc("restore", *sim)) == []


def test_the_documents_that_read_no_machine_follow_the_schema(state_dir: Path) -> None:
    """Issue 24, the rest: profile list, sim list, events and the dossier (once: no simulated machine)."""
    from gpud import journal

    for args, kind in ((("profile", "list"), "profile_list"), (("sim", "list"), "sim_list")):
        doc = _doc(*args)
        assert doc["kind"] == kind and check(doc) == [], (kind, check(doc))
    j = journal.Journal(journal.journal_path())
    j.gpu_seen("GPU-0", "1320", "RTX A6000", "94.02", "0000:17:00.0", 0)
    j.record("xid", "Xid 79 on GPU 0", gpu=0, uuid="GPU-0", boot_id="b1", data={"xid": 79, "line": "NVRM: Xid 79"})
    j.close()
    for args, kind in ((("events",), "events"), (("events", "--dossier", "0"), "dossier")):
        doc = _doc(*args)
        assert doc["kind"] == kind and check(doc) == [], (kind, check(doc))


def test_the_validator_rejects_what_breaks_the_schema() -> None:
    good = _doc("topo", "--simulate", "z8-fury-4x-a6000")
    bad = json.loads(json.dumps(good))
    bad["gpus"][0]["cpu_affinity"] = "0-111"
    del bad["host"]["gpu_count"]
    bad["gpus"][1]["extra"] = 1
    errs = check(bad)
    assert "$.gpus[0].cpu_affinity: str where array/null was expected" in errs
    assert "$.host: 'gpu_count' missing" in errs and "$.gpus[1]: 'extra' is not in the schema" in errs
    assert check({**good, "schema_version": 1}) == ["$.schema_version: 1 is not 2"]
    assert validate(1.5, {"type": "integer"}) and not validate(None, {"type": ["integer", "null"]})


def test_docs_describe_every_document_and_field() -> None:
    text = (REPO / "docs" / "json.md").read_text()
    for kind, schema in SCHEMAS.items():
        assert f"`{kind}`" in text, kind
        for field in schema["properties"]:
            assert f"`{field}`" in text, (kind, field)


def test_metrics_export_lifetime_ecc_counts_as_status_shows_them(state_dir: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    doc = _doc("status", "--simulate", "z8-fury-4x-a6000-degraded")
    r = run_gpud("metrics", "--simulate", "z8-fury-4x-a6000-degraded")
    samples = {(s.name, s.labels.get("gpu"), s.labels.get("type")): s.value
               for f in text_string_to_metric_families(r.stdout) for s in f.samples}
    for g in doc["gpus"]:
        e, i = g["sample"]["ecc_errors"], str(g["sample"]["index"])
        assert samples[("gpud_gpu_ecc_errors_aggregate_total", i, "uncorrected")] == e["aggregate_uncorrected"]
        assert samples[("gpud_gpu_ecc_errors_total", i, "uncorrected")] == e["volatile_uncorrected"]
    assert samples[("gpud_gpu_ecc_errors_aggregate_total", "3", "uncorrected")] > 0
