"""TeXstudio (Debian's stock package) as `coda/TeXstudio-v0`: LaTeX editing tasks checked on the saved files.

Registers the app, its check types (`compile`, `tex_file`, `tex_include`) and its ScienceBoard translation.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ...registry import AppSpec, register_app
from . import scienceboard
from .adapter import TeXstudio
from .checks import CHECKS
from .families import FAMILIES
from .setup import SETUP_OPS


def available() -> str | None:
    missing = [b for b in ("texstudio", "pdflatex", "bibtex") if shutil.which(b) is None]
    if missing:
        return (
            f"{', '.join(missing)} not found: run `make setup` (apt packages texstudio texlive-latex-base; "
            f"texlive-latex-extra texlive-fonts-extra for ScienceBoard's documents)"
        )
    return None


SPEC = register_app(
    AppSpec(
        name="texstudio",
        env_id="coda/TeXstudio-v0",
        adapter=TeXstudio,
        checks=CHECKS,
        setup_ops=SETUP_OPS,
        families=FAMILIES,
        task_dir=Path(__file__).parent / "tasks",
        available=available,
        scienceboard=scienceboard,
        scienceboard_names=("TeXstudio",),
        description="TeXstudio LaTeX editor: edit, build and fix documents; checks read the saved files and build "
        "them with pdflatex/bibtex",
    )
)
