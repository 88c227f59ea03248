"""One env's desktop and the apps on it, episode after episode: what a reset does before the first observation.

The env (`env.py`) is Gymnasium's face; this is its coordinator and task manager, as android_env splits
them. A `Session` owns the adapters and processes of the apps, and the per-episode home: it reverts to the
desktop's snapshot where the desktop has snapshots (a VM) and the same apps are saved there, and otherwise
boots the desktop if needed, makes a fresh home, runs the task's "files" setup operations, launches every
app of the task, polls each until ready (never a fixed wait), saves a snapshot where it can, and runs the
"app" setup operations. It knows no app: adapters and setup operations come from the registry.
"""

from __future__ import annotations

import shutil
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

    def adapter(self, name: str) -> App:
        if name not in self.apps:
            self.apps[name] = get_app_spec(name).adapter()
        return self.apps[name]

    # ------------------------------------------------------------------------------------------- episodes
    def begin(self, task: Task, timings: dict[str, float], settle: Callable[[], Any]) -> None:
        """Make the desktop and apps ready for `task` (timings: desktop, launch, setup). `settle` waits for
        the screen after each "app" setup operation."""
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
        for op in task.initialize:
            if SETUP_OPS[op["func"]].phase == "app":
                self.run_op(task, op, [])
                settle()
        timings["setup"] = time.monotonic() - t2

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
