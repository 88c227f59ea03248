"""Gymnasium wrappers that give RL libraries the Box/Discrete spaces they can use, one transform per file.

Each takes the env (or a wrapper of it) as its only required argument, so it composes with
`gym.make_vec(id, num_envs, wrappers=[PixelObservation, functools.partial(ClickGrid, rows=4)])`. Action
wrappers map to the env's own action strings (the pyautogui language of `coda_env.actions`), so everything
the env checks, parses and whitelists still applies. Typical SB3 stack:

    env = ClickGrid(PixelObservation(gym.make("coda/KAlgebra-v0", task="tab_3d_graph")), rows=1, cols=12,
                    region=(0, 41, 1016, 65), kinds=("click",))
"""

from .click_grid import ClickGrid
from .pixels import PixelObservation, decode_instruction, encode_instruction
from .pointer import PointerAction
from .setup_failure import SetupFailure
from .shaping import RewardShaping, ShapingContext, action_error_cost, screen_change_bonus, step_cost
from .vocabulary import Vocabulary, vocabulary_from_tasks

__all__ = [
    "ClickGrid",
    "PixelObservation",
    "PointerAction",
    "RewardShaping",
    "SetupFailure",
    "ShapingContext",
    "Vocabulary",
    "action_error_cost",
    "decode_instruction",
    "encode_instruction",
    "screen_change_bonus",
    "step_cost",
    "vocabulary_from_tasks",
]
