"""Where a desktop lives. One module per backend, and BACKENDS, the one table that names them: `gym.make`,
`coda eval --backend` and `RayVectorEnv` read it. Adding a backend is one new module (with a
`make_desktop(width, height, sandbox, **options)`) plus its line here."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # imported only when used (libvirt's needs libvirt-python)
    apps_on_host: bool = False  # the apps run on this machine: an app's own `available()` applies
    host_option: str | None = None  # the option that names another host (envs are spread over hosts by it)
    description: str = ""


DEFAULT_BACKEND = "local"  # what gym.make uses when no backend is named

BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "local",
            "coda_env.backends.local",
            apps_on_host=True,
            description="Xvfb on this machine, every app sealed (bubblewrap)",
        ),
        Backend(
            "libvirt",
            "coda_env.backends.libvirt",
            host_option="uri",
            description="a VM per env, on any libvirt URI (local or remote)",
        ),
        Backend("fake", "coda_env.backends.fake", description="a fake desktop for fast tests of logic"),
    )
}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(repr(b) for b in BACKENDS)}")
    return BACKENDS[name]


def make_desktop(backend: str, width: int, height: int, sandbox: bool = True, **options):
    """A desktop of `backend` with the env's screen size; `options` (backend_options) go to its config.
    `sandbox`: seal the apps (the local backend's bubblewrap; a VM is its own seal, so others ignore it)."""
    return importlib.import_module(get_backend(backend).module).make_desktop(width, height, sandbox, **options)
