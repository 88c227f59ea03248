"""TEMPORARY (deleted at merge): the SPEC.md core names this package needs, until coda_env.registry lands.

Imports the real ones when the core is there; otherwise minimal stand-ins with the same fields.
"""
from __future__ import annotations

try:  # the core (SPEC.md)
    from ...registry import (AppError, AppSpec, CheckContext, CheckError, CheckType, LaunchContext,  # noqa: F401
                             SetupContext, SetupError, SetupOp, confined, register_app)
    from ...checks import compile_predicate, translate_lambda  # noqa: F401
    CORE = True
except ImportError:
    import os
    from dataclasses import dataclass, field
    from typing import Any, Callable, Sequence

    from .. import AppError  # noqa: F401  (the pre-core AppError, so the current env catches it)

    CORE = False

    class CheckError(ValueError):
        pass

    class SetupError(ValueError):
        pass

    def confined(home: str, rel: str, what: str = "path") -> str:
        if not isinstance(rel, str) or not rel or "\x00" in rel or os.path.isabs(rel) or rel.startswith("~"):
            raise SetupError(f"{what} {rel!r} must be a relative path inside the app's home folder")
        root = os.path.realpath(home)
        full = os.path.realpath(os.path.join(root, rel))
        if full != root and not full.startswith(root + os.sep):
            raise SetupError(f"{what} {rel!r} leaves the app's home folder")
        return full

    def compile_predicate(src):
        raise CheckError("predicate expressions need the core's compile_predicate (not on main yet)")

    def translate_lambda(src):
        raise CheckError("lambda translation needs the core's translate_lambda (not on main yet)")

    def _none(item):
        return None

    @dataclass(frozen=True)
    class CheckType:
        name: str
        run: Callable
        validate: Callable = _none
        fields: tuple = (frozenset(), frozenset())

    @dataclass(frozen=True)
    class SetupOp:
        name: str
        run: Callable
        validate: Callable = _none
        fields: tuple = (frozenset(), frozenset())
        phase: str = "app"

    @dataclass
    class AppSpec:
        name: str
        env_id: str
        adapter: Callable
        checks: Sequence = ()
        setup_ops: Sequence = ()
        task_dir: Any = None
        available: Callable = lambda: None
        scienceboard: Any = None
        scienceboard_names: tuple = ()
        description: str = ""
        env_kwargs: dict = field(default_factory=dict)

    @dataclass
    class LaunchContext:
        desktop: Any
        home: str
        task: Any = None
        open_files: list = field(default_factory=list)

    @dataclass
    class SetupContext:
        desktop: Any
        app: Any
        home: str
        task: Any = None
        open_files: list = field(default_factory=list)

        def path(self, rel):
            return confined(self.home, rel)

        def write_file(self, rel, data):
            self.desktop.write_file(self.path(rel), data)

    @dataclass
    class CheckContext:
        answer: Any = None
        task: Any = None
        desktop: Any = None
        home: Any = None
        state: dict = field(default_factory=dict)
        states: dict = field(default_factory=dict)

        def read_file(self, rel):
            try:
                return self.desktop.read_file(confined(self.home, rel))
            except FileNotFoundError:
                return None

    SPECS: dict = {}

    def register_app(spec):
        SPECS[spec.name] = spec
        return spec
