"""Training methods: `coda train METHOD ...`, one file per method and one entry per method in METHODS.

Every field of a method's config dataclass is a flag (`--group-size 8`, `--tasks a b`, `--no-resume`) whose
help text shows its default; `--config FILE.json` loads a saved config (flags given on the command line
override it), and each run writes the full config it used to OUT/config.json, so any run can be repeated
with `--config runs/X/config.json`. Adding a method: a new file here defining `METHOD = Method(...)` (its
config, `run(cfg, progress) -> records`) and its line in METHODS. What methods share is in common.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path

from . import bepa, coda, coepg, grpo, procua, sft
from .common import Method

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        coda.METHOD,  # stage 1 as published: step-level decoupled GRPO over state datasets (TRL)
        coepg.METHOD,  # Co-EPG: GRPO under C-DREM (grounding ensemble) + grounding SFT, iterated
        procua.METHOD,  # PRO-CUA: step-level GRPO with process rewards for the policy's own live states
        grpo.METHOD,  # stage 1, episodic: decoupled GRPO on the planner over whole episodes
        bepa.METHOD,  # episodic GRPO + expert trajectories: LEVEL-1 re-rolls, LEVEL-2 per-task cache
        sft.METHOD,  # stage 2: generalist SFT on successful trajectories
    )
}


def _flag_type(t):
    if typing.get_origin(t) in (typing.Union, types.UnionType):  # X | None -> X
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return t


def add_config_arguments(p: argparse.ArgumentParser, cls) -> None:
    """One flag per field of the config dataclass `cls`, typed from its annotations, its help text from the
    field's metadata with the default appended; the parsed defaults stay None so that only the flags given
    override --config."""
    p.add_argument("--config", type=Path, metavar="FILE.json", help="a config.json written by an earlier run")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ())]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        shown = " ".join(map(str, default)) if isinstance(default, list) else default
        help_ = f"{f.metadata.get('help', '')} (default: {shown if shown not in ('', None) else 'none'})"
        help_ = help_.replace("%", "%%")
        t = _flag_type(hints[f.name])
        if typing.get_origin(t) is list:
            p.add_argument(*flags, dest=f.name, nargs="*", default=None, help=help_)
        elif t is bool:
            p.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=help_)
        else:
            p.add_argument(*flags, dest=f.name, type=t, default=None, help=help_)


def config_from_args(cls, args: argparse.Namespace):
    """The config: --config's file (unknown settings are an error), then every flag given on top."""
    values = {}
    if getattr(args, "config", None):
        try:
            values = json.loads(args.config.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read --config {args.config}: {e}") from None
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"{args.config}: unknown settings {sorted(unknown)}")
    for f in dataclasses.fields(cls):
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    return cls(**values)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`coda train`'s sub-commands: one per METHODS entry."""
    sub = p.add_subparsers(dest="method", required=True, title="methods", metavar="METHOD")
    for m in METHODS.values():
        s = sub.add_parser(m.name, help=m.help, description=m.help)
        add_config_arguments(s, m.config)
        s.add_argument("--quiet", action="store_true", help="no progress bar")


def main_train(args: argparse.Namespace) -> int:
    """Run the chosen method; print its summary. Errors are exceptions (ValueError, OSError, ...) that the
    `coda` command turns into one line and exit code 2."""
    method = METHODS[args.method]
    cfg = config_from_args(method.config, args)
    history = method.run(cfg, not args.quiet)
    if method.summary is not None:
        print(method.summary(cfg, history))
    return 0


__all__ = ["METHODS", "Method", "add_arguments", "add_config_arguments", "config_from_args", "main_train"]
