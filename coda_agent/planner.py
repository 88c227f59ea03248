"""The Cerebrum: a Qwen2.5-VL planner that writes the next step in words.

Each turn it sees the task, every earlier thought and action, the screenshots of the last `history_images`
steps, and the current screenshot, as a multi-turn chat (older screenshots are left out to bound the
context). It answers `Thought: ...` / `Action: ...`; an action of `DONE`, `FAIL`, `WAIT` or `ANS <text>` is a
terminal answer that goes to the env as it is, without the executor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import prompts
from .models import Conversation, Generation, SamplingParams, VLM


class PlanParseError(ValueError):
    """The planner's answer does not follow the Thought/Action format."""


@dataclass
class Turn:
    """One past step of an episode, as the planner remembers it."""

    screenshot: np.ndarray | None
    thought: str
    action: str


@dataclass
class Plan:
    thought: str
    action: str  # the step in words, or the terminal answer
    terminal: str | None = None  # "DONE" | "FAIL" | "WAIT" | "ANS <text>" when the answer is terminal


_TERMINAL = re.compile(r"^\W*(DONE|FAIL|WAIT)\W*$|^\W*ANS\b[\s:]*(.*?)\W*$", re.IGNORECASE | re.DOTALL)
_FIELDS = re.compile(r"^\s*(Thought|Action)\s*:\s*", re.IGNORECASE | re.MULTILINE)


def parse_plan(text: str) -> Plan:
    """Split `Thought: ... Action: ...`; recognise terminal answers."""
    if not text or not text.strip():
        raise PlanParseError("the planner's answer is empty")
    marks = list(_FIELDS.finditer(text))
    found: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        found.setdefault(m.group(1).lower(), text[m.end() : end].strip())
    action = found.get("action")
    if not action:
        raise PlanParseError(f"no 'Action:' line in the planner's answer: {text.strip()[:120]!r}")
    thought = found.get("thought", "")
    m = _TERMINAL.match(action)
    if m and m.group(1):
        return Plan(thought, action, m.group(1).upper())
    if m and action.lstrip("`'\" ").upper().startswith("ANS"):
        return Plan(thought, action, f"ANS {m.group(2).strip()}".rstrip())
    return Plan(thought, action)


@dataclass
class Planner:
    model: VLM
    app: str
    screen: tuple[int, int] = (1280, 800)
    history_images: int = 2
    params: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=512, temperature=0.0))
    system: str = prompts.PLANNER_SYSTEM

    def conversation(self, instruction: str, history: Sequence[Turn], screenshot: np.ndarray) -> Conversation:
        """The chat the planner answers: task, then (screenshot, answer) turns, then the current screen."""
        w, h = self.screen
        conv: Conversation = [{"role": "system", "content": self.system.format(app=self.app, width=w, height=h)}]
        first_image = len(history) - self.history_images
        user: list[dict[str, Any]] = [{"type": "text", "text": prompts.PLANNER_TASK.format(instruction=instruction)}]
        for i, turn in enumerate(history):
            if i >= first_image and turn.screenshot is not None:
                user += [
                    {"type": "text", "text": prompts.PLANNER_HISTORY_SCREEN.format(step=i + 1)},
                    {"type": "image", "image": turn.screenshot},
                ]
            else:
                user.append({"type": "text", "text": f"Step {i + 1} (screenshot omitted)."})
            conv.append({"role": "user", "content": user})
            conv.append({"role": "assistant", "content": f"Thought: {turn.thought}\nAction: {turn.action}"})
            user = []
        user += [
            {"type": "text", "text": prompts.PLANNER_STEP.format(step=len(history) + 1)},
            {"type": "image", "image": screenshot},
        ]
        conv.append({"role": "user", "content": user})
        return conv

    def plan(self, conversations: Sequence[Conversation]) -> list[tuple[Generation, Plan | PlanParseError]]:
        gens = self.model.generate(conversations, self.params)
        out = []
        for g in gens:
            try:
                out.append((g, parse_plan(g.text)))
            except PlanParseError as e:
                out.append((g, e))
        return out
