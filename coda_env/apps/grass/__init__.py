"""GRASS GIS 8.2 (Debian's stock build, wxGUI) as `coda/GRASS-v0`.

The adapter (`adapter.py`) launches `grass --gui` on a copy of this project's GRASS database (`data.py`,
built once by GRASS from `_build_db.py`) and reads the GUI's own state from a state server inside the GUI
process (`guistate.py`); the `info` and `db` check types are in `checks.py`, the `location` and `layer`
setup operations in `adapter.py`, ScienceBoard's GRASS tasks translate in `scienceboard.py`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ...registry import AppSpec, register_app
from . import scienceboard
from .adapter import Grass
from .checks import CHECKS
from .data import SYSTEM_PYTHON, set_grassdata  # noqa: F401  (coda import-scienceboard --option grassdata=DIR)
from .setup import SETUP_OPS


def available() -> str | None:
    if shutil.which("grass") is None:
        return "GRASS GIS is not installed: run `make setup` (Debian's grass package, 8.2)"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} is missing (GRASS's GUI needs Debian's python3-wxgtk4.0)"
    return None


SPEC = register_app(
    AppSpec(
        name="grass",
        env_id="coda/GRASS-v0",
        adapter=Grass,
        checks=CHECKS,
        setup_ops=SETUP_OPS,
        task_dir=Path(__file__).parent / "tasks",
        available=available,
        scienceboard=scienceboard,
        scienceboard_names=("GrassGIS",),
        scienceboard_options={"grassdata": "a GRASS database (folder) holding ScienceBoard's two locations"},
        description="GRASS GIS 8.2 with its wxGUI: layers, regions, map calculator, attribute queries",
        # the GUI takes 3-4 s to start on an idle 2-core machine and far longer on a loaded one
        env_kwargs={"ready_timeout": 90.0},
    )
)
