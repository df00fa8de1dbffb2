"""Dashboards and alert rules, proven against a real Prometheus that scraped gpud daemons."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, run_gpud
from daemon_helpers import RunningDaemon, free_port

from gpud.probe.torchrun import torch_available

GRAFANA = REPO / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
RULES = GRAFANA / "prometheus" / "gpud-rules.yml"
PANEL_TYPES = {"timeseries", "stat", "state-timeline", "table"}

# Expressions that may rightly return nothing from these workstations, and why.
EXPECTED_EMPTY = {
    "GpudScalingRegression": "needs a probe run at least 10 % worse than the best of the last 7 days; one probe ran",
    "GpudProbeFailed": "the CPU probe passed (its figures check function only, so it has no threshold to fail)",
    "GpudPcieReplayRate": "no simulated PCIe replay counter climbs (promtool's unit test proves the rule)",
    "GpudTickStale": "every daemon here ticks (promtool's unit test proves the rule)",
    "GpudAbsent": "Prometheus has gpud targets here (promtool's unit test proves the rule: none at all)",
    "GpudNvlinkErrorRate": "no simulated NVLink error counter climbs here (promtool's unit test proves the rule)",
}
PROBE_PANELS = ("gpud_probe_",)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing (Debian's prometheus package)")
        pytest.skip(f"{name} not installed (apt-get install prometheus)")
    return path


def load_dashboards() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in DASHBOARDS]


def panel_queries() -> list[tuple[str, str, str]]:
    out = []
    for d in load_dashboards():
        for p in d["panels"]:
            for t in p.get("targets", []):
                out.append((d["uid"], p["title"], t["expr"]))
    return out


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


# -- static checks ----------------------------------------------------------------------------

def test_dashboards_are_generated_from_generate_py() -> None:
    sys.path.insert(0, str(GRAFANA))
    import generate

    assert json.loads((GRAFANA / "dashboards" / "gpud-workstation.json").read_text()) == generate.workstation()
    assert json.loads((GRAFANA / "dashboards" / "gpud-lab.json").read_text()) == generate.lab()


def test_dashboard_json_model() -> None:
    boards = load_dashboards()
    assert {b["uid"] for b in boards} == {"gpud-workstation", "gpud-lab"}
    for b in boards:
        names = {v["name"] for v in b["templating"]["list"]}
        assert {"datasource", "instance", "gpu"} <= names
        assert next(v for v in b["templating"]["list"] if v["name"] == "datasource")["type"] == "datasource"
        ids = [p["id"] for p in b["panels"]]
        assert len(ids) == len(set(ids))
        for p in b["panels"]:
            if p["type"] == "row":
                continue
            assert p["type"] in PANEL_TYPES, p["title"]
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
            assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']} has no unit"
            for t in p["targets"]:
                assert t["datasource"] == p["datasource"]
                for var in re.findall(r"\$(?:\{)?(\w+)", t["expr"]):
                    assert var in names or var.startswith("__"), f"{p['title']}: ${var} is not defined"
        for v in b["templating"]["list"]:
            for var in re.findall(r"\$(\w+)", json.dumps(v.get("query", ""))):
                assert var in names, f"variable {v['name']} uses undefined ${var}"


def test_each_gpus_active_profile_and_rule_is_on_both_dashboards() -> None:
    """gpud_gpu_profile_active (the rules' switches, issue 27's "a metric of the active profile per GPU and
    rule") is shown: a table of what each GPU follows now, on the workstation and the lab dashboard."""
    for uid in ("gpud-workstation", "gpud-lab"):
        shown = [(title, expr) for u, title, expr in panel_queries() if u == uid and "gpud_gpu_profile_active" in expr]
        assert shown, f"{uid} does not show gpud_gpu_profile_active"


def test_promtool_checks_and_tests_the_rules() -> None:
    promtool = tool("promtool")
    r = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS: 17 rules found" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([promtool, "test", "rules", "gpud-rules.test.yml"], capture_output=True, text=True,
                       cwd=RULES.parent)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([promtool, "check", "config", "--syntax-only", str(RULES.parent / "prometheus.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# -- against a real Prometheus ------------------------------------------------------------------

class Lab:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.daemons: list[RunningDaemon] = []
        self.prom: subprocess.Popen[bytes] | None = None

    def daemon(self, name: str, sim: str, config: str = "") -> RunningDaemon:
        d = self.tmp / name
        d.mkdir(exist_ok=True)
        daemon = RunningDaemon(d, sim=sim, config=config, interval=0.5, env={"GPUD_STATE_DIR": str(d / "state")})
        self.daemons.append(daemon)
        return daemon

    def start_prometheus(self, targets: list[str]) -> str:
        rules_copy = self.tmp / "rules.yml"
        # The `for:` durations are proven by promtool's unit tests; here the expressions must fire now.
        rules_copy.write_text(re.sub(r"\n(\s+)for: \w+", r"\n\1for: 0s", RULES.read_text()))
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules_copy)],
               # a node label per target, as the PodMonitor's relabelling adds one (the dashboards' $node)
               "scrape_configs": [{"job_name": "gpud", "static_configs": [
                   {"targets": [t], "labels": {"node": f"node-{k}"}} for k, t in enumerate(targets)]}]}
        (self.tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        port = free_port()
        self.prom = subprocess.Popen([tool("prometheus"), f"--config.file={self.tmp / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                                      f"--web.listen-address=127.0.0.1:{port}"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.tmp / "prometheus.log", "wb"))
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            data = json.loads(r.read())
        assert data["status"] == "success", data
        return data["data"]["result"]  # type: ignore[no-any-return]

    def close(self) -> None:
        for d in self.daemons:
            d.stop(signal.SIGKILL)
        if self.prom is not None:
            self.prom.kill()
            self.prom.wait()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    tool("prometheus")
    tmp = tmp_path_factory.mktemp("lab")
    saved = {k: os.environ.get(k) for k in ("GPUD_STATE_DIR", "GPUD_SOCKET")}
    lab = Lab(tmp)
    probe: subprocess.Popen[str] | None = None
    try:
        healthy_state = tmp / "healthy" / "state"
        if torch_available():  # a real CPU probe for the probe panels, run while the lab starts (its half minute)
            probe = subprocess.Popen([sys.executable, "-m", "gpud", "probe", "--device", "cpu", "--world-sizes", "1,2",
                                      "--quick", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "GPUD_STATE_DIR": str(healthy_state)}, cwd=REPO)
        _last_burnin(healthy_state)  # the burn-in panels read the last result the daemon exports
        healthy = lab.daemon("healthy", "z8-fury-4x-a6000", 'profile = "training"\n')
        degraded = lab.daemon("degraded", "z8-fury-4x-a6000-degraded")
        faulty = lab.daemon("faulty", "z8-fury-4x-rtx6000ada", 'profile = "quiet"\n')
        hgx = lab.daemon("hgx", "hgx-8x-h200")  # NVLink data counters: only NVSwitch GPUs give them
        # the HGX's kernel log unreadable (a container without /dev/kmsg): its Xid components are unknown
        r = run_gpud("sim", "inject", "kernel_log_unreadable",
                     env={"GPUD_STATE_DIR": str(tmp / "hgx" / "state"), "GPUD_SIMULATE": "hgx-8x-h200"})
        assert r.returncode == 0, r.stderr
        down = f"127.0.0.1:{free_port()}"  # a workstation whose gpud is not running
        lab.start_prometheus([f"127.0.0.1:{d.port}" for d in (healthy, degraded, faulty, hgx)] + [down])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if len(lab.query('up{job="gpud"}')) == 5:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        # Faults on the third workstation, after Prometheus has seen it healthy.
        env = {"GPUD_STATE_DIR": str(tmp / "faulty" / "state"), "GPUD_SIMULATE": "z8-fury-4x-rtx6000ada"}
        time.sleep(3)
        for args in (["no_permission", 'call="nvmlDeviceSetPowerManagementLimit"', "gpu=0"],
                     ["unsupported", 'call="nvmlDeviceGetTemperature"', "gpu=1"],
                     ["gpu_lost", "gpu=3"], ["xid", "gpu=2", "xid=79"]):
            r = run_gpud("sim", "inject", *args, env=env)
            assert r.returncode == 0, r.stderr
        os.environ["GPUD_STATE_DIR"] = env["GPUD_STATE_DIR"]
        from gpud.backends import open_machine

        m = open_machine("z8-fury-4x-rtx6000ada")
        m.simulation.machine.state["faults"] = [f for f in m.simulation.machine.state["faults"]
                                                if f["kind"] != "no_permission"]
        with m.simulation.machine.mutate():  # a power limit changed behind gpud's back, which it cannot undo
            m.simulation.machine.settings(0)["power_limit_mw"] = 300000
        if probe is not None:  # the healthy daemon reads the probe history when it changes, at its next tick
            _, err = probe.communicate(timeout=180)
            assert probe.returncode == 0, err[-2000:]
        time.sleep(14)  # the kernel log is read every 10 s; let Prometheus see the increase
        yield lab
    finally:
        if probe is not None and probe.poll() is None:
            probe.kill()
            probe.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        lab.close()


def _last_burnin(state: Path) -> None:
    """A last burn-in result, as `gpud burnin` leaves it in the state directory (without running one)."""
    from gpud.burnin.result import Result, Verdict

    res = Result("z8-fury-4x-a6000", "quick", "cpu", [0, 1], {0: "NVIDIA RTX A6000", 1: "NVIDIA RTX A6000"},
                 time.time(), seconds=60.0, simulated_time=True,
                 verdicts=[Verdict("burnin.clocks.hw_slowdown", "pass", "0 s", 0, 0.0, 0.0, "nvml.h"),
                           Verdict("burnin.clocks.hw_slowdown", "fail", "hw_slowdown 5 s", 1, 5.0, 0.0, "nvml.h")])
    state.mkdir(parents=True, exist_ok=True)
    (state / "burnin.json").write_text(json.dumps(res.json("test", {"name": "z8-fury-4x-a6000"})))


def _substitute(expr: str) -> str:
    return expr.replace("$instance", ".*").replace("$gpu", ".*").replace("$__rate_interval", "15s")


def test_nvlink_throughput_comes_from_the_nvswitch_gpus(lab: Lab) -> None:
    hgx = f"127.0.0.1:{lab.daemons[3].port}"
    got = lab.query('sum by (instance, gpu, direction) (rate(gpud_gpu_nvlink_data_bytes_total[15s]))')
    assert {r["metric"]["instance"] for r in got} == {hgx}  # the bridged A6000s give no such counter
    assert len(got) == 8 * 2


def test_every_panel_query_returns_data(lab: Lab) -> None:
    empty = []
    for uid, title, expr in panel_queries():
        if not torch_available() and any(p in expr for p in PROBE_PANELS):
            continue
        if not lab.query(_substitute(expr)):
            empty.append(f"{uid}: {title}: {expr}")
    assert not empty, "\n".join(empty)


def test_every_alert_expression_returns_data_or_is_expected_empty(lab: Lab) -> None:
    empty = []
    for r in rules():
        got = lab.query(r["expr"])
        if r["alert"] in EXPECTED_EMPTY:
            assert not got, f"{r['alert']} listed as expected-empty but returns {got}"
        elif not got and (torch_available() or "probe" not in r["expr"]):
            empty.append(r["alert"])
    assert not empty, empty


def test_a_node_picks_its_machines_through_the_instance_variable(lab: Lab) -> None:
    """$node (the PodMonitor's node label) narrows $instance: the instance variable's own query, with
    $node as Grafana substitutes it, gives that node's machine only; "All" (.*) gives every machine."""
    sys.path.insert(0, str(GRAFANA))
    import generate

    for board in (generate.lab(), generate.workstation()):
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["node"]["allValue"] == ".*"
        query = variables["instance"]["query"]["query"]
        series = re.fullmatch(r"label_values\((.*), instance\)", query)
        assert series, query
        one = {r["metric"]["instance"] for r in lab.query(series.group(1).replace("$node", "node-1"))}
        every = {r["metric"]["instance"] for r in lab.query(series.group(1).replace("$node", ".*"))}
        assert one == {f"127.0.0.1:{lab.daemons[1].port}"} and len(every) == 4, (one, every)


def test_the_lab_shows_a_machine_whose_xids_are_unknown_as_unknown_not_healthy(lab: Lab) -> None:
    """The lab's "Health state per workstation": the worst of degraded and unhealthy, else unknown (-1: a
    source gpud could not read), else healthy; a plain max showed the HGX, whose kernel log is unreadable,
    as healthy."""
    sys.path.insert(0, str(GRAFANA))
    import generate

    def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [q for p in items for q in (p, *panels(p.get("panels", [])))]

    panel = next(p for p in panels(generate.lab()["panels"]) if p.get("title") == "Health state per workstation")
    expr = _substitute(panel["targets"][0]["expr"])
    names = {f"127.0.0.1:{d.port}": n for d, n in zip(lab.daemons, ("healthy", "degraded", "faulty", "hgx"),
                                                       strict=True)}
    deadline = time.monotonic() + 20
    while True:
        got = {names.get(r["metric"].get("instance", ""), "?"): float(r["value"][1]) for r in lab.query(expr)}
        if {"healthy", "degraded", "hgx"} <= set(got) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert got["healthy"] == 0 and got["degraded"] == 2 and got["hgx"] == -1, got
    texts = {v["text"] for m in panel["fieldConfig"]["defaults"]["mappings"] for v in m["options"].values()}
    assert texts == {"unknown", "healthy", "degraded", "unhealthy"}


def test_expected_alerts_fire(lab: Lab) -> None:
    deadline = time.monotonic() + 15
    want = {
        ("GpudGpuHardwareSlowdown", "degraded", "1"), ("GpudGpuThermalMargin", "degraded", "3"),
        ("GpudHardwareXid", "degraded", "3"), ("GpudCheckFailing", "degraded", "2"),
        ("GpudCheckFailing", "degraded", "3"), ("GpudGpuLost", "faulty", "3"), ("GpudFanFailsafe", "faulty", ""),
        ("GpudNewXid", "faulty", "2"), ("GpudProfileDrift", "faulty", "0"), ("GpudDown", "down", ""),
        ("GpudGpuThrottledShare", "degraded", "1"), ("GpudUnhealthy", "degraded", "3"),
    }
    ports = {str(d.port): name for d, name in zip(lab.daemons, ("healthy", "degraded", "faulty", "hgx"),
                                                   strict=True)}
    while True:
        with urllib.request.urlopen(lab.url + "/api/v1/alerts", timeout=10) as r:
            alerts = json.loads(r.read())["data"]["alerts"]
        firing = {(a["labels"]["alertname"], ports.get(a["labels"].get("instance", "").rsplit(":", 1)[-1], "down"),
                   a["labels"].get("gpu", "")) for a in alerts if a["state"] == "firing"}
        if want <= firing or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert want <= firing, sorted(want - firing)
    assert not {f for f in firing if f[1] == "healthy"}, sorted(f for f in firing if f[1] == "healthy")
