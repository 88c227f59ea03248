"""Commands, files and app state in the guest: the QEMU guest agent (`guest-exec`, `guest-file-*`), or the
OSWorld-style HTTP server of ScienceBoard's image (`guest_http.py`) when `guest="http"`; accessibility
trees by running coda_env/a11y.py in the guest (`GuestA11y`); `http_get` to a server inside the guest.

The readers the host runs in the guest (a11y.py, HTTP_GET_SCRIPT) travel with each call as the program text
of `python3 -I -c SOURCE ARGS...` (`reader_argv`): no copy of them is left in the guest between calls, where
the guest's user could replace it and forge the state the checks read."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ... import a11y as a11y_module
from ...a11y import A11yError, Node
from ..base import DesktopError, PolledProcess, Window, backoff, poll_until
from .config import GUEST_PYTHON, DomainBootError, GuestAgentError, GuestHttpError, _code
from .guest_http import OSWorldGuest

if TYPE_CHECKING:
    from . import LibvirtDesktop


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


A11Y_SOURCE = Path(a11y_module.__file__).read_text(encoding="utf-8")
"""coda_env/a11y.py, the accessibility reader, as the host has it: sent whole with every read (`GuestA11y`)."""

MAX_ARG_STRLEN = 128 * 1024
"""Linux's limit on one argument of a program (MAX_ARG_STRLEN, 32 pages): a reader's source, sent as one
argument, must stay under it. Neither transport has a lower one (qemu-ga's JSON messages may reach 64 MiB;
the OSWorld server's /execute takes any JSON body). a11y.py is about 13 KB."""


def reader_argv(python: str, source: str, args: Sequence[str]) -> list[str]:
    """`python -I -c SOURCE ARGS...`: a reader run in the guest from the text the host sends, never a file there.

    `source` is the host's own fixed program (coda_env/a11y.py, HTTP_GET_SCRIPT), never agent or task data:
    what varies per call is in `args`, which the program reads as arguments. -I (isolated): no current folder
    on sys.path (a server's cwd may be the user's home), no user site-packages (usercustomize), no PYTHON*
    variables; only the interpreter and the system's library (jeepney from python3-jeepney) are the guest's."""
    if len(source.encode()) >= MAX_ARG_STRLEN:
        raise ValueError(
            f"a reader's source is {len(source.encode())} bytes, over the {MAX_ARG_STRLEN}-byte limit of "
            f"one argument in the guest"
        )
    return [python, "-I", "-c", source, *[str(a) for a in args]]


HTTP_GET_SCRIPT = r"""import base64, socket, sys, urllib.error, urllib.request
url, timeout = sys.argv[1], float(sys.argv[2])
slow = (socket.timeout, TimeoutError)
try:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=timeout) as r:
        body = r.read()
except urllib.error.HTTPError as e:
    sys.stderr.write("HTTP %d %s: %r" % (e.code, e.reason, e.read()[:300]))
    sys.exit(3)
except urllib.error.URLError as e:
    sys.stderr.write(str(e.reason))
    sys.exit(4 if isinstance(e.reason, slow) else 2)
except slow as e:
    sys.stderr.write("timed out: %s" % e)
    sys.exit(4)
except OSError as e:
    sys.stderr.write(str(e))
    sys.exit(2)
sys.stdout.write(base64.b64encode(body).decode())
"""
"""What `http_get` runs in the guest as `python3 -I -c HTTP_GET_SCRIPT URL TIMEOUT`: fixed text, the URL an
argument. No proxy (127.0.0.1 is the guest's own). stdout: the body in base64 (the "http" transport carries
output as text); exit 2: no connection, 3: an HTTP error status, 4: timed out."""

HTTP_GET_START = 30.0  # seconds http_get allows the guest's python3 to start (a first start under TCG is slow)

_HTTP_PATH = re.compile(r"/(?:[A-Za-z0-9\-._~/?=&+,:;@]|%[0-9A-Fa-f]{2})*")


def check_http_path(path: str) -> str:
    """`path` when it is a URL path (and query) of safe characters only: letters, digits, `-._~/?=&+,:;@`
    and %XX escapes, starting with one '/'; else ValueError. Quote queries with urllib.parse.quote/urlencode."""
    if not isinstance(path, str) or len(path) > 8192 or path.startswith("//") or not _HTTP_PATH.fullmatch(path):
        raise ValueError(
            f"http_get needs a URL path that starts with '/' and holds only letters, digits, "
            f"-._~/?=&+,:;@ and %XX escapes (quote the query with urllib.parse.quote): {path!r}"
        )
    return path


class GuestA11y:
    """The apps' accessibility trees in the guest: each read sends coda_env/a11y.py's text and runs it there
    (`reader_argv`, through the guest agent or the "http" transport); it prints the app's tree as JSON, with
    the states and extents of the nodes whose roles the caller names (`details_roles`). No reader file is
    kept in the guest, so the guest's user has none to replace.

    Why not a D-Bus connection from the host: the guest's AT-SPI bus is a unix socket inside the VM. A
    channel to it (virtio-serial) would carry one D-Bus connection whose state a snapshot revert rewinds;
    one stateless command per read survives reverts, and a read is one round trip either way. States and
    extents are those of the moment of the read (the local client asks live)."""

    def __init__(self, desktop: "LibvirtDesktop", address: str, timeout: float = 30.0, python: str = GUEST_PYTHON):
        self.desktop, self.address, self.timeout, self.python = desktop, address, timeout, python

    def app_tree(
        self,
        name: str,
        skip_roles: frozenset[str] = frozenset(),
        texts: bool = False,
        details_roles: frozenset[str] = frozenset(),
    ) -> Node | None:
        args = ["tree", self.address, name]
        for role in sorted(skip_roles):
            args += ["--skip", role]
        for role in sorted(details_roles):
            args += ["--details", role]
        if texts:
            args.append("--texts")
        data = self._read(args, name)
        return Node.from_dict(data) if data is not None else None

    def _read(self, args: list[str], name: str) -> Any:
        """Run the reader (sent whole with the call) in the guest; its JSON answer (a tree, or rows)."""
        try:
            p = self.desktop.run(reader_argv(self.python, A11Y_SOURCE, args), timeout=self.timeout)
        except FileNotFoundError:
            raise A11yError(
                f"{self.python} is not installed in the guest image (vm_images/build.sh installs it "
                f"with python3-jeepney)"
            ) from None
        except subprocess.TimeoutExpired:
            raise A11yError(f"reading {name}'s accessibility tree in the guest took over {self.timeout:.0f}s") from None
        if p.returncode != 0:
            raise A11yError(
                f"the guest's a11y reader failed (exit {p.returncode}): "
                f"{p.stderr.decode(errors='replace').strip()[-400:]}"
            )
        try:
            return json.loads(p.stdout)
        except ValueError as e:
            what = "tree" if args[0] == "tree" else "rows"
            raise A11yError(f"the guest's a11y reader printed no JSON {what} ({e})") from None

    def showing_rows(
        self,
        name: str,
        max_nodes: int,
        text_roles: frozenset[str] = frozenset(),
        unlisted: frozenset[str] = frozenset(),
        skip_roles: frozenset[str] = frozenset(),
        text_limit: int = 2000,
    ) -> list[tuple] | None:
        """The guest's reader's `showing` command (a11y.py, sent with the call)."""
        args = ["showing", self.address, name, "--max", str(int(max_nodes)), "--text-limit", str(int(text_limit))]
        for flag, roles in (("--text", text_roles), ("--unlisted", unlisted), ("--skip", skip_roles)):
            for role in sorted(roles):
                args += [flag, role]
        data = self._read(args, name)
        if data is None:
            return None
        return [
            (
                int(d),
                str(r),
                str(n),
                t if isinstance(t, str) else None,
                tuple(int(v) for v in e) if e else None,
                [str(x) for x in st],
            )
            for d, r, n, t, e, st in data
        ]

    def states(self, node: Node) -> set[str]:
        if node.states is None:
            raise A11yError(
                f"the states of {node.role} {node.name!r} were not read: pass its role in app_tree's details_roles"
            )
        return set(node.states)

    def extents(self, node: Node) -> tuple[int, int, int, int] | None:
        if node.states is None:  # read together with the states
            raise A11yError(
                f"the extents of {node.role} {node.name!r} were not read: pass its role in app_tree's details_roles"
            )
        return node.extents

    def close(self) -> None:
        pass


class GuestMixin:
    """`LibvirtDesktop`'s guest transport: waiting for it, commands, programs, files, app state."""

    def _wait_guest(self, deadline: float) -> None:
        if self.config.guest == "agent":
            return self._wait_agent(deadline)

        def answered() -> bool | None:
            self._boot_failed()
            if self._http is None:
                url = self.config.guest_url or self._lease_url()
                self._http = OSWorldGuest(url, self.config.agent_timeout) if url else None
            return True if self._http is not None and self._http.ping() else None

        def timeout() -> Exception:
            where = self._http.url if self._http else "no DHCP lease of the domain yet"
            return GuestAgentError(
                f"the HTTP server in {self.name} did not answer ({where}): the image must run an "
                f"OSWorld-style server on port {self.config.guest_port}, and the domain XML needs a network "
                f"interface (vm_images/scienceboard.xml.in) or pass guest_url"
            )

        poll_until(deadline, answered, timeout, 0.2, 2.0)

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
        last: list[Exception] = []

        def answered() -> bool | None:
            self._boot_failed()
            try:
                self._agent("guest-ping", timeout=5)
                return True
            except GuestAgentError as e:
                if e.__cause__ is not None and _code(e.__cause__) == lv.VIR_ERR_NO_SUPPORT:
                    raise
                last[:] = [e]
                return None

        def timeout() -> Exception:
            return GuestAgentError(
                f"the QEMU guest agent in {self.name} did not answer within "
                f"{self.config.boot_timeout:.0f}s ({last[0] if last else 'no answer'}): install and enable "
                f"qemu-guest-agent in the image and keep the org.qemu.guest_agent.0 channel in the domain XML"
            )

        poll_until(deadline, answered, timeout, 0.1, 2.0)

    def _prepare_a11y(self, deadline: float) -> None:
        """Run the a11y reader (`a11y.py apps`, sent with the call like every read) until the guest's AT-SPI
        bus answers, which also activates AT-SPI's registry, so an app started later registers at once. The
        running registry is part of the snapshot; no file is written to the guest."""
        t0 = time.monotonic()
        address = self._bus_address() or ""
        argv = reader_argv(self.config.guest_python, A11Y_SOURCE, ["apps", address])
        last = ""
        for pause in backoff(0.1, 1.0):
            try:
                p = self.run(argv, timeout=60)
            except FileNotFoundError:
                raise DomainBootError(
                    f"the guest image has no {self.config.guest_python}, which reading app "
                    f"state needs: rebuild it with `make vm-image`, or pass a11y=False"
                ) from None
            except subprocess.TimeoutExpired:  # a first Python start under TCG can be slow: poll on
                p = subprocess.CompletedProcess([], 124, b"", b"the a11y reader took over 60 s")
            if p.returncode == 0:
                self.timings["a11y"] = time.monotonic() - t0
                return
            last = p.stderr.decode(errors="replace").strip()[-300:]
            if "ModuleNotFoundError" in last or time.monotonic() + pause > deadline:
                raise DomainBootError(
                    f"the accessibility bus in {self.name} did not come up ({last}): the image needs "
                    f"python3-jeepney (installed system-wide: the reader runs isolated, `-I`, without the user's "
                    f"site-packages) and an AT-SPI bus at {address} (vm_images/guest/xinitrc); rebuild it with "
                    f"`make vm-image`, or pass a11y=False"
                )
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
            raise DesktopError(
                "guest_env has no DBUS_SESSION_BUS_ADDRESS: the guest's accessibility bus is "
                "unknown (the image's xinitrc puts it at unix:path=/run/coda/bus)"
            )
        return GuestA11y(self, address, python=self.config.guest_python)

    def windows(self) -> list[Window]:
        """Top-level windows, from `wmctrl -lGx` in the guest (the image installs wmctrl)."""
        try:
            p = self.run(["wmctrl", "-lGx"], timeout=10)
        except FileNotFoundError:
            raise DesktopError(
                "wmctrl is not installed in the guest image (the vm_images recipe installs it); windows() needs it"
            ) from None
        return parse_wmctrl(p.stdout.decode(errors="replace")) if p.returncode == 0 else []

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
                why = (
                    f"this libvirt driver ({self.config.uri}) has no QEMU guest agent; use a qemu:// URI, "
                    f"or wait_for_agent=False and no run/read_file/write_file"
                )
            elif code in (
                lv.VIR_ERR_AGENT_UNRESPONSIVE,
                lv.VIR_ERR_AGENT_UNSYNCED,
                lv.VIR_ERR_ARGUMENT_UNSUPPORTED,
                lv.VIR_ERR_OPERATION_INVALID,
            ):
                why = (
                    "the guest agent is silent: is qemu-guest-agent installed and running in the image, "
                    "and does the domain XML keep the org.qemu.guest_agent.0 channel?"
                )
            else:
                why = "the agent refused it"
            raise GuestAgentError(f"guest agent command {command} in {self.name} failed: {e} ({why})") from e
        return json.loads(reply).get("return")

    def _exec(self, argv: Sequence[str], env: Mapping[str, str] | None, capture: bool) -> int:
        if not argv:
            raise ValueError("empty command")
        full = dict(self.config.guest_env)
        full.update(env or {})
        args = {
            "path": str(argv[0]),
            "arg": [str(a) for a in argv[1:]],
            "env": [f"{k}={v}" for k, v in full.items()],
            "capture-output": capture,
        }
        try:
            return int(self._agent("guest-exec", args)["pid"])
        except GuestAgentError as e:
            if "No such file" in str(e) or "Failed to execute child process" in str(e):
                raise FileNotFoundError(f"{argv[0]} is not installed in the guest image ({e})") from None
            raise

    def _exec_status(self, pid: int) -> dict[str, Any]:
        return self._agent("guest-exec-status", {"pid": pid})

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, *, writable: Sequence[str] | None = None
    ) -> subprocess.CompletedProcess:
        """Run a command in the guest to completion, with its output (like subprocess.run). `writable`
        changes nothing here: the VM is the sandbox."""
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

    def spawn(
        self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None, log: str | None = None
    ) -> GuestProcess:  # type: ignore[override]
        """Start a program in the guest in a session of its own; returns a Popen-like `GuestProcess`.

        `cwd` is created in the guest when missing (adapters pass a profile folder named on the host)."""
        self._check()
        script = (
            'd=$1; l=$2; shift 2; mkdir -p "$d" && cd "$d" || exit 126; '
            'if [ -n "$l" ]; then exec "$@" >>"$l" 2>&1; else exec "$@" >/dev/null 2>&1; fi'
        )
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
                self._agent(
                    "guest-file-write",
                    {"handle": handle, "buf-b64": base64.b64encode(data[i : i + (1 << 20)]).decode()},
                )
        finally:
            self._agent("guest-file-close", {"handle": handle})

    def _file_open(self, path: str, mode: str) -> int:
        try:
            return int(self._agent("guest-file-open", {"path": path, "mode": mode}))
        except GuestAgentError as e:
            if "No such file" in str(e):
                raise FileNotFoundError(f"{path} does not exist in the guest") from None
            raise

    def http_get(self, port: int, path: str, timeout: float = 10.0) -> bytes:
        """GET http://127.0.0.1:PORT/PATH inside the guest, where an app's own server (ChimeraX's REST) listens
        unreachable from the host: the body of a 2xx reply.

        It runs the fixed program `python3 -I -c HTTP_GET_SCRIPT URL TIMEOUT` through the guest's transport (the
        image has python3, not curl): the URL is an argument, never shell text, and `path` is checked first
        (`check_http_path`). `timeout` bounds the request; the guest's python3 start (seconds under TCG) is
        allowed `HTTP_GET_START` on top. Raises GuestHttpError when nothing answers, the reply is not 2xx, or
        it takes too long."""
        self._check()
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"http_get port must be an int in 1..65535, not {port!r}")
        if not timeout > 0:
            raise ValueError(f"http_get timeout must be positive, not {timeout!r}")
        url = f"http://127.0.0.1:{port}{check_http_path(path)}"
        try:
            p = self.run(
                reader_argv(self.config.guest_python, HTTP_GET_SCRIPT, [url, repr(float(timeout))]),
                timeout=timeout + HTTP_GET_START,
            )
        except FileNotFoundError:
            raise GuestHttpError(
                f"GET {url} in {self.name}: the guest image has no {self.config.guest_python}, "
                f"which http_get runs (vm_images/build.sh installs it)"
            ) from None
        except subprocess.TimeoutExpired:
            raise GuestHttpError(
                f"GET {url} in {self.name}: no reply within {timeout + HTTP_GET_START:.0f} s "
                f"(the request's {timeout:g} s and python3's start in the guest)"
            ) from None
        why = p.stderr.decode(errors="replace").strip()[-400:]
        if p.returncode == 0:
            try:
                return base64.b64decode(p.stdout, validate=True)
            except ValueError:
                raise GuestHttpError(
                    f"GET {url} in {self.name}: the guest's reply was not the expected base64 ({p.stdout[:100]!r})"
                ) from None
        if p.returncode == 2:
            raise GuestHttpError(
                f"GET {url} in {self.name}: nothing answers on port {port} in the guest ({why}); "
                f"is the app's server started?"
            )
        if p.returncode == 3:
            raise GuestHttpError(f"GET {url} in {self.name}: the server answered {why}")
        if p.returncode == 4:
            raise GuestHttpError(f"GET {url} in {self.name}: no reply within {timeout:g} s ({why})")
        raise GuestHttpError(f"GET {url} in {self.name}: python3 in the guest failed (exit {p.returncode}): {why}")


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
