"""KAlgebra's task families (coda_env.families): seeded instances of plotting, calculating and looking up.

The oracles click where the shipped tasks' oracles click (1280x800): the tabs at y=53 (2D Graph x=125, 3D Graph
207, Dictionary 291), the 2D tab's expression field (1137, 77), the 3D field (640, 751), the console (500, 751),
the Dictionary's search field (1142, 99). Checks are specific to the parameters: the points of `eqn` lie on this
instance's curve only, `val` wants this instance's number, so another instance's oracle scores 0 here.
"""

from __future__ import annotations

import math
import random
from typing import Any

from ...families import Family

TAB_XY = {"2D Graph": (125, 53), "3D Graph": (207, 53), "Dictionary": (291, 53)}
FIELD_2D, FIELD_3D, CONSOLE, SEARCH = (1137, 77), (640, 751), (500, 751), (1142, 99)
# Names of letters a variable may take: e and i are KAlgebra's constants.
VARIABLES = [c for c in "abcdfghjklmnopqrstuvwxyz"]
NONZERO_5 = [k for k in range(-5, 6) if k]
NONZERO_9 = [k for k in range(-9, 10) if k]


def _click(xy: tuple[int, int]) -> str:
    return f"pyautogui.click({xy[0]}, {xy[1]})"


def _write(text: str) -> str:
    return f"pyautogui.write({text!r})\npyautogui.press('enter')"


def _terms(pairs: list[tuple[int, str]], kalgebra: bool) -> str:
    """A sum of coefficient*monomial terms, written for KAlgebra (3*x^2-2*x+5) or for people (3x² - 2x + 5)."""
    out = ""
    for coef, mono in pairs:
        if coef == 0:
            continue
        sign = "-" if coef < 0 else "+"
        mag = abs(coef)
        if mono:
            body = mono if mag == 1 else (f"{mag}*{mono}" if kalgebra else f"{mag}{mono}")
        else:
            body = str(mag)
        if not out:
            out = ("-" if sign == "-" else "") + body
        else:
            out += f"{sign}{body}" if kalgebra else f" {sign} {body}"
    return out or "0"


def _plot(f, points_xy: list[tuple[float, ...]]) -> list[list]:
    """`eqn` points: on the curve at each (x[, y]), and off it by 1 at the first two."""
    on = [[*p, round(f(*p), 9), True] for p in points_xy]
    off = [[*p, round(f(*p) + 1, 9), False] for p in points_xy[:2]]
    return on + off


# ------------------------------------------------------------------------------------------ 2D graphs
def _poly2d_sample(rng: random.Random) -> dict[str, Any]:
    return {"a": rng.choice(NONZERO_5), "b": rng.randint(-9, 9), "c": rng.randint(-9, 9)}


def _poly2d_build(p: dict[str, Any]) -> dict[str, Any]:
    pairs = [(p["a"], "x^2"), (p["b"], "x"), (p["c"], "")]
    expr, shown = _terms(pairs, True), _terms(pairs, False)
    f = lambda x: p["a"] * x * x + p["b"] * x + p["c"]  # noqa: E731
    return {
        "instruction": f"In KAlgebra's 2D Graph, plot y = {shown}.",
        "steps": 6,
        "difficulty": "easy",
        "category": "2D Graph",
        "evaluate": [{"type": "eqn", "dim": 2, "points": _plot(f, [(-2,), (1,), (3,)])}],
        "solution": [_click(TAB_XY["2D Graph"]), f"{_click(FIELD_2D)}\n{_write(expr)}", "DONE"],
    }


def _trig2d_sample(rng: random.Random) -> dict[str, Any]:
    return {
        "fn": rng.choice(["sin", "cos"]),
        "a": rng.choice(NONZERO_9),
        "b": rng.randint(1, 5),
        "c": rng.randint(-5, 5),
    }


def _trig2d_build(p: dict[str, Any]) -> dict[str, Any]:
    fn, a, b, c = p["fn"], p["a"], p["b"], p["c"]
    inner = "x" if b == 1 else f"{b}*x"
    amp = "" if a == 1 else "-" if a == -1 else f"{a}*"
    expr = f"{amp}{fn}({inner})" + (f"+{c}" if c > 0 else f"{c}" if c < 0 else "")
    shown_inner = "x" if b == 1 else f"{b}x"
    shown_amp = "" if a == 1 else "-" if a == -1 else f"{a}·"
    shown = f"{shown_amp}{fn}({shown_inner})" + (f" + {c}" if c > 0 else f" - {-c}" if c < 0 else "")
    g = getattr(math, fn)
    f = lambda x: a * g(b * x) + c  # noqa: E731
    return {
        "instruction": f"In KAlgebra's 2D Graph, plot y = {shown}.",
        "steps": 6,
        "difficulty": "easy",
        "category": "2D Graph",
        "evaluate": [{"type": "eqn", "dim": 2, "points": _plot(f, [(0.5,), (1,), (2,)])}],
        "solution": [_click(TAB_XY["2D Graph"]), f"{_click(FIELD_2D)}\n{_write(expr)}", "DONE"],
    }


# ------------------------------------------------------------------------------------------ 3D graphs
def _plane_sample(rng: random.Random) -> dict[str, Any]:
    return {"a": rng.choice(NONZERO_9), "b": rng.choice(NONZERO_9), "c": rng.randint(-9, 9)}


def _surface_build(p: dict[str, Any], monomials: tuple[str, str], noun: str, difficulty: str) -> dict[str, Any]:
    """z = a·m1 + b·m2 + c in the 3D Graph (a plane for x, y; a paraboloid for x^2, y^2)."""
    pairs = [(p["a"], monomials[0]), (p["b"], monomials[1]), (p["c"], "")]
    expr, shown = _terms(pairs, True), _terms(pairs, False)
    power = 2 if monomials[0] == "x^2" else 1
    f = lambda x, y: p["a"] * x**power + p["b"] * y**power + p["c"]  # noqa: E731
    return {
        "instruction": f"In KAlgebra's 3D Graph, plot the {noun} z = {shown}.",
        "steps": 6,
        "difficulty": difficulty,
        "category": "3D Graph",
        "evaluate": [{"type": "eqn", "dim": 3, "points": _plot(f, [(1, 2), (-2, 1), (3, -1)])}],
        "solution": [_click(TAB_XY["3D Graph"]), f"{_click(FIELD_3D)}\n{_write(expr)}", "DONE"],
    }


def _plane_build(p: dict[str, Any]) -> dict[str, Any]:
    return _surface_build(p, ("x", "y"), "plane", "easy")


def _paraboloid_sample(rng: random.Random) -> dict[str, Any]:
    return {"a": rng.choice(NONZERO_5), "b": rng.choice(NONZERO_5), "c": rng.randint(-9, 9)}


def _paraboloid_build(p: dict[str, Any]) -> dict[str, Any]:
    return _surface_build(p, ("x^2", "y^2"), "surface", "medium")


# ------------------------------------------------------------------------------------------ the calculator
_OPS = {"+": ("plus", lambda a, b: a + b), "-": ("minus", lambda a, b: a - b), "*": ("times", lambda a, b: a * b)}


def _arith_sample(rng: random.Random) -> dict[str, Any]:
    return {"op": rng.choice(list(_OPS)), "a": rng.randint(2, 99), "b": rng.randint(2, 99), "v": rng.choice(VARIABLES)}


def _arith_build(p: dict[str, Any]) -> dict[str, Any]:
    word, fn = _OPS[p["op"]]
    return {
        "instruction": f"In KAlgebra's Calculator, store {p['a']} {word} {p['b']} in a variable named `{p['v']}`.",
        "steps": 5,
        "difficulty": "easy",
        "category": "Calculator",
        "evaluate": [{"type": "val", "name": p["v"], "value": fn(p["a"], p["b"])}],
        "solution": [f"{_click(CONSOLE)}\n{_write('{v}:={a}{op}{b}'.format(**p))}", "DONE"],
    }


def _power_sample(rng: random.Random) -> dict[str, Any]:
    return {"a": rng.randint(2, 12), "n": rng.randint(2, 6), "v": rng.choice(VARIABLES)}


def _power_build(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "instruction": (
            f"In KAlgebra's Calculator, store the value of {p['a']} to the power of {p['n']} in a variable named "
            f"`{p['v']}`."
        ),
        "steps": 5,
        "difficulty": "easy",
        "category": "Calculator",
        "evaluate": [{"type": "val", "name": p["v"], "value": p["a"] ** p["n"]}],
        "solution": [f"{_click(CONSOLE)}\n{_write('{v}:={a}^{n}'.format(**p))}", "DONE"],
    }


FUNCTION_NAMES = ["f", "g", "h", "p", "q"]


def _function_sample(rng: random.Random) -> dict[str, Any]:
    fname = rng.choice(FUNCTION_NAMES)
    return {
        "f": fname,
        "a": rng.choice(NONZERO_5),
        "b": rng.randint(-9, 9),
        "c": rng.randint(-9, 9),
        "k": rng.randint(-5, 5),
        "v": rng.choice([v for v in VARIABLES if v not in FUNCTION_NAMES]),
    }


def _function_build(p: dict[str, Any]) -> dict[str, Any]:
    pairs = [(p["a"], "x^2"), (p["b"], "x"), (p["c"], "")]
    expr, shown = _terms(pairs, True), _terms(pairs, False)
    k = p["k"]
    value = p["a"] * k * k + p["b"] * k + p["c"]
    define, store = f"{p['f']}:=x->{expr}", f"{p['v']}:={p['f']}({k})"
    return {
        "instruction": (
            f"In KAlgebra's Calculator, define a function `{p['f']}` with {p['f']}(x) = {shown}, then store "
            f"{p['f']}({k}) in a variable named `{p['v']}`."
        ),
        "steps": 8,
        "difficulty": "medium",
        "category": "Calculator",
        "evaluate": [{"type": "val", "name": p["v"], "value": value, "tol": 1e-06}],
        "solution": [
            f"{_click(CONSOLE)}\n{_write(define)}",
            f"pyautogui.hotkey('ctrl', 'a')\n{_write(store)}",
            "DONE",
        ],
    }


# ------------------------------------------------------------------------------------------ the dictionary
# Operations of KAlgebra's Dictionary (its MathML operator list, as the Dictionary tab shows them).
OPERATIONS = [
    "abs", "and", "arccos", "arcsin", "arctan", "card", "ceiling", "conjugate", "cos", "cosh", "cot", "csc", "diff",
    "divide", "eq", "exp", "factorial", "floor", "gcd", "geq", "gt", "imaginary", "lcm", "leq", "ln", "log", "lt",
    "max", "min", "minus", "neq", "not", "or", "plus", "power", "product", "quotient", "real", "rem", "root", "sec",
    "sin", "sinh", "sum", "tan", "tanh", "times", "xor",
]  # fmt: skip
START_TABS = ["Calculator", "2D Graph", "3D Graph"]
# A curve already plotted (or none): the 2D Graph tab then shows it, and it must stay.
CURVES = ["", "x", "x^2", "x^3", "sin(x)", "cos(x)", "x-1", "x^2+1", "abs(x-2)"]


def _lookup_sample(rng: random.Random) -> dict[str, Any]:
    return {"name": rng.choice(OPERATIONS), "start": rng.choice(START_TABS), "curve": rng.choice(CURVES)}


def _lookup_build(p: dict[str, Any]) -> dict[str, Any]:
    start = START_TABS.index(p["start"])
    setup = [{"func": "func_2d", "expr": p["curve"]}] if p["curve"] else []
    if setup or start:
        setup.append({"func": "tab", "index": start})
    checks = [
        {"type": "state", "path": "tab", "value": "Dictionary"},
        {"type": "state", "path": "dictionary_query", "value": p["name"]},
    ]
    if p["curve"]:
        checks.append({"type": "eqn", "dim": 2, "count": 1})
    return {
        "instruction": f"Look up the `{p['name']}` operation in KAlgebra's Dictionary."
        + (" Keep the curve that is plotted." if p["curve"] else ""),
        "steps": 5,
        "difficulty": "easy",
        "category": "Dictionary",
        "initialize": setup,
        "evaluate": checks,
        "solution": [_click(TAB_XY["Dictionary"]), f"{_click(SEARCH)}\npyautogui.write({p['name']!r})", "DONE"],
    }


FAMILIES = [
    Family(
        "plot2d_poly",
        "kalgebra",
        "plot a quadratic y = ax² + bx + c in the 2D Graph",
        {"a": "-5..5 but 0", "b": "-9..9", "c": "-9..9"},
        _poly2d_sample,
        _poly2d_build,
        10 * 19 * 19,
    ),
    Family(
        "plot2d_trig",
        "kalgebra",
        "plot y = a·sin(bx) + c or a·cos(bx) + c in the 2D Graph",
        {"fn": "sin, cos", "a": "-9..9 but 0", "b": "1..5", "c": "-5..5"},
        _trig2d_sample,
        _trig2d_build,
        2 * 18 * 5 * 11,
    ),
    Family(
        "plot3d_plane",
        "kalgebra",
        "plot a plane z = ax + by + c in the 3D Graph",
        {"a": "-9..9 but 0", "b": "-9..9 but 0", "c": "-9..9"},
        _plane_sample,
        _plane_build,
        18 * 18 * 19,
    ),
    Family(
        "plot3d_paraboloid",
        "kalgebra",
        "plot z = ax² + by² + c in the 3D Graph",
        {"a": "-5..5 but 0", "b": "-5..5 but 0", "c": "-9..9"},
        _paraboloid_sample,
        _paraboloid_build,
        10 * 10 * 19,
    ),
    Family(
        "calc_arith",
        "kalgebra",
        "store a + b, a - b or a × b in a named variable in the Calculator",
        {"op": "plus, minus, times", "a": "2..99", "b": "2..99", "v": "a-z but e, i"},
        _arith_sample,
        _arith_build,
        3 * 98 * 98 * len(VARIABLES),
    ),
    Family(
        "calc_exponent",
        "kalgebra",
        "store a to the power of n in a named variable in the Calculator",
        {"a": "2..12", "n": "2..6", "v": "a-z but e, i"},
        _power_sample,
        _power_build,
        11 * 5 * len(VARIABLES),
    ),
    Family(
        "calc_function_value",
        "kalgebra",
        "define a quadratic function in the Calculator, then store its value at a point (two steps)",
        {
            "f": "f, g, h, p, q",
            "a": "-5..5 but 0",
            "b": "-9..9",
            "c": "-9..9",
            "k": "-5..5",
            "v": "a-z but e, i, f-q's names",
        },
        _function_sample,
        _function_build,
        5 * 10 * 19 * 19 * 11 * (len(VARIABLES) - 5),
    ),
    Family(
        "dict_lookup",
        "kalgebra",
        "look up an operation in the Dictionary, starting from another tab",
        {"name": f"{len(OPERATIONS)} operations", "start": ", ".join(START_TABS), "curve": "none or 8 curves"},
        _lookup_sample,
        _lookup_build,
        len(OPERATIONS) * len(START_TABS) * len(CURVES),
    ),
]
