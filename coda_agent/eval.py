"""`coda eval`: run an agent over a task suite on a gymnasium vector env, and score it.

Written as it happens, under --out:
    trajectories/<task>__<episode>/steps.jsonl   one record per step (thought, action, parse errors, reward,
                                                 timings, every model call); step_NNN.png the screen after it
    episodes.jsonl                               one record per finished episode: what a rerun resumes from
At the end: results.json (summary + episodes, for `coda eval compare`), report/index.html and one page per
episode. Episodes in flight when a run dies are redone from the start on the rerun; finished ones are kept.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import time
from collections import defaultdict
from pathlib import Path

import gymnasium as gym
import numpy as np

from coda_env.backends import BACKENDS
from coda_env.runs import check_config, episode_name, load_finished, read_jsonl

from .policy import Agent
from .rollout import RunRecorder, make_env_pool, make_vector_env, run_episodes, step_record, unbatch_info  # noqa: F401


def run_eval(
    env_id: str,
    agent: Agent,
    out: Path,
    task_ids: list[str] | None = None,
    episodes: int = 1,
    num_envs: int = 1,
    seed: int = 0,
    env_kwargs: dict | None = None,
    progress: bool = True,
    config: dict | None = None,
    make_envs=None,
    lockstep: bool = False,
) -> dict:
    """Run `agent` on every task `episodes` times over `num_envs` envs; resume what `out` already holds
    (only when `config`, what made the run, is the same as the one stored there). `make_envs(n)` builds the
    envs: any VectorEnv with CodaEnv's `next_task`, or an EnvPool. By default, more than one env is an EnvPool
    (`make_env_pool`: no env waits for another), and with `lockstep` gymnasium's AsyncVectorEnv (every env
    steps together: the agent's batches are the same on a rerun, so sampling agents reproduce)."""
    from tqdm import tqdm

    t_start = time.monotonic()
    env_kwargs = dict(env_kwargs or {})
    probe = gym.make(env_id, **env_kwargs)  # the task table; opens no desktop until reset
    tasks = probe.unwrapped.tasks
    probe.close()
    ids = task_ids or list(tasks)
    unknown = [t for t in ids if t not in tasks]
    if unknown:
        raise ValueError(f"unknown tasks for {env_id}: {', '.join(unknown)} (`coda tasks` lists them)")
    check_config(
        out,
        {
            "env": env_id,
            "agent": getattr(agent, "name", type(agent).__name__),
            "tasks": ids,
            "seed": seed,
            **py_config(env_kwargs),
            **(config or {}),
        },
    )
    finished = load_finished(out)
    queue = [(t, e) for t in ids for e in range(episodes) if (t, e) not in finished]
    bar = tqdm(
        total=len(ids) * episodes,
        initial=len(ids) * episodes - len(queue),
        disable=not progress,
        unit="ep",
        dynamic_ncols=True,
    )
    successes = sum(r["success"] for r in finished.values())
    if queue:
        recorder = RunRecorder(out)

        def on_step(i, st, shot, reward, info, agent_s):
            ep = recorder.step(i, st, shot, reward, info, agent_s)
            bar.set_postfix_str(f"{ep.task.id} step {ep.steps} | successes {successes}", refresh=False)

        def on_end(i, reward, info):
            nonlocal successes
            rec = recorder.end(i, reward, info)
            finished[(rec["task"], rec["episode"])] = rec
            successes += rec["success"]
            bar.update(1)
            bar.set_postfix_str(f"successes {successes}")

        n = max(1, min(num_envs, len(queue)))
        if make_envs is None:
            make_envs = make_vector_env if n == 1 or lockstep else make_env_pool
            envs = make_envs(env_id, n, **env_kwargs)
        else:
            envs = make_envs(n)
        try:
            run_episodes(envs, agent, tasks, queue, recorder.start, on_step, on_end, seed=seed)
        finally:
            recorder.close()
            envs.close()
    bar.close()
    records = [finished[(t, e)] for t in ids for e in range(episodes) if (t, e) in finished]
    summary = summarize(records, episodes)
    summary.update(
        {
            "env": env_id,
            "agent": getattr(agent, "name", type(agent).__name__),
            "episodes": episodes,
            "num_envs": num_envs,
            "wall_seconds": round(time.monotonic() - t_start, 1),
        }
    )
    (out / "results.json").write_text(json.dumps({"summary": summary, "episodes": records}, indent=1))
    write_report(out, summary, records)
    return summary


# env settings that change how fast episodes run, never their results: not part of a run's config (a rerun
# with another value resumes)
SPEED_ONLY = frozenset({"swap_reset", "info_timings"})


def py_config(env_kwargs: dict) -> dict:
    """The env settings that change results, as JSON (a scorer object is named by its class)."""
    out = {}
    for k, v in env_kwargs.items():
        if k in SPEED_ONLY:
            continue
        if k == "reward" and not isinstance(v, str):
            cfg = getattr(v, "config", None)
            v = {
                "scorer": type(v).__name__,
                **(
                    {"models": [getattr(m, "spec", str(m)) for m in cfg.models], "threshold": cfg.threshold}
                    if cfg is not None
                    else {}
                ),
            }
        out[k] = v if isinstance(v, (str, int, float, bool, list, dict, type(None))) else repr(v)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with c successes in n samples (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(records: list[dict], episodes: int = 1) -> dict:
    def rate(rs):
        s = sum(r["success"] for r in rs)
        return {"n": len(rs), "success": s, "rate": round(s / len(rs), 4) if rs else 0.0}

    groups: dict[str, dict[str, list]] = {
        "app": defaultdict(list),
        "difficulty": defaultdict(list),
        "category": defaultdict(list),
        "origin": defaultdict(list),
    }
    per_task: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        for g in groups:
            key = origin_group(r.get("origin")) if g == "origin" else r.get(g)
            groups[g][key or "-"].append(r)
        per_task[r["task"]].append(r["success"])
    summary = {
        "overall": rate(records),
        "mean_steps": round(float(np.mean([r["steps"] for r in records])), 2) if records else 0.0,
        "parse_errors": sum(r.get("parse_errors", 0) for r in records),
        **{f"by_{g}": {k: rate(v) for k, v in sorted(d.items())} for g, d in groups.items()},
        "per_task": {t: round(sum(v) / len(v), 4) for t, v in per_task.items()},
    }
    if episodes > 1 and per_task:
        summary["pass_at_k"] = {
            str(k): round(float(np.mean([pass_at_k(len(v), sum(v), k) for v in per_task.values() if len(v) >= k])), 4)
            for k in range(1, episodes + 1)
        }
    return summary


def origin_group(origin: str | None) -> str:
    """Where a task came from, without the file: "scienceboard:KAlgebra/A-01" -> "scienceboard:KAlgebra"."""
    return (origin or "coda").split("/", 1)[0]


SECTIONS = ("by_app", "by_category", "by_difficulty", "by_origin")


def print_table(summary: dict, out: Path | None = None) -> None:
    print(
        f"\n{summary['env']}  agent={summary['agent']}  wall={summary['wall_seconds']}s  "
        f"mean steps={summary['mean_steps']}  parse errors={summary['parse_errors']}"
    )
    print(f"{'group':<34}{'episodes':>9}{'solved':>8}{'rate':>8}")
    for section in SECTIONS:
        for k, v in summary.get(section, {}).items():
            print(f"{section[3:] + ':' + k:<34}{v['n']:>9}{v['success']:>8}{v['rate']:>8.0%}")
    o = summary["overall"]
    print(f"{'overall':<34}{o['n']:>9}{o['success']:>8}{o['rate']:>8.0%}")
    for k, v in (summary.get("pass_at_k") or {}).items():
        print(f"pass@{k}: {v:.1%}")
    if out is not None:
        print(f"\nreport:  {out / 'report' / 'index.html'}\nresults: {out / 'results.json'}")


# ------------------------------------------------------------------------------------------ report
_CSS = (
    "body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
    "padding:4px 8px;vertical-align:top}.ok{color:#070}.bad{color:#a00}img{max-width:640px}"
    "pre{white-space:pre-wrap;max-width:640px;margin:0}"
)


def write_report(out: Path, summary: dict, records: list[dict]) -> None:
    """A static HTML report: index with the table and episodes, one page per episode (screens in order)."""
    rep = out / "report"
    rep.mkdir(exist_ok=True)
    e = html.escape
    rows = []
    for r in records:
        name = episode_name(r["task"], r["episode"])
        rows.append(
            f"<tr><td><a href='{e(name)}.html'>{e(r['task'])}</a></td><td>{r['episode']}</td>"
            f"<td>{e(str(r.get('category')))}</td><td>{e(str(r.get('difficulty')))}</td>"
            f"<td>{e(str(r.get('origin') or 'coda'))}</td>"
            f"<td class='{'ok' if r['success'] else 'bad'}'>{'pass' if r['success'] else 'fail'}</td>"
            f"<td>{r['steps']}</td><td>{r.get('parse_errors', 0)}</td><td>{e(str(r.get('error') or ''))}</td></tr>"
        )
        _episode_page(out, rep, r)
    groups = "".join(
        f"<tr><td>{e(sec[3:])}: {e(k)}</td><td>{v['n']}</td><td>{v['success']}</td><td>{v['rate']:.0%}</td></tr>"
        for sec in SECTIONS
        for k, v in summary.get(sec, {}).items()
    )
    o = summary["overall"]
    passk = "".join(f"<li>pass@{k}: {v:.1%}</li>" for k, v in (summary.get("pass_at_k") or {}).items())
    (rep / "index.html").write_text(
        f"<!doctype html><meta charset='utf-8'><title>coda eval: {e(summary['agent'])}</title><style>{_CSS}</style>"
        f"<h1>{e(summary['env'])} — agent {e(summary['agent'])}</h1><p>overall {o['success']}/{o['n']} "
        f"({o['rate']:.1%}), mean steps {summary['mean_steps']}, parse errors {summary['parse_errors']}, "
        f"wall {summary['wall_seconds']} s</p><ul>{passk}</ul><table><tr><th>group</th><th>episodes</th>"
        f"<th>solved</th><th>rate</th></tr>{groups}</table><h2>Episodes</h2><table><tr><th>task</th><th>ep</th>"
        f"<th>category</th><th>difficulty</th><th>origin</th><th>result</th><th>steps</th><th>parse errors</th>"
        f"<th>error</th>"
        f"</tr>{''.join(rows)}</table>"
    )


def _episode_page(out: Path, rep: Path, r: dict) -> None:
    e = html.escape
    name = episode_name(r["task"], r["episode"])
    traj = out / "trajectories" / name
    steps = read_jsonl(traj / "steps.jsonl")

    def shot(k: int) -> str:  # each screen links to its full-size PNG
        src = f"../trajectories/{e(name)}/step_{k:03d}.png"
        return f"<a href='{src}'><img src='{src}' alt='screen after step {k}'></a>"

    cells = [f"<tr><td>0 (start)</td><td>{shot(0)}</td><td></td></tr>"]
    for s in steps:
        notes = "".join(f"<div class='bad'>{e(p)}</div>" for p in s.get("parse_errors") or [])
        if s.get("action_error"):
            notes += f"<div class='bad'>action error: {e(s['action_error'])}</div>"
        plan = f"<p><b>Plan:</b> {e(s['plan'])}</p>" if s.get("plan") and s["plan"] != s["action"] else ""
        cells.append(
            f"<tr><td>{s['step']}</td><td>{shot(int(s['step']))}"
            f"</td><td><p><b>Thought:</b> {e(s.get('thought') or '')}</p>{plan}<p><b>Action:</b></p>"
            f"<pre>{e(s['action'])}</pre>{notes}</td></tr>"
        )
    verdict = "pass" if r["success"] else "fail"
    (rep / f"{name}.html").write_text(
        f"<!doctype html><meta charset='utf-8'><title>{e(name)}</title><style>{_CSS}</style>"
        f"<p><a href='index.html'>all episodes</a></p><h1>{e(r['task'])} (episode {r['episode']}): "
        f"<span class='{'ok' if r['success'] else 'bad'}'>{verdict}</span></h1>"
        f"<p><b>Instruction:</b> {e(r.get('instruction') or '')}</p><p>{r['steps']} steps, "
        f"{r['seconds']} s. Checks: {e(json.dumps(r.get('checks')))}</p><table><tr><th>step</th><th>screen after"
        f" the action</th><th>thought and action</th></tr>{''.join(cells)}</table>"
    )


# ------------------------------------------------------------------------------------------ compare
def compare(a: Path, b: Path) -> str:
    """Side-by-side success of two runs: overall, per group, and the tasks whose result changed."""
    ra, rb = (json.loads((p / "results.json" if p.is_dir() else p).read_text())["summary"] for p in (a, b))
    lines = [f"{'':<26}{'A':>8}{'B':>8}{'B-A':>8}", f"{'agent':<26}{ra['agent']:>8}{rb['agent']:>8}"]

    def row(label, x, y):
        lines.append(f"{label:<26}{x:>8.1%}{y:>8.1%}{y - x:>+8.1%}")

    row("overall", ra["overall"]["rate"], rb["overall"]["rate"])
    for sec in SECTIONS:
        for k in sorted(set(ra.get(sec, {})) | set(rb.get(sec, {}))):
            row(
                f"{sec[3:]}:{k}",
                ra.get(sec, {}).get(k, {}).get("rate", 0.0),
                rb.get(sec, {}).get(k, {}).get("rate", 0.0),
            )
    ta, tb = ra.get("per_task", {}), rb.get("per_task", {})
    changed = [t for t in sorted(set(ta) | set(tb)) if ta.get(t) != tb.get(t)]
    if changed:
        lines.append("changed tasks:")
        lines += [f"  {t:<24}{ta.get(t, float('nan')):>8.0%}{tb.get(t, float('nan')):>8.0%}" for t in changed]
    return "\n".join(lines)


def add_arguments(p) -> None:
    from .policy import AGENTS

    p.add_argument("--env", default="coda/KAlgebra-v0", help="env id (`coda envs` lists them)")
    p.add_argument("--agent", default="oracle", choices=AGENTS, help="the agent to evaluate")
    p.add_argument(
        "--tasks",
        nargs="*",
        default=None,
        help="task ids (default: the whole suite); task family names, or `families` for all, run --episodes "
        "instances of --split (`coda tasks APP --families` lists them)",
    )
    p.add_argument("--split", choices=("train", "val", "test"), default=None, help="the split of family instances")
    p.add_argument(
        "--tasks-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of your own task files, added to the app's (repeatable; also CODA_TASKS_PATH)",
    )
    p.add_argument("--episodes", type=int, default=1, help="episodes per task (k of pass@k)")
    p.add_argument(
        "--num-envs",
        type=int,
        default=1,
        help="envs run in parallel, each in its own process, none waiting for another",
    )
    p.add_argument(
        "--lockstep",
        action="store_true",
        help="step the envs together (gymnasium's AsyncVectorEnv): slower, but a sampling agent's batches, "
        "and so its samples, are the same on a rerun",
    )
    p.add_argument("--planner", help="planner checkpoint directory or http(s):// OpenAI-compatible endpoint")
    p.add_argument(
        "--executor",
        help="executor (UI-TARS-1.5) checkpoint directory or endpoint, or `a11y` (--agent "
        "coda: grounds the planner's step in the app's accessibility tree, no model)",
    )
    p.add_argument("--planner-model", help="model name at the planner endpoint (default: the first served)")
    p.add_argument("--executor-model", help="model name at the executor endpoint (default: the first served)")
    p.add_argument("--history", type=int, default=2, help="screenshots of earlier steps shown to the planner")
    p.add_argument("--max-steps", type=int, default=None, help="step budget instead of each task's own")
    p.add_argument(
        "--judge",
        action="append",
        default=None,
        metavar="PATH_OR_URL",
        help="score episodes with a VLM judge instead of the checks (repeat for an ensemble)",
    )
    p.add_argument("--judge-threshold", type=float, default=0.5, help="judge success = score >= this")
    p.add_argument("--backend", default="local", choices=tuple(BACKENDS), help="where the desktops run")
    p.add_argument(
        "--swap-reset",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="prepare each env's next episode on a second desktop while one runs, so a reset is a swap "
        "(default: on where the process has at least 4 cores)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the agent's sampling and the envs")
    p.add_argument("--out", default=None, help="run folder (default: runs/AGENT-DATE); rerun to resume")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main_eval(args) -> int:
    """`coda eval`: check every argument before anything is written, then run."""
    from .policy import make_agent

    if args.episodes < 1 or args.num_envs < 1:
        raise ValueError("--episodes and --num-envs must be >= 1")
    out = Path(args.out or f"runs/{args.agent}-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is an existing file, not a folder")
    env_kwargs: dict = {"max_steps": args.max_steps} if args.max_steps else {}
    if args.tasks_dir:
        env_kwargs["task_dirs"] = [str(Path(d).resolve()) for d in args.tasks_dir]
    if args.backend != "local":
        env_kwargs["backend"] = args.backend
    if args.swap_reset is not None:
        env_kwargs["swap_reset"] = args.swap_reset
    if args.judge:
        from .judge import Judge, JudgeConfig

        env_kwargs["reward"] = Judge(JudgeConfig(models=list(args.judge), threshold=args.judge_threshold))
    probe = gym.make(args.env, **env_kwargs)  # raises for an unknown env id, app or task folder
    base = probe.unwrapped
    app, screen, tasks = base.app_name, (base.width, base.height), base.tasks
    probe.close()
    episodes = args.episodes
    if args.tasks or args.split:  # family names become --episodes instances of --split, one episode each
        from coda_env.families import expand

        named = list(args.tasks or [])
        args.tasks = expand(app, named, args.split, args.episodes, args.seed, tasks.static)
        if args.tasks != named:
            episodes = 1
    unknown = [t for t in args.tasks or [] if t not in tasks]
    if unknown:
        raise ValueError(
            f"unknown task{'s' if len(unknown) > 1 else ''} for {args.env}: {', '.join(unknown)} "
            f"(`coda tasks {app}` lists them)"
        )
    agent = make_agent(
        args.agent,
        app,
        screen,
        args.planner,
        args.executor,
        args.planner_model,
        args.executor_model,
        args.history,
        args.seed,
    )
    if getattr(agent, "wants_a11y_tree", False):  # the a11y executor reads the a11y_tree observation
        env_kwargs["a11y_tree"] = True
    config = {
        k: v
        for k, v in {
            "planner": args.planner,
            "executor": args.executor,
            "planner_model": args.planner_model,
            "executor_model": args.executor_model,
        }.items()
        if v is not None
    }
    if args.planner or args.executor:  # what the models were shown
        config["history"] = args.history
    summary = run_eval(
        args.env,
        agent,
        out,
        args.tasks,
        episodes,
        args.num_envs,
        args.seed,
        env_kwargs,
        progress=not args.quiet,
        config=config,
        lockstep=args.lockstep,
    )
    print_table(summary, out)
    return 0
