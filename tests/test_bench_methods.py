"""`benchmarks/methods.py`'s accounting (fast tier: no X server, no model): env steps and generated tokens per
round counted from run folders and records, the caps --budget and --token-budget put on each method's round,
the table, and the token counts the methods record for it (a planner call's `tokens`, a GRPO run's
`generated_tokens`, Co-EPG's `plan_tokens`)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("trl")

fast = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_methods", ROOT / "benchmarks" / "methods.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(folder: Path, episodes: list[tuple[str, int, list[list[dict]]]]) -> Path:
    """A run folder in `coda eval`'s layout: episodes.jsonl and trajectories/<task>__<ep>/steps.jsonl, each step
    with the given model calls."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "episodes.jsonl", "w") as f:
        for task, ep, steps in episodes:
            f.write(json.dumps({"task": task, "episode": ep, "steps": len(steps)}) + "\n")
            d = folder / "trajectories" / f"{task}__{ep}"
            d.mkdir(parents=True)
            (d / "steps.jsonl").write_text(
                "".join(json.dumps({"step": k + 1, "calls": calls}) + "\n" for k, calls in enumerate(steps))
            )
    return folder / "episodes.jsonl"


def _planner(tokens=None, output="Thought: t\nAction: ANS 3"):
    return {"model": "planner", "output": output, **({"tokens": tokens} if tokens is not None else {})}


class _Tok:
    """A fake tokenizer: one token per character (named as a fake)."""

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=list(text))


@fast
def test_live_runs_count_env_steps_and_only_the_planners_tokens(bench, tmp_path):
    ep = _run(
        tmp_path / "run",
        [
            ("a", 0, [[_planner(7), {"model": "uitars", "output": "click", "tokens": 100}], [_planner(5)]]),
            (
                "b",
                0,
                [
                    [
                        _planner(3),
                        {"model": "executor", "output": "click", "tokens": 50},
                        {"model": "a11y", "output": "x"},
                    ]
                ],
            ),
        ],
    )
    assert bench.episode_steps([ep]) == 3
    # the planner's 7 + 5 + 3 and the UI-TARS policy's 100 (the trained model of `--agent uitars`); the
    # executor's calls (model "executor", or the a11y executor's) are not the trained model's
    assert bench.planner_tokens([ep]) == 115
    un = _run(tmp_path / "endpoint", [("a", 0, [[_planner(None, output="abcd")]])])
    with pytest.raises(ValueError):
        bench.planner_tokens([un])
    assert bench.planner_tokens([un], _Tok()) == 5  # re-tokenized, + 1 for the EOS
    assert bench.planner_tokens([tmp_path / "none" / "episodes.jsonl"]) == 0


@fast
def test_a_loop_round_adds_its_live_runs_grpo_and_other_generations(bench, tmp_path):
    train = tmp_path / "train"
    _run(train / "round_-1" / "eval", [("a", 0, [[_planner(4)], [_planner(6)]])])  # coda's starting planner
    _run(train / "round_00" / "eval", [("a", 0, [[_planner(10)]]), ("b", 0, [[_planner(2)], [_planner(2)]])])
    _run(train / "round_01" / "collect", [("a", 0, [[_planner(9)]])])  # pro-cua's layout
    (train / "round_00" / "train").mkdir(parents=True)
    (train / "round_00" / "train" / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "completions/mean_length": 12.0})
        + "\n"
        + json.dumps({"summary": True, "generated_tokens": 96})
        + "\n"
    )
    r0 = bench.loop_round_usage(train, 0, {"plan_tokens": 30})
    assert r0 == {
        "train_env_steps": 2 + 3,
        "tokens": (4 + 6 + 10 + 2 + 2) + 96 + 30,
        "tokens_live": 24,
        "tokens_grpo": 96,
        "tokens_other": 30,
    }
    r1 = bench.loop_round_usage(train, 1, {})  # no round_-1 after round 0, no GRPO summary written
    assert (r1["train_env_steps"], r1["tokens"], r1["tokens_grpo"]) == (1, 9, 0)


@fast
def test_episodic_rounds_count_their_iterations_and_first_round_extras(bench, tmp_path):
    run = tmp_path / "train"
    for i, tok in enumerate((3, 4, 5)):
        _run(run / "rollouts" / f"iter_{i:04d}", [("a", 0, [[_planner(tok)]])])
    _run(run / "level1", [("a", 0, [[_planner(100)], [_planner(1)]])])  # BEPA's LEVEL-1 re-rolls
    first = bench.run_files(run, 0, 2, first=True)
    later = bench.run_files(run, 2, 3, first=False)
    assert (bench.episode_steps(first), bench.planner_tokens(first)) == (4, 3 + 4 + 101)
    assert (bench.episode_steps(later), bench.planner_tokens(later)) == (1, 5)


def _args(**kw):
    base = dict(
        tasks=["a", "b"],
        steps=2,
        group_size=4,
        budget=16,
        token_budget=1536,
        max_new_tokens=24,
        states_per_step=2,
        loop_steps=4,
    )
    return argparse.Namespace(**{**base, **kw})


@fast
def test_the_budgets_cap_each_methods_round(bench):
    a = _args()
    # episodic: an iteration is at most 4 x 2 x 2 = 16 env steps and 16 x 24 = 384 tokens
    assert bench.episodic_iterations(a) == 1
    assert bench.episodic_iterations(_args(budget=64)) == 4
    assert bench.episodic_iterations(_args(budget=64, token_budget=800)) == 2  # the tokens bind
    assert bench.episodic_iterations(_args(token_budget=10)) == 1  # never less than one
    # loop: 4 live episodes per task (2 tasks, 2 steps, 24 tokens) = 384 tokens of live answers at most; a GRPO
    # step is 2 states x 4 plans x 24 = 192 tokens at most
    assert bench.loop_grpo_steps(a, "pro-cua", 4) == 4  # (1536 - 384) // 192 = 6, --loop-steps 4
    assert bench.loop_grpo_steps(_args(token_budget=1000), "pro-cua", 4) == 3  # (1000 - 384) // 192
    assert bench.loop_grpo_steps(_args(token_budget=1000), "coda", 4) == 1  # two live runs: (1000 - 768) // 192
    assert bench.loop_grpo_steps(_args(token_budget=100), "co-epg", 4) == 1
    for tb in (900, 1200, 1536, 3000):
        for name in ("coda", "co-epg", "pro-cua"):
            b = _args(token_budget=tb)
            live = 4 * 2 * 2 * 24 * (2 if name == "coda" else 1)
            assert live + bench.loop_grpo_steps(b, name, 4) * 192 <= tb or bench.loop_grpo_steps(b, name, 4) == 1


@fast
def test_the_table_shows_every_figure_per_round_and_the_budgets_used(bench):
    results = {
        "coda": [
            {"success": 0.0, "own_reward": 0.5, "action_reward": 1.0, "train_env_steps": 10, "tokens": 700},
            {"success": 0.25, "own_reward": 0.75, "action_reward": 1.25, "train_env_steps": 8, "tokens": 600},
        ],
        "grpo": [
            {"success": 0.5, "own_reward": None, "action_reward": 0.5, "train_env_steps": 16, "tokens": 300},
            {"success": 0.0, "own_reward": None, "action_reward": 0.25, "train_env_steps": 14, "tokens": 280},
        ],
    }
    start = {
        "coda": {"success": 0.0, "own_reward": 0.1, "action_reward": 0.9},
        "grpo": {"success": 0.0, "own_reward": None, "action_reward": 0.9},
    }
    table = bench.make_table(results, start, {"coda": "loop", "grpo": "episodic"}, 2, 1536)
    lines = table.splitlines()
    coda = next(x for x in lines if x.startswith("coda"))
    grpo = next(x for x in lines if x.startswith("grpo"))
    assert coda.split() == "coda action 0.00 0.00 0.25 | 0.10 0.50 0.75 | 0.90 1.00 1.25 | 18 1300".split()
    assert grpo.split() == "grpo - 0.00 0.50 0.00 | - - - | 0.90 0.50 0.25 | 30 580".split()
    assert "token budget 1536 per round, 3072 in all" in lines[-1]


@fast
def test_a_grpo_runs_generated_tokens_come_from_its_generating_steps():
    from coda_agent.train.steplevel import throughput as _throughput

    # 2 states x 4 plans per step; step 2 reuses step 1's batch (updates per batch 2): no completion lengths
    logs = [
        {"step_time": 1.0, "completions/mean_length": 10.0},
        {"step_time": 1.0},
        {"step_time": 2.0, "completions/mean_length": 5.5},
        {"loss": 0.1},  # not a step record
        {"eval_reward": 0.3, "eval_completions/mean_length": 99.0},  # held-out evaluation: not training
    ]
    trainer = SimpleNamespace(
        state=SimpleNamespace(log_history=logs),
        args=SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2),
        accelerator=SimpleNamespace(num_processes=1),
        num_generations=4,
    )
    assert _throughput(trainer)["generated_tokens"] == 8 * 10 + 8 * 5.5


@fast
def test_the_planners_call_records_its_token_count():
    from coda_agent.models import Generation
    from coda_agent.planner import Planner
    from coda_agent.policy import CodaAgent

    class FakeVLM:  # a fake model: fixed answers and token ids
        name = "fake"

        def generate(self, convs, params):
            return [Generation("Thought: t\nAction: ANS 3", token_ids=[1, 2, 3, 4]) for _ in convs]

    class NoExecutor:  # a terminal plan never reaches the executor
        def execute(self, items):
            raise AssertionError("called")

    agent = CodaAgent(Planner(FakeVLM(), "kalgebra"), NoExecutor())
    agent.reset(0, SimpleNamespace(instruction="do it"))
    (step,) = agent.act([(0, {"screenshot": np.zeros((800, 1280, 3), np.uint8)})])
    assert step.action == "ANS 3" and step.calls[0]["model"] == "planner" and step.calls[0]["tokens"] == 4


@fast
def test_coepg_counts_the_tokens_of_the_regenerated_plans(monkeypatch):
    import coda_agent.models as models
    import coda_agent.states as states
    from coda_agent.models import Generation
    from coda_agent.train.coepg import CoEPGConfig, verified_plans

    lengths = iter([3, 5, 7, 2, 4, 6])

    class FakeVLM:  # a fake planner: token ids of known lengths
        def generate(self, convs, params):
            return [Generation("Action: Click 'OK'", token_ids=[0] * next(lengths)) for _ in convs]

    class FakeReward:  # a fake C-DREM: every plan passes and scores 1
        def score(self, rows, texts):
            return [1.0] * len(texts), {"cdrem/gate_pass_rate": 1.0}

    monkeypatch.setattr(models, "load_model", lambda spec, **kw: FakeVLM())
    monkeypatch.setattr(states, "planner_conversation", lambda r, history_images=2: [])
    rows = [{"point": [1, 2]}, {"point": []}, {"point": [3, 4]}]
    pairs, counts = verified_plans(CoEPGConfig(sft_plans=1), ["p1", "p2"], rows, FakeReward())
    assert counts["plans_sampled"] == 6 and counts["plan_tokens"] == 3 + 5 + 7 + 2 + 4 + 6
    assert len(pairs) == 6 and counts["plans_verified"] == 6  # every plan of both planners scored 1
