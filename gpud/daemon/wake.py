"""A socket server that sleeps until a connection comes or it is told to stop: no polling.

``socketserver.BaseServer.serve_forever`` wakes every ``poll_interval`` (0.5 s) to look at its stop
flag: four wake-ups a second for the daemon's HTTP and control servers, 0.04 % of a core between them
(benchmarks/footprint.py, each thread's CPU clock) where the daemon's own budget is 0.2 %. Here the
loop waits on the listening socket and on a pipe that ``shutdown`` writes to, so it runs only when
there is something to do and still stops at once."""

from __future__ import annotations

import os
import selectors
import threading


class Wakeable:
    """Mixed in before a ``socketserver`` server class: ``serve_forever`` and ``shutdown`` as the
    standard library's (same signatures, the same handling of each request), without the polling."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._stop_asked = False
        self._stopped = threading.Event()
        self._stopped.set()  # not serving yet: shutdown() has nothing to wait for
        super().__init__(*args, **kwargs)

    def serve_forever(self, poll_interval: float = 0.5) -> None:  # noqa: ARG002 (the standard signature)
        self._stopped.clear()
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self, selectors.EVENT_READ)  # type: ignore[arg-type]  # a server has fileno()
                sel.register(self._wake_r, selectors.EVENT_READ)
                while not self._stop_asked:
                    for key, _ in sel.select():
                        if key.fd == self._wake_r or self._stop_asked:
                            break
                        self._handle_request_noblock()  # type: ignore[attr-defined]  # BaseServer's
        finally:
            self._stop_asked = False
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop the loop and wait for it to end (from another thread, as ``BaseServer.shutdown``)."""
        self._stop_asked = True
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # the pipe is full of earlier wake-ups: the loop will see one
            pass
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()  # type: ignore[misc]
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


class Stop(threading.Event):
    """The daemon's stop flag, a ``threading.Event`` whose ``wait`` is one lock acquire with a timeout. The
    daemon's loops sleep on it between rounds, and ``Event.wait`` goes through a ``Condition``: a lock
    allocated, acquired and listed per wait, the condition's lock released and taken again around it. On a
    mostly idle machine each wake-up runs cold, and that costs: 2 cores, no load, a thread waking from a
    0.5 s wait spent 174 µs of its CPU clock in ``Event.wait`` against 126 µs here (medians of 15,
    interleaved). ``set`` releases the lock held since creation, once; each waiter that gets it hands it on.
    ``clear`` is not supported: the daemon stops once."""

    def __init__(self) -> None:
        super().__init__()
        self._down = threading.Lock()
        self._down.acquire()
        self._once = threading.Lock()

    def set(self) -> None:
        # One release however many callers, signal handlers included (one may interrupt another: nothing blocks).
        if self._once.acquire(False):
            super().set()
            self._down.release()

    def clear(self) -> None:
        raise RuntimeError("a stop flag cannot be cleared")

    def wait(self, timeout: float | None = None) -> bool:
        if self.is_set():
            return True
        if self._down.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            self._down.release()  # the next waiter's turn
            return True
        return self.is_set()
