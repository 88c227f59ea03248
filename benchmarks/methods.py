"""Every training method of `coda_agent.train.METHODS` on one KAlgebra task family with one budget of env steps:
live success per round (a `coda eval` run of each round's planner), one table printed and one PNG plot.

Which methods run is read from METHODS, by the settings their configs have, so a method that lands later
(Co-EPG, PRO-CUA) joins without an edit here:
  episodic   a config with `iterations` and `group_size` (grpo, bepa): its own loop over the env; a round is
             `budget // (group_size x tasks x steps)` more iterations, resumed from the run's checkpoint
  loop       a config with `rounds` and `episodes` (coda's stage 1 and its step-level kin): the method's own
             collect -> train loop for --rounds rounds with `budget // (tasks x steps)` live episodes per task
             per round; each round's planner is read from its records
  skipped    anything else (sft: stage 2 learns from run folders, not from an env), with the reason
A method the issues name that METHODS lacks is reported as missing.

Every round's planner is evaluated the same way: `coda eval` (coda_agent.eval.run_eval) of --eval-episodes
episodes per task, at temperature 1, the same seed. Round -1 is the starting planner, shared by all methods.

Without --planner it builds tiny random Qwen2.5-VL models (coda_agent.tiny) and, unless --no-warmup, teaches
the planner the answer format with WRONG answers only (SFT): the case BEPA is for, where plain GRPO's groups
all fail. So the figures show the methods' mechanics on CPU in a few minutes, not what real models reach.
The default family is KAlgebra's answer tasks whose oracle fits 2 steps (BEPA's experts are the oracles).
Usage: python benchmarks/methods.py [--out DIR] [--rounds 2] [--budget 16] [--methods grpo bepa coda]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coda_agent.train import METHODS

EXPECTED = ["grpo", "bepa", "coda", "co-epg", "pro-cua"]  # the RL methods the project's issues name
FAMILY = ["calc_ans_multiply", "plot_count_zeros_ans"]
WRONG = {"calc_ans_multiply": ["392", "390", "401"], "plot_count_zeros_ans": ["2", "4", "1"]}


def kind(method) -> tuple[str | None, str]:
    names = {f.name for f in dataclasses.fields(method.config)}
    if {"iterations", "group_size", "env"} <= names:
        return "episodic", ""
    if {"rounds", "episodes", "env"} <= names:
        return "loop", ""
    return None, "no env to run live (neither iterations+group_size nor rounds+episodes in its config)"


def make_config(method, values: dict):
    """The method's config from `values`, taking only the settings its config has."""
    names = {f.name for f in dataclasses.fields(method.config)}
    return method.config(**{k: v for k, v in values.items() if k in names})


def live_success(a, planner: str, executor: str, out: Path) -> tuple[float, int]:
    """A `coda eval` run of `planner` with the executor: (success rate, env steps)."""
    from coda_agent.eval import run_eval
    from coda_agent.models import SamplingParams
    from coda_agent.policy import make_agent

    agent = make_agent(
        "coda",
        "kalgebra",
        planner=planner,
        executor=executor,
        seed=a.seed,
        planner_params=SamplingParams(max_new_tokens=a.max_new_tokens, temperature=1.0),
        executor_params=SamplingParams(max_new_tokens=8, temperature=1.0),
        executor_tries=1,
    )
    summary = run_eval(
        "coda/KAlgebra-v0",
        agent,
        out,
        task_ids=a.tasks,
        episodes=a.eval_episodes,
        num_envs=a.num_envs,
        seed=a.seed,
        env_kwargs={"max_steps": a.steps},
        progress=False,
        config={"planner": planner, "executor": executor},
    )
    return float(summary["overall"]["rate"]), int(round(summary["mean_steps"] * summary["overall"]["n"]))


def warm_planner(a, tiny: Path, out: Path) -> Path:
    """The tiny planner taught the answer format with wrong answers only (SFT on the real first screens)."""
    import gymnasium as gym

    from coda_agent.models import TransformersVLM
    from coda_agent.planner import Planner
    from coda_agent.train.sft import Example, SFTConfig, finetune
    from coda_agent.types import Sample

    if (out / "planner" / "config.json").exists():
        return out / "planner"
    warm = []
    env = gym.make("coda/KAlgebra-v0")
    try:
        for task in a.tasks:
            obs, _ = env.reset(seed=0, options={"task": task})
            conv = Planner(None, "kalgebra").conversation(obs["instruction"], [], obs["screenshot"])
            for ans in WRONG.get(task, ["0", "1", "2"]):
                warm.append(
                    Example(
                        task, "kalgebra", 1, Sample("planner", conv, []), f"Thought: compute it.\nAction: ANS {ans}"
                    )
                )
    finally:
        env.close()
    cfg = SFTConfig(out=str(out), epochs=50, lr=5e-3, micro_batch=len(warm), lora_r=0, resume=False)
    finetune(cfg, TransformersVLM(tiny), warm, progress=False)
    return out / "planner"


def episode_steps(run: Path, lo: int, hi: int, first: bool) -> int:
    """Env steps an episodic run spent in iterations lo..hi-1 (its rollouts' episodes.jsonl), plus, in the first
    round, those of any episodes it ran before iterating (BEPA's LEVEL-1 re-rolls in level1/)."""
    paths = [run / "rollouts" / f"iter_{i:04d}" / "episodes.jsonl" for i in range(lo, hi)]
    if first:
        paths += [p.parent for p in run.glob("*/episodes.jsonl") if p.parent.name != "rollouts"]
        paths = [p if p.name == "episodes.jsonl" else p / "episodes.jsonl" for p in paths]
    total = 0
    for p in paths:
        if p.exists():
            total += sum(json.loads(x).get("steps", 0) for x in p.read_text().splitlines() if x.strip())
    return total


def run_episodic(a, name, method, start: str, executor: str, out: Path) -> list[dict]:
    per_iter = a.group_size * len(a.tasks) * a.steps  # an upper bound of an iteration's env steps
    k = max(1, a.budget // per_iter)
    rows = []
    for r in range(a.rounds):
        cfg = make_config(
            method,
            dict(
                env="coda/KAlgebra-v0",
                tasks=a.tasks,
                planner=start,
                executor=executor,
                out=str(out / "train"),
                iterations=(r + 1) * k,
                tasks_per_iteration=len(a.tasks),
                group_size=a.group_size,
                num_envs=a.num_envs,
                max_steps=a.steps,
                max_new_tokens=a.max_new_tokens,
                executor_max_new_tokens=8,
                executor_tries=1,
                lr=a.lr,
                lora_r=8,
                lora_alpha=16,
                kl_coef=0.01,
                micro_batch=10,
                epochs=4,
                seed=a.seed,
                resume=True,
            ),
        )
        t0 = time.monotonic()
        method.run(cfg, False)
        train_s = time.monotonic() - t0
        steps = episode_steps(out / "train", r * k, (r + 1) * k, first=r == 0)
        role = "policy" if getattr(cfg, "agent", "coda") == "uitars" else "planner"
        rate, _ = live_success(a, str(out / "train" / role), executor, out / f"eval_{r:02d}")
        rows.append({"round": r, "success": rate, "train_env_steps": steps, "train_s": round(train_s, 1)})
        print(f"  {name} round {r}: live success {rate:.2f}, {steps} env steps in training, {train_s:.0f} s")
    return rows


def run_loop(a, name, method, start: str, executor: str, out: Path) -> list[dict]:
    episodes = max(1, a.budget // (len(a.tasks) * a.steps))
    cfg = make_config(
        method,
        dict(
            env="coda/KAlgebra-v0",
            tasks=a.tasks,
            planner=start,
            executor=executor,
            grounder=executor,  # Co-EPG's own grounding model: the same tiny UI-TARS-style model
            out=str(out / "train"),
            rounds=a.rounds,
            episodes=episodes,
            episode_steps=a.steps,
            num_envs=a.num_envs,
            group_size=a.group_size,
            states_per_step=2,
            micro_batch=2 * a.group_size,
            max_steps=a.loop_steps,
            max_new_tokens=a.max_new_tokens,
            executor_max_new_tokens=8,
            executor_tries=1,
            lr=a.lr,
            lora_r=8,
            lora_alpha=16,
            seed=a.seed,
            save_steps=10_000,
        ),
    )
    t0 = time.monotonic()
    hist = [h for h in method.run(cfg, False) if h.get("round", -1) >= 0]
    train_s = (time.monotonic() - t0) / max(1, len(hist))
    rows = []
    for h in hist:
        r = h["round"]
        rd = out / "train" / f"round_{r:02d}"  # the round's live run: `eval` (coda, co-epg), `collect` (pro-cua)
        live = next((rd / d / "episodes.jsonl" for d in ("eval", "collect") if (rd / d / "episodes.jsonl").exists()))
        steps = sum(json.loads(x).get("steps", 0) for x in live.read_text().splitlines() if x.strip())
        rate, _ = live_success(a, h["planner"], executor, out / f"eval_{r:02d}")
        rows.append({"round": r, "success": rate, "train_env_steps": steps, "train_s": round(train_s, 1)})
        print(f"  {name} round {r}: live success {rate:.2f}, {steps} live env steps collected, ~{train_s:.0f} s")
    return rows


def plot(results: dict, start: float, path: Path) -> str:
    """success per round, one line per method: matplotlib when installed, else drawn with Pillow."""
    series = {m: [start] + [r["success"] for r in rows] for m, rows in results.items() if rows}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        for m, ys in series.items():
            ax.plot(range(-1, len(ys) - 1), ys, marker="o", label=m)
        ax.set_xlabel("round (-1: the starting planner)")
        ax.set_ylabel("live success")
        ax.set_ylim(-0.05, 1.05)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        return "matplotlib"
    except ImportError:
        pass
    from PIL import Image, ImageDraw

    w, h, m = 640, 360, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    n = max(len(v) for v in series.values()) if series else 1
    colors = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]

    def xy(i, y):
        return m + i * (w - 2 * m) / max(1, n - 1), h - m - y * (h - 2 * m)

    d.line([xy(0, 0), xy(n - 1, 0)], fill="black")
    d.line([xy(0, 0), xy(0, 1)], fill="black")
    for y in (0.0, 0.5, 1.0):
        d.text((5, xy(0, y)[1] - 6), f"{y:.1f}", fill="black")
    for i in range(n):
        d.text((xy(i, 0)[0] - 4, h - m + 6), str(i - 1), fill="black")
    d.text((w // 2 - 120, h - 18), "round (-1: the starting planner)", fill="black")
    d.text((5, 5), "live success per round", fill="black")
    for k, (name, ys) in enumerate(series.items()):
        c = colors[k % len(colors)]
        pts = [xy(i, y) for i, y in enumerate(ys)]
        if len(pts) > 1:
            d.line(pts, fill=c, width=2)
        for p in pts:
            d.ellipse([p[0] - 3, p[1] - 3, p[0] + 3, p[1] + 3], fill=c)
        d.text((w - m - 90, m + 14 * k), name, fill=c)
    img.save(path)
    return "Pillow (matplotlib is not installed)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/bench-methods"), help="folder of the runs, table and plot")
    p.add_argument("--methods", nargs="*", help="methods to run (default: every RL method in METHODS)")
    p.add_argument("--tasks", nargs="*", default=FAMILY, help="the KAlgebra task family")
    p.add_argument("--rounds", type=int, default=2, help="rounds per method")
    p.add_argument("--budget", type=int, default=16, help="env steps of training data per round")
    p.add_argument("--steps", type=int, default=2, help="step budget per episode")
    p.add_argument("--group-size", type=int, default=4, help="G of every method")
    p.add_argument("--loop-steps", type=int, default=4, help="optimizer steps per round of a loop method")
    p.add_argument("--eval-episodes", type=int, default=4, help="live eval episodes per task per round")
    p.add_argument("--num-envs", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--planner", help="starting planner checkpoint (default: a tiny one, warmed up)")
    p.add_argument("--executor", help="executor checkpoint (default: a tiny one)")
    p.add_argument("--no-warmup", action="store_true", help="start from the tiny random planner as it is")
    a = p.parse_args(argv)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    wanted = a.methods or list(METHODS)
    runnable, skipped = {}, {}
    for name in wanted:
        if name not in METHODS:
            skipped[name] = "not in coda_agent.train.METHODS"
            continue
        k, why = kind(METHODS[name])
        (runnable.__setitem__(name, k) if k else skipped.__setitem__(name, why))
    missing = [m for m in EXPECTED if m not in METHODS]

    from coda_agent.tiny import build_tiny_qwen2_5_vl

    models = out / "models"
    executor = a.executor or str(
        models / "executor"
        if (models / "executor" / "config.json").exists()
        else build_tiny_qwen2_5_vl(models / "executor", seed=5)
    )
    if a.planner:
        start = a.planner
    else:
        tiny = models / "tiny" if (models / "tiny" / "config.json").exists() else build_tiny_qwen2_5_vl(models / "tiny")
        start = str(tiny if a.no_warmup else warm_planner(a, tiny, models / "warm"))
    print(f"tasks {a.tasks}; budget {a.budget} env steps per round; {a.rounds} rounds; planner {start}")
    before, _ = live_success(a, start, executor, out / "eval_start")
    print(f"starting planner: live success {before:.2f}")

    results: dict[str, list[dict]] = {}
    for name, k in runnable.items():
        print(f"{name} ({k})")
        run = run_episodic if k == "episodic" else run_loop
        results[name] = run(a, name, METHODS[name], start, executor, out / name)

    head = f"{'method':<10}{'kind':<10}" + "".join(f"{f'r{r}':>7}" for r in range(-1, a.rounds)) + f"{'env steps':>11}"
    lines = [head]
    for name, rows in results.items():
        cells = [before] + [r["success"] for r in rows]
        steps = sum(r["train_env_steps"] for r in rows)
        lines.append(f"{name:<10}{runnable[name]:<10}" + "".join(f"{c:>7.2f}" for c in cells) + f"{steps:>11}")
    table = "\n".join(lines)
    how = plot(results, before, out / "methods.png")
    notes = [f"skipped {m}: {why}" for m, why in skipped.items()]
    notes += [f"missing (not in METHODS yet): {', '.join(missing)}"] if missing else []
    print("\n" + table + "\n" + "\n".join(notes))
    print(f"plot: {out / 'methods.png'} ({how}); results: {out / 'results.json'}")
    (out / "results.json").write_text(
        json.dumps(
            {
                "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                "start_success": before,
                "results": results,
                "skipped": skipped,
                "missing": missing,
                "table": table,
            },
            indent=1,
        )
    )
    return 0 if math.isfinite(before) else 1


if __name__ == "__main__":
    raise SystemExit(main())
