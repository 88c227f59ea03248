"""Decoupled GRPO on the planner (CODA stage 1, "specialization"), top to bottom in one file.

Only the planner learns; the executor (UI-TARS) is a separate, frozen model. Each iteration:
  1. rollouts: G episodes of each of a few tasks over a vector env; the planner samples at temperature T.
  2. advantages, per group of one task:  A_i = (R_i - mean_j R_j) / (std_j R_j + eps),  0 when std = 0
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
TRL's GRPOTrainer and verl were considered. TRL's environment integrations (OpenEnv, Harbor) treat an env as
tools the trained model calls in text turns; verl's multi-turn agent loop runs on Ray with vLLM/SGLang
workers on GPUs. Here every planner turn goes through a second, frozen model (the executor) and a desktop
that returns a screenshot, and the whole loop must also run (and be tested) on CPU. The loop is small enough
to own, so the maths stays in this one file.
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from .models import SamplingParams, TransformersVLM
from .policy import PlannerSample
from .rollout import Rollout


@dataclass
class GRPOConfig:
    env: str = "coda/KAlgebra-v0"
    planner: str = ""                      # local checkpoint directory (the trainer needs the weights)
    executor: str | None = None            # directory or http(s) endpoint of the fixed executor
    tasks: list[str] | None = None         # default: the env's whole suite
    out: str = "runs/grpo"
    iterations: int = 10
    tasks_per_iteration: int = 4
    group_size: int = 8                    # G episodes per task
    num_envs: int = 4
    max_steps: int | None = None           # step budget instead of each task's own
    history_images: int = 2
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    executor_max_new_tokens: int = 128
    executor_tries: int = 3
    lr: float = 1e-6
    clip_eps: float = 0.2
    kl_coef: float = 0.01                  # beta; 0 turns the reference model off
    epochs: int = 1
    micro_batch: int = 4                   # planner samples per forward pass (gradient accumulation)
    max_grad_norm: float = 1.0
    lora_r: int = 16                       # 0 = full fine-tuning
    lora_alpha: int = 32
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    adv_eps: float = 1e-4
    save_every: int = 1
    seed: int = 0
    device: str | None = None


# ------------------------------------------------------------------------------------------ the maths
def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """Rewards of consecutive groups of `group_size` episodes -> group-normalised advantages."""
    r = rewards.view(-1, group_size).float()
    mean = r.mean(dim=1, keepdim=True)
    std = r.std(dim=1, keepdim=True, unbiased=False)
    adv = (r - mean) / (std + eps)
    adv = torch.where(std > 0, adv, torch.zeros_like(adv))        # all equal: no signal, not noise
    return adv.view(-1)


def grpo_loss(new_lp: torch.Tensor, old_lp: torch.Tensor, ref_lp: torch.Tensor | None, adv: torch.Tensor,
              mask: torch.Tensor, clip_eps: float, kl_coef: float, n_tokens: int) -> tuple[torch.Tensor, dict]:
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
        stats = {"clipped_tokens": float((((ratio - 1).abs() > clip_eps).float() * mask).sum()),
                 "kl_sum": float((kl * mask).sum()), "tokens": float(mask.sum()),
                 "ratio_sum": float((ratio * mask).sum())}
    return loss, stats


def token_logprobs(vlm: TransformersVLM, samples: Sequence[PlannerSample], temperature: float,
                   model=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each sample's own sampled tokens given its prompt: ([B, T], mask [B, T]) over the last T
    positions (left padding puts every completion at the end, so only those logits are computed)."""
    model = model or vlm.model
    inputs = vlm.build_inputs([s.conversation for s in samples], [s.token_ids for s in samples])
    comp_mask = inputs.pop("completion_mask")
    t = max(len(s.token_ids) for s in samples)
    logits = model(**inputs, logits_to_keep=t + 1).logits[:, :-1].float() / temperature   # predicts the last t
    if vlm.banned_token_ids:                      # the policy never writes vision placeholders (as in generate)
        logits[..., vlm.banned_token_ids] = float("-inf")
    targets = inputs["input_ids"][:, -t:]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = comp_mask[:, -t:]
    # outside the completion (prompt tail, padding) a log-prob may be -inf (a vision placeholder of the prompt
    # is banned as a *prediction*); zero it there so that ratios and KL stay finite where the mask drops them
    return lp.masked_fill(~mask, 0.0), mask


# ------------------------------------------------------------------------------------------ the loop
def _write_scalars(writer, it: int, scalars: dict) -> None:
    for k, v in scalars.items():
        if isinstance(v, (int, float)) and math.isfinite(v):
            writer.add_scalar(k, v, it)
    writer.flush()


def train_batch(cfg: GRPOConfig, vlm: TransformersVLM, optimizer, rollouts: Sequence[Rollout],
                ref_model=None) -> dict:
    """One GRPO update from one batch of rollouts (task-major groups of cfg.group_size)."""
    model = vlm.model
    rewards = torch.tensor([r.reward for r in rollouts])
    adv = group_advantages(rewards, cfg.group_size, cfg.adv_eps)
    items = [(s, float(a)) for r, a in zip(rollouts, adv) for s in r.samples]
    if cfg.kl_coef == 0:
        items = [(s, a) for s, a in items if a != 0]             # zero advantage and no KL: zero gradient
    stats = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "planner_tokens": 0, "logprob_mismatch": 0.0,
             "samples": len(items), "grad_norm": 0.0}
    if not items:
        return stats
    chunks = [items[i:i + cfg.micro_batch] for i in range(0, len(items), cfg.micro_batch)]
    n_tokens = sum(len(s.token_ids) for s, _ in items)
    lora = hasattr(model, "disable_adapter")
    # log-probs of the rollout policy (recomputed with this exact forward; compared with generate's own)
    # and of the reference, once per batch, without gradients
    old, ref = [], []
    model.eval()
    with torch.no_grad():
        for ch in chunks:
            lp, m = token_logprobs(vlm, [s for s, _ in ch], cfg.temperature)
            old.append(lp)
            for row, (s, _) in enumerate(ch):
                if s.logprobs:
                    got = lp[row][m[row]][: len(s.logprobs)]
                    want = torch.tensor(s.logprobs[: len(got)], dtype=got.dtype, device=got.device)
                    stats["logprob_mismatch"] = max(stats["logprob_mismatch"], float((got - want).abs().max()))
            if cfg.kl_coef > 0:
                if lora:
                    with model.disable_adapter():
                        ref.append(token_logprobs(vlm, [s for s, _ in ch], cfg.temperature)[0])
                else:
                    ref.append(token_logprobs(vlm, [s for s, _ in ch], cfg.temperature, model=ref_model)[0])
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(cfg.epochs):
        optimizer.zero_grad(set_to_none=True)
        totals = {"tokens": 0.0, "clipped_tokens": 0.0, "kl_sum": 0.0}
        loss_sum = 0.0
        for k, ch in enumerate(chunks):
            lp, m = token_logprobs(vlm, [s for s, _ in ch], cfg.temperature)
            a = torch.tensor([x for _, x in ch], device=lp.device)
            loss, st = grpo_loss(lp, old[k], ref[k] if ref else None, a, m, cfg.clip_eps, cfg.kl_coef, n_tokens)
            loss.backward()
            loss_sum += float(loss.detach())
            for key in totals:
                totals[key] += st[key]
        gn = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        optimizer.step()
    model.eval()
    stats.update(loss=loss_sum, kl=totals["kl_sum"] / max(1, totals["tokens"]),
                 clip_frac=totals["clipped_tokens"] / max(1, totals["tokens"]), planner_tokens=n_tokens,
                 grad_norm=float(gn))
    return stats


def prepare_model(vlm: TransformersVLM, lr: float, lora_r: int, lora_alpha: int, lora_targets: list[str],
                  frozen_reference: bool = False):
    """LoRA adapters (peft) on the language model's projections (lora_r > 0), or every weight trainable; with
    `frozen_reference` and full weights, a frozen copy to compute the KL against (LoRA needs none: the
    reference is the same model with its adapter switched off). Returns (AdamW optimizer, reference or None)."""
    import copy
    model = vlm.model
    ref_model = None
    if lora_r > 0:
        from peft import LoraConfig, get_peft_model
        if not hasattr(model, "disable_adapter"):
            model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0,
                                                     target_modules=lora_targets))
    else:
        if frozen_reference:
            ref_model = copy.deepcopy(model).eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
        for p in model.parameters():
            p.requires_grad_(True)
    vlm.model = model
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    return opt, ref_model


def export_planner(vlm: TransformersVLM, path: Path) -> Path:
    """A self-contained planner directory that `coda eval --planner` loads: LoRA adapters merged into a copy
    of the weights, with the tokenizer (chat template) and image processor beside them."""
    import copy
    model = vlm.model
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(path)
    vlm.tokenizer.save_pretrained(path)
    vlm.image_processor.save_pretrained(path)
    return path


def save_checkpoint(out: Path, cfg: GRPOConfig, vlm: TransformersVLM, optimizer, iteration: int,
                    rng: random.Random) -> None:
    """out/checkpoint/trainer_state.pt: the trainable weights (the LoRA adapter, or all of them), the optimizer
    and the RNGs, under the model's own parameter names, so resuming needs no format conversion."""
    ck, tmp = out / "checkpoint", out / "checkpoint.tmp"
    import shutil
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainable = {n: p.detach().cpu() for n, p in vlm.model.named_parameters() if p.requires_grad}
    torch.save({"iteration": iteration, "trainable": trainable, "optimizer": optimizer.state_dict(),
                "rng": rng.getstate(), "torch_rng": torch.get_rng_state()}, tmp / "trainer_state.pt")
    (tmp / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    shutil.rmtree(ck, ignore_errors=True)
    tmp.rename(ck)                                      # a crash mid-save leaves the previous checkpoint


def load_checkpoint(out: Path, vlm: TransformersVLM, optimizer, rng: random.Random) -> int:
    """Restore a checkpoint written by `save_checkpoint`; returns the next iteration (0 if none)."""
    ck = out / "checkpoint" / "trainer_state.pt"
    if not ck.exists():
        return 0
    state = torch.load(ck, weights_only=False)
    params = dict(vlm.model.named_parameters())
    wrong = [n for n in state["trainable"] if n not in params] or \
        [n for n, p in params.items() if p.requires_grad and n not in state["trainable"]]
    if wrong:
        raise ValueError(f"{ck} does not fit this planner (LoRA settings changed?): e.g. {wrong[:3]}")
    with torch.no_grad():
        for n, v in state["trainable"].items():
            params[n].copy_(v)
    optimizer.load_state_dict(state["optimizer"])
    rng.setstate(state["rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["iteration"]) + 1


def train(cfg: GRPOConfig, planner_vlm: TransformersVLM | None = None, executor_vlm=None,
          progress: bool = True, resume: bool = True) -> list[dict]:
    """The whole stage-1 run: returns one stats dict per iteration (also in out/metrics.jsonl and
    TensorBoard scalars under out/tb). Rollouts are written as `coda eval`-style trajectories under
    out/rollouts/iter_NNN, which stage 2 (`coda_agent.sft`) reads."""
    from torch.utils.tensorboard import SummaryWriter
    from tqdm import tqdm

    import gymnasium as gym

    from .executor import Executor
    from .models import load_model
    from .planner import Planner
    from .policy import CodaAgent
    from .rollout import collect_groups, make_vector_env

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    vlm = planner_vlm or TransformersVLM(cfg.planner, device=cfg.device)
    if not isinstance(vlm, TransformersVLM):
        raise ValueError("GRPO trains the planner's weights: --planner must be a local checkpoint directory")
    if executor_vlm is None:
        if not cfg.executor:
            raise ValueError("GRPO needs a fixed executor: --executor DIR|URL")
        local = not cfg.executor.startswith(("http://", "https://"))
        executor_vlm = load_model(cfg.executor, **({"device": cfg.device} if local else {}))
    if executor_vlm is vlm or getattr(executor_vlm, "model", None) is vlm.model:
        raise ValueError("the executor must be a separate model: the planner's weights change during training")
    optimizer, ref_model = prepare_model(vlm, cfg.lr, cfg.lora_r, cfg.lora_alpha, cfg.lora_targets,
                                         frozen_reference=cfg.kl_coef > 0)
    start = load_checkpoint(out, vlm, optimizer, rng) if resume else 0

    env_kwargs = {"max_steps": cfg.max_steps} if cfg.max_steps else {}
    probe = gym.make(cfg.env, **env_kwargs)
    base = probe.unwrapped
    tasks, app, screen = base.tasks, base.app_name, (base.width, base.height)
    probe.close()
    ids = list(cfg.tasks or tasks)
    unknown = [t for t in ids if t not in tasks]
    if unknown:
        raise ValueError(f"unknown tasks for {cfg.env}: {unknown}")
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                            logprobs=True)
    planner = Planner(vlm, app, screen=screen, history_images=cfg.history_images, params=params)
    executor = Executor(executor_vlm, screen=screen, tries=cfg.executor_tries,
                        params=SamplingParams(max_new_tokens=cfg.executor_max_new_tokens, temperature=1.0))
    agent = CodaAgent(planner, executor)
    writer = SummaryWriter(str(out / "tb"))
    history: list[dict] = []
    envs = make_vector_env(cfg.env, min(cfg.num_envs, cfg.group_size * cfg.tasks_per_iteration), **env_kwargs)
    bar = tqdm(total=cfg.iterations, initial=start, disable=not progress, unit="it", dynamic_ncols=True)
    try:
        for it in range(start, cfg.iterations):
            batch = rng.sample(ids, min(cfg.tasks_per_iteration, len(ids)))
            t0 = time.monotonic()
            vlm.model.eval()
            rollouts = collect_groups(envs, agent, tasks, batch, cfg.group_size, seed=cfg.seed + it,
                                      out=out / "rollouts" / f"iter_{it:04d}")
            t_roll = time.monotonic() - t0
            t1 = time.monotonic()
            stats = train_batch(cfg, vlm, optimizer, rollouts, ref_model)
            t_train = time.monotonic() - t1
            env_steps = sum(len(r.steps) for r in rollouts)
            gen_tokens = sum(len(s.token_ids) for r in rollouts for s in r.samples)
            by_app: dict[str, list[float]] = {}
            for r in rollouts:
                by_app.setdefault(r.app, []).append(r.reward)
            scalars = {"iteration": it, "reward_mean": float(sum(r.reward for r in rollouts) / len(rollouts)),
                       "success_rate": sum(r.success for r in rollouts) / len(rollouts),
                       **{f"reward_mean/{a}": sum(v) / len(v) for a, v in by_app.items()},
                       "env_steps_per_s": env_steps / t_roll, "planner_tokens_per_s": gen_tokens / t_roll,
                       "train_tokens_per_s": stats["planner_tokens"] / t_train if t_train > 0 else 0.0,
                       "rollout_s": t_roll, "train_s": t_train, **stats}
            history.append(scalars)
            _write_scalars(writer, it, scalars)
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(scalars) + "\n")
            if (it + 1) % cfg.save_every == 0 or it + 1 == cfg.iterations:
                save_checkpoint(out, cfg, vlm, optimizer, it, rng)
        if start < cfg.iterations:
            export_planner(vlm, out / "planner")
            bar.update(1)
            bar.set_postfix_str(f"reward {scalars['reward_mean']:.2f} kl {stats['kl']:.3g} "
                                f"clip {stats['clip_frac']:.2f}")
    finally:
        bar.close()
        writer.close()
        envs.close()
    return history
