"""ScienceBoard's GrassGIS task files as coda tasks.

Their tasks use two GRASS locations of ScienceBoard's VM image (`natural_earth_dataset`,
`grassdata_piemonte_utm32n_wgs84_grass7`, and `world_latlong_wgs84` where GRASS starts), which no registry
offers: a converted task names them in `requires`, and its `location` setup op copies them from the user's
GRASS database (`convert(..., grassdata=DIR)`, `set_grassdata(DIR)` or $CODA_GRASSDATA at run time).

Setup operations, mapped (nothing of a ScienceBoard file runs as a shell command):
- `execute` `rm -rf .../.gislock`: dropped: every reset copies the location afresh, without locks.
- `launch` (a terminal running `grass --gui` with a fixed wait): dropped: the adapter launches GRASS and
  polls for its windows and state server.
- `map` {grassdb, location, mapset}: `location` (files phase: the GUI opens that location).
- `layer` {query: {name}} (+ a fixed wait): `layer` {map} (added through the GUI's state server, then
  polled until listed).
- `scale` {scale}: `scale` (the map display's scale, set as its status-bar field does).
Anything else is refused with the reason.

Checks: `info` (a key lambda over the GUI dump, a value, an optional two-argument predicate lambda) and `db`
(a GRASS module with kwargs, a key lambda over its output) become this package's `info`/`db` checks: the
lambdas' usual shapes (a subscript path; a list comprehension filtering on a field, then `[0]`; `any`/`all`
over a comprehension; comparisons, `abs(key - value) < tol`, `value in key`) are read from their syntax tree
into a path and a test. Any other shape goes through `coda_env.checks.translate_lambda` (the key substituted
into the predicate) into a restricted `expr`, or the task is refused. `stop` ANS/FAIL become `answer` checks.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any

from ...tasks import TaskError
from . import data

NAMES = ("GrassGIS",)
START_LOCATION = "world_latlong_wgs84"  # where ScienceBoard's launch command opens GRASS


class _Refused(Exception):
    pass


# ---------------------------------------------------------------------------------------- lambdas
def _lambda(src: Any, nargs: int) -> tuple[list[str], ast.AST]:
    if not isinstance(src, str):
        raise _Refused(f"lambda must be a string, got {type(src).__name__}")
    try:
        node = ast.parse(src.strip(), mode="eval").body
    except SyntaxError as e:
        raise _Refused(f"lambda {src[:60]!r} does not parse: {e.msg}") from None
    if not isinstance(node, ast.Lambda) or len(node.args.args) != nargs:
        raise _Refused(f"expected a lambda of {nargs} argument(s): {src[:60]!r}")
    return [a.arg for a in node.args.args], node.body


def _const(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        raise _Refused(f"not a literal: {ast.unparse(node)[:60]}") from None


def _filter(cond: ast.AST, var: str) -> dict:
    """`v['k'] == C` (and more of them joined by `and`) as {"k": C}."""
    parts = cond.values if isinstance(cond, ast.BoolOp) and isinstance(cond.op, ast.And) else [cond]
    out = {}
    for p in parts:
        if not (isinstance(p, ast.Compare) and len(p.ops) == 1 and isinstance(p.ops[0], ast.Eq)):
            raise _Refused(f"filter {ast.unparse(cond)[:80]!r} is not field == constant")
        left = p.left
        if not (isinstance(left, ast.Subscript) and isinstance(left.value, ast.Name) and left.value.id == var):
            raise _Refused(f"filter {ast.unparse(cond)[:80]!r} is not on the element's field")
        out[_const(left.slice)] = _const(p.comparators[0])
    return out


def path_of(node: ast.AST, root: str) -> list:
    """A path (this package's check path) for an expression over `root`; _Refused when it is no path."""
    if isinstance(node, ast.Name) and node.id == root:
        return []
    if isinstance(node, ast.Subscript):
        base = path_of(node.value, root)
        key = _const(node.slice)
        if isinstance(key, int) and key == 0 and base and isinstance(base[-1], dict):
            return base  # [matches][0]: the filter already picks the first match
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise _Refused(f"subscript {ast.unparse(node)[:60]!r} is not a key or an index")
        return base + [key]
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        gen = node.generators[0]
        if (
            isinstance(gen.target, ast.Name)
            and isinstance(node.elt, ast.Name)
            and node.elt.id == gen.target.id
            and len(gen.ifs) == 1
            and not gen.is_async
        ):
            return path_of(gen.iter, root) + [_filter(gen.ifs[0], gen.target.id)]
    raise _Refused(f"{ast.unparse(node)[:80]!r} is not a path")


def _value_of(node: ast.AST, vname: str, value: Any) -> Any:
    if isinstance(node, ast.Name) and node.id == vname:
        return value
    if isinstance(node, ast.Subscript):
        return _value_of(node.value, vname, value)[_const(node.slice)]
    return _const(node)


_CMP = {ast.Eq: "value", ast.Gt: "gt", ast.Lt: "lt", ast.GtE: "ge", ast.LtE: "le"}
_FLIP = {"gt": "lt", "lt": "gt", "ge": "le", "le": "ge", "value": "value"}


def _tests(pred: ast.AST, kname: str, vname: str, base: list, value: Any) -> list[dict]:
    """The predicate as a list of (path, test) checks; _Refused when its shape is not one of these."""

    def kpath(n):
        sub = path_of(n, kname)
        if base and isinstance(base[-1], dict) and sub[:1] == [0]:
            sub = sub[1:]  # key[0]: the filter at the end of the key's path picks the first match
        return base + sub

    if isinstance(pred, ast.BoolOp) and isinstance(pred.op, ast.And):
        return [t for p in pred.values for t in _tests(p, kname, vname, base, value)]
    if isinstance(pred, ast.Compare) and len(pred.ops) == 1:
        op, left, right = type(pred.ops[0]), pred.left, pred.comparators[0]
        if op is ast.In:  # value in key
            return [{"path": kpath(right), "contains": _value_of(left, vname, value)}]
        if op in _CMP:
            if (
                isinstance(left, ast.Call)
                and isinstance(left.func, ast.Name)
                and left.func.id == "abs"
                and len(left.args) == 1
                and isinstance(left.args[0], ast.BinOp)
                and isinstance(left.args[0].op, ast.Sub)
                and op in (ast.Lt, ast.LtE)
            ):
                d = left.args[0]  # abs(key - value) < tol
                return [{"path": kpath(d.left), "value": _value_of(d.right, vname, value), "tol": float(_const(right))}]
            try:
                return [{"path": kpath(left), _CMP[op]: _value_of(right, vname, value)}]
            except _Refused:
                return [{"path": kpath(right), _FLIP[_CMP[op]]: _value_of(left, vname, value)}]
    if (
        isinstance(pred, ast.Call)
        and isinstance(pred.func, ast.Name)
        and pred.func.id in ("any", "all")
        and len(pred.args) == 1
        and isinstance(pred.args[0], ast.ListComp)
    ):
        comp = pred.args[0]
        gen = comp.generators[0]
        if len(comp.generators) != 1 or gen.ifs or not isinstance(gen.target, ast.Name):
            raise _Refused("only any/all over one plain comprehension")
        var, elt = gen.target.id, comp.elt
        if isinstance(gen.iter, ast.Name) and gen.iter.id == vname:  # all([v in key... for v in value])
            if (
                pred.func.id == "all"
                and isinstance(elt, ast.Compare)
                and isinstance(elt.ops[0], ast.In)
                and isinstance(elt.left, ast.Name)
                and elt.left.id == var
            ):
                return [{"path": kpath(elt.comparators[0]), "all_in": list(value)}]
            raise _Refused("unsupported comprehension over the value")
        target = kpath(gen.iter)
        if pred.func.id == "any":  # any([item['f'] == V ...]): such an item exists
            cond = {k: _value_of(n, vname, value) for k, n in _eq_fields(elt, var, ast.Eq).items()}
            return [{"path": target + [cond], "exists": True}]
        cond = {k: _value_of(n, vname, value) for k, n in _eq_fields(elt, var, ast.NotEq).items()}
        if len(cond) == 1:  # all([item['f'] != V ...]): no such item
            return [{"path": target + [cond], "exists": False}]
    raise _Refused(f"predicate shape {ast.unparse(pred)[:100]!r}")


def _eq_fields(elt: ast.AST, var: str, op: type) -> dict:
    parts = elt.values if isinstance(elt, ast.BoolOp) and isinstance(elt.op, ast.And) else [elt]
    out = {}
    for p in parts:
        if not (
            isinstance(p, ast.Compare)
            and len(p.ops) == 1
            and isinstance(p.ops[0], op)
            and isinstance(p.left, ast.Subscript)
            and isinstance(p.left.value, ast.Name)
            and p.left.value.id == var
        ):
            raise _Refused(f"{ast.unparse(elt)[:80]!r} is not item['field'] {'==' if op is ast.Eq else '!='} value")
        out[_const(p.left.slice)] = p.comparators[0]
    return out


class _Subst(ast.NodeTransformer):
    def __init__(self, key: ast.AST, vname: str, kname: str, value: Any):
        self.key, self.vname, self.kname, self.value = key, vname, kname, value

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == self.kname:
            return copy.deepcopy(self.key)
        if node.id == self.vname:
            return ast.parse(repr(self.value), mode="eval").body
        return node


def translate(check: dict, base: list | None = None) -> list[dict]:
    """A ScienceBoard `info`/`db` check's key/pred/value as this package's tests (list of test dicts with
    `path`); falls back to an `expr` through coda_env.checks.translate_lambda."""
    (root,), key = _lambda(check["key"], 1)
    value = check.get("value")
    base = base or []
    try:
        kpath = base + path_of(key, root)
    except _Refused:
        kpath = None
    if "pred" not in check:
        if kpath is None:
            return [_expr(key, root, None, None, value, equal=True)]
        return [{"path": kpath, "value": value}]
    (kname, vname), pred = _lambda(check["pred"], 2)
    if kpath is not None:
        try:
            return _tests(pred, kname, vname, kpath, value)
        except _Refused:
            pass
    return [_expr(key, root, pred, (kname, vname), value)]


def _expr(key: ast.AST, root: str, pred: ast.AST | None, names, value: Any, equal: bool = False) -> dict:
    from ...predicate import translate_lambda
    from ...registry import CheckError

    if pred is None:
        body = ast.Compare(left=key, ops=[ast.Eq()], comparators=[ast.parse(repr(value), mode="eval").body])
    else:
        body = _Subst(key, names[1], names[0], value).visit(copy.deepcopy(pred))
    src = f"lambda {root}: {ast.unparse(ast.fix_missing_locations(body))}"
    try:
        return {"expr": translate_lambda(src)}
    except CheckError as e:
        raise _Refused(f"predicate outside the restricted language: {e}") from None


# ---------------------------------------------------------------------------------------- checks
def _db(c: dict) -> list[dict]:
    kwargs = dict(c.get("kwargs") or {})
    module = c.get("cmd")
    flags = kwargs.pop("flags", "")
    (root,), key = _lambda(c["key"], 1)
    try:
        kp = path_of(key, root)
    except _Refused:
        kp = None
    if module == "v.db.select" and kwargs.get("format") == "json" and kp and kp[:2] == ["info", "columns"]:
        # GRASS 8.2's JSON has no "info" part (8.4 adds it): the same columns come from `v.info -c`
        base = {"module": "v.info", "args": {"map": kwargs["map"]}, "flags": "c", "parse": "columns"}
        tests = translate({**c, "key": f"lambda {root}: {root}"}, base=[])
    elif module == "v.db.select" and kwargs.get("format") == "json":
        base = {"module": module, "args": kwargs, "parse": "json"}
        if flags:
            base["flags"] = flags
        tests = translate(c)
    else:
        if not (
            isinstance(key, ast.Call)
            and isinstance(key.func, ast.Attribute)
            and key.func.attr == "strip"
            and isinstance(key.func.value, ast.Name)
            and key.func.value.id == root
        ):
            raise _Refused(f"db key {c['key'][:60]!r} on plain-text output")
        base = {"module": module, "args": kwargs, "parse": "text"}
        if flags:
            base["flags"] = flags
        tests = translate({**c, "key": f"lambda {root}: {root}"})
    out = []
    for t in tests:
        chk = {"type": "db", **copy.deepcopy(base), **t}
        if chk.get("path") == []:
            del chk["path"]
        out.append(chk)
    return out


def _checks(sb: dict) -> list[dict]:
    out = []
    for c in sb.get("evaluate") or []:
        kind = c.get("type")
        if kind == "info":
            for t in translate(c):
                chk = {"type": "info", **t}
                if chk.get("path") == []:
                    del chk["path"]
                out.append(chk)
        elif kind == "db":
            out.extend(_db(c))
        elif kind == "stop" and c.get("value") == "FAIL":
            out.append({"type": "answer", "value": "FAIL"})
        elif kind == "stop" and c.get("value") == "ANS" and c.get("args"):
            ans = str(c["args"][0])
            out.append(
                {"type": "answer", "number": float(ans), "tol": 0}
                if re.fullmatch(r"-?\d+(\.\d+)?", ans)
                else {"type": "answer", "value": ans}
            )
        else:
            raise _Refused(f"check type {kind!r} ({json.dumps(c)[:80]})")
    if not out:
        raise _Refused("no checks")
    return out


# ---------------------------------------------------------------------------------------- setup
def _setup(sb: dict, grassdata: str | None) -> tuple[list[dict], list[str]]:
    ops, locations = [], []
    mapped = False
    for op in sb.get("initialize") or []:
        func = op.get("func")
        if func == "execute" and ".gislock" in str(op.get("command", "")) and "rm " in str(op.get("command", "")):
            continue
        if func == "launch" and "grass --gui" in str(op.get("command", "")):
            continue
        if func == "map":
            loc = op.get("location")
            loc_op = {"func": "location", "location": loc, "mapset": op.get("mapset", "PERMANENT")}
            if grassdata:
                loc_op["grassdata"] = grassdata
            ops.append(loc_op)
            locations.append(loc)
            mapped = True
        elif func == "layer" and isinstance(op.get("query"), dict) and isinstance(op["query"].get("name"), str):
            ops.append({"func": "layer", "map": op["query"]["name"]})
        elif func == "scale" and isinstance(op.get("scale"), (int, float)):
            ops.append({"func": "scale", "scale": op["scale"]})
        else:
            raise _Refused(f"setup operation {func!r} ({json.dumps(op)[:80]})")
    if not mapped:  # GRASS stays where ScienceBoard's launch command opened it
        loc_op = {"func": "location", "location": START_LOCATION, "mapset": "PERMANENT"}
        if grassdata:
            loc_op["grassdata"] = grassdata
        ops.insert(0, loc_op)
        locations.append(START_LOCATION)
    return ops, locations


def convert(sb: dict, path: str, grassdata: str | None = None) -> dict:
    """One ScienceBoard GrassGIS task as a coda task dict; TaskError naming the reason when refused."""
    grassdata = grassdata or data.grassdata()
    try:
        if sb.get("type") not in NAMES:
            raise _Refused(f"not a GrassGIS task (type {sb.get('type')!r})")
        ops, locations = _setup(sb, grassdata)
        checks = _checks(sb)
    except (_Refused, KeyError, TypeError, ValueError, IndexError) as e:
        raise TaskError(f"{path}: not translated: {e}") from None
    stem = Path(path).stem
    # the instruction names natural_earth_dataset as the target location: both must be there
    for loc in re.findall(r"natural_earth_dataset|grassdata_piemonte_utm32n_wgs84_grass7", sb.get("instruction", "")):
        if loc not in locations:
            locations.append(loc)
    for extra in locations[1:]:
        if extra != locations[0] and not any(o.get("location") == extra for o in ops):
            ops.insert(
                1,
                {
                    "func": "location",
                    "location": extra,
                    "open": False,
                    **({"grassdata": grassdata} if grassdata else {}),
                },
            )
    task = {
        "id": "sb_" + re.sub(r"[^A-Za-z0-9_.-]", "_", stem),
        "app": "grass",
        "instruction": sb["instruction"].strip(),
        "steps": max(1, min(100, int(sb.get("steps", 15)))),
        "initialize": ops,
        "evaluate": checks,
        "category": "ScienceBoard",
        "origin": f"scienceboard:GrassGIS/{stem}",
        "requires": "ScienceBoard's GRASS location(s) "
        + ", ".join(dict.fromkeys(locations))
        + " (from its VM image): pass the GRASS database holding them with "
        "`coda import-scienceboard --option grassdata=DIR` or $CODA_GRASSDATA",
    }
    return task
