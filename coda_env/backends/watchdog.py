"""What the backends' watchdogs share: a watchdog is a process of its own that learns of its parent's death
however the parent dies (its stdin pipe closes) and then removes what the parent made (a local desktop's
processes and folder; a VM). Each backend's `__main__` runs its own cleanup after `wait_for_parent_death`."""

from __future__ import annotations

import signal
import sys
from typing import Iterator


def wait_for_parent_death() -> Iterator[bytes]:
    """The lines the parent writes on our stdin (what it tells us as it goes), until it is gone (EOF). A
    SIGTERM or SIGINT meant for the parent's group does not end us before the cleanup."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    yield from sys.stdin.buffer
