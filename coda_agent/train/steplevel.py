"""The public base of the step-level methods: single-turn GRPO over state datasets on Hugging Face TRL's
GRPOTrainer. CODA's stage 1 (coda.py), Co-EPG (coepg.py) and PRO-CUA (procua.py) are each a reward function and
the differences of their loop; everything else is here, public and documented:

- `StepLevelConfig`: the settings they share (the planner, state datasets, the executor, TRL's GRPO settings,
  vLLM, the loop's live runs); each method's config subclasses it and adds or re-defaults its own.
- the executor: `make_executor` builds the fixed executor once per run (a11y, a UI-TARS checkpoint or an
  endpoint); `execute_plans` maps sampled plans to env actions through the `coda` agent's own path.
- the trainer: `grpo_args` (our settings -> trl.GRPOConfig, in one place), `build_trainer(cfg, out,
  reward_funcs)` (a trl.GRPOTrainer over the states with the method's reward functions), `run_trainer`
  (held-out reward before and after, resume, export) and `completion_rows` (what a TRL reward function gets,
  as one row per completion).
- the states: `ImageTextProcessor` (Qwen2.5-VL's processor without its video half: `Qwen2_5_VLProcessor` needs
  torchvision, which does not load beside this project's CPU torch), `load_states`, `PromptTransform` (each
  state as TRL's multimodal prompt, applied on the fly), `trl_messages`.
- the loop: `Rounds` (OUT/round_NN folders, done markers, resume, one metrics record per round), `live_eval`
  (the planner + the executor over the tasks, live: a `coda eval` run), `oracle_state_paths`.
- the run: `RunLogCallback` (TRL's logs -> OUT/metrics.jsonl and TensorBoard), `last_checkpoint`,
  `export_planner` (a self-contained checkpoint `coda eval --planner` loads, LoRA merged), `config_flags` and
  `launch_command` (a run under `accelerate launch`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from transformers import TrainerCallback
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
from transformers.processing_utils import ProcessorMixin

from ..executor import PlanExecutor, plans_to_actions
from ..models import VISION_TOKENS, Conversation, to_pil
from ..planner import PlanParseError, parse_plan
from .common import TrainConfig, opt, write_config

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------ settings


@dataclass
class StepLevelConfig(TrainConfig):
    """What every step-level method's config has (each field a flag whose help shows its default): the trained
    planner and its state datasets, the fixed executor, TRL's GRPO settings, vLLM, and the loop's live runs."""

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


# ------------------------------------------------------------------------------------------ the processor
class ImageTextProcessor(Qwen2_5_VLProcessor):
    """Qwen2.5-VL's processor for images and text only: the tokenizer and the image processor of a checkpoint
    (as `TransformersVLM` loads them), no video processor, so no torchvision."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> "ImageTextProcessor":
        """The processor of a local checkpoint directory (nothing is downloaded)."""
        from transformers import AutoImageProcessor, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        tok.padding_side = "left"
        if not tok.chat_template:
            for f in ("chat_template.jinja", "chat_template.json"):
                if (Path(path) / f).exists():
                    t = (Path(path) / f).read_text()
                    tok.chat_template = json.loads(t)["chat_template"] if f.endswith("json") else t
                    break
            else:
                raise ValueError(f"{path}: the checkpoint has no chat template")
        ip = AutoImageProcessor.from_pretrained(path, local_files_only=True)
        return cls(ip, tok, chat_template=tok.chat_template)

    def vision_token_ids(self) -> list[int]:
        """Vision placeholders: the processor's to place, never the model's to write."""
        vocab = self.tokenizer.get_vocab()
        return [vocab[t] for t in VISION_TOKENS if t in vocab]


# ------------------------------------------------------------------------------------------ state datasets
def load_states(paths: Sequence[str | Path], app: str | None = None):
    """Load and concatenate state datasets (`datasets.save_to_disk` folders). Every dataset must hold states of
    one app, `app` when given. Returns (dataset, app). Errors are ValueErrors of one line."""
    from datasets import concatenate_datasets

    from ..states import load_checked

    if not paths:
        raise ValueError("no state dataset: give --data DIR (made by `coda data states ...`)")
    parts = []
    apps: dict[str, str] = {}
    for p in map(Path, paths):
        ds = load_checked(p)
        for a in set(ds.unique("app")):
            apps.setdefault(a, str(p))
        parts.append(ds)
    if app is not None and set(apps) != {app}:
        other = sorted(set(apps) - {app})
        raise ValueError(
            f"state dataset {apps[other[0]]} holds states of {', '.join(other)}, not {app}: CODA's "
            "stage 1 trains one planner per app"
        )
    if len(apps) > 1:
        raise ValueError(
            f"the state datasets mix apps ({', '.join(sorted(apps))}): CODA's stage 1 trains one "
            "planner per app; give the datasets of one app (or --app)"
        )
    return (parts[0] if len(parts) == 1 else concatenate_datasets(parts)), next(iter(apps))


def _strip_vision(text: str) -> str:
    for t in VISION_TOKENS:
        text = text.replace(t, "")
    return text


def trl_messages(conversation: Conversation) -> tuple[list[dict], list]:
    """A live conversation (coda_agent.models' shape: images as arrays or PIL in the content) -> TRL's prompt
    (every content a list of parts, images as `{"type": "image"}` placeholders) and the images in order, as
    PIL. Text parts lose vision tokens, as `TransformersVLM` strips them."""
    msgs, images = [], []
    for m in conversation:
        content = m["content"]
        parts: list[dict[str, Any]] = []
        for p in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            if p["type"] == "image":
                images.append(to_pil(p["image"]))
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": _strip_vision(p["text"])})
        msgs.append({"role": m["role"], "content": parts})
    return msgs, images


def planner_conversation(record: dict, history_images: int = 2) -> Conversation:
    """The planner's conversation at a stored state, exactly as the live agent built it (coda_agent.states)."""
    from ..states import planner_conversation as rebuild

    return rebuild(record, history_images=history_images)


class PromptTransform:
    """`Dataset.with_transform` hook: each state gains `prompt` and `images` (TRL's multimodal prompt: the
    screenshots at full resolution, the current one last, which the executor then sees too) and keeps its other
    columns for the reward."""

    def __init__(self, history_images: int = 2, rebuild=None):
        self.history_images = history_images
        self.rebuild = rebuild or planner_conversation

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        n = len(next(iter(batch.values())))
        prompts, images = [], []
        for i in range(n):
            record = {k: v[i] for k, v in batch.items()}
            msgs, imgs = trl_messages(self.rebuild(record, history_images=self.history_images))
            prompts.append(msgs)
            images.append(imgs)
        out = dict(batch)
        out["prompt"], out["images"] = prompts, images
        return out


# ------------------------------------------------------------------------------------------ logging
class RunLogCallback(TrainerCallback):
    """TRL's log records (every `logging_steps`) appended to OUT/metrics.jsonl, their numbers as TensorBoard
    scalars under OUT/tb, on the main process only. `extra` is merged into every record (e.g. the round)."""

    def __init__(self, out: Path, extra: dict | None = None):
        self.out, self.extra = Path(out), dict(extra or {})
        self.writer = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, **self.extra, **{k: _plain(v) for k, v in logs.items()}}
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tb"))
        for k, v in record.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "step":
                self.writer.add_scalar(k, v, state.global_step)
        self.writer.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _plain(v):
    if hasattr(v, "item"):
        v = v.item()
    return v


# ------------------------------------------------------------------------------------------ checkpoints
_CKPT = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(folder: Path) -> Path | None:
    """The newest complete `checkpoint-N` folder the Trainer wrote under `folder` (one with trainer_state.json;
    a save cut short has none), or None."""
    if not folder.is_dir():
        return None
    found = [
        (int(m.group(1)), d)
        for d in folder.iterdir()
        if (m := _CKPT.match(d.name)) and d.is_dir() and (d / "trainer_state.json").exists()
    ]
    return max(found)[1] if found else None


# ------------------------------------------------------------------------------------------ export
def export_planner(trainer, base: str | Path | None, processor: ImageTextProcessor, out: Path) -> Path:
    """Write the trained planner to `out` as a self-contained checkpoint `coda eval --planner` loads: with LoRA,
    the adapter (gathered by `trainer.save_model`, which handles ZeRO-3 and FSDP; kept in OUT/adapter, peft's
    format) merged into the base weights;
    with full fine-tuning, the weights; plus the tokenizer (chat template) and the image processor. Every
    process must call it (the gather is collective); the main process writes."""
    out = Path(out)
    tmp = out.parent / (out.name + ".tmp")
    adapter = out.parent / "adapter"
    is_peft = hasattr(trainer.model, "peft_config")
    trainer.save_model(str(adapter if is_peft else tmp))
    if trainer.accelerator.is_main_process:
        if is_peft:
            import torch
            from peft import PeftModel

            if base is not None:
                from transformers import AutoModelForImageTextToText

                model = AutoModelForImageTextToText.from_pretrained(
                    str(base), dtype=torch.float32, local_files_only=True
                )
            else:  # a model built in memory (benchmarks): merge a copy of it
                import copy

                model = copy.deepcopy(trainer.accelerator.unwrap_model(trainer.model)).get_base_model()
                _drop_lora(model)
            merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
            shutil.rmtree(tmp, ignore_errors=True)
            merged.save_pretrained(tmp)
        processor.tokenizer.save_pretrained(tmp)
        processor.image_processor.save_pretrained(tmp)
        for junk in ("processor_config.json", "training_args.bin"):
            (tmp / junk).unlink(missing_ok=True)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    trainer.accelerator.wait_for_everyone()
    return out


def _drop_lora(model) -> None:
    """Replace peft's LoRA layers by their base layers in place (a deep copy of a peft model's base)."""
    from peft.tuners.lora import LoraLayer

    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, LoraLayer):
                setattr(module, child_name, child.get_base_layer())


# ------------------------------------------------------------------------------------------ the executor
def make_executor(cfg: StepLevelConfig, app: str, screen: tuple[int, int] = (1280, 800)):
    """The fixed executor of cfg.executor, built by the agents' own factory (policy.make_executor): `a11y`, a
    local UI-TARS directory, or an endpoint (asked to answer now, so that a wrong address fails before any
    training)."""
    from ..models import ModelError, OpenAIVLM, SamplingParams
    from ..policy import make_executor as agents_executor

    spec = cfg.executor
    if not spec:
        raise ValueError("training needs --executor a11y|DIR|URL (the fixed executor)")
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


def execute_plans(
    executor: PlanExecutor, items: Sequence[tuple[str, str, Any]], stats: dict[str, int] | None = None
) -> list[str | None]:
    """Sampled planner answers -> env actions, batched, through the `coda` agent's own path from a plan to an
    action (coda_agent.executor.plans_to_actions): the answer is parsed as the agent parses it (Thought /
    Action; DONE, FAIL, WAIT and ANS are their own actions), every other step goes to the executor (UI-TARS
    from a directory or an endpoint, or the a11y executor) in one batched call. items: (instruction, the
    planner's answer text, observation: the env's observation dict or its screenshot). None where the answer
    or the executor's output did not parse. `stats` (when given) accumulates counts: plans, terminal,
    plan_parse_errors, executor_parse_errors; each batch's counts are also logged."""
    counts = {"plans": len(items), "terminal": 0, "plan_parse_errors": 0, "executor_parse_errors": 0}
    parsed = []
    for instruction, text, obs in items:
        try:
            plan = parse_plan(text)
        except PlanParseError:
            plan = None
            counts["plan_parse_errors"] += 1
        else:
            counts["terminal"] += bool(plan.terminal)
        parsed.append((instruction, plan, obs))
    results = plans_to_actions(executor, parsed)
    actions = []
    for (_, plan, _), res in zip(parsed, results):
        if plan is not None and res.action is None:
            counts["executor_parse_errors"] += 1
        actions.append(res.action)
    if stats is not None:
        for k, v in counts.items():
            stats[k] = stats.get(k, 0) + v
    log.info(
        "execute_plans: %(plans)d plans, %(terminal)d terminal, %(plan_parse_errors)d planner parse errors, "
        "%(executor_parse_errors)d executor parse errors",
        counts,
    )
    return actions


# ------------------------------------------------------------------------------------------ the trainer
def completion_rows(completions, columns: dict) -> tuple[list[str], list[dict]]:
    """What TRL hands a reward function -> (each completion's text, each completion's state row: the dataset's
    columns, one value per completion)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    rows = [
        {k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(texts)} for i in range(len(texts))
    ]
    return texts, rows


def world_size() -> int:
    from accelerate import PartialState

    return PartialState().num_processes


def checkpointing_field() -> str:
    """transformers renamed gradient_checkpointing to activation_checkpointing (5.2x); TRL 1.16 runs on both."""
    from trl import GRPOConfig

    return (
        "activation_checkpointing"
        if "activation_checkpointing" in {f.name for f in fields(GRPOConfig)}
        else "gradient_checkpointing"
    )


def grpo_args(cfg: StepLevelConfig, out: Path, processor, has_eval: bool, progress: bool = True):
    """trl.GRPOConfig from our settings (the mapping, in one place)."""
    import torch
    from trl import GRPOConfig

    world = world_size()
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
    checkpointing = checkpointing_field()
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
    cfg: StepLevelConfig,
    out: Path,
    reward_funcs: Sequence[Callable],
    model=None,
    processor=None,
    train_states=None,
    eval_states=None,
    progress: bool = True,
    extra_log: dict | None = None,
):
    """The trl.GRPOTrainer of a run (not started): the planner (cfg.planner, or `model`: a model object), the
    states (cfg.data, or `train_states`; held-out: cfg.eval_data or `eval_states`), the method's reward functions
    (TRL sums them; each is called with the completions and every dataset column, `completion_rows`), LoRA
    (cfg.lora_r > 0) or full weights, our metrics callback."""
    from trl import GRPOTrainer

    if model is None:
        if not cfg.planner:
            raise ValueError("training needs --planner DIR (a local checkpoint: its weights are trained)")
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
    if not reward_funcs:
        raise ValueError("a step-level method gives its reward functions")
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
        reward_funcs=list(reward_funcs),
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


def run_trainer(
    trainer, cfg: StepLevelConfig, out: Path, base: str | None = None, extra_log: dict | None = None
) -> dict:
    """Held-out reward before (with --eval-data), training (resumed from the newest checkpoint unless
    --no-resume), held-out reward after, and the planner exported to OUT/planner (merged into `base`, the
    planner's checkpoint directory, or into a copy of the in-memory model when None). Returns a summary
    record, also the last line of OUT/metrics.jsonl."""
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
    summary.update(throughput(trainer))
    export_planner(trainer, base, trainer.processing_class, out / "planner")
    summary["planner"] = str(out / "planner")
    if trainer.accelerator.is_main_process:
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"summary": True, **(extra_log or {}), **summary}) + "\n")
    return summary


def throughput(trainer) -> dict:
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


# ------------------------------------------------------------------------------------------ the loop
def live_eval(
    cfg: StepLevelConfig,
    planner: str,
    executor,
    out: Path,
    progress: bool,
    agent: str = "coda",
    config: dict | None = None,
) -> dict:
    """A policy live over cfg.env's tasks: a `coda eval` run (resumable) -> its results (`success_rate` reads
    the overall figure). `agent` "coda": the planner + the run's executor; "uitars": UI-TARS end to end
    (`executor` is then its checkpoint or endpoint, and `planner` is not used). `config` is recorded with the
    run (default: the planner and the executor)."""
    from ..eval import run_eval
    from ..models import SamplingParams
    from ..policy import make_agent
    from .common import probe_env

    env = probe_env(cfg.env, cfg.episode_steps)
    policy = make_agent(
        agent,
        env.app,
        env.screen,
        planner=planner,
        executor=executor,
        history_images=cfg.history_images,
        seed=cfg.seed,
        model_options={"device": cfg.device} if cfg.device else {},
        planner_params=SamplingParams(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.live_temperature, top_p=cfg.top_p
        ),
    )
    env_kwargs = dict(env.kwargs)
    if getattr(policy, "wants_a11y_tree", False):
        env_kwargs["a11y_tree"] = True
    return run_eval(
        cfg.env,
        policy,
        out,
        task_ids=cfg.tasks,
        episodes=cfg.episodes,
        num_envs=cfg.num_envs,
        seed=cfg.seed,
        env_kwargs=env_kwargs,
        progress=progress,
        config=config if config is not None else {"planner": planner, "executor": cfg.executor},
    )


class Rounds:
    """A method's loop on disk: OUT/config.json, OUT/round_NN/ per round (`dir`), OUT/round_NN/done.json once a
    round has finished (written atomically: a rerun resumes at the first round without one, `done`), and each
    round's record appended once to OUT/metrics.jsonl (`finish`); `history` holds every round's record, the
    resumed ones included, in order."""

    def __init__(self, out: str | Path, cfg):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        write_config(self.out, cfg)
        self.history: list[dict] = []
        self._done: dict[int, dict] = {}
        for p in self.out.glob("round_*/done.json"):
            rec = json.loads(p.read_text())
            self._done[int(rec["round"])] = rec

    def dir(self, r: int) -> Path:
        return self.out / f"round_{r:02d}"

    def done(self, r: int) -> dict | None:
        """Round r's record when it finished in an earlier run (then it joins `history`), else None."""
        rec = self._done.get(r)
        if rec is not None:
            self.history.append(rec)
        return rec

    def finish(self, r: int, rec: dict) -> dict:
        rd = self.dir(r)
        rd.mkdir(parents=True, exist_ok=True)
        tmp = rd / "done.json.tmp"
        tmp.write_text(json.dumps(rec))
        tmp.rename(rd / "done.json")
        with open(self.out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.history.append(rec)
        return rec


def oracle_state_paths(cfg: StepLevelConfig, out: Path) -> list[str]:
    """The state dataset of the oracle replays of cfg.env's tasks (cfg.tasks), built once in OUT/oracle_states:
    the labelled states a loop bootstraps from (CODA's "small set of initial task trajectories")."""
    from .. import states

    oracle = Path(out) / "oracle_states"
    if not (oracle / "dataset_info.json").exists():
        states.build(states.oracle_states(cfg.env, cfg.tasks, history_images=cfg.history_images), oracle)
    return [str(oracle)]


def success_rate(summary: dict) -> float:
    """The overall success rate of a `coda eval` run's summary."""
    return float(summary["overall"]["rate"])


def resolve_app(cfg: StepLevelConfig) -> None:
    """cfg.app from --env's app where an env is given (a different --app is an error); step-level methods share it."""
    if cfg.env:
        from .common import probe_env

        env_app = probe_env(cfg.env).app
        if cfg.app and cfg.app != env_app:
            raise ValueError(f"--app {cfg.app} but --env {cfg.env} is {env_app}")
        cfg.app = env_app


def config_flags(cfg: StepLevelConfig) -> list[str]:
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


def launch_command(launcher: str, cfg: StepLevelConfig, method: str = "coda") -> list[str]:
    """`LAUNCHER` + the module + the flags of `cfg`: accelerate and torchrun take `-m MODULE`; any other
    launcher (srun, ...) is followed by this Python."""
    argv = shlex.split(launcher)
    if not argv:
        raise ValueError("--launcher is empty")
    if Path(argv[0]).name in ("accelerate", "torchrun"):
        argv += ["-m", "coda_agent.cli"]
    else:
        argv += [sys.executable, "-m", "coda_agent.cli"]
    return argv + ["train", method, "--quiet", *config_flags(cfg)]
