"""FAKES for fast tests of logic (no X server, no app). Never the only test of a behaviour: the real-env
suites (e.g. test_train.py's learning test on KAlgebra) cover the same code paths end to end."""
from __future__ import annotations

from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
from gymnasium import spaces

FAKE_ENV_ID = "test/FakeAlternating-v0"


@dataclass
class FakeTask:
    id: str
    instruction: str
    app: str = "fake"
    difficulty: str = "easy"
    category: str = "fake"
    solution: list[str] = field(default_factory=lambda: ["DONE"])


class FakeAlternatingEnv(gym.Env):
    """A FAKE env with CodaEnv's interface as the trainers use it (tasks, app_name, width/height, next_task,
    info["task"], info["success"]). Screens are seeded noise; an episode ends at a terminal answer or after
    `max_steps`, and episodes are rewarded 1, 0, 1, 0, ... in the order the env runs them, whatever the agent
    did: noise, not a task. What a training-loop test needs from it is groups with unequal rewards."""
    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 1, width: int = 96, height: int = 64, tasks=("fake_a", "fake_b")):
        self.tasks = {t: FakeTask(t, f"Fake task {t}: answer anything.") for t in tasks}
        self.app_name, self.width, self.height, self.max_steps = "fake", width, height, max_steps
        self.observation_space = spaces.Dict({
            "screenshot": spaces.Box(0, 255, (height, width, 3), np.uint8),
            "instruction": spaces.Text(max_length=4096)})
        self.action_space = spaces.Text(max_length=4096)
        self.next_task: str | None = None
        self.episodes, self.task, self.t = 0, None, 0

    def _obs(self):
        shot = self.np_random.integers(0, 255, (self.height, self.width, 3), dtype=np.uint8)
        return {"screenshot": shot, "instruction": self.tasks[self.task].instruction}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task = (options or {}).get("task") or self.next_task or sorted(self.tasks)[0]
        self.next_task, self.t = None, 0
        return self._obs(), {"task": self.task}

    def step(self, action):
        self.t += 1
        terminal = str(action).split(" ")[0] in ("DONE", "FAIL", "ANS")
        truncated = not terminal and self.t >= self.max_steps
        reward, info = 0.0, {"task": self.task, "action_error": None}
        if terminal or truncated:
            reward = 1.0 if self.episodes % 2 == 0 else 0.0
            self.episodes += 1
            info["success"] = reward == 1.0
        return self._obs(), reward, terminal, truncated, info


if FAKE_ENV_ID not in gym.registry:
    gym.register(FAKE_ENV_ID, entry_point="tests.fakes:FakeAlternatingEnv", disable_env_checker=True)
