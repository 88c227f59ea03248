"""Episodes of an agent over a gymnasium vector env: the one loop that `coda eval` and the trainers share.

`run_episodes` feeds a queue of (task, episode) pairs through the N envs of a vector env in NEXT_STEP autoreset
mode: each env tells its next task through `CodaEnv.next_task`, the agent acts on every active env in one
batched call, and callbacks see each episode start, each step and each end as it happens (eval writes files
from them; the trainer keeps records in memory). `collect_groups` is the trainers' use of it: G episodes of
every task, and every model call that gave token ids kept as a `Sample` tagged with the role of the model
that made it, a group key and a reward (by default the episode's, for GRPO over the episodes of one task in
one batch; a sample that carries its own key and reward keeps them: a step-level method groups by state),
so that a training method picks the samples it learns from by role and compares them within groups by key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from coda_env.runs import TrajectoryWriter, append_jsonl, py

from .types import Agent, AgentStep, Role, Sample

__all__ = [
    "Role",
    "Rollout",
    "RunRecorder",
    "Sample",
    "collect_groups",
    "make_env_pool",
    "make_vector_env",
    "run_episodes",
    "step_record",
    "task_group_key",
    "unbatch_info",
]


def unbatch_info(infos: dict, i: int) -> dict:
    """Env i's info out of a vector env's batched info (arrays with `_key` presence masks)."""
    out = {}
    for k, v in infos.items():
        if k.startswith("_"):
            continue
        mask = infos.get(f"_{k}")
        if mask is not None and not mask[i]:
            continue
        out[k] = unbatch_info(v, i) if isinstance(v, dict) else py(v[i])
    return out


def step_record(step: AgentStep) -> dict:
    """What the run folder keeps of an agent's step (coda_env.runs.TrajectoryWriter.record)."""
    return {
        "thought": step.thought,
        "plan": step.plan,
        "action": step.action,
        "parse_errors": step.parse_errors,
        "calls": step.calls,
    }


class RunRecorder:
    """A run folder written as the episodes happen (what `coda eval` and the trainers' `out` share): one
    TrajectoryWriter per env slot (out/trajectories/<task>__<episode>/), and each finished episode's record
    appended to out/episodes.jsonl, which a rerun resumes from. `close()` closes the episodes still open (an
    interrupted run keeps every step it took); it is a context manager for that."""

    def __init__(self, out: Path):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.writers: dict[int, TrajectoryWriter] = {}

    def start(self, slot: int, task, episode: int, shot: np.ndarray) -> None:
        self.writers[slot] = TrajectoryWriter(self.out, task, episode, shot)

    def step(self, slot: int, step: AgentStep, shot: np.ndarray, reward: float, info: dict, agent_s: float):
        """Record one step of the episode in `slot`; returns its writer (task, steps so far)."""
        w = self.writers[slot]
        w.record(step_record(step), shot, reward, info, agent_s)
        return w

    def end(self, slot: int, reward: float, info: dict) -> dict:
        """Finish the episode in `slot`: its record, also appended to episodes.jsonl."""
        rec = self.writers.pop(slot).finish(reward, info)
        append_jsonl(self.out / "episodes.jsonl", rec)
        return rec

    def close(self) -> None:
        for w in self.writers.values():
            w.close()
        self.writers.clear()

    def __enter__(self) -> "RunRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_vector_env(env_id: str, num_envs: int, **env_kwargs) -> gym.vector.VectorEnv:
    """N envs, each with its own desktop (async when N > 1), in the autoreset mode `run_episodes` expects; a
    task whose set-up fails is one failed episode there (coda_env.wrappers.SetupFailure), not the run's end."""
    from coda_env.wrappers import SetupFailure

    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="async" if num_envs > 1 else "sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
        wrappers=[SetupFailure],
        **env_kwargs,
    )


OnStart = Callable[[int, Any, int, np.ndarray], None]  # slot, task, episode, first screenshot
OnStep = Callable[[int, "AgentStep", np.ndarray, float, dict, float], None]  # slot, step, screen, reward, info, agent s
OnEnd = Callable[[int, float, dict], None]  # slot, final reward, final info


def make_env_pool(env_id: str, num_envs: int, **env_kwargs):
    """N envs stepped independently (coda_env.pool.EnvPool: each env in its own process, none waits for the
    others), with SetupFailure as `make_vector_env` has it; `coda eval`'s default."""
    from coda_env.pool import EnvPool
    from coda_env.wrappers import SetupFailure

    return EnvPool(env_id, num_envs, wrappers=[SetupFailure], **env_kwargs)


def run_episodes(
    envs,
    agent: Agent,
    tasks: dict,
    queue: Sequence[tuple[str, int]],
    on_start: OnStart,
    on_step: OnStep,
    on_end: OnEnd,
    seed: int | None = None,
) -> None:
    """Run every (task id, episode) of `queue` to its end. The envs are reset first (so a vector env can be
    reused across calls) and each env gets its next task as soon as it finishes one. A reset whose set-up
    failed (info["setup_error"], from coda_env.wrappers.SetupFailure) is an episode that starts and ends
    there: on_start, then on_end with reward 0 and info["error"]; the env's next step ends it and the step
    after resets the env to its next task. `envs` may also be an EnvPool (`make_env_pool`), whose envs do not
    wait for each other: see `_run_pool`."""
    queue = list(queue)
    if not queue:
        return
    from coda_env.pool import EnvPool

    if isinstance(envs, EnvPool):
        return _run_pool(envs, agent, tasks, queue, on_start, on_step, on_end, seed)
    n = envs.num_envs
    pending: list[tuple[str, int] | None] = [queue.pop(0) if queue else None for _ in range(n)]
    envs.set_attr("next_task", [p[0] if p else None for p in pending])
    obs, infos = envs.reset(seed=seed)
    active = [False] * n
    fresh = np.ones(n, dtype=bool)  # envs whose obs is a fresh reset
    autoreset = np.zeros(n, dtype=bool)  # envs that reset on the next step (NEXT_STEP mode)
    failed = np.zeros(n, dtype=bool)  # envs whose reset failed: their next step ends that episode
    while True:
        started = []
        for i in np.flatnonzero(fresh):
            if pending[i] is not None:
                tid, ep = pending[i]
                info = unbatch_info(infos, i)
                got = info.get("task")
                if got != tid:
                    raise RuntimeError(f"env {i} reset to task {got!r}, expected {tid!r}")
                # each env's next task is reserved when it starts one, so that it can prepare it (swap_reset)
                pending[i] = queue.pop(0) if queue else None
                started.append(int(i))
                if info.get("setup_error"):
                    on_start(int(i), tasks[tid], ep, obs["screenshot"][i])
                    on_end(
                        int(i),
                        0.0,
                        {"task": tid, "success": False, "checks": [], "error": f"set-up failed: {info['setup_error']}"},
                    )
                    failed[i] = True
                    continue
                active[i] = True
                agent.reset(int(i), tasks[tid])
                on_start(int(i), tasks[tid], ep, obs["screenshot"][i])
        if started:  # each env reads it at its first step (the others have read theirs already)
            envs.set_attr("upcoming_task", [pending[i][0] if i in started and pending[i] else None for i in range(n)])
        slots = [i for i in range(n) if active[i]]
        if not slots and not any((autoreset[i] or failed[i]) and pending[i] for i in range(n)):
            return
        t0 = time.monotonic()
        steps = agent.act([(i, {k: v[i] for k, v in obs.items()}) for i in slots]) if slots else []
        agent_s = (time.monotonic() - t0) / max(1, len(slots))
        actions = ["WAIT"] * n
        for i, st in zip(slots, steps):
            actions[i] = st.action
        obs, rewards, terms, truncs, infos = envs.step(tuple(actions))
        failed[:] = False  # this step ended their empty episodes (terminated)
        fresh = autoreset  # this step reset them: their obs starts an episode
        for i, st in zip(slots, steps):
            info = unbatch_info(infos, i)
            on_step(i, st, obs["screenshot"][i], float(rewards[i]), info, agent_s)
            if terms[i] or truncs[i]:
                on_end(i, float(rewards[i]), info)
                active[i] = False
        autoreset = np.logical_or(terms, truncs)
        if autoreset.any():
            # NEXT_STEP autoreset: those envs reset on the next step; tell each which task is next
            envs.set_attr("next_task", [pending[i][0] if autoreset[i] and pending[i] else None for i in range(n)])


def _run_pool(pool, agent, tasks, queue, on_start, on_step, on_end, seed) -> None:
    """`run_episodes` on an EnvPool: whenever envs answer, the agent acts on those that are ready (one batched
    call) and each is sent its action at once, while the others go on. As in the lockstep loop, each env's
    next task is reserved when it starts one (its `upcoming_task`, for swap resets); an env that finds the
    queue empty takes the task another env reserved but has not started. Env i's first reset gets
    seed + i (as a vector env seeds its envs), later ones none."""
    n = min(pool.num_envs, len(queue))
    current: dict[int, tuple[str, int]] = {}  # env -> the (task, episode) it runs
    pending: dict[int, tuple[str, int] | None] = {}  # env -> the (task, episode) it runs next
    acting: dict[int, tuple[AgentStep, float]] = {}  # env -> the step it was sent, and the agent's seconds

    def start(i: int, first: bool = False) -> bool:
        nxt = pending.pop(i, None)
        if nxt is None and not queue:  # take a task another env reserved and has not started
            j = next((j for j, p in pending.items() if p is not None), None)
            if j is not None:
                nxt, pending[j] = pending[j], None
        if nxt is None and queue:
            nxt = queue.pop(0)
        if nxt is None:
            return False
        current[i] = nxt
        pending[i] = queue.pop(0) if queue else None
        s = None if seed is None or not first else seed + i
        pool.send_reset(i, seed=s, options={"task": nxt[0]}, upcoming=pending[i][0] if pending[i] else None)
        return True

    for i in range(n):
        start(i, first=True)
    while pool.busy:
        ready = []
        for r in pool.recv():
            i = r.env
            tid, ep = current[i]
            if r.kind == "reset":
                if r.info.get("task") != tid:
                    raise RuntimeError(f"env {i} reset to task {r.info.get('task')!r}, expected {tid!r}")
                on_start(i, tasks[tid], ep, r.obs["screenshot"])
                if r.info.get("setup_error"):
                    on_end(
                        i,
                        0.0,
                        {
                            "task": tid,
                            "success": False,
                            "checks": [],
                            "error": f"set-up failed: {r.info['setup_error']}",
                        },
                    )
                    start(i)
                    continue
                agent.reset(i, tasks[tid])
                ready.append((i, r.obs))
            else:
                st, agent_s = acting.pop(i)
                on_step(i, st, r.obs["screenshot"], r.reward, r.info, agent_s)
                if r.terminated or r.truncated:
                    on_end(i, r.reward, r.info)
                    start(i)
                else:
                    ready.append((i, r.obs))
        if ready:
            t0 = time.monotonic()
            steps = agent.act(ready)
            agent_s = (time.monotonic() - t0) / len(ready)
            for (i, _), st in zip(ready, steps):
                acting[i] = (st, agent_s)
                pool.send_step(i, st.action)


@dataclass
class Rollout:
    """One episode as a trainer sees it: its samples (every role) and its reward."""

    task: str
    app: str
    group: str  # the group key its samples carry
    samples: list[Sample] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # JSON-safe step records (thought, action, errors)
    reward: float = 0.0
    success: bool = False
    info: dict = field(default_factory=dict)


def task_group_key(task_id: str, index: int) -> str:
    """GRPO's group key: the task and its group's index in the batch (a task listed twice is two groups)."""
    return f"{task_id}#{index}"


OnSample = Callable[["Rollout", int, AgentStep, dict], None]  # rollout, step number (1-based), step, env info


def collect_groups(
    envs: gym.vector.VectorEnv,
    agent: Agent,
    tasks: dict,
    task_ids: Sequence[str],
    group_size: int,
    seed: int | None = None,
    out: Path | None = None,
    group_key: Callable[[str, int], str] = task_group_key,
    tag_step: OnSample | None = None,
) -> list[Rollout]:
    """G = `group_size` episodes of every task in `task_ids`, batched over the envs; rollouts in queue order.
    Each episode's samples carry `group_key(task id, index of the task in task_ids)` and, once it ends, its
    reward, unless the sample already carries its own (`Sample.group`/`Sample.reward` not None): a method that
    groups by state and scores each step tags its samples itself, in the agent or in `tag_step`, which sees
    every step (its rollout, step number, AgentStep with its samples, env info) before they are kept. With
    `out`, the episodes are also written as `coda eval` trajectories (out/trajectories, out/episodes.jsonl),
    which stage-2 SFT reads."""
    # episode numbers go on across repeats of a task, so that (task, episode) names one episode (and its folder)
    queue = [(t, task_ids[:g].count(t) * group_size + e) for g, t in enumerate(task_ids) for e in range(group_size)]
    rollouts = [Rollout(t, tasks[t].app, group_key(t, g)) for g, t in enumerate(task_ids) for _ in range(group_size)]
    index = {q: k for k, q in enumerate(queue)}
    current: dict[int, Rollout] = {}
    recorder = RunRecorder(out) if out is not None else None

    def on_start(slot, task, ep, shot):
        current[slot] = rollouts[index[(task.id, ep)]]
        if recorder is not None:
            recorder.start(slot, task, ep, shot)

    def on_step(slot, step, shot, reward, info, agent_s):
        r = current[slot]
        if tag_step is not None:
            tag_step(r, len(r.steps) + 1, step, info)
        for sample in step.samples:
            if sample.group is None:
                sample.group = r.group
            r.samples.append(sample)
        r.steps.append(
            {
                "thought": step.thought,
                "plan": step.plan,
                "action": step.action,
                "parse_errors": step.parse_errors,
                "action_error": info.get("action_error"),
            }
        )
        if recorder is not None:
            recorder.step(slot, step, shot, reward, info, agent_s)

    def on_end(slot, reward, info):
        r = current.pop(slot)
        r.reward, r.success, r.info = reward, bool(info.get("success")), info
        for sample in r.samples:
            if sample.reward is None:
                sample.reward = reward
        if recorder is not None:
            recorder.end(slot, reward, info)

    try:
        run_episodes(envs, agent, tasks, queue, on_start, on_step, on_end, seed=seed)
    finally:
        if recorder is not None:
            recorder.close()
    return rollouts
