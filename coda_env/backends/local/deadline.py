"""The X-call deadline: a frozen X server cannot hang a desktop's caller."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Iterator


class _Deadline:
    """Cuts a desktop's X connections when a call on them overruns, so that a frozen X server cannot hang us.

    One thread sleeps until the armed deadline; a call that returns in time disarms it (a lock and a notify,
    a few microseconds). Cutting is `shutdown()` on the connections' sockets: a read blocked on a silent
    server returns at once, and python-xlib and XCB both report a closed connection."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._until: float | None = None
        self._depth = 0
        self._socks: list[socket.socket] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.expired = False

    def attach(self, socks: list[socket.socket]) -> None:
        with self._cond:
            self._socks, self.expired, self._closed = socks, False, False

    @contextlib.contextmanager
    def arm(self, seconds: float) -> Iterator[None]:
        with self._cond:
            self._depth += 1
            if self._depth == 1:  # nested calls run under the outermost deadline
                self._until = time.monotonic() + seconds
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="coda-x-deadline", daemon=True)
                    self._thread.start()
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._until = None

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._until is None:
                    self._cond.wait()
                    continue
                left = self._until - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self.expired, self._until = True, None
                for s in self._socks:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            for s in self._socks:
                try:
                    s.close()
                except OSError:
                    pass
            self._socks = []


def _xcb_socket(shot) -> socket.socket | None:
    """A duplicate of the socket of mss's XCB connection (shutting it down cuts mss's connection too)."""
    import ctypes
    import ctypes.util

    conn = getattr(getattr(shot, "_impl", None), "conn", None)
    lib = ctypes.util.find_library("xcb")
    if conn is None or lib is None:
        return None
    xcb = ctypes.CDLL(lib)
    xcb.xcb_get_file_descriptor.argtypes = [ctypes.c_void_p]
    xcb.xcb_get_file_descriptor.restype = ctypes.c_int
    addr = ctypes.cast(conn, ctypes.c_void_p).value if isinstance(conn, ctypes._Pointer) else ctypes.addressof(conn)
    fd = xcb.xcb_get_file_descriptor(addr)
    return socket.socket(fileno=os.dup(fd)) if fd >= 0 else None
