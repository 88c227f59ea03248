"""The `coda` command.

    coda envs                          every env id, and whether it can run on this machine (if not, why)
    coda tasks APP [--tasks-dir DIR]   an app's tasks, and the task files that failed to load (with why)
    coda eval ...                      run an agent over a task suite (`coda eval compare A B` diffs two runs)
    coda train METHOD ...              train (methods: coda_agent.train.METHODS)
    coda judge calibrate ...           the VLM judge against the checks of stored episodes
    coda prm train|calibrate ...       the process reward model: train it on exact replay labels; measure it
    coda import-scienceboard SRC OUT   ScienceBoard's task files as coda task files
    coda data states|show ...          state datasets (oracle replays, run folders) for step-level training
    coda serve ENV_ID --port N         serve an env as an OpenEnv environment (the openenv extra)

Errors are one line on stderr and exit code 2, never a traceback. torch is imported only by the commands
that load a model.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

FORMAT = argparse.ArgumentDefaultsHelpFormatter


class CommandError(Exception):
    """A user error: printed as one line, exit code 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and `--help` for the rest), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    return Parser(prog=prog, description=description, formatter_class=FORMAT)


def _envs() -> int:
    from coda_env.backends.local.sandbox import probe
    from coda_env.registry import APPS, BROKEN_APPS

    why = probe()
    print("sandbox (local backend): " + ("apps run sealed (bubblewrap)" if why is None else f"unavailable: {why}"))
    width = max([len(s.env_id) for s in APPS.values()] + [10])
    for name, spec in sorted(APPS.items()):
        missing = spec.available()
        status = "ready" if missing is None else f"cannot run here: {missing}"
        print(f"{spec.env_id:<{width}}  app={name:<10}  {status}")
    for name, why in BROKEN_APPS.items():
        print(f"{'(app package ' + name + ')':<{width}}  failed to load: {why}")
    return 0


def _tasks(args: argparse.Namespace) -> int:
    from coda_env.registry import APPS
    from coda_env.tasks import broken_tasks, load_tasks

    if args.app not in APPS:
        close = difflib.get_close_matches(args.app, APPS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise CommandError(f"unknown app {args.app!r}{hint} (known: {', '.join(sorted(APPS))})")
    if args.families:
        return _families(args.app)
    dirs = [str(Path(d).resolve()) for d in args.tasks_dir]
    for tid, task in load_tasks(args.app, dirs).items():
        origin = "" if task.origin == "coda" else f"  [{task.origin}]"
        print(f"{tid:<32}{task.category:<14}{task.difficulty:<8}{task.instruction[:70]}{origin}")
    broken = broken_tasks(args.app, dirs)
    if broken:
        print(f"\n{len(broken)} broken task file(s), left out:")
        for path, why in broken.items():
            print(f"  {why}")
    return 0


def _families(app: str) -> int:
    from coda_env.families import SPLITS, families, split_sizes

    fams = families(app)
    if not fams:
        print(f"{app} registers no task families")
        return 0
    sample = 2000
    print(
        f"{'family':<20}{'instances':>10}  "
        + "".join(f"{s:>7}" for s in SPLITS)
        + f"  (distinct, first {sample} seeds)"
    )
    for name, fam in fams.items():
        sizes = split_sizes(fam, sample)
        print(f"{name:<20}{fam.size:>10}  " + "".join(f"{sizes[s]:>7}" for s in SPLITS) + f"  {fam.describe}")
        print(" " * 22 + "; ".join(f"{k}: {v}" for k, v in fam.space.items()))
    print("\ninstances are ids FAMILY/SEED; gym.make(..., tasks='families', split='train') draws them")
    return 0


def _import_scienceboard(argv: list[str]) -> int:
    p = _parser(
        "coda import-scienceboard",
        "Convert ScienceBoard task files (its tasks/VM/<App>/*.json layout, "
        "or a flat folder) into coda task files OUT/<app>/<id>.json plus OUT/import-report.json.",
    )
    p.add_argument("src", help="ScienceBoard's tasks folder (or a checkout, or a folder of task files)")
    p.add_argument("out", help="folder for the converted tasks (use it with --tasks-dir or CODA_TASKS_PATH)")
    from coda_env.scienceboard import import_folder, import_options

    known = import_options()
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an import option an app's translation takes (repeatable): "
        + ("; ".join(f"{k}: {v}" for k, v in sorted(known.items())) or "none here"),
    )
    args = p.parse_args(argv)
    options = {}
    for item in args.option:
        name, sep, value = item.partition("=")
        if not sep or name not in known:
            raise CommandError(
                f"--option {item!r}: want NAME=VALUE with NAME one of {', '.join(sorted(known)) or '(none)'}"
            )
        options[name] = value
    report = import_folder(Path(args.src), Path(args.out), **options)
    done = sum(1 for r in report["files"] if r["status"] == "converted")
    print(
        f"converted {done} of {len(report['files'])} files into {args.out} "
        f"(report: {Path(args.out) / 'import-report.json'})"
    )
    for app, counts in sorted(report["by_app"].items()):
        print(f"  {app:<12} converted {counts['converted']:>3}  refused {counts['refused']:>3}")
    return 0


def _serve(argv: list[str]) -> int:
    import os

    from coda_env.backends import BACKENDS

    p = _parser(
        "coda serve",
        "Serve an env as an OpenEnv environment (reset/step/state over a WebSocket at /ws; OpenEnv's EnvClient, "
        "TRL and other trainers connect to it). Each WebSocket session gets its own env (its own desktop and app), "
        "closed when the session ends. Needs the openenv extra: pip install 'coda[openenv]'.",
    )
    p.add_argument("env_id", help="the env id (`coda envs` lists them), e.g. coda/KAlgebra-v0")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0: any free one, printed)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument(
        "--max-sessions",
        type=int,
        default=os.cpu_count() or 1,
        help="sessions at once (each is a desktop and an app; about a core each while it steps)",
    )
    p.add_argument(
        "--session-timeout", type=float, default=None, help="close a session idle this many seconds (default: never)"
    )
    p.add_argument(
        "--tasks",
        nargs="*",
        default=None,
        help="the tasks a reset with no task picks from (seeded); task family names, or `families` for all",
    )
    p.add_argument("--split", choices=("train", "val", "test"), default=None, help="the split of family instances")
    p.add_argument(
        "--tasks-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your own task files, added to the app's (repeatable; also CODA_TASKS_PATH)",
    )
    p.add_argument("--max-steps", type=int, default=None, help="step budget instead of each task's own")
    p.add_argument("--a11y-tree", action="store_true", help="observations carry the app's accessibility tree")
    p.add_argument("--backend", default="local", choices=tuple(BACKENDS), help="where the desktops run")
    p.add_argument("--log-level", default="warning", help="the server's (uvicorn's) log level")
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: want 0-65535")
    if args.max_sessions < 1:
        raise ValueError("--max-sessions must be >= 1")
    if args.session_timeout is not None and args.session_timeout <= 0:
        raise ValueError("--session-timeout must be > 0")
    from coda_env import envs

    if args.env_id.removeprefix("coda_env:") not in envs():  # before the server's imports (seconds)
        close = difflib.get_close_matches(args.env_id, envs(), n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"{args.env_id!r} is not a coda env id ({hint}`coda envs` lists them)")
    import socket

    try:  # first, before the server's imports (seconds): a taken port is said at once
        sock = socket.create_server(
            (args.host, args.port), family=socket.AF_INET6 if ":" in args.host else socket.AF_INET
        )
    except OSError as e:
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    try:
        from coda_env.openenv import serve
    except ImportError as e:
        sock.close()
        raise ValueError(str(e)) from None
    env_kwargs: dict = {}
    if args.tasks:
        env_kwargs["tasks"] = list(args.tasks)
    if args.split:
        env_kwargs["split"] = args.split
    if args.tasks_dir:
        env_kwargs["task_dirs"] = [str(Path(d).resolve()) for d in args.tasks_dir]
    if args.max_steps:
        env_kwargs["max_steps"] = args.max_steps
    if args.a11y_tree:
        env_kwargs["a11y_tree"] = True
    if args.backend != "local":
        env_kwargs["backend"] = args.backend
    serve(
        args.env_id,
        args.host,
        args.port,
        env_kwargs,
        max_sessions=args.max_sessions,
        session_timeout=args.session_timeout,
        log_level=args.log_level,
        sock=sock,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except CommandError as e:
        print(f"coda: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("coda: interrupted", file=sys.stderr)
        return 130


def _fail(cmd: str, e: BaseException) -> int:
    print(f"coda {cmd}: error: {e}", file=sys.stderr)
    return 2


def _main(argv: list[str]) -> int:
    import coda_env  # noqa: F401  (registers the apps)
    from gymnasium import error as gym_error

    from coda_env.registry import AppError, CheckError, SetupError
    from coda_env.runs import RunError
    from coda_env.tasks import TaskError

    user_errors = (
        ValueError,
        RuntimeError,
        OSError,
        TaskError,
        AppError,
        CheckError,
        SetupError,
        RunError,
        gym_error.Error,
    )
    if argv[:2] == ["eval", "compare"]:
        c = _parser("coda eval compare", "Compare two eval runs: overall, per group, and changed tasks.")
        c.add_argument("a", help="a run's --out folder or its results.json")
        c.add_argument("b", help="the other run's --out folder or its results.json")
        args = c.parse_args(argv[2:])
        from .eval import compare

        try:
            print(compare(Path(args.a), Path(args.b)))
        except (OSError, ValueError, KeyError) as e:
            return _fail("eval compare", e)
        return 0
    if argv[:1] == ["judge"]:
        from .judge import add_calibrate_arguments, main_calibrate

        j = _parser(
            "coda judge calibrate",
            "Judge stored `coda eval` episodes with VLMs and compare the verdicts "
            "with their programmatic checks (precision, recall, agreement).",
        )
        add_calibrate_arguments(j)
        if argv[1:2] != ["calibrate"]:
            j.error("the judge command is: coda judge calibrate --runs RUN [RUN ...] --judge PATH_OR_URL")
        return main_calibrate(j.parse_args(argv[2:]))
    if argv[:1] == ["prm"]:
        from .prm import add_calibrate_arguments as add_prm_calibrate_arguments
        from .prm import add_train_arguments as add_prm_train_arguments
        from .prm import main_calibrate as prm_calibrate
        from .prm import main_train as prm_train

        usage = (
            "the prm commands are: coda prm train --data STATES... --env ENV --out DIR [--base CKPT] | "
            "coda prm calibrate --data STATES... --prm DIR|URL"
        )
        if argv[1:2] in (["-h"], ["--help"]):
            print(f"{usage[0].upper()}{usage[1:]} (each with --help for its settings)")
            return 0
        if argv[1:2] == ["train"]:
            q = _parser(
                "coda prm train",
                "Train a process reward model (PRO-CUA's reward): a Qwen2.5-VL checkpoint that answers YES or NO to "
                "'is this candidate step a good next step?', fine-tuned on exact replay labels of candidate steps "
                "(the labelled action and the other clickable elements, optionally planner samples) at the states "
                "of train-split tasks. Writes a checkpoint, prm.json and labels.jsonl to --out.",
            )
            add_prm_train_arguments(q)
            command, name = prm_train, "prm train"
        else:
            q = _parser(
                "coda prm calibrate",
                "Score candidate steps at stored states with a process reward model (a `coda prm train` folder, or "
                "a prompted VLM) and with the exact replay scorer; compare them: agreement, precision, recall, "
                "the majority-class rate, per app.",
            )
            add_prm_calibrate_arguments(q)
            if argv[1:2] != ["calibrate"]:
                _parser("coda prm", "The process reward model.").error(usage)
            command, name = prm_calibrate, "prm calibrate"
        try:
            return command(q.parse_args(argv[2:]))
        except user_errors as e:
            return _fail(name, e)
    if argv[:1] == ["data"]:
        from .states import add_arguments as add_data_arguments

        d = _parser(
            "coda data",
            "State datasets for step-level training: build one (`coda data states SOURCES... "
            "--out DIR`) from oracle replays and run folders, or count one (`coda data show DIR`).",
        )
        dsub = d.add_subparsers(dest="data_cmd", required=True, metavar="COMMAND", parser_class=Parser)
        add_data_arguments(dsub)
        args = d.parse_args(argv[1:])
        from .states import main_show, main_states

        try:
            return main_states(args) if args.data_cmd == "states" else main_show(args)
        except user_errors as e:
            return _fail(f"data {args.data_cmd}", e)
    if argv[:1] == ["serve"]:
        try:
            return _serve(argv[1:])
        except user_errors as e:
            return _fail("serve", e)
    if argv[:1] == ["import-scienceboard"]:
        try:
            return _import_scienceboard(argv[1:])
        except user_errors as e:
            return _fail("import-scienceboard", e)
    p = _parser(
        "coda",
        "Gymnasium environments on real scientific desktop applications, and the CODA "
        "planner-executor agent: list envs and tasks, evaluate agents, train, judge, import tasks.",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser("envs", help="list the env ids and whether each can run here", formatter_class=FORMAT)
    t = sub.add_parser("tasks", help="list an app's tasks (and broken task files)", formatter_class=FORMAT)
    t.add_argument("app", nargs="?", default="kalgebra", help="the app (`coda envs` lists them)")
    t.add_argument(
        "--tasks-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your own task files (repeatable; also CODA_TASKS_PATH)",
    )
    t.add_argument(
        "--families", action="store_true", help="list the app's task families: parameter space, size, splits"
    )
    from .eval import add_arguments

    add_arguments(
        sub.add_parser(
            "eval", help="run an agent over a task suite (or: coda eval compare A B)", formatter_class=FORMAT
        )
    )
    sub.add_parser("judge", help="coda judge calibrate: the VLM judge against stored episodes' checks")
    sub.add_parser(
        "prm", help="coda prm train|calibrate: the process reward model, trained on and measured against exact replays"
    )
    sub.add_parser("import-scienceboard", help="convert ScienceBoard's task files into coda task files")
    sub.add_parser("data", help="coda data states|show: state datasets for step-level training")
    sub.add_parser("serve", help="coda serve ENV_ID --port N: an env as an OpenEnv environment (WebSocket)")
    train = sub.add_parser(
        "train", help="train: coda train METHOD ... (coda train --help lists the methods)", formatter_class=FORMAT
    )
    if argv[:1] == ["train"]:  # torch is imported only for this command
        from .train import add_arguments as add_train_arguments

        add_train_arguments(train)
    args = p.parse_args(argv)
    if args.cmd == "envs":
        return _envs()
    if args.cmd == "tasks":
        try:
            return _tasks(args)
        except (TaskError, AppError) as e:
            raise CommandError(str(e)) from None
    if args.cmd == "train":
        from .train import main_train

        try:
            return main_train(args)
        except user_errors as e:
            return _fail(f"train {args.method}", e)
    from .eval import main_eval

    out = Path(args.out) if args.out else None
    existed = out is not None and out.exists()
    try:
        return main_eval(args)
    except user_errors as e:
        if out is not None and not existed and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # leave no empty --out behind
        return _fail("eval", e)


if __name__ == "__main__":
    sys.exit(main())
