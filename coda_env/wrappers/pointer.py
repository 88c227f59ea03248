"""PointerAction: a continuous pointer, Box [0, 1]^2 over the screen (or a region), plus an action type.

For continuous-control algorithms (PPO/SAC with Gaussian policies). SB3 takes one Box, so by default the
action is Box([0, 1]^3): x, y, and the type as a third coordinate split into len(kinds) equal bins (values
outside [0, 1] are clipped, as Gaussian policies produce them). `dict_space=True` gives
Dict(point=Box([0, 1]^2), kind=Discrete) instead, for libraries that handle composite actions.
"""

from __future__ import annotations

from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..actions import Action
from ._util import region_of, require_text_actions, screen_of

#: kind -> how a point becomes an action (None: the kind ignores the point)
POINTER_KINDS = {
    "click": ("left", 1),
    "double": ("left", 2),
    "right": ("right", 1),
    "move": None,
    "done": None,
    "wait": None,
}


class PointerAction(gym.ActionWrapper):
    def __init__(
        self,
        env: gym.Env,
        kinds: Sequence[str] = ("click", "double", "right", "done"),
        region: tuple[int, int, int, int] | None = None,
        dict_space: bool = False,
    ):
        super().__init__(env)
        require_text_actions(env, "PointerAction")
        bad = [k for k in kinds if k not in POINTER_KINDS]
        if bad or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {list(POINTER_KINDS)}, got {list(kinds)}")
        self.kinds, self.dict_space = tuple(kinds), dict_space
        self.region = region_of(region, screen_of(env))
        if dict_space:
            self.action_space = spaces.Dict(
                {"point": spaces.Box(0.0, 1.0, (2,), np.float32), "kind": spaces.Discrete(len(self.kinds))}
            )
        else:
            self.action_space = spaces.Box(0.0, 1.0, (3,), np.float32)

    def pixel(self, fx: float, fy: float) -> tuple[int, int]:
        """Fractions of the region (clipped to [0, 1]) -> a pixel inside it."""
        x0, y0, x1, y1 = self.region
        fx, fy = (float(np.clip(v, 0.0, 1.0)) for v in (fx, fy))
        return min(x1 - 1, int(x0 + fx * (x1 - x0))), min(y1 - 1, int(y0 + fy * (y1 - y0)))

    def action(self, action: Any) -> str:
        if self.dict_space:
            fx, fy = np.asarray(action["point"], dtype=np.float64).ravel()[:2]
            k = int(np.asarray(action["kind"]).item())
            if not 0 <= k < len(self.kinds):
                raise ValueError(f"PointerAction kind {k} is outside Discrete({len(self.kinds)})")
        else:
            a = np.asarray(action, dtype=np.float64).ravel()
            if a.shape != (3,) or not np.all(np.isfinite(a)):
                raise ValueError(f"PointerAction takes 3 finite numbers (x, y, kind), got {action!r}")
            fx, fy = a[0], a[1]
            k = min(len(self.kinds) - 1, int(np.clip(a[2], 0.0, 1.0) * len(self.kinds)))
        kind = self.kinds[k]
        if kind in ("done", "wait"):
            return kind.upper()
        x, y = self.pixel(fx, fy)
        if kind == "move":
            return Action("move", x=x, y=y).to_pyautogui()
        button, clicks = POINTER_KINDS[kind]
        return Action("click", x=x, y=y, button=button, clicks=clicks).to_pyautogui()
