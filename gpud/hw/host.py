"""Host facts read from files under a root path (default ``/``).

The simulator lays out a tree with the same files (``/proc``, ``/sys``, ``/etc/X11``, the
kernel log), so tests read it through exactly this code.
"""

from __future__ import annotations

import errno
import math
import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path

from gpud import procinfo
from gpud.hw import journald
from gpud.model import CpuInfo, PciDevice, XidEvent, XorgOption

PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
XID_RE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\):\s*(\d+),?\s*(.*)")
OPTION_RE = re.compile(r'^\s*Option\s+"([^"]+)"(?:\s+"([^"]*)")?', re.IGNORECASE)
SECTION_RE = re.compile(r'^\s*(Sub)?Section\s+"([^"]+)"', re.IGNORECASE)
END_RE = re.compile(r"^\s*End(Sub)?Section\b", re.IGNORECASE)
NVIDIA_VENDOR = 0x10DE
# A command line is read up to 128 KiB: Linux's MAX_ARG_STRLEN (32 pages), the longest single argument
# execve takes. What a rule's pattern and gpud's outputs see of a longer one is its first 128 KiB.
MAX_CMDLINE = 128 * 1024
ACS_CAP_ID = 0x000D


def parse_size(text: str, total: int | None = None) -> int | None:
    """tmpfs ``size=`` values: 64m, 65536k, 2g, 50%, or bytes."""
    m = re.fullmatch(r"(\d+)([kKmMgGtT%]?)", text.strip())
    if not m:
        return None
    n, unit = int(m.group(1)), m.group(2).lower()
    if unit == "%":
        return total * n // 100 if total else None
    return n * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[unit]


def acs_capability(config: bytes) -> tuple[bool | None, int | None]:
    """(has an ACS capability, its Control register) from a PCIe config space dump.

    (None, None) when the extended config space (offset 0x100 on) is not readable — only root reads
    it; (False, None) for a port that has no ACS capability at all (nothing there can redirect P2P).
    """
    if len(config) < 0x104:
        return None, None  # extended config space is readable by root only
    off, seen = 0x100, set()
    while off and off not in seen and off + 8 <= len(config):
        seen.add(off)
        header = int.from_bytes(config[off:off + 4], "little")
        if header in (0, 0xFFFFFFFF):
            return False, None  # an empty extended capability list
        if header & 0xFFFF == ACS_CAP_ID:
            return True, int.from_bytes(config[off + 6:off + 8], "little")
        off = (header >> 20) & 0xFFC
    return False, None


KERNEL_LOG_FILES = ("/var/log/kern.log", "/var/log/messages")  # syslog's kernel files (Debian/Ubuntu, RHEL)


@dataclass(frozen=True)
class KernelLogUnreadable:
    """No kernel log could be read: each source tried, in order, and why it failed ("absent",
    "permission denied", the error's text, or for a journal directory one of ``gpud.hw.journald``'s
    reasons: "libsystemd not found", "no kernel messages of this boot", "refused: …"). Not an empty
    log: the Xids are unknown."""

    tried: tuple[tuple[str, str], ...]

    def says(self) -> str:
        """``/dev/kmsg absent, /var/log/kern.log permission denied, …``."""
        return ", ".join(f"{path} {why}" for path, why in self.tried)

    def why(self, path: str) -> str | None:
        return next((w for p, w in self.tried if p == path), None)


def _why(err: OSError) -> str:
    """A kernel-log source's failure in words: absent, permission denied (EACCES, and EPERM: what
    /dev/kmsg answers without CAP_SYSLOG under kernel.dmesg_restrict=1), or the error itself."""
    if isinstance(err, FileNotFoundError) or err.errno in (errno.ENOENT, errno.ENOTDIR):
        return "absent"
    if isinstance(err, PermissionError) or err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return err.strerror or str(err)


class Host:
    """Reads host facts under ``root``. Every reader returns None when the file is absent."""

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = Path(root)

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, rel: str) -> str | None:
        try:
            return self.path(rel).read_text(errors="replace")
        except OSError:
            return None

    def _read_int(self, rel: str, base: int = 10) -> int | None:
        text = self.read(rel)
        try:
            return int(text.strip(), base) if text is not None else None
        except ValueError:
            return None

    # -- kernel --------------------------------------------------------------------
    def kernel_cmdline(self) -> str | None:
        text = self.read("/proc/cmdline")
        return text.strip() if text is not None else None

    def loaded_modules(self) -> frozenset[str]:
        text = self.read("/proc/modules") or ""
        return frozenset(line.split()[0] for line in text.splitlines() if line.strip())

    def kernel_log(self) -> list[tuple[float | None, str]] | None:
        """Kernel messages since boot (``read_kernel_log``); None when no source could be read."""
        log = self.read_kernel_log()
        return None if isinstance(log, KernelLogUnreadable) else log

    def read_kernel_log(self) -> list[tuple[float | None, str]] | KernelLogUnreadable:
        """Kernel messages since boot: ``/dev/kmsg`` records, else the systemd journal's kernel messages
        of this boot (``gpud.hw.journald``: ``/var/log/journal`` and ``/run/log/journal``), else
        ``/var/log/kern.log`` or ``/var/log/messages`` lines of this boot; when none of them can be read,
        which were tried and why each failed (``KernelLogUnreadable``), never an empty log: "not read" is
        not "no Xids".

        ``/dev/kmsg`` needs CAP_SYSLOG when ``kernel.dmesg_restrict`` is 1 (open fails with EPERM); a
        container has it only when it is mounted in; RHEL's ``/var/log/messages`` is 0600 root, Debian's
        ``kern.log`` 0640 syslog:adm, and a journald-only node has neither. The journal comes before the
        syslog files: its entries carry the boot's id and the kernel's own time (the seconds /dev/kmsg
        gives), where a syslog file's boot is found by its banner or its clock; rsyslog's files are
        copies of what the kernel (or journald) gave it, so a node with both loses nothing.
        """
        tried: list[tuple[str, str]] = []
        try:
            records = _read_kmsg(self.path("/dev/kmsg"))
        except OSError as err:
            records = None
            tried.append(("/dev/kmsg", _why(err)))
        else:
            if records is None:
                tried.append(("/dev/kmsg", "absent"))
        if records is not None:
            out: list[tuple[float | None, str]] = []
            for rec in records:
                head, _, msg = rec.partition(";")
                fields = head.split(",")
                secs = int(fields[2]) / 1e6 if len(fields) > 2 and fields[2].isdigit() else None
                out.append((secs, msg.rstrip("\n")))
            return out
        journal = journald.kernel_messages(self.root, self.boot_id())
        if not isinstance(journal, journald.NotRead):
            return journal
        tried.extend(journal.tried)
        for rel in KERNEL_LOG_FILES:
            try:
                text = self.path(rel).read_text(errors="replace")
            except OSError as err:
                tried.append((rel, _why(err)))
                continue
            return this_boot(text.splitlines(), self.boot_time())
        return KernelLogUnreadable(tuple(tried))

    def kernel_log_unreadable(self) -> KernelLogUnreadable | None:
        """Why no kernel log can be read (``read_kernel_log``); None when one can."""
        log = self.read_kernel_log()
        return log if isinstance(log, KernelLogUnreadable) else None

    def boot_time(self) -> float | None:
        """When this boot began (``btime`` of ``/proc/stat``, seconds since the epoch)."""
        for line in (self.read("/proc/stat") or "").splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
        return None

    def xid_events(self) -> list[XidEvent] | None:
        """``NVRM: Xid`` lines of the kernel log; None when the log cannot be read (``read_xids`` says why)."""
        events = self.read_xids()
        return None if isinstance(events, KernelLogUnreadable) else events

    def read_xids(self) -> list[XidEvent] | KernelLogUnreadable:
        """``NVRM: Xid`` lines of the kernel log, or which sources were tried and why none could be read."""
        log = self.read_kernel_log()
        if isinstance(log, KernelLogUnreadable):
            return log
        events = []
        for secs, msg in log:
            m = XID_RE.search(msg)
            if m:
                bus = m.group(1).lower()
                if bus.count(":") == 1:
                    bus = "0000:" + bus
                if "." not in bus:
                    bus += ".0"
                events.append(XidEvent(bus, int(m.group(2)), m.group(3).strip(), secs, msg[msg.find("NVRM"):].strip()))
        return events

    # -- X server ------------------------------------------------------------------
    def xorg_files(self) -> list[Path]:
        files = [self.path("/etc/X11/xorg.conf")]
        for d in ("/etc/X11/xorg.conf.d", "/usr/share/X11/xorg.conf.d"):
            p = self.path(d)
            if p.is_dir():
                files.extend(sorted(p.glob("*.conf")))
        return [f for f in files if f.is_file()]

    def xorg_options(self) -> list[XorgOption]:
        out = []
        for f in self.xorg_files():
            section = None
            shown = "/" + str(f.relative_to(self.root))
            for n, raw in enumerate(f.read_text(errors="replace").splitlines(), 1):
                line = raw.split("#", 1)[0]
                if m := SECTION_RE.match(line):
                    if not m.group(1):
                        section = m.group(2)
                elif m := END_RE.match(line):
                    if not m.group(1):
                        section = None
                elif m := OPTION_RE.match(line):
                    out.append(XorgOption(shown, n, section, m.group(1), m.group(2)))
        return out

    def xorg_log(self) -> list[tuple[str, int, str]]:
        out = []
        d = self.path("/var/log")
        for f in sorted(d.glob("Xorg.*.log")) if d.is_dir() else []:
            shown = "/" + str(f.relative_to(self.root))
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                out.append((shown, n, line))
        return out

    # -- PCI -----------------------------------------------------------------------
    def pci_devices(self, vendor: int | None = None) -> list[PciDevice]:
        base = self.path("/sys/bus/pci/devices")
        if not base.is_dir():
            return []
        out = []
        for entry in sorted(base.iterdir()):
            dev = self.pci_device(entry.name)
            if dev is not None and (vendor is None or dev.vendor == vendor):
                out.append(dev)
        return out

    def nvidia_gpus(self) -> list[PciDevice]:
        """NVIDIA display/3D controllers on the bus (class 0x03xxxx)."""
        return [d for d in self.pci_devices(NVIDIA_VENDOR) if d.pci_class >> 16 == 0x03]

    def aer_counts(self, address: str) -> dict[str, int] | None:
        """A PCI device's AER error counts since boot: ``correctable``, ``nonfatal``, ``fatal`` (the
        ``TOTAL_ERR_COR``, ``TOTAL_ERR_NONFATAL``, ``TOTAL_ERR_FATAL`` lines of sysfs's ``aer_dev_*``, Linux
        Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats); None where the kernel gives none (no AER
        capability, or a kernel without CONFIG_PCIEAER)."""
        out: dict[str, int] = {}
        for kind, total in (("correctable", "TOTAL_ERR_COR"), ("nonfatal", "TOTAL_ERR_NONFATAL"),
                            ("fatal", "TOTAL_ERR_FATAL")):
            text = self.read(f"/sys/bus/pci/devices/{address}/aer_dev_{kind}")
            if text is None:
                return None
            for line in text.splitlines():
                name, _, value = line.strip().partition(" ")
                if name == total and value.strip().isdigit():
                    out[kind] = int(value)
            if kind not in out:
                return None
        return out

    def pci_device(self, address: str) -> PciDevice | None:
        rel = f"/sys/bus/pci/devices/{address}"
        entry = self.path(rel)
        vendor = self._read_int(rel + "/vendor", 16)
        if vendor is None:
            return None
        try:
            target = os.readlink(entry)
        except OSError:
            target = ""
        parents = tuple(p for p in target.split("/") if PCI_ADDR.match(p) and p != address)
        try:
            config = (entry / "config").read_bytes()
        except OSError:
            config = b""
        acs = acs_capability(config)
        width = self._read_int(rel + "/current_link_width")
        max_width = self._read_int(rel + "/max_link_width")
        numa = self._read_int(rel + "/numa_node")
        drv = entry / "driver"
        return PciDevice(
            address=address,
            vendor=vendor,
            device=self._read_int(rel + "/device", 16) or 0,
            pci_class=self._read_int(rel + "/class", 16) or 0,
            current_link_speed=(self.read(rel + "/current_link_speed") or "").strip() or None,
            current_link_width=width,
            max_link_speed=(self.read(rel + "/max_link_speed") or "").strip() or None,
            max_link_width=max_width,
            numa_node=numa if numa is not None and numa >= 0 else None,
            parents=parents,
            acs_ctrl=acs[1],
            acs_capable=acs[0],
            driver=os.path.basename(os.readlink(drv)) if drv.is_symlink() else None,
        )

    # -- IOMMU ---------------------------------------------------------------------
    def iommu(self) -> dict[str, object]:
        """``enabled`` (an IOMMU unit registered), ``domain_types`` of its groups, the cmdline."""
        units = self.path("/sys/class/iommu")
        groups = self.path("/sys/kernel/iommu_groups")
        types = set()
        if groups.is_dir():
            for g in groups.iterdir():
                t = self.read(f"/sys/kernel/iommu_groups/{g.name}/type")
                if t:
                    types.add(t.strip())
        cmdline = self.kernel_cmdline() or ""
        return {
            "enabled": units.is_dir() and any(units.iterdir()),
            "groups": sum(1 for _ in groups.iterdir()) if groups.is_dir() else 0,
            "domain_types": sorted(types),
            "passthrough": "iommu=pt" in cmdline.split() or types == {"identity"},
            "cmdline": [w for w in cmdline.split() if "iommu" in w],
        }

    # -- CPU, memory, limits -------------------------------------------------------
    def cpu_governors(self) -> dict[int, str]:
        base = self.path("/sys/devices/system/cpu")
        out = {}
        for d in base.glob("cpu[0-9]*") if base.is_dir() else []:
            gov = self.read(f"/sys/devices/system/cpu/{d.name}/cpufreq/scaling_governor")
            if gov:
                out[int(d.name[3:])] = gov.strip()
        return dict(sorted(out.items()))

    def set_cpu_governor(self, governor: str, cpus: list[int] | None = None) -> dict[int, str]:
        """Write ``scaling_governor`` (all CPUs, or ``cpus``); returns the governors read back."""
        for cpu in cpus if cpus is not None else list(self.cpu_governors()):
            path = self.path(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor")
            path.write_text(governor + "\n")
        return self.cpu_governors()

    def cpu_governors_available(self) -> set[str]:
        text = self.read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors")
        return set(text.split()) if text else set()

    @cached_property
    def _meminfo(self) -> dict[str, int]:
        out = {}
        for line in (self.read("/proc/meminfo") or "").splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
        return out

    def memory_total_bytes(self) -> int | None:
        return self._meminfo.get("MemTotal")

    def shm_bytes(self) -> int | None:
        """Size of the /dev/shm tmpfs: its ``size=`` mount option, else statvfs."""
        for line in (self.read("/proc/mounts") or "").splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "/dev/shm":
                for opt in parts[3].split(","):
                    if opt.startswith("size="):
                        return parse_size(opt[5:], self.memory_total_bytes())
        try:
            st = os.statvfs(self.path("/dev/shm"))
        except OSError:
            return None
        return st.f_blocks * st.f_frsize

    def memlock_bytes(self) -> float | None:
        """Soft ``Max locked memory`` of this process (math.inf when unlimited)."""
        for line in (self.read("/proc/self/limits") or "").splitlines():
            if line.startswith("Max locked memory"):
                soft = line[len("Max locked memory"):].split()[0]
                return math.inf if soft == "unlimited" else float(soft)
        return None

    def cpu_info(self) -> CpuInfo:
        model = None
        sockets, cores, threads = set(), set(), 0
        phys = "0"
        for line in (self.read("/proc/cpuinfo") or "").splitlines():
            key, _, value = (s.strip() for s in line.partition(":"))
            if key == "processor":
                threads += 1
            elif key == "model name" and model is None:
                model = value
            elif key == "physical id":
                phys = value
                sockets.add(value)
            elif key == "core id":
                cores.add((phys, value))
        nodes = self.path("/sys/devices/system/node")
        numa = len(list(nodes.glob("node[0-9]*"))) if nodes.is_dir() else 0
        return CpuInfo(model, max(len(sockets), 1 if threads else 0), len(cores) or threads, threads, numa or 1)

    def product_name(self) -> str | None:
        """The system's product name from DMI (``HP Z8 Fury G5 Workstation Desktop PC``)."""
        text = self.read("/sys/class/dmi/id/product_name")
        return text.strip() if text and text.strip() else None

    def cpu_power_limit_watts(self) -> float | None:
        """Sum of the CPU packages' long-term power limit (RAPL PL1, about the TDP)."""
        base = self.path("/sys/class/powercap")
        total = 0.0
        for d in sorted(base.glob("intel-rapl:[0-9]*")) if base.is_dir() else []:
            if d.name.count(":") != 1:
                continue  # sub-zones (core, uncore, dram)
            uw = self._read_int(f"/sys/class/powercap/{d.name}/constraint_0_power_limit_uw")
            if uw:
                total += uw / 1e6
        return total or None

    def x_displays(self) -> list[str]:
        """X servers running (sockets in /tmp/.X11-unix)."""
        d = self.path("/tmp/.X11-unix")
        return sorted(":" + p.name[1:] for p in d.glob("X*")) if d.is_dir() else []

    def nvidia_settings_query(self, attribute: str) -> str | None:
        """``nvidia-settings -q ATTR -t`` on a running X server; None when that cannot be asked.

        Only on the real root: a program under another root cannot be run.
        """

        exe = shutil.which("nvidia-settings")
        displays = self.x_displays()
        if str(self.root) != "/" or exe is None or not displays:
            return None
        try:
            r = subprocess.run([exe, "-c", displays[0], "-q", attribute, "-t"], capture_output=True, text=True,
                               timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None

    # -- processes -----------------------------------------------------------------
    def process(self, pid: int) -> tuple[str | None, str | None]:
        """(user, command line) of a process, from ``/proc/PID``: the real uid of ``status`` (parsed by
        ``gpud.procinfo.status_fields``, split on newlines alone), the command line at most
        ``MAX_CMDLINE`` bytes."""
        status = self.proc_status(pid)
        if status is None:
            return None, None
        uids = procinfo.status_ids(status, "Uid")
        cmd = (self.read_head(f"/proc/{pid}/cmdline", MAX_CMDLINE) or "").replace("\0", " ").strip() or None
        return (self.user_name(uids[0]) if uids else None), cmd

    def start_time(self, pid: int) -> int | None:
        """When a process started (``/proc/PID/stat`` field 22, clock ticks after boot): with the pid, what
        tells one process from a later one the pid was reused for. None when it cannot be read."""
        return procinfo.start_time(self.read_head(f"/proc/{pid}/stat", 4096))

    def proc_status(self, pid: int) -> str | None:
        """``/proc/PID/status`` as the kernel wrote it: read as bytes, so no ``\\r`` in a process's name
        becomes a line break (text mode's universal newlines would make one); parse it with
        ``gpud.procinfo.status_fields``."""
        return self.read_head(f"/proc/{pid}/status", 1 << 20)  # Groups: up to NGROUPS_MAX (65536) gids

    def read_head(self, rel: str, limit: int) -> str | None:
        """At most ``limit`` bytes of a file, as written (no newline translation): a process's command line
        is the process's to make long, and its name and cgroup names may hold a ``\\r``."""
        try:
            with self.path(rel).open("rb") as f:
                return f.read(limit).decode(errors="replace")
        except OSError:
            return None

    def workload(self, pid: int) -> str | None:
        """The container, pod, Slurm job or systemd unit of a process, from ``/proc/PID/cgroup``."""
        return procinfo.workload(self.read_head(f"/proc/{pid}/cgroup", 1 << 20))

    def boot_id(self) -> str | None:
        """This boot's id (``/proc/sys/kernel/random/boot_id``): a new one after every reboot."""
        text = self.read("/proc/sys/kernel/random/boot_id")
        return text.strip() if text and text.strip() else None

    def user_name(self, uid: int) -> str:
        for line in (self.read("/etc/passwd") or "").splitlines():
            parts = line.split(":")
            if len(parts) > 2 and parts[2] == str(uid):
                return parts[0]
        if str(self.root) == "/":  # NSS (LDAP, sssd) only answers for the real root

            try:
                return pwd.getpwuid(uid).pw_name
            except KeyError:
                pass
        return str(uid)


BOOT_MARK = re.compile(r"kernel: (?:\[\s*0\.0+\] )?Linux version ")
KERNEL_SECS = re.compile(r"kernel: \[\s*(\d+\.\d+)\] ")
ISO_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?)\s")
BSD_STAMP = re.compile(r"^([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s")


def _stamp(line: str, year: int) -> float | None:
    """The syslog time of a line: RFC 3339 (rsyslog's default on current distributions) or the
    traditional ``Nov 30 01:02:03`` (no year: this one is assumed), as local time."""

    m = ISO_STAMP.match(line)
    try:
        if m:
            return datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        m = BSD_STAMP.match(line)
        if m:
            return datetime.strptime(f"{year} {m.group(1)}", "%Y %b %d %H:%M:%S").timestamp()
    except ValueError:
        return None
    return None


def this_boot(lines: list[str], boot_time: float | None) -> list[tuple[float | None, str]]:
    """The lines of a syslog kernel file (``kern.log``, ``messages``) that belong to this boot.

    Those files span earlier boots: an Xid from last week must not count now. The boot starts at
    the last "Linux version" banner; without one, lines stamped before ``boot_time`` are dropped.
    Seconds since boot come from the kernel's own ``[ 1234.5678]`` prefix where it is there.
    """
    start = 0
    for k, line in enumerate(lines):
        if BOOT_MARK.search(line):
            start = k
    if start == 0 and boot_time is not None:

        year = datetime.fromtimestamp(boot_time).year
        kept = []
        for line in lines:
            t = _stamp(line, year)
            if t is not None and t < boot_time - 1:
                continue
            kept.append(line)
        lines, start = kept, 0
    out: list[tuple[float | None, str]] = []
    for line in lines[start:]:
        m = KERNEL_SECS.search(line)
        out.append((float(m.group(1)) if m else None, line))
    return out


def _read_kmsg(path: Path) -> list[str] | None:
    """All records of /dev/kmsg (a character device, read non-blocking) or of a kmsg-format file."""
    if not path.exists():
        return None
    if path.is_file():
        return [line for line in path.read_text(errors="replace").splitlines() if line]
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        while True:
            try:
                data = os.read(fd, 8192)
            except OSError as err:
                if err.errno == errno.EAGAIN:
                    break
                if err.errno == errno.EPIPE:  # a record was overwritten: go on
                    continue
                raise
            if not data:
                break
            records.append(data.decode(errors="replace"))
    finally:
        os.close(fd)
    return records
