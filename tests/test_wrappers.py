"""coda_env.wrappers: the mapping logic on a fake env (named as such), then every wrapper on real KAlgebra
under Xvfb: SB3's and gymnasium's check_env, oracle-equivalent actions scoring 1.0, make_vec composition."""

from __future__ import annotations

import functools
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import coda_env  # noqa: F401  (registers the env ids)
from coda_env.actions import parse_action
from coda_env.env import CodaEnv
from coda_env.tasks import load_tasks
from coda_env.wrappers import (
    ClickGrid,
    PixelObservation,
    PointerAction,
    RewardShaping,
    Vocabulary,
    decode_instruction,
    encode_instruction,
    screen_change_bonus,
    step_cost,
    vocabulary_from_tasks,
)

TAB_3D = (207, 53)  # the 3D Graph tab (tab_3d_graph's oracle click)
TAB_BAR = (0, 41, 1016, 65)  # KAlgebra's tab strip


class FakeScreenEnv(gym.Env):
    """A FAKE of CodaEnv's spaces for fast mapping tests: a random screen, records the last action string."""

    metadata = {"render_modes": []}

    def __init__(self, width=320, height=200):
        self.width, self.height = width, height
        self.observation_space = spaces.Dict(
            {"screenshot": spaces.Box(0, 255, (height, width, 3), np.uint8), "instruction": spaces.Text(100)}
        )
        self.action_space = spaces.Text(10_000)
        self.last = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def _obs(self):
        return {
            "screenshot": self.np_random.integers(0, 256, (self.height, self.width, 3), dtype=np.uint8),
            "instruction": "Plot y=x²",
        }

    def step(self, action):
        parse_action(action, (self.width, self.height))  # raises on anything the real env would reject
        self.last = action
        return self._obs(), 0.0, action == "DONE", False, {"action_error": None}


# ------------------------------------------------------------------------------------------ fast (fake env)
def test_tokenizer_round_trip_and_padding():
    ids = encode_instruction("Plot y=x²", 16)
    assert ids.shape == (16,) and ids.dtype == np.int64 and ids[-1] == 0 and ids.max() <= 256
    assert decode_instruction(ids) == "Plot y=x²"
    assert np.array_equal(ids, encode_instruction("Plot y=x²", 16))  # deterministic
    assert decode_instruction(encode_instruction("abcdef", 3)) == "abc"


def test_pixels_shapes_grayscale_and_tokens():
    env = PixelObservation(FakeScreenEnv(), size=(50, 60), grayscale=True)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (50, 60, 1) and obs.dtype == np.uint8 and env.observation_space.contains(obs)
    env = PixelObservation(FakeScreenEnv(), size=(40, 40), instruction="tokens", max_tokens=32)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and decode_instruction(obs["instruction"]) == "Plot y=x²"
    stacked = gym.wrappers.FrameStackObservation(PixelObservation(FakeScreenEnv(), size=(36, 36)), 4)
    obs, _ = stacked.reset(seed=0)
    assert obs.shape == (4, 36, 36, 3) and stacked.observation_space.contains(obs)
    with pytest.raises(ValueError, match="instruction"):
        PixelObservation(FakeScreenEnv(), instruction="words")


def test_click_grid_mapping():
    env = ClickGrid(FakeScreenEnv(320, 200), rows=2, cols=4)
    assert env.action_space.n == 2 * 4 * 3 + 1
    assert env.action(0) == "pyautogui.click(40, 50)"
    assert env.action(7) == "pyautogui.click(280, 150)"
    assert env.action(8) == "pyautogui.click(40, 50, clicks=2)"
    assert env.action(16 + 5) == "pyautogui.click(120, 150, button='right')"
    assert env.action(24) == "DONE"
    assert env.action(env.index(130, 160, "double")) == "pyautogui.click(120, 150, clicks=2)"
    sub = ClickGrid(FakeScreenEnv(320, 200), rows=1, cols=2, kinds=("click",), region=(100, 10, 200, 30), extra=())
    assert [sub.action(i) for i in range(2)] == ["pyautogui.click(125, 20)", "pyautogui.click(175, 20)"]
    with pytest.raises(ValueError, match="outside"):
        sub.action(2)
    with pytest.raises(ValueError, match="region"):
        ClickGrid(FakeScreenEnv(320, 200), region=(0, 0, 400, 10))
    with pytest.raises(TypeError, match="Text action space"):
        ClickGrid(ClickGrid(FakeScreenEnv()))


def test_pointer_mapping():
    env = PointerAction(FakeScreenEnv(320, 200))
    assert env.action(np.array([0.5, 0.5, 0.0])) == "pyautogui.click(160, 100)"
    assert env.action(np.array([1.0, 1.0, 0.3])) == "pyautogui.click(319, 199, clicks=2)"
    assert env.action(np.array([-3.0, 0.0, 0.6])) == "pyautogui.click(0, 0, button='right')"
    assert env.action(np.array([0.2, 0.2, 1.0])) == "DONE"
    with pytest.raises(ValueError, match="finite"):
        env.action(np.array([np.nan, 0, 0]))
    d = PointerAction(FakeScreenEnv(320, 200), kinds=("move", "click"), dict_space=True)
    assert d.action({"point": np.array([0.25, 0.5]), "kind": 1}) == "pyautogui.click(80, 100)"
    assert d.action(d.action_space.sample()).startswith("pyautogui.")


def test_vocabulary_from_a_task_family():
    tasks = load_tasks("kalgebra")
    calc = [t for t in tasks.values() if t.category == "Calculator"]
    vocab = vocabulary_from_tasks(calc)
    assert vocab[0] == "DONE" and "pyautogui.press('enter')" in vocab and "pyautogui.write(':=')" in vocab
    assert len(vocab) < 120 and len(set(vocab)) == len(vocab)
    assert not any(v.startswith("ANS") for v in vocab)
    env = Vocabulary(FakeScreenEnv(1280, 800), vocab)
    ids = env.encode("a:=3^4")
    assert [env.action(i) for i in ids] == [
        "pyautogui.write('a')",
        "pyautogui.write(':=')",
        "pyautogui.write('3')",
        "pyautogui.write('^')",
        "pyautogui.write('4')",
    ]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        env.encode("zebra")
    with pytest.raises(ValueError, match="not a valid action"):
        Vocabulary(FakeScreenEnv(), ["os.system('x')"])


def test_shaping_off_by_default_and_hooks():
    base = RewardShaping(FakeScreenEnv())
    base.reset(seed=0)
    _, r, _, _, info = base.step("WAIT")
    assert r == 0.0 and info["task_reward"] == 0.0 and info["shaping"] == 0.0
    shaped = RewardShaping(FakeScreenEnv(), [step_cost(0.1), screen_change_bonus(0.5)])
    shaped.reset(seed=0)
    _, r, _, _, info = shaped.step("WAIT")  # the fake's screen is random: it changed
    assert r == pytest.approx(0.4) and info["task_reward"] == 0.0 and info["shaping"] == pytest.approx(0.4)


# ------------------------------------------------------------------------------------------ real KAlgebra
def _pixel_env(**kw):
    return PixelObservation(CodaEnv("kalgebra", task="tab_3d_graph", info_timings=False), **kw)


@pytest.mark.parametrize(
    "name, make",
    [
        ("pixels+grid", lambda: ClickGrid(_pixel_env(), rows=4, cols=4)),
        ("pixels(gray, tokens)+pointer", lambda: PointerAction(_pixel_env(grayscale=True, instruction="tokens"))),
        ("pixels+vocabulary+shaping", lambda: RewardShaping(Vocabulary(_pixel_env()), [step_cost()])),
    ],
)
def test_check_env_sb3_and_gymnasium(name, make):
    from gymnasium.utils.env_checker import check_env as gym_check_env
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    env = make()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # advice (e.g. "use a [-1, 1] Box"), not failures
            sb3_check_env(env, warn=True)
            gym_check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_grid_pointer_and_vocabulary_solve_real_tasks():
    """The wrapped action spaces reach what the oracles do: each scores 1.0 on real KAlgebra."""
    env = CodaEnv("kalgebra", tasks=["tab_3d_graph", "calc_power"], max_steps=10)  # typing by snippet takes 8 steps
    try:
        grid = ClickGrid(PixelObservation(env), rows=1, cols=12, kinds=("click",), region=TAB_BAR)
        obs, info = grid.reset(options={"task": "tab_3d_graph"})
        assert obs.shape == (84, 84, 3)
        grid.step(grid.index(*TAB_3D))
        _, r, term, _, info = grid.step(grid.action_space.n - 1)  # DONE
        assert term and r == 1.0, info

        pointer = PointerAction(env)
        pointer.reset(options={"task": "tab_3d_graph"})
        pointer.step(np.array([TAB_3D[0] / 1280, TAB_3D[1] / 800, 0.0], np.float32))
        _, r, term, _, info = pointer.step(np.array([0, 0, 1.0], np.float32))
        assert term and r == 1.0, info

        vocab = RewardShaping(Vocabulary(env), [step_cost(0.01)])
        voc = vocab.env
        vocab.reset(options={"task": "calc_power"})
        plan = (
            [voc.index("pyautogui.click(500, 751)")]
            + voc.encode("a:=3^4")
            + [voc.index("pyautogui.press('enter')"), voc.index("DONE")]
        )
        assert len(plan) == 8
        for a in plan:
            _, r, term, trunc, info = vocab.step(a)
            if term or trunc:
                break
        assert term and info["task_reward"] == 1.0 and r == pytest.approx(1.0 - 0.01), info
    finally:
        env.close()


def test_make_vec_with_wrappers_and_frame_stack():
    envs = gym.make_vec(
        "coda/KAlgebra-v0",
        num_envs=1,
        vectorization_mode="sync",
        task="tab_3d_graph",
        max_steps=30,
        wrappers=[
            functools.partial(PixelObservation, size=(64, 64), grayscale=True),
            functools.partial(ClickGrid, rows=1, cols=12, kinds=("click",), region=TAB_BAR, extra=("WAIT", "DONE")),
            functools.partial(gym.wrappers.FrameStackObservation, stack_size=2),
        ],
    )
    try:
        assert envs.single_observation_space.shape == (2, 64, 64, 1)
        assert envs.single_action_space == spaces.Discrete(14)
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (1, 2, 64, 64, 1) and obs.std() > 0
        first = obs[0, 1]
        obs, r, term, trunc, info = envs.step(np.array([2]))  # cell 2 of the tab strip: the 3D Graph tab
        # the 3D view paints a while after the switch (longer on a loaded machine): WAIT until it shows
        for _ in range(20):
            if not np.array_equal(obs[0, 1], first):
                break
            prev = obs
            obs, r, term, trunc, info = envs.step(np.array([12]))  # WAIT
            assert np.array_equal(obs[0, 0], prev[0, 1])  # the stack shifts by one frame per step
        assert not np.array_equal(obs[0, 1], first), "the 3D Graph tab never showed"
        obs, r, term, trunc, info = envs.step(np.array([13]))  # DONE
        assert term[0] and r[0] == 1.0
    finally:
        envs.close()
