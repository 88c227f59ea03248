"""CodaEnv: one real desktop application as a Gymnasium environment.

Observation: {"screenshot": (H, W, 3) uint8, "instruction": text[, "a11y_tree": text]}.
Action: a pyautogui code string (or `DONE`/`FAIL`/`WAIT`/`ANS <text>`), parsed and whitelisted by
`coda_env.actions`; or, with action_mode="structured", the array form of `actions.structured_space`.
Reward: 0 until the episode ends; then, with reward="check", the task's checks give 1.0 or 0.0; with
reward="judge", a VLM judge (`coda_env.judge`) scores the episode's screens: 1.0/0.0 by the judge's threshold
(JudgeConfig.reward="binary", the default, on the checks' scale) or its score in [0, 1] (reward="score").
The checks still run in judge mode: info["success"]/["checks"] are theirs, info["judge"] the judge's, so
the two can be compared. A judge that fails (dead endpoint) gives reward 0.0 and info["error"] naming it.

After every action the env waits until the screen has settled (no change for `settle_quiet` seconds,
at most `settle_timeout`), instead of sleeping a fixed time.
"""
from __future__ import annotations

import shutil
import string
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .actions import TERMINAL_KINDS, Action, ActionError, from_structured, parse_action, structured_space
from .apps import AppError, get_app
from .backends.base import DesktopError, make_temp_dir
from .checks import run_checks
from .judge import JudgeError, fit_within, make_judge
from .tasks import Task, TaskError, load_tasks

CHARSET = string.printable + "".join(chr(c) for c in range(0xA0, 0x3000))
MAX_TEXT = 10_000


def make_desktop(backend: str, width: int, height: int, **kwargs):
    """A desktop of `backend` with the env's screen size; `kwargs` (backend_options) go to its config."""
    if backend == "local":
        from .backends.local import LocalConfig, LocalDesktop
        return LocalDesktop(LocalConfig(width=width, height=height, **kwargs))
    if backend == "libvirt":  # the module imports libvirt-python only when a desktop is made
        from .backends.libvirt import LibvirtConfig, LibvirtDesktop
        return LibvirtDesktop(LibvirtConfig(width=width, height=height, **kwargs))
    raise ValueError(f"unknown backend {backend!r}; available: 'local', 'libvirt'")


class CodaEnv(gym.Env):
    """A real app on a private desktop; tasks from `coda_env/tasks/<app>/`."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, app: str = "kalgebra", backend: str = "local", task: str | None = None,
                 tasks: list[str] | None = None, screen: tuple[int, int] = (1280, 800), reward: str = "check",
                 action_mode: str = "text", render_mode: str | None = None, max_steps: int | None = None,
                 a11y_tree: bool = False, settle_timeout: float = 2.0, settle_quiet: float = 0.05,
                 ready_timeout: float | None = None, info_timings: bool = True, backend_options: dict | None = None,
                 judge: Any = None):
        if reward not in ("check", "judge"):
            raise ValueError(f"reward must be 'check' or 'judge', got {reward!r}")
        if judge is not None and reward != "judge":
            raise ValueError("judge= is only used with reward='judge'")
        # reward="judge": a Judge, JudgeConfig or dict of its fields; its models load on first use. Public:
        # a trainer may swap in another Judge between episodes
        self.judge = make_judge(judge) if reward == "judge" else None
        if action_mode not in ("text", "structured"):
            raise ValueError("action_mode must be 'text' or 'structured'")
        if render_mode not in (None, "rgb_array"):
            raise ValueError("render_mode must be None or 'rgb_array'")
        self.app_name, self.backend_name = app, backend
        self.width, self.height = screen
        self.render_mode, self.action_mode = render_mode, action_mode
        self.max_steps, self.want_a11y = max_steps, a11y_tree
        self.settle_timeout, self.settle_quiet = settle_timeout, settle_quiet
        self._backend_options = backend_options or {}
        # Per-phase timings of the last reset/step are always in `self.timings`; they are also put in `info`
        # unless info_timings=False (gymnasium's check_env demands identical infos for identical seeds).
        self.info_timings = info_timings
        self.timings: dict[str, float] = {}
        all_tasks = load_tasks(app)
        if task is not None and task not in all_tasks:
            raise TaskError(f"unknown task {task!r} for app {app!r}")
        unknown = [t for t in (tasks or []) if t not in all_tasks]
        if unknown:
            raise TaskError(f"unknown tasks for app {app!r}: {unknown}")
        self.tasks = all_tasks
        self.task_ids = [task] if task else (list(tasks) if tasks else list(all_tasks))
        obs = {"screenshot": spaces.Box(0, 255, (self.height, self.width, 3), np.uint8),
               "instruction": spaces.Text(max_length=MAX_TEXT, charset=CHARSET)}
        if a11y_tree:
            obs["a11y_tree"] = spaces.Text(max_length=1_000_000, charset=CHARSET, min_length=0)
        self.observation_space = spaces.Dict(obs)
        self.action_space = (spaces.Text(max_length=MAX_TEXT, charset=CHARSET) if action_mode == "text"
                             else structured_space(screen))
        self.desktop = make_desktop(backend, self.width, self.height, **self._backend_options)
        # how long an app may take to start: a VM under software emulation needs far longer than Xvfb
        self.ready_timeout = float(ready_timeout if ready_timeout is not None
                                   else getattr(self.desktop, "app_timeout", 30.0))
        self.app = get_app(app)
        self.task: Task | None = None
        self._proc = None
        self._profile: str | None = None
        self._obs: dict[str, Any] | None = None
        self._steps = 0
        self._done = True
        # judge mode only: downscaled copies of the episode's screens, each kept only when it differs from the
        # screen before (what the judge shows as earlier steps); the final screen is the observation itself
        self._frames: list[np.ndarray] = []
        self._frame_last: np.ndarray | None = None
        self._frame_kept = False
        # The task of the next reset when its options name none: how a runner assigns tasks to the envs of
        # a vector env (`envs.set_attr("next_task", [...])`), whose autoreset passes no options. Used once.
        self.next_task: str | None = None
        self._app_saved = False  # the desktop's snapshot has the app running (see reset)

    # ----------------------------------------------------------------------------------------- helpers
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
                obs["a11y_tree"] = self.app.tree(self.desktop).to_text()[: 1_000_000]
            except (AppError, DesktopError) as e:
                obs["a11y_tree"] = f"(accessibility tree unavailable: {e})"
        return obs

    def _stop_app(self) -> None:
        self.app.close()
        if self._proc is not None:
            self.desktop.kill_group(self._proc)
            self._proc = None
        if self._profile:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    def _pick_task(self, options: dict | None) -> Task:
        wanted = (options or {}).get("task")
        if wanted is not None:
            if wanted not in self.tasks:
                raise TaskError(f"unknown task {wanted!r} for app {self.app_name!r}")
            return self.tasks[wanted]
        if self.next_task is not None:
            wanted, self.next_task = self.next_task, None
            if wanted not in self.tasks:
                raise TaskError(f"unknown task {wanted!r} for app {self.app_name!r}")
            return self.tasks[wanted]
        return self.tasks[self.task_ids[int(self.np_random.integers(len(self.task_ids)))]]

    # ----------------------------------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        timings: dict[str, float] = {}
        t0 = time.monotonic()
        self.task = self._pick_task(options)
        self._release_input()
        # A desktop with snapshots (a VM) saves one once the app is up (`checkpoint`); every later reset
        # reverts to it, and the app comes back running and ready. Any other desktop restarts the app.
        snapshots = hasattr(self.desktop, "checkpoint")
        reverted = False
        if snapshots and self._app_saved and self.desktop.alive():
            self.app.close()  # connections only: the app itself is part of the snapshot
            try:
                self.desktop.reset()
                self._check_app()
                reverted = True
            except (DesktopError, AppError):  # a failed revert: boot afresh below instead of retrying it
                self.desktop.stop()
        if not reverted:
            self._stop_app()
            self._app_saved = False
            if not self.desktop.alive():
                self.desktop.start()
            elif hasattr(self.desktop, "reset"):  # a snapshot desktop before its app checkpoint
                self.desktop.reset()
        timings["desktop"] = time.monotonic() - t0
        t1 = time.monotonic()
        if not self._app_saved:
            # inside the desktop's own folder where it has one: removed with it, however this process ends
            self._profile = make_temp_dir(f"coda-{self.app_name}-", getattr(self.desktop, "tmpdir", None),
                                          f"the home folder of {self.app_name}")
            self.desktop.app_home = self._profile
            self._proc = self.app.launch(self.desktop, self._profile)
        if not self._app_saved:  # (after a revert to the app's snapshot it is as it was when ready() passed)
            deadline = time.monotonic() + self.ready_timeout
            while not self.app.ready(self.desktop):
                if time.monotonic() > deadline:
                    raise AppError(f"{self.app_name} did not become ready within {self.ready_timeout}s")
                time.sleep(0.01)
        if snapshots and not self._app_saved:
            self.desktop.checkpoint(self.app_name)
            self._app_saved = True
        timings["launch"] = time.monotonic() - t1
        t2 = time.monotonic()
        for op in self.task.initialize:
            self.app.setup(self.desktop, op)
            self._settle()
        timings["setup"] = time.monotonic() - t2
        frame, timings["settle"] = self._settle()
        timings["reset"] = time.monotonic() - t0
        self._obs = self._observation(frame)
        self._steps, self._done, self._answer = 0, False, None
        if self.judge is not None:
            self._frames, self._frame_last = [], None
            self._keep_frame(frame)
        self.timings = timings
        info = {"task": self.task.id, "instruction": self.task.instruction}
        if self.info_timings:
            info["timings"] = timings
        return self._obs, info

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
            for a in acts:
                if a.kind not in TERMINAL_KINDS:
                    try:
                        self.desktop.input(a)
                    except ActionError as e:  # an action this desktop cannot perform (a key with no keysym)
                        info["action_error"] = str(e)
                        break
            timings["action"] = time.monotonic() - t0
            self._check_app()
            wait = any(a.kind == "wait" for a in acts)
            frame, timings["settle"] = self._settle(timeout=self.settle_timeout * (2 if wait else 1))
            t1 = time.monotonic()
            self._obs = self._observation(frame)
            timings["screenshot"] = time.monotonic() - t1
            if self.judge is not None:
                self._keep_frame(frame)
        except (DesktopError, AppError, OSError) as e:
            return self._crash(e, info)
        budget = self.max_steps or self.task.steps
        terminated = terminal is not None
        truncated = not terminated and self._steps >= budget
        reward = 0.0
        if terminated or truncated:
            if terminal is not None and terminal.kind == "answer":
                self._answer = terminal.text
            t2 = time.monotonic()
            try:
                self._check_app()
                reward, info = self._evaluate(info, terminal)
            except (DesktopError, AppError, OSError) as e:
                return self._crash(e, info)
            timings["evaluate"] = time.monotonic() - t2
            self._done = True
            self._release_input()
        return self._obs, reward, terminated, truncated, info

    def _check_app(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            raise AppError(f"{self.app_name} exited (code {self._proc.returncode}) during the episode")

    def _evaluate(self, info: dict, terminal: Action | None) -> tuple[float, dict]:
        state = self.app.state(self.desktop)
        # FAIL is an answer too: an infeasible task is solved by {"type": "answer", "value": "FAIL"}
        answer = "FAIL" if terminal is not None and terminal.kind == "fail" else self._answer
        ok, results = run_checks(self.task.evaluate, state, answer)
        info["success"] = ok
        info["checks"] = [{"passed": r.passed, "type": r.check["type"], "detail": r.detail} for r in results]
        info["answer"] = answer
        if self.judge is None:
            return (1.0 if ok else 0.0), info
        return self._judge_reward(info, answer), info

    def _keep_frame(self, frame: np.ndarray) -> None:
        """Judge mode: keep a downscaled copy of a screen that differs from the one before (about 6 ms)."""
        self._frame_kept = False
        if self.judge.config.history > 0 and (self._frame_last is None or not np.array_equal(frame, self._frame_last)):
            self._frames.append(fit_within(frame, self.judge.config.history_size))
            self._frame_kept = True
        self._frame_last = frame

    def _judge_reward(self, info: dict, answer: str | None) -> float:
        """Ask the judge about the episode; its failure is the episode's error, not the env's."""
        earlier = self._frames[:-1] if self._frame_kept else self._frames
        t0 = time.monotonic()
        try:
            result = self.judge.score(self.task.instruction, [*earlier, self._obs["screenshot"]], answer)
        except JudgeError as e:
            info["error"] = f"JudgeError: {e}"
            return 0.0
        finally:
            self.timings["judge"] = time.monotonic() - t0
            self._frames, self._frame_last = [], None
        info["judge"] = result.to_dict()
        if self.judge.config.reward == "score":
            return float(result.score)
        return 1.0 if result.success else 0.0

    def _crash(self, error: Exception, info: dict):
        """The app or the desktop died: end the episode as truncated and say why; reset() recovers."""
        info["error"] = f"{type(error).__name__}: {error}"
        info["success"] = False
        self._done = True
        self._release_input()
        if not self.desktop.alive():
            self.desktop.stop()
        obs = self._obs if self._obs is not None else self._observation(np.zeros((self.height, self.width, 3), np.uint8))
        return obs, 0.0, False, True, info

    def _release_input(self) -> None:
        """Release held keys and buttons, so that no episode inherits another's (a keyDown('shift') would
        otherwise stay down into the next episode); a desktop that cannot is stopped, and reset rebuilds it."""
        release = getattr(self.desktop, "release_all", None)
        if release is None or not self.desktop.alive():
            return
        try:
            release()
        except DesktopError:
            self.desktop.stop()

    def render(self):
        if self.render_mode == "rgb_array" and self._obs is not None:
            return self._obs["screenshot"]
        return None

    def state(self) -> dict[str, Any]:
        """The app's current state as the checks see it (for debugging tasks)."""
        return self.app.state(self.desktop)

    def close(self):
        try:
            self._stop_app()
        finally:
            self.desktop.stop()
        super().close()
