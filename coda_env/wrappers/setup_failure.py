"""A task whose set-up fails is one failed episode, not the end of a run.

A task file can validate on load and still fail when its reset sets it up (a GRASS location copied from a
folder that holds none, a KAlgebra expression KAlgebra refuses, an app that does not become ready). Raised
inside a vector env, that error ends the run: gymnasium's AsyncVectorEnv shuts the failing worker down and
re-raises. `SetupFailure` catches it in the env's own process instead: the reset answers a blank observation
(zeros; the task's instruction) with `info["setup_error"]` ("AppError: ..."), and the next step, whatever its
action, ends that empty episode at once (terminated, reward 0, `info["success"] = False`, `info["error"]`)
without touching the desktop, so a NEXT_STEP vector env resets the env to its next task. The env itself
recovers on that reset (it stops what the failed one started). A reset that fails before a task is chosen
(an unknown task id) is the caller's error and is raised as before.

    envs = gym.make_vec("coda/GRASS-v0", num_envs=2, wrappers=[SetupFailure], ...)

`coda eval` and the trainers' vector envs use it (coda_agent.rollout.make_vector_env); `run_episodes` records
such an episode as failed, with its error, and goes on.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class SetupFailure(gym.Wrapper):
    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._failed: dict[str, Any] | None = None  # the failed reset's task and error, until the next step

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        self._failed = None
        base = self.env.unwrapped
        wanted = (options or {}).get("task") or getattr(base, "next_task", None)
        try:
            return self.env.reset(seed=seed, options=options)
        except Exception as e:  # noqa: BLE001 - any failure of a chosen task's set-up: recorded, not raised
            task = getattr(base, "task", None)
            if task is None or (wanted is not None and task.id != wanted):
                raise  # no task was chosen: not a task's failure
            _unmark_reset_check(self.env)
            error = f"{type(e).__name__}: {e}"
            self._failed = {"task": task.id, "error": error}
            info = {"task": task.id, "instruction": task.instruction, "setup_error": error}
            return self._blank(task.instruction), info

    def step(self, action):
        if self._failed is None:
            return self.env.step(action)
        failed, self._failed = self._failed, None
        info = {
            "task": failed["task"],
            "success": False,
            "checks": [],
            "setup_error": failed["error"],
            "error": f"set-up failed: {failed['error']}",
        }
        return self._blank(""), 0.0, True, False, info

    def _blank(self, instruction: str) -> Any:
        space = self.observation_space
        if isinstance(space, spaces.Dict):
            return {k: _blank(s, instruction if k == "instruction" else "") for k, s in space.spaces.items()}
        return _blank(space, instruction)


def _unmark_reset_check(env: gym.Env) -> None:
    """gymnasium's PassiveEnvChecker (which gym.make adds) marks its first-reset check done even when that
    reset raised, and its first step then fails on the reset data it never stored (gymnasium 1.4). A reset
    that raised did not happen: the checker checks the next one."""
    from gymnasium.wrappers.common import PassiveEnvChecker

    while isinstance(env, gym.Wrapper):
        if isinstance(env, PassiveEnvChecker) and not env.checked_step and env._previous_data is None:
            env.checked_reset = False
        env = env.env


def _blank(space: spaces.Space, text: str) -> Any:
    if isinstance(space, spaces.Box):
        return np.zeros(space.shape, dtype=space.dtype)
    if isinstance(space, spaces.Text):
        return text[: space.max_length] if len(text) >= space.min_length else text.ljust(space.min_length)
    if isinstance(space, spaces.Dict):
        return {k: _blank(s, "") for k, s in space.spaces.items()}
    if isinstance(space, spaces.Discrete):
        return np.int64(space.start)
    return space.sample()
