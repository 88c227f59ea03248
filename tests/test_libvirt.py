"""The libvirt backend against libvirt's built-in test driver (no daemon, no VM), plus a `vm` suite.

The test driver keeps real domain, storage and snapshot state in this process and answers screenshots
and sendKey; it has no QEMU monitor and no guest agent, so pointer events and guest commands are tested
as the exact event lists they translate to, and as the clear errors the driver's refusals become.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

libvirt = pytest.importorskip("libvirt", reason="libvirt-python is not installed (pip install 'coda[vm]')")

from coda_env.actions import KEY_NAMES, Action, parse_action
from coda_env.backends import libvirt as lvb
from coda_env.backends.base import Desktop, DesktopError

TEST_URI = "test:///default"
POOL = "default-pool"  # the test driver's built-in dir pool
SIZE = (1280, 800)


def wait_until(cond, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() > deadline:
            return v
        time.sleep(0.02)
    return v


@pytest.fixture(scope="module")
def conn():
    c = libvirt.open(TEST_URI)
    yield c
    c.close()


@pytest.fixture(scope="module")
def base(conn) -> str:
    """A base volume in the test driver's pool (10 GiB, qcow2)."""
    pool = conn.storagePoolLookupByName(POOL)
    name = f"base-{uuid.uuid4().hex[:8]}.qcow2"
    vol = pool.createXML(
        f"<volume><name>{name}</name><capacity unit='G'>10</capacity><target><format type='qcow2'/></target></volume>",
        0,
    )
    yield vol.path()
    vol.delete(0)


def config(base: str, **kw) -> lvb.LibvirtConfig:
    opts = dict(uri=TEST_URI, base_image=base, pool=POOL, wait_for_agent=False)
    opts.update(kw)
    return lvb.LibvirtConfig(**opts)


@pytest.fixture
def desktop(base):
    d = lvb.LibvirtDesktop(config(base))
    d.start()
    yield d
    d.stop()


def coda_domains(conn) -> list[str]:
    return sorted(d.name() for d in conn.listAllDomains() if d.name().startswith("coda-"))


def coda_volumes(conn) -> list[str]:
    return sorted(v for v in conn.storagePoolLookupByName(POOL).listVolumes() if v.startswith("coda-"))


# ------------------------------------------------------------------------------------ lifecycle


def test_protocol_and_make_desktop(base):
    from coda_env.env import make_desktop

    d = make_desktop("libvirt", 1024, 768, uri=TEST_URI, base_image=base, pool=POOL, wait_for_agent=False)
    assert isinstance(d, lvb.LibvirtDesktop) and isinstance(d, Desktop)
    assert (d.width, d.height, d.config.width, d.config.height) == (1024, 768, 1024, 768)
    assert not d.alive()
    with pytest.raises(TypeError):
        make_desktop("libvirt", 1024, 768, no_such_option=1)
    with pytest.raises(ValueError, match="'libvirt'"):
        make_desktop("nope", 1024, 768)


def test_start_defines_domain_on_overlay_and_stop_removes_everything(conn, base):
    before_doms, before_vols = coda_domains(conn), coda_volumes(conn)
    d = lvb.LibvirtDesktop(config(base, memory_mib=1536, vcpus=1))
    d.start()
    try:
        assert d.alive()
        dom = conn.lookupByName(d.name)
        assert dom.isActive() and dom.isPersistent()
        xml = dom.XMLDesc()
        assert "<domain type='qemu'" in xml  # software emulation by default
        assert "<input type='tablet' bus='usb'/>" in xml
        assert "org.qemu.guest_agent.0" in xml
        assert "<memory unit='KiB'>1572864</memory>" in xml
        assert "<resolution x='1280' y='800'/>" in xml
        vol = conn.storagePoolLookupByName(POOL).storageVolLookupByName(d.volume)
        assert f"<source file='{vol.path()}'/>" in xml
        vxml = vol.XMLDesc()
        assert f"<backingStore>\n    <path>{base}</path>" in vxml and "<format type='qcow2'/>" in vxml
        assert d._watchdog is not None and d._watchdog.poll() is None
        watchdog = d._watchdog
    finally:
        d.stop()
    assert not d.alive()
    assert coda_domains(conn) == before_doms and coda_volumes(conn) == before_vols
    assert watchdog.wait(timeout=5) is not None
    d.stop()  # idempotent


def test_several_desktops_from_one_base(conn, base):
    base_vol = conn.storageVolLookupByPath(base)
    size = base_vol.info()[1]
    a, b = lvb.LibvirtDesktop(config(base)), lvb.LibvirtDesktop(config(base))
    a.start()
    b.start()
    try:
        assert a.name != b.name and a.volume != b.volume
        assert a.alive() and b.alive()
        for d in (a, b):
            assert base in conn.storagePoolLookupByName(POOL).storageVolLookupByName(d.volume).XMLDesc()
        a.stop()
        assert not a.alive() and b.alive()
        with pytest.raises(libvirt.libvirtError):
            conn.lookupByName(a.name)
        assert conn.lookupByName(b.name).isActive()
    finally:
        a.stop()
        b.stop()
    assert conn.storageVolLookupByPath(base).info()[1] == size  # the base is still there, unchanged


def test_ready_snapshot_saved_once_with_memory_and_reset_reverts(conn, desktop):
    dom = conn.lookupByName(desktop.name)
    assert dom.snapshotListNames(0) == ["coda-ready"]
    snap_xml = dom.snapshotLookupByName("coda-ready", 0).getXMLDesc(0)
    assert "<state>running</state>" in snap_xml and "<memory snapshot='internal'/>" in snap_xml
    desktop.input(Action("type", text="x"))  # state changes after the snapshot ...
    dom.suspend()
    assert dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED
    desktop._pointer = (500, 400)
    desktop.reset()  # ... and a revert brings back the running ready state, pointer included
    assert dom.state()[0] == libvirt.VIR_DOMAIN_RUNNING
    assert desktop._pointer == (0, 0)
    desktop.reset()
    assert dom.snapshotNum(0) == 1  # saved once, reverted many times
    assert desktop.alive()


def test_reset_reverts_in_place_with_hmp_loadvm_and_falls_back_to_libvirt(desktop, monkeypatch):
    """revert_mode='loadvm' asks the running QEMU to `loadvm` (no restart); an HMP error, or a driver with
    no QEMU monitor (the test driver), reverts through libvirt instead."""
    sent, reverted = [], []
    real_revert = desktop._dom.revertToSnapshot
    monkeypatch.setattr(
        desktop._dom, "revertToSnapshot", lambda *a: reverted.append(1) or real_revert(*a), raising=False
    )

    def monitor(dom, cmd, flags):
        sent.append(json.loads(cmd))
        return json.dumps({"return": reply})

    monkeypatch.setattr(desktop._lvq, "qemuMonitorCommand", monitor)
    reply = ""
    desktop.reset()
    assert sent[-1] == {"execute": "human-monitor-command", "arguments": {"command-line": "loadvm coda-ready"}}
    assert reverted == [] and "revert" in desktop.timings
    reply = "Error: Snapshot 'coda-ready' does not exist\r\n"
    desktop.reset()
    assert reverted == [1] and desktop.alive()


def test_reset_before_start_boots(base, conn):
    d = lvb.LibvirtDesktop(config(base))
    try:
        d.reset()
        assert d.alive() and conn.lookupByName(d.name).snapshotNum(0) == 1
    finally:
        d.stop()


def test_gc_and_atexit_finalizer_remove_domain(conn, base):
    d = lvb.LibvirtDesktop(config(base, watchdog=False))
    d.start()
    name = d.name
    assert d._finalizer.atexit  # weakref.finalize also runs at interpreter exit
    del d
    import gc

    gc.collect()
    with pytest.raises(libvirt.libvirtError):
        conn.lookupByName(name)


# ------------------------------------------------------------------------------------ screenshots


def test_screenshot_from_test_driver_is_rgb_of_configured_size(desktop):
    frame = desktop.screenshot()
    assert frame.shape == (800, 1280, 3) and frame.dtype == np.uint8
    assert frame.std() > 0  # the driver's picture, not a blank
    assert np.array_equal(frame[..., 0], frame[..., 1])  # the driver's PNG is grayscale, expanded to RGB


def test_screenshot_of_other_size_is_an_error_without_resize(base):
    d = lvb.LibvirtDesktop(config(base, resize=False))
    d.start()
    try:
        with pytest.raises(DesktopError, match=r"1120x832, not the configured 1280x800"):
            d.screenshot()
    finally:
        d.stop()


@pytest.mark.parametrize("fmt", ["PPM", "PNG"])
def test_decode_screenshot_exact_pixels(fmt):
    from PIL import Image

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (60, 80, 3), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    out = lvb.decode_screenshot(buf.getvalue(), (80, 60))
    assert out.shape == (60, 80, 3) and np.array_equal(out, pixels)
    assert out.flags.writeable
    with pytest.raises(DesktopError, match="cannot decode"):
        lvb.decode_screenshot(b"not an image", (80, 60))


def test_screenshot_after_stop_is_desktop_error(base):
    d = lvb.LibvirtDesktop(config(base))
    d.start()
    d.stop()
    with pytest.raises(DesktopError, match="not running"):
        d.screenshot()


# ------------------------------------------------------------------------------------ keys


def _linux_keycodes() -> dict[str, int]:
    header = Path("/usr/include/linux/input-event-codes.h")
    if not header.exists():
        pytest.skip("linux-libc-dev's input-event-codes.h is not installed")
    return {m[1]: int(m[2], 0) for m in re.finditer(r"#define (KEY_\w+)\s+(0x[0-9a-fA-F]+|\d+)", header.read_text())}


# An independent spelling of the US layout in the kernel's names: the backend's table must agree.
KERNEL_NAMES = {
    "enter": "KEY_ENTER",
    "esc": "KEY_ESC",
    "tab": "KEY_TAB",
    "backspace": "KEY_BACKSPACE",
    "space": "KEY_SPACE",
    "delete": "KEY_DELETE",
    "insert": "KEY_INSERT",
    "home": "KEY_HOME",
    "end": "KEY_END",
    "pageup": "KEY_PAGEUP",
    "pagedown": "KEY_PAGEDOWN",
    "up": "KEY_UP",
    "down": "KEY_DOWN",
    "left": "KEY_LEFT",
    "right": "KEY_RIGHT",
    "ctrl": "KEY_LEFTCTRL",
    "ctrlright": "KEY_RIGHTCTRL",
    "shift": "KEY_LEFTSHIFT",
    "shiftright": "KEY_RIGHTSHIFT",
    "alt": "KEY_LEFTALT",
    "altright": "KEY_RIGHTALT",
    "win": "KEY_LEFTMETA",
    "winright": "KEY_RIGHTMETA",
    "capslock": "KEY_CAPSLOCK",
    "numlock": "KEY_NUMLOCK",
    "scrolllock": "KEY_SCROLLLOCK",
    "printscreen": "KEY_SYSRQ",
    "pause": "KEY_PAUSE",
    "apps": "KEY_COMPOSE",
    "-": "KEY_MINUS",
    "=": "KEY_EQUAL",
    "[": "KEY_LEFTBRACE",
    "]": "KEY_RIGHTBRACE",
    ";": "KEY_SEMICOLON",
    "'": "KEY_APOSTROPHE",
    "`": "KEY_GRAVE",
    "\\": "KEY_BACKSLASH",
    ",": "KEY_COMMA",
    ".": "KEY_DOT",
    "/": "KEY_SLASH",
    "add": "KEY_KPPLUS",
    "subtract": "KEY_KPMINUS",
    "multiply": "KEY_KPASTERISK",
    "divide": "KEY_KPSLASH",
    "decimal": "KEY_KPDOT",
    "volumeup": "KEY_VOLUMEUP",
    "volumedown": "KEY_VOLUMEDOWN",
    "volumemute": "KEY_MUTE",
    "playpause": "KEY_PLAYPAUSE",
    "nexttrack": "KEY_NEXTSONG",
    "prevtrack": "KEY_PREVIOUSSONG",
    "browserback": "KEY_BACK",
    "browserforward": "KEY_FORWARD",
    "browserrefresh": "KEY_REFRESH",
    "browserhome": "KEY_HOMEPAGE",
    "help": "KEY_HELP",
    "yen": "KEY_YEN",
    **{c: f"KEY_{c.upper()}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"},
    **{f"f{i}": f"KEY_F{i}" for i in range(1, 25)},
    **{f"num{i}": f"KEY_KP{i}" for i in range(10)},
}


def test_keycodes_match_the_kernel_header():
    codes = _linux_keycodes()
    for key, kernel in KERNEL_NAMES.items():
        assert lvb.key_chord([key]) == (codes[kernel],), key
    assert lvb.SHIFT == codes["KEY_LEFTSHIFT"]


def test_chords_for_characters_hotkeys_and_shift():
    codes = _linux_keycodes()
    k = lambda n: codes[f"KEY_{n}"]
    assert lvb.key_chord(["a"]) == (k("A"),)
    assert lvb.key_chord(["A"]) == (k("LEFTSHIFT"), k("A"))
    assert lvb.key_chord([":"]) == (k("LEFTSHIFT"), k("SEMICOLON"))
    assert lvb.key_chord(["\n"]) == (k("ENTER"),) and lvb.key_chord([" "]) == (k("SPACE"),)
    assert lvb.key_chord(["ctrl", "shift", "s"]) == (k("LEFTCTRL"), k("LEFTSHIFT"), k("S"))
    assert lvb.key_chord(["ctrl", "+"]) == (k("LEFTSHIFT"), k("LEFTCTRL"), k("EQUAL"))
    with pytest.raises(ValueError, match="US keyboard"):
        lvb.key_chord(["é"])


def test_typing_plan_is_one_chord_per_character():
    (a,) = parse_action("pyautogui.write('x:=2+3')")
    steps, pointer = lvb.plan_input(a, (7, 9), SIZE)
    codes = _linux_keycodes()
    S = codes["KEY_LEFTSHIFT"]
    assert steps == [
        ("keys", (codes["KEY_X"],)),
        ("keys", (S, codes["KEY_SEMICOLON"])),
        ("keys", (codes["KEY_EQUAL"],)),
        ("keys", (codes["KEY_2"],)),
        ("keys", (S, codes["KEY_EQUAL"])),
        ("keys", (codes["KEY_3"],)),
    ]
    assert pointer == (7, 9)


def test_every_mapped_key_name_is_accepted_by_send_key(desktop):
    """libvirt validates Linux keycodes against its own table: a wrong one is an error."""
    mapped = [
        k
        for k in KEY_NAMES
        if k
        not in (
            "accept",
            "final",
            "junja",
            "modechange",
            "kanji",
            "clear",
            "select",
            "execute",
            "separator",
            "browserstop",
            "browsersearch",
        )
    ]
    for key in mapped:
        desktop.input(Action("press", keys=(key,)))
    desktop.input(Action("hotkey", keys=("ctrl", "alt", "delete")))
    desktop.input(Action("type", text="Hello, World! x:=2+3\n"))
    with pytest.raises(ValueError, match="cannot type"):
        desktop.input(Action("type", text="π"))


def test_send_key_rejects_a_bad_keycode_in_test_driver(conn, desktop):
    """Proves the test above can fail: the driver checks the codes it is sent."""
    dom = conn.lookupByName(desktop.name)
    with pytest.raises(libvirt.libvirtError, match="invalid keycode"):
        dom.sendKey(libvirt.VIR_KEYCODE_SET_LINUX, 10, [9999], 1, 0)


# ------------------------------------------------------------------------------------ pointer


def _abs(x, y):
    return (
        "qmp",
        [{"type": "abs", "data": {"axis": "x", "value": x}}, {"type": "abs", "data": {"axis": "y", "value": y}}],
    )


def _btn(b, down):
    return ("qmp", [{"type": "btn", "data": {"down": down, "button": b}}])


def test_click_plan_moves_then_presses_and_releases_in_separate_syncs():
    (a,) = parse_action("pyautogui.doubleClick(1279, 0, button='right')")
    steps, pointer = lvb.plan_input(a, (0, 0), SIZE)
    assert steps == [
        _abs(0x7FFF, 0),
        _btn("right", True),
        _btn("right", False),
        _btn("right", True),
        _btn("right", False),
    ]
    assert pointer == (1279, 0)
    (a,) = parse_action("pyautogui.click(640, 400)")
    steps, _ = lvb.plan_input(a, (0, 0), SIZE)
    assert steps[0] == _abs(round(640 * 0x7FFF / 1279), round(400 * 0x7FFF / 799))


def test_move_keeps_the_missing_coordinate_and_mouse_down_up():
    steps, pointer = lvb.plan_input(Action("move", x=None, y=799), (100, 5), SIZE)
    assert steps == [_abs(round(100 * 0x7FFF / 1279), 0x7FFF)] and pointer == (100, 799)
    steps, pointer = lvb.plan_input(Action("mouse_down", button="middle"), (3, 4), SIZE)
    assert steps == [_btn("middle", True)] and pointer == (3, 4)
    steps, _ = lvb.plan_input(Action("mouse_up"), (3, 4), SIZE)
    assert steps == [_btn("left", False)]


def test_drag_plan_interpolates_between_press_and_release():
    steps, pointer = lvb.plan_input(Action("drag", x=120, y=0, seconds=1.2), (0, 0), SIZE)
    assert steps[0] == _btn("left", True) and steps[-1] == _btn("left", False)
    moves = [s for s in steps if s[0] == "qmp" and s[1][0]["type"] == "abs"]
    sleeps = [s[1] for s in steps if s[0] == "sleep"]
    assert len(moves) == 12 and moves[-1] == _abs(round(120 * 0x7FFF / 1279), 0)
    xs = [m[1][0]["data"]["value"] for m in moves]
    assert xs == sorted(xs) and len(set(xs)) == 12
    assert sum(sleeps) == pytest.approx(1.2)
    assert pointer == (120, 0)


def test_scroll_plans():
    steps, _ = lvb.plan_input(Action("scroll", amount=2), (0, 0), SIZE)
    assert steps == [_btn("wheel-up", True), _btn("wheel-up", False)] * 2
    steps, _ = lvb.plan_input(Action("scroll", amount=-1, x=10, y=10), (0, 0), SIZE)
    assert steps[1:] == [_btn("wheel-down", True), _btn("wheel-down", False)]
    shift = lambda down: ("qmp", [{"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": "shift"}}}])
    steps, _ = lvb.plan_input(Action("hscroll", amount=1), (0, 0), SIZE)
    assert steps == [shift(True), _btn("wheel-down", True), _btn("wheel-down", False), shift(False)]
    steps, _ = lvb.plan_input(Action("hscroll", amount=-1), (0, 0), SIZE, native_hscroll=True)
    assert steps == [_btn("wheel-left", True), _btn("wheel-left", False)]


def test_held_keys_use_qcodes_with_shift_for_shifted_characters():
    steps, _ = lvb.plan_input(Action("key_down", keys=("ctrl",)), (0, 0), SIZE)
    assert steps == [("qmp", [{"type": "key", "data": {"down": True, "key": {"type": "qcode", "data": "ctrl"}}}])]
    steps, _ = lvb.plan_input(Action("key_up", keys=("!",)), (0, 0), SIZE)
    assert [e["data"]["key"]["data"] for e in steps[0][1]] == ["1", "shift"]
    assert [e["data"]["down"] for e in steps[0][1]] == [False, False]


def test_plan_covers_every_non_terminal_action_kind():
    from coda_env.actions import KINDS, TERMINAL_KINDS

    samples = {
        "move": Action("move", x=1, y=1),
        "click": Action("click"),
        "mouse_down": Action("mouse_down"),
        "mouse_up": Action("mouse_up"),
        "drag": Action("drag", x=5, y=5),
        "scroll": Action("scroll", amount=1),
        "hscroll": Action("hscroll", amount=1),
        "type": Action("type", text="a"),
        "press": Action("press", keys=("enter",), presses=3),
        "hotkey": Action("hotkey", keys=("ctrl", "c")),
        "key_down": Action("key_down", keys=("shift",)),
        "key_up": Action("key_up", keys=("shift",)),
        "sleep": Action("sleep", seconds=0.5),
        "wait": Action("wait"),
    }
    assert set(samples) | TERMINAL_KINDS == set(KINDS)
    for kind, a in samples.items():
        steps, _ = lvb.plan_input(a, (0, 0), SIZE)
        assert kind == "wait" or steps, kind
    assert lvb.plan_input(samples["press"], (0, 0), SIZE)[0] == [("keys", (28,))] * 3
    assert lvb.plan_input(samples["sleep"], (0, 0), SIZE)[0] == [("sleep", 0.5)]


def test_pointer_input_needs_the_qemu_monitor(desktop):
    """The test driver has no QEMU monitor: the refusal is a DesktopError naming the call."""
    with pytest.raises(DesktopError, match="QemuMonitorCommand"):
        desktop.input(Action("click", x=10, y=10))
    assert desktop._pointer == (0, 0)  # a failed action does not move the tracked pointer


# ------------------------------------------------------------------------------------ errors


def test_cannot_connect_says_how_to_start_libvirtd():
    # A local URI with no daemon behind it, whether or not one runs here (socket= names the daemon's socket).
    d = lvb.LibvirtDesktop(
        lvb.LibvirtConfig(uri="qemu:///system?socket=/nonexistent/libvirt-sock", base_image="/x.qcow2")
    )
    with pytest.raises(lvb.LibvirtConnectError, match=r"libvirtd -d.*uri"):
        d.start()
    assert not d.alive()
    with pytest.raises(lvb.LibvirtConnectError, match="qemu\\+ssh://nohost.invalid/system"):
        lvb.LibvirtDesktop(lvb.LibvirtConfig(uri="qemu+ssh://nohost.invalid/system?no_tty=1", base_image="/x")).start()


def test_bad_uri():
    with pytest.raises(lvb.LibvirtConnectError, match="cannot connect to libvirt at 'bogus-driver:///x'"):
        lvb.LibvirtDesktop(lvb.LibvirtConfig(uri="bogus-driver:///x", base_image="/x")).start()


def test_missing_base_image(conn, monkeypatch):
    monkeypatch.delenv("CODA_VM_IMAGE", raising=False)
    with pytest.raises(lvb.BaseImageError, match="/nowhere/base.qcow2 is in no storage pool"):
        lvb.LibvirtDesktop(config("/nowhere/base.qcow2")).start()
    with pytest.raises(lvb.BaseImageError, match="no base image configured.*make vm-image"):
        lvb.LibvirtDesktop(config("")).start()
    assert coda_domains(conn) == [] and coda_volumes(conn) == []


def test_guest_agent_silent_fails_start_with_clear_message(conn, base):
    d = lvb.LibvirtDesktop(config(base, wait_for_agent=True, boot_timeout=5))
    t0 = time.monotonic()
    with pytest.raises(lvb.GuestAgentError, match="guest agent command guest-ping.*no QEMU guest agent"):
        d.start()
    assert time.monotonic() - t0 < 5  # "not supported" is final: no waiting for a timeout
    assert not d.alive() and coda_domains(conn) == [] and coda_volumes(conn) == []


def test_guest_commands_without_agent_are_clear_errors(desktop):
    with pytest.raises(lvb.GuestAgentError, match="guest-exec"):
        desktop.run(["true"])
    with pytest.raises(lvb.GuestAgentError, match="guest-file-open"):
        desktop.read_file("/etc/hostname")
    with pytest.raises(lvb.GuestAgentError, match="guest-exec"):
        desktop.write_file("/tmp/x/y", b"data")
    with pytest.raises(lvb.GuestAgentError, match="guest-exec"):
        desktop.spawn(["kalgebra"])


def test_domain_rejected_or_template_broken_is_boot_error(conn, base):
    with pytest.raises(lvb.DomainBootError, match="unknown or malformed placeholder.*nosuch"):
        lvb.LibvirtDesktop(config(base, domain_xml="<domain type='$domain_type'><name>$nosuch</name></domain>")).start()
    with pytest.raises(lvb.DomainBootError, match="libvirt rejected the domain XML"):
        lvb.LibvirtDesktop(
            config(base, domain_xml="<domain type='$domain_type'><name>$name</name><memory>lots</memory></domain>")
        ).start()
    assert coda_domains(conn) == [] and coda_volumes(conn) == []


def test_template_from_file(tmp_path, base, conn):
    t = tmp_path / "domain.xml"
    t.write_text(lvb.DEFAULT_DOMAIN_XML.replace("<vcpu>$vcpus</vcpu>", "<vcpu>3</vcpu>"))
    d = lvb.LibvirtDesktop(config(base, domain_xml=str(t), domain_type="kvm"))
    d.start()
    try:
        xml = conn.lookupByName(d.name).XMLDesc()
        assert "<vcpu placement='static'>3</vcpu>" in xml and "<domain type='kvm'" in xml
        assert "host-passthrough" in xml
    finally:
        d.stop()


def test_base_image_from_env_and_the_domain_xml_beside_it(tmp_path, monkeypatch):
    """`make vm-image` writes domain.xml beside the image (which has no bootloader): with a local URI and no
    domain_xml given, that template is the one used; a remote URI keeps the default (its files are the
    remote host's). CODA_VM_IMAGE is the default base image."""
    image = tmp_path / "coda-debian12.qcow2"
    image.write_bytes(b"QFI\xfb")
    monkeypatch.setenv("CODA_VM_IMAGE", str(image))
    assert lvb.LibvirtConfig().base_image == str(image)
    local = lvb.LibvirtDesktop(lvb.LibvirtConfig(uri="qemu:///system"))
    remote = lvb.LibvirtDesktop(lvb.LibvirtConfig(uri="qemu+ssh://host/system"))
    local.name = remote.name = "coda-x"
    assert "<boot dev='hd'/>" in local.domain_xml("/o.qcow2")  # no domain.xml beside it yet
    (tmp_path / "domain.xml").write_text(lvb.DEFAULT_DOMAIN_XML.replace("<boot dev='hd'/>", "<kernel>/k</kernel>"))
    xml = local.domain_xml("/o.qcow2")
    assert "<kernel>/k</kernel>" in xml and "<name>coda-x</name>" in xml and 'file="/o.qcow2"' in xml
    assert "<boot dev='hd'/>" in remote.domain_xml("/o.qcow2")
    explicit = lvb.LibvirtDesktop(lvb.LibvirtConfig(uri="qemu:///system", domain_xml=lvb.DEFAULT_DOMAIN_XML))
    explicit.name = "coda-y"
    assert "<boot dev='hd'/>" in explicit.domain_xml("/o.qcow2")


def test_missing_libvirt_python_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "libvirt", None)  # what `import libvirt` sees when it is not installed
    with pytest.raises(lvb.LibvirtMissingError, match=r"pip install 'coda\[vm\]'.*libvirt-dev"):
        lvb.LibvirtDesktop(lvb.LibvirtConfig())


def test_accessibility_is_read_in_the_guest(desktop):
    """App state comes from coda_env/a11y.py run through the guest agent at the guest's fixed bus address;
    without an agent (this driver) that says what failed instead of answering nothing."""
    assert desktop.env["DISPLAY"] == ":0"
    assert desktop.env["DBUS_SESSION_BUS_ADDRESS"] == "unix:path=/run/coda/bus"
    source = desktop.a11y()
    assert isinstance(source, lvb.GuestA11y) and source.address == "unix:path=/run/coda/bus"
    with pytest.raises(lvb.GuestAgentError, match="guest-exec"):
        source.app_tree("kalgebra")


def test_guest_a11y_parses_the_readers_output(monkeypatch, desktop):
    from coda_env.a11y import A11yError

    sent = []

    def run(argv, timeout=30.0):
        sent.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, OUT.pop(0), b"")

    OUT = [
        json.dumps(
            {
                "bus": ":1.5",
                "path": "/r",
                "role": "application",
                "name": "kalgebra",
                "children": [
                    {
                        "bus": ":1.5",
                        "path": "/t",
                        "role": "page tab",
                        "name": "2D Graph",
                        "states": ["selected"],
                        "extents": [1, 2, 30, 40],
                    }
                ],
            }
        ).encode(),
        b"null",
        b"garbage",
        b'{"path": "/x"}',
    ]
    monkeypatch.setattr(desktop, "run", run)
    source = desktop.a11y()
    tree = source.app_tree("kalgebra", skip_roles=frozenset({"menu bar", "combo box"}), texts=True)
    # the reader's whole text travels with the call, run isolated by the system's python3: no file in the guest
    assert sent[0] == [
        "/usr/bin/python3",
        "-I",
        "-c",
        lvb.A11Y_SOURCE,
        "tree",
        "unix:path=/run/coda/bus",
        "kalgebra",
        "--skip",
        "combo box",
        "--skip",
        "menu bar",
        "--texts",
    ]
    tab = tree.first("page tab")
    assert source.states(tab) == {"selected"} and source.extents(tab) == (1, 2, 30, 40)
    assert source.app_tree("kalgebra") is None
    with pytest.raises(A11yError, match="printed no JSON tree"):
        source.app_tree("kalgebra")
    with pytest.raises(A11yError, match="malformed accessibility tree"):
        source.app_tree("kalgebra")
    monkeypatch.setattr(
        desktop,
        "run",
        lambda argv, timeout=30.0: subprocess.CompletedProcess(
            argv, 1, b"", b"a11y: cannot reach the accessibility bus: [Errno 2] No such file or directory"
        ),
    )
    with pytest.raises(A11yError, match=r"reader failed \(exit 1\): a11y: cannot reach the accessibility bus"):
        source.app_tree("kalgebra")


# ------------------------------------------------------------------------------------ helpers


def test_is_local_uri():
    assert lvb.is_local_uri("qemu:///system") and lvb.is_local_uri("qemu:///session")
    assert lvb.is_local_uri("test:///default")
    assert not lvb.is_local_uri("qemu+ssh://host/system")
    assert not lvb.is_local_uri("qemu://host/system")
    assert not lvb.is_local_uri("qemu+tcp://10.0.0.1/system")


def test_parse_wmctrl():
    text = (
        "0x00c00003  0 0    0    1280 800  kalgebra.kalgebra  vm KAlgebra — Calculator\n"
        "0x00e00001 -1 0    770  1280 30   panel.Panel vm \n"
        "garbage line\n"
    )
    wins = lvb.parse_wmctrl(text)
    assert wins[0] == lvb.Window(0xC00003, "kalgebra", "KAlgebra — Calculator", 0, 0, 1280, 800)
    assert wins[1].wm_class == "Panel" and wins[1].title == "" and wins[1].y == 770
    assert len(wins) == 2


def test_image_size_reads_qcow2_header(tmp_path):
    p = tmp_path / "x.qcow2"
    p.write_bytes(b"QFI\xfb" + b"\0" * 20 + (5 << 30).to_bytes(8, "big") + b"\0" * 64)
    assert lvb._image_size(str(p), "qcow2") == 5 << 30
    raw = tmp_path / "x.raw"
    raw.write_bytes(b"\0" * 4096)
    assert lvb._image_size(str(raw), "raw") == 4096


# ------------------------------------------------------------------------------------ no orphans


def test_destroy_domain_removes_running_domain_and_overlay(conn, base):
    name = f"coda-t-{uuid.uuid4().hex[:8]}"
    pool = conn.storagePoolLookupByName(POOL)
    pool.createXML(f"<volume><name>{name}.qcow2</name><capacity unit='G'>1</capacity></volume>", 0)
    dom = conn.defineXML(
        f"<domain type='qemu'><name>{name}</name><memory>65536</memory><os><type>hvm</type></os></domain>"
    )
    dom.create()
    assert lvb.destroy_domain(conn, name, POOL, f"{name}.qcow2") == ["destroyed", "undefined", "deleted overlay"]
    with pytest.raises(libvirt.libvirtError):
        conn.lookupByName(name)
    assert f"{name}.qcow2" not in pool.listVolumes()
    assert lvb.destroy_domain(conn, name, POOL, f"{name}.qcow2") == []


def test_watchdog_acts_when_its_stdin_closes():
    name = f"coda-w-{uuid.uuid4().hex[:8]}"
    w = lvb._start_watchdog(TEST_URI, name, POOL, f"{name}.qcow2", stdout=subprocess.PIPE)
    assert w.poll() is None  # it waits while its parent lives
    w.stdin.close()
    out = w.stdout.read()
    assert w.wait(timeout=20) == 0
    # Its own connection to the test driver sees a fresh state: nothing to remove, but it ran the cleanup.
    assert out.decode().strip() == f"watchdog {name}: nothing to remove"


CHILD = """
import sys
from coda_env.backends import libvirt as lvb
d = lvb.LibvirtDesktop(lvb.LibvirtConfig(uri='test:///default', base_image=sys.argv[1], pool='default-pool',
                                         wait_for_agent=False))
d.start()
print(d._watchdog.pid, flush=True)
sys.stdin.read()
"""


def test_watchdog_outlives_a_killed_parent_only_to_clean_up(tmp_path):
    # A base that this child's own test-driver state has: its pool starts empty, so create it in the child.
    script = tmp_path / "child.py"
    script.write_text(
        "import libvirt\nc = libvirt.open('test:///default')\n"
        "c.storagePoolLookupByName('default-pool').createXML(\"<volume><name>b.qcow2</name>"
        "<capacity unit='G'>1</capacity></volume>\", 0)\n" + CHILD
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    child = subprocess.Popen(
        [sys.executable, str(script), "/default-pool/b.qcow2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        line = child.stdout.readline().decode().strip()
        assert line.isdigit(), line
        wpid = int(line)
        assert Path(f"/proc/{wpid}").exists()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=5)
        gone = wait_until(
            lambda: (
                not Path(f"/proc/{wpid}").exists()
                or Path(f"/proc/{wpid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            ),
            20,
        )
        assert gone, "the watchdog did not notice its parent's death"
    finally:
        child.kill()
        child.wait()


# ------------------------------------------------------------------------------------ a real VM


def _vm_image() -> tuple[str, str | None]:
    """The image from `make vm-image` (CODA_VM_IMAGE) and the domain.xml beside it, or skip."""
    image = os.environ.get("CODA_VM_IMAGE", "vm_images/build/coda-debian12.qcow2")
    if not os.path.exists(image):
        if os.environ.get("CODA_VM_REQUIRED"):  # `make vm-test`: a missing image is a failure, not a skip
            pytest.fail(f"no VM image at {image} (build it with `make vm-image`)")
        pytest.skip(f"no VM image at {image} (build it with `make vm-image`)")
    # build.sh's image has no bootloader: the domain.xml beside it boots the kernel beside it.
    xml = os.environ.get("CODA_VM_DOMAIN_XML", os.path.join(os.path.dirname(os.path.abspath(image)), "domain.xml"))
    return os.path.abspath(image), xml if os.path.exists(xml) else None


VM_OPTIONS = dict(pool="coda-test", overlay_dir="/var/lib/libvirt/images/coda-test")


@pytest.mark.vm
def test_real_vm_round_trip():
    """Boot the image under qemu:///system and use every part of the desktop."""
    image, xml = _vm_image()
    d = lvb.LibvirtDesktop(lvb.LibvirtConfig(base_image=image, domain_xml=xml, **VM_OPTIONS))
    d.start()
    try:
        assert {"boot", "agent", "desktop", "a11y", "snapshot"} <= set(d.timings)
        assert d.screenshot().shape == (800, 1280, 3)
        assert d.run(["echo", "hi"]).stdout == b"hi\n"
        d.write_file("/tmp/coda/x.txt", b"\x00\x01data")
        assert d.read_file("/tmp/coda/x.txt") == b"\x00\x01data"
        p = d.spawn(["sleep", "600"])
        assert p.poll() is None
        d.kill_group(p)
        assert p.poll() is not None
        after = d.spawn(["sleep", "600"])  # started after the snapshot: the revert ends it
        d.input(Action("click", x=640, y=400))
        d.input(Action("type", text="x:=2+3\n"))
        d.write_file("/tmp/coda/marker", b"1")
        d.reset()
        with pytest.raises(FileNotFoundError):
            d.read_file("/tmp/coda/marker")  # the revert took the disk back too
        assert after.poll() is not None
        assert d.a11y().app_tree("no-such-app") is None  # the guest's AT-SPI bus answers after a revert
        with pytest.raises(FileNotFoundError):
            d.read_file("/run/coda/a11y.py")  # the reader is sent with each call: no copy in the guest
    finally:
        d.stop()


VM_CHILD = """
import sys
from coda_env.backends import libvirt as lvb
d = lvb.LibvirtDesktop(lvb.LibvirtConfig(base_image=sys.argv[1], domain_xml=sys.argv[2] or None, pool=sys.argv[3],
                                         overlay_dir=sys.argv[4], wait_for_agent=False))
d.start()
print(d.name, flush=True)
sys.stdin.read()
"""


@pytest.mark.vm
def test_vm_of_a_killed_parent_is_removed():
    """SIGKILL the process that owns a running VM: its watchdog destroys the domain and deletes the overlay."""
    image, xml = _vm_image()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    child = subprocess.Popen(
        [sys.executable, "-c", VM_CHILD, image, xml or "", VM_OPTIONS["pool"], VM_OPTIONS["overlay_dir"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    conn = libvirt.open("qemu:///system")
    try:
        name = child.stdout.readline().decode().strip()
        assert name.startswith("coda-"), name
        assert conn.lookupByName(name).isActive()
        pool = conn.storagePoolLookupByName(VM_OPTIONS["pool"])
        assert f"{name}.qcow2" in pool.listVolumes()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        assert wait_until(lambda: name not in [d.name() for d in conn.listAllDomains()], 60), "domain left"
        pool.refresh(0)
        assert f"{name}.qcow2" not in pool.listVolumes()
    finally:
        child.kill()
        child.wait()
        conn.close()


def _remote_pools(uri: str, image: str) -> dict:
    """For a remote URI the base must be in one of that host's storage pools, and the overlays need a pool:
    both made there through the connection (here the "remote" host is this one, reached over ssh).

    The base's pool is named after its folder: libvirtd keeps a transient pool across its own restarts (in
    /run/libvirt/storage), so a fixed name could still point at the folder of an earlier checkout."""
    import hashlib

    folder = os.path.dirname(image)
    base_pool = f"coda-test-base-{hashlib.sha1(folder.encode()).hexdigest()[:8]}"
    conn = libvirt.open(uri)
    try:
        for name, path in ((base_pool, folder), ("coda-test-remote", "/var/lib/libvirt/images/coda-test-remote")):
            if name == base_pool:
                try:
                    conn.storageVolLookupByPath(image)
                    continue  # already in a pool there
                except libvirt.libvirtError:
                    pass
            try:
                pool = conn.storagePoolLookupByName(name)
            except libvirt.libvirtError:  # WITH_BUILD makes the folder on that host
                pool = conn.storagePoolCreateXML(
                    f"<pool type='dir'><name>{name}</name><target><path>{path}</path></target></pool>",
                    libvirt.VIR_STORAGE_POOL_CREATE_WITH_BUILD,
                )
            pool.refresh(0)
    finally:
        conn.close()
    return dict(uri=uri, pool="coda-test-remote")


@pytest.fixture(scope="session")
def loopback_ssh_uri(tmp_path_factory):
    """A `qemu+ssh://` URI whose ssh hop is real: a private sshd on 127.0.0.1 (its own host key, one
    authorized key, a free port) stands in for a remote host and reaches this machine's libvirtd, so the
    backend takes libvirt's remote transport end to end. The ssh wrapper keeps its own known_hosts: nothing
    of the user's ssh setup is read or written. sshd ends with the session."""
    sshd = "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        why = "openssh-server is not installed (`make vm-setup` installs it)"
        pytest.fail(why) if os.environ.get("CODA_VM_REQUIRED") else pytest.skip(why)
    d = tmp_path_factory.mktemp("ssh")
    for key in ("host", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "id.pub").read_text())
    with socket_port() as port:
        pass
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nPidFile none\n"
    )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    log = open(d / "sshd.log", "wb")
    proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(d / "sshd_config")], stdout=log, stderr=log)
    wrapper = d / "ssh"
    wrapper.write_text(
        f"#!/bin/sh\nexec ssh -i {d}/id -o UserKnownHostsFile={d}/known_hosts "
        f'-o StrictHostKeyChecking=accept-new "$@"\n'
    )
    wrapper.chmod(0o755)
    try:
        import socket

        def listening() -> bool:
            if proc.poll() is not None:
                return True
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        assert wait_until(listening, 10) and proc.poll() is None, (d / "sshd.log").read_text()
        import getpass

        yield f"qemu+ssh://{getpass.getuser()}@127.0.0.1:{port}/system?command={wrapper}&no_tty=1"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.mark.vm
@pytest.mark.parametrize("where", ["local", "remote"])
def test_kalgebra_task_through_a_vm(where, request):
    """The same env, tasks and checks with KAlgebra inside a VM: the oracle of a task scores 1.0; then a
    reset (a revert to the snapshot saved with KAlgebra up) and DONE at once scores 0.0. "remote": the same
    over a qemu+ssh:// URI: CODA_VM_REMOTE_URI (a real remote host that has the image at the same path), or
    else this machine's libvirtd through a loopback sshd (`loopback_ssh_uri`)."""
    from coda_env.env import CodaEnv

    from .conftest import run_solution

    image, xml = _vm_image()
    uri = "qemu:///system"
    if where == "remote":
        uri = os.environ.get("CODA_VM_REMOTE_URI") or request.getfixturevalue("loopback_ssh_uri")
    options = dict(VM_OPTIONS) if uri == "qemu:///system" else _remote_pools(uri, image)
    env = CodaEnv(app="kalgebra", backend="libvirt", backend_options=dict(base_image=image, domain_xml=xml, **options))
    figures: dict[str, object] = {}
    try:
        t0 = time.monotonic()
        rewards, term, trunc, info = run_solution(env, "calc_power")
        figures["first_episode_s"] = time.monotonic() - t0
        figures["desktop"] = dict(env.desktop.timings)
        assert term and not trunc and rewards[-1] == 1.0, info.get("checks")
        assert info["success"] is True and all(r == 0.0 for r in rewards[:-1])
        resets = []
        for _ in range(2):
            obs, info = env.reset(options={"task": "calc_power"})
            resets.append(dict(env.timings))
            assert obs["screenshot"].shape == (800, 1280, 3)
            obs, r, term, trunc, info = env.step("DONE")
            assert term and r == 0.0 and info["success"] is False, info.get("checks")
        figures["resets"] = resets
        obs, info = env.reset(options={"task": "calc_derivative_at_point"})  # another task, same snapshot
        assert obs["instruction"] == env.unwrapped.tasks["calc_derivative_at_point"].instruction
        name = env.desktop.name
    finally:
        env.close()
    conn = libvirt.open(uri)
    try:
        assert name not in [d.name() for d in conn.listAllDomains()]
        assert env.desktop.volume not in conn.storagePoolLookupByName(options["pool"]).listVolumes()
    finally:
        conn.close()
    print("vm figures:", json.dumps(figures))
    out = os.environ.get("CODA_VM_FIGURES")
    if out:
        Path(out).write_text(json.dumps(figures, indent=1))


@pytest.mark.vm
def test_two_envs_from_one_base_at_once():
    """Two envs of an async vector env, each on its own VM and overlay of the one base, at the same time: the
    oracle in one and DONE in the other score [1, 0] (neither sees the other's input); the base is never
    written; close() removes both domains and overlays. No domain_xml is passed: the one beside the image
    is found."""
    import gymnasium as gym

    import coda_env  # noqa: F401  (registers the ids)
    from coda_env.tasks import load_tasks

    image, _ = _vm_image()
    before = os.stat(image)
    conn = libvirt.open("qemu:///system")
    envs = gym.make_vec(
        "coda/KAlgebra-v0",
        num_envs=2,
        vectorization_mode="async",
        task="calc_power",
        backend="libvirt",
        backend_options=dict(base_image=image, **VM_OPTIONS),
    )
    try:
        obs, info = envs.reset(seed=0)
        assert obs["screenshot"].shape == (2, 800, 1280, 3)
        running = [d for d in conn.listAllDomains() if d.name().startswith("coda-") and d.isActive()]
        assert len(running) >= 2
        pool = conn.storagePoolLookupByName(VM_OPTIONS["pool"])
        pool.refresh(0)
        ours = [f"{d.name()}.qcow2" for d in running]
        assert len(set(ours) & set(pool.listVolumes())) >= 2  # an overlay each
        for action in load_tasks("kalgebra")["calc_power"].solution[:-1]:
            obs, r, term, trunc, info = envs.step([action, "WAIT"])
            assert not term.any() and not trunc.any()
        obs, r, term, trunc, info = envs.step(["DONE", "DONE"])
        assert term.all() and r.tolist() == [1.0, 0.0], info
    finally:
        envs.close()
    try:
        left = {d.name() for d in conn.listAllDomains()}
        assert not left & {d.name() for d in running}
        pool.refresh(0)
        assert not set(ours) & set(pool.listVolumes())
    finally:
        conn.close()
    after = os.stat(image)
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)  # the base is only read


def test_vm_images_domain_template_is_accepted(tmp_path, base, conn):
    """vm_images/domain.xml.in, filled in as build.sh does, defines and starts a domain."""
    text = (Path(__file__).resolve().parents[1] / "vm_images" / "domain.xml.in").read_text()
    t = tmp_path / "domain.xml"
    t.write_text(text.replace("@KERNEL@", "/b/vmlinuz").replace("@INITRD@", "/b/initrd.img"))
    d = lvb.LibvirtDesktop(config(base, domain_xml=str(t)))
    d.start()
    try:
        xml = conn.lookupByName(d.name).XMLDesc()
        assert "<kernel>/b/vmlinuz</kernel>" in xml and "root=/dev/vda" in xml
        assert "<input type='tablet' bus='usb'/>" in xml and "org.qemu.guest_agent.0" in xml
    finally:
        d.stop()


def test_scienceboard_domain_template_is_accepted(base, conn, osworld):
    """vm_images/scienceboard.xml.in (SATA disk, a NIC on the default network, no agent channel) defines and
    starts a domain, and with guest="http" the desktop comes up through the (stand-in) server."""
    xml = str(Path(__file__).resolve().parents[1] / "vm_images" / "scienceboard.xml.in")
    d = lvb.LibvirtDesktop(
        config(
            base,
            domain_xml=xml,
            wait_for_agent=True,
            guest="http",
            guest_url=osworld.url,
            ready_command=("true",),
            a11y=False,
            width=1920,
            height=1080,
        )
    )
    d.start()
    try:
        text = conn.lookupByName(d.name).XMLDesc()
        assert "<target dev='sda' bus='sata'/>" in text and "<source network='default'/>" in text
        assert "org.qemu.guest_agent.0" not in text and d.screenshot().shape == (1080, 1920, 3)
    finally:
        d.stop()


def test_env_on_libvirt_backend_reaches_the_guest(base, conn):
    """gym env -> make_desktop('libvirt', backend_options) -> a domain; launching the app needs the guest
    agent, which the test driver lacks: reset says so instead of hanging."""
    from coda_env.env import CodaEnv

    env = CodaEnv(
        app="kalgebra",
        backend="libvirt",
        screen=(1024, 768),
        backend_options=dict(uri=TEST_URI, base_image=base, pool=POOL, wait_for_agent=False),
    )
    try:
        assert isinstance(env.desktop, lvb.LibvirtDesktop) and env.desktop.width == 1024
        if __import__("shutil").which("kalgebra") is None:
            pytest.skip("the kalgebra adapter checks for kalgebra on this machine first")
        with pytest.raises(lvb.GuestAgentError, match="guest-exec"):
            env.reset(options={"task": next(iter(env.tasks))})
        assert env.desktop.alive() and conn.lookupByName(env.desktop.name).isActive()
    finally:
        env.close()
    assert coda_domains(conn) == [] and coda_volumes(conn) == []


# ------------------------------------------------------------------- the "http" guest transport


class _OSWorldStandIn:
    """A stand-in for the OSWorld server that ScienceBoard's VM image runs on port 5000 (named as such: that
    image cannot be downloaded here). It serves the four endpoints the transport uses, as that server's
    source defines them, and runs the commands on this machine, in a scratch folder's world, with `env` (the
    server's session environment; None: this process's)."""

    def __init__(self, env: dict[str, str] | None = None):
        import threading
        from email.parser import BytesParser
        from http.server import ThreadingHTTPServer

        from .conftest import JSONHandler

        seen, commands = self.seen, self.commands = [], []

        def form(handler) -> dict:
            length = int(handler.headers.get("Content-Length", 0))
            raw = (f"Content-Type: {handler.headers['Content-Type']}\r\n\r\n").encode() + handler.rfile.read(length)
            msg = BytesParser().parsebytes(raw)
            return {
                part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
                for part in msg.get_payload()
            }

        class Handler(JSONHandler):
            def do_GET(self):
                seen.append(self.path)
                if self.path == "/platform":
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"Linux")
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self):
                seen.append(self.path)
                if self.path == "/execute":
                    data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    commands.append(data["command"])
                    try:
                        r = subprocess.run(
                            data["command"],
                            shell=data.get("shell", False),
                            capture_output=True,
                            text=True,
                            timeout=300,
                            env=env,
                        )
                    except Exception as e:
                        return self._send(500, {"status": "error", "message": str(e)})
                    return self._send(
                        200, {"status": "success", "output": r.stdout, "error": r.stderr, "returncode": r.returncode}
                    )
                fields = form(self)
                path = fields.get("file_path", b"").decode()
                if self.path == "/file":
                    try:
                        body = Path(path).read_bytes()
                    except FileNotFoundError:
                        return self._send(404, {"error": "File not found"})
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path == "/setup/upload" and "file_data" in fields:
                    Path(path).write_bytes(fields["file_data"])
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"File Uploaded")
                else:
                    self._send(400, {"error": "file_path and file_data are required"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def osworld(tmp_path, monkeypatch):
    # the stand-in runs spawned programs on this machine: their exit statuses go to the test's folder, not to
    # the guest's /tmp/coda-exit (which would be this machine's /tmp here)
    monkeypatch.setattr(lvb.OSWorldGuest, "EXIT_DIR", str(tmp_path / "exit-statuses"))
    s = _OSWorldStandIn()
    yield s
    s.close()


def test_http_guest_transport_runs_commands_files_and_programs(base, osworld, tmp_path):
    d = lvb.LibvirtDesktop(
        config(base, wait_for_agent=True, guest="http", guest_url=osworld.url, ready_command=("true",), a11y=False)
    )
    d.start()  # waits for GET /platform instead of the guest agent
    try:
        assert "/platform" in osworld.seen and d.alive()
        assert d.run(["echo", "hi"]).stdout == b"hi\n"
        assert d.run(["sh", "-c", "exit 3"]).returncode == 3
        with pytest.raises(FileNotFoundError, match="not installed in the guest"):
            d.run(["no-such-program-coda"])
        f = str(tmp_path / "sub" / "x.bin")
        d.write_file(f, b"\x00\x01data\xff")
        assert d.read_file(f) == b"\x00\x01data\xff"
        with pytest.raises(FileNotFoundError, match="does not exist in the guest"):
            d.read_file(str(tmp_path / "missing"))
        log = tmp_path / "prog.log"
        p = d.spawn(
            ["sh", "-c", 'echo "$FOO $QT_LINUX_ACCESSIBILITY_ALWAYS_ON $PWD"; exit 7'],
            env={"FOO": "bar"},
            cwd=str(tmp_path / "home"),
            log=str(log),
        )
        assert p.wait(timeout=20) == 7
        assert log.read_text().strip() == f"bar 1 {tmp_path / 'home'}"
        sleeper = d.spawn(["sleep", "600"])
        assert sleeper.poll() is None
        d.kill_group(sleeper)  # its whole process group, through the server
        assert sleeper.poll() is not None
        assert wait_until(lambda: subprocess.run(["pgrep", "-f", "^sleep 600$"], capture_output=True).returncode != 0)
        assert isinstance(d.a11y(), lvb.GuestA11y) and d.a11y().address == "-"  # the server's own session bus
    finally:
        d.stop()


def test_http_guest_silent_is_a_clear_error(base):
    with socket_port() as port:  # nothing listens there
        d = lvb.LibvirtDesktop(
            config(base, wait_for_agent=True, guest="http", guest_url=f"http://127.0.0.1:{port}", boot_timeout=1.0)
        )
        with pytest.raises(
            lvb.GuestAgentError,
            match=r"the HTTP server in coda-\w+ did not answer "
            r"\(http://127.0.0.1:\d+\): the image must run an OSWorld",
        ):
            d.start()
        assert d.name is not None and not d.alive()
    with pytest.raises(ValueError, match="guest must be 'agent' or 'http'"):
        lvb.LibvirtDesktop(config(base, guest="ssh"))


class socket_port:
    """A free local TCP port, closed again (so a connection to it is refused)."""

    def __enter__(self):
        import socket

        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        return port

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------- http_get: a server inside the guest


class _HostGuestAgent:
    """A stand-in for the QEMU guest agent (named as such: libvirt's test driver has none). It answers
    `guest-ping`, `guest-exec` and `guest-exec-status` as qemu-ga does, running the command on this machine
    (whose Debian 12 python3 is the image's), records every command's name, and hands every other call
    (`guest-file-*`) to libvirt_qemu; so `run`, and `http_get` on top of it, go through the backend's real
    agent code, and the request script really runs."""

    class Refusal(libvirt.libvirtError):
        def __init__(self, message):  # libvirtError's own __init__ would take libvirt's last error instead
            Exception.__init__(self, message)
            self.err = None

    def __init__(self, lvq):
        self._lvq, self.execs, self.commands, self._procs = lvq, [], [], {}

    def __getattr__(self, name):
        return getattr(self._lvq, name)

    def qemuAgentCommand(self, dom, text, timeout, flags):
        import base64
        import tempfile

        cmd = json.loads(text)
        args = cmd.get("arguments", {})
        self.commands.append(cmd["execute"])
        if cmd["execute"] == "guest-ping":
            return json.dumps({"return": {}})
        if cmd["execute"] == "guest-exec":
            argv = [args["path"], *args.get("arg", [])]
            self.execs.append(argv)
            out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            sink = {} if args.get("capture-output") else {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            try:
                p = subprocess.Popen(
                    argv,
                    env=dict(e.split("=", 1) for e in args.get("env", [])),
                    **({"stdout": out, "stderr": err} | sink),
                )
            except FileNotFoundError:
                raise self.Refusal(
                    f"internal error: unable to execute QEMU agent command 'guest-exec': Failed to "
                    f"execute child process “{argv[0]}” (No such file or directory)"
                ) from None
            self._procs[p.pid] = (p, out, err)
            return json.dumps({"return": {"pid": p.pid}})
        if cmd["execute"] == "guest-exec-status":
            p, out, err = self._procs[args["pid"]]
            if p.poll() is None:
                return json.dumps({"return": {"exited": False}})
            out.seek(0)
            err.seek(0)
            return json.dumps(
                {
                    "return": {
                        "exited": True,
                        "exitcode": p.returncode,
                        "out-data": base64.b64encode(out.read()).decode(),
                        "err-data": base64.b64encode(err.read()).decode(),
                    }
                }
            )
        return self._lvq.qemuAgentCommand(dom, text, timeout, flags)

    def close(self):
        for p, out, err in self._procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
            out.close()
            err.close()


@pytest.fixture
def agent(desktop, monkeypatch):
    a = _HostGuestAgent(desktop._lvq)
    monkeypatch.setattr(desktop, "_lvq", a)
    yield a
    a.close()


@pytest.fixture
def rest():
    """An HTTP server on 127.0.0.1, the guest's own address as the stand-in transports see it (in a VM it
    would be the app's, e.g. ChimeraX's REST server): a binary body that names the request, or 404."""
    import threading
    from http.server import ThreadingHTTPServer

    from .conftest import JSONHandler

    seen = []

    class Handler(JSONHandler):
        def do_GET(self):
            seen.append(self.path)
            if self.path.startswith("/missing"):
                return self._send(404, {"error": "no such thing"})
            body = b"\x00\xff" + f"GET {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.seen, server.port = seen, server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_capabilities_are_declared():
    assert lvb.LibvirtDesktop.capabilities == frozenset({"snapshots", "a11y"})
    assert callable(lvb.LibvirtDesktop.checkpoint) and callable(lvb.LibvirtDesktop.a11y)


def test_http_get_runs_a_fixed_program_through_the_guest_agent(desktop, agent, rest):
    assert desktop.run(["echo", "hi"]).stdout == b"hi\n"  # the stand-in answers guest-exec as qemu-ga does
    path = "/run?command=info%20models&json=true"
    assert desktop.http_get(rest.port, path) == b"\x00\xffGET " + path.encode()
    assert rest.seen == [path]
    # the program and its script are fixed; the URL is only ever an argument of it
    assert agent.execs[-1] == [
        "/usr/bin/python3",
        "-I",
        "-c",
        lvb.HTTP_GET_SCRIPT,
        f"http://127.0.0.1:{rest.port}{path}",
        "10.0",
    ]


def test_http_get_failures_are_guest_http_errors(desktop, agent, rest, monkeypatch):
    import socket

    with pytest.raises(
        lvb.GuestHttpError,
        match=r"GET http://127.0.0.1:\d+/missing in coda-\w+: the server "
        r"answered HTTP 404",
    ):
        desktop.http_get(rest.port, "/missing")
    with (
        socket_port() as port,
        pytest.raises(lvb.GuestHttpError, match=f"nothing answers on port {port} in the guest .*refused"),
    ):
        desktop.http_get(port, "/")
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        t0 = time.monotonic()
        with pytest.raises(lvb.GuestHttpError, match=r"no reply within 1 s"):
            desktop.http_get(silent.getsockname()[1], "/", timeout=1.0)
        assert time.monotonic() - t0 < 10
    monkeypatch.setattr(desktop.config, "guest_python", "/nonexistent/python3")
    with pytest.raises(lvb.GuestHttpError, match="the guest image has no /nonexistent/python3"):
        desktop.http_get(rest.port, "/")
    assert isinstance(lvb.GuestHttpError("x"), DesktopError)


def test_http_get_checks_its_arguments_before_running_anything(desktop, agent, base):
    for bad in [
        "",
        "run",
        "//evil.example/x",
        "/a b",
        "/a\nb",
        "/$(reboot)",
        "/`id`",
        "/a'b",
        '/a"b',
        "/x#frag",
        "/%zz",
        "/a\\b",
        "/é",
        "/" + "a" * 9000,
        None,
    ]:
        with pytest.raises(ValueError, match="http_get needs a URL path"):
            desktop.http_get(8000, bad)
    for port in (0, 65536, "80", True, 80.0):
        with pytest.raises(ValueError, match="port must be an int"):
            desktop.http_get(port, "/")
    with pytest.raises(ValueError, match="timeout must be positive"):
        desktop.http_get(8000, "/", timeout=0)
    assert agent.execs == []
    assert (
        lvb.check_http_path("/run?command=open+1abc%3B+color+red&x=a,b:c@d~e")
        == "/run?command=open+1abc%3B+color+red&x=a,b:c@d~e"
    )
    d = lvb.LibvirtDesktop(config(base))
    with pytest.raises(DesktopError, match="not running"):
        d.http_get(8000, "/")


def test_http_get_over_the_http_transport(base, osworld, rest):
    d = lvb.LibvirtDesktop(
        config(base, wait_for_agent=True, guest="http", guest_url=osworld.url, ready_command=("true",), a11y=False)
    )
    d.start()
    try:
        assert d.http_get(rest.port, "/state?x=1") == b"\x00\xffGET /state?x=1"  # bytes survive the JSON reply
        assert "/execute" in osworld.seen and rest.seen == ["/state?x=1"]
        with pytest.raises(lvb.GuestHttpError, match="answered HTTP 404"):
            d.http_get(rest.port, "/missing")
    finally:
        d.stop()


# ------------------------------------------------------------------- the readers travel with each call


def test_readers_are_sent_whole_and_fit_one_argument():
    """The a11y reader sent to the guest is the host's coda_env/a11y.py, as one argument of `python3 -I -c`,
    well under Linux's limit on one argument (the transports have none lower)."""
    from coda_env import a11y

    assert lvb.A11Y_SOURCE == Path(a11y.__file__).read_text(encoding="utf-8")
    for source in (lvb.A11Y_SOURCE, lvb.HTTP_GET_SCRIPT):
        assert len(source.encode()) < lvb.MAX_ARG_STRLEN // 4
        assert lvb.reader_argv("/usr/bin/python3", source, ["apps", 5]) == [
            "/usr/bin/python3",
            "-I",
            "-c",
            source,
            "apps",
            "5",
        ]
    with pytest.raises(ValueError, match="over the 131072-byte limit of one argument"):
        lvb.reader_argv("/usr/bin/python3", "#" * lvb.MAX_ARG_STRLEN, [])
    assert lvb.LibvirtConfig().guest_python == lvb.GUEST_PYTHON == "/usr/bin/python3"  # not looked up on PATH


@pytest.fixture
def guest_bus(tmp_path):
    """A session bus with AT-SPI's bus on it, started as the image's xinitrc starts them (no X server: none is
    needed to list the bus's applications): the bus that the readers, run through the stand-in transports,
    read. Everything it starts carries a token in its environment, by which the fixture ends it."""
    import selectors
    import shutil

    launcher = "/usr/libexec/at-spi-bus-launcher"
    if shutil.which("dbus-daemon") is None or not os.access(launcher, os.X_OK):
        pytest.skip("needs dbus-daemon and at-spi-bus-launcher (Debian's dbus and at-spi2-core: `make setup`)")
    mark = uuid.uuid4().hex
    token = f"CODA_TEST_GUEST_BUS={mark}".encode()
    home = tmp_path / "bus-home"
    home.mkdir()
    env = {"PATH": lvb.GUEST_PATH, "HOME": str(home), "LANG": "C.UTF-8", "CODA_TEST_GUEST_BUS": mark}

    def ours() -> list[int]:
        pids = []
        for e in os.listdir("/proc"):
            try:
                if e.isdigit() and token in Path(f"/proc/{e}/environ").read_bytes():
                    pids.append(int(e))
            except OSError:
                pass
        return pids

    procs = [
        subprocess.Popen(
            ["dbus-daemon", "--session", "--nofork", "--print-address=1"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    ]
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(procs[0].stdout, selectors.EVENT_READ)
            if not sel.select(timeout=30):
                pytest.fail("dbus-daemon printed no address within 30 s")
        address = procs[0].stdout.readline().decode().strip()
        assert address.startswith("unix:"), address
        procs.append(
            subprocess.Popen(
                [launcher, "--launch-immediately"],
                env={**env, "DBUS_SESSION_BUS_ADDRESS": address},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
        yield address
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # the launcher's bus and the registry it activated too
            for pid in ours():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            for p in procs:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if wait_until(lambda: not ours(), timeout=5):
                break
        procs[0].stdout.close()
        assert not ours()


FORGED_TREE = '{"bus":":1.9","path":"/forged","role":"application","name":"kalgebra","children":[]}'


@pytest.fixture
def hostile_guest(tmp_path):
    """A guest whose user has planted a forged a11y reader everywhere a Python program started by the host
    could pick one up: the folder the transport runs commands in (a11y.py, jeepney/, json.py), PYTHONPATH
    (jeepney/, sitecustomize.py) and a `python3` ahead on PATH. Each forgery notes itself in a sentinel file
    and prints a tree of "kalgebra", which is not on the bus. The interpreter the host names stands for the
    image's /usr/bin/python3 with python3-jeepney (this machine's is another build, without jeepney)."""
    from types import SimpleNamespace

    sentinel = tmp_path / "forged-reader-ran"
    forgery = (
        f"import os, sys\nwith open({str(sentinel)!r}, 'a') as f:\n    f.write(repr(sys.argv[:1]) + '\\n')\n"
        f"sys.stdout.write({FORGED_TREE!r} if 'tree' in sys.argv else 'kalgebra\\n')\n"
        f"sys.stdout.flush()\nos._exit(0)\n"
    )
    cwd, pythonpath, userbin, system = (tmp_path / n for n in ("cwd", "pythonpath", "userbin", "system"))
    for folder in (cwd / "jeepney", pythonpath / "jeepney", userbin, system):
        folder.mkdir(parents=True)
    for f in (
        cwd / "a11y.py",
        cwd / "json.py",
        cwd / "jeepney" / "__init__.py",
        pythonpath / "jeepney" / "__init__.py",
        pythonpath / "sitecustomize.py",
    ):
        f.write_text(forgery)
    (userbin / "python3").write_text(f"#!{sys.executable}\n{forgery}")
    python = system / "python3"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    for f in (userbin / "python3", python):
        f.chmod(0o755)

    def files() -> list[str]:
        return sorted(
            str(p.relative_to(tmp_path))
            for p in tmp_path.rglob("*")
            if p.name != "exit-statuses" and "exit-statuses" not in p.parts and "bus-home" not in p.parts
        )

    return SimpleNamespace(
        sentinel=sentinel,
        cwd=cwd,
        python=str(python),
        files=files,
        env={"PATH": f"{userbin}:{lvb.GUEST_PATH}", "PYTHONPATH": str(pythonpath)},
    )


def _reader_calls(execs) -> list[list[str]]:
    """The commands that ran a Python reader, however it was named."""
    return [list(argv) for argv in execs if any("python" in str(a) or "a11y" in str(a) for a in argv[:2])]


@pytest.mark.parametrize("transport", ["agent", "http"])
def test_a_replaced_reader_in_the_guest_changes_nothing(
    transport, base, guest_bus, hostile_guest, monkeypatch, request
):
    """Reward integrity on the libvirt backend: the a11y reader goes with every call (start's bus probe, each
    read, after a revert), nothing is written to the guest for it, and a guest user's planted readers are
    never run: the real reader answers (kalgebra is not on the bus) and no forgery's sentinel appears."""
    monkeypatch.chdir(hostile_guest.cwd)  # where the stand-ins run commands: a folder the guest's user writes
    if transport == "agent":
        guest_env = {**lvb.LibvirtConfig().guest_env, **hostile_guest.env, "DBUS_SESSION_BUS_ADDRESS": guest_bus}
        d = lvb.LibvirtDesktop(
            config(
                base,
                wait_for_agent=True,
                ready_command=("true",),
                guest_python=hostile_guest.python,
                guest_env=guest_env,
            )
        )
        agent = d._lvq = _HostGuestAgent(d._lvq)
        request.addfinalizer(agent.close)
        calls = lambda: agent.execs  # noqa: E731
        writes = lambda: [c for c in agent.commands if c.startswith("guest-file")]  # noqa: E731
    else:  # the server's session: its environment is the guest user's (~/.profile), its bus the session's
        osworld = _OSWorldStandIn(env={**os.environ, **hostile_guest.env, "DBUS_SESSION_BUS_ADDRESS": guest_bus})
        request.addfinalizer(osworld.close)
        monkeypatch.setattr(lvb.OSWorldGuest, "EXIT_DIR", str(hostile_guest.cwd.parent / "exit-statuses"))
        d = lvb.LibvirtDesktop(
            config(
                base,
                wait_for_agent=True,
                guest="http",
                guest_url=osworld.url,
                ready_command=("true",),
                guest_python=hostile_guest.python,
            )
        )
        calls = lambda: osworld.commands  # noqa: E731
        writes = lambda: [p for p in osworld.seen if p == "/setup/upload"]  # noqa: E731
    before = hostile_guest.files()
    d.start()  # polls `a11y.py apps` until the guest's AT-SPI bus answers
    try:
        assert "a11y" in d.timings
        source = d.a11y()
        assert source.app_tree("kalgebra") is None  # the real reader: no kalgebra on this bus
        d.reset()
        assert d.a11y().app_tree("kalgebra", texts=True, details_roles=frozenset({"page tab"})) is None
        readers = _reader_calls(calls())
        assert len(readers) >= 3
        for argv in readers:  # each call carries the whole reader; none names a file in the guest
            assert argv[:4] == [hostile_guest.python, "-I", "-c", lvb.A11Y_SOURCE], argv[:3]
            assert argv[4] in ("apps", "tree") and not any(a.endswith(".py") for a in argv[4:])
        assert writes() == []  # no reader (nor anything else) written to the guest
        assert not hostile_guest.sentinel.exists(), hostile_guest.sentinel.read_text()
        assert hostile_guest.files() == before  # nothing left where the readers ran (no copy, no cache)
    finally:
        d.stop()


def test_a_forged_reader_would_have_been_seen(hostile_guest, guest_bus, monkeypatch):
    """The forgeries of `hostile_guest` are live, so the test above proves something: the host reads a forged
    tree from a reader file in the guest (how the backend ran it before: `python3 /run/coda/a11y.py`), from
    the reader's text run without -I (the planted jeepney is imported), and from `python3` looked up on PATH."""
    monkeypatch.chdir(hostile_guest.cwd)
    env = {**hostile_guest.env, "DBUS_SESSION_BUS_ADDRESS": guest_bus}
    args = ["tree", guest_bus, "kalgebra"]
    for argv in (
        [hostile_guest.python, "a11y.py", *args],
        [hostile_guest.python, "-c", lvb.A11Y_SOURCE, *args],
        lvb.reader_argv("python3", lvb.A11Y_SOURCE, args),
    ):
        p = subprocess.run(argv, env=env, capture_output=True, timeout=60)
        assert p.returncode == 0 and p.stdout.decode() == FORGED_TREE, (argv[:2], p.stderr[-300:])
        assert hostile_guest.sentinel.exists()
        hostile_guest.sentinel.unlink()
    p = subprocess.run(
        lvb.reader_argv(hostile_guest.python, lvb.A11Y_SOURCE, args), env=env, capture_output=True, timeout=60
    )
    assert (p.returncode, p.stdout, hostile_guest.sentinel.exists()) == (0, b"null", False), p.stderr[-300:]
