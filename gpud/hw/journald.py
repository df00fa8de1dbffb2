"""The kernel's messages of this boot from the systemd journal, through libsystemd (ctypes).

A journald-only node (no ``/var/log/kern.log`` or ``/var/log/messages``) keeps the kernel log in the
journal alone, and an unprivileged container cannot open ``/dev/kmsg`` (the device cgroup denies it):
there the journal is the Xids' only source. gpud does not parse journal files itself; libsystemd
(``libsystemd.so.0``, Debian's ``libsystemd0``, RHEL's ``systemd-libs``) reads them, as its manual pages
describe (https://www.freedesktop.org/software/systemd/man/):

- sd_journal_open_files_fd(3) (``sd_journal_open(3)``, since systemd 230): a journal over files gpud
  opened itself; once it succeeds the journal owns the descriptors and ``sd_journal_close(3)`` closes
  them (a failed call leaves them to the caller);
- sd_journal_add_match(3): ``_TRANSPORT=kernel`` and ``_BOOT_ID=<this boot>`` (two fields: both must
  hold), the fields of systemd.journal-fields(7);
- sd_journal_next(3) to walk the matching entries, sd_journal_get_data(3) for ``MESSAGE`` and
  ``_SOURCE_MONOTONIC_TIMESTAMP`` (the kernel's own time of the message, µs since boot: the seconds
  /dev/kmsg gives, which the rest of gpud expects), and sd_journal_get_monotonic_usec(3) (when journald
  received it) for an entry without that field.

Why gpud opens the files and not ``sd_journal_open_directory(3)``: that call fails only when the top
directory cannot be opened. A machine directory (``/var/log/journal/<machine-id>``, mode 2750) or a
journal file (0640) it may not read is skipped, recorded only in the library's private list
(journalctl's "insufficient permissions" hint reads it), and the journal reads as empty: "no Xid",
where the truth is "not read" (seen with Debian bookworm's libsystemd 252 as uid 65534: return 0 and no
entry; -EACCES only for the top directory). Opening each file here tells a refusal (EACCES) from an
empty journal, and what is checked is what libsystemd reads (the descriptors), nothing looked up twice.

Which files: ``system.journal`` and its archives (``system@….journal``, ``system@….journal~``), in the
journal directory and in its machine-id directories (32 hex digits); journald writes kernel messages to
the system journal of the default namespace only, so user journals, namespaces (``<id>.<ns>``) and
``remote/`` are not opened. Both ``/var/log/journal`` (persistent) and ``/run/log/journal`` (volatile,
and a persistent journal's start before the flush) are read together, as journalctl does.

Trust, when gpud runs as root (it may run where other people log in): the directories from ``/`` to the
journal directory are opened one by one without following a symbolic link, each owned by root and not
writable by others (a sticky directory excepted, as for ``gpud.paths.open_trusted``; group write is
tolerated on the directories above the journal's: Ubuntu's ``/var/log`` is ``root:syslog 0775``, the
group of rsyslogd, no person's); the journal directory and its machine-id directories owned by root and
writable by root alone (journald makes them ``root:systemd-journal`` 2755 and 2750); every file a regular
file, not a symbolic link, owned by root and writable by root alone. Anything else is refused, named in
the reason. Not root: the journal directory's path is followed as given (the permissions of gpud's user
are what protect it), and within it no link is followed.

Outcomes: this boot's kernel messages, else why each journal directory could not serve: "absent",
"permission denied", "refused: …", "no journal files", "boot id unknown", "libsystemd not found",
"libsystemd: <error>", or "no kernel messages of this boot". A journal that covers this boot holds at
least the kernel's first lines (journald reads the whole kmsg buffer when it starts), so one without any
is not this boot's record (journald writes elsewhere, ``Storage=volatile`` into an unmounted
``/run/log/journal``): its silence is no "no Xid", and an empty list is never returned.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

LIBRARY = "libsystemd.so.0"
JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_OPEN_FILE = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW


@dataclass(frozen=True)
class NotRead:
    """No journal could be read: each journal directory that could not, and why."""

    tried: tuple[tuple[str, str], ...]


class _Refused(Exception):
    """A directory or file gpud will not hand to libsystemd: the reason, in words."""


@lru_cache(maxsize=4)
def _load(name: str) -> ctypes.CDLL | None:
    """libsystemd with the prototypes gpud calls; None when it cannot be loaded or lacks them."""
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    p = ctypes.POINTER
    try:
        lib.sd_journal_open_files_fd.argtypes = [p(ctypes.c_void_p), p(ctypes.c_int), ctypes.c_uint, ctypes.c_int]
        lib.sd_journal_add_match.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.sd_journal_next.argtypes = [ctypes.c_void_p]
        lib.sd_journal_get_data.argtypes = [ctypes.c_void_p, ctypes.c_char_p, p(ctypes.c_void_p),
                                            p(ctypes.c_size_t)]
        lib.sd_journal_get_monotonic_usec.argtypes = [ctypes.c_void_p, p(ctypes.c_uint64), ctypes.c_char_p]
        lib.sd_journal_close.argtypes = [ctypes.c_void_p]
        lib.sd_journal_close.restype = None
    except AttributeError:  # older than systemd 230: no sd_journal_open_files_fd
        return None
    return lib


def _refusal(st: os.stat_result, where: str, journal: bool) -> str | None:
    if st.st_uid != 0:
        return f"refused: {where} is owned by uid {st.st_uid}, not root"
    writable = stat.S_IWOTH | (stat.S_IWGRP if journal else 0)
    if st.st_mode & writable and not (stat.S_ISDIR(st.st_mode) and not journal and st.st_mode & stat.S_ISVTX):
        return f"refused: {where} is writable by {'group or others' if journal else 'others'} " \
               f"(mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _open_journal_dir(root: Path, rel: str, as_root: bool) -> int:
    """The journal directory ``rel`` under ``root``, opened (a descriptor); as root each directory from
    ``/`` down opened without following a link and checked (``_Refused``). OSError when it cannot be."""
    if not as_root:
        return os.open(root / rel.lstrip("/"), _OPEN_DIR)
    parts = [x for x in os.path.realpath(root).split("/") if x]
    inner = [x for x in rel.split("/") if x]
    dfd = os.open("/", _OPEN_DIR)
    try:
        where = "/"
        for i, name in enumerate([*parts, *inner, None]):
            why = _refusal(os.fstat(dfd), where, journal=i == len(parts) + len(inner))
            if why:
                raise _Refused(why)
            if name is None:
                return os.dup(dfd)
            where = os.path.join(where, name)
            try:
                nfd = os.open(name, _OPEN_DIR | os.O_NOFOLLOW, dir_fd=dfd)
            except OSError as err:
                if err.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(where):
                    raise _Refused(f"refused: {where} is a symbolic link") from err
                raise
            os.close(dfd)
            dfd = nfd
    finally:
        os.close(dfd)
    raise AssertionError("unreachable")


def _is_system(name: str) -> bool:
    return name == "system.journal" or (name.startswith("system@") and name.endswith((".journal", ".journal~")))


def _is_machine_id(name: str) -> bool:
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


def _journal_files(dfd: int, shown: str, as_root: bool) -> list[int]:
    """Descriptors of the system journal files in the journal directory ``dfd`` and its machine-id
    directories (each checked as the module says); PermissionError, _Refused."""
    fds: list[int] = []
    try:
        _collect(dfd, shown, as_root, fds, top=True)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _collect(dfd: int, shown: str, as_root: bool, fds: list[int], top: bool) -> None:
    for name in sorted(os.listdir(dfd)):
        where = f"{shown}/{name}"
        if top and _is_machine_id(name):
            try:
                sub = os.open(name, _OPEN_DIR | os.O_NOFOLLOW, dir_fd=dfd)
            except OSError as err:
                if err.errno == errno.ENOTDIR:
                    continue  # a file by that name: no machine's directory
                if err.errno == errno.ELOOP:
                    raise _Refused(f"refused: {where} is a symbolic link") from err
                raise
            try:
                why = _refusal(os.fstat(sub), where, journal=True) if as_root else None
                if why:
                    raise _Refused(why)
                _collect(sub, where, as_root, fds, top=False)
            finally:
                os.close(sub)
        elif _is_system(name):
            try:
                fd = os.open(name, _OPEN_FILE, dir_fd=dfd)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise _Refused(f"refused: {where} is a symbolic link") from err
                raise
            fds.append(fd)
            st = os.fstat(fd)
            why = (f"refused: {where} is not a regular file" if not stat.S_ISREG(st.st_mode) else
                   _refusal(st, where, journal=True) if as_root else None)
            if why:
                raise _Refused(why)


def _why(err: OSError) -> str:
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return "absent"
    if err.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return err.strerror or str(err)


def kernel_messages(root: Path, boot_id: str | None) -> list[tuple[float | None, str]] | NotRead:
    """This boot's kernel messages from the journals under ``root``, as (seconds since boot, text) in
    the journal's order; else why not (``NotRead``: ``Host.read_kernel_log`` adds its pairs to
    ``KernelLogUnreadable.tried``). ``boot_id``: this boot's id (``/proc/sys/kernel/random/boot_id``,
    dashes or not)."""
    as_root = os.geteuid() == 0
    failed: list[tuple[str, str]] = []
    found: list[tuple[str, list[int]]] = []
    try:
        for rel in JOURNAL_DIRS:
            dfd: int | None = None
            try:  # the directory, then its files: a refusal or an error of either is this directory's reason
                dfd = _open_journal_dir(root, rel, as_root)
                fds = _journal_files(dfd, rel, as_root)
            except _Refused as err:
                failed.append((rel, str(err)))
                continue
            except OSError as err:
                failed.append((rel, _why(err)))
                continue
            finally:
                if dfd is not None:
                    os.close(dfd)
            found.append((rel, fds))
        with_files = [rel for rel, fds in found if fds]
        if not with_files or any(w != "absent" for _, w in failed):  # one refused directory: Xids unknown
            return _in_order((*failed, *((rel, "no journal files") for rel, fds in found if not fds)))
        if not boot_id:
            got: list[tuple[float | None, str]] | str = "boot id unknown (/proc/sys/kernel/random/boot_id)"
        elif (lib := _load(LIBRARY)) is None:
            got = "libsystemd not found"
        else:
            got = _read(lib, found, boot_id.replace("-", "").strip().lower())
    finally:
        for _, fds in found:
            for fd in fds:
                os.close(fd)
    if not got:
        got = "no kernel messages of this boot"
    if isinstance(got, str):  # the directories read say why; the others are absent or hold no file
        return _in_order((*failed, *((rel, got if rel in with_files else "no journal files") for rel, _ in found)))
    return got


def _in_order(tried: tuple[tuple[str, str], ...]) -> NotRead:
    return NotRead(tuple(sorted(tried, key=lambda t: JOURNAL_DIRS.index(t[0]))))


def _read(lib: ctypes.CDLL, found: list[tuple[str, list[int]]], boot_id: str) -> list[tuple[float | None, str]] | str:
    """The matching entries of the journal over the descriptors of ``found``, or libsystemd's error in
    words. Opened, the journal owns the descriptors (sd_journal_close closes them: the lists are emptied
    here); not opened, they stay the caller's (libsystemd's ``sd_journal_open_files_fd`` "fail:" path)."""
    fds = [fd for _, opened in found for fd in opened]
    j = ctypes.c_void_p()
    arr = (ctypes.c_int * len(fds))(*fds)
    r = lib.sd_journal_open_files_fd(ctypes.byref(j), arr, len(fds), 0)
    if r < 0:
        return f"libsystemd: {os.strerror(-r)}"
    for _, opened in found:
        opened.clear()
    try:
        for match in (b"_TRANSPORT=kernel", b"_BOOT_ID=" + boot_id.encode()):
            r = lib.sd_journal_add_match(j, match, 0)
            if r < 0:
                return f"libsystemd: {os.strerror(-r)}"
        out: list[tuple[float | None, str]] = []
        data, size = ctypes.c_void_p(), ctypes.c_size_t()
        usec, entry_boot = ctypes.c_uint64(), ctypes.create_string_buffer(16)
        while (r := lib.sd_journal_next(j)) > 0:
            if lib.sd_journal_get_data(j, b"MESSAGE", ctypes.byref(data), ctypes.byref(size)) < 0:
                continue
            msg = ctypes.string_at(data.value or 0, size.value)[len(b"MESSAGE="):]
            secs: float | None = None
            if lib.sd_journal_get_data(j, b"_SOURCE_MONOTONIC_TIMESTAMP", ctypes.byref(data), ctypes.byref(size)) >= 0:
                raw = ctypes.string_at(data.value or 0, size.value).partition(b"=")[2]
                secs = int(raw) / 1e6 if raw.isdigit() else None
            if secs is None and lib.sd_journal_get_monotonic_usec(j, ctypes.byref(usec), entry_boot) >= 0:
                secs = usec.value / 1e6
            out.append((secs, msg.decode(errors="replace").rstrip("\n")))
        if r < 0:
            return f"libsystemd: {os.strerror(-r)}"
        return out
    finally:
        lib.sd_journal_close(j)
