"""Stage 2 ("generalization"): one generalist planner fine-tuned on the specialists' successful trajectories.

The data are `coda eval`-style run directories (what `coda eval` and the GRPO trainer's out/rollouts/iter_*
write). An episode is kept when its programmatic checks passed (`filter="check"`) or when the VLM judge gives
it a score >= threshold (`filter="judge"`). Each planner call of a kept episode becomes one example: the
planner's conversation rebuilt exactly as the agent built it (task, earlier thoughts/actions, the last k
screenshots from the stored PNGs, the current screen) and, as the target, what the planner answered. The
loss is the mean cross-entropy of the target tokens, appended as tokens to the prompt's.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from .planner import Planner, Turn
from .policy import PlannerSample


@dataclass
class SFTConfig:
    runs: list[str] = field(default_factory=list)   # run directories (globs allowed)
    planner: str = ""                                # base checkpoint to fine-tune
    out: str = "runs/sft"
    filter: str = "check"                            # "check" | "judge"
    judge: list[str] = field(default_factory=list)   # judge model specs when filter="judge"
    threshold: float = 0.5
    history_images: int = 2
    epochs: int = 3
    lr: float = 1e-5
    micro_batch: int = 4
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    lora_r: int = 16                                 # 0 = full fine-tuning
    lora_alpha: int = 32
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    seed: int = 0
    device: str | None = None


@dataclass
class Example:
    task: str
    app: str
    step: int
    sample: PlannerSample                            # conversation + target tokens (filled by `tokenize`)
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


def load_examples(runs: Sequence[str | Path], filter: str = "check", judge=None, threshold: float = 0.5,
                  history_images: int = 2, screen: tuple[int, int] = (1280, 800)) -> tuple[list[Example], dict]:
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
                    examples.append(Example(ep["task"], ep["app"], k + 1, PlannerSample(conv, [], None),
                                            call["output"]))
                history.append(Turn(shots[k], st.get("thought", ""), st.get("plan") or st.get("action", "")))
    counts["examples"] = len(examples)
    return examples, counts


def tokenize(vlm, examples: Sequence[Example]) -> None:
    """Target texts -> token ids (with the end-of-turn token the planner must learn to stop with)."""
    end = vlm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for ex in examples:
        ex.sample.token_ids = vlm.tokenizer(ex.target, add_special_tokens=False)["input_ids"] + [end]


def planner_loss(vlm, examples: Sequence[Example], n_tokens: int | None = None):
    """Summed cross-entropy of the examples' target tokens / n_tokens (default: their own token count)."""
    from .grpo import token_logprobs
    lp, mask = token_logprobs(vlm, [e.sample for e in examples], temperature=1.0)
    n = n_tokens or int(mask.sum())
    return -(lp * mask.float()).sum() / n, int(mask.sum())


def mean_loss(vlm, examples: Sequence[Example], micro_batch: int = 4) -> float:
    """Mean per-token loss of the planner on `examples` (no gradients)."""
    import torch
    total, tokens = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(examples), micro_batch):
            loss, n = planner_loss(vlm, examples[i:i + micro_batch])
            total += float(loss) * n
            tokens += n
    return total / max(1, tokens)


def finetune(cfg: SFTConfig, vlm, examples: Sequence[Example], progress: bool = True) -> list[dict]:
    """SFT with LoRA (peft) or full weights; gradient accumulation over micro-batches; returns per-epoch
    stats (also out/metrics.jsonl) and saves the planner to out/planner."""
    import torch
    from tqdm import tqdm
    from .grpo import export_planner, prepare_model
    if not examples:
        raise ValueError("no training examples: no kept episode had a planner call")
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1))
    tokenize(vlm, examples)
    optimizer, _ = prepare_model(vlm, cfg.lr, cfg.lora_r, cfg.lora_alpha, cfg.lora_targets)
    params = [p for p in vlm.model.parameters() if p.requires_grad]
    history = [{"epoch": 0, "loss": mean_loss(vlm, examples, cfg.micro_batch)}]
    bar = tqdm(total=cfg.epochs, disable=not progress, unit="epoch")
    for epoch in range(1, cfg.epochs + 1):
        t0 = time.monotonic()
        order = list(examples)
        rng.shuffle(order)
        step_size = cfg.micro_batch * cfg.grad_accum
        vlm.model.train()
        for i in range(0, len(order), step_size):
            group = order[i:i + step_size]
            n = sum(len(e.sample.token_ids) for e in group)
            optimizer.zero_grad(set_to_none=True)
            for j in range(0, len(group), cfg.micro_batch):
                loss, _ = planner_loss(vlm, group[j:j + cfg.micro_batch], n_tokens=n)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
        vlm.model.eval()
        rec = {"epoch": epoch, "loss": mean_loss(vlm, examples, cfg.micro_batch),
               "seconds": round(time.monotonic() - t0, 2)}
        history.append(rec)
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        bar.update(1)
        bar.set_postfix_str(f"loss {rec['loss']:.3f}")
    bar.close()
    export_planner(vlm, out / "planner")
    return history
