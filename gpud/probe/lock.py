"""One probe at a time on this machine: an ``flock`` shared by the CLI, the daemon and job scripts."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpud.paths import probe_lock_path, state_dir
from gpud.probe.errors import ProbeBusy, ProbeError


@contextmanager
def probe_lock() -> Iterator[None]:
    """One probe at a time on this machine, whoever starts it (CLI, daemon, a job script).

    The lock file is opened once, in a directory no other user can write (checked on its descriptor),
    never through a symlink, and written to only when it is this user's own: a lock in a world-writable
    directory could be a symlink to a file root would truncate, or a file another user holds to block
    every probe. A user who cannot open the machine's lock (``/run/gpud`` is root's) takes one in their
    own state directory: their probes exclude each other, and the busy-GPU check stands between them and
    root's."""
    path = probe_lock_path()
    fd = _open_lock(path)
    if fd is None:  # the machine's lock is not this user's to open
        path = state_dir() / "probe.lock"
        fd = _open_lock(path)
        if fd is None:
            raise ProbeError(f"cannot open the probe's lock {path}")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()[:16] or "?"
            raise ProbeBusy(f"another probe is running on this machine (pid {holder}, lock {path})") from None
        if os.fstat(fd).st_uid == os.geteuid():
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _open_lock(path: Path) -> int | None:
    """The lock file's descriptor; None where this user may not open it (not root, the machine's lock);
    ProbeError where it is unsafe (a symlink, not a file, a directory others can write)."""
    euid = os.geteuid()
    try:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if euid != 0 and err.errno in (errno.EACCES, errno.EPERM, errno.ENOENT):
            return None
        raise ProbeError(f"cannot open the probe lock's directory {path.parent}: {err.strerror}") from err
    try:
        st = os.fstat(dfd)
        if st.st_uid not in (0, euid) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ProbeError(f"the probe lock's directory {path.parent} can be written by another user "
                             f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): refused")
        flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(path.name, flags | os.O_RDWR | os.O_CREAT, 0o644, dir_fd=dfd)
        except PermissionError:
            if euid == 0:
                raise
            try:
                fd = os.open(path.name, flags | os.O_RDONLY, dir_fd=dfd)  # root's lock: flock needs no write
            except OSError:
                return None
    except OSError as err:
        why = "a symlink" if err.errno == errno.ELOOP else err.strerror
        raise ProbeError(f"cannot open the probe's lock {path}: {why}: refused") from err
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, euid):
        os.close(fd)
        raise ProbeError(f"the probe's lock {path} is not a file of root's or this user's (uid {st.st_uid}): refused")
    return fd
