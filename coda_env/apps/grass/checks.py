"""GRASS's check types: `info` reads the GUI's state dump, `db` asks GRASS about the data.

Both pick a value with a PATH and compare it with exactly one test.

PATH: a dotted string ("statusbar.mode", "layers.0.opacity") or a list whose items are keys, list indices,
or filters: {"name": "towns@PERMANENT"} picks the first list element whose fields equal those values
(`["layers", {"name": "towns@PERMANENT"}, "opacity"]`). A path that does not resolve is "missing".

Tests (one per check): `value` (equality; numbers within `tol`, default 1e-6), `gt`/`ge`/`lt`/`le`
(numbers; `gt` and `lt` may come together as a range), `contains` (an item of a list / a substring of a
text), `all_in` (each listed item is contained), `one_of` (the value is one of a list), `exists`
(true/false: the path resolves), or `expr`: a core predicate (coda_env.checks.compile_predicate) in which
`state` is the value the path picked (the whole dump when there is no path).

`info`: {"type": "info", "path": ..., <test>} over the adapter's state() (see guistate.py for its keys).
`db`:   {"type": "db", "module": "r.univar", "args": {"map": "elevation"}, "flags": "g",
         "parse": "kv", "path": "mean", "value": 500.49, "tol": 0.01}
  runs one whitelisted, read-only GRASS module (no shell: module, options and flags are data checked
  against `MODULES`) in a throwaway mapset of the episode's location. `parse` turns its output into data:
  `text` (stripped), `lines`, `kv` (key=value lines; numbers become floats), `json`, `table` (a
  `|`-separated table with a header row: a list of row dicts), `columns` (`v.info -c`: [{name, sql_type}]).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ...predicate import compile_predicate
from ...registry import (
    MAX_VALUE,
    AppError,
    CheckError,
    CheckType,
    finite_values,
    number,
)

TESTS = ("value", "gt", "ge", "lt", "le", "contains", "all_in", "one_of", "exists", "expr")
_MISSING = object()

# module -> (allowed options, allowed flags). Nothing here writes: no output=, no SQL other than a
# single-statement WHERE clause (checked by _WHERE), and the queries run in a throwaway mapset.
MODULES: dict[str, tuple[frozenset[str], str]] = {
    "g.list": (frozenset({"type", "pattern", "exclude", "mapset"}), "m"),
    "g.region": (frozenset({"region", "raster", "vector"}), "pgcelmu"),
    "g.findfile": (frozenset({"element", "file", "mapset"}), ""),
    "r.info": (frozenset({"map"}), "grsh"),
    "r.univar": (frozenset({"map", "zones", "percentile"}), "ge"),
    "r.describe": (frozenset({"map", "nv", "nsteps"}), "1rndi"),
    "r.stats": (frozenset({"input", "separator", "nsteps"}), "acpnNlgx1C"),
    "r.what": (frozenset({"map", "coordinates", "separator", "null_value"}), "nfcv"),
    "r.category": (frozenset({"map", "separator"}), ""),
    "r.colors.out": (frozenset({"map"}), "p"),
    "v.info": (frozenset({"map", "layer"}), "ctgehl"),
    "v.db.select": (frozenset({"map", "layer", "columns", "where", "separator", "format", "null_value"}), "cv"),
    "v.univar": (frozenset({"map", "column", "type", "where", "layer"}), "ge"),
    "v.db.univar": (frozenset({"map", "column", "where", "layer"}), "ge"),
    "v.category": (frozenset({"input", "option", "type", "layer"}), "g"),
    "v.to.db": (frozenset({"map", "option", "columns", "type", "layer", "units", "separator"}), "p"),
    "db.describe": (frozenset({"table"}), "c"),
}
# Options refused by name whatever the module, with why: a `db` check reads the episode's own data only.
REFUSED_OPTIONS = {
    "database": "names a database file, which the query would open or create (it reads the "
    "episode's own attribute database only)",
    "driver": "picks a database driver (the episode's own database only)",
}
# Numeric options: (low, high, integer). nsteps: how many ranges a module splits a map into (time and memory).
NUMBER_OPTIONS = {"nsteps": (1, 10_000, True), "percentile": (0, 100, False), "layer": (-1, 1_000_000, True)}
# Options naming GRASS elements, files and mapsets: a plain name, no folders.
NAME_OPTIONS = frozenset({"element", "file", "mapset", "region", "map", "input", "zones", "table", "layer"})
_PLAIN_NAME = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_.@,\-]{0,255}|\.|\*)$")  # also lists; mapset . or *
_REQUIRED_FLAGS = {"v.to.db": "p"}  # v.to.db writes to the table unless it only prints (-p)
_VALUE = re.compile(r"^[A-Za-z0-9_.@:,+\-/ =<>'%*|]{0,300}$")
_WHERE = re.compile(r"^[A-Za-z0-9_.@:,+\-/ =<>'%*()]{1,300}$")
_FORBIDDEN_SQL = re.compile(
    r";|--|/\*|\b(insert|update|delete|drop|alter|create|attach|detach|pragma|replace|vacuum|"
    r"load_extension|readfile|writefile|fts3_tokenizer)\b",
    re.I,
)
PARSERS = ("text", "lines", "kv", "json", "table", "columns")


# ------------------------------------------------------------------------------------------ paths
def _path_items(path: Any) -> list:
    if isinstance(path, str):
        return [int(p) if p.lstrip("-").isdigit() else p for p in path.split(".")] if path else []
    if isinstance(path, list):
        return path
    if isinstance(path, int) and not isinstance(path, bool):
        return [path]
    raise CheckError(f"path must be a dotted string or a list, got {type(path).__name__}")


def _validate_path(path: Any) -> None:
    for p in _path_items(path):
        if isinstance(p, dict):
            if not p or not all(isinstance(k, str) for k in p):
                raise CheckError(f"path filter {p!r} must map field names to values")
        elif not isinstance(p, (str, int)) or isinstance(p, bool):
            raise CheckError(f"path item {p!r} must be a key, an index or a filter object")


def resolve(data: Any, path: Any) -> Any:
    """The value at `path` in `data`, or _MISSING."""
    cur = data
    for p in _path_items(path):
        if isinstance(p, dict):
            if not isinstance(cur, list):
                return _MISSING
            cur = next(
                (x for x in cur if isinstance(x, dict) and all(_equal(x.get(k), v) for k, v in p.items())), _MISSING
            )
        elif isinstance(p, int) and isinstance(cur, list):
            cur = cur[p] if -len(cur) <= p < len(cur) else _MISSING
        elif isinstance(cur, dict):
            cur = cur.get(str(p), _MISSING)
        else:
            return _MISSING
        if cur is _MISSING:
            return _MISSING
    return cur


def _number(v: Any) -> float | None:
    """A finite number, or a string that is one (the state's and GRASS's output hold numbers as text)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            f = float(v.strip())
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None


def _bounded(v: Any, what: str, low: float = -MAX_VALUE, high: float = MAX_VALUE, integer: bool = False) -> None:
    """A number, or a string of one, finite and in [low, high] (CheckError naming `what` otherwise)."""
    got = _number(v) if isinstance(v, str) else v
    if got is None:
        raise CheckError(f"{what} must be a finite number, got {v!r}")
    if integer and isinstance(got, float) and got.is_integer() and isinstance(v, str):
        got = int(got)
    number(got, what, low, high, integer=integer, error=CheckError)


def _equal(got: Any, want: Any, tol: float = 1e-6) -> bool:
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        g = _number(got)
        return g is not None and math.isfinite(g) and abs(g - want) <= tol
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_equal(g, w, tol) for g, w in zip(got, want))
    if isinstance(want, str) and isinstance(got, (int, float)) and not isinstance(got, bool):
        return str(got) == want or _equal(got, _number(want), tol) if _number(want) is not None else False
    return got == want


def _contains(got: Any, item: Any) -> bool:
    if isinstance(got, str):
        return isinstance(item, str) and item in got
    if isinstance(got, (list, tuple)):
        return any(_equal(x, item) for x in got)
    if isinstance(got, dict):
        return item in got
    return False


# ------------------------------------------------------------------------------------------ validation
def _validate_test(c: dict) -> None:
    present = [t for t in TESTS if t in c]
    ranged = set(present) <= {"gt", "ge", "lt", "le"} and len(present) == 2 and len({t[0] for t in present}) == 2
    if len(present) != 1 and not ranged:
        raise CheckError(f"needs exactly one test of {', '.join(TESTS)} (or a gt/ge with an lt/le), got {present}")
    for t in ("gt", "ge", "lt", "le"):
        if t in c:
            _bounded(c[t], repr(t))
    if "tol" in c:
        number(c["tol"], "'tol'", 0, MAX_VALUE, error=CheckError)
    for t in ("value", "contains", "all_in", "one_of"):
        if t in c:
            finite_values(c[t], f"{t!r}", CheckError)
    if "all_in" in c and not isinstance(c["all_in"], list):
        raise CheckError("'all_in' must be a list")
    if "one_of" in c and not isinstance(c["one_of"], list):
        raise CheckError("'one_of' must be a list")
    if "exists" in c and not isinstance(c["exists"], bool):
        raise CheckError("'exists' must be true or false")
    if "expr" in c:
        compile_predicate(c["expr"])
    if "path" in c:
        _validate_path(c["path"])


def _test(c: dict, data: Any) -> tuple[bool, str]:
    where = c.get("path", "(state)")
    got = resolve(data, c["path"]) if "path" in c else data
    if "exists" in c:
        return (got is not _MISSING) == c["exists"], f"{where} {'exists' if got is not _MISSING else 'is missing'}"
    if got is _MISSING:
        return False, f"{where} is missing"
    shown = repr(got)[:200]
    if "expr" in c:
        try:
            ok = bool(compile_predicate(c["expr"])(got))
        except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
            return False, f"{c['expr']!r} could not be evaluated on {where}: {type(e).__name__}: {e}"
        return ok, f"{c['expr']!r} is {ok} for {where} = {shown}"
    if "value" in c:
        tol = float(c.get("tol", 1e-6))
        return _equal(got, c["value"], tol), f"{where} = {shown}, want {c['value']!r}" + (
            f" ±{tol}" if "tol" in c else ""
        )
    if "contains" in c:
        return _contains(got, c["contains"]), f"{where} = {shown}, want it to contain {c['contains']!r}"
    if "all_in" in c:
        missing = [x for x in c["all_in"] if not _contains(got, x)]
        return not missing, f"{where} = {shown}" + (
            f" lacks {missing!r}" if missing else f" has all of {c['all_in']!r}"
        )
    if "one_of" in c:
        return any(_equal(got, x) for x in c["one_of"]), f"{where} = {shown}, want one of {c['one_of']!r}"
    g = _number(got)
    if g is None:
        return False, f"{where} = {shown} is not a number"
    ops = {"gt": lambda a, b: a > b, "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}
    fails = [f"{t} {c[t]}" for t in ops if t in c and not ops[t](g, float(c[t]))]
    want = " and ".join(f"{t} {c[t]}" for t in ops if t in c)
    return not fails, f"{where} = {g!r}, want {want}"


# ------------------------------------------------------------------------------------------ info
def _info_validate(c: dict) -> None:
    _validate_test(c)


def _info_run(c: dict, ctx) -> tuple[bool, str]:
    return _test(c, ctx.state)


# ------------------------------------------------------------------------------------------ db
def build_args(c: dict) -> list[str]:
    """The GRASS module's argument list from a `db` check (raises CheckError when not allowed)."""
    module = c.get("module")
    if module not in MODULES:
        raise CheckError(f"module {module!r} is not a whitelisted read-only query ({', '.join(sorted(MODULES))})")
    options, flags = MODULES[module]
    args = c.get("args", {})
    if not isinstance(args, dict):
        raise CheckError("'args' must be an object of option: value")
    out = []
    for k, v in args.items():
        if k in REFUSED_OPTIONS:
            raise CheckError(f"{module} option {k!r} is refused: it {REFUSED_OPTIONS[k]}")
        if k not in options:
            raise CheckError(f"{module} option {k!r} is not allowed here (allowed: {', '.join(sorted(options))})")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise CheckError(f"{module} option {k}= must be a string or number")
        if k in NUMBER_OPTIONS:
            _bounded(v, f"{module} option {k}=", *NUMBER_OPTIONS[k])
        elif not isinstance(v, str):
            number(v, f"{module} option {k}=", error=CheckError)
        v = str(v)
        if k == "where":
            if not _WHERE.match(v) or _FORBIDDEN_SQL.search(v):
                raise CheckError(f"where={v!r} is not a simple WHERE clause")
        elif not _VALUE.match(v) or "\n" in v:
            raise CheckError(f"{module} option {k}={v!r} has characters that are not allowed")
        elif (k in NAME_OPTIONS and not _PLAIN_NAME.match(v)) or ".." in v or v.startswith(("/", "~")):
            raise CheckError(
                f"{module} option {k}={v[:80]!r} must be a plain GRASS name (no '..', no folders, "
                f"not an absolute path): a check reads the episode's location only"
            )
        out.append(f"{k}={v}")
    f = c.get("flags", "")
    if not isinstance(f, str) or any(ch not in flags for ch in f):
        raise CheckError(f"{module} flags {f!r} not allowed (allowed: {flags or 'none'})")
    f += "".join(ch for ch in _REQUIRED_FLAGS.get(module, "") if ch not in f)
    if f:
        out.append("-" + f)
    return out


def parse_output(text: str, how: str) -> Any:
    if how == "text":
        return text.strip()
    if how == "lines":
        return [l for l in (x.strip() for x in text.splitlines()) if l]
    if how == "kv":
        out: dict[str, Any] = {}
        for line in text.splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                n = _number(v)
                out[k.strip()] = n if n is not None else v.strip()
            elif ":" in line:
                k, v = line.split(":", 1)
                n = _number(v)
                out[k.strip()] = n if n is not None else v.strip()
        return out
    if how == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise AppError(f"the GRASS module's output is not JSON: {e}") from None
    if how == "table":
        lines = [l for l in text.splitlines() if l.strip()]
        if not lines:
            return []
        head = lines[0].split("|")
        return [dict(zip(head, l.split("|"))) for l in lines[1:]]
    if how == "columns":
        out_cols = []
        for line in text.splitlines():
            if "|" in line:
                t, name = line.split("|", 1)
                out_cols.append({"name": name.strip(), "sql_type": t.strip()})
        return out_cols
    raise CheckError(f"unknown parse {how!r}")


def _db_validate(c: dict) -> None:
    build_args(c)
    if c.get("parse", "text") not in PARSERS:
        raise CheckError(f"'parse' must be one of {', '.join(PARSERS)}")
    _validate_test(c)


def _db_run(c: dict, ctx) -> tuple[bool, str]:
    from .adapter import run_query

    db = (ctx.state or {}).get("database") or {}
    if not db.get("gisdbase"):
        raise AppError("the db check needs the state of a launched GRASS (its 'database' entry)")
    out = run_query(ctx.desktop, ctx.home, db, c["module"], build_args(c))
    ok, detail = _test(c, parse_output(out, c.get("parse", "text")))
    return ok, f"{c['module']}: {detail}"


_TEST_FIELDS = frozenset({*TESTS, "tol", "path", "note"})
CHECKS = [
    CheckType("info", _info_run, _info_validate, optional=_TEST_FIELDS),
    CheckType("db", _db_run, _db_validate, required={"module"}, optional=_TEST_FIELDS | {"args", "flags", "parse"}),
]
