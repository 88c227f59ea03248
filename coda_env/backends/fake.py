"""A FAKE desktop for fast tests: no X server, like android_env's fake simulator.

`FakeDesktop` keeps the screen as a numpy array drawn from the state of the scripted app that runs on it
(`coda_env.apps._fake`: the app lives with the apps, the desktop with the backends). They exist so the env
loop, wrappers, rollouts, eval and the trainers' logic can be tested in milliseconds (`pytest -m fast`);
they are not a model of any real application or display.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..actions import Action
from .base import DesktopError, Window


class FakeProcess:
    """Popen-like handle of a fake app 'process'."""

    _next = 40_000

    def __init__(self, args: Sequence[str]):
        FakeProcess._next += 1
        self.pid, self.args, self.returncode = FakeProcess._next, list(args), None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    terminate = kill


class FakeDesktop:
    """A desktop in memory (a FAKE): input updates the scripted app's state, the screenshot draws it."""

    capabilities = frozenset()
    app_timeout = 5.0
    tmpdir = None

    def __init__(self, width: int = 1280, height: int = 800, fail_start: bool = False, refuse_keys: Sequence[str] = ()):
        self.width, self.height = width, height
        self.fail_start = fail_start
        self.refuse_keys = frozenset(refuse_keys)  # keys this 'keyboard' lacks: input raises ValueError
        self.started = False
        self.procs: list[FakeProcess] = []
        self.pressed: set[str] = set()
        self.buttons: set[str] = set()
        self.app: dict[str, Any] = {}
        self.inputs: list[Action] = []
        self.starts = 0

    # lifecycle
    def start(self) -> None:
        if self.fail_start:
            raise DesktopError("the fake desktop was told to fail at start")
        self.started, self.starts = True, self.starts + 1

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        self.procs.clear()
        self.started = False
        self.pressed.clear()
        self.buttons.clear()

    def alive(self) -> bool:
        return self.started

    def _check(self) -> None:
        if not self.started:
            raise DesktopError("the fake desktop is not running")

    # observation
    def screenshot(self) -> np.ndarray:
        self._check()
        img = np.full((self.height, self.width, 3), 200, np.uint8)
        if self.running():
            text = self.app.get("text", "")
            digest = hashlib.sha256(repr((text, self.app.get("submitted"), self.app.get("clicks"))).encode()).digest()
            img[: self.height // 10] = np.frombuffer(digest[:3], np.uint8)  # a "title bar" per state
            n = min(len(text), 60)
            img[self.height // 2 : self.height // 2 + 20, 20 : 20 + 20 * n] = 0  # the text field's content
        return img

    def windows(self) -> list[Window]:
        self._check()
        return [
            Window(p.pid, "fake", "Fake app", 0, 0, self.width, self.height) for p in self.procs if p.poll() is None
        ]

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    # input
    def input(self, action: Action) -> None:
        self._check()
        missing = self.refuse_keys.intersection(action.keys)
        if missing:
            raise ValueError(f"key {sorted(missing)[0]!r} is not on the fake keyboard")
        self.inputs.append(action)
        if not self.running():
            return
        a, app = action, self.app
        if a.kind == "type":
            app["text"] = app.get("text", "") + a.text
        elif a.kind in ("press", "hotkey"):
            for key in a.keys * (a.presses if a.kind == "press" else 1):
                if key == "enter":
                    app.setdefault("submitted", []).append(app.get("text", ""))
                    app["text"] = ""
                elif key == "backspace":
                    app["text"] = app.get("text", "")[:-1]
        elif a.kind == "click":
            app["clicks"] = app.get("clicks", 0) + a.clicks
            app["last_click"] = [a.x, a.y]
        elif a.kind == "key_down":
            self.pressed.update(a.keys)
        elif a.kind == "key_up":
            self.pressed.difference_update(a.keys)
        elif a.kind == "mouse_down":
            self.buttons.add(a.button)
        elif a.kind == "mouse_up":
            self.buttons.discard(a.button)

    def release_all(self) -> None:
        self.pressed.clear()
        self.buttons.clear()

    # processes and files
    def spawn(
        self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None, log: str | None = None
    ) -> FakeProcess:
        self._check()
        p = FakeProcess(argv)
        self.procs.append(p)
        return p

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, *, writable: Sequence[str] | None = None
    ) -> subprocess.CompletedProcess:
        self._check()
        return subprocess.CompletedProcess(list(argv), 0, b"", b"")

    def kill_group(self, proc) -> None:
        proc.kill()
        if proc in self.procs:
            self.procs.remove(proc)

    def crash_app(self) -> None:
        """Tests: the app 'dies' as if killed."""
        for p in self.procs:
            p.returncode = -9

    def read_file(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def write_file(self, path: str, data: bytes) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)

    def a11y(self):
        raise DesktopError("the fake desktop has no accessibility bus")

    def checkpoint(self, name: str) -> None:
        raise DesktopError("the fake desktop has no snapshots (the capability 'snapshots' is a VM's)")

    def reset(self) -> None:
        raise DesktopError("the fake desktop has no snapshots (the capability 'snapshots' is a VM's)")

    def http_get(self, port: int, path: str, timeout: float = 10.0) -> bytes:
        raise DesktopError("the fake desktop serves no HTTP")


def make_desktop(width: int, height: int, sandbox: bool = True, **options) -> FakeDesktop:
    """The backends table's entry point (a fake: there is nothing to seal)."""
    return FakeDesktop(width, height, **options)
