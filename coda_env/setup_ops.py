"""Setup operations every app can use in a task's `initialize` list; apps register their own beside these.

All file operations are confined to the app's home folder (a fresh one per reset): a task file cannot write
anywhere else, whatever path it names.
"""

from __future__ import annotations

from .registry import SetupContext, SetupError, SetupOp, confined, register_setup_op, relative_path, validate_item

MAX_CONTENT = 5_000_000


def _check_rel(op: dict, name: str = "path") -> None:
    relative_path(op.get(name), repr(name), SetupError)  # on load: relative, no '..'
    confined("/nonexistent-home", op.get(name), f"{name!r}")  # and the rule it is used under


def _write_validate(op: dict) -> None:
    _check_rel(op)
    if not isinstance(op.get("content"), str):
        raise SetupError("'content' must be a string")
    if len(op["content"]) > MAX_CONTENT:
        raise SetupError(f"'content' is over {MAX_CONTENT} characters")


def _write(ctx: SetupContext, op: dict) -> None:
    ctx.write_file(op["path"], op["content"].encode())


def _open_validate(op: dict) -> None:
    _check_rel(op)


def _open(ctx: SetupContext, op: dict) -> None:
    ctx.open_files.append(ctx.path(op["path"]))


CORE_OPS = [
    SetupOp("write_file", _write, _write_validate, required={"path", "content"}, phase="files"),
    SetupOp("open_file", _open, _open_validate, required={"path"}, phase="files"),
]
for _op in CORE_OPS:
    register_setup_op(_op)


def validate_op(op: object) -> None:
    """SetupError naming the problem if an `initialize` entry is malformed."""
    validate_item(op, "setup_ops")
