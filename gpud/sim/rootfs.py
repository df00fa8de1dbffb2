"""Lay out the simulated workstation's files (``/proc``, ``/sys``, ``/etc/X11``, kernel log).

``gpud.hw.host.Host`` reads this tree exactly as it reads ``/`` on a real machine.
"""

from __future__ import annotations

import atexit
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from gpud.sim.description import GpuSpec, MachineSpec, Xorg
from gpud.sim.faults import DEFAULT_XID_TEXT
from gpud.sim.jobs import PROCESS_KINDS, Process, running
from gpud.sim.machine import SimMachine
from gpud.sim.topology import downstream_port, host_bridge, link_state, node_cpus

ACS_ON = 0x001D  # SrcValid | ReqRedir | CmpltRedir | UpstreamFwd, what BIOSes set when "ACS enabled"
GT_S = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}
STAMP = ".gpud-sim-stamp"


def _write(root: Path, rel: str, text: str | bytes) -> None:
    """Write a file of the tree, its directories made only where the write finds them missing: a tree is
    about 360 files in 280 directories, and a ``mkdir`` ahead of every write answered "exists" for most of
    them (the suite builds about 900 trees a run)."""
    p = root / rel.lstrip("/")
    data = text if isinstance(text, bytes) else text.encode()
    try:
        p.write_bytes(data)
    except FileNotFoundError:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def _config_space(acs_ctrl: int | None) -> bytes:
    """4 KiB of PCIe config space: a header, and an ACS extended capability at 0x100."""
    cfg = bytearray(4096)
    cfg[0:4] = (0x10DE).to_bytes(2, "little") + (0).to_bytes(2, "little")
    if acs_ctrl is not None:
        header = 0x000D | (1 << 16)  # ACS, version 1, no next capability
        cfg[0x100:0x104] = header.to_bytes(4, "little")
        cfg[0x104:0x106] = (0x5F).to_bytes(2, "little")  # capabilities
        cfg[0x106:0x108] = acs_ctrl.to_bytes(2, "little")
    return bytes(cfg)


def stamp_of(sim: SimMachine) -> str:
    """What the tree is built from; processes starting and exiting are not in it (``sync_processes``
    updates their few files in place, not the whole tree)."""
    faults = [(f.kind, sorted(f.params.items())) for f in sim.faults if f.kind not in PROCESS_KINDS]
    return hashlib.sha256(json.dumps([sim.desc.digest, faults, sim.boot_id()], default=str).encode()).hexdigest()[:16]


def ensure_root(sim: SimMachine, dest: Path) -> Path:
    """Build the tree at ``dest`` unless it is already current; swap it in atomically."""
    stamp = stamp_of(sim)
    try:
        if (dest / STAMP).read_text() == stamp:
            sync_processes(sim, dest)
            return dest
    except OSError:
        pass
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        build(sim, tmp)
        _write(tmp, STAMP, stamp)
        old = dest.with_name(f"{dest.name}.{os.getpid()}.old")
        if dest.exists():
            os.rename(dest, old)
        os.rename(tmp, dest)
        shutil.rmtree(old, ignore_errors=True)
        return dest
    except OSError:
        # A full or read-only state directory: the machine's /proc and /sys are no files on its disk,
        # so the tree goes to a private temporary directory instead (removed when the process ends).
        shutil.rmtree(tmp, ignore_errors=True)
        return _private_root(sim, stamp)


_PRIVATE: dict[str, Path] = {}


def _private_root(sim: SimMachine, stamp: str) -> Path:

    root = _PRIVATE.get(sim.desc.name)
    if root is not None and (root / STAMP).is_file() and (root / STAMP).read_text() == stamp:
        sync_processes(sim, root)
        return root
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
    root = Path(tempfile.mkdtemp(prefix=f"gpud-sim-{sim.desc.name}-"))
    atexit.register(shutil.rmtree, root, True)
    build(sim, root)
    _write(root, STAMP, stamp)
    _PRIVATE[sim.desc.name] = root
    return root


def build(sim: SimMachine, root: Path) -> None:
    desc = sim.desc
    m = desc.machine
    _proc(root, m, desc.gpus)
    _cpus(root, m)
    _pci(root, sim)
    _iommu(root, m, len(desc.gpus))
    _xorg(root, desc.xorg)
    _kmsg(root, sim)
    _write(root, "/proc/sys/kernel/random/boot_id", sim.boot_id() + "\n")
    _write(root, "/proc/stat", f"cpu  0 0 0 0 0 0 0 0 0 0\nbtime {sim.boot_time()}\n")
    (root / "dev/shm").mkdir(parents=True, exist_ok=True)
    sync_processes(sim, root)


def _replace(root: Path, rel: str, text: str) -> None:
    """Write a file another process may be reading: whole or not at all (a temporary file renamed over
    it), and not at all when it already holds ``text``."""
    p = root / rel.lstrip("/")
    try:
        if p.read_text() == text:
            return
    except OSError:
        pass
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, p)


def sync_processes(sim: SimMachine, root: Path) -> None:
    """``/proc/PID`` (status with its name, uid and gid; stat with its start time; cmdline, cgroup) of every
    process running now, the
    entries of those that exited removed, and ``/etc/passwd`` and ``/etc/group`` (each user with a
    group of its own name and id, as useradd makes them)."""
    users = {0: "root"}
    live = set()
    for _, p in running(sim):
        users[p.uid] = p.user
        live.add(str(p.pid))
        name = comm(p)
        shown = name.replace("\\", "\\\\").replace("\n", "\\n")  # status escapes these two alone (fs/proc/array.c)
        _replace(root, f"/proc/{p.pid}/status", f"Name:\t{shown}\nPid:\t{p.pid}\n"
                 f"Uid:\t{p.uid}\t{p.uid}\t{p.uid}\t{p.uid}\nGid:\t{p.uid}\t{p.uid}\t{p.uid}\t{p.uid}\n"
                 f"Groups:\t{p.uid}\n")
        _replace(root, f"/proc/{p.pid}/stat", stat_line(p, name))
        _replace(root, f"/proc/{p.pid}/cmdline", p.command.replace(" ", "\0") + "\0")
        _replace(root, f"/proc/{p.pid}/cgroup", f"0::{cgroup_path(p)}\n")
    for d in (root / "proc").iterdir() if (root / "proc").is_dir() else ():
        if d.name.isdigit() and d.name not in live:
            shutil.rmtree(d, ignore_errors=True)
    _replace(root, "/etc/passwd", "".join(f"{name}:x:{uid}:{uid}::/home/{name}:/bin/bash\n"
                                          for uid, name in sorted(users.items())))
    _replace(root, "/etc/group", "".join(f"{name}:x:{uid}:\n" for uid, name in sorted(users.items())))


def comm(p: Process) -> str:
    """The process's name as the kernel keeps it (``/proc/PID/comm``): its executable's file name (here the
    first word of its command line), at most 15 bytes, any character but NUL."""
    argv0 = p.command.split(" ")[0] or "?"
    return argv0.rsplit("/", 1)[-1].encode()[:15].decode(errors="ignore") or "?"


def start_ticks(p: Process) -> int:
    """The process's start time in clock ticks after boot (``/proc/PID/stat`` field 22). The simulator
    keeps no clock per process: the figure is derived from everything that makes the process what it
    is (pid, user, command, place…), so a pid given to another process gets another start time, and
    the same process keeps its own however often the tree is written."""
    digest = hashlib.sha256(repr(dataclasses.astuple(p)).encode()).digest()
    return 1000 + int.from_bytes(digest[:4], "little") % 100_000_000


def stat_line(p: Process, name: str) -> str:
    """``/proc/PID/stat`` as ``fs/proc/array.c`` writes it: the name in parentheses, unescaped, then the
    fields from 3 (state) to 52; those gpud reads are the start time (22) and, for show, the rest plain."""
    fields = ["S", "1", str(p.pid), str(p.pid), "0", "-1", "4194560"] + ["0"] * 8 + ["20", "0", "1", "0"]
    fields += [str(start_ticks(p)), str(p.used_mib << 20), "0"]  # 22: starttime, 23: vsize, 24: rss
    fields += ["0"] * (52 - 24)
    return f"{p.pid} ({name}) {' '.join(fields)}\n"


def cgroup_path(p: Process) -> str:
    """The process's cgroup v2 path as systemd, Docker, Podman, the kubelet (systemd driver, containerd)
    and slurmd (cgroup/v2 plugin) lay them out; a plain login session otherwise."""
    uid = p.uid
    if p.container:
        cid = p.container
        if p.container_runtime == "podman":
            return f"/machine.slice/libpod-{cid}.scope/container"
        return f"/system.slice/docker-{cid}.scope"
    if p.pod:
        pod = p.pod.replace("-", "_")
        cid = f"{p.pid:064x}"
        return (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{pod}.slice/"
                f"cri-containerd-{cid}.scope")
    if p.slurm_job is not None:
        return f"/system.slice/slurmstepd.scope/job_{p.slurm_job}/step_0/user/task_0"
    if p.unit:
        return f"/system.slice/{p.unit}"
    return f"/user.slice/user-{uid}.slice/session-1.scope"


def _proc(root: Path, m: MachineSpec, gpus: tuple[GpuSpec, ...]) -> None:
    mem_kib = m.memory_gib * 1024 * 1024
    _write(root, "/proc/cmdline", m.kernel_cmdline + "\n")
    _write(root, "/proc/modules", "".join(f"{mod} 1000000 0 - Live 0x0000000000000000\n" for mod in m.modules))
    _write(root, "/proc/meminfo", f"MemTotal:       {mem_kib} kB\nMemFree:        {mem_kib * 9 // 10} kB\n"
           f"MemAvailable:   {mem_kib * 9 // 10} kB\n")
    _write(root, "/proc/mounts", "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n"
           "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"
           f"tmpfs /dev/shm tmpfs rw,nosuid,nodev,size={m.shm_mib * 1024}k,inode64 0 0\n")
    memlock = m.memlock_kib
    value = "unlimited" if memlock == "unlimited" else str(int(memlock) * 1024)
    _write(root, "/proc/self/limits", "Limit                     Soft Limit           Hard Limit           Units\n"
           f"{'Max locked memory':<26}{value:<21}{value:<21}bytes\n"
           f"{'Max open files':<26}{'1048576':<21}{'1048576':<21}files\n")
    lines = []
    cores = m.cores_per_socket
    total = cores * m.sockets
    cpu = 0
    for _ in range(m.threads_per_core):
        for core in range(total):
            lines.append(f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: {m.cpu_model}\n"
                         f"physical id\t: {core // cores}\ncore id\t\t: {core % cores}\ncpu cores\t: {cores}\n")
            cpu += 1
    _write(root, "/proc/cpuinfo", "\n".join(lines) + "\n")
    _write(root, "/sys/class/dmi/id/product_name", m.vendor_model + "\n")
    if m.psu_watts is not None:
        # SMBIOS type 39 ("System Power Supply", DSP0134): Max Power Capacity is the WORD at 0x0C, in W.
        psu = bytearray(0x16)
        psu[0], psu[1], psu[2:4], psu[4] = 39, 0x16, (0x3900).to_bytes(2, "little"), 1
        psu[0x0C:0x0E] = int(m.psu_watts).to_bytes(2, "little")
        _write(root, "/sys/firmware/dmi/entries/39-0/raw", bytes(psu) + b"\0\0")
    for s in range(m.sockets):
        uw = int(m.cpu_tdp_watts / m.sockets * 1e6)
        _write(root, f"/sys/class/powercap/intel-rapl:{s}/constraint_0_power_limit_uw", f"{uw}\n")


def _cpus(root: Path, m: MachineSpec) -> None:
    threads = m.cores_per_socket * m.sockets * m.threads_per_core
    for cpu in range(threads):
        _write(root, f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", m.cpu_governor + "\n")
        _write(root, f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_available_governors",
               "performance powersave schedutil ondemand\n")
    for node in range(m.sockets * m.numa_nodes_per_socket):
        cpus = node_cpus(m, node)
        _write(root, f"/sys/devices/system/node/node{node}/cpulist", ",".join(map(str, cpus)) + "\n")


def _pci(root: Path, sim: SimMachine) -> None:
    """Root port → (switch up/down ports) → GPU, and the /sys/bus/pci/devices links."""
    links = root / "sys/bus/pci/devices"
    links.mkdir(parents=True, exist_ok=True)

    def device(path: str, addr: str, vendor: int, dev: int, cls: int, numa: int, gen: int, width: int,
               max_gen: int, max_width: int, acs: int | None) -> None:
        rel = f"/sys/devices/{path}"
        _write(root, f"{rel}/vendor", f"0x{vendor:04x}\n")
        _write(root, f"{rel}/device", f"0x{dev:04x}\n")
        _write(root, f"{rel}/class", f"0x{cls:06x}\n")
        _write(root, f"{rel}/numa_node", f"{numa}\n")
        _write(root, f"{rel}/current_link_speed", GT_S.get(gen, "Unknown") + "\n")
        _write(root, f"{rel}/current_link_width", f"{width}\n")
        _write(root, f"{rel}/max_link_speed", GT_S.get(max_gen, "Unknown") + "\n")
        _write(root, f"{rel}/max_link_width", f"{max_width}\n")
        _write(root, f"{rel}/config", _config_space(acs))
        link = links / addr
        if not link.is_symlink():
            os.symlink(f"../../../devices/{path}", link)

    for i, g in enumerate(sim.desc.gpus):
        gen, width = link_state(sim, i, g)
        mg, mw = int(g.pcie_max_generation), int(g.pcie_max_width)  # the GPU's own Link Capabilities
        sg, sw = int(g.slot_generation), int(g.slot_width)  # the port the GPU sits in: the slot
        acs = None if not g.acs_capable else ACS_ON if g.acs else 0
        chain = [f"pci{host_bridge(g)}", g.root_port]
        # sysfs max_link_* of a port are its own capability; current_link_* the link it trained
        if g.switch:
            device("/".join(chain), g.root_port, 0x8086, 0x352A, 0x060400, g.numa_node, mg, mw, mg, mw, acs)
            down = downstream_port(g.switch, i)
            chain.append(g.switch)
            device("/".join(chain), g.switch, 0x1000, 0xC010, 0x060400, g.numa_node, mg, mw, mg, mw, acs)
            chain.append(down)
            device("/".join(chain), down, 0x1000, 0xC010, 0x060400, g.numa_node, gen, width, sg, sw, acs)
        else:
            device("/".join(chain), g.root_port, 0x8086, 0x352A, 0x060400, g.numa_node, gen, width, sg, sw,
                   acs)
        chain.append(g.bus_id)
        dev_id = g.pci_device_id >> 16
        device("/".join(chain), g.bus_id, 0x10DE, dev_id, 0x030000, g.numa_node, gen, width, mg, mw, None)
        _aer(root, "/sys/devices/" + "/".join(chain))
        os.symlink("../../../../bus/pci/drivers/nvidia", root / f"sys/devices/{'/'.join(chain)}/driver")
        # the GPU's HDMI audio function, as on real boards
        audio = g.bus_id[:-1] + "1"
        device("/".join(chain[:-1] + [audio]), audio, 0x10DE, 0x1AEF, 0x040300, g.numa_node, gen, width, mg, mw,
               None)
    (root / "sys/bus/pci/drivers/nvidia").mkdir(parents=True, exist_ok=True)


# The AER statistics a kernel with CONFIG_PCIEAER gives a device with the AER capability (Linux
# Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats, drivers/pci/pcie/aer.c's
# aer_correctable_error_string / aer_uncorrectable_error_string): one line per error kind, then the total.
AER_CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
AER_UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF",
                     "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked",
                     "TLPBlockedErr", "PoisonTLPBlocked")


def _aer(root: Path, rel: str) -> None:
    """A GPU's AER counts: none since boot (the simulator injects no PCIe error of this kind)."""
    _write(root, f"{rel}/aer_dev_correctable", "".join(f"{k} 0\n" for k in AER_CORRECTABLE) + "TOTAL_ERR_COR 0\n")
    for kind, total in (("nonfatal", "TOTAL_ERR_NONFATAL"), ("fatal", "TOTAL_ERR_FATAL")):
        _write(root, f"{rel}/aer_dev_{kind}", "".join(f"{k} 0\n" for k in AER_UNCORRECTABLE) + f"{total} 0\n")


def _iommu(root: Path, m: MachineSpec, n: int) -> None:
    if m.iommu == "off":
        return
    (root / "sys/class/iommu/dmar0").mkdir(parents=True, exist_ok=True)
    kind = "identity" if m.iommu == "passthrough" else "DMA-FQ"
    for g in range(n * 2 + 4):
        _write(root, f"/sys/kernel/iommu_groups/{g}/type", kind + "\n")


def _xorg(root: Path, xorg: Xorg) -> None:
    if xorg.conf:
        _write(root, "/etc/X11/xorg.conf", xorg.conf)
    for name, text in (xorg.files or {}).items():
        _write(root, f"/etc/X11/xorg.conf.d/{name}", str(text))
    if xorg.log:
        _write(root, "/var/log/Xorg.0.log", xorg.log)


def _kmsg(root: Path, sim: SimMachine) -> None:
    """/dev/kmsg records (``prio,seq,usec,flags;message``) as a plain file; none at all under a
    ``kernel_log_unreadable`` fault (the tree has no journal and no syslog kernel file either), so the
    host reader meets an absent source as on a node whose container was given no /dev/kmsg. A journal
    is no simulated file: a test writes a real one under the root (``tests/test_journald.py``)."""
    if sim.faults_of("kernel_log_unreadable"):
        return
    m = sim.desc.machine
    lines = [
        (0.0, 5, "Linux version 6.8.0-49-generic (buildd@lcy02-amd64) #49-Ubuntu SMP PREEMPT_DYNAMIC"),
        (0.0, 6, f"Command line: {m.kernel_cmdline}"),
        (4.2, 6, "nvidia: loading out-of-tree module taints kernel."),
        (4.9, 6, f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {m.driver_version}"),
    ]
    for p in sim.faults_of("xid"):
        g = sim.desc.gpus[int(p.gpu or 0)]
        bus = g.bus_id.rsplit(".", 1)[0]
        text = p.text or DEFAULT_XID_TEXT.get(p.xid, "")
        lines.append((float(p.seconds), 4, f"NVRM: Xid (PCI:{bus}): {p.xid}, pid=4242, name=python, {text}"))
    lines.sort(key=lambda x: x[0])
    _write(root, "/dev/kmsg", "".join(f"{prio},{seq},{int(t * 1e6)},-;{msg}\n"
                                      for seq, (t, prio, msg) in enumerate(lines)))
