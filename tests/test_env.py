"""CodaEnv end to end on real KAlgebra under real Xvfb: oracles, DONE, check_env, crashes, orphans, isolation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

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
    assert set(kalgebra_env.timings) >= {"desktop", "launch", "setup", "settle", "reset"}
    assert "timings" not in info  # opt-in (info_timings=True): check_env wants identical infos
    obs, r, term, trunc, info = kalgebra_env.step("pyautogui.click(500, 751)")
    assert set(kalgebra_env.timings) >= {"action", "settle", "screenshot"}
    assert (r, term, trunc) == (0.0, False, False)
    # the step budget truncates and still scores
    for _ in range(kalgebra_env.unwrapped.tasks["calc_power"].steps - 1):
        obs, r, term, trunc, info = kalgebra_env.step("WAIT")
    assert trunc and not term and r == 0.0 and "checks" in info
    with pytest.raises(gym.error.ResetNeeded):
        kalgebra_env.step("WAIT")


def test_render_rgb_array():
    env = CodaEnv("kalgebra", task="calc_power", render_mode="rgb_array")
    try:
        obs, _ = env.reset(seed=0)
        frame = env.render()
        assert frame.shape == (800, 1280, 3) and np.array_equal(frame, obs["screenshot"])
    finally:
        env.close()


def test_a11y_tree_observation():
    env = CodaEnv("kalgebra", task="calc_power", a11y_tree=True)
    try:
        obs, _ = env.reset(seed=0)
        assert "Variables" in obs["a11y_tree"] and "Calculator" in obs["a11y_tree"]
    finally:
        env.close()


def test_check_env_passes():
    from gymnasium.utils.env_checker import check_env

    env = CodaEnv("kalgebra", task="calc_power", info_timings=False)
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
    bad = [
        "import os; os.system('touch /tmp/x')",
        "pyautogui.click(99999, 5)",
        "pyautogui.press('nokey')",
        "__import__('os')",
        "open('/etc/passwd')",
        "x" * 20000,
        "pyautogui.write('\u00e9t\u00e9')",
    ]
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
    proc = kalgebra_env.unwrapped.procs["kalgebra"]
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
    env = CodaEnv("kalgebra", task="calc_power")
    env.reset(seed=0)
    token = env.desktop.token
    names = {open(f"/proc/{p}/comm").read().strip() for p in live_token_pids(token)}
    assert {"Xvfb", "kalgebra", "openbox", "dbus-daemon"} <= names, names
    env.close()
    assert wait_until(lambda: not live_token_pids(token), timeout=10), live_token_pids(token)


def test_no_orphans_after_gc():
    import gc

    env = CodaEnv("kalgebra", task="calc_power")
    env.reset(seed=0)
    token = env.desktop.token
    assert live_token_pids(token)
    del env
    gc.collect()
    assert wait_until(lambda: not live_token_pids(token), timeout=10), live_token_pids(token)


HOLDER = """
import json, sys, time
from coda_env.env import CodaEnv
envs = [CodaEnv("kalgebra", task="calc_power") for _ in range(2)]
for e in envs:
    e.reset(seed=0)
print(json.dumps([e.desktop.token for e in envs]), flush=True)
time.sleep(600)
"""


def test_no_orphans_after_parent_sigkill():
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, start_new_session=True)
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
    a, b = CodaEnv("kalgebra", task="calc_power"), CodaEnv("kalgebra", task="calc_power")
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


class _HostAgent:
    """A stand-in for the libvirt backend's guest agent (named as such: no VM here): it runs the command
    `GuestA11y` sends to the guest on this machine instead, with the desktop's environment, so the reader
    script, its JSON and the adapter's reading of it are the real ones."""

    def __init__(self, desktop):
        self.desktop = desktop

    def run(self, argv, timeout=30.0):
        from coda_env.backends.libvirt import GUEST_PYTHON

        argv = [sys.executable if i == 0 and a == GUEST_PYTHON else a for i, a in enumerate(argv)]
        return subprocess.run(argv, env=self.desktop.env, capture_output=True, timeout=timeout)


class _GuestView:
    """The env's desktop, except that accessibility is read the libvirt backend's way."""

    def __init__(self, desktop, address=None):
        self._desktop, self._address = desktop, address or desktop.env["AT_SPI_BUS_ADDRESS"]

    def __getattr__(self, name):
        return getattr(self._desktop, name)

    def a11y(self):
        from coda_env.backends.libvirt import GuestA11y

        return GuestA11y(_HostAgent(self._desktop), self._address)


def _content(node):
    """A tree without its object paths (Qt makes new objects for a tree view's items on every read)."""
    return (node.role, node.name, node.text, node.states, node.extents, [_content(c) for c in node.children])


def test_guest_a11y_reader_reads_what_the_client_reads(kalgebra_env):
    """The libvirt backend reads app state by running coda_env/a11y.py in the guest; the same script run on
    this desktop's bus gives KAlgebra's adapter the same state, tab and widget positions as the live client."""
    from coda_env.a11y import A11yError
    from coda_env.apps.kalgebra.adapter import _DETAILS, _STATE_SKIP, KAlgebra

    rewards, *_ = run_solution(kalgebra_env, "calc_power")
    assert rewards[-1] == 1.0
    desktop = kalgebra_env.unwrapped.desktop
    local, guest = KAlgebra(), KAlgebra()
    try:
        want = local.state(desktop)
        assert want["variables"]["a"] == "81" and want["tab"] == "Calculator"
        assert guest.state(_GuestView(desktop)) == want
        live, reader = desktop.a11y(), guest._client(_GuestView(desktop))
        try:

            def same_tree():  # KAlgebra settles for a moment after a calculation (a status label comes and goes)
                a = live.app_tree("kalgebra", skip_roles=_STATE_SKIP, texts=True, details_roles=_DETAILS)
                b = reader.app_tree("kalgebra", skip_roles=_STATE_SKIP, texts=True, details_roles=_DETAILS)
                c = live.app_tree("kalgebra", skip_roles=_STATE_SKIP, texts=True, details_roles=_DETAILS)
                return _content(a) == _content(b) == _content(c) and (a, b)

            tree, read = wait_until(same_tree, timeout=20)
            assert read.first("page tab", "Calculator").states & {
                "selected",
                "focused",
            }  # how the adapter tells the tab
            tab = tree.first("page tab", "Calculator")
            assert read.first("page tab", "Calculator").extents == live.extents(tab)
            assert read.first("frame", "Variables") is not None and read.first("list").children == []  # skipped
            with pytest.raises(A11yError, match="were not read: pass its role in app_tree's details_roles"):
                reader.states(read.first("frame", "Variables"))
        finally:
            live.close()
        assert guest._client(_GuestView(desktop)).app_tree("no-such-app") is None
    finally:
        local.close()
        guest.close()


def test_guest_a11y_reader_errors_are_clear(kalgebra_env):
    from coda_env.a11y import A11yError
    from coda_env.registry import AppError
    from coda_env.apps.kalgebra.adapter import KAlgebra

    kalgebra_env.reset(options={"task": "calc_power"})
    desktop = kalgebra_env.unwrapped.desktop
    broken = _GuestView(desktop, address="unix:path=/nonexistent/bus")
    with pytest.raises(
        A11yError,
        match=r"the guest's a11y reader failed \(exit 1\): a11y: cannot reach the "
        r"accessibility bus",
    ):
        broken.a11y().app_tree("kalgebra")
    app = KAlgebra()
    with pytest.raises(AppError, match="cannot read KAlgebra's state: the guest's a11y reader failed"):
        app.state(broken)
    assert app.ready(broken) is False  # polled while an app starts: not ready yet, not an error
    from coda_env.a11y import main

    assert main(["tree"]) == 2  # usage


def test_a11y_script_takes_the_bus_from_its_environment(kalgebra_env):
    """`a11y.py apps -`: the bus of the caller's session (how it runs under an OSWorld-style guest server)."""
    from coda_env import a11y

    kalgebra_env.reset(options={"task": "calc_power"})
    desktop = kalgebra_env.unwrapped.desktop
    p = subprocess.run([sys.executable, a11y.__file__, "apps", "-"], env=desktop.env, capture_output=True, timeout=60)
    assert p.returncode == 0 and "kalgebra" in p.stdout.decode().split("\n"), p.stderr


def test_a_users_task_folder_runs_like_a_shipped_task(tmp_path, monkeypatch, capsys):
    """A task of the user's own, in CODA_TASKS_PATH or --tasks-dir: listed, and its oracle scores 1.0."""
    from coda_agent.cli import main

    mine = {
        **json.loads(Path(load_tasks("kalgebra")["calc_power"].path).read_text()),
        "id": "my_power_of_two",
        "instruction": "Store 2^10 in a variable named b.",
        "evaluate": [{"type": "val", "name": "b", "value": 1024}],
        "solution": ["pyautogui.click(500, 751)", "pyautogui.write('b:=2^10')", "pyautogui.press('enter')", "DONE"],
    }
    (tmp_path / "kalgebra").mkdir()
    (tmp_path / "kalgebra" / "my_power_of_two.json").write_text(json.dumps(mine))
    monkeypatch.setenv("CODA_TASKS_PATH", str(tmp_path))
    assert main(["tasks", "kalgebra"]) == 0
    assert "my_power_of_two" in capsys.readouterr().out
    env = gym.make("coda/KAlgebra-v0", task="my_power_of_two")
    try:
        rewards, term, _, info = run_solution(env, "my_power_of_two")
        assert term and rewards[-1] == 1.0, info
    finally:
        env.close()
    monkeypatch.delenv("CODA_TASKS_PATH")
    out = tmp_path / "run"
    assert (
        main(
            [
                "eval",
                "--agent",
                "oracle",
                "--tasks-dir",
                str(tmp_path),
                "--tasks",
                "my_power_of_two",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert json.loads((out / "results.json").read_text())["summary"]["overall"]["rate"] == 1.0
