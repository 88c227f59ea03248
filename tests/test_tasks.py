"""Task files: the shipped suite loads; malformed files fail naming the file, the field and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coda_env.tasks import TaskError, load_task_file, load_tasks

pytestmark = pytest.mark.fast  # pure logic: no X server

GOOD = {
    "id": "t",
    "app": "kalgebra",
    "instruction": "Do it.",
    "steps": 3,
    "evaluate": [{"type": "var", "name": "a", "value": "1"}],
    "solution": ["DONE"],
}


def test_shipped_suite_loads():
    tasks = load_tasks("kalgebra")
    assert len(tasks) >= 25
    for t in tasks.values():
        assert t.solution and t.solution[-1].split()[0] in ("DONE", "FAIL", "ANS"), t.id
        assert t.difficulty in ("easy", "medium", "hard")
    assert {t.difficulty for t in tasks.values()} == {"easy", "medium", "hard"}


@pytest.mark.parametrize(
    "patch,field,problem",
    [
        ({"steps": "3"}, "steps", "must be int"),
        ({"steps": 0}, "steps", "1..100"),
        ({"steps": True}, "steps", "must be int"),
        ({"instruction": "  "}, "instruction", "empty"),
        ({"evaluate": []}, "evaluate", "at least one"),
        ({"evaluate": [{"type": "bogus"}]}, "evaluate[0]", "unknown check type"),
        ({"solution": ["import os"]}, "solution[0]", "not a valid action"),
        ({"solution": [3]}, "solution[0]", "action string"),
        ({"initialize": [{"expr": "x"}]}, "initialize[0]", "func"),
        ({"initialize": [{"func": "nope"}]}, "initialize[0]", "unknown setup operation"),
        ({"initialize": [{"func": "console"}]}, "initialize[0]", "lacks expr"),
        ({"initialize": [{"func": "console", "expr": 3}]}, "initialize[0]", "'expr' must be"),
        ({"initialize": [{"func": "write_file", "path": "/etc/x", "content": "x"}]}, "initialize[0]", "relative"),
        ({"initialize": [{"func": "write_file", "path": "../x", "content": "x"}]}, "initialize[0]", "leaves"),
        ({"evaluate": [{"type": "val", "name": "a", "value": 1, "tol": -1}]}, "evaluate[0]", "tol"),
        ({"evaluate": [{"type": "val", "name": "a", "value": "81"}]}, "evaluate[0]", "numeric"),
        ({"evaluate": [{"type": "answer", "number": 1, "tol": "x"}]}, "evaluate[0]", "tol"),
        ({"evaluate": [{"type": "predicate", "expr": "__import__('os')"}]}, "evaluate[0]", "only calls of"),
        ({"evaluate": [{"type": "include", "path": "a", "pattern": "("}]}, "evaluate[0]", "not a valid regular"),
        ({"id": "../escape"}, "id", "letters, digits"),
        ({"id": "a/b"}, "id", "letters, digits"),
        ({"instruction": "x" * 10_001}, "instruction", "max 10000"),
        ({"apps": ["nope"]}, "apps[0]", "not another known app"),
        ({"difficulty": "insane"}, "difficulty", "one of"),
        ({"colour": "red"}, "colour", "not a task field"),
        ({"id": None}, "id", "must be str"),
    ],
)
def test_malformed_task_names_file_field_problem(tmp_path, patch, field, problem):
    data = {**GOOD, **patch}
    f = tmp_path / "broken.json"
    f.write_text(json.dumps(data))
    with pytest.raises(TaskError) as e:
        load_task_file(f)
    msg = str(e.value)
    assert str(f) in msg and repr(field) in msg and problem in msg, msg


def test_missing_field_and_bad_json(tmp_path):
    f = tmp_path / "a.json"
    f.write_text(json.dumps({k: v for k, v in GOOD.items() if k != "evaluate"}))
    with pytest.raises(TaskError, match=r"a\.json: field 'evaluate': is required"):
        load_task_file(f)
    f.write_text("{not json")
    with pytest.raises(TaskError, match=r"a\.json: not valid JSON"):
        load_task_file(f)
    f.write_text("[1, 2]")
    with pytest.raises(TaskError, match="JSON object"):
        load_task_file(f)
    with pytest.raises(TaskError, match="cannot read"):
        load_task_file(tmp_path / "missing.json")


def test_unknown_app():
    from coda_env.registry import AppError

    with pytest.raises(AppError, match="unknown app 'no-such-app'; known apps: .*kalgebra"):
        load_tasks("no-such-app")


# ------------------------------------------------------------------------------------------ the hostile corpus
HOSTILE = Path(__file__).resolve().parent / "hostile_tasks"
# file -> (the field the refusal names, words of the reason). Each file's `note` says what it would do.
REFUSED = {
    "chimerax_info_models_savefile": (
        "evaluate[0]",
        "resolves to info models's keyword 'saveFile', which writes a file",
    ),
    "chimerax_hbonds_savefile": ("initialize[1]", "resolves to hbonds's keyword 'saveFile', which writes a file"),
    "chimerax_contacts_savefile": ("initialize[1]", "'save_file' in 'contacts /A save_file"),
    "chimerax_runscript_abbreviated": ("initialize[1]", "'runs' is not a full ChimeraX command name"),
    "chimerax_open_python": ("initialize[1]", "ChimeraX command 'open' is not allowed"),
    "chimerax_color_image_file": ("initialize[1]", "'color image' is not allowed in a task file: it reads"),
    "chimerax_info_notify_url": ("initialize[1]", "'info notify start' is not allowed in a task file"),
    "chimerax_wait_forever": ("initialize[1]", "frames to wait must be finite and at most 600"),
    "chimerax_save_outside_home": ("initialize[1]", "has '..'"),
    "chimerax_file_check_absolute": ("evaluate[0]", "must be relative to the app's home folder"),
    "chimerax_image_width_infinite": ("evaluate[0]", "'width' must be an integer in [1, 20000]"),
    "grass_db_database_file": ("evaluate[0]", "option 'database' is refused"),
    "grass_db_driver": ("evaluate[0]", "option 'driver' is refused"),
    "grass_findfile_climbs": ("evaluate[0]", "element='../../../../etc' must be a plain GRASS name"),
    "grass_findfile_absolute": ("evaluate[0]", "file='/etc/hostname' must be a plain GRASS name"),
    "grass_scale_infinite": ("initialize[0]", "'scale' (the n of 1:n) must be a finite number"),
    "grass_stats_nsteps_huge": ("evaluate[0]", "nsteps= must be an integer in [1, 10000]"),
    "core_file_etc_hostname": ("evaluate[0]", "'/etc/hostname' must be relative to the app's home folder"),
    "core_file_climbs": ("evaluate[0]", "has '..'"),
    "core_include_absolute": ("evaluate[0]", "'/etc/passwd' must be relative"),
    "core_write_file_climbs": ("initialize[0]", "has '..'"),
    "core_include_count_huge": ("evaluate[0]", "count must be an integer in [0, 2e+06]"),
    "core_answer_infinite": ("evaluate[0]", "number must be a finite number"),
    "kalgebra_val_tolerance_infinite": ("evaluate[0]", "'tol' must be a finite number"),
}


def test_the_hostile_corpus_is_complete():
    assert sorted(p.stem for p in HOSTILE.glob("*.json")) == sorted(REFUSED)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_hostile_task_file_is_refused_on_load_naming_file_and_field(name):
    f = HOSTILE / f"{name}.json"
    field, words = REFUSED[name]
    with pytest.raises(TaskError) as e:
        load_task_file(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: field {field!r}: ") and words in msg, msg


def test_hostile_files_in_a_task_folder_are_left_out_with_the_reason():
    from coda_env.tasks import broken_tasks

    for app in ("chimerax", "grass", "kalgebra"):
        names = {n for n in REFUSED if n.startswith(app) or (app == "kalgebra" and n.startswith("core"))}
        assert not [t for t in load_tasks(app, task_dirs=[HOSTILE]) if t.startswith("hostile_")]
        broken = broken_tasks(app, task_dirs=[HOSTILE])
        assert {Path(p).stem for p in broken} == names
        assert all(REFUSED[Path(p).stem][1] in why for p, why in broken.items())


def test_a_path_of_the_home_still_loads():
    data = {
        **GOOD,
        "initialize": [{"func": "write_file", "path": "notes/a.txt", "content": "x"}],
        "evaluate": [
            {"type": "file", "path": "notes/a.txt", "exists": True},
            {"type": "include", "path": "./notes/a.txt", "pattern": "x", "count": 1},
        ],
    }
    from coda_env.tasks import parse_task

    assert parse_task(data, "ok.json").id == "t"
