"""GRASS's setup operations: `location` (files phase: which GRASS location the GUI opens, copied from this
project's database or a user's), `layer` (add a map layer as the Layer Manager does) and `scale` (set the map
display's scale), the last two through the GUI's state server once the app is ready."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from ...registry import AppError, SetupError, SetupOp
from . import data

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}$")


def _location_validate(op: dict) -> None:
    for key in ("location", "mapset"):
        if key in op and not (isinstance(op[key], str) and NAME_RE.match(op[key])):
            raise SetupError(f"{key!r} must be a GRASS name (letters, digits, _ . -), got {op.get(key)!r}")
    if "grassdata" in op and not (isinstance(op["grassdata"], str) and os.path.isabs(op["grassdata"])):
        raise SetupError("'grassdata' must be an absolute folder (a GRASS database the location is copied from)")
    if "open" in op and not isinstance(op["open"], bool):
        raise SetupError("'open' must be true or false")


def _location(ctx, op: dict) -> None:
    """Files phase: which location the GUI opens. `coda` is this project's; any other is copied (read only)
    from `grassdata` in the op, else from set_grassdata()/$CODA_GRASSDATA."""
    loc, mapset = op.get("location", data.LOCATION), op.get("mapset", data.MAPSET)
    if loc == data.LOCATION and "grassdata" not in op:
        src = (str(data.database()), loc, mapset)
        if op.get("open", True):
            ctx.app.location_source = src
        else:
            ctx.app.extra_locations.append(src[:2])
        return
    src = op.get("grassdata") or data.grassdata()
    if not src:
        raise AppError(
            f"this task needs the GRASS location {loc!r}: name the GRASS database holding it with "
            f"$CODA_GRASSDATA or `coda import-scienceboard --option grassdata=DIR`"
        )
    if not data.is_location(Path(src, loc)) or not Path(src, loc, mapset).is_dir():
        raise AppError(f"the GRASS location {loc}/{mapset} is not in {src}")
    if op.get("open", True):
        ctx.app.location_source = (src, loc, mapset)
    else:  # only copied beside it (a task that asks to switch to it)
        ctx.app.extra_locations.append((src, loc))


_LAYER_MODULES = {"raster": "d.rast", "vector": "d.vect"}
_PARAM_RE = re.compile(r"^[A-Za-z0-9_.@:,+\- ]{1,200}$")


def _layer_validate(op: dict) -> None:
    if not (isinstance(op.get("map"), str) and re.match(r"^[A-Za-z0-9_.@\-]{1,120}$", op["map"])):
        raise SetupError(f"'map' must be a GRASS map name, got {op.get('map')!r}")
    if op.get("type", "raster") not in _LAYER_MODULES and "type" in op:
        raise SetupError(f"'type' must be raster or vector, got {op.get('type')!r}")
    params = op.get("params", {})
    if not isinstance(params, dict) or not all(
        isinstance(k, str)
        and re.match(r"^[a-z_]{1,30}$", k)
        and k != "map"
        and isinstance(v, (str, int, float))
        and _PARAM_RE.match(str(v))
        for k, v in params.items()
    ):
        raise SetupError("'params' must map d.rast/d.vect option names to simple values")
    from ...registry import number

    for k, v in params.items():
        if not isinstance(v, str):
            number(v, f"'params' {k}", -1e12, 1e12, error=SetupError)


def _layer(ctx, op: dict) -> None:
    """App phase: add a map layer as the Layer Manager's 'Add map layer' does; wait until it is listed."""
    app = ctx.app  # the Grass adapter
    before = len(app.state(ctx.desktop)["layers"])
    req: dict[str, Any] = {"op": "add_layer", "map": op["map"]}
    if "type" in op:
        req["cmd"] = [
            _LAYER_MODULES[op["type"]],
            f"map={op['map']}",
            *(f"{k}={v}" for k, v in op.get("params", {}).items()),
        ]
    app.request(req)
    deadline = time.monotonic() + 10
    while len(app.state(ctx.desktop)["layers"]) <= before:
        if time.monotonic() > deadline:
            raise AppError(f"GRASS did not list the layer {op['map']!r}")
        time.sleep(0.02)
    _wait_rendered(ctx)


def _wait_rendered(ctx, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while ctx.app.request({"op": "ping"}).get("rendering"):
        if time.monotonic() > deadline:
            raise AppError("GRASS's map display did not finish rendering")
        time.sleep(0.02)


def _scale_validate(op: dict) -> None:
    from ...registry import number

    number(op.get("scale"), "'scale' (the n of 1:n)", 1, 1e10, error=SetupError)


def _scale(ctx, op: dict) -> None:
    """App phase: set the map display's scale to 1:n, as typing it into the status bar's Map scale does."""
    ctx.app.request({"op": "set_scale", "scale": float(op["scale"])})
    _wait_rendered(ctx)


SETUP_OPS = [
    SetupOp(
        "location", _location, _location_validate, optional={"location", "mapset", "grassdata", "open"}, phase="files"
    ),
    SetupOp("scale", _scale, _scale_validate, required={"scale"}, phase="app"),
    SetupOp("layer", _layer, _layer_validate, required={"map"}, optional={"type", "params"}, phase="app"),
]
