"""The `coda` command: `coda envs`, `coda tasks APP`, `coda eval ...`, `coda eval compare A B`, `coda train
grpo|sft ...`, `coda judge calibrate --runs ... --judge ...` (the VLM judge against the checks, `coda_env.judge`).

`coda eval` (in `coda_agent.eval`) runs an agent over a task suite and writes the trajectory as it happens:
one JSONL record and one PNG per step under `--out`, so a crash loses at most the step in flight, and a
rerun with the same `--out` resumes. This module imports no torch; model-backed agents import it on use.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    import coda_env
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["eval", "compare"]:
        c = argparse.ArgumentParser(prog="coda eval compare", description="compare two eval runs")
        c.add_argument("a", help="a run's --out folder or its results.json")
        c.add_argument("b")
        args = c.parse_args(argv[2:])
        from coda_agent.eval import compare
        print(compare(Path(args.a), Path(args.b)))
        return 0
    if argv[:1] == ["judge"]:
        from .judge import add_calibrate_arguments, main_calibrate
        j = argparse.ArgumentParser(prog="coda judge calibrate",
                                    description="judge stored `coda eval` episodes; compare with their checks")
        add_calibrate_arguments(j)
        if argv[1:2] != ["calibrate"]:
            j.error("the judge command is: coda judge calibrate --runs RUN [RUN ...] --judge PATH_OR_URL")
        return main_calibrate(j.parse_args(argv[2:]))
    p = argparse.ArgumentParser(prog="coda", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("envs", help="list the registered env ids")
    sub.add_parser("judge", help="coda judge calibrate: the VLM judge against stored episodes' checks")
    t = sub.add_parser("tasks", help="list an app's tasks")
    t.add_argument("app", nargs="?", default="kalgebra")
    from coda_agent.eval import add_arguments
    add_arguments(sub.add_parser("eval", help="run an agent over a task suite (or: coda eval compare A B)"))
    train = sub.add_parser("train", help="train: coda train METHOD ... (coda train --help lists the methods)")
    if argv[:1] == ["train"]:                   # torch is imported only for this command
        from coda_agent.train import add_arguments as add_train_arguments
        add_train_arguments(train)
    args = p.parse_args(argv)
    if args.cmd == "envs":
        for env_id, app in coda_env.ENVS.items():
            print(f"{env_id}\tapp={app}")
        return 0
    if args.cmd == "tasks":
        from .tasks import load_tasks
        for tid, task in load_tasks(args.app).items():
            print(f"{tid:<28}{task.category:<12}{task.difficulty:<8}{task.instruction[:70]}")
        return 0
    if args.cmd == "train":
        from coda_agent.train import main_train
        try:
            return main_train(args)
        except (ValueError, RuntimeError, OSError) as e:   # ModelError, bad config, missing checkpoint ...
            print(f"coda train {args.method}: error: {e}", file=sys.stderr)
            return 2
    from coda_agent.eval import main_eval
    try:
        return main_eval(args)
    except (ValueError, RuntimeError) as e:     # ModelError, unknown task/agent, missing --planner ...
        print(f"coda eval: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
