"""Where a desktop lives. One module per backend; `make_desktop` is the one table that names them."""
from __future__ import annotations

BACKENDS = ("local", "libvirt", "fake")


def make_desktop(backend: str, width: int, height: int, sandbox: bool = True, **options):
    """A desktop of `backend` with the env's screen size; `options` (backend_options) go to its config.
    `sandbox`: seal the apps (the local backend's bubblewrap; a VM is its own seal, so others ignore it).
    Each backend module is imported only when used (libvirt's needs libvirt-python)."""
    if backend == "local":
        from .local import LocalConfig, LocalDesktop
        options.setdefault("sandbox", sandbox)
        return LocalDesktop(LocalConfig(width=width, height=height, **options))
    if backend == "libvirt":
        from .libvirt import LibvirtConfig, LibvirtDesktop
        return LibvirtDesktop(LibvirtConfig(width=width, height=height, **options))
    if backend == "fake":
        from .fake import FakeDesktop
        return FakeDesktop(width, height, **options)
    raise ValueError(f"unknown backend {backend!r}; available: {', '.join(repr(b) for b in BACKENDS)}")
