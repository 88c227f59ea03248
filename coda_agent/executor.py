"""The Cerebellum: UI-TARS-1.5 turns the planner's step into one precise GUI action.

As in CODA's inference code, UI-TARS gets its own computer-use prompt (with the task) and the screenshot as
the user turn, and an assistant turn that already starts with `Thought: <planner's thought>\\nAction: `, so
it only completes the action, in its own grammar (parsed by `coda_agent.uitars`, never executed). Its
coordinates are pixels of the image as Qwen2.5-VL resized it; they are mapped back to screen pixels.
Sampling is at temperature 1.0 with up to `tries` attempts; a last failure is a counted parse error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from . import prompts
from .models import Conversation, SamplingParams, VLM, model_image_size
from .rollout import Sample
from .uitars import UITarsParseError, parse_uitars, to_env_action


@dataclass
class ExecResult:
    action: str | None                          # the env action, or None when every try failed to parse
    calls: list[dict] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    sample: Sample | None = None                # the last try (the one that counts), when the model gives ids


def uitars_action(text: str, image_size: tuple[int, int], screen: tuple[int, int],
                  coords: str = "absolute") -> str:
    """UI-TARS's answer (with or without its `Thought:` part) -> this project's action string."""
    _, actions = parse_uitars(text)
    return to_env_action(actions, image_size, screen, coords)


@dataclass
class Executor:
    model: VLM
    screen: tuple[int, int] = (1280, 800)
    coords: str = "absolute"           # UI-TARS-1.5: resized-image pixels; "relative1000" for UI-TARS v1
    tries: int = 3
    params: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=128, temperature=1.0))

    def conversation(self, instruction: str, thought: str, screenshot: np.ndarray) -> Conversation:
        return [{"role": "user", "content": [{"type": "text", "text": prompts.uitars_prompt(instruction)},
                                             {"type": "image", "image": screenshot}]},
                {"role": "assistant", "content": f"Thought: {thought}\nAction: "}]

    def execute(self, items: Sequence[tuple[str, str, np.ndarray]]) -> list[ExecResult]:
        """items: (instruction, planner thought, screenshot) per env. Failed parses are re-sampled together."""
        results = [ExecResult(None) for _ in items]
        convs = [self.conversation(*it) for it in items]
        image_size = model_image_size(self.model, self.screen)
        todo = list(range(len(items)))
        for attempt in range(self.tries):
            if not todo:
                break
            gens = self.model.generate([convs[i] for i in todo], self.params)
            failed = []
            for i, g in zip(todo, gens):
                call = {"model": "executor", "attempt": attempt + 1, "prefix": convs[i][-1]["content"],
                        "output": g.text, "seconds": round(g.seconds, 3)}
                results[i].calls.append(call)
                if g.token_ids:
                    results[i].sample = Sample("executor", convs[i], list(g.token_ids), g.logprobs)
                try:
                    results[i].action = uitars_action(g.text, image_size, self.screen, self.coords)
                except UITarsParseError as e:
                    results[i].parse_errors.append(f"executor try {attempt + 1}: {e}")
                    failed.append(i)
            todo = failed
        return results
