"""The scorer protocol behind `gym.make(id, reward=...)`: an episode in, a reward and details out.

The default reward is the task's checks (1.0 when all pass). Any object with this protocol can replace it:
the VLM judge of the agent package (`Judge`) is one, and a user's own reward model is another. `coda_env` only
defines the protocol; it imports no scorer implementation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


class ScoringError(RuntimeError):
    """The scorer could not score (a dead endpoint, say): the episode gets reward 0.0 and info['error']."""


@dataclass
class Episode:
    """What a scorer sees of a finished episode."""
    task_id: str
    app: str
    instruction: str
    final: np.ndarray                                   # the final screen, full resolution
    earlier: list[np.ndarray] = field(default_factory=list)   # earlier screens that changed, downscaled
    answer: str | None = None                           # ANS text ("FAIL" after FAIL), None if none
    checks_passed: bool = False                         # what the task's checks said
    checks: list[dict] = field(default_factory=list)


@dataclass
class Score:
    reward: float
    success: bool
    details: dict[str, Any] = field(default_factory=dict)   # put in info["judge"] (JSON-safe)


@runtime_checkable
class Scorer(Protocol):
    #: (width, height) earlier screens are kept at (downscaled), or None to keep none
    history_size: tuple[int, int] | None

    def score(self, episode: Episode) -> Score:
        """Score one episode; raise ScoringError when it cannot."""


def fit_within(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Downscale (never upscale) to fit in size = (width, height), aspect kept; area-averaged so small text
    blurs instead of aliasing. A frame that already fits is returned as it is."""
    h, w = frame.shape[:2]
    s = min(size[0] / w, size[1] / h)
    if s >= 1.0:
        return frame
    from PIL import Image
    nw, nh = max(1, round(w * s)), max(1, round(h * s))
    return np.asarray(Image.fromarray(np.ascontiguousarray(frame)).resize((nw, nh), Image.Resampling.BOX))
