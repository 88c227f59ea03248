"""`coda train coda` (or `--method co-epg|pro-cua`) on one GPU, prepared as one script: 3 GRPO steps of a randomly initialised Qwen2.5-VL with the
3B configuration, LoRA, G = 8, over states of a state dataset (the oracle dataset: `coda data states --oracle`).
Prints seconds per step, generated tokens/s, peak GPU memory, the loss (finite?) and whether the adapter changed.

    python benchmarks/gpu_train.py --data runs/states-oracle            # on a GPU machine (no network needed)
    python benchmarks/gpu_train.py --model tiny --device cpu --data ...  # the same path, tiny model, on a CPU
    python benchmarks/gpu_train.py --dry-run                             # the settings, nothing loaded
    python benchmarks/gpu_train.py --method co-epg --data ...            # Co-EPG's C-DREM reward instead
    python benchmarks/gpu_train.py --method pro-cua --data ...           # PRO-CUA's VLM PRM reward instead

`--method` picks the step-level method's reward (the trainer is the same): `coda`, the executor's action scored
against the label; `co-epg`, C-DREM over one grounding model (a second random model of the same configuration,
greedy, with its coordinate tokens' log-probs); `pro-cua`, a VLM process reward model (a second random model
of the same configuration) scoring the executor's action for each plan. The second model is saved to a
temporary folder and loaded as a user's checkpoint would be, so its generation cost is in the step time.

No weights can be downloaded, so the model is built from Qwen2.5-VL-3B-Instruct's configuration with random
weights, directly on the GPU in bfloat16, with the byte-level tokenizer of coda_agent.tiny (its special tokens
are Qwen2.5-VL's; the model keeps the full 151,936-row vocabulary, so generation costs what it costs the real
model) and Qwen2.5-VL's default image processor (a 1280x800 screen is 1288x812 pixels, 1,334 image tokens).
A random planner writes no plan that parses, so the real reward (the executor's action scored against the
label) is 0 for every sample and gives GRPO no signal; a SYNTHETIC reward (the mean token id of a completion) is added so that advantages are non-zero and the update path (LoRA gradients, the optimizer)
really runs. Without --data the states are SYNTHETIC too (random screens), named as such in the output.

What the GPU machine needs: torch with CUDA, transformers, accelerate, peft, the pure-Python wheels of trl 1.16
(0.9 MB) and datasets (0.6 MB), and datasets' own dependencies where it lacks them (pyarrow, pandas, xxhash,
dill, multiprocess, fsspec); the project itself (this checkout); and the states: build them here with
`coda data states oracle --env coda/KAlgebra-v0 --out runs/states-kalgebra` (150 states, 17 MB) and bring that
folder. Run it as `python benchmarks/gpu_train.py --data runs/states-kalgebra`: with the defaults (256 states
cycled from the 150, 3 steps of 8 states x G 8 = 64 plans of up to 128 tokens, LoRA r 16, gradient
checkpointing) it should take a few minutes on one H100; no GPU was lent to this work, so that is untested.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Qwen2.5-VL-3B-Instruct's config.json (text and vision), as published with the model.
QWEN2_5_VL_3B = {
    "text": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        max_position_embeddings=128000,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        mrope_section=[16, 24, 24],
    ),
    "vision": dict(
        depth=32,
        hidden_size=1280,
        intermediate_size=3420,
        num_heads=16,
        out_hidden_size=2048,
        fullatt_block_indexes=[7, 15, 23, 31],
        window_size=112,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
        in_chans=3,
        hidden_act="silu",
        tokens_per_second=2,
    ),
    "tie_word_embeddings": True,
}
TINY = {
    "text": dict(
        vocab_size=None,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        mrope_section=[4, 2, 2],
    ),
    "vision": dict(
        depth=2,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        fullatt_block_indexes=[1],
        window_size=112,
    ),
    "tie_word_embeddings": True,
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--data", nargs="*", default=[], help="state datasets (coda data states); none: synthetic states")
    p.add_argument(
        "--method", choices=("coda", "co-epg", "pro-cua"), default="coda", help="whose step-level reward to train on"
    )
    p.add_argument("--states", type=int, default=256, help="states in the training set (the data cycled to this)")
    p.add_argument("--steps", type=int, default=3, help="GRPO optimizer steps")
    p.add_argument("--group-size", type=int, default=8, help="plans per state (G)")
    p.add_argument("--states-per-step", type=int, default=8, help="states per optimizer step")
    p.add_argument("--micro-batch", type=int, default=8, help="completions per forward pass")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per plan")
    p.add_argument("--history-images", type=int, default=2, help="earlier screenshots in each prompt")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank (must be > 0: the adapter is checked)")
    p.add_argument("--lr", type=float, default=1e-5, help="learning rate (high enough to see the adapter move)")
    p.add_argument("--executor", default="a11y", help="the fixed executor (a11y needs no model)")
    p.add_argument("--model", choices=("3b", "tiny"), default="3b", help="model configuration")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run with --model tiny")
    p.add_argument(
        "--gradient-checkpointing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="recompute activations in the backward pass",
    )
    p.add_argument("--out", default="runs/gpu_train", help="run folder (checkpoints, metrics.jsonl)")
    p.add_argument("--seed", type=int, default=0, help="seed")
    p.add_argument("--dry-run", action="store_true", help="print the settings and exit")
    args = p.parse_args(argv)
    if args.steps < 1 or args.group_size < 2 or args.states < 1 or args.lora_r < 1:
        p.error("--steps >= 1, --group-size >= 2, --states >= 1 and --lora-r >= 1 are required")
    if (args.states_per_step * args.group_size) % args.micro_batch:
        p.error("--states-per-step x --group-size must divide by --micro-batch")
    if args.model == "3b" and args.device == "cpu":
        p.error("the 3B model on a CPU would take hours; use --model tiny with --device cpu")
    return args


def coda_config(args):
    """The `coda train coda` settings this benchmark runs (every other setting at its default)."""
    from coda_agent.train.coda import CodaConfig

    return CodaConfig(
        out=args.out,
        executor=args.executor,
        group_size=args.group_size,
        states_per_step=args.states_per_step,
        micro_batch=args.micro_batch,
        max_steps=args.steps,
        lr=args.lr,
        max_new_tokens=args.max_new_tokens,
        history_images=args.history_images,
        lora_r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        seed=args.seed,
        device=args.device,
        resume=False,
        save_steps=10**6,
        gradient_checkpointing=args.gradient_checkpointing,
        bf16=args.device.startswith("cuda"),
    )


def build_model(kind: str, device: str, tmp: Path):
    """(model, processor): random Qwen2.5-VL of `kind` built on `device`, the tiny tokenizer, Qwen2.5-VL's image
    processor (defaults; `tiny`: small images)."""
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from coda_agent.tiny import SPECIAL_TOKENS, build_tiny_qwen2_5_vl
    from coda_agent.train.steplevel import ImageTextProcessor

    build_tiny_qwen2_5_vl(tmp / "tokenizer")  # for its tokenizer (the tiny weights are not used)
    tok = AutoTokenizer.from_pretrained(tmp / "tokenizer", local_files_only=True)
    tok.padding_side = "left"
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    spec = QWEN2_5_VL_3B if kind == "3b" else TINY
    text = dict(spec["text"])
    text["vocab_size"] = text["vocab_size"] or len(tok)
    mrope = text.pop("mrope_section")
    theta = text.pop("rope_theta")
    text.update(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": mrope},
    )
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(spec["vision"]),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=spec["tie_word_embeddings"],
    )
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2_5_VLForConditionalGeneration._from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    ip = (
        Qwen2VLImageProcessorPil()
        if kind == "3b"
        else Qwen2VLImageProcessorPil(size={"shortest_edge": 4 * 28 * 28, "longest_edge": 64 * 28 * 28})
    )
    return model, ImageTextProcessor(ip, tok, chat_template=tok.chat_template)


def synthetic_states(n: int, seed: int = 0):
    """SYNTHETIC states (random screens, KAlgebra's tab bar as the a11y table, the '2D Graph' tab as the target)
    in coda_agent.states' format, when no --data is given."""
    import numpy as np
    from datasets import Dataset

    from coda_agent import states

    rng = np.random.default_rng(seed)
    shots = [states._png(rng.integers(0, 255, (800, 1280, 3), dtype=np.uint8)) for _ in range(4)]
    table = (
        "role\tname\ttext\tx,y,w,h\tstates\npage tab\tCalculator\t\t0,39,85,27\t\n"
        "page tab\t2D Graph\t\t85,39,82,27\t\npage tab\t3D Graph\t\t167,39,82,27\t\n"
    )
    rows = [
        {
            "id": f"synthetic:{i}:1",
            "app": "kalgebra",
            "task": "synthetic",
            "step": 1,
            "source": "synthetic",
            "instruction": f"Synthetic task {i}: plot x^{i} in the 2D Graph.",
            "history": "[]",
            "images": [shots[i % 4]],
            "target": "pyautogui.click(125, 53)",
            "box": [85, 39, 166, 65],
            "radius": 20.0,
            "screen": [1280, 800],
            "a11y": table,
        }
        for i in range(min(n, 16))
    ]
    return Dataset.from_list(rows, features=states.features())


def cycled(ds, n: int):
    return ds.select([i % len(ds) for i in range(n)])


class SyntheticReward:
    """SYNTHETIC reward for a random planner: the mean token id of a completion over the vocabulary size (it
    varies within a group, so GRPO's advantages are non-zero)."""

    __name__ = "synthetic_token_ids"

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        return [sum(ids) / max(1, len(ids)) / self.vocab for ids in completion_ids]


def method_rewards(args, cfg, states, tmp: Path) -> list | None:
    """The reward functions of --method (None: CODA's own, which build_trainer makes): the second model (a
    grounding model or a PRM) is another random model of --model's configuration, saved as a checkpoint."""
    if args.method == "coda":
        return None
    model, processor = build_model(args.model, args.device, tmp / "reward-tok")
    path = tmp / "reward-model"
    model.save_pretrained(path)
    processor.tokenizer.save_pretrained(path)
    processor.image_processor.save_pretrained(path)
    del model
    if args.method == "co-epg":
        from coda_agent.train.coepg import CDREMReward, TransformersGrounder

        return [CDREMReward([TransformersGrounder(path, name="grounder", device=args.device)], [2.0])]
    from coda_agent.train.coda import make_executor
    from coda_agent.prm import VLMPRM
    from coda_agent.train.procua import ProcessReward

    row = states[0]
    screen = tuple(row["screen"]) or (1280, 800)
    return [ProcessReward(make_executor(cfg, row["app"], screen), VLMPRM(str(path), device=args.device))]


def lora_weights(model) -> dict:
    return {n: p.detach().float().clone() for n, p in model.named_parameters() if "lora_" in n and p.requires_grad}


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg = coda_config(args)
    print(
        json.dumps(
            {
                "model": f"Qwen2.5-VL ({args.model} config, random weights)",
                "device": args.device,
                "data": args.data or "SYNTHETIC",
                "states": args.states,
                "steps": args.steps,
                "group_size": args.group_size,
                "states_per_step": args.states_per_step,
                "micro_batch": args.micro_batch,
                "max_new_tokens": args.max_new_tokens,
                "lora_r": args.lora_r,
                "executor": args.executor,
                "method": args.method,
            }
        )
    )
    if args.dry_run:
        return 0
    import tempfile

    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_train: no CUDA device here (use --model tiny --device cpu for a CPU smoke run)", file=sys.stderr)
        return 2
    from coda_agent.train import coda, steplevel
    from coda_agent.train.steplevel import load_states

    if args.data:
        states, _ = load_states(args.data)
    else:
        states = synthetic_states(args.states, args.seed)
    states = cycled(states, args.states)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        model, processor = build_model(args.model, args.device, Path(tmp))
        build_s = time.monotonic() - t0
        rewards = method_rewards(args, cfg, states, Path(tmp))
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        synthetic = SyntheticReward(model.config.get_text_config().vocab_size)
        common = dict(model=model, processor=processor, train_states=states, progress=False)
        if rewards is None:  # CODA's own reward through the executor
            trainer = coda.build_trainer(cfg, Path(args.out), extra_rewards=[synthetic], **common)
        else:
            trainer = steplevel.build_trainer(cfg, Path(args.out), [*rewards, synthetic], **common)
        before = lora_weights(trainer.model)
        t1 = time.monotonic()
        trainer.train()
        train_s = time.monotonic() - t1
        after = lora_weights(trainer.model)
    logs = [r for r in trainer.state.log_history if "step_time" in r]
    reward_name = {"coda": "action_reward", "co-epg": "cdrem", "pro-cua": "process_reward"}[args.method]
    per_step = args.states_per_step * args.group_size
    step_s = [r["step_time"] for r in logs]
    tokens = [r.get("completions/mean_length", 0.0) * per_step for r in logs]
    losses = [r["loss"] for r in logs if "loss" in r]
    changed = any(not torch.equal(before[n], after[n].to(before[n].device)) for n in before)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else float("nan")
    result = {
        "model_build_s": round(build_s, 1),
        "train_s": round(train_s, 1),
        "seconds_per_step": [round(s, 2) for s in step_s],
        "generated_tokens_per_s": round(sum(tokens) / sum(step_s), 1) if step_s else 0.0,
        "states_per_s": round(len(logs) * args.states_per_step / sum(step_s), 3) if step_s else 0.0,
        "peak_gpu_memory_gib": round(peak, 2),
        "loss": losses,
        "loss_finite": all(map(math.isfinite, losses)),
        "adapter_changed": changed,
        "real_reward_mean": [r.get(f"rewards/{reward_name}/mean") for r in logs],
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    }
    print(json.dumps(result))
    ok = result["loss_finite"] and changed and len(logs) == args.steps
    print(
        "gpu_train: " + ("OK" if ok else "FAILED") + f" ({len(logs)} steps, loss finite "
        f"{result['loss_finite']}, adapter changed {changed})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
