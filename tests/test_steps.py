"""The labelling vocabulary: CODA's stage-1 reward (coda_agent.steps.action_reward) on every action type, box edges, unparseable
predictions and types that differ; and steplevel.execute_plans, the coda agent's plan -> action path, batched. Fast tier:
pure logic, plus a FAKE scripted executor model where only its words matter."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("torch")

from coda_agent.steps import (
    DEFAULT_RADIUS,
    DEFAULT_SCALE,
    action_reward,
    action_type,  # noqa: E402
    canonical_steps,
)

fast = pytest.mark.fast
S = (1280, 800)
BOX = (167, 39, 248, 65)  # KAlgebra's '3D Graph' tab, edges included


def r(pred, target, box=None, **kw):
    return action_reward(pred, target, box, S, **kw)


@fast
def test_click_inside_the_box_and_on_its_edges_scores_two():
    t = "pyautogui.click(207, 53)"
    for x, y in [(207, 53), (167, 39), (248, 65), (167, 65), (248, 39), (200, 60)]:
        assert r(f"pyautogui.click({x}, {y})", t, BOX) == 2.0, (x, y)
    assert r("pyautogui.click(210, 50)", t, list(BOX)) == 2.0  # a list box (as a dataset stores it)


@fast
def test_click_outside_the_box_falls_off_monotonically_with_distance():
    t = "pyautogui.click(207, 53)"
    got = [r(f"pyautogui.click({249 + d}, 53)", t, BOX) for d in (0, 5, 20, 50, 200, 1000)]
    assert all(1.0 < a < 2.0 for a in got)
    assert all(a > b for a, b in zip(got, got[1:]))
    assert math.isclose(got[3] - 1.0, math.exp(-51 / DEFAULT_SCALE))  # 51 px from the right edge
    assert r("pyautogui.click(300, 53)", t, BOX, scale=200) > r("pyautogui.click(300, 53)", t, BOX, scale=20)
    below = r("pyautogui.click(207, 66)", t, BOX)  # one pixel below the bottom edge
    assert 1.97 < below < 2.0


@fast
def test_no_box_uses_the_target_point_and_the_radius():
    t = "pyautogui.click(500, 751)"
    assert r("pyautogui.click(500, 751)", t) == 2.0
    assert r(f"pyautogui.click({500 + int(DEFAULT_RADIUS)}, 751)", t) == 2.0  # on the disc's rim
    assert r("pyautogui.click(500, 751)", t, ()) == 2.0  # an empty box: none
    assert r("pyautogui.click(530, 751)", t, radius=10) < r("pyautogui.click(530, 751)", t, radius=30) == 2.0
    far = [r(f"pyautogui.click({500 + d}, 751)", t) for d in (30, 60, 120)]
    assert far[0] > far[1] > far[2] > 1.0


@fast
def test_pointer_types_differ_by_button_and_clicks():
    t = "pyautogui.click(207, 53)"
    assert r("pyautogui.doubleClick(207, 53)", t, BOX) == 0.0
    assert r("pyautogui.rightClick(207, 53)", t, BOX) == 0.0
    assert r("pyautogui.moveTo(207, 53)", t, BOX) == 0.0
    assert r("pyautogui.doubleClick(1100, 89)", "pyautogui.doubleClick(1101, 90)") == 2.0
    assert r("pyautogui.click(207, 53, button='right')", "pyautogui.rightClick(100, 53)", BOX) == 2.0
    assert action_type("pyautogui.tripleClick(1, 2)") == "triple_click"


@fast
def test_drags_score_both_ends():
    t = "pyautogui.moveTo(100, 100)\npyautogui.dragTo(400, 300)"
    assert action_type(t) == "drag" and r(t, t) == 2.0
    start_off = r("pyautogui.moveTo(200, 100)\npyautogui.dragTo(400, 300)", t)
    end_off = r("pyautogui.moveTo(100, 100)\npyautogui.dragTo(500, 300)", t)
    both_off = r("pyautogui.moveTo(200, 100)\npyautogui.dragTo(500, 300)", t)
    assert 1.5 < start_off < 2.0 and math.isclose(start_off, end_off) and both_off < start_off
    # the box belongs to the drag's start (the element grabbed)
    assert r("pyautogui.moveTo(130, 120)\npyautogui.dragTo(400, 300)", t, (90, 90, 140, 130)) == 2.0
    assert r("pyautogui.dragTo(400, 300)", t) == 0.0 or r("pyautogui.dragTo(400, 300)", t) < 2.0
    assert r("pyautogui.click(100, 100)", t) == 0.0


@fast
def test_typed_text_by_normalised_similarity_one_only_for_exact():
    t = "pyautogui.write('f:=factorial(10)')\npyautogui.press('enter')"
    assert action_type(t) == "type"
    assert r(t, t) == 2.0
    assert r("pyautogui.write('  f:=factorial(10) ')\npyautogui.press('enter')", t) == 2.0  # trimmed
    near = r("pyautogui.write('f:=factorial(11)')\npyautogui.press('enter')", t)
    far = r("pyautogui.write('fact')\npyautogui.press('enter')", t)
    nothing_alike = r("pyautogui.write('zzz')\npyautogui.press('enter')", t)
    assert 1.0 == nothing_alike < far < near < 2.0
    no_enter = r("pyautogui.write('f:=factorial(10)')", t)
    assert no_enter == 1.5  # same text, not submitted: halved
    assert r("pyautogui.write('a:=1')", "pyautogui.write('A:=1')") < 2.0  # case matters (maths)


@fast
def test_keys_and_hotkeys_by_key_set():
    assert r("pyautogui.press('enter')", "pyautogui.press('return')") == 2.0  # an alias: the same key
    assert r("pyautogui.hotkey('ctrl', 'a')", "pyautogui.hotkey('ctrl', 'a')") == 2.0
    assert r("pyautogui.hotkey('a', 'ctrl')", "pyautogui.hotkey('ctrl', 'a')") == 2.0  # a set
    assert r("pyautogui.hotkey('ctrl', 'c')", "pyautogui.hotkey('ctrl', 'a')") == pytest.approx(1 + 1 / 3)
    assert r("pyautogui.press('tab')", "pyautogui.hotkey('ctrl', 'a')") == 1.0  # same type, no overlap
    assert r("pyautogui.press('ctrl')", "pyautogui.hotkey('ctrl', 'a')") == 1.5
    assert r("pyautogui.write('a')", "pyautogui.press('a')") == 0.0


@fast
def test_scroll_by_direction_then_amount():
    t = "pyautogui.scroll(-5)"
    assert r("pyautogui.scroll(-5)", t) == 2.0
    assert r("pyautogui.scroll(5)", t) == 1.0  # the other direction
    assert r("pyautogui.hscroll(-5)", t) == 1.0  # the other axis
    assert r("pyautogui.scroll(-10)", t) == 1.75 and r("pyautogui.scroll(-1)", t) == pytest.approx(1.6)
    assert r("pyautogui.scroll(-3, x=10, y=10)", t) > r("pyautogui.scroll(-1)", t)


@fast
def test_terminal_answers():
    assert r("DONE", "DONE") == 2.0 and r("FAIL", "FAIL") == 2.0 and r("WAIT", "WAIT") == 2.0
    assert r("FAIL", "DONE") == 0.0 and r("DONE", "ANS 3") == 0.0 and r("pyautogui.click(1, 1)", "DONE") == 0.0
    assert r("ANS 81", "ANS 81") == 2.0 and r("ANS  Eighty one. ", "ANS eighty one") == 2.0
    assert r("ANS 81.0000000001", "ANS 81") == 2.0 and r("ANS 82", "ANS 81") == 1.0
    assert r("ANS 1,000", "ANS 1000") == 2.0


@fast
def test_unparseable_or_missing_predictions_score_zero_and_broken_labels_raise():
    t = "pyautogui.click(207, 53)"
    for bad in ["click the tab", "pyautogui.click(207, 53", "os.system('x')", "", "pyautogui.click(5000, 1)", None]:
        assert r(bad, t, BOX) == 0.0, bad
    with pytest.raises(ValueError, match="labelled action"):
        r(t, "click it")
    with pytest.raises(ValueError, match="left, top, right, bottom"):
        r(t, t, (10, 10, 5, 5))


@fast
def test_multi_step_actions_compare_step_by_step():
    t = "pyautogui.click(500, 751)\npyautogui.write('x:=2')\npyautogui.press('enter')"
    assert action_type(t) == "click+type"
    assert [s.type for s in canonical_steps(t)] == ["click", "type"] and canonical_steps(t)[1].submit
    assert r(t, t) == 2.0
    assert r("pyautogui.write('x:=2')\npyautogui.press('enter')", t) == 0.0  # a step missing: types differ
    half = r("pyautogui.click(500, 751)\npyautogui.write('y:=3')\npyautogui.press('enter')", t)
    assert 1.0 < half < 2.0


class ScriptedUITars:
    """A FAKE executor model: answers each request with the next text of its script."""

    name, min_pixels, max_pixels = "scripted", 56 * 56, 64 * 28 * 28

    def __init__(self, answers):
        self.answers, self.seen = list(answers), []

    def generate(self, conversations, params):
        from coda_agent.models import Generation

        self.seen += [c[-1]["content"] for c in conversations]
        return [Generation(self.answers.pop(0)) for _ in conversations]


@fast
def test_execute_plans_goes_through_the_coda_agents_path_and_counts_failures():
    from coda_agent.executor import Executor
    from coda_agent.train.steplevel import execute_plans

    shot = np.zeros((800, 1280, 3), np.uint8)
    model = ScriptedUITars(["click(start_box='(100,100)')", "nonsense", "nonsense"])
    ex = Executor(model, tries=2)
    items = [
        ("task", "Thought: the tab.\nAction: Click the '3D Graph' tab", shot),
        ("task", "Thought: finished\nAction: DONE", {"screenshot": shot}),
        ("task", "no format at all", shot),
        ("task", "Thought: x\nAction: ANS 81", shot),
        ("task", "Thought: y\nAction: Press enter", {"screenshot": shot}),
    ]
    stats: dict = {}
    actions = execute_plans(ex, items, stats)
    assert actions[0].startswith("pyautogui.click(") and actions[1] == "DONE" and actions[2] is None
    assert actions[3] == "ANS 81" and actions[4] is None
    # the executor saw the planner's thought and step as the start of its answer, in one batch per try
    assert model.seen[:2] == [
        "Thought: the tab. Click the '3D Graph' tab\nAction: ",
        "Thought: y Press enter\nAction: ",
    ]
    assert stats == {"plans": 5, "terminal": 2, "plan_parse_errors": 1, "executor_parse_errors": 1}
    execute_plans(ex, [], stats)
    assert stats["plans"] == 5
