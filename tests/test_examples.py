"""examples/*.py run unmodified, on real KAlgebra desktops, for a short budget: they step several envs,
log, save, reload the saved policy and play an episode with it."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, args: list[str], tmp_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["eval_steps"] >= 1 and result["eval_return"] in (0.0, 1.0)
    return result


def test_sb3_ppo_example_runs(tmp_path):
    pytest.importorskip("stable_baselines3", reason="pip install -e .[sb3]")
    result = _run("sb3_ppo.py", ["--timesteps", "16", "--num-envs", "2", "--n-steps", "8"], tmp_path)
    assert result["timesteps"] == 16
    rows = list(csv.DictReader(open(tmp_path / "progress.csv")))
    assert rows and int(rows[-1]["time/total_timesteps"]) == 16
    assert (tmp_path / "model.zip").stat().st_size > 100_000  # a CNN policy's weights


def test_cleanrl_ppo_example_runs(tmp_path):
    result = _run(
        "cleanrl_ppo.py",
        [
            "--total-timesteps",
            "16",
            "--num-envs",
            "2",
            "--num-steps",
            "8",
            "--num-minibatches",
            "2",
            "--update-epochs",
            "2",
        ],
        tmp_path,
    )
    assert result["global_step"] == 16 and result["episodes"] >= 1
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert len(rows) == 1 and float(rows[0]["entropy"]) > 0
    assert (tmp_path / "agent.pt").stat().st_size > 1_000_000
