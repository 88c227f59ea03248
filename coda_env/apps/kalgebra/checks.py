"""KAlgebra's own check types, read from the state its adapter returns (variables, plotted functions).

- `var`: {"name": "p", "value": "1+-i"} the variable's text equals a string, or {"name": "e", "absent": true}
- `val`: {"name": "p", "value": 1.585, "tol": 1e-6} the variable holds a NUMBER within tol (a function such as
         `x->81`, an equation, a list or text is not a number, whatever it evaluates to)
- `eqn`: {"dim": 2|3, "points": [[x, y, bool], ...] (or [x, y, z, bool]), "count": n} some plotted function
         passes every point test; `count` alone checks how many 2D functions are plotted

ScienceBoard's harness `eval()`s lambda strings and asks a patched KAlgebra whether points lie on a plot;
here KAlgebra's expressions are parsed by a small recursive-descent parser (`MathExpr`) and evaluated over a
whitelist of functions. Nothing is `eval`ed.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from ...checks import check_tolerance, is_number
from ...registry import CheckContext, CheckError, CheckType, number

MAX_FUNCTIONS = 1000  # `count` of plotted functions, and points per check


def _name(c: dict) -> None:
    if not isinstance(c.get("name"), str) or not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]{0,63}", c["name"]):
        raise CheckError("'name' must be a KAlgebra variable name")


def _var_validate(c: dict) -> None:
    _name(c)
    if ("value" in c) == bool(c.get("absent")):
        raise CheckError("check 'var' needs exactly one of value or absent: true")
    if "absent" in c and c["absent"] is not True:
        raise CheckError("check 'var' absent must be true")
    if "value" in c and not isinstance(c["value"], str):
        raise CheckError("check 'var' value must be a string (KAlgebra's text of the value)")


def _val_validate(c: dict) -> None:
    _name(c)
    if not is_number(c.get("value")):
        raise CheckError("check 'val' needs a finite numeric value")
    number(c["value"], "check 'val' value", error=CheckError)
    check_tolerance(c)


def _eqn_validate(c: dict) -> None:
    if "points" not in c and "count" not in c:
        raise CheckError("check 'eqn' needs points or count")
    dim = c.get("dim", 2)
    if dim not in (2, 3) or isinstance(dim, bool):
        raise CheckError("check 'eqn' dim must be 2 or 3")
    if "count" in c:
        number(c["count"], "check 'eqn' count", 0, MAX_FUNCTIONS, integer=True, error=CheckError)
    check_tolerance(c)
    if "points" in c and (not isinstance(c["points"], list) or len(c["points"]) > MAX_FUNCTIONS):
        raise CheckError(f"check 'eqn' points must be a list of at most {MAX_FUNCTIONS}")
    for p in c.get("points", []):
        if (
            not isinstance(p, list)
            or len(p) != dim + 1
            or not isinstance(p[-1], bool)
            or not all(is_number(v) for v in p[:-1])
        ):
            raise CheckError(f"check 'eqn' point {p!r} must be [{'x, y' if dim == 2 else 'x, y, z'}, true|false]")
        for v in p[:-1]:
            number(v, "check 'eqn' point coordinate", error=CheckError)


def _variables(ctx: CheckContext) -> dict:
    v = ctx.state.get("variables", {})
    if not isinstance(v, dict):
        raise ValueError("the state's variables are not a table")
    return v


def _var(c, ctx):
    variables = _variables(ctx)
    if c.get("absent"):
        return c["name"] not in variables, f"{c['name']} {'present' if c['name'] in variables else 'absent'}"
    got = variables.get(c["name"])
    return got == c["value"], f"{c['name']} = {got!r}, want {c['value']!r}"


def number_value(text: Any) -> float:
    """The number a variable holds: ValueError for anything that is not a plain finite number (a function
    `x->81` evaluates to 81 but is not a number; neither is an equation, a list or NaN)."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not KAlgebra's text of a value")
    f = MathExpr(text)
    if f.params or f.equation or f.free_names():
        raise ValueError(f"{text!r} is not a number")
    v = f.value({})
    if not math.isfinite(v):
        raise ValueError(f"{text!r} is not a finite number")
    return v


def _val(c, ctx):
    got = _variables(ctx).get(c["name"])
    if got is None:
        return False, f"{c['name']} is not defined"
    try:
        v = number_value(got)
    except (ValueError, ArithmeticError) as e:
        return False, f"{c['name']} = {got!r}: {e}"
    return abs(v - c["value"]) <= c.get("tol", 1e-6), f"{c['name']} = {v!r}, want {c['value']!r}"


def _on(f: "MathExpr", point: list, tol: float) -> bool:
    names = ("x", "y", "z")[: len(point) - 1]
    env = dict(zip(names, (float(v) for v in point[:-1])))
    try:
        if f.equation:
            lhs, rhs = f.sides(env)
            return math.isfinite(lhs) and math.isfinite(rhs) and abs(lhs - rhs) <= tol * (1 + abs(lhs) + abs(rhs))
        out = names[-1]
        got = f.value({k: v for k, v in env.items() if k != out})
        return math.isfinite(got) and abs(got - env[out]) <= tol * (1 + abs(env[out]))
    except (ArithmeticError, ValueError, TypeError):
        return False


def _eqn(c, ctx):
    state = ctx.state
    dim = c.get("dim", 2)
    exprs = (
        [f["expression"] for f in state.get("functions_2d", [])]
        if dim == 2
        else [state["function_3d"]]
        if state.get("function_3d")
        else []
    )
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


CHECKS = [
    CheckType("var", _var, _var_validate, required={"name"}, optional={"value", "absent"}),
    CheckType("val", _val, _val_validate, required={"name", "value"}, optional={"tol"}),
    CheckType("eqn", _eqn, _eqn_validate, optional={"dim", "points", "count", "tol"}),
]


# ------------------------------------------------------------------------------------------------ maths
def _root(x: float, n: float = 2.0) -> float:
    if x < 0 and float(n).is_integer() and int(n) % 2 == 1:
        return -((-x) ** (1.0 / n))
    return x ** (1.0 / n)


_FUNCS: dict[str, Callable[..., float]] = {
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "sec": lambda x: 1 / math.cos(x),
    "csc": lambda x: 1 / math.sin(x),
    "cot": lambda x: 1 / math.tan(x),
    "arcsin": math.asin,
    "arccos": math.acos,
    "arctan": math.atan,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "arcsinh": math.asinh,
    "arccosh": math.acosh,
    "arctanh": math.atanh,
    "ln": math.log,
    "log": math.log10,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "abs": abs,
    "root": _root,
    "floor": math.floor,
    "ceiling": math.ceil,
    "factorial": lambda x: math.gamma(x + 1) if x <= 170 else math.inf,
    "sign": lambda x: float((x > 0) - (x < 0)),
    "power": math.pow,
    "max": max,
    "min": min,
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
        try:
            tree = self._sum()
        except RecursionError:
            raise ValueError(f"{text[:40]!r} is nested too deeply") from None
        self.equation = self._peek() == "="
        if self.equation:
            self._i += 1
            try:
                self._rhs = self._sum()
            except RecursionError:
                raise ValueError(f"{text[:40]!r} is nested too deeply") from None
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
                raise ValueError(f"cannot read {text[pos : pos + 10]!r}")
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
        r = a**b
        if isinstance(r, complex):
            raise ValueError("complex result")
        return r

    def free_names(self) -> set[str]:
        """Names that are neither parameters nor constants (an unbound variable)."""
        out: set[str] = set()

        def walk(node):
            if node[0] == "name" and node[1] not in self.params and node[1] not in _CONSTS:
                out.add(node[1])
            elif node[0] == "call":
                for a in node[2]:
                    walk(a)
            elif node[0] == "neg":
                walk(node[1])
            elif node[0] in ("+", "-", "*", "/", "^"):
                walk(node[1])
                walk(node[2])

        walk(self._tree)
        if self.equation:
            walk(self._rhs)
        return out

    def _bind(self, env: dict[str, float]) -> dict[str, float]:
        if self.params:  # a lambda's parameters take the point's coordinates in order (x, y, z)
            coords = [env[k] for k in ("x", "y", "z") if k in env]
            return dict(zip(self.params, coords))
        return env

    def value(self, env: dict[str, float]) -> float:
        if self.equation:
            raise ValueError(f"{self.text!r} is an equation, not a function")
        try:
            return self._eval(self._tree, self._bind(env))
        except RecursionError:
            raise ValueError("expression nested too deeply") from None

    def sides(self, env: dict[str, float]) -> tuple[float, float]:
        env = self._bind(env)
        try:
            return self._eval(self._tree, env), self._eval(self._rhs, env)
        except RecursionError:
            raise ValueError("expression nested too deeply") from None
