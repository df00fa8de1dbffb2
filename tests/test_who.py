"""Who uses the GPUs: processes with user, container or job (from /proc/PID/cgroup), graphics
processes, `gpud ps`, and `gpud select` choosing idle, well-connected GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, run_gpud

from gpud.model import GpuProcess, GpuSample, MigInstance, Snapshot, Topology, Versions
from gpud.picker import choose
from gpud.procinfo import workload

DEGRADED = {"GPUD_SIMULATE": "z8-fury-4x-a6000-degraded"}


@pytest.mark.parametrize(("cgroup", "expected"), [
    ("0::/system.slice/docker-3f9c2a1b7d4e8f6a0b5c9d2e1f3a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a.scope\n",
     "docker:3f9c2a1b7d4e"),
    ("12:memory:/docker/3f9c2a1b7d4e8f6a0b5c9d2e1f3a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a\n"
     "1:name=systemd:/docker/3f9c2a1b7d4e8f6a0b5c9d2e1f3a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a\n",
     "docker:3f9c2a1b7d4e"),
    ("0::/user.slice/user-1000.slice/user@1000.service/user.slice/"
     "libpod-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope/container\n",
     "user-unit:libpod-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope"),  # rootless: the
    ("0::/machine.slice/libpod-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope/container\n",
     "podman:0123456789ab"),  # user's own name for it, never a container id; rootful: the container
    ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_0000_4111_8222_123456789abc.slice/"
     "cri-containerd-00ff.scope\n", "pod:1a2b3c4d-0000-4111-8222-123456789abc"),
    ("11:devices:/kubepods/besteffort/pod1a2b3c4d-0000-4111-8222-123456789abc/abcdef\n",
     "pod:1a2b3c4d-0000-4111-8222-123456789abc"),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n", "slurm:4242"),
    ("7:cpuset:/slurm/uid_1001/job_77/step_batch\n", "slurm:77"),
    ("0::/system.slice/jupyterhub.service\n", "unit:jupyterhub.service"),
    ("0::/user.slice/user-1001.slice/session-4.scope\n", "unit:session-4.scope"),
    ("0::/\n", None),
    ("", None),
])
def test_workload_from_cgroup(cgroup: str, expected: str | None) -> None:
    assert workload(cgroup) == expected


def test_ps_names_two_users_and_a_container_on_the_degraded_z8(state_dir) -> None:
    r = run_gpud("ps", "--json", env=DEGRADED)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["processes"]
    got = {(p["gpu"], p["pid"], p["user"], p["kind"], p["container"], p["used_memory_bytes"] >> 20) for p in rows}
    assert got == {(1, 48213, "alice", "compute", "unit:session-1.scope", 40960),
                   (2, 60112, "carol", "compute", "docker:3f9c2a1b7d4e", 8192),
                   (3, 51877, "bob", "compute", "unit:session-1.scope", 30720)}
    # The trainers have SM samples; carol's notebook on an idle GPU has none since the last read: no figure, not 0.
    sm = {p["pid"]: p["sm_utilization_percent"] for p in rows}
    assert sm[60112] is None and sm[48213] == 100 and sm[51877] == 100
    table = run_gpud("ps", env=DEGRADED)
    assert table.returncode == 0, table.stderr
    assert "docker:3f9c2a1b7d4e" in table.stdout and "alice" in table.stdout and "python finetune.py" in table.stdout
    assert "SM" in table.stdout and "100%" in table.stdout


def _desc(tmp_path: Path, processes: str, extra: str = "", utilization: int = 0) -> str:
    """The healthy Z8 (bridges 0-1 and 2-3) with processes on GPU0 (at this utilisation)."""
    text = (REPO / "gpud/sim/descriptions/z8-fury-4x-a6000.toml").read_text()
    marker = 'bus_id = "0000:16:00.0"'
    assert text.count(marker) == 1
    text = text.replace('name = "z8-fury-4x-a6000"', 'name = "z8-who"').replace(
        marker, f"{marker}\nprocesses = [{processes}]"
        + (f"\nutilization_percent = {utilization}" if utilization else ""))
    path = tmp_path / "z8-who.toml"
    path.write_text(text + extra)
    return str(path)


def test_graphics_processes_are_listed_and_merged_with_compute(tmp_path: Path) -> None:
    desc = _desc(tmp_path, '{ pid = 2001, used_mib = 300, user = "root", uid = 0, command = "/usr/lib/xorg/Xorg :0", '
                           'graphics = true }, { pid = 2002, used_mib = 1000, slurm_job = 4242 }')
    r = run_gpud("ps", "--json", env={"GPUD_SIMULATE": desc})
    assert r.returncode == 0, r.stderr
    rows = {p["pid"]: p for p in json.loads(r.stdout)["processes"]}
    assert rows[2001]["kind"] == "graphics" and rows[2001]["user"] == "root"
    assert rows[2002]["kind"] == "compute" and rows[2002]["container"] == "slurm:4242"


def test_select_prefers_an_nvlink_pair_over_a_pcie_pair(tmp_path: Path) -> None:
    # GPU0 is busy (dave trains on it): GPUs 1, 2, 3 are idle; 1-2 are PCIe (NODE), 2-3 an NVLink pair.
    desc = _desc(tmp_path, '{ pid = 3001, used_mib = 1000, user = "dave", uid = 1004 }', utilization=100)
    r = run_gpud("select", "-n", "2", env={"GPUD_SIMULATE": desc})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "2,3"
    # The pair is the best connected one: the message says so (it once said "farthest pair: NVLink").
    assert "best-connected pair: NVLink" in r.stderr and "farthest" not in r.stderr
    three = run_gpud("select", "-n", "3", "--json", env={"GPUD_SIMULATE": desc})
    assert json.loads(three.stdout)["gpus"] == [1, 2, 3]
    assert json.loads(three.stdout)["reason"] == ("3 idle GPU(s), best-connected pair: NVLink, "
                                                  "farthest pair: same NUMA node")
    uuids = run_gpud("select", "-n", "2", "--uuid", env={"GPUD_SIMULATE": desc})
    assert uuids.stdout.strip().count("GPU-") == 2


def test_the_thresholds_decide_not_the_presence_of_a_process(tmp_path: Path) -> None:
    # GPU0 of a desktop: the display server, the shell and an idle notebook holding 8 GiB.
    desc = _desc(tmp_path, '{ pid = 2001, used_mib = 300, user = "root", uid = 0, command = "/usr/lib/xorg/Xorg :0", '
                           'graphics = true }, { pid = 2002, used_mib = 200, user = "erin", uid = 1005, '
                           'command = "/usr/bin/gnome-shell", graphics = true }, { pid = 2003, used_mib = 8192, '
                           'user = "erin", uid = 1005, command = "python -m jupyter lab" }')
    env = {"GPUD_SIMULATE": desc}
    r = run_gpud("select", "-n", "1", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["gpus"] == [0]
    # An A6000 has 48 GiB: 40 GiB are not left free beside the notebook: GPU1 is chosen, and why not GPU0 is said.
    big = run_gpud("select", "-n", "4", "--min-free-memory", "40g", env=env)
    assert big.returncode == 1 and "GPU0: 36.5 GiB free < 40.0 GiB (erin, root)" in big.stderr, big.stderr
    assert run_gpud("select", "-n", "1", "--min-free-memory", "40g", env=env).stdout.strip() == "1"
    # A training run at 100 % makes the GPU busy whatever it holds; --max-utilization 100 lets it through.
    busy = _desc(tmp_path, '{ pid = 3001, used_mib = 1000, user = "dave", uid = 1004 }', utilization=100)
    r = run_gpud("select", "-n", "4", env={"GPUD_SIMULATE": busy})
    assert r.returncode == 1 and "GPU0: utilisation 100 % > 10 % (dave)" in r.stderr, r.stderr
    assert run_gpud("select", "-n", "4", "--max-utilization", "100", env={"GPUD_SIMULATE": busy}).returncode == 0


def test_select_without_a_fit_exits_1_with_the_reason(state_dir) -> None:
    one = run_gpud("select", "-n", "1", env=DEGRADED)
    assert one.returncode == 0 and one.stdout.strip() == "0", one.stderr
    # carol's idle notebook (8 GiB) leaves GPU2 free; alice and bob train on GPU1 and GPU3.
    two = run_gpud("select", "-n", "2", env=DEGRADED)
    assert two.returncode == 0 and two.stdout.strip() == "0,2", two.stderr
    r = run_gpud("select", "-n", "3", env=DEGRADED)
    assert r.returncode == 1 and r.stdout == ""
    assert "2 of 4 GPU(s) free, 3 needed" in r.stderr and "GPU1: utilisation 100 % > 10 % (alice)" in r.stderr
    # GPU0 has 46068 MiB: asking for more free memory than that leaves nothing.
    big = run_gpud("select", "-n", "1", "--min-free-memory", "47GiB", env=DEGRADED)
    assert big.returncode == 1 and "GiB free <" in big.stderr
    bad = run_gpud("select", "--min-free-memory", "lots", env=DEGRADED)
    assert bad.returncode == 2


def test_select_waits_then_gives_up(state_dir) -> None:
    import time

    t0 = time.monotonic()
    r = run_gpud("select", "-n", "3", "--wait", "3", env=DEGRADED)
    assert r.returncode == 1 and time.monotonic() - t0 >= 3


def test_nvlink_error_counters_are_read_every_10_s_not_every_tick(state_dir) -> None:
    """The ECC totals and every link's error counters come in one field-value call a slow round, with the
    counts each counter's own call gives; a driver whose field values fail is asked counter by counter."""
    from gpud.backends import open_machine

    m = open_machine("z8-fury-4x-a6000")
    sim = m.simulation
    sim.machine.inject("nvlink_errors", gpu=0, link=1, counter="replay", per_second=50.0)
    own = {"nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetFieldValues"}
    before = {n: sim.library.called[n] for n in own}
    first = m.nvml.sample(0)
    assert first.nvlink_errors is not None and len(first.nvlink_errors) == 4 * 4  # 4 links, 4 counters
    errs = {(link, kind): n for link, kind, n in first.nvlink_errors}
    assert errs[(1, "replay")] > 0 and errs[(0, "replay")] == 0 and errs[(1, "crc_flit")] == 0
    assert sim.library.called["nvmlDeviceGetNvLinkErrorCounter"] == before["nvmlDeviceGetNvLinkErrorCounter"]
    assert sim.library.called["nvmlDeviceGetTotalEccErrors"] == before["nvmlDeviceGetTotalEccErrors"]
    calls = {n: sim.library.called[n] for n in own}
    m.nvml.sample(0)  # the next tick: served from the 10 s cache
    assert {n: sim.library.called[n] for n in own} == calls

    # The same counts through each counter's own call, where the field values are refused.
    other = open_machine("z8-fury-4x-a6000")
    other.simulation.machine.inject("nvlink_errors", gpu=0, link=1, counter="replay", per_second=50.0)
    other.simulation.machine.inject("unsupported", call="nvmlDeviceGetFieldValues", gpu=0)
    slow = other.nvml.sample(0)
    assert other.simulation.library.called["nvmlDeviceGetNvLinkErrorCounter"] == 16
    assert other.simulation.library.called["nvmlDeviceGetTotalEccErrors"] == (4 if slow.ecc_enabled else 0)
    assert [(link, kind) for link, kind, _ in slow.nvlink_errors or ()] == [(link, kind) for link, kind, _ in
                                                                            first.nvlink_errors]
    assert {(link, kind): n > 0 for link, kind, n in slow.nvlink_errors or ()} == {k: n > 0 for k, n in errs.items()}
    assert slow.ecc_errors == first.ecc_errors
    ada = open_machine("z8-fury-4x-rtx6000ada")  # PCIe only: no NVLink, no counters (absent, not 0)
    assert ada.nvml.sample(0).nvlink_errors is None


def test_a_gpu_process_is_looked_up_in_proc_once_while_it_stays(state_dir, monkeypatch) -> None:
    """User, command and container come from /proc/PID when a process first shows on a GPU, not on
    every tick; one that leaves the lists is forgotten (its pid may be reused)."""
    from gpud.backends import open_machine

    m = open_machine("z8-fury-4x-a6000-degraded")
    looked: list[int] = []
    real = m.host.process
    monkeypatch.setattr(m.host, "process", lambda pid: (looked.append(pid), real(pid))[1])
    first = m.snapshot()
    users = {p.pid: p.user for s in first.samples for p in s.processes or ()}
    assert sorted(looked) == sorted(users) and users[48213] == "alice"
    second = m.snapshot()
    assert sorted(looked) == sorted(users)  # not read again
    assert {p.pid: (p.user, p.container) for s in second.samples for p in s.processes or ()} == \
        {p.pid: (p.user, p.container) for s in first.samples for p in s.processes or ()}


def _mig_snapshot(instances_of: dict[int, tuple[MigInstance, ...] | None], util: dict[int, int | None]) -> tuple:
    """GPUs 0… as one snapshot and an all-NVLink topology: those in ``instances_of`` MIG-enabled with those
    instances (their processes on the GPU's list too, as gpud reads them), the others whole at ``util`` %."""
    samples = []
    for i in sorted(util):
        mig = instances_of.get(i, ()) if i in instances_of else None
        procs = tuple(p for m in mig or () for p in m.processes or ())
        samples.append(GpuSample(index=i, uuid=f"GPU-{i}", timestamp=0.0, utilization_gpu_percent=util[i],
                                 mig_mode=i in instances_of, mig_instances=mig, processes=procs,
                                 memory_total_bytes=80 << 30, memory_used_bytes=0, memory_free_bytes=80 << 30))
    n = len(samples)
    level = tuple(tuple("X" if a == b else "NV18" for b in range(n)) for a in range(n))
    topo = Topology(tuple(range(n)), level, level, level, level, level, level)
    return Snapshot(0.0, Versions("590.48.01", "13.1", "13.590"), (), tuple(samples)), topo


def _instance(index: int, gi: int, free_gib: int, pids: tuple[int, ...] = ()) -> MigInstance:
    procs = tuple(GpuProcess(pid, 1 << 30, "alice", "python train.py", gpu_instance_id=gi, compute_instance_id=0)
                  for pid in pids)
    return MigInstance(index, f"MIG-{gi}-{index}", gi, 0, "3g.40gb", 40 << 30, (40 - free_gib) << 30, 0,
                       free_gib << 30, procs)


def test_select_judges_a_mig_gpu_by_its_instances_not_its_missing_utilisation() -> None:
    """A MIG GPU's utilisation is Not Supported (None): it is not idle for that. One GPU asked for, no whole
    GPU idle: the free instance is chosen, named by its MIG UUID (CUDA_VISIBLE_DEVICES names no instance by
    index); a job running in the other instance keeps it out."""
    busy_one, free_one = _instance(0, 2, 29, pids=(4242,)), _instance(1, 3, 20)
    snap, topo = _mig_snapshot({0: (busy_one, free_one)}, {0: None, 1: 90})
    got = choose(snap, topo, 1)
    assert got.instances == ("MIG-3-1",) and got.gpus == (0,) and got.uuids == ("MIG-3-1",)
    assert "MIG instance 3g.40gb GI 3" in got.reason and "not the GPU" in got.reason
    # Not as a whole GPU, even when every instance is free: two GPUs cannot be two instances
    snap2, topo2 = _mig_snapshot({0: (free_one,), 1: (_instance(0, 1, 40),)}, {0: None, 1: None})
    two = choose(snap2, topo2, 2)
    assert two.gpus == () and "MIG enabled: CUDA sees its instances, not the GPU" in two.reason
    # Every instance busy, or too small for --min-free-memory: no fit, each instance's reason said
    snap3, topo3 = _mig_snapshot({0: (busy_one, free_one)}, {0: None})
    none = choose(snap3, topo3, 1, min_free_bytes=30 << 30)
    assert none.gpus == () and "GI 2/CI 0: 1 process(es) (alice)" in none.reason
    assert "GI 3/CI 0: 20.0 GiB free < 30.0 GiB" in none.reason
    # A whole idle GPU is preferred over an instance
    snap4, topo4 = _mig_snapshot({0: (free_one,)}, {0: None, 1: 0})
    assert choose(snap4, topo4, 1).gpus == (1,) and choose(snap4, topo4, 1).instances == ()


def test_select_and_ps_on_a_simulated_mig_gpu(tmp_path: Path) -> None:
    """Through the simulator (the same readers as on hardware): ps names each process's instance and its
    MIG UUID; select gives a one-GPU job the free MIG instance, by its MIG UUID, when no whole GPU is idle."""
    text = ('[machine]\nname = "mig-who"\n[gpu_defaults]\nmodel = "H200"\n[[gpu]]\nbus_id = "0000:17:00.0"\n'
            'root_port = "0000:16:01.0"\nmig_mode = true\nmig_instances = ['
            '{ gpu_instance_id = 2, profile = "3g.71gb", memory_mib = 71424 }, '
            '{ gpu_instance_id = 9, profile = "1g.18gb", memory_mib = 16384 }]\n'
            'processes = [{ pid = 5150, used_mib = 9000, user = "alice", gpu_instance_id = 2, '
            'compute_instance_id = 0 }]\n')
    desc = tmp_path / "mig-who.toml"
    desc.write_text(text)
    env = {"GPUD_SIMULATE": str(desc)}
    ps = run_gpud("ps", "--json", env=env)
    assert ps.returncode == 0, ps.stderr
    [row] = json.loads(ps.stdout)["processes"]
    assert (row["pid"], row["gpu_instance_id"], row["compute_instance_id"]) == (5150, 2, 0)
    assert row["mig_uuid"].startswith("MIG-")
    assert "0 GI2/CI0" in run_gpud("ps", env=env).stdout
    sel = run_gpud("select", "-n", "1", "--json", env=env)
    assert sel.returncode == 0, sel.stderr
    doc = json.loads(sel.stdout)
    assert doc["mig_instances"] == [doc["cuda_visible_devices"]] and doc["cuda_visible_devices"].startswith("MIG-")
    assert doc["cuda_visible_devices"] != row["mig_uuid"] and "1g.18gb GI 9" in doc["reason"]
    too_big = run_gpud("select", "-n", "1", "--min-free-memory", "20g", env=env)
    assert too_big.returncode == 1 and "MIG enabled" in too_big.stderr
