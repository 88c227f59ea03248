"""The run folder: how `coda eval`, the trainers and the judge write and read episodes (one owner).

    OUT/config.json                               what made the run (env, agent, models, tasks): a rerun
                                                  resumes only the same configuration
    OUT/trajectories/<task>__<episode>/step_000.png   the first screen; step_NNN.png the screen after step N
    OUT/trajectories/<task>__<episode>/steps.jsonl    one record per step, written as it happens
    OUT/episodes.jsonl                            one record per finished episode: what a rerun resumes from
Every path built from data (task ids) is checked to stay inside OUT.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np


class RunError(ValueError):
    """A run folder cannot be used as asked (another configuration's episodes, a path outside it)."""


def inside(root: Path, *parts: str) -> Path:
    """root/parts..., refusing anything that would leave root (a task id of `../x`)."""
    base = root.resolve()
    p = base.joinpath(*parts).resolve()
    if p != base and base not in p.parents:
        raise RunError(f"{'/'.join(parts)!r} would be outside the run folder {root}")
    return p


def py(v: Any) -> Any:
    """numpy values -> JSON-safe Python values."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        return {k: py(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [py(x) for x in v]
    return v


def save_png(frame: np.ndarray, path: Path) -> None:
    from PIL import Image

    Image.fromarray(np.asarray(frame)).save(path, compress_level=1)


def read_png(path: Path) -> np.ndarray:
    """A stored screenshot as (H, W, 3) uint8 RGB."""
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file written as it happened; a line cut by a crash is skipped; a missing file
    has none."""
    out = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict):
                out.append(rec)
    return out


def append_jsonl(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(py(record)) + "\n")


def episode_name(task_id: str, episode: int) -> str:
    """An episode's file name: `<task>__<episode>`, a family instance's `family/seed` written `family@seed` (no
    task file id holds '@')."""
    return f"{task_id.replace('/', '@')}__{int(episode)}"


def trajectory_dir(out: Path, task_id: str, episode: int) -> Path:
    return inside(out, "trajectories", episode_name(task_id, episode))


class TrajectoryWriter:
    """One episode's files, written as it happens: step_000.png (the first screen), then per step a
    steps.jsonl record and step_NNN.png (the screen after it)."""

    def __init__(self, out: Path, task, episode: int, first_screenshot: np.ndarray):
        self.task, self.episode = task, episode
        self.dir = trajectory_dir(out, task.id, episode)
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in self.dir.glob("step_*.png"):
            old.unlink()
        save_png(first_screenshot, self.dir / "step_000.png")
        self.log = open(self.dir / "steps.jsonl", "w")
        self.steps, self.parse_errors, self.t0 = 0, 0, time.monotonic()

    def record(
        self, step: Mapping[str, Any], screenshot: np.ndarray, reward: float, info: dict, agent_seconds: float = 0.0
    ) -> None:
        """`step`: what the agent did (thought, plan, action, parse_errors, calls)."""
        self.steps += 1
        self.parse_errors += len(step.get("parse_errors") or [])
        save_png(screenshot, self.dir / f"step_{self.steps:03d}.png")
        self.log.write(
            json.dumps(
                py(
                    {
                        "task": self.task.id,
                        "episode": self.episode,
                        "step": self.steps,
                        "thought": step.get("thought", ""),
                        "plan": step.get("plan", ""),
                        "action": step.get("action", ""),
                        "parse_errors": step.get("parse_errors") or [],
                        "action_error": info.get("action_error"),
                        "reward": float(reward),
                        "error": info.get("error"),
                        "timings": {"agent": round(agent_seconds, 4), **(info.get("timings") or {})},
                        "calls": step.get("calls") or [],
                    }
                )
            )
            + "\n"
        )
        self.log.flush()

    def close(self) -> None:
        if not self.log.closed:
            self.log.close()

    def finish(self, reward: float, info: dict) -> dict:
        """Close the files; the episode's record (what episodes.jsonl holds)."""
        self.close()
        t = self.task
        return {
            "task": t.id,
            "episode": self.episode,
            "app": t.app,
            "difficulty": t.difficulty,
            "category": t.category,
            "origin": getattr(t, "origin", "coda"),
            "instruction": t.instruction,
            "success": bool(info.get("success")),
            "reward": float(reward),
            "steps": self.steps,
            "parse_errors": self.parse_errors,
            "seconds": round(time.monotonic() - self.t0, 3),
            "checks": py(info.get("checks")),
            "answer": info.get("answer"),
            "error": info.get("error"),
        }


def load_finished(out: Path) -> dict[tuple[str, int], dict]:
    """Finished episodes by (task, episode); a line cut by a crash is skipped, so that episode is redone."""
    return {(r["task"], r["episode"]): r for r in read_jsonl(out / "episodes.jsonl") if "task" in r and "episode" in r}


def check_config(out: Path, config: dict) -> None:
    """Write OUT/config.json, or, when OUT already holds a run, refuse unless it is the same configuration
    (resuming another agent's or task set's episodes under a new name would corrupt the results)."""
    path = out / "config.json"
    config = py(config)
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            old = None
        if isinstance(old, dict):
            diff = [
                f"{k}: {old.get(k)!r} -> {config.get(k)!r}"
                for k in sorted(set(old) | set(config))
                if old.get(k) != config.get(k)
            ]
            if diff:
                raise RunError(
                    f"{out} holds a run of another configuration ({'; '.join(diff)}); use another "
                    f"--out, or delete {out} to start over"
                )
            return
    elif (out / "episodes.jsonl").exists():
        raise RunError(f"{out} holds episodes of an unknown configuration (no config.json); use another --out")
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=1))


def load_episodes(run: Path) -> tuple[list[dict], list[dict]]:
    """(episodes to judge or learn from, skipped with the reason) of one run folder. Each episode: its
    episodes.jsonl record plus the step PNG paths in order, `check` (the checks' verdict) and the answer."""
    path = run / "episodes.jsonl"
    if not path.exists():
        raise RunError(f"{run} has no episodes.jsonl: not a `coda eval` run folder")
    records: dict[tuple[str, int], dict] = {}
    for rec in read_jsonl(path):
        if "task" in rec and "episode" in rec:
            records[(rec["task"], rec["episode"])] = rec  # a rerun's record replaces the earlier one
    good, skipped = [], []
    for (tid, ep), rec in records.items():
        where = {"run": str(run), "task": tid, "episode": ep, "app": rec.get("app")}
        instruction = rec.get("instruction")
        if instruction is None:
            try:
                from .tasks import load_tasks

                instruction = load_tasks(rec["app"])[tid].instruction
            except Exception as e:  # noqa: BLE001 - an old run whose task is gone: skipped, with the reason
                skipped.append({**where, "reason": f"task not in the registry: {e}"})
                continue
        try:
            traj = trajectory_dir(run, tid, ep)
        except (RunError, ValueError) as e:
            skipped.append({**where, "reason": str(e)})
            continue
        pngs = sorted(traj.glob("step_*.png"), key=lambda p: int(p.stem.split("_")[1]))
        steps = read_jsonl(traj / "steps.jsonl")
        if rec.get("error"):
            skipped.append({**where, "reason": f"the episode crashed: {rec['error']}"})
        elif not pngs or len(pngs) != len(steps) + 1:
            skipped.append({**where, "reason": f"{len(pngs)} screenshots for {len(steps)} steps in {traj}"})
        else:
            good.append(
                {
                    **where,
                    "check": bool(rec["success"]),
                    "instruction": instruction,
                    "pngs": pngs,
                    "answer": rec.get("answer"),
                }
            )
    return good, skipped
