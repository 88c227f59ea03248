"""ClickGrid: Discrete(rows * cols * kinds [+ extras]) -> a click at the centre of a grid cell.

The cheapest action space a pixel agent can explore: every action is a click (single, double or right) at
the centre of one cell of a rows x cols grid laid over the screen, or over a `region` of it (a tab bar, a
toolbar) when the task family's targets lie there. `extra` appends whole action strings after the grid,
by default "DONE", so an agent can end an episode itself (a truncated episode is scored too).
"""

from __future__ import annotations

from typing import Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..actions import Action, parse_action
from ._util import region_of, require_text_actions, screen_of

#: kind name -> (button, clicks)
CLICK_KINDS = {"click": ("left", 1), "double": ("left", 2), "right": ("right", 1)}


class ClickGrid(gym.ActionWrapper):
    """Index i < rows*cols*len(kinds): kind i // (rows*cols), cell i % (rows*cols) in row-major order; then
    the `extra` actions in order."""

    def __init__(
        self,
        env: gym.Env,
        rows: int = 8,
        cols: int = 8,
        kinds: Sequence[str] = ("click", "double", "right"),
        region: tuple[int, int, int, int] | None = None,
        extra: Sequence[str] = ("DONE",),
    ):
        super().__init__(env)
        require_text_actions(env, "ClickGrid")
        if rows < 1 or cols < 1:
            raise ValueError(f"rows and cols must be >= 1, got {rows}x{cols}")
        bad = [k for k in kinds if k not in CLICK_KINDS]
        if bad or not kinds:
            raise ValueError(f"kinds must be a non-empty subset of {list(CLICK_KINDS)}, got {list(kinds)}")
        screen = screen_of(env)
        for a in extra:  # fail at construction, not mid-episode
            parse_action(a, screen)
        self.rows, self.cols, self.kinds, self.extra = int(rows), int(cols), tuple(kinds), tuple(extra)
        self.region = region_of(region, screen)
        self.cells = self.rows * self.cols
        self.action_space = spaces.Discrete(self.cells * len(self.kinds) + len(self.extra))

    def point(self, cell: int) -> tuple[int, int]:
        """Pixel centre of a cell (row-major)."""
        x0, y0, x1, y1 = self.region
        r, c = divmod(int(cell), self.cols)
        return int(x0 + (c + 0.5) * (x1 - x0) / self.cols), int(y0 + (r + 0.5) * (y1 - y0) / self.rows)

    def index(self, x: int, y: int, kind: str = "click") -> int:
        """The action that clicks the cell holding pixel (x, y) (what an oracle or a test picks)."""
        x0, y0, x1, y1 = self.region
        if not (x0 <= x < x1 and y0 <= y < y1):
            raise ValueError(f"({x}, {y}) is outside the grid's region {self.region}")
        c = min(self.cols - 1, int((x - x0) * self.cols / (x1 - x0)))
        r = min(self.rows - 1, int((y - y0) * self.rows / (y1 - y0)))
        return self.kinds.index(kind) * self.cells + r * self.cols + c

    def action(self, action) -> str:
        i = int(np.asarray(action).item())
        if not 0 <= i < self.action_space.n:
            raise ValueError(f"ClickGrid action {i} is outside Discrete({self.action_space.n})")
        if i >= self.cells * len(self.kinds):
            return self.extra[i - self.cells * len(self.kinds)]
        kind, cell = divmod(i, self.cells)
        button, clicks = CLICK_KINDS[self.kinds[kind]]
        x, y = self.point(cell)
        return Action("click", x=x, y=y, button=button, clicks=clicks).to_pyautogui()
