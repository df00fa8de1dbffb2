"""The systemd journal as the kernel log's source (``gpud.hw.journald``): real journal files, written by
systemd's own ``systemd-journal-remote`` from journal export format, under the simulated root; read by
libsystemd as on a node.

A journald-only node (the ``kernel_log_unreadable`` fault: no /dev/kmsg, no kern.log or messages) with
an Xid 79 in its journal fails the Xid check; another boot's journal is not this boot's; a journal
directory gpud's user may not read (a real refusal: a child turned nobody), libsystemd missing, or a
directory another user could change (as root) leave the Xids "not judged" with what gpud needs.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_helpers import description, doctor, only

from gpud.config import Config
from gpud.doctor import health as hl
from gpud.doctor.xid import unreadable_needs
from gpud.hw import journald
from gpud.hw.host import Host, KernelLogUnreadable

UNREADABLE = '[[fault]]\nkind = "kernel_log_unreadable"\n'
MACHINE_ID = "5a1c3e0b9d2f4c6e8a7b1d3f5e9c0a2b"
OTHER_BOOT = "0123456789abcdef0123456789abcdef"
GPU1_XID = "NVRM: Xid (PCI:0000:37:00): 79, pid=4242, name=python, GPU has fallen off the bus."


def journal_remote() -> str:
    """Debian's systemd-journal-remote (it writes a journal file from export format on stdin)."""
    path = shutil.which("systemd-journal-remote", path="/lib/systemd:/usr/lib/systemd")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("systemd-journal-remote is missing (Debian's systemd-journal-remote package)")
        pytest.skip("systemd-journal-remote not installed (apt-get install systemd-journal-remote)")
    return path


def entry(boot_id: str, seconds: float, message: str, transport: str = "kernel", source: bool = True) -> str:
    """One entry in journal export format (systemd's JOURNAL_EXPORT_FORMATS), as journald stores a kernel
    message: the kernel's time in _SOURCE_MONOTONIC_TIMESTAMP, journald's own a little later."""
    usec = int(seconds * 1e6)
    lines = [f"__REALTIME_TIMESTAMP={1_764_000_000_000_000 + usec + 1000}", f"__MONOTONIC_TIMESTAMP={usec + 1000}",
             f"_BOOT_ID={boot_id.replace('-', '')}", f"_TRANSPORT={transport}", "PRIORITY=4",
             "SYSLOG_IDENTIFIER=kernel", f"MESSAGE={message}"]
    if source:
        lines.append(f"_SOURCE_MONOTONIC_TIMESTAMP={usec}")
    return "\n".join(lines) + "\n\n"


def write_journal(root: Path, rel: str, entries: list[str]) -> Path:
    """``rel``/<machine-id>/system.journal under ``root``, with the modes journald gives (2755 and 2750
    directories, a 0640 file)."""
    top = root / rel.lstrip("/")
    top.mkdir(parents=True, exist_ok=True)
    top.chmod(0o2755)
    d = top / MACHINE_ID
    d.mkdir(mode=0o2750, exist_ok=True)
    d.chmod(0o2750)
    out = d / "system.journal"
    r = subprocess.run([journal_remote(), f"--output={out}", "-"], input="".join(entries), capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and out.is_file(), r.stderr
    out.chmod(0o640)
    return out


def journald_only(m) -> None:
    """The journal of a journald-only node under the simulated machine's root: this boot's first kernel
    lines in the volatile journal (before the flush), the Xid in the persistent one."""
    boot = m.host.boot_id()
    write_journal(m.host.root, "/run/log/journal", [entry(boot, 0.0, "Linux version 6.8.0-49-generic"),
                                                    entry(boot, 4.9, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module")])
    write_journal(m.host.root, "/var/log/journal", [entry(boot, 5123.4, GPU1_XID),
                                                    entry(boot, 5200.0, "a later line", source=False),
                                                    entry(boot, 5300.0, "a service's line", transport="stdout")])
    (m.host.root / "var/log/journal" / OTHER_BOOT).write_text("")  # a file by a machine id's name: passed over


def test_a_journald_only_node_reports_the_xid_from_the_journal(tmp_path: Path) -> None:
    report = doctor(tmp_path, "health.xid", description(2, extra=UNREADABLE), before=journald_only)
    r = only(report)
    assert (r.status, r.gpu) == ("fail", 1) and "Xid 79" in r.summary, r
    assert "not judged" not in r.summary


def test_the_journal_gives_the_kernels_seconds_and_only_kernel_messages(tmp_path: Path) -> None:
    p = tmp_path / "box.toml"
    p.write_text(description(2, extra=UNREADABLE))
    from gpud.backends import open_machine

    m = open_machine(str(p))
    assert m.host.kernel_log_unreadable() is not None  # the fault: no source at all
    journald_only(m)
    fds = len(os.listdir("/proc/self/fd"))
    log = m.host.read_kernel_log()
    assert isinstance(log, list)
    # both directories, in time order; the kernel's time, else journald's; no service's line
    assert [t for t, _ in log] == [0.0, 4.9, 5123.4, 5200.001] and "a service's line" not in str(log)
    (x,) = m.host.read_xids()  # type: ignore[misc]
    assert (x.pci_bus_id, x.xid, x.seconds_since_boot) == ("0000:37:00.0", 79, 5123.4)
    assert len(os.listdir("/proc/self/fd")) == fds  # libsystemd closed the files it was given
    states = hl.gather(m, Config(), (), m.snapshot(), history=())
    xid = {h.gpu: h for h in states if h.component == "xid"}
    assert xid[1].state == "unhealthy" and "79" in xid[1].reason and xid[0].state == "healthy", xid


def test_another_boots_journal_is_not_this_boots(tmp_path: Path) -> None:
    def other_boot(m) -> None:
        write_journal(m.host.root, "/var/log/journal", [entry(OTHER_BOOT, 5123.4, GPU1_XID),
                                                        entry(m.host.boot_id(), 0.0, "Linux version 6.8.0")])

    r = only(doctor(tmp_path, "health.xid", description(2, extra=UNREADABLE), before=other_boot))
    assert (r.status, r.summary) == ("pass", "no Xid in the kernel log since boot"), r


def test_a_journal_without_this_boot_is_not_judged(tmp_path: Path) -> None:
    def stale(m) -> None:
        write_journal(m.host.root, "/var/log/journal", [entry(OTHER_BOOT, 0.0, "Linux version 6.8.0"),
                                                        entry(OTHER_BOOT, 5123.4, GPU1_XID)])

    r = only(doctor(tmp_path, "health.xid", description(2, extra=UNREADABLE), before=stale))
    assert r.status == "skip" and r.summary.startswith("not judged:"), r
    assert "/var/log/journal no kernel messages of this boot" in r.summary
    assert "mount /run/log/journal (journald's volatile journal) too" in r.summary


def test_without_libsystemd_the_journal_is_not_judged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(journald, "LIBRARY", "libsystemd-absent-for-gpud-tests.so.0")
    r = only(doctor(tmp_path, "health.xid", description(2, extra=UNREADABLE), before=journald_only))
    assert r.status == "skip" and "/var/log/journal libsystemd not found" in r.summary, r
    assert "/run/log/journal libsystemd not found" in r.summary
    assert "install libsystemd (libsystemd0, systemd-libs) to read /var/log/journal and /run/log/journal" in r.remedy


# -- refusals: a real kernel's (a child turned nobody), and gpud's own as root ------------------------

def _acl(path: Path, perm: int, gid: int) -> None:
    """A POSIX access ACL granting group ``gid`` ``perm`` (the xattr's format, linux/posix_acl_xattr.h:
    version 2, then tag/perm/id entries sorted by tag), as systemd-tmpfiles' ``a+`` lines set it."""
    mode = path.stat().st_mode
    undefined = 0xFFFFFFFF
    entries = [(0x01, (mode >> 6) & 7, undefined), (0x04, (mode >> 3) & 7, undefined), (0x08, perm, gid),
               (0x10, ((mode >> 3) & 7) | perm, undefined), (0x20, mode & 7, undefined)]
    data = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", data)
    except OSError as err:
        pytest.skip(f"no POSIX ACLs on {path}'s file system ({err.strerror})")


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A root tree another user can reach (pytest's own directories are root's 0700)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    d = Path(tempfile.mkdtemp(prefix="gpud-journal-", dir="/tmp"))
    d.chmod(0o755)
    (d / "proc/sys/kernel/random").mkdir(parents=True)
    (d / "proc/sys/kernel/random/boot_id").write_text("8f3b2c1d-4e5f-4a6b-9c7d-0e1f2a3b4c5d\n")
    for p in (d / "proc", d / "proc/sys", d / "proc/sys/kernel", d / "proc/sys/kernel/random"):
        p.chmod(0o755)
    (d / "proc/sys/kernel/random/boot_id").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _read_as_nobody(root: Path, groups: list[int]) -> object:
    """``Host(root).read_xids()`` in a forked child that became uid/gid 65534 with ``groups``."""
    journald._load(journald.LIBRARY)  # loaded before the fork (the child reads no file of root's)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups(groups)
            os.setgid(65534)
            os.setuid(65534)
            got = Host(root).read_xids()
            msg = json.dumps(got.tried if isinstance(got, KernelLogUnreadable) else [x.xid for x in got])
        except BaseException as err:  # noqa: BLE001
            msg = json.dumps(f"child failed: {err!r}")
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        return json.loads(f.read())


def test_a_journal_its_user_may_not_read_is_not_judged(open_root: Path) -> None:
    boot = (open_root / "proc/sys/kernel/random/boot_id").read_text().strip()
    write_journal(open_root, "/var/log/journal", [entry(boot, 0.0, "Linux version 6.8.0"),
                                                  entry(boot, 5123.4, GPU1_XID)])
    (open_root / "var").chmod(0o755)
    (open_root / "var/log").chmod(0o755)
    assert [x.xid for x in Host(open_root).read_xids()] == [79]  # type: ignore[union-attr]  # root reads it
    tried = _read_as_nobody(open_root, [])
    # /var/log/journal (2755) opens; its machine directory (2750 root:root) does not: not an empty journal
    assert tried == [["/dev/kmsg", "absent"], ["/var/log/journal", "permission denied"], ["/run/log/journal", "absent"],
                     ["/var/log/kern.log", "absent"], ["/var/log/messages", "absent"]], tried
    needs = " ".join(unreadable_needs(tuple((p, w) for p, w in tried), root=False))  # type: ignore[misc, union-attr]
    assert "join group systemd-journal, or adm where the journal's ACL grants it, to read /var/log/journal" in needs


def test_group_adm_reads_the_journal_through_its_acl(open_root: Path) -> None:
    """Debian's and Ubuntu's tmpfiles.d/systemd.conf give group adm r-x on the machine directory and r--
    on the journal files by ACL: the DaemonSet's supplementalGroups [4] reads them."""
    boot = (open_root / "proc/sys/kernel/random/boot_id").read_text().strip()
    out = write_journal(open_root, "/var/log/journal", [entry(boot, 0.0, "Linux version 6.8.0"),
                                                        entry(boot, 5123.4, GPU1_XID)])
    for p in (open_root / "var", open_root / "var/log"):
        p.chmod(0o755)
    _acl(out.parent, 0o5, 4)
    _acl(out, 0o4, 4)
    assert _read_as_nobody(open_root, [4]) == [79]
    assert ["/var/log/journal", "permission denied"] in _read_as_nobody(open_root, [])  # type: ignore[operator]


def test_as_root_a_journal_another_user_could_change_is_refused(open_root: Path) -> None:
    boot = (open_root / "proc/sys/kernel/random/boot_id").read_text().strip()
    elsewhere = open_root / "elsewhere"
    out = write_journal(open_root, "/elsewhere/journal", [entry(boot, 0.0, "Linux version"),
                                                          entry(boot, 5123.4, GPU1_XID)])
    (open_root / "var/log").mkdir(parents=True)
    os.symlink(elsewhere / "journal", open_root / "var/log/journal")
    got = Host(open_root).read_xids()
    assert isinstance(got, KernelLogUnreadable), got
    assert got.why("/var/log/journal") == f"refused: {open_root.resolve()}/var/log/journal is a symbolic link"
    (open_root / "var/log/journal").unlink()
    os.rename(elsewhere / "journal", open_root / "var/log/journal")
    assert [x.xid for x in Host(open_root).read_xids()] == [79]  # type: ignore[union-attr]
    machine = open_root / "var/log/journal" / MACHINE_ID
    machine.chmod(0o2777)
    why = Host(open_root).read_xids().why("/var/log/journal")  # type: ignore[union-attr]
    assert why == "refused: /var/log/journal/" + MACHINE_ID + " is writable by group or others (mode 2777)"
    machine.chmod(0o2750)
    os.chown(machine / out.name, 65534, 65534)
    why = Host(open_root).read_xids().why("/var/log/journal")  # type: ignore[union-attr]
    assert why == f"refused: /var/log/journal/{MACHINE_ID}/system.journal is owned by uid 65534, not root"
    needs = unreadable_needs(Host(open_root).read_xids().tried, root=True)  # type: ignore[union-attr]
    assert any(n.startswith("make /var/log/journal root's and writable by root alone") for n in needs), needs
