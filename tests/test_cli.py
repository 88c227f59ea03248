"""`coda eval`: trajectories written as they happen, a results file, and resume."""
from __future__ import annotations

import json

from coda_env.cli import main, run_eval


def test_eval_oracle_writes_trajectories_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    tasks = ["calc_power", "plot_parabola"]
    assert main(["eval", "--agent", "oracle", "--tasks", *tasks, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "overall" in printed and "100%" in printed and str(out / "trajectories") in printed
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["overall"] == {"n": 2, "success": 2, "rate": 1.0}
    for t in tasks:
        ep = out / "trajectories" / f"{t}__0"
        steps = [json.loads(line) for line in (ep / "steps.jsonl").read_text().splitlines()]
        assert steps[-1]["reward"] == 1.0 and steps[-1]["action"] == "DONE"
        assert len(list(ep.glob("step_*.png"))) == len(steps) + 1
    # a rerun with the same --out does not redo finished episodes; a new task is added
    summary = run_eval("coda/KAlgebra-v0", "done", out, tasks + ["calc_log2_3"], quiet=True)
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert [r["task"] for r in records] == tasks + ["calc_log2_3"]
    assert summary["overall"] == {"n": 3, "success": 2, "rate": 0.6667}


def test_envs_and_tasks_listing(capsys):
    assert main(["envs"]) == 0
    assert "coda/KAlgebra-v0" in capsys.readouterr().out
    assert main(["tasks", "kalgebra"]) == 0
    assert "calc_power" in capsys.readouterr().out
