"""PixelObservation: the screenshot alone, small, as a channel-last uint8 Box that CNN policies take.

CodaEnv observes a 1280x800 screen and a Text instruction; SB3 rejects Text spaces and a flattened screen is
3 million entries. This wrapper resizes with Pillow (no OpenCV), optionally to grayscale (kept as one channel,
so the result stays an image SB3 recognises), and either drops the instruction (a single task, or a family
whose target does not depend on it) or keeps it as a fixed-length Box of token ids from a byte tokenizer:
UTF-8 bytes shifted by one, 0 for padding. The tokenizer needs no vocabulary file and gives the same ids on
every machine. Frames stack with gymnasium's FrameStackObservation on top of this wrapper.
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from PIL import Image

PAD = 0
VOCAB_SIZE = 257  # 256 byte values shifted by one, and PAD

_RESAMPLE = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "area": Image.Resampling.BOX,
    "lanczos": Image.Resampling.LANCZOS,
}


def encode_instruction(text: str, length: int) -> np.ndarray:
    """Token ids of `text`: its UTF-8 bytes + 1, cut or padded with 0 to `length` (int64)."""
    ids = np.frombuffer(text.encode("utf-8")[:length], dtype=np.uint8).astype(np.int64) + 1
    out = np.full(length, PAD, dtype=np.int64)
    out[: len(ids)] = ids
    return out


def decode_instruction(ids: np.ndarray) -> str:
    """The text of `encode_instruction` ids (padding dropped; a multi-byte character cut at the end is dropped)."""
    data = bytes(int(i) - 1 for i in np.asarray(ids).ravel() if int(i) != PAD)
    return data.decode("utf-8", errors="ignore")


class PixelObservation(gym.ObservationWrapper):
    """Dict(screenshot, instruction) -> Box(0, 255, (H, W, C), uint8), or Dict(pixels, instruction ids).

    size: (height, width) of the result; grayscale: one channel instead of three; instruction: "drop", or
    "tokens" for Dict(pixels=Box, instruction=Box(0, 256, (max_tokens,), int64)); resample: Pillow filter
    ("area" averages, so thin text and lines survive a large downscale best; "bilinear" is the default).
    """

    def __init__(
        self,
        env: gym.Env,
        size: tuple[int, int] = (84, 84),
        grayscale: bool = False,
        instruction: Literal["drop", "tokens"] = "drop",
        max_tokens: int = 128,
        resample: str = "bilinear",
    ):
        super().__init__(env)
        if instruction not in ("drop", "tokens"):
            raise ValueError(f"instruction must be 'drop' or 'tokens', got {instruction!r}")
        if resample not in _RESAMPLE:
            raise ValueError(f"resample must be one of {sorted(_RESAMPLE)}, got {resample!r}")
        space = env.observation_space
        if not isinstance(space, spaces.Dict) or "screenshot" not in space.spaces:
            raise TypeError(f"PixelObservation needs the env's Dict observation with a 'screenshot', got {space}")
        h, w = (int(v) for v in size)
        if h < 1 or w < 1:
            raise ValueError(f"size must be positive (height, width), got {size}")
        self.size, self.grayscale, self.mode = (h, w), grayscale, instruction
        self.max_tokens, self._resample = int(max_tokens), _RESAMPLE[resample]
        pixels = spaces.Box(0, 255, (h, w, 1 if grayscale else 3), np.uint8)
        if instruction == "drop":
            self.observation_space = pixels
        else:
            self.observation_space = spaces.Dict(
                {"pixels": pixels, "instruction": spaces.Box(0, VOCAB_SIZE - 1, (self.max_tokens,), np.int64)}
            )

    def pixels(self, frame: np.ndarray) -> np.ndarray:
        """One screenshot, resized (and grayscaled) as the observation holds it."""
        img = Image.fromarray(np.asarray(frame, dtype=np.uint8))
        if self.grayscale:
            img = img.convert("L")
        h, w = self.size
        if img.size != (w, h):
            img = img.resize((w, h), self._resample, reducing_gap=3.0)
        arr = np.asarray(img, dtype=np.uint8)
        return arr[..., None] if self.grayscale else arr

    def observation(self, observation: dict[str, Any]):
        px = self.pixels(observation["screenshot"])
        if self.mode == "drop":
            return px
        return {
            "pixels": px,
            "instruction": encode_instruction(str(observation.get("instruction", "")), self.max_tokens),
        }
