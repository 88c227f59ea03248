"""The domain's lifecycle: the overlay on the base image (through libvirt's storage-volume API, so the base
is never written and remote URIs work unchanged), define + boot, waiting until the desktop is ready, the
snapshots (with memory), reverting to them, and removing it all again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
import weakref
from pathlib import Path
from string import Template
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from ..base import DesktopError, backoff
from .config import (
    DEFAULT_DOMAIN_XML,
    BaseImageError,
    DomainBootError,
    LibvirtConfig,
    LibvirtConnectError,
    host_files_are_local,
    is_local_uri,
)
from .watchdog import _cleanup, _start_watchdog


class DomainMixin:
    """`LibvirtDesktop`'s domain: start, reset, checkpoint, stop."""

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
        self._finalizer = weakref.finalize(
            self, _cleanup, self.config.uri, self.name, self.config.pool, self.volume, self._watchdog
        )
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
                raise DesktopError(
                    f"cannot revert domain {self.name} to snapshot {self._snapshot.getName()!r}: {e}"
                ) from None
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
        cmd = json.dumps(
            {"execute": "human-monitor-command", "arguments": {"command-line": f"loadvm {self._snapshot.getName()}"}}
        )
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
            hint = (
                "start the daemon: `make vm-setup` (as root), `/usr/sbin/libvirtd -d` or `systemctl start libvirtd`"
                if is_local_uri(uri)
                else "check that libvirtd runs on that host and that the URI and "
                "its transport (ssh keys, TLS) are right"
            )
            raise LibvirtConnectError(
                f"cannot connect to libvirt at {uri!r}: {e}. Is libvirtd running? "
                f"{hint}; or pass another uri in backend_options"
            ) from None

    def _find_base(self) -> tuple[str, int]:
        """The base image's path and capacity in bytes, looked up through libvirt's storage pools (so it
        works on a remote host), or on the local disk for a local URI."""
        base, lv = self.config.base_image, self._lv
        if not base:
            raise BaseImageError(
                "no base image configured: pass backend_options={'base_image': "
                "'/path/on/the/libvirt/host/coda-debian12.qcow2'} or set CODA_VM_IMAGE "
                "(`make vm-image` builds one)"
            )
        try:
            vol = self._conn.storageVolLookupByPath(base)
            return base, int(vol.info()[1])
        except lv.libvirtError:
            pass
        if host_files_are_local(self.config.uri):
            if os.path.isfile(base):
                return base, _image_size(base, self.config.base_format)
            raise BaseImageError(
                f"the base image {base} does not exist: build it with `make vm-image` or "
                f"point base_image at an existing qcow2"
            )
        raise BaseImageError(
            f"the base image {base} is in no storage pool at {self.config.uri}: copy it to "
            f"the libvirt host into a pool's directory and run `virsh pool-refresh POOL`"
        )

    def _pool(self) -> Any:
        lv, name = self._lv, self.config.pool
        try:
            pool = self._conn.storagePoolLookupByName(name)
        except lv.libvirtError:
            if not is_local_uri(self.config.uri):
                raise DomainBootError(
                    f"no storage pool {name!r} at {self.config.uri} for the overlays: create one there "
                    f"(`virsh pool-define-as {name} dir --target /var/lib/libvirt/images && virsh pool-start "
                    f"{name}`) or pass pool=..."
                ) from None
            os.makedirs(self.config.overlay_dir, exist_ok=True)
            xml = (
                f"<pool type='dir'><name>{escape(name)}</name><target><path>"
                f"{escape(self.config.overlay_dir)}</path></target></pool>"
            )
            try:
                pool = self._conn.storagePoolCreateXML(xml, 0)
            except lv.libvirtError:  # another env created it meanwhile
                pool = self._conn.storagePoolLookupByName(name)
        if not pool.isActive():
            pool.create(0)
        return pool

    def _create_overlay(self, base: str, capacity: int) -> str:
        """A new qcow2 volume backed by the base: the VM writes there, the base is only read."""
        xml = (
            f"<volume><name>{escape(self.volume or '')}</name><capacity unit='bytes'>{capacity}</capacity>"
            f"<target><format type='qcow2'/></target><backingStore><path>{escape(base)}</path>"
            f"<format type={quoteattr(self.config.base_format)}/></backingStore></volume>"
        )
        try:
            return str(self._pool().createXML(xml, 0).path())
        except self._lv.libvirtError as e:
            raise DomainBootError(
                f"cannot create the overlay disk {self.volume} in pool {self.config.pool!r} at {self.config.uri}: {e}"
            ) from None

    def domain_xml(self, overlay: str) -> str:
        """The domain XML for this desktop: the configured template filled in."""
        c = self.config
        text = c.domain_xml or _beside_base(c) or DEFAULT_DOMAIN_XML
        if not text.lstrip().startswith("<"):
            text = Path(text).read_text()
        cpu = "<cpu mode='host-passthrough'/>" if c.domain_type == "kvm" else ""
        try:
            return Template(text).substitute(
                name=escape(self.name or ""),
                domain_type=escape(c.domain_type),
                memory_mib=int(c.memory_mib),
                vcpus=int(c.vcpus),
                cpu=cpu,
                overlay=quoteattr(overlay),
                width=int(c.width),
                height=int(c.height),
            )
        except (KeyError, ValueError) as e:
            raise DomainBootError(
                f"the domain XML template has an unknown or malformed placeholder: {e}; "
                f"known: $name $domain_type $memory_mib $vcpus $cpu $overlay $width "
                f"$height"
            ) from None

    def _boot(self, xml: str) -> Any:
        lv = self._lv
        try:
            dom = self._conn.defineXML(xml)
        except lv.libvirtError as e:
            raise DomainBootError(f"libvirt rejected the domain XML of {self.name}: {e}") from None
        try:
            dom.create()
        except lv.libvirtError as e:
            hint = (
                " (domain_type='kvm' needs a working /dev/kvm on the host; use 'qemu' for software emulation)"
                if self.config.domain_type == "kvm"
                else ""
            )
            raise DomainBootError(
                f"domain {self.name} failed to start: {e}{hint}; QEMU's log is "
                f"/var/log/libvirt/qemu/{self.name}.log on the libvirt host"
            ) from None
        return dom

    def _boot_failed(self) -> None:
        """Raise if the domain stopped (crashed, powered off) while we wait for it."""
        try:
            state, reason = self._dom.state()
        except self._lv.libvirtError as e:
            raise DomainBootError(f"domain {self.name} vanished while booting: {e}") from None
        if state in (self._lv.VIR_DOMAIN_SHUTOFF, self._lv.VIR_DOMAIN_CRASHED, self._lv.VIR_DOMAIN_SHUTDOWN):
            raise DomainBootError(
                f"domain {self.name} stopped while booting (state {state}, reason {reason}); "
                f"see /var/log/libvirt/qemu/{self.name}.log on the libvirt host"
            )

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
                        f"({last.strip()}); check the image's auto-login X session"
                    )
                time.sleep(pause)

    def _save_snapshot(self, name: str | None = None, description: str = "desktop ready") -> None:
        """Save the current state, memory included (an internal qcow2 snapshot of the overlay), as the one
        `reset` reverts to."""
        name = name or self.config.snapshot
        xml = (
            f"<domainsnapshot><name>{escape(name)}</name>"
            f"<description>coda: {escape(description)}</description></domainsnapshot>"
        )
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
