"""KAlgebra (KDE's calculator and plotter, Debian's stock build) as `coda/KAlgebra-v0`.

The adapter reads its state through AT-SPI (`adapter.py`); its own check types (`var`, `val`, `eqn`) and
setup operations (`tab`, `console`, `func_2d`, `func_3d`) register here, with the task files in `tasks/`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ...registry import AppSpec, register_app
from . import scienceboard
from .adapter import KAlgebra
from .checks import CHECKS
from .families import FAMILIES
from .setup import SETUP_OPS


def available() -> str | None:
    if shutil.which("kalgebra") is None:
        return "kalgebra is not installed: run `make setup` (Debian's kalgebra package), or use backend='libvirt'"
    return None


SPEC = register_app(
    AppSpec(
        name="kalgebra",
        env_id="coda/KAlgebra-v0",
        adapter=KAlgebra,
        checks=CHECKS,
        setup_ops=SETUP_OPS,
        families=FAMILIES,
        task_dir=Path(__file__).parent / "tasks",
        available=available,
        scienceboard=scienceboard,
        scienceboard_names=("KAlgebra",),
        description="KDE's calculator and function plotter (2D/3D graphs)",
    )
)
