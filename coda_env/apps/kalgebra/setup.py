"""KAlgebra's setup operations: `tab` (switch tab), `console` (evaluate an expression), `func_2d` and
`func_3d` (add a function to a graph). Each is validated on load and performed through the app's own GUI
(the adapter's `run_op`: the keyboard and mouse, as a person would), once the app is ready."""

from __future__ import annotations

from ...registry import SetupContext, SetupError, SetupOp
from .adapter import TABS


def _run(ctx: SetupContext, op: dict) -> None:
    ctx.app.run_op(ctx.desktop, op)


def _expr_validate(op: dict) -> None:
    from ...actions import ActionError, parse_action

    expr = op.get("expr")
    if not isinstance(expr, str) or not expr.strip() or len(expr) > 500:
        raise SetupError("'expr' must be a non-empty string of at most 500 characters")
    try:  # it is typed through the keyboard, so it must be typeable
        parse_action(f"pyautogui.write({expr!r})")
    except ActionError as e:
        raise SetupError(f"'expr' cannot be typed: {e}") from None


def _tab_validate(op: dict) -> None:
    if ("index" in op) == ("name" in op):
        raise SetupError("'tab' needs exactly one of index or name")
    if "index" in op and op["index"] not in range(len(TABS)) or isinstance(op.get("index"), bool):
        raise SetupError(f"'index' must be 0..{len(TABS) - 1}")
    if "name" in op and op["name"] not in TABS:
        raise SetupError(f"'name' must be one of {TABS}")


_EXPR = {"required": {"expr"}}
SETUP_OPS = [
    SetupOp("tab", _run, _tab_validate, optional={"index", "name"}),
    SetupOp("console", _run, _expr_validate, **_EXPR),
    SetupOp("func_2d", _run, _expr_validate, **_EXPR),
    SetupOp("func_3d", _run, _expr_validate, **_EXPR),
]
