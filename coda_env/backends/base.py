"""The Desktop protocol: what an env needs from wherever its desktop lives.

A backend owns a display (Xvfb here, a VM elsewhere) and everything started on it. Apps and checks talk to
the desktop only through this protocol, so the same app adapter and task run on every backend.
"""

from __future__ import annotations

import os

import errno
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, TypeVar, runtime_checkable

import numpy as np

from ..actions import Action

if TYPE_CHECKING:
    from ..a11y import A11ySource

T = TypeVar("T")


class DesktopError(RuntimeError):
    """The desktop (display server, VM) is gone or unusable; the env must restart it."""


@dataclass(frozen=True)
class Window:
    id: int
    wm_class: str
    title: str
    x: int
    y: int
    width: int
    height: int


@runtime_checkable
class Desktop(Protocol):
    """What the env and the app adapters call. Optional capabilities are declared in `capabilities`, never
    probed: "a11y" (an AT-SPI bus: `a11y()` works), "snapshots" (`checkpoint(name)` saves the running
    desktop, `reset()` reverts to the last checkpoint; a VM)."""

    width: int
    height: int
    capabilities: frozenset[str]
    app_timeout: float  # how long an app may take to become ready here (a VM: far longer)
    tmpdir: str | None  # a folder that lives and dies with this desktop (None: none here):
    # app homes, per-desktop caches, links of fixed name

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def alive(self) -> bool: ...
    def screenshot(self) -> np.ndarray:
        """The whole screen as an (height, width, 3) uint8 RGB array."""

    def input(self, action: Action) -> None:
        """Perform one non-terminal action with the mouse or keyboard."""

    def spawn(
        self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None, log: str | None = None
    ) -> subprocess.Popen:
        """Start a long-running program (an app) on this desktop, in a process group of its own."""

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, *, writable: Sequence[str] | None = None
    ) -> subprocess.CompletedProcess:
        """Run a command on the desktop to completion. With `writable`, it runs sealed as an app does (on a
        backend that seals apps: the local one), able to write only in those folders (checks that run
        programs on what the agent made); a VM, the sandbox itself, runs it as any command."""

    def read_file(self, path: str) -> bytes: ...
    def write_file(self, path: str, data: bytes) -> None: ...
    def windows(self) -> list[Window]: ...
    def a11y(self) -> "A11ySource":
        """Read access to the accessibility trees of the apps on this desktop (the caller closes it)."""

    def kill_group(self, proc: subprocess.Popen) -> None:
        """Kill a spawned program and everything it started."""

    def release_all(self) -> None:
        """Release every key and mouse button an action left pressed (episode end, reset, a failed action);
        a backend that can also switches keyboard locks off, so that no episode inherits another's input."""

    def http_get(self, port: int, path: str, timeout: float = 10.0) -> bytes:
        """GET http://127.0.0.1:port/path as seen from the desktop (this machine, or inside the VM guest)."""

    def checkpoint(self, name: str) -> None:
        """(capability "snapshots") Save the running desktop, apps and all, as `name`; `reset()` reverts to
        the latest. A desktop without the capability raises DesktopError."""

    def reset(self) -> None:
        """(capability "snapshots") Revert in place to the latest checkpoint (or to the booted desktop)."""


SNAPSHOTS = "snapshots"
A11Y = "a11y"


# where a sealed app finds the desktop's links of fixed name: inside its own private /tmp, so the same path on
# every desktop (the desktop's folder itself has a random name, which an app that shows a path would show)
SHOWN_LINKS = "/tmp/coda"


def stable_path(desktop: "Desktop", name: str, target: str) -> str:
    """The path an app is given for `target` (a folder in a fresh per-reset home) so that what it shows of the
    path is the same on every reset and every desktop: a link of fixed `name` in the desktop's folder, seen by
    a sealed app at SHOWN_LINKS/<name> (`shown_links` of a desktop that has them), else at the link itself.
    `target` itself where the desktop has no folder or the link cannot be made."""
    tmp = desktop.tmpdir
    if not tmp:
        return target
    link = os.path.join(tmp, name)
    if desktop.run(["ln", "-sfn", "--", str(target), link], timeout=10).returncode != 0:
        return target
    return os.path.join(SHOWN_LINKS, name) if getattr(desktop, "shown_links", False) else link


def make_temp_dir(prefix: str, parent: str | None = None, what: str = "a temporary folder") -> str:
    """tempfile.mkdtemp, with an error that names the folder and the fix instead of a bare OSError (the one
    helper for the desktops' folders and the apps' homes)."""
    try:
        return tempfile.mkdtemp(prefix=prefix, dir=parent)
    except OSError as e:
        where = parent or tempfile.gettempdir()
        hint = "the disk is full: free space or " if e.errno == errno.ENOSPC else ""
        raise DesktopError(
            f"cannot create {what} in {where} ({e.strerror or e}): {hint}set TMPDIR to a "
            f"writable folder with free space"
        ) from None


def poll_until(
    deadline: float,
    attempt: Callable[[], T | None],
    on_timeout: Callable[[], Exception],
    first: float = 0.005,
    most: float = 0.2,
) -> T:
    """Call `attempt` until it returns something other than None, with growing pauses between the calls;
    `on_timeout()`'s exception once the next pause would end past `deadline` (time.monotonic())."""
    for pause in backoff(first, most):
        got = attempt()
        if got is not None:
            return got
        if time.monotonic() + pause > deadline:
            raise on_timeout()
        time.sleep(pause)
    raise AssertionError("unreachable")


def backoff(first: float = 0.005, most: float = 0.2) -> Iterator[float]:
    """Growing pauses for polling: quick answers stay quick, slow ones cost few round trips."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, most)


class PolledProcess:
    """Popen-like handle of a program in a VM guest, whose state is asked for (`poll`) over some channel.

    Subclasses say how to poll and signal it; `in_snapshot` is what a snapshot revert brings back."""

    def __init__(self, pid: int, args: Sequence[str]):
        self.pid, self.args = pid, list(args)
        self.returncode: int | None = None
        self.in_snapshot = False  # running when the current snapshot was saved: a revert brings it back

    def poll(self) -> int | None:
        raise NotImplementedError

    def send_signal(self, sig: int) -> None:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for pause in backoff():
            if self.poll() is not None:
                return self.returncode  # type: ignore[return-value]
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(pause)
        raise AssertionError("unreachable")

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
