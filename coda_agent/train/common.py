"""What every training method shares, so that a method's own file holds only its maths and its loop.

- configs: `TrainConfig` (the trained model, the run folder, optimizer and LoRA settings) and `RolloutConfig`
  (the env, the agent and its sampling), dataclasses whose fields carry their help text (`opt`), from which
  `coda train METHOD` makes one flag per field;
- the model: `load_trainable`, `prepare_model` (LoRA via peft, or every weight, and the frozen reference),
  `token_logprobs` (the log-prob of each sampled token, exactly as generation scored it), `reference_logprobs`,
  `export_planner` (a self-contained checkpoint that `coda eval` loads);
- the update: `accumulate` (one optimizer step over micro-batches; GRPO and SFT both step through it);
- the run: `save_checkpoint`/`load_checkpoint` (trainable weights by parameter name, optimizer, RNGs; written
  atomically), `RunLog` (metrics.jsonl, TensorBoard scalars and the progress bar, one record per iteration);
- rollouts: `probe_env`/`make_envs` (the vector env of a config) and `AGENT_FACTORIES` (which agent a method
  trains and the role of the samples it learns from: CODA's planner, or UI-TARS end to end).
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from tqdm import tqdm

from ..models import SamplingParams, TransformersVLM
from ..types import Role, Sample


# ------------------------------------------------------------------------------------------ methods
@dataclass(frozen=True)
class Method:
    """A training method as `coda train` sees it: `coda train NAME` builds `config` from flags (one per field)
    or --config FILE.json and calls `run(config, progress)`, which returns one record per iteration/epoch;
    `summary(config, records)` is what is printed at the end."""

    name: str
    help: str
    config: type
    run: Callable[[Any, bool], list[dict]]
    summary: Callable[[Any, list[dict]], str] | None = None


def opt(default: Any, help: str, *aliases: str) -> Any:
    """A config field with its help text (and extra flag names) for `coda train`'s flags."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, "aliases": aliases})
    return field(default=default, metadata={"help": help, "aliases": aliases})


@dataclass
class TrainConfig:
    """What every method's config has."""

    planner: str = opt(
        "",
        "checkpoint directory of the model that is trained (a local directory: its weights "
        "change); with --agent uitars, the UI-TARS checkpoint",
    )
    out: str = opt("runs/train", "run folder: config.json, metrics.jsonl, tb/, checkpoint/, the trained model")
    lr: float = opt(1e-6, "AdamW learning rate")
    micro_batch: int = opt(4, "samples per forward pass (gradient accumulation over the rest)")
    max_grad_norm: float = opt(1.0, "gradient clipping norm")
    lora_r: int = opt(16, "LoRA rank; 0 = full fine-tuning")
    lora_alpha: int = opt(32, "LoRA alpha")
    lora_targets: list[str] = opt(["q_proj", "k_proj", "v_proj", "o_proj"], "modules that get LoRA adapters")
    seed: int = opt(0, "seed of the task order, sampling and shuffles")
    device: str | None = opt(None, "torch device (default: cuda when available, else cpu)")
    resume: bool = opt(True, "continue from OUT/checkpoint when there is one (--no-resume: start afresh)")


@dataclass
class RolloutConfig(TrainConfig):
    """What a method that collects its own episodes adds: the env, the agent, sampling."""

    env: str = opt("coda/KAlgebra-v0", "env id")
    agent: str = opt(
        "coda", "what is trained: coda (CODA's planner; the executor stays fixed) | uitars (UI-TARS end to end)"
    )
    executor: str | None = opt(
        None, "fixed executor of --agent coda: UI-TARS-1.5 checkpoint directory or http(s):// endpoint"
    )
    tasks: list[str] | None = opt(None, "task ids (default: the env's whole suite)")
    num_envs: int = opt(4, "envs run in parallel (a vector env)")
    max_steps: int | None = opt(None, "step budget per episode instead of each task's own")
    history_images: int = opt(2, "screenshots of earlier steps the model sees")
    temperature: float = opt(1.0, "sampling temperature (the log-probs are scaled by it too)")
    top_p: float = opt(1.0, "nucleus sampling")
    max_new_tokens: int = opt(256, "tokens per answer of the trained model")
    executor_max_new_tokens: int = opt(128, "tokens per answer of the executor")
    executor_tries: int = opt(3, "executor attempts when its answer does not parse")


def write_config(out: Path, cfg) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1))


# ------------------------------------------------------------------------------------------ the model
def load_trainable(path: str, device: str | None = None) -> TransformersVLM:
    if not path:
        raise ValueError("training needs --planner DIR (a local checkpoint: its weights are trained)")
    if path.startswith(("http://", "https://")):
        raise ValueError(f"--planner {path}: an endpoint cannot be trained; give a local checkpoint directory")
    return TransformersVLM(path, device=device)


def token_logprobs(
    vlm: TransformersVLM, samples: Sequence[Sample], temperature: float, model=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each sample's own sampled tokens given its prompt: ([B, T], mask [B, T]) over the last T
    positions (left padding puts every completion at the end, so only those logits are computed)."""
    model = model or vlm.model
    inputs = vlm.build_inputs([s.conversation for s in samples], [s.token_ids for s in samples])
    comp_mask = inputs.pop("completion_mask")
    t = max(len(s.token_ids) for s in samples)
    logits = model(**inputs, logits_to_keep=t + 1).logits[:, :-1].float() / temperature  # predicts the last t
    if vlm.banned_token_ids:  # the policy never writes vision placeholders (as in generate)
        logits[..., vlm.banned_token_ids] = float("-inf")
    targets = inputs["input_ids"][:, -t:]
    lp = torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    mask = comp_mask[:, -t:]
    # outside the completion (prompt tail, padding) a log-prob may be -inf (a vision placeholder of the prompt
    # is banned as a *prediction*); zero it there so that ratios and KL stay finite where the mask drops them
    return lp.masked_fill(~mask, 0.0), mask


def reference_logprobs(
    vlm: TransformersVLM, samples: Sequence[Sample], temperature: float, ref_model=None
) -> torch.Tensor:
    """`token_logprobs` under the frozen reference that `prepare_model` set up: the same model with its LoRA
    adapter switched off, or the frozen copy of full weights."""
    if ref_model is None:
        if not hasattr(vlm.model, "disable_adapter"):
            raise ValueError("no reference model: prepare_model(frozen_reference=True) makes one for full weights")
        with vlm.model.disable_adapter():
            return token_logprobs(vlm, samples, temperature)[0]
    return token_logprobs(vlm, samples, temperature, model=ref_model)[0]


def prepare_model(
    vlm: TransformersVLM,
    lr: float,
    lora_r: int,
    lora_alpha: int,
    lora_targets: list[str],
    frozen_reference: bool = False,
):
    """LoRA adapters (peft) on the language model's projections (lora_r > 0), or every weight trainable; with
    `frozen_reference` and full weights, a frozen copy to compute the KL against (LoRA needs none: the
    reference is the same model with its adapter switched off). Returns (AdamW optimizer, reference or None)."""
    model = vlm.model
    ref_model = None
    if lora_r > 0:
        from peft import LoraConfig, get_peft_model

        if not hasattr(model, "disable_adapter"):
            model = get_peft_model(
                model, LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=lora_targets)
            )
    else:
        if frozen_reference:
            ref_model = copy.deepcopy(model).eval()
            for p in ref_model.parameters():
                p.requires_grad_(False)
        for p in model.parameters():
            p.requires_grad_(True)
    vlm.model = model
    opt_ = torch.optim.AdamW(trainable_parameters(model), lr=lr, weight_decay=0.0)
    return opt_, ref_model


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def export_planner(vlm: TransformersVLM, path: Path) -> Path:
    """A self-contained checkpoint directory that `coda eval --planner` (or --executor) loads: LoRA adapters
    merged into a copy of the weights, with the tokenizer (chat template) and image processor beside them."""
    model = vlm.model
    if hasattr(model, "merge_and_unload"):
        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(path)
    vlm.tokenizer.save_pretrained(path)
    vlm.image_processor.save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------ the update
def accumulate(
    optimizer,
    params: Sequence[torch.nn.Parameter],
    chunks: Sequence,
    max_grad_norm: float,
    loss_fn: Callable[[int, Any], tuple[torch.Tensor, dict]],
) -> tuple[float, float, dict]:
    """One optimizer step over micro-batches: `loss_fn(k, chunks[k])` -> (loss, stats), each loss already
    divided by the whole batch's size, so the summed gradients are exactly the full batch's. Clips the
    gradient norm, steps; returns (summed loss, gradient norm before clipping, summed stats)."""
    optimizer.zero_grad(set_to_none=True)
    total, sums = 0.0, {}
    for k, chunk in enumerate(chunks):
        loss, stats = loss_fn(k, chunk)
        loss.backward()
        total += float(loss.detach())
        for key, v in stats.items():
            sums[key] = sums.get(key, 0.0) + v
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return total, float(grad_norm), sums


# ------------------------------------------------------------------------------------------ the run
def save_checkpoint(out: Path, cfg, model, optimizer, step: int, rng: random.Random) -> None:
    """out/checkpoint/trainer_state.pt: the trainable weights (the LoRA adapter, or all of them) under the
    model's own parameter names, the optimizer and the RNGs after `step`. Written to checkpoint.tmp and renamed,
    so a crash mid-save leaves the previous checkpoint whole."""
    ck, tmp = out / "checkpoint", out / "checkpoint.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainable = {n: p.detach().cpu() for n, p in model.named_parameters() if p.requires_grad}
    torch.save(
        {
            "step": step,
            "trainable": trainable,
            "optimizer": optimizer.state_dict(),
            "rng": rng.getstate(),
            "torch_rng": torch.get_rng_state(),
        },
        tmp / "trainer_state.pt",
    )
    (tmp / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    old = out / "checkpoint.old"
    shutil.rmtree(old, ignore_errors=True)
    if ck.exists():
        ck.rename(old)
    tmp.rename(ck)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(out: Path, model, optimizer, rng: random.Random) -> int:
    """Restore what `save_checkpoint` wrote; returns the next step (0 when there is no checkpoint). A crash
    between the two renames of a save leaves checkpoint.old, which is used then."""
    ck = out / "checkpoint" / "trainer_state.pt"
    if not ck.exists() and (out / "checkpoint.old" / "trainer_state.pt").exists():
        ck = out / "checkpoint.old" / "trainer_state.pt"
    if not ck.exists():
        return 0
    state = torch.load(ck, weights_only=False)
    params = dict(model.named_parameters())
    wrong = [n for n in state["trainable"] if n not in params] or [
        n for n, p in params.items() if p.requires_grad and n not in state["trainable"]
    ]
    if wrong:
        raise ValueError(
            f"{ck} does not fit this model (LoRA settings changed?): e.g. {wrong[:3]}; use --no-resume or another --out"
        )
    with torch.no_grad():
        for n, v in state["trainable"].items():
            params[n].copy_(v)
    optimizer.load_state_dict(state["optimizer"])
    rng.setstate(state["rng"])
    torch.set_rng_state(state["torch_rng"])
    return int(state["step"]) + 1


class RunLog:
    """One record per iteration (or epoch): appended to out/metrics.jsonl, its numbers written as TensorBoard
    scalars under out/tb, and the progress bar advanced by one. A run that starts at step 0 starts a fresh
    metrics.jsonl; a resumed one appends."""

    def __init__(self, out: Path, total: int, start: int = 0, progress: bool = True, unit: str = "it"):
        from torch.utils.tensorboard import SummaryWriter

        self.path = out / "metrics.jsonl"
        if start == 0:
            self.path.unlink(missing_ok=True)
        self.writer = SummaryWriter(str(out / "tb"))
        self.bar = tqdm(total=total, initial=start, disable=not progress, unit=unit, dynamic_ncols=True)

    def log(self, step: int, record: dict, postfix: str = "", advance: bool = True) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        for k, v in record.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()
        if advance:
            self.bar.update(1)
        if postfix:
            self.bar.set_postfix_str(postfix)

    def close(self) -> None:
        self.bar.close()
        self.writer.close()


# ------------------------------------------------------------------------------------------ rollouts
@dataclass
class EnvInfo:
    """What a trainer needs to know of an env id before it builds the vector env and the agent."""

    env_id: str
    kwargs: dict
    tasks: dict
    app: str
    screen: tuple[int, int]


def probe_env(env_id: str, max_steps: int | None = None) -> EnvInfo:
    """Make one env of `env_id` (no reset: no desktop starts) to read its tasks, app and screen size."""
    import gymnasium as gym

    kwargs = {"max_steps": max_steps} if max_steps else {}
    env = gym.make(env_id, **kwargs)
    try:
        base = env.unwrapped
        return EnvInfo(env_id, kwargs, dict(base.tasks), base.app_name, (base.width, base.height))
    finally:
        env.close()


def make_envs(info: EnvInfo, num_envs: int, agent=None):
    """The vector env of `info`; with the a11y_tree observation when `agent` reads it (the a11y executor)."""
    from ..rollout import make_vector_env

    kwargs = dict(info.kwargs)
    if getattr(agent, "wants_a11y_tree", False):
        kwargs["a11y_tree"] = True
    return make_vector_env(info.env_id, num_envs, **kwargs)


def rollout_params(cfg: RolloutConfig) -> SamplingParams:
    """Sampling of the trained model: with log-probs, which the trainer checks against its own."""
    return SamplingParams(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, logprobs=True
    )


def coda_agent(cfg: RolloutConfig, vlm: TransformersVLM, env: EnvInfo, executor=None):
    """CODA with `vlm` as the planner and a fixed executor (`executor`: a model or executor object, else
    cfg.executor: a directory, an endpoint or `a11y`), built by the agents' one factory (policy.make_agent)."""
    from ..policy import make_agent

    executor = executor if executor is not None else cfg.executor
    if not executor:
        raise ValueError("--agent coda needs a fixed executor: --executor DIR|URL|a11y")
    if executor is vlm or getattr(executor, "model", None) is vlm.model:
        raise ValueError("the executor must be a separate model: the planner's weights change during training")
    return make_agent(
        "coda",
        env.app,
        env.screen,
        planner=vlm,
        executor=executor,
        history_images=cfg.history_images,
        model_options={"device": cfg.device},
        planner_params=rollout_params(cfg),
        executor_tries=cfg.executor_tries,
        executor_params=SamplingParams(max_new_tokens=cfg.executor_max_new_tokens, temperature=1.0),
    )


def uitars_agent(cfg: RolloutConfig, vlm: TransformersVLM, env: EnvInfo, executor=None):
    """UI-TARS end to end, `vlm` being UI-TARS: the model that acts is the one trained."""
    from ..policy import make_agent

    if executor is not None or cfg.executor:
        raise ValueError("--agent uitars has no executor: UI-TARS acts alone (leave --executor out)")
    return make_agent(
        "uitars",
        env.app,
        env.screen,
        executor=vlm,
        history_images=cfg.history_images,
        planner_params=rollout_params(cfg),
        executor_tries=cfg.executor_tries,
    )


AgentFactory = Callable[[RolloutConfig, TransformersVLM, EnvInfo, Any], Any]

# agent name -> (factory(cfg, trained vlm, env info, executor model or None) -> Agent, role of its samples
# that the method trains on)
AGENT_FACTORIES: dict[str, tuple[AgentFactory, Role]] = {
    "coda": (coda_agent, "planner"),
    "uitars": (uitars_agent, "policy"),
}


def agent_factory(name: str) -> tuple[AgentFactory, Role]:
    if name not in AGENT_FACTORIES:
        raise ValueError(f"unknown --agent {name!r}; trainable agents: {', '.join(AGENT_FACTORIES)}")
    return AGENT_FACTORIES[name]
