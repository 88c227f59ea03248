"""Latency of one coda/TeXstudio-v0 env on the local backend: reset, step, a11y_text, state, the compile check.

Usage: python benchmarks/texstudio_latency.py [--resets 10] [--steps 30] [--task insert_itemize]
Steps alternate a cursor key, typing a word and a click in the editor (each: the action, waiting for the
screen to settle, the screenshot). Prints p50/p95 in milliseconds and the machine's load average, since
on a shared machine the figures move with it.
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import numpy as np

import coda_env  # noqa: F401  (registers the envs)

STEPS = [
    "pyautogui.press('down')",
    "pyautogui.write('word ')",
    "pyautogui.click(700, 300)",
    "pyautogui.press('end')",
    "pyautogui.hotkey('ctrl', 'home')",
]


def pct(xs: list[float], q: float) -> float:
    return 1000 * float(np.percentile(np.asarray(xs), q))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resets", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--task", default="insert_itemize")
    args = ap.parse_args()
    env = gym.make("coda/TeXstudio-v0", task=args.task, max_steps=10_000)
    try:
        env.reset(seed=0)  # the first reset also starts the desktop
        resets, launches = [], []
        for _ in range(args.resets):
            t0 = time.monotonic()
            env.reset()
            resets.append(time.monotonic() - t0)
            launches.append(env.unwrapped.timings["launch"])
        steps, settles = [], []
        for i in range(args.steps):
            t0 = time.monotonic()
            env.step(STEPS[i % len(STEPS)])
            steps.append(time.monotonic() - t0)
            settles.append(env.unwrapped.timings["settle"])
        app, desk = env.unwrapped.app, env.unwrapped.desktop
        a11y, states = [], []
        for _ in range(10):
            t0 = time.monotonic()
            text = app.a11y_text(desk)
            a11y.append(time.monotonic() - t0)
        for _ in range(5):
            t0 = time.monotonic()
            app.state(desk)
            states.append(time.monotonic() - t0)
        t0 = time.monotonic()
        obs, r, term, trunc, info = env.step("DONE")
        evaluate = time.monotonic() - t0
    finally:
        env.close()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(
        f"reset  p50 {pct(resets, 50):7.0f} ms  p95 {pct(resets, 95):7.0f} ms  (launch+ready p50 {pct(launches, 50):.0f} ms)"
    )
    print(f"step   p50 {pct(steps, 50):7.0f} ms  p95 {pct(steps, 95):7.0f} ms  (settle p50 {pct(settles, 50):.0f} ms)")
    print(
        f"a11y_text p50 {pct(a11y, 50):4.0f} ms  min {1000 * min(a11y):.0f} ms  ({len(text.splitlines())} lines, "
        f"{len(text)} chars)"
    )
    print(f"state  p50 {pct(states, 50):7.0f} ms")
    print(f"evaluate (state + checks, incl. the compile check) {1000 * evaluate:.0f} ms; reward {r}")


if __name__ == "__main__":
    main()
