"""Reset and step latency of a coda env over OpenEnv's WebSocket (`coda serve`) against the same env in-process.

Each round replays one task's oracle (reset, its steps, DONE) in-process (`gym.make`) and then through
`coda serve` on localhost with OpenEnv's own client (GenericEnvClient, sync), alternating so that the load of
a shared machine falls on both alike. What the socket adds: the screenshot's PNG encoding (base64, in JSON),
the message round trip and the client's decoding of the JSON (not of the PNG).
Usage: python benchmarks/openenv_latency.py [--env coda/KAlgebra-v0] [--task calc_define_function] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gymnasium as gym

import coda_env  # noqa: F401


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _episode(reset, step, actions) -> tuple[float, list[float], float]:
    t = time.perf_counter()
    reset()
    t_reset = time.perf_counter() - t
    steps, reward = [], None
    for a in actions:
        t = time.perf_counter()
        reward, done = step(a)
        steps.append(time.perf_counter() - t)
        if done:
            break
    return t_reset, steps, reward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", default="coda/KAlgebra-v0")
    ap.add_argument("--task", default="calc_define_function")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    from openenv.core import GenericEnvClient

    from coda_env.openenv import encode_png

    env = gym.make(a.env)
    task = env.unwrapped.tasks[a.task]
    actions = [*task.solution, "DONE"]
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "coda_agent.cli", "serve", a.env, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not _healthy(port):
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("coda serve did not come up")
        time.sleep(0.05)
    client = GenericEnvClient(base_url=f"http://127.0.0.1:{port}", message_timeout_s=120).sync()
    client.connect()
    res: dict[str, dict[str, list]] = {k: {"reset": [], "step": [], "reward": []} for k in ("in-process", "openenv")}
    png = []

    def local_step(x):
        obs, r, term, trunc, _ = env.step(x)
        return r, term or trunc

    def remote_step(x):
        r = client.step({"action": x})
        return r.reward, r.done

    try:
        for i in range(a.rounds + 1):  # the first round warms both up and is not counted
            for name, reset, step in (
                ("in-process", lambda: env.reset(options={"task": a.task}), local_step),
                ("openenv", lambda: client.reset(task=a.task), remote_step),
            ):
                t_reset, steps, reward = _episode(reset, step, actions)
                if i:
                    res[name]["reset"].append(t_reset)
                    res[name]["step"] += steps
                    res[name]["reward"].append(reward)
            if i:
                frame = env.unwrapped.render() if env.unwrapped.render_mode else env.unwrapped._obs["screenshot"]
                t = time.perf_counter()
                size = len(encode_png(frame))
                png.append((time.perf_counter() - t, size))
    finally:
        client.close()
        env.close()
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
    print(f"{a.env} task={a.task} rounds={a.rounds} steps/episode={len(res['openenv']['step']) // a.rounds}")
    print(f"{'':<12}{'reset p50':>10}{'step p50':>10}{'step p90':>10}{'rewards':>10}")
    for name, r in res.items():
        q = statistics.quantiles(r["step"], n=10)
        print(
            f"{name:<12}{statistics.median(r['reset']) * 1000:>8.0f}ms{statistics.median(r['step']) * 1000:>8.0f}ms"
            f"{q[8] * 1000:>8.0f}ms{sum(r['reward']):>7.0f}/{len(r['reward'])}"
        )
    enc = statistics.median(t for t, _ in png)
    print(
        f"PNG encoding of one screen: {enc * 1000:.0f} ms, {statistics.median(s for _, s in png) / 1024:.0f} KiB base64"
    )


if __name__ == "__main__":
    main()
