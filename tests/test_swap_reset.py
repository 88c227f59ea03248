"""Swap resets (`swap_reset=True`, coda_env.session.Spare): the next episode's app is prepared on a second
desktop while an episode runs, and reset swaps it in. Real KAlgebra under real Xvfb: every episode still
starts as an ordinary reset would start it (the oracle solves it), a guess that turns out wrong falls back
to an ordinary reset, the spare app is sealed like any app, and nothing outlives close() or a killed parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from coda_env.env import CodaEnv

from .conftest import live_token_pids, run_solution, wait_until
from .test_sandbox import _assert_sealed

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    not Path("/usr/bin/kalgebra").exists() and not Path("/usr/bin/kalgebramobile").exists(),
    reason="KAlgebra is not installed",
)

# no setup operations / an "app" setup operation (a tab) / none again
TASKS = ["calc_power", "calc_double_variable", "calc_define_function"]


def _swapped(env) -> bool:
    t = env.unwrapped.timings
    return t.get("launch") == 0.0 and t.get("desktop") == 0.0


def test_swapped_episodes_start_as_ordinary_ones_and_close_leaves_nothing():
    env = CodaEnv(app="kalgebra", swap_reset=True)
    tokens = set()
    try:
        swapped = []
        for k, task in enumerate(TASKS * 2):
            env.upcoming_task = None
            env.reset(options={"task": task})
            swapped.append(_swapped(env))
            # announce the next task (as coda eval's runner does) before the first step
            env.upcoming_task = (TASKS * 2)[k + 1] if k + 1 < len(TASKS) * 2 else None
            rewards, _, _, info = run_solution(env, task)
            assert rewards[-1] == 1.0, (task, info)
            assert env._spare.error is None, env._spare.error
            tokens |= {env.desktop.token, env._spare.session.desktop.token}
        # the first reset has nothing prepared; every announced one after it is a swap
        assert swapped == [False] + [True] * (len(TASKS) * 2 - 1), swapped
        env._spare.wait()
        _assert_sealed(env._spare.session.desktop)  # the prepared app is sealed like the one in use
        assert len(tokens) == 2
    finally:
        env.close()
    for token in tokens:
        assert wait_until(lambda: not live_token_pids(token), 10), live_token_pids(token)


def test_an_unannounced_task_with_the_same_start_still_swaps():
    """Without an announcement the spare prepares a guess: the task just named, again, its "app" operations
    left for the reset. Another KAlgebra task has the same start (no files), so it still swaps, and one with
    an "app" operation (a tab to open) gets it at reset; each is solved."""
    env = CodaEnv(app="kalgebra", swap_reset=True)
    try:
        env.reset(options={"task": "calc_power"})
        env.step("WAIT")  # the spare is prepared from the first step on
        env.reset(options={"task": "calc_define_function"})  # no setup operations either: swapped
        assert _swapped(env)
        env.step("WAIT")
        env.reset(options={"task": "calc_double_variable"})  # same files, an "app" operation run at reset
        assert _swapped(env) and env.unwrapped.timings["setup"] > 0
        rewards, _, _, info = run_solution(env, "calc_double_variable")
        assert rewards[-1] == 1.0, info
        env.reset(options={"task": "calc_power"})  # the guess was calc_double_variable: same files again
        rewards, _, _, info = run_solution(env, "calc_power")
        assert rewards[-1] == 1.0, info
    finally:
        env.close()


def test_swap_reset_cannot_take_a_callers_desktop():
    from coda_env.backends import make_desktop

    d = make_desktop("local", 1280, 800)
    try:
        with pytest.raises(ValueError, match="second desktop"):
            CodaEnv(app="kalgebra", desktop=d, swap_reset=True)
    finally:
        d.stop()


HOLDER = """
from coda_env.env import CodaEnv
env = CodaEnv(app="kalgebra", swap_reset=True)
env.reset(options={"task": "calc_power"})
env.step("WAIT")
env._spare.wait()
print(env.desktop.token, env._spare.session.desktop.token, flush=True)
import time
time.sleep(600)
"""


def test_nothing_of_the_spare_survives_a_killed_parent():
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=str(ROOT)
    )
    try:
        tokens = holder.stdout.readline().split()
        assert len(tokens) == 2, tokens
        assert all(live_token_pids(t) for t in tokens)  # both desktops are up
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    for token in tokens:
        assert wait_until(lambda: not live_token_pids(token), 15), live_token_pids(token)


def test_a_wrong_guess_is_an_ordinary_reset():
    """TeXstudio's tasks each write their own document before launch ("files" operations): a spare prepared
    for one task is no start for another, so that reset is an ordinary one; the same task again swaps."""
    from coda_env.apps import texstudio

    if texstudio.available() is not None:
        pytest.skip(str(texstudio.available()))
    env = CodaEnv(app="texstudio", swap_reset=True)
    try:
        env.reset(options={"task": "bold_word"})
        env.step("WAIT")  # the guess: bold_word again
        env.reset(options={"task": "add_author_date"})
        assert not _swapped(env)
        rewards, _, _, info = run_solution(env, "add_author_date")
        assert rewards[-1] == 1.0, info
        env.reset(options={"task": "add_author_date"})
        assert _swapped(env)
        rewards, _, _, info = run_solution(env, "add_author_date")
        assert rewards[-1] == 1.0, info
    finally:
        env.close()


def test_check_env_passes_with_swap_resets():
    """gymnasium's checker resets with the same seed twice and compares the observations: the second reset is
    a swap, so a swapped-in start must be the very start an ordinary reset makes."""
    from gymnasium.utils.env_checker import check_env

    env = CodaEnv(app="kalgebra", task="calc_power", swap_reset=True)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


@pytest.mark.parametrize(
    "app,task",
    [("grass", "ans_big_towns"), ("texstudio", "add_author_date")],
)
def test_a_swapped_start_is_the_start_of_a_plain_reset(app, task):
    """GRASS and TeXstudio (KAlgebra: check_env above): the first observation of a swapped-in episode, its
    next task announced as coda eval's runner announces it, is the one an ordinary reset of the same task and
    seed gives, screen and instruction."""
    import numpy as np

    from coda_env.registry import APPS

    if APPS[app].available() is not None:
        pytest.skip(str(APPS[app].available()))
    plain = CodaEnv(app=app)
    try:
        want, _ = plain.reset(seed=5, options={"task": task})
    finally:
        plain.close()
    env = CodaEnv(app=app, swap_reset=True)
    try:
        env.reset(seed=1, options={"task": task})
        env.upcoming_task = task
        env.step("WAIT")
        got, _ = env.reset(seed=5, options={"task": task})
        assert _swapped(env) and env._spare.error is None
    finally:
        env.close()
    assert got["instruction"] == want["instruction"]
    diff = np.argwhere(np.any(got["screenshot"] != want["screenshot"], axis=2))
    assert diff.size == 0, f"the swapped start differs from a plain one in box {diff.min(0)}-{diff.max(0)}"
