"""Tests for coda_env.actions: the whitelist parser of agent actions."""

from __future__ import annotations

import ast
import builtins
import os
import sys

import numpy as np
import pytest
from gymnasium import spaces

from coda_env.actions import (
    KEY_NAMES,
    KINDS,
    STRUCTURED_KINDS,
    TERMINAL_KINDS,
    Action,
    ActionError,
    from_structured,
    parse_action,
    structured_space,
)

pytestmark = pytest.mark.fast  # pure logic: no X server

A = Action

# ---------------------------------------------------------------------------
# Valid actions: (code, expected actions)
# ---------------------------------------------------------------------------

VALID: list[tuple[str, list[Action]]] = [
    # click family
    ("pyautogui.click(100, 200)", [A("click", 100, 200)]),
    ("pyautogui.click()", [A("click")]),
    (
        "pyautogui.click(x=100, y=200, clicks=2, interval=0.1, button='right', duration=0.2)",
        [A("click", 100, 200, button="right", clicks=2)],
    ),
    ("pyautogui.click((100, 200))", [A("click", 100, 200)]),
    ("pyautogui.click([100.4, 199.5])", [A("click", 100, 200)]),
    ("pyautogui.click(x=(3, 4), clicks=3)", [A("click", 3, 4, clicks=3)]),
    ("pyautogui.click(640/2, 400-10)", [A("click", 320, 390)]),
    ("pyautogui.click(-(-5), +7)", [A("click", 5, 7)]),
    ("pyautogui.click(7 // 2, 7 % 4)", [A("click", 3, 3)]),
    ("pyautogui.click(2 * 3.5, 10 + 2 - 1)", [A("click", 7, 11)]),
    ("pyautogui.click(100)", [A("click", 100, None)]),
    ("pyautogui.click(y=5)", [A("click", None, 5)]),
    ("pyautogui.click(None, None, 1)", [A("click")]),
    ("pyautogui.click(1279, 799, button='primary')", [A("click", 1279, 799)]),
    ("pyautogui.click(0, 0, button='secondary')", [A("click", 0, 0, button="right")]),
    ("pyautogui.click(10, 20, 2, 0.0, 'middle')", [A("click", 10, 20, button="middle", clicks=2)]),
    ("pyautogui.leftClick(5, 6)", [A("click", 5, 6)]),
    ("pyautogui.doubleClick(10, 20)", [A("click", 10, 20, clicks=2)]),
    ("pyautogui.doubleClick(x=10, y=20, interval=0.2, button='right')", [A("click", 10, 20, button="right", clicks=2)]),
    ("pyautogui.tripleClick(x=10, y=20, button='middle')", [A("click", 10, 20, button="middle", clicks=3)]),
    ("pyautogui.rightClick(10, 20)", [A("click", 10, 20, button="right")]),
    ("pyautogui.rightClick()", [A("click", button="right")]),
    ("pyautogui.middleClick((10, 20), duration=0.1)", [A("click", 10, 20, button="middle")]),
    # pointer
    ("pyautogui.moveTo(300, 400)", [A("move", 300, 400)]),
    ("pyautogui.moveTo(300, 400, 0.5)", [A("move", 300, 400, seconds=0.5)]),
    ("pyautogui.moveTo(x=(3, 4), duration=1)", [A("move", 3, 4, seconds=1.0)]),
    ("pyautogui.mouseDown(10, 10)", [A("mouse_down", 10, 10)]),
    ("pyautogui.mouseDown()", [A("mouse_down")]),
    ("pyautogui.mouseDown(10, 10, 'right')", [A("mouse_down", 10, 10, button="right")]),
    ("pyautogui.mouseUp(button='right')", [A("mouse_up", button="right")]),
    ("pyautogui.mouseUp(x=1, y=2)", [A("mouse_up", 1, 2)]),
    ("pyautogui.dragTo(500, 600)", [A("drag", 500, 600)]),
    ("pyautogui.dragTo(500, 600, 1.0, 'left')", [A("drag", 500, 600, seconds=1.0)]),
    ("pyautogui.dragTo((500, 600), duration=2, button='right')", [A("drag", 500, 600, button="right", seconds=2.0)]),
    # scrolling
    ("pyautogui.scroll(-5)", [A("scroll", amount=-5)]),
    ("pyautogui.scroll(3, 100, 200)", [A("scroll", 100, 200, amount=3)]),
    ("pyautogui.scroll(clicks=10, x=5, y=6)", [A("scroll", 5, 6, amount=10)]),
    ("pyautogui.scroll(2, x=(5, 6))", [A("scroll", 5, 6, amount=2)]),
    ("pyautogui.vscroll(2)", [A("scroll", amount=2)]),
    ("pyautogui.hscroll(-4, 10, 10)", [A("hscroll", 10, 10, amount=-4)]),
    ("pyautogui.hscroll(100)", [A("hscroll", amount=100)]),
    # typing
    ("pyautogui.write('hello world')", [A("type", text="hello world")]),
    ("pyautogui.typewrite('x:=2\\n', interval=0.05)", [A("type", text="x:=2\n")]),
    ("pyautogui.write(message='a\\tb')", [A("type", text="a\tb")]),
    ('pyautogui.write("it\'s \\"quoted\\"")', [A("type", text='it\'s "quoted"')]),
    ("pyautogui.write('a' 'b')", [A("type", text="ab")]),
    ("pyautogui.write('')", [A("type", text="")]),
    ("pyautogui.write('~!@#$%^&*()_+{}|:<>?')", [A("type", text="~!@#$%^&*()_+{}|:<>?")]),
    ("pyautogui.typewrite(['a', 'b', 'enter'])", [A("press", keys=("a", "b", "enter"))]),
    # keys
    ("pyautogui.press('enter')", [A("press", keys=("enter",))]),
    ("pyautogui.press('Return')", [A("press", keys=("enter",))]),
    ("pyautogui.press(['tab', 'tab'], presses=2)", [A("press", keys=("tab", "tab"), presses=2)]),
    ("pyautogui.press('esc', 3)", [A("press", keys=("esc",), presses=3)]),
    ("pyautogui.press(keys='pgdn', interval=0.1)", [A("press", keys=("pagedown",))]),
    ("pyautogui.press('pgup')", [A("press", keys=("pageup",))]),
    ("pyautogui.press('\\n')", [A("press", keys=("enter",))]),
    ("pyautogui.press(' ')", [A("press", keys=("space",))]),
    ("pyautogui.press('F5')", [A("press", keys=("f5",))]),
    ("pyautogui.press('\\\\')", [A("press", keys=("\\",))]),
    ('pyautogui.press("\'")', [A("press", keys=("'",))]),
    ("pyautogui.hotkey('ctrl', 's')", [A("hotkey", keys=("ctrl", "s"))]),
    ("pyautogui.hotkey('Control', 'Shift', 'T', interval=0.1)", [A("hotkey", keys=("ctrl", "shift", "t"))]),
    ("pyautogui.hotkey(['cmd', 'c'])", [A("hotkey", keys=("command", "c"))]),
    ("pyautogui.hotkey('escape')", [A("hotkey", keys=("esc",))]),
    (
        "pyautogui.hotkey('ctrl', 'alt', 'shift', 'win', 'f1', 'a')",
        [A("hotkey", keys=("ctrl", "alt", "shift", "win", "f1", "a"))],
    ),
    ("pyautogui.keyDown('shift')", [A("key_down", keys=("shift",))]),
    ("pyautogui.keyUp(key='del')", [A("key_up", keys=("delete",))]),
    # sleeping
    ("time.sleep(1)", [A("sleep", seconds=1.0)]),
    ("pyautogui.sleep(0.5)", [A("sleep", seconds=0.5)]),
    ("import time\ntime.sleep(2.5)", [A("sleep", seconds=2.5)]),
    ("time.sleep(5)\ntime.sleep(5)", [A("sleep", seconds=5.0)] * 2),
    ("time.sleep(0)", [A("sleep", seconds=0.0)]),
    # several statements, imports, fences, comments, layout
    (
        "import pyautogui\npyautogui.write('x:=2')\npyautogui.press('enter')",
        [A("type", text="x:=2"), A("press", keys=("enter",))],
    ),
    (
        "import pyautogui, time\npyautogui.click(1, 1); time.sleep(0.5); pyautogui.write('a')",
        [A("click", 1, 1), A("sleep", seconds=0.5), A("type", text="a")],
    ),
    (
        "import pyautogui\nimport time\npyautogui.hotkey('ctrl', 'a')\npyautogui.press('backspace')",
        [A("hotkey", keys=("ctrl", "a")), A("press", keys=("backspace",))],
    ),
    ("```python\npyautogui.click(1, 2)\n```", [A("click", 1, 2)]),
    ("```\npyautogui.click(1, 2)\npyautogui.click(3, 4)\n```", [A("click", 1, 2), A("click", 3, 4)]),
    ("  ```py\nDONE\n```  ", [A("done")]),
    ("# click the OK button\npyautogui.click(10, 10)  # there", [A("click", 10, 10)]),
    ("pyautogui.click(1, 2)\r\npyautogui.click(3, 4)", [A("click", 1, 2), A("click", 3, 4)]),
    ("pyautogui.click(\n    100,\n    200,\n)", [A("click", 100, 200)]),
    ("\n\n    pyautogui.click(1, 2)\n\n", [A("click", 1, 2)]),
    ("pyautogui.press('a')\n" * 50, [A("press", keys=("a",))] * 50),
    (
        "pyautogui.moveTo(1, 1, duration=4)\npyautogui.dragTo(5, 5, duration=3)\ntime.sleep(3)",
        [A("move", 1, 1, seconds=4.0), A("drag", 5, 5, seconds=3.0), A("sleep", seconds=3.0)],
    ),
    # terminal answers
    ("DONE", [A("done")]),
    ("  DONE  \n", [A("done")]),
    ("FAIL", [A("fail")]),
    ("WAIT", [A("wait")]),
    ("ANS 42", [A("answer", text="42")]),
    ("ANS   spaced out  ", [A("answer", text="spaced out")]),
    (
        "ANS The answer is 3.14 \u2014 \u03c0 \u2248 3.14159 \u2713",
        [A("answer", text="The answer is 3.14 \u2014 \u03c0 \u2248 3.14159 \u2713")],
    ),
    ("ANS \u6771\u4eac\nline two", [A("answer", text="\u6771\u4eac\nline two")]),
    ("ANS " + "x" * 2000, [A("answer", text="x" * 2000)]),
]


@pytest.mark.parametrize("code,expected", VALID, ids=[repr(c[:60]) for c, _ in VALID])
def test_valid(code: str, expected: list[Action]) -> None:
    assert parse_action(code) == expected


@pytest.mark.parametrize("code,expected", VALID, ids=[repr(c[:60]) for c, _ in VALID])
def test_round_trip(code: str, expected: list[Action]) -> None:
    for action in parse_action(code):
        assert parse_action(action.to_pyautogui()) == [action], action.to_pyautogui()


def test_canonical_code_examples() -> None:
    assert (
        A("click", 1, 2, button="right", clicks=2).to_pyautogui() == "pyautogui.click(1, 2, clicks=2, button='right')"
    )
    assert A("press", keys=("enter",), presses=3).to_pyautogui() == "pyautogui.press('enter', presses=3)"
    assert A("type", text="a'b\n").to_pyautogui() == 'pyautogui.write("a\'b\\n")'
    assert A("answer", text="42").to_pyautogui() == "ANS 42"
    assert [A(k).to_pyautogui() for k in ("done", "fail", "wait")] == ["DONE", "FAIL", "WAIT"]


def test_other_screen_size() -> None:
    assert parse_action("pyautogui.click(1900, 1000)", screen=(1920, 1080)) == [A("click", 1900, 1000)]
    with pytest.raises(ActionError, match="off the 640x480 screen"):
        parse_action("pyautogui.click(700, 10)", screen=(640, 480))


def test_constants() -> None:
    assert KINDS == (
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
    assert TERMINAL_KINDS == {"done", "fail", "answer"}
    assert STRUCTURED_KINDS == (
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
    assert len(set(KEY_NAMES)) == len(KEY_NAMES)
    assert all(k == k.lower() and k.isprintable() for k in KEY_NAMES)
    for key in (
        "enter",
        "tab",
        "esc",
        "backspace",
        "ctrl",
        "ctrlleft",
        "shift",
        "alt",
        "win",
        "command",
        "up",
        "f1",
        "f24",
        "a",
        "0",
        "/",
        "space",
        "delete",
        "pageup",
    ):
        assert key in KEY_NAMES
    assert A("answer", text="x").terminal and not A("wait").terminal
    with pytest.raises(ActionError, match="unknown action kind"):
        A("teleport")


# ---------------------------------------------------------------------------
# Hostile and malformed actions: (code, substring the message must contain)
# <TMP> is replaced by a sentinel directory; if any payload ran, it would
# create a file there or set an attribute on a module.
# ---------------------------------------------------------------------------

SENTINEL_ATTR = "PWNED_BY_CODA_TEST"

SENTINEL_PAYLOADS: list[tuple[str, str]] = [
    ("open(r'<TMP>/pwned_open', 'w')", "`open` is not allowed"),
    ("__import__('pathlib').Path(r'<TMP>/pwned_pathlib').touch()", "__import__"),
    (f"import builtins; builtins.{SENTINEL_ATTR} = 1", "`import builtins` is not allowed"),
    (f"__builtins__.{SENTINEL_ATTR} = 1", "assignment"),
    (f"__import__('builtins').{SENTINEL_ATTR} = 1", "assignment"),
    (f"setattr(__import__('sys'), '{SENTINEL_ATTR}', 1)", "`setattr"),
    (f"import os; os.{SENTINEL_ATTR} = 1", "`import os` is not allowed"),
    ("exec(\"open(r'<TMP>/pwned_exec', 'w')\")", "`exec` is not allowed"),
    ("eval(\"__import__('os').mkdir(r'<TMP>/pwned_eval')\")", "`eval` is not allowed"),
    ("pyautogui.click(1, 1); open(r'<TMP>/pwned_chain', 'w')", "`open` is not allowed"),
    ("pyautogui.write(open(r'<TMP>/pwned_arg', 'w').name)", "attribute access is not allowed as an argument"),
    ("pyautogui.write(open(r'<TMP>/pwned_arg2', 'w'))", "nested call"),
    ("[open(r'<TMP>/pwned_comp', 'w') for _ in 'x']", "list comprehension"),
    ("import os\nos.system('touch <TMP>/pwned_system')", "`import os` is not allowed"),
    ("pyautogui.write(f\"{open(r'<TMP>/pwned_fstr', 'w')}\")", "f-string"),
    ("(lambda: open(r'<TMP>/pwned_lambda', 'w'))()", "is not allowed"),
    ("pyautogui.press(__import__('os').mkdir(r'<TMP>/pwned_key'))", "nested call"),
    ("time.sleep(open(r'<TMP>/pwned_sleep', 'w') and 1)", "boolean operator"),
    ("pyautogui.click(1, 1)\nwith open(r'<TMP>/pwned_with', 'w') as f:\n    pass", "with statement"),
    ("def f():\n    open(r'<TMP>/pwned_def', 'w')\nf()", "function definition"),
]

MALICIOUS: list[tuple[object, str]] = [
    # imports
    ("import os", "`import os` is not allowed"),
    ("import subprocess", "`import subprocess` is not allowed"),
    ("import sys", "`import sys` is not allowed"),
    ("import os\nos.system('ls')", "`import os` is not allowed"),
    ("import pyautogui, os", "`import os` is not allowed"),
    ("from os import system", "from-import"),
    ("from pyautogui import click", "from-import"),
    ("import pyautogui as p", "aliases are not supported"),
    ("import pyautogui as pyautogui", "aliases are not supported"),
    ("import time as t", "aliases are not supported"),
    ("import pyautogui.os", "`import pyautogui.os` is not allowed"),
    # dynamic evaluation and builtins
    ("__import__('os').system('ls')", "`__import__('os').system` is not allowed"),
    ("__import__('os')", "`__import__` is not allowed"),
    ("exec('print(1)')", "`exec` is not allowed"),
    ("eval('1+1')", "`eval` is not allowed"),
    ("compile('1', 'x', 'exec')", "`compile` is not allowed"),
    ("open('/etc/passwd')", "`open` is not allowed"),
    ("print(open('/etc/passwd').read())", "`print` is not allowed"),
    ("getattr(pyautogui, 'click')(1, 2)", "getattr(pyautogui, 'click')"),
    ("getattr(__builtins__, 'eval')('1')", "getattr"),
    ("globals()", "`globals` is not allowed"),
    ("locals()['x']", "subscript"),
    ("vars(pyautogui)", "`vars` is not allowed"),
    ("breakpoint()", "`breakpoint` is not allowed"),
    ("help()", "`help` is not allowed"),
    ("type('A', (), {})", "`type` is not allowed"),
    (
        "os.system('ls')",
        "`os.system` is not allowed; only pyautogui.<function>(...) and time.sleep(...) calls are accepted",
    ),
    ("subprocess.run(['ls'])", "`subprocess.run` is not allowed"),
    # attribute tricks
    ("pyautogui.__class__", "attribute access"),
    ("pyautogui.__class__()", "pyautogui.__class__ is not supported"),
    ("().__class__.__bases__[0].__subclasses__()", "is not allowed"),
    ("pyautogui.click.__globals__", "attribute access"),
    ("pyautogui.click.__globals__['os'].system('ls')", "is not allowed"),
    ("pyautogui.click.__call__(1, 2)", "`pyautogui.click.__call__` is not allowed"),
    ("pyautogui.os.system('ls')", "`pyautogui.os.system` is not allowed"),
    ("pyautogui.__dict__['click'](1, 2)", "`pyautogui.__dict__['click']` is not allowed"),
    ("pyautogui.click(1, 2).__class__", "attribute access"),
    ("time.time()", "time.time is not allowed"),
    ("time.os.system('ls')", "`time.os.system` is not allowed"),
    ("pyautogui.write(__file__)", "name `__file__`"),
    ("pyautogui.write(__builtins__)", "name `__builtins__`"),
    ("pyautogui.write(pyautogui.__name__)", "attribute access is not allowed as an argument"),
    # functions, classes, control flow
    ("lambda: 0", "lambda"),
    ("(lambda: __import__('os').system('ls'))()", "is not allowed"),
    ("pyautogui.click(lambda: 1)", "lambda"),
    ("def f():\n    pass", "function definition"),
    ("def f(): return __import__('os')\nf()", "function definition"),
    ("@pyautogui.click\ndef f(): pass", "function definition"),
    ("class A: pass", "class definition"),
    ("for i in range(3):\n    pyautogui.click(1, 1)", "for loop"),
    ("while True:\n    pyautogui.click(1, 1)", "while loop"),
    ("if True:\n    pyautogui.click(1, 1)", "if statement"),
    ("try:\n    pyautogui.click(1, 1)\nexcept Exception:\n    pass", "try statement"),
    ("with open('x') as f:\n    pass", "with statement"),
    ("match x:\n    case 1:\n        pass", "match statement"),
    ("yield pyautogui.click(1, 1)", "yield"),
    ("await pyautogui.click(1, 1)", "await"),
    ("async def f():\n    pass", "async function definition"),
    ("global x", "global statement"),
    ("del pyautogui", "del statement"),
    ("assert False", "assert statement"),
    ("raise SystemExit", "raise statement"),
    ("pyautogui.click(1, 2)\npass", "pass statement"),
    # comprehensions, f-strings, walrus, assignment, names
    ("[pyautogui.click(1, 1) for _ in range(3)]", "list comprehension"),
    ("{x for x in ()}", "set comprehension"),
    ("{k: 1 for k in ()}", "dict comprehension"),
    ("pyautogui.write((c for c in 'ab'))", "generator expression"),
    ("pyautogui.write(''.join(c for c in 'ab'))", "nested call"),
    ("pyautogui.write(f'{1+1}')", "f-string"),
    ('f\'{__import__("os").system("ls")}\'', "f-string"),
    ("(x := 5)", "walrus"),
    ("pyautogui.click(x := 5, 5)", "walrus"),
    ("x = 5", "assignment"),
    ("x = 5\npyautogui.click(x, x)", "assignment"),
    ("pyautogui.FAILSAFE = False", "assignment"),
    ("x += 1", "augmented assignment"),
    ("x: int = 1", "annotated assignment"),
    ("pyautogui.click(x, 10)", "name `x` is not allowed"),
    ("pyautogui.click(1, 2) if True else 0", "conditional expression"),
    ("pyautogui.click(1, 2) or exec('x')", "boolean operator"),
    ("pyautogui.click(1, 2)[0]", "subscript"),
    ("pyautogui.click([1, 2][0], 5)", "subscript"),
    ("pyautogui.click({'x': 1}, 5)", "dict literal"),
    ("pyautogui.click({1, 2}, 5)", "set literal"),
    ("pyautogui.click(1 if 1 else 2, 5)", "conditional expression"),
    ("pyautogui.click(1 < 2, 5)", "comparison"),
    ("42", "constant"),
    # sizes and numbers
    ("pyautogui.write('" + "a" * 100_000 + "')", "action is too long (100019 characters; max 10000)"),
    ("pyautogui.write('" + "a" * 5000 + "')", "text is too long (5000 characters; max 2000)"),
    ("pyautogui.click(" + "9" * 400 + ", 1)", "too large"),
    ("pyautogui.click(10000000, 1)", "too large"),
    ("pyautogui.click(1e6 * 1e6, 1)", "too large"),
    ("pyautogui.click(10 ** 6, 1)", "`**` operator is not allowed"),
    ("pyautogui.click(9**9**9, 1)", "`**` operator is not allowed"),
    ("9**9**9", "is not allowed"),
    ("pyautogui.click(1e400, 1)", "not finite"),
    ("pyautogui.click(1e400 - 1e400, 1)", "not finite"),
    ("pyautogui.click(float('nan'), 1)", "nested call"),
    ("pyautogui.click(float('inf'), 1)", "nested call"),
    ("pyautogui.click(1 / 0, 1)", "division by zero"),
    ("pyautogui.click(~1, 5)", "unary operator Invert"),
    ("pyautogui.click(not 1, 5)", "unary operator Not"),
    ("pyautogui.click(1 << 20, 5)", "operator LShift"),
    ("pyautogui.click(" + "(" * 200 + "1" + ")" * 200 + ", 1)", "nested"),
    ("pyautogui.click(" + "-" * 3000 + "1, 1)", "nested too deeply"),
    ("pyautogui.click(" + "(" * 20 + "1," + "), " * 20 + "1)", "nested too deeply"),
    ("pyautogui.press([" + "'a', " * 101 + "])", "101 elements"),
    # keys
    ("pyautogui.press('enterr')", "pyautogui.press: unknown key 'enterr'"),
    ("pyautogui.hotkey('ctrl', 'sss')", "unknown key 'sss'"),
    ("pyautogui.keyDown('superkey')", "unknown key 'superkey'"),
    ("pyautogui.keyUp('ctrl+c')", "unknown key 'ctrl+c'"),
    ("pyautogui.press(['enter', 'nope'])", "unknown key 'nope'"),
    ("pyautogui.press('')", "unknown key ''"),
    ("pyautogui.press('\u00e9')", "unknown key"),
    ("pyautogui.hotkey()", "needs 1 to 6 keys, got 0"),
    ("pyautogui.hotkey('ctrl', 'alt', 'shift', 'win', 'a', 'b', 'c')", "needs 1 to 6 keys, got 7"),
    ("pyautogui.hotkey('ctrl', ['c'])", "key name must be a string"),
    ("pyautogui.press([])", "needs 1 to"),
    ("pyautogui.press(5)", "keys must be a key name or a list"),
    ("pyautogui.keyDown(['shift'])", "key name must be a string"),
    ("pyautogui.typewrite(['enter', 5])", "key name must be a string"),
    ("pyautogui.keyDown()", "missing required argument 'key'"),
    # coordinates
    ("pyautogui.click(1500, 300)", "pyautogui.click: x=1500 is off the 1280x800 screen"),
    ("pyautogui.click(100, 800)", "y=800 is off the 1280x800 screen"),
    ("pyautogui.click(-1, 100)", "x=-1 is off the 1280x800 screen"),
    ("pyautogui.moveTo(100, -5)", "y=-5 is off"),
    ("pyautogui.click((2000, 10))", "x=2000 is off"),
    ("pyautogui.dragTo(1280, 0)", "x=1280 is off"),
    ("pyautogui.scroll(3, 5000, 10)", "x=5000 is off"),
    ("pyautogui.mouseDown(0, 900)", "y=900 is off"),
    ("pyautogui.click(1279.6, 10)", "x=1280 is off"),
    ("pyautogui.click((1, 2, 3))", "(x, y) pair"),
    ("pyautogui.click((1, None))", "two numbers"),
    ("pyautogui.click((1, 2), 3)", "y must not be given"),
    ("pyautogui.click('button.png')", "locating images on screen is not supported"),
    ("pyautogui.click(True, 5)", "x must be a number, got bool"),
    ("pyautogui.click(None, '5')", "y must be a number, got str"),
    # non-ASCII and control characters
    ("pyautogui.cl\u00edck(1, 2)", "non-ASCII character"),
    ("pyautogui.click(1, 2)  # \u00fcn\u00efcode comment", "non-ASCII character"),
    ("\uff45\uff58\uff45\uff43('x')", "non-ASCII character"),
    ("pyautogui.click(1, 2)\n\u00e9\u00e9 = 3 +", "non-ASCII character"),
    ("pyautogui.write('h\u00e9llo')", "typing non-ASCII text is not supported"),
    ("pyautogui.write('\\u00e9')", "typing non-ASCII text is not supported"),
    ("pyautogui.typewrite('\u65e5\u672c\u8a9e')", "typing non-ASCII text is not supported"),
    ("pyautogui.write('a\\x1bb')", "control character U+001B"),
    ("pyautogui.write('a\\x00b')", "control character U+0000"),
    ("pyautogui.write('a\x07b')", "character U+0007"),
    ("pyautogui.click(1, 2)\x00", "character U+0000"),
    ("pyautogui.click(1,\x002)", "character U+0000"),
    ("\x00", "character U+0000"),
    ("DONE\x00", "character U+0000"),
    ("pyautogui.click(1, 2)\x1b[2J", "character U+001B"),
    ("pyautogui.click(1, 2)\rimport os", "character U+000D"),
    ("pyautogui.write('abc\u202e')", "character U+202E"),
    ("pyautogui.click(1,\u200b2)", "character U+200B"),
    ("ANS hi\x00there", "character U+0000"),
    ("ANS " + "x" * 2001, "ANS text is too long"),
    # unknown functions and arguments
    ("pyautogui.screenshot()", "pyautogui.screenshot is not supported"),
    ("pyautogui.screenshot('/tmp/x.png')", "pyautogui.screenshot is not supported"),
    ("pyautogui.alert('hi')", "pyautogui.alert is not supported"),
    ("pyautogui.locateOnScreen('x.png')", "pyautogui.locateOnScreen is not supported"),
    ("pyautogui.position()", "pyautogui.position is not supported"),
    ("pyautogui.click(1, 2, foo=3)", "unknown keyword argument 'foo'"),
    ("pyautogui.click(1, 2, _pause=False)", "unknown keyword argument '_pause'"),
    ("pyautogui.write('x', tween=1)", "unknown keyword argument 'tween'"),
    ("pyautogui.hotkey('ctrl', 'c', presses=2)", "unknown keyword argument 'presses'"),
    ("pyautogui.click(1, 2, 3, 4, 5, 6, 7)", "takes at most 6 positional arguments, got 7"),
    ("pyautogui.click(x=1, x=2)", "multiple values for 'x'"),
    ("pyautogui.click(1, x=2)", "multiple values for 'x'"),
    ("pyautogui.write(123)", "message must be a string"),
    ("pyautogui.write()", "missing required argument 'message'"),
    ("pyautogui.write(b'bytes')", "bytes literals are not allowed"),
    ("pyautogui.click(..., 1)", "ellipsis constants are not allowed"),
    ("pyautogui.click(1j, 1)", "complex constants are not allowed"),
    ("pyautogui.press('enter', presses='3')", "presses must be an integer"),
    ("pyautogui.press('enter', presses=101)", "presses=101 is out of range 1..100"),
    ("pyautogui.click(1, 2, clicks=4)", "clicks=4 is out of range 1..3"),
    ("pyautogui.click(1, 2, clicks=0)", "clicks=0 is out of range"),
    ("pyautogui.click(1, 2, clicks=1.5)", "clicks must be an integer"),
    ("pyautogui.click(1, 2, button='super')", "button='super' is not one of"),
    ("pyautogui.click(1, 2, button=1)", "button=1 is not one of"),
    ("pyautogui.scroll(101)", "clicks=101 is out of range -100..100"),
    ("pyautogui.scroll(1.5)", "clicks must be an integer"),
    ("pyautogui.scroll()", "missing required argument 'clicks'"),
    ("pyautogui.press('enter', interval=100)", "interval=100 must be between 0 and 10 seconds"),
    ("pyautogui.moveTo(1, 1, duration=-1)", "duration=-1 must be between 0 and 10"),
    ("pyautogui.write('x', interval='fast')", "interval must be a number of seconds"),
    # statement count and time budget
    ("pyautogui.click(1, 1)\n" * 51, "too many statements (51; max 50)"),
    ("pyautogui.click(1, 1);" * 51, "too many statements"),
    ("time.sleep(11)", "between 0 and 10 seconds"),
    ("time.sleep(-1)", "between 0 and 10 seconds"),
    ("pyautogui.sleep(20)", "between 0 and 10 seconds"),
    ("time.sleep(6)\ntime.sleep(6)", "total sleep/duration time 12 s exceeds the 10 s limit"),
    ("pyautogui.moveTo(1, 1, duration=8)\npyautogui.dragTo(5, 5, duration=8)", "exceeds the 10 s limit"),
    ("time.sleep('1')", "number of seconds"),
    ("time.sleep()", "missing required argument"),
    # nesting, unpacking, string tricks
    ("pyautogui.write(pyautogui.position())", "nested call"),
    ("pyautogui.write(open('x').read())", "nested call"),
    ("pyautogui.click(*[1, 2])", "starred arguments (*args) are not allowed"),
    ("pyautogui.hotkey(*['ctrl', 'c'])", "starred arguments"),
    ("pyautogui.click(**{'x': 1})", "keyword unpacking (**kwargs) is not allowed"),
    ("pyautogui.write('ab' + 'cd')", "`+` is only allowed on numbers, not str"),
    ("pyautogui.write('a' * 100000)", "`*` is only allowed on numbers"),
    ("pyautogui.write('%s' % 'x')", "`%` is only allowed on numbers"),
    ("pyautogui.write(('a',) * 3)", "only allowed on numbers"),
    ("pyautogui.click(1 + True, 2)", "only allowed on numbers, not bool"),
    ("pyautogui.click(-'1', 2)", "only allowed on numbers"),
    # the whole action is rejected, nothing partial
    ("pyautogui.click(1, 2); import os", "line 1: `import os` is not allowed"),
    ("pyautogui.click(1, 2); os.system('ls')", "`os.system` is not allowed"),
    ("pyautogui.click(1, 2); __import__('os').system('ls')", "__import__"),
    ("import pyautogui\nos.system('rm -rf /')", "line 2: `os.system` is not allowed"),
    ("pyautogui.click(\n1,\n2)\nos.system('x')", "line 4: `os.system`"),
    (
        "pyautogui.click(100, 100)\npyautogui.write(open('/etc/passwd').read())",
        "line 2: pyautogui.write: message: nested call",
    ),
    # empty / non-str / malformed / terminal misuse
    ("", "empty"),
    ("   \n\t  ", "empty"),
    ("```python\n\n```", "empty code block"),
    ("```bash\nrm -rf /\n```", "code fence language 'bash' is not supported"),
    (None, "action must be a str, got NoneType"),
    (b"DONE", "action must be a str, got bytes"),
    (42, "action must be a str, got int"),
    (["DONE"], "action must be a str, got list"),
    ("done", "case-sensitive"),
    ("Done", "case-sensitive"),
    ("DONE\npyautogui.click(1, 1)", "must be the whole action"),
    ("pyautogui.click(1, 1)\nFAIL", "must be the whole action"),
    ("ANS", "ANS needs an answer text"),
    ("ANS    ", "ANS needs an answer text"),
    ("import pyautogui", "no pyautogui call"),
    ("pyautogui.click(1, 2", "syntax error at line 1"),
    ("pyautogui.click(1,2) )", "syntax error"),
    ("rm -rf /", "syntax error"),
    ("x = 1" + "1" * 5000, "syntax error"),
    ("pyautogui.click", "attribute access"),
]


def _materialize(code: object, tmp: str) -> object:
    return code.replace("<TMP>", tmp) if isinstance(code, str) else code


@pytest.fixture(scope="module")
def sentinel_dir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("sentinel")


def _assert_nothing_ran(directory) -> None:
    assert list(directory.iterdir()) == []
    for module in (builtins, sys, os):
        assert not hasattr(module, SENTINEL_ATTR)


ALL_BAD = SENTINEL_PAYLOADS + MALICIOUS


@pytest.mark.parametrize("code,expected", ALL_BAD, ids=[repr(c)[:60] for c, _ in ALL_BAD])
def test_rejected(code: object, expected: str, sentinel_dir) -> None:
    with pytest.raises(ActionError) as info:
        parse_action(_materialize(code, str(sentinel_dir)))
    assert expected in str(info.value), str(info.value)
    _assert_nothing_ran(sentinel_dir)


def test_corpus_size() -> None:
    assert len(ALL_BAD) >= 110


def test_nothing_ran_after_corpus(sentinel_dir) -> None:
    """Runs after the parametrized corpus: no payload left a trace."""
    _assert_nothing_ran(sentinel_dir)


def test_parser_never_evaluates(monkeypatch: pytest.MonkeyPatch, sentinel_dir) -> None:
    """With eval/exec/__import__ booby-trapped and compile limited to AST-only, everything still parses."""
    real_compile = builtins.compile
    calls: list[str] = []

    def trap(name: str):
        def raiser(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"parser called {name}")

        return raiser

    real_import = builtins.__import__

    def guarded_import(name, *args, **kwargs):
        # CPython's own parser imports unicodedata to NFKC-normalize non-ASCII identifiers.
        if name == "unicodedata":
            return real_import(name, *args, **kwargs)
        calls.append(f"__import__({name!r})")
        raise AssertionError(f"parser imported {name}")

    def ast_only_compile(source, filename, mode, flags=0, *args, **kwargs):
        if not flags & ast.PyCF_ONLY_AST:
            calls.append("compile")
            raise AssertionError("parser compiled code for execution")
        return real_compile(source, filename, mode, flags, *args, **kwargs)

    results = []
    with monkeypatch.context() as m:
        m.setattr(builtins, "eval", trap("eval"))
        m.setattr(builtins, "exec", trap("exec"))
        m.setattr(builtins, "compile", ast_only_compile)
        m.setattr(builtins, "__import__", guarded_import)
        for code, expected in VALID:
            results.append(parse_action(code) == expected)
        for code, _ in ALL_BAD:
            try:
                parse_action(_materialize(code, str(sentinel_dir)))
            except ActionError:
                results.append(True)
            else:
                results.append(False)
    assert calls == []
    assert all(results)
    assert "pyautogui" not in sys.modules or not hasattr(sys.modules["pyautogui"], SENTINEL_ATTR)
    _assert_nothing_ran(sentinel_dir)


def test_error_is_value_error() -> None:
    assert issubclass(ActionError, ValueError)
    with pytest.raises(ValueError):
        parse_action("os.system('ls')")


# ---------------------------------------------------------------------------
# Structured (array) form
# ---------------------------------------------------------------------------


def _sample(kind: str, point=(0, 0), point2=(0, 0), scroll=10, keys=(0, 0, 0)) -> dict:
    return {
        "kind": np.int64(STRUCTURED_KINDS.index(kind)),
        "point": np.array(point, dtype=np.int64),
        "point2": np.array(point2, dtype=np.int64),
        "scroll": np.int64(scroll),
        "keys": np.array(keys, dtype=np.int64),
    }


def test_structured_space_shape() -> None:
    space = structured_space((1280, 800))
    assert isinstance(space, spaces.Dict)
    assert space["kind"].n == len(STRUCTURED_KINDS)
    assert space["point"].shape == (2,) and space["point"].dtype == np.int64
    assert list(space["point"].high) == [1279, 799] and list(space["point"].low) == [0, 0]
    assert space["point2"] == space["point"]
    assert space["scroll"].n == 21
    assert list(space["keys"].nvec) == [len(KEY_NAMES) + 1] * 3


def test_structured_samples_convert_or_raise_action_error() -> None:
    space = structured_space((640, 480))
    space.seed(0)
    converted = rejected = 0
    for _ in range(500):
        sample = space.sample()
        try:
            actions = from_structured(sample, (640, 480))
        except ActionError:
            rejected += 1
            continue
        converted += 1
        assert actions and all(isinstance(a, Action) for a in actions)
        for a in actions:
            assert parse_action(a.to_pyautogui(), (640, 480)) == [a]
    assert converted > 0


STRUCTURED_CASES = [
    (_sample("move", (5, 6)), [A("move", 5, 6)]),
    (_sample("click", (5, 6)), [A("click", 5, 6)]),
    (_sample("double_click", (5, 6)), [A("click", 5, 6, clicks=2)]),
    (_sample("right_click", (5, 6)), [A("click", 5, 6, button="right")]),
    (_sample("drag", (5, 6), (70, 80)), [A("move", 5, 6), A("drag", 70, 80)]),
    (_sample("scroll", (5, 6), scroll=13), [A("scroll", 5, 6, amount=3)]),
    (_sample("scroll", (5, 6), scroll=0), [A("scroll", 5, 6, amount=-10)]),
    (_sample("press", keys=(KEY_NAMES.index("enter") + 1, 0, 5)), [A("press", keys=("enter",))]),
    (
        _sample("hotkey", keys=(KEY_NAMES.index("ctrl") + 1, 0, KEY_NAMES.index("s") + 1)),
        [A("hotkey", keys=("ctrl", "s"))],
    ),
    (_sample("done"), [A("done")]),
    (_sample("fail"), [A("fail")]),
    (_sample("wait"), [A("wait")]),
    ({"kind": 8}, [A("done")]),
]


@pytest.mark.parametrize("sample,expected", STRUCTURED_CASES)
def test_from_structured(sample: dict, expected: list[Action]) -> None:
    assert from_structured(sample) == expected


STRUCTURED_BAD = [
    ("not a mapping", "must be a mapping"),
    ({}, "missing 'kind'"),
    ({"kind": 99}, "out of range"),
    ({"kind": -1}, "out of range"),
    ({"kind": 1.5}, "must be integer"),
    ({"kind": [1, 2]}, "shape"),
    ({"kind": 1}, "missing 'point'"),
    ({"kind": 1, "point": [1, 2, 3]}, "shape"),
    ({"kind": 1, "point": [1.0, 2.0]}, "must be integer"),
    ({"kind": 1, "point": [1, [2]]}, "structured action field 'point'"),
    ({"kind": 1, "point": [5000, 2]}, "off the 1280x800 screen"),
    ({"kind": 1, "point": [-1, 2]}, "off the"),
    (_sample("drag", (1, 1), (1280, 0)), "point2=(1280, 0) is off"),
    (_sample("scroll", (1, 1), scroll=21), "scroll 21 is out of range"),
    (_sample("press", keys=(0, 3, 0)), "press needs a key in keys[0]"),
    (_sample("hotkey", keys=(0, 0, 0)), "hotkey needs at least one"),
    (_sample("hotkey", keys=(len(KEY_NAMES) + 1, 0, 0)), "out of range"),
    ({"kind": STRUCTURED_KINDS.index("press"), "keys": "abc"}, "shape"),
    ({"kind": STRUCTURED_KINDS.index("press"), "keys": ["a", "b", "c"]}, "must be integer"),
]


@pytest.mark.parametrize("sample,expected", STRUCTURED_BAD, ids=[m for _, m in STRUCTURED_BAD])
def test_from_structured_rejects(sample: object, expected: str) -> None:
    with pytest.raises(ActionError) as info:
        from_structured(sample)
    assert expected in str(info.value), str(info.value)


def test_keys_without_an_x_keysym_are_refused_by_name():
    for key in ("accept", "final"):
        with pytest.raises(ActionError, match=f"key '{key}' .*does not exist on an X keyboard"):
            parse_action(f"pyautogui.press('{key}')")
