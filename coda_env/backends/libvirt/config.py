"""The libvirt backend's configuration, its error classes, and the lazy import of libvirt-python (shared
by every module of the package; nothing here talks to libvirt)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..base import DesktopError

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


class GuestHttpError(DesktopError):
    """An HTTP GET inside the guest (`LibvirtDesktop.http_get`) failed: nothing answers on the port, the
    server replied with an error status, or it did not answer in time."""


def _libvirt() -> tuple[Any, Any]:
    """Import (libvirt, libvirt_qemu) lazily: the rest of coda_env must work without libvirt-python."""
    try:
        import libvirt
        import libvirt_qemu
    except ImportError as e:
        raise LibvirtMissingError(
            f"the libvirt backend needs libvirt-python ({e}): pip install 'coda[vm]' (building it needs the "
            "apt packages libvirt-dev and pkg-config; `make setup` installs both)"
        ) from None
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
GUEST_PYTHON = "/usr/bin/python3"
"""The guest's interpreter for the readers the host sends (app state, http_get): the system's, named by its
path, not looked up on a PATH that may hold folders the guest's user writes (~/.local/bin in a desktop
session, which the "http" transport's server inherits)."""


@dataclass
class LibvirtConfig:
    """Where and how to build the VM. Paths (base_image, overlay_dir) are on the libvirt host."""

    uri: str = "qemu:///system"
    base_image: str = field(default_factory=lambda: os.environ.get("CODA_VM_IMAGE", ""))
    # default: $CODA_VM_IMAGE (what `make vm-test` sets)
    base_format: str = "qcow2"
    domain_xml: str | None = None  # template text, or a local file holding it; None: the domain.xml
    # beside a local base image (build.sh writes one), else
    # DEFAULT_DOMAIN_XML
    width: int = 1280
    height: int = 800
    memory_mib: int = 2048
    vcpus: int = 2
    domain_type: str = "qemu"  # software emulation (nested KVM hangs here); "kvm" on real hosts
    snapshot: str = "coda-ready"
    pool: str = "default"  # storage pool that holds the overlays
    overlay_dir: str = "/var/lib/libvirt/images/coda"  # a local URI's pool path, when the pool is missing
    name_prefix: str = "coda"
    boot_timeout: float = 900.0  # first boot under TCG is slow
    revert_timeout: float = 120.0
    revert_mode: str = "loadvm"  # "loadvm": HMP loadvm inside the running QEMU (measured 1-3 s under
    # TCG); "libvirt": virDomainRevertToSnapshot, which in libvirt 9
    # restarts QEMU with -loadvm (4-10 s). loadvm falls back to libvirt.
    agent_timeout: float = 10.0  # one guest agent command
    app_timeout: float = 300.0  # an app's start in the guest (CodaEnv's ready_timeout): 30 s under TCG
    wait_for_agent: bool = True  # False only for drivers without an agent (libvirt's test driver)
    ready_command: tuple[str, ...] = ("wmctrl", "-m")  # succeeds once the window manager is up
    guest_env: dict[str, str] = field(
        default_factory=lambda: {
            "DISPLAY": ":0",
            "HOME": "/root",
            "PATH": GUEST_PATH,
            "XDG_RUNTIME_DIR": "/run/user/0",
            "LANG": "C.UTF-8",
            "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/coda/bus",  # vm_images/guest/xinitrc
            "QT_LINUX_ACCESSIBILITY_ALWAYS_ON": "1",
            "QT_ACCESSIBILITY": "1",
            "GTK_MODULES": "gail:atk-bridge",
        }
    )
    a11y: bool = True  # before the snapshot: wait until the AT-SPI bus answers the reader
    guest_python: str = GUEST_PYTHON  # the interpreter that runs the readers sent to the guest
    guest: str = "agent"  # how commands and files reach the guest: "agent" (the QEMU guest
    # agent, our image) or "http" (an OSWorld-style server, e.g.
    # ScienceBoard's image; backends/libvirt/guest_http.py)
    guest_url: str | None = None  # "http": the server's URL; None: the domain's DHCP lease + guest_port
    guest_port: int = 5000
    resize: bool = True  # resize screenshots of another size (else DesktopError)
    key_hold_ms: int = 10  # how long sendKey holds a chord (QEMU's default is 100 ms)
    native_hscroll: bool = False  # QMP wheel-left/right (QEMU >= 8.1); else shift + wheel
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


def _code(e: BaseException) -> int | None:
    get = getattr(e, "get_error_code", None)
    return get() if callable(get) else None
