"""Task files: the shipped suite loads; malformed files fail naming the file, the field and the problem."""
from __future__ import annotations

import json

import pytest

from coda_env.tasks import TaskError, load_task_file, load_tasks

pytestmark = pytest.mark.fast  # pure logic: no X server

GOOD = {"id": "t", "app": "kalgebra", "instruction": "Do it.", "steps": 3,
        "evaluate": [{"type": "var", "name": "a", "value": "1"}], "solution": ["DONE"]}


def test_shipped_suite_loads():
    tasks = load_tasks("kalgebra")
    assert len(tasks) >= 25
    for t in tasks.values():
        assert t.solution and t.solution[-1].split()[0] in ("DONE", "FAIL", "ANS"), t.id
        assert t.difficulty in ("easy", "medium", "hard")
    assert {t.difficulty for t in tasks.values()} == {"easy", "medium", "hard"}


@pytest.mark.parametrize("patch,field,problem", [
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
])
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
