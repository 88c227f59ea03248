"""UI-TARS's action grammar -> this project's actions, on a table of outputs written from UI-TARS's documented
formats (the UI-TARS-1.5 computer-use prompt, its README's coordinate notes, the v1 `<|box_start|>` and
relative-1000 conventions), and on malformed ones. Every converted action must also pass the env's own
parser, so what the executor hands on is what the env accepts.

Coordinates: a 1280x800 screen is resized by Qwen2.5-VL's smart_resize to 1288x812 (both multiples of 28), so
(644, 406) in the model's image is (640, 400) on the screen; relative-1000 coordinates scale by 1.28 and 0.8.
"""

from __future__ import annotations

import pytest

from coda_agent.executor import uitars_action
from coda_agent.models import smart_resize
from coda_agent.uitars import UITarsParseError, parse_uitars, uitars_to_env
from coda_env.actions import parse_action

pytestmark = pytest.mark.fast  # pure logic: no X server

SCREEN = (1280, 800)
IMAGE = (1288, 812)

GOOD = [
    # ---- clicks in UI-TARS-1.5's grammar, absolute pixels of the resized image
    ("Thought: Click OK.\nAction: click(start_box='(644,406)')", "pyautogui.click(640, 400)"),
    ("Action: click(start_box='(322,203)')", "pyautogui.click(320, 200)"),
    ("click(start_box='(966,609)')", "pyautogui.click(960, 600)"),  # no Action: prefix
    ("Action: click(start_box='(644, 406)')", "pyautogui.click(640, 400)"),  # spaces inside
    ('Action: click(start_box="(644,406)")', "pyautogui.click(640, 400)"),  # double quotes
    ("Action: click(start_box='<|box_start|>(644,406)<|box_end|>')", "pyautogui.click(640, 400)"),
    ("Action: click(point='<point>644 406</point>')", "pyautogui.click(640, 400)"),  # 1.5 point form
    ("Action: click(start_box='[644,406]')", "pyautogui.click(640, 400)"),
    ("Action: click(start_box='(644.0,406.0)')", "pyautogui.click(640, 400)"),  # floats
    ("Action: click(start_box='(100,100,200,200)')", "pyautogui.click(149, 148)"),  # a box: its centre
    ("Action: click(start_box='[322,203,966,609]')", "pyautogui.click(640, 400)"),
    ("Action: click(start_box='(0,0)')", "pyautogui.click(0, 0)"),
    ("Action: click(start_box='(1288,812)')", "pyautogui.click(1279, 799)"),  # edge: clamped
    ("Action: click(start_box='(5000,5000)')", "pyautogui.click(1279, 799)"),  # off-image: clamped
    ("Action: left_single(start_box='(644,406)')", "pyautogui.click(640, 400)"),
    ("Action: left_double(start_box='(644,406)')", "pyautogui.doubleClick(640, 400)"),
    ("Action: right_single(start_box='(322,203)')", "pyautogui.rightClick(320, 200)"),
    ("Action: hover(start_box='(644,406)')", "pyautogui.moveTo(640, 400)"),
    ("Action: mouse_move(start_box='(966,609)')", "pyautogui.moveTo(960, 600)"),
    (
        "Action: drag(start_box='(322,203)', end_box='(966,609)')",
        "pyautogui.moveTo(320, 200)\npyautogui.dragTo(960, 600)",
    ),
    (
        "Action: select(start_box='(322,203)', end_box='(644,406)')",
        "pyautogui.moveTo(320, 200)\npyautogui.dragTo(640, 400)",
    ),
    (
        "Action: drag(start_point='<point>322 203</point>', end_point='<point>966 609</point>')",
        "pyautogui.moveTo(320, 200)\npyautogui.dragTo(960, 600)",
    ),
    # ---- keys
    ("Action: hotkey(key='ctrl c')", "pyautogui.hotkey('ctrl', 'c')"),
    ("Action: hotkey(key='ctrl+shift+s')", "pyautogui.hotkey('ctrl', 'shift', 's')"),
    ("Action: hotkey(key='Control S')", "pyautogui.hotkey('ctrl', 's')"),
    ("Action: hotkey(key='enter')", "pyautogui.press('enter')"),  # one key: a press
    ("Action: hotkey(key='Return')", "pyautogui.press('enter')"),
    ("Action: hotkey(key='arrowdown')", "pyautogui.press('down')"),
    ("Action: press(key='escape')", "pyautogui.press('esc')"),
    ("Action: press(key='tab')", "pyautogui.press('tab')"),
    ("Action: keydown(key='shift')", "pyautogui.keyDown('shift')"),
    ("Action: keyup(key='shift')", "pyautogui.keyUp('shift')"),
    ("Action: hotkey(hotkey='ctrl a')", "pyautogui.hotkey('ctrl', 'a')"),  # older argument name
    # ---- typing: a trailing \n submits (UI-TARS-1.5's prompt says so)
    ("Action: type(content='x:=2+3')", "pyautogui.write('x:=2+3')"),
    ("Action: type(content='a:=3^4\\n')", "pyautogui.write('a:=3^4')\npyautogui.press('enter')"),
    ("Action: type(content='\\n')", "pyautogui.press('enter')"),
    ("Action: type(content='it\\'s \"quoted\"')", "pyautogui.write('it\\'s \"quoted\"')"),
    ("Action: type(content='sin(x)+cos(y), done')", "pyautogui.write('sin(x)+cos(y), done')"),
    # ---- scrolling
    ("Action: scroll(start_box='(644,406)', direction='down')", "pyautogui.scroll(-5, x=640, y=400)"),
    ("Action: scroll(start_box='(644,406)', direction='up')", "pyautogui.scroll(5, x=640, y=400)"),
    ("Action: scroll(direction='down')", "pyautogui.scroll(-5)"),
    ("Action: scroll(start_box='(322,203)', direction='left')", "pyautogui.hscroll(5, x=320, y=200)"),
    ("Action: scroll(start_box='(322,203)', direction='Right')", "pyautogui.hscroll(-5, x=320, y=200)"),
    # ---- terminal and waiting
    ("Thought: The value is stored.\nAction: finished()", "DONE"),
    ("Action: finished(content='a = 81')", "DONE"),
    ("Action: call_user()", "FAIL"),
    ("Action: wait()", "WAIT"),
    ("Action: WAIT()", "WAIT"),  # names: any case
    # ---- several actions in one answer; a terminal one after GUI actions is dropped
    (
        "Action: click(start_box='(644,406)')\n\ntype(content='x:=1\\n')",
        "pyautogui.click(640, 400)\npyautogui.write('x:=1')\npyautogui.press('enter')",
    ),
    ("Action: click(start_box='(644,406)')\n\nfinished()", "pyautogui.click(640, 400)"),
    # ---- the full 1.5 layout with reflection and summary before the action
    (
        "Reflection: the dialog is gone.\nAction_Summary: open the menu\nThought: Open File.\n"
        "Action: click(start_box='(322,203)')",
        "pyautogui.click(320, 200)",
    ),
    (
        "Thought: Missing the closing paren at the end.\nAction: click(start_box='(644,406)'",
        "pyautogui.click(640, 400)",
    ),
]

RELATIVE = [  # UI-TARS v1: 0..1000 on each axis, whatever the image size
    ("Action: click(start_box='(500,500)')", "pyautogui.click(640, 400)"),
    ("Action: click(start_box='<|box_start|>(250,750)<|box_end|>')", "pyautogui.click(320, 600)"),
    ("Action: click(start_box='(1000,1000)')", "pyautogui.click(1279, 799)"),
    ("Action: drag(start_box='(0,0)', end_box='(500,250)')", "pyautogui.moveTo(0, 0)\npyautogui.dragTo(640, 200)"),
    ("Action: click(start_box='(250,250,750,750)')", "pyautogui.click(640, 400)"),
]

BAD = [
    ("", "empty"),
    ("   \n ", "empty"),
    ("Thought: I will click somewhere.", "no 'Action:'"),
    ("Action: ", "no action"),
    ("Action: tap(start_box='(1,2)')", "unknown action 'tap'"),
    ("Action: click()", "needs start"),
    ("Action: click(start_box='(1)')", "expected 2 or 4 numbers"),
    ("Action: click(start_box='(1,2,3)')", "expected 2 or 4 numbers"),
    ("Action: click(start_box='(a,b)')", "expected 2 or 4 numbers"),
    ("Action: click(start_box='(-5,10)')", "non-negative"),
    ("Action: click(start_box='(nan,10)')", "2 or 4 numbers"),
    ("Action: click(start_box='(1e9,10)')", "2 or 4 numbers"),
    ("Action: click(start_box='(200000,10)')", "non-negative and finite"),
    ("Action: type(content='Größe π')", "env refuses the converted action: .*non-ASCII"),  # X typing is ASCII
    ("Action: click(start_box='here')", "is not a point"),
    ("Action: click(start_box=(10,20))", "must be a quoted string"),
    ("Action: click(start_box='(10,20)", "unterminated string"),
    ("Action: click(start_box='(10,20)', button='left')", "unexpected argument 'button'"),
    ("Action: __import__('os').system('rm -rf /')", "expected key='value'"),
    ("Action: click(start_box=__import__('os'))", "must be a quoted string"),
    ("Action: os.system('ls')", "expected an action"),
    ("Action: drag(start_box='(1,2)')", "needs end"),
    ("Action: type()", "needs content"),
    ("Action: hotkey(key='ctrl banana')", "unknown key 'banana'"),
    ("Action: hotkey(key='')", "no keys"),
    ("Action: press(key='F13x')", "unknown key"),
    ("Action: scroll(start_box='(1,2)', direction='sideways')", "not up/down/left/right"),
    ("Action: scroll(start_box='(1,2)')", "needs direction"),
    ("Action: click(start_box='(1,2)') and then type", "expected an action"),
    ("Action: " + "x" * 20_000, "over 10000"),
]


def _env_ok(action: str) -> None:
    if action not in ("DONE", "FAIL", "WAIT"):
        parse_action(action, SCREEN)  # raises ActionError if the env would refuse it


@pytest.mark.parametrize("text,expected", GOOD, ids=[f"good{i}" for i in range(len(GOOD))])
def test_documented_outputs_convert(text, expected):
    assert uitars_action(text, IMAGE, SCREEN) == expected
    _env_ok(expected)


@pytest.mark.parametrize("text,expected", RELATIVE, ids=[f"rel{i}" for i in range(len(RELATIVE))])
def test_relative1000_coordinates(text, expected):
    assert uitars_action(text, IMAGE, SCREEN, coords="relative1000") == expected
    _env_ok(expected)


@pytest.mark.parametrize("text,message", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_malformed_outputs_raise_a_clear_error(text, message):
    with pytest.raises(UITarsParseError, match=message):
        uitars_action(text, IMAGE, SCREEN)


def test_thought_is_returned_with_the_action():
    thought, action = uitars_to_env(
        "Thought: The button is at the top.\nAction: click(start_box='(644,406)')", IMAGE, SCREEN
    )
    assert thought == "The button is at the top." and action == "pyautogui.click(640, 400)"
    thought, actions = parse_uitars("Reflection: ok\nThought: two\nlines\nAction: wait()")
    assert thought == "two\nlines" and [a.kind for a in actions] == ["wait"]


def test_coordinates_follow_the_models_image_size():
    """The same answer lands elsewhere on the screen when the model saw a smaller image (max_pixels)."""
    assert uitars_action("click(start_box='(140,84)')", (280, 168), SCREEN) == "pyautogui.click(640, 400)"
    assert uitars_action("click(start_box='(140,84)')", (1288, 812), SCREEN) == "pyautogui.click(139, 83)"
    with pytest.raises(ValueError, match="coords must be"):
        uitars_action("click(start_box='(1,1)')", IMAGE, SCREEN, coords="percent")


@pytest.mark.parametrize(
    "hw,kw,expected",
    [
        ((800, 1280), {}, (812, 1288)),  # the default screen
        ((1080, 1920), {}, (1092, 1932)),
        ((800, 1280), {"max_pixels": 64 * 28 * 28}, (168, 280)),  # the tiny test model
        ((800, 1280), {"max_pixels": 1280 * 28 * 28}, (784, 1260)),  # area over the cap: scaled down
        ((10, 10), {}, (56, 56)),  # min_pixels = 56*56 scales it up
        ((28, 28), {"min_pixels": 28 * 28}, (28, 28)),
    ],
)
def test_smart_resize(hw, kw, expected):
    h, w = smart_resize(*hw, **kw)
    assert (h, w) == expected
    assert h % 28 == 0 and w % 28 == 0
    assert kw.get("min_pixels", 56 * 56) <= h * w <= kw.get("max_pixels", 28 * 28 * 16384)


def test_smart_resize_refuses_extreme_aspect_ratios():
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(10, 5000)
