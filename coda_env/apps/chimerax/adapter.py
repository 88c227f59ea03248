"""UCSF ChimeraX, driven and read through its REST server (`remotecontrol rest start ... json true`).

ChimeraX's state is not on the accessibility bus (the graphics are OpenGL, the log is a web view), so the
adapter asks ChimeraX itself: at launch it starts the REST server on a free port and, once that answers,
loads `inside.py` (a script that runs inside ChimeraX: a log recorder and a state dump). `state()` runs
the dump and reads the JSON it writes into the app's home. REST requests go through the desktop
(`desktop.http_get`: urllib on this machine, a request inside the guest for a VM) so they reach the app
wherever it runs.

The same adapter drives coda's ChimeraX *engine* (ChimeraX 1.7.1's library without a GUI,
`make chimerax-engine`) when built with `gui=False`: the engine tests use that; gym.make never does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

from ...backends.base import Desktop
from ...registry import AppError, LaunchContext

HERE = Path(__file__).resolve().parent
INSIDE = HERE / "inside.py"
DATA = HERE / "data"
STATE_MARK = "coda-state:"  # inside.py's codadump: the log line that carries the state
CODA_DIR = ".coda-chimerax"  # in the app's home: inside.py, state dumps
STATE_FILE = f"{CODA_DIR}/state.json"
# Where the Debian/Ubuntu .deb puts its launcher besides /usr/bin/chimerax (a symlink to it).
DEB_PATHS = ("/usr/bin/chimerax", "/usr/lib/ucsf-chimerax*/bin/ChimeraX")
MISSING = (
    "ChimeraX is not installed (looked for CODA_CHIMERAX, `chimerax` on PATH and "
    + ", ".join(DEB_PATHS)
    + "): download the .deb from https://www.cgl.ucsf.edu/chimerax/download.html "
    "and install it on this machine (apt install ./ucsf-chimerax_*.deb), or add it to the VM image "
    '(CHIMERAX_DEB=/path/to/ucsf-chimerax.deb make vm-image) and use backend="libvirt"'
)


def find_chimerax(binary: str | None = None) -> str | None:
    """The ChimeraX launcher on this machine: `binary`, $CODA_CHIMERAX, `chimerax` on PATH, the .deb's paths."""
    import glob

    debs = [p for pattern in DEB_PATHS for p in sorted(glob.glob(pattern))]
    for cand in (binary, os.environ.get("CODA_CHIMERAX"), shutil.which("chimerax"), *debs):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(desktop: Desktop, port: int, path: str, timeout: float) -> bytes:
    """GET http://127.0.0.1:port/path where the app runs: the desktop's http_get (urllib on this machine, a
    request inside the guest for a VM); a desktop without one cannot reach the app, so no host fallback."""
    get = getattr(desktop, "http_get", None)
    if get is None:
        raise AppError(f"the {type(desktop).__name__} desktop has no http_get: ChimeraX's REST server is unreachable")
    try:
        return get(port, path, timeout)
    except Exception as e:  # the desktop's own error type: report it as the app's
        raise AppError(f"ChimeraX's REST server on port {port} did not answer {path[:80]!r}: {e}") from None


def rest_run(desktop: Desktop, port: int, command: str, timeout: float = 60.0) -> dict:
    """Run one ChimeraX command over REST; the JSON answer ({"json values", "log messages", "error"}).
    Raises AppError when the server is unreachable or the command failed."""
    raw = http_get(desktop, port, "/run?" + urllib.parse.urlencode({"command": command}), timeout)
    try:
        answer = json.loads(raw)
    except ValueError:
        raise AppError(f"ChimeraX's REST answer to {command!r} is not JSON: {raw[:200]!r}") from None
    if answer.get("error"):
        err = answer["error"]
        raise AppError(f"ChimeraX command {command!r} failed: {err.get('message', err)}")
    return answer


def quote(path: str) -> str:
    """A path as one ChimeraX command argument."""
    if '"' in path or "\n" in path:
        raise AppError(f"unsupported character in path {path!r}")
    return f'"{path}"'


class ChimeraX:
    name = "chimerax"

    def __init__(self, binary: str | None = None, gui: bool = True) -> None:
        self.binary = binary
        self.gui = gui
        self.port: int | None = None
        self.home: str | None = None
        self._proc: subprocess.Popen | None = None
        self._initialized = False
        self._a11y = None

    # ------------------------------------------------------------------ lifecycle
    def _find(self, desktop: Desktop) -> str:
        if self.binary:  # asked of the desktop, so it looks where the app runs (a guest, for a VM)
            if desktop.run(["test", "-x", self.binary], timeout=30).returncode != 0:
                raise AppError(f"ChimeraX launcher {self.binary!r} is not an executable file. " + MISSING)
            return self.binary
        probe = (
            'for c in "$CODA_CHIMERAX" "$(command -v chimerax)" '
            + " ".join(DEB_PATHS)
            + '; do [ -n "$c" ] && [ -x "$c" ] && [ -f "$c" ] && { echo "$c"; exit 0; }; done; exit 1'
        )
        r = desktop.run(["sh", "-c", probe], timeout=30)
        out = (r.stdout.decode() if isinstance(r.stdout, bytes) else (r.stdout or "")).strip()
        if r.returncode != 0 or not out:
            raise AppError(MISSING)
        return out.splitlines()[0]

    def launch(self, ctx: LaunchContext) -> subprocess.Popen:
        desktop, home = ctx.desktop, ctx.home
        binary = self._find(desktop)
        h = Path(home)
        # A fresh profile: the folders ChimeraX expects, no toolshed or update checks (no network).
        desktop.write_file(
            str(h / ".config/ChimeraX/chimerax.core-1"),
            b"[DEFAULT]\ntoolshed_update_interval = 'never'\nnewer_update_interval = 'never'\n",
        )
        desktop.write_file(str(h / ".local/share/ChimeraX/.coda"), b"")
        desktop.write_file(str(h / ".cache/ChimeraX/.coda"), b"")
        desktop.write_file(str(h / CODA_DIR / "inside.py"), INSIDE.read_bytes())
        self.home = home
        self.port = free_port()
        self._initialized = False
        env = {
            "HOME": home,
            "CODA_HOME": home,
            "XDG_CONFIG_HOME": str(h / ".config"),
            "XDG_DATA_HOME": str(h / ".local/share"),
            "XDG_CACHE_HOME": str(h / ".cache"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            # a crash (ChimeraX's Python has segfaulted, rarely, reopening a session) leaves its Python stack
            # in chimerax.log, which the error for a dead ChimeraX quotes
            "PYTHONFAULTHANDLER": "1",
            # QtWebEngine (the log, help viewer) refuses to run as root without these
            "QTWEBENGINE_DISABLE_SANDBOX": "1",
            "QTWEBENGINE_CHROMIUM_FLAGS": "--no-sandbox --disable-gpu",
            # matplotlib's font cache: in the home (a sealed app writes nowhere else)
            "MPLCONFIGDIR": str(h / ".cache" / "mplconfig"),
            # no network: anything that honours proxies goes nowhere; the REST server is local
            "http_proxy": "http://127.0.0.1:9",
            "https_proxy": "http://127.0.0.1:9",
            "HTTP_PROXY": "http://127.0.0.1:9",
            "HTTPS_PROXY": "http://127.0.0.1:9",
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        argv = [binary, "--cmd", f"remotecontrol rest start port {self.port} json true"]
        if not self.gui:
            argv.append("--nostatus")
        argv += list(ctx.open_files)
        self._proc = desktop.spawn(argv, env=env, cwd=home, log=str(h / "chimerax.log"))
        return self._proc

    def _log(self, desktop: Desktop) -> str:
        try:
            data = desktop.read_file(str(Path(self.home) / "chimerax.log")) if self.home else b""
        except OSError:
            return ""
        return data.decode(errors="replace")

    def _log_tail(self, desktop: Desktop) -> str:
        return self._log(desktop)[-800:]

    def ready(self, desktop: Desktop) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise AppError(
                f"chimerax exited with code {self._proc.returncode} while starting: {self._log_tail(desktop)}"
            )
        if self.gui and not any("chimerax" in (w.wm_class or "").lower() and w.width > 200 for w in desktop.windows()):
            return False
        try:
            rest_run(desktop, self.port, "version", timeout=2.0)
        except AppError:
            return False
        if not self._initialized:
            rest_run(desktop, self.port, f"runscript {quote(self.inside_path)} init")
            self._initialized = True
        return True

    @property
    def inside_path(self) -> str:
        return str(Path(self.home) / CODA_DIR / "inside.py")

    def close(self) -> None:
        self._initialized = False
        if self._a11y is not None:
            try:
                self._a11y.close()
            except Exception:  # noqa: BLE001 - the bus may be gone with the desktop
                pass
            self._a11y = None

    # ------------------------------------------------------------------ commands and state
    def command(self, desktop: Desktop, text: str, timeout: float = 60.0) -> dict:
        """Run a command over REST (not logged, as ScienceBoard's harness does); its JSON answer."""
        if self.port is None:
            raise AppError("ChimeraX is not running")
        try:
            return rest_run(desktop, self.port, text, timeout)
        except AppError as e:
            raise self.exited_error(desktop) or e from None

    def exited_error(self, desktop: Desktop) -> AppError | None:
        """An error naming how ChimeraX died (exit code or signal, its log's tail), or None while it runs:
        a REST call to a dead ChimeraX otherwise reads as 'connection refused'."""
        code = self._proc.poll() if self._proc is not None else None
        if code is None:
            return None
        how = f"exited with code {code}"
        sig = -code if code < 0 else code - 128 if code > 128 else 0  # a sealed app's sandbox exits 128 + signal
        if sig:
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = "?"
            how = f"was killed by signal {sig} ({name})" if code < 0 else f"{how} (signal {sig}, {name})"
        return AppError(f"ChimeraX {how}: {self._crash_report(desktop)}")

    def _crash_report(self, desktop: Desktop) -> str:
        """faulthandler's report in the log (the error and the Python stack, without its long list of
        extension modules), else the log's tail."""
        text = self._log(desktop)
        i = text.rfind("Fatal Python error")
        if i < 0:
            return text[-800:]
        return text[i:].split("\nExtension modules:", 1)[0][:1500]

    def typed(self, desktop: Desktop, text: str) -> None:
        """Run a command as the command line does (logged). For tests that replay oracles on the engine."""
        self.command(desktop, "codatype " + text)

    def state(self, desktop: Desktop) -> dict[str, Any]:
        try:
            return dump_state(desktop, self.port, self.home)
        except AppError as e:
            raise self.exited_error(desktop) or e from None

    def a11y_text(self, desktop: Desktop) -> str:
        """The GUI's accessible widgets (menus, toolbar, command line) as `role name` lines; the graphics
        and log panes are not on the bus."""
        if not self.gui:
            return ""
        try:
            if self._a11y is None:
                self._a11y = desktop.a11y()
            tree = self._a11y.app_tree("ChimeraX", skip_roles=frozenset({"scroll bar"}), texts=True)
        except Exception as e:  # AT-SPI can be missing or slow; the observation says so instead of failing
            return f"(accessibility tree unavailable: {e})"
        if tree is None:
            return "(ChimeraX is not on the accessibility bus)"
        lines = []
        for n in tree.walk():
            if n.name or getattr(n, "text", None):
                lines.append(f"{n.role}\t{n.name}\t{(getattr(n, 'text', '') or '')[:80]}")
            if len(lines) >= 300:
                lines.append("...")
                break
        return "\n".join(lines)


def dump_state(desktop: Desktop, port: int | None, home: str | None) -> dict[str, Any]:
    """The session's state as inside.py's `codadump` gives it in its REST answer (no file in the app's home
    is read or run for it), plus the REST port (checks that query the app use it)."""
    if port is None or home is None:
        raise AppError("ChimeraX is not running")
    answer = rest_run(desktop, port, "codadump")
    msgs = answer.get("log messages") or {}
    lines = [m for level in msgs.values() if isinstance(level, list) for m in level if isinstance(m, str)]
    text = next((m for m in lines if m.startswith(STATE_MARK)), None)
    if text is None:
        raise AppError(f"ChimeraX's codadump answered no state: {str(answer)[:300]}")
    try:
        state = json.loads(text[len(STATE_MARK) :])
    except ValueError as e:
        raise AppError(f"ChimeraX's state is not JSON: {e}") from None
    state["rest_port"] = port
    return state
