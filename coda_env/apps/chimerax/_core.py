"""The core names this package uses: coda_env.registry once the core refactor is merged, else the shim.
(Checked by file: an editable install of another checkout can otherwise supply a half-made registry.)"""
import os

if os.path.exists(os.path.join(os.path.dirname(__file__), "..", "..", "registry.py")):
    from ...registry import (AppError, AppSpec, CheckContext, CheckError, CheckType, LaunchContext,  # noqa: F401
                             SetupContext, SetupError, SetupOp, confined, register_app)
else:  # before the merge of issue 16's core
    from ._shim import (AppError, AppSpec, CheckContext, CheckError, CheckType, LaunchContext,  # noqa: F401
                        SetupContext, SetupError, SetupOp, confined, register_app)
