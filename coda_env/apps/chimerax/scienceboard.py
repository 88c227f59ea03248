"""ScienceBoard's ChimeraX task files as coda tasks: `convert(sb, path) -> dict` (TaskError when refused).

ScienceBoard reads ChimeraX through an extension of its own whose `states` command dumps a flattened
`session.__dict__` (keys like `_state_containers.models._models.(1,)._name`). Each key it checks is mapped
here onto the adapter's state (inside.py) by what it means: the model's name, its drawing bounds, the view's
background / lighting / silhouettes, the model-view rotation, nucleotide styling, and, for `find` lambdas
("the model named X"), the model of that name: its surface's vertex colours (compared by digest), its
pseudobonds (count and colours), a marker's position and radius, a colour key's border and ticks, a scale
bar's size; the Log's HTML (`page_source`) maps onto the Log's text. Lambdas are recognised by their
shape (a few regular expressions), never run; a key with no mapping refuses the task with the reason.

Setup: ScienceBoard's profile clean-up and launch are what every reset does anyway; `open <id>` and
`download` of a PDB file become `chimerax_user_structure` (the structure the user supplies in
$CODA_PDB_DIR: coda never fetches) plus `chimerax_open`; `turn`, `clear_log`, `color` map one to one.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ...tasks import TaskError
from .setup import check_command

PREFIX = "_state_containers.models._models.(1,)."
VIEW = PREFIX + "_atoms_drawing._draw_shape.bindings._opengl_context.window.view."
# ScienceBoard key (after the model prefix or the view prefix) -> coda state path
MODEL_KEYS = {
    "_name": "models_by_id.#1.name",
    "_redraw_needed.cached_drawing_bounds.xyz_min": "models_by_id.#1.bounds.xyz_min",
    "_redraw_needed.cached_drawing_bounds.xyz_max": "models_by_id.#1.bounds.xyz_max",
    "_ladder_params.stubs_only": "models_by_id.#1.nucleotides.ladder_stubs_only",
}
VIEW_KEYS = {
    "_background_rgba": "background.rgba",
    "_render.lighting.ambient_light_intensity": "lighting.ambient_intensity",
    "_render.lighting.key_light_intensity": "lighting.key_intensity",
    "_render.lighting.fill_light_intensity": "lighting.fill_intensity",
    "_render.lighting.multishadow_depth_bias": "lighting.multishadow_depth_bias",
    "_render.lighting.multishadow": "lighting.multishadow",
    "_render.silhouette.depth_jump": "silhouettes.depth_jump",
    "_render.silhouette.enabled": "silhouettes.enabled",
}
NUCLEOTIDE_STYLING = ("_nucleotide_info", "_nucleotide_changes", "_ring_drawing")
FIND_NAME = re.compile(r"^lambda key, value: key\.endswith\('([^']*)'\) and value == '([^']*)'$")
FIND_SUFFIX = re.compile(r"^lambda key, value: key\.endswith\('([^']*)'\)$")
KEY_ATTRS = re.compile(r"^lambda key: '\.'\.join\(key\.split\('\.'\)\[:-(\d)\] \+ \[([^\]]*)\]\)$")
KEY_STARTS = re.compile(r"^lambda key: key\.startswith\('([^']*)'\)$")
RCSB = re.compile(r"^https://files\.rcsb\.org/download/([0-9A-Za-z]{4})\.cif$")
NEEDS_NETWORK = {
    "A-01": "the task is fetching 2OLX from the PDB over the network; coda runs ChimeraX offline",
    "D-03": "the task runs an AlphaFold prediction on Google Colab (network and a Google account)",
}


def _numbers(text: str) -> list:
    """A numpy array as printed ("[ 1.  -2.5]", "[[139 0 0 255] ...]") as nested lists of floats."""
    if "..." in text:
        raise TaskError(f"the expected array is abbreviated by numpy ('...'): {text[:60]}")
    rows = re.findall(r"\[([^\[\]]*)\]", text)
    if text.strip().startswith("[["):
        return [[float(x) for x in r.split()] for r in rows]
    return [float(x) for x in rows[0].split()] if rows else []


def _value(v: Any) -> Any:
    if isinstance(v, str) and v.strip().startswith("["):
        return _numbers(v)
    return v


def _states_check(path: str, sb_item: dict) -> dict:
    if "pattern" in sb_item:
        raise TaskError(f"a pattern on {path} has no coda mapping")
    v = _value(sb_item.get("value"))
    check = {"type": "states", "path": path, "value": v}
    if isinstance(v, float) or (isinstance(v, list) and v and isinstance(v[0], float)):
        check["tol"] = 1e-3
    return check


def _by_key(item: dict, where: str) -> list[dict]:
    key = item["key"]
    m = KEY_STARTS.match(key)
    if m:
        rest = m.group(1)[len(PREFIX) :] if m.group(1).startswith(PREFIX) else None
        if rest is not None and rest.startswith(NUCLEOTIDE_STYLING) and item.get("value") is None:
            return [{"type": "states", "path": "models_by_id.#1.nucleotides.drawing", "value": False}]
        raise TaskError(f"{where}: key {key!r} has no coda mapping")
    if key.startswith(VIEW):
        rest = key[len(VIEW) :]
        if rest == "_render.current_model_view_matrix._m44":
            # ScienceBoard's regex asks for an identity rotation (the standard orientation)
            return [
                {
                    "type": "states",
                    "path": "models_by_id.#1.view_rotation",
                    "value": [[1, 0, 0], [0, 1, 0], [0, 0, 1]],
                    "tol": 1e-4,
                }
            ]
        if rest in VIEW_KEYS:
            return [_states_check(VIEW_KEYS[rest], item)]
    elif key.startswith(PREFIX) and key[len(PREFIX) :] in MODEL_KEYS:
        return [_states_check(MODEL_KEYS[key[len(PREFIX) :]], item)]
    raise TaskError(f"{where}: ScienceBoard state key {key!r} has no coda mapping")


def _by_find(item: dict, where: str) -> list[dict]:
    find, key = item["find"], item["key"]
    m = FIND_SUFFIX.match(find)
    if m and m.group(1) == "page_source" and key == "lambda key: key" and "pattern" in item:
        # the Log's HTML; coda keeps its text, where a <br> is a line break
        pattern = re.sub(r"\s*<br>\s*", r"\\s*", item["pattern"])
        return [{"type": "chimerax_info", "log": True, "pattern": pattern}]
    m = FIND_NAME.match(find)
    if not m:
        raise TaskError(f"{where}: find lambda {find!r} has no coda mapping")
    name = m.group(2)
    base = f"models_by_name.{name}"
    if key == "lambda key: key" and item.get("pattern") == ".+":
        return [{"type": "states", "path": base, "exists": True}]
    k = KEY_ATTRS.match(key)
    if not k:
        raise TaskError(f"{where}: key lambda {key!r} has no coda mapping")
    attrs = re.findall(r"'([^']*)'", k.group(2))
    value = item.get("value")
    if attrs == ["_vertex_colors"]:
        rows = _numbers(value)
        digest = hashlib.sha256(bytes(int(x) for r in rows for x in r)).hexdigest()
        return [{"type": "states", "path": f"{base}.surface.vertex_colors_sha256", "value": digest}]
    if attrs == ["_pbond_drawing", "name"] and value == "pbonds":
        return [{"type": "states", "path": base, "exists": True}]
    if attrs == ["_pbond_drawing", "_opaque_color_count"]:
        return [{"type": "states", "path": f"{base}.pseudobonds", "value": value}]
    if attrs == ["_pbond_drawing", "_colors"]:
        rows = _numbers(value)
        colours = sorted({"#%02x%02x%02x" % tuple(int(x) for x in r[:3]) for r in rows})
        return [
            {"type": "states", "path": f"{base}.pseudobonds", "value": len(rows)},
            {"type": "states", "path": f"{base}.pb_colors", "value": colours},
        ]
    if attrs == ["_atoms_drawing", "_positions", "_shift_and_scale"]:
        ((x, y, z, r),) = _numbers(value)
        return [
            {"type": "states", "path": f"{base}.markers.0.coord", "value": [x, y, z], "tol": 1e-3},
            {"type": "states", "path": f"{base}.markers.0.radius", "value": r, "tol": 1e-3},
        ]
    if attrs in (["_border"], ["_ticks"]):
        return [{"type": "states", "path": f"{base}.{attrs[0][1:]}", "value": value}]
    if attrs in (["scalebar_width"], ["scalebar_height"]):
        return [{"type": "states", "path": f"{base}.{attrs[0]}", "value": value, "tol": 1e-6}]
    raise TaskError(f"{where}: attributes {attrs} of the model named {name!r} have no coda mapping")


def _checks(sb: dict, where: str) -> list[dict]:
    out: list[dict] = []
    for i, item in enumerate(sb.get("evaluate", [])):
        at = f"{where}: evaluate[{i}]"
        t = item.get("type")
        if t == "states":
            out += _by_find(item, at) if "find" in item else _by_key(item, at)
        elif t == "info":
            if not isinstance(item.get("value"), list):
                raise TaskError(f"{at}: an info check without a list of lines")
            out.append({"type": "chimerax_info", "command": "info " + item["key"], "lines": item["value"]})
        elif t == "stop":
            if item.get("value") == "FAIL":
                out.append({"type": "answer", "value": "FAIL"})
            elif item.get("value") == "ANS" and len(item.get("args", [])) == 1:
                a = str(item["args"][0])
                if re.fullmatch(r"-?\d+(\.\d+)?", a):
                    decimals = len(a.split(".")[1]) if "." in a else 0
                    out.append({"type": "answer", "number": float(a), "tol": 0.5 * 10**-decimals})
                else:
                    out.append({"type": "answer", "value": a})
            else:
                raise TaskError(f"{at}: stop check {item!r} has no coda mapping")
        elif t == "file":
            raise TaskError(f"{at}: file checks on ScienceBoard's guest paths ({item.get('key')}) have no mapping")
        else:
            raise TaskError(f"{at}: check type {t!r} has no coda mapping")
    return out


def _structure(entry: str, rel: str, name: str | None) -> list[dict]:
    ops = [{"func": "chimerax_user_structure", "entry": entry, "path": rel}]
    ops.append({"func": "chimerax_open", "path": rel, **({"name": name} if name else {})})
    return ops


def _setup(sb: dict, where: str) -> tuple[list[dict], list[str]]:
    ops: list[dict] = []
    needs: list[str] = []
    for i, op in enumerate(sb.get("initialize", [])):
        f = op.get("func")
        at = f"{where}: initialize[{i}]"
        if f in ("execute", "launch"):
            continue  # profile clean-up and start: every coda reset starts ChimeraX on a fresh profile
        if f == "clear_log":
            ops.append({"func": "chimerax_clear_log"})
        elif f == "open":
            entry = str(op.get("name", ""))
            if not re.fullmatch(r"[0-9A-Za-z]{4}", entry):
                raise TaskError(f"{at}: open of {entry!r} (only PDB ids are mapped)")
            ops += _structure(entry.lower(), f"{entry.lower()}.cif", entry.lower())
            needs.append(entry.lower())
        elif f == "alphafold_match":
            uniprot = str(op.get("name", ""))
            if not re.fullmatch(r"[0-9A-Z]{6,10}", uniprot):
                raise TaskError(f"{at}: alphafold_match of {uniprot!r}")
            entry = f"AF-{uniprot}-F1-model_v4"
            ops += _structure(entry, f"{entry}.cif", None)
            needs.append(entry)
        elif f == "download":
            m = RCSB.match(str(op.get("url", "")))
            path = str(op.get("path", ""))
            if not m or not path.startswith("/home/user/"):
                raise TaskError(f"{at}: download {op.get('url')!r} -> {path!r} (only RCSB mmCIF files into the home)")
            # downloaded, not opened: the task is to open it
            ops.append(
                {"func": "chimerax_user_structure", "entry": m.group(1).lower(), "path": path[len("/home/user/") :]}
            )
            needs.append(m.group(1).lower())
        elif f == "turn":
            ops.append({"func": "chimerax_turn", "axis": op.get("axis"), "angle": op.get("angle")})
        elif f == "color":
            style = str(op.get("style", ""))
            if not re.fullmatch(r"by[a-z]+", style):
                raise TaskError(f"{at}: color style {style!r}")
            ops.append({"func": "chimerax_command", "command": check_command(f"color {style}")})
        else:
            raise TaskError(f"{at}: setup {f!r} has no coda mapping")
    return ops, needs


def convert(sb: dict, path: str) -> dict:
    from pathlib import Path

    from ...scienceboard import base_task
    from .setup import source_url

    stem = Path(path).stem
    if stem in NEEDS_NETWORK:
        raise TaskError(f"{path}: refused: {NEEDS_NETWORK[stem]}")
    task = base_task(sb, path, "chimerax")
    ops, needs = _setup(sb, path)
    task["initialize"] = ops
    checks: list[dict] = []
    for c in _checks(sb, path):
        if c not in checks:  # A-10's three keys map onto one check
            checks.append(c)
    task["evaluate"] = checks
    if not task["evaluate"]:
        raise TaskError(f"{path}: no checks")
    if needs:
        task["requires"] = "structures in $CODA_PDB_DIR (coda never fetches): " + ", ".join(
            f"{e}.cif ({source_url(e)})" for e in dict.fromkeys(needs)
        )
    return task
