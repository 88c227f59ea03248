"""UI-TARS's action grammar, parsed (never evaluated) and converted to this project's pyautogui actions.

UI-TARS-1.5 answers `Thought: ...` then `Action: click(start_box='(x,y)')` and the like; several actions
may follow one another separated by blank lines. Points come as `(x,y)`, `<|box_start|>(x,y)<|box_end|>`,
`<point>x y</point>` or boxes `(x1,y1,x2,y2)` / `[x1,y1,x2,y2]` (their centre). Coordinates are pixels of the
image as Qwen2.5-VL resized it (UI-TARS-1.5, `coords="absolute"`) or 0..1000 (`coords="relative1000"`,
UI-TARS v1). No `ui-tars` package is used: its parser evaluates model output, which this project never does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from coda_env.actions import KEY_ALIASES, KEY_NAMES, ActionError, parse_action

MAX_OUTPUT = 10_000
SCROLL_CLICKS = 5

ACTIONS = {
    "click",
    "left_single",
    "left_double",
    "right_single",
    "drag",
    "select",
    "hotkey",
    "press",
    "keydown",
    "keyup",
    "type",
    "scroll",
    "wait",
    "finished",
    "call_user",
    "hover",
    "mouse_move",
}
POINT_ARGS = {"start_box": "start", "point": "start", "start_point": "start", "end_box": "end", "end_point": "end"}
NEEDS = {
    "click": ["start"],
    "left_single": ["start"],
    "left_double": ["start"],
    "right_single": ["start"],
    "hover": ["start"],
    "mouse_move": ["start"],
    "drag": ["start", "end"],
    "select": ["start", "end"],
    "hotkey": ["key"],
    "press": ["key"],
    "keydown": ["key"],
    "keyup": ["key"],
    "type": ["content"],
    "scroll": ["direction"],
}
UITARS_KEYS = {
    "arrowleft": "left",
    "arrowright": "right",
    "arrowup": "up",
    "arrowdown": "down",
    "control": "ctrl",
    "meta": "win",
    "super": "win",
    "cmd": "command",
    "escape": "esc",
    "return": "enter",
    "pagedown": "pagedown",
    "pageup": "pageup",
    "spacebar": "space",
}


class UITarsParseError(ValueError):
    """The model's output is not in UI-TARS's action grammar; the message says where."""


@dataclass
class UITarsAction:
    kind: str
    args: dict = field(default_factory=dict)  # points as (x, y) floats in the model's coordinate space


def _excerpt(s: str) -> str:
    s = s.strip().replace("\n", "\\n")
    return repr(s if len(s) <= 80 else s[:77] + "...")


_CALL = re.compile(r"\s*([A-Za-z_]+)\s*\(")
_ARG = re.compile(r"\s*([A-Za-z_]+)\s*=\s*")
_ESC = {"n": "\n", "t": "\t", "'": "'", '"': '"', "\\": "\\", "r": "\r"}


def _string(s: str, i: int) -> tuple[str, int]:
    """A quoted literal starting at s[i] (single or double quotes, backslash escapes) -> (value, next index)."""
    q, out, i = s[i], [], i + 1
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            out.append(_ESC.get(s[i + 1], "\\" + s[i + 1]))
            i += 2
            continue
        if c == q:
            return "".join(out), i + 1
        out.append(c)
        i += 1
    raise UITarsParseError(f"unterminated string in {_excerpt(s)}")


def _calls(text: str) -> list[tuple[str, dict[str, str]]]:
    """`name(key='value', ...)` calls, in order; only keyword arguments with string literal values."""
    calls, i = [], 0
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        m = _CALL.match(text, i)
        if not m:
            raise UITarsParseError(f"expected an action like click(start_box='(x,y)') at {_excerpt(text[i:])}")
        name, i, args = m.group(1), m.end(), {}
        while True:
            while i < len(text) and text[i] in " \t\n,":
                i += 1
            if i >= len(text):
                break  # a missing final ')' at the very end is tolerated
            if text[i] == ")":
                i += 1
                break
            a = _ARG.match(text, i)
            if not a:
                raise UITarsParseError(f"{name}(): expected key='value' at {_excerpt(text[i:])}")
            i = a.end()
            if i >= len(text) or text[i] not in "'\"":
                raise UITarsParseError(f"{name}(): the value of {a.group(1)} must be a quoted string")
            args[a.group(1)], i = _string(text, i)
        calls.append((name, args))
    return calls


_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"


def _point(value: str, name: str) -> tuple[float, float]:
    v = value.replace("<|box_start|>", "").replace("<|box_end|>", "").strip()
    m = re.fullmatch(rf"<point>\s*({_NUM})[\s,]+({_NUM})\s*</point>", v)
    if m:
        nums = [m.group(1), m.group(2)]
    else:
        m = re.fullmatch(r"[(\[]([^()\[\]]*)[)\]]", v)
        if not m:
            raise UITarsParseError(f"{name}={_excerpt(value)} is not a point '(x,y)' or a box '(x1,y1,x2,y2)'")
        nums = [p.strip() for p in m.group(1).split(",")]
        if len(nums) not in (2, 4) or not all(re.fullmatch(_NUM, p) for p in nums):
            raise UITarsParseError(f"{name}={_excerpt(value)}: expected 2 or 4 numbers")
    xs = [float(p) for p in nums]
    if any(not math.isfinite(x) or x < 0 or x > 1e5 for x in xs):
        raise UITarsParseError(f"{name}={_excerpt(value)}: coordinates must be non-negative and finite")
    if len(xs) == 4:
        return (xs[0] + xs[2]) / 2, (xs[1] + xs[3]) / 2
    return xs[0], xs[1]


def parse_uitars(text: str) -> tuple[str | None, list[UITarsAction]]:
    """A UI-TARS answer -> (its thought or None, its actions). Raises UITarsParseError."""
    if not isinstance(text, str) or not text.strip():
        raise UITarsParseError("the executor's answer is empty")
    if len(text) > MAX_OUTPUT:
        raise UITarsParseError(f"the executor's answer is {len(text)} characters, over {MAX_OUTPUT}")
    thought = None
    m = re.search(r"(?:^|\n)\s*Action\s*:", text)
    body = text[m.end() :] if m else text
    head = text[: m.start()] if m else ""
    t = re.search(r"Thought\s*:(.*?)(?=\n\s*(?:Reflection|Action_Summary)\s*:|\Z)", head, re.DOTALL)
    if t:
        thought = t.group(1).strip()
    if not m and re.match(r"\s*(Thought|Reflection|Action_Summary)\s*:", text):
        raise UITarsParseError(f"no 'Action:' in the executor's answer {_excerpt(text)}")
    actions = []
    for name, raw in _calls(body):
        kind = name.lower()
        if kind not in ACTIONS:
            raise UITarsParseError(f"unknown action {name!r}; UI-TARS actions: {', '.join(sorted(ACTIONS))}")
        args: dict = {}
        for k, v in raw.items():
            if k in POINT_ARGS:
                args[POINT_ARGS[k]] = _point(v, k)
            elif k in ("key", "hotkey", "content", "direction"):
                args["key" if k == "hotkey" else k] = v
            else:
                raise UITarsParseError(f"{name}(): unexpected argument {k!r}")
        missing = [a for a in NEEDS.get(kind, []) if a not in args]
        if missing:
            raise UITarsParseError(f"{name}() needs {', '.join(missing)}")
        if kind == "scroll" and args["direction"].strip().lower() not in ("up", "down", "left", "right"):
            raise UITarsParseError(f"scroll direction {args['direction']!r} is not up/down/left/right")
        actions.append(UITarsAction(kind, args))
    if not actions:
        raise UITarsParseError(f"no action in the executor's answer {_excerpt(text)}")
    return thought, actions


def _key(name: str) -> str:
    k = name.strip().lower()
    k = UITARS_KEYS.get(k, KEY_ALIASES.get(k, k))
    if k not in KEY_NAMES:
        raise UITarsParseError(f"unknown key {name!r}")
    return k


def to_env_action(
    actions: list[UITarsAction], image_size: tuple[int, int], screen: tuple[int, int], coords: str = "absolute"
) -> str:
    """UI-TARS actions -> one pyautogui action string for a `screen` = (w, h) display. `image_size` = (w, h) of
    the image the model saw. A terminal action (finished -> DONE, call_user -> FAIL, wait -> WAIT) counts
    only when it is the first; after GUI actions it is dropped (the GUI actions run, the episode goes on)."""
    if coords not in ("absolute", "relative1000"):
        raise ValueError("coords must be 'absolute' or 'relative1000'")
    sw, sh = screen
    iw, ih = (1000, 1000) if coords == "relative1000" else image_size

    def xy(p):
        return (min(sw - 1, max(0, round(p[0] / iw * sw))), min(sh - 1, max(0, round(p[1] / ih * sh))))

    first = actions[0].kind
    if first in ("finished", "call_user", "wait"):
        return {"finished": "DONE", "call_user": "FAIL", "wait": "WAIT"}[first]
    lines = []
    for a in actions:
        k, g = a.kind, a.args
        if k in ("finished", "call_user", "wait"):
            break
        if k in ("click", "left_single"):
            lines.append("pyautogui.click({}, {})".format(*xy(g["start"])))
        elif k == "left_double":
            lines.append("pyautogui.doubleClick({}, {})".format(*xy(g["start"])))
        elif k == "right_single":
            lines.append("pyautogui.rightClick({}, {})".format(*xy(g["start"])))
        elif k in ("hover", "mouse_move"):
            lines.append("pyautogui.moveTo({}, {})".format(*xy(g["start"])))
        elif k in ("drag", "select"):
            lines += [
                "pyautogui.moveTo({}, {})".format(*xy(g["start"])),
                "pyautogui.dragTo({}, {})".format(*xy(g["end"])),
            ]
        elif k == "hotkey":
            keys = [_key(x) for x in g["key"].replace("+", " ").split()]
            if not keys:
                raise UITarsParseError("hotkey() with no keys")
            lines.append(
                f"pyautogui.hotkey({', '.join(repr(x) for x in keys)})"
                if len(keys) > 1
                else f"pyautogui.press({keys[0]!r})"
            )
        elif k in ("press", "keydown", "keyup"):
            fn = {"press": "press", "keydown": "keyDown", "keyup": "keyUp"}[k]
            lines.append(f"pyautogui.{fn}({_key(g['key'])!r})")
        elif k == "type":
            text = g["content"]
            submit = text.endswith("\n")
            text = text[:-1] if submit else text
            if text:
                lines.append(f"pyautogui.write({text!r})")
            if submit:
                lines.append("pyautogui.press('enter')")
        elif k == "scroll":
            d = g["direction"].strip().lower()
            amount = SCROLL_CLICKS if d in ("up", "left") else -SCROLL_CLICKS
            fn = "scroll" if d in ("up", "down") else "hscroll"
            pos = ", x={}, y={}".format(*xy(g["start"])) if "start" in g else ""
            lines.append(f"pyautogui.{fn}({amount}{pos})")
    if not lines:
        raise UITarsParseError("the executor's answer holds no action to perform")
    code = "\n".join(lines)
    try:
        parse_action(code, screen)  # what the env would refuse is an executor error, here
    except ActionError as e:
        raise UITarsParseError(f"the env refuses the converted action: {e}") from None
    return code


def uitars_to_env(
    text: str, image_size: tuple[int, int], screen: tuple[int, int], coords: str = "absolute"
) -> tuple[str | None, str]:
    """Parse and convert in one go: (thought, env action string)."""
    thought, actions = parse_uitars(text)
    return thought, to_env_action(actions, image_size, screen, coords)
