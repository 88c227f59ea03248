"""Adding a backend or an app is one room (issue 27): a throwaway backend (a module and its table line,
nothing else) and a throwaway app with its own check type run through gym.make and `coda eval`; a desktop
built by the caller goes in through gym.make(desktop=...)."""

from __future__ import annotations

import json
import sys
import textwrap

import gymnasium as gym
import pytest

import coda_env  # noqa: F401
from coda_env.apps._fake import FAKE_TASKS, FakeApp
from coda_env.backends import BACKENDS, Backend
from coda_env.backends.fake import FakeDesktop
from coda_env.registry import AppSpec, CheckType, register_app, unregister_app

pytestmark = pytest.mark.fast


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """A backend module written to a folder on sys.path, its line in the table, and an app that uses it."""
    (tmp_path / "coda_throwaway_backend.py").write_text(
        textwrap.dedent("""
        from coda_env.backends.fake import FakeDesktop

        class ThrowawayDesktop(FakeDesktop):
            made = 0

        def make_desktop(width, height, sandbox=True, **options):
            ThrowawayDesktop.made += 1
            return ThrowawayDesktop(width, height, **options)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(BACKENDS, "throwaway", Backend("throwaway", "coda_throwaway_backend"))

    def seen(c, ctx):
        return ctx.state.get("clicks", 0) >= c["n"], f"{ctx.state.get('clicks')} clicks"

    tasks = [{**t, "app": "tapp", "id": "t_" + t["id"]} for t in FAKE_TASKS if t["id"] != "fake_click_twice"]
    tasks.append(
        {
            "id": "t_clicks",
            "app": "tapp",
            "instruction": "Click twice.",
            "steps": 4,
            "evaluate": [{"type": "tapp_seen", "n": 2}],
            "solution": ["pyautogui.click(1, 1)", "pyautogui.click(2, 2)", "DONE"],
        }
    )

    class TApp(FakeApp):
        name = "tapp"

    register_app(
        AppSpec(
            name="tapp",
            env_id="coda/Tapp-v0",
            adapter=TApp,
            tasks=tasks,
            checks=[CheckType("tapp_seen", seen, required={"n"})],
            env_kwargs={"backend": "throwaway", "settle_quiet": 0.0, "settle_timeout": 0.0},
        )
    )
    yield sys.modules.get("coda_throwaway_backend")
    unregister_app("tapp")


def test_a_throwaway_backend_and_app_run_through_gym_make(throwaway):
    env = gym.make("coda/Tapp-v0")
    try:
        assert type(env.unwrapped.desktop).__name__ == "ThrowawayDesktop"
        env.reset(options={"task": "t_clicks"})
        for a in ("pyautogui.click(1, 1)", "pyautogui.click(2, 2)"):
            env.step(a)
        obs, r, term, trunc, info = env.step("DONE")
        assert r == 1.0 and term, info
    finally:
        env.close()


def test_a_throwaway_backend_and_app_run_through_coda_eval(throwaway, tmp_path):
    from coda_agent.cli import main

    out = tmp_path / "run"
    rc = main(["eval", "--env", "coda/Tapp-v0", "--backend", "throwaway", "--agent", "oracle", "--out", str(out)])
    assert rc in (0, None)
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["overall"] == {"n": 4, "success": 4, "rate": 1.0}, results["summary"]
    assert throwaway.ThrowawayDesktop.made >= 1  # the eval's envs ran on the throwaway backend


def test_a_desktop_built_by_the_caller():
    from coda_env.apps._fake import register_fake

    register_fake()
    desk = FakeDesktop(1280, 800)
    env = gym.make("coda/Fake-v0", desktop=desk)
    try:
        assert env.unwrapped.desktop is desk
        env.reset(options={"task": "fake_answer"})
        assert env.step("ANS 7")[1] == 1.0
    finally:
        env.close()
