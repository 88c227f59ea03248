"""Input to the VM: `virDomainSendKey` with Linux keycodes for keys and typing, and QMP `input-send-event`
(absolute axes on the domain's USB tablet, buttons, the wheel, held keys) through `qemuMonitorCommand`.

The translation of actions to input events is pure (`plan_input`, `key_chord`), so it is tested without a
VM; `InputMixin` sends the planned events to the domain.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Union

from ...actions import Action
from ..base import DesktopError

# Linux input keycodes (linux/input-event-codes.h) and QEMU QKeyCode names, per project key name.
_KEYS: dict[str, tuple[int, str]] = {
    "esc": (1, "esc"),
    "backspace": (14, "backspace"),
    "tab": (15, "tab"),
    "enter": (28, "ret"),
    "space": (57, "spc"),
    "ctrl": (29, "ctrl"),
    "ctrlleft": (29, "ctrl"),
    "ctrlright": (97, "ctrl_r"),
    "shift": (42, "shift"),
    "shiftleft": (42, "shift"),
    "shiftright": (54, "shift_r"),
    "alt": (56, "alt"),
    "altleft": (56, "alt"),
    "altright": (100, "alt_r"),
    "option": (56, "alt"),
    "optionleft": (56, "alt"),
    "optionright": (100, "alt_r"),
    "win": (125, "meta_l"),
    "winleft": (125, "meta_l"),
    "winright": (126, "meta_r"),
    "command": (125, "meta_l"),
    "capslock": (58, "caps_lock"),
    "numlock": (69, "num_lock"),
    "scrolllock": (70, "scroll_lock"),
    "printscreen": (99, "sysrq"),
    "prtsc": (99, "sysrq"),
    "prtscr": (99, "sysrq"),
    "prntscrn": (99, "sysrq"),
    "print": (99, "sysrq"),
    "pause": (119, "pause"),
    "apps": (127, "compose"),
    "home": (102, "home"),
    "up": (103, "up"),
    "pageup": (104, "pgup"),
    "left": (105, "left"),
    "right": (106, "right"),
    "end": (107, "end"),
    "down": (108, "down"),
    "pagedown": (109, "pgdn"),
    "insert": (110, "insert"),
    "delete": (111, "delete"),
    "help": (138, "help"),
    "stop": (166, "audiostop"),
    "add": (78, "kp_add"),
    "subtract": (74, "kp_subtract"),
    "multiply": (55, "kp_multiply"),
    "divide": (98, "kp_divide"),
    "decimal": (83, "kp_decimal"),
    "separator": (121, "kp_comma"),
    "volumemute": (113, "audiomute"),
    "volumedown": (114, "volumedown"),
    "volumeup": (115, "volumeup"),
    "playpause": (164, "audioplay"),
    "nexttrack": (163, "audionext"),
    "prevtrack": (165, "audioprev"),
    "browserback": (158, "ac_back"),
    "browserforward": (159, "ac_forward"),
    "browserrefresh": (173, "ac_refresh"),
    "browserhome": (172, "ac_home"),
    "browserfavorites": (156, "ac_bookmarks"),
    "launchmail": (155, "mail"),
    "launchapp1": (157, "computer"),
    "launchapp2": (140, "calculator"),
    "launchmediaselect": (226, "mediaselect"),
    "sleep": (142, "sleep"),
    "fn": (143, "wake"),
    "yen": (124, "yen"),
    "hangul": (122, "lang1"),
    "hanguel": (122, "lang1"),
    "hanja": (123, "lang2"),
    "kana": (93, "katakanahiragana"),
    "convert": (92, "henkan"),
    "nonconvert": (94, "muhenkan"),
    "-": (12, "minus"),
    "=": (13, "equal"),
    "[": (26, "bracket_left"),
    "]": (27, "bracket_right"),
    ";": (39, "semicolon"),
    "'": (40, "apostrophe"),
    "`": (41, "grave_accent"),
    "\\": (43, "backslash"),
    ",": (51, "comma"),
    ".": (52, "dot"),
    "/": (53, "slash"),
}
_KEYS.update({f"f{i}": (58 + i, f"f{i}") for i in range(1, 11)})
_KEYS.update({"f11": (87, "f11"), "f12": (88, "f12")})
_KEYS.update({f"f{i}": (170 + i, f"f{i}") for i in range(13, 25)})
_KEYS.update({str(d): (2 + (d - 1) % 10, str(d)) for d in range(10)})
_KEYS.update({f"num{d}": (c, f"kp_{d}") for d, c in zip(range(10), (82, 79, 80, 81, 75, 76, 77, 71, 72, 73))})
_KEYS.update({ch: (c, ch) for ch, c in zip("qwertyuiop", range(16, 26))})
_KEYS.update({ch: (c, ch) for ch, c in zip("asdfghjkl", range(30, 39))})
_KEYS.update({ch: (c, ch) for ch, c in zip("zxcvbnm", range(44, 51))})

# Characters typed with shift on a US layout -> the unshifted key.
_SHIFTED = dict(zip('!@#$%^&*()_+{}:"~|<>?', "1234567890-=[];'`\\,./"))
_SHIFTED.update({c.upper(): c for c in "abcdefghijklmnopqrstuvwxyz"})
_CHAR_NAMES = {" ": "space", "\n": "enter", "\r": "enter", "\t": "tab"}
SHIFT = _KEYS["shift"][0]


def _resolve(key: str) -> tuple[str, bool]:
    """(key name in _KEYS, needs shift) for a project key name or a single character."""
    key = _CHAR_NAMES.get(key, key)
    if key in _KEYS:
        return key, False
    if key in _SHIFTED:
        return _SHIFTED[key], True
    raise ValueError(
        f"the libvirt backend cannot type {key!r}: it sends Linux keycodes of a US keyboard "
        f"layout, which has no such key"
    )


def key_chord(keys: Sequence[str]) -> tuple[int, ...]:
    """The Linux keycodes that `virDomainSendKey` presses together (in order, released in reverse) for
    a hotkey; shift comes first, once, when any key needs it (`'!'` is shift+1)."""
    codes: list[int] = []
    for key in keys:
        name, shift = _resolve(key)
        if shift and SHIFT not in codes:
            codes.insert(0, SHIFT)
        if _KEYS[name][0] not in codes:
            codes.append(_KEYS[name][0])
    return tuple(codes)


ABS_MAX = 0x7FFF  # QEMU's absolute axis range (INPUT_EVENT_ABS_MAX)

Keys = tuple[int, ...]  # one sendKey chord
Step = Union[tuple[str, Keys], tuple[str, list], tuple[str, float]]
"""("keys", keycodes) for sendKey, ("qmp", events) for one input-send-event (one input sync),
("sleep", seconds) for pacing."""


def _abs(x: int, y: int, size: tuple[int, int]) -> list[dict]:
    w, h = size
    return [
        {"type": "abs", "data": {"axis": "x", "value": round(x * ABS_MAX / max(w - 1, 1))}},
        {"type": "abs", "data": {"axis": "y", "value": round(y * ABS_MAX / max(h - 1, 1))}},
    ]


def _btn(button: str, down: bool) -> list[dict]:
    return [{"type": "btn", "data": {"down": down, "button": button}}]


def _qkey(name: str, down: bool) -> dict:
    return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": _KEYS[name][1]}}}


def plan_input(
    action: Action, pointer: tuple[int, int], size: tuple[int, int], native_hscroll: bool = False
) -> tuple[list[Step], tuple[int, int]]:
    """The exact events that perform `action`, and where the pointer ends.

    Every button change is its own QMP command: QEMU's USB tablet reports its state once per input sync,
    so a press and a release in one command would be merged into no click at all.
    """
    k = action.kind
    steps: list[Step] = []
    x, y = pointer
    if k != "drag" and (action.x is not None or action.y is not None):
        x = pointer[0] if action.x is None else int(action.x)
        y = pointer[1] if action.y is None else int(action.y)
        steps.append(("qmp", _abs(x, y, size)))
    if k == "click":
        for _ in range(action.clicks):
            steps += [("qmp", _btn(action.button, True)), ("qmp", _btn(action.button, False))]
    elif k in ("mouse_down", "mouse_up"):
        steps.append(("qmp", _btn(action.button, k == "mouse_down")))
    elif k == "drag":
        tx = x if action.x is None else int(action.x)
        ty = y if action.y is None else int(action.y)
        n = 12  # toolkits start a drag only after several motion events
        steps.append(("qmp", _btn(action.button, True)))
        for i in range(1, n + 1):
            steps.append(("qmp", _abs(round(x + (tx - x) * i / n), round(y + (ty - y) * i / n), size)))
            steps.append(("sleep", max(action.seconds, 0.06) / n))
        steps.append(("qmp", _btn(action.button, False)))
        x, y = tx, ty
    elif k in ("scroll", "hscroll"):
        if k == "scroll" or native_hscroll:
            names = ("wheel-up", "wheel-down") if k == "scroll" else ("wheel-right", "wheel-left")
            wheel = names[0] if action.amount > 0 else names[1]
            shift = False
        else:  # toolkits scroll sideways on shift + wheel; wheel-left/right need QEMU 8.1 (Debian 12 has 7.2)
            wheel = "wheel-down" if action.amount > 0 else "wheel-up"
            shift = True
        if shift and action.amount:
            steps.append(("qmp", [_qkey("shift", True)]))
        for _ in range(abs(action.amount)):
            steps += [("qmp", _btn(wheel, True)), ("qmp", _btn(wheel, False))]
        if shift and action.amount:
            steps.append(("qmp", [_qkey("shift", False)]))
    elif k == "type":
        steps += [("keys", key_chord([ch])) for ch in action.text]
    elif k == "press":
        for _ in range(action.presses):
            steps += [("keys", key_chord([key])) for key in action.keys]
    elif k == "hotkey":
        steps.append(("keys", key_chord(action.keys)))
    elif k in ("key_down", "key_up"):
        down = k == "key_down"
        for key in action.keys:
            name, shift = _resolve(key)
            events = [_qkey(name, down)]
            if shift:
                events = [_qkey("shift", True)] + events if down else events + [_qkey("shift", False)]
            steps.append(("qmp", events))
    elif k == "sleep":
        steps.append(("sleep", float(action.seconds)))
    elif k in ("move", "wait", "done", "fail", "answer"):
        pass
    else:
        raise ValueError(f"unknown action kind {k!r}")
    return steps, (x, y)


class InputMixin:
    """`LibvirtDesktop`'s input: the planned events, sent to its domain."""

    def input(self, action: Action) -> None:
        self._check()
        steps, pointer = plan_input(action, self._pointer, (self.width, self.height), self.config.native_hscroll)
        lv = self._lv
        try:
            for kind, arg in steps:
                if kind == "keys":
                    codes = list(arg)  # type: ignore[arg-type]
                    self._dom.sendKey(lv.VIR_KEYCODE_SET_LINUX, self.config.key_hold_ms, codes, len(codes), 0)
                elif kind == "qmp":
                    self._qmp("input-send-event", {"events": arg})
                else:
                    time.sleep(float(arg))  # type: ignore[arg-type]  # pacing the agent asked for
        except lv.libvirtError as e:
            if not self.alive():
                raise DesktopError(f"the VM {self.name} died during input: {e}") from None
            raise DesktopError(f"input to {self.name} failed: {e}") from None
        self._pointer = pointer
        self._track(action)

    def release_all(self) -> None:
        """Release the held keys and buttons that keyDown/mouseDown actions pressed (tracked in `_held`)."""
        held = getattr(self, "_held", None)
        if not held or not self.alive():
            return
        events = [_qkey(name, False) for kind, name in held if kind == "key"]
        events += [e for kind, name in held if kind == "btn" for e in _btn(name, False)]
        try:
            for e in events:
                self._qmp("input-send-event", {"events": [e]})
        finally:
            held.clear()

    def _track(self, action: Action) -> None:
        held = self.__dict__.setdefault("_held", set())
        if action.kind in ("key_down", "key_up"):
            for key in action.keys:
                name, shift = _resolve(key)
                for n in (name, "shift") if shift else (name,):
                    (held.add if action.kind == "key_down" else held.discard)(("key", n))
        elif action.kind in ("mouse_down", "mouse_up"):
            (held.add if action.kind == "mouse_down" else held.discard)(("btn", action.button))

    def _qmp(self, command: str, arguments: Mapping[str, Any]) -> Any:
        text = json.dumps({"execute": command, "arguments": arguments})
        reply = json.loads(self._lvq.qemuMonitorCommand(self._dom, text, 0))
        if "error" in reply:
            raise DesktopError(f"QEMU refused {command}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return")
