"""Every training method of `coda_agent.train.METHODS` on one KAlgebra task family with one budget of env steps
and one budget of generated tokens per round: live success and held-out reward per round, one table printed and
one PNG plot.

Which methods run is read from METHODS, by the settings their configs have, so a method that lands later
joins without an edit here:
  episodic   a config with `iterations` and `group_size` (grpo, bepa): its own loop over the env; a round is
             k more iterations, resumed from the run's checkpoint, k = the most that both budgets allow
             (--budget // (G x tasks x steps) env steps, --token-budget // (G x tasks x steps x
             --max-new-tokens) tokens), at least 1
  loop       a config with `rounds` and `episodes` (coda's stage 1 and its step-level kin co-epg, pro-cua): the
             method's own collect -> train loop for --rounds rounds with `budget // (tasks x steps)` live
             episodes per task per round and `max_steps` GRPO steps per round = the most that --token-budget
             leaves after its live runs (states-per-step x G x --max-new-tokens each; at most --loop-steps, at
             least 1); each round's planner is read from its records
  skipped    anything else (sft: stage 2 learns from run folders, not from an env), with the reason
A method the issues name that METHODS lacks is reported as missing.

The budgets. Env steps: those of the episodes each method ran to train (its live runs, its rollouts).
Generated tokens: what the trained planner sampled for training (EOS included): its live runs' answers (the
`tokens` of each planner call in the run folders), the GRPO completions (TRL's completion lengths, `generated_
tokens` of each round's summary), Co-EPG's regenerated SFT plans (`plan_tokens`). The caps above are upper
bounds (every answer at --max-new-tokens); what each method used is measured and reported. Not capped by the
flags, but counted: coda runs its starting planner live before round 0 (its successes feed round 0; counted in
round 0), Co-EPG regenerates plans for the grounding SFT (one per pooled planner per state), BEPA's
LEVEL-1 re-rolls. Held-out evaluations and the benchmark's own `coda eval` runs are not training, not counted.

Every round's planner is evaluated the same way:
  live success   `coda eval` (coda_agent.eval.run_eval) of --eval-episodes episodes per task, temperature 1,
                 the same seed; round -1 is the starting planner, shared by all methods
  held-out       states not trained on: the oracle states of --held-out tasks (default calc_fibonacci_ans, the
                 family's third answer task; its oracle's every step), OUT/held_out.
                 own: each step-level method's own reward on them (CODA's action reward, Co-EPG's C-DREM,
                 PRO-CUA's replay process score), the methods' own `eval_data` evaluation (`eval_reward_before`
                 of round 0 for round -1, `eval_reward_after` of round r: TRL's evaluate, --group-size plans per
                 state); "-" for the episodic methods (their reward is the episode's success).
                 action: the common yardstick for every method: CODA's action reward (coda.score_plans through
                 the fixed executor; type match + graded parameters, in [0, 2]) of --held-out-samples plans per
                 state sampled from the round's planner (temperature 1, one seed).

Without --planner it builds tiny random Qwen2.5-VL models (coda_agent.tiny) and, unless --no-warmup, teaches
the planner the answer format with WRONG answers only (SFT): the case BEPA is for, where plain GRPO's groups
all fail. So the figures show the methods' mechanics on CPU in 10-30 minutes, not what real models reach.
The default family is KAlgebra's answer tasks whose oracle fits 2 steps (BEPA's experts are the oracles).
Usage: python benchmarks/methods.py [--out DIR] [--rounds 2] [--budget 16] [--token-budget 1536]
       [--methods grpo bepa coda co-epg pro-cua] [--held-out calc_fibonacci_ans]
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
HELD_OUT = ["calc_fibonacci_ans"]  # the family's third answer task: its oracle states are never trained on
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


def run_files(run: Path, lo: int | None = None, hi: int | None = None, first: bool = True) -> list[Path]:
    """The episodes.jsonl files of a training run's live episodes: a run folder itself (`coda eval`'s layout), or
    an episodic run's rollouts of iterations lo..hi-1 plus, when `first`, those of any episodes it ran before
    iterating (BEPA's LEVEL-1 re-rolls in level1/)."""
    if lo is None:
        return [run / "episodes.jsonl"]
    paths = [run / "rollouts" / f"iter_{i:04d}" / "episodes.jsonl" for i in range(lo, hi)]
    if first:
        paths += [p for p in run.glob("*/episodes.jsonl") if p.parent.name != "rollouts"]
    return paths


def episode_steps(paths: list[Path]) -> int:
    """Env steps of the episodes in these episodes.jsonl files."""
    total = 0
    for p in paths:
        if p.exists():
            total += sum(json.loads(x).get("steps", 0) for x in p.read_text().splitlines() if x.strip())
    return total


def planner_tokens(paths: list[Path], tokenizer=None) -> int:
    """Tokens the trained model generated in the episodes of these episodes.jsonl files: every planner (or
    UI-TARS policy) call of every step (trajectories/*/steps.jsonl beside each file), its recorded `tokens`
    (the generation's token ids, EOS included); a call recorded without them (an endpoint that returns no ids)
    is re-tokenized with `tokenizer`, + 1 for its EOS."""
    total = 0
    for p in paths:
        for steps in sorted(p.parent.glob("trajectories/*/steps.jsonl")):
            for line in steps.read_text().splitlines():
                if not line.strip():
                    continue
                for call in json.loads(line).get("calls") or []:
                    if call.get("model") not in ("planner", "uitars"):
                        continue
                    if "tokens" in call:
                        total += int(call["tokens"])
                    elif tokenizer is not None:
                        total += len(tokenizer(call.get("output") or "", add_special_tokens=False).input_ids) + 1
                    else:
                        raise ValueError(f"{steps}: a planner call without its token count and no tokenizer")
    return total


def grpo_tokens(train: Path) -> int:
    """Tokens a step-level round's GRPO sampled: `generated_tokens` of its summary record (coda.run_trainer), 0
    when it wrote none."""
    m = train / "metrics.jsonl"
    if not m.exists():
        return 0
    found = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
    summaries = [x for x in found if x.get("summary")]
    return int(summaries[-1].get("generated_tokens", 0)) if summaries else 0


def loop_round_usage(train: Path, r: int, rec: dict, tokenizer=None) -> dict:
    """What round r of a loop method's run (`train`, its OUT) spent: env steps and generated tokens of its live
    runs (coda and co-epg: round_NN/eval, after training; pro-cua: round_NN/collect, before; coda's round 0
    also its starting planner's run, round_-1/eval), its GRPO's tokens, Co-EPG's regenerated plans'."""
    rd = train / f"round_{r:02d}"
    live = [rd / d / "episodes.jsonl" for d in ("eval", "collect")]
    if r == 0:
        live.append(train / "round_-1" / "eval" / "episodes.jsonl")
    live = [p for p in live if p.exists()]
    live_tokens = planner_tokens(live, tokenizer)
    gen = grpo_tokens(rd / "train")
    extra = int(rec.get("plan_tokens", 0))
    return {
        "train_env_steps": episode_steps(live),
        "tokens": live_tokens + gen + extra,
        "tokens_live": live_tokens,
        "tokens_grpo": gen,
        "tokens_other": extra,
    }


def held_out_rows(a, out: Path) -> list[dict]:
    """The held-out states (the oracle states of --held-out tasks, built once into OUT/held_out)."""
    from coda_agent import states
    from coda_agent.train.steplevel import load_states

    path = out / "held_out"
    if not (path / "dataset_info.json").exists():
        report: dict = {}
        records = list(states.oracle_states("coda/KAlgebra-v0", a.held_out, report=report))
        if not records:
            raise SystemExit(f"no held-out states from {a.held_out}: {report.get('left_out')}")
        states.build(records, path)
    return [dict(r) for r in load_states([path])[0]]


class ActionYardstick:
    """CODA's action reward of a planner's plans on the held-out states: the common yardstick of all methods.
    --held-out-samples plans per state (temperature 1, --seed), each turned into an action by the fixed
    executor and scored against the state's target (coda.score_plans); the mean."""

    def __init__(self, a, executor: str, rows: list[dict]):
        from coda_agent.models import SamplingParams
        from coda_agent.train.coda import CodaConfig, make_executor

        self.rows = [r for r in rows for _ in range(a.held_out_samples)]
        screen = tuple(rows[0]["screen"])
        cfg = CodaConfig(executor=executor, executor_tries=1, executor_max_new_tokens=8)
        self.executor = make_executor(cfg, "kalgebra", screen)
        self.params = SamplingParams(max_new_tokens=a.max_new_tokens, temperature=1.0, seed=a.seed)

    def __call__(self, planner: str) -> float:
        from coda_agent.models import TransformersVLM
        from coda_agent.states import planner_conversation
        from coda_agent.train.coda import score_plans

        vlm = TransformersVLM(planner)
        convs = [planner_conversation(r, history_images=2) for r in self.rows]
        texts = [g.text for g in vlm.generate(convs, self.params)]
        rewards, _ = score_plans(self.executor, self.rows, texts)
        return sum(rewards) / len(rewards)


def episodic_iterations(a) -> int:
    """Iterations per round of an episodic method: the most both budgets allow (upper bounds: every episode
    runs --steps steps, every answer --max-new-tokens tokens), at least 1."""
    per_iter = a.group_size * len(a.tasks) * a.steps
    return max(1, min(a.budget // per_iter, a.token_budget // (per_iter * a.max_new_tokens)))


def loop_grpo_steps(a, name: str, episodes: int) -> int:
    """GRPO steps per round of a loop method: what --token-budget leaves after its live runs of the round
    (coda: two in round 0, its starting planner's and its own), at --max-new-tokens per answer; at most
    --loop-steps, at least 1."""
    live = episodes * len(a.tasks) * a.steps * a.max_new_tokens * (2 if name == "coda" else 1)
    per_step = a.states_per_step * a.group_size * a.max_new_tokens
    return max(1, min(a.loop_steps, (a.token_budget - live) // per_step))


def run_episodic(a, name, method, start: str, executor: str, out: Path, yardstick, tokenizer) -> list[dict]:
    k = episodic_iterations(a)
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
                lora_r=a.lora_r,
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
        files = run_files(out / "train", r * k, (r + 1) * k, first=r == 0)
        steps, tokens = episode_steps(files), planner_tokens(files, tokenizer)
        role = "policy" if getattr(cfg, "agent", "coda") == "uitars" else "planner"
        planner = str(out / "train" / role)
        rate, _ = live_success(a, planner, executor, out / f"eval_{r:02d}")
        action = yardstick(planner)
        rows.append(
            {
                "round": r,
                "success": rate,
                "own_reward": None,
                "action_reward": action,
                "train_env_steps": steps,
                "tokens": tokens,
                "tokens_live": tokens,
                "iterations": k,
                "train_s": round(train_s, 1),
            }
        )
        print(
            f"  {name} round {r}: live success {rate:.2f}, held-out action reward {action:.3f}, {steps} env steps "
            f"and {tokens} tokens in training, {train_s:.0f} s"
        )
    return rows


def run_loop(a, name, method, start: str, executor: str, out: Path, yardstick, tokenizer) -> list[dict]:
    episodes = max(1, a.budget // (len(a.tasks) * a.steps))
    grpo_steps = loop_grpo_steps(a, name, episodes)
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
            states_per_step=a.states_per_step,
            micro_batch=a.states_per_step * a.group_size,
            max_steps=grpo_steps,
            max_new_tokens=a.max_new_tokens,
            executor_max_new_tokens=8,
            executor_tries=1,
            lr=a.lr,
            lora_r=a.lora_r,
            lora_alpha=16,
            seed=a.seed,
            save_steps=10_000,
            logging_steps=1,  # every generating step's record: the tokens are counted from them
            eval_data=[str(a.held_out_path)],  # the method's own reward on the held-out states, before and after
            eval_generations=a.group_size,
            sft_plans=1,  # Co-EPG: one regenerated plan per pooled planner per state
            # PRO-CUA: no trained PRM here, so its privileged ablation (the exact replay, reading the oracle),
            # and round 0 on the oracle's states as coda's and co-epg's
            scorer="replay",
            oracle_states=True,
        ),
    )
    t0 = time.monotonic()
    hist = [h for h in method.run(cfg, False) if h.get("round", -1) >= 0]
    train_s = (time.monotonic() - t0) / max(1, len(hist))
    rows = []
    for h in hist:
        r = h["round"]
        use = loop_round_usage(out / "train", r, h, tokenizer)
        rate, _ = live_success(a, h["planner"], executor, out / f"eval_{r:02d}")
        action = yardstick(h["planner"])
        rows.append(
            {
                "round": r,
                "success": rate,
                "own_reward": h.get("eval_reward_after"),
                "own_reward_before": h.get("eval_reward_before"),
                "action_reward": action,
                **use,
                "grpo_steps": h.get("steps"),
                "train_s": round(train_s, 1),
            }
        )
        own = h.get("eval_reward_after")
        print(
            f"  {name} round {r}: live success {rate:.2f}, held-out own reward "
            f"{own if own is None else round(own, 3)}, action reward {action:.3f}, {use['train_env_steps']} env "
            f"steps and {use['tokens']} tokens ({use['tokens_live']} live, {use['tokens_grpo']} GRPO, "
            f"{use['tokens_other']} other), ~{train_s:.0f} s"
        )
    return rows


OWN_REWARD = {"coda": "action", "co-epg": "C-DREM", "pro-cua": "process"}


def series(results: dict, start: dict, key: str) -> dict[str, list]:
    """Per method: [round -1, round 0, ...] of a figure (None where a method has none)."""
    out = {}
    for m, rows in results.items():
        if not rows:
            continue
        first = start.get(m, {}).get(key)
        out[m] = [first] + [r.get(key) for r in rows]
    return out


def make_table(results: dict, start: dict, kinds: dict, rounds: int, token_budget: int) -> str:
    """One table: per method live success, held-out own reward and held-out action reward per round (r-1 the
    starting planner), env steps and generated tokens in training (all rounds)."""
    rs = [f"r{r}" for r in range(-1, rounds)]
    w = 6

    def cells(vals):
        return "".join(f"{'-' if v is None else f'{v:.2f}':>{w}}" for v in vals)

    span = w * len(rs)
    lines = [
        f"{'':<19}{'live success':^{span}} |{'held-out own reward':^{span}} |{'held-out action reward':^{span}} |",
        f"{'method':<10}{'reward':<9}"
        + "".join(f"{x:>{w}}" for x in rs)
        + " |"
        + "".join(f"{x:>{w}}" for x in rs)
        + " |"
        + "".join(f"{x:>{w}}" for x in rs)
        + " |"
        + f"{'env steps':>10}{'tokens':>8}",
    ]
    succ, own, act = (series(results, start, k) for k in ("success", "own_reward", "action_reward"))
    for m, rows in results.items():
        if not rows:
            continue
        steps = sum(r["train_env_steps"] for r in rows)
        tokens = sum(r["tokens"] for r in rows)
        reward = OWN_REWARD.get(m, "-") if kinds[m] == "loop" else "-"
        lines.append(
            f"{m:<10}{reward:<9}" + cells(succ[m]) + " |" + cells(own[m]) + " |" + cells(act[m]) + " |"
            f"{steps:>10}{tokens:>8}"
        )
    lines.append(f"(token budget {token_budget} per round, {rounds * token_budget} in all)")
    return "\n".join(lines)


PANELS = [
    ("success", "live success (coda eval)", (0.0, 1.0)),
    ("own_reward", "held-out own reward\n(coda: action, co-epg: C-DREM, pro-cua: process)", (0.0, 2.0)),
    ("action_reward", "held-out action reward\n(CODA's, for every method)", (0.0, 2.0)),
]


def plot(results: dict, start: dict, usage: dict, path: Path) -> str:
    """Three panels, one line per method over the rounds: live success, held-out own reward, held-out action
    reward; the legend gives each method's env steps and tokens. matplotlib when installed, else Pillow."""
    label = {m: f"{m} ({u['env_steps']} steps, {u['tokens']} tok)" for m, u in usage.items()}
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(14, 4))
        for ax, (key, title, (lo, hi)) in zip(axes, PANELS):
            for m, ys in series(results, start, key).items():
                pts = [(i - 1, y) for i, y in enumerate(ys) if y is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=label[m])
            ax.set_title(title)
            ax.set_xlabel("round (-1: the starting planner)")
            ax.set_ylim(lo - 0.05 * hi, hi * 1.05)
        axes[0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        return "matplotlib"
    except ImportError:
        pass
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=13)
    pw, h, m = 420, 380, 45
    img = Image.new("RGB", (pw * 3, h + 70), "white")
    d = ImageDraw.Draw(img)
    colors = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]
    names = list(results)
    for p, (key, title, (lo, hi)) in enumerate(PANELS):
        ser = series(results, start, key)
        n = max((len(v) for v in ser.values()), default=1)
        x0 = p * pw

        def xy(i, y, k=0):  # method k's line is lifted by k pixels, so that equal figures stay visible
            return x0 + m + i * (pw - 2 * m) / max(1, n - 1), h - m - (y - lo) / (hi - lo) * (h - 2 * m) - 2 * k

        d.line([xy(0, lo), xy(n - 1, lo)], fill="black")
        d.line([xy(0, lo), xy(0, hi)], fill="black")
        for y in (lo, (lo + hi) / 2, hi):
            d.text((x0 + 8, xy(0, y)[1] - 7), f"{y:.1f}", fill="black", font=font)
        for i in range(n):
            d.text((xy(i, lo)[0] - 4, h - m + 6), str(i - 1), fill="black", font=font)
        d.text((x0 + pw // 2 - 100, h - 22), "round (-1: the starting planner)", fill="black", font=font)
        d.text((x0 + m, 12), title, fill="black", font=font)
        for name, ys in ser.items():
            k = names.index(name)
            c = colors[k % len(colors)]
            pts = [xy(i, y, k) for i, y in enumerate(ys) if y is not None]
            if len(pts) > 1:
                d.line(pts, fill=c, width=2)
            for q in pts:
                d.ellipse([q[0] - 3, q[1] - 3, q[0] + 3, q[1] + 3], fill=c)
    d.text(
        (m, h + 8),
        "env steps and generated tokens spent in training, all rounds (each line lifted 2 px per method, so that equal "
        "figures stay visible):",
        fill="black",
        font=font,
    )
    x = m
    for k, name in enumerate(names):
        c = colors[k % len(colors)]
        text = label.get(name, name)
        d.text((x, h + 30), text, fill=c, font=font)
        x += d.textlength(text, font=font) + 24
    img.save(path)
    return "Pillow (matplotlib is not installed)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/bench-methods"), help="folder of the runs, table and plot")
    p.add_argument("--methods", nargs="*", help="methods to run (default: every RL method in METHODS)")
    p.add_argument("--tasks", nargs="*", default=FAMILY, help="the KAlgebra task family")
    p.add_argument("--held-out", nargs="*", default=HELD_OUT, help="tasks whose oracle states are the held-out states")
    p.add_argument("--held-out-samples", type=int, default=8, help="plans per held-out state (action reward)")
    p.add_argument("--rounds", type=int, default=2, help="rounds per method")
    p.add_argument("--budget", type=int, default=16, help="env steps of training data per round")
    p.add_argument("--token-budget", type=int, default=1536, help="generated tokens per round (upper bound; see above)")
    p.add_argument("--steps", type=int, default=2, help="step budget per episode")
    p.add_argument("--group-size", type=int, default=4, help="G of every method")
    p.add_argument("--states-per-step", type=int, default=2, help="states per GRPO step of a loop method")
    p.add_argument("--loop-steps", type=int, default=4, help="most GRPO steps per round of a loop method")
    p.add_argument("--eval-episodes", type=int, default=4, help="live eval episodes per task per round")
    p.add_argument("--num-envs", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument(
        "--lora-r",
        type=int,
        default=0,
        help="LoRA rank of every method's training (0: full weights, as the warm-up and BEPA's learning test: a "
        "rank-8 adapter moved the tiny planner too slowly to show in a few rounds)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--planner", help="starting planner checkpoint (default: a tiny one, warmed up)")
    p.add_argument("--executor", help="executor checkpoint (default: a tiny one)")
    p.add_argument("--no-warmup", action="store_true", help="start from the tiny random planner as it is")
    a = p.parse_args(argv)
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    overlap = sorted(set(a.held_out) & set(a.tasks))
    if overlap:
        p.error(f"--held-out tasks are trained on: {overlap}")
    t_start = time.monotonic()

    wanted = a.methods or list(METHODS)
    runnable, skipped = {}, {}
    for name in wanted:
        if name not in METHODS:
            skipped[name] = "not in coda_agent.train.METHODS"
            continue
        k, why = kind(METHODS[name])
        (runnable.__setitem__(name, k) if k else skipped.__setitem__(name, why))
    missing = [m for m in EXPECTED if m not in METHODS]

    from transformers import AutoTokenizer

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
    tokenizer = AutoTokenizer.from_pretrained(start, local_files_only=True)
    rows = held_out_rows(a, out)
    a.held_out_path = out / "held_out"
    yardstick = ActionYardstick(a, executor, rows)
    print(
        f"tasks {a.tasks}; held out {a.held_out} ({len(rows)} states); per round {a.budget} env steps, "
        f"{a.token_budget} tokens; {a.rounds} rounds; planner {start}"
    )
    before, _ = live_success(a, start, executor, out / "eval_start")
    action0 = yardstick(start)
    print(f"starting planner: live success {before:.2f}, held-out action reward {action0:.3f}")

    results: dict[str, list[dict]] = {}
    start_figs: dict[str, dict] = {}
    for name, k in runnable.items():
        print(f"{name} ({k})")
        run = run_episodic if k == "episodic" else run_loop
        results[name] = run(a, name, METHODS[name], start, executor, out / name, yardstick, tokenizer)
        own0 = results[name][0].get("own_reward_before") if results[name] else None
        start_figs[name] = {"success": before, "action_reward": action0, "own_reward": own0}

    usage = {
        m: {"env_steps": sum(r["train_env_steps"] for r in rows), "tokens": sum(r["tokens"] for r in rows)}
        for m, rows in results.items()
    }
    table = make_table(results, start_figs, runnable, a.rounds, a.token_budget)
    how = plot(results, start_figs, usage, out / "methods.png")
    notes = [f"skipped {m}: {why}" for m, why in skipped.items()]
    notes += [f"missing (not in METHODS yet): {', '.join(missing)}"] if missing else []
    minutes = (time.monotonic() - t_start) / 60
    print("\n" + table + "\n" + "\n".join(notes))
    print(f"plot: {out / 'methods.png'} ({how}); results: {out / 'results.json'}; {minutes:.1f} minutes")
    (out / "results.json").write_text(
        json.dumps(
            {
                "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                "start": {"success": before, "action_reward": action0},
                "start_by_method": start_figs,
                "results": results,
                "usage": usage,
                "skipped": skipped,
                "missing": missing,
                "table": table,
                "minutes": minutes,
            },
            indent=1,
        )
    )
    return 0 if math.isfinite(before) else 1


if __name__ == "__main__":
    raise SystemExit(main())
