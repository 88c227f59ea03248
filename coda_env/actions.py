"""The action language of the coda environments.

Agents emit a short string of pyautogui code (``pyautogui.click(100, 200)``)
or a terminal answer (``DONE``, ``FAIL``, ``WAIT``, ``ANS <text>``).
:func:`parse_action` turns that string into a list of :class:`Action` values.

This module is a security boundary.  The code is only *parsed* with
:mod:`ast` and interpreted against a whitelist of pyautogui functions whose
arguments must be literals; nothing the agent writes is ever executed,
imported or looked up by name.  Anything outside the whitelist raises
:class:`ActionError` with a message saying what was wrong.

For RL libraries, :func:`structured_space` and :func:`from_structured` offer
an array form of a subset of the same actions.
"""

from __future__ import annotations

import ast
import difflib
import io
import math
import operator
import re
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = [
    "KINDS",
    "TERMINAL_KINDS",
    "KEY_NAMES",
    "KEY_ALIASES",
    "STRUCTURED_KINDS",
    "ActionError",
    "Action",
    "parse_action",
    "structured_space",
    "from_structured",
]

# ---------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------

KINDS: tuple[str, ...] = (
    "move",
    "click",
    "mouse_down",
    "mouse_up",
    "drag",
    "scroll",
    "hscroll",
    "type",
    "press",
    "hotkey",
    "key_down",
    "key_up",
    "sleep",
    "done",
    "fail",
    "wait",
    "answer",
)

TERMINAL_KINDS: frozenset[str] = frozenset({"done", "fail", "answer"})

# pyautogui.KEYBOARD_KEYS, normalized: the whitespace characters and the
# duplicate spellings ('return', 'escape', 'del', 'pgup', 'pgdn', ' ') are
# accepted through KEY_ALIASES instead, so every key has exactly one name.
KEY_NAMES: tuple[str, ...] = (
    "!",
    '"',
    "#",
    "$",
    "%",
    "&",
    "'",
    "(",
    ")",
    "*",
    "+",
    ",",
    "-",
    ".",
    "/",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    ":",
    ";",
    "<",
    "=",
    ">",
    "?",
    "@",
    "[",
    "\\",
    "]",
    "^",
    "_",
    "`",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "i",
    "j",
    "k",
    "l",
    "m",
    "n",
    "o",
    "p",
    "q",
    "r",
    "s",
    "t",
    "u",
    "v",
    "w",
    "x",
    "y",
    "z",
    "{",
    "|",
    "}",
    "~",
    "add",
    "alt",
    "altleft",
    "altright",
    "apps",
    "backspace",
    "browserback",
    "browserfavorites",
    "browserforward",
    "browserhome",
    "browserrefresh",
    "browsersearch",
    "browserstop",
    "capslock",
    "clear",
    "convert",
    "ctrl",
    "ctrlleft",
    "ctrlright",
    "decimal",
    "delete",
    "divide",
    "down",
    "end",
    "enter",
    "esc",
    "execute",
    "f1",
    "f2",
    "f3",
    "f4",
    "f5",
    "f6",
    "f7",
    "f8",
    "f9",
    "f10",
    "f11",
    "f12",
    "f13",
    "f14",
    "f15",
    "f16",
    "f17",
    "f18",
    "f19",
    "f20",
    "f21",
    "f22",
    "f23",
    "f24",
    "fn",
    "hanguel",
    "hangul",
    "hanja",
    "help",
    "home",
    "insert",
    "junja",
    "kana",
    "kanji",
    "launchapp1",
    "launchapp2",
    "launchmail",
    "launchmediaselect",
    "left",
    "modechange",
    "multiply",
    "nexttrack",
    "nonconvert",
    "num0",
    "num1",
    "num2",
    "num3",
    "num4",
    "num5",
    "num6",
    "num7",
    "num8",
    "num9",
    "numlock",
    "pagedown",
    "pageup",
    "pause",
    "playpause",
    "prevtrack",
    "print",
    "printscreen",
    "prntscrn",
    "prtsc",
    "prtscr",
    "right",
    "scrolllock",
    "select",
    "separator",
    "shift",
    "shiftleft",
    "shiftright",
    "sleep",
    "space",
    "stop",
    "subtract",
    "tab",
    "up",
    "volumedown",
    "volumemute",
    "volumeup",
    "win",
    "winleft",
    "winright",
    "yen",
    "command",
    "option",
    "optionleft",
    "optionright",
)

KEY_ALIASES: Mapping[str, str] = {
    "return": "enter",
    "escape": "esc",
    "control": "ctrl",
    "cmd": "command",
    "del": "delete",
    "pgup": "pageup",
    "pgdn": "pagedown",
    " ": "space",
    "\n": "enter",
    "\r": "enter",
    "\t": "tab",
}

_KEY_SET = frozenset(KEY_NAMES)

# pyautogui key names with no X keysym at all (Windows IME keys): refused by name, so an agent learns why
NO_X_KEYSYM: Mapping[str, str] = {"accept": "the Windows IME 'accept' key", "final": "the Windows IME 'final' key"}

BUTTONS: Mapping[str, str] = {
    "left": "left",
    "middle": "middle",
    "right": "right",
    "primary": "left",
    "secondary": "right",
}

MAX_CODE_CHARS = 10_000
MAX_TEXT_CHARS = 2_000
MAX_STATEMENTS = 50
MAX_SECONDS = 10.0  # per sleep/duration/interval and in total
MAX_MAGNITUDE = 1e6  # any numeric literal or arithmetic result
MAX_LITERAL_DEPTH = 16  # nesting of tuples/lists/arithmetic
MAX_SEQUENCE = 100  # elements in a tuple/list literal
MAX_HOTKEY_KEYS = 6


class ActionError(ValueError):
    """A rejected action; str(e) says exactly what was wrong (which call, which argument, why)."""


# ---------------------------------------------------------------------------
# The Action value
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One primitive GUI action.

    ``x``/``y`` of ``None`` mean "the current pointer coordinate".  ``seconds``
    is the sleep length for ``sleep`` and the movement duration for ``move``
    and ``drag``; ``amount`` is scroll clicks (positive = up / right).
    """

    kind: str
    x: int | None = None
    y: int | None = None
    button: str = "left"
    clicks: int = 1
    keys: tuple[str, ...] = ()
    presses: int = 1
    text: str = ""
    amount: int = 0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ActionError(f"unknown action kind {self.kind!r}; expected one of {', '.join(KINDS)}")

    @property
    def terminal(self) -> bool:
        """True for DONE, FAIL and ANS (the episode ends)."""
        return self.kind in TERMINAL_KINDS

    def to_pyautogui(self) -> str:
        """Canonical code for this action; ``parse_action(a.to_pyautogui()) == [a]``."""
        k = self.kind
        if k in ("done", "fail", "wait"):
            return k.upper()
        if k == "answer":
            return f"ANS {self.text}"
        if k == "sleep":
            return f"time.sleep({float(self.seconds)!r})"
        if k == "type":
            return f"pyautogui.write({self.text!r})"
        if k == "press":
            keys = repr(self.keys[0]) if len(self.keys) == 1 else repr(list(self.keys))
            extra = f", presses={self.presses}" if self.presses != 1 else ""
            return f"pyautogui.press({keys}{extra})"
        if k == "hotkey":
            return f"pyautogui.hotkey({', '.join(repr(key) for key in self.keys)})"
        if k in ("key_down", "key_up"):
            fn = "keyDown" if k == "key_down" else "keyUp"
            return f"pyautogui.{fn}({self.keys[0]!r})"
        if k in ("scroll", "hscroll"):
            args = [str(self.amount)]
            if self.x is not None:
                args.append(f"x={self.x}")
            if self.y is not None:
                args.append(f"y={self.y}")
            return f"pyautogui.{k}({', '.join(args)})"
        # Pointer actions: move, click, mouse_down, mouse_up, drag.
        fn = {"move": "moveTo", "click": "click", "mouse_down": "mouseDown", "mouse_up": "mouseUp", "drag": "dragTo"}[k]
        args = []
        if self.x is not None or self.y is not None:
            args = [repr(self.x), repr(self.y)]
        if k == "click" and self.clicks != 1:
            args.append(f"clicks={self.clicks}")
        if k in ("move", "drag") and self.seconds:
            args.append(f"duration={float(self.seconds)!r}")
        if k != "move" and self.button != "left":
            args.append(f"button={self.button!r}")
        return f"pyautogui.{fn}({', '.join(args)})"


# ---------------------------------------------------------------------------
# Whitelist: function name -> (kind, parameter names, defaults)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Signature:
    kind: str
    params: tuple[str, ...]  # positional-or-keyword, in pyautogui order
    defaults: Mapping[str, Any] = field(default_factory=dict)  # also fixed values (clicks=2 ...)
    required: tuple[str, ...] = ()
    varargs: str | None = None  # name that collects *args (hotkey)


_CLICK_PARAMS = ("x", "y", "interval", "button", "duration")

PYAUTOGUI_FUNCTIONS: Mapping[str, _Signature] = {
    "moveTo": _Signature("move", ("x", "y", "duration")),
    "click": _Signature("click", ("x", "y", "clicks", "interval", "button", "duration")),
    "leftClick": _Signature("click", ("x", "y", "interval", "duration")),
    "doubleClick": _Signature("click", _CLICK_PARAMS, {"clicks": 2}),
    "tripleClick": _Signature("click", _CLICK_PARAMS, {"clicks": 3}),
    "rightClick": _Signature("click", ("x", "y", "interval", "duration"), {"button": "right"}),
    "middleClick": _Signature("click", ("x", "y", "interval", "duration"), {"button": "middle"}),
    "mouseDown": _Signature("mouse_down", ("x", "y", "button", "duration")),
    "mouseUp": _Signature("mouse_up", ("x", "y", "button", "duration")),
    "dragTo": _Signature("drag", ("x", "y", "duration", "button")),
    "scroll": _Signature("scroll", ("clicks", "x", "y"), required=("clicks",)),
    "vscroll": _Signature("scroll", ("clicks", "x", "y"), required=("clicks",)),
    "hscroll": _Signature("hscroll", ("clicks", "x", "y"), required=("clicks",)),
    "write": _Signature("type", ("message", "interval"), required=("message",)),
    "typewrite": _Signature("type", ("message", "interval"), required=("message",)),
    "press": _Signature("press", ("keys", "presses", "interval"), required=("keys",)),
    "hotkey": _Signature("hotkey", ("interval",), varargs="keys"),
    "keyDown": _Signature("key_down", ("key",), required=("key",)),
    "keyUp": _Signature("key_up", ("key",), required=("key",)),
    "sleep": _Signature("sleep", ("seconds",), required=("seconds",)),
}

TIME_FUNCTIONS: Mapping[str, _Signature] = {
    "sleep": _Signature("sleep", ("secs",), required=("secs",)),
}

_MODULES: Mapping[str, Mapping[str, _Signature]] = {
    "pyautogui": PYAUTOGUI_FUNCTIONS,
    "time": TIME_FUNCTIONS,
}

_ONLY_CALLS = "only pyautogui.<function>(...) and time.sleep(...) calls are accepted"

# Friendly names for rejected syntax; anything else is named by its ast class.
_CONSTRUCTS: Mapping[type, str] = {
    ast.Assign: "assignment",
    ast.AugAssign: "augmented assignment",
    ast.AnnAssign: "annotated assignment",
    ast.For: "for loop",
    ast.AsyncFor: "async for loop",
    ast.While: "while loop",
    ast.If: "if statement",
    ast.With: "with statement",
    ast.AsyncWith: "async with statement",
    ast.FunctionDef: "function definition (def)",
    ast.AsyncFunctionDef: "async function definition (async def)",
    ast.ClassDef: "class definition",
    ast.Return: "return statement",
    ast.Delete: "del statement",
    ast.Raise: "raise statement",
    ast.Try: "try statement",
    ast.Assert: "assert statement",
    ast.Global: "global statement",
    ast.Nonlocal: "nonlocal statement",
    ast.Pass: "pass statement",
    ast.Break: "break statement",
    ast.Continue: "continue statement",
    ast.Match: "match statement",
    ast.ImportFrom: "from-import",
    ast.Lambda: "lambda",
    ast.NamedExpr: "walrus operator (:=)",
    ast.ListComp: "list comprehension",
    ast.SetComp: "set comprehension",
    ast.DictComp: "dict comprehension",
    ast.GeneratorExp: "generator expression",
    ast.JoinedStr: "f-string",
    ast.FormattedValue: "f-string",
    ast.Subscript: "subscript",
    ast.Slice: "slice",
    ast.Attribute: "attribute access",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield from",
    ast.Starred: "starred expression",
    ast.Dict: "dict literal",
    ast.Set: "set literal",
    ast.Compare: "comparison",
    ast.BoolOp: "boolean operator (and/or)",
    ast.IfExp: "conditional expression",
    ast.Call: "function call",
    ast.Name: "name",
    ast.BinOp: "expression",
    ast.UnaryOp: "expression",
    ast.Constant: "constant",
}
if hasattr(ast, "TryStar"):  # Python >= 3.11
    _CONSTRUCTS = {**_CONSTRUCTS, ast.TryStar: "try statement"}

_ARITHMETIC: Mapping[type, tuple[str, Any]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
}


def _construct(node: ast.AST) -> str:
    return _CONSTRUCTS.get(type(node), f"`{type(node).__name__}`")


def _source(node: ast.AST, limit: int = 60) -> str:
    """Short source text of a node, for messages (never evaluated)."""
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError, TypeError, AttributeError):
        return type(node).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------
# Literal evaluation (a tiny interpreter for constants only)
# ---------------------------------------------------------------------------


def _literal(node: ast.AST, depth: int = 0) -> Any:
    """Value of a literal argument: constants, tuples/lists, numeric arithmetic."""
    if depth > MAX_LITERAL_DEPTH:
        raise ActionError("argument is nested too deeply")
    if isinstance(node, ast.Constant):
        value = node.value
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, float)):
            return _check_number(value)
        kind = "bytes literals" if isinstance(value, bytes) else f"{type(value).__name__} constants"
        raise ActionError(f"{kind} are not allowed as arguments")
    if isinstance(node, (ast.Tuple, ast.List)):
        if len(node.elts) > MAX_SEQUENCE:
            raise ActionError(f"sequence has {len(node.elts)} elements (max {MAX_SEQUENCE})")
        return tuple(_literal(elt, depth + 1) for elt in node.elts)
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd)):
            raise ActionError(f"unary operator {type(node.op).__name__} is not allowed; only - and +")
        operand = _number_operand(_literal(node.operand, depth + 1), "unary -/+")
        return _check_number(-operand if isinstance(node.op, ast.USub) else operand)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Pow):
            raise ActionError("the `**` operator is not allowed")
        if type(node.op) not in _ARITHMETIC:
            raise ActionError(f"operator {type(node.op).__name__} is not allowed; only + - * / // % on numbers")
        symbol, apply = _ARITHMETIC[type(node.op)]
        left = _number_operand(_literal(node.left, depth + 1), symbol)
        right = _number_operand(_literal(node.right, depth + 1), symbol)
        if symbol in ("/", "//", "%") and right == 0:
            raise ActionError("division by zero")
        result = apply(left, right)
        return _check_number(result)
    if isinstance(node, ast.Name):
        raise ActionError(f"name `{node.id}` is not allowed; arguments must be literals (no variables)")
    if isinstance(node, ast.Call):
        raise ActionError(f"nested call `{_source(node)}` is not allowed as an argument")
    raise ActionError(f"{_construct(node)} is not allowed as an argument; arguments must be literals")


def _number_operand(value: Any, op: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ActionError(f"`{op}` is only allowed on numbers, not {type(value).__name__}")
    return value


def _check_number(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ActionError(f"number {value!r} is not finite")
    if abs(value) > MAX_MAGNITUDE:
        raise ActionError(f"number is too large (magnitude over {MAX_MAGNITUDE:g})")
    return value


# ---------------------------------------------------------------------------
# Argument validation
# ---------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _coordinate(fn: str, name: str, value: Any, size: int, screen: tuple[int, int]) -> int | None:
    if value is None:
        return None
    if not _is_number(value):
        raise ActionError(f"{fn}: {name} must be a number, got {type(value).__name__} {value!r:.40}")
    pixel = math.floor(value + 0.5)
    if not 0 <= pixel < size:
        raise ActionError(f"{fn}: {name}={pixel} is off the {screen[0]}x{screen[1]} screen")
    return pixel


def _point(fn: str, args: Mapping[str, Any], screen: tuple[int, int]) -> tuple[int | None, int | None]:
    x, y = args.get("x"), args.get("y")
    if isinstance(x, tuple):
        if len(x) != 2:
            raise ActionError(f"{fn}: a point must be an (x, y) pair, got {len(x)} values")
        if y is not None:
            raise ActionError(f"{fn}: x is already an (x, y) pair, so y must not be given")
        x, y = x
        if x is None or y is None:
            raise ActionError(f"{fn}: an (x, y) pair must hold two numbers")
    if isinstance(x, str):
        raise ActionError(f"{fn}: locating images on screen is not supported; x must be a number")
    return (_coordinate(fn, "x", x, screen[0], screen), _coordinate(fn, "y", y, screen[1], screen))


def _integer(fn: str, name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionError(f"{fn}: {name} must be an integer, got {type(value).__name__} {value!r:.40}")
    if not low <= value <= high:
        raise ActionError(f"{fn}: {name}={value} is out of range {low}..{high}")
    return value


def _seconds(fn: str, name: str, value: Any) -> float:
    if not _is_number(value):
        raise ActionError(f"{fn}: {name} must be a number of seconds, got {type(value).__name__} {value!r:.40}")
    if not 0 <= value <= MAX_SECONDS:
        raise ActionError(f"{fn}: {name}={value} must be between 0 and {MAX_SECONDS:g} seconds")
    return float(value)


def _button(fn: str, value: Any) -> str:
    button = BUTTONS.get(value.lower()) if isinstance(value, str) else None
    if button is None:
        raise ActionError(f"{fn}: button={value!r:.40} is not one of {', '.join(BUTTONS)}")
    return button


def _key(fn: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{fn}: a key name must be a string, got {type(value).__name__} {value!r:.40}")
    name = KEY_ALIASES.get(value, value.lower())
    name = KEY_ALIASES.get(name, name)
    if name in NO_X_KEYSYM:
        raise ActionError(f"{fn}: key {name!r} ({NO_X_KEYSYM[name]}) does not exist on an X keyboard")
    if name not in _KEY_SET:
        hint = difflib.get_close_matches(name, KEY_NAMES, n=1)
        suffix = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ActionError(f"{fn}: unknown key {value!r:.40}{suffix}")
    return name


def _keys(fn: str, value: Any, low: int = 1, high: int = MAX_SEQUENCE) -> tuple[str, ...]:
    keys = (value,) if isinstance(value, str) else value
    if not isinstance(keys, tuple):
        raise ActionError(f"{fn}: keys must be a key name or a list of key names, got {type(value).__name__}")
    if not low <= len(keys) <= high:
        raise ActionError(f"{fn}: needs {low} to {high} keys, got {len(keys)}")
    return tuple(_key(fn, key) for key in keys)


def _text(fn: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{fn}: message must be a string, got {type(value).__name__} {value!r:.40}")
    if len(value) > MAX_TEXT_CHARS:
        raise ActionError(f"{fn}: text is too long ({len(value)} characters; max {MAX_TEXT_CHARS})")
    for ch in value:
        if ord(ch) > 126:
            raise ActionError(f"{fn}: typing non-ASCII text is not supported (found {ch!r}, U+{ord(ch):04X})")
        if ch < " " and ch not in "\n\t":
            raise ActionError(f"{fn}: text contains control character U+{ord(ch):04X}; only \\n and \\t are allowed")
    return value


# ---------------------------------------------------------------------------
# Binding a call to the whitelist
# ---------------------------------------------------------------------------


def _argument(fn: str, name: str, node: ast.AST) -> Any:
    """Literal value of one argument; errors name the function and parameter."""
    try:
        return _literal(node)
    except ActionError as exc:
        raise ActionError(f"{fn}: {name}: {exc}") from None
    except RecursionError:
        raise ActionError(f"{fn}: {name}: argument is nested too deeply") from None


def _bind(fn: str, sig: _Signature, call: ast.Call) -> dict[str, Any]:
    """Map the call's literal arguments onto the signature's parameter names."""
    bound: dict[str, Any] = {}
    positional = list(call.args)
    for arg in positional:
        if isinstance(arg, ast.Starred):
            raise ActionError(f"{fn}: starred arguments (*args) are not allowed")
    if sig.varargs:
        bound[sig.varargs] = tuple(_argument(fn, sig.varargs, arg) for arg in positional)
    else:
        if len(positional) > len(sig.params):
            raise ActionError(f"{fn}: takes at most {len(sig.params)} positional arguments, got {len(positional)}")
        for name, arg in zip(sig.params, positional):
            bound[name] = _argument(fn, name, arg)
    for kw in call.keywords:
        if kw.arg is None:
            raise ActionError(f"{fn}: keyword unpacking (**kwargs) is not allowed")
        if kw.arg not in sig.params:
            accepted = ", ".join(sig.params) or "none"
            raise ActionError(f"{fn}: unknown keyword argument {kw.arg!r} (accepted: {accepted})")
        if kw.arg in bound:
            raise ActionError(f"{fn}: got multiple values for {kw.arg!r}")
        bound[kw.arg] = _argument(fn, kw.arg, kw.value)
    for name in sig.required:
        if name not in bound:
            raise ActionError(f"{fn}: missing required argument {name!r}")
    return {**sig.defaults, **bound}


def _build(fn: str, sig: _Signature, args: Mapping[str, Any], screen: tuple[int, int]) -> Action:
    """Validate bound arguments and make the Action."""
    kind = sig.kind
    for name in ("interval", "duration"):
        if name in args:
            _seconds(fn, name, args[name])
    if kind in ("move", "click", "mouse_down", "mouse_up", "drag"):
        x, y = _point(fn, args, screen)
        button = _button(fn, args.get("button", "left"))
        if kind == "move":
            return Action("move", x, y, seconds=float(args.get("duration", 0.0)))
        if kind == "click":
            clicks = _integer(fn, "clicks", args.get("clicks", 1), 1, 3)
            return Action("click", x, y, button=button, clicks=clicks)
        if kind == "drag":
            return Action("drag", x, y, button=button, seconds=float(args.get("duration", 0.0)))
        return Action(kind, x, y, button=button)
    if kind in ("scroll", "hscroll"):
        amount = _integer(fn, "clicks", args["clicks"], -100, 100)
        x, y = _point(fn, args, screen)
        return Action(kind, x, y, amount=amount)
    if kind == "type":
        message = args["message"]
        if isinstance(message, tuple):  # typewrite(['a', 'enter']) presses keys
            return Action("press", keys=_keys(fn, message))
        return Action("type", text=_text(fn, message))
    if kind == "press":
        presses = _integer(fn, "presses", args.get("presses", 1), 1, 100)
        return Action("press", keys=_keys(fn, args["keys"]), presses=presses)
    if kind == "hotkey":
        keys = args["keys"]
        if len(keys) == 1 and isinstance(keys[0], tuple):  # hotkey(['ctrl', 'c'])
            keys = keys[0]
        return Action("hotkey", keys=_keys(fn, keys, 1, MAX_HOTKEY_KEYS))
    if kind in ("key_down", "key_up"):
        return Action(kind, keys=(_key(fn, args["key"]),))
    if kind == "sleep":
        value = args.get("secs", args.get("seconds"))
        return Action("sleep", seconds=_seconds(fn, "seconds", value))
    raise AssertionError(f"unhandled kind {kind}")  # pragma: no cover


# ---------------------------------------------------------------------------
# Statements
# ---------------------------------------------------------------------------


def _check_import(stmt: ast.Import) -> None:
    for alias in stmt.names:
        if alias.name not in _MODULES:
            raise ActionError(f"`import {alias.name}` is not allowed; only `import pyautogui` and `import time`")
        if alias.asname is not None:
            raise ActionError(
                f"`import {alias.name} as {alias.asname}` is not allowed; import aliases are not supported"
            )


def _statement(stmt: ast.stmt, screen: tuple[int, int]) -> Action | None:
    if isinstance(stmt, ast.Import):
        _check_import(stmt)
        return None
    if not isinstance(stmt, ast.Expr):
        raise ActionError(f"{_construct(stmt)} is not allowed; {_ONLY_CALLS}")
    call = stmt.value
    if isinstance(call, ast.Name) and call.id in ("DONE", "FAIL", "WAIT", "ANS"):
        raise ActionError(f"`{call.id}` must be the whole action on its own, not mixed with code")
    if isinstance(call, ast.Name) and call.id.upper() in ("DONE", "FAIL", "WAIT", "ANS"):
        raise ActionError(
            f"name `{call.id}` is not allowed; terminal answers are case-sensitive: DONE, FAIL, WAIT or ANS <text>"
        )
    if not isinstance(call, ast.Call):
        raise ActionError(f"{_construct(call)} `{_source(call)}` is not allowed; {_ONLY_CALLS}")
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in _MODULES):
        raise ActionError(f"`{_source(func)}` is not allowed; {_ONLY_CALLS}")
    module, name = func.value.id, func.attr
    sig = _MODULES[module].get(name)
    if sig is None:
        if module == "time":
            raise ActionError(f"time.{name} is not allowed; only time.sleep(...) is supported")
        supported = ", ".join(PYAUTOGUI_FUNCTIONS)
        raise ActionError(f"pyautogui.{name} is not supported; supported functions: {supported}")
    fn = f"{module}.{name}"
    return _build(fn, sig, _bind(fn, sig, call), screen)


# ---------------------------------------------------------------------------
# Text-level checks
# ---------------------------------------------------------------------------

_FENCE = re.compile(r"\A```[ \t]*([A-Za-z0-9_+.-]*)[ \t]*\n(.*?)\n?[ \t]*```\Z", re.DOTALL)
_FENCE_LANGUAGES = ("", "python", "py", "python3")


def _strip_fence(code: str) -> str:
    match = _FENCE.match(code)
    if match is None or "```" in match.group(2):
        return code
    language = match.group(1)
    if language.lower() not in _FENCE_LANGUAGES:
        raise ActionError(f"code fence language {language!r:.20} is not supported; use ```python")
    return match.group(2).strip()


def _position(code: str, index: int) -> str:
    line = code.count("\n", 0, index) + 1
    column = index - (code.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"


def _check_characters(code: str) -> None:
    for index, ch in enumerate(code):
        if ch not in "\n\t" and not ch.isprintable():
            raise ActionError(
                f"control or non-printable character U+{ord(ch):04X} at {_position(code, index)} is not allowed"
            )


def _first_non_ascii(code: str) -> int | None:
    return next((i for i, ch in enumerate(code) if ord(ch) > 126), None)


def _check_non_ascii_outside_strings(code: str) -> None:
    """Non-ASCII is only tolerated inside string literals (validated later)."""
    if _first_non_ascii(code) is None:
        return
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):  # pragma: no cover - ast.parse succeeded
        tokens = []
    for tok in tokens:
        if tok.type != tokenize.STRING and _first_non_ascii(tok.string) is not None:
            ch = tok.string[_first_non_ascii(tok.string)]
            raise ActionError(
                f"line {tok.start[0]}: non-ASCII character {ch!r} (U+{ord(ch):04X}) is not allowed in code"
            )


def _terminal(code: str) -> list[Action] | None:
    if code in ("DONE", "FAIL", "WAIT"):
        return [Action(code.lower())]
    if code == "ANS" or code.startswith("ANS "):
        text = code[4:].strip()
        if not text:
            raise ActionError("ANS needs an answer text: `ANS <text>`")
        if len(text) > MAX_TEXT_CHARS:
            raise ActionError(f"ANS text is too long ({len(text)} characters; max {MAX_TEXT_CHARS})")
        return [Action("answer", text=text)]
    return None


def _check_screen(screen: tuple[int, int]) -> tuple[int, int]:
    try:
        width, height = screen
    except (TypeError, ValueError):
        raise ValueError(f"screen must be a (width, height) pair, got {screen!r}") from None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0 for v in (width, height)):
        raise ValueError(f"screen must be two positive integers, got {screen!r}")
    return int(width), int(height)


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------


def parse_action(code: str, screen: tuple[int, int] = (1280, 800)) -> list[Action]:
    """Parse one agent action string into a list of Actions (several statements allowed).

    Raise ActionError on anything not whitelisted; the action is accepted or
    rejected as a whole.  Nothing in ``code`` is ever executed.
    """
    screen = _check_screen(screen)
    if not isinstance(code, str):
        raise ActionError(f"action must be a str, got {type(code).__name__}")
    if len(code) > MAX_CODE_CHARS:
        raise ActionError(f"action is too long ({len(code)} characters; max {MAX_CODE_CHARS})")
    code = code.replace("\r\n", "\n")
    _check_characters(code)
    code = code.strip()
    if not code:
        raise ActionError("action is empty; send pyautogui code, DONE, FAIL, WAIT or ANS <text>")
    code = _strip_fence(code)
    if not code:
        raise ActionError("action is an empty code block")
    terminal = _terminal(code)
    if terminal is not None:
        return terminal

    try:
        tree = ast.parse(code, mode="exec")
    except SyntaxError as exc:
        first = _first_non_ascii(code)
        if first is not None:
            ch = code[first]
            raise ActionError(
                f"non-ASCII character {ch!r} (U+{ord(ch):04X}) at {_position(code, first)} is not allowed in code"
            ) from None
        raise ActionError(f"syntax error at line {exc.lineno}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise ActionError(f"action could not be parsed (nested too deeply or invalid): {type(exc).__name__}") from None
    _check_non_ascii_outside_strings(code)

    if len(tree.body) > MAX_STATEMENTS:
        raise ActionError(f"too many statements ({len(tree.body)}; max {MAX_STATEMENTS})")
    actions: list[Action] = []
    for stmt in tree.body:
        try:
            action = _statement(stmt, screen)
        except ActionError as exc:
            raise ActionError(f"line {stmt.lineno}: {exc}") from None
        except RecursionError:
            raise ActionError(f"line {stmt.lineno}: argument is nested too deeply") from None
        if action is not None:
            actions.append(action)
    if not actions:
        raise ActionError("action has no pyautogui call (only imports)")
    total = sum(a.seconds for a in actions)
    if total > MAX_SECONDS:
        raise ActionError(f"total sleep/duration time {total:g} s exceeds the {MAX_SECONDS:g} s limit")
    return actions


STRUCTURED_KINDS: tuple[str, ...] = (
    "move",
    "click",
    "double_click",
    "right_click",
    "drag",
    "scroll",
    "press",
    "hotkey",
    "done",
    "fail",
    "wait",
)

SCROLL_RANGE = 10  # structured "scroll" k means amount k - SCROLL_RANGE


def structured_space(screen: tuple[int, int] = (1280, 800)) -> spaces.Dict:
    """The array form of actions: kind, point, point2, scroll, keys (see module docs)."""
    width, height = _check_screen(screen)
    point = spaces.Box(low=0, high=np.array([width - 1, height - 1]), shape=(2,), dtype=np.int64)
    return spaces.Dict(
        {
            "kind": spaces.Discrete(len(STRUCTURED_KINDS)),
            "point": point,
            "point2": spaces.Box(low=0, high=np.array([width - 1, height - 1]), shape=(2,), dtype=np.int64),
            "scroll": spaces.Discrete(2 * SCROLL_RANGE + 1),
            "keys": spaces.MultiDiscrete([len(KEY_NAMES) + 1] * 3),
        }
    )


def _field(sample: Mapping, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in sample:
        raise ActionError(f"structured action is missing {name!r}")
    try:
        value = np.asarray(sample[name])
    except (ValueError, TypeError) as exc:
        raise ActionError(f"structured action field {name!r} is not an array: {exc}") from None
    if value.shape != shape and not (shape == () and value.shape == (1,)):
        raise ActionError(f"structured action field {name!r} has shape {value.shape}, expected {shape}")
    if value.dtype.kind not in "iu":
        raise ActionError(f"structured action field {name!r} must be integer, got dtype {value.dtype}")
    return value.reshape(shape)


def _structured_point(sample: Mapping, name: str, screen: tuple[int, int]) -> tuple[int, int]:
    x, y = (int(v) for v in _field(sample, name, (2,)))
    if not (0 <= x < screen[0] and 0 <= y < screen[1]):
        raise ActionError(f"structured {name}=({x}, {y}) is off the {screen[0]}x{screen[1]} screen")
    return x, y


def from_structured(sample: Mapping, screen: tuple[int, int] = (1280, 800)) -> list[Action]:
    """Map a structured_space sample (dict of numpy values) to a list of Actions."""
    screen = _check_screen(screen)
    if not isinstance(sample, Mapping):
        raise ActionError(f"structured action must be a mapping, got {type(sample).__name__}")
    index = int(_field(sample, "kind", ()))
    if not 0 <= index < len(STRUCTURED_KINDS):
        raise ActionError(f"structured kind {index} is out of range 0..{len(STRUCTURED_KINDS) - 1}")
    kind = STRUCTURED_KINDS[index]
    if kind in ("done", "fail", "wait"):
        return [Action(kind)]
    if kind in ("press", "hotkey"):
        codes = [int(k) for k in _field(sample, "keys", (3,))]
        if any(not 0 <= k <= len(KEY_NAMES) for k in codes):
            raise ActionError(f"structured keys {codes} out of range 0..{len(KEY_NAMES)}")
        if kind == "press":
            if codes[0] == 0:
                raise ActionError("structured press needs a key in keys[0] (0 means no key)")
            return [Action("press", keys=(KEY_NAMES[codes[0] - 1],))]
        keys = tuple(KEY_NAMES[k - 1] for k in codes if k)
        if not keys:
            raise ActionError("structured hotkey needs at least one non-zero key")
        return [Action("hotkey", keys=keys)]
    x, y = _structured_point(sample, "point", screen)
    if kind == "move":
        return [Action("move", x, y)]
    if kind == "click":
        return [Action("click", x, y)]
    if kind == "double_click":
        return [Action("click", x, y, clicks=2)]
    if kind == "right_click":
        return [Action("click", x, y, button="right")]
    if kind == "drag":
        x2, y2 = _structured_point(sample, "point2", screen)
        return [Action("move", x, y), Action("drag", x2, y2)]
    # scroll
    step = int(_field(sample, "scroll", ()))
    if not 0 <= step <= 2 * SCROLL_RANGE:
        raise ActionError(f"structured scroll {step} is out of range 0..{2 * SCROLL_RANGE}")
    return [Action("scroll", x, y, amount=step - SCROLL_RANGE)]
