"""The core names this package uses: SPEC.md's `coda_env.registry` once it is in this checkout, else the
temporary shim (the venv's editable install would otherwise import main's half-written registry)."""
from pathlib import Path

if (Path(__file__).resolve().parents[2] / "registry.py").exists():
    from ...registry import (AppError, AppSpec, CheckContext, CheckError, CheckType, LaunchContext,  # noqa: F401
                             SetupContext, SetupError, SetupOp, confined, register_app)
else:  # pragma: no cover - removed at merge
    from ._shim import (AppError, AppSpec, CheckContext, CheckError, CheckType, LaunchContext,  # noqa: F401
                        SetupContext, SetupError, SetupOp, confined, register_app)
