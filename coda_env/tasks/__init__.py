"""Task files: JSON package data, one folder per app, validated on load.

A task is data (BrowserGym style: setup is its `initialize` list, validation its `evaluate` list); the env
runs the setup through the app adapter and scores with `checks.run_checks`. A malformed file fails on load
with a message naming the file, the field and the problem.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..actions import ActionError, parse_action
from ..checks import CheckError, validate_check

TASK_DIR = Path(__file__).parent
DIFFICULTIES = ("easy", "medium", "hard")
_FIELDS = {"id": str, "app": str, "instruction": str, "steps": int, "initialize": list, "evaluate": list,
           "solution": list, "difficulty": str, "category": str, "ans": str, "version": str}
_REQUIRED = ("id", "app", "instruction", "steps", "evaluate")


class TaskError(ValueError):
    """A task file is malformed."""


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
    path: str = ""


def parse_task(data: Any, path: str = "<task>", screen: tuple[int, int] = (1280, 800)) -> Task:
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
            raise fail(name, f"must be {want.__name__}, got {type(value).__name__}")
    if not data["instruction"].strip():
        raise fail("instruction", "is empty")
    if not 1 <= data["steps"] <= 100:
        raise fail("steps", f"must be 1..100, got {data['steps']}")
    if not data["evaluate"]:
        raise fail("evaluate", "needs at least one check")
    for i, check in enumerate(data["evaluate"]):
        try:
            validate_check(check)
        except CheckError as e:
            raise fail(f"evaluate[{i}]", str(e)) from None
    for i, op in enumerate(data.get("initialize", [])):
        if not isinstance(op, dict) or not isinstance(op.get("func"), str):
            raise fail(f"initialize[{i}]", "must be an object with a string 'func'")
    for i, act in enumerate(data.get("solution", [])):
        if not isinstance(act, str):
            raise fail(f"solution[{i}]", "must be an action string")
        try:
            parse_action(act, screen)
        except ActionError as e:
            raise fail(f"solution[{i}]", f"is not a valid action: {e}") from None
    if data.get("difficulty", "medium") not in DIFFICULTIES:
        raise fail("difficulty", f"must be one of {DIFFICULTIES}")
    kw = {k: v for k, v in data.items() if k not in ("ans", "version")}
    return Task(**kw, path=path)


def load_task_file(path: str | Path) -> Task:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise TaskError(f"{p}: not valid JSON: {e}") from None
    except OSError as e:
        raise TaskError(f"{p}: cannot read: {e}") from None
    return parse_task(data, str(p))


@lru_cache(maxsize=None)
def load_tasks(app: str) -> dict[str, Task]:
    """Every task of one app, by id, in file order."""
    folder = TASK_DIR / app
    if not folder.is_dir():
        raise TaskError(f"no task folder for app {app!r} ({folder})")
    tasks: dict[str, Task] = {}
    for f in sorted(folder.glob("*.json")):
        t = load_task_file(f)
        if t.app != app:
            raise TaskError(f"{f}: field 'app': {t.app!r} does not match its folder {app!r}")
        if t.id in tasks:
            raise TaskError(f"{f}: field 'id': {t.id!r} is also used by {tasks[t.id].path}")
        tasks[t.id] = t
    return tasks
