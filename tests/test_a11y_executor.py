"""The a11y executor (coda_agent.a11y_executor): the planner's step in words grounded through the app's
accessibility table into an env action, no model. Fast: the grammar on a table written here (KAlgebra's
layout). Real: KAlgebra's own a11y_tree observation, the actions performed in the real app, and
`coda eval --agent coda --executor a11y` end to end with a scripted planner endpoint (a stand-in OpenAI server
that answers fixed plans: the planner is not what is tested here)."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import gymnasium as gym
import pytest

from coda_agent.a11y_executor import A11yExecutor, GroundingError, find_element, ground
from coda_env.a11y import parse_table, table_text

from .conftest import JSONHandler

fast = pytest.mark.fast
TABLE = table_text(
    [
        ("page tab list", "Calculator", "", (0, 39, 335, 27), {"showing"}),
        ("page tab", "Calculator", "", (0, 39, 85, 27), {"showing", "selected"}),
        ("page tab", "2D Graph", "", (85, 39, 82, 27), {"showing"}),
        ("page tab", "3D Graph", "", (167, 39, 82, 27), {"showing"}),
        ("check box", "Full Screen", "", (936, 42, 82, 22), {"showing"}),
        ("text", "", "", (11, 737, 996, 30), {"showing"}),
        ("frame", "Variables", "", (1024, 39, 256, 739), {"showing"}),
        ("tree item", "pi", "", (1025, 108, 100, 15), {"showing"}),
        ("push button", "OK", "", (500, 500, 60, 20), {"showing"}),
    ]
)
ELS = parse_table(TABLE)


@fast
@pytest.mark.parametrize(
    "step, action",
    [
        ("Click the 'Graph 2D' tab", "pyautogui.click(125, 52)"),  # the words for '2D Graph'
        ("Thought: the Calculator is open. Click the 3D Graph tab at the top.", "pyautogui.click(207, 52)"),
        ("type '3^4' into the expression field", "pyautogui.click(508, 751)\npyautogui.write('3^4')"),
        (
            "Type 3^4 into the input line and press Enter",
            "pyautogui.click(508, 751)\npyautogui.write('3^4')\npyautogui.press('enter')",
        ),
        ("I should enter 'sin(x)' and submit it.", "pyautogui.write('sin(x)')\npyautogui.press('enter')"),
        ("press enter", "pyautogui.press('enter')"),
        ("Hit the Return key to submit.", "pyautogui.press('enter')"),
        ("Press Ctrl+A", "pyautogui.hotkey('ctrl', 'a')"),
        ("Now select all the text", "pyautogui.hotkey('ctrl', 'a')"),
        ("Press the OK button", "pyautogui.click(529, 509)"),
        ("Double-click the 'pi' item in the Variables panel", "pyautogui.doubleClick(1074, 115)"),
        ("Right-click the OK button", "pyautogui.rightClick(529, 509)"),
        ("Scroll down in the Variables panel", "pyautogui.scroll(-5, x=1151, y=408)"),
        ("Scroll up 3 times", "pyautogui.scroll(3)"),
        ("Click at (500, 751)", "pyautogui.click(500, 751)"),
        ("The console is empty. Click the input line at the bottom of the window", "pyautogui.click(508, 751)"),
        ("Check the 'Full Screen' box", "pyautogui.click(976, 52)"),
        ("Drag the 'pi' item to the OK button", "pyautogui.moveTo(1074, 115)\npyautogui.dragTo(529, 509)"),
    ],
)
def test_grounds_steps_in_words(step, action):
    assert ground(step, ELS) == action


@fast
def test_what_cannot_be_grounded_is_a_counted_error_and_the_env_gets_nothing():
    with pytest.raises(GroundingError, match="banana"):
        ground("Open the banana menu", ELS)
    with pytest.raises(GroundingError, match="no accessibility table"):
        find_element("the OK button", [])
    res = A11yExecutor().execute(
        [
            ("task", "Click the 'Nope' tab", {"a11y_tree": TABLE}),
            ("task", "Click the OK button", {"a11y_tree": TABLE}),
            ("task", "Click the OK button", {"screenshot": None}),  # no table at all
            ("task", "Click at (5000, 3)", {"a11y_tree": TABLE}),
        ]
    )  # off the screen
    assert [r.action for r in res] == [None, "pyautogui.click(529, 509)", None, None]
    assert all(r.parse_errors and r.parse_errors[0].startswith("a11y: ") for r in (res[0], res[2], res[3]))
    assert res[1].calls == [{"model": "a11y", "input": "Click the OK button", "output": "pyautogui.click(529, 509)"}]


# ------------------------------------------------------------------------------------------ real KAlgebra
@pytest.fixture(scope="module")
def env():
    e = gym.make("coda/KAlgebra-v0", a11y_tree=True, max_steps=20)
    yield e
    e.close()


def test_kalgebra_a11y_tree_is_a_table_with_boxes(env):
    obs, _ = env.reset(options={"task": "tab_3d_graph"})
    els = parse_table(obs["a11y_tree"])
    tabs = {e.name: e for e in els if e.role == "page tab"}
    assert {"Calculator", "2D Graph", "3D Graph", "Dictionary"} <= set(tabs)
    assert tabs["3D Graph"].contains(207, 53)  # where the task's oracle clicks
    assert any(e.role == "text" and e.contains(500, 751) for e in els)  # the console's input line
    assert all(0 <= e.box[0] <= e.box[2] < 1280 and 0 <= e.box[1] <= e.box[3] < 800 for e in els)


def test_a11y_executor_acts_in_real_kalgebra(env):
    ex = A11yExecutor()
    obs, _ = env.reset(options={"task": "calc_power"})
    for step in [
        "Click the 'Graph 3D' tab",
        "Click the Calculator tab",
        "Click the input line at the bottom of the window",
        "Type 'a:=3^4' and press enter",
    ]:
        (res,) = ex.execute([(obs["instruction"], step, obs)])
        assert res.action is not None, res.parse_errors
        obs, reward, term, trunc, info = env.step(res.action)
        assert info["action_error"] is None
        if step.startswith("Click the 'Graph 3D'"):
            assert env.unwrapped.state()["tab"] == "3D Graph"
    assert env.unwrapped.state()["variables"].get("a") == "81"
    obs, reward, term, trunc, info = env.step("DONE")
    assert term and reward == 1.0


PLANS = {  # task -> the scripted planner's answers, one per step
    "tab_3d_graph": [
        "Thought: The Calculator tab is open.\nAction: Click the 'Graph 3D' tab",
        "Thought: The 3D Graph tab is shown.\nAction: DONE",
    ],
    "calc_factorial_10": [
        "Thought: The console is empty.\nAction: Click the input line at the bottom of the window",
        "Thought: The input has focus.\nAction: Type 'f:=factorial(10)' and press enter",
        "Thought: f is stored.\nAction: DONE",
    ],
}


class _ScriptedPlanner(JSONHandler):
    """A stand-in OpenAI endpoint that answers as a planner with fixed plans: the task is found in the prompt,
    the step by the assistant turns before it."""

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "scripted-planner", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        msgs = body["messages"]
        text = json.dumps(msgs)
        task = next(t for t in PLANS if {"tab_3d_graph": "3D Graph tab", "calc_factorial_10": "factorial"}[t] in text)
        step = sum(m["role"] == "assistant" for m in msgs)
        out = PLANS[task][min(step, len(PLANS[task]) - 1)]
        self._send(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10},
            },
        )


def test_coda_eval_with_the_a11y_executor(tmp_path):
    from coda_agent.cli import main

    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedPlanner)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "run"
        rc = main(
            [
                "eval",
                "--env",
                "coda/KAlgebra-v0",
                "--agent",
                "coda",
                "--planner",
                f"http://127.0.0.1:{server.server_address[1]}",
                "--executor",
                "a11y",
                "--tasks",
                "tab_3d_graph",
                "calc_factorial_10",
                "--out",
                str(out),
                "--quiet",
            ]
        )
    finally:
        server.shutdown()
    assert rc == 0
    results = json.loads((out / "results.json").read_text())["summary"]
    assert results["per_task"] == {"tab_3d_graph": 1.0, "calc_factorial_10": 1.0}, results["per_task"]
    steps = [
        json.loads(x) for x in (out / "trajectories" / "calc_factorial_10__0" / "steps.jsonl").read_text().splitlines()
    ]
    assert [s["action"] for s in steps] == [
        "pyautogui.click(508, 751)",
        "pyautogui.write('f:=factorial(10)')\npyautogui.press('enter')",
        "DONE",
    ]
    assert steps[0]["calls"][1]["model"] == "a11y" and not steps[0]["parse_errors"]
    assert json.loads((out / "config.json").read_text())["executor"] == "a11y"
