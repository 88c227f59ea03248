"""EnvPool (coda_env.pool): envs in their own processes, stepped independently. The pool's mechanics on a
FAKE env (`SleepyEnv`, below: a step sleeps, dies or raises as its action says; no X server), then real
KAlgebra under real Xvfb: `coda eval`'s runner over a pool, a worker killed mid-run, and a killed parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from coda_env.pool import EnvPool, EnvPoolError

from .conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent
SLEEPY = "test/Sleepy-v0"


class SleepyEnv(gym.Env):
    """A FAKE env for the pool's mechanics: action "sleep S" sleeps S seconds, "die" ends the process at
    once (as a killed worker), "raise" raises, "done" ends the episode with reward 1."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {"screenshot": spaces.Box(0, 255, (2, 2, 3), np.uint8), "instruction": spaces.Text(100)}
        )
        self.action_space = spaces.Text(100)
        self.task = None

    def _obs(self):
        return {"screenshot": np.full((2, 2, 3), os.getpid() % 255, np.uint8), "instruction": str(self.task)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.task = (options or {}).get("task", "t")
        time.sleep((options or {}).get("sleep", 0))
        return self._obs(), {"task": self.task, "pid": os.getpid()}

    def step(self, action):
        if action.startswith("sleep"):
            time.sleep(float(action.split()[1]))
        elif action == "die":
            os._exit(3)
        elif action == "raise":
            raise ValueError("the sleepy env refuses")
        return self._obs(), float(action == "done"), action == "done", False, {"task": self.task, "pid": os.getpid()}


if SLEEPY not in gym.registry:
    gym.register(SLEEPY, entry_point=SleepyEnv, disable_env_checker=True)


def _reset_all(pool: EnvPool) -> dict[int, dict]:
    for i in range(pool.num_envs):
        pool.send_reset(i, options={"task": f"t{i}"})
    got = {}
    while len(got) < pool.num_envs:
        got.update({r.env: r.info for r in pool.recv()})
    return got


@pytest.mark.fast
def test_recv_answers_whichever_env_is_ready_without_waiting_for_the_others():
    with EnvPool(SLEEPY, 2) as pool:
        infos = _reset_all(pool)
        assert infos[0]["pid"] != infos[1]["pid"] != os.getpid()  # one process per env
        pool.send_step(0, "sleep 1.5")
        pool.send_step(1, "sleep 0")
        first = pool.recv()
        assert [r.env for r in first] == [1] and first[0].kind == "step"
        assert pool.busy == [0]  # env 0 is still in its step
        for _ in range(3):  # env 1 goes on stepping while env 0 sleeps
            pool.send_step(1, "sleep 0")
            assert [r.env for r in pool.recv()] == [1]
        pool.send_step(1, "done")
        rs = []
        while len(rs) < 2:
            rs += pool.recv()
        assert sorted((r.env, r.terminated, r.reward) for r in rs) == [(0, False, 0.0), (1, True, 1.0)]
        assert pool.recv() == []  # nothing is due
        with pytest.raises(EnvPoolError, match="has not answered"):
            pool.send_step(0, "sleep 1")
            pool.send_step(0, "sleep 0")


@pytest.mark.fast
def test_a_dead_worker_is_replaced_and_its_episode_ends_with_the_error():
    with EnvPool(SLEEPY, 2) as pool:
        before = _reset_all(pool)
        pool.send_step(0, "die")
        (r,) = pool.recv()
        assert r.env == 0 and r.truncated and not r.terminated and r.reward == 0.0
        assert "worker process died (exit code 3)" in r.info["error"] and r.info["task"] == "t0"
        assert r.obs["screenshot"].shape == (2, 2, 3) and not r.obs["screenshot"].any()  # a blank observation
        pool.send_reset(0, options={"task": "again"})
        (r,) = pool.recv()
        assert r.kind == "reset" and r.info["task"] == "again" and r.info["pid"] != before[0]["pid"]
        # a worker that dies in a reset: answered as a failed set-up (what SetupFailure answers)
        pool.send_reset(1, options={"task": "x", "sleep": 30})
        os.kill(pool._slots[1].process.pid, signal.SIGKILL)
        (r,) = pool.recv()
        assert r.env == 1 and r.kind == "reset" and r.info["task"] == "x"
        assert "worker process died (exit code -9)" in r.info["setup_error"]


@pytest.mark.fast
def test_an_env_error_names_the_env_and_the_env_stays_usable():
    with EnvPool(SLEEPY, 2) as pool:
        _reset_all(pool)
        pool.send_step(1, "raise")
        with pytest.raises(EnvPoolError, match=r"env 1 of test/Sleepy-v0 raised in its step: ValueError: the sleepy"):
            pool.recv()
        pool.send_step(1, "done")
        (r,) = pool.recv()
        assert r.terminated and r.reward == 1.0
    with pytest.raises(EnvPoolError, match="closed"):
        pool.send_step(0, "done")
    with pytest.raises(ValueError, match="at least one env"):
        EnvPool(SLEEPY, 0)


HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
import tests.test_pool
from coda_env.pool import EnvPool
pool = EnvPool({env!r}, 2{kwargs})
for i in range(2):
    pool.send_reset(i, options={task})
got = []
while len(got) < 2:
    got += pool.recv()
print(*[s.process.pid for s in pool._slots], flush=True)
time.sleep(600)
"""


def _descendants(pid: int) -> set[int]:
    """`pid` and every live process under it."""
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        out.add(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                    alive.add(p)
        except OSError:
            continue
    return alive


def _kill_holder_and_check(env_id: str, kwargs: str, task: str, min_procs: int) -> None:
    code = HOLDER.format(root=str(ROOT), env=env_id, kwargs=kwargs, task=task)
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        workers = [int(p) for p in holder.stdout.readline().split()]
        assert len(workers) == 2, workers
        procs = set().union(*(_descendants(w) for w in workers))
        assert len(_alive(procs)) >= min_procs, procs
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert wait_until(lambda: not _alive(procs), 30), _alive(procs)


@pytest.mark.fast
def test_a_killed_parent_leaves_no_worker():
    _kill_holder_and_check(SLEEPY, "", "{'task': 't'}", 2)


# ------------------------------------------------------------------------------------------ real KAlgebra
kalgebra = pytest.mark.skipif(
    not Path("/usr/bin/kalgebra").exists() and not Path("/usr/bin/kalgebramobile").exists(),
    reason="KAlgebra is not installed",
)


@kalgebra
def test_a_killed_parent_leaves_no_worker_desktop_or_app():
    """Two real KAlgebra envs in a pool; the parent SIGKILLed: every worker, Xvfb, window manager, D-Bus and
    app under them goes."""
    _kill_holder_and_check("coda/KAlgebra-v0", "", "{'task': 'calc_power'}", 2 * 4)


@kalgebra
def test_a_worker_killed_mid_run_is_one_failed_episode_and_the_run_goes_on(tmp_path):
    """`coda eval`'s runner on a pool of two real KAlgebra envs; an agent that kills env 0's worker at its
    second step: that episode is recorded as failed with the error, the fresh worker runs the tasks after it,
    every other episode is solved, and nothing of the dead worker's desktop is left."""
    from coda_agent.eval import run_eval
    from coda_agent.policy import OracleAgent
    from coda_agent.rollout import make_env_pool

    tasks = ["calc_hypotenuse", "calc_power", "calc_log2_3", "dict_gcd", "calc_gcd_lcm"]
    holder: dict = {}

    class KillingOracle(OracleAgent):
        def __init__(self):
            super().__init__()
            self.killed, self.task, self.t = None, {}, {}

        def reset(self, slot, task):
            super().reset(slot, task)
            self.task[slot], self.t[slot] = task.id, 0

        def act(self, batch):
            steps = super().act(batch)
            for slot, _ in batch:
                self.t[slot] += 1
                if self.killed is None and slot == 0 and self.t[slot] == 2:
                    pid = holder["pool"]._slots[0].process.pid
                    self.killed = self.task[slot], _descendants(pid)
                    os.kill(pid, signal.SIGKILL)  # before its second step is sent
            return steps

    agent = KillingOracle()

    def make(n):
        holder["pool"] = make_env_pool("coda/KAlgebra-v0", n)
        return holder["pool"]

    summary = run_eval("coda/KAlgebra-v0", agent, tmp_path / "run", tasks, num_envs=2, progress=False, make_envs=make)
    killed_task, procs = agent.killed
    results = {r["task"]: r for r in summary_records(tmp_path / "run")}
    assert set(results) == set(tasks)
    assert not results[killed_task]["success"] and "worker process died" in results[killed_task]["error"]
    failed = {t: (r.get("error"), r.get("checks")) for t, r in results.items() if t != killed_task and not r["success"]}
    assert not failed, f"killed {killed_task}; failed besides: {failed}"
    assert summary["overall"]["success"] == len(tasks) - 1
    assert wait_until(lambda: not _alive(procs), 30), _alive(procs)


def summary_records(out: Path) -> list[dict]:
    import json

    return json.loads((out / "results.json").read_text())["episodes"]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@kalgebra
def test_ctrl_c_ends_a_pooled_coda_eval_at_once_and_leaves_nothing(tmp_path):
    """Ctrl-C (SIGINT to the process group) during `coda eval --num-envs 2`: the run ends within seconds, exit
    code 130, no process of it is left (workers included: a worker blocked sending an observation the
    parent no longer reads must still see its close), and the finished episodes are kept."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "coda_agent.cli", "eval", "--agent", "oracle", "--num-envs", "2"]
    cmd += ["--out", str(out), "--quiet"]
    # as from a shell: Ctrl-C neither ignored nor blocked. A child inherits both from this process, and in the
    # full suite something earlier left SIGINT so (3 of 3 fresh `make test` runs here: the eval then ran to
    # its end, exit 0; alone the test passed)
    inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_default_sigint,
    )
    done = out / "episodes.jsonl"
    try:
        assert wait_until(lambda: done.exists() and len(done.read_text().splitlines()) >= 3, timeout=120)
        procs = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        rc = proc.wait(timeout=40)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert rc == 130, (proc.stderr.read(), "this process's SIGINT handler and blocked signals:", inherited)
    assert took < 30, f"{took:.1f} s to end after Ctrl-C"
    assert wait_until(lambda: not _alive(procs), 30), _alive(procs)
    assert len(done.read_text().splitlines()) >= 3
