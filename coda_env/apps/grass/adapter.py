"""GRASS GIS 8.2 (Debian's stock build) with its wxGUI: launch, readiness, state, accessibility, set-up.

Two sources of state, because GRASS keeps two kinds:
- The data (maps, attribute tables, regions) lives in the GRASS database in the env's home. The `db` check
  asks GRASS itself, with `grass --tmp-mapset LOCATION --exec MODULE ...`: a throwaway mapset beside the one
  the GUI holds, so the GUI's lock is never broken and the query sees the same maps.
- What only the GUI knows (the Layer Manager's layers with their commands, order, checked state and
  opacity; the displayed region and scale; the status-bar mode; toolbars; open windows; console output) is
  read from inside the GUI process. Choice: a small state server (`guistate.py`) that Python's per-user
  start-up hook (`usercustomize`, found in the user site folder of the env's own HOME) starts inside
  `wxgui.py` only. It reads wx objects on the GUI thread and writes nothing. The channel cannot be taken
  over: the env listens, the GUI connects once at start (before any agent acts), and the env keeps that one
  connection (checked to come from the GUI process) and closes its socket; requests carry ids. The GUI's
  console runs programs, but inside the app's sandbox (backends/local/sandbox.py), and nothing it starts can
  replace the GUI on that connection. Its Python tab is hidden (GRASS's `manager.hideTabs.pyshell`) and
  the Simple Python Editor's menu items are removed (`guistate._no_python_editor`).

AT-SPI sees only the menus and toolbars of wxGTK (the layer and data trees are custom-drawn), so
`a11y_text` joins those with the Layer Manager's layers as the GUI lays them out (names and boxes from the
state server).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ...backends.base import Desktop, stable_path
from ...registry import AppError
from . import data

SOCKET_ENV = "CODA_GRASS_STATE_SOCKET"
A11Y_ROWS = 400
_A11Y_SKIP = frozenset({"menu", "popup menu"})  # closed menus' items are not on screen
_A11Y_ROLES = frozenset(
    {
        "frame",
        "dialog",
        "menu",
        "menu item",
        "push button",
        "toggle button",
        "check box",
        "radio button",
        "combo box",
        "text",
        "page tab",
        "spin button",
        "slider",
        "label",
        "list item",
        "table cell",
        "tree item",
    }
)
A11Y_APP_NAMES = ("wxgui.py", "GRASS GIS", "python3")  # how wxGTK may name the GUI on the bus
# wx.json, GRASS's own preferences: no locale dialog (no en_US locale here), no Python shell tab, no Tools
# tab (the same modules are in the menus; the console is then shown from the start), and the
# single-window layout (GRASS 8.4's default, which ScienceBoard's tasks were made on; 8.2 offers it as an
# option): Data Catalog, Layers, Map Display, Tools and Console in one window that the desktop maximizes
WX_SETTINGS = {
    "language": {"locale": {"lc_all": "C"}},
    "manager": {"hideTabs": {"pyshell": True, "search": True}},
    "general": {"singleWindow": {"enabled": True}},
}
QUICK_ANSWER, QUICK_ANSWERS = 0.2, 2  # ready: the GUI thread answered within 0.2 s twice running
USERCUSTOMIZE = "import coda_grass_state\ncoda_grass_state.install()\n"


def system_python_version() -> str:
    """'3.11' for /usr/bin/python3 (the user-site folder is named after it)."""
    global _PYVER
    if _PYVER is None:
        r = subprocess.run(
            [data.SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        _PYVER = r.stdout.strip() or "3.11"
    return _PYVER


_PYVER: str | None = None


class Grass:
    name = "grass"
    wm_class = "wxgui.py"

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._sock: str | None = None
        self._listener: socket.socket | None = None
        self._conn: socket.socket | None = None  # the one connection from the GUI's state server
        self._buf = b""
        self._serial = 0
        self.home: str | None = None
        # set by the `location` setup op (files phase) before launch; default: the coda database
        self.location_source: tuple[str, str, str] | None = None  # (source GISDBASE, location, mapset)
        self.extra_locations: list[tuple[str, str]] = []  # (source GISDBASE, location): copied too
        self.gisdbase: str | None = None
        self._quick, self._splash_closed = 0, False
        self.location = data.LOCATION
        self.mapset = data.MAPSET

    # ------------------------------------------------------------------------------------ lifecycle
    def launch(self, ctx) -> subprocess.Popen:
        desktop, home = ctx.desktop, ctx.home
        if shutil.which("grass") is None:
            raise AppError("GRASS GIS is not installed: `apt-get install grass` (or `make setup`)")
        if not os.access(data.SYSTEM_PYTHON, os.X_OK):
            raise AppError(f"{data.SYSTEM_PYTHON} is missing: GRASS's GUI needs Debian's python3 with wxPython")
        self.home = home
        src_db, self.location, self.mapset = self.location_source or (str(data.database()), data.LOCATION, data.MAPSET)
        try:
            self.gisdbase = str(data.copy_location(src_db, self.location, home))
            for extra_db, extra in self.extra_locations:
                if extra != self.location:
                    data.copy_location(extra_db, extra, home)
        except (data.DataError, OSError) as e:
            raise AppError(f"cannot set up the GRASS database: {e}") from None
        finally:  # one adapter serves every reset: the next task's `location` ops choose afresh
            self.location_source, self.extra_locations = None, []
        site = Path(home, ".local", "lib", f"python{system_python_version()}", "site-packages")
        desktop.write_file(str(site / "coda_grass_state.py"), Path(__file__).with_name("guistate.py").read_bytes())
        desktop.write_file(str(site / "usercustomize.py"), USERCUSTOMIZE.encode())
        desktop.write_file(str(Path(home, ".grass8", "wx.json")), json.dumps(WX_SETTINGS).encode())
        # no GTK transitions: a checkbox caught mid-animation made two identical resets' screens differ
        desktop.write_file(
            str(Path(home, ".config", "gtk-3.0", "settings.ini")), b"[Settings]\ngtk-enable-animations=0\n"
        )
        self._disconnect()
        self._sock = os.path.join(home, f".coda-grass-{uuid.uuid4().hex[:12]}.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._sock)
        os.chmod(self._sock, 0o666)  # the app's (unprivileged) user connects to it
        self._listener.listen(1)
        self._listener.setblocking(False)
        env = {
            **data.grass_env(home),
            SOCKET_ENV: self._sock,
            "XDG_CONFIG_HOME": str(Path(home, ".config")),
            "XDG_CACHE_HOME": str(Path(home, ".cache")),
            "NO_AT_BRIDGE": "0",
        }
        # GRASS's session folder (grass8-<user>-<pid>) in the home, which goes with the episode; the app is
        # sealed and can write nowhere else (the desktop's own folder is not even visible to it)
        os.makedirs(os.path.join(home, ".tmp"), exist_ok=True)
        env.update(data.grass_env(home, os.path.join(home, ".tmp")))
        mapset = str(
            Path(self._stable_root(desktop, home), os.path.relpath(self.gisdbase, home), self.location, self.mapset)
        )
        self._quick, self._splash_closed = 0, False
        self._proc = desktop.spawn(["grass", "--gui", mapset], env=env, cwd=home, log=str(Path(home, "grass.log")))
        return self._proc

    @staticmethod
    def _stable_root(desktop: Desktop, home: str) -> str:
        """home as GRASS is given it. The Data Catalog shows the database's full path, and home is a fresh
        random folder per reset: through a link of fixed name the screen is the same for every reset of one
        task, on every desktop (gymnasium's check_env; a swap reset's second desktop)."""
        return stable_path(desktop, "grass-home", home)

    def close(self) -> None:
        self._disconnect()
        self._proc = None

    def _disconnect(self) -> None:
        for s in (self._conn, self._listener):
            if s is not None:
                s.close()
        self._conn = self._listener = None
        self._buf = b""
        if self._sock:
            try:
                os.unlink(self._sock)
            except OSError:
                pass

    def _accept(self) -> bool:
        """Take the GUI's connection if it has come (only a process of the GUI: its command line runs
        wxgui.py), then close the socket for good. False while it has not come."""
        if self._conn is not None:
            return True
        if self._listener is None:
            raise AppError("GRASS is not launched")
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return False
        pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if b"wxgui.py" not in cmdline:
            conn.close()
            raise AppError(f"the GRASS state socket was reached by a process that is not GRASS's GUI (pid {pid})")
        conn.setblocking(True)
        self._conn = conn
        self._listener.close()
        self._listener = None
        try:
            os.unlink(self._sock or "")
        except OSError:
            pass
        return True

    def _alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            log = ""
            if self.home:
                try:
                    log = Path(self.home, "grass.log").read_text(errors="replace")[-600:]
                except OSError:
                    pass
            raise AppError(f"GRASS exited with code {self._proc.returncode}; its log ends: {log}")

    def request(self, req: dict, timeout: float = 10.0) -> dict:
        """One request to the state server inside the GUI (see guistate.py), on its one connection. A reply
        that comes after its request timed out is recognised by its id and dropped."""
        if not self._accept():
            raise AppError("GRASS's GUI has not connected its state server yet")
        self._serial += 1
        serial = self._serial
        conn = self._conn
        conn.settimeout(timeout)
        deadline = time.monotonic() + timeout
        conn.sendall((json.dumps({**req, "id": serial}) + "\n").encode())
        while True:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout(f"GRASS's state server did not answer {req.get('op')!r} within {timeout}s")
                conn.settimeout(left)
                chunk = conn.recv(1 << 20)
                if not chunk:
                    raise ConnectionError("GRASS's state server closed its connection")
                self._buf += chunk
            line, self._buf = self._buf.split(b"\n", 1)
            reply = json.loads(line)
            if reply.get("id") == serial:
                break
        if not reply.get("ok"):
            raise AppError(f"GRASS GUI state server: {reply.get('error')}")
        return reply

    def ready(self, desktop: Desktop) -> bool:
        self._alive()
        if not any(w.title.endswith("GRASS GIS") and w.width >= desktop.width * 0.9 for w in desktop.windows()):
            return False
        try:
            ping = self.request({"op": "ping"}, timeout=2)
            if not ping.get("ready") or ping.get("rendering"):
                self._quick = 0
                return False
            if not self._splash_closed:
                self.request({"op": "close_splash"}, timeout=2)
                self._splash_closed = True
            # After its windows show, the GUI goes on filling its catalog and tool trees; input sent then
            # is handled seconds later. Ready once the GUI thread answers promptly several times in a row.
            t0 = time.monotonic()
            self.request({"op": "ping"}, timeout=2)
            self._quick = self._quick + 1 if time.monotonic() - t0 < QUICK_ANSWER else 0
            return self._quick >= QUICK_ANSWERS
        except (OSError, ValueError, AppError):
            return False

    # ------------------------------------------------------------------------------------ state
    def state(self, desktop: Desktop, busy_timeout: float = 60.0) -> dict[str, Any]:
        """The GUI's state, read once the commands it started have finished (so `db` checks see their data)."""
        self._alive()
        try:
            deadline = time.monotonic() + busy_timeout
            while self.request({"op": "ping"}).get("busy") and time.monotonic() < deadline:
                time.sleep(0.05)
            st = self.request({"op": "state"})["state"]
        except (OSError, ValueError) as e:
            raise AppError(f"cannot read GRASS's GUI state: {e}") from None
        st["database"] = {"gisdbase": self.gisdbase, "location": self.location, "mapset": self.mapset}
        # by-name views for checks (a layer added twice: the topmost)
        st["layer"] = {}
        for layer in st.get("layers", []):
            st["layer"].setdefault(layer.get("name"), layer)
        return st

    # ------------------------------------------------------------------------------------ a11y
    def a11y_text(self, desktop: Desktop) -> str:
        """role | name | x,y,w,h for what is on screen: AT-SPI's showing menus/toolbar buttons, then the
        Layer Manager's layers (custom-drawn, so from the state server). Bounded to A11Y_ROWS rows."""
        rows: list[str] = ["role\tname\tbox"]
        try:
            client = desktop.a11y()
            try:
                rows += self._a11y_rows(client)
            finally:
                client.close()
        except Exception as e:  # a11y is an observation aid: its absence must not end the episode
            rows.append(f"(accessibility unavailable: {type(e).__name__})")
        try:
            for layer in self.request({"op": "layer_boxes"}, timeout=2).get("layers", []):
                box = ",".join(str(v) for v in layer["box"]) if layer.get("box") else ""
                mark = "[x]" if layer.get("checked") else "[ ]"
                rows.append(f"layer\t{mark} {layer.get('label')}\t{box}")
        except (OSError, ValueError, AppError):
            pass
        return "\n".join(rows[: A11Y_ROWS + 1])

    _a11y_name: str | None = None

    def _a11y_rows(self, client) -> list[str]:
        """The showing widgets AT-SPI knows of (menus, toolbar buttons, tabs, text fields), through the
        A11ySource API only (so a VM's reader works too): states and boxes come with the tree read."""
        names = [self._a11y_name] if self._a11y_name else list(A11Y_APP_NAMES)
        for name in names:
            root = client.app_tree(name, skip_roles=_A11Y_SKIP, details_roles=_A11Y_ROLES)
            if root is None:
                continue
            self._a11y_name = name
            out = []
            for n in root.walk():
                if n.role not in _A11Y_ROLES or not n.name or not n.extents or "showing" not in (n.states or ()):
                    continue
                x, y, w, h = n.extents
                if w > 0 and h > 0:
                    out.append(f"{n.role}\t{n.name[:80]}\t{x},{y},{w},{h}")
                    if len(out) >= A11Y_ROWS:
                        break
            return out
        return []


def run_query(
    desktop: Desktop, home: str | None, database: dict, module: str, args: list[str], timeout: float = 60.0
) -> str:
    """Run one GRASS module on the episode's location in a throwaway mapset (`--tmp-mapset`, so the GUI's
    lock on its mapset stays); its stdout. `module`/`args` must already be whitelisted (checks.py): no
    shell, no output options.

    It runs sealed like the app (as the app's user, so what it leaves in the location is the app's to change),
    able to write only the episode's home (the throwaway mapset) and a HOME of its own in the desktop's folder,
    which the app cannot see: GRASS reads start-up files from HOME, and the app's home is the agent's to
    write. On a VM (no desktop folder) HOME is a folder in the episode's home, as before."""
    if desktop.tmpdir and home:
        qhome = tempfile.mkdtemp(prefix="check-grass-", dir=desktop.tmpdir)
    else:
        qhome = str(Path(home or "/tmp", ".cache", "coda-grass-query"))
        os.makedirs(qhome, exist_ok=True)
    env = [f"{k}={v}" for k, v in data.grass_env(qhome, qhome).items()]
    argv = [
        "env",
        *env,
        "grass",
        "--tmp-mapset",
        str(Path(database["gisdbase"], database["location"])),
        "--exec",
        module,
        *args,
    ]
    try:
        r = desktop.run(argv, timeout=timeout, writable=[qhome, home] if desktop.tmpdir and home else None)
    except subprocess.TimeoutExpired:
        raise AppError(f"GRASS query {module} took over {timeout}s") from None
    finally:
        if desktop.tmpdir and home:
            shutil.rmtree(qhome, ignore_errors=True)
    out = r.stdout.decode(errors="replace") if isinstance(r.stdout, bytes) else (r.stdout or "")
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace") if isinstance(r.stderr, bytes) else (r.stderr or "")
        raise AppError(f"GRASS query {module} {' '.join(args)} failed (code {r.returncode}): {err[-500:]}")
    return out
