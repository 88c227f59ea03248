"""Latency and memory of real envs on the local backend, one app after another.

Prints, per env: reset p50/p95, step p50/p95 (a click + waiting for the screen to settle + the
screenshot), screenshot p50 and the memory of every process the env started (RSS summed, and PSS, which
counts shared pages once). With `--swap both`, the reset figures with and without swap resets (the next episode's app prepared while
an agent thinks). Usage: python benchmarks/env_latency.py [--env ID ...] [--resets 20] [--steps 100]
(default: every registered env that can run here; `--task` picks the reset task, else the env's first).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import numpy as np

import gymnasium as gym

import coda_env  # noqa: F401  (registers the envs)
from coda_env.backends.local import token_pids
from coda_env.registry import APPS


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def memory_mb(token: str) -> tuple[float, float, dict[str, float]]:
    """(RSS sum, PSS sum, RSS by command) over the processes carrying the desktop's token."""
    rss = pss = 0.0
    by: dict[str, float] = {}
    for e in token_pids(token):
        try:
            with open(f"/proc/{e}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{e}/smaps_rollup") as f:
                fields = {ln.split(":")[0]: float(ln.split()[1]) for ln in f if ln.split()[-1] == "kB"}
        except OSError:
            continue
        rss += fields.get("Rss", 0) / 1024
        pss += fields.get("Pss", 0) / 1024
        by[comm] = by.get(comm, 0) + fields.get("Rss", 0) / 1024
    return rss, pss, by


def bench(
    env_id: str, resets_n: int, steps_n: int, task: str | None, sandbox: bool = True, swap: bool = False, think=1.0
) -> None:
    t0 = time.monotonic()
    env = gym.make(env_id, max_steps=10_000, sandbox=sandbox, swap_reset=swap).unwrapped
    task = task if task in env.tasks else next(iter(env.tasks))
    env.reset(seed=0, options={"task": task})
    first = time.monotonic() - t0
    resets, launches, parts = [], [], {"swap": [], "setup": [], "settle": []}
    for i in range(resets_n):
        if swap:  # an episode of one step and an agent that thinks `think` s (a model call) before the reset
            env.upcoming_task = task  # the next task announced, as coda eval's runner announces it
            env.step("WAIT")
            time.sleep(think)
        t = time.monotonic()
        env.reset(seed=i, options={"task": task})
        resets.append(time.monotonic() - t)
        launches.append(env.timings["launch"])
        for k in parts:
            parts[k].append(env.timings.get(k, 0.0))

    rng = random.Random(0)
    steps, settles = [], []
    for _ in range(steps_n):  # clicks in the middle of the window (KAlgebra: the console's output area)
        x, y = rng.randint(300, 1000), rng.randint(300, 600)
        t = time.monotonic()
        env.step(f"pyautogui.click({x}, {y})")
        steps.append(time.monotonic() - t)
        settles.append(env.timings["settle"])

    shots = []
    for _ in range(200):
        t = time.perf_counter()
        env.desktop.screenshot()
        shots.append(time.perf_counter() - t)
    rss, pss, by = memory_mb(env.desktop.token)
    env.close()

    ms = 1000.0
    print(
        f"{env_id} (task {task}) on the local backend, {'sealed' if sandbox else 'UNSEALED (sandbox=False)'}, "
        f"{f'swap resets (the agent thinks {think:g} s before each reset), ' if swap else ''}"
        f"{env.width}x{env.height}, {os.cpu_count()} CPUs"
    )
    print(f"  first reset (desktop start + launch): {first:.2f} s")
    print(
        f"  reset   p50 {pct(resets, 50):.3f} s   p95 {pct(resets, 95):.3f} s   (launch p50 {statistics.median(launches):.3f} s, n={len(resets)})"
    )
    if swap:
        print(
            "          of which p50: "
            + ", ".join(f"{k} {statistics.median(v):.3f} s" for k, v in parts.items())
            + " (swap: waiting for the spare's preparation; setup: the task's operations left to apply)"
        )
    print(
        f"  step    p50 {pct(steps, 50) * ms:.0f} ms   p95 {pct(steps, 95) * ms:.0f} ms   (settle p50 {statistics.median(settles) * ms:.0f} ms, n={len(steps)})"
    )
    print(f"  screenshot p50 {pct(shots, 50) * ms:.2f} ms   p95 {pct(shots, 95) * ms:.2f} ms")
    print(f"  memory per env: RSS {rss:.0f} MB (sum over processes), PSS {pss:.0f} MB")
    print("    " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(by.items(), key=lambda kv: -kv[1])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", nargs="*", default=None, help="env ids (default: every env that can run here)")
    ap.add_argument("--resets", type=int, default=20)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--task", default="calc_power", help="the reset task, where the env has it")
    ap.add_argument(
        "--sandbox",
        choices=("on", "off", "both"),
        default="on",
        help="apps sealed (on), unsealed (off), or each in turn (both: the sandbox's cost)",
    )
    ap.add_argument(
        "--swap",
        choices=("on", "off", "both"),
        default="off",
        help="swap resets (swap_reset=True: each reset follows a one-step episode and --think seconds)",
    )
    ap.add_argument("--think", type=float, default=1.0, help="the agent's time before each swap reset (s)")
    args = ap.parse_args()
    ids = args.env or [s.env_id for s in APPS.values() if s.available() is None]
    modes = {"on": [True], "off": [False], "both": [False, True]}
    for env_id in ids:
        for sealed in modes[args.sandbox]:
            for swap in modes[args.swap]:
                bench(env_id, args.resets, args.steps, args.task, sealed, swap, args.think)


if __name__ == "__main__":
    main()
