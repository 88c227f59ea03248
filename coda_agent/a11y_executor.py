"""An executor that needs no model: it grounds the planner's step in words through the app's accessibility
tree (the env's `a11y_tree` observation, an a11y table with boxes: coda_env.a11y.parse_table) into one env
action. A baseline to evaluate (`coda eval --agent coda --executor a11y`), and a frozen executor that makes a
CPU learning test of the planner meaningful.

The step is read a sentence at a time from its end (the planner's thought comes first, its step last); the
first sentence that reads as one of these becomes the action:

    click | select | open | choose | switch to | go to | tap | press <element>   -> pyautogui.click(center)
    double-click <element>  /  right-click <element>  /  hover over <element>
    click at (x, y)                                   -> pyautogui.click(x, y)   (the same for the others)
    type | enter | write | input '<text>' [into <field>] [and press enter]
                                                      -> [click the field, when it is not focused]
                                                         pyautogui.write(text) [+ press('enter')]
    press | hit <key>[+<key>...] [key]                -> pyautogui.press / pyautogui.hotkey
    select all                                        -> pyautogui.hotkey('ctrl', 'a')
    scroll up|down|left|right [N times] [in <element>]
    drag <element> to <element>                       -> moveTo + dragTo

An element is named by a quoted name ('2D Graph', "OK") or by its words ("the 3D Graph tab"), and a kind
word (tab, button, field, check box, item, menu) prefers elements of that role; an unnamed input ("the
input line at the bottom") is found by its role and position words. What it cannot ground is a counted
parse error and the env gets WAIT, as with UI-TARS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from coda_env.a11y import Element, parse_table
from coda_env.actions import KEY_ALIASES, KEY_NAMES, ActionError, parse_action

from .executor import ExecResult


class GroundingError(ValueError):
    """The step names nothing the a11y executor can find or do."""


_QUOTES = re.compile(r"(?<![\w'])'([^']+)'(?![\w'])|\"([^\"]+)\"|`([^`]+)`|“([^”]+)”|‘([^’]+)’")
_HOLE = "\x00{}\x00"
_HOLE_RE = re.compile("\x00(\\d+)\x00")

_ROLE_WORDS: dict[str, frozenset[str]] = {
    "tab": frozenset({"page tab"}),
    "tabs": frozenset({"page tab"}),
    "button": frozenset({"push button", "toggle button"}),
    "field": frozenset({"text", "entry", "spin box"}),
    "input": frozenset({"text", "entry", "spin box"}),
    "box": frozenset({"text", "entry", "spin box", "combo box"}),
    "line": frozenset({"text", "entry"}),
    "bar": frozenset({"text", "entry"}),
    "entry": frozenset({"text", "entry"}),
    "console": frozenset({"text", "entry"}),
    "editor": frozenset({"text", "entry"}),
    "textbox": frozenset({"text", "entry"}),
    "textfield": frozenset({"text", "entry"}),
    "checkbox": frozenset({"check box"}),
    "check": frozenset({"check box"}),
    "item": frozenset({"tree item", "list item", "cell", "table cell", "menu item"}),
    "row": frozenset({"tree item", "list item", "cell", "table cell"}),
    "cell": frozenset({"cell", "table cell", "tree item"}),
    "menu": frozenset({"menu item", "menu"}),
    "radio": frozenset({"radio button"}),
    "label": frozenset({"label"}),
    "spinbox": frozenset({"spin box"}),
}
_INPUT_ROLES = frozenset({"text", "entry", "spin box"})
_FILLER = frozenset(
    {
        "the",
        "a",
        "an",
        "on",
        "at",
        "of",
        "in",
        "into",
        "to",
        "window",
        "screen",
        "kalgebra",
        "app",
        "application",
        "labelled",
        "labeled",
        "named",
        "called",
        "titled",
        "its",
        "this",
        "that",
        "top",
        "bottom",
        "left",
        "right",
        "upper",
        "lower",
        "middle",
        "corner",
        "side",
        "panel",
        "area",
        "pane",
        "with",
        "text",
        "",
        "and",
        "then",
        "now",
        "next",
        "i",
        "will",
        "should",
        "let",
        "us",
        "we",
        "need",
        "to",
        "it",
        "key",
        "keys",
        "mouse",
        "pointer",
        "cursor",
        "page",
        "tab",
        "tabs",
        "button",
        "field",
        "input",
        "box",
        "line",
        "bar",
        "entry",
        "item",
        "row",
        "cell",
        "menu",
        "radio",
        "label",
        "check",
        "checkbox",
        "textbox",
        "textfield",
        "spinbox",
        "console",
        "editor",
        "list",
    }
)
_KEY_WORDS = {
    "control": "ctrl",
    "ctl": "ctrl",
    "return": "enter",
    "escape": "esc",
    "del": "delete",
    "spacebar": "space",
    "page down": "pagedown",
    "page up": "pageup",
    "arrow": "",
    "cmd": "command",
    "windows": "win",
    "super": "win",
    "meta": "win",
    "backspace": "backspace",
    "bksp": "backspace",
}
_CLICK_VERBS = (
    r"double[- ]?click",
    r"right[- ]?click",
    r"hover(?: over)?",
    r"move (?:the )?(?:mouse|pointer|cursor) "
    r"(?:to|over)",
    r"click(?: on)?",
    r"select",
    r"open",
    r"choose",
    r"switch to",
    r"go to",
    r"tap(?: on)?",
    r"press",
    r"pick",
    r"activate",
    r"focus(?: on)?",
    r"toggle",
    r"check",
    r"uncheck",
)
# a sentence's verb comes first, after lead-in words ("Now I will click ...")
_LEAD = (
    r"^\W*(?:(?:now|then|next|and|so|finally|first|please|i|we|you|will|should|need|needs|must|want|to|"
    r"let's|let|us|can|just|i'll|we'll|i'm|going|shall)\W+)*"
)
_CLICK = re.compile(_LEAD + r"(" + "|".join(_CLICK_VERBS) + r")\b\s*(.*)", re.IGNORECASE | re.DOTALL)
_TYPE = re.compile(_LEAD + r"(type|enter|write|input|insert|fill in|put)\b\s*(.*)", re.IGNORECASE | re.DOTALL)
_KEY = re.compile(_LEAD + r"(press|hit|tap|push|use)\b\s*(?:the\s+)?(.*)", re.IGNORECASE | re.DOTALL)
_SUBMIT = re.compile(
    r"\b(?:and|then|,)\s*(?:press|hit)\s+(?:the\s+)?(?:enter|return)\b|\bsubmit\b|\bpress(?:ing)? "
    r"(?:the )?(?:enter|return)\b",
    re.IGNORECASE,
)
_AT = re.compile(r"\bat\s*\(?\s*(\d{1,5})\s*,\s*(\d{1,5})\s*\)?", re.IGNORECASE)
_SCROLL = re.compile(_LEAD + r"scroll\b(.*)", re.IGNORECASE | re.DOTALL)
_DRAG = re.compile(_LEAD + r"drag\b\s*(.*?)\s+\b(?:to|onto|into|over)\b\s+(.*)", re.IGNORECASE | re.DOTALL)


def _quoted(text: str, raw: list[str] | None = None) -> tuple[str, list[str]]:
    """Text with its quoted parts replaced by holes, and those parts (without quotes; with them in `raw`)."""
    found: list[str] = []

    def hole(m: re.Match) -> str:
        found.append(next(g for g in m.groups() if g is not None))
        if raw is not None:
            raw.append(m.group(0))
        return _HOLE.format(len(found) - 1)

    return _QUOTES.sub(hole, text), found


def _restore(masked: str, raw: list[str]) -> str:
    return _HOLE_RE.sub(lambda m: raw[int(m.group(1))], masked)


def _sentences(text: str) -> list[str]:
    """Sentences of the step (quoted parts never split), last first."""
    raw: list[str] = []
    masked, _ = _quoted(text, raw)
    parts = [p.strip() for p in re.split(r"(?<=[.!?;:])\s+|\n+", masked) if p.strip()]
    return [_restore(p, raw) for p in reversed(parts)]


def _words(s: str) -> list[str]:
    return [w for w in (x.strip(".-") for x in re.findall(r"[\w^+*/=<>.-]+", s.lower())) if w]


def _norm(s: str) -> str:
    return " ".join(_words(s))


@dataclass
class _Target:
    quoted: list[str]
    words: list[str]  # the phrase's content words
    roles: frozenset[str]  # preferred roles (from kind words)
    position: set[str]  # top / bottom / left / right


def _target(phrase: str) -> _Target:
    masked, quoted = _quoted(phrase)
    words = _words(_HOLE_RE.sub(" ", masked))
    roles: frozenset[str] = frozenset()
    for w in words:
        roles |= _ROLE_WORDS.get(w, frozenset())
    if "check" in words and "box" in words:
        roles = frozenset({"check box"})
    pos = {w for w in words if w in ("top", "bottom", "left", "right", "upper", "lower")}
    pos = {"top" if w == "upper" else "bottom" if w == "lower" else w for w in pos}
    content = [w for w in words if w not in _FILLER]
    return _Target(quoted, content, roles, pos)


def _name_score(e: Element, t: _Target) -> float:
    name = _norm(e.name)
    if t.quoted:
        best = 0.0
        for q in t.quoted:
            nq = _norm(q)
            if not nq:
                continue
            if name == nq:
                best = max(best, 1.0)
            elif name and set(name.split()) == set(nq.split()):  # 'Graph 2D' for '2D Graph'
                best = max(best, 0.9)
            elif name and (f" {nq} " in f" {name} " or f" {name} " in f" {nq} "):
                best = max(best, 0.75)
            elif _norm(e.text) == nq:
                best = max(best, 0.7)
        return best
    if not t.words:
        return 0.0
    phrase = " ".join(t.words)
    if name and name == phrase:
        return 1.0
    if name and set(name.split()) == set(t.words):
        return 0.9
    nw = set(_words(e.name)) - {"the", "a", "an"}
    if not nw:
        return 0.0
    if f" {name} " in f" {phrase} ":
        return 0.7 + 0.25 * len(nw) / max(len(t.words), len(nw))
    common = nw & set(t.words)
    return 0.6 * len(common) / len(nw | set(t.words))


def find_element(phrase: str, elements: Sequence[Element], screen: tuple[int, int] = (1280, 800)) -> Element:
    """The element a phrase names ("the '3D Graph' tab", "the OK button", "the input line at the bottom")."""
    t = _target(phrase)
    if not elements:
        raise GroundingError(
            "the observation has no accessibility table with boxes (make the env with "
            "a11y_tree=True; the app must list boxes)"
        )
    best, best_score = None, 0.0
    for e in elements:
        s = _name_score(e, t)
        if t.roles:
            s += 0.3 if e.role in t.roles else -0.25
        if not e.name and e.role in _INPUT_ROLES and t.roles & _INPUT_ROLES and not t.quoted:
            s = max(s, 0.55 + 0.1 * ("focused" in e.states))  # an unnamed input, named by its kind
        if s <= 0:
            continue
        cx, cy = e.center
        for p in t.position:  # position words break ties
            s += (
                0.05
                * {
                    "top": 1 - cy / screen[1],
                    "bottom": cy / screen[1],
                    "left": 1 - cx / screen[0],
                    "right": cx / screen[0],
                }[p]
            )
        s -= 1e-9 * e.area  # the same words: the smaller element
        if s > best_score:
            best, best_score = e, s
    if best is None or best_score < 0.45:
        what = " / ".join(repr(q) for q in t.quoted) or repr(" ".join(t.words) or phrase.strip())
        raise GroundingError(f"no element on screen matches {what}")
    return best


def _keys(spec: str) -> list[str] | None:
    """'ctrl+a' / 'Ctrl + A' / 'the Enter key' / 'ctrl a' -> key names, or None when it is not keys."""
    s = spec.lower().strip().strip(".!").strip()
    s = re.sub(r"\b(the|key|keys|button|on the keyboard|keyboard|combination|shortcut|together)\b", " ", s)
    for k, v in _KEY_WORDS.items():
        s = re.sub(rf"\b{k}\b", v, s)
    tokens = [x for x in re.split(r"\s*\+\s*|\s+and\s+|\s+", s.strip()) if x]
    if not tokens or len(tokens) > 6:
        return None
    out = []
    for tok in tokens:
        tok = KEY_ALIASES.get(tok, tok)
        if tok not in KEY_NAMES:
            return None
        out.append(tok)
    return out


def _key_action(keys: list[str]) -> str:
    return (
        f"pyautogui.press({keys[0]!r})" if len(keys) == 1 else f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})"
    )


def _point_action(verb: str, x: int, y: int) -> str:
    v = verb.lower()
    if v.startswith("double"):
        return f"pyautogui.doubleClick({x}, {y})"
    if v.startswith("right"):
        return f"pyautogui.rightClick({x}, {y})"
    if v.startswith(("hover", "move")):
        return f"pyautogui.moveTo({x}, {y})"
    return f"pyautogui.click({x}, {y})"


def ground(
    text: str, elements: Sequence[Element], screen: tuple[int, int] = (1280, 800), scroll_clicks: int = 5
) -> str:
    """The env action for a planner's step in words; raises GroundingError when no sentence of it grounds.
    Sentences are tried from the last; a sentence must start with its verb (after lead-in words such as
    "Now I will"), and only when none does is a verb anywhere in a sentence taken."""
    errors = []
    for anchored in (True, False):
        for sentence in _sentences(text):
            try:
                action = _ground_sentence(sentence, elements, screen, scroll_clicks, anchored)
            except GroundingError as e:
                errors.append(str(e))
                continue
            if action is not None:
                return action
    raise GroundingError(errors[0] if errors else f"no step the a11y executor can do in {text.strip()[:120]!r}")


def _match(rx: re.Pattern, s: str, anchored: bool) -> re.Match | None:
    if anchored:
        return rx.match(s)
    return re.compile(rx.pattern.replace(_LEAD, r"\b", 1), rx.flags).search(s)


def _ground_sentence(
    s: str, elements: Sequence[Element], screen: tuple[int, int], scroll_clicks: int, anchored: bool = True
) -> str | None:
    raw: list[str] = []
    masked, quotes = _quoted(s, raw)
    low = masked.lower()
    restore = lambda p: _restore(p, raw)  # noqa: E731
    if _match(re.compile(_LEAD + r"select all\b", re.IGNORECASE), masked, anchored):
        return "pyautogui.hotkey('ctrl', 'a')"
    m = _match(_DRAG, masked, anchored)
    if m:
        a = find_element(restore(m.group(1)), elements, screen).center
        b = find_element(restore(m.group(2)), elements, screen).center
        return f"pyautogui.moveTo({a[0]}, {a[1]})\npyautogui.dragTo({b[0]}, {b[1]})"
    m = _match(_SCROLL, masked, anchored)
    if m:
        rest = m.group(1)
        d = next(iter(re.findall(r"\b(up|down|left|right)\b", rest.lower())), "down")
        n = re.search(r"\b(\d{1,3})\s*(?:times|clicks|steps|notches|lines)\b", rest, re.IGNORECASE)
        amount = int(n.group(1)) if n else scroll_clicks
        amount = amount if d in ("up", "left") else -amount
        fn = "scroll" if d in ("up", "down") else "hscroll"
        where = re.search(r"\b(?:in|on|over|inside)\b\s+(.*)", rest, re.IGNORECASE | re.DOTALL)
        pos = ""
        if where:
            x, y = find_element(restore(where.group(1)), elements, screen).center
            pos = f", x={x}, y={y}"
        return f"pyautogui.{fn}({amount}{pos})"
    m = _match(_TYPE, masked, anchored)
    if m and (quotes or m.group(1).lower() != "enter"):
        rest = m.group(2)
        hole = _HOLE_RE.search(rest)
        if hole:
            text, after = quotes[int(hole.group(1))], rest[hole.end() :]
        else:
            mm = re.match(
                r"\s*(.+?)(?=\s+(?:into|in|on)\s+the\b|\s+and\s+(?:press|hit|then)\b|[.;]?\s*$)",
                rest,
                re.IGNORECASE | re.DOTALL,
            )
            if not mm or not mm.group(1).strip():
                return None
            text, after = mm.group(1).strip(), rest[mm.end() :]
        lines = []
        into = re.search(r"\b(?:into|in|on)\s+(.*?)(?=\s+and\b|[.;]?\s*$)", after, re.IGNORECASE | re.DOTALL)
        if into and elements:
            try:
                field = find_element(restore(into.group(1)), elements, screen)
            except GroundingError:
                field = None
            if field is not None and field.states and "focused" not in field.states:
                lines.append("pyautogui.click({}, {})".format(*field.center))
        submit = bool(_SUBMIT.search(after)) or text.endswith("\n")
        lines.append(f"pyautogui.write({text.rstrip(chr(10))!r})")
        if submit:
            lines.append("pyautogui.press('enter')")
        return "\n".join(lines)
    m = _match(_KEY, masked, anchored)
    if m and (m.group(1).lower() != "use" or re.search(r"\b(shortcut|hotkey|keys?)\b", low)):
        rest = re.split(
            r"\s+(?:to|so|in order|on the keyboard)\b|[,.;]",
            _HOLE_RE.sub(lambda h: quotes[int(h.group(1))], m.group(2)),
            maxsplit=1,
        )[0]
        keys = _keys(rest)
        if keys:
            return _key_action(keys)
    m = _match(re.compile(_LEAD + r"(?:use the )?hotkey\b\s*(.*)", re.IGNORECASE | re.DOTALL), masked, anchored)
    if m and _keys(_HOLE_RE.sub(lambda h: quotes[int(h.group(1))], m.group(1))):
        return _key_action(_keys(_HOLE_RE.sub(lambda h: quotes[int(h.group(1))], m.group(1))))
    m = _match(_CLICK, masked, anchored)
    if m:
        verb, rest = m.group(1), m.group(2)
        at = _AT.search(rest)
        if at and not _HOLE_RE.search(rest[: at.start()]) and not _target(rest[: at.start()]).words:
            return _point_action(verb, int(at.group(1)), int(at.group(2)))
        x, y = find_element(restore(rest), elements, screen).center
        return _point_action(verb, x, y)
    return None


def step_kind(text: str) -> tuple[str, str] | None:
    """The action type and value a step in words states, read with this executor's own verb grammar but not
    grounded (the first sentence that reads as a step, sentences that start with a verb first): click /
    double-click / right-click / hover -> click, double_click, right_click, move with value ""; type 'x' ->
    ("type", "x"); press ctrl+a -> ("key", "a ctrl"); scroll down -> ("scroll", "down"); drag -> ("drag", "").
    None when no sentence reads as a step. Co-EPG's gate reads plans with it."""
    for anchored in (True, False):
        for sentence in _sentences(text):
            found = _sentence_kind(sentence, anchored)
            if found is not None:
                return found
    return None


def _sentence_kind(s: str, anchored: bool) -> tuple[str, str] | None:
    masked, quotes = _quoted(s)
    fill = lambda t: _HOLE_RE.sub(lambda h: quotes[int(h.group(1))], t)  # noqa: E731
    if _match(re.compile(_LEAD + r"select all\b", re.IGNORECASE), masked, anchored):
        return "key", "a ctrl"
    if _match(_DRAG, masked, anchored):
        return "drag", ""
    m = _match(_SCROLL, masked, anchored)
    if m:
        d = next(iter(re.findall(r"\b(up|down|left|right)\b", m.group(1).lower())), "down")
        return "scroll", d
    m = _match(_TYPE, masked, anchored)
    if m and (quotes or m.group(1).lower() != "enter"):
        rest = m.group(2)
        hole = _HOLE_RE.search(rest)
        if hole:
            return "type", quotes[int(hole.group(1))]
        mm = re.match(r"\s*(.+?)(?=\s+(?:into|in|on)\s+the\b|\s+and\s+(?:press|hit|then)\b|[.;]?\s*$)", rest, re.DOTALL)
        return ("type", mm.group(1).strip()) if mm and mm.group(1).strip() else None
    m = _match(_KEY, masked, anchored)
    if m:
        keys = _keys(re.split(r"\s+(?:to|so|in order|on the keyboard)\b|[,.;]", fill(m.group(2)), maxsplit=1)[0])
        if keys:
            return "key", " ".join(sorted(keys))
    m = _match(_CLICK, masked, anchored)
    if m:
        verb = m.group(1).lower()
        if verb.startswith("double"):
            return "double_click", ""
        if verb.startswith("right"):
            return "right_click", ""
        if verb.startswith(("hover", "move")):
            return "move", ""
        return "click", ""
    return None


@dataclass
class A11yExecutor:
    """Grounds the planner's step in the accessibility table of the observation (`a11y_tree`); no model."""

    screen: tuple[int, int] = (1280, 800)
    scroll_clicks: int = 5
    wants_a11y_tree = True  # the env must give the a11y_tree observation

    def execute(self, items: Sequence[tuple[str, str, Any]]) -> list[ExecResult]:
        """items: (instruction, the planner's step text, the env's observation dict with `a11y_tree`)."""
        out = []
        for _, text, obs in items:
            table = obs.get("a11y_tree") if isinstance(obs, dict) else None
            call: dict[str, Any] = {"model": "a11y", "input": text}
            try:
                action = ground(text, parse_table(table), self.screen, self.scroll_clicks)
                parse_action(action, self.screen)  # what the env would refuse is this executor's error
            except (GroundingError, ActionError) as e:
                call["output"] = ""
                out.append(ExecResult(None, calls=[call], parse_errors=[f"a11y: {e}"]))
                continue
            call["output"] = action
            out.append(ExecResult(action, calls=[call]))
        return out
