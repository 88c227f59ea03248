"""KAlgebra, Debian's stock build, read through its accessibility tree.

State comes from AT-SPI, not from a patched build with an HTTP server (as ScienceBoard's harness does): the
Variables panel is a tree whose items come in (name, value) pairs with full precision, the 2D Graph's
function list is a tree of (name, expression) pairs, and the tab bar says which tab is selected.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from ...a11y import A11yAdapter, A11yError, Node, table_text
from ...actions import Action
from ...backends.base import Desktop
from ...registry import AppError, LaunchContext

TABS = ("Calculator", "2D Graph", "3D Graph", "Dictionary")
_SKIP = frozenset({"menu bar", "combo box", "popup menu", "scroll bar", "web document"})
# State reads also skip lists: the Dictionary's operator list is 285 of the tree's 437 nodes, and no check
# reads it (the a11y_tree observation keeps it). That matters in a VM, where a read runs in the guest.
_STATE_SKIP = _SKIP | {"list"}
_DETAILS = frozenset({"page tab"})
# what the a11y_tree observation lists (with states and boxes), and the inputs it lists even when unnamed
_INPUTS = frozenset({"text", "entry", "spin box"})
_LISTED = _INPUTS | frozenset(
    {
        "page tab",
        "push button",
        "toggle button",
        "check box",
        "radio button",
        "tree item",
        "list item",
        "cell",
        "table cell",
        "column header",
        "menu item",
        "label",
        "frame",
        "status bar",
        "page tab list",
    }
)
A11Y_MAX_NODES = 600  # nodes the a11y_tree observation reads at most
STATE_PATIENCE = 30.0  # seconds a running but busy KAlgebra may take to answer a state read  # the tabs' states say which is current; their extents are pressed


class KAlgebra(A11yAdapter):
    name = "kalgebra"
    wm_class = "kalgebra"
    binary = "kalgebra"

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._found_on: Desktop | None = None  # the desktop where `kalgebra` was found (asked once)

    # ------------------------------------------------------------------ lifecycle
    def launch(self, ctx: LaunchContext) -> subprocess.Popen:
        desktop, profile_dir = ctx.desktop, ctx.home
        # asked of the desktop, so it looks where the app will run (this machine, or the guest of a VM)
        if (
            self._found_on is not desktop
            and desktop.run(["sh", "-c", 'command -v "$0"', self.binary], timeout=30).returncode != 0
        ):
            raise AppError(
                "kalgebra is not installed: run `make setup` (it installs Debian's kalgebra package; "
                "in a VM image, vm_images/build.sh does)"
            )
        self._found_on = desktop
        home = Path(profile_dir)
        # No caret blinking: screenshots of the same state are then identical (Qt's KDE theme reads this).
        # Written through the desktop, so that it lands where the app runs (the guest, for a VM).
        desktop.write_file(str(home / ".config" / "kdeglobals"), b"[KDE]\nCursorBlinkRate=0\n")
        env = {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local/share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "QTWEBENGINE_DISABLE_SANDBOX": "1",
            "XDG_CURRENT_DESKTOP": "KDE",
            "KDE_SESSION_VERSION": "5",
            "QTWEBENGINE_CHROMIUM_FLAGS": "--disable-gpu --single-process",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "QT_HASH_SEED": "0",
            # Qt Quick (the console's QtWebEngine view) drawn by its software renderer, not by OpenGL on
            # llvmpipe: the app's start costs a third of the CPU (0.18 s instead of 0.53 s, measured), and
            # the console's results are on the screenshot as soon as the screen settles (with OpenGL the
            # settled screenshot could still show an empty console). The 3D Graph is a plain OpenGL
            # widget and is unaffected.
            "QT_QUICK_BACKEND": "software",
        }
        # Caches (Mesa's and Qt's compiled shaders) stay in the fresh HOME: a sealed app writes nowhere else, so
        # no episode can leave anything for the next one.
        self._proc = desktop.spawn([self.binary], env=env, cwd=str(home), log=str(home / "kalgebra.log"))
        return self._proc

    def _tree(self, desktop: Desktop, texts: bool, skip: frozenset[str] = _STATE_SKIP) -> Node | None:
        return self._client(desktop).app_tree(self.name, skip_roles=skip, texts=texts, details_roles=_DETAILS)

    def ready(self, desktop: Desktop) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise AppError(f"kalgebra exited with code {self._proc.returncode} while starting")
        if not any(w.wm_class == self.wm_class and w.width >= desktop.width * 0.9 for w in desktop.windows()):
            return False
        try:
            tree = self._tree(desktop, texts=False)
        except A11yError:  # a starting app can be slow to answer; the caller's deadline bounds the polling
            return False
        return (
            tree is not None
            and tree.first("page tab", "Dictionary") is not None
            and tree.first("frame", "Variables") is not None
        )

    # ------------------------------------------------------------------ state
    def a11y_text(self, desktop: Desktop) -> str:
        """The elements on screen as an a11y table (coda_env.a11y.table_text: role, name, text, box, states):
        showing, of positive size, named or holding text or an input; in tree order. Lists (the Dictionary's
        285 operators) are skipped, as state reads skip them."""
        if self._proc is not None and self._proc.poll() is not None:
            raise AppError(f"kalgebra is not running (exit code {self._proc.returncode})")
        try:  # only what shows is read (closed tabs and menus never are): a few requests a level
            found = self._client(desktop).showing_rows(
                self.name, A11Y_MAX_NODES, text_roles=_LISTED, skip_roles=_STATE_SKIP, text_limit=-1
            )
        except A11yError as e:
            raise AppError(f"cannot read KAlgebra's state: {e}") from None
        if found is None:
            raise AppError("kalgebra is not on the accessibility bus (did it crash?)")
        rows = [
            (role, name, text or "", ext, states)
            for _, role, name, text, ext, states in found
            if role in _LISTED and (name or text or role in _INPUTS)
        ]
        return table_text(rows)

    def tree(self, desktop: Desktop, skip_roles: frozenset[str] = _SKIP, details: frozenset[str] = _DETAILS) -> Node:
        """The app's accessibility tree (state reads skip more); the nodes of the `details` roles come with
        their states and boxes."""
        if self._proc is not None and self._proc.poll() is not None:
            raise AppError(f"kalgebra is not running (exit code {self._proc.returncode})")
        try:
            tree = self._client(desktop).app_tree(self.name, skip_roles=skip_roles, texts=True, details_roles=details)
        except A11yError as e:
            raise AppError(f"cannot read KAlgebra's state: {e}") from None
        if tree is None:
            raise AppError("kalgebra is not on the accessibility bus (did it crash?)")
        return tree

    @staticmethod
    def _pairs(tree: Node | None) -> list[tuple[str, str]]:
        if tree is None:
            return []
        items = [n.name for n in tree.children if n.role in ("tree item", "cell", "table cell")]
        return list(zip(items[0::2], items[1::2]))

    def state(self, desktop: Desktop) -> dict[str, Any]:
        """The state; a read that KAlgebra does not answer in time is tried again while it runs, for up to
        STATE_PATIENCE seconds: a busy KAlgebra (an implicit curve, a script just loaded, a loaded machine)
        answers AT-SPI seconds late, and that is no reason to score an episode as an error."""
        deadline = time.monotonic() + STATE_PATIENCE
        while True:
            try:
                return self._read_state(desktop)
            except (A11yError, AppError) as e:
                if (self._proc is not None and self._proc.poll() is not None) or time.monotonic() > deadline:
                    if isinstance(e, AppError):
                        raise
                    raise AppError(f"cannot read KAlgebra's state: {e}") from None
            time.sleep(0.1)  # polled: the next read comes when KAlgebra may have caught up

    def _read_state(self, desktop: Desktop) -> dict[str, Any]:
        """{"tab", "variables": {name: value}, "functions_2d": [{"name", "expression"}], "function_3d",
        "dictionary_query"}: everything KAlgebra's checks read."""
        root = self.tree(desktop, _STATE_SKIP)
        client = self._client(desktop)
        tab = None
        tabs = next((n for n in root.find("page tab list") if n.first("page tab", "Dictionary")), None)
        if tabs is not None:
            for t in tabs.children:
                if t.role == "page tab" and client.states(t) & {
                    "selected",
                    "focused",
                }:  # Qt 5 marks the current tab focused
                    tab = t.name
        variables_frame = root.first("frame", "Variables")
        variables = dict(self._pairs(variables_frame.first("tree") if variables_frame else None))
        functions_frame = root.first("frame", "Functions")
        functions = [
            {"name": n, "expression": e}
            for n, e in self._pairs(functions_frame.first("tree") if functions_frame else None)
        ]
        ops = root.first("frame", "Operations")
        query = None
        if ops is not None:
            box = ops.first("text")
            query = box.text if box is not None else None
        texts = [n for n in root.find("text")]
        # The main area's inputs, in tree order: [console, 3D expression] (a hidden tab keeps its widgets).
        main = [n.text for n in texts if not self._inside(root, n, ("Functions", "Operations", "Variables"))]
        return {
            "tab": tab,
            "variables": variables,
            "functions_2d": functions,
            "function_3d": main[1] if len(main) > 1 and main[1] else None,
            "console_input": main[0] if main else None,
            "dictionary_query": query,
        }

    @staticmethod
    def _inside(root: Node, node: Node, frame_names: tuple[str, ...]) -> bool:
        return any(n is node for f in root.find("frame") if f.name in frame_names for n in f.walk())

    # ------------------------------------------------------------------ setup operations
    def _press(self, desktop: Desktop, node: Node) -> None:
        ext = self._client(desktop).extents(node)
        if not ext or ext[2] <= 0:
            raise AppError(f"KAlgebra widget {node.role} {node.name!r} is not on screen")
        desktop.input(Action("click", x=ext[0] + ext[2] // 2, y=ext[1] + ext[3] // 2))
        # and away: an agent's first click on the same widget would otherwise come within Qt's double-click
        # interval of this one and be taken as a double click (the 2D tab's "Add" page then ignored it)
        desktop.input(Action("move", x=0, y=desktop.height - 1))

    def run_op(self, desktop: Desktop, op: dict[str, Any]) -> None:
        """One of KAlgebra's own setup operations (registered below)."""
        try:
            self._setup(desktop, op)
        except A11yError as e:
            raise AppError(f"KAlgebra setup {op.get('func')!r} failed: {e}") from None

    def _setup(self, desktop: Desktop, op: dict[str, Any]) -> None:
        func = op["func"]
        if func == "tab":
            index = op.get("index")
            name = TABS[index] if isinstance(index, int) else op.get("name")
            tab = self.tree(desktop, _STATE_SKIP).first("page tab", name)
            if tab is None:
                raise AppError(f"KAlgebra has no tab {name!r}")
            self._press(desktop, tab)
        elif func in ("console", "func_2d", "func_3d"):
            tab = {"console": "Calculator", "func_2d": "2D Graph", "func_3d": "3D Graph"}[func]
            self._setup(desktop, {"func": "tab", "name": tab})
            self._wait_tab(desktop, tab)
            before = len(self.state(desktop)["functions_2d"])
            if func == "func_2d":  # the 2D tab's "Add" page holds the expression field
                add = self.tree(desktop, _STATE_SKIP).first("page tab", "Add")
                self._press(desktop, add)
            desktop.input(Action("type", text=op["expr"]))
            desktop.input(Action("press", keys=("enter",)))
            if func == "func_2d":  # done when the new function is listed (the dock then shows its List page)
                deadline = time.monotonic() + 5
                while len(self.state(desktop)["functions_2d"]) <= before:
                    if time.monotonic() > deadline:
                        raise AppError(f"KAlgebra did not add the 2D function {op['expr']!r}")
                    time.sleep(0.02)
        else:
            raise AppError(f"unknown KAlgebra setup operation {func!r}")

    def _wait_tab(self, desktop: Desktop, name: str, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while self.state(desktop)["tab"] != name:
            if time.monotonic() > deadline:
                raise AppError(f"KAlgebra did not switch to the {name!r} tab")
            time.sleep(0.01)
