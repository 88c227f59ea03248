"""`coda train pro-cua`: PRO-CUA's process rewards on the step-level GRPO core (TRL's GRPOTrainer).

Fast tier (marker `fast`: no X server, seconds): per-state advantages, the PRM's score parsing and its FAKE-model
path (a scripted model, named as such), the state distance, the reward's logged scalars, the command's flags and
errors. The rest runs the real KAlgebra env: the replay scorer gives the same score on repeated replays of a
prefix, `coda prm calibrate` on real oracle states with a real tiny Qwen2.5-VL PRM, one collect -> score ->
optimise round with resume, and the learning test: a tiny real planner warmed up to write one of four plans,
one PRO-CUA round (live collection on 4 tasks of the 2D-graph family, replay-scored GRPO) raises its mean
process reward on the states of 3 held-out tasks."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from coda_agent.models import Generation  # noqa: E402
from coda_agent.train import METHODS  # noqa: E402
from coda_agent.train.procua import (  # noqa: E402
    Candidate,
    ProcessReward,
    ProcuaConfig,
    ReplayScorer,
    StepScore,
    VLMPRM,
    agreement_rate,
    measure,
    oracle_runs,
    parse_score,
    state_advantages,
    state_distance,
)

fast = pytest.mark.fast
ENV = "coda/KAlgebra-v0"

# A SYNTHETIC accessibility table (KAlgebra's tab bar and its 2D function input), for the distance tests.
TABLE = (
    "role\tname\ttext\tx,y,w,h\tstates\n"
    "page tab list\t2D Graph\t\t0,39,335,27\tenabled,focused,showing\n"
    "page tab\t2D Graph\t\t85,39,82,27\tenabled,focused,showing\n"
    "page tab\t3D Graph\t\t167,39,82,27\tenabled,showing\n"
    "text\t\t\t998,62,278,30\teditable,enabled,showing\n"
)


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


# ------------------------------------------------------------------------------------------ the PRM
@fast
def test_parse_score_reads_scores_and_refuses_the_malformed():
    cases = {
        "The tab is right.\nSCORE: 0.8": 0.8,
        "**Score:** .5": 0.5,
        "score = 1": 1.0,
        "Score: 7/10": 0.7,
        "SCORE: 80%": 0.8,
        "SCORE: 0.2\nOn reflection...\nSCORE: 0.9": 0.9,  # the last one wins
        "SCORE: 0": 0.0,
        "SCORE: 1.5": None,  # outside [0, 1]
        "SCORE: 3/0": None,
        "SCORE: <a number between 0 and 1>": None,  # the echoed template
        "I think it is good.": None,
        "": None,
        "__import__('os').system('true')": None,  # text, matched by a regular expression, never run
    }
    for text, want in cases.items():
        assert parse_score(text) == (pytest.approx(want) if want is not None else None), text


class FakePRMModel:
    """FAKE model for fast tests: answers each prompt with the next scripted text (the models' `generate`)."""

    name = "fake-prm"

    def __init__(self, texts):
        self.texts, self.prompts = list(texts), []

    def generate(self, conversations, params):
        self.prompts += conversations
        return [Generation(self.texts.pop(0)) for _ in conversations]


def _state(**kw):
    import numpy as np

    from coda_agent import states

    rec = {
        "id": "synthetic:1",
        "app": "kalgebra",
        "task": "plot_parabola",
        "step": 1,
        "source": "synthetic",
        "instruction": "In KAlgebra's 2D Graph, plot f(x) = x^2.",
        "history": json.dumps([{"thought": "", "action": "Click the 'Calculator' tab"}]),
        "images": [states._png(np.zeros((800, 1280, 3), np.uint8))],
        "target": "pyautogui.click(125, 53)",
        "box": [85, 39, 166, 65],
        "radius": 20.0,
        "screen": [1280, 800],
        "a11y": TABLE,
    }
    return {**rec, **kw}


@fast
def test_vlm_prm_scores_parses_and_falls_back():
    model = FakePRMModel(["SCORE: 0.9", "no verdict", "SCORE: 0.2", "SCORE: 0.4"])
    prm = VLMPRM(model, samples=2, fallback=0.25)
    st = _state()
    out = prm.score(
        [
            Candidate(st, "pyautogui.click(125, 53)", "Action: Click '2D Graph'"),
            Candidate(st, None, "gibberish"),  # no action: 0, not asked
            Candidate(st, "pyautogui.press('enter')", "Action: Press enter"),
        ]
    )
    assert [o.score for o in out] == pytest.approx([0.9, 0.0, 0.3])  # one readable sample; the mean of two
    assert out[1].details == {"asked": False}
    assert len(model.prompts) == 4  # 2 candidates x 2 samples, one batched call
    text = model.prompts[0][1]["content"][1]["text"]
    assert "plot f(x) = x^2" in text and "Click the 'Calculator' tab" in text and "Click '2D Graph'" in text
    assert model.prompts[0][1]["content"][0]["image"].shape == (800, 1280, 3)  # the current screen
    unreadable = VLMPRM(FakePRMModel(["nothing", "at all"]), samples=2, fallback=0.25).score([Candidate(st, "DONE")])
    assert unreadable[0].score == 0.25 and unreadable[0].details["fallback"]


# ------------------------------------------------------------------------------------------ the distance
@fast
def test_state_distance_over_checked_state_and_a11y_rows():
    state = {"tab": "2D Graph", "functions_2d": []}
    a = measure(state, TABLE)
    assert state_distance(a, a) == 0.0
    moved = TABLE.replace("998,62,278,30", "990,60,270,30")  # geometry is left out
    unfocused = TABLE.replace("enabled,focused,showing\npage tab\t2D", "enabled,showing\npage tab\t2D")
    assert state_distance(a, measure(state, moved)) == 0.0
    assert state_distance(a, measure(state, unfocused)) == 0.0  # a container's focus flag is left out
    field = measure(state, TABLE.replace("editable,enabled,showing", "editable,enabled,focused,showing"))
    assert state_distance(a, field) == pytest.approx(0.5 * (1 - 3 / 5))  # an input field's focus counts
    plotted = measure({"tab": "2D Graph", "functions_2d": [{"name": "f0", "expression": "x^2"}]}, TABLE)
    # paths: /functions_2d#len (differs), /functions_2d/0/expression and /name (one side only), /tab (same)
    assert state_distance(a, plotted) == pytest.approx(0.5 * 3 / 4)
    assert 0 < state_distance(a, measure({"tab": "3D Graph"}, "")) <= 1


@fast
def test_oracle_runs_are_the_oracle_states_steps():
    """The replay prefix of an oracle state (its first step - 1 oracle actions) is what states.oracle_states
    performs: its labels are those actions without their sleeps."""
    from coda_env.tasks import load_tasks

    from coda_agent.states import split_action

    task = load_tasks("kalgebra")["plot_parabola"]
    runs = oracle_runs(task, (1280, 800))
    assert runs == [
        "pyautogui.click(125, 53)",
        "pyautogui.click(1137, 77)",
        "pyautogui.write('x^2')\npyautogui.press('enter')",
        "DONE",
    ]
    assert [lbl for a in task.solution for lbl in split_action(a)] == runs


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
    for shown in ("--scorer SCORER the process reward: replay", "(default: replay)", "(default: runs/pro-cua)"):
        assert shown in text, shown


@fast
def test_errors_are_one_line_and_exit_code_2(tmp_path, capsys):
    from coda_agent.cli import main

    cases = {
        "prm scorer without a prm": (["train", "pro-cua", "--scorer", "prm", "--data", "x"], "--prm"),
        "replay without an env": (["train", "pro-cua", "--data", "x"], "--env"),
        "a judge": (["train", "pro-cua", "--judge", "http://h:1"], "no --judge"),
        "prm calibrate: missing prm": (
            ["prm", "calibrate", "--data", "x", "--prm", str(tmp_path / "no")],
            "is not a directory",
        ),
    }
    for name, (argv, needle) in cases.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, (name, err)
    with pytest.raises(SystemExit) as e:
        main(["prm", "judge"])
    assert e.value.code == 2
    assert "coda prm calibrate --data" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ real env
@pytest.fixture(scope="module")
def parabola_states(tmp_path_factory):
    from coda_agent import states

    path = tmp_path_factory.mktemp("procua") / "parabola"
    states.build(states.oracle_states(ENV, ["plot_parabola", "tab_3d_graph"]), path)
    return path


def test_replay_scorer_gives_the_same_score_on_repeated_replays(parabola_states):
    """The same action after the same prefix, replayed in fresh episodes (and by a second scorer with its own
    env), scores the same; the scores say what the step did."""
    from coda_agent.train.steplevel import load_states

    ds, _ = load_states([parabola_states])
    by_id = {r["id"]: r for r in ds}
    s1, s3 = by_id["oracle:plot_parabola:1"], by_id["oracle:plot_parabola:3"]
    cands = [
        Candidate(s1, "pyautogui.click(125, 53)"),  # the oracle's step: reaches the oracle's next state
        Candidate(s1, "pyautogui.click(207, 53)"),  # the wrong tab
        Candidate(s1, "DONE"),  # premature
        Candidate(s3, "pyautogui.write('x^2')\npyautogui.press('enter')"),  # completes the task (prefix of 2)
        Candidate(s3, "pyautogui.write('x^3')\npyautogui.press('enter')"),  # another curve
    ]
    first, second = ReplayScorer(ENV), ReplayScorer(ENV)
    try:
        a = [s.score for s in first.score(cands)]
        first._cache.clear()
        first._before.clear()
        b = [s.score for s in first.score(cands)]  # replayed again in the same env
        c = [s.score for s in second.score(cands)]  # and in another env
        print(f"replay scores {[round(x, 3) for x in a]}; {first.replays} replays in {first.seconds:.1f} s")
    finally:
        first.close()
        second.close()
    assert a == b == c
    assert a[0] == 0.5 and a[2] == 0.0 and a[3] == 1.0
    assert a[1] < 0.25 and a[4] < 0.5
    assert first._env is None and second._env is None  # closed: their desktops are gone


def test_prm_calibrate_on_real_states(parabola_states, tmp_path, capsys):
    """`coda prm calibrate` with a real tiny Qwen2.5-VL PRM (random weights: its answers hold no SCORE, so
    every candidate falls back to 0) against the replay on real KAlgebra oracle states."""
    from coda_agent.cli import main
    from coda_agent.tiny import build_tiny_qwen2_5_vl

    prm = build_tiny_qwen2_5_vl(tmp_path / "prm")
    out = tmp_path / "report.json"
    argv = ["prm", "calibrate", "--data", str(parabola_states), "--prm", str(prm), "--candidates", "2"]
    assert main([*argv, "--max-new-tokens", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    print(text)
    report = json.loads(out.read_text())
    assert report["candidates"] == 6 * 2  # 6 states, 2 candidates each (its label and another state's)
    k = report["by_app"]["kalgebra"]
    assert k["n"] == 12 and k["tp"] == k["fp"] == 0  # the PRM said no good step anywhere (fallback 0)
    assert k["fn"] >= 6 - 1  # the oracle's own steps replay as good ones (the field click is a no-op here)
    assert k["agreement"] == pytest.approx((k["tn"]) / 12)
    assert "app:kalgebra" in text and "overall" in text


@pytest.mark.timeout(900)
def test_round_collects_scores_optimises_and_resumes(tmp_path):
    """One round on the real env: the tiny planner runs tab_3d_graph live, every visited state is stored
    with its replay prefix and a11y table, GRPO with the replay reward runs; a rerun does not redo it."""
    from datasets import load_from_disk

    from coda_agent.tiny import build_tiny_qwen2_5_vl
    from coda_agent.train.procua import run_rounds

    cfg = ProcuaConfig(
        planner=str(build_tiny_qwen2_5_vl(tmp_path / "tiny")),
        executor="a11y",
        rounds=1,
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
