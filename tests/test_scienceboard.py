"""ScienceBoard's KAlgebra task files: translation, refusals, hostile files, and every converted task's
oracle (1.0) and DONE at once (0.0) on the real KAlgebra under Xvfb, through gym.make, `coda eval` and
`coda import-scienceboard`.

The files are ScienceBoard's published ones, found through SCIENCEBOARD_DIR (default: ../shared/scienceboard
beside the repository); without them these tests are skipped, saying why.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import gymnasium as gym
import pytest

import coda_env  # noqa: F401  (registers the env ids)
from coda_agent.cli import main as coda
from coda_env.checks import CheckError, translate_lambda
from coda_env.scienceboard import convert, convert_file, import_folder
from coda_env.tasks import TaskError

from .conftest import run_solution

SB_DIR = Path(
    os.environ.get("SCIENCEBOARD_DIR") or Path(__file__).resolve().parents[1].parent / "shared" / "scienceboard"
)
SRC = SB_DIR / "tasks" / "VM" / "KAlgebra"
if not SRC.is_dir():
    _why = f"ScienceBoard's KAlgebra task files are not at {SRC} (set SCIENCEBOARD_DIR to a ScienceBoard checkout)"
    print(_why)
    pytest.skip(_why, allow_module_level=True)

# What the translation must refuse, each with the words of its reason (measured on Debian's KAlgebra 22.12).
REFUSED = {
    "A-01": "real part",  # wants the text 1+-i; the Variables panel shows only real parts
    "B-02": "built-in constant",  # wants euler removed; no GUI removes a variable
    "B-04": "'color'",  # curve colour, resolution and 3D style are not in the AT-SPI state
    "B-05": "'res'",
    "B-06": "'style'",
    "C-09": "user-defined function",  # the plot is to call the script's r(2)
}
STEMS = sorted(p.stem for p in SRC.glob("*.json"))
CONVERTED = [s for s in STEMS if s not in REFUSED]
# one of each kind for the `coda eval` run: val, 2D eqn, 3D eqn, #SIZE, FAIL, ANS, a loaded script
EVAL_SAMPLE = ["sb_A-04", "sb_B-03", "sb_C-01", "sb_C-05", "sb_C-08", "sb_C-14", "sb_D-03"]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("sb")
    import_folder(SRC, out)
    return out


# ------------------------------------------------------------------------------------------ translation
def test_all_31_files_convert_or_are_refused_with_a_reason(out):
    assert len(STEMS) == 31
    report = json.loads((out / "import-report.json").read_text())
    status = {Path(r["file"]).stem: r for r in report["files"]}
    assert set(status) == set(STEMS)
    for stem, words in REFUSED.items():
        assert status[stem]["status"] == "refused", stem
        assert words in status[stem]["reason"], (stem, status[stem]["reason"])
    for stem in CONVERTED:
        r = status[stem]
        assert r["status"] == "converted" and r["oracle"] is True, r
        task = json.loads((out / r["to"]).read_text())
        assert task["origin"] == f"scienceboard:KAlgebra/{stem}" and task["id"] == f"sb_{stem}"
        assert task["solution"][-1] in ("DONE", "FAIL") or task["solution"][-1].startswith("ANS ")
        assert not any(op["func"] == "launch" for op in task.get("initialize", []))
    assert report["by_app"] == {"kalgebra": {"converted": len(CONVERTED), "refused": len(REFUSED)}}
    assert sorted(p.stem for p in (out / "kalgebra").glob("*.json")) == [f"sb_{s}" for s in CONVERTED]


def test_mapping_of_each_kind():
    t = {s: convert_file(SRC / f"{s}.json") for s in ("A-04", "B-03", "C-03", "C-05", "C-17", "C-01", "B-07")}
    assert t["A-04"]["initialize"] == [{"func": "tab", "index": 3}]
    assert t["A-04"]["evaluate"] == [{"type": "answer", "value": "FAIL"}]
    assert t["B-03"]["initialize"] == [{"func": "tab", "index": 1}, {"func": "func_2d", "expr": "q->6*sin(3*q)"}]
    assert t["B-03"]["evaluate"] == [{"type": "eqn", "count": 0}]
    assert t["C-03"]["evaluate"] == [{"type": "answer", "number": 46368.0, "tol": 1e-6}]
    assert t["C-05"]["initialize"] == [
        {"func": "write_file", "path": "script.kal", "content": "a := vector{-1, root(3, 3)}"}
    ]
    assert t["C-01"]["evaluate"] == [{"type": "val", "name": "p", "value": 1.58496250072, "tol": 1e-6}]
    eqn = t["C-17"]["evaluate"][0]  # (0, -0.0, 1) and (0, 0, 1) are both kept, each with its result
    assert eqn["dim"] == 3 and eqn["tol"] == 1e-4 and len(eqn["points"]) == 10
    assert [0, -0.0, 1, True] in eqn["points"] and [0, 0, 1, True] in eqn["points"]
    assert t["B-07"]["evaluate"][0]["points"][0] == [-21.11, -24.99, 10, False]


def _sb(**kw) -> dict:
    base = {
        "type": "KAlgebra",
        "instruction": "Do a thing in KAlgebra.",
        "steps": 5,
        "initialize": [{"func": "launch", "wait": 2.5, "command": "kalgebra", "shell": True}],
        "evaluate": [{"type": "val", "key": "p", "value": 1.0}],
    }
    return {**base, **kw}


@pytest.mark.parametrize(
    "path, words",
    [
        ("/etc/profile.d/x.sh", "outside the home folder"),
        ("/home/user/../../etc/x", "outside the home folder"),
        ("/root/script.kal", "outside the home folder"),
        ("script.kal", "not absolute"),
    ],
)
def test_touch_outside_home_is_refused(path, words):
    with pytest.raises(TaskError, match=words):
        convert(_sb(initialize=[{"func": "touch", "path": path, "text": "x := 1"}]), "t.json")


def test_var_undef_is_absent_and_unknown_checks_are_refused():
    task = convert(_sb(evaluate=[{"type": "var", "key": "q", "value": "#UNDEF"}]), "t.json")
    assert task["evaluate"] == [{"type": "var", "name": "q", "absent": True}]
    with pytest.raises(TaskError, match="no KAlgebra translation"):
        convert(_sb(evaluate=[{"type": "pixels", "key": "p", "value": 1}]), "t.json")
    with pytest.raises(TaskError, match="neither FAIL nor ANS"):
        convert(_sb(evaluate=[{"type": "stop", "value": "ANS", "args": ["1", "2"]}]), "t.json")


# ------------------------------------------------------------------------------------------ hostile files
def test_hostile_files_are_refused_and_not_run(tmp_path):
    """A shell `execute` op, a lambda with `__import__`/attribute access (as a core predicate): refused with
    the reason, and the sentinel their commands would create never appears (no TeXstudio or GRASS package is
    on main, so the hostile file is KAlgebra-typed)."""
    sentinel = tmp_path / "PWNED"
    shell = f"touch {sentinel}"
    src = tmp_path / "src"
    src.mkdir()
    hostile = {
        "exec.json": _sb(initialize=[{"func": "execute", "command": ["sh", "-c", shell], "shell": True}]),
        "lambda.json": _sb(
            evaluate=[{"type": "predicate", "expr": f"lambda dump: __import__('os').system({shell!r}) == 0"}]
        ),
        "attr.json": _sb(evaluate=[{"type": "predicate", "expr": "lambda dump: dump.__class__ == 1"}]),
    }
    for name, sb in hostile.items():
        (src / name).write_text(json.dumps(sb))
        with pytest.raises(TaskError) as e:
            convert(sb, name)
        assert "refused" in str(e.value) and "not run" in str(e.value)
    out = tmp_path / "out"
    report = import_folder(src, out)
    assert [r["status"] for r in report["files"]] == ["refused"] * 3
    assert not (out / "kalgebra").exists() or not list((out / "kalgebra").glob("*.json"))
    # the core's lambda translation refuses them too, before anything could evaluate them
    for expr in (hostile["lambda.json"]["evaluate"][0]["expr"], hostile["attr.json"]["evaluate"][0]["expr"]):
        with pytest.raises(CheckError):
            translate_lambda(expr)
    # their launch command is dropped, never kept to run: it appears nowhere in a converted task
    launched = convert(_sb(initialize=[{"func": "launch", "command": shell, "shell": True}]), "l.json")
    assert shell not in json.dumps(launched)
    assert not sentinel.exists()


# ------------------------------------------------------------------------------------------ real KAlgebra
@pytest.fixture(scope="module")
def sb_env(out):
    env = gym.make("coda/KAlgebra-v0", task_dirs=[str(out / "kalgebra")])
    yield env
    env.close()


@pytest.mark.parametrize("stem", CONVERTED)
def test_oracle_scores_one_and_done_zero(sb_env, stem):
    tid = f"sb_{stem}"
    rewards, term, trunc, info = run_solution(sb_env, tid)
    assert term and not trunc, info
    assert rewards[-1] == 1.0 and info["success"] is True, info.get("checks")
    obs, info = sb_env.reset(options={"task": tid})
    obs, r, term, trunc, info = sb_env.step("DONE")
    assert term and r == 0.0 and info["success"] is False, info.get("checks")


def test_coda_eval_oracle_names_the_origin(out, tmp_path, capsys):
    run = tmp_path / "run"
    rc = coda(
        [
            "eval",
            "--tasks-dir",
            str(out / "kalgebra"),
            "--agent",
            "oracle",
            "--tasks",
            *EVAL_SAMPLE,
            "--out",
            str(run),
            "--quiet",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    results = json.loads((run / "results.json").read_text())
    assert {e["task"] for e in results["episodes"]} == set(EVAL_SAMPLE)
    assert all(e["origin"] == f"scienceboard:KAlgebra/{e['task'][3:]}" and e["success"] for e in results["episodes"])
    assert results["summary"]["by_origin"] == {
        "scienceboard:KAlgebra": {"n": len(EVAL_SAMPLE), "success": len(EVAL_SAMPLE), "rate": 1.0}
    }
    assert "origin:scienceboard:KAlgebra" in capsys.readouterr().out
    assert "scienceboard:KAlgebra/C-05" in (run / "report" / "index.html").read_text()


def test_import_scienceboard_cli(tmp_path, capsys):
    out = tmp_path / "imported"
    assert coda(["import-scienceboard", str(SB_DIR), str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{'kalgebra':<12} converted {len(CONVERTED):>3}" in printed, printed
    assert sorted(p.stem for p in (out / "kalgebra").glob("*.json")) == [f"sb_{s}" for s in CONVERTED]
    report = json.loads((out / "import-report.json").read_text())
    kal = [r for r in report["files"] if r["file"].startswith("tasks/VM/KAlgebra/")]
    assert len(kal) == 31 and sum(r["status"] == "converted" for r in kal) == len(CONVERTED)
    assert report["by_app"]["kalgebra"]["converted"] == len(CONVERTED)
