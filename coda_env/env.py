"""CodaEnv: one real desktop application as a Gymnasium environment.

Observation: {"screenshot": (H, W, 3) uint8, "instruction": text[, "a11y_tree": text]}.
Action: a pyautogui code string (or `DONE`/`FAIL`/`WAIT`/`ANS <text>`), parsed and whitelisted by
`coda_env.actions`; or, with action_mode="structured", the array form of `actions.structured_space`.
Reward: 0 until the episode ends; then the task's checks give 1.0 or 0.0, or any scorer (`coda_env.scoring`,
e.g. the VLM judge of the agent package, `Judge`) given as `reward=` scores the episode. The checks always run:
info["success"]/["checks"] are theirs, info["judge"] the scorer's details. A scorer that fails gives reward
0.0 and info["error"] naming it.

The env knows no app: the app's package registered its adapter, check types and setup operations
(`coda_env.registry`), and the env calls them. After every action it waits until the screen has settled
(no change for `settle_quiet` seconds, at most `settle_timeout`) instead of sleeping a fixed time.
Per-phase timings of the last reset/step are in `env.unwrapped.timings`; `info_timings=True` also puts
them in `info` (off by default: gymnasium's check_env wants identical infos for identical steps).
"""
from __future__ import annotations

import errno
import shutil
import string
import tempfile
import time
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .actions import TERMINAL_KINDS, Action, ActionError, from_structured, parse_action, structured_space
from .backends import get_backend, make_desktop
from .backends.base import DesktopError
from .checks import run_checks
from .registry import (SETUP_OPS, App, AppError, CheckContext, LaunchContext, SetupContext, SetupError,
                       get_app_spec)
from .scoring import Episode, Scorer, ScoringError, fit_within
from .tasks import Task, TaskError, load_tasks

CHARSET = string.printable + "".join(chr(c) for c in range(0xA0, 0x3000))
MAX_TEXT = 10_000


class Text(spaces.Text):
    """gymnasium's Text space with a repr a person can read (the charset has 12,000 characters)."""

    def __repr__(self) -> str:
        return f"Text({self.min_length}, {self.max_length}, charset=<{len(self.character_set)} characters>)"


def _temp_folder(prefix: str, parent: str | None = None) -> str:
    try:
        return tempfile.mkdtemp(prefix=prefix, dir=parent)
    except OSError as e:
        where = parent or tempfile.gettempdir()
        hint = ("the disk is full: free space or " if e.errno == errno.ENOSPC else "")
        raise OSError(e.errno, f"cannot create a folder for the app in {where} ({e.strerror}): {hint}set TMPDIR "
                               f"to a writable folder with free space") from None


class CodaEnv(gym.Env):
    """A real app on a private desktop; tasks from the app package, CODA_TASKS_PATH and `task_dirs`."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, app: str, backend: str = "local", task: str | None = None,
                 tasks: Sequence[str] | None = None, task_dirs: Sequence[str] | None = None,
                 screen: tuple[int, int] = (1280, 800), reward: str | Scorer = "check",
                 action_mode: str = "text", render_mode: str | None = None, max_steps: int | None = None,
                 a11y_tree: bool = False, settle_timeout: float = 2.0, settle_quiet: float = 0.05,
                 ready_timeout: float | None = None, info_timings: bool = False,
                 backend_options: dict | None = None, sandbox: bool = True, judge: Any = None):
        if judge is not None:
            raise ValueError("judge= is gone: pass the scorer itself, e.g. reward=Judge({...}) (the agent "
                             "package's VLM judge)")
        if isinstance(reward, str):
            if reward != "check":
                raise ValueError(f"reward must be 'check' or a scorer object (coda_env.scoring.Scorer), got "
                                 f"{reward!r}; for the VLM judge: reward=Judge({{'models': [...]}}) (the agent package's judge)")
            self.scorer: Scorer | None = None
        elif isinstance(reward, Scorer):
            self.scorer = reward          # public: a trainer may swap in another scorer between episodes
        else:
            raise TypeError(f"reward must be 'check' or a scorer with score(episode) and history_size, got "
                            f"{type(reward).__name__}")
        if action_mode not in ("text", "structured"):
            raise ValueError("action_mode must be 'text' or 'structured'")
        if render_mode not in (None, "rgb_array"):
            raise ValueError("render_mode must be None or 'rgb_array'")
        self.spec_app = get_app_spec(app)
        if get_backend(backend).apps_on_host:   # on a VM the app lives in the guest: the image decides
            missing = self.spec_app.available()
            if missing:
                raise AppError(f"{self.spec_app.env_id} cannot run here: {missing}")
        self.app_name, self.backend_name = app, backend
        self.width, self.height = screen
        self.render_mode, self.action_mode = render_mode, action_mode
        self.max_steps, self.want_a11y = max_steps, a11y_tree
        self.settle_timeout, self.settle_quiet = settle_timeout, settle_quiet
        self.info_timings = info_timings
        self.timings: dict[str, float] = {}
        self.task_dirs = list(task_dirs or [])
        all_tasks = load_tasks(app, self.task_dirs)
        wanted = [task] if task is not None else list(tasks or [])
        unknown = [t for t in wanted if t not in all_tasks]
        if unknown:
            raise TaskError(f"unknown task{'s' if len(unknown) > 1 else ''} for app {app!r}: "
                            f"{', '.join(map(repr, unknown))} (`coda tasks {app}` lists them)")
        if not all_tasks:
            raise TaskError(f"app {app!r} has no valid tasks (`coda tasks {app}` lists broken files)")
        self.tasks = all_tasks
        self.task_ids = wanted or list(all_tasks)
        obs = {"screenshot": spaces.Box(0, 255, (self.height, self.width, 3), np.uint8),
               "instruction": Text(max_length=MAX_TEXT, charset=CHARSET)}
        if a11y_tree:
            obs["a11y_tree"] = Text(max_length=1_000_000, charset=CHARSET, min_length=0)
        self.observation_space = spaces.Dict(obs)
        self.action_space = (Text(max_length=MAX_TEXT, charset=CHARSET) if action_mode == "text"
                             else structured_space(screen))
        # sandbox: every app sealed (no privileges, no network, its home the only writable place); on the
        # local backend a machine that cannot make sandboxes refuses here, naming the cause and sandbox=False
        self.desktop = make_desktop(backend, self.width, self.height, sandbox=sandbox, **(backend_options or {}))
        self.snapshots = "snapshots" in self.desktop.capabilities
        # how long an app may take to start: a VM under software emulation needs far longer than Xvfb
        self.ready_timeout = float(ready_timeout if ready_timeout is not None else self.desktop.app_timeout)
        self.apps: dict[str, App] = {}          # adapters by app name (the main one, and a task's others)
        self.procs: dict[str, Any] = {}
        self.task: Task | None = None
        self._home: str | None = None
        self._obs: dict[str, Any] | None = None
        self._steps = 0
        self._done = True
        self._answer: str | None = None
        # scorer only: downscaled copies of the episode's screens, each kept only when it differs from the one
        # before (what a judge shows as earlier steps); the final screen is the observation itself
        self._frames: list[np.ndarray] = []
        self._frame_last: np.ndarray | None = None
        self._frame_kept = False
        # The task of the next reset when its options name none: how a runner assigns tasks to the envs of
        # a vector env (`envs.set_attr("next_task", [...])`), whose autoreset passes no options. Used once.
        self.next_task: str | None = None
        self._app_saved: tuple[str, ...] | None = None   # the apps in the desktop's snapshot (see reset)

    # ----------------------------------------------------------------------------------------- helpers
    @property
    def app(self) -> App:
        """The main app's adapter."""
        return self._adapter(self.app_name)

    def _adapter(self, name: str) -> App:
        if name not in self.apps:
            self.apps[name] = get_app_spec(name).adapter()
        return self.apps[name]

    def _settle(self, timeout: float | None = None) -> tuple[np.ndarray, float]:
        """Poll screenshots until the screen is unchanged for settle_quiet seconds (or timeout)."""
        t0 = time.monotonic()
        limit = t0 + (self.settle_timeout if timeout is None else timeout)
        last = self.desktop.screenshot()
        changed = time.monotonic()
        while True:
            now = time.monotonic()
            if now - changed >= self.settle_quiet or now >= limit:
                return last, now - t0
            time.sleep(0.01)
            cur = self.desktop.screenshot()
            if not np.array_equal(cur, last):
                last, changed = cur, time.monotonic()

    def _observation(self, frame: np.ndarray) -> dict[str, Any]:
        obs = {"screenshot": frame, "instruction": self.task.instruction if self.task else ""}
        if self.want_a11y:
            try:
                obs["a11y_tree"] = self.app.a11y_text(self.desktop)[: 1_000_000]
            except (AppError, DesktopError) as e:
                obs["a11y_tree"] = f"(accessibility tree unavailable: {e})"
        return obs

    def _stop_apps(self) -> None:
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
        if self._home:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def _pick_task(self, options: dict | None) -> Task:
        wanted = (options or {}).get("task")
        if wanted is None and self.next_task is not None:
            wanted, self.next_task = self.next_task, None
        if wanted is not None:
            if wanted not in self.tasks:
                raise TaskError(f"unknown task {wanted!r} for app {self.app_name!r}")
            return self.tasks[wanted]
        return self.tasks[self.task_ids[int(self.np_random.integers(len(self.task_ids)))]]

    def _release(self) -> None:
        try:
            self.desktop.release_all()
        except (DesktopError, OSError):
            pass

    # ----------------------------------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        timings: dict[str, float] = {}
        t0 = time.monotonic()
        self.task = self._pick_task(options)
        apps = self.task.all_apps
        self._release()
        # A desktop with snapshots (a VM) saves one once the apps are up; every later reset of the same apps
        # reverts to it and they come back running and ready. Any other desktop restarts the apps.
        reverted = False
        if self.snapshots and self._app_saved == apps and self.desktop.alive():
            for a in self.apps.values():
                a.close()                     # connections only: the apps are part of the snapshot
            try:
                self.desktop.reset()
                self._check_apps()
                reverted = True
            except (DesktopError, AppError):  # a failed revert: boot afresh below instead of retrying it
                self.desktop.stop()
        if not reverted:
            self._stop_apps()
            self._app_saved = None
            if not self.desktop.alive():
                self.desktop.start()
            elif self.snapshots:              # a snapshot desktop before its app checkpoint
                self.desktop.reset()
        timings["desktop"] = time.monotonic() - t0
        t1 = time.monotonic()
        if not reverted:
            # inside the desktop's own folder where it has one (local): removed with it however we end
            self._home = _temp_folder(f"coda-{self.app_name}-", self.desktop.tmpdir)
            files_ops = [op for op in self.task.initialize if SETUP_OPS[op["func"]].phase == "files"]
            open_files: list[str] = []
            for op in files_ops:
                self._run_op(op, open_files)
            for name in apps:
                adapter = self._adapter(name)
                self.procs[name] = adapter.launch(LaunchContext(self.desktop, self._home, self.task,
                                                                list(open_files)))
            deadline = time.monotonic() + self.ready_timeout
            for name in apps:
                while not self.apps[name].ready(self.desktop):
                    if time.monotonic() > deadline:
                        raise AppError(f"{name} did not become ready within {self.ready_timeout:g}s")
                    time.sleep(0.01)
            if self.snapshots:
                self.desktop.checkpoint("+".join(apps))
                self._app_saved = apps
        timings["launch"] = time.monotonic() - t1
        t2 = time.monotonic()
        for op in self.task.initialize:
            if SETUP_OPS[op["func"]].phase == "app":
                self._run_op(op, [])
                self._settle()
        timings["setup"] = time.monotonic() - t2
        frame, timings["settle"] = self._settle()
        timings["reset"] = time.monotonic() - t0
        self._obs = self._observation(frame)
        self._steps, self._done, self._answer = 0, False, None
        if self.scorer is not None:
            self._frames, self._frame_last = [], None
            self._keep_frame(frame)
        self.timings = timings
        info = {"task": self.task.id, "instruction": self.task.instruction}
        if self.info_timings:
            info["timings"] = timings
        return self._obs, info

    def _run_op(self, op: dict, open_files: list[str]) -> None:
        s = SETUP_OPS[op["func"]]
        adapter = self._adapter(s.app or self.app_name)
        home = self._home or ""
        try:
            s.run(SetupContext(self.desktop, adapter, home, self.task, open_files), op)
        except SetupError as e:
            raise TaskError(f"task {self.task.id!r}: setup {op['func']!r}: {e}") from None

    def _run_actions(self, acts: list[Action], info: dict) -> None:
        """Perform the non-terminal actions in order. A statement that the desktop cannot perform (not a dead
        desktop: that raises on) stops the action there: info['action_error'] says which statement failed
        and that the earlier ones ran, and anything left pressed is released."""
        for k, a in enumerate(acts):
            if a.kind in TERMINAL_KINDS:
                continue
            try:
                self.desktop.input(a)
            except (DesktopError, OSError):
                self._release()
                raise
            except Exception as e:  # noqa: BLE001 - an action the desktop refused: the agent's error
                self._release()
                ran = f"statements 1-{k} ran" if k > 1 else "statement 1 ran" if k == 1 else "nothing ran"
                info["action_error"] = (f"statement {k + 1} of {len(acts)} ({a.to_pyautogui()}) failed: "
                                        f"{type(e).__name__}: {e}; {ran}")
                return

    def step(self, action):
        if self._done or self.task is None:
            raise gym.error.ResetNeeded("call reset() before step() (the episode is over)")
        self._steps += 1
        info: dict[str, Any] = {"task": self.task.id, "step": self._steps, "action_error": None}
        timings: dict[str, float] = {}
        self.timings = timings
        if self.info_timings:
            info["timings"] = timings
        t0 = time.monotonic()
        try:
            acts = (parse_action(action, (self.width, self.height)) if self.action_mode == "text"
                    else from_structured(action, (self.width, self.height)))
        except ActionError as e:
            acts = []
            info["action_error"] = str(e)
        terminal = next((a for a in acts if a.kind in TERMINAL_KINDS), None)
        try:
            self._run_actions(acts, info)
            timings["action"] = time.monotonic() - t0
            self._check_apps()
            wait = any(a.kind == "wait" for a in acts)
            frame, timings["settle"] = self._settle(timeout=self.settle_timeout * (2 if wait else 1))
            t1 = time.monotonic()
            self._obs = self._observation(frame)
            timings["screenshot"] = time.monotonic() - t1
            if self.scorer is not None:
                self._keep_frame(frame)
        except (DesktopError, AppError, OSError) as e:
            return self._crash(e, info)
        budget = self.max_steps or self.task.steps
        terminated = terminal is not None
        truncated = not terminated and self._steps >= budget
        reward = 0.0
        if terminated or truncated:
            self._release()
            if terminal is not None and terminal.kind == "answer":
                self._answer = terminal.text
            t2 = time.monotonic()
            try:
                self._check_apps()
                reward, info = self._evaluate(info, terminal)
            except (DesktopError, AppError, OSError) as e:
                return self._crash(e, info)
            timings["evaluate"] = time.monotonic() - t2
            self._done = True
        return self._obs, reward, terminated, truncated, info

    def _check_apps(self) -> None:
        for name, proc in self.procs.items():
            if proc is not None and proc.poll() is not None:
                raise AppError(f"{name} exited (code {proc.returncode}) during the episode")

    def _evaluate(self, info: dict, terminal: Action | None) -> tuple[float, dict]:
        states = {name: self.apps[name].state(self.desktop) for name in self.task.all_apps}
        # FAIL is an answer too: an infeasible task is solved by {"type": "answer", "value": "FAIL"}
        answer = "FAIL" if terminal is not None and terminal.kind == "fail" else self._answer
        ctx = CheckContext(answer=answer, task=self.task, desktop=self.desktop, home=self._home,
                           state=states[self.app_name], states=states)
        ok, results = run_checks(self.task.evaluate, ctx)
        info["success"] = ok
        info["checks"] = [{"passed": r.passed, "type": r.check["type"], "detail": r.detail} for r in results]
        info["answer"] = answer
        if self.scorer is None:
            return (1.0 if ok else 0.0), info
        return self._score(info, answer), info

    def _keep_frame(self, frame: np.ndarray) -> None:
        """Scorer mode: keep a downscaled copy of a screen that differs from the one before (about 6 ms)."""
        size = self.scorer.history_size
        self._frame_kept = bool(size) and (self._frame_last is None or not np.array_equal(frame, self._frame_last))
        if self._frame_kept:
            self._frames.append(fit_within(frame, size))
        self._frame_last = frame

    def _score(self, info: dict, answer: str | None) -> float:
        """Ask the scorer about the episode; its failure is the episode's error, not the env's."""
        # the final screen is shown at full size: drop its small copy when the last step kept one
        earlier = self._frames[:-1] if self._frame_kept else self._frames
        t0 = time.monotonic()
        try:
            result = self.scorer.score(Episode(self.task.id, self.app_name, self.task.instruction,
                                               self._obs["screenshot"], earlier, answer, info["success"],
                                               info["checks"]))
        except ScoringError as e:
            info["error"] = f"{type(e).__name__}: {e}"
            return 0.0
        finally:
            self.timings["judge"] = time.monotonic() - t0
            self._frames, self._frame_last = [], None
        info["judge"] = result.details
        return float(result.reward)

    def _crash(self, error: Exception, info: dict):
        """The app or the desktop died: end the episode as truncated and say why; reset() recovers."""
        info["error"] = f"{type(error).__name__}: {error}"
        info["success"] = False
        self._done = True
        if not self.desktop.alive():
            self.desktop.stop()
        if self._obs is not None:        # a fresh object: never the previous step's observation again
            obs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self._obs.items()}
        else:
            obs = self._observation(np.zeros((self.height, self.width, 3), np.uint8))
        self._obs = obs
        return obs, 0.0, False, True, info

    def render(self):
        if self.render_mode == "rgb_array" and self._obs is not None:
            return self._obs["screenshot"]
        return None

    def state(self) -> dict[str, Any]:
        """The main app's current state as the checks see it (for debugging tasks)."""
        return self.app.state(self.desktop)

    def close(self):
        try:
            self._stop_apps()
        finally:
            self.desktop.stop()
        super().close()
