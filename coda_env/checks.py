"""Generic checks (the core's registrations, as an app's are); apps add their own check types.

A check is a dict with a `type`; every type validates its fields when a task file loads and, at the end of
an episode, answers (passed, detail) from a `CheckContext` (the app's state, the agent's answer, files of
the app's home). Core types, usable by every app:
- `answer`:    {"value": "4"} (stripped string) or {"number": 4, "tol": 1e-6}: the agent's `ANS` text
- `state`:     {"path": "tab", "value": "2D Graph"[, "app": name]}: a dotted path into the state equals a value
- `file`:      {"path": "doc.tex", "equals": "..."} | {"sha256": "..."} | {"exists": bool}
- `include`:   {"path": "doc.tex" | "state": "a.b", "pattern": regex[, "count": n][, "negate": true]}
- `predicate`: {"expr": "state['statusbar']['mode'] == 'x'"[, "app": name]}

`predicate` expressions are in the restricted language of `predicate.py` (parsed with `ast`, interpreted
over a whitelist, never `eval`ed); `translate_lambda` turns ScienceBoard's lambda strings into it.
"""

from __future__ import annotations

import hashlib
import math
import re

import regex
from dataclasses import dataclass
from typing import Any, Sequence

from .predicate import Predicate, compile_predicate, translate_lambda  # the language: predicate.py
from .registry import (
    CHECKS,
    MAX_VALUE,
    CheckContext,
    CheckError,
    CheckType,
    finite_values,
    number,
    register_check,
    relative_path,
    validate_item,
)

__all__ = [
    "CheckError",
    "CheckResult",
    "Predicate",
    "compile_predicate",
    "translate_lambda",
    "run_checks",
    "validate_check",
    "get_path",
    "is_number",
    "check_tolerance",
    "same_value",
]


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


# ------------------------------------------------------------------------------------------ running checks
@dataclass
class CheckResult:
    passed: bool
    check: dict
    detail: str


def validate_check(check: Any) -> None:
    """CheckError naming the problem if a check dict is malformed (unknown type, fields, values)."""
    validate_item(check, "checks")


def run_checks(
    checks: Sequence[dict], ctx: CheckContext | dict, answer: str | None = None
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
    CheckType("answer", _answer, _answer_validate, optional={"value", "number", "tol"}),
    CheckType("state", _state, _state_validate, required={"path", "value"}, optional={"app"}),
    CheckType("file", _file, _file_validate, required={"path"}, optional={"equals", "sha256", "exists"}),
    CheckType(
        "include",
        _include,
        _include_validate,
        required={"pattern"},
        optional={"path", "state", "count", "negate", "app"},
    ),
    CheckType("predicate", _predicate, _predicate_validate, required={"expr"}, optional={"app"}),
]
for _c in CORE_CHECKS:
    register_check(_c)
