"""CodaEnv: one real desktop application as a Gymnasium environment.

Gymnasium's face over a `Session` (session.py: the desktop and the apps, reset after reset), the task
files (tasks.py), the checks (checks.py) and a scorer (scoring.py). The env knows no app: the app's package
registered its adapter, check types and setup operations (`coda_env.registry`).

## Observation space
`Dict(screenshot=Box(0, 255, (H, W, 3), uint8), instruction=Text[, a11y_tree=Text])`, 1280x800 by default.

## Action space
`Text`: a pyautogui code string (or `DONE`/`FAIL`/`WAIT`/`ANS <text>`), parsed and whitelisted by
`coda_env.actions`, never executed; with action_mode="structured", the `Dict` of `actions.structured_space`.

## Reward
0 until the episode ends; then the task's checks give 1.0 or 0.0, or any scorer (`coda_env.scoring`, e.g.
the agent package's VLM judge) given as `reward=` scores the episode. The checks always run: info["success"]
and info["checks"] are theirs, info["judge"] the scorer's details. A scorer that fails gives reward 0.0
and info["error"] naming it.

## Episode end
Terminated by DONE, FAIL or ANS; truncated after the task's `steps` (or `max_steps`), or when the app or
the desktop dies (info["error"] says which; the next reset recovers).

## Arguments
`app`, `backend` ("local" | "libvirt" | ..., coda_env.backends.BACKENDS), `desktop` (one built by the caller:
tests, custom backends), `task`/`tasks`/`task_dirs` (`tasks` may name task families, or be "families" for
all of the app's: each reset then draws an instance, `split` saying of which split; coda_env.families),
`screen`, `reward`, `action_mode`, `render_mode`,
`max_steps`, `a11y_tree`, `settle_timeout`/`settle_quiet` (after every action, and between the statements
of one, the env waits until the screen is unchanged for settle_quiet seconds, at most settle_timeout: no
fixed sleep), `ready_timeout`,
`info_timings` (per-phase timings in info; always in `env.unwrapped.timings`), `backend_options`, `sandbox`,
`swap_reset` (prepare the next episode's apps on a second desktop while an episode runs, so that reset
swaps them in: session.Spare; default on where at least 4 cores are free to this process, off otherwise;
`upcoming_task` tells it the next task when a runner knows it).

## Version history
- v0: the first version.
"""

from __future__ import annotations

import os
import string
import time
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .actions import TERMINAL_KINDS, Action, ActionError, from_structured, parse_action, structured_space
from .backends import DEFAULT_BACKEND, get_backend, make_desktop
from .backends.base import Desktop, DesktopError
from .checks import run_checks
from .registry import App, AppError, CheckContext, get_app_spec
from .scoring import Episode, FrameKeeper, Scorer, ScoringError
from .session import Session, Spare
from . import families
from .tasks import Task, TaskError, load_tasks

CHARSET = string.printable + "".join(chr(c) for c in range(0xA0, 0x3000))
MAX_TEXT = 10_000


class Text(spaces.Text):
    """gymnasium's Text space with a repr a person can read (the charset has 12,000 characters)."""

    def __repr__(self) -> str:
        return f"Text({self.min_length}, {self.max_length}, charset=<{len(self.character_set)} characters>)"


ObsType = dict[str, Any]
ActType = Any  # a str (action_mode="text") or a dict of arrays (action_mode="structured")


class CodaEnv(gym.Env[ObsType, ActType]):
    """A real app on a private desktop; tasks from the app package, CODA_TASKS_PATH and `task_dirs`
    (the module docstring is the env's card: spaces, reward, episode end, arguments)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        app: str,
        backend: str = DEFAULT_BACKEND,
        task: str | None = None,
        tasks: Sequence[str] | str | None = None,
        split: str | None = None,
        task_dirs: Sequence[str] | None = None,
        screen: tuple[int, int] = (1280, 800),
        reward: str | Scorer = "check",
        action_mode: str = "text",
        render_mode: str | None = None,
        max_steps: int | None = None,
        a11y_tree: bool = False,
        settle_timeout: float = 2.0,
        settle_quiet: float = 0.05,
        ready_timeout: float | None = None,
        info_timings: bool = False,
        backend_options: dict | None = None,
        sandbox: bool = True,
        desktop: Desktop | None = None,
        swap_reset: bool | None = None,
    ):
        if isinstance(reward, str):
            if reward != "check":
                raise ValueError(
                    f"reward must be 'check' or a scorer object (coda_env.scoring.Scorer), got "
                    f"{reward!r}; for the VLM judge: reward=Judge({{'models': [...]}}) (the agent package's judge)"
                )
            self.scorer: Scorer | None = None
        elif isinstance(reward, Scorer):
            self.scorer = reward  # public: a trainer may swap in another scorer between episodes
        else:
            raise TypeError(
                f"reward must be 'check' or a scorer with score(episode) and history_size, got {type(reward).__name__}"
            )
        if action_mode not in ("text", "structured"):
            raise ValueError("action_mode must be 'text' or 'structured'")
        if render_mode not in (None, "rgb_array"):
            raise ValueError("render_mode must be None or 'rgb_array'")
        self.spec_app = get_app_spec(app)
        if desktop is None and get_backend(backend).apps_on_host:  # on a VM the image decides
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
        fams = families.families(app)
        self.tasks = families.TaskSet(load_tasks(app, self.task_dirs), fams)
        if tasks == "families":
            wanted = families.pick_families(app, "families")
        elif isinstance(tasks, str):
            raise TaskError(f"tasks must be a list of task ids and family names, or 'families'; got {tasks!r}")
        else:
            wanted = [task] if task is not None else list(tasks or [])
            if "families" in wanted and "families" not in self.tasks:  # a command line's `--tasks families`
                wanted = [t for t in wanted if t != "families"] + families.pick_families(app, "families")
        unknown = [t for t in wanted if t not in self.tasks and t not in fams]
        if unknown:
            raise TaskError(
                f"unknown task{'s' if len(unknown) > 1 else ''} for app {app!r}: "
                f"{', '.join(map(repr, unknown))} (`coda tasks {app}` lists them, `--families` its families)"
            )
        if split is not None and split not in families.SPLITS:
            raise TaskError(f"split must be one of {', '.join(families.SPLITS)}, got {split!r}")
        if split is not None and not any(t in fams for t in wanted):
            raise TaskError("split= draws family instances: name families in tasks= (or tasks='families')")
        if not self.tasks and not wanted:
            raise TaskError(f"app {app!r} has no valid tasks (`coda tasks {app}` lists broken files)")
        self.split = split
        self.task_ids = wanted or list(self.tasks)  # task ids, and family names (an instance drawn per reset)
        obs = {
            "screenshot": spaces.Box(0, 255, (self.height, self.width, 3), np.uint8),
            "instruction": Text(max_length=MAX_TEXT, charset=CHARSET),
        }
        if a11y_tree:
            obs["a11y_tree"] = Text(max_length=1_000_000, charset=CHARSET, min_length=0)
        self.observation_space = spaces.Dict(obs)
        self.action_space = (
            Text(max_length=MAX_TEXT, charset=CHARSET) if action_mode == "text" else structured_space(screen)
        )
        # sandbox: every app sealed (no privileges, no network, its home the only writable place); on the
        # local backend a machine that cannot make sandboxes refuses here, naming the cause and sandbox=False
        self.desktop = (
            desktop
            if desktop is not None
            else make_desktop(backend, self.width, self.height, sandbox=sandbox, **(backend_options or {}))
        )
        # how long an app may take to start: a VM under software emulation needs far longer than Xvfb
        self.ready_timeout = float(ready_timeout if ready_timeout is not None else self.desktop.app_timeout)
        self.session = Session(self.desktop, app, self.ready_timeout)
        if swap_reset is None:  # the spare's preparation competes with the episode for the cores
            swap_reset = desktop is None and len(os.sched_getaffinity(0)) >= 4
        elif swap_reset and desktop is not None:
            raise ValueError("swap_reset needs a second desktop of the backend; it cannot be used with desktop=")
        self._spare: Spare | None = None
        if swap_reset:
            spare = make_desktop(backend, self.width, self.height, sandbox=sandbox, **(backend_options or {}))
            self._spare = Spare(Session(spare, app, self.ready_timeout))
        # A runner that knows the task after the next reset may say so here before the episode's first step
        # (swap_reset prepares it); read then, and cleared
        self.upcoming_task: str | None = None
        self._spare_due: bool | None = None  # the spare is to be prepared at the next step (by_name)
        self.task: Task | None = None
        self._obs: dict[str, Any] | None = None
        self._steps = 0
        self._done = True
        self._answer: str | None = None
        # scorer only: what a judge is shown of the episode's earlier screens
        self._keeper = FrameKeeper(self.scorer.history_size if self.scorer is not None else None)
        # The task of the next reset when its options name none: how a runner assigns tasks to the envs of
        # a vector env (`envs.set_attr("next_task", [...])`), whose autoreset passes no options. Used once.
        self.next_task: str | None = None

    # ----------------------------------------------------------------------------------------- the session's
    @property
    def app(self) -> App:
        """The main app's adapter."""
        return self.session.adapter(self.app_name)

    @property
    def apps(self) -> dict[str, App]:
        return self.session.apps

    @property
    def procs(self) -> dict[str, Any]:
        return self.session.procs

    @property
    def snapshots(self) -> bool:
        return self.session.snapshots

    @property
    def _frames(self) -> list[np.ndarray]:
        """The screens kept for the scorer so far (scoring.FrameKeeper)."""
        return self._keeper.frames

    @property
    def _home(self) -> str | None:
        """The episode's home folder (the app's HOME, its files)."""
        return self.session.home

    def _settle(self, timeout: float | None = None, desktop: Desktop | None = None) -> tuple[np.ndarray, float]:
        """Poll screenshots until the screen is unchanged for settle_quiet seconds (or timeout)."""
        desktop = desktop or self.desktop
        t0 = time.monotonic()
        limit = t0 + (self.settle_timeout if timeout is None else timeout)
        last = desktop.screenshot()
        changed = time.monotonic()
        while True:
            now = time.monotonic()
            if now - changed >= self.settle_quiet or now >= limit:
                return last, now - t0
            time.sleep(0.01)
            cur = desktop.screenshot()
            if not np.array_equal(cur, last):
                last, changed = cur, time.monotonic()

    def _prepare_next(self, by_name: bool) -> None:
        """Start preparing the spare for the likeliest next task: the one a runner announced
        (`upcoming_task`: sure, its "app" operations applied too), else a guess whose "app" operations wait
        for the reset: the task just named again (a trainer's G episodes of one task), or the env's own next
        draw."""
        wanted, self.upcoming_task = self.upcoming_task, None
        if wanted in self.tasks:
            task, sure = self.tasks[wanted], True
        elif by_name:
            task, sure = self.task, False
        else:
            peek = np.random.Generator(type(self.np_random.bit_generator)())
            peek.bit_generator.state = self.np_random.bit_generator.state
            task, sure = self._draw(peek), False
        self._spare.prepare(self._spare.session, task, sure, lambda d: self._settle(desktop=d))

    def _observation(self, frame: np.ndarray) -> dict[str, Any]:
        obs = {"screenshot": frame, "instruction": self.task.instruction if self.task else ""}
        if self.want_a11y:
            try:
                obs["a11y_tree"] = self.app.a11y_text(self.desktop)[:1_000_000]
            except (AppError, DesktopError) as e:
                obs["a11y_tree"] = f"(accessibility tree unavailable: {e})"
        return obs

    def _pick_task(self, options: dict | None) -> Task:
        wanted = (options or {}).get("task")
        if wanted is None and self.next_task is not None:
            wanted, self.next_task = self.next_task, None
        if wanted is not None:
            if wanted not in self.tasks:
                raise TaskError(f"unknown task {wanted!r} for app {self.app_name!r}")
            return self.tasks[wanted]
        return self._draw(self.np_random)

    def _draw(self, rng: np.random.Generator) -> Task:
        """A task of task_ids drawn with `rng`; a family name there stands for an instance of `split`."""
        pick = self.task_ids[int(rng.integers(len(self.task_ids)))]
        fam = self.tasks.families.get(pick)
        return fam.draw(rng, self.split) if fam is not None and pick not in self.tasks.static else self.tasks[pick]

    # ----------------------------------------------------------------------------------------- API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        timings: dict[str, float] = {}
        t0 = time.monotonic()
        by_name = (options or {}).get("task") is not None or self.next_task is not None
        self.task = self._pick_task(options)
        if self._spare is not None:  # swap in the session prepared during the last episode
            self.session = self._spare.take(self.session)
            self.desktop = self.session.desktop
            timings["swap"] = time.monotonic() - t0
        self.session.begin(self.task, timings, self._settle)
        frame, timings["settle"] = self._settle()
        timings["reset"] = time.monotonic() - t0
        # the spare is prepared from the first step on, so that a runner can announce `upcoming_task` first
        self._spare_due = by_name if self._spare is not None else None
        self._obs = self._observation(frame)
        self._steps, self._done, self._answer = 0, False, None
        if self.scorer is not None:
            self._keeper.size = self.scorer.history_size  # a trainer may have swapped the scorer
            self._keeper.clear()
            self._keeper.keep(frame)
        self.timings = timings
        info = {"task": self.task.id, "instruction": self.task.instruction}
        if self.info_timings:
            info["timings"] = timings
        return self._obs, info

    def _run_actions(self, acts: list[Action], info: dict) -> None:
        """Perform the non-terminal actions in order. A statement that the desktop cannot perform (not a dead
        desktop: that raises on) stops the action there: info['action_error'] says which statement failed
        and that the earlier ones ran, and anything left pressed is released. Between two statements the
        screen settles first, as a person's hand pauses: a key sent the instant after a click can reach the app
        before it has handled the click (KAlgebra took 1 in 5 of a click, ctrl+a, backspace as a plain
        backspace; pyautogui itself pauses 0.1 s after every call)."""
        done = 0
        for k, a in enumerate(acts):
            if a.kind in TERMINAL_KINDS:
                continue
            if done:
                self._settle()
            done += 1
            try:
                self.desktop.input(a)
            except (DesktopError, OSError):
                self.session.release()
                raise
            except Exception as e:  # noqa: BLE001 - an action the desktop refused: the agent's error
                self.session.release()
                ran = f"statements 1-{k} ran" if k > 1 else "statement 1 ran" if k == 1 else "nothing ran"
                info["action_error"] = (
                    f"statement {k + 1} of {len(acts)} ({a.to_pyautogui()}) failed: {type(e).__name__}: {e}; {ran}"
                )
                return

    def step(self, action):
        if self._done or self.task is None:
            raise gym.error.ResetNeeded("call reset() before step() (the episode is over)")
        self._steps += 1
        if self._spare_due is not None:
            self._prepare_next(self._spare_due)
            self._spare_due = None
        info: dict[str, Any] = {"task": self.task.id, "step": self._steps, "action_error": None}
        timings: dict[str, float] = {}
        self.timings = timings
        if self.info_timings:
            info["timings"] = timings
        t0 = time.monotonic()
        try:
            acts = (
                parse_action(action, (self.width, self.height))
                if self.action_mode == "text"
                else from_structured(action, (self.width, self.height))
            )
        except ActionError as e:
            acts = []
            info["action_error"] = str(e)
        terminal = next((a for a in acts if a.kind in TERMINAL_KINDS), None)
        try:
            self._run_actions(acts, info)
            timings["action"] = time.monotonic() - t0
            self.session.check_apps()
            wait = any(a.kind == "wait" for a in acts)
            frame, timings["settle"] = self._settle(timeout=self.settle_timeout * (2 if wait else 1))
            t1 = time.monotonic()
            self._obs = self._observation(frame)
            timings["screenshot"] = time.monotonic() - t1
            if self.scorer is not None:
                self._keeper.keep(frame)
        except (DesktopError, AppError, OSError) as e:
            return self._crash(e, info)
        budget = self.max_steps or self.task.steps
        terminated = terminal is not None
        truncated = not terminated and self._steps >= budget
        reward = 0.0
        if terminated or truncated:
            self.session.release()
            if terminal is not None and terminal.kind == "answer":
                self._answer = terminal.text
            t2 = time.monotonic()
            try:
                self.session.check_apps()
                reward, info = self._evaluate(info, terminal)
            except (DesktopError, AppError, OSError) as e:
                return self._crash(e, info)
            timings["evaluate"] = time.monotonic() - t2
            self._done = True
        return self._obs, reward, terminated, truncated, info

    def _evaluate(self, info: dict, terminal: Action | None) -> tuple[float, dict]:
        states = {name: self.apps[name].state(self.desktop) for name in self.task.all_apps}
        # FAIL is an answer too: an infeasible task is solved by {"type": "answer", "value": "FAIL"}
        answer = "FAIL" if terminal is not None and terminal.kind == "fail" else self._answer
        ctx = CheckContext(
            answer=answer,
            task=self.task,
            desktop=self.desktop,
            home=self._home,
            state=states[self.app_name],
            states=states,
        )
        ok, results = run_checks(self.task.evaluate, ctx)
        info["success"] = ok
        info["checks"] = [{"passed": r.passed, "type": r.check["type"], "detail": r.detail} for r in results]
        info["answer"] = answer
        if self.scorer is None:
            return (1.0 if ok else 0.0), info
        return self._score(info, answer), info

    def _score(self, info: dict, answer: str | None) -> float:
        """Ask the scorer about the episode; its failure is the episode's error, not the env's."""
        earlier = self._keeper.earlier()
        t0 = time.monotonic()
        try:
            result = self.scorer.score(
                Episode(
                    self.task.id,
                    self.app_name,
                    self.task.instruction,
                    self._obs["screenshot"],
                    earlier,
                    answer,
                    info["success"],
                    info["checks"],
                )
            )
        except ScoringError as e:
            info["error"] = f"{type(e).__name__}: {e}"
            return 0.0
        finally:
            self.timings["judge"] = time.monotonic() - t0
            self._keeper.clear()
        info["judge"] = result.details
        return float(result.reward)

    def _crash(self, error: Exception, info: dict):
        """The app or the desktop died: end the episode as truncated and say why; reset() recovers."""
        info["error"] = f"{type(error).__name__}: {error}"
        info["success"] = False
        self._done = True
        if not self.desktop.alive():
            self.desktop.stop()
        if self._obs is not None:  # a fresh object: never the previous step's observation again
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
            if self._spare is not None:
                self._spare.close()
        finally:
            self.session.close()
            super().close()
