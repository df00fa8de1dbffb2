"""One launch of the probe: a process per rank (a file-store rendezvous in a private directory, data
planes on loopback), waited for with a timeout and the P2P pairs' deadlines; what a failed launch
measured is kept, and a pair that hung is named with ACS as its likely cause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from gpud.child import environment, python
from gpud.errors import GpudError
from gpud.hw.machine import Machine
from gpud.probe.errors import ProbeError
from gpud.probe.monitor import LoadMonitor, acs_above
from gpud.probe.nccl import parse_nccl_transports

ACS_HANG = ("ACS on a PCIe bridge above the GPUs redirects peer-to-peer requests through the root complex, "
            "where they are slow or never complete (NCCL troubleshooting, \"PCI Access Control Services\"): "
            "`gpud doctor --check pcie.acs`, `sudo lspci -vvv | grep ACSCtl`")
TEARDOWN_GRACE = 10.0  # seconds the ranks get to exit once the result is written


def rank_env(spec: dict[str, Any], world: int, rank: int, workdir: Path, gpus: int | None,
             environ: dict[str, str] | None = None) -> dict[str, str]:
    """One rank's environment (``gpud.child.environment``: only what a rank needs): its rank, PCI bus
    order, the data planes on loopback alone (Gloo's and NCCL's bootstrap sockets; the rendezvous itself is
    a file store, ``spec["store"]``), its own temporary directory, and on GPUs NCCL's INFO output in a
    file per rank (the transports are read back from it; the user's NCCL_DEBUG settings win)."""
    env = environment(base=os.environ if environ is None else environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "TORCHELASTIC_RUN_ID"):
        env.pop(k, None)
    env |= {"WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(rank), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "TMPDIR": str(workdir),
            "OMP_NUM_THREADS": str(spec.get("threads_per_rank", 1))}
    if spec["device"] == "cuda":
        if gpus is not None and "CUDA_VISIBLE_DEVICES" not in env:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
        if "NCCL_DEBUG" not in env:
            env |= {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}
        if "NCCL_DEBUG_FILE" not in env:
            env["NCCL_DEBUG_FILE"] = str(workdir / f"nccl-ws{world}-rank{rank}.log")
    return env


def launch(spec: dict[str, Any], world: int, timeout: float, workdir: Path, gpus: int | None = None,
           affinity: list[list[int]] | None = None, pids: set[int] | None = None) -> dict[str, Any]:
    """Start one process per rank (loopback rendezvous), wait with a timeout, return rank 0's JSON.

    The collectives' own timeout is half the launch's, so a hang ends in a rank's error naming the
    collective, not in the launch's kill. Once rank 0 has written its result, a tear-down that hangs
    is killed after a grace period and does not fail the probe."""
    out = workdir / f"ws{world}-{'-'.join(spec['tasks'])}.json"
    progress = out.with_suffix(".progress")
    progress.unlink(missing_ok=True)
    partial = Path(str(out) + ".partial")
    partial.unlink(missing_ok=True)
    spec = {**spec, "out": str(out), "timeout": timeout, "collective_timeout": max(5.0, timeout / 2),
            "progress": str(progress)}
    spec_file = out.with_suffix(".spec.json")
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    store = workdir / f"ws{world}-{'-'.join(spec['tasks'])}.store"  # a file store: nothing listens for it
    store.unlink(missing_ok=True)
    spec["store"] = str(store)
    for rank in range(world):
        log = open(workdir / f"ws{world}-rank{rank}.log", "wb")
        logs.append(log)
        env = rank_env(spec, world, rank, workdir, gpus)
        rank_spec = spec | ({"cpus": affinity[rank]} if affinity and rank < len(affinity) and affinity[rank] else {})
        rank_file = spec_file.with_suffix(f".{rank}.json")
        rank_file.write_text(json.dumps(rank_spec))
        argv = python("-W", "ignore", "-m", "gpud.probe.worker", str(rank_file))
        procs.append(subprocess.Popen(argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        if pids is not None:
            pids.add(procs[-1].pid)
    deadline = time.monotonic() + timeout
    failed = None
    culprit = 0
    written_at: float | None = None
    lingering: list[int] = []
    hung: dict[str, Any] | None = None
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            hung = _overdue(progress)
            if hung is not None and written_at is None:
                failed = (f"P2P GPU{hung['p2p_pair'][0]}→GPU{hung['p2p_pair'][1]} hung (no result within "
                          f"{hung['deadline_seconds']:.0f} s)")
                break
            if written_at is None and out.is_file():
                written_at = now
            if written_at is not None and now - written_at > TEARDOWN_GRACE:
                lingering = [k for k, p in enumerate(procs) if p.poll() is None]
                break
            if now > deadline:
                failed = f"timed out after {timeout:.0f} s"
                break
            bad = [p for p in procs if p.poll() not in (None, 0)]
            if bad and written_at is None:
                time.sleep(0.2)  # let the other ranks notice, so the first failure is the one reported
                bad = sorted((p for p in procs if p.poll() not in (None, 0)), key=lambda p: -p.returncode)
                culprit = procs.index(bad[0])
                failed = f"rank {culprit} exited with {bad[0].returncode}"
                break
            time.sleep(0.05)
        if failed is None and written_at is None and not out.is_file():
            bad = [p for p in procs if p.returncode not in (None, 0)]
            if bad:
                culprit = procs.index(bad[0])
                failed = f"rank {culprit} exited with {bad[0].returncode}"
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()  # reaped: no zombie
        for log in logs:
            log.close()
    if failed is not None or not out.is_file():
        tail = "" if hung else (workdir / f"ws{world}-rank{culprit}.log").read_text(errors="replace")[-2000:]
        kept = json.loads(partial.read_text()) if partial.is_file() else None
        raise ProbeError(f"world size {world} ({', '.join(spec['tasks'])}): {failed or 'no result written'}"
                         + (f"\n{tail}" if tail.strip() else ""), kept, hung, workdir)
    data: dict[str, Any] = json.loads(out.read_text())
    if lingering:
        data["teardown_killed_ranks"] = lingering
    text = "".join(f.read_text(errors="replace") for f in sorted(workdir.glob(f"nccl-ws{world}-rank*.log")))
    data["nccl_transports"] = parse_nccl_transports(text)
    return data


def _overdue(progress: Path) -> dict[str, Any] | None:
    """The step rank 0 announced last (a P2P pair) when it has run past its deadline, else None."""
    try:
        lines = progress.read_text().splitlines()
        last: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return None
    deadline = last.get("deadline_seconds")
    if isinstance(deadline, (int, float)) and time.time() - float(last.get("at", time.time())) > deadline:
        return last
    return None


def launch_kept(spec: dict[str, Any], n: int, limit: float, workdir: Path, gpus: int | None,
                 affinity: list[list[int]], monitor: LoadMonitor, failures: list[str],
                 machine: Machine | None) -> list[dict[str, Any]]:
    """One planned launch; when it fails or times out, what its rank 0 had measured is kept and the
    failure is said in ``failures``. A P2P pair that hangs is killed at its deadline and the copies start
    again after it (its reverse skipped too: the same path), within the launch's time."""
    kept: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit
    skip: list[list[int]] = []
    while True:
        try:
            kept.append(launch(spec, n, max(1.0, deadline - time.monotonic()), workdir, gpus, affinity, monitor.ours))
            return kept
        except ProbeError as err:
            if err.partial:
                kept.append(err.partial)
            if err.hung is None:
                lines = [x.strip() for x in str(err).splitlines() if x.strip()]
                why = f": {lines[-1]}" if len(lines) > 1 else ""
                failures.append(f"{lines[0] if lines else err}{why}" + (f" (the ranks' logs: {err.logs})"
                                                                          if err.logs else ""))
                return kept
            a, b = err.hung["p2p_pair"]
            failures.append(hung_sentence(err.hung, machine))
            skip += [[a, b], [b, a]]
            done = (err.partial or {}).get("p2p", {}).get("pairs", [])
            spec = spec | {"p2p_skip": skip, "p2p_done": done}
            if deadline - time.monotonic() < 5:
                failures.append("P2P: the pairs after the one that hung were not measured (launch time used up)")
                return kept


def hung_sentence(hung: dict[str, Any], machine: Machine | None) -> str:
    """'P2P GPU a→b hung' in NVML's numbering where the GPUs' UUIDs are known, with ACS as the likely cause
    and the bridges with ACS on above either GPU."""
    a, b = hung["p2p_pair"]
    acs: dict[int, list[str]] = {}
    if machine is not None:
        try:
            by_uuid = {g.uuid: g.index for g in machine.snapshot().gpus}
            a, b = by_uuid.get(hung.get("src_uuid") or "", a), by_uuid.get(hung.get("dst_uuid") or "", b)
            acs = acs_above(machine)
        except GpudError:
            pass
    seen = [f"GPU{g}: {', '.join(acs[g])}" for g in (a, b) if acs.get(g)]
    return (f"P2P GPU{a}→GPU{b} hung: its copies did not finish within {hung['deadline_seconds']:.0f} s; "
            + ACS_HANG + (f"; ACS is on above {'; '.join(seen)}" if seen else ""))
