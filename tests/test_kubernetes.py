"""deploy/: the Kubernetes manifests against the Kubernetes schema (kubernetes-validate, whose schemas
are packaged: no cluster, no network), the pieces against each other and against gpud itself (the
ConfigMap's gpud.toml loads, the probes' /healthz answers, the image's paths and user), and Node
Problem Detector's custom plugin against NPD's documented format, its check run on simulated machines;
and `kubectl kustomize`'s rendering, whose shell commands (the init containers') run under setpriv with
the user and capabilities their securityContext grants."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO
from daemon_helpers import free_port

DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"
# An older cluster (1.30: still under its vendors' extended support) and the newest schema
# kubernetes-validate carries: the manifests must be valid on both.
K8S_VERSIONS = ("1.30.0", "latest")
# the Prometheus Operator's CRDs are not in Kubernetes' schema: checked against their documented fields
CUSTOM = {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}


@functools.cache
def _documents() -> str:
    return json.dumps(_read_documents())


def documents() -> list[tuple[str, dict[str, Any]]]:
    """Every manifest (a fresh copy each call: a test may change what it gets)."""
    return [tuple(x) for x in json.loads(_documents())]  # type: ignore[misc]


def _read_documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def find(kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)


def go_duration(text: str) -> float:
    """Seconds of a Go duration (time.ParseDuration, the units NPD's configuration uses)."""
    parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)(h|m|s|ms))+", text)
    assert parts, f"{text!r} is not a Go duration"
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(h|m|s|ms)", text))


def quantity_mib(q: str) -> float:
    m = re.fullmatch(r"(\d+)(Mi|Gi)", q)
    assert m, q
    return int(m.group(1)) * (1024 if m.group(2) == "Gi" else 1)


def test_every_manifest_is_valid_kubernetes_and_kustomize_lists_them_all() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    docs = documents()
    assert {d["kind"] for _, d in docs} >= {"Namespace", "ConfigMap", "DaemonSet", "Service", "ServiceAccount",
                                            "ClusterRole", "ClusterRoleBinding", "PodMonitor", "PrometheusRule"}
    for version in K8S_VERSIONS:
        v = kv.latest_version() if version == "latest" else version
        for _, doc in docs:
            if (doc["apiVersion"], doc["kind"]) in CUSTOM:
                continue
            kv.validate(doc, v, strict=True)  # raises ValidationError (with the path) on a bad field
    # a misspelt field is caught, not ignored: the check can fail
    bad = json.loads(json.dumps(find("DaemonSet", "gpud")))
    bad["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
    assert {i["name"] for i in kust["images"]} == {c["image"] for _, d in docs if d["kind"] == "DaemonSet"
                                                  for c in d["spec"]["template"]["spec"]["initContainers"]
                                                  + d["spec"]["template"]["spec"]["containers"]}


def test_the_prometheus_rule_is_gpud_rules_yml_and_both_carry_the_label_kube_prometheus_stack_selects() -> None:
    """The same alert rules in a cluster: grafana/generate.py writes prometheusrule.yaml from gpud-rules.yml
    (run it after changing the rules); kube-prometheus-stack's default selectors take the objects labelled
    with its release's name, which the PodMonitor and the PrometheusRule carry (kube-prometheus-stack's
    values: podMonitorSelectorNilUsesHelmValues, ruleSelectorNilUsesHelmValues, both true by default)."""
    sys.path.insert(0, str(REPO / "grafana"))
    import generate

    assert (K8S / "prometheusrule.yaml").read_text() == generate.prometheus_rule()
    rule = find("PrometheusRule", "gpud")
    assert rule["spec"] == yaml.safe_load((REPO / "grafana" / "prometheus" / "gpud-rules.yml").read_text())
    assert set(rule["spec"]) == {"groups"}
    assert all(set(g) <= {"name", "interval", "rules"} for g in rule["spec"]["groups"])
    for kind in ("PodMonitor", "PrometheusRule"):
        assert find(kind, "gpud")["metadata"]["labels"]["release"] == "kube-prometheus-stack", kind
    rendered = subprocess.run([kubectl(), "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    assert any(d and d["kind"] == "PrometheusRule" for d in yaml.safe_load_all(rendered.stdout))


def test_the_agents_tolerate_every_noschedule_taint_as_npd_does() -> None:
    for name in ("gpud", "gpud-node-problem-detector"):
        tolerations = find("DaemonSet", name)["spec"]["template"]["spec"]["tolerations"]
        assert {"operator": "Exists", "effect": "NoSchedule"} in tolerations, name
        assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in tolerations, name


def test_the_pod_monitor_has_the_operators_fields_and_scrapes_the_named_port() -> None:
    pm = find("PodMonitor", "gpud")
    assert set(pm["spec"]) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels"}
    ds = find("DaemonSet", "gpud")
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"] for p in ds["spec"]["template"]["spec"]["containers"][0]["ports"]}
    for ep in pm["spec"]["podMetricsEndpoints"]:
        assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings",
                           "scheme", "honorLabels"}
        assert ep["port"] in ports and ep["path"] == "/metrics"
        go_duration(ep["interval"])
    svc = find("Service", "gpud")
    assert svc["spec"]["selector"] == pm["spec"]["selector"]["matchLabels"]
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports


def test_the_daemonset_runs_on_nvidia_nodes_without_privilege() -> None:
    ds = find("DaemonSet", "gpud")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert pod["hostPID"] is False and not pod.get("hostNetwork") and not pod["automountServiceAccountToken"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")
    # the init container alone is root, with CHOWN alone, to hand the node's state directory over
    (init,) = pod["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    # every host path but the state directory is read-only, and GPUD_ROOT points at them
    env = {e["name"]: e.get("value") for e in c["env"]}
    host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for m in c["volumeMounts"]:
        if m["name"] in host and m["mountPath"] != env["GPUD_STATE_DIR"]:
            assert m["readOnly"] is True, m
            assert m["mountPath"] == env["GPUD_ROOT"] + host[m["name"]], m
    assert {"/proc", "/sys"} <= set(host.values())
    # liveness and readiness ask /healthz on the metrics port; no CPU limit (a throttled daemon misses ticks)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert "cpu" not in c["resources"]["limits"] and c["resources"]["requests"]["memory"]


def test_both_agents_mount_every_kernel_log_source_gpud_reads_where_gpud_reads_it() -> None:
    """gpud.hw.host reads the kernel log under GPUD_ROOT: the syslog files and the persistent journal in
    /var/log, the volatile journal in /run/log/journal (gpud.hw.journald's JOURNAL_DIRS), each read-only,
    with group adm (the journal's ACL, kern.log's group) among the pod's groups."""
    from gpud.hw.host import KERNEL_LOG_FILES
    from gpud.hw.journald import JOURNAL_DIRS

    for name in ("gpud", "gpud-node-problem-detector"):
        pod = find("DaemonSet", name)["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        root = {e["name"]: e.get("value") for e in c["env"]}["GPUD_ROOT"]
        host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
        mounted = {host[m["name"]] for m in c["volumeMounts"] if m["name"] in host and m.get("readOnly")
                   and m["mountPath"] == root + host[m["name"]]}
        for path in (*JOURNAL_DIRS, *KERNEL_LOG_FILES):
            assert any(path == m or path.startswith(m + "/") for m in mounted), (name, path, mounted)
        assert 4 in pod["securityContext"]["supplementalGroups"], name


def test_the_image_the_manifests_and_gpud_toml_agree() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    user = re.search(r"^USER (\d+):(\d+)$", text, re.M)
    runs = " ".join(re.findall(r"^RUN .*$", text, re.M))
    assert user and "torch" not in runs and "[probe]" not in runs  # the daemon needs no torch
    port = int(re.search(r"^EXPOSE (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    toml = find("ConfigMap", "gpud-config")["data"]["gpud.toml"]
    assert f'listen = ":{port}"' in toml
    for name in ("gpud", "gpud-node-problem-detector"):
        pod = find("DaemonSet", name)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsUser"] == int(user.group(1))
        assert f"chown {user.group(1)}:{user.group(2)} " in pod["initContainers"][0]["command"][-1]
    c = find("DaemonSet", "gpud")["spec"]["template"]["spec"]["containers"][0]
    assert c["ports"][0]["containerPort"] == port
    assert c["args"][-1] == "/etc/gpud/gpud.toml"
    npd = json.loads(find("ConfigMap", "gpud-node-problem-detector")["data"]["gpud-health.json"])
    assert {r["path"] for r in npd["rules"]} == {entry[0]}
    # the image copies only what the package needs
    for src in re.findall(r"^COPY (?!--from)(.+) /src/?\S*$", text, re.M):
        for part in src.split():
            assert (REPO / part).exists(), part


def test_the_configmaps_gpud_toml_loads_and_the_probes_healthz_answers(tmp_path: Path) -> None:
    """The container's own command line and configuration, on a simulated 8-GPU node: /healthz
    answers 200 within the startup probe's budget, and /metrics serves gpud's series."""
    c = find("DaemonSet", "gpud")["spec"]["template"]["spec"]["containers"][0]
    conf = tmp_path / "gpud.toml"
    conf.write_text(find("ConfigMap", "gpud-config")["data"]["gpud.toml"])
    from gpud import config

    config.load(str(conf))  # raises InvalidInput (file: key: reason) if the ConfigMap's file is wrong
    port = free_port()
    env = {**os.environ, "GPUD_SIMULATE": "hgx-8x-h200", "GPUD_STATE_DIR": str(tmp_path / "state"),
           "GPUD_SOCKET": str(tmp_path / "gpud.sock")}
    args = [a if a != "/etc/gpud/gpud.toml" else str(conf) for a in c["args"]]
    proc = subprocess.Popen([sys.executable, "-m", "gpud", *args, "--listen", f"127.0.0.1:{port}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    budget = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    try:
        deadline, answer = time.monotonic() + budget, None
        while time.monotonic() < deadline and answer is None:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    answer = (r.status, r.read().decode())
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        assert answer is not None and answer[0] == 200 and answer[1].startswith("ok: last tick"), answer
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert body.count("gpud_gpu_info{") == 8
    finally:
        proc.terminate()
        proc.wait(timeout=20)


# -- Node Problem Detector ------------------------------------------------------------------------

# NPD's custom-plugin-monitor fields (kubernetes/node-problem-detector pkg/custompluginmonitor/types:
# CustomPluginConfig, pluginGlobalConfig, CustomRule; pkg/types Condition)
NPD_TOP = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
NPD_PLUGIN = {"invoke_interval", "timeout", "max_output_length", "concurrency",
              "enable_message_change_based_condition_update", "skip_initial_status"}
NPD_RULE = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}
NPD_CONDITION = {"type", "reason", "message"}
PROLOG_LIMIT = 200  # gpud doctor --prolog: one line of at most 200 characters on failure


def npd_config() -> dict[str, Any]:
    return json.loads(find("ConfigMap", "gpud-node-problem-detector")["data"]["gpud-health.json"])


def test_the_npd_plugin_configuration_follows_npds_format() -> None:
    cfg = npd_config()
    assert set(cfg) <= NPD_TOP and cfg["plugin"] == "custom" and cfg["source"]
    pc = cfg["pluginConfig"]
    assert set(pc) <= NPD_PLUGIN
    global_timeout = go_duration(pc["timeout"])
    go_duration(pc["invoke_interval"])
    # NPD cuts the message at max_output_length (default 80): the prolog's whole line must fit
    assert pc["max_output_length"] >= PROLOG_LIMIT and pc["concurrency"] == 1
    conditions = {c["type"]: c for c in cfg["conditions"]}
    for c in cfg["conditions"]:
        assert set(c) == NPD_CONDITION
    for rule in cfg["rules"]:
        assert set(rule) <= NPD_RULE and rule["type"] in ("permanent", "temporary")
        # NPD's Validate: a permanent rule's condition needs a default condition; no rule outlasts the global timeout
        if rule["type"] == "permanent":
            assert rule["condition"] in conditions
        assert go_duration(rule["timeout"]) <= global_timeout
        assert go_duration(rule["timeout"]) > 10  # the prolog's own 10 s, and the interpreter's start
        assert rule["args"][:2] == ["doctor", "--prolog"]
    ds = find("DaemonSet", "gpud-node-problem-detector")["spec"]["template"]["spec"]
    (c,) = ds["containers"]
    flag = next(a for a in c["args"] if a.startswith("--config.custom-plugin-monitor="))
    mount = next(m for m in c["volumeMounts"] if flag.split("=", 1)[1].startswith(m["mountPath"] + "/"))
    volume = next(v for v in ds["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == "gpud-node-problem-detector"
    assert "NODE_NAME" in {e["name"] for e in c["env"]}  # NPD's node, from the downward API
    role = find("ClusterRole", "gpud-node-problem-detector")
    assert {"nodes/status"} in [set(r["resources"]) for r in role["rules"] if "patch" in r["verbs"]]


@pytest.mark.parametrize("machine, fit", [("z8-fury-4x-a6000", True), ("z8-fury-4x-a6000-degraded", False)])
def test_the_npd_check_on_a_simulated_node_gives_npds_exit_status_and_one_line(tmp_path: Path, machine: str,
                                                                            fit: bool) -> None:
    """The rule's command, as NPD runs it (its arguments, its timeout), with gpud of this checkout for
    the image's path and the simulated machine chosen the way gpud always chooses it (GPUD_SIMULATE)."""
    cfg = npd_config()
    (rule,) = cfg["rules"]
    gpud = shutil.which("gpud", path=os.path.dirname(sys.executable)) or ""
    conf = tmp_path / "gpud.toml"
    conf.write_text(find("ConfigMap", "gpud-config")["data"]["gpud.toml"])
    args = [a if a != "/etc/gpud/gpud.toml" else str(conf) for a in rule["args"]]
    env = {**os.environ, "GPUD_SIMULATE": machine, "GPUD_STATE_DIR": str(tmp_path / "state"),
           "GPUD_SOCKET": str(tmp_path / "gpud.sock")}
    t0 = time.monotonic()
    r = subprocess.run([gpud, *args], env=env, capture_output=True, text=True, timeout=go_duration(rule["timeout"]))
    if r.returncode == 2 and "--prolog" in r.stderr:
        pytest.skip("this gpud has no `doctor --prolog` yet (the health states' work brings it)")
    assert time.monotonic() - t0 <= 10.0 + 2.0  # the prolog's 10 s, and the interpreter's start
    # NPD: exit 0 → OK, 1 → NonOK (the condition's message: stdout, trimmed, cut at max_output_length)
    assert r.returncode == (0 if fit else 1), r.stderr
    if not fit:
        lines = r.stdout.strip().splitlines()
        assert len(lines) == 1 and 0 < len(lines[0]) <= min(PROLOG_LIMIT, cfg["pluginConfig"]["max_output_length"])


# -- pod attribution (docs/deployment.md, "Which pod is using a GPU") ------------------------------

UID = "0f3c6a2e-5b1d-4c8e-9a7f-2d4e6b8c0a1f"
CID = "4b825dc642cb6eb9a060e54bf8d69288fbee4904a1b2c3d4e5f60718293a4b5c"


@pytest.mark.parametrize("cgroup", [
    # systemd driver, cgroup v2: containerd, CRI-O, cri-dockerd
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope",
    f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
    f"crio-{CID}.scope",
    f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope",  # Guaranteed
    # read from a container with its own cgroup namespace: relative to the reader's cgroup
    f"0::/../../kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope",
    # systemd driver, cgroup v1: one line per controller
    f"12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope\n1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
    # cgroupfs driver, v1 and v2
    f"4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}",
    f"0::/kubepods/pod{UID}/{CID}",
])
def test_a_pods_process_is_attributed_to_its_pod_uid_in_every_layout(cgroup: str) -> None:
    from gpud.procinfo import workload

    assert workload(cgroup) == f"pod:{UID}"


def test_a_host_process_seen_from_a_pods_cgroup_namespace_keeps_its_unit() -> None:
    from gpud.procinfo import workload

    assert workload("0::/../../../../system.slice/jupyter.service") == "unit:jupyter.service"


# -- the rendered manifests' shell commands, under their own securityContext -----------------------

# how the kubelet finds a missing hostPath (DirectoryOrCreate: root:root 0755), and states a later start
# may find: gpud's already, with another mode (someone's chmod, a setgid bit), another user's
START_STATES = [(0, 0, 0o755), (10909, 10909, 0o750), (10909, 10909, 0o700), (10909, 10909, 0o2755),
                (1000, 1000, 0o777)]
SHELLS = ("/bin/sh", "/bin/bash", "sh", "bash")
SANDBOX_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is missing (Debian's kubernetes-client package)")
        pytest.skip("kubectl not installed (Debian's kubernetes-client package): no `kubectl kustomize`")
    return path


def setpriv() -> str:
    path = shutil.which("setpriv")
    if path is None and os.environ.get("CI") == "true":
        pytest.fail("setpriv is missing (util-linux)")
    if path is None:
        pytest.skip("setpriv not installed (util-linux)")
    if os.geteuid() != 0:
        pytest.skip("running a container's command as its user and capabilities needs root")
    return path


@functools.cache
def _rendered(tool: str) -> str:
    r = subprocess.run([tool, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def rendered() -> list[dict[str, Any]]:
    """What `kubectl apply -k deploy/kubernetes` sends: kustomize's rendering, not the files."""
    return [d for d in yaml.safe_load_all(_rendered(kubectl())) if d is not None]


def shell_containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(DaemonSet/container, pod spec, container) for every container whose command is a shell's -c."""
    out = []
    for d in docs:
        if d["kind"] != "DaemonSet":
            continue
        pod = d["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            cmd = c.get("command") or []
            if len(cmd) >= 3 and cmd[0] in SHELLS and cmd[1] == "-c":
                out.append((f"{d['metadata']['name']}/{c['name']}", pod, c))
    return out


def sandbox(tool: str, pod: dict[str, Any], c: dict[str, Any]) -> tuple[list[str], int, int]:
    """setpriv's arguments for exactly the user, groups and capabilities the container is given: the
    container's runAsUser/runAsGroup over the pod's, the pod's supplementalGroups, and with
    `drop: [ALL]` the capability set is exactly `add` (effective for root only: the runtime sets no
    ambient capabilities, so a non-root command has none). Returns (argv, uid, CapEff's mask)."""
    psc, sc = pod.get("securityContext", {}), c.get("securityContext", {})
    uid, gid = sc.get("runAsUser", psc.get("runAsUser")), sc.get("runAsGroup", psc.get("runAsGroup"))
    assert uid is not None and gid is not None, f"{c['name']}: the image's USER would decide"
    assert not (uid == 0 and sc.get("runAsNonRoot", psc.get("runAsNonRoot"))), "the kubelet refuses root here"
    assert not sc.get("privileged"), c["name"]
    caps = sc.get("capabilities", {})
    assert [x.upper() for x in caps.get("drop", [])] == ["ALL"], f"{c['name']}: the runtime's default set applies"
    add = sorted({x.upper().removeprefix("CAP_").lower() for x in caps.get("add", [])})
    names = subprocess.run([tool, "--list-caps"], capture_output=True, text=True, check=True).stdout.split()
    mask = sum(1 << names.index(a) for a in add) if uid == 0 else 0
    groups = psc.get("supplementalGroups", [])
    argv = [tool, f"--reuid={uid}", f"--regid={gid}",
            f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups",
            "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=" + ",".join(["-all", *(f"+{a}" for a in add)])]
    if sc.get("allowPrivilegeEscalation") is False:
        argv.append("--no-new-privs")
    return argv, uid, mask


@pytest.mark.parametrize("start", START_STATES, ids=lambda s: f"{s[0]}:{s[1]}:{s[2]:o}")
def test_every_shell_command_runs_under_its_own_user_and_capabilities_on_every_start(
        start: tuple[int, int, int]) -> None:
    """The rendered DaemonSets' shell commands (the state-owner init containers; gpud and NPD run
    binaries) run under setpriv with their securityContext's user, groups and capabilities, each
    mount a directory standing in for its path: twice (the first start, then a restart on what the
    first left), exit 0 both times; the state directory ends gpud's user's, mode 0750, and the main
    container's user (no capabilities) can write there."""
    tool = setpriv()
    docs = rendered()
    found = shell_containers(docs)
    assert {n for n, _, _ in found} >= {"gpud/state-owner", "gpud-node-problem-detector/state-owner"}, found
    base = Path(tempfile.mkdtemp(prefix="gpud-k8s-"))  # under /tmp: gpud's user must reach the state directory
    try:
        base.chmod(0o755)
        for n, (name, pod, c) in enumerate(found):
            argv, uid, mask = sandbox(tool, pod, c)
            env = {"PATH": SANDBOX_PATH}
            r = subprocess.run([*argv, "--", "/bin/sh", "-c", "grep ^CapEff: /proc/self/status"], env=env,
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0 and int(r.stdout.split()[1], 16) == mask, (name, r.stdout, r.stderr)
            main = pod["containers"][0]
            state = next(e["value"] for e in main["env"] if e["name"] == "GPUD_STATE_DIR")
            dirs = {}
            for m in c.get("volumeMounts", []):
                d = base / f"{n}-{m['name']}"
                d.mkdir()
                os.chown(d, *(start[:2] if m["mountPath"] == state else (0, 0)))
                d.chmod(start[2] if m["mountPath"] == state else 0o755)
                dirs[m["mountPath"]] = d
            script = c["command"][2]
            for path in sorted(dirs, key=len, reverse=True):
                script = script.replace(path, str(dirs[path]))
            for attempt in ("first start", "restart"):
                r = subprocess.run([*argv, "--", *c["command"][:2], script, *c["command"][3:]], env=env,
                                   capture_output=True, text=True, timeout=30)
                assert r.returncode == 0, f"{name}, {attempt}: exit {r.returncode}: {r.stderr.strip()}"
            if state in dirs:
                st = os.stat(dirs[state])
                psc = pod["securityContext"]
                assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (psc["runAsUser"], psc["runAsGroup"], 0o750)
                user, _, _ = sandbox(tool, pod, main)
                probe = dirs[state] / "journal.probe"
                r = subprocess.run([*user, "--", "/bin/sh", "-c", f"echo x > {probe} && rm {probe}"], env=env,
                                   capture_output=True, text=True, timeout=30)
                assert r.returncode == 0, f"{name}: gpud's user cannot write its state directory: {r.stderr}"
    finally:
        shutil.rmtree(base)
