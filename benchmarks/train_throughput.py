"""GRPO throughput: env steps/s and planner tokens/s during rollouts, and trained tokens/s, with N envs.

Without --planner it builds tiny random Qwen2.5-VL models (coda_agent.tiny) for the planner and the executor,
so the figures measure the loop (envs, batched generation, scoring, the update), not a real model. With real
checkpoints on a GPU: --planner DIR --executor DIR|URL --device cuda.
Usage: python benchmarks/train_throughput.py [--num-envs 1 2 4] [--iterations 2] [--group-size 4]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from coda_agent.train.grpo import GRPOConfig, train
from coda_agent.models import TransformersVLM
from coda_agent.tiny import build_tiny_qwen2_5_vl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--planner")
    ap.add_argument("--executor")
    ap.add_argument("--device")
    ap.add_argument("--num-envs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--tasks", nargs="+", default=["calc_power", "calc_ans_multiply"])
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="coda-bench-"))
    planner_dir = a.planner or build_tiny_qwen2_5_vl(tmp / "planner")
    executor_dir = a.executor or build_tiny_qwen2_5_vl(tmp / "executor", seed=1)
    print(f"planner={planner_dir} executor={executor_dir} tasks={a.tasks} G={a.group_size} "
          f"max_steps={a.max_steps} new_tokens<={a.max_new_tokens}")
    print(f"{'envs':>4} {'env steps/s':>12} {'planner tok/s':>14} {'train tok/s':>12} {'rollout s':>10} {'train s':>8}")
    for n in a.num_envs:
        cfg = GRPOConfig(env="coda/KAlgebra-v0", tasks=a.tasks, out=str(tmp / f"run{n}"), iterations=a.iterations,
                         tasks_per_iteration=len(a.tasks), group_size=a.group_size, num_envs=n,
                         max_steps=a.max_steps, max_new_tokens=a.max_new_tokens, executor_max_new_tokens=16,
                         lr=1e-4, lora_r=8, device=a.device, save_every=10_000, executor=str(executor_dir),
                         resume=False)
        remote = str(executor_dir).startswith("http")
        executor = None if remote else TransformersVLM(executor_dir, device=a.device)
        hist = train(cfg, TransformersVLM(planner_dir, device=a.device), executor, progress=False)
        med = {k: statistics.median(h[k] for h in hist)
               for k in ("env_steps_per_s", "planner_tokens_per_s", "train_tokens_per_s", "rollout_s", "train_s")}
        print(f"{n:>4} {med['env_steps_per_s']:>12.2f} {med['planner_tokens_per_s']:>14.1f} "
              f"{med['train_tokens_per_s']:>12.1f} {med['rollout_s']:>10.1f} {med['train_s']:>8.1f}")


if __name__ == "__main__":
    main()
