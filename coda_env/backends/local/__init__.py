"""The local backend: a private X desktop on this machine.

One `LocalDesktop` is one Xvfb (display number picked by Xvfb itself through `-displayfd`), a window manager
(openbox, main windows maximized), a private D-Bus session with the AT-SPI accessibility bus, XTest input
bound to that display only, and MIT-SHM screenshots into numpy (through `mss`).

No orphans: every process carries a per-desktop token in its environment and lives in a process group we
own; `stop()`, garbage collection, interpreter exit, and a watchdog process (which notices when its parent
dies, however it dies, because its stdin pipe closes) all kill by group, sweep /proc for the token, and
remove the desktop's temporary folder (the env makes the app homes inside it).

Faults are reported, never hung on: every X call runs under a deadline (a frozen X server cuts the
connection and raises DesktopError), `alive()` checks every part the desktop started, and the input it
holds down (keys, buttons) is tracked so that `release_all()` leaves the next episode a clean keyboard.
"""

from __future__ import annotations

from .desktop import LocalConfig, LocalDesktop, _openbox_rc  # noqa: F401 (tests read _openbox_rc)
from .processes import TOKEN_VAR, _proc_state, kill_everything, token_pids  # noqa: F401
from .xinput import _BUTTONS, _KEYSYMS, NO_KEYSYM, key_plan  # noqa: F401


def make_desktop(width: int, height: int, sandbox: bool = True, **options) -> LocalDesktop:
    """The backends table's entry point (coda_env.backends.BACKENDS)."""
    options.setdefault("sandbox", sandbox)
    return LocalDesktop(LocalConfig(width=width, height=height, **options))


__all__ = [
    "make_desktop",
    "LocalConfig",
    "LocalDesktop",
    "TOKEN_VAR",
    "NO_KEYSYM",
    "kill_everything",
    "token_pids",
    "key_plan",
]
