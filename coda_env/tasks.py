"""Tasks: JSON files validated on load, from the app packages and from the user's own folders.

A task is data (BrowserGym style: setup is its `initialize` list, validation its `evaluate` list). Sources,
in order: the app package's `tasks/` folder, the folders in `CODA_TASKS_PATH` (os.pathsep-separated), and
`gym.make(id, task_dirs=[...])` / `coda eval --tasks-dir DIR`. In a user folder, `DIR/*.json` and
`DIR/<app>/*.json` are read and the tasks of the wanted app kept. A user's task whose id is also a shipped
one's is an error naming both files.

Everything that can be validated is validated on load, not at reset: fields and their types, the id (one
safe pattern: it names files and folders of a run), setup operations and checks (through their registered
validators), the oracle's actions. A broken file does not take the other tasks down: it is left out and
reported by `broken_tasks(app)` (and `coda tasks`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .actions import ActionError, parse_action
from .registry import APPS, SETUP_OPS, CheckError, SetupError, generation, get_app_spec, validate_item

DIFFICULTIES = ("easy", "medium", "hard")
MAX_INSTRUCTION = 10_000
MAX_FILE_BYTES = 10_000_000
ID_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "app": str,
    "apps": list,
    "instruction": str,
    "steps": int,
    "initialize": list,
    "evaluate": list,
    "solution": list,
    "difficulty": str,
    "category": str,
    "origin": str,
    "requires": str,
    "ans": str,
    "version": str,
    "note": str,
}
_REQUIRED = ("id", "app", "instruction", "steps", "evaluate")


class TaskError(ValueError):
    """A task file is malformed, or a task is unknown; the message names the file and the field."""


@dataclass(frozen=True)
class Task:
    id: str
    app: str
    instruction: str
    steps: int
    evaluate: list[dict]
    initialize: list[dict] = field(default_factory=list)
    solution: list[str] = field(default_factory=list)
    difficulty: str = "medium"
    category: str = ""
    apps: tuple[str, ...] = ()  # other apps the task needs on the same desktop
    origin: str = "coda"  # "coda", or where it was imported from ("scienceboard:KAlgebra/A-01")
    requires: str = ""  # data the user must supply (free text); empty: runs as shipped
    path: str = ""

    @property
    def all_apps(self) -> tuple[str, ...]:
        return (self.app, *self.apps)


def _no_constants(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_task(data: Any, path: str = "<task>", screen: tuple[int, int] = (1280, 800)) -> Task:
    """A validated Task from a decoded task file; TaskError names the file, the field and the problem."""

    def fail(where: str, problem: str) -> TaskError:
        return TaskError(f"{path}: field {where!r}: {problem}")

    if not isinstance(data, dict):
        raise TaskError(f"{path}: a task file must hold a JSON object, got {type(data).__name__}")
    for name in _REQUIRED:
        if name not in data:
            raise fail(name, "is required")
    for name, value in data.items():
        if name not in _FIELDS:
            raise fail(name, f"is not a task field (known: {', '.join(_FIELDS)})")
        want = _FIELDS[name]
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise fail(name, f"must be {getattr(want, '__name__', want)}, got {type(value).__name__}")
    if not ID_PATTERN.fullmatch(data["id"]) or data["id"] in (".", ".."):
        raise fail("id", f"{data['id'][:60]!r} must be 1-100 letters, digits, '_', '.', '-' (it names files)")
    if not data["instruction"].strip():
        raise fail("instruction", "is empty")
    if len(data["instruction"]) > MAX_INSTRUCTION:
        raise fail("instruction", f"is {len(data['instruction'])} characters (max {MAX_INSTRUCTION})")
    if not 1 <= data["steps"] <= 100:
        raise fail("steps", f"must be 1..100, got {data['steps']}")
    apps = data.get("apps", [])
    for i, a in enumerate(apps):
        if not isinstance(a, str) or a not in APPS or a == data["app"]:
            raise fail(f"apps[{i}]", f"{a!r} is not another known app (known: {', '.join(sorted(APPS))})")
    if data["app"] not in APPS:
        raise fail("app", f"unknown app {data['app']!r} (known: {', '.join(sorted(APPS))})")
    if not data["evaluate"]:
        raise fail("evaluate", "needs at least one check")
    for i, check in enumerate(data["evaluate"]):
        try:
            validate_item(check, "checks")
        except CheckError as e:
            raise fail(f"evaluate[{i}]", str(e)) from None
        owner = _owner(check.get("type"), "check")
        if owner is not None and owner not in (data["app"], *apps):
            raise fail(
                f"evaluate[{i}]", f"check type {check['type']!r} belongs to app {owner!r}, which the task does not use"
            )
    for i, op in enumerate(data.get("initialize", [])):
        try:
            validate_item(op, "setup_ops")
        except SetupError as e:
            raise fail(f"initialize[{i}]", str(e)) from None
        owner = SETUP_OPS[op["func"]].app
        if owner is not None and owner not in (data["app"], *apps):
            raise fail(
                f"initialize[{i}]", f"operation {op['func']!r} belongs to app {owner!r}, which the task does not use"
            )
    for i, act in enumerate(data.get("solution", [])):
        if not isinstance(act, str):
            raise fail(f"solution[{i}]", "must be an action string")
        try:
            parse_action(act, screen)
        except ActionError as e:
            raise fail(f"solution[{i}]", f"is not a valid action: {e}") from None
    if data.get("difficulty", "medium") not in DIFFICULTIES:
        raise fail("difficulty", f"must be one of {DIFFICULTIES}")
    kw = {k: v for k, v in data.items() if k not in ("ans", "version", "note", "apps")}
    return Task(**kw, apps=tuple(apps), path=path)


def _owner(name: Any, kind: str) -> str | None:
    from .registry import CHECKS

    table = CHECKS if kind == "check" else SETUP_OPS
    item = table.get(name)
    return item.app if item is not None else None


def read_task_file(path: str | Path) -> Any:
    """The decoded JSON of a task file; TaskError (naming the file) for anything unreadable."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise TaskError(f"{p}: over {MAX_FILE_BYTES} bytes")
        text = p.read_bytes().decode("utf-8")
        return json.loads(text, parse_constant=_no_constants)
    except UnicodeDecodeError as e:
        raise TaskError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise TaskError(f"{p}: not valid JSON: {e}") from None
    except RecursionError:
        raise TaskError(f"{p}: nested too deeply") from None
    except ValueError as e:
        raise TaskError(f"{p}: {e}") from None
    except OSError as e:
        raise TaskError(f"{p}: cannot read: {e}") from None


def load_task_file(path: str | Path) -> Task:
    try:
        return parse_task(read_task_file(path), str(path))
    except RecursionError:
        raise TaskError(f"{path}: nested too deeply") from None


def _user_dirs(task_dirs: Sequence[str | Path] | None) -> list[Path]:
    env = [d for d in os.environ.get("CODA_TASKS_PATH", "").split(os.pathsep) if d]
    return [Path(d).expanduser() for d in [*env, *(task_dirs or [])]]


def _files(folder: Path, app: str) -> Iterable[Path]:
    yield from sorted(folder.glob("*.json"))
    if (folder / app).is_dir():
        yield from sorted((folder / app).glob("*.json"))


_CACHE: dict[tuple, tuple[dict[str, Task], dict[str, str]]] = {}


def clear_cache() -> None:
    _CACHE.clear()


def _load(app: str, task_dirs: Sequence[str | Path] | None) -> tuple[dict[str, Task], dict[str, str]]:
    spec = get_app_spec(app)
    dirs = _user_dirs(task_dirs)
    key = (generation(), app, tuple(str(d) for d in dirs))  # a registration changes the generation
    if key in _CACHE:
        return _CACHE[key]
    tasks: dict[str, Task] = {}
    broken: dict[str, str] = {}

    def add(t: Task) -> None:
        if t.id in tasks:
            raise TaskError(f"{t.path}: field 'id': {t.id!r} is also used by {tasks[t.id].path}")
        tasks[t.id] = t

    for i, data in enumerate(spec.tasks):
        add(parse_task(data, f"<{app} task {i}>"))
    sources: list[tuple[Path, bool]] = []
    if spec.task_dir is not None and Path(spec.task_dir).is_dir():
        sources += [(f, True) for f in sorted(Path(spec.task_dir).glob("*.json"))]
    for d in dirs:
        if not d.is_dir():
            raise TaskError(f"task folder {d} does not exist (from CODA_TASKS_PATH or task_dirs)")
        sources += [(f, False) for f in _files(d, app)]
    for f, shipped in sources:
        try:
            data = read_task_file(f)
            if not shipped and isinstance(data, dict) and data.get("app") != app:
                continue  # another app's task in a shared user folder
            t = parse_task(data, str(f))
        except (TaskError, RecursionError) as e:
            broken[str(f)] = str(e) if isinstance(e, TaskError) else f"{f}: nested too deeply"
            continue
        if shipped and t.app != app:
            broken[str(f)] = f"{f}: field 'app': {t.app!r} does not match its package {app!r}"
            continue
        add(t)
    _CACHE[key] = (tasks, broken)
    return tasks, broken


def load_tasks(app: str, task_dirs: Sequence[str | Path] | None = None) -> dict[str, Task]:
    """Every valid task of one app, by id, in source order (broken files left out: `broken_tasks`)."""
    return _load(app, task_dirs)[0]


def broken_tasks(app: str, task_dirs: Sequence[str | Path] | None = None) -> dict[str, str]:
    """Task files of one app that failed to load: path -> reason."""
    return _load(app, task_dirs)[1]
