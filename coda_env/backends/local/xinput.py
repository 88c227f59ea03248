"""X input: the key and button tables, a pure key plan (what goes down and up for an action, testable
without an X server), and XTest input on the desktop's display with what it holds down tracked."""

from __future__ import annotations

import time

from ...actions import Action, ActionError
from ..base import DesktopError


# pyautogui key name -> X keysym (X11's keysymdef.h names; single printable characters map through their code
# point). Keys of other platforms follow the X keysyms that Chromium's key tables pair them with. Names whose
# key X has no keysym for at all are in NO_KEYSYM: pressing one is an ActionError, never a crash.
_KEYSYM_NAMES = {
    "enter": "Return",
    "tab": "Tab",
    "esc": "Escape",
    "backspace": "BackSpace",
    "delete": "Delete",
    "space": "space",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "home": "Home",
    "end": "End",
    "pageup": "Prior",
    "pagedown": "Next",
    "insert": "Insert",
    "ctrl": "Control_L",
    "ctrlleft": "Control_L",
    "ctrlright": "Control_R",
    "shift": "Shift_L",
    "shiftleft": "Shift_L",
    "shiftright": "Shift_R",
    "alt": "Alt_L",
    "altleft": "Alt_L",
    "altright": "Alt_R",
    "option": "Alt_L",
    "optionleft": "Alt_L",
    "optionright": "Alt_R",
    "win": "Super_L",
    "winleft": "Super_L",
    "winright": "Super_R",
    "command": "Super_L",
    "super": "Super_L",
    "capslock": "Caps_Lock",
    "numlock": "Num_Lock",
    "scrolllock": "Scroll_Lock",
    "printscreen": "Print",
    "prtsc": "Print",
    "prtscr": "Print",
    "prntscrn": "Print",
    "print": "Print",
    "pause": "Pause",
    "apps": "Menu",
    "menu": "Menu",
    "clear": "Clear",
    "help": "Help",
    "select": "Select",
    "execute": "Execute",
    "add": "KP_Add",
    "subtract": "KP_Subtract",
    "multiply": "KP_Multiply",
    "divide": "KP_Divide",
    "decimal": "KP_Decimal",
    "separator": "KP_Separator",
    "yen": "yen",
    "convert": "Henkan_Mode",
    "nonconvert": "Muhenkan",
    "kana": "Hiragana_Katakana",
    "kanji": "Kanji",
    "hangul": "Hangul",
    "hanguel": "Hangul",
    "hanja": "Hangul_Hanja",
    "junja": "Hangul_Jeonja",
    "modechange": "Mode_switch",
    "volumeup": "XF86_AudioRaiseVolume",
    "volumedown": "XF86_AudioLowerVolume",
    "volumemute": "XF86_AudioMute",
    "playpause": "XF86_AudioPlay",
    "nexttrack": "XF86_AudioNext",
    "prevtrack": "XF86_AudioPrev",
    "stop": "XF86_AudioStop",
    "browserback": "XF86_Back",
    "browserforward": "XF86_Forward",
    "browserrefresh": "XF86_Refresh",
    "browserhome": "XF86_HomePage",
    "browsersearch": "XF86_Search",
    "browserstop": "XF86_Stop",
    "browserfavorites": "XF86_Favorites",
    "launchmail": "XF86_Mail",
    "launchmediaselect": "XF86_AudioMedia",
    "launchapp1": "XF86_MyComputer",
    "launchapp2": "XF86_Calculator",
    "sleep": "XF86_Sleep",
    "fn": "XF86_WakeUp",
}
_KEYSYM_NAMES.update({f"f{i}": f"F{i}" for i in range(1, 25)})
_KEYSYM_NAMES.update({f"num{i}": f"KP_{i}" for i in range(10)})
# Windows' IME keys VK_ACCEPT and VK_FINAL: X has no keysym for either.
NO_KEYSYM = frozenset({"accept", "final"})


def _keysym_table() -> dict[str, int]:
    from Xlib import XK

    for group in ("xf86", "korean"):
        XK.load_keysym_group(group)
    table = {}
    for key, name in _KEYSYM_NAMES.items():
        ks = XK.string_to_keysym(name)
        if not ks:
            raise AssertionError(f"python-xlib knows no keysym {name} (for key {key!r})")
        table[key] = ks
    return table


_KEYSYMS = _keysym_table()


_BUTTONS = {"left": 1, "middle": 2, "right": 3}


_BUTTON_NAMES = {v: k for k, v in _BUTTONS.items()}


def key_plan(action: Action) -> list[tuple[str, bool]]:
    """The key events of a keyboard action, in order, as (key name, down): what XTest is then told. Pure: the
    same action always gives the same plan, and no X server is needed to know it."""
    k = action.kind
    if k == "type":
        names = [{"\n": "enter", "\t": "tab", " ": "space"}.get(ch, ch) for ch in action.text]
        return [(n, d) for n in names for d in (True, False)]
    if k == "press":
        return [(key, d) for _ in range(action.presses) for key in action.keys for d in (True, False)]
    if k == "hotkey":
        return [(key, True) for key in action.keys] + [(key, False) for key in reversed(action.keys)]
    if k == "key_down":
        return [(key, True) for key in action.keys]
    if k == "key_up":
        return [(key, False) for key in action.keys]
    return []


class XInput:
    """The input half of LocalDesktop (mixed into it): needs `_xlib`, `_x()`, `_check()`, `alive()`, and the
    bookkeeping fields `_held_keys`, `_held_buttons`, `_bound`, `_spare`."""

    def pressed(self) -> dict[str, list[str]]:
        """What input() holds down now: {"keys": key names, "buttons": button names} (keyDown/mouseDown)."""
        return {
            "keys": sorted(set(self._held_keys.values())),
            "buttons": sorted(_BUTTON_NAMES.get(b, str(b)) for b in self._held_buttons),
        }

    def input(self, action: Action) -> None:
        """Perform one action. An unknown key is an ActionError before anything is pressed; an action that
        fails midway releases whatever it had pressed."""
        self._check()
        keys_before, buttons_before = set(self._held_keys), set(self._held_buttons)
        extra = {"sleep": float(action.seconds), "drag": max(float(action.seconds), 0.06)}.get(action.kind, 0.0)
        try:
            with self._x(f"performing {action.kind}", extra):
                self._perform(action)
        except BaseException:
            self._release(set(self._held_keys) - keys_before, self._held_buttons - buttons_before)
            raise

    def _perform(self, action: Action) -> None:
        from Xlib import X
        from Xlib.ext import xtest

        d, k = self._xlib, action.kind
        if k in ("press", "hotkey", "key_down", "key_up"):
            for key in action.keys:  # fail before pressing anything
                self._keysym(key)
        if k != "drag" and (action.x is not None or action.y is not None):
            self._move(action.x, action.y)
        if k == "move":
            pass
        elif k == "click":
            b = _BUTTONS[action.button]
            for _ in range(action.clicks):
                self._button(b, True)
                self._button(b, False)
        elif k == "mouse_down":
            self._button(_BUTTONS[action.button], True)
        elif k == "mouse_up":
            self._button(_BUTTONS[action.button], False)
        elif k == "drag":
            self._drag(action)
        elif k in ("scroll", "hscroll"):
            up, down = (4, 5) if k == "scroll" else (7, 6)
            b = up if action.amount > 0 else down
            for _ in range(abs(action.amount)):
                xtest.fake_input(d, X.ButtonPress, b)
                xtest.fake_input(d, X.ButtonRelease, b)
        elif k in ("type", "press", "hotkey", "key_down", "key_up"):
            for key, down in key_plan(action):
                self._key(key, down)
        elif k == "sleep":
            d.sync()
            time.sleep(action.seconds)  # the agent asked for this wait
        elif k in ("wait", "done", "fail", "answer"):
            pass
        else:
            raise ActionError(f"the local desktop cannot perform actions of kind {k!r}")
        d.sync()

    def _button(self, b: int, down: bool) -> None:
        from Xlib import X
        from Xlib.ext import xtest

        xtest.fake_input(self._xlib, X.ButtonPress if down else X.ButtonRelease, b)
        if down:
            self._held_buttons.add(b)
        else:
            self._held_buttons.discard(b)

    def _move(self, x: int | None, y: int | None) -> None:
        from Xlib import X
        from Xlib.ext import xtest

        if x is None or y is None:
            p = self._xlib.screen().root.query_pointer()
            x = p.root_x if x is None else x
            y = p.root_y if y is None else y
        xtest.fake_input(self._xlib, X.MotionNotify, x=int(x), y=int(y))

    def _drag(self, a: Action) -> None:
        from Xlib import X
        from Xlib.ext import xtest

        d = self._xlib
        p = d.screen().root.query_pointer()
        x0, y0 = p.root_x, p.root_y
        b = _BUTTONS[a.button]
        self._button(b, True)
        d.sync()
        steps = 12  # toolkits start a drag only after several motion events
        for i in range(1, steps + 1):
            xtest.fake_input(
                d, X.MotionNotify, x=round(x0 + (a.x - x0) * i / steps), y=round(y0 + (a.y - y0) * i / steps)
            )
            d.sync()
            time.sleep(max(a.seconds, 0.06) / steps)
        self._button(b, False)

    def _keycode(self, keysym: int) -> tuple[int, bool]:
        """(keycode, needs shift) for a keysym. A keysym the keymap lacks is bound to a spare keycode (as
        xdotool does) and stays bound; when every spare one is taken, the least recently used binding that is
        not held down is replaced."""
        d = self._xlib
        kc = self._bound.get(keysym)
        if kc is not None:
            self._bound.move_to_end(keysym)
            return kc, False
        for kc, index in d.keysym_to_keycodes(keysym):
            if index in (0, 1) and kc not in self._bound.values():
                return kc, index == 1
        used = set(self._bound.values())
        free = [c for c in self._spare if c not in used]
        if free:
            kc = free[0]
        else:
            victim = next((ks for ks, c in self._bound.items() if c not in self._held_keys), None)
            if victim is None:
                raise ActionError(
                    f"cannot type keysym {keysym:#x}: all {len(self._spare)} spare keycodes are "
                    f"bound to keys held down now"
                )
            kc = self._bound.pop(victim)
        d.change_keyboard_mapping(kc, [(keysym, keysym)])
        self._bound[keysym] = kc
        return kc, False

    def _keysym(self, key: str) -> int:
        """The keysym of a key name; ActionError for a name X has no key for."""
        if key in NO_KEYSYM:
            raise ActionError(
                f"key {key!r} has no X keysym (it is a Windows IME key), so the local desktop cannot press it"
            )
        ks = _KEYSYMS.get(key)
        if ks is None and len(key) == 1:
            cp = ord(key)
            ks = cp if 0x20 <= cp <= 0xFF else 0x01000000 | cp  # Latin-1 keysyms are code points; others Unicode
        if not ks:
            raise ActionError(f"no X keysym for key {key!r}")
        return ks

    def _key(self, key: str, down: bool) -> None:
        from Xlib import X
        from Xlib.ext import xtest

        kc, shift = self._keycode(self._keysym(key))
        shift_kc = self._keycode(_KEYSYMS["shift"])[0] if shift else 0
        if shift and down:
            xtest.fake_input(self._xlib, X.KeyPress, shift_kc)
        xtest.fake_input(self._xlib, X.KeyPress if down else X.KeyRelease, kc)
        if down:
            self._held_keys[kc] = key
        else:
            self._held_keys.pop(kc, None)
        if shift and not down:
            xtest.fake_input(self._xlib, X.KeyRelease, shift_kc)

    def _release(self, keys: set[int], buttons: set[int]) -> None:
        """Release these keycodes and buttons (after a failed action); nothing to do on a dead connection."""
        if not (keys or buttons) or self._broken or self._xlib is None:
            self._held_keys = {k: v for k, v in self._held_keys.items() if k not in keys}
            self._held_buttons -= buttons
            return
        from Xlib import X
        from Xlib.ext import xtest

        try:
            with self._x("releasing the keys of a failed action"):
                for kc in keys:
                    xtest.fake_input(self._xlib, X.KeyRelease, kc)
                for b in buttons:
                    xtest.fake_input(self._xlib, X.ButtonRelease, b)
                self._xlib.sync()
        except DesktopError:
            pass
        self._held_keys = {k: v for k, v in self._held_keys.items() if k not in keys}
        self._held_buttons -= buttons

    def release_all(self) -> None:
        """Release every key and button the X server has down and switch Caps/Num/Scroll Lock off, so that
        the next episode starts from the same keyboard (the env calls this at episode end and on reset).
        Asks the server, not only our bookkeeping: it also catches what a failed action left behind."""
        from Xlib import X, XK
        from Xlib.ext import xtest

        if not self.alive():  # a dead or frozen desktop holds nothing: the next reset rebuilds it
            self._held_keys.clear()
            self._held_buttons.clear()
            return
        d = self._xlib
        with self._x("releasing held keys and buttons"):
            keymap = d.query_keymap()
            for kc in range(8, 256):
                if keymap[kc // 8] >> (kc % 8) & 1:
                    xtest.fake_input(d, X.KeyRelease, kc)
            mask = d.screen().root.query_pointer().mask
            for b in range(1, 6):
                if mask & (X.Button1Mask << (b - 1)):
                    xtest.fake_input(d, X.ButtonRelease, b)
            d.sync()
            # A lock is on when its modifier is on with no key down: tap its key to switch it off.
            mods = d.get_modifier_mapping()
            state = d.screen().root.query_pointer().mask
            for name in ("Caps_Lock", "Num_Lock", "Scroll_Lock"):
                ks = XK.string_to_keysym(name)
                codes = [kc for kc, _ in d.keysym_to_keycodes(ks)]
                if not codes:
                    continue
                bit = next((1 << i for i, row in enumerate(mods) if codes[0] in row), 0)
                if bit and state & bit:
                    xtest.fake_input(d, X.KeyPress, codes[0])
                    xtest.fake_input(d, X.KeyRelease, codes[0])
            d.sync()
        self._held_keys.clear()
        self._held_buttons.clear()
