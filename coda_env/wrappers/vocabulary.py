"""Vocabulary: Discrete(n) over a small list of whole env actions (keys, text snippets, clicks, answers).

Typing `a:=3^4` one key at a time is 6 actions from a 100-key space; drawn from a task family's oracle
solutions, a vocabulary has the family's identifiers, numbers and operators as single entries (so typing an
answer is a few actions), its keys (enter, tab ...), the fixed clicks its solutions make (focus the console),
and DONE. `vocabulary_from_tasks` builds it; any list of action strings works too. The family's `ANS`
answers are included only with answers=True (they give the answers away; for curricula and smoke tests).
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..actions import Action, ActionError, parse_action
from ._util import require_text_actions, screen_of

#: one text snippet: a name, a number, an assignment, or one other non-space character
_SNIPPET = re.compile(r":=|[A-Za-z_][A-Za-z_0-9]*|\d+(?:\.\d+)?|\S| ")
DEFAULT_KEYS = ("enter", "backspace", "tab", "esc")


def vocabulary_from_tasks(
    tasks: Iterable,
    keys: Sequence[str] = DEFAULT_KEYS,
    clicks: bool = True,
    answers: bool = False,
    screen: tuple[int, int] = (1280, 800),
) -> list[str]:
    """Distinct action strings from the oracle solutions of `tasks` (Task objects), in a stable order:
    DONE, the keys, the clicks, the text snippets (sorted), then the answers."""
    found_keys: list[str] = list(keys)
    click_set: list[str] = []
    snippets: set[str] = set()
    answer_set: list[str] = []
    for task in tasks:
        for code in task.solution:
            try:
                acts = parse_action(code, screen)
            except ActionError as e:
                raise ValueError(f"task {task.id}: its solution {code!r} does not parse: {e}") from None
            for a in acts:
                if a.kind == "type":
                    snippets.update(_SNIPPET.findall(a.text))
                elif a.kind == "press" and len(a.keys) == 1:
                    if a.keys[0] not in found_keys:
                        found_keys.append(a.keys[0])
                elif a.kind in ("press", "hotkey") or (a.kind == "click" and clicks):
                    s = Action(a.kind, x=a.x, y=a.y, button=a.button, clicks=a.clicks, keys=a.keys).to_pyautogui()
                    if s not in click_set:
                        click_set.append(s)
                elif a.kind == "answer" and answers and a.to_pyautogui() not in answer_set:
                    answer_set.append(a.to_pyautogui())
    return (
        ["DONE"]
        + [Action("press", keys=(k,)).to_pyautogui() for k in found_keys]
        + click_set
        + [Action("type", text=s).to_pyautogui() for s in sorted(snippets)]
        + answer_set
    )


class Vocabulary(gym.ActionWrapper):
    """Discrete(len(entries)) -> entries[i]. With entries=None, the vocabulary of the env's own task list
    (`env.unwrapped.task_ids`), built by `vocabulary_from_tasks(**options)`."""

    def __init__(self, env: gym.Env, entries: Sequence[str] | None = None, **options):
        super().__init__(env)
        require_text_actions(env, "Vocabulary")
        screen = screen_of(env)
        if entries is None:
            base = env.unwrapped
            entries = vocabulary_from_tasks([base.tasks[t] for t in base.task_ids], screen=screen, **options)
        elif options:
            raise TypeError(f"options {sorted(options)} only apply when the vocabulary is built from tasks")
        entries = list(dict.fromkeys(entries))
        if not entries:
            raise ValueError("a Vocabulary needs at least one action")
        for e in entries:  # every entry must be a valid action now, not an error mid-episode
            try:
                parse_action(e, screen)
            except ActionError as err:
                raise ValueError(f"vocabulary entry {e!r} is not a valid action: {err}") from None
        self.entries: list[str] = entries
        self.action_space = spaces.Discrete(len(entries))

    def index(self, entry: str) -> int:
        """The action id of an entry (for scripted or oracle use)."""
        return self.entries.index(entry)

    def encode(self, text: str) -> list[int]:
        """The action ids that type `text`, snippet by snippet; ValueError naming a snippet not in the
        vocabulary."""
        ids = []
        for s in _SNIPPET.findall(text):
            entry = Action("type", text=s).to_pyautogui()
            if entry not in self.entries:
                raise ValueError(f"{s!r} (of {text!r}) is not in the vocabulary")
            ids.append(self.entries.index(entry))
        return ids

    def action(self, action) -> str:
        i = int(np.asarray(action).item())
        if not 0 <= i < len(self.entries):
            raise ValueError(f"Vocabulary action {i} is outside Discrete({len(self.entries)})")
        return self.entries[i]
