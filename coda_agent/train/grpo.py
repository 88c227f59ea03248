"""Decoupled GRPO on the planner (CODA stage 1, "specialization"): the maths and the loop, top to bottom.

Only the planner learns; the executor (UI-TARS) is a separate, frozen model. Each iteration:
  1. rollouts: G episodes of each of a few tasks over a vector env; the planner samples at temperature T.
     Every planner call becomes a `Sample` (rollout.py) tagged with its group key: the task and the index of
     its group in the batch.
  2. advantages, per group (the episodes whose key is the same):
         A_i = (R_i - mean_j R_j) / (std_j R_j + eps),  0 when std = 0
     (every episode of the group scored the same: no signal). The episode's A_i is given to every token of
     every planner answer of that episode; prompt tokens (instruction, screenshots, earlier turns) and
     padding are masked out, and the executor's tokens are not in the planner's sequences at all.
  3. the loss, per planner token t with log-probs under the new policy (n), the rollout policy (o) and the
     frozen reference (r), temperature-scaled like the sampling:
         ratio_t = exp(n_t - o_t)
         clip_t  = -min(ratio_t * A, clip(ratio_t, 1 - eps, 1 + eps) * A)
         kl_t    = exp(r_t - n_t) - (r_t - n_t) - 1            (the k3 estimator of KL(new || ref), >= 0)
         L       = sum_t (clip_t + beta * kl_t) / N             (N = planner tokens in the whole batch)
     Dividing by the whole batch's N (not each micro-batch's) makes accumulated micro-batches give exactly
     the full batch's gradient. With LoRA the reference is the same model with its adapter switched off.
  4. `epochs` optimizer steps over the batch (PPO-style reuse; the ratio is 1 on the first), grad clipping.
With `--agent uitars` the same loop trains UI-TARS end to end (its samples have the role `policy`).
TRL's GRPOTrainer and verl were considered. TRL's environment integrations (OpenEnv, Harbor) treat an env as
tools the trained model calls in text turns; verl's multi-turn agent loop runs on Ray with vLLM/SGLang
workers on GPUs. Here every planner turn goes through a second, frozen model (the executor) and a desktop
that returns a screenshot, and the whole loop must also run (and be tested) on CPU. The loop is small enough
to own; what other methods share with it is in common.py.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..models import TransformersVLM
from ..rollout import Rollout, collect_groups
from .common import (
    Method,
    RolloutConfig,
    RunLog,
    accumulate,
    agent_factory,
    export_planner,
    load_checkpoint,
    load_trainable,
    make_envs,
    opt,
    prepare_model,
    probe_env,
    reference_logprobs,
    save_checkpoint,
    token_logprobs,
    trainable_parameters,
    write_config,
)


@dataclass
class GRPOConfig(RolloutConfig):
    out: str = opt("runs/grpo", "run folder: config.json, metrics.jsonl, tb/, checkpoint/, rollouts/, planner/")
    lr: float = opt(1e-6, "AdamW learning rate")
    iterations: int = opt(10, "rollout + update iterations")
    tasks_per_iteration: int = opt(4, "tasks (groups) per iteration")
    group_size: int = opt(8, "episodes per task in a GRPO group (G)")
    clip_eps: float = opt(0.2, "PPO clip range of the ratio (eps)")
    kl_coef: float = opt(0.01, "KL penalty to the frozen reference (beta; 0: no reference)")
    epochs: int = opt(1, "optimizer steps over each batch (PPO-style reuse)")
    adv_eps: float = opt(1e-4, "added to the group's reward std")
    save_every: int = opt(1, "checkpoint every N iterations (and after the last)")


# ------------------------------------------------------------------------------------------ the maths
def group_advantages(rewards: torch.Tensor, keys: Sequence[str], eps: float = 1e-4) -> torch.Tensor:
    """Rewards of episodes and their group keys -> advantages normalised within each key's group, wherever
    its members sit in the batch. A group whose rewards are all equal (or a group of one) gets 0."""
    if len(keys) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards but {len(keys)} group keys")
    r = rewards.float()
    adv = torch.zeros_like(r)
    members: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    for idx in members.values():
        g = r[idx]
        std = g.std(unbiased=False)
        if std > 0:  # all equal: no signal, not noise
            adv[idx] = (g - g.mean()) / (std + eps)
    return adv


def grpo_loss(
    new_lp: torch.Tensor,
    old_lp: torch.Tensor,
    ref_lp: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    kl_coef: float,
    n_tokens: int,
) -> tuple[torch.Tensor, dict]:
    """Per-token log-probs [B, T] (mask: planner tokens), per-sequence advantages [B] -> (loss, stats).
    The loss is a sum over this micro-batch's tokens divided by `n_tokens`, the whole batch's token count."""
    mask = mask.float()
    a = adv.unsqueeze(1)
    ratio = torch.exp(new_lp - old_lp)
    unclipped, clipped = ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a
    per_token = -torch.min(unclipped, clipped)
    kl = torch.zeros_like(new_lp)
    if ref_lp is not None and kl_coef > 0:
        d = ref_lp - new_lp
        kl = torch.exp(d) - d - 1
        per_token = per_token + kl_coef * kl
    loss = (per_token * mask).sum() / n_tokens
    with torch.no_grad():
        stats = {
            "clipped_tokens": float((((ratio - 1).abs() > clip_eps).float() * mask).sum()),
            "kl_sum": float((kl * mask).sum()),
            "tokens": float(mask.sum()),
            "ratio_sum": float((ratio * mask).sum()),
        }
    return loss, stats


# ------------------------------------------------------------------------------------------ one update
def train_batch(
    cfg: GRPOConfig, vlm: TransformersVLM, optimizer, rollouts: Sequence[Rollout], ref_model=None, role: str = "planner"
) -> dict:
    """One GRPO update from one batch of rollouts, on the samples of `role`, grouped by the rollouts' keys."""
    model = vlm.model
    adv = group_advantages(torch.tensor([r.reward for r in rollouts]), [r.group for r in rollouts], cfg.adv_eps)
    items = [(s, float(a)) for r, a in zip(rollouts, adv) for s in r.samples if s.role == role]
    if cfg.kl_coef == 0:
        items = [(s, a) for s, a in items if a != 0]  # zero advantage and no KL: zero gradient
    stats = {
        "loss": 0.0,
        "kl": 0.0,
        "clip_frac": 0.0,
        "planner_tokens": 0,
        "logprob_mismatch": 0.0,
        "samples": len(items),
        "grad_norm": 0.0,
    }
    if not items:
        return stats
    chunks = [items[i : i + cfg.micro_batch] for i in range(0, len(items), cfg.micro_batch)]
    n_tokens = sum(len(s.token_ids) for s, _ in items)
    # log-probs of the rollout policy (recomputed with this exact forward; compared with generate's own)
    # and of the reference, once per batch, without gradients
    old, ref = [], []
    model.eval()
    with torch.no_grad():
        for ch in chunks:
            samples = [s for s, _ in ch]
            lp, m = token_logprobs(vlm, samples, cfg.temperature)
            old.append(lp)
            for row, s in enumerate(samples):
                if s.logprobs:
                    got = lp[row][m[row]][: len(s.logprobs)]
                    want = torch.tensor(s.logprobs[: len(got)], dtype=got.dtype, device=got.device)
                    stats["logprob_mismatch"] = max(stats["logprob_mismatch"], float((got - want).abs().max()))
            if cfg.kl_coef > 0:
                ref.append(reference_logprobs(vlm, samples, cfg.temperature, ref_model))

    def loss_fn(k, ch):
        lp, m = token_logprobs(vlm, [s for s, _ in ch], cfg.temperature)
        a = torch.tensor([x for _, x in ch], device=lp.device)
        return grpo_loss(lp, old[k], ref[k] if ref else None, a, m, cfg.clip_eps, cfg.kl_coef, n_tokens)

    model.train()
    params = trainable_parameters(model)
    for _ in range(cfg.epochs):
        loss_sum, grad_norm, totals = accumulate(optimizer, params, chunks, cfg.max_grad_norm, loss_fn)
    model.eval()
    stats.update(
        loss=loss_sum,
        kl=totals["kl_sum"] / max(1, totals["tokens"]),
        clip_frac=totals["clipped_tokens"] / max(1, totals["tokens"]),
        planner_tokens=n_tokens,
        grad_norm=grad_norm,
    )
    return stats


# ------------------------------------------------------------------------------------------ the loop
def train(
    cfg: GRPOConfig, planner_vlm: TransformersVLM | None = None, executor_vlm=None, progress: bool = True
) -> list[dict]:
    """The whole stage-1 run: returns one record per iteration (also in out/metrics.jsonl and TensorBoard
    scalars under out/tb). Rollouts are written as `coda eval`-style trajectories under out/rollouts/iter_NNNN,
    which stage 2 (`coda train sft`) reads; the trained model goes to out/planner (out/policy for uitars)."""
    out = Path(cfg.out)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    vlm = planner_vlm or load_trainable(cfg.planner, cfg.device)
    if not isinstance(vlm, TransformersVLM):
        raise ValueError("GRPO trains the model's weights: --planner must be a local checkpoint directory")
    factory, role = agent_factory(cfg.agent)
    env = probe_env(cfg.env, cfg.max_steps)
    ids = list(cfg.tasks or env.tasks)
    unknown = [t for t in ids if t not in env.tasks]
    if unknown:
        raise ValueError(f"unknown tasks for {cfg.env}: {unknown}")
    agent = factory(cfg, vlm, env, executor_vlm)
    write_config(out, cfg)  # once the settings are known to work, not before
    optimizer, ref_model = prepare_model(
        vlm, cfg.lr, cfg.lora_r, cfg.lora_alpha, cfg.lora_targets, frozen_reference=cfg.kl_coef > 0
    )
    start = load_checkpoint(out, vlm.model, optimizer, rng) if cfg.resume else 0

    history: list[dict] = []
    envs = make_envs(env, min(cfg.num_envs, cfg.group_size * cfg.tasks_per_iteration), agent)
    log = RunLog(out, cfg.iterations, start, progress, unit="it")
    try:
        for it in range(start, cfg.iterations):
            batch = rng.sample(ids, min(cfg.tasks_per_iteration, len(ids)))
            t0 = time.monotonic()
            vlm.model.eval()
            rollouts = collect_groups(
                envs,
                agent,
                env.tasks,
                batch,
                cfg.group_size,
                seed=cfg.seed + it,
                out=out / "rollouts" / f"iter_{it:04d}",
            )
            t_roll = time.monotonic() - t0
            t1 = time.monotonic()
            stats = train_batch(cfg, vlm, optimizer, rollouts, ref_model, role)
            t_train = time.monotonic() - t1
            env_steps = sum(len(r.steps) for r in rollouts)
            gen_tokens = sum(len(s.token_ids) for r in rollouts for s in r.samples if s.role == role)
            by_app: dict[str, list[float]] = {}
            for r in rollouts:
                by_app.setdefault(r.app, []).append(r.reward)
            rec = {
                "iteration": it,
                "reward_mean": float(sum(r.reward for r in rollouts) / len(rollouts)),
                "success_rate": sum(r.success for r in rollouts) / len(rollouts),
                **{f"reward_mean/{a}": sum(v) / len(v) for a, v in by_app.items()},
                "env_steps_per_s": env_steps / t_roll,
                "planner_tokens_per_s": gen_tokens / t_roll,
                "train_tokens_per_s": stats["planner_tokens"] / t_train if t_train > 0 else 0.0,
                "rollout_s": t_roll,
                "train_s": t_train,
                **stats,
            }
            history.append(rec)
            if (it + 1) % cfg.save_every == 0 or it + 1 == cfg.iterations:
                save_checkpoint(out, cfg, vlm.model, optimizer, it, rng)
            log.log(it, rec, f"reward {rec['reward_mean']:.2f} kl {stats['kl']:.3g} clip {stats['clip_frac']:.2f}")
        if start < cfg.iterations:
            export_planner(vlm, out / role)
    finally:
        log.close()
        envs.close()
    return history


def summary(cfg: GRPOConfig, history: list[dict]) -> str:
    lines = [
        f"iteration {h['iteration']}: reward {h['reward_mean']:.3f} success {h['success_rate']:.3f} "
        f"kl {h['kl']:.4f} clip {h['clip_frac']:.3f} env steps/s {h['env_steps_per_s']:.2f} "
        f"planner tokens/s {h['planner_tokens_per_s']:.1f}"
        for h in history
    ]
    role = agent_factory(cfg.agent)[1]
    return "\n".join(
        lines
        + [
            f"trained model: {Path(cfg.out) / role}  (coda eval --agent {cfg.agent} "
            f"--{'planner' if role == 'planner' else 'executor'} that ...)"
        ]
    )


METHOD = Method(
    "grpo",
    "stage 1: decoupled GRPO on the planner (per app), or UI-TARS with --agent uitars",
    GRPOConfig,
    lambda cfg, progress: train(cfg, progress=progress),
    summary,
)
