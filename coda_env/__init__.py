"""coda_env: Gymnasium environments on real scientific desktop applications.

Importing the package imports the app packages (`coda_env/apps/<app>/`), each of which registers its env
id, check types and setup operations (`coda_env.registry`); `gym.make("coda_env:coda/<App>-v0")` works
without importing it first.
"""

from . import checks, setup_ops  # noqa: F401  (the core check types and setup operations register first)
from . import apps  # noqa: F401  (each app package registers itself)
from .registry import APPS, AppSpec, register_app

__all__ = ["APPS", "AppSpec", "register_app", "envs"]


def envs() -> dict[str, str]:
    """Every registered env id -> the app's name."""
    return {spec.env_id: name for name, spec in APPS.items()}
