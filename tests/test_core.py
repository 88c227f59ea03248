"""The fast tier: the env loop, registry, checks, task sources, run folders and the `coda` command on the FAKE
desktop and scripted FAKE app (no X server). Real apps have their own suites (test_env, test_texstudio ...)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import coda_env
from coda_env.apps._fake import FakeApp, register_fake
from coda_env.backends.fake import FakeDesktop
from coda_env.checks import compile_predicate, run_checks, translate_lambda, validate_check
from coda_env.registry import (
    APPS,
    CHECKS,
    AppError,
    AppSpec,
    CheckContext,
    CheckError,
    CheckType,
    SetupError,
    confined,
    register_app,
    unregister_app,
)
from coda_env.runs import RunError, check_config, inside
from coda_env.tasks import TaskError, broken_tasks, load_tasks

pytestmark = pytest.mark.fast


@pytest.fixture(autouse=True)
def fake_app():
    register_fake()
    yield
    unregister_app("fake")


def make(**kw):
    return gym.make("coda/Fake-v0", **kw)


def play(env, task_id):
    obs, info = env.reset(options={"task": task_id})
    r, info = 0.0, {}
    for a in env.unwrapped.tasks[task_id].solution:
        obs, r, term, trunc, info = env.step(a)
        if term or trunc:
            break
    return r, info


# ------------------------------------------------------------------------------------------ the env loop
def test_fake_env_oracles_done_and_check_env():
    env = make()
    try:
        for tid in env.unwrapped.tasks:
            r, info = play(env, tid)
            assert r == 1.0 and info["success"], (tid, info)
            env.reset(options={"task": tid})
            _, r, term, _, info = env.step("DONE")
            assert term and r == 0.0 and info["success"] is False
        check_env(env.unwrapped)  # the default env passes as made (no timings in info)
    finally:
        env.close()


def test_observation_space_repr_is_readable():
    env = make()
    assert len(repr(env.observation_space)) < 200 and "characters" in repr(env.observation_space)
    env.close()


def test_timings_opt_in():
    env = make(info_timings=True)
    obs, info = env.reset(options={"task": "fake_type_42"})
    assert set(info["timings"]) >= {"desktop", "launch", "setup", "reset"}
    _, _, _, _, info = env.step("WAIT")
    assert "action" in info["timings"] and env.unwrapped.timings is info["timings"]
    env.close()


def test_app_crash_truncates_with_a_fresh_observation_and_reset_recovers():
    env = make()
    obs, _ = env.reset(options={"task": "fake_type_42"})
    env.unwrapped.desktop.crash_app()
    obs2, r, term, trunc, info = env.step("WAIT")
    assert trunc and not term and r == 0.0 and "fake exited" in info["error"]
    assert obs2["screenshot"] is not obs["screenshot"]  # never the previous step's object
    r, info = play(env, "fake_type_42")
    assert r == 1.0
    env.close()


def test_held_input_is_released_on_reset_and_episode_end():
    env = make()
    env.reset(options={"task": "fake_type_42"})
    env.step("pyautogui.keyDown('shift')\npyautogui.mouseDown(5, 5)")
    desk = env.unwrapped.desktop
    assert desk.pressed == {"shift"} and desk.buttons == {"left"}
    env.reset(options={"task": "fake_type_42"})
    assert not desk.pressed and not desk.buttons
    env.step("pyautogui.keyDown('ctrl')")
    env.step("DONE")
    assert not desk.pressed
    env.close()


def test_a_statement_the_desktop_refuses_names_itself_and_the_env_stays_usable():
    env = make(backend_options={"refuse_keys": ["f20"]})
    env.reset(options={"task": "fake_type_42"})
    _, r, term, trunc, info = env.step(
        "pyautogui.keyDown('shift')\npyautogui.write('4')\npyautogui.press('f20')\npyautogui.write('2')"
    )
    err = info["action_error"]
    assert "statement 3 of 4" in err and "press('f20')" in err and "statements 1-2 ran" in err, err
    assert not env.unwrapped.desktop.pressed  # the held shift was released
    assert not (term or trunc)
    assert env.step("pyautogui.write('2')\npyautogui.press('enter')")[4]["action_error"] is None
    _, r, *_ = env.step("DONE")
    assert r == 1.0  # '4' then '2': statement 4 never ran
    env.close()


def test_the_screen_settles_between_the_statements_of_one_action():
    """A key sent the instant after a click reached KAlgebra before it had handled the click (a click, ctrl+a,
    backspace erased one character, 1 time in 5): the env looks at the screen between statements."""
    env = make()
    env.reset(options={"task": "fake_type_42"})
    desk = env.unwrapped.desktop
    log: list[str] = []
    shot, inp = desk.screenshot, desk.input
    desk.screenshot = lambda: log.append("shot") or shot()
    desk.input = lambda a: log.append(a.kind) or inp(a)
    try:
        env.step("pyautogui.click(5, 5)\npyautogui.hotkey('ctrl', 'a')\npyautogui.press('backspace')")
    finally:
        env.close()  # also when an assertion below would fail: no folder left behind
    kinds = [e for e in log if e != "shot"]
    assert kinds == ["click", "hotkey", "press"], log
    for a, b in zip(kinds, kinds[1:]):
        between = log[log.index(a) + 1 : log.index(b)]
        assert "shot" in between, (a, b, log)


def test_structured_samples_never_raise():
    env = make(action_mode="structured")
    env.reset(options={"task": "fake_click_twice"}, seed=0)
    env.action_space.seed(0)
    for _ in range(300):
        _, _, term, trunc, info = env.step(env.action_space.sample())
        if term or trunc:
            env.reset(options={"task": "fake_click_twice"})
    env.close()


# ------------------------------------------------------------------------------------------ the registry
def test_a_throwaway_app_package_runs_through_gym_make(tmp_path):
    """An app added at test time, with its own check type and task, needs no core file."""
    calls = []

    def lucky(c, ctx):
        calls.append(c)
        return ctx.state["value"] == c["number"], f"value {ctx.state['value']!r}"

    register_app(
        AppSpec(
            name="throwaway",
            env_id="coda/Throwaway-v0",
            adapter=FakeApp,
            checks=[CheckType("lucky", lucky, lambda c: None, (frozenset({"number"}), frozenset()))],
            tasks=[
                {
                    "id": "t1",
                    "app": "throwaway",
                    "instruction": "Type 7, Enter.",
                    "steps": 3,
                    "evaluate": [{"type": "lucky", "number": "7"}],
                    "solution": ["pyautogui.write('7')", "pyautogui.press('enter')", "DONE"],
                }
            ],
            env_kwargs={"backend": "fake"},
        )
    )
    try:
        assert "coda/Throwaway-v0" in coda_env.envs()
        env = gym.make("coda/Throwaway-v0")
        r, info = play(env, "t1")
        assert r == 1.0 and calls and info["checks"][0]["type"] == "lucky"
        env.close()
    finally:
        unregister_app("throwaway")
    assert "lucky" not in CHECKS and "throwaway" not in APPS


def test_check_type_names_are_one_namespace():
    with pytest.raises(ValueError, match="already registered"):
        register_app(
            AppSpec(
                name="clash",
                env_id="coda/Clash-v0",
                adapter=FakeApp,
                checks=[CheckType("answer", lambda c, x: (True, ""))],
            )
        )
    unregister_app("clash")


def test_missing_app_is_one_clear_error():
    register_app(
        AppSpec(
            name="absent",
            env_id="coda/Absent-v0",
            adapter=FakeApp,
            tasks=[
                {
                    "id": "a",
                    "app": "absent",
                    "instruction": "x",
                    "steps": 1,
                    "evaluate": [{"type": "answer", "value": "x"}],
                }
            ],
            available=lambda: "absent-app is not installed: install it, or use backend='libvirt'",
        )
    )
    try:
        with pytest.raises(AppError, match="coda/Absent-v0 cannot run here: absent-app is not installed"):
            gym.make("coda/Absent-v0")
    finally:
        unregister_app("absent")


# ------------------------------------------------------------------------------------------ checks
@pytest.mark.parametrize(
    "expr,state,want",
    [
        ("state['a']['b'] == 3", {"a": {"b": 3}}, True),
        ("len(state['xs']) >= 2 and 'q' in state['xs']", {"xs": ["p", "q"]}, True),
        ("abs(state['v'] - 2.5) < 0.1", {"v": 2.45}, True),
        ("lower(state['m']) == 'pan'", {"m": "PAN"}, True),
        ("max(state['xs'][1:]) if state['xs'] else 0", {"xs": [1, 5, 3]}, 5),
        ("answer == '4'", {}, False),
    ],
)
def test_predicates(expr, state, want):
    assert compile_predicate(expr)(state, None) == want


@pytest.mark.parametrize(
    "expr,why",
    [
        ("__import__('os').system('touch /tmp/x')", "only calls of"),
        ("state.__class__", "attribute access"),
        ("open('/etc/passwd')", "only calls of"),
        ("[x for x in state]", "ListComp"),
        ("lambda: 1", "Lambda"),
        ("os", "unknown name"),
        ("state['a'] ** 99999", "operator Pow"),
        ("(yield 1)", "Yield"),
        ("f'{state}'", "JoinedStr"),
        ("1 +", "not an expression"),
    ],
)
def test_predicates_outside_the_whitelist_are_refused(expr, why):
    with pytest.raises(CheckError, match=why):
        compile_predicate(expr)


def test_translate_lambda_and_hostile_lambdas_never_run(tmp_path):
    assert translate_lambda("lambda dump: dump['statusbar']['mode'] == 'Pan'") == "state['statusbar']['mode'] == 'Pan'"
    assert translate_lambda("lambda d: d['x'].lower() == 'a'") == "lower(state['x']) == 'a'"
    sentinel = tmp_path / "ran"
    for src in [
        f"lambda d: __import__('os').system('touch {sentinel}')",
        f"lambda d: open('{sentinel}', 'w')",
        "lambda d: d.__class__.__bases__",
        "lambda d, e=print: e(d)",
        f"(lambda: __import__('os').system('touch {sentinel}'))()",
    ]:
        with pytest.raises(CheckError):
            translate_lambda(src)
    assert not sentinel.exists()


def test_repetition_and_sizes_are_bounded():
    with pytest.raises(ValueError, match="too large"):
        compile_predicate("'a' * 1000000000")({}, None)


def test_catastrophic_regex_fails_the_check_in_time(tmp_path):
    (tmp_path / "f.txt").write_text("a" * 60 + "b")
    ctx = CheckContext(answer=None, desktop=FakeDesktop(), home=str(tmp_path))
    check = {"type": "include", "path": "f.txt", "pattern": "(a|aa)+$"}
    validate_check(check)
    t0 = time.monotonic()
    ok, results = run_checks([check], ctx)
    assert not ok and "did not finish" in results[0].detail and time.monotonic() - t0 < 30


def test_any_exception_in_a_check_fails_it_with_a_detail():
    def boom(exc):
        def run(c, ctx):
            raise exc

        return run

    for i, exc in enumerate(
        [
            OverflowError("big"),
            RecursionError("deep"),
            ZeroDivisionError("z"),
            KeyError("k"),
            AttributeError("a"),
            MemoryError(),
        ]
    ):
        CHECKS[f"boom{i}"] = CheckType(f"boom{i}", boom(exc))
        try:
            ok, results = run_checks([{"type": f"boom{i}"}], {})
            assert not ok and "could not evaluate" in results[0].detail and type(exc).__name__ in results[0].detail
        finally:
            del CHECKS[f"boom{i}"]


@pytest.mark.parametrize(
    "check,state,answer,ok",
    [
        ({"type": "state", "path": "flag", "value": 1}, {"flag": True}, None, False),  # True is not 1
        ({"type": "state", "path": "n", "value": "1"}, {"n": 1}, None, False),  # "1" is not 1
        ({"type": "state", "path": "n", "value": 1.5}, {"n": float("nan")}, None, False),
        ({"type": "state", "path": "a.0.b", "value": 2}, {"a": [{"b": 2}]}, None, True),
        ({"type": "state", "path": "a.9", "value": 2}, {"a": [1]}, None, False),
        ({"type": "answer", "number": 7}, {}, "nan", False),
        ({"type": "answer", "number": 7}, {}, "inf", False),
        ({"type": "answer", "number": 7}, {}, "7_0", False),
        ({"type": "answer", "number": 7}, {}, " 7.0 ", True),
        ({"type": "answer", "value": "FAIL"}, {}, None, False),
        ({"type": "predicate", "expr": "state['a']"}, {"a": "yes"}, None, False),  # truthy is not True
        ({"type": "predicate", "expr": "state['a'] > 1"}, {}, None, False),  # empty state
        ({"type": "val", "name": "a", "value": 81}, {"variables": {"a": "x->81"}}, None, False),  # a function
        ({"type": "val", "name": "a", "value": 81}, {"variables": {"a": "81"}}, None, True),
        ({"type": "val", "name": "a", "value": 2}, {"variables": {"a": "x=2"}}, None, False),  # an equation
        ({"type": "val", "name": "a", "value": 2}, {"variables": {"a": "y*2"}}, None, False),  # unbound name
        ({"type": "val", "name": "a", "value": 1}, {"variables": {"a": "list{1}"}}, None, False),
        ({"type": "val", "name": "a", "value": 1}, {"variables": "oops"}, None, False),
        ({"type": "var", "name": "a", "value": "1"}, {"variables": {"a": 1}}, None, False),
    ],
)
def test_no_type_confusion(check, state, answer, ok):
    validate_check(check)
    assert run_checks([check], state, answer)[0] is ok


@pytest.mark.parametrize(
    "check,msg",
    [
        ({"type": "answer", "number": float("nan")}, "finite"),
        ({"type": "answer", "number": 1, "tol": float("inf")}, "tol"),
        ({"type": "answer", "number": 1, "tol": -1}, "tol"),
        ({"type": "answer", "number": True}, "finite"),
        ({"type": "val", "name": "a", "value": float("inf")}, "finite"),
        ({"type": "file", "path": "a"}, "exactly one"),
        ({"type": "file", "path": "a", "sha256": "xyz"}, "hex"),
        ({"type": "include", "pattern": "a"}, "exactly one of path or state"),
        ({"type": "include", "path": "a", "pattern": "a", "count": -1}, "count"),
        ({"type": "state", "path": 3, "value": 1}, "string"),
    ],
)
def test_check_fields_are_validated_on_load(check, msg):
    with pytest.raises(CheckError, match=msg):
        validate_check(check)


# ------------------------------------------------------------------------------------------ task files
GOOD = {
    "id": "mine",
    "app": "fake",
    "instruction": "Type 5, Enter.",
    "steps": 3,
    "evaluate": [{"type": "state", "path": "value", "value": "5"}],
    "solution": ["pyautogui.write('5')", "pyautogui.press('enter')", "DONE"],
}


def test_user_task_folders(tmp_path, monkeypatch):
    d = tmp_path / "mine"
    (d / "fake").mkdir(parents=True)
    (d / "fake" / "mine.json").write_text(json.dumps(GOOD))
    (d / "other.json").write_text(
        json.dumps({**GOOD, "id": "k1", "app": "kalgebra", "evaluate": [{"type": "var", "name": "a", "value": "1"}]})
    )
    assert "mine" in load_tasks("fake", [d]) and "k1" not in load_tasks("fake", [d])
    monkeypatch.setenv("CODA_TASKS_PATH", str(d))
    assert "mine" in load_tasks("fake")
    env = make()
    assert play(env, "mine")[0] == 1.0
    env.close()
    monkeypatch.delenv("CODA_TASKS_PATH")
    env = make(task_dirs=[str(d)])
    assert play(env, "mine")[0] == 1.0
    env.close()


def test_duplicate_id_names_both_files(tmp_path):
    (tmp_path / "dup.json").write_text(json.dumps({**GOOD, "id": "fake_type_42"}))
    with pytest.raises(TaskError, match=r"dup\.json.*'fake_type_42' is also used by <fake task 0>"):
        load_tasks("fake", [tmp_path])


def test_a_broken_file_is_reported_and_the_rest_load(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps(GOOD))
    (tmp_path / "bad.json").write_text(json.dumps({**GOOD, "id": "bad", "steps": 0}))
    (tmp_path / "latin1.json").write_bytes(b'{"id": "\xe9"}')
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "nan.json").write_text(json.dumps(GOOD).replace('"value": "5"', '"value": NaN'))
    tasks, broken = load_tasks("fake", [tmp_path]), broken_tasks("fake", [tmp_path])
    assert "mine" in tasks
    reasons = {Path(k).name: v for k, v in broken.items()}
    assert "1..100" in reasons["bad.json"]
    assert "not UTF-8" in reasons["latin1.json"]
    assert "nested too deeply" in reasons["deep.json"] or "JSON object" in reasons["deep.json"]
    assert "NaN is not a number JSON allows" in reasons["nan.json"]
    env = make(task_dirs=[str(tmp_path)])  # gym.make still works
    env.close()


def test_setup_files_stay_in_the_apps_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert confined(str(home), "a/b.txt") == str(home / "a" / "b.txt")
    for bad in ("/etc/passwd", "../x", "a/../../x", "~/x", ""):
        with pytest.raises(SetupError):
            confined(str(home), bad)
    (home / "link").symlink_to(tmp_path)
    with pytest.raises(SetupError, match="leaves"):
        confined(str(home), "link/x")


# ------------------------------------------------------------------------------------------ run folders
def test_run_paths_stay_inside(tmp_path):
    assert inside(tmp_path, "trajectories", "a__0") == tmp_path.resolve() / "trajectories" / "a__0"
    with pytest.raises(RunError):
        inside(tmp_path, "trajectories", "../../etc__0")


def test_a_run_folder_resumes_only_its_own_configuration(tmp_path):
    check_config(tmp_path, {"agent": "oracle", "tasks": ["a"]})
    check_config(tmp_path, {"agent": "oracle", "tasks": ["a"]})
    with pytest.raises(RunError, match=r"agent: 'oracle' -> 'random'"):
        check_config(tmp_path, {"agent": "random", "tasks": ["a"]})


# ------------------------------------------------------------------------------------------ coda eval on the fake
def test_coda_eval_report_and_refusals(tmp_path, capsys):
    from coda_agent.cli import main

    out = tmp_path / "run"
    assert main(["eval", "--env", "coda/Fake-v0", "--agent", "oracle", "--out", str(out), "--quiet"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["overall"]["rate"] == 1.0
    page = (out / "report" / "fake_type_42__0.html").read_text()
    assert "Type 42 in the field and press Enter." in page
    assert "<a href='../trajectories/fake_type_42__0/step_001.png'><img" in page
    # another agent on the same --out: refused, naming what differs
    assert main(["eval", "--env", "coda/Fake-v0", "--agent", "done", "--out", str(out), "--quiet"]) == 2
    assert "agent: 'oracle' -> 'done'" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "--env",
                "coda/Fake-v0",
                "--agent",
                "oracle",
                "--tasks",
                "fake_answer",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 2
    )
    # an unknown task: a clean error, and no empty --out left behind
    fresh = tmp_path / "fresh"
    assert main(["eval", "--env", "coda/Fake-v0", "--tasks", "nope", "--out", str(fresh), "--quiet"]) == 2
    assert "unknown task" in capsys.readouterr().err and not fresh.exists()
    # --out that is a file
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["eval", "--env", "coda/Fake-v0", "--out", str(f), "--quiet"]) == 2
    assert "is an existing file" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["tasks", "kalgebr"], "did you mean kalgebra"),
        (["eval", "--env", "coda/KAlgebr-v0", "--quiet"], "Did you mean: `KAlgebra`"),
        (["eval", "--agent", "nope"], "invalid choice: 'nope'"),
        (["eval", "--env", "coda/Nope-v0"], "doesn't exist"),
    ],
)
def test_cli_errors_are_one_line(argv, msg, capsys):
    from coda_agent.cli import main

    with pytest.raises(SystemExit) if argv[:2] == ["eval", "--agent"] else _nothing():
        rc = main(argv)
        assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_every_flag_has_help_with_its_default(capsys):
    from coda_agent.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: coda/KAlgebra-v0)" in text and "(default: 1)" in text
    for flag in ("--tasks-dir", "--judge", "--num-envs", "--out"):
        assert flag in text


def test_coda_tasks_lists_broken_files(tmp_path, capsys):
    from coda_agent.cli import main

    (tmp_path / "bad.json").write_text(json.dumps({**GOOD, "id": "bad", "steps": 0}))
    assert main(["tasks", "fake", "--tasks-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fake_type_42" in out and "1 broken task file" in out and "bad.json" in out


def test_every_app_and_backend_conforms_to_its_protocol():
    from coda_env.backends.base import Desktop
    from coda_env.backends.fake import FakeDesktop
    from coda_env.backends.libvirt import LibvirtDesktop
    from coda_env.backends.local import LocalDesktop
    from coda_env.registry import App

    app_members = (
        [m for m in App.__protocol_attrs__ if not m.startswith("_")]
        if hasattr(App, "__protocol_attrs__")
        else ["name", "launch", "ready", "state", "a11y_text", "close"]
    )
    for name, spec in APPS.items():
        adapter = spec.adapter()
        missing = [m for m in app_members if not hasattr(adapter, m)]
        assert not missing, f"app {name} lacks {missing}"
    desk_members = sorted(set(Desktop.__annotations__) | {m for m in vars(Desktop) if not m.startswith("_")})
    for cls in (LocalDesktop, LibvirtDesktop, FakeDesktop):
        missing = [m for m in desk_members if m not in ("width", "height") and not hasattr(cls, m)]
        assert not missing, f"{cls.__name__} lacks {missing}"
        assert isinstance(cls.capabilities, frozenset) and cls.capabilities <= {"a11y", "snapshots"}


def test_a_task_may_need_two_apps_on_one_desktop():
    class Second(FakeApp):
        name = "second"

        def launch(self, ctx):
            self.proc = ctx.desktop.spawn(["second-app"])
            return self.proc

        def state(self, desktop):
            return {"running": self.proc is not None and self.proc.poll() is None}

    register_app(AppSpec(name="second", env_id="coda/Second-v0", adapter=Second, env_kwargs={"backend": "fake"}))
    register_fake(
        [
            *__import__("coda_env.apps._fake", fromlist=["FAKE_TASKS"]).FAKE_TASKS,
            {
                "id": "both",
                "app": "fake",
                "apps": ["second"],
                "instruction": "Type 1, Enter.",
                "steps": 3,
                "evaluate": [
                    {"type": "state", "path": "value", "value": "1"},
                    {"type": "state", "app": "second", "path": "running", "value": True},
                ],
                "solution": ["pyautogui.write('1')", "pyautogui.press('enter')", "DONE"],
            },
        ]
    )
    try:
        env = make()
        r, info = play(env, "both")
        assert r == 1.0 and len(info["checks"]) == 2, info
        assert set(env.unwrapped.procs) == {"fake", "second"}
        env.unwrapped.procs["second"].kill()  # the second app dies: the episode says which
        env.reset(options={"task": "both"})
        env.unwrapped.procs["second"].kill()
        _, _, _, trunc, info = env.step("WAIT")
        assert trunc and "second exited" in info["error"]
        env.close()
    finally:
        unregister_app("second")
