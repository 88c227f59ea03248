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
    final: np.ndarray  # the final screen, full resolution
    earlier: list[np.ndarray] = field(default_factory=list)  # earlier screens that changed, downscaled
    answer: str | None = None  # ANS text ("FAIL" after FAIL), None if none
    checks_passed: bool = False  # what the task's checks said
    checks: list[dict] = field(default_factory=list)


@dataclass
class Score:
    reward: float
    success: bool
    details: dict[str, Any] = field(default_factory=dict)  # put in info["judge"] (JSON-safe)


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


class FrameKeeper:
    """What a scorer is shown of an episode's earlier screens: a downscaled copy of each screen that differs
    from the one before (about 6 ms each); the final screen is shown at full size, so its copy is dropped."""

    def __init__(self, size: tuple[int, int] | None):
        self.size = size
        self.frames: list[np.ndarray] = []
        self._last: np.ndarray | None = None
        self._kept = False

    def keep(self, frame: np.ndarray) -> None:
        self._kept = bool(self.size) and (self._last is None or not np.array_equal(frame, self._last))
        if self._kept:
            self.frames.append(fit_within(frame, self.size))  # type: ignore[arg-type]
        self._last = frame

    def earlier(self) -> list[np.ndarray]:
        """The kept screens before the final one (the final one's copy dropped when the last step kept it)."""
        return self.frames[:-1] if self._kept else list(self.frames)

    def clear(self) -> None:
        self.frames, self._last, self._kept = [], None, False
