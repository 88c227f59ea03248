"""A FAKE app for fast tests: a text field that typing fills and Enter submits, and a click counter, on the
fake desktop (`coda_env.backends.fake`). Not a model of any real application: every real app has its own
end-to-end suite on a real desktop. `register_fake()` registers it as `coda/Fake-v0` (backend "fake") with a
few inline tasks; `import coda_env` does not (app packages whose names start with "_" are not loaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ...backends.fake import FakeDesktop, FakeProcess
from ...families import Family
from ...registry import AppError, AppSpec, CheckType, LaunchContext, register_app


class FakeApp:
    """A scripted app (a FAKE): a text field and a click counter on a FakeDesktop."""

    name = "fake"

    def __init__(self) -> None:
        self.proc: FakeProcess | None = None

    def launch(self, ctx: LaunchContext) -> FakeProcess:
        if not isinstance(ctx.desktop, FakeDesktop):
            raise AppError("the fake app runs only on the fake backend (backend='fake')")
        ctx.desktop.app = {"text": "", "submitted": [], "clicks": 0, "opened": [Path(f).name for f in ctx.open_files]}
        self.proc = ctx.desktop.spawn(["fake-app"])
        return self.proc

    def ready(self, desktop: FakeDesktop) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AppError("the fake app exited while starting")
        return bool(desktop.windows())

    def state(self, desktop: FakeDesktop) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            raise AppError("the fake app is not running")
        app = desktop.app
        return {
            "text": app.get("text", ""),
            "submitted": list(app.get("submitted", [])),
            "value": (app.get("submitted") or [None])[-1],
            "clicks": app.get("clicks", 0),
            "opened": list(app.get("opened", [])),
        }

    def a11y_text(self, desktop: FakeDesktop) -> str:
        s = self.state(desktop)
        return f"role\tname\ttext\tbox\nentry\tinput\t{s['text']}\t20,400,1200,20"

    def close(self) -> None:
        self.proc = None


def _clicks(c: dict, ctx) -> tuple[bool, str]:
    got = ctx.state.get("clicks")
    return got == c["at_least"] or (
        isinstance(got, int) and got >= c["at_least"]
    ), f"{got} clicks, want >= {c['at_least']}"


FAKE_TASKS = [
    {
        "id": "fake_type_42",
        "app": "fake",
        "instruction": "Type 42 in the field and press Enter.",
        "steps": 5,
        "evaluate": [{"type": "state", "path": "value", "value": "42"}],
        "solution": ["pyautogui.write('42')", "pyautogui.press('enter')", "DONE"],
        "difficulty": "easy",
        "category": "Entry",
    },
    {
        "id": "fake_click_twice",
        "app": "fake",
        "instruction": "Click anywhere twice.",
        "steps": 4,
        "evaluate": [{"type": "fake_clicks", "at_least": 2}],
        "solution": ["pyautogui.click(10, 10)", "pyautogui.click(20, 20)", "DONE"],
        "category": "Pointer",
    },
    {
        "id": "fake_answer",
        "app": "fake",
        "instruction": "What is 3 + 4? Answer with ANS.",
        "steps": 3,
        "evaluate": [{"type": "answer", "number": 7}],
        "solution": ["ANS 7"],
        "difficulty": "easy",
        "category": "Answer",
    },
    {
        "id": "fake_note",
        "app": "fake",
        "instruction": "Type the word in note.txt and press Enter.",
        "steps": 5,
        "initialize": [
            {"func": "write_file", "path": "note.txt", "content": "hello"},
            {"func": "open_file", "path": "note.txt"},
        ],
        "evaluate": [
            {"type": "state", "path": "value", "value": "hello"},
            {"type": "file", "path": "note.txt", "equals": "hello"},
        ],
        "solution": ["pyautogui.write('hello')", "pyautogui.press('enter')", "DONE"],
        "category": "Entry",
    },
]


def _type_sample(rng) -> dict:
    return {"n": rng.randint(0, 999)}


def _type_build(p: dict) -> dict:
    return {
        "instruction": f"Type {p['n']} in the field and press Enter.",
        "steps": 5,
        "evaluate": [{"type": "state", "path": "value", "value": str(p["n"])}],
        "solution": [f"pyautogui.write('{p['n']}')", "pyautogui.press('enter')", "DONE"],
        "difficulty": "easy",
        "category": "Entry",
    }


# A FAKE family of seeded tasks (coda_env.families) for the fast tests of families in the env.
FAKE_FAMILIES = [Family("fake_type", "fake", "type a number", {"n": "0..999"}, _type_sample, _type_build, 1000)]


def register_fake(tasks: Sequence[dict] = FAKE_TASKS) -> AppSpec:
    """Register the FAKE app as `coda/Fake-v0` (backend 'fake'); tests call this, `import coda_env` does not."""
    return register_app(
        AppSpec(
            name="fake",
            env_id="coda/Fake-v0",
            adapter=FakeApp,
            tasks=list(tasks),
            families=FAKE_FAMILIES,
            checks=[CheckType("fake_clicks", _clicks, lambda c: None, required={"at_least"})],
            env_kwargs={"backend": "fake", "settle_quiet": 0.0, "settle_timeout": 0.0},
            description="a scripted FAKE app for fast tests (no X server)",
        )
    )
