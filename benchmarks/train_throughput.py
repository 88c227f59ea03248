"""Training throughput of both stage-1 methods on this machine.

`grpo` (episodic, the own loop): env steps/s and planner tokens/s during rollouts, and trained tokens/s, with N
envs. `coda` (step-level, TRL's GRPOTrainer over a state dataset): states/s and generated tokens/s of whole
optimizer steps (generation, the executor's reward, the reference and policy passes, the update), for a few
group sizes.

Without --planner it builds tiny random Qwen2.5-VL models (coda_agent.tiny) for the planner (and the grpo
executor), so the figures measure the machinery (envs, batched generation, scoring, the update), not a real
model. `coda` trains on --states (a state dataset, e.g. `coda data states oracle --out DIR`); without it, on the
oracle states of --tasks, built here first (their time is printed too). With real checkpoints on a GPU:
--planner DIR --executor DIR|URL --device cuda.
Usage: python benchmarks/train_throughput.py [--method grpo coda] [--num-envs 1 2 4] [--coda-group-size 4 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from coda_agent.models import TransformersVLM
from coda_agent.tiny import build_tiny_qwen2_5_vl


def bench_grpo(a, tmp: Path, planner_dir, executor_dir) -> None:
    from coda_agent.train.grpo import GRPOConfig, train

    print(
        f"grpo: planner={planner_dir} executor={executor_dir} tasks={a.tasks} G={a.group_size} "
        f"max_steps={a.max_steps} new_tokens<={a.max_new_tokens}"
    )
    print(f"{'envs':>4} {'env steps/s':>12} {'planner tok/s':>14} {'train tok/s':>12} {'rollout s':>10} {'train s':>8}")
    for n in a.num_envs:
        cfg = GRPOConfig(
            env="coda/KAlgebra-v0",
            tasks=a.tasks,
            out=str(tmp / f"run{n}"),
            iterations=a.iterations,
            tasks_per_iteration=len(a.tasks),
            group_size=a.group_size,
            num_envs=n,
            max_steps=a.max_steps,
            max_new_tokens=a.max_new_tokens,
            executor_max_new_tokens=16,
            lr=1e-4,
            lora_r=8,
            device=a.device,
            save_every=10_000,
            executor=str(executor_dir),
            resume=False,
        )
        remote = str(executor_dir).startswith("http")
        executor = None if remote else TransformersVLM(executor_dir, device=a.device)
        hist = train(cfg, TransformersVLM(planner_dir, device=a.device), executor, progress=False)
        med = {
            k: statistics.median(h[k] for h in hist)
            for k in ("env_steps_per_s", "planner_tokens_per_s", "train_tokens_per_s", "rollout_s", "train_s")
        }
        print(
            f"{n:>4} {med['env_steps_per_s']:>12.2f} {med['planner_tokens_per_s']:>14.1f} "
            f"{med['train_tokens_per_s']:>12.1f} {med['rollout_s']:>10.1f} {med['train_s']:>8.1f}"
        )


def bench_coda(a, tmp: Path, planner_dir) -> None:
    from coda_agent import states
    from coda_agent.train.coda import CodaConfig, train_once

    data = a.states
    if not data:
        t0 = time.monotonic()
        path = tmp / "oracle-states"
        ds = states.build(states.oracle_states("coda/KAlgebra-v0", a.tasks), path)
        print(f"coda: {len(ds)} oracle states of {a.tasks} built in {time.monotonic() - t0:.1f} s")
        data = [str(path)]
    print(
        f"coda: planner={planner_dir} executor={a.coda_executor} states={data} "
        f"states/step={a.states_per_step} new_tokens<={a.max_new_tokens} steps={a.coda_steps} (first dropped)"
    )
    print(f"{'G':>4} {'states/s':>9} {'gen tok/s':>10} {'s/step':>7} {'completions/step':>17}")
    for g in a.coda_group_size:
        cfg = CodaConfig(
            planner=str(planner_dir),
            data=list(data),
            out=str(tmp / f"coda{g}"),
            executor=a.coda_executor,
            group_size=g,
            states_per_step=a.states_per_step,
            micro_batch=min(16, g * a.states_per_step),
            max_steps=a.coda_steps,
            max_new_tokens=a.max_new_tokens,
            lr=1e-4,
            lora_r=8,
            device=a.device,
            resume=False,
            save_steps=10**6,
        )
        train_once(cfg, progress=False)
        lines = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
        steps = [x for x in lines if "step_time" in x][1:] or [x for x in lines if "step_time" in x]
        per = g * a.states_per_step
        sec = statistics.median(x["step_time"] for x in steps)
        tok = statistics.median(x["completions/mean_length"] * per / x["step_time"] for x in steps)
        print(f"{g:>4} {a.states_per_step / sec:>9.3f} {tok:>10.1f} {sec:>7.2f} {per:>17}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--method", nargs="+", choices=("grpo", "coda"), default=["grpo", "coda"], help="which methods")
    ap.add_argument("--planner", help="planner checkpoint (default: a tiny random one)")
    ap.add_argument("--executor", help="grpo's executor checkpoint or URL (default: a tiny random one)")
    ap.add_argument("--device", help="torch device (default: cuda when available)")
    ap.add_argument("--num-envs", type=int, nargs="+", default=[1, 2, 4], help="grpo: envs")
    ap.add_argument("--iterations", type=int, default=2, help="grpo: iterations")
    ap.add_argument("--group-size", type=int, default=4, help="grpo: episodes per task")
    ap.add_argument("--tasks", nargs="+", default=["calc_power", "calc_ans_multiply"], help="tasks")
    ap.add_argument("--max-steps", type=int, default=3, help="grpo: step budget per episode")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="tokens per planner answer")
    ap.add_argument("--states", nargs="*", default=[], help="coda: state datasets (default: oracle states of --tasks)")
    ap.add_argument("--coda-executor", default="a11y", help="coda: the fixed executor (a11y, DIR or URL)")
    ap.add_argument("--coda-group-size", type=int, nargs="+", default=[4, 8], help="coda: plans per state (G)")
    ap.add_argument("--states-per-step", type=int, default=4, help="coda: states per optimizer step")
    ap.add_argument("--coda-steps", type=int, default=4, help="coda: optimizer steps (the median of all but the first)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="coda-bench-") as folder:  # tiny models and runs: removed after
        tmp = Path(folder)
        planner_dir = a.planner or build_tiny_qwen2_5_vl(tmp / "planner")
        if "grpo" in a.method:
            executor_dir = a.executor or build_tiny_qwen2_5_vl(tmp / "executor", seed=1)
            bench_grpo(a, tmp, planner_dir, executor_dir)
        if "coda" in a.method:
            bench_coda(a, tmp, planner_dir)


if __name__ == "__main__":
    main()
