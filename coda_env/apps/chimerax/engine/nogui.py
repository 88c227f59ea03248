"""chimerax.core.nogui for coda's ChimeraX engine (written for coda; the PyPI wheel does not ship one).

ChimeraX's `--nogui` mode imports two names from this module: `UI` (the session's user interface object)
and `NoGuiLog` (a logger that prints). ChimeraX's own version reads commands from stdin and ends on end of
input; this one is built to be a server: its event loop runs functions other threads hand it through
`thread_safe` (that is how the REST server runs commands on the main thread) and ends only on `exit`
(or a signal). It reads commands from stdin too when stdin is a terminal or CHIMERAX_NOGUI_STDIN=1; end of
input then stops reading, not the program.
"""

import os
import queue
import sys
import threading
import weakref

from .logger import PlainTextLog
from .state import State


class NoGuiLog(PlainTextLog):
    """Prints log messages to stdout (level-tagged), and status lines."""

    _names = {
        PlainTextLog.LEVEL_INFO: "INFO",
        PlainTextLog.LEVEL_WARNING: "WARNING",
        PlainTextLog.LEVEL_ERROR: "ERROR",
        PlainTextLog.LEVEL_BUG: "BUG",
    }

    def log(self, level, msg):
        try:
            print(f"{self._names.get(level, 'INFO')}:\n{msg}", end="" if msg.endswith("\n") else "\n", flush=True)
        except (ValueError, OSError):  # stdout closed
            pass
        return True

    def status(self, msg, color, secondary):
        if msg and not secondary:
            try:
                print(f"STATUS:\n{msg}", flush=True)
            except (ValueError, OSError):
                pass
        return True


class UI:
    """The session's text user interface: no windows, a queue of main-thread calls."""

    _instance = None

    def __new__(cls, session):
        if cls._instance is None:
            ui = super().__new__(cls)
            ui.is_gui = False
            ui.has_graphics = False
            ui.stereo = False
            ui.autostart_tools = False
            ui._session = weakref.ref(session)
            ui._calls = None
            ui._running = False
            cls._instance = ui
        return cls._instance

    @classmethod
    def instance(cls):
        return cls._instance

    def initialize_color_output(self, color_output):
        self.color_output = bool(color_output)  # plain text always: the output is read by programs

    def initialize_offscreen_rendering(self):
        """OSMesa rendering (PYOPENGL_PLATFORM=osmesa), so `save image.png` works without a display."""
        session = self._session()
        from chimerax import graphics

        try:
            context = graphics.OffScreenRenderingContext()
        except Exception as e:
            session.logger.info(f"Offscreen rendering is not available: {e}")
            self.has_graphics = False
            return
        session.main_view.initialize_rendering(context)
        self.has_graphics = True

    def splash_info(self, message, splash_step=None, num_splash_steps=None):
        print(message, file=sys.stderr, flush=True)

    def build(self):
        pass

    def open_pending_files(self, ignore_files=()):
        pass

    def quit(self):
        session = self._session()
        if session is not None:
            session.logger.status("Exiting ...", blank_after=0)
            session.logger.clear()
        self._running = False
        sys.exit(os.EX_OK)

    def thread_safe(self, func, *args, **kw):
        """Run func on the main thread (queued while the event loop runs; at once before it starts)."""
        if self._calls is not None:
            self._calls.put((func, args, kw))
        else:
            func(*args, **kw)

    def event_loop(self):
        self._calls = queue.Queue()
        self._running = True
        if sys.stdin is not None and (os.environ.get("CHIMERAX_NOGUI_STDIN") == "1" or sys.stdin.isatty()):
            threading.Thread(target=self._read_stdin, name="nogui-stdin", daemon=True).start()
        while self._running:
            func, args, kw = self._calls.get()
            try:
                func(*args, **kw)
            except SystemExit:
                raise
            except Exception:
                import traceback

                session = self._session()
                if session is not None:
                    session.logger.bug(traceback.format_exc())

    def _read_stdin(self):
        done = threading.Event()
        while True:
            try:
                line = sys.stdin.readline()
            except (ValueError, OSError):
                return
            if not line:
                return  # end of input: stop reading, keep serving
            done.clear()
            self.thread_safe(self._run_line, line, done)
            done.wait()

    def _run_line(self, line, done):
        try:
            text = line.strip()
            if text:
                from . import errors
                from .commands import run

                session = self._session()
                try:
                    run(session, text)
                except errors.NotABug as e:
                    session.logger.error(str(e))
        finally:
            done.set()


class _Input(State):
    """Stands in for the stdin task that sessions saved by ChimeraX's own nogui mode may name."""

    SESSION_ENDURING = True

    def take_snapshot(self, session, flags):
        return None

    @staticmethod
    def restore_snapshot(session, data):
        return None
