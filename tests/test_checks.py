"""Programmatic checks and the KAlgebra expression parser: no eval, clear failures."""

from __future__ import annotations

import math

import pytest

from coda_env.apps.kalgebra.checks import MathExpr
from coda_env.checks import CheckError, run_checks, validate_check

pytestmark = pytest.mark.fast  # pure logic: no X server

STATE = {
    "tab": "2D Graph",
    "variables": {"a": "81", "b": "0.333333333333", "s": "x->x^2"},
    "functions_2d": [{"name": "f1", "expression": "x->sin(x)"}, {"name": "f2", "expression": "x^2+y^2=4"}],
    "function_3d": "(x,y)->x*y",
    "console_input": "",
    "dictionary_query": None,
}


@pytest.mark.parametrize(
    "text,env,want",
    [
        ("2+3*4", {}, 14),
        ("2^10", {}, 1024),
        ("2x+1", {"x": 3}, 7),
        ("3(x+1)", {"x": 1}, 6),
        ("x->sin(x)^2", {"x": math.pi / 2}, 1.0),
        ("(x,y)->x*y", {"x": 2, "y": 5}, 10),
        ("root(27, 3)", {}, 3.0),
        ("sqrt(16)", {}, 4.0),
        ("-2^2", {}, -4),
        ("factorial(5)", {}, 120),
        ("ln(e)", {}, 1.0),
        ("abs(-3)+1.5e1", {}, 18),
        ("pi", {}, math.pi),
        (".5*4", {}, 2.0),
    ],
)
def test_math_expr_values(text, env, want):
    assert MathExpr(text).value(env) == pytest.approx(want)


@pytest.mark.parametrize(
    "text", ["__import__('os')", "x.y", "open(1)", "f(x)", "2+", "x" * 3000, "2 $ 3", "lambda: 1", "[1,2]", "a;b", "2^"]
)
def test_math_expr_rejects(text):
    with pytest.raises(ValueError):
        MathExpr(text).value({"x": 1})


def test_math_expr_equation_sides():
    f = MathExpr("x^2+y^2=4")
    assert f.equation and f.sides({"x": 2, "y": 0}) == (4, 4)


def test_huge_factorial_does_not_hang():
    assert MathExpr("factorial(100000000)").value({}) == math.inf


@pytest.mark.parametrize(
    "check,ok",
    [
        ({"type": "var", "name": "a", "value": "81"}, True),
        ({"type": "var", "name": "a", "value": "82"}, False),
        ({"type": "var", "name": "z", "absent": True}, True),
        ({"type": "var", "name": "a", "absent": True}, False),
        ({"type": "val", "name": "a", "value": 81}, True),
        ({"type": "val", "name": "a", "value": 81.00001}, False),
        ({"type": "val", "name": "b", "value": 1 / 3, "tol": 1e-9}, True),
        ({"type": "val", "name": "s", "value": 1}, False),  # a function is not a number: fails, no crash
        ({"type": "val", "name": "missing", "value": 1}, False),
        ({"type": "eqn", "dim": 2, "points": [[0, 0, True], [math.pi / 2, 1, True], [0, 1, False]]}, True),
        ({"type": "eqn", "dim": 2, "points": [[2, 0, True], [0, 2, True], [1, 1, False]]}, True),
        ({"type": "eqn", "dim": 2, "points": [[0, 5, True]]}, False),
        ({"type": "eqn", "dim": 2, "count": 2}, True),
        ({"type": "eqn", "dim": 2, "count": 1}, False),
        ({"type": "eqn", "dim": 3, "points": [[2, 3, 6, True], [1, 1, 2, False]]}, True),
        ({"type": "state", "path": "tab", "value": "2D Graph"}, True),
        ({"type": "state", "path": "tab", "value": "Calculator"}, False),
    ],
)
def test_checks_against_state(check, ok):
    validate_check(check)
    passed, results = run_checks([check], STATE, None)
    assert passed is ok and results[0].detail


def test_answer_checks():
    assert run_checks([{"type": "answer", "value": "42"}], STATE, " 42 ")[0]
    assert not run_checks([{"type": "answer", "value": "42"}], STATE, "43")[0]
    assert run_checks([{"type": "answer", "number": 0.5, "tol": 1e-3}], STATE, "0.5004")[0]
    assert not run_checks([{"type": "answer", "number": 0.5}], STATE, "half")[0]
    assert not run_checks([{"type": "answer", "number": 0.5}], STATE, None)[0]


def test_all_checks_must_pass_and_empty_fails():
    good, bad = {"type": "var", "name": "a", "value": "81"}, {"type": "var", "name": "a", "value": "1"}
    assert run_checks([good, good], STATE, None)[0]
    assert not run_checks([good, bad], STATE, None)[0]
    assert not run_checks([], STATE, None)[0]


@pytest.mark.parametrize(
    "check,msg",
    [
        ({"type": "nope"}, "unknown check type"),
        ({"type": "var"}, "lacks"),
        ({"type": "var", "name": "a", "value": 1, "extra": 2}, "unknown fields"),
        ({"type": "val", "name": "a", "value": "x"}, "numeric"),
        ({"type": "eqn", "dim": 2}, "points or count"),
        ({"type": "eqn", "dim": 4, "count": 1}, "dim"),
        ({"type": "eqn", "dim": 2, "points": [[1, True]]}, "point"),
        ("var", "object"),
    ],
)
def test_validate_check_errors(check, msg):
    with pytest.raises(CheckError, match=msg):
        validate_check(check)
