"""Sealed envs (issue 23): a hostile agent, acting only through `env.step`, reaches nothing outside its app,
and nothing the reward reads except by doing the task.

Each attack runs on the real app under a real Xvfb, and each is proven to fail by what it would have left
behind (a sentinel file that does not appear, a connection a host server never receives, a process that
does not survive) and by the app's own output (files its commands wrote in the app's home). A canary key
sits in this process's environment, as a user's API key would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

from coda_env.backends.local import sandbox as sb
from coda_env.backends.local import LocalConfig, LocalDesktop
from coda_env.env import CodaEnv

from .conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]
CANARY = "sk-coda-canary-" + uuid.uuid4().hex
ROOTED = os.geteuid() == 0

needs_grass = pytest.mark.skipif(shutil.which("grass") is None, reason="GRASS GIS is not installed (make setup)")
needs_texstudio = pytest.mark.skipif(shutil.which("texstudio") is None, reason="TeXstudio is not installed")


@pytest.fixture(autouse=True)
def _canary(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    monkeypatch.setenv("HF_TOKEN", CANARY)


class HostListener:
    """A TCP server on this machine's loopback: a sealed app must never reach it."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
                self.hits += 1
                conn.close()
            except OSError:
                pass

    def close(self):
        self._stop = True
        self._t.join(2)
        self.sock.close()


def _assert_sealed(desktop: LocalDesktop) -> None:
    """Every process of every sealed app: not root, no canary, no network or PID namespace of ours, and a
    view of the file system without the project tree or the user's home."""
    assert desktop._sealed, "no sealed app on this desktop"
    mine_net = os.readlink("/proc/self/ns/net")
    mine_pid = os.readlink("/proc/self/ns/pid")
    for bwrap, home in desktop._sealed:
        procs = sb.sandbox_pids(bwrap.pid)
        assert procs, "the sandbox has no process"
        app = procs[-1]
        for pid in procs:
            status = Path(f"/proc/{pid}/status").read_text()
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
            cap_eff = next(line for line in status.splitlines() if line.startswith("CapEff:")).split()[1]
            if pid == app:
                assert uid != 0, "the app runs as root"
                assert int(cap_eff, 16) == 0, f"the app has capabilities {cap_eff}"
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            assert CANARY.encode() not in environ, "the harness's secrets reached the sandbox"
            assert os.readlink(f"/proc/{pid}/ns/net") != mine_net, "the sandbox shares the host's network"
            assert os.readlink(f"/proc/{pid}/ns/pid") != mine_pid, "the sandbox shares the host's PIDs"
        view = Path(f"/proc/{app}/root")
        assert (view / "usr" / "bin").is_dir() and (view / home).is_dir()
        assert not (view / str(ROOT).lstrip("/")).exists() or not any((view / str(ROOT).lstrip("/")).iterdir()), (
            "the project tree is visible to the app"
        )
        root_home = view / "root"
        assert not root_home.exists() or not any(root_home.iterdir()), "the user's home is visible to the app"


# --------------------------------------------------------------------------------------- the sandbox itself
def test_probe_says_sandboxes_start_here():
    assert sb.probe() is None


def test_a_sealed_command_reaches_nothing_and_leaves_nothing(tmp_path):
    """What a console or terminal of any app could try, run as a sealed program runs: each attempt fails,
    seen by what it writes in its home (the only place it can) and by sentinels that never appear."""
    listener = HostListener()
    sentinel = ROOT / f"coda_sentinel_{uuid.uuid4().hex}"
    host_tmp = Path("/tmp") / f"coda_sentinel_{uuid.uuid4().hex}"
    marker = f"coda-survivor-{uuid.uuid4().hex[:8]}"
    d = LocalDesktop(LocalConfig(window_manager=False))
    d.start()
    try:
        home = os.path.join(d.tmpdir, "coda-probe-home")
        os.mkdir(home)
        script = f"""
id -u > "$HOME/uid"
env > "$HOME/env"
ls -A {ROOT} > "$HOME/project_ls" 2>&1
ls -A /root > "$HOME/root_ls" 2>&1
touch {sentinel} 2> "$HOME/project_write" || echo refused >> "$HOME/project_write"
touch {host_tmp}
touch /usr/coda_x 2> "$HOME/usr_write" || echo refused >> "$HOME/usr_write"
cat /etc/shadow > "$HOME/shadow" 2>&1
bash -c 'exec 3<>/dev/tcp/127.0.0.1/{listener.port}' 2> "$HOME/net" && echo connected >> "$HOME/net"
setsid sh -c 'exec -a {marker} sleep 300' > /dev/null 2>&1 &
"""
        r = d.run(["sh", "-c", script], writable=[home], timeout=30)
        assert r.returncode == 0, r.stderr
        h = Path(home)
        if ROOTED:
            assert h.joinpath("uid").read_text().strip() == str(sb.SandboxConfig.uid)
        assert CANARY not in h.joinpath("env").read_text()
        assert "OPENAI_API_KEY" not in h.joinpath("env").read_text()
        assert "pyproject.toml" not in h.joinpath("project_ls").read_text()
        assert not set(os.listdir("/root")) & set(h.joinpath("root_ls").read_text().split())
        assert "refused" in h.joinpath("project_write").read_text()
        assert "refused" in h.joinpath("usr_write").read_text()
        assert "root:" not in h.joinpath("shadow").read_text()
        assert "connected" not in h.joinpath("net").read_text()
        assert not sentinel.exists() and not host_tmp.exists()
    finally:
        d.stop()
        listener.close()
    assert listener.hits == 0
    # nothing started in the sandbox outlives the desktop, setsid included
    assert wait_until(lambda: not any(marker.encode() in _cmdline(p) for p in _pids()), 5), (
        "a setsid process of the sandbox outlived its desktop"
    )


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_sandbox_false_runs_unsealed_and_a_missing_bwrap_is_one_line(monkeypatch):
    d = LocalDesktop(LocalConfig(sandbox=False, window_manager=False, accessibility=False))
    assert not d.sandbox.enabled
    sb.probe.cache_clear()
    real = shutil.which
    monkeypatch.setattr(sb.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real(name, *a, **k))
    try:
        with pytest.raises(Exception) as e:
            CodaEnv(app="kalgebra")
        msg = str(e.value)
        assert "bubblewrap" in msg and "sandbox=False" in msg and "\n" not in msg
    finally:
        sb.probe.cache_clear()


def test_the_window_manager_runs_nothing():
    """openbox's stock bindings open a terminal (root menu) or run commands; ours have none."""
    from coda_env.backends.local import _openbox_rc

    text = _openbox_rc(Path("/etc/xdg/openbox/rc.xml").read_text(), "/m.xml", "")
    for word in ("Execute", "root-menu", "GoToDesktop", "<keybind"):
        assert word not in text


# --------------------------------------------------------------------------------------- KAlgebra
def test_kalgebra_runs_sealed_and_still_scores(kalgebra_env):
    from .conftest import run_solution

    rewards, term, trunc, info = run_solution(kalgebra_env, "calc_power")
    assert rewards[-1] == 1.0, info
    kalgebra_env.reset(options={"task": "calc_power"})
    _assert_sealed(kalgebra_env.unwrapped.desktop)


# --------------------------------------------------------------------------------------- GRASS's console
def _console(env, command: str):
    """Type a command into GRASS's console as the oracles do (a '.' opens a completion list: esc closes it)."""
    env.step("pyautogui.click(1150, 728)")
    env.step("WAIT")
    parts = command.split(".")
    for i, part in enumerate(parts):
        text = part + ("." if i < len(parts) - 1 else "")
        if text:
            env.step(f"pyautogui.write({text!r})\npyautogui.press('esc')")
    env.step("pyautogui.press('enter')")
    env.step("WAIT")


@needs_grass
def test_grass_console_reaches_nothing_and_cannot_forge_the_state():
    listener = HostListener()
    sentinel = ROOT / f"coda_sentinel_{uuid.uuid4().hex}"
    marker = f"codasurvivor{uuid.uuid4().hex[:8]}"
    env = CodaEnv(app="grass", max_steps=200)
    try:
        env.reset(options={"task": "layer_opacity_half"})
        home = Path(env.unwrapped._home)
        _assert_sealed(env.unwrapped.desktop)
        _console(
            env,
            f"sh -c 'id -u > $HOME/probe_uid; env > $HOME/probe_env; touch {sentinel}; "
            f'bash -c "exec 3<>/dev/tcp/127.0.0.1/{listener.port}" 2> $HOME/probe_net; '
            f'rm -f $HOME/*sock; setsid sh -c "exec -a {marker} sleep 300" &\'',
        )
        assert wait_until(lambda: home.joinpath("probe_net").exists(), 20), "the console ran nothing"
        assert home.joinpath("probe_uid").read_text().strip() != "0"
        assert CANARY not in home.joinpath("probe_env").read_text()
        assert not sentinel.exists()
        # the state is still GRASS's own: the layer is not half transparent, so the task scores 0
        st = env.unwrapped.app.state(env.unwrapped.desktop)
        assert st["layers"], st
        obs, r, term, trunc, info = env.step("DONE")
        assert r == 0.0, info
    finally:
        env.close()
        listener.close()
    assert listener.hits == 0
    assert not any(marker.encode() in _cmdline(p) for p in _pids())


# --------------------------------------------------------------------------------------- TeXstudio
HOSTILE_TEX = (
    "% !TeX TXS-program:compile = txs:///pdflatex/[--shell-escape]\n"
    "\\documentclass{article}\\begin{document}\n"
    "\\immediate\\write18{id > probe-escape}\n"
    "Host: \\input{/etc/hostname}\n"
    "\\end{document}\n"
)


@needs_texstudio
def test_texstudio_build_reads_no_host_file_and_runs_no_shell():
    env = CodaEnv(app="texstudio", max_steps=50)
    try:
        env.reset(options={"task": "build_pdf"})
        home = Path(env.unwrapped._home)
        _assert_sealed(env.unwrapped.desktop)
        env.step("pyautogui.hotkey('ctrl', 'a')")
        env.step(f"pyautogui.write({HOSTILE_TEX!r})")
        env.step("pyautogui.hotkey('ctrl', 's')")
        env.step("pyautogui.press('f5')")
        work = home / "atelier"
        assert wait_until(lambda: (work / "main.log").exists(), 30), "TeXstudio built nothing"
        env.step("WAIT")
        log = (work / "main.log").read_text(errors="replace")
        assert (work / "main.tex").read_text().startswith("% !TeX"), "the hostile text was not typed"
        assert not (work / "probe-escape").exists(), "\\write18 ran a shell command"
        hostname = Path("/etc/hostname").read_text().strip()
        pdf = work / "main.pdf"
        if pdf.exists():
            text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True).stdout.decode()
            assert hostname not in text
        assert "/etc/hostname" in log  # TeX refused it (paranoid reads) and said so
    finally:
        env.close()


@needs_texstudio
def test_texstudio_empty_pdf_does_not_pass_build_pdf():
    """`touch main.pdf` in a terminal (done here by the test itself, as the app's user could) scores 0."""
    env = CodaEnv(app="texstudio", max_steps=10)
    try:
        env.reset(options={"task": "build_pdf"})
        env.unwrapped.desktop.write_file(os.path.join(env.unwrapped._home, "atelier", "main.pdf"), b"")
        obs, r, term, trunc, info = env.step("DONE")
        assert r == 0.0 and "not a PDF" in str(info.get("checks")), info
        env.reset(options={"task": "build_pdf"})
        env.unwrapped.desktop.write_file(os.path.join(env.unwrapped._home, "atelier", "main.pdf"), b"%PDF-1.4\n%%EOF\n")
        obs, r, term, trunc, info = env.step("DONE")
        assert r == 0.0, info
    finally:
        env.close()


# --------------------------------------------------------------------------------------- the desktop around the app
def test_closing_the_app_leaves_no_way_out_on_the_desktop():
    """An agent that iconifies the app (the title bar's button) and clicks or keys on the bare desktop finds
    no menu, terminal or launcher there. (Quitting the app ends the episode.)"""
    env = CodaEnv(app="kalgebra", max_steps=50)
    try:
        obs, _ = env.reset(options={"task": "calc_power"})
        d = env.unwrapped.desktop
        env.step("pyautogui.click(1237, 9)")  # openbox's iconify button, top right
        obs = env.step("WAIT")[0]
        assert (obs["screenshot"][100:700, 100:1000] == obs["screenshot"][400, 600]).all(), "the app still shows"
        before = set(d.pids())
        bare = env.step("WAIT")[0]["screenshot"]
        for button in ("right", "middle", "left"):
            obs, r, term, trunc, info = env.step(f"pyautogui.click(640, 400, button={button!r})")
            # openbox's stock root menu (with its terminal entry) would be drawn here
            assert np.array_equal(obs["screenshot"], bare), f"a {button} click on the desktop showed something"
        for keys in (("alt", "f2"), ("ctrl", "alt", "t"), ("super", "e"), ("alt", "f3")):
            env.step("pyautogui.hotkey(" + ", ".join(repr(k) for k in keys) + ")")
        env.step("WAIT")
        assert [w.wm_class for w in d.windows()] == ["kalgebra"], f"something opened: {d.windows()}"
        assert set(d.pids()) <= before, "a program was started on the bare desktop"
    finally:
        env.close()


def test_a_second_app_of_the_same_name_is_never_read_in_the_apps_place(kalgebra_env):
    """A program started later that registers on the accessibility bus under the app's name (an impostor an
    app's terminal could start) is not what the env's reader reads: the reader stays on the app it found."""
    env = kalgebra_env.unwrapped
    env.reset(options={"task": "calc_power"})
    d = env.desktop
    client = env.app._client(d)
    first = client.application("kalgebra")
    assert first is not None
    home = os.path.join(d.tmpdir, "coda-impostor-home")
    os.mkdir(home)
    impostor = d.spawn(["kalgebra"], env={"HOME": home, "QT_QUICK_BACKEND": "software"}, cwd=home)
    try:
        assert wait_until(lambda: sum(a.name == "kalgebra" for a in client.applications()) == 2, 20), (
            "the second KAlgebra did not register"
        )
        assert client.application("kalgebra").bus == first.bus
        env.desktop.kill_group(env.procs["kalgebra"])  # the app itself gone: nothing is read in its place
        assert wait_until(lambda: client.application("kalgebra") is None, 10)
    finally:
        d.kill_group(impostor)


NONROOT = r"""
import json, os, subprocess, sys, tempfile
sys.path[:0] = sys.argv[1:]
from coda_env.backends.local import sandbox as sb
why = sb.probe()
home = tempfile.mkdtemp()
argv = sb.wrap_argv(["sh", "-c", "id -u; touch $HOME/x && echo wrote; ls -A /root 2>&1 | head -1; "
                     "unshare -r true 2>/dev/null && echo userns-made || echo userns-refused"],
                    sb.SandboxConfig(), [home], [], {"HOME": home, "PATH": sb.SAFE_PATH}, home)
r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
print(json.dumps({"probe": why, "uid": os.getuid(), "rc": r.returncode, "out": r.stdout.split("\n")}))
"""


@pytest.mark.skipif(not ROOTED, reason="needs root to become a plain user (setpriv)")
def test_as_a_plain_user_the_sandbox_keeps_the_users_uid_and_allows_no_namespaces():
    """The path a user who is not root takes: bwrap's own user namespace maps the user's uid, and no
    further user namespace can be made inside (--disable-userns)."""
    import json
    import sys

    py = "/usr/bin/python3"
    ver = subprocess.run([py, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    if ver.stdout.strip() != str(tuple(sys.version_info[:2])):
        pytest.skip("Debian's python3 is another version than this venv's: it cannot load the venv's packages")
    site = next(p for p in sys.path if p.endswith("site-packages") and ".venv" in p)
    r = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "env",
            "HOME=/tmp",
            py,
            "-c",
            NONROOT,
            str(ROOT),
            site,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr[-500:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["probe"] is None and got["rc"] == 0, got
    assert got["out"][0] == "65534" and "wrote" in got["out"], got
    assert "userns-refused" in got["out"], got
    assert "No such file" in got["out"][2], got  # the user's home (root's here) is not there at all


@needs_texstudio
def test_texstudio_terminal_tab_runs_no_shell():
    """The bottom panel's Terminal tab (a shell in a stock TeXstudio) runs `true` in the profile the env
    writes: what is typed there runs nothing, so its sentinel files never appear in the home."""
    env = CodaEnv(app="texstudio", max_steps=50)
    try:
        env.reset(options={"task": "build_pdf"})
        home = Path(env.unwrapped._home)
        rows = [line.split("\t") for line in env.unwrapped.app.a11y_text(env.unwrapped.desktop).splitlines()]
        tab = next(r for r in rows if r[:2] == ["page tab", "Terminal"])
        x, y, w, h = (int(v) for v in tab[3].split(","))
        env.step(f"pyautogui.click({x + w // 2}, {y + h // 2})")
        env.step(f"pyautogui.click({x + w // 2}, {y + h + 60})")  # into the terminal's area
        env.step("pyautogui.write('id > ~/probe_term; env > ~/probe_env\\n')")
        env.step("WAIT")
        env.step("WAIT")
        assert not home.joinpath("probe_term").exists() and not home.joinpath("probe_env").exists()
        assert not (home / "atelier" / "probe_term").exists()
    finally:
        env.close()
