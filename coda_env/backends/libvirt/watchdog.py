"""Removing a domain: `destroy_domain` (by `stop()`, garbage collection and atexit through `_cleanup`), and
the watchdog process that notices its parent's death (its stdin pipe closes) and removes the domain by name
through its own connection. The watchdog runs as `python -m coda_env.backends.libvirt --watchdog ...`
(this package's `__main__.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from ..watchdog import wait_for_parent_death
from .config import _code, _libvirt


def destroy_domain(conn: Any, name: str, pool: str | None, volume: str | None) -> list[str]:
    """Destroy and undefine domain `name` and delete its overlay volume; what was missing is skipped.

    Returns what it did (for the watchdog's log and for tests)."""
    libvirt, _ = _libvirt()
    done: list[str] = []
    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        dom = None
    if dom is not None:
        try:
            if dom.isActive():
                dom.destroy()
                done.append("destroyed")
        except libvirt.libvirtError:
            pass
        base = libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
        for flags in (base | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM, base):  # not every driver knows NVRAM
            try:
                dom.undefineFlags(flags)
                done.append("undefined")
                break
            except libvirt.libvirtError as e:
                if _code(e) == libvirt.VIR_ERR_NO_DOMAIN:  # a transient domain is gone once destroyed
                    break
    if pool and volume:
        try:
            conn.storagePoolLookupByName(pool).storageVolLookupByName(volume).delete(0)
            done.append("deleted overlay")
        except libvirt.libvirtError:
            pass
    return done


def _cleanup(uri: str, name: str, pool: str | None, volume: str | None, watchdog: subprocess.Popen | None) -> None:
    """Remove the domain through a fresh connection (the desktop's own may be closed or broken)."""
    try:
        libvirt, _ = _libvirt()
        conn = libvirt.open(uri)
        try:
            destroy_domain(conn, name, pool, volume)
        finally:
            conn.close()
    except Exception:
        pass
    if watchdog is not None and watchdog.poll() is None:
        watchdog.kill()
        watchdog.wait()


def _start_watchdog(uri: str, name: str, pool: str, volume: str, stdout: Any = subprocess.DEVNULL) -> subprocess.Popen:
    """A process that removes the domain when we die, however we die (its stdin closes then)."""
    return subprocess.Popen(
        [sys.executable, "-m", "coda_env.backends.libvirt", "--watchdog", uri, name, pool, volume],
        stdin=subprocess.PIPE,
        stdout=stdout,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=str(Path(__file__).resolve().parents[3]),
    )


def _watchdog_main(uri: str, name: str, pool: str, volume: str) -> None:
    """Block on stdin; at EOF (the parent is gone) destroy the domain by name and delete its overlay."""
    for _ in wait_for_parent_death():
        pass
    try:
        libvirt, _ = _libvirt()
        conn = libvirt.open(uri)
        done = destroy_domain(conn, name, pool, volume)
        conn.close()
    except Exception as e:
        done = [f"error: {e}"]
    print(f"watchdog {name}: {', '.join(done) or 'nothing to remove'}", flush=True)
