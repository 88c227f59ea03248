"""The CODA agent end to end with tiny real Qwen2.5-VL models on the real KAlgebra env.

The tiny model is random-initialised from real transformers classes, then taught two fixed answers by a few
real gradient steps on the task's real first screenshot (one planner answer, one executor completion), so
that the planner -> executor -> env path is exercised with real generations, not only the parse errors.
"""

from __future__ import annotations

import json

import pytest


from coda_env.actions import parse_action

torch = pytest.importorskip("torch")

from coda_agent.eval import run_eval  # noqa: E402
from coda_agent.executor import Executor  # noqa: E402
from coda_agent.models import SamplingParams, TransformersVLM  # noqa: E402
from coda_agent.planner import Planner  # noqa: E402
from coda_agent.policy import CodaAgent, PlannerOnlyAgent, UITarsAgent, make_agent  # noqa: E402
from coda_agent.tiny import build_tiny_qwen2_5_vl  # noqa: E402

PLAN = "Thought: The console is empty.\nAction: Click the input line at the bottom of the window"
CLICK = "click(start_box='(140,84)')"


def teach(vlm: TransformersVLM, pairs, steps: int = 60, lr: float = 3e-3) -> None:
    """A few steps of supervised fine-tuning on (conversation, completion) pairs: loss on completions only."""
    model = vlm.model
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    convs, comps = [c for c, _ in pairs], [t + "<|im_end|>" for _, t in pairs]
    enc = vlm.build_inputs(convs, comps)
    mask = enc.pop("completion_mask")
    labels = enc["input_ids"].masked_fill(~mask, -100)
    for _ in range(steps):
        loss = model(**enc, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@pytest.fixture(scope="module")
def first_obs():
    """The real first observation of KAlgebra's calc_power task (what the agent sees at step 1)."""
    import gymnasium as gym

    env = gym.make("coda/KAlgebra-v0")
    try:
        obs, _ = env.reset(seed=0, options={"task": "calc_power"})
        return obs
    finally:
        env.close()


@pytest.fixture(scope="module")
def taught(tmp_path_factory, first_obs):
    vlm = TransformersVLM(build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny") / "m"))
    planner = Planner(vlm, "kalgebra", params=SamplingParams(max_new_tokens=40))
    executor = Executor(vlm, params=SamplingParams(max_new_tokens=16, temperature=0.0))  # greedy: the taught answer
    instr, shot = first_obs["instruction"], first_obs["screenshot"]
    thought = "The console is empty. Click the input line at the bottom of the window"
    teach(
        vlm,
        [(planner.conversation(instr, [], shot), PLAN), (executor.conversation(instr, thought, shot), CLICK)],
        steps=80,
    )
    return vlm, planner, executor


def test_taught_model_drives_planner_and_executor(taught, first_obs):
    vlm, planner, executor = taught
    instr, shot = first_obs["instruction"], first_obs["screenshot"]
    ((gen, plan),) = planner.plan([planner.conversation(instr, [], shot)])
    assert plan.action == "Click the input line at the bottom of the window", gen.text
    (res,) = executor.execute([(instr, f"{plan.thought} {plan.action}", shot)])
    # (140, 84) in the tiny model's 280x168 image space is (640, 400) on the 1280x800 screen
    assert res.action == "pyautogui.click(640, 400)", res.calls


def _check_run(out, n_steps_max):
    steps = [json.loads(x) for x in (out / "trajectories" / "calc_power__0" / "steps.jsonl").read_text().splitlines()]
    assert 1 <= len(steps) <= n_steps_max
    for s in steps:
        assert s["action"] in ("WAIT", "DONE", "FAIL") or s["action"].startswith("ANS") or parse_action(s["action"])
        assert s["action"] != "WAIT" or s["parse_errors"], s  # WAIT only stands for a parse error here
        assert s["calls"] and all("output" in c for c in s["calls"])
    assert (out / "report" / "calc_power__0.html").exists() and (out / "results.json").exists()
    return steps


def test_coda_agent_on_real_kalgebra(taught, tmp_path):
    vlm, planner, executor = taught
    agent = CodaAgent(planner, executor)
    run_eval("coda/KAlgebra-v0", agent, tmp_path / "coda", ["calc_power"], env_kwargs={"max_steps": 3}, progress=False)
    steps = _check_run(tmp_path / "coda", 3)
    first = steps[0]
    assert [c["model"] for c in first["calls"]][0] == "planner"
    assert (
        first["calls"][0]["input"][0]["role"] == "system"
        and "<image 1280x800>" in first["calls"][0]["input"][-1]["content"]
    )
    assert any(s["action"] == "pyautogui.click(640, 400)" for s in steps)  # executor actions reached the env


def test_baselines_with_untaught_tiny_model(tmp_path):
    """Random weights: gibberish answers must become counted parse errors (WAIT), never crashes."""
    vlm = TransformersVLM(build_tiny_qwen2_5_vl(tmp_path / "raw", seed=1))
    p = SamplingParams(max_new_tokens=24, temperature=1.0)
    for name, agent in [
        ("uitars", UITarsAgent(vlm, history_images=2, params=p)),
        ("planner-only", PlannerOnlyAgent(Planner(vlm, "kalgebra", params=p))),
    ]:
        run_eval(
            "coda/KAlgebra-v0", agent, tmp_path / name, ["calc_power"], env_kwargs={"max_steps": 2}, progress=False
        )
        steps = _check_run(tmp_path / name, 2)
        assert sum(len(s["parse_errors"]) for s in steps) >= 1


def test_make_agent_shares_one_model_for_both_roles(tmp_path):
    path = str(build_tiny_qwen2_5_vl(tmp_path / "m"))
    agent = make_agent("coda", planner=path, executor=path)
    assert agent.planner.model is agent.executor.model
    with pytest.raises(ValueError, match="needs --executor"):
        make_agent("uitars")
