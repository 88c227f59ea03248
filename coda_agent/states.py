"""State datasets: the unit of step-level training (CODA's stage 1, Co-EPG, PRO-CUA).

A state is what the planner sees at one step of a task (the instruction, its earlier turns, the last
screenshots) plus the labelled positive action a_T for that step in the env's action language and, for a
pointer action, the box of the element under its point in the app's accessibility tree (or a radius where
there is no tree). A dataset is a Hugging Face `datasets.Dataset` saved to disk (`save_to_disk`), one row
per state, with these columns (the contract trainers code against):

    id           str     unique: "oracle:<task>:<step>" or "run:<folder>:<task>__<episode>:<step>"
    app          str     the app (kalgebra, ...)
    task         str     the task id
    step         int     the planner's step number (1-based: "Step N" of its prompt)
    source       str     "oracle" | "run:<folder>"
    instruction  str     the task's instruction
    history      str     JSON list of {"thought", "action"} of the earlier turns, oldest first, as the planner
                         remembers them (its thought, and its step in words or the env action)
    images       [Image] the screenshots the planner sees at that step, oldest first, the current one last
    target       str     the labelled action a_T (env action language)
    box          [int32] (left, top, right, bottom) screen pixels of the target element, edges included; []
                         when there is none
    radius       float   the target disc's radius around the target's point, used when box is []
    screen       [int32] [width, height]
    a11y         str     the a11y table (the env's `a11y_tree` observation) at that state, "" when unknown: what
                         the a11y executor grounds in (an extra column beside the contract's)

`planner_conversation(record, ...)` rebuilds the planner's prompt exactly as coda_agent.planner.Planner
builds it live (it is that code); `state_observation(record)` is the env observation the executor gets.

Sources: `oracle_states` replays the tasks' oracle solutions in the real env, recording the state before each
action (a solution's multi-statement action is split into executor-sized steps: one click, one typed text with
its enter, one key, ...; each earlier step is remembered in words, as a planner would have said it:
`describe_action`); `run_states` reads the successful episodes of run folders (`coda eval`, `coda train`
rollouts; success by the checks or by a VLM judge), one state per step whose action was performed.
Commands: `coda data states SOURCES... --out DIR`, `coda data show DIR`.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from coda_env.a11y import Element, element_at, parse_table
from coda_env.actions import ActionError, parse_action

from . import prompts
from .planner import Planner, Turn
from .steps import DEFAULT_RADIUS, action_type
from .types import Conversation

BOX_MAX_FRACTION = 1 / 8  # an element larger than this share of the screen is no target box
_NO_BOX_ROLES = frozenset(
    {"frame", "page tab list", "status bar", "application", "filler", "panel", "layered pane", "scroll pane", "window"}
)
COLUMNS = (
    "id",
    "app",
    "task",
    "step",
    "source",
    "instruction",
    "history",
    "images",
    "target",
    "box",
    "radius",
    "screen",
    "a11y",
)
_POINTER = {
    "click": "Click",
    "double_click": "Double-click",
    "triple_click": "Triple-click",
    "right_click": "Right-click",
    "middle_click": "Middle-click",
    "move": "Hover over",
}
_NOUN = {
    "page tab": "tab",
    "push button": "button",
    "toggle button": "button",
    "tree item": "item",
    "list item": "item",
    "table cell": "cell",
    "text": "field",
    "entry": "field",
    "spin box": "field",
}


def features():
    """The dataset's `datasets.Features` (COLUMNS, typed)."""
    from datasets import Features, Image, Sequence, Value

    return Features(
        {
            "id": Value("string"),
            "app": Value("string"),
            "task": Value("string"),
            "step": Value("int32"),
            "source": Value("string"),
            "instruction": Value("string"),
            "history": Value("string"),
            "images": Sequence(Image()),
            "target": Value("string"),
            "box": Sequence(Value("int32")),
            "radius": Value("float32"),
            "screen": Sequence(Value("int32")),
            "a11y": Value("string"),
        }
    )


# ------------------------------------------------------------------------------------------ labels
def split_action(code: str, screen: tuple[int, int] = (1280, 800)) -> list[str]:
    """An action string -> executor-sized actions, each one canonical step (coda_agent.steps): a
    pointer action, a drag (moveTo + dragTo), a typed text with the enter that submits it, a key, a scroll,
    a terminal answer. Sleeps are no step (no executor makes them): they are left out here (`executor_steps` keeps
    them for the replay). Raises ActionError when `code` does not parse."""
    return [label for label, _ in executor_steps(code, screen)]


def executor_steps(code: str, screen: tuple[int, int]) -> list[tuple[str, str]]:
    """(label, code to perform) per executor-sized step, as `oracle_states` performs a solution's actions and
    as a replay rebuilds a state: the code keeps the sleeps around the step (before it; trailing ones after the
    last step)."""
    acts = parse_action(code, screen)
    groups: list[tuple[list, list]] = []  # (the step's actions, the sleeps before it)
    pending: list = []
    i = 0
    while i < len(acts):
        a, nxt = acts[i], acts[i + 1] if i + 1 < len(acts) else None
        if a.kind == "sleep":
            pending.append(a)
            i += 1
            continue
        pair = (a.kind == "move" and nxt is not None and nxt.kind == "drag") or (
            a.kind == "type" and nxt is not None and nxt.kind == "press" and nxt.keys == ("enter",) and nxt.presses == 1
        )
        groups.append(([a, nxt] if pair else [a], pending))
        pending = []
        i += 2 if pair else 1
    if not groups:  # only sleeps: performed, no step of their own
        return []
    out = []
    for k, (step, before) in enumerate(groups):
        after = pending if k == len(groups) - 1 else []
        label = "\n".join(x.to_pyautogui() for x in step)
        out.append((label, "\n".join(x.to_pyautogui() for x in [*before, *step, *after])))
    return out


def _first_point(code: str, screen: tuple[int, int]) -> tuple[int, int] | None:
    for a in parse_action(code, screen):
        if a.kind in ("click", "move", "drag", "mouse_down", "mouse_up") and a.x is not None and a.y is not None:
            return a.x, a.y
        if a.kind not in ("sleep",):
            return None
    return None


def target_element(code: str, elements: Sequence[Element], screen: tuple[int, int]) -> Element | None:
    """The element under a pointer action's (first) point: the smallest on-screen element there that is no
    container and no larger than BOX_MAX_FRACTION of the screen; None for other actions or where none is."""
    p = _first_point(code, screen)
    if p is None:
        return None
    return element_at(
        [e for e in elements if e.role not in _NO_BOX_ROLES], *p, max_area=int(screen[0] * screen[1] * BOX_MAX_FRACTION)
    )


def _q(s: str) -> str:
    return repr(s) if "'" not in s or '"' in s else f'"{s}"'


def describe_action(code: str, elements: Sequence[Element] = (), screen: tuple[int, int] = (1280, 800)) -> str:
    """An action in words, as a planner would say the step, naming the element under a pointer action from
    the a11y table when it has a name (which the a11y executor grounds back): "Click the '3D Graph' tab",
    "Type 'x:=2' and press enter", "Press ctrl+a", "DONE"."""
    acts = [a for a in parse_action(code, screen) if a.kind != "sleep"] or parse_action(code, screen)
    words = []
    inputs = [e for e in elements if e.role in ("text", "entry", "spin box")]
    i = 0
    while i < len(acts):
        a, nxt = acts[i], acts[i + 1] if i + 1 < len(acts) else None
        k = a.kind
        if k in ("done", "fail", "wait", "answer"):
            words.append(a.to_pyautogui())
        elif k == "type":
            submit = nxt is not None and nxt.kind == "press" and nxt.keys == ("enter",) and nxt.presses == 1
            words.append(f"Type {_q(a.text)}" + (" and press enter" if submit else ""))
            i += submit
        elif k in ("press", "hotkey"):
            words.append("Press " + "+".join(a.keys) + (f" {a.presses} times" if a.presses > 1 else ""))
        elif k in ("key_down", "key_up"):
            words.append(("Hold down " if k == "key_down" else "Release ") + a.keys[0])
        elif k in ("scroll", "hscroll"):
            d = ("up" if a.amount > 0 else "down") if k == "scroll" else ("left" if a.amount > 0 else "right")
            where = ""
            e = element_at(elements, a.x, a.y) if a.x is not None and a.y is not None else None
            if e is not None and e.name:
                where = f" in the {_q(e.name)} {_NOUN.get(e.role, e.role)}"
            words.append(f"Scroll {d} {abs(a.amount)} times{where}")
        elif k == "move" and nxt is not None and nxt.kind == "drag":
            words.append(f"Drag from ({a.x}, {a.y}) to ({nxt.x}, {nxt.y})")
            i += 1
        elif k in _POINTER or k == "click":
            t = (
                {
                    ("left", 1): "click",
                    ("left", 2): "double_click",
                    ("left", 3): "triple_click",
                    ("right", 1): "right_click",
                    ("middle", 1): "middle_click",
                }.get((a.button, a.clicks), "click")
                if k == "click"
                else k
            )
            verb = _POINTER.get(t, "Click")
            e = target_element(a.to_pyautogui(), elements, screen) if a.x is not None else None
            if e is not None and e.name and sum(x.name == e.name and x.role == e.role for x in elements) == 1:
                words.append(f"{verb} the {_q(e.name)} {_NOUN.get(e.role, e.role)}")
            elif e is not None and e.role in ("text", "entry", "spin box") and len(inputs) == 1:
                words.append(f"{verb} the input field")
            elif a.x is not None:
                words.append(f"{verb} at ({a.x}, {a.y})")
            else:
                words.append(verb)
        else:
            words.append(a.to_pyautogui())
        i += 1
    return ", then ".join(words)


# ------------------------------------------------------------------------------------------ records
def _png(frame: np.ndarray) -> dict:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.asarray(frame)).save(buf, format="PNG", compress_level=1)
    return {"bytes": buf.getvalue(), "path": None}


def _record(
    *,
    id: str,
    app: str,
    task: str,
    step: int,
    source: str,
    instruction: str,
    history: list[dict],
    images: list,
    target: str,
    box: tuple | None,
    radius: float,
    screen: tuple[int, int],
    a11y: str,
) -> dict:
    return {
        "id": id,
        "app": app,
        "task": task,
        "step": int(step),
        "source": source,
        "instruction": instruction,
        "history": json.dumps(history),
        "images": images,
        "target": target,
        "box": [int(v) for v in box] if box else [],
        "radius": float(radius),
        "screen": [int(screen[0]), int(screen[1])],
        "a11y": a11y or "",
    }


def oracle_states(
    env_id: str = "coda/KAlgebra-v0",
    tasks: Sequence[str] | None = None,
    task_dirs: Sequence[str] | None = None,
    history_images: int = 2,
    radius: float = DEFAULT_RADIUS,
    report: dict | None = None,
    progress: Callable[[str], None] | None = None,
) -> Iterator[dict]:
    """States of the tasks' oracle solutions replayed in the real env, each recorded before its action. A
    task whose replay does not succeed (its checks fail, an action errs) gives no states; `report` (when
    given) gets per-task counts and the reasons tasks were left out."""
    import gymnasium as gym

    kwargs: dict[str, Any] = {"a11y_tree": True, "max_steps": 10_000}
    if task_dirs:
        kwargs["task_dirs"] = [str(Path(d).resolve()) for d in task_dirs]
    env = gym.make(env_id, **kwargs)
    report = report if report is not None else {}
    report.setdefault("tasks", {})
    report.setdefault("left_out", {})
    try:
        base = env.unwrapped
        screen = (base.width, base.height)
        ids = list(tasks or base.tasks)
        unknown = [t for t in ids if t not in base.tasks]
        if unknown:
            raise ValueError(f"unknown tasks for {env_id}: {', '.join(unknown)}")
        for tid in ids:
            task = base.tasks[tid]
            if not task.solution:
                report["left_out"][tid] = "the task has no oracle solution"
                continue
            if progress:
                progress(tid)
            records, why = _replay(env, task, screen, history_images, radius)
            if why:
                report["left_out"][tid] = why
                continue
            report["tasks"][tid] = len(records)
            yield from records
    finally:
        env.close()


def solution_steps(task, screen: tuple[int, int]) -> list[tuple[str, str]]:
    """A task's oracle solution as (label, code to perform) per executor-sized step (`executor_steps` of each
    action), an action of sleeps only performed with the next step: the steps `oracle_states` records, and
    what a replay of an oracle state performs."""
    pieces: list[tuple[str, str]] = []
    carry = ""
    for action in task.solution:
        got = executor_steps(action, screen)
        if not got:
            carry = f"{carry}\n{action}".strip()
            continue
        if carry:
            got[0], carry = (got[0][0], f"{carry}\n{got[0][1]}"), ""
        pieces += got
    return pieces


def _replay(env, task, screen, history_images: int, radius: float) -> tuple[list[dict], str | None]:
    obs, info = env.reset(options={"task": task.id})
    pieces = solution_steps(task, screen)
    history: list[dict] = []
    shots: list[dict] = []
    records = []
    term = trunc = False
    for n, (piece, run) in enumerate(pieces, 1):
        table = obs.get("a11y_tree", "")
        elements = parse_table(table)
        current = _png(obs["screenshot"])
        el = target_element(piece, elements, screen)
        earlier = shots[len(shots) - min(history_images, len(shots)) :] if history_images > 0 else []
        records.append(
            _record(
                id=f"oracle:{task.id}:{n}",
                app=task.app,
                task=task.id,
                step=n,
                source="oracle",
                instruction=task.instruction,
                history=list(history),
                images=[*earlier, current],
                target=piece,
                box=el.box if el is not None else None,
                radius=radius,
                screen=screen,
                a11y=table,
            )
        )
        history.append({"thought": "", "action": describe_action(piece, elements, screen)})
        shots.append(current)
        obs, reward, term, trunc, info = env.step(run)
        if info.get("action_error"):
            return [], f"step {n} ({piece!r}) failed: {info['action_error']}"
        if term or trunc:
            break
    if not term:
        return [], "the solution ended without a terminal answer (DONE/ANS)"
    if not info.get("success"):
        return [], f"the replayed solution did not pass the checks: {info.get('error') or info.get('checks')}"
    return records, None


def keep_performed(step: dict) -> bool:
    """A run's step is a label when its action was performed: not a WAIT that stands for a parse error, not
    an action the env refused."""
    if step.get("action_error"):
        return False
    return not (step.get("action") == "WAIT" and step.get("parse_errors"))


def run_states(
    run: str | Path,
    judge=None,
    history_images: int = 2,
    radius: float = DEFAULT_RADIUS,
    keep_episode: Callable[[dict], bool] | None = None,
    keep_step: Callable[[dict], bool] = keep_performed,
    report: dict | None = None,
) -> Iterator[dict]:
    """States of the successful episodes of one run folder (episodes.jsonl + trajectories/): success by the
    checks, or by `judge` (a coda_agent.judge.Judge) when given; `keep_episode` overrides both. Each kept
    step (`keep_step`) is one state: the screenshot before it, the history as the agent kept it (thought, and
    its step in words or the env action), and the action it performed as the label (no box: a run folder
    holds no accessibility tree, so `radius` stands for it)."""
    from coda_env.runs import load_episodes, read_jsonl

    run = Path(run)
    source = f"run:{run}"
    episodes, skipped = load_episodes(run)
    report = report if report is not None else {}
    counts = report.setdefault("runs", {}).setdefault(
        str(run), {"episodes": 0, "kept": 0, "states": 0, "skipped": len(skipped)}
    )
    for ep in episodes:
        counts["episodes"] += 1
        if keep_episode is not None:
            keep = keep_episode(ep)
        elif judge is not None:
            from coda_env.runs import read_png

            keep = judge.judge(ep["instruction"], [read_png(p) for p in ep["pngs"]], ep.get("answer")).success
        else:
            keep = bool(ep["check"])
        if not keep:
            continue
        counts["kept"] += 1
        pngs = ep["pngs"]
        steps = read_jsonl(pngs[0].parent / "steps.jsonl")
        from PIL import Image

        with Image.open(pngs[0]) as im:
            screen = im.size
        shots = [{"bytes": p.read_bytes(), "path": None} for p in pngs]
        history: list[dict] = []
        for k, st in enumerate(steps):
            action = st.get("action", "")
            try:
                parse_action(action, screen)
                ok = keep_step(st)
            except ActionError:
                ok = False
            if ok:
                earlier = shots[max(0, k - history_images) : k] if history_images > 0 else []
                counts["states"] += 1
                yield _record(
                    id=f"{source}:{ep['task']}__{ep['episode']}:{k + 1}",
                    app=ep["app"] or "",
                    task=ep["task"],
                    step=k + 1,
                    source=source,
                    instruction=ep["instruction"],
                    history=list(history),
                    images=[*earlier, shots[k]],
                    target=action,
                    box=None,
                    radius=radius,
                    screen=screen,
                    a11y="",
                )
            history.append({"thought": st.get("thought", ""), "action": st.get("plan") or action})


def build(records: Iterable[dict], out: str | Path):
    """Write the records as a `datasets` dataset to `out` (save_to_disk); returns the dataset."""
    from datasets import Dataset

    rows = list(records)
    if not rows:
        raise ValueError("no states to write (no successful episodes or oracle replays in the sources)")
    ds = Dataset.from_list(rows, features=features())
    ds.save_to_disk(str(out))
    return ds


def load(path: str | Path):
    """A state dataset written by `build` (`datasets.load_from_disk`), its columns checked."""
    from datasets import load_from_disk

    p = Path(path)
    if not (p / "dataset_info.json").exists() and not (p / "state.json").exists():
        raise ValueError(f"{p} is not a state dataset (no datasets files there; `coda data states` writes one)")
    ds = load_from_disk(str(p))
    missing = [c for c in COLUMNS if c not in ds.column_names]
    if missing:
        raise ValueError(f"{p} is not a state dataset: it lacks the columns {missing}")
    return ds


def load_checked(path: str | Path):
    """One state dataset folder for training or scoring (the trainers' `load_states`, the PRM's `load_rows`):
    `datasets.load_from_disk` with its problems as one-line ValueErrors naming the folder (missing, not a
    dataset, several splits, columns missing (the optional a11y aside), no rows)."""
    from datasets import load_from_disk

    p = Path(path)
    if not p.exists():
        raise ValueError(f"state dataset {str(p)!r} does not exist (make one with `coda data states ...`)")
    if _saved_empty(p):
        raise ValueError(f"{p} holds no states")
    try:
        ds = load_from_disk(str(p))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise ValueError(f"{p} is not a state dataset saved by `coda data states`: {str(e).splitlines()[0]}") from None
    if hasattr(ds, "keys") and not hasattr(ds, "column_names"):  # a DatasetDict
        raise ValueError(f"{p} holds several splits ({', '.join(ds.keys())}); give one split's folder")
    missing = [c for c in COLUMNS if c != "a11y" and c not in ds.column_names]
    if missing:
        raise ValueError(f"{p} is not a state dataset: columns {missing} are missing")
    if len(ds) == 0:
        raise ValueError(f"{p} holds no states")
    return ds


def _saved_empty(folder: Path) -> bool:
    """A dataset saved with no rows: `datasets` writes it as no data files, which load_from_disk cannot read."""
    try:
        return json.loads((folder / "state.json").read_text()).get("_data_files") == []
    except (OSError, ValueError, AttributeError):
        return False


# ------------------------------------------------------------------------------------------ prompts
def _array(image) -> np.ndarray:
    from PIL import Image

    if isinstance(image, np.ndarray):
        return image
    if isinstance(image, dict):
        image = Image.open(io.BytesIO(image["bytes"]))
    return np.asarray(image.convert("RGB"))


def history_turns(record: dict) -> tuple[list[Turn], np.ndarray]:
    """The record's earlier turns (with the screenshots it stores for the last of them) and current screen."""
    hist = json.loads(record["history"])
    images = [_array(im) for im in record["images"]]
    earlier, current = images[:-1], images[-1]
    first = len(hist) - len(earlier)
    turns = [
        Turn(earlier[i - first] if i >= first else None, h.get("thought", ""), h.get("action", ""))
        for i, h in enumerate(hist)
    ]
    return turns, current


def planner_conversation(
    record: dict, planner: Planner | None = None, *, history_images: int | None = None, system: str | None = None
) -> Conversation:
    """The planner's prompt at the record's state, built by coda_agent.planner.Planner.conversation itself
    (so it is exactly what the live agent builds): system prompt for the record's app and screen, the task,
    the earlier turns with the stored screenshots of the last `history_images` of them, the current screen.
    `planner` (its history_images and system prompt) or the two settings; by default as many earlier
    screenshots as the record stores. Asking for more than it stores raises ValueError."""
    turns, current = history_turns(record)
    stored = len(record["images"]) - 1
    h = history_images if history_images is not None else planner.history_images if planner is not None else stored
    if h > stored and len(turns) > stored:
        raise ValueError(f"state {record['id']} stores {stored} earlier screenshots; the planner wants {h}")
    sys_prompt = system if system is not None else planner.system if planner is not None else prompts.PLANNER_SYSTEM
    p = Planner(
        None,
        record["app"],
        screen=(int(record["screen"][0]), int(record["screen"][1])),  # type: ignore
        history_images=h,
        system=sys_prompt,
    )
    return p.conversation(record["instruction"], turns, current)


def state_observation(record: dict) -> dict:
    """The env observation at the record's state, as an executor gets it (screenshot, instruction, a11y_tree)."""
    return {
        "screenshot": _array(record["images"][-1]),
        "instruction": record["instruction"],
        "a11y_tree": record.get("a11y") or "",
    }


# ------------------------------------------------------------------------------------------ commands
def add_arguments(sub) -> None:
    """`coda data states` and `coda data show`."""
    import argparse

    fmt = argparse.ArgumentDefaultsHelpFormatter
    s = sub.add_parser(
        "states",
        formatter_class=fmt,
        help="build a state dataset from oracle replays and run folders",
        description="Build a state dataset (datasets.save_to_disk) for step-level training: "
        "SOURCES are `oracle` (the env's tasks' oracle solutions replayed in the real env) and/or "
        "run folders (`coda eval` / `coda train` rollouts; globs allowed), whose successful "
        "episodes (by their checks, or by --judge) give one state per performed step.",
    )
    s.add_argument("sources", nargs="+", metavar="SOURCE", help="`oracle` or a run folder (glob allowed)")
    s.add_argument("--out", required=True, help="folder for the dataset (must not exist, or be empty)")
    s.add_argument("--env", default="coda/KAlgebra-v0", help="env id whose tasks `oracle` replays")
    s.add_argument("--tasks", nargs="*", default=None, help="task ids for `oracle` (default: all with a solution)")
    s.add_argument("--tasks-dir", action="append", default=[], metavar="DIR", help="more task files for `oracle`")
    s.add_argument(
        "--split",
        choices=("train", "val", "test"),
        default=None,
        help="with task families in --tasks (or `--tasks families`): replay --limit instances of this split",
    )
    s.add_argument("--limit", type=int, default=100, help="family instances to replay (with --split)")
    s.add_argument("--seed", type=int, default=0, help="which family instances: the seed that draws them")
    s.add_argument(
        "--judge",
        action="append",
        default=None,
        metavar="PATH_OR_URL",
        help="decide run folders' success with a VLM judge instead of the checks (repeat: an ensemble)",
    )
    s.add_argument("--judge-threshold", type=float, default=0.5, help="judge success = score >= this")
    s.add_argument("--history", type=int, default=2, help="screenshots of earlier steps stored with each state")
    s.add_argument(
        "--radius",
        type=float,
        default=DEFAULT_RADIUS,
        help="pixels around a target point that count as on target where there is no element box",
    )
    s.add_argument("--quiet", action="store_true", help="no progress lines")
    w = sub.add_parser(
        "show",
        formatter_class=fmt,
        help="counts of a state dataset per app, action type, source",
        description="Counts of a state dataset's states per app, action type and source.",
    )
    w.add_argument("dir", help="the dataset folder (`coda data states --out`)")


def _sources(items: Sequence[str]) -> list[str | Path]:
    import glob

    out: list[str | Path] = []
    for s in items:
        if s == "oracle":
            out.append("oracle")
            continue
        found = sorted(glob.glob(s)) if any(c in s for c in "*?[") else [s]
        runs = [Path(d) for d in found if (Path(d) / "episodes.jsonl").exists()]
        if not runs:
            raise ValueError(f"source {s!r} is neither `oracle` nor a run folder (a folder with episodes.jsonl)")
        out += runs
    return out


def main_states(args) -> int:
    if args.history < 0 or args.radius < 0:
        raise ValueError("--history and --radius must be >= 0")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an empty folder")
    sources = _sources(args.sources)
    tasks = args.tasks
    if tasks or args.split:
        import gymnasium as gym

        from coda_env.families import expand

        if args.limit < 1:
            raise ValueError("--limit must be >= 1")
        from coda_env.tasks import load_tasks

        app = gym.spec(args.env).kwargs.get("app", "")
        dirs = [str(Path(d).resolve()) for d in args.tasks_dir]
        tasks = expand(app, tasks or [], args.split, args.limit, args.seed, load_tasks(app, dirs))
    judge = None
    if args.judge:
        from .judge import Judge, JudgeConfig

        judge = Judge(JudgeConfig(models=list(args.judge), threshold=args.judge_threshold))
    report: dict = {}
    say = (lambda m: None) if args.quiet else (lambda m: print(m, flush=True))
    if args.quiet:
        from datasets.utils.logging import disable_progress_bar

        disable_progress_bar()
    t0 = time.monotonic()

    def records() -> Iterator[dict]:
        for src in sources:
            if src == "oracle":
                say(f"oracle replays of {args.env}")
                yield from oracle_states(
                    args.env,
                    tasks,
                    args.tasks_dir,
                    args.history,
                    args.radius,
                    report,
                    progress=lambda t: say(f"  {t}"),
                )
            else:
                say(f"run folder {src}")
                yield from run_states(src, judge, args.history, args.radius, report=report)

    ds = build(records(), out)
    seconds = time.monotonic() - t0
    for tid, why in report.get("left_out", {}).items():
        print(f"left out {tid}: {why}")
    for run, c in report.get("runs", {}).items():
        print(f"{run}: {c['kept']} of {c['episodes']} episodes kept ({c['skipped']} unreadable), {c['states']} states")
    print(f"wrote {len(ds)} states to {out} in {seconds:.1f} s ({len(ds) / max(seconds, 1e-9):.2f} states/s)")
    return 0


def counts(ds) -> dict[str, dict[str, int]]:
    """States per app, action type (coda_agent.steps.action_type of the target) and source."""

    out: dict[str, dict[str, int]] = {"app": {}, "action type": {}, "source": {}}
    cols = ds.select_columns(["app", "source", "target", "screen"])
    for row in cols:
        try:
            kind = action_type(row["target"], tuple(row["screen"]))
        except ActionError:
            kind = "(unparseable)"
        for key, v in (("app", row["app"]), ("action type", kind), ("source", row["source"])):
            out[key][v] = out[key].get(v, 0) + 1
    return out


def main_show(args) -> int:
    ds = load(args.dir)
    c = counts(ds)
    print(
        f"{args.dir}: {len(ds)} states, {len(set(ds['task']))} tasks, "
        f"{sum(1 for b in ds['box'] if b)} with a target box"
    )
    for key, table in c.items():
        print(f"{key}:")
        for k, n in sorted(table.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {k:<40}{n:>7}")
    return 0


__all__ = [
    "COLUMNS",
    "DEFAULT_RADIUS",
    "build",
    "counts",
    "describe_action",
    "features",
    "history_turns",
    "load",
    "oracle_states",
    "planner_conversation",
    "run_states",
    "split_action",
    "state_observation",
    "target_element",
]
