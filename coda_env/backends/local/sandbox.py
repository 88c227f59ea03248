"""The seal around every app of the local backend: bubblewrap, plus a drop to an unprivileged user.

Why: the apps run code by design (GRASS's console, TeXstudio's terminal and `\\write18`, ChimeraX's
`runscript`), so an agent acting only through the screen can reach whatever the app's process can. A VM
closes that for the libvirt backend; here each app runs in its own namespaces (Debian's `bubblewrap`, a
maintained tool, not namespace code of ours):

- **no privileges**: as root, bwrap does the mounts and `setpriv` then drops to `SandboxConfig.uid`, a plain
  unprivileged uid with no capabilities and no-new-privs (root-owned files are "other" to it); as another
  user, bwrap's user namespace maps the user's own uid;
- **the system read-only** (`/usr`, `/etc`, `/var/lib`, `/var/cache`), nothing else of the host: no user's
  home, no project tree, no other desktop; a private `/tmp`, `/dev/shm` and `/run`;
- **writable**: only the folders it is given (the app's per-reset home; a check's scratch folder);
- **no network** (its own network namespace: connect gives ENETUNREACH), **its own PID namespace**
  (nothing it starts, `setsid` included, outlives it: when bwrap dies the kernel kills the namespace);
- **an allow-listed environment**: display, bus addresses, locale, home and what the adapter sets; never
  the harness's environment (API keys, tokens).

The desktop's sockets (the X display, the session and accessibility buses) are bound in read-only, at the
same paths, so the app cannot rename or replace them. `probe()` says once per process whether sandboxes
can start here, and why not.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
RUNTIME = ".run"  # XDG_RUNTIME_DIR of a sealed program: in its home (toolkits want it 0700 and their own)


class SandboxError(RuntimeError):
    """The sandbox cannot start here (bwrap missing, no namespaces): says why and how to opt out."""


@dataclass(frozen=True)
class SandboxConfig:
    """How apps are sealed. `uid`: the unprivileged user apps run as when the harness is root: `nobody`
    (65534) by default, since D-Bus refuses peers whose uid has no passwd entry, and `nobody` owns nothing."""

    enabled: bool = True
    uid: int = 65534
    system: tuple[str, ...] = ("/usr", "/etc", "/var/lib", "/var/cache")
    extra_ro: tuple[str, ...] = ()  # more host folders to show read-only (an app installed in /opt)
    # environment names passed through from the desktop's own environment (set by the backend, not the user)
    desktop_env: tuple[str, ...] = (
        "DISPLAY",
        "DBUS_SESSION_BUS_ADDRESS",
        "AT_SPI_BUS_ADDRESS",
        "QT_LINUX_ACCESSIBILITY_ALWAYS_ON",
        "QT_ACCESSIBILITY",
        "GTK_MODULES",
        "NO_AT_BRIDGE",
    )
    binds_ro: tuple[str, ...] = field(default=())  # host paths bound read-only at the same path (sockets)


@functools.lru_cache(maxsize=None)
def probe(uid: int = SandboxConfig.uid) -> str | None:
    """None when a sandbox can start on this machine; else one line saying why and how to opt out."""
    if shutil.which("bwrap") is None:
        return (
            "bubblewrap (bwrap) is not installed: run `make setup` (Debian's bubblewrap package), or pass "
            "sandbox=False to gym.make (the app then runs unsealed, with your user's rights)"
        )
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing: it drops the apps' privileges; or pass sandbox=False"
    cfg = SandboxConfig(uid=uid)
    argv = wrap_argv(["true"], cfg, writable=(), ro_binds=(), env={}, cwd="/")
    try:
        r = subprocess.run(argv, capture_output=True, timeout=20, env={"PATH": SAFE_PATH})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap could not start a sandbox ({e}); pass sandbox=False to gym.make to run apps unsealed"
    if r.returncode != 0:
        why = r.stderr.decode(errors="replace").strip().splitlines()
        return (
            f"bubblewrap cannot make a sandbox here ({why[-1] if why else 'exit ' + str(r.returncode)}; "
            f"user namespaces may be off: sysctl user.max_user_namespaces / kernel.unprivileged_userns_clone)"
            f": pass sandbox=False to gym.make to run apps unsealed"
        )
    return None


def wrap_argv(
    argv: Sequence[str],
    config: SandboxConfig,
    writable: Sequence[str],
    ro_binds: Sequence[str],
    env: Mapping[str, str],
    cwd: str | None,
    links: Mapping[str, str] | None = None,
    keep_fds: Sequence[int] = (),
) -> list[str]:
    """The bwrap command line that runs `argv` sealed. `writable` folders and `ro_binds` paths appear at
    their host paths; `links` are symlinks made inside (link path -> target); `env` is the whole
    environment the program gets."""
    root = os.geteuid() == 0
    a = [
        "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "coda",
    ]
    if not root:
        a += ["--unshare-user", "--disable-userns"]
    shown = [d for d in (*config.system, *config.extra_ro) if os.path.isdir(d)]
    for d in sorted({str(q) for p in shown for q in Path(p).parents if str(q) != "/"}, key=lambda q: q.count("/")):
        a += ["--perms", "0755", "--dir", d]  # (bwrap makes missing parents 0700: the user could not pass)
    for d in shown:
        a += ["--ro-bind", d, d]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = f"/{name}"
        if os.path.islink(p):
            a += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            a += ["--ro-bind", p, p]
    a += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--tmpfs",
        "/dev/shm",
        "--perms",
        "0755",
        "--tmpfs",
        "/run",
        "--perms",
        "0700",
        "--dir",
        "/run/user",
    ]
    # the folders above what is bound in: bwrap would make them 0700 (root's), which the user cannot pass
    above = {str(q) for p in (*writable, *ro_binds, *(links or {})) for q in Path(p).parents if str(q) != "/"}
    for d in sorted(above, key=lambda q: q.count("/")):
        if d not in ("/tmp", "/run") and not any(
            d == s or d.startswith(s + "/") for s in (*config.system, *config.extra_ro, "/proc", "/dev")
        ):
            a += ["--perms", "0755", "--dir", d]
    for w in writable:
        a += ["--bind", w, w]
    for p in ro_binds:
        a += ["--ro-bind", p, p]
    for link, target in (links or {}).items():
        a += ["--symlink", target, link]
    a += ["--clearenv"]
    for k, v in env.items():
        a += ["--setenv", k, v]
    if cwd:
        a += ["--chdir", cwd]
    if root:
        a += [
            "--cap-add",
            "CAP_SETUID,CAP_SETGID",
            "--",
            "setpriv",
            f"--reuid={config.uid}",
            f"--regid={config.uid}",
            "--clear-groups",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--no-new-privs",
        ]
    else:
        a += ["--"]
    return a + list(argv)


def sandbox_env(
    config: SandboxConfig, desktop_env: Mapping[str, str], app_env: Mapping[str, str] | None, home: str | None
) -> dict[str, str]:
    """The allow-listed environment of a sealed program: a safe PATH, locale, a private runtime folder, the
    desktop's display and buses, then what the adapter sets. Nothing else of the harness's environment."""
    env = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TMPDIR": "/tmp", "XDG_RUNTIME_DIR": "/run/user"}
    if home:
        env["HOME"] = home
        env["XDG_RUNTIME_DIR"] = os.path.join(home, RUNTIME)
    for k in config.desktop_env:
        if k in desktop_env:
            env[k] = desktop_env[k]
    env.update(app_env or {})
    env["PATH"] = SAFE_PATH if "PATH" not in (app_env or {}) else env["PATH"]
    return env


def hand_over(paths: Sequence[str], uid: int) -> None:
    """Give these folders (recursively) to the sandbox's user, so that it can write there (root only)."""
    if os.geteuid() != 0:
        return
    for top in paths:
        for dirpath, dirnames, filenames in os.walk(top):
            os.lchown(dirpath, uid, uid)
            for n in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                os.lchown(os.path.join(dirpath, n), uid, uid)


def hand_over_one(path: str, uid: int) -> None:
    if os.geteuid() == 0:
        os.lchown(path, uid, uid)


_CLONE_NEWNET = 0x40000000


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def sandbox_pids(bwrap_pid: int) -> list[int]:
    """Every process inside the sandbox that `bwrap_pid` (the bwrap we started) made, its init first."""
    out, todo = [], [bwrap_pid]
    while todo:
        kids = _children(todo.pop(0))
        out += kids
        todo += kids
    return out


def http_get_in_netns(bwrap_pid: int, port: int, path: str, timeout: float) -> bytes:
    """GET http://127.0.0.1:port/path inside the network namespace of the sandbox that `bwrap_pid` (the
    bwrap process we started) made. The request runs on a thread of its own that joins that namespace
    (setns moves only the calling thread), so nothing else of this process changes namespace."""
    import ctypes
    import http.client
    import threading

    inner = _children(bwrap_pid)
    if not inner:
        raise OSError(f"the sandbox of process {bwrap_pid} has no process inside")
    box: dict = {}

    def work() -> None:
        try:
            fd = os.open(f"/proc/{inner[0]}/ns/net", os.O_RDONLY)
            try:
                if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"cannot enter the sandbox's network ({os.strerror(err)}; needs root)")
            finally:
                os.close(fd)
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            try:
                conn.request("GET", path)
                r = conn.getresponse()
                body = r.read()
                if r.status >= 400:
                    raise OSError(f"HTTP {r.status} {r.reason}")
                box["body"] = body
            finally:
                conn.close()
        except Exception as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=work, name="coda-netns-get", daemon=True)
    t.start()
    t.join(timeout + 5)
    if "body" in box:
        return box["body"]
    e = box.get("error")
    raise e if isinstance(e, OSError) else OSError(str(e or f"no answer within {timeout}s"))
