"""FAKES for fast tests of the trainers' logic: the real CodaEnv on the fake backend and scripted FAKE app
(`coda_env.backends.fake`, no X server), scored by a FAKE scorer. Never the only test of a behaviour: the
real-env suites (test_train.py's learning test on KAlgebra) cover the same code paths end to end."""

from __future__ import annotations

import gymnasium as gym

from coda_env.apps._fake import register_fake
from coda_env.env import CodaEnv
from coda_env.scoring import Episode, Score

FAKE_ENV_ID = "test/FakeAlternating-v0"


class AlternatingScorer:
    """A FAKE scorer: rewards 1, 0, 1, 0, ... in the order it scores episodes, whatever the agent did. Noise,
    not a task: what a training-loop test needs from it is groups whose rewards differ."""

    history_size = None

    def __init__(self) -> None:
        self.scored = 0

    def score(self, episode: Episode) -> Score:
        reward = 1.0 if self.scored % 2 == 0 else 0.0
        self.scored += 1
        return Score(reward, reward == 1.0, {"fake": "alternating"})


def make_alternating_env(**kwargs) -> CodaEnv:
    """The FAKE app on the fake backend, small screens, each env with its own AlternatingScorer. The app is
    registered again when a test that ran before unregistered it (test_core's and test_eval's clean-ups)."""
    from coda_env.registry import APPS

    if "fake" not in APPS:
        register_fake()
    return CodaEnv(
        app="fake",
        backend="fake",
        screen=(320, 200),
        reward=AlternatingScorer(),
        settle_quiet=0.0,
        settle_timeout=0.0,
        **kwargs,
    )


register_fake()
if FAKE_ENV_ID not in gym.registry:
    gym.register(FAKE_ENV_ID, entry_point="tests.fakes:make_alternating_env", disable_env_checker=True)
