"""Where apps, check types and setup operations register, and what the core knows of them.

An app is a package under `coda_env/apps/<app>/` whose `__init__` calls `register_app(AppSpec(...))`. That
one call adds its env id (to gymnasium's registry), its check types and its setup operations; the env, the
task loader and the `coda` command read these tables and never name an app. A test can register a
throwaway app the same way (see `coda_env.apps._fake`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Collection, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from .backends.base import Desktop


class CheckError(ValueError):
    """A check definition is malformed (raised when a task file loads)."""


class SetupError(ValueError):
    """A setup operation is malformed, or asked for something outside the app's home."""


class AppError(RuntimeError):
    """The application is missing, crashed, or did not become ready."""


# ------------------------------------------------------------------------------------------ task-file values
MAX_VALUE = 1e100  # any number a task file compares with or tolerates (finite, well short of overflow)
MAX_PATH = 1000  # characters of a path in a task file


def number(
    value: Any,
    what: str,
    low: float = -MAX_VALUE,
    high: float = MAX_VALUE,
    *,
    integer: bool = False,
    error: type[Exception] = ValueError,
) -> float:
    """`value` if it is a finite number (an integer when asked; never a bool) in [low, high]; else `error`
    naming `what` and the bounds. Every numeric field of a setup operation or a check goes through it."""
    kind = "an integer" if integer else "a finite number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise error(f"{what} must be {kind} in [{low:g}, {high:g}], got {value!r}")
    if not math.isfinite(value) or not low <= value <= high:
        raise error(f"{what} must be {kind} in [{low:g}, {high:g}], got {value!r}")
    return value


def finite_values(value: Any, what: str, error: type[Exception] = ValueError, _depth: int = 0) -> None:
    """Every number inside a JSON value (an expected value of a check) finite and within MAX_VALUE."""
    if _depth > 32:
        raise error(f"{what} is nested too deeply")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number(value, what, error=error)
    elif isinstance(value, list):
        for v in value:
            finite_values(v, what, error, _depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            finite_values(v, what, error, _depth + 1)


def relative_path(rel: Any, what: str = "path", error: type[Exception] = ValueError) -> str:
    """A task file's path as it must be written: relative to the app's home, no `..`, no `~`, not absolute,
    at most MAX_PATH characters (checked on load; `confined` checks it again where it is used)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or len(rel) > MAX_PATH:
        raise error(f"{what} must be a relative path of 1..{MAX_PATH} characters, got {str(rel)[:80]!r}")
    if os.path.isabs(rel) or rel.startswith("~"):
        raise error(f"{what} {rel[:80]!r} must be relative to the app's home folder, not absolute")
    if ".." in rel.replace("\\", "/").split("/"):
        raise error(
            f"{what} {rel[:80]!r} has '..': a task file's paths never climb, so none leaves the app's home folder"
        )
    return rel


# ------------------------------------------------------------------------------------------ contexts
def confined(home: str, rel: str, what: str = "path") -> str:
    """`rel` as an absolute path inside `home`; a task file cannot name anything outside it."""
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
    desktop: "Desktop"
    home: str  # a fresh folder per reset: the app's HOME, profile and task files
    task: Any  # the episode's tasks.Task (the registry imports no task code)
    open_files: list[str] = field(default_factory=list)  # absolute paths in home that setup ops asked to open


@dataclass
class SetupContext:
    desktop: "Desktop"
    app: "App"  # the adapter of the app the operation belongs to
    home: str
    task: Any  # the episode's tasks.Task (the registry imports no task code)
    open_files: list[str] = field(default_factory=list)

    def path(self, rel: str) -> str:
        return confined(self.home, rel)

    def write_file(self, rel: str, data: bytes) -> None:
        self.desktop.write_file(self.path(rel), data)


@dataclass
class CheckContext:
    answer: str | None  # the agent's ANS text ("FAIL" after FAIL), None if it gave none
    task: Any = None  # tasks.Task
    desktop: "Desktop | None" = None
    home: str | None = None
    state: dict = field(default_factory=dict)  # the main app's state, read once per evaluation
    states: dict[str, dict] = field(default_factory=dict)  # every app of the task, by name

    def state_of(self, app: str | None) -> dict:
        if app is None:
            return self.state
        if app not in self.states:
            raise KeyError(f"the task has no app {app!r} (apps: {', '.join(self.states) or 'none'})")
        return self.states[app]

    def read_file(self, rel: str) -> bytes | None:
        """A file of the app's home (None when missing); paths outside home are refused."""
        if self.home is None or self.desktop is None:
            raise CheckError("this check reads files, and the episode has no home folder")
        path = confined(self.home, rel)
        try:
            return self.desktop.read_file(path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None


# ------------------------------------------------------------------------------------------ protocols
@runtime_checkable
class App(Protocol):
    """What the env calls on an app adapter (one adapter per env)."""

    name: str

    def launch(self, ctx: LaunchContext) -> subprocess.Popen:
        """Start the app on ctx.desktop with HOME = ctx.home; return its process (a group of its own)."""

    def ready(self, desktop: "Desktop") -> bool:
        """Polled after launch until true (never a fixed wait); may raise AppError (it exited)."""

    def state(self, desktop: "Desktop") -> dict[str, Any]:
        """What the checks read; raise AppError when it cannot be read."""

    def a11y_text(self, desktop: "Desktop") -> str:
        """The accessible elements on screen as compact, bounded text (the `a11y_tree` observation)."""

    def close(self) -> None:
        """Drop connections to the app (the env kills its process group)."""


def _no_validate(item: dict) -> None:
    return None


def _name_fields(item) -> None:
    """required/optional as frozensets, and `fields` as their pair (given positionally: taken apart)."""
    if item.fields and not (item.required or item.optional):
        req, opt = item.fields
        object.__setattr__(item, "required", req)
        object.__setattr__(item, "optional", opt)
    object.__setattr__(item, "required", frozenset(item.required))
    object.__setattr__(item, "optional", frozenset(item.optional))
    object.__setattr__(item, "fields", (item.required, item.optional))


@dataclass(frozen=True)
class CheckType:
    """A check type: `run(check, ctx) -> (passed, detail)`, `validate(check)` on load, and the fields a check
    of this type has, by name: `required=`, `optional=` (neither: any). `fields` is the pair they make."""

    name: str
    run: Callable[[dict, CheckContext], tuple[bool, str]]
    validate: Callable[[dict], None] = _no_validate
    fields: tuple = ()  # (required, optional), derived; the old positional form still works
    app: str | None = None  # the app that registered it (None: core)
    required: Collection[str] = frozenset()
    optional: Collection[str] = frozenset()

    def __post_init__(self) -> None:
        _name_fields(self)


@dataclass(frozen=True)
class SetupOp:
    """A setup operation: `run(ctx, op)` in its `phase`, `validate(op)` on load, its fields by name
    (`required=`, `optional=`)."""

    name: str
    run: Callable[[SetupContext, dict], None]
    validate: Callable[[dict], None] = _no_validate
    fields: tuple = ()  # (required, optional), derived
    phase: str = "app"  # "files": before launch; "app": once the app is ready
    app: str | None = None
    required: Collection[str] = frozenset()
    optional: Collection[str] = frozenset()

    def __post_init__(self) -> None:
        _name_fields(self)
        if self.phase not in ("files", "app"):
            raise ValueError(f"setup op {self.name!r}: phase must be 'files' or 'app'")


@dataclass
class AppSpec:
    name: str  # the task files' "app"
    env_id: str  # "coda/KAlgebra-v0"
    adapter: Callable[[], App]  # a fresh adapter per env
    checks: Sequence[CheckType] = ()
    setup_ops: Sequence[SetupOp] = ()
    task_dir: Path | None = None  # the package's tasks/ folder
    tasks: Sequence[dict] = ()  # tasks given inline (a test's throwaway app)
    families: Sequence[Any] = ()  # families.Family generators of seeded task instances
    available: Callable[[], str | None] = lambda: None  # None: runnable here; else one line: what is missing
    scienceboard: Any = None  # module with convert(sb_task, path) -> coda task dict
    scienceboard_names: tuple[str, ...] = ()  # ScienceBoard "type" values / folders it translates
    scienceboard_options: dict = field(default_factory=dict)  # import options its translation takes: name -> help
    description: str = ""
    env_kwargs: dict = field(default_factory=dict)  # defaults passed to CodaEnv by gym.make


def check_fields(item: dict, fields: tuple, what: str, key: str, error: type[Exception]) -> None:
    """The fields an item (a check, a setup operation) declares: required present, nothing unknown ("note" and
    its `key` aside); no declared fields means any."""
    required, optional = (set(f) for f in fields)
    missing = required - item.keys()
    if missing:
        raise error(f"{what} lacks {', '.join(sorted(missing))}")
    if required or optional:
        extra = item.keys() - required - optional - {key, "note"}
        if extra:
            raise error(f"{what} has unknown fields {', '.join(sorted(extra))}")


APPS: dict[str, AppSpec] = {}
CHECKS: dict[str, CheckType] = {}
SETUP_OPS: dict[str, SetupOp] = {}
BROKEN_APPS: dict[str, str] = {}  # app packages that failed to import: name -> reason
# Counts the changes of the tables above: a cache of what was derived from them (tasks.py's parsed task
# files) keys on it, so the registry needs to know nothing of its readers.
_generation = 0


def generation() -> int:
    """How many times an app was registered or removed (a reader's cache key)."""
    return _generation


def validate_item(item: Any, table: str) -> None:
    """The one check of a task file's item against what registered it: a check (`table` "checks", keyed by
    "type", CheckError) or a setup operation ("setup_ops", keyed by "func", SetupError): a known name, the
    declared fields, then the registrant's own validation."""
    if table == "checks":
        if not isinstance(item, dict):
            raise CheckError(f"a check must be an object, got {type(item).__name__}")
        name = item.get("type")
        if not isinstance(name, str) or name not in CHECKS:
            raise CheckError(f"unknown check type {name!r}; known: {', '.join(sorted(CHECKS))}")
        entry: CheckType | SetupOp = CHECKS[name]
        check_fields(item, entry.fields, f"check {name!r}", "type", CheckError)
    elif table == "setup_ops":
        if not isinstance(item, dict) or not isinstance(item.get("func"), str):
            raise SetupError("must be an object with a string 'func'")
        name = item["func"]
        if name not in SETUP_OPS:
            raise SetupError(f"unknown setup operation {name!r}; known: {', '.join(sorted(SETUP_OPS))}")
        entry = SETUP_OPS[name]
        check_fields(item, entry.fields, f"operation {name!r}", "func", SetupError)
    else:
        raise ValueError(f"no table {table!r}: 'checks' or 'setup_ops'")
    entry.validate(item)


def register_check(check: CheckType, app: str | None = None) -> CheckType:
    if check.name in CHECKS and CHECKS[check.name].app != app:  # an app registered again replaces its own
        owner = CHECKS[check.name].app or "core"
        raise ValueError(f"check type {check.name!r} is already registered (by {owner})")
    check = check if check.app == app else dataclasses.replace(check, app=app)
    CHECKS[check.name] = check
    return check


def register_setup_op(op: SetupOp, app: str | None = None) -> SetupOp:
    if op.name in SETUP_OPS and SETUP_OPS[op.name].app != app:
        raise ValueError(f"setup operation {op.name!r} is already registered (by {SETUP_OPS[op.name].app or 'core'})")
    op = op if op.app == app else dataclasses.replace(op, app=app)
    SETUP_OPS[op.name] = op
    return op


def register_app(spec: AppSpec) -> AppSpec:
    """Add an app: its env id, check types and setup operations. Registering the same name again replaces
    it (a test's throwaway app); a check type or op name owned by another app is an error."""
    from gymnasium.envs.registration import register, registry

    for c in spec.checks:
        register_check(c, spec.name)
    for op in spec.setup_ops:
        register_setup_op(op, spec.name)
    APPS[spec.name] = spec
    if spec.env_id in registry:
        del registry[spec.env_id]
    register(id=spec.env_id, entry_point="coda_env.env:CodaEnv", kwargs={"app": spec.name, **spec.env_kwargs})
    global _generation
    _generation += 1
    return spec


def unregister_app(name: str) -> None:
    """Remove an app and what it registered (tests' throwaway apps)."""
    from gymnasium.envs.registration import registry

    spec = APPS.pop(name, None)
    if spec is None:
        return
    for table in (CHECKS, SETUP_OPS):
        for k in [k for k, v in table.items() if v.app == name]:
            del table[k]
    registry.pop(spec.env_id, None)
    global _generation
    _generation += 1


def get_app_spec(name: str) -> AppSpec:
    if name not in APPS:
        known = ", ".join(sorted(APPS)) or "none"
        extra = f"; app packages that failed to load: {BROKEN_APPS}" if BROKEN_APPS else ""
        raise AppError(f"unknown app {name!r}; known apps: {known}{extra}")
    return APPS[name]


def app_for_env(env_id: str) -> AppSpec:
    for spec in APPS.values():
        if spec.env_id == env_id:
            return spec
    raise AppError(f"no app registers env id {env_id!r}; known: {', '.join(s.env_id for s in APPS.values())}")
