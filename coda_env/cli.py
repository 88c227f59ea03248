"""The `coda` command: `coda envs`, `coda tasks APP`, `coda eval ...`.

`coda eval` runs an agent over a task suite and writes the trajectory as it happens: one JSONL record and one
PNG per step under `--out`, so a crash loses at most the step in flight.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import gymnasium as gym
import numpy as np


class OracleAgent:
    """Replays the task's `solution`."""
    name = "oracle"

    def reset(self, task) -> None:
        self._plan = list(task.solution) or ["DONE"]

    def act(self, obs) -> str:
        return self._plan.pop(0) if self._plan else "DONE"


class DoneAgent:
    """Answers DONE at once: the floor every task's checks must reject."""
    name = "done"

    def reset(self, task) -> None:
        pass

    def act(self, obs) -> str:
        return "DONE"


class RandomAgent:
    """Random valid clicks, keys and text; DONE with small probability."""
    name = "random"

    def __init__(self, seed: int = 0, screen=(1280, 800)):
        self.rng, self.screen = random.Random(seed), screen

    def reset(self, task) -> None:
        pass

    def act(self, obs) -> str:
        r, (w, h) = self.rng.random(), self.screen
        if r < 0.05:
            return "DONE"
        if r < 0.6:
            return f"pyautogui.click({self.rng.randrange(w)}, {self.rng.randrange(h)})"
        if r < 0.8:
            return f"pyautogui.press('{self.rng.choice(['enter', 'tab', 'esc', 'backspace', 'down'])}')"
        return f"pyautogui.write('{self.rng.choice(['x', '2+2', 'sin(x)', 'a:=1'])}')"


AGENTS = {"oracle": OracleAgent, "done": DoneAgent, "random": RandomAgent}


def _save_png(frame: np.ndarray, path: Path) -> None:
    from PIL import Image
    Image.fromarray(frame).save(path, compress_level=1)


def run_eval(env_id: str, agent_name: str, out: Path, task_ids: list[str] | None = None,
             episodes: int = 1, seed: int = 0, quiet: bool = False) -> dict:
    """Run the agent on every task `episodes` times; resume what `out` already holds."""
    out.mkdir(parents=True, exist_ok=True)
    done_path = out / "episodes.jsonl"
    finished = {}
    if done_path.exists():
        for line in done_path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                finished[(rec["task"], rec["episode"])] = rec
    env = gym.make(env_id)
    base = env.unwrapped
    ids = task_ids or list(base.tasks)
    agent = AGENTS[agent_name]() if agent_name != "random" else RandomAgent(seed, (base.width, base.height))
    t_start = time.monotonic()
    try:
        for task_id in ids:
            task = base.tasks[task_id]
            for ep in range(episodes):
                if (task_id, ep) in finished:
                    continue
                ep_dir = out / "trajectories" / f"{task_id}__{ep}"
                ep_dir.mkdir(parents=True, exist_ok=True)
                obs, info = env.reset(seed=seed + ep, options={"task": task_id})
                agent.reset(task)
                _save_png(obs["screenshot"], ep_dir / "step_000.png")
                reward, steps, t_ep, last = 0.0, 0, time.monotonic(), {}
                with open(ep_dir / "steps.jsonl", "w") as log:
                    while True:
                        action = agent.act(obs)
                        obs, reward, term, trunc, last = env.step(action)
                        steps += 1
                        _save_png(obs["screenshot"], ep_dir / f"step_{steps:03d}.png")
                        log.write(json.dumps({"task": task_id, "episode": ep, "step": steps, "action": action,
                                              "action_error": last.get("action_error"), "reward": reward,
                                              "error": last.get("error"), "timings": last.get("timings")}) + "\n")
                        log.flush()
                        if term or trunc:
                            break
                rec = {"task": task_id, "episode": ep, "difficulty": task.difficulty, "category": task.category,
                       "success": bool(last.get("success")), "reward": reward, "steps": steps,
                       "seconds": round(time.monotonic() - t_ep, 3), "checks": last.get("checks"),
                       "error": last.get("error")}
                finished[(task_id, ep)] = rec
                with open(done_path, "a") as f:
                    f.write(json.dumps(rec) + "\n")
                if not quiet:
                    ok = sum(r["success"] for r in finished.values())
                    print(f"[{len(finished)}/{len(ids) * episodes}] {task_id}: {'PASS' if rec['success'] else 'fail'}"
                          f" in {steps} steps ({rec['seconds']:.1f}s); successes so far {ok}", flush=True)
    finally:
        env.close()
    records = [finished[(t, e)] for t in ids for e in range(episodes) if (t, e) in finished]
    summary = summarize(records)
    summary.update({"env": env_id, "agent": agent_name, "wall_seconds": round(time.monotonic() - t_start, 1)})
    (out / "results.json").write_text(json.dumps({"summary": summary, "episodes": records}, indent=1))
    return summary


def summarize(records: list[dict]) -> dict:
    def rate(rs):
        return {"n": len(rs), "success": sum(r["success"] for r in rs), "rate": round(
            sum(r["success"] for r in rs) / len(rs), 4) if rs else 0.0}
    by: dict[str, dict] = {"difficulty": defaultdict(list), "category": defaultdict(list)}
    for r in records:
        by["difficulty"][r["difficulty"]].append(r)
        by["category"][r["category"] or "-"].append(r)
    return {"overall": rate(records), "mean_steps": round(float(np.mean([r["steps"] for r in records])), 2)
            if records else 0.0,
            "by_difficulty": {k: rate(v) for k, v in sorted(by["difficulty"].items())},
            "by_category": {k: rate(v) for k, v in sorted(by["category"].items())}}


def print_table(summary: dict, out: Path) -> None:
    print(f"\n{summary['env']}  agent={summary['agent']}  wall={summary['wall_seconds']}s  "
          f"mean steps={summary['mean_steps']}")
    print(f"{'group':<22}{'tasks':>7}{'solved':>8}{'rate':>8}")
    for section in ("by_category", "by_difficulty"):
        for k, v in summary[section].items():
            print(f"{k:<22}{v['n']:>7}{v['success']:>8}{v['rate']:>8.0%}")
    o = summary["overall"]
    print(f"{'overall':<22}{o['n']:>7}{o['success']:>8}{o['rate']:>8.0%}")
    print(f"\ntrajectories: {out / 'trajectories'}\nresults:      {out / 'results.json'}")


def main(argv: list[str] | None = None) -> int:
    import coda_env
    p = argparse.ArgumentParser(prog="coda", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("envs", help="list the registered env ids")
    t = sub.add_parser("tasks", help="list an app's tasks")
    t.add_argument("app", nargs="?", default="kalgebra")
    e = sub.add_parser("eval", help="run an agent over a task suite")
    e.add_argument("--env", default="coda/KAlgebra-v0")
    e.add_argument("--agent", default="oracle", choices=sorted(AGENTS))
    e.add_argument("--tasks", nargs="*", default=None)
    e.add_argument("--episodes", type=int, default=1)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.cmd == "envs":
        for env_id, app in coda_env.ENVS.items():
            print(f"{env_id}\tapp={app}")
        return 0
    if args.cmd == "tasks":
        from .tasks import load_tasks
        for tid, task in load_tasks(args.app).items():
            print(f"{tid:<28}{task.category:<12}{task.difficulty:<8}{task.instruction[:70]}")
        return 0
    out = Path(args.out or f"runs/{args.agent}-{time.strftime('%Y%m%d-%H%M%S')}")
    summary = run_eval(args.env, args.agent, out, args.tasks, args.episodes, args.seed)
    print_table(summary, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
