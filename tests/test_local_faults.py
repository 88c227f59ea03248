"""Faults of the local backend, on real Xvfb desktops and a real KAlgebra (issue 15).

Every key name the action parser accepts can be pressed; held keys and buttons do not outlive an episode;
the death of any part of a desktop (X server, window manager, session bus, accessibility bus, app) ends the
step with an error naming it and the next reset rebuilds; a frozen X server cannot hang a step; no
temporary folder outlives the process that made it, however it ends; a bad temporary folder is a clear error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from Xlib import X, display as xdisplay

from coda_env.actions import KEY_ALIASES, KEY_NAMES, ActionError, parse_action
from coda_env.backends.base import DesktopError
from coda_env.backends.local import NO_KEYSYM, LocalConfig, LocalDesktop, _KEYSYMS, _proc_state
from coda_env.env import CodaEnv

from .conftest import live_token_pids, run_solution, wait_until

ROOT = Path(__file__).resolve().parents[1]


def _accepted_key_names() -> list[str]:
    """Every key spelling `parse_action` accepts for pyautogui.press."""
    out = []
    for name in [*KEY_NAMES, *KEY_ALIASES]:
        try:
            parse_action(f"pyautogui.press({name!r})", (1280, 800))
        except ActionError:
            continue
        out.append(name)
    return out


def _server_input(display: int) -> tuple[list[int], int]:
    """(keycodes down, pointer button mask) as the X server itself sees them, on a connection of our own."""
    d = xdisplay.Display(f":{display}")
    try:
        keymap = d.query_keymap()
        down = [kc for kc in range(8, 256) if keymap[kc // 8] >> (kc % 8) & 1]
        mask = d.screen().root.query_pointer().mask
        return down, mask & (X.Button1Mask | X.Button2Mask | X.Button3Mask | X.Button4Mask | X.Button5Mask)
    finally:
        d.close()


# ------------------------------------------------------------------------------------------ 1. keys
def test_key_table_covers_every_accepted_name():
    names = {KEY_ALIASES.get(n, n) for n in _accepted_key_names()}
    missing = {n for n in names if len(n) > 1 and n not in _KEYSYMS and n not in NO_KEYSYM}
    assert not missing, f"accepted key names with no keysym and no rejection: {sorted(missing)}"


def test_keys_missing_from_the_keymap_reach_a_window_as_their_keysym():
    """A keysym the keymap lacks (F13-F24, XF86 media keys, ...) is bound to a spare keycode; what arrives
    at a window is that keysym, also after the spare keycodes ran out and bindings were recycled."""
    desk = LocalDesktop(LocalConfig(width=640, height=400, window_manager=False, accessibility=False))
    desk.start()
    watcher = xdisplay.Display(f":{desk.display}")
    try:
        win = watcher.screen().root.create_window(
            0, 0, 640, 400, 0, watcher.screen().root_depth, event_mask=X.KeyPressMask
        )
        win.map()
        watcher.sync()
        assert wait_until(lambda: win.get_attributes().map_state == X.IsViewable, 5)
        win.set_input_focus(X.RevertToParent, X.CurrentTime)
        watcher.sync()
        names = [
            n
            for n in sorted(set(_KEYSYMS) - NO_KEYSYM)
            if not list(desk._xlib.keysym_to_keycodes(_KEYSYMS[n])) or n in ("f13", "f24", "volumeup")
        ]
        assert len(names) > len(desk._spare), (len(names), len(desk._spare))  # forces recycling
        for name in names + names[:3]:
            desk.input(parse_action(f"pyautogui.press({name!r})", (640, 400))[0])
            ev = None
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if watcher.pending_events():
                    e = watcher.next_event()
                    if e.type == X.MappingNotify:
                        watcher.refresh_keyboard_mapping(e)
                    elif e.type == X.KeyPress:
                        ev = e
                        break
                else:
                    time.sleep(0.005)
            assert ev is not None, f"no KeyPress for {name!r}"
            got = watcher.keycode_to_keysym(ev.detail, 0)
            assert got == _KEYSYMS[name], (name, hex(got), hex(_KEYSYMS[name]))
        assert desk.pressed() == {"keys": [], "buttons": []}
        assert _server_input(desk.display) == ([], 0)
    finally:
        watcher.close()
        desk.stop()


def test_every_accepted_key_can_be_pressed_and_the_env_stays_usable():
    env = CodaEnv(app="kalgebra", max_steps=10_000)
    try:
        env.reset(options={"task": "calc_power"})
        names = _accepted_key_names()
        assert len(names) > 180
        rejected = {}
        for name in names:
            obs, r, term, trunc, info = env.step(f"pyautogui.press({name!r})")
            assert "error" not in info and not term and not trunc, (name, info)
            if KEY_ALIASES.get(name, name) in NO_KEYSYM:
                assert name in info["action_error"] and "no X keysym" in info["action_error"], info
                rejected[name] = info["action_error"]
            else:
                assert info["action_error"] is None, (name, info["action_error"])
        # a hotkey with a key the keymap lacks: nothing stays held (it raised with Shift down before)
        obs, r, term, trunc, info = env.step("pyautogui.hotkey('shift', 'f20')")
        assert info["action_error"] is None and "error" not in info
        assert env.desktop.pressed() == {"keys": [], "buttons": []}
        assert _server_input(env.desktop.display) == ([], 0)
        assert set(rejected) <= NO_KEYSYM
        rewards, *_ = run_solution(env, "calc_power")
        assert rewards[-1] == 1.0
    finally:
        env.close()


# ------------------------------------------------------------------------------------ 2. held input
def test_held_keys_and_buttons_do_not_survive_reset():
    env = CodaEnv(app="kalgebra")
    try:
        env.reset(options={"task": "calc_power"})
        for action in ("pyautogui.keyDown('shift')", "pyautogui.mouseDown(1200, 60, button='middle')"):
            info = env.step(action)[4]
            assert info["action_error"] is None and "error" not in info, info
        assert env.desktop.pressed() == {"keys": ["shift"], "buttons": ["middle"]}
        down, buttons = _server_input(env.desktop.display)
        assert down and buttons == X.Button2Mask
        rewards, term, trunc, info = run_solution(env, "calc_power")  # reset, then the oracle
        assert rewards[-1] == 1.0, info
        assert env.desktop.pressed() == {"keys": [], "buttons": []}
        assert _server_input(env.desktop.display) == ([], 0)
    finally:
        env.close()


def test_episode_end_releases_held_input_and_locks():
    env = CodaEnv(app="kalgebra")
    try:
        env.reset(options={"task": "calc_power"})
        env.step("pyautogui.press('capslock'); pyautogui.keyDown('ctrl')")
        assert _server_input(env.desktop.display)[0]
        obs, r, term, trunc, info = env.step("DONE")
        assert term
        assert _server_input(env.desktop.display) == ([], 0)
        d = xdisplay.Display(f":{env.desktop.display}")
        try:
            assert not d.screen().root.query_pointer().mask & X.LockMask  # Caps Lock is off again
        finally:
            d.close()
    finally:
        env.close()


def test_an_action_that_fails_midway_releases_what_it_pressed(monkeypatch):
    env = CodaEnv(app="kalgebra")
    try:
        env.reset(options={"task": "calc_power"})
        desk = env.desktop
        real = desk._keycode
        f20 = _KEYSYMS["f20"]

        def failing(keysym):  # the X server refusing the second key of a hotkey
            if keysym == f20:
                raise RuntimeError("injected failure")
            return real(keysym)

        monkeypatch.setattr(desk, "_keycode", failing)
        with pytest.raises(DesktopError, match="injected failure"):
            desk.input(parse_action("pyautogui.hotkey('ctrl', 'shift', 'f20')", (1280, 800))[0])
        assert desk.pressed() == {"keys": [], "buttons": []}
        assert _server_input(desk.display) == ([], 0)
    finally:
        env.close()


# ------------------------------------------------------------------------------------ 4. dead parts
PARTS = {  # what to kill -> what the error must name
    "xvfb": "X server (Xvfb)",
    "wm": "window manager (openbox)",
    "dbus": "session bus (dbus-daemon)",
    "atspi": "accessibility bus",
    "a11ybus": "accessibility bus",
    "app": "kalgebra exited",
}


def _kill_part(env, part: str) -> None:
    d = env.unwrapped.desktop
    if part == "a11ybus":  # not our child: its parent, the launcher, reaps it
        pid = d._a11y_bus
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: _proc_state(pid) in (None, "Z", "X"), 5)
        return
    proc = env.unwrapped.procs["kalgebra"] if part == "app" else d._procs[part]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)  # (a killed multi-threaded process shows as a zombie before it can be reaped)


def _fault_env() -> CodaEnv:
    return CodaEnv(app="kalgebra", max_steps=50)


def _fault_round(env, part: str) -> tuple[str, float]:
    """Kill `part` mid-episode; return (where the cause was reported, seconds the recovering reset took)."""
    env.reset(options={"task": "calc_power"})
    env.step("pyautogui.click(500, 751)")  # mid-episode
    _kill_part(env, part)
    obs, r, term, trunc, info = env.step("pyautogui.write('1')")
    where = "step"
    if not (trunc and PARTS[part] in info.get("error", "")):
        where = "reset"  # allowed: the next reset reports it
        with pytest.raises(DesktopError, match=PARTS[part].split(" (")[0]):
            env.reset(options={"task": "calc_power"})
    t = time.monotonic()
    rewards, term, trunc, info = run_solution(env, "calc_power")
    took = time.monotonic() - t
    assert rewards[-1] == 1.0, (part, info)
    return where, took


@pytest.mark.parametrize("part", list(PARTS))
def test_a_dead_part_is_reported_and_the_next_reset_recovers(part):
    env = _fault_env()
    try:
        where, took = _fault_round(env, part)
        assert where == "step"
        assert took < 20, f"recovering from a dead {part} took {took:.1f}s"
    finally:
        env.close()


def test_a_closed_x_connection_is_reported_and_the_next_reset_recovers():
    env = _fault_env()
    try:
        env.reset(options={"task": "calc_power"})
        other = xdisplay.Display(f":{env.desktop.display}")
        try:  # the X server closes the desktop's own connection (what xkill does to a client)
            mine = env.desktop._xlib
            pixmap = mine.screen().root.create_pixmap(1, 1, mine.screen().root_depth)  # a resource of it
            mine.sync()
            other.create_resource_object("pixmap", pixmap.id).kill_client()
            other.sync()
        finally:
            other.close()
        obs, r, term, trunc, info = env.step("pyautogui.click(500, 751)")
        assert trunc and "X connection was closed" in info["error"], info
        rewards, *_ = run_solution(env, "calc_power")
        assert rewards[-1] == 1.0
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_dead_parts_ten_times_each():
    env = _fault_env()
    counts: dict[str, dict[str, int]] = {}
    times: dict[str, list[float]] = {}
    try:
        for part in PARTS:
            for _ in range(10):
                where, took = _fault_round(env, part)
                counts.setdefault(part, {}).setdefault(where, 0)
                counts[part][where] += 1
                times.setdefault(part, []).append(round(took, 2))
    finally:
        env.close()
        print("\nfault counts:", json.dumps(counts), "\nrecovery seconds:", json.dumps(times))
    assert all(sum(c.values()) == 10 for c in counts.values()), counts


# ------------------------------------------------------------------------------------ 5. frozen X
def _in_thread(fn, timeout: float):
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    return t.is_alive(), box


def test_a_frozen_x_server_ends_the_step_and_reset_rebuilds():
    env = CodaEnv(app="kalgebra", backend_options={"x_timeout": 2.0})
    xvfb = None
    try:
        env.reset(options={"task": "calc_power"})
        xvfb = env.desktop._procs["xvfb"]
        os.kill(xvfb.pid, signal.SIGSTOP)
        t = time.monotonic()
        hung, box = _in_thread(lambda: env.step("pyautogui.click(500, 751)"), 30)
        assert not hung, "step hung on a frozen X server"
        took = time.monotonic() - t
        obs, r, term, trunc, info = box["value"]
        assert trunc and "did not answer within 2s" in info["error"], info
        assert took < 10, took
        assert wait_until(lambda: _proc_state(xvfb.pid) in (None, "Z"), 5)  # the frozen desktop was killed
        rewards, *_ = run_solution(env, "calc_power")
        assert rewards[-1] == 1.0
        # frozen between episodes: the reset notices and rebuilds instead of hanging
        xvfb = env.desktop._procs["xvfb"]
        os.kill(xvfb.pid, signal.SIGSTOP)
        hung, box = _in_thread(lambda: run_solution(env, "calc_power"), 60)
        assert not hung, "reset hung on a frozen X server"
        assert "error" not in box, box.get("error")
        assert box["value"][0][-1] == 1.0
    finally:
        if xvfb is not None and xvfb.poll() is None:
            os.kill(xvfb.pid, signal.SIGCONT)
        env.close()


# ------------------------------------------------------------------------------------ 6. temp folders
HOLDER = """
import sys, time
from coda_env.env import CodaEnv
env = CodaEnv(app="kalgebra", task="calc_power")
env.reset(seed=0)
print(env.desktop.token, env.desktop.tmpdir, env.unwrapped._home, flush=True)
if sys.argv[1] == "wait":
    time.sleep(600)
"""


def _holder(tmp: str, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, mode],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=str(ROOT),
        env={**os.environ, "TMPDIR": tmp},
    )


def _coda_entries(tmp: str) -> list[str]:
    return sorted(e for e in os.listdir(tmp) if e.startswith("coda-"))


@pytest.fixture
def private_tmp():
    tmp = tempfile.mkdtemp(prefix="ct-", dir="/tmp")  # short: the desktop's sockets live below it
    yield tmp
    subprocess.run(["rm", "-rf", tmp])


def test_no_temp_folder_survives_a_sigkilled_parent(private_tmp):
    holder = _holder(private_tmp, "wait")
    try:
        token, desk_tmp, home = holder.stdout.readline().split()
        assert Path(desk_tmp).is_dir() and Path(home).is_dir()
        assert _coda_entries(private_tmp)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert wait_until(lambda: not live_token_pids(token), 15), live_token_pids(token)
    assert wait_until(lambda: not _coda_entries(private_tmp), 15), _coda_entries(private_tmp)


def test_no_temp_folder_survives_an_exit_without_close(private_tmp):
    holder = _holder(private_tmp, "exit")
    token = holder.stdout.readline().split()[0]
    assert holder.wait(timeout=60) == 0
    assert not _coda_entries(private_tmp)
    assert wait_until(lambda: not live_token_pids(token), 10), live_token_pids(token)


# ------------------------------------------------------------------------------------ 7. clear errors
@pytest.mark.parametrize("kind", ["not permitted", "a file"])
def test_an_unusable_temp_folder_is_a_clear_error(monkeypatch, tmp_path, kind):
    if kind == "a file":
        bad = tmp_path / "plain-file"
        bad.write_text("")
    else:
        bad = Path("/sys")  # mkdir there fails even for root
    monkeypatch.setattr(tempfile, "tempdir", str(bad))
    env = CodaEnv(app="kalgebra")
    try:
        with pytest.raises(DesktopError) as err:
            env.reset(options={"task": "calc_power"})
        msg = str(err.value)
        assert str(bad) in msg and "TMPDIR" in msg and "the desktop's folder" in msg, msg
    finally:
        env.close()
