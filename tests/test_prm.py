"""`coda_agent.prm`: the process reward model (PRO-CUA's reward): scoring, training on replay labels, calibration.

Fast tier (marker `fast`: no X server, seconds): the VLM PRM's score parsing and its FAKE-model path (a scripted
model, named as such), the state distance, the oracle's runs, the candidate steps of a state, and the commands'
one-line errors. Without a desktop: the trained PRM's score is p(YES) / (p(YES) + p(NO)) of a real tiny
Qwen2.5-VL's next-token logits (checked against a manual forward pass). The rest runs the real KAlgebra env:
the replay scorer gives the same score on repeated replays; `coda prm calibrate` with a prompted tiny VLM PRM;
and the learning test: `coda prm train` on replay labels of the first states of 7 train-split tasks makes a
tiny PRM agree with the replay labels on the first states of 7 HELD-OUT tasks more often than the majority
answer does (`coda prm calibrate`)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from coda_agent.models import Generation  # noqa: E402
from coda_agent.prm import (  # noqa: E402
    PROMPT_VERSION,
    PRM_YES_NO_QUESTION,
    Candidate,
    ClassifierPRM,
    ReplayScorer,
    VLMPRM,
    element_candidates,
    load_prm,
    measure,
    oracle_runs,
    parse_score,
    prm_conversation,
    state_distance,
)

fast = pytest.mark.fast
ENV = "coda/KAlgebra-v0"
# The KAlgebra task splits the step-level learning tests share (tests/learning.py): their first correct steps
# differ (the '2D Graph' tab, the '3D Graph' tab, the 'Dictionary' tab, the Calculator's console input).
from tests.learning import HELD_OUT, POLICY_TRAIN, PRM_TRAIN  # noqa: E402, F401

# A SYNTHETIC accessibility table (KAlgebra's tab bar and its 2D function input).
TABLE = (
    "role\tname\ttext\tx,y,w,h\tstates\n"
    "page tab list\t2D Graph\t\t0,39,335,27\tenabled,focused,showing\n"
    "page tab\t2D Graph\t\t85,39,82,27\tenabled,focused,showing\n"
    "page tab\t3D Graph\t\t167,39,82,27\tenabled,showing\n"
    "text\t\t\t998,62,278,30\teditable,enabled,showing\n"
)


def _state(**kw):
    """A SYNTHETIC state record (a black screen, the table above) with the state datasets' columns."""
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


# ------------------------------------------------------------------------------------------ the VLM PRM
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


# ------------------------------------------------------------------------------------------ the replay
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


# ------------------------------------------------------------------------------------------ candidates
@fast
def test_element_candidates_word_the_label_and_the_elements_alike():
    st = _state(a11y=TABLE + "push button\tOK\t\t600,700,60,24\tenabled,showing\n")
    cands = element_candidates(st, 0)
    assert [c.action for c in cands[:2]] == [
        "pyautogui.click(125, 53)",  # the labelled action first
        "pyautogui.click(207, 52)",  # its sibling (another tab) next: the hard negative
    ]
    assert {c.action for c in cands[2:]} == {"pyautogui.click(1136, 76)", "pyautogui.click(629, 711)"}
    assert [c.plan for c in cands[:2]] == ["Action: Click the '2D Graph' tab", "Action: Click the '3D Graph' tab"]
    assert {c.plan for c in cands[2:]} == {"Action: Click the input field", "Action: Click the 'OK' button"}
    assert len(element_candidates(st, 2)) == 2 and element_candidates(st, 0, seed=0) == cands  # seeded
    typed = element_candidates(_state(target="pyautogui.write('x^2')\npyautogui.press('enter')"), 3)
    assert typed[0].plan == "Action: Type 'x^2' and press enter" and len(typed) == 3
    assert [c.action for c in element_candidates(_state(a11y=""), 4)] == ["pyautogui.click(125, 53)"]


# ------------------------------------------------------------------------------------------ errors
@pytest.fixture
def synthetic_states(tmp_path):
    from coda_agent import states

    states.build([_state()], tmp_path / "synthetic")
    return tmp_path / "synthetic"


@fast
def test_errors_are_one_line_and_exit_code_2(tmp_path, capsys, synthetic_states):
    from datasets import Dataset

    from coda_agent.cli import main
    from coda_agent.states import features

    Dataset.from_dict({k: [] for k in features()}, features=features()).save_to_disk(str(tmp_path / "empty"))
    (tmp_path / "bare").mkdir()
    (tmp_path / "wrong").mkdir()
    (tmp_path / "wrong" / "prm.json").write_text(json.dumps({"kind": "regressor"}))
    data = str(synthetic_states)
    train = ["prm", "train", "--env", ENV, "--out", str(tmp_path / "out"), "--base", str(tmp_path / "bare")]
    cases = {
        "calibrate: a missing prm": (
            ["prm", "calibrate", "--data", data, "--prm", str(tmp_path / "no")],
            "is not a directory",
        ),
        "calibrate: a folder of nothing": (
            ["prm", "calibrate", "--data", data, "--prm", str(tmp_path / "bare")],
            "holds neither prm.json",
        ),
        "calibrate: another kind of prm.json": (
            ["prm", "calibrate", "--data", data, "--prm", str(tmp_path / "wrong")],
            "want 'classifier'",
        ),
        "calibrate: no dataset": (
            ["prm", "calibrate", "--data", str(tmp_path / "none"), "--prm", "x"],
            "does not exist",
        ),
        "train: an empty dataset": ([*train, "--data", str(tmp_path / "empty")], "holds no states"),
        "train: a folder that is no dataset": ([*train, "--data", str(tmp_path / "bare")], "is not a state dataset"),
        "train: no base": (["prm", "train", "--data", data, "--env", ENV, "--out", str(tmp_path / "o")], "--base"),
        "train: a base that is no checkpoint": ([*train, "--data", data], "is not a checkpoint directory"),
    }
    capsys.readouterr()  # the datasets' own progress lines
    for name, (argv, needle) in cases.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, (name, err)
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as e:
        main(["prm", "judge"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "coda prm calibrate --data" in err and "coda prm train --data" in err


# ------------------------------------------------------------------------------------------ the trained PRM
def test_classifier_score_is_p_yes_of_the_answer_logits(tmp_path):
    """A real tiny Qwen2.5-VL as the classifier: each asked candidate's score is softmax([l_YES, l_NO])[0] at
    the answer position, equal to a manual forward pass of its prompt alone; no action: 0, unasked."""
    from coda_agent.tiny import build_tiny_qwen2_5_vl

    tiny = build_tiny_qwen2_5_vl(tmp_path / "tiny")
    prm = ClassifierPRM(tiny, batch=2)
    st, other = _state(), _state(instruction="Switch KAlgebra to its 3D Graph tab.", history="[]")
    cands = [
        Candidate(st, "pyautogui.click(125, 53)", "Action: Click the '2D Graph' tab"),
        Candidate(st, None, "no plan"),
        Candidate(other, "pyautogui.click(207, 52)", "Thought: the tab.\nAction: Click the '3D Graph' tab"),
        Candidate(other, "DONE", "Action: DONE"),
    ]
    got = prm.score(cands)
    assert got[1].score == 0.0 and got[1].details == {"asked": False}
    vlm = prm.vlm
    for c, s in zip(cands, got):
        if c.action is None:
            continue
        conv = prm_conversation(c, PRM_YES_NO_QUESTION)
        with torch.no_grad():
            logits = vlm.model(**vlm.build_inputs([conv])).logits[0, -1]
        p = torch.softmax(torch.stack([logits[prm.yes_id], logits[prm.no_id]]), 0)[0].item()
        assert 0.0 < s.score < 1.0 and s.score == pytest.approx(p, abs=1e-4)
        assert s.details["asked"] and not s.details["fallback"]
    text = prm.conversations(cands[2:3])[0][1]["content"][1]["text"]
    assert "Candidate next step: Click the '3D Graph' tab" in text and text.endswith(PRM_YES_NO_QUESTION)
    yes, no = (vlm.tokenizer.convert_ids_to_tokens(i) for i in (prm.yes_id, prm.no_id))
    assert "YES".startswith(yes) and "NO".startswith(no)
    # a PRM folder is a checkpoint plus prm.json (detected by it); another prompt version is refused
    (tiny / "prm.json").write_text(json.dumps({"kind": "classifier", "prompt_version": PROMPT_VERSION}))
    assert isinstance(load_prm(str(tiny)), ClassifierPRM)
    (tiny / "prm.json").write_text(json.dumps({"kind": "classifier", "prompt_version": PROMPT_VERSION + 1}))
    with pytest.raises(ValueError, match="prompt version"):
        load_prm(str(tiny))
    (tiny / "prm.json").unlink()
    assert isinstance(load_prm(str(tiny)), VLMPRM)  # a bare checkpoint: the prompted PRM


# ------------------------------------------------------------------------------------------ real env
@pytest.fixture(scope="module")
def parabola_states(tmp_path_factory):
    from coda_agent import states

    path = tmp_path_factory.mktemp("prm") / "parabola"
    states.build(states.oracle_states(ENV, ["plot_parabola", "tab_3d_graph"]), path)
    return path


def test_replay_scorer_gives_the_same_score_on_repeated_replays(parabola_states):
    """The same action after the same prefix, replayed in fresh episodes (and by a second scorer with its own
    env), scores the same; the scores say what the step did."""
    from coda_agent.prm import load_rows

    by_id = {r["id"]: r for r in load_rows([parabola_states])}
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


def test_prm_calibrate_a_prompted_vlm_on_real_states(parabola_states, tmp_path, capsys):
    """`coda prm calibrate` with a prompted real tiny Qwen2.5-VL (random weights: its answers hold no SCORE,
    so every candidate falls back to 0) against the replay on real KAlgebra oracle states."""
    from coda_agent.cli import main
    from coda_agent.tiny import build_tiny_qwen2_5_vl

    prm = build_tiny_qwen2_5_vl(tmp_path / "prm")
    out = tmp_path / "report.json"
    argv = ["prm", "calibrate", "--data", str(parabola_states), "--prm", str(prm), "--candidates", "2"]
    assert main([*argv, "--max-new-tokens", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    print(text)
    report = json.loads(out.read_text())
    assert report["prm"]["kind"] == "vlm"
    assert report["candidates"] == 6 * 2  # 6 states, 2 candidates each (its label and another element)
    k = report["by_app"]["kalgebra"]
    assert k["n"] == 12 and k["tp"] == k["fp"] == 0  # the PRM said no good step anywhere (fallback 0)
    assert k["fn"] >= 6 - 1  # the oracle's own steps replay as good ones (the field click is a no-op here)
    assert k["agreement"] == pytest.approx((k["tn"]) / 12) and k["majority"] >= k["agreement"]
    assert "app:kalgebra" in text and "overall" in text and "majority" in text


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 5 min on a shared 2-core machine (replays ~1.4 s each under load)
def test_prm_trained_on_replay_labels_beats_the_majority_on_held_out_tasks(tmp_path, capsys, one_torch_thread):
    """`coda prm train` on the replay labels of the first states of the PRM_TRAIN tasks (the labelled action
    and 5 other clickable elements each), then `coda prm calibrate` on the first states of the HELD_OUT tasks:
    the tiny PRM agrees with the replay labels more often than the majority answer (NO) does. The screens are
    alike at a first step: the PRM must read the instruction and the candidate's words."""
    import time

    from coda_agent import states
    from coda_agent.cli import main
    from coda_agent.tiny import build_tiny_qwen2_5_vl

    for name, tasks in (("train", PRM_TRAIN), ("held", HELD_OUT)):
        states.build([r for r in states.oracle_states(ENV, tasks) if r["step"] == 1], tmp_path / name)
    tiny = build_tiny_qwen2_5_vl(tmp_path / "tiny")
    prm = tmp_path / "prm"
    argv = ["prm", "train", "--data", str(tmp_path / "train"), "--env", ENV, "--out", str(prm), "--base", str(tiny)]
    t0 = time.monotonic()
    assert main([*argv, "--candidates", "6", "--epochs", "40", "--lr", "1e-3", "--batch", "8", "--quiet"]) == 0
    train_s = time.monotonic() - t0
    print(capsys.readouterr().out)
    meta = json.loads((prm / "prm.json").read_text())
    assert meta["kind"] == "classifier" and meta["prompt_version"] == PROMPT_VERSION and meta["positive"] == 0.5
    st = meta["stats"]
    assert st["states"] == 7 and st["examples"] == 7 * 6 and st["yes"] >= 4 and st["no"] > st["yes"]
    labels = [json.loads(x) for x in (prm / "labels.jsonl").read_text().splitlines()]
    assert len(labels) == 42 and {x["label"] for x in labels} == {"YES", "NO"}
    assert (prm / "config.json").exists() and (prm / "tokenizer_config.json").exists()

    report = tmp_path / "held.json"
    argv = ["prm", "calibrate", "--data", str(tmp_path / "held"), "--prm", str(prm), "--env", ENV]
    assert main([*argv, "--candidates", "6", "--out", str(report)]) == 0
    print(capsys.readouterr().out)
    o = json.loads(report.read_text())["overall"]
    print(
        f"held-out agreement {o['agreement']:.3f} vs majority {o['majority']:.3f} ({o['n']} candidates, "
        f"precision {o['precision']}, recall {o['recall']}); labels {st['label_seconds']:.0f} s, "
        f"fit {st['train_seconds']:.0f} s, coda prm train {train_s:.0f} s in all"
    )
    assert o["n"] == 7 * 6 and o["agreement"] > o["majority"]
