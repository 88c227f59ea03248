"""The restricted expression language of `predicate` checks (and of translated ScienceBoard lambdas).

A subset of Python expressions, parsed with `ast` and interpreted by a tree walker over a whitelist:
literals, the names `state` and `answer`, subscripts, arithmetic, comparisons (`in` too), and/or/not,
conditional expressions, list/tuple literals, and calls of a few pure functions (abs, min, max, len, round,
float, int, str, sum, any, all, sorted, lower, upper, strip). No attribute access, no other names or calls:
nothing a task file says is ever `eval`ed. ScienceBoard's checks are lambda strings; `translate_lambda`
turns one into this language or refuses it with the reason. Its own module: the language is the core's
most delicate code, and knows nothing of check types.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any, Callable

from .registry import MAX_VALUE, CheckError

MAX_EXPR = 4_000
MAX_DEPTH = 40
MAX_COLLECTION = 100_000


def _lower(s):
    return _need_str(s, "lower").lower()


def _upper(s):
    return _need_str(s, "upper").upper()


def _strip(s):
    return _need_str(s, "strip").strip()


def _need_str(s, fn):
    if not isinstance(s, str):
        raise TypeError(f"{fn}() takes a string, got {type(s).__name__}")
    return s


def _sized(fn: Callable) -> Callable:
    def call(*args):
        for a in args:
            if isinstance(a, (list, tuple, dict, str)) and len(a) > MAX_COLLECTION:
                raise ValueError("collection too large")
        return fn(*args)

    return call


FUNCTIONS: dict[str, Callable] = {
    "abs": abs,
    "min": _sized(min),
    "max": _sized(max),
    "len": len,
    "round": round,
    "float": float,
    "int": int,
    "str": str,
    "sum": _sized(sum),
    "any": _sized(any),
    "all": _sized(all),
    "sorted": _sized(sorted),
    "lower": _lower,
    "upper": _upper,
    "strip": _strip,
    "bool": bool,
}
NAMES = ("state", "answer")

_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_CMPS = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


def _reject(node: ast.AST, why: str) -> CheckError:
    try:
        src = ast.unparse(node)
    except Exception:  # noqa: BLE001
        src = type(node).__name__
    return CheckError(f"predicate: {why}: `{src[:80]}`")


def _validate_node(node: ast.AST, names: tuple[str, ...], depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise CheckError("predicate: nested too deeply")
    if isinstance(node, ast.Constant):
        if not (node.value is None or isinstance(node.value, (bool, int, float, str))):
            raise _reject(node, "only numbers, strings, booleans and None are allowed as constants")
        if isinstance(node.value, int) and not isinstance(node.value, bool) and abs(node.value) > 10**18:
            raise _reject(node, "integer constant too large")
        if isinstance(node.value, float) and not (math.isfinite(node.value) and abs(node.value) <= MAX_VALUE):
            raise _reject(node, f"number constant must be finite and at most {MAX_VALUE:g}")
        return
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise _reject(node, f"unknown name {node.id!r} (known: {', '.join(names)})")
        return
    if isinstance(node, ast.Subscript):
        if isinstance(node.slice, ast.Slice):
            for part in (node.slice.lower, node.slice.upper, node.slice.step):
                if part is not None:
                    _validate_node(part, names, depth + 1)
        else:
            _validate_node(node.slice, names, depth + 1)
        _validate_node(node.value, names, depth + 1)
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise _reject(node, f"operator {type(node.op).__name__} is not allowed (only + - * / // %)")
        _validate_node(node.left, names, depth + 1)
        _validate_node(node.right, names, depth + 1)
        return
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            raise _reject(node, "only unary -, + and not are allowed")
        _validate_node(node.operand, names, depth + 1)
        return
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _validate_node(v, names, depth + 1)
        return
    if isinstance(node, ast.Compare):
        if any(type(op) not in _CMPS for op in node.ops):
            raise _reject(node, "comparison operator not allowed")
        for v in (node.left, *node.comparators):
            _validate_node(v, names, depth + 1)
        return
    if isinstance(node, ast.IfExp):
        for v in (node.test, node.body, node.orelse):
            _validate_node(v, names, depth + 1)
        return
    if isinstance(node, (ast.List, ast.Tuple)):
        if len(node.elts) > 1000:
            raise _reject(node, "literal too long")
        for v in node.elts:
            if isinstance(v, ast.Starred):
                raise _reject(v, "starred expressions are not allowed")
            _validate_node(v, names, depth + 1)
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise _reject(node, f"only calls of {', '.join(FUNCTIONS)} are allowed")
        if node.keywords:
            raise _reject(node, "keyword arguments are not allowed")
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise _reject(a, "starred arguments are not allowed")
            _validate_node(a, names, depth + 1)
        return
    if isinstance(node, ast.Attribute):
        raise _reject(node, "attribute access is not allowed (use lower(x), not x.lower())")
    raise _reject(node, f"{type(node).__name__} is not allowed")


def _eval(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.Subscript):
        base = _eval(node.value, env)
        if isinstance(node.slice, ast.Slice):
            s = node.slice
            key = slice(*(None if p is None else _eval(p, env) for p in (s.lower, s.upper, s.step)))
        else:
            key = _eval(node.slice, env)
        if not isinstance(base, (dict, list, tuple, str)):
            raise TypeError(f"cannot index a {type(base).__name__}")
        return base[key]
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Mult) and (isinstance(a, (str, list, tuple)) or isinstance(b, (str, list, tuple))):
            n = b if isinstance(a, (str, list, tuple)) else a
            seq = a if isinstance(a, (str, list, tuple)) else b
            if not isinstance(n, int) or len(seq) * max(n, 0) > MAX_COLLECTION:
                raise ValueError("repetition too large")
        r = _BINOPS[type(node.op)](a, b)
        if isinstance(r, (str, list, tuple)) and len(r) > MAX_COLLECTION:
            raise ValueError("result too large")
        return r
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not v
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            v: Any = True
            for x in node.values:
                v = _eval(x, env)
                if not v:
                    return v
            return v
        v = False
        for x in node.values:
            v = _eval(x, env)
            if v:
                return v
        return v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, env)
            if not _CMPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, ast.List):
        return [_eval(v, env) for v in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_eval(v, env) for v in node.elts)
    if isinstance(node, ast.Call):
        return FUNCTIONS[node.func.id](*(_eval(a, env) for a in node.args))
    raise CheckError(f"predicate: {type(node).__name__} is not allowed")  # unreachable after validation


@dataclass(frozen=True)
class Predicate:
    """A validated predicate expression; call it with the state (and the answer) to get its value."""

    source: str
    tree: ast.Expression

    def __call__(self, state: Any, answer: str | None = None) -> Any:
        return _eval(self.tree.body, {"state": state, "answer": answer})


def _parse(src: Any, what: str = "predicate") -> ast.Expression:
    if not isinstance(src, str) or not src.strip():
        raise CheckError(f"{what} must be a non-empty string")
    if len(src) > MAX_EXPR:
        raise CheckError(f"{what} is too long ({len(src)} characters; max {MAX_EXPR})")
    try:
        return ast.parse(src.strip(), mode="eval")
    except SyntaxError as e:
        raise CheckError(f"{what} {src[:60]!r} is not an expression: {e.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise CheckError(f"{what} is nested too deeply or invalid") from None


def compile_predicate(src: Any) -> Predicate:
    """Parse and validate a predicate; CheckError names what is outside the whitelist."""
    tree = _parse(src)
    _validate_node(tree.body, NAMES)
    return Predicate(src.strip(), tree)


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str):
        self.old = old

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name("state" if node.id == self.old else node.id, node.ctx), node)


_METHODS = {"lower", "upper", "strip"}


class _Methods(ast.NodeTransformer):
    """`x.lower()` -> `lower(x)` (ScienceBoard writes the method form)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in _METHODS and not node.args and not node.keywords:
            return ast.copy_location(ast.Call(ast.Name(f.attr, ast.Load()), [f.value], []), node)
        return node


def translate_lambda(src: Any) -> str:
    """ScienceBoard's `lambda dump: <expr>` (or a bare expression over `dump`) as a predicate over `state`.
    Refused with CheckError, the reason named, when it uses anything outside the whitelist; nothing of it
    runs."""
    tree = _parse(src, "lambda")
    body = tree.body
    arg = "dump"
    if isinstance(body, ast.Lambda):
        a = body.args
        if a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg or a.defaults or len(a.args) != 1:
            raise CheckError("lambda: only `lambda x: <expression>` with one argument is translated")
        arg, body = a.args[0].arg, body.body
    if arg in NAMES and arg != "state":
        raise CheckError(f"lambda: argument name {arg!r} clashes with the predicate's names")
    body = _Methods().visit(body)
    body = _Rename(arg).visit(body)
    ast.fix_missing_locations(body)
    _validate_node(body, NAMES)
    return ast.unparse(body)
