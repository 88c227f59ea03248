"""UCSF ChimeraX (the molecular graphics program) as `coda/ChimeraX-v0`.

The GUI comes from UCSF's .deb (not in any registry here): `available()` says how to get it. The adapter
drives ChimeraX over its REST server and reads the session through a script that runs inside it
(adapter.py, inside.py); the check types (`states`, `chimerax_info`, `chimerax_file`) and setup operations
(`chimerax_open`, `chimerax_command`, `chimerax_turn`, `chimerax_clear_log`, `chimerax_save`) register
here, with this project's tasks in tasks/ and the structures they open in data/. `make chimerax-engine`
builds ChimeraX's library without a GUI (engine/), on which the default test suite runs everything but the
GUI itself.
"""

from __future__ import annotations

from pathlib import Path

from ...registry import AppSpec, register_app
from . import scienceboard
from .adapter import MISSING, ChimeraX, find_chimerax
from .checks import CHECKS
from .setup import SETUP_OPS


def available() -> str | None:
    return None if find_chimerax() else MISSING


SPEC = register_app(
    AppSpec(
        name="chimerax",
        env_id="coda/ChimeraX-v0",
        adapter=ChimeraX,
        checks=CHECKS,
        setup_ops=SETUP_OPS,
        task_dir=Path(__file__).parent / "tasks",
        available=available,
        scienceboard=scienceboard,
        scienceboard_names=("ChimeraX",),
        description="UCSF ChimeraX: molecular structure visualisation and analysis",
    )
)
