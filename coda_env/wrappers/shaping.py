"""RewardShaping: optional dense terms added to the task's sparse reward; off (no terms) by default.

CodaEnv's reward is 0 until the episode ends and then the task's checks (1.0/0.0): the reward of record.
Shaping helps exploration but changes what is optimised, so this wrapper keeps the record: info["task_reward"]
is always the env's own reward and info["shaping"] the sum of the terms, while the returned reward is
task_reward + shaping. With no terms the reward is unchanged. A term is any callable ShapingContext -> float.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class ShapingContext:
    """What a shaping term sees of one step."""

    prev_obs: Any
    action: Any
    obs: Any
    reward: float  # the env's reward (the task's checks at the end)
    terminated: bool
    truncated: bool
    info: dict
    step: int  # 1 for the episode's first step


Shaper = Callable[[ShapingContext], float]


def _screen(obs: Any) -> np.ndarray | None:
    if isinstance(obs, dict):
        obs = obs.get("screenshot", obs.get("pixels"))
    return obs if isinstance(obs, np.ndarray) else None


def step_cost(cost: float = 0.01) -> Shaper:
    """-cost per step: prefers shorter solutions."""
    return lambda ctx: -float(cost)


def action_error_cost(cost: float = 0.05) -> Shaper:
    """-cost when the env rejected the action (info["action_error"])."""
    return lambda ctx: -float(cost) if ctx.info.get("action_error") else 0.0


def screen_change_bonus(bonus: float = 0.01) -> Shaper:
    """+bonus when the action changed the screen (an exploration signal; it can be farmed: keep it small)."""

    def term(ctx: ShapingContext) -> float:
        a, b = _screen(ctx.prev_obs), _screen(ctx.obs)
        return float(bonus) if a is not None and b is not None and not np.array_equal(a, b) else 0.0

    return term


class RewardShaping(gym.Wrapper):
    """reward = task reward + scale * sum(term(ctx) for term in shapers); info keeps both parts."""

    def __init__(self, env: gym.Env, shapers: Sequence[Shaper] = (), scale: float = 1.0):
        super().__init__(env)
        self.shapers, self.scale = tuple(shapers), float(scale)
        self._prev: Any = None
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._prev, self._steps = obs, 0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._steps += 1
        info = dict(info)
        info["task_reward"] = float(reward)
        bonus = 0.0
        if self.shapers:
            ctx = ShapingContext(
                self._prev, action, obs, float(reward), bool(terminated), bool(truncated), info, self._steps
            )
            bonus = self.scale * sum(float(s(ctx)) for s in self.shapers)
        info["shaping"] = bonus
        self._prev = obs
        return obs, float(reward) + bonus, terminated, truncated, info
