"""The app packages. Importing this imports each `coda_env/apps/<app>/` package, which registers itself
(`coda_env.registry.register_app`); a package that fails to import is reported in `registry.BROKEN_APPS`
(and by `coda envs`) instead of taking the other apps down."""

from __future__ import annotations

import importlib
import pkgutil

from ..registry import BROKEN_APPS


def load_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        if mod.ispkg and not mod.name.startswith("_"):
            try:
                importlib.import_module(f"{__name__}.{mod.name}")
            except Exception as e:  # noqa: BLE001 - one broken app must not hide the others
                BROKEN_APPS[mod.name] = f"{type(e).__name__}: {e}"


load_all()
