"""State datasets (coda_agent.states): labels split and described, the dataset round trip, the commands'
errors (fast); the oracle dataset of real KAlgebra replays, whose every label the a11y executor grounds back
from its words; and the stored prompt == the live agent's prompt at that step, token for token with a tiny
real Qwen2.5-VL (coda_agent.tiny), for run-folder states and oracle states. The live runs' planner is a
scripted stand-in endpoint (fixed plans; what is tested is the prompt the agent builds, the env and the
a11y executor are real)."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("datasets")
torch = pytest.importorskip("torch")

from coda_agent import states  # noqa: E402
from coda_agent.cli import main  # noqa: E402
from coda_agent.planner import Planner, Turn  # noqa: E402
from coda_env.a11y import parse_table, table_text  # noqa: E402

from .conftest import JSONHandler  # noqa: E402

fast = pytest.mark.fast
ORACLE_TASKS = ["tab_3d_graph", "calc_factorial_10", "plot_parabola", "calc_swap_variables"]


# ------------------------------------------------------------------------------------------ fast
@fast
def test_split_action_gives_executor_sized_steps():
    code = "pyautogui.click(500, 751)\npyautogui.write('f:=factorial(10)')\npyautogui.press('enter')"
    assert states.split_action(code) == [
        "pyautogui.click(500, 751)",
        "pyautogui.write('f:=factorial(10)')\npyautogui.press('enter')",
    ]
    # sleeps are no step of their own: performed with the step around them, never in a label
    code = "time.sleep(1)\npyautogui.hotkey('ctrl', 'a')\npyautogui.write('x')\ntime.sleep(0.5)"
    assert states.split_action(code) == ["pyautogui.hotkey('ctrl', 'a')", "pyautogui.write('x')"]
    assert states.executor_steps(code, (1280, 800)) == [
        ("pyautogui.hotkey('ctrl', 'a')", "time.sleep(1.0)\npyautogui.hotkey('ctrl', 'a')"),
        ("pyautogui.write('x')", "pyautogui.write('x')\ntime.sleep(0.5)"),
    ]
    assert states.split_action("time.sleep(1)") == []
    assert states.split_action("pyautogui.moveTo(1, 2)\npyautogui.dragTo(30, 40)") == [
        "pyautogui.moveTo(1, 2)\npyautogui.dragTo(30, 40)"
    ]
    assert states.split_action("DONE") == ["DONE"]


@fast
def test_describe_action_names_the_element_or_the_point():
    els = parse_table(
        table_text(
            [
                ("page tab", "3D Graph", "", (167, 39, 82, 27), {"showing"}),
                ("text", "", "", (11, 737, 996, 30), {"showing"}),
                ("frame", "Variables", "", (1024, 39, 256, 739), {"showing"}),
            ]
        )
    )
    assert states.describe_action("pyautogui.click(207, 53)", els) == "Click the '3D Graph' tab"
    assert states.describe_action("pyautogui.doubleClick(500, 751)", els) == "Double-click the input field"
    assert states.describe_action("pyautogui.click(1100, 500)", els) == "Click at (1100, 500)"  # a frame: no target
    assert (
        states.describe_action("pyautogui.write(\"it's\")\npyautogui.press('enter')") == 'Type "it\'s" and press enter'
    )
    assert states.describe_action("pyautogui.hotkey('ctrl', 'a')") == "Press ctrl+a"
    assert states.describe_action("ANS 81") == "ANS 81"
    assert states.target_element("pyautogui.click(1100, 500)", els, (1280, 800)) is None
    assert states.target_element("pyautogui.click(207, 53)", els, (1280, 800)).box == (167, 39, 248, 65)


def _frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (800, 1280, 3), dtype=np.uint8)


def _made_records() -> list[dict]:
    shots = [states._png(_frame(i)) for i in range(4)]
    hist = [
        {"thought": "t1", "action": "Click the '2D Graph' tab"},
        {"thought": "", "action": "Press enter"},
        {"thought": "t3", "action": "pyautogui.write('x')"},
    ]
    return [
        states._record(
            id=f"made:{k}",
            app="kalgebra",
            task="made",
            step=k + 1,
            source="oracle",
            instruction="Do it.",
            history=hist[:k],
            images=shots[max(0, k - 2) : k + 1],
            target="pyautogui.click(207, 53)" if k < 3 else "DONE",
            box=(167, 39, 248, 65) if k < 3 else None,
            radius=20.0,
            screen=(1280, 800),
            a11y="role\tname\nx\ty" if k == 0 else "",
        )
        for k in range(4)
    ]


@fast
def test_dataset_round_trip_keeps_every_column(tmp_path):
    recs = _made_records()
    states.build(recs, tmp_path / "ds")
    ds = states.load(tmp_path / "ds")
    assert ds.column_names == list(states.COLUMNS)
    assert len(ds) == 4
    for rec, row in zip(recs, ds):
        for col in states.COLUMNS:
            if col == "images":
                assert [np.asarray(im.convert("RGB")).tobytes() for im in row["images"]] == [
                    states._array(im).tobytes() for im in rec["images"]
                ]
            else:
                assert row[col] == rec[col], col
    assert ds.features["images"].feature.__class__.__name__ == "Image"


@fast
def test_planner_conversation_is_the_planners_own():
    recs = _made_records()
    rec = recs[3]  # 3 earlier turns, screenshots of the last 2 stored
    conv = states.planner_conversation(rec)
    turns = [
        Turn(None, "t1", "Click the '2D Graph' tab"),
        Turn(_frame(1), "", "Press enter"),
        Turn(_frame(2), "t3", "pyautogui.write('x')"),
    ]
    want = Planner(None, "kalgebra", history_images=2).conversation("Do it.", turns, _frame(3))
    assert _same(conv, want)
    assert _same(
        states.planner_conversation(rec, history_images=1),
        Planner(None, "kalgebra", history_images=1).conversation("Do it.", turns, _frame(3)),
    )
    with pytest.raises(ValueError, match="stores 2 earlier screenshots"):
        states.planner_conversation(rec, history_images=3)
    obs = states.state_observation(recs[0])
    assert obs["a11y_tree"] == "role\tname\nx\ty" and np.array_equal(obs["screenshot"], _frame(0))


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@fast
def test_data_commands_refuse_bad_input_with_one_line(tmp_path, capsys):
    assert main(["data", "states", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "neither `oracle` nor a run folder" in err[0]
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["data", "states", "oracle", "--out", str(tmp_path / "full")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert main(["data", "show", str(tmp_path / "nothing")]) == 2
    assert "not a state dataset" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["data", "states", "--out", str(tmp_path / "o")])
    assert e.value.code == 2


# ------------------------------------------------------------------------------------------ real KAlgebra
@pytest.fixture(scope="module")
def oracle_ds(tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle") / "ds"
    assert (
        main(
            [
                "data",
                "states",
                "oracle",
                "--env",
                "coda/KAlgebra-v0",
                "--tasks",
                *ORACLE_TASKS,
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    return out


def test_oracle_states_of_real_kalgebra(oracle_ds, capsys):
    from coda_agent.a11y_executor import ground
    from coda_agent.steps import action_reward

    ds = states.load(oracle_ds)
    assert sorted(set(ds["task"])) == sorted(ORACLE_TASKS) and set(ds["source"]) == {"oracle"}
    for row in ds:
        hist = json.loads(row["history"])
        assert len(row["images"]) == min(2, len(hist)) + 1 and row["step"] == len(hist) + 1
        assert row["screen"] == [1280, 800] and row["a11y"].startswith("role\tname")
        if row["target"].startswith("pyautogui.click("):
            assert len(row["box"]) == 4, row["id"]  # KAlgebra's clicks all land on elements
        # every label is what the a11y executor makes of its words (the history's words for earlier steps)
        words = states.describe_action(row["target"], parse_table(row["a11y"]))
        got = row["target"] if row["target"] in ("DONE", "FAIL") else ground(words, parse_table(row["a11y"]))
        reward = action_reward(got, row["target"], row["box"] or None, tuple(row["screen"]), radius=row["radius"])
        assert reward == 2.0, (row["id"], words, got)
    assert main(["data", "show", str(oracle_ds)]) == 0
    shown = capsys.readouterr().out
    assert "kalgebra" in shown and "click" in shown and "oracle" in shown


class _Scripted(JSONHandler):
    """A stand-in OpenAI planner endpoint: for the task whose instruction is in the prompt, answers its next
    fixed plan (the step is the number of assistant turns before it)."""

    script: dict[str, list[str]] = {}

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = "\n".join(
            p["text"]
            for m in body["messages"]
            if m["role"] != "assistant"
            for p in (m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}])
            if p["type"] == "text"
        )
        plans = next(v for k, v in self.script.items() if k in text)
        out = plans[min(sum(m["role"] == "assistant" for m in body["messages"]), len(plans) - 1)]
        self._send(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": "stop"}],
            },
        )


class Recording:
    """Wraps the planner's model and keeps every conversation it is asked (what the live agent built)."""

    def __init__(self, inner):
        self.inner, self.convs = inner, []
        self.name, self.min_pixels, self.max_pixels = inner.name, inner.min_pixels, inner.max_pixels

    def generate(self, conversations, params):
        self.convs += list(conversations)
        return self.inner.generate(conversations, params)


def _live_run(tmp_path, script: dict[str, list[str]], tasks: list[str]) -> tuple[Path, list]:
    """`coda eval`'s runner with the coda agent: the scripted planner (recorded) and the a11y executor."""
    from coda_agent.eval import run_eval
    from coda_agent.models import OpenAIVLM
    from coda_agent.policy import make_agent

    _Scripted.script = script
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        planner = Recording(OpenAIVLM(f"http://127.0.0.1:{server.server_address[1]}", model="scripted"))
        agent = make_agent("coda", "kalgebra", planner=planner, executor="a11y", history_images=2)
        out = tmp_path / "run"
        run_eval("coda/KAlgebra-v0", agent, out, tasks, env_kwargs={"a11y_tree": True, "max_steps": 6}, progress=False)
    finally:
        server.shutdown()
    return out, planner.convs


def _task_of(conv) -> str:
    return next(p["text"] for p in conv[1]["content"] if p["type"] == "text")


def _step_of(conv) -> int:
    return sum(m["role"] == "assistant" for m in conv) + 1


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from coda_agent.models import TransformersVLM
    from coda_agent.tiny import build_tiny_qwen2_5_vl

    return TransformersVLM(build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny") / "m"))


def _ids(vlm, conv):
    return vlm.build_inputs([conv])


def test_run_states_prompts_are_the_live_prompts(tmp_path, tiny):
    """A live run (2 tasks solved, 1 failed): the successful episodes' states, stored and loaded back, rebuild
    the planner's prompt exactly: the same token ids and the same pixels as the live agent's at each step."""
    script = {
        "3D Graph tab": [
            "Thought: The Calculator tab is open.\nAction: Click the 'Graph 3D' tab",
            "Thought: The 3D Graph tab is shown.\nAction: DONE",
        ],
        "factorial of 10": [
            "Thought: The console is empty.\nAction: Click the input line at the bottom",
            "Thought: It has focus.\nAction: Type 'f:=factorial(10)' and press enter",
            "Thought: Stored.\nAction: DONE",
        ],
        "3 to the power of 4": ["Thought: Nothing to do.\nAction: DONE"],
    }  # fails its checks
    run, live = _live_run(tmp_path, script, ["tab_3d_graph", "calc_factorial_10", "calc_power"])
    rep: dict = {}
    states.build(states.run_states(run, report=rep), tmp_path / "ds")
    ds = states.load(tmp_path / "ds")
    assert rep["runs"][str(run)] == {"episodes": 3, "kept": 2, "states": 5, "skipped": 0}
    assert sorted(ds["task"]) == ["calc_factorial_10"] * 3 + ["tab_3d_graph"] * 2
    assert ds[0]["source"] == f"run:{run}" and ds[0]["box"] == [] and ds[0]["radius"] == states.DEFAULT_RADIUS
    by_key = {(_task_of(c), _step_of(c)): c for c in live}
    for row in ds:
        conv = by_key[(f"Task: {row['instruction']}", row["step"])]
        a, b = _ids(tiny, states.planner_conversation(row)), _ids(tiny, conv)
        assert torch.equal(a["input_ids"], b["input_ids"]), row["id"]
        assert torch.equal(a["pixel_values"], b["pixel_values"]) and torch.equal(
            a["image_grid_thw"], b["image_grid_thw"]
        )
    # --judge URL decides success instead of the checks: a judge that says yes keeps the failed episode too
    from .test_judge import _StandIn

    judge = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=judge.serve_forever, daemon=True).start()
    try:
        assert (
            main(
                [
                    "data",
                    "states",
                    str(run),
                    "--judge",
                    f"http://127.0.0.1:{judge.server_address[1]}",
                    "--out",
                    str(tmp_path / "judged"),
                    "--quiet",
                ]
            )
            == 0
        )
    finally:
        judge.shutdown()
    assert (
        sorted(states.load(tmp_path / "judged")["task"])
        == ["calc_factorial_10"] * 3 + ["calc_power"] + ["tab_3d_graph"] * 2
    )
    factorial = [json.loads(r["history"]) for r in ds if r["task"] == "calc_factorial_10"]
    assert factorial[-1] == [
        {"thought": "The console is empty.", "action": "Click the input line at the bottom"},
        {"thought": "It has focus.", "action": "Type 'f:=factorial(10)' and press enter"},
    ]


def test_oracle_states_prompts_are_the_live_prompts(tmp_path, oracle_ds, tiny):
    """A planner that says the oracle states' words, live with the a11y executor: it solves each task, and at
    every step its prompt has the token ids of the oracle state's stored prompt (the screens may differ by
    where the pointer rests, not in size)."""
    ds = states.load(oracle_ds)
    script = {}
    for task in ORACLE_TASKS:
        rows = sorted((r for r in ds if r["task"] == task), key=lambda r: r["step"])
        words = [json.loads(r["history"])[-1]["action"] for r in rows[1:]] + [rows[-1]["target"]]
        script[rows[0]["instruction"]] = [f"Thought: \nAction: {w}" for w in words]
    run, live = _live_run(tmp_path, script, ORACLE_TASKS)
    results = json.loads((run / "results.json").read_text())["summary"]
    assert results["overall"]["rate"] == 1.0, results["per_task"]
    by_key = {(_task_of(c), _step_of(c)): c for c in live}
    for row in ds:
        conv = by_key[(f"Task: {row['instruction']}", row["step"])]
        a, b = _ids(tiny, states.planner_conversation(row)), _ids(tiny, conv)
        assert torch.equal(a["input_ids"], b["input_ids"]), row["id"]
