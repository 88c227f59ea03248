"""Env throughput: aggregate steps/s and episodes/s for 1, 2 and 4 envs under gymnasium's SyncVectorEnv and
AsyncVectorEnv and under RayVectorEnv (Ray actors); CPU seconds per reset and per step of one env; then a
paper estimate of the hosts a GRPO run of CODA's size needs.

Every env replays its task's oracle solution (episodes of the tasks' own length, as an agent that solves
them would make), cycling over --tasks; a vector env in NEXT_STEP autoreset mode starts the next episode on
the step after one ends, as `coda eval` and the GRPO trainer run it. CPU per reset/step is measured on one
env in this process: this process's CPU plus that of every process carrying the desktop's token (Xvfb, the
window manager, D-Bus, AT-SPI, the app) plus reaped children, from /proc and getrusage.
`--profile` instead says where an episode's time goes with 1, 2 and 4 async envs, with and without swap
resets: per phase (reset: swap wait, desktop, app launch, setup operations, settle; step: action, settle,
screenshot, checks), each env's busy and idle share of the wall time, and each core's busy share (/proc/stat),
for envs stepped in lockstep (gymnasium's vector env) and as a pool (coda_env.pool.EnvPool, no env waiting
for another; `--runners`). `--eval` instead times `coda eval --agent oracle` on the whole KAlgebra suite with
each --num-envs, side by side in one run, pool and lockstep.
Usage: python benchmarks/throughput.py [--seconds 20] [--num-envs 1 2 4] [--modes sync async ray]
       [--profile [--runners lockstep pool] [--swap off on]] [--eval]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import coda_env  # noqa: F401
from coda_env.backends.local import token_pids
from coda_env.env import CodaEnv

ENV = "coda/KAlgebra-v0"
HZ = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------ CPU accounting
def token_cpu(token: str) -> dict[int, float]:
    """CPU seconds (own + reaped children) of each live process carrying the desktop's token."""
    out = {}
    for e in token_pids(token):
        try:
            with open(f"/proc/{e}/stat") as f:
                p = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[e] = sum(int(v) for v in p[11:15]) / HZ
    return out


def own_cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def pss_mb(token: str) -> float:
    """PSS of the desktop's processes (shared pages counted once), MB."""
    total = 0.0
    for e in token_pids(token):
        try:
            with open(f"/proc/{e}/smaps_rollup") as f:
                total += sum(float(ln.split()[1]) for ln in f if ln.startswith("Pss:"))
        except OSError:
            continue
    return total / 1024


class CpuMeter:
    """CPU seconds used since the last `take()` by this process, its reaped children and the desktop."""

    def __init__(self, token: str):
        self.token = token
        self.last_own, self.last = own_cpu(), token_cpu(token)

    def take(self) -> float:
        own, now = own_cpu(), token_cpu(self.token)
        used = own - self.last_own + sum(v - self.last.get(p, 0.0) for p, v in now.items())
        # a process gone since the last take (the app killed by a reset) is counted in full by its reaper
        # (RUSAGE_CHILDREN here, or its parent's children time): take off what earlier takes counted of it
        used -= sum(v for p, v in self.last.items() if p not in now)
        self.last_own, self.last = own, now
        return used


def cpu_per_reset_and_step(tasks: list[str], episodes: int) -> dict:
    """Replay `episodes` oracle episodes on one env; CPU and wall per reset and per step; memory."""
    env = CodaEnv("kalgebra", tasks=tasks)
    try:
        env.reset(seed=0)  # starts the desktop (not counted: once per env)
        meter = CpuMeter(env.desktop.token)
        meter.take()
        resets, steps, wall_r, wall_s = [], [], [], []
        for k in range(episodes):
            t = time.monotonic()
            env.reset(options={"task": tasks[k % len(tasks)]})
            wall_r.append(time.monotonic() - t)
            resets.append(meter.take())
            for action in env.tasks[tasks[k % len(tasks)]].solution:
                t = time.monotonic()
                _, _, term, trunc, _ = env.step(action)
                wall_s.append(time.monotonic() - t)
                steps.append(meter.take())
                if term or trunc:
                    break
        mem = pss_mb(env.desktop.token)
    finally:
        env.close()
    return {
        "reset_cpu": statistics.median(resets),
        "reset_cpu_mean": statistics.mean(resets),
        "reset_wall": statistics.median(wall_r),
        "step_cpu": statistics.median(steps),
        "step_cpu_mean": statistics.mean(steps),
        "step_wall": statistics.median(wall_s),
        "steps_per_episode": len(steps) / episodes,
        "pss_mb": mem,
    }


# ------------------------------------------------------------------------------------------ vector throughput
def make_envs(mode: str, n: int, tasks: list[str]) -> gym.vector.VectorEnv:
    if mode == "ray":
        import ray
        from coda_env.distributed import RayVectorEnv

        if not ray.is_initialized():
            ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
        return RayVectorEnv(ENV, n, num_cpus=min(1.0, os.cpu_count() / n), memory=256 << 20, tasks=tasks)
    return gym.make_vec(
        ENV,
        num_envs=n,
        vectorization_mode=mode,
        tasks=tasks,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
    )


def replay(
    envs, tasks: list[str], seconds: float, solutions: dict[str, list[str]], on_step=None, on_start=None
) -> dict:
    """Oracle replay on a NEXT_STEP-autoreset vector env for `seconds` (the first reset not counted: `on_start()`
    runs after it); `on_step(i, info, was_reset)` sees every env's result of every step. Steps, episodes, wall."""
    from coda_agent.rollout import unbatch_info

    n = envs.num_envs
    envs.set_attr("next_task", [tasks[i % len(tasks)] for i in range(n)])
    _, infos = envs.reset(seed=0)
    current = [infos["task"][i] for i in range(n)]
    k = [0] * n
    autoreset = np.zeros(n, dtype=bool)
    steps = episodes = 0
    if on_start is not None:
        on_start()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        actions = []
        for i in range(n):
            sol = solutions[current[i]]
            actions.append("WAIT" if autoreset[i] else (sol[k[i]] if k[i] < len(sol) else "DONE"))
            k[i] += 0 if autoreset[i] else 1
        _, _, term, trunc, infos = envs.step(tuple(actions))
        for i in range(n):
            if on_step is not None:
                on_step(i, unbatch_info(infos, i), bool(autoreset[i]))
            if autoreset[i]:  # this step was env i's reset: its new task
                current[i], k[i] = infos["task"][i], 0
            else:
                steps += 1
        done = np.logical_or(term, trunc) & ~autoreset
        episodes += int(done.sum())
        autoreset = np.logical_or(term, trunc)
    return {"steps": steps, "episodes": episodes, "wall": time.monotonic() - t0}


def pool_replay(
    pool, tasks: list[str], seconds: float, solutions: dict[str, list[str]], on_step=None, on_start=None
) -> dict:
    """`replay` on an EnvPool (coda_env.pool): each env is sent its next action, or its next reset, as soon
    as it answers, without waiting for the others. The same tasks: each env's first is named, later ones
    are the env's own seeded draws (as a vector env's autoreset draws them)."""
    n = pool.num_envs
    for i in range(n):
        pool.send_reset(i, seed=i, options={"task": tasks[i % len(tasks)]})
    first = []
    while len(first) < n:
        first += pool.recv()
    current, k = [""] * n, [0] * n
    steps = episodes = 0
    if on_start is not None:
        on_start()
    t0 = time.monotonic()

    def act(i: int) -> None:
        sol = solutions[current[i]]
        pool.send_step(i, sol[k[i]] if k[i] < len(sol) else "DONE")
        k[i] += 1

    for r in first:
        current[r.env] = r.info["task"]
        act(r.env)
    while time.monotonic() - t0 < seconds:
        for r in pool.recv(timeout=max(0.0, seconds - (time.monotonic() - t0))):
            i = r.env
            if on_step is not None:
                on_step(i, r.info, r.kind == "reset")
            if r.kind == "reset":
                current[i], k[i] = r.info["task"], 0
                act(i)
                continue
            steps += 1
            if r.terminated or r.truncated:
                episodes += 1
                pool.send_reset(i)
            else:
                act(i)
    return {"steps": steps, "episodes": episodes, "wall": time.monotonic() - t0}


def throughput(mode: str, n: int, tasks: list[str], seconds: float, solutions: dict[str, list[str]]) -> dict:
    """Steps/s and episodes/s over `seconds` of oracle replay (the first reset not counted)."""
    envs = make_envs(mode, n, tasks)
    try:
        r = replay(envs, tasks, seconds, solutions)
    finally:
        envs.close()
    return {
        "steps_per_s": r["steps"] / r["wall"],
        "episodes_per_s": r["episodes"] / r["wall"],
        "steps": r["steps"],
        "episodes": r["episodes"],
    }


# ------------------------------------------------------------------------------------------ profile
RESET_PHASES = ("swap", "desktop", "launch", "setup", "settle")
STEP_PHASES = ("action", "settle", "screenshot", "evaluate")


def core_ticks() -> list[tuple[int, int]]:
    """(busy, total) jiffies of each core since boot."""
    out = []
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                v = [int(x) for x in line.split()[1:]]
                idle = v[3] + v[4]  # idle + iowait
                out.append((sum(v) - idle, sum(v)))
    return out


def profile(
    n: int, tasks: list[str], seconds: float, solutions: dict[str, list[str]], swap: bool, runner: str = "lockstep"
) -> dict:
    """Oracle replay on n envs for `seconds`, stepped in lockstep (gymnasium's vector env: async for n > 1)
    or as a `pool` (coda_env.pool.EnvPool: no env waits for another); where each env's time went, from the
    env's own timings."""
    from coda_env.pool import EnvPool

    kwargs = {"tasks": tasks, "info_timings": True, "swap_reset": swap}
    if runner == "pool":
        envs = EnvPool(ENV, n, **kwargs)
        run = pool_replay
    else:
        envs = gym.make_vec(
            ENV,
            num_envs=n,
            vectorization_mode="async" if n > 1 else "sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
            **kwargs,
        )
        run = replay
    phases = [
        dict.fromkeys([f"reset.{p}" for p in RESET_PHASES] + [f"step.{p}" for p in STEP_PHASES], 0.0) for _ in range(n)
    ]
    busy = [0.0] * n

    def account(i: int, info: dict, was_reset: bool) -> None:
        t = info.get("timings") or {}
        kind, names = ("reset", RESET_PHASES) if was_reset else ("step", STEP_PHASES)
        for p in names:
            phases[i][f"{kind}.{p}"] += t.get(p, 0.0)
        busy[i] += t.get("reset", 0.0) if was_reset else sum(t.get(p, 0.0) for p in STEP_PHASES)

    before: list[tuple[int, int]] = []
    try:
        r = run(envs, tasks, seconds, solutions, account, on_start=lambda: before.extend(core_ticks()))
        after = core_ticks()
    finally:
        envs.close()
    steps, episodes, wall = r["steps"], r["episodes"], r["wall"]
    cores = [(b1 - b0) / max(1, t1 - t0_) for (b0, t0_), (b1, t1) in zip(before, after)]
    per_episode = {p: sum(ph[p] for ph in phases) / max(1, episodes) for p in phases[0]}
    return {
        "episodes_per_s": episodes / wall,
        "episodes": episodes,
        "steps": steps,
        "per_episode": per_episode,
        "env_busy": [b / wall for b in busy],
        "cores": cores,
    }


def print_profile(a: argparse.Namespace, solutions: dict[str, list[str]]) -> None:
    rows = []
    for runner in a.runners:
        for swap in [{"off": False, "on": True}[x] for x in a.swap]:
            base = None
            for n in a.num_envs:
                r = profile(n, a.tasks, a.seconds, solutions, swap, runner)
                base = base or r["episodes_per_s"]
                rows.append((runner, swap, n, r))
                print(
                    f"{runner:<8} swap={'on ' if swap else 'off'} envs={n}: {r['episodes_per_s']:.3f} episodes/s "
                    f"({r['episodes_per_s'] / base:.2f}x), {r['episodes']} episodes, {r['steps']} steps; env busy "
                    f"{' '.join(f'{b:.0%}' for b in r['env_busy'])} (idle the rest); cores busy "
                    f"{' '.join(f'{c:.0%}' for c in r['cores'])}",
                    flush=True,
                )
    names = list(rows[0][3]["per_episode"])
    print("\nseconds per episode, summed over its reset and steps, by phase (from the envs' own timings):")
    label = {"lockstep": "lock", "pool": "pool"}
    print(f"{'phase':<18}" + "".join(f"{label[u] + (' swap ' if s else ' ') + str(n):>13}" for u, s, n, _ in rows))
    for p in names:
        print(f"{p:<18}" + "".join(f"{r['per_episode'][p]:>13.3f}" for *_, r in rows))
    print(
        f"{'wall/episode':<18}"
        + "".join(f"{len(r['env_busy']) / max(r['episodes_per_s'], 1e-9):>13.3f}" for *_, r in rows)
    )
    print("(wall/episode is per env: n envs / episodes per second; what the phases leave of it is idle time)")


def eval_suite(a: argparse.Namespace) -> None:
    """`coda eval --agent oracle` on the whole KAlgebra suite with each --num-envs, side by side in this run:
    episodes/s of each, as a pool (coda eval's default) and in lockstep (`--lockstep`); one env is the same
    either way (in-process) and is the baseline."""
    import tempfile

    from coda_agent.eval import run_eval
    from coda_agent.policy import OracleAgent

    print(f"\n`coda eval --agent oracle` on {ENV}'s whole suite, one run folder per configuration:")
    one = None
    configs = [(1, "one env")] * (1 in a.num_envs) + [(n, u) for u in a.runners for n in a.num_envs if n > 1]
    for n, runner in configs:
        with tempfile.TemporaryDirectory() as tmp:
            t = time.monotonic()
            s = run_eval(ENV, OracleAgent(), Path(tmp), num_envs=n, progress=False, lockstep=runner == "lockstep")
            wall = time.monotonic() - t
        eps = s["overall"]["n"] / wall
        one = one or eps
        print(
            f"  {runner:<8} envs={n}: {s['overall']['success']}/{s['overall']['n']} solved in {wall:.1f} s = "
            f"{eps:.3f} episodes/s ({eps / one:.2f}x the first row)",
            flush=True,
        )


# ------------------------------------------------------------------------------------------ estimate
def grpo_estimate(cost: dict, a: argparse.Namespace) -> str:
    """Hosts for one GRPO iteration's rollouts at CODA's scale, from one env's measured costs."""
    rollouts = a.group_size * a.apps * a.tasks_per_app  # episodes per iteration, all in flight
    steps = a.steps_per_episode
    env_cpu_episode = cost["reset_cpu"] + steps * cost["step_cpu"]
    env_wall_step = cost["step_wall"] + a.model_latency  # the env waits for the models each step
    episode_wall = cost["reset_wall"] + steps * env_wall_step
    cores_per_env = env_cpu_episode / episode_wall  # average busy cores of one env
    usable = a.host_cores * a.host_utilisation
    by_cpu = rollouts * cores_per_env / usable
    by_mem = rollouts * cost["pss_mb"] * a.memory_headroom / (a.host_mem_gb * 1024)
    hosts = max(1, math.ceil(max(by_cpu, by_mem)))
    cpu_s = rollouts * env_cpu_episode
    return "\n".join(
        [
            f"GRPO iteration: G={a.group_size} x {a.apps} apps x {a.tasks_per_app} tasks = {rollouts} rollouts in "
            f"flight, {steps} steps each, models {a.model_latency:.1f} s per step (planner + executor on GPUs)",
            f"  per env: {env_cpu_episode:.2f} CPU s per episode ({cost['reset_cpu']:.2f} reset + {steps} x "
            f"{cost['step_cpu']:.3f} step), episode wall {episode_wall:.0f} s -> {cores_per_env:.3f} busy cores; "
            f"{cost['pss_mb']:.0f} MB PSS",
            f"  cores needed {rollouts * cores_per_env:.1f} -> {by_cpu:.2f} hosts by CPU ({a.host_cores} cores at "
            f"{a.host_utilisation:.0%}); memory {rollouts * cost['pss_mb'] * a.memory_headroom / 1024:.0f} GB "
            f"(x{a.memory_headroom} headroom) -> {by_mem:.2f} hosts of {a.host_mem_gb} GB",
            f"  => {hosts} host(s) of {a.host_cores} cores; env CPU per iteration {cpu_s / 3600:.2f} core-hours; "
            f"the iteration's rollouts take ~{episode_wall / 60:.1f} min of wall time if all run at once",
            "  (KAlgebra's costs stand in for the 4 apps; a heavier app (ChimeraX, GRASS) scales the CPU term)",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="stepping time per configuration")
    ap.add_argument("--num-envs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--modes", nargs="+", default=["sync", "async", "ray"], choices=["sync", "async", "ray"])
    ap.add_argument("--tasks", nargs="+", default=["calc_power", "tab_3d_graph", "plot_parabola", "dict_gcd"])
    ap.add_argument("--cpu-episodes", type=int, default=8, help="episodes of the one-env CPU measurement")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--apps", type=int, default=4)
    ap.add_argument("--tasks-per-app", type=int, default=8, help="tasks per app in one GRPO batch")
    ap.add_argument("--steps-per-episode", type=int, default=15)
    ap.add_argument("--model-latency", type=float, default=4.0, help="planner + executor seconds per step")
    ap.add_argument("--host-cores", type=int, default=16)
    ap.add_argument("--host-mem-gb", type=float, default=64)
    ap.add_argument("--host-utilisation", type=float, default=0.75)
    ap.add_argument("--memory-headroom", type=float, default=1.5)
    ap.add_argument("--env-mem-mb", type=float, help="memory per env instead of the measured PSS (e.g. a VM's)")
    ap.add_argument("--profile", action="store_true", help="where an episode's time goes (see the docstring)")
    ap.add_argument("--runners", nargs="+", default=["lockstep", "pool"], choices=["lockstep", "pool"])
    ap.add_argument("--swap", nargs="+", default=["off", "on"], choices=["off", "on"], help="--profile: swap resets")
    ap.add_argument(
        "--eval", action="store_true", help="`coda eval --agent oracle` on the whole suite per --num-envs and runner"
    )
    a = ap.parse_args()

    probe = CodaEnv("kalgebra", tasks=a.tasks)
    solutions = {t: list(probe.tasks[t].solution) for t in a.tasks}
    probe.close()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; tasks {a.tasks}")
    if a.eval:
        eval_suite(a)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        return
    if a.profile:
        print_profile(a, solutions)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        return
    cost = cpu_per_reset_and_step(a.tasks, a.cpu_episodes)
    measured_pss = cost["pss_mb"]
    if a.env_mem_mb:
        cost["pss_mb"] = a.env_mem_mb
    print(
        f"one env: reset {cost['reset_cpu']:.3f} CPU s (median; mean {cost['reset_cpu_mean']:.3f}), "
        f"{cost['reset_wall']:.3f} s wall; step {cost['step_cpu']:.3f} CPU s (median; mean "
        f"{cost['step_cpu_mean']:.3f}), {cost['step_wall']:.3f} s wall; {cost['steps_per_episode']:.1f} steps "
        f"per episode; desktop+app PSS {measured_pss:.0f} MB"
    )
    print(f"\n{'mode':<6}{'envs':>5}{'steps/s':>10}{'episodes/s':>12}{'speedup':>9}")
    for mode in a.modes:
        base = None
        for n in a.num_envs:
            try:
                r = throughput(mode, n, a.tasks, a.seconds, solutions)
            except Exception as e:  # one failing mode (e.g. Ray missing) should not hide the others
                print(f"{mode:<6}{n:>5}  failed: {type(e).__name__}: {e}")
                continue
            base = base or r["episodes_per_s"]
            print(
                f"{mode:<6}{n:>5}{r['steps_per_s']:>10.2f}{r['episodes_per_s']:>12.3f}"
                f"{r['episodes_per_s'] / base if base else float('nan'):>8.2f}x",
                flush=True,
            )
    if "ray" in a.modes:
        import ray

        ray.shutdown()
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    print(grpo_estimate(cost, a))


if __name__ == "__main__":
    sys.exit(main())
