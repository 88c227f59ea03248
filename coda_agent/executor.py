"""The Cerebellum: UI-TARS-1.5 turns the planner's step into one precise GUI action.

As in CODA's inference code, UI-TARS gets its own computer-use prompt (with the task) and the screenshot as
the user turn, and an assistant turn that already starts with `Thought: <planner's thought>\\nAction: `, so
it only completes the action, in its own grammar (parsed by `coda_agent.uitars`, never executed). Its
coordinates are pixels of the image as Qwen2.5-VL resized it; they are mapped back to screen pixels.
Sampling is at temperature 1.0 with up to `tries` attempts; a last failure is a counted parse error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from . import prompts
from .models import SamplingParams, VLM, generate_until_parsed, model_image_size
from .planner import Plan
from .types import Conversation, Sample
from .uitars import UITarsParseError, parse_uitars, to_env_action


@dataclass
class ExecResult:
    action: str | None  # the env action, or None when every try failed to parse
    calls: list[dict] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    sample: Sample | None = None  # the last try (the one that counts), when the model gives ids


class PlanExecutor(Protocol):
    """What turns a planner's step into an env action: UI-TARS (`Executor`) or the accessibility tree
    (`coda_agent.a11y_executor.A11yExecutor`). Items are (instruction, the planner's step text, observation),
    the observation being the env's observation dict or just its screenshot."""

    def execute(self, items: Sequence[tuple[str, str, Any]]) -> list[ExecResult]: ...


def screenshot_of(observation: Any) -> np.ndarray:
    """The screenshot of an observation dict, or the observation itself when it is an image already."""
    return observation["screenshot"] if isinstance(observation, dict) else observation


def uitars_action(text: str, image_size: tuple[int, int], screen: tuple[int, int], coords: str = "absolute") -> str:
    """UI-TARS's answer (with or without its `Thought:` part) -> this project's action string."""
    _, actions = parse_uitars(text)
    return to_env_action(actions, image_size, screen, coords)


def uitars_conversation(instruction: str, thought: str, screenshot) -> Conversation:
    """What UI-TARS is asked, as CODA's inference code asks it: its computer-use prompt with the screenshot as
    the user turn, and an assistant turn that already starts `Thought: <thought>\nAction: ` for the model to
    complete with the action. The executor and Co-EPG's grounding models (asked and fine-tuned) share it."""
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": prompts.uitars_prompt(instruction)},
                {"type": "image", "image": screenshot},
            ],
        },
        {"role": "assistant", "content": f"Thought: {thought}\nAction: "},
    ]


@dataclass
class Executor:
    model: VLM
    screen: tuple[int, int] = (1280, 800)
    coords: str = "absolute"  # UI-TARS-1.5: resized-image pixels; "relative1000" for UI-TARS v1
    tries: int = 3
    params: SamplingParams = field(default_factory=lambda: SamplingParams(max_new_tokens=128, temperature=1.0))

    def conversation(self, instruction: str, thought: str, screenshot: np.ndarray) -> Conversation:
        return uitars_conversation(instruction, thought, screenshot)

    def execute(self, items: Sequence[tuple[str, str, Any]]) -> list[ExecResult]:
        """items: (instruction, planner thought, observation or screenshot) per env. Failed parses are
        re-sampled together (models.generate_until_parsed)."""
        convs = [self.conversation(instr, thought, screenshot_of(obs)) for instr, thought, obs in items]
        image_size = model_image_size(self.model, self.screen)
        tries = generate_until_parsed(
            self.model,
            convs,
            self.params,
            lambda text: uitars_action(text, image_size, self.screen, self.coords),
            self.tries,
            (UITarsParseError,),
        )
        results = []
        for conv, attempts in zip(convs, tries):
            res = ExecResult(None)
            for a in attempts:
                g = a.generation
                res.calls.append(
                    {
                        "model": "executor",
                        "attempt": a.number,
                        "prefix": conv[-1]["content"],
                        "output": g.text,
                        "seconds": round(g.seconds, 3),
                    }
                )
                if g.token_ids:
                    res.sample = Sample("executor", conv, list(g.token_ids), g.logprobs)
                if a.ok:
                    res.action = a.value
                else:
                    res.parse_errors.append(f"executor try {a.number}: {a.error}")
            results.append(res)
        return results


def executor_text(plan: Plan) -> str:
    """What the executor is given of a (non-terminal) plan: the planner's thought and its step, as CODA hands
    UI-TARS the planner's thought as the start of its answer."""
    return f"{plan.thought} {plan.action}".strip()


def plans_to_actions(executor: PlanExecutor, items: Sequence[tuple[str, Plan | None, Any]]) -> list[ExecResult]:
    """The coda agent's one way from plans to env actions, batched: a terminal plan (DONE, FAIL, WAIT, ANS) is
    its own action; any other goes through the executor in one batched call; a plan that is None (the
    planner's answer did not parse) gets ExecResult(None). items: (instruction, plan, observation)."""
    results: list[ExecResult] = [ExecResult(None) for _ in items]
    todo = []
    for k, (instr, plan, obs) in enumerate(items):
        if plan is None:
            continue
        if plan.terminal:
            results[k].action = plan.terminal
        else:
            todo.append(k)
    if todo:
        done = executor.execute([(items[k][0], executor_text(items[k][1]), items[k][2]) for k in todo])
        for k, res in zip(todo, done):
            results[k] = res
    return results
