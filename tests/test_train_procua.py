"""`coda train pro-cua`: PRO-CUA's process rewards on the step-level GRPO core (TRL's GRPOTrainer).

The scorers themselves (the PRM, the replay) are tested in test_prm.py. Fast tier (marker `fast`: no X server,
seconds): per-state advantages, the reward's logged scalars, the command's flags and errors. The rest runs the
real KAlgebra env: the default path (a trained tiny PRM) through `coda train pro-cua` on task files that have no
oracle solution at all; one collect -> score -> optimise round with the replay scorer and resume; and the
learning test: a tiny real planner warmed up to write one of four plans, one PRO-CUA round (live collection on 4
tasks of the 2D-graph family, replay-scored GRPO) raises its mean process reward on the states of 3 held-out
tasks."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from coda_agent.train import METHODS  # noqa: E402
from coda_agent.prm import StepScore, agreement_rate  # noqa: E402
from coda_agent.train.procua import ProcessReward, ProcuaConfig, state_advantages  # noqa: E402

fast = pytest.mark.fast
ENV = "coda/KAlgebra-v0"

from tests.test_prm import _state  # noqa: E402  (a SYNTHETIC state: a black screen, KAlgebra's tab bar)


# ------------------------------------------------------------------------------------------ advantages
@fast
def test_state_advantages_are_relative_to_each_states_group():
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # the unbiased std of [1, 0, 1, 0] is sqrt(1/3): a = 0.866
    assert state_advantages([1.0, 0.0, 1.0, 0.0], 4) == pytest.approx([a, -a, a, -a], rel=1e-6)
    # two states, one whose candidates all score the same: it teaches nothing (advantages 0)
    adv = state_advantages([0.5, 0.5, 0.0, 1.0], 2)
    assert adv[:2] == [0.0, 0.0]
    assert adv[2:] == pytest.approx([-0.5 / (math.sqrt(0.5) + 1e-4), 0.5 / (math.sqrt(0.5) + 1e-4)])
    assert state_advantages([0.0, 1.0, 0.0, 1.0], 2, scale="none") == [-0.5, 0.5, -0.5, 0.5]
    b = state_advantages([0.0, 1.0, 1.0, 1.0], 2, scale="batch")  # std over the batch: sqrt(0.25)
    assert b == pytest.approx([-0.5 / (0.5 + 1e-4), 0.5 / (0.5 + 1e-4), 0.0, 0.0])
    with pytest.raises(ValueError, match="whole number of groups"):
        state_advantages([1.0, 0.0, 1.0], 2)


# ------------------------------------------------------------------------------------------ the reward
class FixedScorer:
    """FAKE scorer for fast tests: a score per plan text (0 without an action); it records the candidates."""

    def __init__(self, name, table):
        self.name, self.table, self.seen = name, table, []

    def score(self, candidates):
        self.seen += candidates
        return [
            StepScore(self.table.get(c.plan, 0.0) if c.action else 0.0, {"asked": True, "fallback": False})
            for c in candidates
        ]

    def close(self):
        self.closed = True


@fast
def test_process_reward_scores_through_the_executor_and_logs_both_scorers():
    from coda_agent.a11y_executor import A11yExecutor

    st = _state()
    texts = ["Action: Click '2D Graph'", "Action: Click '3D Graph'", "no plan here", "Action: DONE"]
    prm = FixedScorer("prm", {texts[0]: 0.9, texts[1]: 0.6, texts[2]: 0.7, texts[3]: 0.1})
    replay = FixedScorer("replay", {texts[0]: 0.5, texts[1]: 0.06})
    logged = {}
    reward = ProcessReward(A11yExecutor((1280, 800)), prm, replay, positive=0.5)
    columns = {k: [st[k]] * len(texts) for k in st}
    got = reward(
        prompts=[None] * 4,
        completions=[[{"role": "assistant", "content": t}] for t in texts],
        log_metric=lambda k, v: logged.setdefault(k, v),
        **columns,
    )
    assert got == [0.9, 0.6, 0.0, 0.1]  # no plan: no action, 0
    assert [c.action for c in prm.seen] == ["pyautogui.click(125, 52)", "pyautogui.click(207, 52)", None, "DONE"]
    assert replay.seen == prm.seen  # both scorers see the same candidates
    assert logged["prm/score_mean"] == pytest.approx(0.4)
    assert logged["replay/score_mean"] == pytest.approx(0.14)
    assert logged["scorer/agreement"] == 0.75  # they differ on the 3D tab (0.6 vs 0.06)
    assert [logged[f"prm/hist_{b}"] for b in range(4)] == [0.5, 0.0, 0.25, 0.25]
    assert logged["prm/parse_failure_rate"] == 0.0 and logged["planner/parse_error_rate"] == 0.25
    assert agreement_rate([], []) != agreement_rate([], [])  # nan when there is nothing to agree on


@fast
def test_help_shows_every_setting_with_its_default(capsys):
    from coda_agent.cli import main

    assert METHODS["pro-cua"].config is ProcuaConfig
    with pytest.raises(SystemExit) as e:
        main(["train", "pro-cua", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(ProcuaConfig):
        assert f"--{f.name.replace('_', '-')}" in text, f.name
        assert f.metadata.get("help"), f.name
    for shown in (
        "--scorer SCORER the process reward: prm",
        "privileged: reads the tasks' oracle solutions; never the default) (default: prm)",
        "--oracle-states, --no-oracle-states",
        "(privileged: reads the oracle) (default: False)",
        "(default: runs/pro-cua)",
    ):
        assert shown in text, shown


@fast
def test_errors_are_one_line_and_exit_code_2(tmp_path, capsys):
    from coda_agent.cli import main

    (tmp_path / "bare").mkdir()
    cases = {
        "the default scorer without a prm": (["train", "pro-cua", "--data", "x"], "--prm"),
        "a missing prm": (["train", "pro-cua", "--data", "x", "--prm", str(tmp_path / "no")], "is not a directory"),
        "a prm folder of nothing": (["train", "pro-cua", "--data", "x", "--prm", str(tmp_path / "bare")], "prm.json"),
        "replay without an env": (["train", "pro-cua", "--scorer", "replay", "--data", "x"], "--env"),
        "an unknown scorer": (["train", "pro-cua", "--scorer", "oracle", "--data", "x"], "prm | replay"),
    }
    for name, (argv, needle) in cases.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, (name, err)


# ------------------------------------------------------------------------------------------ real env


@pytest.mark.timeout(900)
def test_round_collects_scores_optimises_and_resumes(tmp_path):
    """One round on the real env with the (privileged) replay scorer and the oracle's states: the tiny planner
    runs tab_3d_graph live, every visited state is stored with its replay prefix and a11y table, GRPO with the
    replay reward runs; a rerun does not redo it."""
    from datasets import load_from_disk

    from coda_agent.tiny import build_tiny_qwen2_5_vl
    from coda_agent.train.procua import run_rounds

    cfg = ProcuaConfig(
        planner=str(build_tiny_qwen2_5_vl(tmp_path / "tiny")),
        executor="a11y",
        rounds=1,
        scorer="replay",
        oracle_states=True,
        env=ENV,
        tasks=["tab_3d_graph"],
        episodes=1,
        num_envs=1,
        episode_steps=2,
        group_size=2,
        states_per_step=2,
        micro_batch=4,
        max_steps=1,
        max_new_tokens=8,
        lora_r=4,
        lora_alpha=8,
        out=str(tmp_path / "loop"),
        save_steps=1,
    )
    history = run_rounds(cfg, progress=False)
    out = tmp_path / "loop"
    assert [h["round"] for h in history] == [0] and 0.0 <= history[0]["collect_success_rate"] <= 1.0
    ds = load_from_disk(str(out / "round_00" / "states"))
    assert len(ds) == 2 and [json.loads(p) for p in ds["prefix"]][0] == []  # the episode's 2 visited states
    assert json.loads(ds["prefix"][1]) == [ds["target"][0]]  # the second state: after the first action
    assert all(t.startswith("role\tname") for t in ds["a11y"])  # filled in by the replay
    assert history[0]["states"] == 2 + 2  # the collected ones and the oracle's (click the tab, DONE)
    lines = [json.loads(x) for x in (out / "round_00" / "train" / "metrics.jsonl").read_text().splitlines()]
    step = next(x for x in lines if "rewards/process_reward/mean" in x)
    assert {"replay/score_mean", "replay/hist_0", "planner/parse_error_rate"} <= set(step)
    assert (out / "round_00" / "train" / "planner" / "config.json").exists()
    assert run_rounds(cfg, progress=False) == history  # finished rounds are not redone


def _solutionless_tasks(folder, ids):
    """Copies of shipped KAlgebra task files with their `solution` removed (and ids of their own, which a user
    folder needs): tasks that hold no golden answer for anything to read."""
    from pathlib import Path

    import coda_env

    src = Path(coda_env.__file__).parent / "apps" / "kalgebra" / "tasks"
    folder.mkdir()
    for tid in ids:
        data = json.loads((src / f"{tid}.json").read_text())
        data.pop("solution")
        data["id"] = f"nosol_{tid}"
        (folder / f"nosol_{tid}.json").write_text(json.dumps(data))
    return [f"nosol_{t}" for t in ids]


@pytest.mark.timeout(900)
def test_default_path_trains_on_tasks_without_solutions(tmp_path, monkeypatch, capsys, one_torch_thread):
    """`coda train pro-cua` with its default scorer (a trained tiny ClassifierPRM) on task files that have no
    `solution` at all, through the CLI: it collects live, rebuilds the states from the agent's own actions,
    scores with the PRM and runs GRPO, and writes its metrics; anything that reached for an oracle (its
    actions, its states, the replay scorer's oracle path) would raise here."""
    import time

    from datasets import load_from_disk

    import coda_agent.prm
    import coda_agent.states
    from coda_agent import states
    from coda_agent.cli import main
    from coda_agent.prm import train_prm
    from coda_agent.models import TransformersVLM
    from coda_agent.tiny import build_tiny_qwen2_5_vl
    from coda_agent.train.sft import Example, SFTConfig, finetune
    from coda_agent.types import Sample
    from coda_env.tasks import load_tasks

    tiny = str(build_tiny_qwen2_5_vl(tmp_path / "tiny"))
    # the PRM's own training data may be privileged: replay labels at a shipped task's first state
    first = [r for r in states.oracle_states(ENV, ["tab_3d_graph"]) if r["step"] == 1]
    states.build(first, tmp_path / "prm_data")
    train_prm([tmp_path / "prm_data"], ENV, tmp_path / "prm", tiny, epochs=1, lr=1e-3, candidates=2)
    # a planner warmed up to write plans the a11y executor grounds (a random one writes none): the PRM is asked
    vlm = TransformersVLM(tiny)
    conv = states.planner_conversation(first[0], history_images=2)
    warm = [Example("tab_3d_graph", "kalgebra", 1, Sample("planner", conv, []), f"Action: {p}") for p in PLANS[:2]]
    finetune(SFTConfig(out=str(tmp_path / "warm"), epochs=60, lr=1e-2, micro_batch=2, lora_r=0), vlm, warm, False)
    planner = str(tmp_path / "warm" / "planner")

    ids = _solutionless_tasks(tmp_path / "tasks", ["tab_3d_graph", "plot_parabola"])
    monkeypatch.setenv("CODA_TASKS_PATH", str(tmp_path / "tasks"))
    tasks = load_tasks("kalgebra")
    assert all(tasks[t].solution == [] for t in ids)

    def no_oracle(*a, **k):
        raise AssertionError("the default PRO-CUA path reached for a task's oracle")

    monkeypatch.setattr(coda_agent.prm, "oracle_runs", no_oracle)
    monkeypatch.setattr(coda_agent.prm.ReplayScorer, "oracle_path", no_oracle)
    monkeypatch.setattr(coda_agent.states, "oracle_states", no_oracle)
    out = tmp_path / "run"
    argv = ["train", "pro-cua", "--planner", planner, "--executor", "a11y", "--prm", str(tmp_path / "prm")]
    argv += ["--env", ENV, "--tasks", *ids, "--rounds", "1", "--episodes", "1", "--episode-steps", "1"]
    argv += ["--num-envs", "1", "--group-size", "2", "--states-per-step", "2", "--micro-batch", "4"]
    argv += ["--max-steps", "1", "--max-new-tokens", "16", "--lora-r", "4", "--lora-alpha", "8", "--save-steps", "1"]
    t0 = time.monotonic()
    assert main([*argv, "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    seconds = time.monotonic() - t0
    print(capsys.readouterr().out, f"\nsolution-less coda train pro-cua: {seconds:.0f} s")
    config = json.loads((out / "config.json").read_text())
    assert config["scorer"] == "prm" and config["oracle_states"] is False and not config["compare_replay"]
    rec = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["round"] == 0 and rec["states"] == 2 and "replays" not in rec  # the 2 live states, no replay scorer
    lines = [json.loads(x) for x in (out / "round_00" / "train" / "metrics.jsonl").read_text().splitlines()]
    step = next(x for x in lines if "rewards/process_reward/mean" in x)
    assert {"prm/score_mean", "prm/parse_failure_rate"} <= set(step) and not any(k.startswith("replay/") for k in step)
    assert step["executor/no_action_rate"] < 1.0  # plans grounded in the live states' a11y tables, and scored
    assert 0.0 < step["prm/score_mean"] < 1.0 and step["prm/parse_failure_rate"] == 0.0
    live = load_from_disk(str(out / "round_00" / "states"))
    assert all(t.startswith("role\tname") for t in live["a11y"]) and set(live["prefix"]) == {"[]"}
    assert (out / "round_00" / "train" / "planner" / "config.json").exists()


# ------------------------------------------------------------------------------------------ learning
TRAIN_TASKS = ["plot_parabola", "plot_abs_shift", "plot_circle_implicit", "plot_derivative"]
HELD_OUT = ["plot_ln_squared", "plot_sine_scaled", "plot_with_tangent"]
# The warm-up teaches the answer format with four plans; the a11y executor grounds each on KAlgebra's tab bar.
# At the first step of a 2D-graph task the replay scores the '2D Graph' tab 0.5 (it reaches the oracle's next
# state), the other tabs little or nothing, a key press 0.
PLANS = ["Click '2D Graph'", "Click '3D Graph'", "Press enter", "Click 'Dictionary'"]


@pytest.mark.timeout(1800)  # about 2-3 min on an idle 2-core machine; far longer on a shared, loaded one
def test_one_round_raises_the_process_reward_on_held_out_states(tmp_path):
    from coda_agent import states
    from coda_agent.models import TransformersVLM
    from coda_agent.tiny import build_tiny_qwen2_5_vl
    from coda_agent.train.procua import run_rounds
    from coda_agent.train.sft import Example, SFTConfig, finetune
    from coda_agent.types import Sample

    warm_states = [r for r in states.oracle_states(ENV, TRAIN_TASKS) if r["step"] == 1]
    states.build([r for r in states.oracle_states(ENV, HELD_OUT) if r["step"] == 1], tmp_path / "held")
    vlm = TransformersVLM(build_tiny_qwen2_5_vl(tmp_path / "tiny"))
    warm = [
        Example(
            r["task"],
            "kalgebra",
            1,
            Sample("planner", states.planner_conversation(r, history_images=2), []),
            f"Action: {p}",
        )
        for r in warm_states
        for p in PLANS
    ]
    finetune(
        SFTConfig(out=str(tmp_path / "warm"), epochs=16, lr=1e-2, micro_batch=4, lora_r=0), vlm, warm, progress=False
    )
    cfg = ProcuaConfig(
        planner=str(tmp_path / "warm" / "planner"),
        executor="a11y",
        scorer="replay",
        env=ENV,
        tasks=TRAIN_TASKS,
        rounds=1,
        episodes=1,
        episode_steps=1,  # the collected states: where the planner starts each task, visited live
        num_envs=1,
        oracle_states=False,
        eval_data=[str(tmp_path / "held")],
        out=str(tmp_path / "run"),
        group_size=8,
        states_per_step=4,
        micro_batch=16,
        max_steps=16,
        updates_per_batch=3,
        lr=1e-3,
        kl_coef=0.01,
        max_new_tokens=12,
        lora_r=0,
        eval_generations=16,
        seed=0,
        save_steps=100,
    )
    import time

    t0 = time.monotonic()
    rec = run_rounds(cfg, progress=False)[0]
    before, after = rec["eval_reward_before"], rec["eval_reward_after"]
    print(
        f"held-out mean process reward before {before:.3f}, after {after:.3f} (one round: {rec['states']} "
        f"collected states, {rec['steps']} GRPO steps, {rec['replays']} replays in "
        f"{rec['replay_seconds']:.1f} s, {time.monotonic() - t0:.0f} s in all)"
    )
    assert after >= before + 0.1, rec
