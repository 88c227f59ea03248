"""App adapters: how to launch an application, know it is ready, set it up, and read its state.

An adapter knows its application and nothing about tasks: checks read the dict that `state()` returns.
"""
from __future__ import annotations

import subprocess
from typing import Any, Callable, Protocol

from ..backends.base import Desktop


class AppError(RuntimeError):
    """The application is missing, crashed, or did not become ready."""


class App(Protocol):
    name: str          # the app id used by task files ("kalgebra")
    wm_class: str      # the X window class of its main window

    def launch(self, desktop: Desktop, profile_dir: str) -> subprocess.Popen: ...
    def ready(self, desktop: Desktop) -> bool: ...
    def state(self, desktop: Desktop) -> dict[str, Any]: ...
    def setup(self, desktop: Desktop, op: dict[str, Any]) -> None:
        """Run one `initialize` operation of a task file (its `func` names it)."""
    def close(self) -> None: ...
    setup_ops: dict[str, Callable]


def get_app(name: str) -> App:
    """A fresh adapter for an app id."""
    if name == "kalgebra":
        from .kalgebra import KAlgebra
        return KAlgebra()
    raise AppError(f"unknown app {name!r}; known apps: kalgebra")
