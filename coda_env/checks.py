"""Programmatic checks: does the app's state (or the agent's answer) satisfy a task?

ScienceBoard's check types, done safely: its harness `eval()`s lambda strings and asks a patched KAlgebra
whether points lie on a plot; here every check is data, and KAlgebra's expressions are parsed by a small
recursive-descent parser (`MathExpr`) and evaluated over a whitelist of functions. Nothing is `eval`ed.

A check is a dict with a `type`:
- `var`:    {"name": "p", "value": "1+-i"} string equality, or {"name": "e", "absent": true}
- `val`:    {"name": "p", "value": 1.585, "tol": 1e-6} numeric |a-b| <= tol
- `eqn`:    {"dim": 2|3, "points": [[x, y, bool], ...] (or [x, y, z, bool]), "count": n} some plotted
            function passes every point test; `count` alone checks how many 2D functions are plotted
- `answer`: {"value": "4"} (string, stripped) or {"number": 4, "tol": 1e-6}: the agent's `ANS` text
- `state`:  {"path": "tab", "value": "2D Graph"} a dotted path into the app state equals a value
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

CHECK_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    # type: (required fields, optional fields)
    "var": ({"name"}, {"value", "absent"}),
    "val": ({"name", "value"}, {"tol"}),
    "eqn": (set(), {"dim", "points", "count", "tol"}),
    "answer": (set(), {"value", "number", "tol"}),
    "state": ({"path", "value"}, set()),
}


class CheckError(ValueError):
    """A check definition is malformed."""


def validate_check(check: Any) -> None:
    """Raise CheckError naming the problem if a check dict is malformed."""
    if not isinstance(check, dict):
        raise CheckError(f"a check must be an object, got {type(check).__name__}")
    kind = check.get("type")
    if kind not in CHECK_FIELDS:
        raise CheckError(f"unknown check type {kind!r}; known: {', '.join(CHECK_FIELDS)}")
    required, optional = CHECK_FIELDS[kind]
    missing = required - check.keys()
    if missing:
        raise CheckError(f"check {kind!r} lacks {', '.join(sorted(missing))}")
    extra = check.keys() - required - optional - {"type"}
    if extra:
        raise CheckError(f"check {kind!r} has unknown fields {', '.join(sorted(extra))}")
    if kind == "var" and ("value" in check) == bool(check.get("absent")):
        raise CheckError("check 'var' needs exactly one of value or absent: true")
    if kind == "val" and not isinstance(check["value"], (int, float)):
        raise CheckError("check 'val' needs a numeric value")
    if kind == "answer" and ("value" in check) == ("number" in check):
        raise CheckError("check 'answer' needs exactly one of value or number")
    if kind == "eqn":
        if "points" not in check and "count" not in check:
            raise CheckError("check 'eqn' needs points or count")
        dim = check.get("dim", 2)
        if dim not in (2, 3):
            raise CheckError("check 'eqn' dim must be 2 or 3")
        for p in check.get("points", []):
            if (not isinstance(p, list) or len(p) != dim + 1 or not isinstance(p[-1], bool)
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p[:-1])):
                raise CheckError(f"check 'eqn' point {p!r} must be [{'x, y' if dim == 2 else 'x, y, z'}, true|false]")


@dataclass
class CheckResult:
    passed: bool
    check: dict
    detail: str


def run_checks(checks: list[dict], state: dict[str, Any], answer: str | None) -> tuple[bool, list[CheckResult]]:
    """All checks must pass. Each result says what was compared."""
    results = []
    for c in checks:
        try:
            ok, detail = _RUNNERS[c["type"]](c, state, answer)
        except (KeyError, TypeError, ValueError) as e:
            ok, detail = False, f"could not evaluate: {e}"
        results.append(CheckResult(ok, c, detail))
    return all(r.passed for r in results) and bool(results), results


def _var(c, state, answer):
    variables = state.get("variables", {})
    if c.get("absent"):
        return c["name"] not in variables, f"{c['name']} {'present' if c['name'] in variables else 'absent'}"
    got = variables.get(c["name"])
    return got == str(c["value"]), f"{c['name']} = {got!r}, want {c['value']!r}"


def _number(text: str) -> float:
    return MathExpr(text).value({})


def _val(c, state, answer):
    got = state.get("variables", {}).get(c["name"])
    if got is None:
        return False, f"{c['name']} is not defined"
    v = _number(got)
    return abs(v - c["value"]) <= c.get("tol", 1e-6), f"{c['name']} = {v!r}, want {c['value']!r}"


def _answer(c, state, answer):
    if answer is None:
        return False, "the episode gave no ANS answer"
    if "value" in c:
        return answer.strip() == str(c["value"]).strip(), f"ANS {answer!r}, want {c['value']!r}"
    try:
        v = float(answer.strip())
    except ValueError:
        return False, f"ANS {answer!r} is not a number"
    return abs(v - c["number"]) <= c.get("tol", 1e-6), f"ANS {v!r}, want {c['number']!r}"


def _state(c, state, answer):
    cur: Any = state
    for part in c["path"].split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur == c["value"], f"{c['path']} = {cur!r}, want {c['value']!r}"


def _on(f: "MathExpr", point: list, tol: float) -> bool:
    names = ("x", "y", "z")[: len(point) - 1]
    env = dict(zip(names, (float(v) for v in point[:-1])))
    try:
        if f.equation:
            lhs, rhs = f.sides(env)
            return abs(lhs - rhs) <= tol * (1 + abs(lhs) + abs(rhs))
        out = names[-1]
        got = f.value({k: v for k, v in env.items() if k != out})
        return abs(got - env[out]) <= tol * (1 + abs(env[out]))
    except (ArithmeticError, ValueError):
        return False


def _eqn(c, state, answer):
    dim = c.get("dim", 2)
    exprs = ([f["expression"] for f in state.get("functions_2d", [])] if dim == 2
             else [state["function_3d"]] if state.get("function_3d") else [])
    notes = []
    if "count" in c:
        if len(exprs) != c["count"]:
            return False, f"{len(exprs)} functions plotted, want {c['count']}"
        notes.append(f"{len(exprs)} functions")
    points = c.get("points")
    if not points:
        return True, "; ".join(notes)
    tol = c.get("tol", 1e-6)
    for text in exprs:
        try:
            f = MathExpr(text)
        except ValueError as e:
            notes.append(f"{text!r}: {e}")
            continue
        bad = [p for p in points if _on(f, p, tol) != p[-1]]
        if not bad:
            return True, f"{text!r} passes all {len(points)} points"
        notes.append(f"{text!r} fails at {bad[0][:-1]}")
    return False, "; ".join(notes) or "nothing is plotted"


_RUNNERS: dict[str, Callable] = {"var": _var, "val": _val, "eqn": _eqn, "answer": _answer, "state": _state}


# ------------------------------------------------------------------------------------------------ maths
def _root(x: float, n: float = 2.0) -> float:
    if x < 0 and float(n).is_integer() and int(n) % 2 == 1:
        return -((-x) ** (1.0 / n))
    return x ** (1.0 / n)


_FUNCS: dict[str, Callable[..., float]] = {
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "sec": lambda x: 1 / math.cos(x),
    "csc": lambda x: 1 / math.sin(x), "cot": lambda x: 1 / math.tan(x), "arcsin": math.asin,
    "arccos": math.acos, "arctan": math.atan, "sinh": math.sinh, "cosh": math.cosh, "tanh": math.tanh,
    "arcsinh": math.asinh, "arccosh": math.acosh, "arctanh": math.atanh, "ln": math.log,
    "log": math.log10, "exp": math.exp, "sqrt": math.sqrt, "abs": abs, "root": _root,
    "floor": math.floor, "ceiling": math.ceil, "factorial": lambda x: math.gamma(x + 1) if x <= 170 else math.inf,
    "sign": lambda x: float((x > 0) - (x < 0)), "power": math.pow, "max": max, "min": min,
}
_CONSTS = {"pi": math.pi, "e": math.e, "euler": 0.5772156649015329, "true": 1.0, "false": 0.0}
_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+)|([A-Za-z_][A-Za-z_0-9]*)|(->|[-+*/^(),=]))")


class MathExpr:
    """A KAlgebra expression: `x->sin(x)^2`, `(x,y)->x*y`, `x^2+y^2=1`, `2x+1`, `root(3, 2)`.

    Parsed once into a tree of tuples; `value(env)` evaluates it. Implicit multiplication (`2x`, `3(x+1)`)
    and KAlgebra's `^` power are understood. Unknown names or functions are errors, never look-ups.
    """

    MAX_LEN = 2000

    def __init__(self, text: str):
        if not isinstance(text, str) or len(text) > self.MAX_LEN:
            raise ValueError("expression must be a string of at most 2000 characters")
        self.text = text
        self._toks = self._tokenize(text)
        self._i = 0
        self.params: tuple[str, ...] = ()
        self._lambda()
        tree = self._sum()
        self.equation = self._peek() == "="
        if self.equation:
            self._i += 1
            self._rhs = self._sum()
        self._tree = tree
        if self._i != len(self._toks):
            raise ValueError(f"unexpected {self._toks[self._i][1]!r} in {text!r}")

    @staticmethod
    def _tokenize(text: str) -> list[tuple[str, str]]:
        out, pos = [], 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise ValueError(f"cannot read {text[pos:pos + 10]!r}")
            num, name, op = m.groups()
            out.append(("num", num) if num else ("name", name) if name else ("op", op))
            pos = m.end()
        return out

    def _peek(self) -> str | None:
        return self._toks[self._i][1] if self._i < len(self._toks) else None

    def _take(self, want: str | None = None) -> tuple[str, str]:
        if self._i >= len(self._toks):
            raise ValueError(f"unexpected end of {self.text!r}")
        tok = self._toks[self._i]
        if want is not None and tok[1] != want:
            raise ValueError(f"expected {want!r}, got {tok[1]!r} in {self.text!r}")
        self._i += 1
        return tok

    def _lambda(self) -> None:
        t = self._toks
        if len(t) > 1 and t[0][0] == "name" and t[1][1] == "->":
            self.params, self._i = (t[0][1],), 2
        elif t and t[0][1] == "(":
            j, names = 1, []
            while j < len(t) and t[j][0] == "name":
                names.append(t[j][1])
                j += 1
                if j < len(t) and t[j][1] == ",":
                    j += 1
            if names and j + 1 < len(t) and t[j][1] == ")" and t[j + 1][1] == "->":
                self.params, self._i = tuple(names), j + 2

    def _sum(self):
        node = self._product()
        while self._peek() in ("+", "-"):
            op = self._take()[1]
            node = (op, node, self._product())
        return node

    def _product(self):
        node = self._unary()
        while True:
            nxt = self._peek()
            if nxt in ("*", "/"):
                op = self._take()[1]
                node = (op, node, self._unary())
            elif self._i < len(self._toks) and (self._toks[self._i][0] in ("name", "num") or nxt == "("):
                node = ("*", node, self._power())  # implicit multiplication: 2x, 3(x+1)
            else:
                return node

    def _unary(self):
        if self._peek() in ("-", "+"):
            op = self._take()[1]
            inner = self._unary()
            return ("neg", inner) if op == "-" else inner
        return self._power()

    def _power(self):
        base = self._atom()
        if self._peek() == "^":
            self._take()
            return ("^", base, self._unary())  # right-associative, binds tighter than unary minus on the left
        return base

    def _atom(self):
        kind, val = self._take()
        if kind == "num":
            return ("num", float(val))
        if kind == "name":
            if self._peek() == "(" and val in _FUNCS:
                self._take("(")
                args = [self._sum()]
                while self._peek() == ",":
                    self._take()
                    args.append(self._sum())
                self._take(")")
                return ("call", val, args)
            if val in _FUNCS and self._i < len(self._toks) and self._toks[self._i][0] in ("name", "num"):
                return ("call", val, [self._power()])  # KAlgebra accepts `sin x`
            return ("name", val)
        if val == "(":
            node = self._sum()
            self._take(")")
            return node
        raise ValueError(f"unexpected {val!r} in {self.text!r}")

    def _eval(self, node, env: dict[str, float]) -> float:
        tag = node[0]
        if tag == "num":
            return node[1]
        if tag == "name":
            if node[1] in env:
                return env[node[1]]
            if node[1] in _CONSTS:
                return _CONSTS[node[1]]
            raise ValueError(f"unknown name {node[1]!r}")
        if tag == "neg":
            return -self._eval(node[1], env)
        if tag == "call":
            return float(_FUNCS[node[1]](*(self._eval(a, env) for a in node[2])))
        a, b = self._eval(node[1], env), self._eval(node[2], env)
        if tag == "+":
            return a + b
        if tag == "-":
            return a - b
        if tag == "*":
            return a * b
        if tag == "/":
            return a / b
        if abs(b) > 1e4 or (abs(a) > 1e6 and b > 1):
            raise OverflowError("power too large")
        r = a ** b
        if isinstance(r, complex):
            raise ValueError("complex result")
        return r

    def _bind(self, env: dict[str, float]) -> dict[str, float]:
        if self.params:  # a lambda's parameters take the point's coordinates in order (x, y, z)
            coords = [env[k] for k in ("x", "y", "z") if k in env]
            return dict(zip(self.params, coords))
        return env

    def value(self, env: dict[str, float]) -> float:
        if self.equation:
            raise ValueError(f"{self.text!r} is an equation, not a function")
        return self._eval(self._tree, self._bind(env))

    def sides(self, env: dict[str, float]) -> tuple[float, float]:
        env = self._bind(env)
        return self._eval(self._tree, env), self._eval(self._rhs, env)
