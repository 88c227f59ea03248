"""Agents over a batch of observations from a gymnasium vector env.

Every agent has the same two calls:
    reset(slot, task)            a new episode starts in env `slot` of the vector env
    act([(slot, obs), ...])      -> one AgentStep per entry: the env action and a record of how it was made
Each AgentStep carries every model input (images as placeholders) and output, and its parse errors, so a
trajectory file shows exactly what each model was asked and said, and a `Sample` (rollout.py) of each model
call whose answer was used and whose model gave token ids: what trainers learn from. Agents: `coda` (planner
+ executor), the baselines `uitars` (UI-TARS alone), `planner-only` (the planner writes pyautogui code, as
ScienceBoard's agents do), `oracle` (replays the task's solution), `random`, and `done` (answers DONE at once).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from coda_env.actions import ActionError, parse_action

from . import prompts
from .executor import Executor, uitars_action
from .models import Conversation, SamplingParams, VLM, model_image_size
from .planner import Plan, PlanParseError, Planner, Turn
from .rollout import Sample
from .uitars import UITarsParseError, parse_uitars


@dataclass
class AgentStep:
    action: str                                   # what goes to env.step
    thought: str = ""
    plan: str = ""                                # the planner's step in words (coda) or the raw action
    calls: list[dict] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)   # the used model calls that gave token ids


class Agent(Protocol):
    name: str

    def reset(self, slot: int, task) -> None: ...

    def act(self, batch: Sequence[tuple[int, dict]]) -> list[AgentStep]: ...


def conversation_record(conv: Conversation) -> list[dict]:
    """A JSON-safe copy of a conversation: images become `<image WxH>` placeholders."""
    out = []
    for m in conv:
        if isinstance(m["content"], str):
            out.append({"role": m["role"], "content": m["content"]})
            continue
        parts = []
        for p in m["content"]:
            if p["type"] == "image":
                h, w = np.asarray(p["image"]).shape[:2]
                parts.append(f"<image {w}x{h}>")
            else:
                parts.append(p["text"])
        out.append({"role": m["role"], "content": "\n".join(parts)})
    return out


# ------------------------------------------------------------------------------------------ CODA
class _PlannerAgent:
    """What the planner-driven agents share: per-slot instruction and history, and the planner turn."""

    def __init__(self, planner: Planner):
        self.planner = planner
        self.history: dict[int, list[Turn]] = {}
        self.instructions: dict[int, str] = {}

    def reset(self, slot: int, task) -> None:
        self.history[slot], self.instructions[slot] = [], task.instruction

    def _plan(self, batch: Sequence[tuple[int, dict]]) -> list[tuple[AgentStep, Plan | None]]:
        """One planner call for the batch: a WAIT step per entry with the call recorded, and its plan
        (None after a parse error, which is counted on the step)."""
        convs = [self.planner.conversation(self.instructions[s], self.history[s], obs["screenshot"])
                 for s, obs in batch]
        out = []
        for conv, (gen, plan) in zip(convs, self.planner.plan(convs)):
            step = AgentStep("WAIT", calls=[{"model": "planner", "input": conversation_record(conv),
                                            "output": gen.text, "seconds": round(gen.seconds, 3)}])
            if gen.token_ids:
                step.samples.append(Sample("planner", conv, list(gen.token_ids), gen.logprobs))
            if isinstance(plan, PlanParseError):
                step.parse_errors.append(f"planner: {plan}")
                plan = None
            else:
                step.thought, step.plan = plan.thought, plan.action
            out.append((step, plan))
        return out

    def _remember(self, batch: Sequence[tuple[int, dict]], steps: Sequence[AgentStep]) -> None:
        for (slot, obs), step in zip(batch, steps):
            self.history[slot].append(Turn(obs["screenshot"], step.thought, step.plan or step.action))


class CodaAgent(_PlannerAgent):
    """Planner (Cerebrum) writes the step in words; executor (Cerebellum) turns it into a GUI action.
    Terminal answers of the planner go to the env directly; a parse failure of either is a counted
    parse error and the env gets WAIT (nothing happens; the episode goes on)."""
    name = "coda"

    def __init__(self, planner: Planner, executor: Executor):
        super().__init__(planner)
        self.executor = executor

    def act(self, batch: Sequence[tuple[int, dict]]) -> list[AgentStep]:
        planned = self._plan(batch)
        steps = [step for step, _ in planned]
        todo: list[tuple[int, str]] = []          # (index into batch, thought for the executor)
        for k, (step, plan) in enumerate(planned):
            if plan is None:
                continue
            if plan.terminal:
                step.action = plan.terminal
            else:
                todo.append((k, f"{plan.thought} {plan.action}".strip()))
        if todo:
            results = self.executor.execute([(self.instructions[batch[k][0]], thought, batch[k][1]["screenshot"])
                                             for k, thought in todo])
            for (k, _), res in zip(todo, results):
                steps[k].calls += res.calls
                steps[k].parse_errors += res.parse_errors
                if res.sample is not None:
                    steps[k].samples.append(res.sample)
                if res.action is not None:
                    steps[k].action = res.action
        self._remember(batch, steps)
        return steps


# ------------------------------------------------------------------------------------------ baselines
class UITarsAgent:
    """UI-TARS end to end: its computer-use prompt, the recent screenshots and its own earlier answers."""
    name = "uitars"

    def __init__(self, model: VLM, screen: tuple[int, int] = (1280, 800), history_images: int = 5,
                 coords: str = "absolute", tries: int = 3,
                 params: SamplingParams | None = None):
        self.model, self.screen, self.history_images, self.coords, self.tries = model, screen, history_images, coords, tries
        self.params = params or SamplingParams(max_new_tokens=256, temperature=1.0)
        self.history: dict[int, list[tuple[np.ndarray, str]]] = {}
        self.instructions: dict[int, str] = {}

    def reset(self, slot: int, task) -> None:
        self.history[slot], self.instructions[slot] = [], task.instruction

    def conversation(self, slot: int, screenshot: np.ndarray) -> Conversation:
        conv: Conversation = [{"role": "user", "content": prompts.uitars_prompt(self.instructions[slot])}]
        hist = self.history[slot]
        for i, (shot, answer) in enumerate(hist):
            if i >= len(hist) - (self.history_images - 1):
                conv.append({"role": "user", "content": [{"type": "image", "image": shot}]})
            conv.append({"role": "assistant", "content": answer})
        conv.append({"role": "user", "content": [{"type": "image", "image": screenshot}]})
        return conv

    def act(self, batch: Sequence[tuple[int, dict]]) -> list[AgentStep]:
        image_size = model_image_size(self.model, self.screen)
        convs = [self.conversation(s, obs["screenshot"]) for s, obs in batch]
        steps = [AgentStep("WAIT") for _ in batch]
        answers = [""] * len(batch)
        samples: list[Sample | None] = [None] * len(batch)      # each entry's last try: the one that counts
        todo = list(range(len(batch)))
        for attempt in range(self.tries):
            if not todo:
                break
            gens = self.model.generate([convs[k] for k in todo], self.params)
            failed = []
            for k, g in zip(todo, gens):
                steps[k].calls.append({"model": "uitars", "attempt": attempt + 1, "input": conversation_record(
                    convs[k]) if attempt == 0 else "(same)", "output": g.text, "seconds": round(g.seconds, 3)})
                if g.token_ids:
                    samples[k] = Sample("policy", convs[k], list(g.token_ids), g.logprobs)
                try:
                    thought, _ = parse_uitars(g.text)
                    steps[k].action = uitars_action(g.text, image_size, self.screen, self.coords)
                    steps[k].thought, steps[k].plan, answers[k] = thought or "", g.text, g.text
                except UITarsParseError as e:
                    steps[k].parse_errors.append(f"uitars try {attempt + 1}: {e}")
                    failed.append(k)
            todo = failed
        for step, sample in zip(steps, samples):
            if sample is not None:
                step.samples.append(sample)
        for k, (slot, obs) in enumerate(batch):
            self.history[slot].append((obs["screenshot"], answers[k] or "Thought: \nAction: wait()"))
        return steps


_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def planner_code(plan: Plan, screen: tuple[int, int]) -> str:
    """The env action in a planner-only answer: a terminal word, or the pyautogui code block, validated."""
    if plan.terminal:
        return plan.terminal
    m = _CODE.search(plan.action)
    code = (m.group(1) if m else plan.action).strip()
    parse_action(code, screen)                    # raises ActionError; nothing is executed
    return code


class PlannerOnlyAgent(_PlannerAgent):
    """The planner alone writes pyautogui code (the ScienceBoard baseline); code outside the whitelist
    is a counted parse error and the env gets WAIT."""
    name = "planner-only"

    def act(self, batch: Sequence[tuple[int, dict]]) -> list[AgentStep]:
        planned = self._plan(batch)
        for step, plan in planned:
            if plan is not None:
                try:
                    step.action = planner_code(plan, self.planner.screen)
                except ActionError as e:
                    step.parse_errors.append(f"planner code: {e}")
        steps = [step for step, _ in planned]
        self._remember(batch, steps)
        return steps


class OracleAgent:
    """Replays the task's `solution`, then answers DONE."""
    name = "oracle"

    def __init__(self):
        self.plans: dict[int, list[str]] = {}

    def reset(self, slot: int, task) -> None:
        self.plans[slot] = list(task.solution) or ["DONE"]

    def act(self, batch):
        return [AgentStep(self.plans[s].pop(0) if self.plans[s] else "DONE") for s, _ in batch]


class DoneAgent:
    """Answers DONE at once: the floor every task's checks must reject."""
    name = "done"

    def reset(self, slot: int, task) -> None:
        pass

    def act(self, batch):
        return [AgentStep("DONE") for _ in batch]


class RandomAgent:
    """Random valid clicks, keys and text; DONE with small probability."""
    name = "random"

    def __init__(self, seed: int = 0, screen: tuple[int, int] = (1280, 800)):
        self.rng, self.screen = random.Random(seed), screen

    def reset(self, slot: int, task) -> None:
        pass

    def _one(self) -> str:
        r, (w, h) = self.rng.random(), self.screen
        if r < 0.05:
            return "DONE"
        if r < 0.6:
            return f"pyautogui.click({self.rng.randrange(w)}, {self.rng.randrange(h)})"
        if r < 0.8:
            return f"pyautogui.press('{self.rng.choice(['enter', 'tab', 'esc', 'backspace', 'down'])}')"
        return f"pyautogui.write('{self.rng.choice(['x', '2+2', 'sin(x)', 'a:=1'])}')"

    def act(self, batch):
        return [AgentStep(self._one()) for _ in batch]


AGENTS = ("coda", "uitars", "planner-only", "oracle", "random", "done")


def make_agent(name: str, app: str = "kalgebra", screen: tuple[int, int] = (1280, 800), planner: str | None = None,
               executor: str | None = None, planner_model: str | None = None, executor_model: str | None = None,
               history_images: int = 2, seed: int = 0, model_options: dict[str, Any] | None = None) -> Agent:
    """Build an agent by name; `planner`/`executor` are local checkpoint paths or http(s):// endpoints."""
    from .models import load_model
    if name == "oracle":
        return OracleAgent()
    if name == "done":
        return DoneAgent()
    if name == "random":
        return RandomAgent(seed, screen)
    opts = model_options or {}
    if name == "uitars":
        if not executor:
            raise ValueError("--agent uitars needs --executor PATH_OR_URL (a UI-TARS-1.5 checkpoint or endpoint)")
        return UITarsAgent(load_model(executor, executor_model, **opts), screen, history_images=max(1, history_images))
    if not planner:
        raise ValueError(f"--agent {name} needs --planner PATH_OR_URL (a Qwen2.5-VL checkpoint or endpoint)")
    plan_model = load_model(planner, planner_model, **opts)
    if name == "planner-only":
        return PlannerOnlyAgent(Planner(plan_model, app, screen, history_images, system=prompts.PLANNER_ONLY_SYSTEM))
    if name == "coda":
        if not executor:
            raise ValueError("--agent coda needs --executor PATH_OR_URL (a UI-TARS-1.5 checkpoint or endpoint)")
        exec_model = plan_model if executor == planner and executor_model == planner_model else \
            load_model(executor, executor_model, **opts)
        return CodaAgent(Planner(plan_model, app, screen, history_images), Executor(exec_model, screen))
    raise ValueError(f"unknown agent {name!r}; choose from {', '.join(AGENTS)}")
