"""Generate gpud's Grafana dashboards (JSON model, schemaVersion 39) from one description each.

    python grafana/generate.py        # rewrites grafana/dashboards/*.json

Panels are current types only (time series, stat, state timeline, table); every panel names its
datasource (the ${datasource} variable) and a unit; every query filters on the $instance (and,
per GPU, $gpu) variables. tests/test_grafana.py checks the files are up to date, and runs every
query against a real Prometheus that scraped gpud.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
INST = 'instance=~"$instance"'
GPUS = 'instance=~"$instance", gpu=~"$gpu"'
PROFILE_ACTIVE = ("the profile each GPU follows now: the [[rules]] rule that switched it (the job's), or empty for "
                  "the base profile (`gpud status`, `gpud rules test`)")


class Board:
    def __init__(self, uid: str, title: str, description: str) -> None:
        self.uid, self.title, self.description = uid, title, description
        self.panels: list[dict[str, Any]] = []
        self.y = 0
        self.x = 0
        self.row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"type": "row", "title": title, "collapsed": False, "id": len(self.panels) + 1,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def panel(self, kind: str, title: str, unit: str, targets: list[tuple[str, str]], w: int = 8, h: int = 8,
              description: str = "", table: bool = False, **extra: Any) -> None:
        if self.x + w > 24:
            self._newline()
        p: dict[str, Any] = {
            "id": len(self.panels) + 1, "type": kind, "title": title, "description": description,
            "datasource": DS, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": {"unit": unit, **extra.pop("defaults", {})}, "overrides": []},
            "options": extra.pop("options", {}),
            "targets": [{"refId": chr(65 + k), "datasource": DS, "expr": expr, "legendFormat": legend,
                         "range": not table, "instant": table, **({"format": "table"} if table else {})}
                        for k, (expr, legend) in enumerate(targets)],
        }
        if table:
            p["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True, "__name__": True,
                                                                                       "job": True}}}]
        p.update(extra)
        self.panels.append(p)
        self.x += w
        self.row_h = max(self.row_h, h)

    def json(self, variables: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "uid": self.uid, "title": self.title, "description": self.description, "tags": ["gpud", "gpu"],
            "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1, "refresh": "30s",
            "time": {"from": "now-6h", "to": "now"}, "timezone": "browser",
            "templating": {"list": variables}, "annotations": {"list": []}, "panels": self.panels,
            "links": [{"title": "gpud", "type": "dashboards", "tags": ["gpud"], "asDropdown": False}],
        }


def variables(with_gpu: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0},
        # In a cluster a target is a pod's IP:port; the PodMonitor's relabelling adds the node's name
        # (deploy/kubernetes/podmonitor.yaml): pick machines by node. A static scrape config has no such
        # label, and "All" (.*) matches series without it.
        {"name": "node", "label": "Node", "type": "query", "datasource": DS,
         "query": {"query": "label_values(gpud_build_info, node)", "refId": "node"},
         "definition": "label_values(gpud_build_info, node)", "refresh": 2, "multi": True, "includeAll": True,
         "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "sort": 1, "hide": 0},
        {"name": "instance", "label": "Workstation", "type": "query", "datasource": DS,
         "query": {"query": 'label_values(gpud_build_info{node=~"$node"}, instance)', "refId": "instance"},
         "definition": 'label_values(gpud_build_info{node=~"$node"}, instance)', "refresh": 2, "multi": True,
         "includeAll": True, "current": {"text": "All", "value": "$__all"}, "sort": 1, "hide": 0},
    ]
    if with_gpu:
        out.append({"name": "gpu", "label": "GPU", "type": "query", "datasource": DS,
                    "query": {"query": 'label_values(gpud_gpu_info{instance=~"$instance"}, gpu)', "refId": "gpu"},
                    "definition": 'label_values(gpud_gpu_info{instance=~"$instance"}, gpu)', "refresh": 2,
                    "multi": True, "includeAll": True, "current": {"text": "All", "value": "$__all"}, "sort": 3,
                    "hide": 0})
    return out


def workstation() -> dict[str, Any]:
    b = Board("gpud-workstation", "gpud / Workstation",
              "One workstation in detail: per-GPU telemetry, doctor's checks, tuning and the training probe.")
    b.row("Health")
    b.panel("stat", "GPUs up", "none", [(f"sum by (instance) (gpud_gpu_up{{{INST}}})", "{{instance}}")], w=4, h=5)
    b.panel("stat", "Failing checks", "none",
            [(f'count by (instance) (gpud_check_status{{{INST}, status="fail"}} == 1) or on(instance) '
              f"(0 * group by (instance) (gpud_build_info{{{INST}}}))", "{{instance}}")], w=4, h=5,
            defaults={"thresholds": {"mode": "absolute", "steps": [{"color": "green", "value": None},
                                                                    {"color": "red", "value": 1}]}})
    b.panel("stat", "Active profile", "none", [(f"gpud_profile_info{{{INST}}}", "{{profile}}")], w=4, h=5,
            options={"textMode": "name", "reduceOptions": {"calcs": ["lastNotNull"]}})
    b.panel("stat", "Profile re-applied (24 h)", "none",
            [(f"increase(gpud_profile_reapply_total{{{INST}}}[24h])", "{{instance}}")], w=4, h=5)
    b.panel("stat", "Fan failsafes (24 h)", "none",
            [(f"increase(gpud_fan_failsafe_total{{{INST}}}[24h])", "{{instance}}")], w=4, h=5)
    b.panel("stat", "Tick p99", "s", [(f"histogram_quantile(0.99, sum by (le, instance) "
                                       f"(rate(gpud_tick_duration_seconds_bucket{{{INST}}}[$__rate_interval])))",
                                       "{{instance}}")], w=4, h=5)
    b.panel("table", "Checks that do not pass", "none",
            [(f'gpud_check_status{{{INST}, status=~"warn|fail"}} == 1', "")], w=12, h=8, table=True)
    b.panel("state-timeline", "Failing checks over time", "none",
            [(f'max by (check) (gpud_check_status{{{INST}, status="fail"}})', "{{check}}")], w=12, h=8)
    b.row("Thermal, fans and power")
    b.panel("timeseries", "Temperature and slowdown temperature", "celsius",
            [(f"gpud_gpu_temperature_celsius{{{GPUS}}}", "GPU{{gpu}}"),
             (f"gpud_gpu_slowdown_temperature_celsius{{{GPUS}}}", "GPU{{gpu}} slowdown")])
    b.panel("timeseries", "Fan speed", "percentunit",
            [(f"gpud_gpu_fan_speed_ratio{{{GPUS}}}", "GPU{{gpu}} fan {{fan}}")], defaults={"min": 0, "max": 1})
    b.panel("timeseries", "Power against limit", "watt",
            [(f"gpud_gpu_power_watts{{{GPUS}}}", "GPU{{gpu}}"),
             (f"gpud_gpu_power_limit_watts{{{GPUS}}}", "GPU{{gpu}} limit")])
    b.panel("state-timeline", "Fan in manual mode", "none",
            [(f"gpud_gpu_fan_manual{{{GPUS}}}", "GPU{{gpu}} fan {{fan}}")], w=12, h=6)
    b.panel("timeseries", "Energy rate", "watt",
            [(f"rate(gpud_gpu_energy_joules_total{{{GPUS}}}[$__rate_interval])", "GPU{{gpu}}")], w=12, h=6)
    b.row("Clocks, utilisation, memory")
    b.panel("timeseries", "SM clock against its maximum", "hertz",
            [(f'gpud_gpu_clock_hertz{{{GPUS}, clock="sm"}}', "GPU{{gpu}}"),
             (f'gpud_gpu_max_clock_hertz{{{GPUS}, clock="sm"}}', "GPU{{gpu}} max")])
    b.panel("timeseries", "Utilisation", "percentunit", [(f"gpud_gpu_utilization_ratio{{{GPUS}}}", "GPU{{gpu}}")],
            defaults={"min": 0, "max": 1})
    b.panel("timeseries", "Memory used", "bytes", [(f"gpud_gpu_memory_used_bytes{{{GPUS}}}", "GPU{{gpu}}"),
                                                  (f"gpud_gpu_memory_total_bytes{{{GPUS}}}", "GPU{{gpu}} total")])
    b.panel("state-timeline", "Clock events (throttling)", "none",
            [(f'gpud_gpu_clock_event_active{{{GPUS}, reason!="gpu_idle"}}', "GPU{{gpu}} {{reason}}")], w=24, h=8)
    b.panel("timeseries", "Share of time throttled (10 min)", "percentunit",
            [(f"rate(gpud_gpu_throttled_seconds_total{{{GPUS}}}[10m]) / "
              f"rate(gpud_gpu_watched_seconds_total{{{GPUS}}}[10m])", "GPU{{gpu}}")], w=12,
            defaults={"min": 0, "max": 1},
            description="time held below the requested clocks by a power or thermal limit, over 10 minutes")
    b.panel("timeseries", "Time per clock-event reason (10 min)", "percentunit",
            [(f'rate(gpud_gpu_clock_event_seconds_total{{{GPUS}, reason!="gpu_idle"}}[10m]) > 0',
              "GPU{{gpu}} {{reason}}")], w=12, defaults={"min": 0, "max": 1})
    b.row("Users")
    b.panel("timeseries", "GPU memory by user", "bytes",
            [(f"sum by (user) (gpud_user_gpu_memory_bytes{{{GPUS}}})", "{{user}}")], w=12,
            description="memory held by each user's processes on the selected GPUs")
    b.panel("timeseries", "GPUs occupied by user", "none",
            [(f"sum by (user) (rate(gpud_user_gpu_seconds_total{{{INST}}}[$__rate_interval]))", "{{user}}")], w=12,
            description="GPU-seconds per second: 2 means two GPUs held the whole time")
    b.row("PCIe, NVLink, errors")
    b.panel("timeseries", "PCIe link width, current and max", "none",
            [(f"gpud_gpu_pcie_link_width{{{GPUS}}}", "GPU{{gpu}} {{kind}}")])
    b.panel("timeseries", "PCIe link generation, current and max", "none",
            [(f"gpud_gpu_pcie_link_generation{{{GPUS}}}", "GPU{{gpu}} {{kind}}")])
    b.panel("timeseries", "PCIe throughput", "Bps",
            [(f"gpud_gpu_pcie_throughput_bytes_per_second{{{GPUS}}}", "GPU{{gpu}} {{direction}}")])
    b.panel("timeseries", "NVLinks up", "none", [(f"sum by (gpu) (gpud_gpu_nvlink_link_up{{{GPUS}}})", "GPU{{gpu}}")])
    b.panel("timeseries", "NVLink throughput", "Bps",
            [(f"sum by (gpu, direction) (rate(gpud_gpu_nvlink_data_bytes_total{{{GPUS}}}[$__rate_interval]))",
              "GPU{{gpu}} {{direction}}")],
            description="data over all of a GPU's NVLinks, where NVML counts it (data-centre GPUs; NVML's counters "
                        "are read every 10 s)")
    b.panel("table", "Xids since boot", "none", [(f"gpud_gpu_xid_errors_total{{{GPUS}}} > 0", "")], table=True)
    b.panel("timeseries", "ECC errors, PCIe replays, NVLink errors (rate)", "short",
            [(f"rate(gpud_gpu_ecc_errors_total{{{GPUS}}}[$__rate_interval])", "GPU{{gpu}} ECC {{type}}"),
             (f"rate(gpud_gpu_pcie_replay_errors_total{{{GPUS}}}[$__rate_interval])", "GPU{{gpu}} PCIe replays"),
             (f"sum by (gpu, type) (rate(gpud_gpu_nvlink_errors_total{{{GPUS}}}[$__rate_interval]))",
              "GPU{{gpu}} NVLink {{type}}")])
    b.row("Tuning")
    b.panel("state-timeline", "Profile drift", "none", [(f"gpud_profile_drift{{{INST}}}", "GPU{{gpu}} {{setting}}")],
            w=12, h=8)
    b.panel("timeseries", "NVML errors", "short",
            [(f"rate(gpud_nvml_errors_total{{{INST}}}[$__rate_interval])", "{{call}}")], w=12, h=8)
    b.panel("table", "Active profile per GPU", "none", [(f"gpud_gpu_profile_active{{{GPUS}}} == 1", "")], w=12, h=8,
            table=True, description=PROFILE_ACTIVE)
    b.panel("state-timeline", "Profile switches", "none",
            [(f"gpud_gpu_profile_active{{{GPUS}}} == 1", "GPU{{gpu}} {{profile}} {{rule}}")], w=12, h=8,
            description="which profile each GPU followed when, and the rule that switched it (docs/profiles.md)")
    b.row("Training probe")
    b.panel("timeseries", "DDP throughput by world size", "short",
            [(f"gpud_probe_ddp_samples_per_second{{{INST}}}", "{{world_size}} GPU(s)")],
            description="samples per second, from the latest probe run")
    b.panel("timeseries", "DDP scaling efficiency", "percentunit",
            [(f"gpud_probe_ddp_efficiency_ratio{{{INST}}}", "{{world_size}} GPUs")], defaults={"min": 0, "max": 1})
    b.panel("timeseries", "All-reduce bus bandwidth", "Bps",
            [(f"gpud_probe_allreduce_busbw_bytes_per_second{{{INST}}}", "{{world_size}} GPUs")])
    b.panel("table", "P2P bandwidth per pair", "Bps", [(f"gpud_probe_p2p_bandwidth_bytes_per_second{{{INST}}}", "")],
            table=True)
    b.panel("stat", "Last probe", "s", [(f"time() - gpud_probe_last_run_timestamp_seconds{{{INST}}}", "{{instance}}")],
            description="seconds since the last probe finished")
    b.panel("stat", "Last probe passed", "bool_yes_no", [(f"gpud_probe_success{{{INST}}}", "{{instance}}")])
    b.row("Burn-in")
    b.panel("stat", "Last burn-in passed", "bool_yes_no", [(f"gpud_burnin_success{{{INST}}}", "{{level}}")],
            description="the last `gpud burnin` (docs/burnin.md); `gpud doctor --burnin` shows its verdicts")
    b.panel("stat", "Last burn-in", "s",
            [(f"time() - gpud_burnin_last_run_timestamp_seconds{{{INST}}}", "{{instance}}")],
            description="seconds since the last burn-in started")
    b.panel("table", "Burn-in tests failed per GPU", "short", [(f"gpud_burnin_gpu_failed_tests{{{GPUS}}}", "")],
            table=True)
    return b.json(variables(with_gpu=True))


def lab() -> dict[str, Any]:
    b = Board("gpud-lab", "gpud / Lab", "Every workstation at a glance: health, failing checks, scaling, heat, power.")
    b.row("Health")
    # job "gpud" in a static scrape config, "<namespace>/<name>" for a PodMonitor's targets (gpud-rules.yml)
    b.panel("state-timeline", "gpud up", "none", [(f'up{{job=~"gpud|.+/gpud", {INST}}}', "{{instance}}")], w=12, h=7)
    b.panel("table", "Health grid", "none",
            [(f"sum by (instance) (gpud_gpu_up{{{INST}}})", "GPUs up"),
             (f'count by (instance) (gpud_check_status{{{INST}, status="fail"}} == 1) or on(instance) '
              f"(0 * group by (instance) (gpud_build_info{{{INST}}}))", "failing checks"),
             (f'count by (instance) (gpud_check_status{{{INST}, status="warn"}} == 1) or on(instance) '
              f"(0 * group by (instance) (gpud_build_info{{{INST}}}))", "warnings")], w=12, h=7, table=True)
    b.panel("table", "Failing checks", "none", [(f'gpud_check_status{{{INST}, status="fail"}} == 1', "")], w=24, h=8,
            table=True)
    # gpud health: -1 unknown (a source gpud could not read), 0 healthy, 1 degraded, 2 unhealthy per GPU and
    # component. Per machine: the worst of degraded and unhealthy; else unknown if a component is; else
    # healthy (a plain max would show a machine whose Xids cannot be read as healthy).
    named = ((-1, "unknown", "text"), (0, "healthy", "green"), (1, "degraded", "orange"), (2, "unhealthy", "red"))
    states = {"mappings": [{"type": "value", "options": {
        str(v): {"text": text, "color": colour, "index": k} for k, (v, text, colour) in enumerate(named)}}],
        "color": {"mode": "thresholds"},
        "thresholds": {"mode": "absolute", "steps": [{"color": colour, "value": None if k == 0 else v}
                                                    for k, (v, _, colour) in enumerate(named)]}}
    health = f"gpud_health_state{{{INST}}}"
    b.panel("state-timeline", "Health state per workstation", "none",
            [(f"max by (instance) ({health}) > 0 or on (instance) min by (instance) ({health}) == -1 "
              f"or on (instance) max by (instance) ({health})", "{{instance}}")], w=12, h=7, defaults=states,
            description="The worst component of each machine (`gpud health`): unhealthy, degraded; unknown when "
                        "a source could not be read (`gpud health` says which and what gpud needs); else healthy")
    b.panel("table", "Degraded and unhealthy components, with their repair action", "none",
            [(f'gpud_health_info{{{INST}, state!="healthy"}}', "")], w=12, h=7, table=True,
            description="Per GPU (host: machine-wide) and component: the state, what found it and the repair action "
                        "(`gpud health`; `gpud health set-healthy GPU --reason TEXT` after a repair)")
    b.row("Scaling, heat, power")
    b.panel("timeseries", "DDP scaling efficiency per workstation", "percentunit",
            [(f"max by (instance, world_size) (gpud_probe_ddp_efficiency_ratio{{{INST}}})",
              "{{instance}} {{world_size}} GPUs")], w=12, defaults={"min": 0, "max": 1})
    b.panel("table", "Hottest GPUs", "celsius", [(f"topk(10, gpud_gpu_temperature_celsius{{{GPUS}}})", "")], w=12,
            table=True)
    b.panel("timeseries", "Power per workstation", "watt",
            [(f"sum by (instance) (gpud_gpu_power_watts{{{INST}}})", "{{instance}}")], w=12)
    b.panel("timeseries", "Thermal margin (lowest per workstation)", "celsius",
            [(f"min by (instance) (gpud_gpu_slowdown_temperature_celsius{{{INST}}} - "
              f"gpud_gpu_temperature_celsius{{{INST}}})", "{{instance}}")], w=12)
    b.panel("state-timeline", "Lost GPUs", "none", [(f"gpud_gpu_up{{{GPUS}}} == 0", "{{instance}} GPU{{gpu}}")],
            w=24, h=6)
    b.row("Users and throttling")
    b.panel("timeseries", "GPUs occupied by user (lab)", "none",
            [(f"sum by (user) (rate(gpud_user_gpu_seconds_total{{{INST}}}[$__rate_interval]))", "{{user}}")], w=12)
    b.panel("table", "Most throttled GPUs (10 min)", "percentunit",
            [(f"topk(10, rate(gpud_gpu_throttled_seconds_total{{{GPUS}}}[10m]) / "
              f"rate(gpud_gpu_watched_seconds_total{{{GPUS}}}[10m]))", "")], w=12, table=True)
    b.panel("table", "Active profile per GPU", "none", [(f"gpud_gpu_profile_active{{{GPUS}}} == 1", "")], w=24,
            h=7, table=True, description=PROFILE_ACTIVE)
    return b.json(variables(with_gpu=True))


RULES = HERE / "prometheus" / "gpud-rules.yml"
PROMETHEUS_RULE = HERE.parent / "deploy" / "kubernetes" / "prometheusrule.yaml"


def prometheus_rule() -> str:
    """The alert rules as the Prometheus Operator's PrometheusRule: gpud-rules.yml's groups under ``spec``,
    as written (comments kept)."""
    text = RULES.read_text()
    body = text[text.index("groups:"):]
    spec = "".join(("  " + line if line.strip() else line) for line in body.splitlines(keepends=True))
    return ("# Generated by grafana/generate.py from grafana/prometheus/gpud-rules.yml: edit that file, run the\n"
            "# script. For the Prometheus Operator (monitoring.coreos.com/v1). kube-prometheus-stack loads the\n"
            "# PrometheusRules labelled release: <its Helm release's name> (`helm list -A`): set the label below\n"
            "# to yours.\n"
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n  name: gpud\n  namespace: gpud\n"
            "  labels:\n    app.kubernetes.io/name: gpud\n    release: kube-prometheus-stack\nspec:\n" + spec)


def main() -> None:
    for name, board in (("gpud-workstation.json", workstation()), ("gpud-lab.json", lab())):
        (HERE / "dashboards" / name).write_text(json.dumps(board, indent=2) + "\n")
    PROMETHEUS_RULE.write_text(prometheus_rule())


if __name__ == "__main__":
    main()
