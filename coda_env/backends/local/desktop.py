"""LocalDesktop: Xvfb + openbox + the desktop's buses, its apps sealed (sandbox.py)."""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from ...actions import ActionError
from ..base import SHOWN_LINKS, DesktopError, Window, make_temp_dir
from . import sandbox as sb
from .deadline import _Deadline, _xcb_socket
from .processes import TOKEN_VAR, _cleanup, _proc_state, token_pids
from .xinput import XInput

if TYPE_CHECKING:
    from ...a11y import A11yClient

# The parts a desktop starts, by their key in `_procs`, and what an error calls them.
_PARTS = (
    ("xvfb", "the X server (Xvfb)"),
    ("wm", "the window manager (openbox)"),
    ("dbus", "the session bus (dbus-daemon)"),
    ("atspi", "the accessibility bus (its dbus-daemon)"),
)

# The desktop's two buses, with configurations of our own: sockets in the desktop's private runtime folder
# (bound read-only into the apps' sandboxes, which run as another user: hence `allow user="*"`; only what
# can reach the socket file can connect), and no activation on the session bus at all, so that no app can
# have a service started on its behalf outside its sandbox. The accessibility bus activates only AT-SPI's
# registry (Debian's accessibility-services folder), as at-spi-bus-launcher's own configuration does.
_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>{type}</type>
  <listen>unix:dir={dir}</listen>
  <auth>EXTERNAL</auth>
  {servicedir}
  <policy context="default">
    <allow user="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""
A11Y_SERVICES = "/usr/share/dbus-1/accessibility-services"
# openbox: Debian's stock look, with nothing that runs a program or hides the app (see _openbox_rc).
_OPENBOX_MENU = """<?xml version="1.0" encoding="UTF-8"?>
<openbox_menu xmlns="http://openbox.org/3.4/menu"></openbox_menu>
"""


@dataclass
class LocalConfig:
    """How to build the desktop. Defaults give the 1280x800 screen of the ScienceBoard tasks.

    `x_timeout`: the most seconds one X call (an input action's own pauses not counted) may take before the
    X server counts as frozen: the call fails with DesktopError and the desktop must be rebuilt."""

    width: int = 1280
    height: int = 800
    window_manager: bool = True
    maximize_windows: bool = True
    accessibility: bool = True
    start_timeout: float = 10.0
    x_timeout: float = 5.0
    sandbox: bool = True
    sandbox_uid: int = sb.SandboxConfig.uid


def _openbox_rc(stock: str, menu: str, rules: str) -> str:
    """Debian's openbox configuration (its theme and layout, so the screen looks as before) without what
    would let an agent out or away from the app: no key bindings (they run programs, switch desktops, exit),
    no mouse binding that runs a program, shows the root menu or switches desktops, one desktop, and a menu
    file of ours that is empty."""
    text = re.sub(r"<!--.*?-->", "", stock, flags=re.S)
    text = re.sub(r"<keyboard>.*?</keyboard>", "<keyboard></keyboard>", text, flags=re.S)
    text = re.sub(
        r"<mousebind\b[^>]*>(?:(?!</mousebind>).)*?(?:Execute|GoToDesktop|root-menu|Exit|Restart|"
        r"SendToDesktop|client-list-combined-menu)(?:(?!</mousebind>).)*</mousebind>",
        "",
        text,
        flags=re.S,
    )
    text = re.sub(r"^<menu>.*?^</menu>", f"<menu><file>{menu}</file></menu>", text, count=1, flags=re.S | re.M)
    text = re.sub(r"<number>\d+</number>", "<number>1</number>", text, count=1)
    if "<applications>" not in text:
        text = text.replace("</openbox_config>", "<applications></applications></openbox_config>")
    return text.replace("</applications>", rules + "</applications>", 1)


class LocalDesktop(XInput):
    """A private X desktop (Xvfb + openbox + D-Bus/AT-SPI) driven through XTest and MIT-SHM."""

    capabilities = frozenset({"a11y"})
    app_timeout = 30.0

    @property
    def shown_links(self) -> bool:
        """Whether its sealed apps see the desktop's links of fixed name at SHOWN_LINKS (base.stable_path)."""
        return self.sandbox.enabled

    def __init__(self, config: LocalConfig | None = None):
        self.config = config or LocalConfig()
        self.sandbox = sb.SandboxConfig(enabled=self.config.sandbox, uid=self.config.sandbox_uid)
        if self.sandbox.enabled:
            why = sb.probe(self.sandbox.uid)
            if why is not None:
                raise DesktopError(f"apps cannot run sealed on this machine: {why}")
        self._sealed: list[tuple[subprocess.Popen, str]] = []  # (bwrap process, home) of each sealed app
        self._handed: set[str] = set()  # folders given to the sandboxes' user
        self.width, self.height = self.config.width, self.config.height
        self.token = uuid.uuid4().hex
        self.display: int | None = None
        self.env: dict[str, str] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._pgids: list[int] = []
        self._xlib = None
        self._shot = None
        self._tmp: str | None = None
        self._watchdog: subprocess.Popen | None = None
        self._deadline = _Deadline()
        self._broken: str | None = None  # why the X connection is unusable (cut at a deadline, closed)
        self._a11y_bus: int | None = None  # pid of the accessibility bus's dbus-daemon (the launcher's child)
        self._held_keys: dict[int, str] = {}  # keycode -> key name, for what input() holds down
        self._held_buttons: set[int] = set()
        self._bound: OrderedDict[int, int] = OrderedDict()  # keysym -> spare keycode it was bound to (LRU order)
        self._spare: list[int] = []  # keycodes with no keysyms in the server's map
        self._finalizer = weakref.finalize(self, _cleanup, self.token, self._pgids, None, None, None, self._deadline)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self.alive():
            return
        self.stop()
        self._tmp = make_temp_dir("coda-desktop-", what="the desktop's folder")
        try:
            runtime = Path(self._tmp, "runtime")
            runtime.mkdir(mode=0o700)
        except OSError as e:
            folder, self._tmp = self._tmp, None
            shutil.rmtree(folder, ignore_errors=True)
            raise DesktopError(_disk_error(folder, e)) from None
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("DBUS_", "XDG_", "WAYLAND"))}
        base_env.update({TOKEN_VAR: self.token, "XDG_RUNTIME_DIR": str(runtime), "NO_AT_BRIDGE": "0"})
        # The watchdog is told the folder up front: it removes it however this process ends.
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "coda_env.backends.local", "--watchdog", self.token, self._tmp],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={k: v for k, v in base_env.items() if k != TOKEN_VAR},
            cwd=str(Path(__file__).resolve().parents[3]),
        )
        self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _cleanup, self.token, self._pgids, self._watchdog, self._tmp, None, self._deadline
        )
        deadline = time.monotonic() + self.config.start_timeout
        try:
            self._start_xvfb(base_env, deadline)
            base_env["DISPLAY"] = f":{self.display}"
            self.env = base_env
            self._connect()
            with self._x("starting the desktop", self.config.start_timeout):
                if self.config.accessibility:
                    self._start_dbus(base_env, deadline)
                if self.config.window_manager:
                    self._start_wm(deadline)
        except OSError as e:  # a file of the desktop could not be written (full disk, read-only folder)
            folder = self._tmp or tempfile.gettempdir()
            self.stop()
            raise DesktopError(_disk_error(folder, e)) from None
        except BaseException:
            self.stop()
            raise
        xserver = (self.display, self._procs["xvfb"].pid)  # whose lock and socket are ours to remove
        self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _cleanup, self.token, self._pgids, self._watchdog, self._tmp, xserver, self._deadline
        )
        if self._watchdog.stdin:
            self._watchdog.stdin.write(f"{xserver[0]} {xserver[1]}\n".encode())
            self._watchdog.stdin.flush()

    def _popen(self, name: str, argv: Sequence[str], env: dict[str, str], group: int = 0, **kw) -> subprocess.Popen:
        try:
            p = subprocess.Popen(list(argv), env=env, process_group=group, stdin=subprocess.DEVNULL, **kw)
        except FileNotFoundError as e:
            raise DesktopError(
                f"{argv[0]} is not installed ({e}); run `make setup` to install the desktop "
                f"packages (xvfb, openbox, dbus, at-spi2-core)"
            ) from None
        self._procs[name] = p
        if group == 0:
            self._pgids.append(p.pid)
        return p

    def _start_xvfb(self, env: dict[str, str], deadline: float) -> None:
        r, w = os.pipe()
        log = open(Path(self._tmp, "xvfb.log"), "wb")
        try:
            self._popen(
                "xvfb",
                [
                    "Xvfb",
                    "-displayfd",
                    str(w),
                    "-screen",
                    "0",
                    f"{self.width}x{self.height}x24",
                    "-nolisten",
                    "tcp",
                    "-dpi",
                    "96",
                    "-nocursor",
                ],
                env,
                pass_fds=(w,),
                stdout=log,
                stderr=log,
            )
        finally:
            os.close(w)
            log.close()
        buf = b""
        try:
            while not buf.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([r], [], [], left)[0]:
                    raise DesktopError(
                        f"Xvfb did not report a display within {self.config.start_timeout}s; "
                        f"log: {Path(self._tmp, 'xvfb.log').read_text(errors='replace')[-500:]}"
                    )
                chunk = os.read(r, 64)
                if not chunk:
                    raise DesktopError(
                        "Xvfb exited at start: " + Path(self._tmp, "xvfb.log").read_text(errors="replace")[-500:]
                    )
                buf += chunk
        finally:
            os.close(r)
        self.display = int(buf.strip())

    def _bus(self, name: str, kind: str, servicedir: str, env: dict[str, str], deadline: float) -> str:
        """Start one dbus-daemon of ours (see _BUS_CONFIG); its address."""
        folder = Path(self._tmp, "runtime", name)
        folder.mkdir(mode=0o700)
        conf = Path(self._tmp, f"{name}.conf")
        conf.write_text(
            _BUS_CONFIG.format(
                type=kind, dir=folder, servicedir=f"<servicedir>{servicedir}</servicedir>" if servicedir else ""
            )
        )
        key = "dbus" if name == "session" else "atspi"
        # umask 0: the socket must be connectable by the sandboxes' user (the folder keeps others out)
        p = self._popen(
            key,
            ["dbus-daemon", f"--config-file={conf}", "--nofork", "--print-address=1"],
            env,
            group=self._pgids[0],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            umask=0,
        )
        ready = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]
        line = p.stdout.readline().decode().strip() if ready else ""
        if not line:
            raise DesktopError(f"dbus-daemon ({name} bus) did not print its address")
        return line

    def bus_sockets(self) -> list[str]:
        """The socket files of this desktop's buses (bound read-only into sandboxes)."""
        out = []
        for key in ("DBUS_SESSION_BUS_ADDRESS", "AT_SPI_BUS_ADDRESS"):
            m = re.search(r"unix:path=([^,;]+)", self.env.get(key, ""))
            if m:
                out.append(m.group(1))
        return out

    def _start_dbus(self, env: dict[str, str], deadline: float) -> None:
        line = self._bus("session", "session", "", env, deadline)
        env["DBUS_SESSION_BUS_ADDRESS"] = line
        env["QT_LINUX_ACCESSIBILITY_ALWAYS_ON"] = "1"
        env["QT_ACCESSIBILITY"] = "1"
        env["GTK_MODULES"] = "gail:atk-bridge"
        a11y = self._bus("a11y", "accessibility", A11Y_SERVICES, env, deadline)
        env["AT_SPI_BUS_ADDRESS"] = a11y
        # Toolkits that find the bus address on the root window (and AT-SPI's registry, activated
        # below) connect at once and deterministically
        # (Qt reads AT_SPI_BUS before it asks the session bus; GTK's atk-bridge reads AT_SPI_BUS_ADDRESS).
        from Xlib import Xatom

        root = self._xlib.screen().root
        root.change_property(self._xlib.intern_atom("AT_SPI_BUS"), Xatom.STRING, 8, a11y.encode())
        self._xlib.sync()
        from ...a11y import A11yClient

        while True:
            try:
                # Activate the registry now: a toolkit that starts while registryd is still being
                # activated may never register its application.
                client = A11yClient(a11y_address=a11y)
                client.applications()
                client.close()
                break
            except Exception as e:  # the registry is not up yet
                if time.monotonic() > deadline:
                    raise DesktopError(f"the AT-SPI bus did not come up: {e}") from None
                time.sleep(0.01)
        self._a11y_bus = self._procs["atspi"].pid

    def _start_wm(self, deadline: float) -> None:
        rules = (
            '<application type="normal"><maximized>true</maximized><focus>yes</focus></application>'
            if self.config.maximize_windows
            else ""
        )
        menu = Path(self._tmp, "openbox-menu.xml")
        menu.write_text(_OPENBOX_MENU)
        cfg = Path(self._tmp, "openbox-rc.xml")
        stock = Path("/etc/xdg/openbox/rc.xml")
        text = (
            stock.read_text()
            if stock.exists()
            else '<openbox_config xmlns="http://openbox.org/3.4/rc"></openbox_config>'
        )
        cfg.write_text(_openbox_rc(text, str(menu), rules))
        argv = ["openbox", "--sm-disable", "--config-file", str(cfg)]
        env = {k: v for k, v in self.env.items() if k in ("DISPLAY", TOKEN_VAR, "PATH")}
        if self.sandbox.enabled:  # the window manager runs sealed too: it needs only the display
            env = sb.sandbox_env(self.sandbox, self.env, {TOKEN_VAR: self.token, "HOME": "/tmp"}, None)
            argv = sb.wrap_argv(
                argv, self.sandbox, writable=(), ro_binds=[self.x_socket(), str(cfg), str(menu)], env=env, cwd="/"
            )
            env = {"PATH": sb.SAFE_PATH, TOKEN_VAR: self.token}
        log = Path(self._tmp, "openbox.log")
        with open(log, "wb") as out:
            self._popen("wm", argv, env, group=self._pgids[0], stdout=out, stderr=subprocess.STDOUT)
        atom = self._xlib.intern_atom("_NET_SUPPORTING_WM_CHECK")
        root = self._xlib.screen().root
        while root.get_full_property(atom, 0) is None:
            code = self._procs["wm"].poll()
            if time.monotonic() > deadline or code is not None:
                said = log.read_bytes()[-400:].decode("utf-8", "replace").strip() if log.exists() else ""
                how = f"exited with code {code}" if code is not None else "timed out"
                raise DesktopError(f"the window manager (openbox) did not start ({how}){': ' + said if said else ''}")
            time.sleep(0.005)

    def x_socket(self) -> str:
        return f"/tmp/.X11-unix/X{self.display}"

    def _connect(self) -> None:
        from Xlib import display as xdisplay
        import mss

        self._xlib = xdisplay.Display(f":{self.display}")
        self._shot = mss.MSS(display=f":{self.display}")
        self._monitor = {"left": 0, "top": 0, "width": self.width, "height": self.height}
        socks = [socket.socket(fileno=os.dup(self._xlib.fileno()))]
        xcb = _xcb_socket(self._shot)
        if xcb is None:
            raise DesktopError(
                "cannot find the socket of mss's X connection (an mss without XCB?): screenshots would have no deadline"
            )
        socks.append(xcb)
        self._deadline.attach(socks)
        self._broken = None
        self._held_keys.clear()
        self._held_buttons.clear()
        self._bound.clear()
        info = self._xlib.display.info
        with self._x("reading the keyboard map"):
            syms = self._xlib.get_keyboard_mapping(info.min_keycode, info.max_keycode - info.min_keycode + 1)
        # keycodes 8 and below are not keys to XKB-based toolkits; the highest ones are the least likely to
        # be produced by any real keyboard layout
        self._spare = sorted(
            (info.min_keycode + i for i, s in enumerate(syms) if not any(s) and info.min_keycode + i > 8), reverse=True
        )

    def stop(self) -> None:
        self._deadline.close()
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
        self._sealed.clear()
        self._handed.clear()
        self._watchdog = None
        self._tmp = None
        self.display = None
        self._a11y_bus = None
        self._held_keys.clear()
        self._held_buttons.clear()

    close = stop

    def health(self, thorough: bool = True) -> str | None:
        """Why this desktop is unusable, naming the part (None when all is well): a part it started that
        exited (or, when `thorough`, is stopped), or an X connection that was cut or closed."""
        if self.display is None or self._xlib is None:
            return "this desktop is not started"
        if self._broken:
            return self._broken
        for key, what in _PARTS:
            p = self._procs.get(key)
            if p is None:
                continue
            if p.poll() is not None:
                return f"{what} of this desktop died (exit code {p.returncode})"
            if thorough and _proc_state(p.pid) in ("T", "t"):
                return f"{what} of this desktop is stopped (SIGSTOP), so it cannot answer"
        if self._a11y_bus is not None and _proc_state(self._a11y_bus) in (None, "Z", "X"):
            return "the accessibility bus (its dbus-daemon) of this desktop died"
        return None

    def alive(self) -> bool:
        return self.health() is None

    def _check(self) -> None:
        why = self.health(thorough=False)
        if why is not None:
            raise DesktopError(why)

    @contextlib.contextmanager
    def _x(self, what: str, extra: float = 0.0) -> Iterator[None]:
        """Run X calls under the deadline; turn a cut or closed connection into DesktopError (and remember
        it, so that `alive()` says the desktop must be rebuilt)."""
        from Xlib import error as xerror

        limit = self.config.x_timeout + extra
        try:
            with self._deadline.arm(limit):
                yield
        except (DesktopError, ActionError):
            raise
        except Exception as e:
            if self._deadline.expired:
                self._broken = (
                    f"the X server (Xvfb) of this desktop did not answer within {limit:g}s while "
                    f"{what}: it is frozen or badly overloaded"
                )
                raise DesktopError(self._broken) from None
            why = self.health(thorough=False)  # a part that died says more than the error it caused
            if why is not None:
                raise DesktopError(why) from None
            if isinstance(e, (xerror.ConnectionClosedError, OSError, ConnectionError)) or self._conn_lost():
                self._broken = f"the desktop's X connection was closed while {what}: {e}"
                raise DesktopError(self._broken) from None
            raise DesktopError(f"the X server refused {what}: {type(e).__name__}: {e}") from None
        if self._deadline.expired:  # the call returned, but only after the connections were cut
            self._broken = (
                f"the X server (Xvfb) of this desktop did not answer within {limit:g}s while "
                f"{what}: it is frozen or badly overloaded"
            )
            raise DesktopError(self._broken)

    def _conn_lost(self) -> bool:
        x = self._xlib
        return x is None or getattr(x.display, "socket_error", None) is not None

    # ---------------------------------------------------------------- observation
    def screenshot(self) -> np.ndarray:
        self._check()
        try:
            with self._x("taking a screenshot"):
                shot = self._shot.grab(self._monitor)
        except DesktopError:
            raise
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
        from Xlib import error as xerror

        d = self._xlib
        with self._x("listing windows"):
            root = d.screen().root
            prop = root.get_full_property(d.intern_atom("_NET_CLIENT_LIST"), 0)
            out = []
            for wid in prop.value if prop else []:
                w = d.create_resource_object("window", wid)
                try:
                    cls = w.get_wm_class() or ("", "")
                    name = w.get_full_property(d.intern_atom("_NET_WM_NAME"), 0)
                    title = (
                        name.value.decode(errors="replace")
                        if name and isinstance(name.value, bytes)
                        else (w.get_wm_name() or "")
                    )
                    g = w.get_geometry()
                    pos = w.translate_coords(root, 0, 0)
                except xerror.XError:  # it vanished under us
                    continue
                out.append(Window(int(wid), cls[1] or cls[0], str(title), -pos.x, -pos.y, g.width, g.height))
            return out

    # ---------------------------------------------------------------- processes and files
    def spawn(
        self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None, log: str | None = None
    ) -> subprocess.Popen:
        """Start an app. Sealed (the default; see sandbox.py): its HOME, which must be a folder in
        this desktop's folder, is the only place it can write, and it sees nothing else of this machine."""
        self._check()
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            if not self.sandbox.enabled:
                full = dict(self.env)
                full.update(env or {})
                p = self._popen(
                    f"app-{len(self._procs)}", argv, full, group=0, cwd=cwd, stdout=out, stderr=subprocess.STDOUT
                )
            else:
                home = (env or {}).get("HOME")
                if not home or not self._inside(home):
                    raise DesktopError(
                        f"a sealed app needs its HOME in this desktop's folder {self._tmp} (got {home!r})"
                    )
                wrapped, outer = self._seal(argv, [home], {**(env or {}), TOKEN_VAR: self.token}, cwd or home)
                p = self._popen(
                    f"app-{len(self._procs)}", wrapped, outer, group=0, stdout=out, stderr=subprocess.STDOUT
                )
                self._sealed.append((p, home))
        finally:
            if log:
                out.close()
        return p

    def _inside(self, path: str) -> bool:
        return bool(self._tmp) and os.path.realpath(path).startswith(os.path.realpath(self._tmp) + os.sep)

    def _seal(
        self, argv: Sequence[str], writable: Sequence[str], env: dict[str, str], cwd: str
    ) -> tuple[list[str], dict[str, str]]:
        """(bwrap command line, the environment of bwrap itself) for a sealed program."""
        if writable:
            os.makedirs(os.path.join(writable[0], sb.RUNTIME), mode=0o700, exist_ok=True)
        sb.hand_over(writable, self.sandbox.uid)
        self._handed.update(os.path.realpath(w) for w in writable)
        full = sb.sandbox_env(self.sandbox, self.env, env, writable[0] if writable else None)
        links = {}
        if self._tmp:  # the desktop's links of fixed name into a home (stable paths on screen) work inside
            for entry in os.scandir(self._tmp):
                if entry.is_symlink():
                    target = os.readlink(entry.path)
                    if any(target == w or target.startswith(w + os.sep) for w in writable):
                        links[entry.path] = target
                        links[os.path.join(SHOWN_LINKS, entry.name)] = target  # the same path on every desktop
        ro = [self.x_socket(), *self.bus_sockets()]
        wrapped = sb.wrap_argv(argv, self.sandbox, writable=writable, ro_binds=ro, env=full, cwd=cwd, links=links)
        return wrapped, {"PATH": sb.SAFE_PATH, TOKEN_VAR: self.token}

    def kill_group(self, proc: subprocess.Popen) -> None:
        """Kill a spawned program and everything it started, and return once they are gone (a sealed app:
        its whole PID namespace, so its windows are gone too before the next app starts)."""
        inside = sb.sandbox_pids(proc.pid) if any(p is proc for p, _ in self._sealed) else []
        if inside:
            try:
                os.kill(inside[0], signal.SIGKILL)  # the namespace's init: the kernel kills the rest
            except ProcessLookupError:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 2
        while any(_proc_state(pid) not in (None, "Z", "X") for pid in inside) and time.monotonic() < deadline:
            time.sleep(0.002)
        if proc.pid in self._pgids:
            self._pgids.remove(proc.pid)
        self._sealed = [(p, h) for p, h in self._sealed if p is not proc]
        for name, p in list(self._procs.items()):
            if p is proc:
                del self._procs[name]

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, *, writable: Sequence[str] | None = None
    ) -> subprocess.CompletedProcess:
        """Run a command to completion. With `writable` (folders in this desktop's folder), it runs sealed as
        an app does, able to write only there (checks that run programs on what the agent made)."""
        self._check()
        if writable is None or not self.sandbox.enabled:
            return subprocess.run(list(argv), env=self.env, capture_output=True, timeout=timeout)
        bad = [w for w in writable if not self._inside(w)]
        if bad:
            raise DesktopError(f"a sealed command may write only in this desktop's folder, not {bad[0]!r}")
        wrapped, outer = self._seal(argv, list(writable), {TOKEN_VAR: self.token}, writable[0] if writable else "/")
        return subprocess.run(wrapped, env=outer, capture_output=True, timeout=timeout, start_new_session=True)

    def a11y(self) -> "A11yClient":
        """A connection to this desktop's AT-SPI bus (the caller closes it)."""
        from ...a11y import A11yClient

        address = self.env.get("AT_SPI_BUS_ADDRESS")
        if not address:
            raise DesktopError("this desktop is not started: it has no accessibility bus yet")
        return A11yClient(a11y_address=address)

    def read_file(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def checkpoint(self, name: str) -> None:
        raise DesktopError("the local desktop has no snapshots (the capability 'snapshots' is a VM's)")

    def reset(self) -> None:
        raise DesktopError("the local desktop has no snapshots (the capability 'snapshots' is a VM's)")

    def http_get(self, port: int, path: str, timeout: float = 10.0) -> bytes:
        """GET http://127.0.0.1:port/path (an app's own server on this machine). A sealed app has a network
        namespace of its own: the request is made from inside it (setns on a thread of ours; needs root)."""
        import urllib.error
        import urllib.request

        if not (isinstance(port, int) and 0 < port < 65536) or not path.startswith("/"):
            raise ValueError(f"bad local URL port {port!r} path {path!r}")
        url = f"http://127.0.0.1:{port}{path}"
        live = [p for p, _ in self._sealed if p.poll() is None]
        if not live:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r:
                    return r.read()
            except (urllib.error.URLError, OSError) as e:
                raise DesktopError(f"GET {url} failed: {e}") from None
        errors = []
        for p in reversed(live):
            try:
                return sb.http_get_in_netns(p.pid, port, path, timeout)
            except OSError as e:
                errors.append(str(e))
        raise DesktopError(f"GET {url} failed inside the apps' sandboxes: {'; '.join(errors)}")

    def write_file(self, path: str, data: bytes) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(data)
        real = Path(os.path.realpath(path))
        for top in self._handed:  # a file set up in a sealed app's home belongs to the app's user
            if str(real).startswith(top + os.sep):
                for p in [real, *real.parents]:
                    if not str(p).startswith(top + os.sep):
                        break
                    sb.hand_over_one(str(p), self.sandbox.uid)
                break

    @property
    def tmpdir(self) -> str | None:
        """This desktop's temporary folder (None until started); removed with the desktop, also by the
        watchdog when this process dies: the env makes the app homes inside it."""
        return self._tmp

    def pids(self) -> list[int]:
        """Every live process of this desktop (for tests and diagnostics)."""
        return token_pids(self.token)


def _disk_error(folder: str, e: OSError) -> str:
    return (
        f"cannot write the desktop's files in {folder} ({e.strerror or e}): set TMPDIR to a writable "
        f"folder with free space"
    )
