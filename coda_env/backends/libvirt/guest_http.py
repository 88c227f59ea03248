"""The second guest transport of the libvirt backend: an OSWorld-style HTTP server inside the guest.

ScienceBoard's published VM image (an Ubuntu VMware image, driven by OSWorld's `DesktopEnv`) runs OSWorld's
`desktop_env/server/main.py` on port 5000 in the user's X session, and no QEMU guest agent. Converted to
qcow2 (vm_images/README.md), it boots under libvirt like our own image; screenshots and input still go
through libvirt and QEMU, and this client does what the guest agent does for our image, with the server's
documented endpoints:

- `POST /execute` `{"command": [...], "shell": false}` -> `{"status", "output", "error", "returncode"}`:
  commands (and so `coda_env/a11y.py`, which reads app state, sent with each call as in our image);
- `POST /file` (form `file_path`) -> the file's bytes, 404 when it is missing;
- `POST /setup/upload` (multipart `file_path`, `file_data`): writing files;
- `GET /platform`: the readiness probe.

Only these are used. The server's `/setup/launch` returns no pid, so programs are started through
`/execute` under `setsid` with their exit status written to a file, which is what `poll()` reads. The
server runs commands without an environment of their own, so one is prefixed with `env K=V ...`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence

from ..base import DesktopError, PolledProcess


class GuestServerError(DesktopError):
    """The HTTP server in the guest did not answer, or refused a request."""


def _multipart(fields: Mapping[str, str], files: Mapping[str, bytes]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    out = []
    for k, v in fields.items():
        out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode())
    for k, data in files.items():
        out.append(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{k}"\r\n'
            f"Content-Type: application/octet-stream\r\n\r\n".encode()
            + data
            + b"\r\n"
        )
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


class OSWorldGuest:
    """Commands and files in a guest through its OSWorld-style server at `url` (e.g. http://10.0.0.5:5000)."""

    EXIT_DIR = "/tmp/coda-exit"  # where spawned programs' exit statuses land

    def __init__(self, url: str, timeout: float = 30.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def _request(
        self, method: str, path: str, body: bytes | None = None, ctype: str | None = None, timeout: float | None = None
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        if ctype:
            req.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except TimeoutError:
            raise
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise TimeoutError(str(e.reason)) from None
            raise GuestServerError(
                f"the guest's HTTP server at {self.url} did not answer {method} {path}: "
                f"{e.reason} (is the VM up, its network on, and the server running on "
                f"that port?)"
            ) from None
        except OSError as e:
            raise GuestServerError(
                f"the guest's HTTP server at {self.url} did not answer {method} {path}: "
                f"{getattr(e, 'reason', e)} (is the VM up, its network on, and the "
                f"server running on that port?)"
            ) from None

    def ping(self) -> bool:
        try:
            status, _ = self._request("GET", "/platform", timeout=5)
        except (GuestServerError, TimeoutError):
            return False
        return status == 200

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30.0
    ) -> subprocess.CompletedProcess:
        command = (["env", *(f"{k}={v}" for k, v in env.items())] if env else []) + [str(a) for a in argv]
        body = json.dumps({"command": command, "shell": False}).encode()
        try:
            status, data = self._request("POST", "/execute", body, "application/json", timeout=timeout + 5)
        except TimeoutError:
            raise subprocess.TimeoutExpired(list(argv), timeout) from None
        try:
            reply = json.loads(data)
        except ValueError:
            raise GuestServerError(f"the guest's server answered /execute with no JSON (HTTP {status})") from None
        if status != 200 or reply.get("status") != "success":
            message = str(reply.get("message", reply))
            if "No such file or directory" in message:
                raise FileNotFoundError(f"{argv[0]} is not installed in the guest ({message})")
            if "timed out" in message:
                raise subprocess.TimeoutExpired(list(argv), timeout)
            raise GuestServerError(f"the guest's server could not run {list(argv)[:3]}: {message}")
        return subprocess.CompletedProcess(
            list(argv),
            int(reply.get("returncode", -1)),
            str(reply.get("output", "")).encode(),
            str(reply.get("error", "")).encode(),
        )

    def read_file(self, path: str) -> bytes:
        body, ctype = _multipart({"file_path": path}, {})
        status, data = self._request("POST", "/file", body, ctype)
        if status == 404:
            raise FileNotFoundError(f"{path} does not exist in the guest")
        if status != 200:
            raise GuestServerError(f"the guest's server refused to read {path} (HTTP {status}): {data[:200]!r}")
        return data

    def write_file(self, path: str, data: bytes) -> None:
        parent = path.rsplit("/", 1)[0]
        if parent:
            self.run(["mkdir", "-p", parent], timeout=10)
        body, ctype = _multipart({"file_path": path}, {"file_data": data})
        status, reply = self._request("POST", "/setup/upload", body, ctype)
        if status != 200:
            raise GuestServerError(f"the guest's server refused to write {path} (HTTP {status}): {reply[:200]!r}")

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str | None, log: str | None
    ) -> "HttpProcess":
        """Start a program in a session of its own; its shell writes the exit status for `poll`."""
        script = (
            'd=$1; l=$2; x=$3; shift 3; if mkdir -p "$d" && cd "$d"; then '
            'if [ -n "$l" ]; then "$@" >>"$l" 2>&1; else "$@" >/dev/null 2>&1; fi; c=$?; else c=126; fi; '
            'echo $c > "$x.tmp" && mv "$x.tmp" "$x"'
        )  # written whole: poll never reads half of it
        # sh -c LAUNCHER SCRIPT EXIT_DIR CWD LOG EXIT_DIR ARGV...: the launcher starts SCRIPT under setsid in
        # the background and prints its pid (= its process group: setsid does not fork in a background job).
        launcher = 's=$0; mkdir -p "$1"; shift; setsid sh -c "$s" sh "$@" </dev/null >/dev/null 2>&1 & echo $!'
        env_args = [f"{k}={v}" for k, v in (env or {}).items()]
        status = f"{self.EXIT_DIR}/{uuid.uuid4().hex}"  # one file per spawn: pids get reused
        command = [
            "env",
            *env_args,
            "sh",
            "-c",
            launcher,
            script,
            self.EXIT_DIR,
            cwd or "/",
            log or "",
            status,
            *[str(a) for a in argv],
        ]
        p = self.run(command, timeout=30)
        try:
            pid = int(p.stdout.decode().split()[-1])
        except (ValueError, IndexError):
            raise GuestServerError(
                f"starting {list(argv)[:3]} in the guest printed no pid: {(p.stdout + p.stderr)[-200:]!r}"
            ) from None
        return HttpProcess(self, pid, argv, status)


class HttpProcess(PolledProcess):
    """A program that `OSWorldGuest.spawn` started (pid = its process group)."""

    def __init__(self, guest: OSWorldGuest, pid: int, args: Sequence[str], status_file: str):
        super().__init__(pid, args)
        self._guest, self._status_file = guest, status_file

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                # alive first, then the status: a program that exits in between is read on the next poll
                code = (
                    self._guest.run(
                        [
                            "sh",
                            "-c",
                            'kill -0 "$1" 2>/dev/null && echo running || cat "$0" 2>/dev/null || echo gone',
                            self._status_file,
                            str(self.pid),
                        ],
                        timeout=10,
                    )
                    .stdout.decode()
                    .strip()
                )
            except (GuestServerError, subprocess.TimeoutExpired):
                return None
            if code == "gone":
                self.returncode = -signal.SIGKILL
            elif code != "running":
                try:
                    self.returncode = int(code)
                except ValueError:
                    self.returncode = -1
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            self._guest.run(["kill", f"-{int(sig)}", "--", f"-{self.pid}"], timeout=10)
