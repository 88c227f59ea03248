"""Stage 2 ("generalization"): one generalist planner fine-tuned on the specialists' successful trajectories.

The data are `coda eval`-style run directories (what `coda eval` and the GRPO trainer's out/rollouts/iter_*
write). An episode is kept when its programmatic checks passed (`filter="check"`) or when the VLM judge gives
it a score >= threshold (`filter="judge"`). Each planner call of a kept episode becomes one example: the
planner's conversation rebuilt exactly as the agent built it (task, earlier thoughts/actions, the last k
screenshots from the stored PNGs, the current screen) and, as the target, what the planner answered. The
loss is the summed cross-entropy of the target tokens (appended as tokens to the prompt's) over an optimizer
step's micro-batches, divided by that step's target-token count.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..planner import Planner, Turn
from ..types import Sample
from .common import (
    Method,
    RunLog,
    TrainConfig,
    accumulate,
    export_planner,
    load_checkpoint,
    load_trainable,
    opt,
    prepare_model,
    save_checkpoint,
    token_logprobs,
    trainable_parameters,
    write_config,
)


@dataclass
class SFTConfig(TrainConfig):
    runs: list[str] = opt([], "run directories (globs allowed) whose successful episodes make the dataset", "--from")
    out: str = opt("runs/sft", "run folder: config.json, metrics.jsonl, tb/, checkpoint/, planner/")
    lr: float = opt(1e-5, "AdamW learning rate")
    filter: str = opt("check", "check | judge: which episodes count as successful")
    judge: list[str] = opt([], "judge model specs (paths or URLs) when --filter judge")
    threshold: float = opt(0.5, "judge score an episode needs to be kept")
    history_images: int = opt(2, "screenshots of earlier steps in each rebuilt planner prompt")
    epochs: int = opt(3, "passes over the examples")
    grad_accum: int = opt(1, "micro-batches per optimizer step")


@dataclass
class Example:
    task: str
    app: str
    step: int
    sample: Sample  # conversation + target tokens (filled by `tokenize`)
    target: str


def _runs(patterns: Sequence[str | Path]) -> list[Path]:
    import glob

    out: list[Path] = []
    for p in map(str, patterns):
        found = sorted(glob.glob(p)) if any(c in p for c in "*?[") else [p]
        out += [Path(d) for d in found if (Path(d) / "episodes.jsonl").exists()]
    if not out:
        raise ValueError(f"no `coda eval`-style run directories (with episodes.jsonl) in {list(map(str, patterns))}")
    return out


def load_examples(
    runs: Sequence[str | Path],
    filter: str = "check",
    judge=None,
    threshold: float = 0.5,
    history_images: int = 2,
    screen: tuple[int, int] = (1280, 800),
) -> tuple[list[Example], dict]:
    """Planner examples from the kept episodes of `runs`, and counts (episodes seen, kept, examples)."""
    from coda_env.runs import load_episodes, read_jsonl, read_png

    if filter not in ("check", "judge"):
        raise ValueError("filter must be 'check' or 'judge'")
    if filter == "judge" and judge is None:
        raise ValueError("filter='judge' needs a judge (coda_agent.judge.Judge or its config)")
    examples: list[Example] = []
    counts = {"episodes": 0, "kept": 0, "skipped": 0, "examples": 0}
    for run in _runs(runs):
        episodes, skipped = load_episodes(run)
        counts["skipped"] += len(skipped)
        for ep in episodes:
            counts["episodes"] += 1
            shots = [read_png(p) for p in ep["pngs"]]
            if filter == "check":
                keep = ep["check"]
            else:
                keep = judge.score(ep["instruction"], shots, ep.get("answer")).score >= threshold
            if not keep:
                continue
            counts["kept"] += 1
            planner = Planner(None, ep["app"], screen=screen, history_images=history_images)
            steps = read_jsonl(ep["pngs"][0].parent / "steps.jsonl")
            history: list[Turn] = []
            for k, st in enumerate(steps):
                call = next((c for c in st.get("calls", []) if c.get("model") == "planner"), None)
                if call is not None and call.get("output"):
                    conv = planner.conversation(ep["instruction"], history, shots[k])
                    examples.append(Example(ep["task"], ep["app"], k + 1, Sample("planner", conv, []), call["output"]))
                history.append(Turn(shots[k], st.get("thought", ""), st.get("plan") or st.get("action", "")))
    counts["examples"] = len(examples)
    return examples, counts


def tokenize(vlm, examples: Sequence[Example]) -> None:
    """Target texts -> token ids (with the end-of-turn token the planner must learn to stop with)."""
    end = vlm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for ex in examples:
        ex.sample.token_ids = vlm.tokenizer(ex.target, add_special_tokens=False)["input_ids"] + [end]


def planner_loss(vlm, examples: Sequence[Example], n_tokens: int | None = None) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy of the examples' target tokens / n_tokens (default: their own token count)."""
    lp, mask = token_logprobs(vlm, [e.sample for e in examples], temperature=1.0)
    n = n_tokens or int(mask.sum())
    return -(lp * mask.float()).sum() / n, int(mask.sum())


def mean_loss(vlm, examples: Sequence[Example], micro_batch: int = 4) -> float:
    """Mean per-token loss of the planner on `examples` (no gradients)."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), micro_batch):
            loss, n = planner_loss(vlm, examples[i : i + micro_batch])
            total += float(loss) * n
            tokens += n
    return total / max(1, tokens)


def finetune(cfg: SFTConfig, vlm, examples: Sequence[Example], progress: bool = True) -> list[dict]:
    """SFT with LoRA (peft) or full weights, gradient accumulation over micro-batches; returns per-epoch
    records (epoch 0: the loss before training; also out/metrics.jsonl), checkpoints after every epoch (a
    rerun resumes) and saves the planner to out/planner."""
    if not examples:
        raise ValueError("no training examples: no kept episode had a planner call")
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    out = Path(cfg.out)
    write_config(out, cfg)
    tokenize(vlm, examples)
    optimizer, _ = prepare_model(vlm, cfg.lr, cfg.lora_r, cfg.lora_alpha, cfg.lora_targets)
    start = load_checkpoint(out, vlm.model, optimizer, rng) if cfg.resume else 0
    params = trainable_parameters(vlm.model)
    log = RunLog(out, cfg.epochs, start, progress, unit="epoch")
    history: list[dict] = []
    try:
        if start == 0:
            history.append({"epoch": 0, "loss": mean_loss(vlm, examples, cfg.micro_batch)})
            log.log(0, history[-1], advance=False)
        for epoch in range(start, cfg.epochs):
            t0 = time.monotonic()
            order = list(examples)
            rng.shuffle(order)
            step_size = cfg.micro_batch * cfg.grad_accum
            vlm.model.train()
            for i in range(0, len(order), step_size):
                group = order[i : i + step_size]
                n = sum(len(e.sample.token_ids) for e in group)
                chunks = [group[j : j + cfg.micro_batch] for j in range(0, len(group), cfg.micro_batch)]
                accumulate(
                    optimizer,
                    params,
                    chunks,
                    cfg.max_grad_norm,
                    lambda k, ch: (planner_loss(vlm, ch, n_tokens=n)[0], {}),
                )
            vlm.model.eval()
            rec = {
                "epoch": epoch + 1,
                "loss": mean_loss(vlm, examples, cfg.micro_batch),
                "seconds": round(time.monotonic() - t0, 2),
            }
            history.append(rec)
            save_checkpoint(out, cfg, vlm.model, optimizer, epoch, rng)
            log.log(epoch + 1, rec, f"loss {rec['loss']:.3f}")
    finally:
        log.close()
    if start < cfg.epochs:
        export_planner(vlm, out / "planner")
    return history


def run(cfg: SFTConfig, progress: bool = True) -> list[dict]:
    """`coda train sft`: the dataset from cfg.runs (and the judge when filter='judge'), then `finetune`."""
    if not cfg.runs:
        raise ValueError("coda train sft needs --from RUN_DIRS (runs of `coda eval` or GRPO's rollouts/iter_*)")
    vlm = load_trainable(cfg.planner, cfg.device)
    judge = None
    if cfg.filter == "judge":
        from ..judge import Judge, JudgeConfig

        judge = Judge(JudgeConfig(models=cfg.judge, threshold=cfg.threshold))
    examples, counts = load_examples(cfg.runs, cfg.filter, judge, cfg.threshold, cfg.history_images)
    print(
        f"episodes {counts['episodes']}, kept {counts['kept']}, examples {counts['examples']}, "
        f"skipped {counts['skipped']}"
    )
    return finetune(cfg, vlm, examples, progress)


def summary(cfg: SFTConfig, history: list[dict]) -> str:
    return (
        "loss per epoch: "
        + ", ".join(f"{h['epoch']}: {h['loss']:.4f}" for h in history)
        + f"\nplanner: {Path(cfg.out) / 'planner'}"
    )


METHOD = Method("sft", "stage 2: generalist SFT on successful trajectories", SFTConfig, run, summary)
