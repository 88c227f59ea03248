"""ChimeraX's check types.

- `states`: a dotted path into the adapter's state (adapter.py / inside.py: models, chains, residues, atoms,
  selection, pseudobond groups, surfaces, labels, background, camera, lighting, log) compared with a value
  (numbers and lists of numbers within `tol`), a regex `pattern`, or `exists`.
- `chimerax_info`: runs a read-only query (`info ...`, `measure center|sasa|area|length|volume|inertia`,
  `getcrd`) over REST and compares its JSON answer (`json`: a path into it), its log lines (`lines`), or a
  pattern over its text; or, with `log: true`, the Log's text.
- `chimerax_file`: a file the agent saved in home: a .pdb/.cif's atoms, residues, chains or text; an
  image's size; a .cxs session that reopens to a given state (this reopens it in the running app, replacing
  its session, so put it last).
"""

from __future__ import annotations

import json
import math
import re
import struct
from typing import Any

from ...registry import (
    MAX_VALUE,
    AppError,
    CheckContext,
    CheckError,
    CheckType,
    SetupError,
    confined,
    finite_values,
    number,
    relative_path,
)
from . import commands
from .adapter import dump_state, quote, rest_run

# The queries a chimerax_info check may run (as resolved by commands.py): they read, never write or reach out.
READ_ONLY = commands.Policy(
    commands=frozenset(
        {
            "info",
            "getcrd",
            *(
                f"info {s}"
                for s in (
                    "bounds",
                    "models",
                    "chains",
                    "polymers",
                    "residues",
                    "atoms",
                    "selection",
                    "atomattr",
                    "atomcolor",
                    "bondattr",
                    "resattr",
                    "rescolor",
                    "distmat",
                )
            ),
            *(f"measure {s}" for s in ("center", "sasa", "area", "length", "volume", "inertia")),
        }
    ),
    keywords={"mark": "places a marker model (a query must not change the session)"},
)
MAX_PATTERN = 500
MAX_PIXELS = 20_000  # width/height of a saved image
MAX_ATOMS = 100_000_000  # atoms/residues/chains of a saved structure


# ------------------------------------------------------------------ helpers
def get_path(obj: Any, path: str | list) -> Any:
    """obj[a][b][0]... for a path "a.b.0" or ["a", "b", 0]; KeyError naming the missing step."""
    parts = path if isinstance(path, list) else path.split(".")
    for i, p in enumerate(parts):
        if isinstance(obj, list):
            try:
                obj = obj[int(p)]
            except (ValueError, IndexError):
                raise KeyError(".".join(map(str, parts[: i + 1]))) from None
        elif isinstance(obj, dict) and str(p) in obj:
            obj = obj[str(p)]
        else:
            raise KeyError(".".join(map(str, parts[: i + 1])))
    return obj


def close(got: Any, want: Any, tol: float) -> bool:
    """Equality with numbers (and lists/dicts of them) within tol; strings compared exactly."""
    if isinstance(want, bool) or isinstance(got, bool):
        return got is want or got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isfinite(got) and abs(got - want) <= tol
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(close(g, w, tol) for g, w in zip(got, want))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(close(got[k], want[k], tol) for k in want)
    return got == want


def compile_pattern(p: Any) -> re.Pattern:
    if not isinstance(p, str) or not p or len(p) > MAX_PATTERN:
        raise CheckError(f"'pattern' must be a regex of 1..{MAX_PATTERN} characters")
    if re.search(r"\([^)]*[+*][^)]*\)[+*{]", p):  # nested quantifiers: catastrophic backtracking
        raise CheckError(f"pattern {p!r} nests quantifiers; rewrite it without (...+)+")
    try:
        return re.compile(p)
    except re.error as e:
        raise CheckError(f"bad pattern {p!r}: {e}") from None


def _tol(c: dict) -> float:
    return float(number(c.get("tol", 1e-3), "'tol'", 0, MAX_VALUE, error=CheckError))


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def _compare(c: dict, got: Any, what: str) -> tuple[bool, str]:
    if "value" in c:
        ok = close(got, c["value"], _tol(c))
        return ok, f"{what} = {_text(got)[:200]} (want {_text(c['value'])[:200]}, tol {_tol(c):g})"
    if "pattern" in c:
        ok = compile_pattern(c["pattern"]).search(_text(got)) is not None
        return ok, f"{what} = {_text(got)[:200]} {'matches' if ok else 'does not match'} {c['pattern']!r}"
    if "contains" in c:
        ok = isinstance(got, (list, str)) and c["contains"] in got
        return ok, f"{what} {'contains' if ok else 'lacks'} {c['contains']!r}"
    raise CheckError("the check needs 'value', 'pattern' or 'contains'")


def _one_comparison(c: dict, extra: tuple[str, ...] = ()) -> None:
    n = sum(k in c for k in ("value", "pattern", "contains", "exists") + extra)
    if n != 1:
        raise CheckError(f"give exactly one of {', '.join(('value', 'pattern', 'contains', 'exists') + extra)}")
    if "pattern" in c:
        compile_pattern(c["pattern"])
    if "tol" in c:
        _tol(c)
    if "value" in c:
        finite_values(c["value"], "'value'", CheckError)
    if "contains" in c and not isinstance(c["contains"], str):
        number(c["contains"], "'contains' (a string or a number)", error=CheckError)
    if "exists" in c and not isinstance(c["exists"], bool):
        raise CheckError("'exists' must be true or false")


# ------------------------------------------------------------------ states
def _states_validate(c: dict) -> None:
    p = c.get("path")
    if not (isinstance(p, str) and p) and not (isinstance(p, list) and p):
        raise CheckError("'path' must be a dotted path (\"models.0.name\") or a list of keys")
    _one_comparison(c)


def _states(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    try:
        got = get_path(ctx.state, c["path"])
    except KeyError as e:
        if c.get("exists") is False:
            return True, f"{c['path']} is absent"
        return False, f"the state has no {e.args[0]}"
    if "exists" in c:
        return bool(c["exists"]), f"{c['path']} exists"
    return _compare(c, got, str(c["path"]))


# ------------------------------------------------------------------ chimerax_info
def _info_validate(c: dict) -> None:
    if ("command" in c) == bool(c.get("log")):
        raise CheckError("chimerax_info needs either 'command' (a read-only query) or 'log': true")
    if "command" in c:
        cmd = c["command"]
        try:
            if len(commands.check(cmd, READ_ONLY)) != 1:
                raise ValueError("is several commands")
        except ValueError as e:
            raise CheckError(
                f"'command': {e} (a check runs one read-only query: info ..., measure center|sasa|"
                f"area|length|volume|inertia ..., getcrd ...)"
            ) from None
    if "json" in c and not isinstance(c["json"], (str, list)):
        raise CheckError("'json' must be a path into the command's JSON value")
    _one_comparison(c, ("lines",))
    if "lines" in c and not (isinstance(c["lines"], list) and all(isinstance(x, str) for x in c["lines"])):
        raise CheckError("'lines' must be a list of strings (the command's log lines, in order)")


def _info(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    if c.get("log"):
        return _compare(c, ctx.state.get("log_text", ""), "the log")
    port = ctx.state.get("rest_port")
    if port is None:
        return False, "the state has no REST port (was ChimeraX running at the end?)"
    try:
        answer = rest_run(ctx.desktop, port, c["command"])
    except AppError as e:
        return False, str(e)
    notes = "".join(answer.get("log messages", {}).get("note", []))
    if "lines" in c:
        got = [ln for ln in notes.splitlines() if ln.strip()]
        return got == c["lines"], f"{c['command']!r} printed {got[:20]} (want {c['lines'][:20]})"
    if "json" in c:
        vals = [v for v in answer.get("json values", []) if v is not None]
        if not vals:
            return False, f"{c['command']!r} gave no JSON value"
        try:
            got = get_path(json.loads(vals[-1]), c["json"]) if c["json"] != "" else json.loads(vals[-1])
        except KeyError as e:
            return False, f"{c['command']!r}'s JSON has no {e.args[0]}"
        return _compare(c, got, f"{c['command']!r} -> {c['json']}")
    return _compare(c, notes, repr(c["command"]))


# ------------------------------------------------------------------ chimerax_file
FILE_KEYS = ("atoms", "residues", "chains", "contains", "width", "height", "state", "exists")


def _file_validate(c: dict) -> None:
    try:
        relative_path(c.get("path"), "'path'", SetupError)
        confined("/nonexistent-home", c.get("path"), "'path'")
    except SetupError as e:
        raise CheckError(str(e)) from None
    keys = [k for k in FILE_KEYS if k in c]
    if not keys:
        raise CheckError(f"chimerax_file needs at least one of {', '.join(FILE_KEYS)}")
    for k in ("width", "height"):
        if k in c:
            number(c[k], f"'{k}'", 1, MAX_PIXELS, integer=True, error=CheckError)
    for k in ("atoms", "residues"):
        if k in c:
            number(c[k], f"'{k}'", 0, MAX_ATOMS, integer=True, error=CheckError)
    if "chains" in c and not (
        isinstance(c["chains"], list) and len(c["chains"]) <= MAX_ATOMS and all(isinstance(x, str) for x in c["chains"])
    ):
        raise CheckError("'chains' must be a list of chain ids")
    if "contains" in c and not isinstance(c["contains"], str):
        raise CheckError("'contains' must be a string")
    if "exists" in c and not isinstance(c["exists"], bool):
        raise CheckError("'exists' must be true or false")
    suffix = c["path"].lower().rsplit(".", 1)[-1]
    if "state" in c:
        if suffix != "cxs":
            raise CheckError("'state' applies to .cxs sessions")
        if not isinstance(c["state"], list) or not c["state"]:
            raise CheckError("'state' must be a list of states checks ({path, value|pattern|exists})")
        for s in c["state"]:
            _states_validate(s)
    if ("width" in c or "height" in c) and suffix not in ("png", "jpg", "jpeg"):
        raise CheckError("'width'/'height' apply to .png/.jpg images")
    if any(k in c for k in ("atoms", "residues", "chains")) and suffix not in ("pdb", "cif"):
        raise CheckError("'atoms'/'residues'/'chains' apply to .pdb/.cif files")


def image_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"\xff\xd8":  # JPEG: the first start-of-frame marker
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                i += 1
                continue
            marker, length = data[i + 1], struct.unpack(">H", data[i + 2 : i + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2):
                h, w = struct.unpack(">HH", data[i + 5 : i + 9])
                return w, h
            i += 2 + length
    return None


def structure_summary(text: str, cif: bool) -> dict:
    """Atoms, residues and chains of a PDB or mmCIF file (ATOM/HETATM records / _atom_site rows)."""
    atoms, residues, chains = 0, set(), []
    if not cif:
        for ln in text.splitlines():
            if ln.startswith(("ATOM  ", "HETATM")):
                atoms += 1
                ch = ln[21:22]
                residues.add((ch, ln[22:27]))
                if ch not in chains:
                    chains.append(ch)
        return {"atoms": atoms, "residues": len(residues), "chains": chains}
    cols: list[str] = []
    in_loop = False
    for ln in text.splitlines():
        s = ln.strip()
        if s == "loop_":
            in_loop, cols = True, []
            continue
        if in_loop and s.startswith("_atom_site."):
            cols.append(s.split()[0][len("_atom_site.") :])
            continue
        if cols and s.startswith(("ATOM", "HETATM")):
            f = s.split()
            rec = dict(zip(cols, f))
            atoms += 1
            ch = rec.get("auth_asym_id", rec.get("label_asym_id", "?"))
            residues.add((ch, rec.get("auth_seq_id", rec.get("label_seq_id")), rec.get("pdbx_PDB_ins_code")))
            if ch not in chains:
                chains.append(ch)
        elif cols and s.startswith(("_", "#", "loop_")):
            cols = [] if not s.startswith("_atom_site.") else cols
    return {"atoms": atoms, "residues": len(residues), "chains": chains}


def _file(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    data = ctx.read_file(c["path"])
    if "exists" in c and len([k for k in FILE_KEYS if k in c]) == 1:
        return (data is not None) == bool(c["exists"]), f"{c['path']} {'exists' if data is not None else 'is missing'}"
    if data is None:
        return False, f"{c['path']} was not saved"
    suffix = c["path"].lower().rsplit(".", 1)[-1]
    details = []
    ok = True
    if suffix in ("png", "jpg", "jpeg") and ("width" in c or "height" in c):
        size = image_size(data)
        if size is None:
            return False, f"{c['path']} is not a PNG/JPEG image"
        for i, k in enumerate(("width", "height")):
            if k in c:
                ok &= size[i] == c[k]
        details.append(f"image {size[0]}x{size[1]}")
    if suffix in ("pdb", "cif"):
        text = data.decode(errors="replace")
        summ = structure_summary(text, suffix == "cif")
        for k in ("atoms", "residues", "chains"):
            if k in c:
                ok &= summ[k] == c[k]
        details.append(f"{summ['atoms']} atoms, {summ['residues']} residues, chains {summ['chains']}")
        if "contains" in c:
            ok &= c["contains"] in text
            details.append(f"{'contains' if c['contains'] in text else 'lacks'} {c['contains']!r}")
    elif "contains" in c:
        found = c["contains"].encode() in data
        ok &= found
        details.append(f"{'contains' if found else 'lacks'} {c['contains']!r}")
    if "state" in c:
        port = ctx.state.get("rest_port")
        try:
            rest_run(ctx.desktop, port, "close session")
            rest_run(ctx.desktop, port, f"open {quote(confined(ctx.home, c['path']))}")
            reopened = dump_state(ctx.desktop, port, ctx.home)
        except AppError as e:
            return False, f"{c['path']} did not reopen: {e}"
        sub = CheckContext(answer=ctx.answer, task=ctx.task, desktop=ctx.desktop, home=ctx.home, state=reopened)
        for s in c["state"]:
            passed, d = _states(s, sub)
            ok &= passed
            details.append(f"reopened: {d}")
    return bool(ok), f"{c['path']}: " + "; ".join(details)


CHECKS = [
    CheckType(
        "states",
        _states,
        _states_validate,
        required={"path"},
        optional={"value", "pattern", "contains", "exists", "tol"},
    ),
    CheckType(
        "chimerax_info",
        _info,
        _info_validate,
        optional={"command", "log", "json", "value", "pattern", "contains", "lines", "tol"},
    ),
    CheckType("chimerax_file", _file, _file_validate, required={"path"}, optional=frozenset(FILE_KEYS) | {"tol"}),
]
