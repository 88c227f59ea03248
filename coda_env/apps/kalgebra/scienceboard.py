"""ScienceBoard's KAlgebra task files (`tasks/VM/KAlgebra/*.json`) as coda tasks.

ScienceBoard drives a KAlgebra build it patched with an HTTP server; coda drives Debian's stock KAlgebra and
reads its state through AT-SPI (`adapter.py`), so each part of their file maps onto an operation or check of
ours, and anything that has no faithful equivalent is refused with the reason (never run):

initialize
  - `launch` {wait, command, shell}: dropped. It starts their patched binary after a fixed wait; the env
    launches a fresh KAlgebra (fresh home) on every reset and polls until it is ready.
  - `tab` {index} -> our `tab`; `func_2d` / `func_3d` {expr} -> ours.
  - `touch` {path: "/home/user/NAME", text} -> core `write_file` {path: "NAME"} in the app's home (their VM's
    home is /home/user; ours is a fresh folder). Any other absolute location is refused. A script that
    defines a function for a plot to call is refused (the `eqn` check cannot evaluate such a plot).
evaluate (their checker: sci/KAlgebra/task.py in OS-Copilot/ScienceBoard)
  - `var` {key, value}: the variable's text equals value; their value "#UNDEF" means "not defined"
    (`key not in vars`) -> our `var` {name, absent: true}. Refused where no episode could pass on Debian's
    KAlgebra: removing a built-in constant (no GUI does it) or a complex value (its Variables panel shows
    only real parts).
  - `val` {key, value}: |float(var) - value| <= 1e-6 (their `is_near`) -> our `val` with tol 1e-6.
  - `eqn` {key: [[x, y(, z)], ...], value: {"(x, y)": bool}}: some plotted function agrees with every point
    test (their patched KAlgebra's tolerance: 1e-4) -> our `eqn` {dim, points: [[x, y, bool], ...], tol: 1e-4};
    `key: "#SIZE"` -> our `eqn` {count}. Their value
    may also demand a curve's colour, plot resolution or 3D style (`color`, `res`, `style`), which our
    adapter cannot read through AT-SPI: refused.
  - `stop` {value: "FAIL"} -> core `answer` {value: "FAIL"}; {value: "ANS", args: [x]} -> core `answer`
    ({number: x} when x is a plain number, else {value: x}).
"""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any

from ...checks import parse_number
from ...scienceboard import base_task
from ...tasks import TaskError

SB_HOME = PurePosixPath("/home/user")  # the home folder of ScienceBoard's VM
TOL = 1e-6  # ScienceBoard's `is_near` for val (sci/KAlgebra/task.py)
EQN_TOL = 1e-4  # their patched KAlgebra's `is_near` for points on a plot
BUILTINS = frozenset({"pi", "e", "euler", "i", "true", "false"})
_IMAGINARY = re.compile(r"(?<![A-Za-z_0-9])i(?![A-Za-z_0-9(])")
_POINT_KEY = re.compile(r"\(\s*([^,()]+)(?:\s*,\s*([^,()]+))(?:\s*,\s*([^,()]+))?\s*\)")


def convert(sb: dict, path: str) -> dict:
    """The coda task dict of one ScienceBoard KAlgebra task; TaskError naming the reason if refused."""
    task = base_task(sb, path, "kalgebra")
    task["initialize"] = [op for o in _list(sb, "initialize", path) for op in _setup(o, path)]
    task["evaluate"] = [_check(c, path) for c in _list(sb, "evaluate", path)]
    if not task["evaluate"]:
        raise TaskError(f"{path}: no evaluate entries: nothing would decide success")
    _script_functions(task, path)
    if isinstance(sb.get("ans"), str) and sb["ans"].strip() not in ("", "N/A"):
        task["ans"] = sb["ans"]  # ScienceBoard's hint at a solution (KAlgebra syntax), kept as data
    return task


def _list(sb: dict, key: str, path: str) -> list:
    v = sb.get(key, [])
    if not isinstance(v, list):
        raise TaskError(f"{path}: {key!r} must be a list")
    return v


# ------------------------------------------------------------------------------------------ initialize
def _setup(op: Any, path: str) -> list[dict]:
    if not isinstance(op, dict) or not isinstance(op.get("func"), str):
        raise TaskError(f"{path}: initialize entry {op!r} is not an operation")
    func = op["func"]
    if func == "launch":
        return []  # the env starts a fresh KAlgebra itself on every reset
    if func == "tab":
        if set(op) - {"func", "index"}:
            raise TaskError(f"{path}: tab with unknown fields {sorted(set(op) - {'func', 'index'})}")
        return [{"func": "tab", "index": op.get("index")}]
    if func in ("func_2d", "func_3d"):
        if set(op) - {"func", "expr"}:
            raise TaskError(f"{path}: {func} with unknown fields {sorted(set(op) - {'func', 'expr'})}")
        return [{"func": func, "expr": op.get("expr")}]
    if func == "touch":
        return [{"func": "write_file", "path": _home_rel(op.get("path"), path), "content": _text(op, path)}]
    raise TaskError(
        f"{path}: ScienceBoard setup operation {func!r} has no KAlgebra translation "
        f"(known: launch, tab, func_2d, func_3d, touch); refused, not run"
    )


def _home_rel(p: Any, path: str) -> str:
    """Their absolute path in the VM's /home/user as a path relative to the app's home; refused elsewhere."""
    if not isinstance(p, str) or not p:
        raise TaskError(f"{path}: touch needs a path")
    pp = PurePosixPath(p)
    if not pp.is_absolute():
        raise TaskError(f"{path}: touch path {p!r} is not absolute (ScienceBoard writes into /home/user)")
    if ".." in pp.parts or not pp.is_relative_to(SB_HOME) or pp == SB_HOME:
        raise TaskError(
            f"{path}: touch writes {p!r}, outside the home folder {SB_HOME}; refused "
            f"(a task file may only write inside the app's home)"
        )
    return str(pp.relative_to(SB_HOME))


def _text(op: dict, path: str) -> str:
    text = op.get("text", "")
    if not isinstance(text, str):
        raise TaskError(f"{path}: touch text must be a string")
    return text


_DEFINES_FUNCTION = re.compile(r"^\s*([A-Za-z_]\w*)\s*:=\s*[^\n]*->", re.M)


def _script_functions(task: dict, path: str) -> None:
    """Refuse a plot task whose setup writes a script defining a function: the plot is meant to call it
    (`r(2)`), and the `eqn` check evaluates only self-contained expressions (a plot that calls the script's
    function fails it, however right); an oracle that avoided the function would pass where a faithful
    agent fails."""
    names = sorted(
        {
            m.group(1)
            for op in task["initialize"]
            if op["func"] == "write_file"
            for m in _DEFINES_FUNCTION.finditer(op["content"])
        }
    )
    if names and any(c["type"] == "eqn" and "points" in c for c in task["evaluate"]):
        raise TaskError(
            f"{path}: the plot is to use the function {', '.join(names)} that its script defines; "
            f"coda's eqn check cannot evaluate a plot that calls a user-defined function; refused"
        )


# ------------------------------------------------------------------------------------------ evaluate
def _check(c: Any, path: str) -> dict:
    if not isinstance(c, dict) or not isinstance(c.get("type"), str):
        raise TaskError(f"{path}: evaluate entry {c!r} is not a check")
    kind, key, value = c["type"], c.get("key"), c.get("value")
    if kind == "var":
        if not isinstance(key, str):
            raise TaskError(f"{path}: var check needs a variable name as key")
        if value == "#UNDEF":
            if key in BUILTINS:
                raise TaskError(
                    f"{path}: var wants KAlgebra's built-in constant {key!r} removed, which its GUI "
                    f"cannot do (its variable views offer only 'Add variable'; names are not editable "
                    f"and Delete does nothing), so no episode could pass; refused"
                )
            return {"type": "var", "name": key, "absent": True}
        if not isinstance(value, str):
            raise TaskError(f"{path}: var check value must be KAlgebra's text of the value")
        if _IMAGINARY.search(value):
            raise TaskError(
                f"{path}: var wants the complex value {value!r}; Debian's KAlgebra (22.12) shows only "
                f"the real part of a complex value in its Variables panel (i shows as 0), the state "
                f"coda reads, so no episode could pass; refused"
            )
        return {"type": "var", "name": key, "value": value}
    if kind == "val":
        v = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if not isinstance(key, str) or v is None or not math.isfinite(v):
            raise TaskError(f"{path}: val check needs a variable name and a finite number")
        return {"type": "val", "name": key, "value": v, "tol": TOL}
    if kind == "eqn":
        return _eqn(key, value, path)
    if kind == "stop":
        return _stop(c, path)
    raise TaskError(
        f"{path}: ScienceBoard check {kind!r} has no KAlgebra translation "
        f"(known: var, val, eqn, stop); refused, not run"
    )


def _eqn(key: Any, value: Any, path: str) -> dict:
    if key == "#SIZE":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TaskError(f"{path}: eqn #SIZE needs a count")
        return {"type": "eqn", "count": value}
    if not isinstance(key, list) or not key or not isinstance(value, dict):
        raise TaskError(f"{path}: eqn needs a list of points as key and point results as value")
    dims = {len(p) for p in key if isinstance(p, list)}
    if len(dims) != 1 or dims - {2, 3} or not all(isinstance(p, list) for p in key):
        raise TaskError(f"{path}: eqn points must all be [x, y] or all [x, y, z]")
    dim = dims.pop()
    expected: dict[tuple[float, ...], bool] = {}
    for k, v in value.items():
        m = _POINT_KEY.fullmatch(k.strip()) if isinstance(k, str) else None
        if m is None:
            raise TaskError(
                f"{path}: eqn demands {k!r} = {v!r} of the plot, which KAlgebra's state as read "
                f"through AT-SPI does not hold (only which points lie on a plotted function); refused"
            )
        nums = [parse_number(g) for g in m.groups() if g is not None]
        if any(n is None for n in nums) or len(nums) != dim or not isinstance(v, bool):
            raise TaskError(f"{path}: eqn entry {k!r}: {v!r} is not a {dim}D point with true/false")
        expected[tuple(nums)] = v
    points = []
    for p in key:
        coords = (
            tuple(float(x) for x in p)
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in p)
            else None
        )
        if coords is None or coords not in expected:
            raise TaskError(f"{path}: eqn point {p!r} has no true/false result in value")
        points.append([*p, expected[coords]])
    unlisted = set(expected) - {tuple(float(x) for x in p) for p in key}
    if unlisted:
        raise TaskError(f"{path}: eqn results for points not listed in key: {sorted(unlisted)}")
    return {"type": "eqn", "dim": dim, "points": points, "tol": EQN_TOL}


def _stop(c: dict, path: str) -> dict:
    if c.get("value") == "FAIL" and not c.get("args"):
        return {"type": "answer", "value": "FAIL"}
    args = c.get("args")
    if (
        c.get("value") == "ANS"
        and isinstance(args, list)
        and len(args) == 1
        and isinstance(args[0], (str, int, float))
        and not isinstance(args[0], bool)
    ):
        n = parse_number(str(args[0]))
        return {"type": "answer", "number": n, "tol": TOL} if n is not None else {"type": "answer", "value": args[0]}
    raise TaskError(f"{path}: stop check {c!r} is neither FAIL nor ANS with one answer; refused")
