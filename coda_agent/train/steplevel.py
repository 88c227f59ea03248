"""What the step-level methods share: single-turn GRPO over state datasets on Hugging Face TRL's GRPOTrainer.

A step-level method (CODA's stage 1 as published; Co-EPG and PRO-CUA are the same shape) is a reward and a data
step: the trainer, the generation engines (transformers' `generate`, or vLLM in server or colocate mode), the
distribution (accelerate: DDP, DeepSpeed ZeRO, FSDP), LoRA (peft), checkpoints and resume are TRL's and
transformers'. This module is the glue a method needs around them:

- `ImageTextProcessor`: Qwen2.5-VL's processor without its video half. `Qwen2_5_VLProcessor` cannot be built
  without torchvision (its video processor needs it), and PyPI's torchvision does not load beside the CPU torch
  this project installs; images and text are all a planner needs. Its token ids equal the live agent's
  (`TransformersVLM.build_inputs`) for the same conversation (tested).
- `load_states`: state datasets (`coda_agent.states`, HF `datasets` on disk) checked and concatenated, one app.
- `PromptTransform`: each state as TRL wants it: `prompt` (the planner's conversation exactly as the live agent
  builds it, images as placeholders) and `images` (what fills them, in order); applied on the fly
  (`Dataset.with_transform`), so no screenshot is decoded or re-encoded ahead of time.
- `RunLogCallback`: every TRL log record into OUT/metrics.jsonl and TensorBoard scalars under OUT/tb, as the
  other methods write them.
- `export_planner`: the trained planner as a self-contained checkpoint that `coda eval --planner` loads (LoRA
  merged into the base weights), also after DeepSpeed ZeRO-3 or FSDP training.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

from transformers import TrainerCallback
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
from transformers.processing_utils import ProcessorMixin

from ..models import VISION_TOKENS, Conversation, to_pil
from ..states import COLUMNS

# The columns a state dataset (coda_agent.states) must have: all but the optional a11y table.
STATE_COLUMNS = tuple(c for c in COLUMNS if c != "a11y")


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
    from datasets import concatenate_datasets, load_from_disk

    if not paths:
        raise ValueError("no state dataset: give --data DIR (made by `coda data states ...`)")
    parts = []
    apps: dict[str, str] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise ValueError(f"state dataset {str(p)!r} does not exist (make one with `coda data states ...`)")
        try:
            ds = load_from_disk(str(p))
        except (FileNotFoundError, ValueError, OSError) as e:
            raise ValueError(
                f"{p} is not a state dataset saved by `coda data states`: {str(e).splitlines()[0]}"
            ) from None
        if hasattr(ds, "keys") and not hasattr(ds, "column_names"):  # a DatasetDict
            raise ValueError(f"{p} holds several splits ({', '.join(ds.keys())}); give one split's folder")
        missing = [c for c in STATE_COLUMNS if c not in ds.column_names]
        if missing:
            raise ValueError(f"{p} is not a state dataset: columns {missing} are missing")
        if len(ds) == 0:
            raise ValueError(f"{p} holds no states")
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
