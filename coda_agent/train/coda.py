"""CODA's stage 1 as the paper trains it: step-level decoupled GRPO on the planner, on TRL's GRPOTrainer.

The maths (arXiv 2508.20096, "Specialization"). At a state s (the task, the earlier steps, the screenshots) the
planner samples G plans p_1..p_G; the fixed executor turns each plan into an action a_i; each action is scored
against the labelled positive action a_T of s:

    r_i = 1[type(a_i) = type(a_T)] + r_dist(a_i, a_T)               (action_reward, in [0, 2])

r_dist grades the parameters in [0, 1]: a click 1 inside the target element's box and falling off with the
distance to it, typed text by similarity, keys by their set, scroll by direction then amount. A plan that does
not parse, or that the executor cannot turn into an action, scores 0. Advantages are group-relative,
A_i = (r_i - mean_j r_j) / std_j r_j over the G plans of one state, and TRL's clipped objective with a KL penalty
to the reference (the base weights: LoRA's adapter switched off) updates the planner alone; the executor never
changes. The paper gives no values for G, the learning rate, the temperature, beta or the clip range; the
defaults here are those of the GRPO trainer R1-V builds on (TRL 0.14: G=8, lr 1e-6, temperature 1.0, beta 0.04,
eps 0.2), the recipe the released CODA planner's model card names.

Two ways to run it:

    coda train coda --data STATES... --planner P --executor E --out OUT
        GRPO over state datasets (`coda data states`). OUT/planner is the trained planner (`coda eval
        --planner OUT/planner`); OUT/checkpoints/ the Trainer's checkpoints (a rerun resumes from the newest);
        OUT/metrics.jsonl and OUT/tb/ every logged step (reward, its std, KL, clip ratios, completion lengths,
        the executor's and the planner's parse-error rates, states/s and generated tokens/s).

    coda train coda --rounds K --env ENV --tasks ... --planner P --executor E --out OUT
        the paper's loop: in round r the states (round 0: the oracle's replays of the tasks plus any --data;
        then also the states of every successful episode so far, success decided by the checks or by --judge)
        train the planner with GRPO, and the new planner then runs the tasks live (a `coda eval` run with the
        executor): its success rate is the round's figure in OUT/metrics.jsonl, its successful episodes feed
        the next round. Before round 0 the starting planner runs the same live evaluation (round -1 in the
        metrics). OUT/round_NN/{states,train,eval}; a rerun resumes at the first unfinished round (and a round
        inside its GRPO from the newest checkpoint).

At scale the same command runs under `accelerate launch` (configs/accelerate/: one GPU, DeepSpeed ZeRO-3, FSDP)
with `--use-vllm` (TRL's colocate mode, or `--vllm-mode server` beside `trl vllm-serve`); the executor is then
best an OpenAI-compatible endpoint (vLLM serving UI-TARS-1.5) that every process calls.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from ..states import state_observation
from ..steps import DEFAULT_SCALE, action_reward
from .common import Method, opt
from .steplevel import (
    Rounds,
    StepLevelConfig,
    completion_rows,
    execute_plans,
    launch_command,
    live_eval,
    make_executor,
    oracle_state_paths,
    resolve_app,
    run_trainer,
    success_rate,
    world_size,
)
from .steplevel import build_trainer as build_grpo_trainer

# ------------------------------------------------------------------------------------------ settings


@dataclass
class CodaConfig(StepLevelConfig):
    """`coda train coda`: the step-level settings (steplevel.StepLevelConfig) plus CODA's reward and loop."""

    reward_scale: float = opt(
        DEFAULT_SCALE, "pixels over which a click's distance reward falls to 1/e outside the target's box"
    )
    oracle_states: bool = opt(True, "round 0 also trains on the states of the tasks' oracle replays")
    judge: list[str] = opt(
        [], "judge models (paths or URLs) that decide which live episodes succeeded (default: the tasks' checks)"
    )
    threshold: float = opt(0.5, "judge score an episode needs to count as successful")
    launcher: str | None = opt(
        None,
        "run each round's GRPO as `LAUNCHER coda train coda ...`, e.g. "
        '"accelerate launch --config_file configs/accelerate/multi_gpu_zero3.yaml"',
    )


# ------------------------------------------------------------------------------------------ the reward
def score_plans(
    executor, rows: Sequence[dict], texts: Sequence[str], scale: float = DEFAULT_SCALE
) -> tuple[list[float], dict[str, float]]:
    """The reward of each sampled plan (`texts[i]` at state `rows[i]`): the executor's action scored by
    `action_reward` against the state's target, 0 when the plan or the executor's output does not parse.
    Returns (rewards, rates): planner and executor parse-error rates and the type-match rate of the batch."""
    counts: dict[str, int] = {}
    actions = execute_plans(
        executor, [(r["instruction"], t, state_observation(r)) for r, t in zip(rows, texts)], counts
    )
    rewards = []
    for r, a in zip(rows, actions):
        box = list(r["box"]) if r.get("box") is not None else None
        radius = r.get("radius")
        rewards.append(
            action_reward(
                a,
                r["target"],
                box or None,
                tuple(r["screen"]),
                scale=scale,
                **({"radius": float(radius)} if radius else {}),
            )
        )
    n = max(1, len(texts))
    plans = max(1, counts.get("plans", 0) - counts.get("plan_parse_errors", 0) - counts.get("terminal", 0))
    rates = {
        "planner/parse_error_rate": counts.get("plan_parse_errors", 0) / n,
        "executor/parse_error_rate": counts.get("executor_parse_errors", 0) / plans,
        "reward/type_match_rate": sum(x >= 1.0 for x in rewards) / n,
    }
    return rewards, rates


class ExecutorReward:
    """TRL reward function: each sampled plan (a completion) -> the executor's action -> `action_reward`
    against the state's labelled target. TRL calls it with the completions and every dataset column, one entry
    per completion; it logs the planner's and the executor's parse-error rates and the type-match rate."""

    __name__ = "action_reward"  # the name TRL logs the reward under (rewards/action_reward/...)

    def __init__(self, executor, scale: float = DEFAULT_SCALE):
        self.executor = executor
        self.scale = scale

    def __call__(self, prompts, completions, log_metric=None, **columns) -> list[float]:
        texts, rows = completion_rows(completions, columns)
        rewards, rates = score_plans(self.executor, rows, texts, self.scale)
        if log_metric is not None:
            for k, v in rates.items():
                log_metric(k, v)
        return rewards


# ------------------------------------------------------------------------------------------ one GRPO run
def build_trainer(
    cfg: CodaConfig,
    out: Path,
    model=None,
    processor=None,
    executor=None,
    train_states=None,
    eval_states=None,
    progress: bool = True,
    extra_log: dict | None = None,
    extra_rewards: Sequence = (),
):
    """CODA's trl.GRPOTrainer (not started): steplevel.build_trainer with the executor's action reward
    (`executor`, or cfg.executor built here) plus any `extra_rewards` (TRL sums reward functions)."""
    if executor is None:
        from .steplevel import load_states

        if train_states is None:
            train_states, cfg.app = load_states(cfg.data, cfg.app)
        screen = tuple(train_states.select_columns(["screen"])[0]["screen"]) or (1280, 800)
        executor = make_executor(cfg, cfg.app or train_states.unique("app")[0], screen)
    rewards = [ExecutorReward(executor, cfg.reward_scale), *extra_rewards]
    return build_grpo_trainer(cfg, out, rewards, model, processor, train_states, eval_states, progress, extra_log)


def train_once(cfg: CodaConfig, out: Path | None = None, executor=None, progress: bool = True, extra_log=None) -> dict:
    """One GRPO run over cfg.data (`build_trainer`, then steplevel.run_trainer). Returns its summary record."""
    out = Path(out or cfg.out)
    trainer = build_trainer(cfg, out, executor=executor, progress=progress, extra_log=extra_log)
    return run_trainer(trainer, cfg, out, base=cfg.planner, extra_log=extra_log)


# ------------------------------------------------------------------------------------------ the paper's loop
def round_states(cfg: CodaConfig, r: int, rounds: Rounds) -> list[str]:
    """Round r's state datasets: the oracle's replays of the tasks (unless --no-oracle-states), the states of the
    successful episodes of every live run so far (OUT/round_NN/states: success by the checks, or by --judge),
    and any --data."""
    from .. import states

    paths = oracle_state_paths(cfg, rounds.out) if cfg.oracle_states else []
    runs = [rounds.dir(k) / "eval" for k in range(-1, r)]
    runs = [p for p in runs if (p / "episodes.jsonl").exists()]
    path = rounds.dir(r) / "states"
    if not (path / "dataset_info.json").exists() and runs:
        judge = None
        if cfg.judge:
            from ..judge import Judge, JudgeConfig

            judge = Judge(JudgeConfig(models=cfg.judge, threshold=cfg.threshold))
        records = [rec for run in runs for rec in states.run_states(run, judge, history_images=cfg.history_images)]
        if records:
            states.build(records, path)
    if (path / "dataset_info.json").exists():
        paths.append(str(path))
    paths += list(cfg.data)
    if not paths:
        raise ValueError(
            f"round {r} has no states: no oracle states (--no-oracle-states), no successful live "
            "episode yet and no --data"
        )
    return paths


def run_rounds(cfg: CodaConfig, progress: bool = True) -> list[dict]:
    """The paper's loop, resumable per round (see the module's docstring). Returns one record per round."""
    if not cfg.env:
        raise ValueError("--rounds needs --env (the env whose tasks the loop runs live)")
    if world_size() > 1:
        raise ValueError(
            "the loop runs in one process (its live runs drive the desktops); to train each round on "
            'several GPUs give --launcher "accelerate launch --config_file ..." instead of launching '
            "the loop itself"
        )
    from .common import probe_env

    env = probe_env(cfg.env, cfg.episode_steps)
    unknown = [t for t in (cfg.tasks or []) if t not in env.tasks]
    if unknown:
        raise ValueError(f"unknown tasks for {cfg.env}: {unknown}")
    resolve_app(cfg)
    if not cfg.planner or not (Path(cfg.planner) / "config.json").exists():
        raise ValueError(
            f"--planner {cfg.planner!r} is not a checkpoint directory (no config.json): the loop trains a local planner"
        )
    executor = make_executor(cfg, env.app, env.screen)  # built once: a wrong --executor fails now
    rounds = Rounds(cfg.out, cfg)
    planner = cfg.planner
    if rounds.done(-1) is None:
        res = live_eval(cfg, planner, executor, rounds.dir(-1) / "eval", progress)
        rounds.finish(-1, {"round": -1, "planner": planner, "live_success_rate": success_rate(res)})
    for r in range(cfg.rounds):
        rd = rounds.dir(r)
        if (rec := rounds.done(r)) is not None:
            planner = rec["planner"]
            continue
        data = round_states(cfg, r, rounds)
        rcfg = CodaConfig(**{**asdict(cfg), "data": data, "planner": planner, "rounds": 0, "out": str(rd / "train")})
        if cfg.launcher:
            _launch(cfg.launcher, rcfg)
            train_rec = _last_summary(rd / "train")
        else:
            train_rec = train_once(rcfg, executor=executor, progress=progress, extra_log={"round": r})
        planner = str(rd / "train" / "planner")
        res = live_eval(cfg, planner, executor, rd / "eval", progress)
        rec = {
            "round": r,
            "planner": planner,
            "states": train_rec.get("states"),
            "steps": train_rec.get("steps"),
            "live_success_rate": success_rate(res),
            **{k: train_rec[k] for k in ("eval_reward_before", "eval_reward_after") if k in train_rec},
        }
        rounds.finish(r, rec)
    return rounds.history


def _last_summary(out: Path) -> dict:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    found = [x for x in lines if x.get("summary")]
    if not found:
        raise RuntimeError(f"the launched GRPO run wrote no summary to {out / 'metrics.jsonl'}")
    return found[-1]


def _launch(launcher: str, cfg: CodaConfig) -> None:
    """Run one round's GRPO in a launched process group (e.g. accelerate launch over GPUs)."""
    argv = launch_command(launcher, cfg)
    rc = subprocess.run(argv).returncode
    if rc != 0:
        raise RuntimeError(f"the round's GRPO run exited with {rc}: {shlex.join(argv)}")


# ------------------------------------------------------------------------------------------ the command
def run(cfg: CodaConfig, progress: bool = True) -> list[dict]:
    if cfg.rounds > 0:
        return run_rounds(cfg, progress)
    resolve_app(cfg)
    return [train_once(cfg, progress=progress)]


def summary(cfg: CodaConfig, history: list[dict]) -> str:
    lines = []
    for h in history:
        if "round" in h:
            extra = "".join(f" {k} {h[k]:.3f}" for k in ("eval_reward_before", "eval_reward_after") if k in h)
            lines.append(
                f"round {h['round']}: live success {h['live_success_rate']:.3f}{extra}  planner {h['planner']}"
            )
        else:
            parts = [f"{h.get('steps', 0)} steps over {h.get('states', 0)} states"]
            for k in ("eval_reward_before", "eval_reward_after", "states_per_s", "generated_tokens_per_s"):
                if k in h:
                    parts.append(f"{k.replace('_', ' ')} {h[k]:.3f}")
            lines.append(", ".join(parts))
            lines.append(
                f"planner: {h.get('planner')}  (coda eval --agent coda --planner {h.get('planner')} "
                f"--executor {cfg.executor} ...)"
            )
    return "\n".join(lines)


METHOD = Method(
    "coda",
    "CODA's stage 1 as published: step-level decoupled GRPO on the planner over state "
    "datasets (TRL GRPOTrainer); --rounds K runs the paper's collect -> label -> train loop",
    CodaConfig,
    run,
    summary,
)
