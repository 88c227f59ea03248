"""The core names this package uses (coda_env.registry), in one place."""
from ...registry import (AppError, AppSpec, CheckContext, CheckError, CheckType, LaunchContext,  # noqa: F401
                         SetupContext, SetupError, SetupOp, confined, register_app,
                         MAX_VALUE, finite_values, number, relative_path)
