"""TeXstudio, Debian's stock build: launched on the task's files with a fresh profile; state from the files.

TeXstudio's accessibility tree shows tabs, the messages/log panes and the PDF viewer's page counter, but not
the editor's text (an empty, childless node), and it saves only when told: so the working folder's files on
disk are the state the checks read (as ScienceBoard's harness does), and the tree adds what the GUI shows.

The profile (`--config DIR`) is written per reset: no session restore, no LanguageTool (it would start Java),
and no typing aids (completion pop-ups, bracket closing, auto-indent) or soft line wrap, so text typed by an
agent lands in the document as typed and a cursor key moves by one line of the file. Closing with unsaved work
asks a question, so the env kills the process, never closes it.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from ...a11y import A11yAdapter, A11yError, Node
from ...backends.base import Desktop, stable_path
from ...registry import AppError, LaunchContext

WORKDIR = "atelier"  # the task files' folder inside home (ScienceBoard's /home/user/atelier)
CONFIG_DIR = ".config/texstudio"
TEXT_SUFFIXES = (".tex", ".bib", ".txt", ".bst", ".cls", ".sty")
MAX_TEXT = 200_000  # bytes of one file's text in state()
MAX_FILES = 200
A11Y_MAX_NODES = 400
A11Y_MAX_CHARS = 20_000
BUILD_WAIT = 60.0  # seconds state() waits for a running build to end
_BUILD_TOOLS = frozenset(
    {
        "pdflatex",
        "latex",
        "xelatex",
        "lualatex",
        "latexmk",
        "bibtex",
        "bibtex8",
        "biber",
        "makeindex",
        "dvipdfmx",
        "dvips",
        "ps2pdf",
        "pdftex",
        "xetex",
        "luatex",
    }
)

# The profile. Keys as TeXstudio writes them (QSettings' ini escaping: %20 for spaces).
PROFILE = """[General]
IniMode=true

[texmaker]
Files\\RestoreSession=false
Files\\Autosave=0
Grammar\\Language%20Tool%20Autorun=false
Editor\\Check%20Grammar=false
Editor\\Real-Time%20Spellchecking=false
Editor\\Completion=false
Editor\\Parentheses%20Completion=false
Editor\\Auto%20Indent=false
Editor\\Weak%20Indent=false
Editor\\ToolTip%20Help=false
Editor\\ToolTip%20Preview=false
Editor\\ImageToolTip=false
Editor\\SilentReload=true
Editor\\BoldCursor=false
Editor\\WordWrapMode=0
Startup\\CheckLatexConfiguration=false
MainWindow\\Maximized=true
Interface\\Language=en
Tools\\InterpetCommandDefinitionInMagicComment=false
Terminal\\Shell=/usr/bin/true
"""
# The last two close code-running surfaces no task needs: a magic comment that redefines a build command
# (`% !TeX TXS-program:compile = txs:///pdflatex/[--shell-escape]`) is ignored, and the Terminal tab of the
# bottom panel runs `true` instead of a shell. (Both would run inside the app's sandbox anyway.)

_STATE_SKIP = frozenset({"menu bar", "popup menu", "list", "scroll bar", "tool bar"})
_PANE_TABS = frozenset({"Messages", "Log", "Preview", "Terminal", "Search Results"})
_COMPLETER_TABS = frozenset({"typical", "most used", "fuzzy", "all"})
_TEXT_ROLES = frozenset({"text", "entry", "spin box", "label", "terminal"})


class TeXstudio(A11yAdapter):
    name = "texstudio"
    wm_class = "TeXstudio"
    binary = "texstudio"
    a11y_name = "TeXstudio"

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self.home: str | None = None
        self.workdir: str | None = None
        self.files: list[str] = []
        self.shown_root: str | None = None

    # ------------------------------------------------------------------------------ lifecycle
    def launch(self, ctx: LaunchContext) -> subprocess.Popen:
        desktop = ctx.desktop
        if desktop.run(["sh", "-c", 'command -v "$0"', self.binary], timeout=30).returncode != 0:
            raise AppError(
                "texstudio is not installed: run `make setup` (Debian's texstudio and texlive-latex-base packages)"
            )
        home = Path(ctx.home)
        self.home = str(home)
        self.files = list(ctx.open_files)
        self.workdir = os.path.dirname(self.files[0]) if self.files else str(home / WORKDIR)
        config = home / CONFIG_DIR
        desktop.write_file(str(config / "texstudio.ini"), PROFILE.encode())
        # No caret blinking, so that screenshots of one state are identical: Qt's built-in KDE theme reads
        # CursorBlinkRate from kdeglobals when XDG_CURRENT_DESKTOP is KDE.
        desktop.write_file(str(home / ".config" / "kdeglobals"), b"[KDE]\nCursorBlinkRate=0\n")
        if not self.files:  # a task with no files: TeXstudio opens on an empty folder
            desktop.write_file(str(Path(self.workdir) / ".keep"), b"")
        shown = self._stable_paths(desktop, home)
        env = {
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local/share"),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_CURRENT_DESKTOP": "KDE",
            "KDE_SESSION_VERSION": "5",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "QT_HASH_SEED": "0",
            # TeX reads and writes only below the document's folder (kpathsea's paranoid mode): no
            # \input{/etc/hostname} into a PDF, no write outside the folder
            "openin_any": "p",
            "openout_any": "p",
            "shell_escape": "f",
        }
        argv = [self.binary, "--start-always", "--no-session", "--config", str(config), *shown]
        self._proc = desktop.spawn(argv, env=env, cwd=self.workdir, log=str(home / "texstudio.log"))
        return self._proc

    def _stable_paths(self, desktop: Desktop, home: Path) -> list[str]:
        """The files as TeXstudio is given them. Its title bar shows the file's full path, and home is a fresh
        random folder per reset; through a link of fixed name in the desktop's own folder (which goes with the
        desktop) the title, and so the screen, is the same for every reset of one task."""
        self.shown_root = None
        if not self.files:
            return []
        root = stable_path(desktop, "texstudio-home", str(home))
        if root == str(home):
            return list(self.files)
        self.shown_root = root
        return [os.path.join(root, os.path.relpath(f, home)) for f in self.files]

    def _shown(self, path: str) -> str:
        root = self.shown_root
        return os.path.join(root, os.path.relpath(path, self.home)) if root and self.home else path

    def _alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise AppError(f"texstudio is not running (exit code {self._proc.returncode}){self._log_tail()}")

    def _log_tail(self) -> str:
        """The end of TeXstudio's own output, to say why it exited (the home goes with the next reset)."""
        try:
            text = (Path(self.home) / "texstudio.log").read_bytes()[-600:].decode("utf-8", "replace").strip()
        except (OSError, TypeError):
            return ""
        return f"; its output ends: {text!r}" if text else ""

    def ready(self, desktop: Desktop) -> bool:
        """The main window is mapped and titled with the file shown last (TeXstudio shows the last file it
        was given); a second TeXstudio window at start is a dialog, which is an error, not a wait."""
        self._alive()
        wins = [w for w in desktop.windows() if w.wm_class == self.wm_class]
        want = os.path.basename(self.files[-1]) if self.files else None
        main = [w for w in wins if w.title.endswith("TeXstudio") and w.width >= desktop.width * 0.9]
        if not main:
            return False
        if want is not None and not main[0].title.startswith(self._shown(self.files[-1])):
            return False
        others = [w for w in wins if w not in main]
        if others:
            raise AppError(f"texstudio opened a dialog at start: {others[0].title!r}")
        if want is None:
            return True
        # the editor shows the file: its tab is current (the tab bar names itself after its current tab)
        try:
            tree = self._client(desktop).app_tree(self.a11y_name, skip_roles=_STATE_SKIP)
        except A11yError:
            return False
        if tree is None or not any(n.name == want for n in self._editor_tabs(tree)):
            return False
        # the structure panel lists the document (it fills in after the editor; until then the screen changes)
        if want.endswith(".tex") and not any(n.role == "tree item" and n.name == want for n in tree.walk()):
            return False
        # the status bar shows its buttons (language, encoding): TeXstudio shows them a moment after the rest,
        # and a reset that returned before would differ from one that returned after (seen beside a busy env)
        bar = next(iter(tree.find("status bar")), None)
        buttons = [n for n in bar.walk() if n.role == "push button" and n.name] if bar is not None else []
        try:
            if not buttons or not all("showing" in self._client(desktop).states(b) for b in buttons):
                return False
        except A11yError:
            return False
        # and the window has the keyboard (openbox focuses it once mapped): keys sent before would be lost.
        # Beside another app's window (a multi-app task) the focus is that app's to take: not waited for.
        if any(w.wm_class != self.wm_class for w in desktop.windows()):
            return True
        frame = next((n for n in tree.children if n.role == "frame" and n.name.endswith("TeXstudio")), None)
        try:
            return frame is not None and "active" in self._client(desktop).states(frame)
        except A11yError:
            return False

    # ------------------------------------------------------------------------------ state
    @staticmethod
    def _tab_lists(tree: Node) -> list[Node]:
        return [n for n in tree.find("page tab list")]

    def _editor_tabs(self, tree: Node) -> list[Node]:
        out = []
        for lst in self._tab_lists(tree):
            tabs = [c for c in lst.children if c.role == "page tab"]
            names = {t.name for t in tabs}
            if tabs and not names & (_PANE_TABS | _COMPLETER_TABS):
                out.extend(tabs)
        return out

    def _files(self, desktop: Desktop) -> dict[str, dict[str, Any]]:
        """{home-relative path: {"size", "text"?}} of the working folder (and the opened files' folders),
        listed through the desktop so it works where the app runs."""
        roots = sorted({self.workdir, *(os.path.dirname(f) for f in self.files)} - {None})
        out: dict[str, dict[str, Any]] = {}
        for root in roots:
            r = desktop.run(["find", root, "-maxdepth", "4", "-type", "f", "-printf", "%P\\t%s\\n"], timeout=10)
            if r.returncode != 0:
                continue
            for line in r.stdout.decode(errors="replace").splitlines():
                rel, _, size = line.rpartition("\t")
                full = os.path.join(root, rel)
                key = os.path.relpath(full, self.home)
                if key in out or len(out) >= MAX_FILES:
                    continue
                info: dict[str, Any] = {"size": int(size)}
                if full.endswith(TEXT_SUFFIXES) and int(size) <= MAX_TEXT:
                    try:
                        info["text"] = desktop.read_file(full).decode("utf-8", errors="replace")
                    except OSError:
                        pass
                out[key] = info
        return out

    def _wait_build(self, desktop: Desktop, timeout: float = BUILD_WAIT) -> bool:
        """If a build the agent started is still running (a TeX tool is a child of TeXstudio), wait for it to
        end, as a person would before judging: a check must not race the build's output files."""
        if self._proc is None:
            return False
        deadline = time.monotonic() + timeout
        pause, waited = 0.02, False
        while True:
            names = self._descendants(desktop)
            if not names & _BUILD_TOOLS or time.monotonic() > deadline:
                return waited
            waited = True
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def _descendants(self, desktop: Desktop) -> set[str]:
        """The names of the processes below TeXstudio's (a sealed app runs a few levels down, under bwrap)."""
        r = desktop.run(["ps", "-e", "-o", "pid=,ppid=,comm="], timeout=10)
        kids: dict[int, list[tuple[int, str]]] = {}
        for line in r.stdout.decode(errors="replace").splitlines():
            parts = line.split(None, 2)
            if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
                kids.setdefault(int(parts[1]), []).append((int(parts[0]), parts[2].strip()))
        names, todo = set(), [self._proc.pid] if self._proc is not None else []
        while todo:
            for pid, name in kids.get(todo.pop(), []):
                names.add(name)
                todo.append(pid)
        return names

    def _read_tree(self, desktop: Desktop) -> Node:
        try:
            tree = self._client(desktop).app_tree(self.a11y_name, skip_roles=_STATE_SKIP, texts=True)
        except A11yError as e:
            raise AppError(f"cannot read TeXstudio's accessibility tree: {e}") from None
        if tree is None:
            raise AppError("texstudio is not on the accessibility bus (did it crash?)")
        return tree

    def state(self, desktop: Desktop) -> dict[str, Any]:
        """{"files": {rel: {"size", "text"}}, "pdf": {rel: size}, "tabs": [...], "current_tab",
        "messages", "log", "log_entries": [[file, type, line, message]], "pdf_page", "title"}."""
        self._alive()
        # The tree read goes through TeXstudio's event loop, so input sent before it (ctrl+s) has been
        # handled when it answers: only then are the files read.
        tree = self._read_tree(desktop)
        if self._wait_build(desktop):
            tree = self._read_tree(desktop)
        files = self._files(desktop)
        wins = [w for w in desktop.windows() if w.wm_class == self.wm_class]
        gui: dict[str, Any] = {
            "tabs": [],
            "current_tab": None,
            "messages": None,
            "log": None,
            "log_entries": [],
            "pdf_page": None,
            "pdf_pages": None,
            "title": wins[0].title if wins else None,
            "windows": [w.title for w in wins],
        }
        tabs = self._editor_tabs(tree)
        gui["tabs"] = [t.name for t in tabs]
        lists = [lst for lst in self._tab_lists(tree) if any(t in tabs for t in lst.children)]
        gui["current_tab"] = lists[0].name if lists else None
        self._panes(tree, gui)
        return {"files": files, "pdf": {k: v["size"] for k, v in files.items() if k.endswith(".pdf")}, **gui}

    @staticmethod
    def _panes(tree: Node, gui: dict[str, Any]) -> None:
        """The bottom panes: the messages text, the log text and its table, and the PDF page counter."""
        parent: dict[int, Node] = {}
        for n in tree.walk():
            for c in n.children:
                parent[id(c)] = n
        table = next(
            (
                n
                for n in tree.find("table")
                if any(c.role == "column header" and c.name == "Message" for c in n.children)
            ),
            None,
        )
        if table is not None:
            cells = [c.name for c in table.children if c.role in ("table cell", "cell")]
            gui["log_entries"] = [cells[i : i + 4] for i in range(0, len(cells) - 3, 4)][:200]
            # the log text is the table's sibling; the messages text comes first in the same pane
            split = parent.get(id(table))
            log = next((c for c in split.children if c.role == "text"), None) if split else None
            pane = split
            for _ in range(2):  # splitter -> filler -> the pane's layered pane
                pane = parent.get(id(pane)) if pane is not None else None
            if log is not None:
                gui["log"] = (log.text or "")[-MAX_TEXT:]
            if pane is not None:
                msg = next((n for n in pane.find("text") if n is not log), None)
                if msg is not None:
                    gui["messages"] = (msg.text or "")[-MAX_TEXT:]
        for n in tree.walk():
            m = re.fullmatch(r"Page (\d+) of (\d+)", n.name.strip()) if n.role == "label" else None
            if m:
                gui["pdf_page"], gui["pdf_pages"] = int(m.group(1)), int(m.group(2))

    # ------------------------------------------------------------------------------ a11y_text
    def a11y_text(self, desktop: Desktop) -> str:
        """One line per SHOWING element: role, name, text, box. Read a level at a time; subtrees whose root
        is not showing (closed menus, hidden docks, other tabs) are never read; at most A11Y_MAX_NODES. Only
        the A11ySource protocol: the same on this machine's bus and through a VM guest's reader."""
        self._alive()
        client = self._client(desktop)
        try:
            rows = client.showing_rows(self.a11y_name, A11Y_MAX_NODES, _TEXT_ROLES, _BORING)
        except A11yError as e:
            raise AppError(f"cannot read TeXstudio's accessibility tree: {e}") from None
        if rows is None:
            raise AppError("texstudio is not on the accessibility bus (did it crash?)")
        rows.sort(key=lambda r: (r[4][1], r[4][0]) if r[4] else (1 << 30, 0))  # reading order on screen
        out, size = ["role\tname\ttext\tx,y,w,h"], 0
        for depth, role, name, text, ext, _states in rows:
            line = f"{role}\t{name[:80]}\t{(text or '')[:200]!r}\t" + ",".join(map(str, ext or ()))
            size += len(line) + 1
            if size > A11Y_MAX_CHARS:
                out.append("... (truncated)")
                break
            out.append(line)
        return "\n".join(out)


_BORING = frozenset({"filler", "layered pane", "splitter", "grip", "scroll bar", "panel", "separator"})
