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
from typing import Any, Sequence

import numpy as np

from coda_env.actions import ActionError, parse_action

from . import prompts
from .executor import Executor, plans_to_actions, uitars_action
from .models import Conversation, SamplingParams, VLM, generate_until_parsed, model_image_size
from .planner import Plan, PlanParseError, Planner, Turn
from .types import Agent, AgentStep, Sample
from .uitars import UITarsParseError, parse_uitars

__all__ = [
    "AGENTS",
    "Agent",
    "AgentStep",
    "CodaAgent",
    "DoneAgent",
    "OracleAgent",
    "PlannerOnlyAgent",
    "RandomAgent",
    "Sample",
    "UITarsAgent",
    "conversation_record",
    "make_agent",
    "planner_code",
]


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
        convs = [
            self.planner.conversation(self.instructions[s], self.history[s], obs["screenshot"]) for s, obs in batch
        ]
        out = []
        for conv, (gen, plan) in zip(convs, self.planner.plan(convs)):
            step = AgentStep(
                "WAIT",
                calls=[
                    {
                        "model": "planner",
                        "input": conversation_record(conv),
                        "output": gen.text,
                        "seconds": round(gen.seconds, 3),
                        **({"tokens": len(gen.token_ids)} if gen.token_ids is not None else {}),
                    }
                ],
            )
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

    def __init__(self, planner: Planner, executor):
        super().__init__(planner)
        self.executor = executor  # executor.Executor (UI-TARS) or a11y_executor.A11yExecutor

    @property
    def wants_a11y_tree(self) -> bool:
        """True when the executor reads the `a11y_tree` observation (make the env with a11y_tree=True)."""
        return bool(getattr(self.executor, "wants_a11y_tree", False))

    def act(self, batch: Sequence[tuple[int, dict]]) -> list[AgentStep]:
        planned = self._plan(batch)
        steps = [step for step, _ in planned]
        results = plans_to_actions(
            self.executor, [(self.instructions[slot], plan, obs) for (slot, obs), (_, plan) in zip(batch, planned)]
        )
        for step, res in zip(steps, results):
            step.calls += res.calls
            step.parse_errors += res.parse_errors
            if res.sample is not None:
                step.samples.append(res.sample)
            if res.action is not None:
                step.action = res.action
        self._remember(batch, steps)
        return steps


# ------------------------------------------------------------------------------------------ baselines
class UITarsAgent:
    """UI-TARS end to end: its computer-use prompt, the recent screenshots and its own earlier answers."""

    name = "uitars"

    def __init__(
        self,
        model: VLM,
        screen: tuple[int, int] = (1280, 800),
        history_images: int = 5,
        coords: str = "absolute",
        tries: int = 3,
        params: SamplingParams | None = None,
    ):
        self.model, self.screen, self.history_images, self.coords, self.tries = (
            model,
            screen,
            history_images,
            coords,
            tries,
        )
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

        def parse(text: str) -> tuple[str, str]:
            thought, _ = parse_uitars(text)
            return thought or "", uitars_action(text, image_size, self.screen, self.coords)

        tries = generate_until_parsed(self.model, convs, self.params, parse, self.tries, (UITarsParseError,))
        steps = [AgentStep("WAIT") for _ in batch]
        answers = [""] * len(batch)
        for k, attempts in enumerate(tries):
            sample = None  # the last try that gave token ids: the one that counts
            for a in attempts:
                g = a.generation
                steps[k].calls.append(
                    {
                        "model": "uitars",
                        "attempt": a.number,
                        "input": conversation_record(convs[k]) if a.number == 1 else "(same)",
                        "output": g.text,
                        "seconds": round(g.seconds, 3),
                        **({"tokens": len(g.token_ids)} if g.token_ids is not None else {}),
                    }
                )
                if g.token_ids:
                    sample = Sample("policy", convs[k], list(g.token_ids), g.logprobs)
                if a.ok:
                    steps[k].thought, steps[k].action = a.value
                    steps[k].plan, answers[k] = g.text, g.text
                else:
                    steps[k].parse_errors.append(f"uitars try {a.number}: {a.error}")
            if sample is not None:
                steps[k].samples.append(sample)
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
    parse_action(code, screen)  # raises ActionError; nothing is executed
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


A11Y_EXECUTOR = "a11y"  # --executor a11y: grounds the planner's step in the accessibility tree, no model


def _load(spec, model_name: str | None, options: dict[str, Any]):
    """A model from a spec (models.load_model: a local checkpoint directory or an http(s):// endpoint); a model
    object is used as it is."""
    from .models import load_model

    if not isinstance(spec, str):
        return spec
    return load_model(spec, model_name, **options)


def make_executor(
    executor,
    screen: tuple[int, int] = (1280, 800),
    executor_model: str | None = None,
    model_options: dict[str, Any] | None = None,
    tries: int = 3,
    params: SamplingParams | None = None,
    shared=None,
):
    """The coda agent's executor: `a11y` (the accessibility-tree executor, no model), UI-TARS from a spec
    (directory or endpoint) or a model object, or an executor object as it is. `shared`: (spec, model) of the
    planner, whose model is reused when the executor's spec is the same."""
    if executor is None:
        raise ValueError(
            "--agent coda needs --executor PATH_OR_URL (a UI-TARS-1.5 checkpoint or endpoint) "
            f"or --executor {A11Y_EXECUTOR}"
        )
    if executor == A11Y_EXECUTOR:
        from .a11y_executor import A11yExecutor

        return A11yExecutor(screen)
    if hasattr(executor, "execute"):
        return executor
    if shared is not None and isinstance(executor, str) and executor == shared[0]:
        model = shared[1]
    else:
        model = _load(executor, executor_model, model_options or {})
    kw = {"params": params} if params is not None else {}
    return Executor(model, screen, tries=tries, **kw)


def make_agent(
    name: str,
    app: str = "kalgebra",
    screen: tuple[int, int] = (1280, 800),
    planner=None,
    executor=None,
    planner_model: str | None = None,
    executor_model: str | None = None,
    history_images: int = 2,
    seed: int = 0,
    model_options: dict[str, Any] | None = None,
    *,
    planner_params: SamplingParams | None = None,
    executor_params: SamplingParams | None = None,
    executor_tries: int = 3,
) -> Agent:
    """Build an agent by name: the one factory `coda eval` and the trainers use. `planner`/`executor` are local
    checkpoint paths, http(s):// endpoints or model objects (a trainer passes the model it trains); the
    coda agent's executor may also be `a11y` (no model) or an executor object. The same spec for both loads
    the model once. `planner_params`: the planner's (or UI-TARS's) sampling; `executor_params`/
    `executor_tries`: the executor's sampling and re-tries (UI-TARS alone uses `executor_tries` too)."""
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
        if executor == A11Y_EXECUTOR:
            raise ValueError(f"--agent uitars is a model: --executor {A11Y_EXECUTOR} is for --agent coda")
        kw = {"params": planner_params} if planner_params is not None else {}
        return UITarsAgent(
            _load(executor, executor_model, opts),
            screen,
            history_images=max(1, history_images),
            tries=executor_tries,
            **kw,
        )
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; choose from {', '.join(AGENTS)}")
    if not planner:
        raise ValueError(f"--agent {name} needs --planner PATH_OR_URL (a Qwen2.5-VL checkpoint or endpoint)")
    plan_model = _load(planner, planner_model, opts)
    pkw = {"params": planner_params} if planner_params is not None else {}
    if name == "planner-only":
        return PlannerOnlyAgent(
            Planner(plan_model, app, screen, history_images, system=prompts.PLANNER_ONLY_SYSTEM, **pkw)
        )
    shared = (planner, plan_model) if isinstance(planner, str) and executor_model == planner_model else None
    ex = make_executor(executor, screen, executor_model, opts, executor_tries, executor_params, shared)
    return CodaAgent(Planner(plan_model, app, screen, history_images, **pkw), ex)
