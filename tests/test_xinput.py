"""The local backend's key plan: what goes down and up for a keyboard action, known without an X server."""

from __future__ import annotations

import pytest

from coda_env.actions import parse_action
from coda_env.backends.local import key_plan

pytestmark = pytest.mark.fast


def plan(code: str):
    (action,) = parse_action(code, (1280, 800))
    return key_plan(action)


def test_typing_taps_each_character_with_its_key_name():
    assert plan("pyautogui.write('a b\\n')") == [
        ("a", True),
        ("a", False),
        ("space", True),
        ("space", False),
        ("b", True),
        ("b", False),
        ("enter", True),
        ("enter", False),
    ]


def test_a_hotkey_presses_in_order_and_releases_in_reverse():
    assert plan("pyautogui.hotkey('ctrl', 'shift', 'a')") == [
        ("ctrl", True),
        ("shift", True),
        ("a", True),
        ("a", False),
        ("shift", False),
        ("ctrl", False),
    ]


def test_press_repeats_and_key_down_up_are_halves():
    assert plan("pyautogui.press('tab', presses=2)") == [("tab", True), ("tab", False)] * 2
    assert plan("pyautogui.keyDown('shift')") == [("shift", True)]
    assert plan("pyautogui.keyUp('shift')") == [("shift", False)]


def test_pointer_actions_have_no_key_events():
    assert plan("pyautogui.click(10, 10)") == [] and plan("pyautogui.scroll(-3)") == []
