"""The agent's seams (issue 24 item 6): the leaf types module, the one retry-until-parsed helper, the one agent
factory, and samples that carry their own group key and reward. Fast tier: FAKE scripted models and the FAKE
env where a model's words or an app do not matter, tiny real transformers models where loading does."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from coda_agent.models import Generation, SamplingParams, generate_until_parsed

fast = pytest.mark.fast
ROOT = Path(__file__).resolve().parent.parent


class ScriptedVLM:
    """A FAKE model: answers each conversation with the next text of its script, and records the batches."""

    name, min_pixels, max_pixels = "scripted", 56 * 56, 64 * 28 * 28

    def __init__(self, answers):
        self.answers, self.batches = list(answers), []

    def generate(self, conversations, params):
        self.batches.append(len(conversations))
        return [Generation(self.answers.pop(0), token_ids=[1, 2]) for _ in conversations]


@fast
def test_types_is_a_leaf_and_the_old_names_still_work():
    tree = ast.parse((ROOT / "coda_agent" / "types.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    assert not relative and not [m for m in imported if m.startswith("coda")], imported
    from coda_agent import policy, rollout, types

    assert rollout.Sample is types.Sample and policy.Sample is types.Sample
    assert policy.AgentStep is types.AgentStep and policy.Agent is types.Agent


@fast
def test_generate_until_parsed_resamples_only_the_failures_together():
    model = ScriptedVLM(["ok 1", "bad", "bad", "ok 2", "bad", "bad"])

    def parse(text):
        if not text.startswith("ok"):
            raise ValueError(f"not ok: {text}")
        return int(text.split()[1])

    out = generate_until_parsed(model, [[], [], []], SamplingParams(), parse, tries=3)
    assert model.batches == [3, 2, 1]  # the two failures together, then the last one
    assert [[a.number for a in tries] for tries in out] == [[1], [1, 2], [1, 2, 3]]
    assert out[0][-1].value == 1 and out[1][-1].value == 2
    assert not out[2][-1].ok and out[2][-1].error == "not ok: bad"


@fast
def test_executor_and_uitars_agent_retry_through_the_helper():
    """Both retry loops are the helper's: a first unparseable answer is re-sampled, and counted."""
    import numpy as np

    from coda_agent.executor import Executor
    from coda_agent.policy import UITarsAgent

    shot = np.zeros((800, 1280, 3), np.uint8)
    ex = Executor(ScriptedVLM(["gibberish", "click(start_box='(10,10)')"]), tries=3)
    (res,) = ex.execute([("task", "Click it", shot)])
    assert res.action is not None and res.action.startswith("pyautogui.click(")
    assert len(res.calls) == 2 and res.parse_errors[0].startswith("executor try 1:")
    agent = UITarsAgent(ScriptedVLM(["nonsense", "Thought: t\nAction: hotkey(key='ctrl c')"]), tries=2)
    agent.reset(0, type("T", (), {"instruction": "x"})())
    (step,) = agent.act([(0, {"screenshot": shot})])
    assert step.action == "pyautogui.hotkey('ctrl', 'c')" and step.thought == "t"
    assert [c["attempt"] for c in step.calls] == [1, 2] and len(step.parse_errors) == 1


class _TaggingAgent:
    """A FAKE agent whose planner sample carries its own group key and reward (a step-level method's), and
    whose executor sample leaves them to the rollout."""

    name = "tagging"

    def reset(self, slot, task):
        pass

    def act(self, batch):
        from coda_agent.types import AgentStep, Sample

        return [
            AgentStep(
                "DONE", samples=[Sample("planner", [], [1], group="state-7", reward=1.5), Sample("executor", [], [2])]
            )
            for _ in batch
        ]


@fast
def test_samples_keep_their_own_group_and_reward_and_tag_step_sees_each_step():
    import gymnasium as gym

    from coda_agent.rollout import collect_groups
    from coda_agent.train import common
    from tests.fakes import FAKE_ENV_ID

    envs = gym.make_vec(
        FAKE_ENV_ID,
        num_envs=1,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
    )
    seen = []
    try:
        tasks = common.probe_env(FAKE_ENV_ID).tasks
        rollouts = collect_groups(
            envs,
            _TaggingAgent(),
            tasks,
            ["fake_answer"],
            2,
            seed=0,
            tag_step=lambda r, n, step, info: seen.append((r.task, n, len(step.samples))),
        )
    finally:
        envs.close()
    assert seen == [("fake_answer", 1, 2)] * 2
    for r in rollouts:
        planner, executor = r.samples
        assert (planner.group, planner.reward) == ("state-7", 1.5)  # its own, kept
        assert (executor.group, executor.reward) == (r.group, r.reward)  # filled from the episode


@fast
def test_trainers_build_agents_through_the_one_factory(tmp_path, monkeypatch):
    from coda_agent import policy
    from coda_agent.models import TransformersVLM
    from coda_agent.tiny import build_tiny_qwen2_5_vl
    from coda_agent.train import common

    calls = []
    real = policy.make_agent
    monkeypatch.setattr(policy, "make_agent", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    vlm = TransformersVLM(build_tiny_qwen2_5_vl(tmp_path / "p"))
    exe = str(build_tiny_qwen2_5_vl(tmp_path / "e", seed=1))
    cfg = common.RolloutConfig(executor=exe, executor_tries=2, executor_max_new_tokens=7, temperature=0.7)
    env = common.EnvInfo("x", {}, {}, "kalgebra", (1280, 800))
    agent = common.coda_agent(cfg, vlm, env)
    assert calls and calls[0][0][0] == "coda"
    assert agent.planner.model is vlm and agent.planner.params.temperature == 0.7 and agent.planner.params.logprobs
    assert agent.executor.tries == 2 and agent.executor.params.max_new_tokens == 7
    assert agent.executor.model is not vlm
    with pytest.raises(ValueError, match="separate model"):
        common.coda_agent(cfg, vlm, env, executor=vlm)
    ui = common.uitars_agent(common.RolloutConfig(executor_tries=4), vlm, env)
    assert ui.model is vlm and ui.tries == 4 and ui.params.logprobs
    assert [c[0][0] for c in calls] == ["coda", "uitars"]
