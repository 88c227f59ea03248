"""What the action wrappers share: the screen size of the env under them and a check that it takes text."""

from __future__ import annotations

import gymnasium as gym
from gymnasium import spaces


def screen_of(env: gym.Env) -> tuple[int, int]:
    """(width, height) of the desktop behind `env` (read off the unwrapped CodaEnv, or its screenshot space)."""
    base = env.unwrapped
    if hasattr(base, "width") and hasattr(base, "height"):
        return int(base.width), int(base.height)
    shot = base.observation_space["screenshot"]
    return int(shot.shape[1]), int(shot.shape[0])


def require_text_actions(env: gym.Env, wrapper: str) -> None:
    """Action wrappers emit action strings: the env under them must take text (action_mode='text')."""
    if not isinstance(env.action_space, spaces.Text):
        raise TypeError(
            f"{wrapper} maps to the env's action strings, so the env under it needs a Text action "
            f"space (action_mode='text'); got {env.action_space}. Put action wrappers directly on "
            "the env or on observation/reward wrappers only."
        )


def region_of(region: tuple[int, int, int, int] | None, screen: tuple[int, int]) -> tuple[int, int, int, int]:
    """Validate a (x0, y0, x1, y1) pixel rectangle (x1, y1 exclusive); None is the whole screen."""
    w, h = screen
    if region is None:
        return 0, 0, w, h
    x0, y0, x1, y1 = (int(v) for v in region)
    if not (0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h):
        raise ValueError(f"region {region} is not a rectangle inside the {w}x{h} screen (x0, y0, x1, y1)")
    return x0, y0, x1, y1
