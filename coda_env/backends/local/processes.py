"""Process hygiene of a desktop: a token in every process's environment, kill by group and by token, and the
watchdog that cleans up when the process that made the desktop dies however it dies (its stdin closes)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from typing import TYPE_CHECKING, Sequence

from ..watchdog import wait_for_parent_death

if TYPE_CHECKING:
    from .deadline import _Deadline

TOKEN_VAR = "CODA_DESKTOP_TOKEN"


def _proc_has_token(pid: int, token: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return token in f.read()
    except OSError:
        return False


def _proc_state(pid: int) -> str | None:
    """The one-letter state of a process (R, S, T for stopped, Z for zombie), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def kill_everything(token: str, pgids: Sequence[int] = (), grace: float = 1.0) -> None:
    """SIGTERM our process groups, wait up to `grace`, SIGKILL what remains, then sweep /proc by token."""
    me = os.getpid()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in pgids:
            try:
                os.killpg(g, sig)
                if sig == signal.SIGTERM:  # a stopped (SIGSTOPed, frozen) process acts on SIGTERM only once continued
                    os.killpg(g, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 0.5)
        while time.monotonic() < deadline:
            if not any(_group_alive(g) for g in pgids):
                break
            time.sleep(0.01)
    needle = f"{TOKEN_VAR}={token}".encode()
    for _ in range(3):  # a dying parent may fork once more; sweep until nothing carries the token
        found = False
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me and _proc_has_token(int(entry), needle):
                found = True
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if not found:
            break
        time.sleep(0.02)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies still count for killpg; treat a group of zombies as dead
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != b"Z":
                    return True
            except (OSError, IndexError, ValueError):
                pass
    return False


def _remove_x_files(display: int, pid: int) -> None:
    """Remove display N's lock and socket if they are still those of our X server (process `pid`, now dead).
    Once it is dead, another desktop's Xvfb may take display N at any moment and write its own: those files
    are not ours (removing them left a new desktop's sealed window manager without its X socket)."""
    lock = f"/tmp/.X{display}-lock"
    try:
        with open(lock) as f:
            if int(f.read().strip()) != pid:
                return
    except (OSError, ValueError):
        return  # gone already (our server removed it, or another took the display and is writing its own)
    for p in (lock, f"/tmp/.X11-unix/X{display}"):
        try:
            os.unlink(p)
        except OSError:
            pass


def _cleanup(
    token: str,
    pgids: list[int],
    watchdog: subprocess.Popen | None,
    tmpdir: str | None,
    xserver: tuple[int, int] | None,
    deadline: "_Deadline | None" = None,
) -> None:
    if deadline is not None:
        deadline.close()
    kill_everything(token, pgids)
    if watchdog is not None and watchdog.poll() is None:
        watchdog.kill()
        watchdog.wait()
    if xserver is not None:  # a SIGKILLed Xvfb leaves its lock and socket behind
        _remove_x_files(*xserver)
    if tmpdir:
        shutil.rmtree(tmpdir, ignore_errors=True)


def token_pids(token: str) -> list[int]:
    """The processes (zombies included) that carry a desktop's token: what tests and benchmarks measure."""
    needle = f"{TOKEN_VAR}={token}".encode()
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and _proc_has_token(int(e), needle)]


def _watchdog_main(token: str, tmpdir: str) -> None:
    """Block on stdin; when the parent is gone (EOF), kill everything that carries the token and remove the
    desktop's folder."""
    xserver = None
    for line in wait_for_parent_death():  # "DISPLAY PID" of our X server once it is up
        words = line.split()
        if len(words) == 2 and all(w.isdigit() for w in words):
            xserver = (int(words[0]), int(words[1]))
    pgids = []
    needle = f"{TOKEN_VAR}={token}".encode()
    for e in os.listdir("/proc"):
        if e.isdigit() and _proc_has_token(int(e), needle):
            try:
                pgids.append(os.getpgid(int(e)))
            except ProcessLookupError:
                pass
    _cleanup(token, sorted(set(pgids)), None, tmpdir, xserver)
