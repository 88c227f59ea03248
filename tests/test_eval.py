"""`coda eval`: the vector-env runner, its files, scores, resume, report and compare."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coda_agent.eval import compare, pass_at_k, run_eval, summarize, unbatch_info
from coda_agent.policy import DoneAgent, OracleAgent, RandomAgent
from coda_agent.cli import main
from coda_env.tasks import load_tasks

from .conftest import wait_until

ROOT = Path(__file__).resolve().parent.parent


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_oracle_solves_the_whole_suite_on_two_envs(tmp_path, capsys):
    out = tmp_path / "oracle"
    assert main(["eval", "--agent", "oracle", "--num-envs", "2", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    n = len(load_tasks("kalgebra"))
    assert results["summary"]["overall"] == {"n": n, "success": n, "rate": 1.0}
    assert "overall" in printed and "100%" in printed
    assert results["summary"]["by_app"]["kalgebra"]["rate"] == 1.0
    assert set(results["summary"]["by_difficulty"]) <= {"easy", "medium", "hard"}
    for rec in results["episodes"]:
        ep = out / "trajectories" / f"{rec['task']}__0"
        steps = _lines(ep / "steps.jsonl")
        assert len(steps) == rec["steps"] and steps[-1]["reward"] == 1.0
        assert steps[-1]["action"].split()[0] in ("DONE", "FAIL", "ANS")
        assert all(s["task"] == rec["task"] for s in steps)  # no slot mixed up another's steps
        assert sorted(p.name for p in ep.glob("step_*.png")) == [f"step_{i:03d}.png" for i in range(len(steps) + 1)]
    index = (out / "report" / "index.html").read_text()
    assert f"{n}/{n}" in index
    page = (out / "report" / "calc_power__0.html").read_text()
    assert "../trajectories/calc_power__0/step_001.png" in page and "pyautogui" in page


def test_random_scores_near_zero(tmp_path):
    tasks = list(load_tasks("kalgebra"))[:8]
    summary = run_eval(
        "coda/KAlgebra-v0", RandomAgent(seed=1), tmp_path / "random", tasks, env_kwargs={"max_steps": 6}, progress=False
    )
    assert summary["overall"]["n"] == 8 and summary["overall"]["rate"] <= 0.125
    assert 1 <= summary["mean_steps"] <= 6


def test_episodes_pass_at_k_and_compare(tmp_path):
    tasks = ["calc_power", "calc_log2_3"]
    a = run_eval("coda/KAlgebra-v0", DoneAgent(), tmp_path / "a", tasks, episodes=2, progress=False)
    assert a["overall"] == {"n": 4, "success": 0, "rate": 0.0} and a["pass_at_k"] == {"1": 0.0, "2": 0.0}
    run_eval("coda/KAlgebra-v0", OracleAgent(), tmp_path / "b", tasks, episodes=1, progress=False)
    text = compare(tmp_path / "a", tmp_path / "b")
    assert "overall" in text and "+100.0%" in text and "calc_power" in text


def test_killed_run_resumes_without_redoing_finished_episodes(tmp_path):
    out = tmp_path / "run"
    tasks = ["calc_power", "calc_log2_3", "calc_hypotenuse", "calc_gcd_lcm"]
    cmd = [
        sys.executable,
        "-m",
        "coda_agent.cli",
        "eval",
        "--agent",
        "oracle",
        "--tasks",
        *tasks,
        "--out",
        str(out),
        "--quiet",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = out / "episodes.jsonl"
    try:
        assert wait_until(lambda: done.exists() and len(done.read_text().splitlines()) >= 2, timeout=120)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    first = _lines(done)
    assert 2 <= len(first) < 4
    before = {r["task"]: r["seconds"] for r in first}
    summary = run_eval("coda/KAlgebra-v0", OracleAgent(), out, tasks, progress=False)
    records = _lines(done)
    assert sorted(r["task"] for r in records) == sorted(tasks)  # each exactly once
    assert {r["task"]: r["seconds"] for r in records if r["task"] in before} == before  # not redone
    assert summary["overall"]["rate"] == 1.0


def test_summary_and_unbatch():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 1, 2) == pytest.approx(0.5)
    recs = [
        {"task": "t", "app": "a", "difficulty": "easy", "category": "c", "success": s, "steps": 3}
        for s in (True, False)
    ]
    s = summarize(recs, episodes=2)
    assert s["overall"]["rate"] == 0.5 and s["pass_at_k"] == {"1": 0.5, "2": 1.0}
    infos = {
        "task": np.array(["a", "b"], dtype=object),
        "_task": np.array([True, True]),
        "error": np.array([None, "boom"], dtype=object),
        "_error": np.array([False, True]),
        "timings": {"step": np.array([0.1, 0.2]), "_step": np.array([True, True])},
        "_timings": np.array([True, True]),
    }
    assert unbatch_info(infos, 0) == {"task": "a", "timings": {"step": 0.1}}
    assert unbatch_info(infos, 1) == {"task": "b", "error": "boom", "timings": {"step": 0.2}}


def test_summary_groups_by_origin():
    recs = [
        {"task": t, "app": "kalgebra", "difficulty": "easy", "category": "c", "success": ok, "steps": 2, "origin": o}
        for t, ok, o in (
            ("a", True, "coda"),
            ("sb_A-02", True, "scienceboard:KAlgebra/A-02"),
            ("sb_C-01", False, "scienceboard:KAlgebra/C-01"),
            ("old", True, None),
        )
    ]
    s = summarize(recs)
    assert s["by_origin"] == {
        "coda": {"n": 2, "success": 2, "rate": 1.0},
        "scienceboard:KAlgebra": {"n": 2, "success": 1, "rate": 0.5},
    }


def test_cli_errors_are_clear(capsys):
    assert main(["eval", "--agent", "coda", "--out", "/tmp/unused-coda-run"]) == 2
    assert "needs --planner" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "--agent",
                "coda",
                "--planner",
                "/nonexistent/ckpt",
                "--executor",
                "x",
                "--out",
                "/tmp/unused-coda-run",
            ]
        )
        == 2
    )
    assert "coda never downloads weights" in capsys.readouterr().err
    assert main(["envs"]) == 0 and "coda/KAlgebra-v0" in capsys.readouterr().out
    assert main(["tasks", "kalgebra"]) == 0 and "calc_power" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ set-up failures
def _records_by_task(out: Path) -> dict[str, dict]:
    return {r["task"]: r for r in _lines(out / "episodes.jsonl")}


@pytest.mark.fast
def test_a_set_up_failure_is_one_failed_episode_and_the_run_goes_on_fake(tmp_path):
    """On the FAKE app: a task whose set-up raises is recorded as one failed episode with its error (in
    episodes.jsonl, results.json and the report), and the tasks after it still run and pass."""
    from coda_env.apps._fake import FAKE_TASKS, register_fake
    from coda_env.registry import AppError, SetupOp, register_setup_op, unregister_app

    def boom(ctx, op):
        raise AppError("the fake location is not in /")

    broken = {
        "id": "fake_broken_setup",
        "app": "fake",
        "instruction": "Never starts.",
        "steps": 3,
        "initialize": [{"func": "fake_fail_setup"}],
        "evaluate": [{"type": "answer", "value": "x"}],
        "solution": ["ANS x"],
    }
    register_fake([*FAKE_TASKS, broken])
    register_setup_op(SetupOp("fake_fail_setup", boom, phase="app"), "fake")
    try:
        out = tmp_path / "run"
        ids = ["fake_type_42", "fake_broken_setup", "fake_answer", "fake_broken_setup", "fake_note"]
        summary = run_eval("coda/Fake-v0", OracleAgent(), out, ids[:3] + ids[4:], progress=False)
        recs = _records_by_task(out)
        assert summary["overall"] == {"n": 4, "success": 3, "rate": 0.75}
        bad = recs["fake_broken_setup"]
        assert bad["success"] is False and bad["steps"] == 0 and bad["reward"] == 0.0
        assert "set-up failed" in bad["error"] and "the fake location is not in /" in bad["error"]
        assert all(recs[t]["success"] for t in ("fake_type_42", "fake_answer", "fake_note"))
        results = json.loads((out / "results.json").read_text())
        assert [r["task"] for r in results["episodes"] if r.get("error")] == ["fake_broken_setup"]
        assert "the fake location is not in /" in (out / "report" / "index.html").read_text()
        # two failing episodes in a row, and one at the very end: still one record each, nothing else lost
        out2 = tmp_path / "run2"
        summary = run_eval(
            "coda/Fake-v0", OracleAgent(), out2, ["fake_broken_setup", "fake_type_42"], episodes=2, progress=False
        )
        recs = _lines(out2 / "episodes.jsonl")
        assert sorted((r["task"], r["episode"], r["success"]) for r in recs) == [
            ("fake_broken_setup", 0, False),
            ("fake_broken_setup", 1, False),
            ("fake_type_42", 0, True),
            ("fake_type_42", 1, True),
        ]
        # on two envs (an AsyncVectorEnv, whose worker an exception would shut down): the same
        out3 = tmp_path / "run3"
        summary = run_eval("coda/Fake-v0", OracleAgent(), out3, ids[:3] + ids[4:], num_envs=2, progress=False)
        assert summary["overall"] == {"n": 4, "success": 3, "rate": 0.75}
        assert "set-up failed" in _records_by_task(out3)["fake_broken_setup"]["error"]
    finally:
        unregister_app("fake")


def test_a_set_up_failure_is_one_failed_episode_on_real_kalgebra(tmp_path, capsys):
    """Real KAlgebra through `coda eval` on two envs: a task that validates but whose set-up fails (a 2D
    function KAlgebra refuses to plot) is one failed episode with the error; the run goes on and exits 0."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "bad_plot.json").write_text(
        json.dumps(
            {
                "id": "bad_plot",
                "app": "kalgebra",
                "instruction": "Plot nothing.",
                "steps": 3,
                "initialize": [{"func": "func_2d", "expr": "(((("}],
                "evaluate": [{"type": "eqn", "count": 1}],
                "solution": ["DONE"],
            }
        )
    )
    out = tmp_path / "run"
    rc = main(
        [
            "eval",
            "--agent",
            "oracle",
            "--tasks",
            "calc_power",
            "bad_plot",
            "calc_log2_3",
            "--num-envs",
            "2",
            "--tasks-dir",
            str(tasks),
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    recs = _records_by_task(out)
    assert set(recs) == {"calc_power", "bad_plot", "calc_log2_3"}
    assert recs["calc_power"]["success"] and recs["calc_log2_3"]["success"]
    assert not recs["bad_plot"]["success"] and recs["bad_plot"]["steps"] == 0
    assert "set-up failed" in recs["bad_plot"]["error"] and "did not add the 2D function" in recs["bad_plot"]["error"]
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["overall"] == {"n": 3, "success": 2, "rate": round(2 / 3, 4)}


@pytest.mark.fast
def test_run_recorder_writes_as_it_goes_and_keeps_an_interrupted_episode(tmp_path):
    """The one run recorder of `coda eval` and the trainers: steps are on disk as they happen, a finished
    episode is in episodes.jsonl, and one still open at close() keeps its steps but is not marked finished
    (so a rerun redoes it)."""
    from coda_agent.rollout import RunRecorder
    from coda_agent.types import AgentStep
    from coda_env.runs import load_finished

    shot = np.zeros((8, 8, 3), np.uint8)
    tasks = load_tasks("kalgebra")
    a, b = tasks["calc_power"], tasks[next(t for t in tasks if t != "calc_power")]
    with RunRecorder(tmp_path / "run") as rec:
        rec.start(0, a, 0, shot)
        rec.start(1, b, 0, shot)
        w = rec.step(0, AgentStep(action="CLICK 1 2", thought="t"), shot, 0.0, {}, 0.1)
        assert (w.task.id, w.steps) == ("calc_power", 1)
        rec.step(1, AgentStep(action="WAIT"), shot, 0.0, {}, 0.1)
        assert _lines(tmp_path / "run" / "trajectories" / "calc_power__0" / "steps.jsonl")[0]["action"] == "CLICK 1 2"
        done = rec.end(0, 1.0, {"success": True})
        assert done["task"] == "calc_power" and done["success"]
    finished = load_finished(tmp_path / "run")
    assert list(finished) == [("calc_power", 0)]
    assert _lines(tmp_path / "run" / "trajectories" / f"{b.id}__0" / "steps.jsonl")[0]["action"] == "WAIT"
