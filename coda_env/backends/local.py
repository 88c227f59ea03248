"""The local backend: a private X desktop on this machine.

One `LocalDesktop` is one Xvfb (display number picked by Xvfb itself through `-displayfd`), a window manager
(openbox, main windows maximized), a private D-Bus session with the AT-SPI accessibility bus, XTest input
bound to that display only, and MIT-SHM screenshots into numpy (through `mss`).

No orphans: every process carries a per-desktop token in its environment and lives in a process group we
own; `stop()`, garbage collection, and a watchdog process (which notices when its parent dies, however it
dies, because its stdin pipe closes) all kill by group and then sweep /proc for the token.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..actions import Action
from .base import DesktopError, Window

if TYPE_CHECKING:
    from ..a11y import A11yClient

TOKEN_VAR = "CODA_DESKTOP_TOKEN"

# pyautogui key name -> X keysym name (single printable characters map through their code point).
_KEYSYMS = {
    "enter": "Return", "tab": "Tab", "esc": "Escape", "backspace": "BackSpace", "delete": "Delete",
    "space": "space", "up": "Up", "down": "Down", "left": "Left", "right": "Right", "home": "Home",
    "end": "End", "pageup": "Prior", "pagedown": "Next", "insert": "Insert", "ctrl": "Control_L",
    "ctrlleft": "Control_L", "ctrlright": "Control_R", "shift": "Shift_L", "shiftleft": "Shift_L",
    "shiftright": "Shift_R", "alt": "Alt_L", "altleft": "Alt_L", "altright": "Alt_R", "option": "Alt_L",
    "optionleft": "Alt_L", "optionright": "Alt_R", "win": "Super_L", "winleft": "Super_L",
    "winright": "Super_R", "command": "Super_L", "super": "Super_L", "capslock": "Caps_Lock",
    "numlock": "Num_Lock", "scrolllock": "Scroll_Lock", "printscreen": "Print", "prtsc": "Print",
    "prtscr": "Print", "prntscrn": "Print", "print": "Print", "pause": "Pause", "apps": "Menu",
    "menu": "Menu", "clear": "Clear", "help": "Help", "select": "Select", "execute": "Execute",
    "add": "KP_Add", "subtract": "KP_Subtract", "multiply": "KP_Multiply", "divide": "KP_Divide",
    "decimal": "KP_Decimal", "separator": "KP_Separator", "volumeup": "XF86AudioRaiseVolume",
    "volumedown": "XF86AudioLowerVolume", "volumemute": "XF86AudioMute", "playpause": "XF86AudioPlay",
    "nexttrack": "XF86AudioNext", "prevtrack": "XF86AudioPrev", "stop": "XF86AudioStop",
    "browserback": "XF86Back", "browserforward": "XF86Forward", "browserrefresh": "XF86Refresh",
    "browserhome": "XF86HomePage", "browsersearch": "XF86Search", "launchmail": "XF86Mail",
    "fn": "XF86WakeUp",
}
_KEYSYMS.update({f"f{i}": f"F{i}" for i in range(1, 25)})
_KEYSYMS.update({f"num{i}": f"KP_{i}" for i in range(10)})
_BUTTONS = {"left": 1, "middle": 2, "right": 3}


@dataclass
class LocalConfig:
    """How to build the desktop. Defaults give the 1280x800 screen of the ScienceBoard tasks."""
    width: int = 1280
    height: int = 800
    window_manager: bool = True
    maximize_windows: bool = True
    accessibility: bool = True
    start_timeout: float = 10.0


def _proc_has_token(pid: int, token: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return token in f.read()
    except OSError:
        return False


def kill_everything(token: str, pgids: Sequence[int] = (), grace: float = 1.0) -> None:
    """SIGTERM our process groups, wait up to `grace`, SIGKILL what remains, then sweep /proc by token."""
    me = os.getpid()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in pgids:
            try:
                os.killpg(g, sig)
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


def _cleanup(token: str, pgids: list[int], watchdog: subprocess.Popen | None, tmpdir: str,
             display: int | None) -> None:
    kill_everything(token, pgids)
    if watchdog is not None and watchdog.poll() is None:
        watchdog.kill()
        watchdog.wait()
    if display is not None:  # a SIGKILLed Xvfb leaves its lock behind
        for p in (f"/tmp/.X{display}-lock", f"/tmp/.X11-unix/X{display}"):
            try:
                os.unlink(p)
            except OSError:
                pass
    shutil.rmtree(tmpdir, ignore_errors=True)


class LocalDesktop:
    """A private X desktop (Xvfb + openbox + D-Bus/AT-SPI) driven through XTest and MIT-SHM."""

    capabilities = frozenset({"a11y"})
    app_timeout = 30.0

    def __init__(self, config: LocalConfig | None = None):
        self.config = config or LocalConfig()
        self.width, self.height = self.config.width, self.config.height
        self.token = uuid.uuid4().hex
        self.display: int | None = None
        self.env: dict[str, str] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._pgids: list[int] = []
        self._xlib = None
        self._shot = None
        self._tmp = tempfile.mkdtemp(prefix="coda-desktop-")
        self._watchdog: subprocess.Popen | None = None
        self._finalizer = weakref.finalize(self, _cleanup, self.token, self._pgids, None, self._tmp, None)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.alive():
            return
        self.stop()
        self._tmp = tempfile.mkdtemp(prefix="coda-desktop-")
        runtime = Path(self._tmp, "runtime")
        runtime.mkdir(mode=0o700)
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("DBUS_", "XDG_", "WAYLAND"))}
        base_env.update({TOKEN_VAR: self.token, "XDG_RUNTIME_DIR": str(runtime), "NO_AT_BRIDGE": "0"})
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "coda_env.backends.local", "--watchdog", self.token],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env={k: v for k, v in base_env.items() if k != TOKEN_VAR},
            cwd=str(Path(__file__).resolve().parents[2]))
        deadline = time.monotonic() + self.config.start_timeout
        try:
            self._start_xvfb(base_env, deadline)
            base_env["DISPLAY"] = f":{self.display}"
            self.env = base_env
            self._connect()
            if self.config.accessibility:
                self._start_dbus(base_env, deadline)
            if self.config.window_manager:
                self._start_wm(deadline)
        except Exception:
            self.stop()
            raise
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _cleanup, self.token, self._pgids, self._watchdog,
                                           self._tmp, self.display)
        if self._watchdog.stdin:
            self._watchdog.stdin.write(f"{self.display}\n".encode())
            self._watchdog.stdin.flush()

    def _popen(self, name: str, argv: Sequence[str], env: dict[str, str], group: int = 0, **kw) -> subprocess.Popen:
        try:
            p = subprocess.Popen(list(argv), env=env, process_group=group, stdin=subprocess.DEVNULL, **kw)
        except FileNotFoundError as e:
            raise DesktopError(f"{argv[0]} is not installed ({e}); run `make setup` to install the desktop "
                               f"packages (xvfb, openbox, dbus, at-spi2-core)") from None
        self._procs[name] = p
        if group == 0:
            self._pgids.append(p.pid)
        return p

    def _start_xvfb(self, env: dict[str, str], deadline: float) -> None:
        r, w = os.pipe()
        log = open(Path(self._tmp, "xvfb.log"), "wb")
        try:
            self._popen("xvfb", ["Xvfb", "-displayfd", str(w), "-screen", "0",
                                 f"{self.width}x{self.height}x24", "-nolisten", "tcp", "-dpi", "96",
                                 "-nocursor"], env, pass_fds=(w,), stdout=log, stderr=log)
        finally:
            os.close(w)
            log.close()
        buf = b""
        try:
            while not buf.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([r], [], [], left)[0]:
                    raise DesktopError(f"Xvfb did not report a display within {self.config.start_timeout}s; "
                                       f"log: {Path(self._tmp, 'xvfb.log').read_text(errors='replace')[-500:]}")
                chunk = os.read(r, 64)
                if not chunk:
                    raise DesktopError("Xvfb exited at start: " +
                                       Path(self._tmp, "xvfb.log").read_text(errors="replace")[-500:])
                buf += chunk
        finally:
            os.close(r)
        self.display = int(buf.strip())

    def _start_dbus(self, env: dict[str, str], deadline: float) -> None:
        p = self._popen("dbus", ["dbus-daemon", "--session", "--nofork", "--print-address=1"], env,
                        group=self._pgids[0], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ready = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]
        line = p.stdout.readline().decode().strip() if ready else ""
        if not line:
            raise DesktopError("dbus-daemon did not print its address")
        env["DBUS_SESSION_BUS_ADDRESS"] = line
        env["QT_LINUX_ACCESSIBILITY_ALWAYS_ON"] = "1"
        env["QT_ACCESSIBILITY"] = "1"
        env["GTK_MODULES"] = "gail:atk-bridge"
        self._popen("atspi", ["/usr/libexec/at-spi-bus-launcher", "--launch-immediately"], env,
                    group=self._pgids[0], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from ..a11y import A11yClient, enable_accessibility
        while True:
            try:
                enable_accessibility(line)
                # Activate the registry now: a toolkit that starts while registryd is still being
                # activated may never register its application.
                client = A11yClient(line)
                client.applications()
                client.close()
                break
            except Exception as e:  # the launcher has not claimed org.a11y.Bus yet
                if time.monotonic() > deadline:
                    raise DesktopError(f"the AT-SPI bus did not come up: {e}") from None
                time.sleep(0.01)

        # Toolkits that find the bus address on the root window connect at once and deterministically
        # (Qt reads AT_SPI_BUS before it asks the session bus; that path also works as root).
        from Xlib import Xatom
        from ..a11y import bus_address
        root = self._xlib.screen().root
        root.change_property(self._xlib.intern_atom("AT_SPI_BUS"), Xatom.STRING, 8,
                             bus_address(line).encode())
        self._xlib.sync()

    def _start_wm(self, deadline: float) -> None:
        rc = Path("/etc/xdg/openbox/rc.xml")
        text = rc.read_text() if rc.exists() else '<openbox_config xmlns="http://openbox.org/3.4/rc"><applications></applications></openbox_config>'
        if self.config.maximize_windows:
            rule = '<application type="normal"><maximized>true</maximized><focus>yes</focus></application>'
            text = re.sub(r"</applications>", rule + "</applications>", text, count=1)
        cfg = Path(self._tmp, "openbox-rc.xml")
        cfg.write_text(text)
        self._popen("wm", ["openbox", "--sm-disable", "--config-file", str(cfg)], self.env,
                    group=self._pgids[0], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        atom = self._xlib.intern_atom("_NET_SUPPORTING_WM_CHECK")
        root = self._xlib.screen().root
        while root.get_full_property(atom, 0) is None:
            if time.monotonic() > deadline or self._procs["wm"].poll() is not None:
                raise DesktopError("the window manager (openbox) did not start")
            time.sleep(0.005)

    def _connect(self) -> None:
        from Xlib import display as xdisplay
        import mss
        self._xlib = xdisplay.Display(f":{self.display}")
        self._shot = mss.MSS(display=f":{self.display}")
        self._monitor = {"left": 0, "top": 0, "width": self.width, "height": self.height}

    def stop(self) -> None:
        for conn in (self._shot, self._xlib):
            try:
                if conn is not None:
                    conn.close()
            except Exception:
                pass
        self._shot = self._xlib = None
        self._finalizer()  # runs _cleanup once
        for p in self._procs.values():
            try:
                p.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        self._pgids.clear()
        self._watchdog = None
        self.display = None

    close = stop

    def alive(self) -> bool:
        x = self._procs.get("xvfb")
        return x is not None and x.poll() is None and self._xlib is not None

    def _check(self) -> None:
        if not self.alive():
            raise DesktopError("the X server (Xvfb) of this desktop is not running")

    # ---------------------------------------------------------------- observation
    def screenshot(self) -> np.ndarray:
        self._check()
        try:
            shot = self._shot.grab(self._monitor)
        except Exception as e:
            raise DesktopError(f"screenshot failed: {e}") from None
        bgra = np.frombuffer(shot.raw, np.uint8).reshape(self.height, self.width, 4)
        # Three plane copies are ~5x faster than one reversed-stride copy (bgra[..., 2::-1].copy()).
        rgb = np.empty((self.height, self.width, 3), np.uint8)
        rgb[..., 0] = bgra[..., 2]
        rgb[..., 1] = bgra[..., 1]
        rgb[..., 2] = bgra[..., 0]
        return rgb

    def windows(self) -> list[Window]:
        self._check()
        d = self._xlib
        root = d.screen().root
        try:
            prop = root.get_full_property(d.intern_atom("_NET_CLIENT_LIST"), 0)
            out = []
            for wid in (prop.value if prop else []):
                w = d.create_resource_object("window", wid)
                cls = w.get_wm_class() or ("", "")
                name = w.get_full_property(d.intern_atom("_NET_WM_NAME"), 0)
                title = name.value.decode(errors="replace") if name and isinstance(name.value, bytes) else (w.get_wm_name() or "")
                g = w.get_geometry()
                pos = w.translate_coords(root, 0, 0)
                out.append(Window(int(wid), cls[1] or cls[0], str(title), -pos.x, -pos.y, g.width, g.height))
            return out
        except Exception as e:  # a window vanished under us, or the server died
            if not self.alive():
                raise DesktopError(f"the X server died: {e}") from None
            return []

    # ---------------------------------------------------------------- input
    def input(self, action: Action) -> None:
        self._check()
        from Xlib import X
        from Xlib.ext import xtest
        d, k = self._xlib, action.kind
        try:
            if k != "drag" and (action.x is not None or action.y is not None):
                self._move(action.x, action.y)
            if k == "move":
                pass
            elif k == "click":
                b = _BUTTONS[action.button]
                for _ in range(action.clicks):
                    xtest.fake_input(d, X.ButtonPress, b)
                    xtest.fake_input(d, X.ButtonRelease, b)
            elif k == "mouse_down":
                xtest.fake_input(d, X.ButtonPress, _BUTTONS[action.button])
            elif k == "mouse_up":
                xtest.fake_input(d, X.ButtonRelease, _BUTTONS[action.button])
            elif k == "drag":
                self._drag(action)
            elif k in ("scroll", "hscroll"):
                up, down = (4, 5) if k == "scroll" else (7, 6)
                b = up if action.amount > 0 else down
                for _ in range(abs(action.amount)):
                    xtest.fake_input(d, X.ButtonPress, b)
                    xtest.fake_input(d, X.ButtonRelease, b)
            elif k == "type":
                for ch in action.text:
                    self._tap_char(ch)
            elif k == "press":
                for _ in range(action.presses):
                    for key in action.keys:
                        self._key(key, True)
                        self._key(key, False)
            elif k == "hotkey":
                for key in action.keys:
                    self._key(key, True)
                for key in reversed(action.keys):
                    self._key(key, False)
            elif k == "key_down":
                for key in action.keys:
                    self._key(key, True)
            elif k == "key_up":
                for key in action.keys:
                    self._key(key, False)
            elif k == "sleep":
                d.sync()
                time.sleep(action.seconds)  # the agent asked for this wait
            elif k in ("wait", "done", "fail", "answer"):
                pass
            else:
                raise ValueError(f"unknown action kind {k!r}")
            d.sync()
        except DesktopError:
            raise
        except (OSError, ConnectionError) as e:
            raise DesktopError(f"lost the X connection: {e}") from None
        except Exception as e:
            if not self.alive():
                raise DesktopError(f"the X server died during input: {e}") from None
            raise

    def release_all(self) -> None:
        """Release the modifier keys and mouse buttons an action may have left down."""
        if not self.alive():
            return
        from Xlib import X
        from Xlib.ext import xtest
        d = self._xlib
        for b in _BUTTONS.values():
            xtest.fake_input(d, X.ButtonRelease, b)
        for key in ("shift", "shiftright", "ctrl", "ctrlright", "alt", "altright", "win", "winright"):
            try:
                xtest.fake_input(d, X.KeyRelease, self._keycode(self._keysym(key))[0])
            except ValueError:
                pass
        d.sync()

    def _move(self, x: int | None, y: int | None) -> None:
        from Xlib import X
        from Xlib.ext import xtest
        if x is None or y is None:
            p = self._xlib.screen().root.query_pointer()
            x = p.root_x if x is None else x
            y = p.root_y if y is None else y
        xtest.fake_input(self._xlib, X.MotionNotify, x=int(x), y=int(y))

    def _drag(self, a: Action) -> None:
        from Xlib import X
        from Xlib.ext import xtest
        d = self._xlib
        p = d.screen().root.query_pointer()
        x0, y0 = p.root_x, p.root_y
        b = _BUTTONS[a.button]
        xtest.fake_input(d, X.ButtonPress, b)
        d.sync()
        steps = 12  # toolkits start a drag only after several motion events
        for i in range(1, steps + 1):
            xtest.fake_input(d, X.MotionNotify, x=round(x0 + (a.x - x0) * i / steps),
                             y=round(y0 + (a.y - y0) * i / steps))
            d.sync()
            time.sleep(max(a.seconds, 0.06) / steps)
        xtest.fake_input(d, X.ButtonRelease, b)

    def _keycode(self, keysym: int) -> tuple[int, bool]:
        """(keycode, needs shift) for a keysym, remapping a spare keycode if the keymap lacks it."""
        d = self._xlib
        for kc, index in d.keysym_to_keycodes(keysym):
            if index in (0, 1):
                return kc, index == 1
        raise ValueError(f"keysym {keysym:#x} is not on the keyboard map")

    def _keysym(self, key: str) -> int:
        from Xlib import XK
        name = _KEYSYMS.get(key)
        ks = XK.string_to_keysym(name) if name else (ord(key) if len(key) == 1 else 0)
        if not ks:
            raise ValueError(f"no X keysym for key {key!r}")
        return ks

    def _key(self, key: str, down: bool) -> None:
        from Xlib import X
        from Xlib.ext import xtest
        kc, shift = self._keycode(self._keysym(key))
        if shift and down:
            xtest.fake_input(self._xlib, X.KeyPress, self._keycode(self._keysym("shift"))[0])
        xtest.fake_input(self._xlib, X.KeyPress if down else X.KeyRelease, kc)
        if shift and not down:
            xtest.fake_input(self._xlib, X.KeyRelease, self._keycode(self._keysym("shift"))[0])

    def _tap_char(self, ch: str) -> None:
        key = {"\n": "enter", "\t": "tab", " ": "space"}.get(ch, ch)
        self._key(key, True)
        self._key(key, False)

    # ---------------------------------------------------------------- processes and files
    def spawn(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None,
              log: str | None = None) -> subprocess.Popen:
        self._check()
        full = dict(self.env)
        full.update(env or {})
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            p = self._popen(f"app-{len(self._procs)}", argv, full, group=0, cwd=cwd, stdout=out,
                            stderr=subprocess.STDOUT)
        finally:
            if log:
                out.close()
        return p

    def kill_group(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        if proc.pid in self._pgids:
            self._pgids.remove(proc.pid)
        for name, p in list(self._procs.items()):
            if p is proc:
                del self._procs[name]

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        self._check()
        return subprocess.run(list(argv), env=self.env, capture_output=True, timeout=timeout)

    def a11y(self) -> "A11yClient":
        """A connection to this desktop's AT-SPI bus (the caller closes it)."""
        from ..a11y import A11yClient
        address = self.env.get("DBUS_SESSION_BUS_ADDRESS")
        if not address:
            raise DesktopError("this desktop is not started: it has no accessibility bus yet")
        return A11yClient(address)

    def read_file(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def http_get(self, port: int, path: str, timeout: float = 10.0) -> bytes:
        """GET http://127.0.0.1:port/path (an app's own server on this machine)."""
        import urllib.error
        import urllib.request
        if not (isinstance(port, int) and 0 < port < 65536) or not path.startswith("/"):
            raise ValueError(f"bad local URL port {port!r} path {path!r}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
                return r.read()
        except (urllib.error.URLError, OSError) as e:
            raise DesktopError(f"GET http://127.0.0.1:{port}{path} failed: {e}") from None

    def write_file(self, path: str, data: bytes) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)

    @property
    def tmpdir(self) -> str:
        return self._tmp

    def pids(self) -> list[int]:
        """Every live process of this desktop (for tests and diagnostics)."""
        needle = f"{TOKEN_VAR}={self.token}".encode()
        return [int(e) for e in os.listdir("/proc") if e.isdigit() and _proc_has_token(int(e), needle)]


def _watchdog_main(token: str) -> None:
    """Block on stdin; when the parent is gone (EOF), kill everything that carries the token."""
    display = None
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for line in sys.stdin.buffer:
        if line.strip().isdigit():
            display = int(line.strip())
    pgids = []
    needle = f"{TOKEN_VAR}={token}".encode()
    for e in os.listdir("/proc"):
        if e.isdigit() and _proc_has_token(int(e), needle):
            try:
                pgids.append(os.getpgid(int(e)))
            except ProcessLookupError:
                pass
    _cleanup(token, sorted(set(pgids)), None, tempfile.gettempdir() + "/nonexistent-coda", display)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--watchdog":
    _watchdog_main(sys.argv[2])
