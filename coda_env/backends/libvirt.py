"""The libvirt backend: one libvirt domain (a QEMU VM) per env.

Each `LibvirtDesktop` defines its own domain (unique name) whose disk is a qcow2 overlay on a shared base
image, created through libvirt's storage-volume API so that the base is never written and remote URIs
(`qemu+ssh://host/system`) work unchanged: nothing here touches the host's files except when the URI is
local. The first start boots the VM, waits for the guest agent and the desktop, and saves a snapshot with
memory; `reset()` reverts to it in seconds instead of booting again.

Observation: `virDomainScreenshot` (a PNG or PPM stream), decoded with Pillow. Input: `virDomainSendKey`
with Linux keycodes for keys and typing, and QMP `input-send-event` (absolute axes on the domain's USB
tablet, buttons, the wheel, held keys) through `qemuMonitorCommand`. App state: the QEMU guest agent
(`guest-exec`, `guest-file-*`); accessibility trees by running coda_env/a11y.py in the guest (`GuestA11y`).

No orphans: `stop()` destroys and undefines the domain and deletes its overlay; so do garbage collection,
atexit, and a watchdog process that notices its parent's death (its stdin pipe closes) and removes the
domain by name through its own connection.

The translation of actions to input events is pure (`plan_input`, `key_chord`), so it is tested without a
VM.
"""
from __future__ import annotations

import base64
import json
import math
import os
import signal
import subprocess
import sys
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from string import Template
from typing import Any, Union
from urllib.parse import urlsplit
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from .. import a11y as a11y_module
from ..a11y import A11yError, Node
from ..actions import Action
from .base import DesktopError, PolledProcess, Window, backoff
from .osworld import OSWorldGuest

# --------------------------------------------------------------------------------------------- errors


class LibvirtMissingError(DesktopError):
    """libvirt-python is not installed."""


class LibvirtConnectError(DesktopError):
    """No libvirt daemon answers at the URI."""


class BaseImageError(DesktopError):
    """The base disk image is not configured or cannot be found on the libvirt host."""


class DomainBootError(DesktopError):
    """libvirt refused the domain, or the VM stopped or never became ready while booting."""


class GuestAgentError(DesktopError):
    """The QEMU guest agent in the VM is silent, missing, or refused a command."""


def _libvirt() -> tuple[Any, Any]:
    """Import (libvirt, libvirt_qemu) lazily: the rest of coda_env must work without libvirt-python."""
    try:
        import libvirt
        import libvirt_qemu
    except ImportError as e:
        raise LibvirtMissingError(
            f"the libvirt backend needs libvirt-python ({e}): pip install 'coda[vm]' (building it needs the "
            "apt packages libvirt-dev and pkg-config; `make setup` installs both)") from None
    libvirt.registerErrorHandler(_quiet, None)  # errors come back as exceptions; don't also print them
    return libvirt, libvirt_qemu


def _quiet(_ctx: object, _err: object) -> None:
    return None


# ----------------------------------------------------------------------------------------- config

DEFAULT_DOMAIN_XML = """\
<domain type='$domain_type'>
  <name>$name</name>
  <memory unit='MiB'>$memory_mib</memory>
  <vcpu>$vcpus</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type><boot dev='hd'/></os>
  <features><acpi/><apic/></features>
  $cpu
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' discard='unmap'/>
      <source file=$overlay/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <controller type='usb' model='qemu-xhci'/>
    <input type='tablet' bus='usb'/>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <video><model type='virtio' heads='1'><resolution x='$width' y='$height'/></model></video>
    <memballoon model='none'/>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
  </devices>
</domain>
"""
"""The domain template (string.Template): $name $domain_type $memory_mib $vcpus $cpu $overlay (a quoted
attribute value) $width $height. No network: the apps need none, and isolation is then free. No graphics
device: QEMU's screendump reads the video device's console without one."""

GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class LibvirtConfig:
    """Where and how to build the VM. Paths (base_image, overlay_dir) are on the libvirt host."""
    uri: str = "qemu:///system"
    base_image: str = field(default_factory=lambda: os.environ.get("CODA_VM_IMAGE", ""))
                                        # default: $CODA_VM_IMAGE (what `make vm-test` sets)
    base_format: str = "qcow2"
    domain_xml: str | None = None       # template text, or a local file holding it; None: the domain.xml
                                        # beside a local base image (build.sh writes one), else
                                        # DEFAULT_DOMAIN_XML
    width: int = 1280
    height: int = 800
    memory_mib: int = 2048
    vcpus: int = 2
    domain_type: str = "qemu"           # software emulation (nested KVM hangs here); "kvm" on real hosts
    snapshot: str = "coda-ready"
    pool: str = "default"               # storage pool that holds the overlays
    overlay_dir: str = "/var/lib/libvirt/images/coda"  # a local URI's pool path, when the pool is missing
    name_prefix: str = "coda"
    boot_timeout: float = 900.0         # first boot under TCG is slow
    revert_timeout: float = 120.0
    revert_mode: str = "loadvm"         # "loadvm": HMP loadvm inside the running QEMU (measured 1-3 s under
                                        # TCG); "libvirt": virDomainRevertToSnapshot, which in libvirt 9
                                        # restarts QEMU with -loadvm (4-10 s). loadvm falls back to libvirt.
    agent_timeout: float = 10.0         # one guest agent command
    app_timeout: float = 300.0          # an app's start in the guest (CodaEnv's ready_timeout): 30 s under TCG
    wait_for_agent: bool = True         # False only for drivers without an agent (libvirt's test driver)
    ready_command: tuple[str, ...] = ("wmctrl", "-m")  # succeeds once the window manager is up
    guest_env: dict[str, str] = field(default_factory=lambda: {
        "DISPLAY": ":0", "HOME": "/root", "PATH": GUEST_PATH, "XDG_RUNTIME_DIR": "/run/user/0",
        "LANG": "C.UTF-8", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/coda/bus",  # vm_images/guest/xinitrc
        "QT_LINUX_ACCESSIBILITY_ALWAYS_ON": "1", "QT_ACCESSIBILITY": "1", "GTK_MODULES": "gail:atk-bridge"})
    a11y: bool = True                   # before the snapshot: copy a11y.py in and wait for the AT-SPI bus
    guest: str = "agent"                # how commands and files reach the guest: "agent" (the QEMU guest
                                        # agent, our image) or "http" (an OSWorld-style server, e.g.
                                        # ScienceBoard's image; coda_env/backends/osworld.py)
    guest_url: str | None = None        # "http": the server's URL; None: the domain's DHCP lease + guest_port
    guest_port: int = 5000
    resize: bool = True                 # resize screenshots of another size (else DesktopError)
    key_hold_ms: int = 10               # how long sendKey holds a chord (QEMU's default is 100 ms)
    native_hscroll: bool = False        # QMP wheel-left/right (QEMU >= 8.1); else shift + wheel
    watchdog: bool = True


def is_local_uri(uri: str) -> bool:
    """True when the libvirt host is this machine (no host name, no remote transport)."""
    parts = urlsplit(uri)
    scheme = parts.scheme
    return "+" not in scheme and not parts.hostname


def host_files_are_local(uri: str) -> bool:
    """True when paths on the libvirt host are paths on this machine: a local URI of a real driver (the
    test driver's storage paths are its own fiction)."""
    return is_local_uri(uri) and not uri.startswith("test:")


# --------------------------------------------------------------------------------- key translation

# Linux input keycodes (linux/input-event-codes.h) and QEMU QKeyCode names, per project key name.
_KEYS: dict[str, tuple[int, str]] = {
    "esc": (1, "esc"), "backspace": (14, "backspace"), "tab": (15, "tab"), "enter": (28, "ret"),
    "space": (57, "spc"), "ctrl": (29, "ctrl"), "ctrlleft": (29, "ctrl"), "ctrlright": (97, "ctrl_r"),
    "shift": (42, "shift"), "shiftleft": (42, "shift"), "shiftright": (54, "shift_r"),
    "alt": (56, "alt"), "altleft": (56, "alt"), "altright": (100, "alt_r"), "option": (56, "alt"),
    "optionleft": (56, "alt"), "optionright": (100, "alt_r"), "win": (125, "meta_l"),
    "winleft": (125, "meta_l"), "winright": (126, "meta_r"), "command": (125, "meta_l"),
    "capslock": (58, "caps_lock"), "numlock": (69, "num_lock"), "scrolllock": (70, "scroll_lock"),
    "printscreen": (99, "sysrq"), "prtsc": (99, "sysrq"), "prtscr": (99, "sysrq"), "prntscrn": (99, "sysrq"),
    "print": (99, "sysrq"), "pause": (119, "pause"), "apps": (127, "compose"), "home": (102, "home"),
    "up": (103, "up"), "pageup": (104, "pgup"), "left": (105, "left"), "right": (106, "right"),
    "end": (107, "end"), "down": (108, "down"), "pagedown": (109, "pgdn"), "insert": (110, "insert"),
    "delete": (111, "delete"), "help": (138, "help"), "stop": (166, "audiostop"),
    "add": (78, "kp_add"), "subtract": (74, "kp_subtract"), "multiply": (55, "kp_multiply"),
    "divide": (98, "kp_divide"), "decimal": (83, "kp_decimal"), "separator": (121, "kp_comma"),
    "volumemute": (113, "audiomute"), "volumedown": (114, "volumedown"), "volumeup": (115, "volumeup"),
    "playpause": (164, "audioplay"), "nexttrack": (163, "audionext"), "prevtrack": (165, "audioprev"),
    "browserback": (158, "ac_back"), "browserforward": (159, "ac_forward"),
    "browserrefresh": (173, "ac_refresh"), "browserhome": (172, "ac_home"),
    "browserfavorites": (156, "ac_bookmarks"), "launchmail": (155, "mail"),
    "launchapp1": (157, "computer"), "launchapp2": (140, "calculator"), "launchmediaselect": (226, "mediaselect"),
    "sleep": (142, "sleep"), "fn": (143, "wake"), "yen": (124, "yen"), "hangul": (122, "lang1"),
    "hanguel": (122, "lang1"), "hanja": (123, "lang2"), "kana": (93, "katakanahiragana"),
    "convert": (92, "henkan"), "nonconvert": (94, "muhenkan"),
    "-": (12, "minus"), "=": (13, "equal"), "[": (26, "bracket_left"), "]": (27, "bracket_right"),
    ";": (39, "semicolon"), "'": (40, "apostrophe"), "`": (41, "grave_accent"), "\\": (43, "backslash"),
    ",": (51, "comma"), ".": (52, "dot"), "/": (53, "slash"),
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
    raise ValueError(f"the libvirt backend cannot type {key!r}: it sends Linux keycodes of a US keyboard "
                     f"layout, which has no such key")


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

Keys = tuple[int, ...]                                 # one sendKey chord
Step = Union[tuple[str, Keys], tuple[str, list], tuple[str, float]]
"""("keys", keycodes) for sendKey, ("qmp", events) for one input-send-event (one input sync),
("sleep", seconds) for pacing."""


def _abs(x: int, y: int, size: tuple[int, int]) -> list[dict]:
    w, h = size
    return [{"type": "abs", "data": {"axis": "x", "value": round(x * ABS_MAX / max(w - 1, 1))}},
            {"type": "abs", "data": {"axis": "y", "value": round(y * ABS_MAX / max(h - 1, 1))}}]


def _btn(button: str, down: bool) -> list[dict]:
    return [{"type": "btn", "data": {"down": down, "button": button}}]


def _qkey(name: str, down: bool) -> dict:
    return {"type": "key", "data": {"down": down, "key": {"type": "qcode", "data": _KEYS[name][1]}}}


def plan_input(action: Action, pointer: tuple[int, int], size: tuple[int, int],
               native_hscroll: bool = False) -> tuple[list[Step], tuple[int, int]]:
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


# ------------------------------------------------------------------------------------ screenshots


def decode_screenshot(data: bytes, size: tuple[int, int], resize: bool = True) -> np.ndarray:
    """A PNG/PPM screenshot as an (H, W, 3) uint8 RGB array of exactly `size` = (width, height)."""
    from PIL import Image
    try:
        img = Image.open(BytesIO(data))
        img.load()
    except Exception as e:
        raise DesktopError(f"cannot decode the VM screenshot ({len(data)} bytes): {e}") from None
    if img.mode != "RGB":
        img = img.convert("RGB")
    if img.size != tuple(size):
        if not resize:
            raise DesktopError(f"the VM screen is {img.size[0]}x{img.size[1]}, not the configured "
                               f"{size[0]}x{size[1]}: set the guest's resolution (the domain XML's video "
                               f"<resolution>, xrandr in the image) or pass resize=True")
        img = img.resize(tuple(size), Image.BILINEAR)
    return np.asarray(img, dtype=np.uint8).copy()


# ----------------------------------------------------------------------------------- cleanup


def destroy_domain(conn: Any, name: str, pool: str | None, volume: str | None) -> list[str]:
    """Destroy and undefine domain `name` and delete its overlay volume; what was missing is skipped.

    Returns what it did (for the watchdog's log and for tests)."""
    libvirt, _ = _libvirt()
    done: list[str] = []
    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        dom = None
    if dom is not None:
        try:
            if dom.isActive():
                dom.destroy()
                done.append("destroyed")
        except libvirt.libvirtError:
            pass
        base = libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
        for flags in (base | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM, base):  # not every driver knows NVRAM
            try:
                dom.undefineFlags(flags)
                done.append("undefined")
                break
            except libvirt.libvirtError as e:
                if _code(e) == libvirt.VIR_ERR_NO_DOMAIN:  # a transient domain is gone once destroyed
                    break
    if pool and volume:
        try:
            conn.storagePoolLookupByName(pool).storageVolLookupByName(volume).delete(0)
            done.append("deleted overlay")
        except libvirt.libvirtError:
            pass
    return done


def _cleanup(uri: str, name: str, pool: str | None, volume: str | None,
             watchdog: subprocess.Popen | None) -> None:
    """Remove the domain through a fresh connection (the desktop's own may be closed or broken)."""
    try:
        libvirt, _ = _libvirt()
        conn = libvirt.open(uri)
        try:
            destroy_domain(conn, name, pool, volume)
        finally:
            conn.close()
    except Exception:
        pass
    if watchdog is not None and watchdog.poll() is None:
        watchdog.kill()
        watchdog.wait()


# ------------------------------------------------------------------------------------ the desktop


class GuestProcess(PolledProcess):
    """A program that the guest agent started (its pid is the guest's).

    `spawn` runs it under `setsid`, so the pid is also its process group (what `kill_group` kills)."""

    def __init__(self, desktop: LibvirtDesktop, pid: int, args: Sequence[str]):
        super().__init__(pid, args)
        self._desktop = desktop

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                status = self._desktop._exec_status(self.pid)
            except DesktopError:
                if not self._desktop.alive():
                    self.returncode = -signal.SIGKILL  # the VM is gone, so is the program
                return self.returncode
            if status.get("exited"):
                self.returncode = _returncode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self._desktop.run(["kill", f"-{int(sig)}", str(self.pid)], timeout=10)


def _returncode(status: Mapping[str, Any]) -> int:
    if "exitcode" in status:
        return int(status["exitcode"])
    return -int(status.get("signal", 1))


GUEST_A11Y = "/run/coda/a11y.py"  # where start() copies coda_env/a11y.py into the guest


class GuestA11y:
    """The apps' accessibility trees in the guest: each read runs coda_env/a11y.py there (through the guest
    agent, or the "http" transport), which prints the app's tree as JSON, with the states and extents of
    the nodes whose roles the caller names (`details_roles`).

    Why not a D-Bus connection from the host: the guest's AT-SPI bus is a unix socket inside the VM. A
    channel to it (virtio-serial) would carry one D-Bus connection whose state a snapshot revert rewinds;
    one stateless command per read survives reverts, and a read is one round trip either way. States and
    extents are those of the moment of the read (the local client asks live)."""

    def __init__(self, desktop: "LibvirtDesktop", address: str, timeout: float = 30.0):
        self.desktop, self.address, self.timeout = desktop, address, timeout

    def app_tree(self, name: str, skip_roles: frozenset[str] = frozenset(), texts: bool = False,
                 details_roles: frozenset[str] = frozenset()) -> Node | None:
        argv = ["python3", GUEST_A11Y, "tree", self.address, name]
        for role in sorted(skip_roles):
            argv += ["--skip", role]
        for role in sorted(details_roles):
            argv += ["--details", role]
        if texts:
            argv.append("--texts")
        try:
            p = self.desktop.run(argv, timeout=self.timeout)
        except FileNotFoundError:
            raise A11yError("python3 is not installed in the guest image (vm_images/build.sh installs it with "
                            "python3-jeepney)") from None
        except subprocess.TimeoutExpired:
            raise A11yError(f"reading {name}'s accessibility tree in the guest took over {self.timeout:.0f}s"
                            ) from None
        if p.returncode != 0:
            raise A11yError(f"the guest's a11y reader failed (exit {p.returncode}): "
                            f"{p.stderr.decode(errors='replace').strip()[-400:]}")
        try:
            data = json.loads(p.stdout)
        except ValueError as e:
            raise A11yError(f"the guest's a11y reader printed no JSON tree ({e})") from None
        return Node.from_dict(data) if data is not None else None

    def states(self, node: Node) -> set[str]:
        if node.states is None:
            raise A11yError(f"the states of {node.role} {node.name!r} were not read: pass its role in "
                            f"app_tree's details_roles")
        return set(node.states)

    def extents(self, node: Node) -> tuple[int, int, int, int] | None:
        if node.states is None:  # read together with the states
            raise A11yError(f"the extents of {node.role} {node.name!r} were not read: pass its role in "
                            f"app_tree's details_roles")
        return node.extents

    def close(self) -> None:
        pass


class LibvirtDesktop:
    """A desktop inside a libvirt domain: overlay disk, snapshot revert, QEMU screenshots and input,
    guest agent for commands and files."""

    def __init__(self, config: LibvirtConfig | None = None):
        self.config = config or LibvirtConfig()
        self.width, self.height = self.config.width, self.config.height
        self.app_timeout = self.config.app_timeout
        self._lv, self._lvq = _libvirt()
        self.name: str | None = None
        self.volume: str | None = None
        self.env: dict[str, str] = dict(self.config.guest_env)
        self.app_home = self.config.guest_env.get("HOME", "/root")
        self._conn: Any = None
        self._dom: Any = None
        self._snapshot: Any = None
        self._procs: weakref.WeakSet[Any] = weakref.WeakSet()  # spawned, for reset's bookkeeping
        if self.config.guest not in ("agent", "http"):
            raise ValueError(f"guest must be 'agent' or 'http', not {self.config.guest!r}")
        self._http: OSWorldGuest | None = None  # the "http" transport, once its URL is known
        self._pointer = (0, 0)
        self._snapshot_pointer = (0, 0)
        self._watchdog: subprocess.Popen | None = None
        self._finalizer = weakref.finalize(self, lambda: None)
        self.timings: dict[str, float] = {}
        """Seconds of the last start()/reset() phases: boot (define + create), agent (to the first
        guest-ping) and desktop (to ready_command passing), both counted from the domain running; snapshot
        (saving it), revert (reset's, through the agent answering again)."""

    # ------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Boot a fresh domain from the base image, wait until it is ready, and save the ready snapshot."""
        if self.alive():
            return
        self.stop()
        self._conn = self._connect()
        self.name = f"{self.config.name_prefix}-{uuid.uuid4().hex[:12]}"
        self.volume = f"{self.name}.qcow2"
        if self.config.watchdog:
            self._watchdog = _start_watchdog(self.config.uri, self.name, self.config.pool, self.volume)
        self._finalizer = weakref.finalize(self, _cleanup, self.config.uri, self.name, self.config.pool,
                                           self.volume, self._watchdog)
        try:
            base, capacity = self._find_base()
            overlay = self._create_overlay(base, capacity)
            t0 = time.monotonic()
            self._dom = self._boot(self.domain_xml(overlay))
            self.timings = {"boot": time.monotonic() - t0}
            deadline = time.monotonic() + self.config.boot_timeout
            self._wait_ready(deadline)
            if self.config.a11y and self.config.wait_for_agent:
                self._prepare_a11y(deadline)
            t1 = time.monotonic()
            self._save_snapshot()
            self.timings["snapshot"] = time.monotonic() - t1
        except BaseException:
            self.stop()
            raise

    def reset(self) -> None:
        """Revert the running domain to its ready snapshot (memory included): a clean desktop in seconds."""
        if self._dom is None or self._snapshot is None:
            self.start()
            return
        t0 = time.monotonic()
        if not (self.config.revert_mode == "loadvm" and self._loadvm()):
            try:
                self._dom.revertToSnapshot(self._snapshot, self._lv.VIR_DOMAIN_SNAPSHOT_REVERT_RUNNING)
            except self._lv.libvirtError as e:
                raise DesktopError(f"cannot revert domain {self.name} to snapshot {self._snapshot.getName()!r}: "
                                   f"{e}") from None
        self._pointer = self._snapshot_pointer
        for proc in self._procs:  # the guest's processes are those of the snapshot again
            proc.returncode = None if proc.in_snapshot else -signal.SIGKILL
        if self.config.wait_for_agent:  # the agent's channel reconnects after a revert
            self._wait_guest(time.monotonic() + self.config.revert_timeout)
        self.timings["revert"] = time.monotonic() - t0

    def _loadvm(self) -> bool:
        """Revert in place: HMP `loadvm` of the internal snapshot (memory, devices and the overlay's disk)
        in the QEMU process that runs, instead of libvirt's stop + restart. False when this driver or QEMU
        cannot (no QEMU monitor, e.g. libvirt's test driver; an HMP error), so the caller reverts through
        libvirt."""
        if not self.alive():
            return False
        cmd = json.dumps({"execute": "human-monitor-command",
                          "arguments": {"command-line": f"loadvm {self._snapshot.getName()}"}})
        try:
            reply = json.loads(self._lvq.qemuMonitorCommand(self._dom, cmd, 0))
        except (self._lv.libvirtError, ValueError):
            return False
        # HMP reports failure as text ("Error: ..."); success is an empty string
        return "error" not in reply and not str(reply.get("return", "")).strip()

    def stop(self) -> None:
        """Destroy and undefine the domain, delete its overlay, and end the watchdog."""
        self._finalizer()  # runs _cleanup once
        if self._conn is not None:
            try:
                self._conn.close()
            except self._lv.libvirtError:
                pass
        self._conn = self._dom = self._snapshot = None
        self._watchdog = None
        self._http = None
        for proc in self._procs:  # they went with the VM
            if proc.returncode is None:
                proc.returncode = -signal.SIGKILL
        self._procs.clear()

    close = stop

    def alive(self) -> bool:
        if self._dom is None:
            return False
        try:
            return bool(self._conn.isAlive()) and bool(self._dom.isActive())
        except self._lv.libvirtError:
            return False

    def _check(self) -> None:
        if not self.alive():
            raise DesktopError(f"the VM {self.name or '(not started)'} of this desktop is not running")

    def _connect(self) -> Any:
        uri = self.config.uri
        try:
            return self._lv.open(uri)
        except self._lv.libvirtError as e:
            hint = ("start the daemon: `make vm-setup` (as root), `/usr/sbin/libvirtd -d` or "
                    "`systemctl start libvirtd`"
                    if is_local_uri(uri) else "check that libvirtd runs on that host and that the URI and "
                                              "its transport (ssh keys, TLS) are right")
            raise LibvirtConnectError(f"cannot connect to libvirt at {uri!r}: {e}. Is libvirtd running? "
                                      f"{hint}; or pass another uri in backend_options") from None

    def _find_base(self) -> tuple[str, int]:
        """The base image's path and capacity in bytes, looked up through libvirt's storage pools (so it
        works on a remote host), or on the local disk for a local URI."""
        base, lv = self.config.base_image, self._lv
        if not base:
            raise BaseImageError("no base image configured: pass backend_options={'base_image': "
                                 "'/path/on/the/libvirt/host/coda-debian12.qcow2'} or set CODA_VM_IMAGE "
                                 "(`make vm-image` builds one)")
        try:
            vol = self._conn.storageVolLookupByPath(base)
            return base, int(vol.info()[1])
        except lv.libvirtError:
            pass
        if host_files_are_local(self.config.uri):
            if os.path.isfile(base):
                return base, _image_size(base, self.config.base_format)
            raise BaseImageError(f"the base image {base} does not exist: build it with `make vm-image` or "
                                 f"point base_image at an existing qcow2")
        raise BaseImageError(f"the base image {base} is in no storage pool at {self.config.uri}: copy it to "
                             f"the libvirt host into a pool's directory and run `virsh pool-refresh POOL`")

    def _pool(self) -> Any:
        lv, name = self._lv, self.config.pool
        try:
            pool = self._conn.storagePoolLookupByName(name)
        except lv.libvirtError:
            if not is_local_uri(self.config.uri):
                raise DomainBootError(
                    f"no storage pool {name!r} at {self.config.uri} for the overlays: create one there "
                    f"(`virsh pool-define-as {name} dir --target /var/lib/libvirt/images && virsh pool-start "
                    f"{name}`) or pass pool=...") from None
            os.makedirs(self.config.overlay_dir, exist_ok=True)
            xml = (f"<pool type='dir'><name>{escape(name)}</name><target><path>"
                   f"{escape(self.config.overlay_dir)}</path></target></pool>")
            try:
                pool = self._conn.storagePoolCreateXML(xml, 0)
            except lv.libvirtError:  # another env created it meanwhile
                pool = self._conn.storagePoolLookupByName(name)
        if not pool.isActive():
            pool.create(0)
        return pool

    def _create_overlay(self, base: str, capacity: int) -> str:
        """A new qcow2 volume backed by the base: the VM writes there, the base is only read."""
        xml = (f"<volume><name>{escape(self.volume or '')}</name><capacity unit='bytes'>{capacity}</capacity>"
               f"<target><format type='qcow2'/></target><backingStore><path>{escape(base)}</path>"
               f"<format type={quoteattr(self.config.base_format)}/></backingStore></volume>")
        try:
            return str(self._pool().createXML(xml, 0).path())
        except self._lv.libvirtError as e:
            raise DomainBootError(f"cannot create the overlay disk {self.volume} in pool {self.config.pool!r} "
                                  f"at {self.config.uri}: {e}") from None

    def domain_xml(self, overlay: str) -> str:
        """The domain XML for this desktop: the configured template filled in."""
        c = self.config
        text = c.domain_xml or _beside_base(c) or DEFAULT_DOMAIN_XML
        if not text.lstrip().startswith("<"):
            text = Path(text).read_text()
        cpu = "<cpu mode='host-passthrough'/>" if c.domain_type == "kvm" else ""
        try:
            return Template(text).substitute(
                name=escape(self.name or ""), domain_type=escape(c.domain_type), memory_mib=int(c.memory_mib),
                vcpus=int(c.vcpus), cpu=cpu, overlay=quoteattr(overlay), width=int(c.width),
                height=int(c.height))
        except (KeyError, ValueError) as e:
            raise DomainBootError(f"the domain XML template has an unknown or malformed placeholder: {e}; "
                                  f"known: $name $domain_type $memory_mib $vcpus $cpu $overlay $width "
                                  f"$height") from None

    def _boot(self, xml: str) -> Any:
        lv = self._lv
        try:
            dom = self._conn.defineXML(xml)
        except lv.libvirtError as e:
            raise DomainBootError(f"libvirt rejected the domain XML of {self.name}: {e}") from None
        try:
            dom.create()
        except lv.libvirtError as e:
            hint = (" (domain_type='kvm' needs a working /dev/kvm on the host; use 'qemu' for software "
                    "emulation)" if self.config.domain_type == "kvm" else "")
            raise DomainBootError(f"domain {self.name} failed to start: {e}{hint}; QEMU's log is "
                                  f"/var/log/libvirt/qemu/{self.name}.log on the libvirt host") from None
        return dom

    def _boot_failed(self) -> None:
        """Raise if the domain stopped (crashed, powered off) while we wait for it."""
        try:
            state, reason = self._dom.state()
        except self._lv.libvirtError as e:
            raise DomainBootError(f"domain {self.name} vanished while booting: {e}") from None
        if state in (self._lv.VIR_DOMAIN_SHUTOFF, self._lv.VIR_DOMAIN_CRASHED, self._lv.VIR_DOMAIN_SHUTDOWN):
            raise DomainBootError(f"domain {self.name} stopped while booting (state {state}, reason {reason}); "
                                  f"see /var/log/libvirt/qemu/{self.name}.log on the libvirt host")

    def _wait_ready(self, deadline: float) -> None:
        self._boot_failed()
        if not self.config.wait_for_agent:
            return
        t0 = time.monotonic()
        self._wait_guest(deadline)
        self.timings["agent"] = time.monotonic() - t0
        if self.config.ready_command:
            last = ""
            for pause in backoff(0.2, 2.0):
                self._boot_failed()
                left = deadline - time.monotonic()
                try:
                    p = self.run(self.config.ready_command, timeout=max(1.0, min(30.0, left)))
                    if p.returncode == 0:
                        self.timings["desktop"] = time.monotonic() - t0
                        return
                    last = (p.stderr or p.stdout).decode(errors="replace")[-300:]
                except (subprocess.TimeoutExpired, FileNotFoundError) as e:
                    last = str(e)
                if time.monotonic() + pause > deadline:
                    raise DomainBootError(
                        f"domain {self.name} booted but its desktop was not ready within "
                        f"{self.config.boot_timeout:.0f}s: {list(self.config.ready_command)} kept failing "
                        f"({last.strip()}); check the image's auto-login X session")
                time.sleep(pause)

    def _wait_guest(self, deadline: float) -> None:
        if self.config.guest == "agent":
            return self._wait_agent(deadline)
        for pause in backoff(0.2, 2.0):
            self._boot_failed()
            if self._http is None:
                url = self.config.guest_url or self._lease_url()
                self._http = OSWorldGuest(url, self.config.agent_timeout) if url else None
            if self._http is not None and self._http.ping():
                return
            if time.monotonic() + pause > deadline:
                where = self._http.url if self._http else "no DHCP lease of the domain yet"
                raise GuestAgentError(
                    f"the HTTP server in {self.name} did not answer ({where}): the image must run an "
                    f"OSWorld-style server on port {self.config.guest_port}, and the domain XML needs a network "
                    f"interface (vm_images/scienceboard.xml.in) or pass guest_url")
            time.sleep(pause)

    def _lease_url(self) -> str | None:
        try:
            addrs = self._dom.interfaceAddresses(self._lv.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, 0)
        except self._lv.libvirtError:
            return None
        for iface in (addrs or {}).values():
            for a in iface.get("addrs") or ():
                if a.get("type") == self._lv.VIR_IP_ADDR_TYPE_IPV4:
                    return f"http://{a['addr']}:{self.config.guest_port}"
        return None

    def _wait_agent(self, deadline: float) -> None:
        """Poll guest-ping until the agent answers; fail fast when this driver has no agent at all."""
        lv = self._lv
        for pause in backoff(0.1, 2.0):
            self._boot_failed()
            try:
                self._agent("guest-ping", timeout=5)
                return
            except GuestAgentError as e:
                if e.__cause__ is not None and _code(e.__cause__) == lv.VIR_ERR_NO_SUPPORT:
                    raise
                last = e
            if time.monotonic() + pause > deadline:
                raise GuestAgentError(
                    f"the QEMU guest agent in {self.name} did not answer within "
                    f"{self.config.boot_timeout:.0f}s ({last}): install and enable qemu-guest-agent in the "
                    f"image and keep the org.qemu.guest_agent.0 channel in the domain XML") from None
            time.sleep(pause)

    def _prepare_a11y(self, deadline: float) -> None:
        """Copy coda_env/a11y.py into the guest and poll it until the guest's AT-SPI bus answers (which also
        activates AT-SPI's registry, so an app started later registers at once). Part of the snapshot."""
        t0 = time.monotonic()
        self.write_file(GUEST_A11Y, Path(a11y_module.__file__).read_bytes())
        address = self._bus_address() or ""
        last = ""
        for pause in backoff(0.1, 1.0):
            try:
                p = self.run(["python3", GUEST_A11Y, "apps", address], timeout=60)
            except FileNotFoundError:
                raise DomainBootError("the guest image has no python3, which reading app state needs: rebuild "
                                      "it with `make vm-image`, or pass a11y=False") from None
            except subprocess.TimeoutExpired:  # a first Python start under TCG can be slow: poll on
                p = subprocess.CompletedProcess([], 124, b"", b"the a11y reader took over 60 s")
            if p.returncode == 0:
                self.timings["a11y"] = time.monotonic() - t0
                return
            last = p.stderr.decode(errors="replace").strip()[-300:]
            if "ModuleNotFoundError" in last or time.monotonic() + pause > deadline:
                raise DomainBootError(
                    f"the accessibility bus in {self.name} did not come up ({last}): the image needs "
                    f"python3-jeepney and an AT-SPI bus at {address} (vm_images/guest/xinitrc); rebuild it with "
                    f"`make vm-image`, or pass a11y=False")
            time.sleep(pause)

    def _bus_address(self) -> str | None:
        """The guest session's bus: fixed in our image; the server's own session ("-") over "http"."""
        if self.config.guest == "http":
            return "-"
        return self.config.guest_env.get("DBUS_SESSION_BUS_ADDRESS")

    def a11y(self) -> GuestA11y:
        """The apps' accessibility trees, read in the guest (see `GuestA11y`)."""
        address = self._bus_address()
        if not address:
            raise DesktopError("guest_env has no DBUS_SESSION_BUS_ADDRESS: the guest's accessibility bus is "
                               "unknown (the image's xinitrc puts it at unix:path=/run/coda/bus)")
        return GuestA11y(self, address)

    def _save_snapshot(self, name: str | None = None, description: str = "desktop ready") -> None:
        """Save the current state, memory included (an internal qcow2 snapshot of the overlay), as the one
        `reset` reverts to."""
        name = name or self.config.snapshot
        xml = (f"<domainsnapshot><name>{escape(name)}</name>"
               f"<description>coda: {escape(description)}</description></domainsnapshot>")
        try:
            self._snapshot = self._dom.snapshotCreateXML(xml, 0)
        except self._lv.libvirtError as e:
            raise DomainBootError(f"cannot save the snapshot {name!r} of {self.name}: {e}") from None
        self._snapshot_pointer = self._pointer
        for proc in self._procs:
            proc.in_snapshot = proc.returncode is None

    def checkpoint(self, label: str) -> None:
        """Save the state now (the env calls it once its app is up and ready) as the snapshot that `reset`
        reverts to from then on: a reset then brings the app back ready instead of starting it again."""
        self._check()
        t0 = time.monotonic()
        name = f"{self.config.snapshot}-{label}"
        try:
            self._dom.snapshotLookupByName(name, 0).delete(0)  # an earlier checkpoint of this label
        except self._lv.libvirtError:
            pass
        self._save_snapshot(name, f"{label} ready")
        self.timings["checkpoint"] = time.monotonic() - t0

    # ----------------------------------------------------------------------------- observation
    def screenshot(self) -> np.ndarray:
        self._check()
        lv = self._lv
        chunks: list[bytes] = []
        try:
            stream = self._conn.newStream(0)
            self._dom.screenshot(stream, 0, 0)
            stream.recvAll(lambda _s, data, acc: acc.append(bytes(data)) or 0, chunks)
            stream.finish()
        except lv.libvirtError as e:
            raise DesktopError(f"screenshot of {self.name} failed: {e}") from None
        return decode_screenshot(b"".join(chunks), (self.width, self.height), self.config.resize)

    def windows(self) -> list[Window]:
        """Top-level windows, from `wmctrl -lGx` in the guest (the image installs wmctrl)."""
        try:
            p = self.run(["wmctrl", "-lGx"], timeout=10)
        except FileNotFoundError:
            raise DesktopError("wmctrl is not installed in the guest image (the vm_images recipe installs "
                               "it); windows() needs it") from None
        return parse_wmctrl(p.stdout.decode(errors="replace")) if p.returncode == 0 else []

    # ----------------------------------------------------------------------------------- input
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

    def _qmp(self, command: str, arguments: Mapping[str, Any]) -> Any:
        text = json.dumps({"execute": command, "arguments": arguments})
        reply = json.loads(self._lvq.qemuMonitorCommand(self._dom, text, 0))
        if "error" in reply:
            raise DesktopError(f"QEMU refused {command}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return")

    # ------------------------------------------------------------------------------ guest agent
    def _agent(self, command: str, arguments: Mapping[str, Any] | None = None, timeout: float | None = None) -> Any:
        """One guest agent command; its `return` value."""
        if self._dom is None:
            raise DesktopError("the VM of this desktop is not running")
        lv = self._lv
        payload: dict[str, Any] = {"execute": command}
        if arguments:
            payload["arguments"] = arguments
        seconds = max(1, math.ceil(self.config.agent_timeout if timeout is None else timeout))
        try:
            reply = self._lvq.qemuAgentCommand(self._dom, json.dumps(payload), seconds, 0)
        except lv.libvirtError as e:
            code = _code(e)
            if code == lv.VIR_ERR_NO_SUPPORT:
                why = (f"this libvirt driver ({self.config.uri}) has no QEMU guest agent; use a qemu:// URI, "
                       f"or wait_for_agent=False and no run/read_file/write_file")
            elif code in (lv.VIR_ERR_AGENT_UNRESPONSIVE, lv.VIR_ERR_AGENT_UNSYNCED,
                          lv.VIR_ERR_ARGUMENT_UNSUPPORTED, lv.VIR_ERR_OPERATION_INVALID):
                why = ("the guest agent is silent: is qemu-guest-agent installed and running in the image, "
                       "and does the domain XML keep the org.qemu.guest_agent.0 channel?")
            else:
                why = "the agent refused it"
            raise GuestAgentError(f"guest agent command {command} in {self.name} failed: {e} ({why})") from e
        return json.loads(reply).get("return")

    def _exec(self, argv: Sequence[str], env: Mapping[str, str] | None, capture: bool) -> int:
        if not argv:
            raise ValueError("empty command")
        full = dict(self.config.guest_env)
        full.update(env or {})
        args = {"path": str(argv[0]), "arg": [str(a) for a in argv[1:]],
                "env": [f"{k}={v}" for k, v in full.items()], "capture-output": capture}
        try:
            return int(self._agent("guest-exec", args)["pid"])
        except GuestAgentError as e:
            if "No such file" in str(e) or "Failed to execute child process" in str(e):
                raise FileNotFoundError(f"{argv[0]} is not installed in the guest image ({e})") from None
            raise

    def _exec_status(self, pid: int) -> dict[str, Any]:
        return self._agent("guest-exec-status", {"pid": pid})

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a command in the guest to completion, with its output (like subprocess.run)."""
        self._check()
        if self._http is not None:
            return self._http.run(argv, timeout=timeout)
        pid = self._exec(argv, None, True)
        deadline = time.monotonic() + timeout
        for pause in backoff():
            status = self._exec_status(pid)
            if status.get("exited"):
                out = base64.b64decode(status.get("out-data", ""))
                err = base64.b64decode(status.get("err-data", ""))
                return subprocess.CompletedProcess(list(argv), _returncode(status), out, err)
            if time.monotonic() > deadline:
                try:
                    self._exec(["kill", "-KILL", str(pid)], None, False)
                except (GuestAgentError, FileNotFoundError):
                    pass
                raise subprocess.TimeoutExpired(list(argv), timeout)
            time.sleep(pause)
        raise AssertionError("unreachable")

    def spawn(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None,
              log: str | None = None) -> GuestProcess:  # type: ignore[override]
        """Start a program in the guest in a session of its own; returns a Popen-like `GuestProcess`.

        `cwd` is created in the guest when missing (adapters pass a profile folder named on the host)."""
        self._check()
        script = ('d=$1; l=$2; shift 2; mkdir -p "$d" && cd "$d" || exit 126; '
                  'if [ -n "$l" ]; then exec "$@" >>"$l" 2>&1; else exec "$@" >/dev/null 2>&1; fi')
        wrapped = ["setsid", "sh", "-c", script, "sh", cwd or "/", log or "", *argv]
        if self._http is not None:  # the server's own environment is the session's; add the toolkits' switches
            switches = {k: v for k, v in self.config.guest_env.items() if k.startswith("QT_") or k == "GTK_MODULES"}
            proc: Any = self._http.spawn(argv, {**switches, **(env or {})}, cwd, log)
        else:
            proc = GuestProcess(self, self._exec(wrapped, env, False), argv)
        self._procs.add(proc)
        return proc

    def kill_group(self, proc: Any) -> None:
        """Kill a spawned program's whole process group in the guest."""
        if proc.poll() is not None:
            return
        try:
            self.run(["kill", "-KILL", "--", f"-{int(proc.pid)}"], timeout=10)
            proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, DesktopError):
            pass

    def read_file(self, path: str) -> bytes:
        self._check()
        if self._http is not None:
            return self._http.read_file(path)
        handle = self._file_open(path, "r")
        chunks: list[bytes] = []
        try:
            while True:
                part = self._agent("guest-file-read", {"handle": handle, "count": 1 << 20})
                chunks.append(base64.b64decode(part.get("buf-b64", "")))
                if part.get("eof") or not part.get("count"):
                    break
        finally:
            self._agent("guest-file-close", {"handle": handle})
        return b"".join(chunks)

    def write_file(self, path: str, data: bytes) -> None:
        self._check()
        if self._http is not None:
            return self._http.write_file(path, data)
        parent = os.path.dirname(path)
        if parent:
            self.run(["mkdir", "-p", parent], timeout=10)
        handle = self._file_open(path, "w")
        try:
            for i in range(0, len(data), 1 << 20):
                self._agent("guest-file-write", {"handle": handle,
                                                 "buf-b64": base64.b64encode(data[i:i + (1 << 20)]).decode()})
        finally:
            self._agent("guest-file-close", {"handle": handle})

    def _file_open(self, path: str, mode: str) -> int:
        try:
            return int(self._agent("guest-file-open", {"path": path, "mode": mode}))
        except GuestAgentError as e:
            if "No such file" in str(e):
                raise FileNotFoundError(f"{path} does not exist in the guest") from None
            raise


def _code(e: BaseException) -> int | None:
    get = getattr(e, "get_error_code", None)
    return get() if callable(get) else None


def _beside_base(c: LibvirtConfig) -> str | None:
    """The `domain.xml` that vm_images/build.sh writes beside its image (that image has no bootloader, so
    only that template, which boots the kernel beside it, can start it); None for a remote URI, whose files
    are not ours to read."""
    if not c.base_image or not host_files_are_local(c.uri):
        return None
    xml = Path(c.base_image).with_name("domain.xml")
    return str(xml) if xml.is_file() else None


def _image_size(path: str, fmt: str) -> int:
    """Virtual size of a local image: a qcow2 header's size field, else the file size (raw)."""
    if fmt == "qcow2":
        with open(path, "rb") as f:
            head = f.read(32)
        if head[:4] == b"QFI\xfb":
            return int.from_bytes(head[24:32], "big")
    return os.path.getsize(path)


def parse_wmctrl(text: str) -> list[Window]:
    """Windows from `wmctrl -lGx` lines: id desktop x y w h instance.class host title."""
    out = []
    for line in text.splitlines():
        f = line.split(None, 8)
        if len(f) < 8:
            continue
        try:
            wid, x, y, w, h = int(f[0], 16), int(f[2]), int(f[3]), int(f[4]), int(f[5])
        except ValueError:
            continue
        out.append(Window(wid, f[6].split(".", 1)[-1], f[8] if len(f) > 8 else "", x, y, w, h))
    return out


# -------------------------------------------------------------------------------------- watchdog


def _start_watchdog(uri: str, name: str, pool: str, volume: str,
                    stdout: Any = subprocess.DEVNULL) -> subprocess.Popen:
    """A process that removes the domain when we die, however we die (its stdin closes then)."""
    return subprocess.Popen(
        [sys.executable, "-m", "coda_env.backends.libvirt", "--watchdog", uri, name, pool, volume],
        stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.DEVNULL, start_new_session=True,
        cwd=str(Path(__file__).resolve().parents[2]))


def _watchdog_main(uri: str, name: str, pool: str, volume: str) -> None:
    """Block on stdin; at EOF (the parent is gone) destroy the domain by name and delete its overlay."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for _ in sys.stdin.buffer:
        pass
    try:
        libvirt, _ = _libvirt()
        conn = libvirt.open(uri)
        done = destroy_domain(conn, name, pool, volume)
        conn.close()
    except Exception as e:
        done = [f"error: {e}"]
    print(f"watchdog {name}: {', '.join(done) or 'nothing to remove'}", flush=True)


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--watchdog":
    _watchdog_main(*sys.argv[2:6])
