"""KAlgebra, Debian's stock build, read through its accessibility tree.

State comes from AT-SPI, not from a patched build with an HTTP server (as ScienceBoard's harness does): the
Variables panel is a tree whose items come in (name, value) pairs with full precision, the 2D Graph's
function list is a tree of (name, expression) pairs, and the tab bar says which tab is selected.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from ..a11y import A11yClient, A11yError, Node
from ..actions import Action
from ..backends.base import Desktop
from . import AppError

TABS = ("Calculator", "2D Graph", "3D Graph", "Dictionary")
_SKIP = frozenset({"menu bar", "combo box", "popup menu", "scroll bar", "web document"})


class KAlgebra:
    name = "kalgebra"
    wm_class = "kalgebra"
    binary = "kalgebra"

    def __init__(self) -> None:
        self._a11y: A11yClient | None = None
        self._proc: subprocess.Popen | None = None

    # ------------------------------------------------------------------ lifecycle
    def launch(self, desktop: Desktop, profile_dir: str) -> subprocess.Popen:
        from ..backends.local import LocalDesktop
        if isinstance(desktop, LocalDesktop):
            installed = shutil.which(self.binary) is not None
        else:  # a VM: look in the guest, where it will run
            installed = desktop.run(["sh", "-c", f"command -v {self.binary}"], timeout=30).returncode == 0
        if not installed:
            raise AppError("kalgebra is not installed: run `make setup` (it installs Debian's kalgebra package; "
                           "in a VM image, vm_images/build.sh does)")
        home = Path(profile_dir)
        # No caret blinking: screenshots of the same state are then identical (Qt's KDE theme reads this).
        # Written through the desktop, so that it lands where the app runs (the guest, for a VM).
        desktop.write_file(str(home / ".config" / "kdeglobals"), b"[KDE]\nCursorBlinkRate=0\n")
        env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
               "XDG_DATA_HOME": str(home / ".local/share"), "XDG_CACHE_HOME": str(home / ".cache"),
               "QTWEBENGINE_DISABLE_SANDBOX": "1", "XDG_CURRENT_DESKTOP": "KDE", "KDE_SESSION_VERSION": "5",
               "QTWEBENGINE_CHROMIUM_FLAGS": "--disable-gpu --single-process", "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8", "QT_HASH_SEED": "0"}
        self._proc = desktop.spawn([self.binary], env=env, cwd=str(home), log=str(home / "kalgebra.log"))
        return self._proc

    def close(self) -> None:
        if self._a11y is not None:
            try:
                self._a11y.close()
            except Exception:
                pass
        self._a11y = None

    def _client(self, desktop: Desktop) -> A11yClient:
        if self._a11y is None:
            addr = getattr(desktop, "env", {}).get("DBUS_SESSION_BUS_ADDRESS")
            if not addr:
                raise AppError("this desktop has no accessibility bus; KAlgebra's state cannot be read")
            self._a11y = A11yClient(addr)
        return self._a11y

    def _app(self, desktop: Desktop) -> Node | None:
        try:
            return self._client(desktop).application(self.name)
        except A11yError:
            return None

    def ready(self, desktop: Desktop) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise AppError(f"kalgebra exited with code {self._proc.returncode} while starting")
        if not any(w.wm_class == self.wm_class and w.width >= desktop.width * 0.9 for w in desktop.windows()):
            return False
        app = self._app(desktop)
        if app is None:
            return False
        try:
            tree = self._client(desktop).tree(app, skip_roles=_SKIP)
        except A11yError:  # a starting app can be slow to answer; the caller's deadline bounds the polling
            return False
        return tree.first("page tab", "Dictionary") is not None and tree.first("frame", "Variables") is not None

    # ------------------------------------------------------------------ state
    def tree(self, desktop: Desktop) -> Node:
        if self._proc is not None and self._proc.poll() is not None:
            raise AppError(f"kalgebra is not running (exit code {self._proc.returncode})")
        app = self._app(desktop)
        if app is None:
            raise AppError("kalgebra is not on the accessibility bus (did it crash?)")
        try:
            return self._client(desktop).tree(app, skip_roles=_SKIP, texts=True)
        except A11yError as e:
            raise AppError(f"cannot read KAlgebra's state: {e}") from None

    @staticmethod
    def _pairs(tree: Node | None) -> list[tuple[str, str]]:
        if tree is None:
            return []
        items = [n.name for n in tree.children if n.role in ("tree item", "cell", "table cell")]
        return list(zip(items[0::2], items[1::2]))

    def state(self, desktop: Desktop) -> dict[str, Any]:
        try:
            return self._read_state(desktop)
        except A11yError as e:
            raise AppError(f"cannot read KAlgebra's state: {e}") from None

    def _read_state(self, desktop: Desktop) -> dict[str, Any]:
        """{"tab", "variables": {name: value}, "functions_2d": [{"name", "expression"}], "function_3d",
        "dictionary_query"}: everything KAlgebra's checks read."""
        root = self.tree(desktop)
        client = self._client(desktop)
        tab = None
        tabs = next((n for n in root.find("page tab list") if n.first("page tab", "Dictionary")), None)
        if tabs is not None:
            for t in tabs.children:
                if t.role == "page tab" and client.states(t) & {"selected", "focused"}:  # Qt 5 marks the current tab focused
                    tab = t.name
        variables_frame = root.first("frame", "Variables")
        variables = dict(self._pairs(variables_frame.first("tree") if variables_frame else None))
        functions_frame = root.first("frame", "Functions")
        functions = [{"name": n, "expression": e}
                     for n, e in self._pairs(functions_frame.first("tree") if functions_frame else None)]
        ops = root.first("frame", "Operations")
        query = None
        if ops is not None:
            box = ops.first("text")
            query = box.text if box is not None else None
        texts = [n for n in root.find("text")]
        # The main area's inputs, in tree order: [console, 3D expression] (a hidden tab keeps its widgets).
        main = [n.text for n in texts if not self._inside(root, n, ("Functions", "Operations", "Variables"))]
        return {"tab": tab, "variables": variables, "functions_2d": functions,
                "function_3d": main[1] if len(main) > 1 and main[1] else None,
                "console_input": main[0] if main else None, "dictionary_query": query}

    @staticmethod
    def _inside(root: Node, node: Node, frame_names: tuple[str, ...]) -> bool:
        return any(n is node for f in root.find("frame") if f.name in frame_names for n in f.walk())

    # ------------------------------------------------------------------ setup operations
    def _press(self, desktop: Desktop, node: Node) -> None:
        ext = self._client(desktop).extents(node)
        if not ext or ext[2] <= 0:
            raise AppError(f"KAlgebra widget {node.role} {node.name!r} is not on screen")
        desktop.input(Action("click", x=ext[0] + ext[2] // 2, y=ext[1] + ext[3] // 2))

    def setup(self, desktop: Desktop, op: dict[str, Any]) -> None:
        try:
            self._setup(desktop, op)
        except A11yError as e:
            raise AppError(f"KAlgebra setup {op.get('func')!r} failed: {e}") from None

    def _setup(self, desktop: Desktop, op: dict[str, Any]) -> None:
        func = op["func"]
        if func == "tab":
            index = op.get("index")
            name = TABS[index] if isinstance(index, int) else op.get("name")
            tab = self.tree(desktop).first("page tab", name)
            if tab is None:
                raise AppError(f"KAlgebra has no tab {name!r}")
            self._press(desktop, tab)
        elif func in ("console", "func_2d", "func_3d"):
            tab = {"console": "Calculator", "func_2d": "2D Graph", "func_3d": "3D Graph"}[func]
            self._setup(desktop, {"func": "tab", "name": tab})
            self._wait_tab(desktop, tab)
            before = len(self.state(desktop)["functions_2d"])
            if func == "func_2d":  # the 2D tab's "Add" page holds the expression field
                add = self.tree(desktop).first("page tab", "Add")
                self._press(desktop, add)
            desktop.input(Action("type", text=op["expr"]))
            desktop.input(Action("press", keys=("enter",)))
            if func == "func_2d":  # done when the new function is listed (the dock then shows its List page)
                deadline = time.monotonic() + 5
                while len(self.state(desktop)["functions_2d"]) <= before:
                    if time.monotonic() > deadline:
                        raise AppError(f"KAlgebra did not add the 2D function {op['expr']!r}")
                    time.sleep(0.02)
        elif func == "write_file":
            desktop.write_file(os.path.expanduser(op["path"]).replace("~", desktop_home(desktop)), op["content"].encode())
        else:
            raise AppError(f"unknown KAlgebra setup operation {func!r}")

    def _wait_tab(self, desktop: Desktop, name: str, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while self.state(desktop)["tab"] != name:
            if time.monotonic() > deadline:
                raise AppError(f"KAlgebra did not switch to the {name!r} tab")
            time.sleep(0.01)


def desktop_home(desktop: Desktop) -> str:
    return getattr(desktop, "app_home", os.path.expanduser("~"))
