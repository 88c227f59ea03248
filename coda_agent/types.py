"""The values the agent's parts hand each other, in a leaf module (it imports nothing else of coda_agent), so
that models, executors, agents, rollouts and trainers can all name them without import cycles.

    Conversation   a chat in the OpenAI shape, images as arrays or PIL images (see models.py)
    Sample         one model call as a trainer needs it: prompt, sampled tokens, behaviour log-probs, the role
                   of the model that made it, its group key and its reward
    AgentStep      what an agent did at one step of one env: the env action and how it was made
    Agent          the protocol every agent follows (reset a slot, act on a batch of observations)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence

Conversation = list[dict[str, Any]]

Role = Literal["planner", "executor", "policy"]


@dataclass
class Sample:
    """One model call as a trainer needs it: the prompt, the sampled tokens and their behaviour log-probs
    (None when the model did not return them; trainers recompute them), tagged with the role of the model
    that made the call (CODA's `planner` and `executor`, or an end-to-end `policy` such as UI-TARS), the
    group it is compared within and its reward.

    `group` and `reward` belong to the sample: whoever makes or collects it may set them (a step-level method
    groups by state and scores each action; episodic GRPO groups by task and gives every sample its episode's
    reward). `rollout.collect_groups` fills only what is still unset (None)."""

    role: Role
    conversation: Conversation
    token_ids: list[int]
    logprobs: list[float] | None = None
    group: str | None = None
    reward: float | None = None


@dataclass
class AgentStep:
    action: str  # what goes to env.step
    thought: str = ""
    plan: str = ""  # the planner's step in words (coda) or the raw action
    calls: list[dict] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)  # the used model calls that gave token ids


class Agent(Protocol):
    name: str

    def reset(self, slot: int, task) -> None: ...

    def act(self, batch: Sequence[tuple[int, dict]]) -> list[AgentStep]: ...


__all__ = ["Agent", "AgentStep", "Conversation", "Role", "Sample"]
