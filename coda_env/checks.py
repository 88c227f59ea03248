"""Generic checks and the restricted expression language they share; apps add their own check types.

A check is a dict with a `type`; every type validates its fields when a task file loads and, at the end of
an episode, answers (passed, detail) from a `CheckContext` (the app's state, the agent's answer, files of
the app's home). Core types, usable by every app:
- `answer`:    {"value": "4"} (stripped string) or {"number": 4, "tol": 1e-6}: the agent's `ANS` text
- `state`:     {"path": "tab", "value": "2D Graph"[, "app": name]}: a dotted path into the state equals a value
- `file`:      {"path": "doc.tex", "equals": "..."} | {"sha256": "..."} | {"exists": bool}
- `include`:   {"path": "doc.tex" | "state": "a.b", "pattern": regex[, "count": n][, "negate": true]}
- `predicate`: {"expr": "state['statusbar']['mode'] == 'x'"[, "app": name]}

The predicate language is a subset of Python expressions, parsed with `ast` and interpreted by a tree
walker over a whitelist: literals, the names `state` and `answer`, subscripts, arithmetic, comparisons
(`in` too), and/or/not, conditional expressions, list/tuple literals, and calls of a few pure functions
(abs, min, max, len, round, float, int, str, sum, any, all, sorted, lower, upper, strip). No attribute
access, no other names or calls: nothing a task file says is ever `eval`ed. ScienceBoard's checks are
lambda strings; `translate_lambda` turns one into this language or refuses it with the reason.
"""
from __future__ import annotations

import ast
import hashlib
import math
import re

import regex
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .registry import (CHECKS, MAX_VALUE, CheckContext, CheckError, CheckType, check_fields, finite_values, number,
                       register_check, relative_path)

__all__ = ["CheckError", "CheckResult", "Predicate", "compile_predicate", "translate_lambda", "run_checks",
           "validate_check", "get_path", "is_number", "check_tolerance", "same_value"]


# ------------------------------------------------------------------------------------------ helpers
def is_number(v: Any) -> bool:
    """A real, finite number (bool is not a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_tolerance(check: dict, name: str = "tol") -> None:
    if name in check:
        number(check[name], repr(name), 0, MAX_VALUE, error=CheckError)


def check_path(check: dict, name: str = "path") -> None:
    """A file a check reads: relative to the app's home, no '..', not absolute (on load, not only at run)."""
    relative_path(check.get(name), repr(name), CheckError)


def same_value(got: Any, want: Any) -> bool:
    """Equality that does not confuse types: True is not 1, "1" is not 1, NaN equals nothing."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if is_number(want):
        return is_number(got) and got == want
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(map(same_value, got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


def get_path(obj: Any, path: str) -> Any:
    """A dotted path into nested dicts/lists (`layers.0.name`); KeyError naming the missing part."""
    cur = obj
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, (list, tuple)) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise KeyError(f"{path!r}: no {part!r} in the state")
    return cur


def _str_field(check: dict, name: str, required: bool = True) -> None:
    if name in check and not isinstance(check[name], str):
        raise CheckError(f"{name!r} must be a string, got {type(check[name]).__name__}")
    if required and not check.get(name):
        raise CheckError(f"{name!r} must be a non-empty string")


# ------------------------------------------------------------------------------------------ regex with a deadline
MAX_PATTERN = 2_000
MAX_SUBJECT = 2_000_000
REGEX_TIMEOUT = 2.0


def compile_pattern(pattern: Any) -> "regex.Pattern":
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN:
        raise CheckError(f"'pattern' must be a regular expression of 1..{MAX_PATTERN} characters")
    try:
        return regex.compile(pattern, regex.MULTILINE)
    except regex.error as e:
        raise CheckError(f"'pattern' {pattern!r} is not a valid regular expression: {e}") from None


def find_all(pattern: "regex.Pattern", text: str, timeout: float = REGEX_TIMEOUT) -> int:
    """How many matches, bounded in time: a backtracking pattern from a task file cannot hang the env.
    (The `regex` module, unlike `re`, can stop a match at a deadline; `re` holds the GIL throughout.)"""
    try:
        return sum(1 for _ in pattern.finditer(text[:MAX_SUBJECT], timeout=timeout))
    except TimeoutError:
        raise TimeoutError(f"the regular expression did not finish within {timeout:g} s") from None


# ------------------------------------------------------------------------------------------ the predicate language
MAX_EXPR = 4_000
MAX_DEPTH = 40
MAX_COLLECTION = 100_000


def _lower(s): return _need_str(s, "lower").lower()
def _upper(s): return _need_str(s, "upper").upper()
def _strip(s): return _need_str(s, "strip").strip()


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
    "abs": abs, "min": _sized(min), "max": _sized(max), "len": len, "round": round, "float": float,
    "int": int, "str": str, "sum": _sized(sum), "any": _sized(any), "all": _sized(all), "sorted": _sized(sorted),
    "lower": _lower, "upper": _upper, "strip": _strip, "bool": bool,
}
NAMES = ("state", "answer")

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}
_CMPS = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
         ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
         ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
         ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b}


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


# ------------------------------------------------------------------------------------------ running checks
@dataclass
class CheckResult:
    passed: bool
    check: dict
    detail: str


def validate_check(check: Any) -> None:
    """CheckError naming the problem if a check dict is malformed (unknown type, fields, values)."""
    if not isinstance(check, dict):
        raise CheckError(f"a check must be an object, got {type(check).__name__}")
    kind = check.get("type")
    if not isinstance(kind, str) or kind not in CHECKS:
        raise CheckError(f"unknown check type {kind!r}; known: {', '.join(sorted(CHECKS))}")
    ct = CHECKS[kind]
    check_fields(check, ct.fields, f"check {kind!r}", "type", CheckError)
    ct.validate(check)


def run_checks(checks: Sequence[dict], ctx: CheckContext | dict, answer: str | None = None
               ) -> tuple[bool, list[CheckResult]]:
    """All checks must pass (and there must be one). An exception inside a check fails that check with a
    detail; it never escapes. `ctx` may be a bare state dict (with `answer`) for simple uses."""
    if not isinstance(ctx, CheckContext):
        ctx = CheckContext(answer=answer, state=ctx)
    results = []
    for c in checks:
        try:
            ct = CHECKS[c["type"]]
            ok, detail = ct.run(c, ctx)
            ok = ok is True
        except Exception as e:  # noqa: BLE001 - any failure inside a check fails that check
            ok, detail = False, f"could not evaluate: {type(e).__name__}: {e}"
        results.append(CheckResult(ok, c, str(detail)))
    return bool(results) and all(r.passed for r in results), results


# ------------------------------------------------------------------------------------------ core check types
def _answer_validate(c: dict) -> None:
    if ("value" in c) == ("number" in c):
        raise CheckError("check 'answer' needs exactly one of value or number")
    if "value" in c and not isinstance(c["value"], (str, int, float)) or isinstance(c.get("value"), bool):
        raise CheckError("check 'answer' value must be a string or a number")
    if "number" in c:
        number(c["number"], "check 'answer' number", error=CheckError)
    if "value" in c and not isinstance(c["value"], str):
        finite_values(c["value"], "check 'answer' value", CheckError)
    if "tol" in c and "number" not in c:
        raise CheckError("check 'answer' tol goes with number")
    check_tolerance(c)


def parse_number(text: str) -> float | None:
    """A finite decimal number written plainly ("81", "-2.5", "1e3"), else None."""
    t = text.strip()
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", t):
        return None
    v = float(t)
    return v if math.isfinite(v) else None


def _answer(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    answer = ctx.answer
    if answer is None:
        return False, "the episode gave no ANS answer"
    if "value" in c:
        return answer.strip() == str(c["value"]).strip(), f"ANS {answer!r}, want {c['value']!r}"
    v = parse_number(answer)
    if v is None:
        return False, f"ANS {answer!r} is not a number"
    return abs(v - c["number"]) <= c.get("tol", 1e-6), f"ANS {v!r}, want {c['number']!r}"


def _state_validate(c: dict) -> None:
    _str_field(c, "path")
    _str_field(c, "app", required=False)
    finite_values(c.get("value"), "check 'state' value", CheckError)


def _state(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    try:
        got = get_path(ctx.state_of(c.get("app")), c["path"])
    except KeyError as e:
        return False, str(e).strip("'\"")
    return same_value(got, c["value"]), f"{c['path']} = {got!r}, want {c['value']!r}"


def _file_validate(c: dict) -> None:
    check_path(c)
    modes = [k for k in ("equals", "sha256", "exists") if k in c]
    if len(modes) != 1:
        raise CheckError("check 'file' needs exactly one of equals, sha256, exists")
    if "equals" in c and not isinstance(c["equals"], str):
        raise CheckError("check 'file' equals must be a string")
    if "sha256" in c and not (isinstance(c["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", c["sha256"])):
        raise CheckError("check 'file' sha256 must be 64 lowercase hex digits")
    if "exists" in c and not isinstance(c["exists"], bool):
        raise CheckError("check 'file' exists must be true or false")


def pdf_pages(ctx: CheckContext, data: bytes) -> tuple[int, str]:
    """(pages, why not) of a PDF by poppler's pdfinfo, run on a copy: sealed, in the desktop's own folder
    (outside the app's home) on this machine; in the VM guest, which is the sandbox, elsewhere."""
    import shutil
    import tempfile
    d = ctx.desktop
    if d is None:
        return 0, "no desktop to run pdfinfo on"
    if not data.startswith(b"%PDF-"):
        return 0, "no %PDF- header"
    scratch = tempfile.mkdtemp(prefix="check-pdf-", dir=d.tmpdir) if d.tmpdir else None
    try:
        if scratch:
            with open(f"{scratch}/f.pdf", "wb") as f:
                f.write(data)
            r = d.run(["pdfinfo", f"{scratch}/f.pdf"], timeout=30, writable=[scratch])
        else:
            path = d.run(["mktemp", "/tmp/coda-pdf-XXXXXX"], timeout=10).stdout.decode().strip()
            d.write_file(path, data)
            r = d.run(["pdfinfo", path], timeout=30, writable=[])
            d.run(["rm", "-f", "--", path], timeout=10)
    except Exception as e:  # noqa: BLE001 - pdfinfo missing, timed out, a dead desktop
        return 0, f"pdfinfo failed: {type(e).__name__}: {e}"
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    m = re.search(rb"^Pages:\s+(\d+)", r.stdout or b"", re.M)
    if r.returncode != 0 or not m:
        return 0, f"pdfinfo: {(r.stderr or b'').decode(errors='replace').strip()[:200] or 'no page count'}"
    return int(m.group(1)), ""


def _norm(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").strip("\n").split("\n"))


def _file(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    data = ctx.read_file(c["path"])
    if "exists" in c:
        if data is not None and c["exists"] and c["path"].lower().endswith(".pdf"):
            pages, why = pdf_pages(ctx, data)  # a PDF counts only when it is one: `touch main.pdf` is not
            if not pages:
                return False, f"{c['path']} exists but is not a PDF with pages ({why})"
            return True, f"{c['path']} exists ({pages} page(s))"
        return (data is not None) == c["exists"], f"{c['path']} {'exists' if data is not None else 'is missing'}"
    if data is None:
        return False, f"{c['path']} is missing"
    if "sha256" in c:
        got = hashlib.sha256(data).hexdigest()
        return got == c["sha256"], f"{c['path']} sha256 {got[:12]}..., want {c['sha256'][:12]}..."
    text = data.decode("utf-8", errors="replace")
    ok = _norm(text) == _norm(c["equals"])
    return ok, f"{c['path']} {'matches' if ok else 'differs from'} the expected text ({len(text)} characters)"


def _include_validate(c: dict) -> None:
    if ("path" in c) == ("state" in c):
        raise CheckError("check 'include' needs exactly one of path or state")
    if "path" in c:
        check_path(c)
    else:
        _str_field(c, "state")
    compile_pattern(c.get("pattern"))
    if "count" in c:
        number(c["count"], "check 'include' count", 0, MAX_SUBJECT, integer=True, error=CheckError)
    if "negate" in c and not isinstance(c["negate"], bool):
        raise CheckError("check 'include' negate must be true or false")


def _include(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    if "path" in c:
        data = ctx.read_file(c["path"])
        if data is None:
            return False, f"{c['path']} is missing"
        text, where = data.decode("utf-8", errors="replace"), c["path"]
    else:
        try:
            value = get_path(ctx.state_of(c.get("app")), c["state"])
        except KeyError as e:
            return False, str(e).strip("'\"")
        text, where = (value if isinstance(value, str) else str(value)), c["state"]
    n = find_all(compile_pattern(c["pattern"]), text)
    if "count" in c:
        ok = n == c["count"]
    else:
        ok = n > 0
    if c.get("negate"):
        ok = not ok
    return ok, f"{n} matches of {c['pattern']!r} in {where}"


def _predicate_validate(c: dict) -> None:
    compile_predicate(c.get("expr"))
    _str_field(c, "app", required=False)


def _predicate(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    value = compile_predicate(c["expr"])(ctx.state_of(c.get("app")), ctx.answer)
    return value is True, f"{c['expr']} -> {value!r}"


CORE_CHECKS = [
    CheckType("answer", _answer, _answer_validate, (frozenset(), frozenset({"value", "number", "tol"}))),
    CheckType("state", _state, _state_validate, (frozenset({"path", "value"}), frozenset({"app"}))),
    CheckType("file", _file, _file_validate, (frozenset({"path"}), frozenset({"equals", "sha256", "exists"}))),
    CheckType("include", _include, _include_validate,
              (frozenset({"pattern"}), frozenset({"path", "state", "count", "negate", "app"}))),
    CheckType("predicate", _predicate, _predicate_validate, (frozenset({"expr"}), frozenset({"app"}))),
]
for _c in CORE_CHECKS:
    register_check(_c)
