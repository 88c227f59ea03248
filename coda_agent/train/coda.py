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
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Sequence

from .common import Method, TrainConfig, opt, write_config
from .rewards import DEFAULT_SCALE, action_reward, execute_plans  # action_reward: importable from here too

# ------------------------------------------------------------------------------------------ settings


@dataclass
class CodaConfig(TrainConfig):
    """`coda train coda`: every field is a flag whose help shows its default."""

    planner: str = opt(
        "",
        "the Qwen2.5-VL planner that is trained: a local checkpoint directory (nothing is "
        "downloaded; OUT/planner is the trained copy)",
    )
    data: list[str] = opt([], "state datasets to train on (folders written by `coda data states`)", "--states")
    eval_data: list[str] = opt(
        [],
        "held-out state datasets: the planner's mean reward on them before and after "
        "training (and every --eval-steps), as eval_reward in the metrics",
    )
    app: str | None = opt(
        None,
        "the app whose states are trained (default: the datasets' own; with --env, its "
        "app); states of another app are refused",
    )
    out: str = opt(
        "runs/coda",
        "run folder: config.json, metrics.jsonl, tb/, checkpoints/, planner/ (with --rounds: round_NN/ per round)",
    )
    executor: str = opt(
        "",
        "the fixed executor that turns each sampled plan into an action: a11y (grounds the "
        "plan through the app's accessibility tree; no model), a UI-TARS-1.5 checkpoint "
        "directory, or an http(s):// OpenAI-compatible endpoint",
    )
    executor_model: str | None = opt(None, "model name at the executor endpoint (default: the one it serves)")
    executor_tries: int = opt(3, "executor attempts when its answer does not parse (temperature 1.0)")
    executor_max_new_tokens: int = opt(128, "tokens per executor answer")
    group_size: int = opt(8, "plans sampled per state: the GRPO group G (TRL's num_generations)")
    states_per_step: int = opt(4, "states per optimizer step, over all processes (each gives G plans)")
    micro_batch: int = opt(
        8,
        "completions per forward pass per device (gradient accumulation over the rest; "
        "states-per-step x G must divide by micro-batch x processes)",
    )
    max_steps: int = opt(-1, "optimizer steps (-1: --epochs passes over the states)")
    epochs: float = opt(1.0, "passes over the states when --max-steps is -1")
    lr: float = opt(1e-6, "AdamW learning rate")
    lr_scheduler: str = opt("constant", "learning-rate schedule (transformers' names: constant, linear, cosine)")
    warmup_steps: float = opt(0.0, "learning-rate warm-up: steps (an integer), or a fraction of all steps (< 1)")
    temperature: float = opt(1.0, "planner sampling temperature")
    top_p: float = opt(1.0, "nucleus sampling of the planner")
    max_new_tokens: int = opt(256, "tokens per plan (TRL's max_completion_length)")
    kl_coef: float = opt(0.04, "KL penalty to the reference planner (beta; 0: no reference is kept)", "--beta")
    clip_eps: float = opt(0.2, "PPO clip range of the ratio (epsilon)")
    clip_eps_high: float | None = opt(None, "upper clip range (DAPO's clip-higher; default: --clip-eps)")
    updates_per_batch: int = opt(1, "optimizer passes over each generated batch (TRL's num_iterations, mu)")
    loss_type: str = opt(
        "grpo", "TRL loss aggregation: grpo (per completion, as the GRPO paper) | dapo | dr_grpo | bnpo"
    )
    scale_rewards: str = opt("group", "reward normalisation: group (A = (r - mean) / std per state) | batch | none")
    reward_scale: float = opt(
        DEFAULT_SCALE, "pixels over which a click's distance reward falls to 1/e outside the target's box"
    )
    history_images: int = opt(2, "screenshots of earlier steps in each planner prompt (as the live agent)")
    logging_steps: int = opt(1, "optimizer steps between metric records")
    save_steps: int = opt(50, "optimizer steps between checkpoints (OUT/checkpoints/checkpoint-N)")
    save_total_limit: int = opt(2, "checkpoints kept")
    eval_steps: int = opt(0, "optimizer steps between held-out evaluations (0: before and after training only)")
    eval_generations: int | None = opt(None, "plans per held-out state (default: --group-size)")
    bf16: bool | None = opt(None, "bfloat16 training (default: on a GPU)")
    gradient_checkpointing: bool = opt(False, "recompute activations in the backward pass (less memory)")
    use_vllm: bool = opt(False, "generate the plans with vLLM (TRL's integration; needs the vllm package and a GPU)")
    vllm_mode: str = opt(
        "colocate", "colocate (vLLM inside each training process) | server (a `trl vllm-serve` process on other GPUs)"
    )
    vllm_server_base_url: str | None = opt(None, "server mode: the vLLM server's base URL (overrides host and port)")
    vllm_server_host: str = opt("0.0.0.0", "server mode: the vLLM server's host")
    vllm_server_port: int = opt(8000, "server mode: the vLLM server's port")
    vllm_server_timeout: float = opt(240.0, "server mode: seconds to wait for the vLLM server to come up")
    vllm_gpu_memory_utilization: float = opt(0.3, "colocate mode: GPU memory fraction vLLM may take")
    vllm_tensor_parallel_size: int = opt(1, "colocate mode: tensor-parallel size of vLLM")
    vllm_enable_sleep_mode: bool = opt(False, "colocate mode: offload vLLM's weights and cache while training")
    # the paper's loop
    rounds: int = opt(0, "run the paper's loop for K rounds (states -> GRPO -> live run); 0: train once on --data")
    env: str | None = opt(None, "env id of the loop's live runs and oracle states, e.g. coda/KAlgebra-v0")
    tasks: list[str] | None = opt(None, "task ids of the loop (default: the env's whole suite)")
    episodes: int = opt(4, "live episodes per task per round (their successes become the next round's states)")
    num_envs: int = opt(2, "envs of the live runs (a vector env)")
    episode_steps: int | None = opt(None, "step budget per live episode (default: each task's own)")
    live_temperature: float = opt(1.0, "planner temperature in the live runs")
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
    from ..states import state_observation

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
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        rows = [
            {k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(texts)}
            for i in range(len(texts))
        ]
        rewards, rates = score_plans(self.executor, rows, texts, self.scale)
        if log_metric is not None:
            for k, v in rates.items():
                log_metric(k, v)
        return rewards


def make_executor(cfg: CodaConfig, app: str, screen: tuple[int, int] = (1280, 800)):
    """The fixed executor of cfg.executor, built by the agents' own factory (policy.make_executor): `a11y`, a
    local UI-TARS directory, or an endpoint (asked to answer now, so that a wrong address fails before any
    training)."""
    from ..models import ModelError, OpenAIVLM, SamplingParams
    from ..policy import make_executor as agents_executor

    spec = cfg.executor
    if not spec:
        raise ValueError("coda train coda needs --executor a11y|DIR|URL (the fixed executor)")
    if spec.startswith(("http://", "https://")):
        try:
            OpenAIVLM(spec, model=None, retries=1, backoff=0.5, timeout=10).model  # GET /models
        except ModelError as e:
            raise ValueError(f"--executor {spec}: {e}") from None
    elif spec != "a11y" and not Path(spec).is_dir():
        raise ValueError(f"--executor {spec!r} is neither a11y, a checkpoint directory nor an http(s):// URL")
    return agents_executor(
        spec,
        screen,
        cfg.executor_model,
        {"device": cfg.device} if cfg.device else {},
        cfg.executor_tries,
        SamplingParams(max_new_tokens=cfg.executor_max_new_tokens, temperature=1.0),
    )


# ------------------------------------------------------------------------------------------ one GRPO run
def _world_size() -> int:
    from accelerate import PartialState

    return PartialState().num_processes


def _checkpointing_field() -> str:
    """transformers renamed gradient_checkpointing to activation_checkpointing (5.2x); TRL 1.16 runs on both."""
    from trl import GRPOConfig

    return (
        "activation_checkpointing"
        if "activation_checkpointing" in {f.name for f in fields(GRPOConfig)}
        else "gradient_checkpointing"
    )


def grpo_args(cfg: CodaConfig, out: Path, processor, has_eval: bool, progress: bool = True):
    """trl.GRPOConfig from our settings (the mapping, in one place)."""
    import torch
    from trl import GRPOConfig

    world = _world_size()
    per_step = cfg.states_per_step * cfg.group_size
    if per_step % (cfg.micro_batch * world):
        raise ValueError(
            f"--states-per-step {cfg.states_per_step} x --group-size {cfg.group_size} = {per_step} "
            f"completions per step must divide by --micro-batch {cfg.micro_batch} x {world} "
            "process(es)"
        )
    if cfg.group_size < 2:
        raise ValueError("--group-size must be at least 2 (advantages are relative within the group)")
    cuda = torch.cuda.is_available() and (cfg.device or "cuda").startswith("cuda")
    bf16 = cuda if cfg.bf16 is None else cfg.bf16
    checkpointing = _checkpointing_field()
    gen_kwargs = None
    if not cfg.use_vllm:  # the policy never writes vision placeholders (as TransformersVLM.generate)
        gen_kwargs = {"suppress_tokens": processor.vision_token_ids()}
    return GRPOConfig(
        output_dir=str(out / "checkpoints"),
        seed=cfg.seed,
        use_cpu=not cuda,
        bf16=bf16,
        fp16=False,
        learning_rate=cfg.lr,
        lr_scheduler_type=cfg.lr_scheduler,
        warmup_steps=cfg.warmup_steps,
        max_grad_norm=cfg.max_grad_norm,
        weight_decay=0.0,
        per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=per_step // (cfg.micro_batch * world),
        per_device_eval_batch_size=cfg.micro_batch,
        num_generations=cfg.group_size,
        num_generations_eval=cfg.eval_generations or cfg.group_size,
        max_steps=cfg.max_steps,
        num_train_epochs=cfg.epochs,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=0,
        max_completion_length=cfg.max_new_tokens,
        generation_kwargs=gen_kwargs,
        beta=cfg.kl_coef,
        epsilon=cfg.clip_eps,
        epsilon_high=cfg.clip_eps_high,
        num_iterations=cfg.updates_per_batch,
        loss_type=cfg.loss_type,
        scale_rewards=cfg.scale_rewards,
        **{checkpointing: cfg.gradient_checkpointing},
        logging_steps=cfg.logging_steps,
        logging_first_step=True,
        report_to=[],
        disable_tqdm=not progress,
        save_strategy="steps",
        save_steps=cfg.save_steps,
        save_total_limit=cfg.save_total_limit,
        eval_strategy="steps" if has_eval and cfg.eval_steps > 0 else "no",
        eval_steps=cfg.eval_steps if cfg.eval_steps > 0 else None,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        model_init_kwargs={"dtype": "bfloat16" if bf16 else "float32", "local_files_only": True, "device_map": None},
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        vllm_server_base_url=cfg.vllm_server_base_url,
        vllm_server_host=cfg.vllm_server_host,
        vllm_server_port=cfg.vllm_server_port,
        vllm_server_timeout=cfg.vllm_server_timeout,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        vllm_tensor_parallel_size=cfg.vllm_tensor_parallel_size,
        vllm_enable_sleep_mode=cfg.vllm_enable_sleep_mode,
    )


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
    reward_funcs: Sequence | None = None,
):
    """The trl.GRPOTrainer of a run (not started): the planner (cfg.planner, or `model`: a model object), the
    states (cfg.data, or `train_states`), the reward through the executor (cfg.executor, or `executor`), LoRA
    (cfg.lora_r > 0) or full weights, our metrics callback. `extra_rewards` are added to the reward (TRL sums
    reward functions; benchmarks use it). `reward_funcs` replace the executor's reward (another step-level
    method's own: Co-EPG's C-DREM, PRO-CUA's process reward; then no executor is built here)."""
    from trl import GRPOTrainer

    from .steplevel import ImageTextProcessor, PromptTransform, RunLogCallback, load_states

    if model is None:
        if not cfg.planner:
            raise ValueError("coda train coda needs --planner DIR (a local checkpoint: its weights are trained)")
        if cfg.planner.startswith(("http://", "https://")):
            raise ValueError(f"--planner {cfg.planner}: an endpoint cannot be trained; give a checkpoint directory")
        if not (Path(cfg.planner) / "config.json").exists():
            raise ValueError(f"--planner {cfg.planner!r} is not a checkpoint directory (no config.json)")
    if train_states is None:
        train_states, app = load_states(cfg.data, cfg.app)
    else:
        app = cfg.app or train_states.unique("app")[0]
    if cfg.use_vllm:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "--use-vllm needs the vllm package (pip install vllm) and a GPU; without it the plans "
                "are generated with transformers"
            )
    if eval_states is None and cfg.eval_data:
        eval_states, _ = load_states(cfg.eval_data, app)
    if processor is None:
        processor = ImageTextProcessor.from_checkpoint(cfg.planner)
    screen = tuple(train_states.select_columns(["screen"])[0]["screen"]) or (1280, 800)
    if executor is None and reward_funcs is None:
        executor = make_executor(cfg, app, screen)
    transform = PromptTransform(cfg.history_images)
    for ds in (train_states, eval_states):  # a prompt the states cannot give fails now, in one line
        if ds is not None:
            try:
                transform(ds[:1])
            except ValueError as e:
                raise ValueError(f"--history-images {cfg.history_images}: {e}") from None
    peft_config = None
    if cfg.lora_r > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=0.0,
            target_modules=list(cfg.lora_targets),
            task_type="CAUSAL_LM",
        )
    args = grpo_args(cfg, out, processor, eval_states is not None, progress)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trainer = GRPOTrainer(
        model=model if model is not None else cfg.planner,
        reward_funcs=[
            *(reward_funcs if reward_funcs is not None else [ExecutorReward(executor, cfg.reward_scale)]),
            *extra_rewards,
        ],
        args=args,
        train_dataset=train_states.with_transform(transform),
        eval_dataset=eval_states.with_transform(transform) if eval_states is not None else None,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=[RunLogCallback(out, extra_log)],
    )
    if not progress:  # --quiet: no progress bar, and no log dicts printed either
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return trainer


def train_once(
    cfg: CodaConfig,
    out: Path | None = None,
    model=None,
    processor=None,
    executor=None,
    train_states=None,
    eval_states=None,
    progress: bool = True,
    extra_log: dict | None = None,
) -> dict:
    """One GRPO run over state datasets (`build_trainer`, then `run_trainer`). Returns its summary record."""
    out = Path(out or cfg.out)
    trainer = build_trainer(cfg, out, model, processor, executor, train_states, eval_states, progress, extra_log)
    return run_trainer(trainer, cfg, out, base=cfg.planner if model is None else None, extra_log=extra_log)


def run_trainer(trainer, cfg: CodaConfig, out: Path, base: str | None = None, extra_log: dict | None = None) -> dict:
    """Held-out reward before (with --eval-data), training (resumed from the newest checkpoint unless
    --no-resume), held-out reward after, and the planner exported to OUT/planner (merged into `base`, the
    planner's checkpoint directory, or into a copy of the in-memory model when None). Returns a summary
    record, also the last line of OUT/metrics.jsonl."""
    from .steplevel import export_planner, last_checkpoint

    out = Path(out)
    if trainer.accelerator.is_main_process:
        write_config(out, cfg)
    resume = last_checkpoint(out / "checkpoints") if cfg.resume else None
    if resume is None and trainer.accelerator.is_main_process:  # a fresh run: no stale records or checkpoints
        (out / "metrics.jsonl").unlink(missing_ok=True)
        shutil.rmtree(out / "checkpoints", ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    summary: dict[str, Any] = {"states": len(trainer.train_dataset)}
    if trainer.eval_dataset is not None and resume is None:
        summary["eval_reward_before"] = trainer.evaluate()["eval_reward"]
    t0 = time.monotonic()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    summary.update(
        train_seconds=time.monotonic() - t0, steps=trainer.state.global_step, train_loss=result.training_loss
    )
    if trainer.eval_dataset is not None:
        summary["eval_reward_after"] = trainer.evaluate()["eval_reward"]
    summary.update(_throughput(trainer))
    export_planner(trainer, base, trainer.processing_class, out / "planner")
    summary["planner"] = str(out / "planner")
    if trainer.accelerator.is_main_process:
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"summary": True, **(extra_log or {}), **summary}) + "\n")
    return summary


def _throughput(trainer) -> dict:
    """States/s, generated tokens/s and generated tokens of the training steps (from TRL's own step records:
    with --logging-steps 1 each generating step's record holds the mean completion length of its one
    generation batch of states-per-step x G completions, EOS included; steps that reuse a batch (--updates-per-
    batch > 1) hold none)."""
    logs = [r for r in trainer.state.log_history if "step_time" in r]
    if not logs:
        return {}
    args = trainer.args
    per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * trainer.accelerator.num_processes
    seconds = sum(r["step_time"] for r in logs)
    tokens = sum(r.get("completions/mean_length", 0.0) * per_step for r in logs)
    steps = len(logs)
    return {
        "generated_tokens": round(tokens),  # the planner's sampled tokens in training (held-out evals not counted)
        "states_per_s": steps * per_step / trainer.num_generations / seconds if seconds else 0.0,
        "generated_tokens_per_s": tokens / seconds if seconds else 0.0,
        "seconds_per_step": seconds / steps,
    }


# ------------------------------------------------------------------------------------------ the paper's loop
def _round_dir(out: Path, r: int) -> Path:
    return out / f"round_{r:02d}"


def _live_eval(cfg: CodaConfig, planner: str, out: Path, progress: bool) -> dict:
    """The planner + the executor over the tasks, live: a `coda eval` run (resumable) -> its results."""
    from ..eval import run_eval
    from ..models import SamplingParams
    from ..policy import make_agent
    from .common import probe_env

    env = probe_env(cfg.env, cfg.episode_steps)
    agent = make_agent(
        "coda",
        env.app,
        env.screen,
        planner=planner,
        executor=make_executor(cfg, env.app, env.screen),
        history_images=cfg.history_images,
        seed=cfg.seed,
        model_options={"device": cfg.device} if cfg.device else {},
        planner_params=SamplingParams(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.live_temperature, top_p=cfg.top_p
        ),
    )
    env_kwargs = dict(env.kwargs)
    if getattr(agent, "wants_a11y_tree", False):
        env_kwargs["a11y_tree"] = True
    return run_eval(
        cfg.env,
        agent,
        out,
        task_ids=cfg.tasks,
        episodes=cfg.episodes,
        num_envs=cfg.num_envs,
        seed=cfg.seed,
        env_kwargs=env_kwargs,
        progress=progress,
        config={"planner": planner, "executor": cfg.executor},
    )


def _success_rate(summary: dict) -> float:
    """The overall success rate of a `coda eval` run's summary."""
    return float(summary["overall"]["rate"])


def _round_states(cfg: CodaConfig, r: int, out: Path) -> list[str]:
    """Round r's state datasets: the oracle's replays of the tasks (built once, OUT/oracle_states; unless
    --no-oracle-states), the states of the successful episodes of every live run so far (OUT/round_NN/states:
    success by the checks, or by --judge), and any --data."""
    from .. import states

    paths = []
    oracle = out / "oracle_states"
    if cfg.oracle_states:
        if not (oracle / "dataset_info.json").exists():
            report: dict = {}
            states.build(
                states.oracle_states(cfg.env, cfg.tasks, history_images=cfg.history_images, report=report), oracle
            )
        paths.append(str(oracle))
    runs = [_round_dir(out, k) / "eval" for k in range(-1, r)]
    runs = [p for p in runs if (p / "episodes.jsonl").exists()]
    path = _round_dir(out, r) / "states"
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
    if _world_size() > 1:
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
    if cfg.app and cfg.app != env.app:
        raise ValueError(f"--app {cfg.app} but --env {cfg.env} is {env.app}")
    cfg.app = env.app
    if not cfg.planner or not (Path(cfg.planner) / "config.json").exists():
        raise ValueError(
            f"--planner {cfg.planner!r} is not a checkpoint directory (no config.json): the loop trains a local planner"
        )
    make_executor(cfg, env.app, env.screen)  # fails now on a wrong --executor, not after a round
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, cfg)
    history: list[dict] = []

    def record(rec: dict, new: bool = True) -> None:  # a finished round's record is written once
        history.append(rec)
        if new:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")

    done = _finished_rounds(out)
    planner = cfg.planner
    if -1 in done:
        record(done[-1], new=False)
    else:
        res = _live_eval(cfg, planner, _round_dir(out, -1) / "eval", progress)
        rec = {"round": -1, "planner": planner, "live_success_rate": _success_rate(res)}
        _mark_done(out, -1, rec)
        record(rec)
    for r in range(cfg.rounds):
        rd = _round_dir(out, r)
        if r in done:
            record(done[r], new=False)
            planner = done[r]["planner"]
            continue
        data = _round_states(cfg, r, out)
        rcfg = CodaConfig(**{**asdict(cfg), "data": data, "planner": planner, "rounds": 0, "out": str(rd / "train")})
        if cfg.launcher:
            _launch(cfg.launcher, rcfg)
            train_rec = _last_summary(rd / "train")
        else:
            train_rec = train_once(rcfg, progress=progress, extra_log={"round": r})
        planner = str(rd / "train" / "planner")
        res = _live_eval(cfg, planner, rd / "eval", progress)
        rec = {
            "round": r,
            "planner": planner,
            "states": train_rec.get("states"),
            "steps": train_rec.get("steps"),
            "live_success_rate": _success_rate(res),
            **{k: train_rec[k] for k in ("eval_reward_before", "eval_reward_after") if k in train_rec},
        }
        _mark_done(out, r, rec)
        record(rec)
    return history


def _finished_rounds(out: Path) -> dict[int, dict]:
    found = {}
    for p in out.glob("round_*/done.json"):
        rec = json.loads(p.read_text())
        found[int(rec["round"])] = rec
    return found


def _mark_done(out: Path, r: int, rec: dict) -> None:
    rd = _round_dir(out, r)
    rd.mkdir(parents=True, exist_ok=True)
    tmp = rd / "done.json.tmp"
    tmp.write_text(json.dumps(rec))
    tmp.rename(rd / "done.json")


def _last_summary(out: Path) -> dict:
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    found = [x for x in lines if x.get("summary")]
    if not found:
        raise RuntimeError(f"the launched GRPO run wrote no summary to {out / 'metrics.jsonl'}")
    return found[-1]


def config_flags(cfg: CodaConfig) -> list[str]:
    """The flags that rebuild `cfg` on a command line (for a launcher)."""
    argv = []
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        flag = "--" + f.name.replace("_", "-")
        if v is None:
            continue
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + f.name.replace("_", "-"))
        elif isinstance(v, list):
            argv += [flag, *map(str, v)] if v else []
        else:
            argv += [flag, str(v)]
    return argv


def launch_command(launcher: str, cfg: CodaConfig) -> list[str]:
    """`LAUNCHER` + the module + the flags of `cfg`: accelerate and torchrun take `-m MODULE`; any other
    launcher (srun, ...) is followed by this Python."""
    argv = shlex.split(launcher)
    if not argv:
        raise ValueError("--launcher is empty")
    if Path(argv[0]).name in ("accelerate", "torchrun"):
        argv += ["-m", "coda_agent.cli"]
    else:
        argv += [sys.executable, "-m", "coda_agent.cli"]
    return argv + ["train", "coda", "--quiet", *config_flags(cfg)]


def _launch(launcher: str, cfg: CodaConfig) -> None:
    """Run one round's GRPO in a launched process group (e.g. accelerate launch over GPUs)."""
    argv = launch_command(launcher, cfg)
    rc = subprocess.run(argv).returncode
    if rc != 0:
        raise RuntimeError(f"the round's GRPO run exited with {rc}: {shlex.join(argv)}")


# ------------------------------------------------------------------------------------------ the command
def resolve_app(cfg: CodaConfig) -> None:
    """cfg.app from --env's app where an env is given (a different --app is an error); step-level methods share it."""
    if cfg.env:
        from .common import probe_env

        env_app = probe_env(cfg.env).app
        if cfg.app and cfg.app != env_app:
            raise ValueError(f"--app {cfg.app} but --env {cfg.env} is {env_app}")
        cfg.app = env_app


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
