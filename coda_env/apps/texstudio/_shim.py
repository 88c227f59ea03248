"""TEMPORARY stand-in for the core pieces of SPEC.md (coda_env.registry, the core setup ops, an episode
runner) until the lead's core refactor is on main. Deleted at merge: nothing outside this package imports it,
and the package imports it only when `coda_env.registry` does not exist.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
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
    task: Any
    open_files: list[str] = field(default_factory=list)


@dataclass
class SetupContext:
    desktop: Any
    app: Any
    home: str
    task: Any
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
        path = confined(self.home, rel)
        try:
            return self.desktop.read_file(path)
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
    tasks: Sequence[dict] = ()
    available: Callable = lambda: None
    scienceboard: Any = None
    scienceboard_names: tuple = ()
    description: str = ""
    env_kwargs: dict = field(default_factory=dict)


APPS: dict[str, AppSpec] = {}
CHECKS: dict[str, CheckType] = {}
SETUP_OPS: dict[str, SetupOp] = {}


def register_app(spec: AppSpec) -> AppSpec:
    for c in spec.checks:
        CHECKS[c.name] = c
    for op in spec.setup_ops:
        SETUP_OPS[op.name] = op
    APPS[spec.name] = spec
    return spec


# ----------------------------------------------------------------------------- the core's write/open ops
def _write_file(ctx: SetupContext, op: dict) -> None:
    ctx.write_file(op["path"], op["content"].encode())


def _open_file(ctx: SetupContext, op: dict) -> None:
    ctx.open_files.append(ctx.path(op["path"]))


SETUP_OPS["write_file"] = SetupOp("write_file", _write_file, phase="files")
SETUP_OPS["open_file"] = SetupOp("open_file", _open_file, phase="files")


def _answer(c: dict, ctx: CheckContext):
    a = ctx.answer
    if a is None:
        return False, "no answer"
    return a.strip() == str(c["value"]).strip(), f"ANS {a!r}, want {c['value']!r}"


CHECKS["answer"] = CheckType("answer", _answer)


# ----------------------------------------------------------------------------- a minimal episode runner
@dataclass
class _Task:
    id: str
    app: str
    instruction: str
    steps: int
    evaluate: list
    initialize: list
    solution: list


def run_episode(task: dict, actions: Sequence[str], desktop=None, keep=False) -> dict:
    """Reset (files ops, launch, ready, app ops), play `actions`, evaluate: what SPEC's env will do."""
    import numpy as np
    from ...actions import TERMINAL_KINDS, parse_action
    from ...backends.local import LocalDesktop
    t = _Task(task["id"], task["app"], task["instruction"], task["steps"], task["evaluate"],
              task.get("initialize", []), task.get("solution", []))
    own = desktop is None
    desktop = desktop or LocalDesktop()
    if not desktop.alive():
        desktop.start()
    spec = APPS[t.app]
    app = spec.adapter()
    home = tempfile.mkdtemp(prefix=f"coda-{t.app}-")
    proc = None
    out: dict = {"timings": {}}
    try:
        t0 = time.monotonic()
        sctx = SetupContext(desktop, app, home, t)
        for op in t.initialize:
            if SETUP_OPS[op["func"]].phase == "files":
                SETUP_OPS[op["func"]].run(sctx, op)
        proc = app.launch(LaunchContext(desktop, home, t, sctx.open_files))
        deadline = time.monotonic() + 30
        while not app.ready(desktop):
            if time.monotonic() > deadline:
                raise AppError("not ready in 30 s")
            time.sleep(0.01)
        for op in t.initialize:
            if SETUP_OPS[op["func"]].phase == "app":
                SETUP_OPS[op["func"]].run(sctx, op)
        out["timings"]["reset"] = time.monotonic() - t0
        answer = None

        def settle():
            last = desktop.screenshot()
            changed = time.monotonic()
            limit = changed + 2.0
            while time.monotonic() - changed < 0.05 and time.monotonic() < limit:
                time.sleep(0.01)
                cur = desktop.screenshot()
                if not np.array_equal(cur, last):
                    last, changed = cur, time.monotonic()
        steps = []
        for a in actions:
            s0 = time.monotonic()
            acts = parse_action(a, (desktop.width, desktop.height))
            for x in acts:
                if x.kind == "answer":
                    answer = x.text
                elif x.kind == "fail":
                    answer = "FAIL"
                if x.kind not in TERMINAL_KINDS:
                    desktop.input(x)
            settle()
            steps.append(time.monotonic() - s0)
            if any(x.kind in TERMINAL_KINDS for x in acts):
                break
        out["timings"]["steps"] = steps
        state = app.state(desktop)
        ctx = CheckContext(answer, t, desktop, home, state, {t.app: state})
        results = []
        for c in t.evaluate:
            try:
                ok, detail = CHECKS[c["type"]].run(c, ctx)
            except (KeyError, TypeError, ValueError) as e:
                ok, detail = False, f"error {e!r}"
            results.append((ok, c["type"], detail))
        out["results"] = results
        out["reward"] = 1.0 if results and all(r[0] for r in results) else 0.0
        out["state"] = state
        out["app"] = app
        if keep:
            out["desktop"], out["home"], out["proc"] = desktop, home, proc
            return out
        return out
    finally:
        if not keep:
            app.close()
            if proc is not None:
                desktop.kill_group(proc)
            shutil.rmtree(home, ignore_errors=True)
            if own:
                desktop.stop()
