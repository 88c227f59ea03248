"""The labelling vocabulary every layer shares: action types, the target's radius, and CODA's stage-1 reward
(arXiv 2508.20096), which scores an action (a sampled plan, turned into an action by the fixed executor)
against the labelled positive action a_T of a state:

    r = 1[type(a) = type(a_T)] + r_dist(a, a_T)        r_dist in [0, 1], and r = 0 when the types differ

Both actions are strings of the env's action language (coda_env.actions), compared through one canonical
form (`canonical_steps`): the parsed primitives, with `moveTo` + `dragTo` read as one drag and `write` +
`press('enter')` as one typed text that is submitted (what UI-TARS's `drag(...)` and `type(content='..\\n')`
become). An action's type is the sequence of its steps' types (`action_type`: "click", "type", "click+type").

r_dist, per step, averaged over the steps of an action:
- pointer steps (click, double_click, triple_click, right_click, middle_click, move, mouse_down, mouse_up):
  exp(-d / scale), d the distance in pixels from the predicted point to the target box (left, top, right,
  bottom, edges included: d = 0 anywhere inside), or, with no box, to the disc of `radius` around the
  target's point. The box belongs to the target's first pointer point (a drag's start); other points are
  scored against their own point and `radius`.
- drag: the mean of the start's and the end's pointer scores (both ends).
- typed text: 1 for the same text after normalisation (whitespace trimmed and runs of it collapsed), else
  difflib's similarity ratio (< 1); halved when one submits (presses enter) and the other does not.
- press / hotkey (one type, "key"): |A & B| / |A | B| over the key sets (1 only for the same set).
- scroll: 0 for another axis or direction, else 0.5 + 0.5 * min(|a|, |b|) / max(|a|, |b|) of the amounts.
- DONE, FAIL, WAIT, sleep: 1.   ANS: 1 when the normalised answers match (numbers within 1e-6), else 0.

State datasets (coda_agent.states), the trainers (coda_agent.train) and the benchmarks read these; this module
imports nothing of either.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from typing import Sequence

from coda_env.actions import ActionError, parse_action


DEFAULT_SCALE = 50.0  # pixels: the pointer score is exp(-1) = 0.37 at this distance outside the box
DEFAULT_RADIUS = 20.0  # pixels: the target disc around a point that has no box

POINTER_TYPES = frozenset(
    {"click", "double_click", "triple_click", "right_click", "middle_click", "move", "mouse_down", "mouse_up", "drag"}
)

__all__ = [
    "DEFAULT_RADIUS",
    "DEFAULT_SCALE",
    "Step",
    "action_reward",
    "action_type",
    "canonical_steps",
    "POINTER_TYPES",
]


@dataclass(frozen=True)
class Step:
    """One step of an action in canonical form."""

    type: str
    point: tuple[int, int] | None = None  # pointer steps and scroll; a drag's end
    start: tuple[int, int] | None = None  # a drag's start (None: from wherever the pointer was)
    text: str = ""  # typed text; ANS's answer
    submit: bool = False  # typed text followed by enter
    keys: frozenset[str] = frozenset()
    axis: str = ""  # scroll: "v" or "h"
    amount: int = 0


def _point(a) -> tuple[int, int] | None:
    return (a.x, a.y) if a.x is not None and a.y is not None else None


_CLICKS = {("left", 1): "click", ("left", 2): "double_click", ("left", 3): "triple_click"}


def canonical_steps(code: str, screen: tuple[int, int] = (1280, 800)) -> list[Step]:
    """The canonical steps of an action string; raises coda_env.actions.ActionError when it does not parse."""
    acts = parse_action(code, screen)
    steps: list[Step] = []
    i = 0
    while i < len(acts):
        a = acts[i]
        nxt = acts[i + 1] if i + 1 < len(acts) else None
        k = a.kind
        if k == "move" and nxt is not None and nxt.kind == "drag":
            steps.append(Step("drag", point=_point(nxt), start=_point(a)))
            i += 2
            continue
        if k == "type" and nxt is not None and nxt.kind == "press" and nxt.keys == ("enter",) and nxt.presses == 1:
            steps.append(Step("type", text=a.text, submit=True))
            i += 2
            continue
        if k == "click":
            t = _CLICKS.get((a.button, a.clicks)) or f"{a.button}_click"
            steps.append(Step(t, point=_point(a)))
        elif k == "drag":
            steps.append(Step("drag", point=_point(a)))
        elif k in ("move", "mouse_down", "mouse_up"):
            steps.append(Step(k, point=_point(a)))
        elif k == "type":
            steps.append(Step("type", text=a.text))
        elif k in ("press", "hotkey"):
            steps.append(Step("key", keys=frozenset(a.keys)))
        elif k in ("key_down", "key_up"):
            steps.append(Step(k, keys=frozenset(a.keys)))
        elif k in ("scroll", "hscroll"):
            steps.append(Step("scroll", point=_point(a), axis="v" if k == "scroll" else "h", amount=a.amount))
        elif k == "answer":
            steps.append(Step("answer", text=a.text))
        else:  # done, fail, wait, sleep
            steps.append(Step(k))
        i += 1
    return steps


def action_type(code: str, screen: tuple[int, int] = (1280, 800)) -> str:
    """The type of an action: its canonical steps' types joined by '+' ("click", "type", "click+type")."""
    return "+".join(s.type for s in canonical_steps(code, screen))


# ------------------------------------------------------------------------------------------ r_dist
def _to_box(p: tuple[int, int], box: tuple[int, int, int, int]) -> float:
    left, top, right, bottom = box
    dx = max(left - p[0], 0, p[0] - right)
    dy = max(top - p[1], 0, p[1] - bottom)
    return math.hypot(dx, dy)


def _pointer(
    pred: tuple[int, int] | None,
    target: tuple[int, int] | None,
    box: tuple[int, int, int, int] | None,
    scale: float,
    radius: float,
) -> float:
    if pred is None or target is None:
        return 1.0 if pred is None and target is None else 0.0
    d = _to_box(pred, box) if box is not None else max(0.0, math.dist(pred, target) - radius)
    return math.exp(-d / scale) if scale > 0 else float(d == 0)


def _norm_text(s: str) -> str:
    return re.sub(r"\s+", " ", s.strip())


def _text(a: Step, b: Step) -> float:
    x, y = _norm_text(a.text), _norm_text(b.text)
    sim = 1.0 if x == y else difflib.SequenceMatcher(None, x, y, autojunk=False).ratio()
    return sim if a.submit == b.submit else sim / 2


def _number(s: str) -> float | None:
    try:
        v = float(s.replace(",", ""))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _answer(a: str, b: str) -> float:
    x, y = (_norm_text(s).casefold().rstrip(".") for s in (a, b))
    if x == y:
        return 1.0
    nx, ny = _number(x), _number(y)
    return 1.0 if nx is not None and ny is not None and math.isclose(nx, ny, rel_tol=1e-6, abs_tol=1e-9) else 0.0


def _step_score(p: Step, t: Step, box, scale: float, radius: float) -> float:
    if t.type == "drag":
        if t.start is None:  # dragged from wherever the pointer was: the end
            return _pointer(p.point, t.point, box, scale, radius)
        return (_pointer(p.start, t.start, box, scale, radius) + _pointer(p.point, t.point, None, scale, radius)) / 2
    if t.type in POINTER_TYPES:
        return _pointer(p.point, t.point, box, scale, radius)
    if t.type == "type":
        return _text(p, t)
    if t.type in ("key", "key_down", "key_up"):
        union = p.keys | t.keys
        return len(p.keys & t.keys) / len(union) if union else 1.0
    if t.type == "scroll":
        if p.axis != t.axis or (p.amount > 0) != (t.amount > 0) or (p.amount < 0) != (t.amount < 0):
            return 0.0
        big = max(abs(p.amount), abs(t.amount))
        return 1.0 if big == 0 else 0.5 + 0.5 * min(abs(p.amount), abs(t.amount)) / big
    if t.type == "answer":
        return _answer(p.text, t.text)
    return 1.0  # done, fail, wait, sleep


def action_reward(
    predicted: str | None,
    target: str,
    box: tuple[int, int, int, int] | Sequence[int] | None,
    screen: tuple[int, int],
    scale: float = DEFAULT_SCALE,
    radius: float = DEFAULT_RADIUS,
) -> float:
    """1[type(predicted) = type(target)] + r_dist(predicted, target), 0 when the types differ or `predicted`
    does not parse (or is None: the executor produced nothing). `box`: (left, top, right, bottom) screen
    pixels of the target element (edges included), None or empty when there is none (then `radius` around the
    target's point stands for it). `scale`: pixels over which the pointer score falls to exp(-1).
    Raises ValueError when `target` itself does not parse (a broken label)."""
    screen = (int(screen[0]), int(screen[1]))
    try:
        want = canonical_steps(target, screen)
    except ActionError as e:
        raise ValueError(f"the labelled action {target!r} does not parse: {e}") from None
    if predicted is None:
        return 0.0
    try:
        got = canonical_steps(predicted, screen)
    except ActionError:
        return 0.0
    if [s.type for s in got] != [s.type for s in want]:
        return 0.0
    b = tuple(int(v) for v in box) if box is not None and len(box) == 4 else None
    if b is not None and (b[2] < b[0] or b[3] < b[1]):
        raise ValueError(f"box {b} is not (left, top, right, bottom)")
    first_pointer = next((i for i, s in enumerate(want) if s.type in POINTER_TYPES), None)
    scores = [
        _step_score(p, t, b if i == first_pointer else None, scale, radius) for i, (p, t) in enumerate(zip(got, want))
    ]
    return 1.0 + sum(scores) / len(scores)
