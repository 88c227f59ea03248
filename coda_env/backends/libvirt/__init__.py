"""The libvirt backend: one libvirt domain (a QEMU VM) per env.

Each `LibvirtDesktop` defines its own domain (unique name) whose disk is a qcow2 overlay on a shared base
image, created through libvirt's storage-volume API so that the base is never written and remote URIs
(`qemu+ssh://host/system`) work unchanged: nothing here touches the host's files except when the URI is
local. The first start boots the VM, waits for the guest agent and the desktop, and saves a snapshot with
memory; `reset()` reverts to it in seconds instead of booting again.

Observation: `virDomainScreenshot` (a PNG or PPM stream), decoded with Pillow. Input: `virDomainSendKey`
with Linux keycodes for keys and typing, and QMP `input-send-event` (absolute axes on the domain's USB
tablet, buttons, the wheel, held keys) through `qemuMonitorCommand`. App state: the QEMU guest agent
(`guest-exec`, `guest-file-*`); accessibility trees by running coda_env/a11y.py in the guest (`GuestA11y`),
its text sent with each call (`python3 -I -c SOURCE`), so that no reader is left in the guest for its user
to replace.

No orphans: `stop()` destroys and undefines the domain and deletes its overlay; so do garbage collection,
atexit, and a watchdog process that notices its parent's death (its stdin pipe closes) and removes the
domain by name through its own connection.

The translation of actions to input events is pure (`plan_input`, `key_chord`), so it is tested without a
VM.

The parts, one module each: `config` (LibvirtConfig, the errors), `domain` (overlay, define/boot, snapshots,
revert), `guest` (the guest agent: commands, programs, files, app state) and `guest_http` (the "http"
transport), `input` (sendKey, QMP pointer), `screen` (screenshots), `watchdog` (removal when the parent
dies). `LibvirtDesktop` is their mixins put together.
"""

from __future__ import annotations

import subprocess
import weakref
from typing import Any

from ..base import DesktopError, Window
from .config import (
    DEFAULT_DOMAIN_XML,
    GUEST_PATH,
    GUEST_PYTHON,
    BaseImageError,
    DomainBootError,
    GuestAgentError,
    GuestHttpError,
    LibvirtConfig,
    LibvirtConnectError,
    LibvirtMissingError,
    _libvirt,
    host_files_are_local,
    is_local_uri,
)
from .domain import DomainMixin, _image_size
from .guest import (
    A11Y_SOURCE,
    HTTP_GET_SCRIPT,
    HTTP_GET_START,
    MAX_ARG_STRLEN,
    GuestA11y,
    GuestMixin,
    GuestProcess,
    check_http_path,
    parse_wmctrl,
    reader_argv,
)
from .guest_http import GuestServerError, HttpProcess, OSWorldGuest
from .input import ABS_MAX, SHIFT, InputMixin, Keys, Step, key_chord, plan_input
from .screen import ScreenMixin, decode_screenshot
from .watchdog import _start_watchdog, destroy_domain

__all__ = [  # what `from coda_env.backends.libvirt import ...` offers (and the tests' _image_size, _start_watchdog)
    "A11Y_SOURCE",
    "ABS_MAX",
    "DEFAULT_DOMAIN_XML",
    "GUEST_PATH",
    "GUEST_PYTHON",
    "HTTP_GET_SCRIPT",
    "HTTP_GET_START",
    "MAX_ARG_STRLEN",
    "SHIFT",
    "BaseImageError",
    "DesktopError",
    "DomainBootError",
    "GuestA11y",
    "GuestAgentError",
    "GuestHttpError",
    "GuestProcess",
    "GuestServerError",
    "HttpProcess",
    "Keys",
    "LibvirtConfig",
    "LibvirtConnectError",
    "LibvirtDesktop",
    "LibvirtMissingError",
    "OSWorldGuest",
    "Step",
    "Window",
    "check_http_path",
    "decode_screenshot",
    "destroy_domain",
    "host_files_are_local",
    "is_local_uri",
    "key_chord",
    "parse_wmctrl",
    "make_desktop",
    "plan_input",
    "reader_argv",
    "_image_size",
    "_start_watchdog",
]


class LibvirtDesktop(DomainMixin, GuestMixin, InputMixin, ScreenMixin):
    """A desktop inside a libvirt domain: overlay disk, snapshot revert, QEMU screenshots and input,
    guest agent for commands and files."""

    capabilities = frozenset({"snapshots", "a11y"})
    tmpdir = None  # the guest's files are not this machine's
    app_timeout = 300.0  # the config's app_timeout replaces it per desktop
    """What this backend offers beyond the Desktop protocol (the env reads this instead of probing):
    snapshots (`checkpoint`, and `reset` reverting to it) and a11y (`a11y()` reads app state in the guest)."""

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


def make_desktop(width: int, height: int, sandbox: bool = True, **options) -> "LibvirtDesktop":
    """The backends table's entry point; `sandbox` changes nothing: the VM is the sandbox."""
    return LibvirtDesktop(LibvirtConfig(width=width, height=height, **options))
