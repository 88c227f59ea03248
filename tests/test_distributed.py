"""RayVectorEnv on a local Ray instance (2 CPUs, 2 actors), real KAlgebra desktops: an oracle eval through it,
an actor killed and an actor hung mid-episode (replaced, episode truncated with info["error"], no hang), and
nothing left behind (actor processes, desktop processes)."""

from __future__ import annotations

import os
import signal

import pytest

ray = pytest.importorskip("ray", reason="pip install -e .[ray]")

from coda_agent.eval import run_eval  # noqa: E402
from coda_agent.policy import make_agent  # noqa: E402
from coda_env.distributed import RayVectorEnv  # noqa: E402

from .conftest import live_token_pids, wait_until  # noqa: E402

ENV = "coda/KAlgebra-v0"


@pytest.fixture(scope="module")
def local_ray():
    # Ray waits a fixed 30 s for its raylet to register; on an overloaded machine that can pass: try again
    for attempt in range(3):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    yield
    ray.shutdown()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _error(infos: dict, i: int):
    return infos["error"][i] if "error" in infos and infos["_error"][i] else None


def _assert_nothing_left(pids, tokens):
    assert wait_until(lambda: all(_gone(p) for p in pids), timeout=20), "an env actor process outlived close()"
    for t in tokens:
        assert wait_until(lambda: not live_token_pids(t), timeout=20), f"desktop {t} left {live_token_pids(t)}"


def test_oracle_eval_through_ray_actors(local_ray, tmp_path):
    made = []

    def make_envs(n):
        envs = RayVectorEnv(ENV, n, num_cpus=1, memory=512 << 20)
        made.append((envs, envs.actor_pids(), envs.desktop_tokens()))
        return envs

    tasks = ["tab_3d_graph", "calc_power", "calc_factorial_10", "dict_gcd"]
    agent = make_agent("oracle", "kalgebra")
    summary = run_eval(ENV, agent, tmp_path, task_ids=tasks, num_envs=2, make_envs=make_envs, progress=False)
    assert summary["overall"] == {"n": 4, "success": 4, "rate": 1.0}, summary
    ((envs, pids, tokens),) = made
    assert envs.closed and len(set(pids)) == 2 and os.getpid() not in pids
    _assert_nothing_left(pids, tokens)


def test_dead_or_hung_actor_is_replaced_and_reported(local_ray):
    envs = RayVectorEnv(ENV, 2, num_cpus=1, memory=512 << 20, task="tab_3d_graph", timeout=60)
    old_pids, old_tokens = envs.actor_pids(), envs.desktop_tokens()
    try:
        obs, infos = envs.reset(seed=0)
        assert obs["screenshot"].shape == (2, 800, 1280, 3)
        assert all(live_token_pids(t) for t in old_tokens)  # each actor's desktop is up
        # 1. env 0's actor process dies mid-episode
        os.kill(old_pids[0], signal.SIGKILL)
        obs, r, term, trunc, infos = envs.step(("pyautogui.click(207, 53)", "pyautogui.click(207, 53)"))
        assert trunc[0] and not term[0] and r[0] == 0.0 and "EnvActorDied" in infos["error"][0]
        assert infos["_error"].tolist() == [True, False] and not trunc[1]
        obs, r, term, trunc, infos = envs.step(("WAIT", "DONE"))  # env 0 resets on a fresh actor
        assert not trunc[0] and infos["task"][0] == "tab_3d_graph" and obs["screenshot"][0].std() > 0, infos
        # env 1 went on undisturbed: its DONE ends its episode (on a machine loaded past its limits the env's
        # own state read can time out, which CodaEnv reports as a truncation with its error: not the actor's)
        assert (term[1] or trunc[1]) and not str(_error(infos, 1)).startswith("EnvActor"), infos.get("error")
        assert envs.restarts == 1
        # 2. env 1's actor hangs (stopped): the step returns after the timeout instead of waiting forever
        envs.timeout = 8
        pids = envs.actor_pids()
        assert pids[0] != old_pids[0] and pids[1] == old_pids[1]
        os.kill(pids[1], signal.SIGSTOP)
        obs, r, term, trunc, infos = envs.step(("pyautogui.click(207, 53)", "WAIT"))
        assert trunc[1] and "EnvActorTimeout" in infos["error"][1] and not trunc[0], infos
        envs.timeout = 60
        obs, r, term, trunc, infos = envs.step(("DONE", "WAIT"))
        assert (term[0] or trunc[0]) and not str(_error(infos, 0)).startswith("EnvActor"), infos.get("error")
        assert infos["task"][1] == "tab_3d_graph"
        assert envs.restarts == 2
        # the replaced actors' desktops did not outlive them (the desktop's watchdog)
        _assert_nothing_left(old_pids, old_tokens)
        new_pids, new_tokens = envs.actor_pids(), envs.desktop_tokens()
        # set_attr/get_attr/call reach the (new) actors
        envs.set_attr("next_task", ["calc_power", "dict_gcd"])
        assert envs.get_attr("next_task") == ("calc_power", "dict_gcd")
        assert envs.call("task_ids") == (["tab_3d_graph"], ["tab_3d_graph"])
    finally:
        envs.close()
    _assert_nothing_left(new_pids, new_tokens)


def test_libvirt_uris_and_placement_options():
    """How actors are configured (no actor started): URIs round-robin, resources and node placement declared."""
    uris = ["qemu+ssh://a/system", "qemu+ssh://b/system"]
    kws = [
        RayVectorEnv._kwargs_for(i, {"task": "calc_power", "backend_options": {"base_image": "/img.qcow2"}}, uris)
        for i in range(3)
    ]
    assert [k["backend_options"]["uri"] for k in kws] == [uris[0], uris[1], uris[0]]
    assert all(k["backend"] == "libvirt" and k["backend_options"]["base_image"] == "/img.qcow2" for k in kws)
    with pytest.raises(ValueError, match="backend='libvirt'"):
        RayVectorEnv._kwargs_for(0, {"backend": "local"}, uris)
    opts = RayVectorEnv._actor_options(1, 2.0, 3 << 30, ["aa" * 28, "bb" * 28], {"runtime_env": {"env_vars": {}}})
    assert opts["num_cpus"] == 2.0 and opts["memory"] == 3 << 30 and opts["runtime_env"] == {"env_vars": {}}
    assert opts["scheduling_strategy"].node_id == "bb" * 28
    assert RayVectorEnv._actor_options(0, 1, None, "spread", None)["scheduling_strategy"] == "SPREAD"
    with pytest.raises(ValueError, match="placement"):
        RayVectorEnv._actor_options(0, 1, None, "everywhere", None)
