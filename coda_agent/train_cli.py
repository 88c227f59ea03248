"""`coda train grpo ...` and `coda train sft ...`: every field of the run's config dataclass is a flag,
`--config FILE.json` loads a saved config (flags given on the command line override it), and the run writes
the full config it used to OUT/config.json, so any run can be repeated with `--config runs/X/config.json`."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path

from .grpo import GRPOConfig
from .sft import SFTConfig

HELP = {
    "planner": "planner checkpoint directory (Qwen2.5-VL family)",
    "executor": "fixed executor: UI-TARS-1.5 checkpoint directory or http(s):// endpoint",
    "runs": "run directories (globs allowed) whose successful episodes make the dataset",
    "lora_r": "LoRA rank; 0 = full fine-tuning",
    "kl_coef": "KL penalty to the frozen reference (0: no reference)",
    "group_size": "episodes per task in a GRPO group (G)",
    "filter": "check | judge: which episodes count as successful",
    "judge": "judge model specs (paths or URLs) when --filter judge",
}


def add_config_arguments(p: argparse.ArgumentParser, cls) -> None:
    """One flag per field of the config dataclass `cls`, typed from its annotations; defaults stay None so
    that only the flags given override --config."""
    p.add_argument("--config", type=Path, help="a config.json written by an earlier run")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag, t = "--" + f.name.replace("_", "-"), hints[f.name]
        if typing.get_origin(t) in (typing.Union, types.UnionType):          # X | None -> X
            t = next(a for a in typing.get_args(t) if a is not type(None))
        if typing.get_origin(t) is list:
            p.add_argument(flag, nargs="*", default=None, help=HELP.get(f.name))
        elif t is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=HELP.get(f.name))
        else:
            p.add_argument(flag, type=t, default=None, help=HELP.get(f.name))


def config_from_args(cls, args: argparse.Namespace):
    values = {}
    if args.config:
        try:
            values = json.loads(args.config.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read --config {args.config}: {e}") from None
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"{args.config}: unknown settings {sorted(unknown)}")
    for f in dataclasses.fields(cls):
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    return cls(**values)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="method", required=True)
    g = sub.add_parser("grpo", help="stage 1: decoupled GRPO on the planner (per app)")
    add_config_arguments(g, GRPOConfig)
    g.add_argument("--no-resume", action="store_true", help="start afresh even if OUT has a checkpoint")
    g.add_argument("--quiet", action="store_true")
    s = sub.add_parser("sft", help="stage 2: generalist SFT on successful trajectories")
    add_config_arguments(s, SFTConfig)
    s.add_argument("--from", dest="runs_from", nargs="*", help="same as --runs")
    s.add_argument("--quiet", action="store_true")


def main_train(args: argparse.Namespace) -> int:
    if args.method == "grpo":
        from .grpo import train
        cfg = config_from_args(GRPOConfig, args)
        if not cfg.planner:
            raise ValueError("coda train grpo needs --planner DIR (a local checkpoint: its weights are trained)")
        history = train(cfg, progress=not args.quiet, resume=not args.no_resume)
        for h in history:
            print(f"iteration {h['iteration']}: reward {h['reward_mean']:.3f} success {h['success_rate']:.3f} "
                  f"kl {h['kl']:.4f} clip {h['clip_frac']:.3f} env steps/s {h['env_steps_per_s']:.2f} "
                  f"planner tokens/s {h['planner_tokens_per_s']:.1f}")
        print(f"planner: {Path(cfg.out) / 'planner'}  (coda eval --agent coda --planner that --executor ...)")
        return 0
    from .models import TransformersVLM
    from .sft import finetune, load_examples
    if args.runs_from:
        args.runs = list(args.runs or []) + args.runs_from
    cfg = config_from_args(SFTConfig, args)
    if not cfg.planner or not cfg.runs:
        raise ValueError("coda train sft needs --planner DIR and --from RUN_DIRS")
    judge = None
    if cfg.filter == "judge":
        from .judge import Judge, JudgeConfig
        judge = Judge(JudgeConfig(models=cfg.judge, threshold=cfg.threshold))
    vlm = TransformersVLM(cfg.planner, device=cfg.device)
    examples, counts = load_examples(cfg.runs, cfg.filter, judge, cfg.threshold, cfg.history_images)
    print(f"episodes {counts['episodes']}, kept {counts['kept']}, examples {counts['examples']}, "
          f"skipped {counts['skipped']}")
    history = finetune(cfg, vlm, examples, progress=not args.quiet)
    print("loss per epoch: " + ", ".join(f"{h['loss']:.4f}" for h in history))
    print(f"planner: {Path(cfg.out) / 'planner'}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="coda train")
    add_arguments(p)
    sys.exit(main_train(p.parse_args()))
