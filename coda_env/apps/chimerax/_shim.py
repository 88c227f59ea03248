"""Stand-in for coda_env.registry (SPEC.md, issue 16) until the lead's core lands on this branch.
Delete at merge: _core.py then imports the real one."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence


class CheckError(ValueError):
    pass


class SetupError(ValueError):
    pass


class AppError(RuntimeError):
    pass


def confined(home: str, rel: str, what: str = "path") -> str:
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise SetupError(f"{what} must be a non-empty relative path, got {rel!r}")
    if os.path.isabs(rel) or rel.startswith("~"):
        raise SetupError(f"{what} {rel!r} must be relative to the app's home folder")
    root = os.path.realpath(home)
    full = os.path.realpath(os.path.join(root, rel))
    if full != root and not full.startswith(root + os.sep):
        raise SetupError(f"{what} {rel!r} leaves the app's home folder")
    return full


@dataclass
class LaunchContext:
    desktop: Any
    home: str
    task: Any = None
    open_files: list[str] = field(default_factory=list)


@dataclass
class SetupContext:
    desktop: Any
    app: Any
    home: str
    task: Any = None
    open_files: list[str] = field(default_factory=list)

    def path(self, rel: str) -> str:
        return confined(self.home, rel)

    def write_file(self, rel: str, data: bytes) -> None:
        self.desktop.write_file(self.path(rel), data)


@dataclass
class CheckContext:
    answer: str | None
    task: Any = None
    desktop: Any = None
    home: str | None = None
    state: dict = field(default_factory=dict)
    states: dict = field(default_factory=dict)

    def read_file(self, rel: str) -> bytes | None:
        try:
            return self.desktop.read_file(confined(self.home, rel))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None


def _no_validate(item: dict) -> None:
    return None


@dataclass(frozen=True)
class CheckType:
    name: str
    run: Callable
    validate: Callable = _no_validate
    fields: tuple = (frozenset(), frozenset())
    app: str | None = None


@dataclass(frozen=True)
class SetupOp:
    name: str
    run: Callable
    validate: Callable = _no_validate
    fields: tuple = (frozenset(), frozenset())
    phase: str = "app"
    app: str | None = None


@dataclass
class AppSpec:
    name: str
    env_id: str
    adapter: Callable
    checks: Sequence[CheckType] = ()
    setup_ops: Sequence[SetupOp] = ()
    task_dir: Path | None = None
    available: Callable[[], str | None] = lambda: None
    scienceboard: Any = None
    scienceboard_names: tuple[str, ...] = ()
    description: str = ""


APPS: dict[str, AppSpec] = {}


def register_app(spec: AppSpec) -> AppSpec:
    APPS[spec.name] = spec
    return spec
