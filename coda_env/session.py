"""One env's desktop and the apps on it, episode after episode: what a reset does before the first observation.

The env (`env.py`) is Gymnasium's face; this is its coordinator and task manager, as android_env splits
them. A `Session` owns the adapters and processes of the apps, and the per-episode home: it reverts to the
desktop's snapshot where the desktop has snapshots (a VM) and the same apps are saved there, and otherwise
boots the desktop if needed, makes a fresh home, runs the task's "files" setup operations, launches every
app of the task, polls each until ready (never a fixed wait), saves a snapshot where it can, and runs the
"app" setup operations. It knows no app: adapters and setup operations come from the registry.

`Spare` is the swap reset (issue 28): a second Session on a second desktop of the same backend, whose
apps a thread launches for the next episode while the current one runs, so that a reset only swaps the
two sessions and applies what is left of the task's setup (see `Spare`).
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from typing import Any, Callable

from .backends.base import SNAPSHOTS, Desktop, DesktopError, make_temp_dir
from .registry import SETUP_OPS, App, AppError, LaunchContext, SetupContext, SetupError, get_app_spec
from .tasks import Task, TaskError


class Session:
    """The desktop and the apps of one env (see the module docstring)."""

    def __init__(self, desktop: Desktop, main_app: str, ready_timeout: float):
        self.desktop = desktop
        self.main_app = main_app
        self.ready_timeout = ready_timeout
        self.snapshots = SNAPSHOTS in desktop.capabilities
        self.apps: dict[str, App] = {}  # adapters by app name (the main one, and a task's others)
        self.procs: dict[str, Any] = {}
        self.home: str | None = None
        self._app_saved: tuple[str, ...] | None = None  # the apps in the desktop's snapshot
        # what `prepare` made ready ahead of a reset: (apps, files ops, app ops or None when not applied)
        self.prepared: tuple[tuple[str, ...], str, str | None] | None = None

    def adapter(self, name: str) -> App:
        if name not in self.apps:
            self.apps[name] = get_app_spec(name).adapter()
        return self.apps[name]

    # ------------------------------------------------------------------------------------------- episodes
    def begin(self, task: Task, timings: dict[str, float], settle: Callable[[], Any]) -> None:
        """Make the desktop and apps ready for `task` (timings: desktop, launch, setup). `settle` waits for
        the screen after each "app" setup operation. A session that `prepare` made ready for this task only
        runs what preparing left out (the "app" operations when they were not known then)."""
        prepared, self.prepared = self.prepared, None
        if prepared is not None and self.usable_for(task, prepared):
            timings["desktop"] = timings["launch"] = 0.0
            t2 = time.monotonic()
            if prepared[2] is None:
                self._app_ops(task, settle)
            timings["setup"] = time.monotonic() - t2
            return
        t0 = time.monotonic()
        apps = task.all_apps
        self.release()
        # A desktop with snapshots (a VM) saves one once the apps are up; every later reset of the same apps
        # reverts to it and they come back running and ready. Any other desktop restarts the apps.
        reverted = False
        if self.snapshots and self._app_saved == apps and self.desktop.alive():
            for a in self.apps.values():
                a.close()  # connections only: the apps are part of the snapshot
            try:
                self.desktop.reset()
                self.check_apps()
                reverted = True
            except (DesktopError, AppError):  # a failed revert: boot afresh below instead of retrying it
                self.desktop.stop()
        if not reverted:
            self.stop_apps()
            self._app_saved = None
            if not self.desktop.alive():
                self.desktop.start()
            elif self.snapshots:  # a snapshot desktop before its app checkpoint
                self.desktop.reset()
        timings["desktop"] = time.monotonic() - t0
        t1 = time.monotonic()
        if not reverted:
            self._launch(task, apps)
        timings["launch"] = time.monotonic() - t1
        t2 = time.monotonic()
        self._app_ops(task, settle)
        timings["setup"] = time.monotonic() - t2

    def _app_ops(self, task: Task, settle: Callable[[], Any]) -> None:
        for op in task.initialize:
            if SETUP_OPS[op["func"]].phase == "app":
                self.run_op(task, op, [])
                settle()

    # ------------------------------------------------------------------------------------------- swap resets
    @staticmethod
    def _ops(task: Task, phase: str) -> str:
        return json.dumps([op for op in task.initialize if SETUP_OPS[op["func"]].phase == phase], sort_keys=True)

    def usable_for(self, task: Task, prepared: tuple[tuple[str, ...], str, str | None]) -> bool:
        """Whether what `prepare` made is `task`'s start: the same apps and "files" operations (the home and
        what was opened), and the same "app" operations if they were applied; and the apps still running."""
        apps, files, app_ops = prepared
        if apps != task.all_apps or files != self._ops(task, "files"):
            return False
        if app_ops is not None and app_ops != self._ops(task, "app"):
            return False
        try:
            self.check_apps()
        except AppError:
            return False
        return self.desktop.alive()

    def prepare(self, task: Task, app_ops: bool, settle: Callable[[], Any]) -> None:
        """Launch `task`'s apps afresh ahead of its reset: boot the desktop if needed, a fresh home, the
        "files" operations, launch, ready; with `app_ops`, the "app" operations too (when the next task is
        known for sure). A later `begin` of a task with the same start only swaps this in."""
        self.prepared = None
        self.release()
        self.stop_apps()
        if not self.desktop.alive():
            self.desktop.start()
        self._launch(task, task.all_apps)
        if app_ops:
            self._app_ops(task, settle)
        self.prepared = (task.all_apps, self._ops(task, "files"), self._ops(task, "app") if app_ops else None)

    def _launch(self, task: Task, apps: tuple[str, ...]) -> None:
        # inside the desktop's own folder where it has one (local): removed with it however we end
        self.home = make_temp_dir(f"coda-{self.main_app}-", self.desktop.tmpdir, what="a folder for the app")
        open_files: list[str] = []
        for op in task.initialize:
            if SETUP_OPS[op["func"]].phase == "files":
                self.run_op(task, op, open_files)
        for name in apps:
            self.procs[name] = self.adapter(name).launch(LaunchContext(self.desktop, self.home, task, list(open_files)))
        deadline = time.monotonic() + self.ready_timeout
        for name in apps:
            while not self.apps[name].ready(self.desktop):
                if time.monotonic() > deadline:
                    raise AppError(f"{name} did not become ready within {self.ready_timeout:g}s")
                time.sleep(0.01)
        if self.snapshots:
            self.desktop.checkpoint("+".join(apps))
            self._app_saved = apps

    def run_op(self, task: Task, op: dict, open_files: list[str]) -> None:
        s = SETUP_OPS[op["func"]]
        adapter = self.adapter(s.app or self.main_app)
        try:
            s.run(SetupContext(self.desktop, adapter, self.home or "", task, open_files), op)
        except SetupError as e:
            raise TaskError(f"task {task.id!r}: setup {op['func']!r}: {e}") from None

    # ------------------------------------------------------------------------------------------- upkeep
    def check_apps(self) -> None:
        for name, proc in self.procs.items():
            if proc is not None and proc.poll() is not None:
                raise AppError(f"{name} exited (code {proc.returncode}) during the episode")

    def release(self) -> None:
        """Release every key and button (episode end, reset, a failed action); nothing on a dead desktop."""
        try:
            self.desktop.release_all()
        except (DesktopError, OSError):
            pass

    def stop_apps(self) -> None:
        for adapter in self.apps.values():
            try:
                adapter.close()
            except Exception:  # noqa: BLE001 - closing connections of a dead app
                pass
        for proc in self.procs.values():
            try:
                self.desktop.kill_group(proc)
            except (DesktopError, OSError):
                pass
        self.procs.clear()
        if self.home:
            shutil.rmtree(self.home, ignore_errors=True)
            self.home = None

    def close(self) -> None:
        try:
            self.stop_apps()
        finally:
            self.desktop.stop()


class Spare:
    """The swap reset: a second Session on a second desktop, prepared on a thread for the next episode.

    After each reset the env hands the session it just left here (`prepare`); a worker thread stops its apps
    and launches them afresh for the likeliest next task, so the next reset swaps the two sessions (`take`)
    and only applies what preparing could not know (a task's "app" operations when the next task was a
    guess). A wrong guess costs only the spare's work: that reset is an ordinary one. The spare's apps are
    sealed as any app (same backend, same sandbox) and stopped with the env (`close`). The worker works on
    its own desktop only (its own X connection, a11y bus and processes) and competes with the episode for
    CPU, which is why it is opt-in where cores are few.

    The worker is one thread for the env's life, not one per preparation: the sandbox starts apps with
    bubblewrap's --die-with-parent, whose parent-death signal fires when the *thread* that started them
    exits, so a thread that ended after preparing would take its apps with it."""

    def __init__(self, session: Session):
        self.session: Session | None = session
        self.error: str | None = None  # why the last preparation failed (the next reset is an ordinary one)
        self._jobs: queue.Queue = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="coda-spare", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            session, task, sure, settle = job
            try:
                session.prepare(task, sure, lambda: settle(session.desktop))
            except Exception as e:  # noqa: BLE001 - any failure makes the next reset an ordinary one
                session.prepared = None
                if not self._closed:
                    self.error = f"{type(e).__name__}: {e}"
            finally:
                self._idle.set()

    def prepare(self, session: Session, task: Task, sure: bool, settle: Callable[[Desktop], Any]) -> None:
        """Start preparing `session` for `task` (apply its "app" operations too when `sure`)."""
        self.wait()
        if self._closed:
            return
        self.session, self.error = session, None
        self._idle.clear()
        self._jobs.put((session, task, sure, settle))

    def wait(self) -> None:
        """Until the preparation in flight (if any) is over."""
        self._idle.wait()

    def take(self, current: Session) -> Session:
        """The spare session once its preparation is over; `current` goes spare in its place. The caller's
        `begin` decides whether the prepared apps fit the task."""
        self.wait()
        spare, self.session = self.session, current
        return spare if spare is not None else current

    def close(self) -> None:
        """Wait for a preparation in flight (stopping a desktop while another thread starts it would race;
        a preparation is bounded by the app's ready timeout), end the worker, close the spare session."""
        self._closed = True
        self.wait()
        self._jobs.put(None)
        self._thread.join()
        if self.session is not None:
            self.session.close()
            self.session = None
