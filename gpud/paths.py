"""Where gpud keeps its state and finds its configuration."""

from __future__ import annotations

import os
import stat
from pathlib import Path

CONFIG_DIR = Path("/etc/gpud")
DEFAULT_SOCKET = "/run/gpud/gpud.sock"


def control_socket(configured: str | None = None) -> Path:
    """The daemon's control socket: ``GPUD_SOCKET``, else ``[daemon] socket`` of gpud.toml
    (``configured``), else /run/gpud/gpud.sock. The daemon and the CLI choose it the same way."""
    return Path(os.environ.get("GPUD_SOCKET") or configured or DEFAULT_SOCKET)


def daemon_running(configured: str | None = None) -> bool:
    """Whether a gpud daemon answers on its control socket."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.2)
    try:
        s.connect(str(control_socket(configured)))
        return True
    except OSError:
        return False
    finally:
        s.close()


def state_dir() -> Path:
    """``GPUD_STATE_DIR``; else ``/var/lib/gpud`` as root, the user's state directory otherwise."""
    env = os.environ.get("GPUD_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/gpud")
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "gpud"


def atomic_write(path: Path, data: str) -> None:
    """Write temp, fsync, rename: a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()  # a full disk or a failed rename leaves no temporary file behind
        except OSError:
            pass
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


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


def trusted(path: str, what: str, file: str | None = None, key: str = "") -> None:
    """As root, refuse files another user could have written: a writable profile could stop the fans.

    ``file``/``key`` name where the path came from (a web configuration's key), for the error.
    """
    from gpud.errors import InvalidInput

    if os.geteuid() != 0:
        return
    try:
        st = os.stat(path)
    except OSError as err:
        raise InvalidInput(file or path, key, f"cannot read {path}: {err.strerror}") from err
    if st.st_uid != 0:
        raise InvalidInput(file or path, key, f"{what} {path} is not owned by root (uid {st.st_uid}): refused "
                                              "while running as root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise InvalidInput(file or path, key, f"{what} {path} is writable by group or others (mode "
                                              f"{stat.S_IMODE(st.st_mode):o}): refused while running as root; "
                                              f"`chmod go-w {path}`")


MAX_INPUT = 1 << 20  # 1 MiB: the largest profile, configuration or description gpud reads
MAX_DEPTH = 32  # nesting of tables and arrays in any input file


def read_limited(path: str | Path, limit: int = MAX_INPUT, shown: str | None = None,
                 too_large: str | None = None) -> bytes:
    """A whole input file, refused (InvalidInput) when larger than ``limit`` bytes — never read whole first.
    ``too_large`` replaces the refusal's reason (an importer of another tool's output says whose)."""
    from gpud.errors import InvalidInput

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
        import fcntl
        import time

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
                from gpud.errors import GpudError

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
    return state_dir() / "burnin.json"
