"""CodaEnv end to end on real KAlgebra under real Xvfb: oracles, DONE, check_env, crashes, orphans, isolation."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import coda_env  # noqa: F401  (registers the env ids)
from coda_env.env import CodaEnv
from coda_env.tasks import load_tasks

from .conftest import live_token_pids, run_solution, wait_until

TASKS = sorted(load_tasks("kalgebra"))


def test_suite_is_broad():
    tasks = load_tasks("kalgebra")
    assert len(tasks) >= 25
    cats = {t.category for t in tasks.values()}
    assert {"Calculator", "2D Graph", "3D Graph", "Dictionary"} <= cats


@pytest.mark.parametrize("task_id", TASKS)
def test_oracle_scores_one(kalgebra_env, task_id):
    rewards, term, trunc, info = run_solution(kalgebra_env, task_id)
    assert term and not trunc, info
    assert rewards[-1] == 1.0, info.get("checks")
    assert all(r == 0.0 for r in rewards[:-1])
    assert info["success"] is True and "error" not in info


@pytest.mark.parametrize("task_id", TASKS)
def test_done_at_once_scores_zero(kalgebra_env, task_id):
    obs, info = kalgebra_env.reset(options={"task": task_id})
    assert obs["instruction"] == kalgebra_env.unwrapped.tasks[task_id].instruction
    obs, r, term, trunc, info = kalgebra_env.step("DONE")
    assert term and not trunc
    assert r == 0.0 and info["success"] is False, info.get("checks")


def test_observation_and_info(kalgebra_env):
    obs, info = kalgebra_env.reset(options={"task": "calc_power"})
    assert kalgebra_env.observation_space.contains(obs)
    shot = obs["screenshot"]
    assert shot.shape == (800, 1280, 3) and shot.dtype == np.uint8 and shot.std() > 0
    assert set(info["timings"]) >= {"desktop", "launch", "setup", "settle", "reset"}
    obs, r, term, trunc, info = kalgebra_env.step("pyautogui.click(500, 751)")
    assert set(info["timings"]) >= {"action", "settle", "screenshot"}
    assert (r, term, trunc) == (0.0, False, False)
    # the step budget truncates and still scores
    for _ in range(kalgebra_env.unwrapped.tasks["calc_power"].steps - 1):
        obs, r, term, trunc, info = kalgebra_env.step("WAIT")
    assert trunc and not term and r == 0.0 and "checks" in info
    with pytest.raises(gym.error.ResetNeeded):
        kalgebra_env.step("WAIT")


def test_render_rgb_array():
    env = CodaEnv(task="calc_power", render_mode="rgb_array")
    try:
        obs, _ = env.reset(seed=0)
        frame = env.render()
        assert frame.shape == (800, 1280, 3) and np.array_equal(frame, obs["screenshot"])
    finally:
        env.close()


def test_a11y_tree_observation():
    env = CodaEnv(task="calc_power", a11y_tree=True)
    try:
        obs, _ = env.reset(seed=0)
        assert "Variables" in obs["a11y_tree"] and "Calculator" in obs["a11y_tree"]
    finally:
        env.close()


def test_check_env_passes():
    from gymnasium.utils.env_checker import check_env
    env = CodaEnv(task="calc_power", info_timings=False)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_gym_make_by_id():
    env = gym.make("coda_env:coda/KAlgebra-v0", task="calc_power")
    try:
        obs, info = env.reset(seed=1)
        assert info["task"] == "calc_power"
    finally:
        env.close()


def test_bad_actions_keep_env_usable(kalgebra_env):
    kalgebra_env.reset(options={"task": "calc_power"})
    bad = ["import os; os.system('touch /tmp/x')", "pyautogui.click(99999, 5)", "pyautogui.press('nokey')",
           "__import__('os')", "open('/etc/passwd')", "x" * 20000, "pyautogui.write('\u00e9t\u00e9')"]
    for i, action in enumerate(bad[:5]):  # the budget is 5 steps; the rest is covered by test_actions.py
        obs, r, term, trunc, info = kalgebra_env.step(action)
        assert info["action_error"], action
        assert r == 0.0 and not term
        if trunc:
            break
    rewards, term, trunc, info = run_solution(kalgebra_env, "calc_power")
    assert rewards[-1] == 1.0


def test_unknown_task_is_a_clear_error(kalgebra_env):
    from coda_env.tasks import TaskError
    with pytest.raises(TaskError, match="no_such_task"):
        kalgebra_env.reset(options={"task": "no_such_task"})
    rewards, *_ = run_solution(kalgebra_env, "calc_power")
    assert rewards[-1] == 1.0


def test_killing_the_app_truncates_and_reset_recovers(kalgebra_env):
    kalgebra_env.reset(options={"task": "calc_power"})
    proc = kalgebra_env.unwrapped._proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)
    obs, r, term, trunc, info = kalgebra_env.step("pyautogui.click(500, 751)")
    assert trunc and not term and r == 0.0
    assert "kalgebra exited" in info["error"]
    rewards, *_ = run_solution(kalgebra_env, "calc_power")
    assert rewards[-1] == 1.0


def test_killing_xvfb_truncates_and_reset_recovers(kalgebra_env):
    kalgebra_env.reset(options={"task": "calc_power"})
    desktop = kalgebra_env.unwrapped.desktop
    old_display = desktop.display
    xvfb = desktop._procs["xvfb"]
    xvfb.kill()
    xvfb.wait(timeout=5)
    obs, r, term, trunc, info = kalgebra_env.step("pyautogui.click(500, 751)")
    assert trunc and not term and r == 0.0
    assert "error" in info and ("X server" in info["error"] or "exited" in info["error"])
    rewards, *_ = run_solution(kalgebra_env, "calc_power")
    assert rewards[-1] == 1.0
    assert desktop.alive() and desktop.display is not None
    del old_display


def test_no_orphans_after_close():
    env = CodaEnv(task="calc_power")
    env.reset(seed=0)
    token = env.desktop.token
    names = {open(f"/proc/{p}/comm").read().strip() for p in live_token_pids(token)}
    assert {"Xvfb", "kalgebra", "openbox", "dbus-daemon"} <= names, names
    env.close()
    assert wait_until(lambda: not live_token_pids(token), timeout=10), live_token_pids(token)


def test_no_orphans_after_gc():
    import gc
    env = CodaEnv(task="calc_power")
    env.reset(seed=0)
    token = env.desktop.token
    assert live_token_pids(token)
    del env
    gc.collect()
    assert wait_until(lambda: not live_token_pids(token), timeout=10), live_token_pids(token)


HOLDER = """
import json, sys, time
from coda_env.env import CodaEnv
envs = [CodaEnv(task="calc_power") for _ in range(2)]
for e in envs:
    e.reset(seed=0)
print(json.dumps([e.desktop.token for e in envs]), flush=True)
time.sleep(600)
"""


def test_no_orphans_after_parent_sigkill():
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        tokens = json.loads(holder.stdout.readline())
        for t in tokens:
            names = {open(f"/proc/{p}/comm").read().strip() for p in live_token_pids(t)}
            assert "kalgebra" in names and "Xvfb" in names, names
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    left = wait_until(lambda: not any(live_token_pids(t) for t in tokens), timeout=15)
    assert left, {t: live_token_pids(t) for t in tokens}


def test_two_envs_in_one_process_are_isolated():
    a, b = CodaEnv(task="calc_power"), CodaEnv(task="calc_power")
    try:
        a.reset(seed=0)
        b.reset(seed=0)
        assert a.desktop.display != b.desktop.display
        for action in a.tasks["calc_power"].solution[:-1]:
            a.step(action)
            b.step("WAIT")
        assert a.state()["variables"].get("a") == "81"
        assert "a" not in b.state()["variables"]
        assert a.step("DONE")[1] == 1.0
        assert b.step("DONE")[1] == 0.0
    finally:
        a.close()
        b.close()


def test_async_vector_env_isolated():
    envs = gym.make_vec("coda/KAlgebra-v0", num_envs=2, vectorization_mode="async", task="calc_power")
    try:
        obs, info = envs.reset(seed=0)
        assert obs["screenshot"].shape == (2, 800, 1280, 3)
        solution = load_tasks("kalgebra")["calc_power"].solution
        for action in solution[:-1]:
            obs, r, term, trunc, info = envs.step([action, "WAIT"])
            assert not term.any()
        obs, r, term, trunc, info = envs.step(["DONE", "DONE"])
        assert term.all()
        assert r.tolist() == [1.0, 0.0]
    finally:
        envs.close()
