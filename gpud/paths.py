"""Where gpud keeps its state and finds its configuration."""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import socket
import stat
import time
from pathlib import Path

from gpud.errors import GpudError, InvalidInput

CONFIG_DIR = Path("/etc/gpud")
DEFAULT_SOCKET = "/run/gpud/gpud.sock"


def control_socket(configured: str | None = None) -> Path:
    """The daemon's control socket: ``GPUD_SOCKET``, else ``[daemon] socket`` of gpud.toml
    (``configured``), else /run/gpud/gpud.sock. The daemon and the CLI choose it the same way."""
    return Path(os.environ.get("GPUD_SOCKET") or configured or DEFAULT_SOCKET)


def daemon_running(configured: str | None = None) -> bool:
    """Whether a gpud daemon answers on its control socket."""

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.2)
    try:
        s.connect(str(control_socket(configured)))
        return True
    except OSError:
        return False
    finally:
        s.close()


_state_dir: tuple[tuple[str | int | None, ...], Path] | None = None  # (what it was worked out from, the path)


def state_dir() -> Path:
    """``GPUD_STATE_DIR``; else ``/var/lib/gpud`` as root, the user's state directory otherwise. Worked out
    again only when what it depends on changed (the daemon's tick asks for it to look for new probe and
    burn-in results every second)."""
    global _state_dir
    env = os.environ.get("GPUD_STATE_DIR")
    euid = os.geteuid()
    key: tuple[str | int | None, ...] = (env,) if env else (
        None, euid, None if euid == 0 else os.environ.get("XDG_STATE_HOME"), os.environ.get("HOME"))
    cached = _state_dir
    if cached is not None and cached[0] == key:
        return cached[1]
    if env:
        path = Path(env)
    elif euid == 0:
        path = Path("/var/lib/gpud")
    else:
        base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        path = Path(base) / "gpud"
    _state_dir = (key, path)
    return path


_in_state: dict[str, tuple[Path, Path]] = {}  # name → (the state directory, the file's path in it)


def in_state_dir(name: str) -> Path:
    """``state_dir() / name``, joined again only when the state directory changed: the files the daemon looks
    at every tick (the probe history, the last burn-in)."""
    base = state_dir()
    got = _in_state.get(name)
    if got is None or got[0] is not base:
        got = _in_state[name] = (base, base / name)
    return got[1]


def atomic_write(path: Path, data: str, durable: bool = True) -> None:
    """Write temp, fsync, rename: a reader sees the old file or the new one, never half. The temporary
    file is created new (O_EXCL, O_NOFOLLOW): nothing planted under its name is written through, and
    the rename replaces a symbolic link at ``path`` itself, never the file it points to. ``durable=False``
    skips both fsyncs: the rename alone keeps readers from a half file, and nothing is promised across a
    power loss (the simulator's hardware state, which its processes share and a reboot need not keep)."""

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with open(fd, "w") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()  # a full disk or a failed rename leaves no temporary file behind
        except OSError:
            pass
        raise
    if not durable:
        return
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def check_output(path: Path, option: str, suffixes: tuple[str, ...] = (), want: str = "") -> None:
    """Refuse an output path before the work that produces it starts (InvalidInput: one line, exit 2,
    nothing written): its directory must exist and be writable, the path must not be a directory, not
    under /proc or /sys, and as root not a symbolic link (root never writes through one a user planted).
    ``suffixes``: the endings allowed (``want`` says what is wanted, for the error)."""

    def refuse(reason: str) -> InvalidInput:
        return InvalidInput(option, "", f"{path}: {reason}")

    if suffixes and path.suffix.lower() not in suffixes:
        raise refuse(f"want {want or 'FILE' + suffixes[0]}")
    full = Path(os.path.abspath(path))
    for base in ("/proc", "/sys"):
        for p in {full, Path(os.path.realpath(full))}:
            if p == Path(base) or Path(base) in p.parents:
                raise refuse(f"under {base}: not a place to write files")
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise refuse(f"cannot use: {err.strerror}") from err
    if st is not None and stat.S_ISLNK(st.st_mode) and os.geteuid() == 0:
        raise refuse("a symbolic link: refused as root")
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(full)
        except OSError:
            st = None  # a dangling link: the write replaces it
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise refuse("a directory: name a file in it")
    parent = full.parent
    if not parent.is_dir():
        raise refuse(f"no directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise refuse(f"directory {parent} is not writable")


def probe_lock_path() -> Path:
    """The training probe's machine-wide lock (one probe at a time, CLI and daemon alike):
    ``GPUD_PROBE_LOCK``; else under ``GPUD_STATE_DIR`` when that is set; else ``/run/gpud/probe.lock``, in
    root's runtime directory (the service's ``RuntimeDirectory``, the one it may write), never in a
    world-writable one such as /run/lock or /tmp."""
    env = os.environ.get("GPUD_PROBE_LOCK")
    if env:
        return Path(env)
    if os.environ.get("GPUD_STATE_DIR"):
        return state_dir() / "probe.lock"
    return Path(DEFAULT_SOCKET).parent / "probe.lock"


def probe_output_path() -> Path:
    """Where the daemon keeps the stderr of the probe it started last (its failure is logged from it)."""
    return state_dir() / "probe-daemon.err"


_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY  # O_NONBLOCK: a FIFO never hangs


def _dir_refusal(st: os.stat_result, where: str, what: str) -> str | None:
    """Why a directory on the way to a file root reads could let another user replace the file, else None.
    A world-writable directory with the sticky bit (/tmp) owned by root is allowed: there nobody but
    root may rename or remove the root-owned entry below it (the kernel's protected_symlinks reasoning)."""
    if st.st_uid != 0:
        return (f"{what}: directory {where} is owned by uid {st.st_uid}, who could replace what is in it: "
                "refused while running as root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return (f"{what}: directory {where} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}), "
                f"who could replace what is in it: refused while running as root; `chmod go-w {where}`")
    return None


def open_trusted(path: str | Path, what: str, file: str | None = None, key: str = "") -> int:
    """Open a file that steers gpud ONCE and check THAT descriptor: a regular file (never a FIFO or a
    device), and as root owned by root, not writable by group or others, not a symbolic link, and in
    directories only root can change (each one opened from ``/`` with O_NOFOLLOW and fstat-ed). The
    caller reads from the descriptor returned (and closes it), so what is checked is what is read: no
    path is looked up twice. Not root: today's rules (symbolic links followed, no ownership refusal).

    InvalidInput (``file``/``key``: where the path came from, for the error) when it is refused;
    OSError (FileNotFoundError …) when it cannot be opened at all.
    """


    shown = file or str(path)
    if os.geteuid() != 0:
        fd = os.open(path, _READ_FLAGS)
        root = False
    else:
        root = True
        full = os.path.abspath(path)
        parent, name = os.path.split(full)
        if not name:
            raise InvalidInput(shown, key, f"{what} {path} is a directory")
        # Directory links are resolved once; the resolved directories are then walked without following
        # anything, so a link changed afterwards is not followed (ELOOP/ENOTDIR below).
        real = os.path.realpath(parent)
        dfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            where = "/"
            parts = [x for x in real.split("/") if x]
            for i in range(len(parts) + 1):
                why = _dir_refusal(os.fstat(dfd), where, f"{what} {path}")
                if why:
                    raise InvalidInput(shown, key, why)
                if i == len(parts):
                    break
                where = "/" + "/".join(parts[: i + 1])
                try:
                    nfd = os.open(parts[i], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                except OSError as err:
                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise InvalidInput(shown, key, f"{what} {path}: {where} changed while it was opened (now a "
                                                       "symbolic link or not a directory): refused") from err
                    raise
                os.close(dfd)
                dfd = nfd
            try:
                fd = os.open(name, _READ_FLAGS | os.O_NOFOLLOW, dir_fd=dfd)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise InvalidInput(shown, key, f"{what} {path} is a symbolic link: refused while running as "
                                                   "root (name the file it points to)") from err
                raise
        finally:
            os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(shown, key, f"{what} {path} is not a regular file")
        if root and st.st_uid != 0:
            raise InvalidInput(shown, key, f"{what} {path} is not owned by root (uid {st.st_uid}): refused "
                                           "while running as root")
        if root and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise InvalidInput(shown, key, f"{what} {path} is writable by group or others (mode "
                                           f"{stat.S_IMODE(st.st_mode):o}): refused while running as root; "
                                           f"`chmod go-w {path}`")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes from ``fd`` (one more than allowed tells "too large")."""
    chunks: list[bytes] = []
    left = limit + 1
    while left > 0:
        b = os.read(fd, min(left, 1 << 16))  # a regular file: O_NONBLOCK does not apply
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


MAX_INPUT = 1 << 20  # 1 MiB: the largest profile, configuration or description gpud reads
MAX_DEPTH = 32  # nesting of tables and arrays in any input file


def read_trusted(path: str | Path, what: str, limit: int = MAX_INPUT, shown: str | None = None,
                 key: str = "", too_large: str | None = None) -> bytes:
    """A whole file that steers gpud (profile, configuration, web configuration, TLS file), opened and
    checked once (``open_trusted``) and read from that descriptor; refused (InvalidInput) when larger
    than ``limit`` bytes — never read whole first."""

    file = shown or str(path)
    try:
        fd = open_trusted(path, what, file, key)
    except OSError as err:
        raise InvalidInput(file, key, f"cannot read: {err.strerror}") from err
    try:
        data = read_fd(fd, limit)
    except OSError as err:
        raise InvalidInput(file, key, f"cannot read: {err.strerror}") from err
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InvalidInput(file, key, too_large or f"larger than {limit // 1024} KiB: refused (not a gpud file?)")
    return data


def read_limited(path: str | Path, limit: int = MAX_INPUT, shown: str | None = None,
                 too_large: str | None = None) -> bytes:
    """A whole input file, refused (InvalidInput) when larger than ``limit`` bytes — never read whole first.
    ``too_large`` replaces the refusal's reason (an importer of another tool's output says whose).
    For files that only describe (a simulated machine, a dump); files that steer gpud: ``read_trusted``."""

    file = shown or str(path)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise InvalidInput(file, "", f"cannot read: {err.strerror}") from err
    if len(data) > limit:
        raise InvalidInput(file, "", too_large or f"larger than {limit // 1024} KiB: refused (not a gpud file?)")
    return data


def depth(value: object, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value`` nests lists and mappings (stops counting past ``limit``)."""
    best = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, tuple, dict)):
            best = max(best, d + 1)
            if best > limit:
                return best
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return best


class LockBusy(Exception):
    """The tuning lock is held by another process (``holder`` says who)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


class TuningLock:
    """The machine-wide tuning lock: every command that writes GPU settings, the CPU governor or
    ``tuning.json`` holds it, and the daemon holds it for as long as it runs. An advisory
    ``flock`` on ``tuning.lock`` beside the state file: the kernel drops it when its holder dies,
    so a killed process never leaves it stuck. The file says who holds it, for the error."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.fd: int | None = None
        self.named = True

    @staticmethod
    def path() -> Path:
        return state_dir() / "tuning.lock"

    def acquire(self, wait: float = 0.0) -> None:

        p = self.path()
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            self.named = True
        except OSError:
            # A read-only state directory: lock the directory itself (flock works on it), so the
            # command still runs one at a time and then says why it cannot save its state.
            try:
                fd = os.open(p.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as err:

                e = GpudError(f"cannot use the state directory {p.parent}: {err.strerror}")
                e.remedy = "create it (root: /var/lib/gpud), or choose another with GPUD_STATE_DIR"
                raise e from err
            self.named = False
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = self.holder()
                if time.monotonic() >= deadline or holder.endswith("daemon"):
                    os.close(fd)
                    raise LockBusy(holder) from None
                time.sleep(0.05)
        if self.named:
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {self.role}\n".encode(), 0)
            except OSError:
                pass  # who holds it is only for messages
        self.fd = fd

    def holder(self) -> str:
        try:
            pid, _, role = self.path().read_text().strip().partition(" ")
            return f"pid {pid}, {role}" if pid.isdigit() else "another process"
        except OSError:
            return "another process"

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> TuningLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def burnin_path() -> Path:
    """The last ``gpud burnin`` result (its JSON document without telemetry)."""
    return in_state_dir("burnin.json")


def burnin_run_path() -> Path:
    """The running (or last) ``gpud burnin``'s result file, written as it goes (``gpud.burnin.progress``)."""
    return state_dir() / "burnin-run.jsonl"
