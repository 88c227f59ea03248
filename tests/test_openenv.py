"""`coda serve`: a coda env as an OpenEnv environment, driven over localhost by OpenEnv's own client.

The server runs as `coda serve` in a subprocess on a free port (polled for health, never slept for). Each test
finds its session's desktop among the server's descendants (the desktop's watchdog names its token and folder)
and checks that, once the client is gone (closed, or killed), nothing of it is left running."""

from __future__ import annotations

import base64
import io
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="the openenv extra is not installed (pip install 'coda[openenv]')")

from openenv.core import GenericEnvClient
from PIL import Image

from coda_env.families import families
from coda_env.tasks import load_tasks

from .conftest import live_token_pids, wait_until

ROOT = Path(__file__).resolve().parents[1]
ENV_ID = "coda/KAlgebra-v0"
TASK = "calc_define_function"  # three oracle steps: two typed into the console, then DONE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _coda(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "coda_agent.cli", *args], cwd=ROOT, env=env, **kw)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open(f"/proc/{e}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(e))
    return kids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def descendants(pid: int) -> list[int]:
    """The live (not zombie) processes under `pid`."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return [p for p in out if _alive(p)]


def desktops(server_pid: int) -> list[tuple[str, str]]:
    """(token, folder) of every desktop the server holds, from its watchdogs' command lines."""
    found = []
    for p in descendants(server_pid):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().decode().split("\0")
        except OSError:
            continue
        if "--watchdog" in argv:
            i = argv.index("--watchdog")
            found.append((argv[i + 1], argv[i + 2]))
    return found


def assert_all_gone(server_pid: int, held: list[tuple[str, str]], procs: list[int]) -> None:
    """Nothing of the session's desktop is left: no process of it, none under the server, its folder removed."""
    assert held, "the session held no desktop"
    gone = wait_until(
        lambda: (
            not any(_alive(p) for p in procs)
            and not descendants(server_pid)
            and not any(live_token_pids(t) for t, _ in held)
            and not any(Path(d).exists() for _, d in held)
        ),
        timeout=30,
    )
    left = [p for p in procs if _alive(p)] + descendants(server_pid)
    assert gone, f"left running after the client went: {sorted(set(left))}; folders: {[d for _, d in held]}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "wb") as out:
        proc = _coda("serve", ENV_ID, "--port", str(port), "--max-sessions", "2", stdout=out, stderr=subprocess.STDOUT)
    ok = wait_until(lambda: proc.poll() is not None or _healthy(port), timeout=120, every=0.1)
    if not ok or proc.poll() is not None:
        proc.kill()
        pytest.fail(f"coda serve did not come up: {log.read_text()[-2000:]}")
    yield proc, port
    # the server stops (SIGTERM) with a session open: that session's env is closed too
    env = _client(port)
    try:
        env.reset(task=TASK)
        held, procs = desktops(proc.pid), descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        env.close()
    assert_all_gone(proc.pid, held, procs)
    text = log.read_text()
    assert "Traceback" not in text and "every session's env closed" in text, text[-4000:]


def _client(port: int):
    return GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync()


def test_oracle_episode_bad_actions_and_close(server):
    proc, port = server
    task = load_tasks("kalgebra")[TASK]
    with _client(port) as env:
        result = env.reset(task=TASK, seed=1)
        obs = result.observation
        assert result.reward is None and not result.done
        assert obs["task"] == TASK and obs["instruction"] == task.instruction and obs["step"] == 0
        shot = Image.open(io.BytesIO(base64.b64decode(obs["screenshot"])))
        assert shot.format == "PNG" and shot.size == (1280, 800)
        held, procs = desktops(proc.pid), descendants(proc.pid)
        assert len(held) == 1
        rewards = []
        for action in [*task.solution, "DONE"]:
            result = env.step({"action": action})
            assert result.observation["action_error"] is None, result.observation
            rewards.append(result.reward)
            if result.done:
                break
        assert result.done and result.observation["terminated"] and not result.observation["truncated"]
        assert rewards[-1] == 1.0 and all(r == 0.0 for r in rewards[:-1]), rewards
        assert result.observation["info"]["success"] is True
        assert env.state()["done"] is True and env.state()["step_count"] == len(rewards)

        # a bad action is answered as env.step answers it: an action_error, the step counted, the episode on
        env.reset(task=TASK)
        result = env.step({"action": "import os\nos.system('touch /tmp/pwned')"})
        assert not result.done and result.reward == 0.0
        err = result.observation["action_error"]
        assert err and "not allowed" in err and result.observation["info"]["action_error"] == err
        assert result.observation["step"] == 1
        # what is not an action at all is refused by OpenEnv's validation, and the session stays usable
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"action": 5})
        with pytest.raises(RuntimeError, match="reset takes seed, episode_id, task and options; not backend"):
            env.reset(task=TASK, backend="libvirt")
        with pytest.raises(RuntimeError, match="unknown task 'nope'"):
            env.reset(task="nope")
        result = env.reset(task="calc_ans_multiply")
        for action in load_tasks("kalgebra")["calc_ans_multiply"].solution:
            result = env.step({"action": action})
        assert result.done and result.reward == 1.0
        fam = families("kalgebra")["calc_exponent"]  # a task family's instance, by its id
        result = env.reset(task="calc_exponent/11")
        assert result.observation["instruction"] == fam.instance(11).instruction
        for action in fam.instance(11).solution:
            result = env.step({"action": action})
        assert result.done and result.reward == 1.0
        with pytest.raises(RuntimeError, match="reset"):
            env.step({"action": "DONE"})  # the episode is over
        assert desktops(proc.pid) == held  # one env for the whole session
    assert not Path("/tmp/pwned").exists()
    assert_all_gone(proc.pid, held, procs)


_KILLED_CLIENT = """
import sys
from openenv.core import GenericEnvClient
env = GenericEnvClient(base_url=sys.argv[1]).sync()
env.connect()
env.reset(task=sys.argv[2])
env.step({"action": "pyautogui.click(500, 751)"})
print("ready", flush=True)
sys.stdin.read()  # until killed
"""


def test_killed_client_leaves_nothing_running(server):
    proc, port = server
    client = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CLIENT, f"http://127.0.0.1:{port}", TASK],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = client.stdout.readline()
        assert line.strip() == "ready", client.stderr.read()
        held, procs = desktops(proc.pid), descendants(proc.pid)
        assert len(held) == 1 and any(live_token_pids(t) for t, _ in held)
    finally:
        client.kill()  # no close message: the connection just drops
        client.wait()
    assert_all_gone(proc.pid, held, procs)
    assert _healthy(port)


_DROPPED_DURING_RESET = """
import json, os, sys
from websockets.sync.client import connect
with connect(sys.argv[1]) as ws:
    ws.send(json.dumps({"type": "reset", "data": {"task": sys.argv[2]}}))
    os._exit(0)  # gone while the reset runs: the server answers into a closed socket
"""


def test_client_gone_during_reset_leaves_nothing_running(server):
    """OpenEnv's wire protocol by hand, to drop the connection at a chosen moment: mid-reset."""
    proc, port = server
    subprocess.run([sys.executable, "-c", _DROPPED_DURING_RESET, f"ws://127.0.0.1:{port}/ws", TASK], check=True)
    held = wait_until(lambda: desktops(proc.pid), timeout=60, every=0.02)
    procs = descendants(proc.pid)
    assert_all_gone(proc.pid, held, procs)
    assert _healthy(port)


def test_http_step_without_session_is_409(server):
    _, port = server
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/step",
        data=b'{"action": {"action": "DONE"}}',
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 409 and "WebSocket" in e.value.read().decode()


def _one_line_error(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_serve_bad_env_id_is_one_line():
    line = _one_line_error(
        _coda("serve", "coda/KAlgbra-v0", "--port", "0", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    )
    assert "not a coda env id" in line and "coda/KAlgebra-v0" in line


def test_serve_taken_port_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        line = _one_line_error(
            _coda("serve", ENV_ID, "--port", str(port), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    assert f"cannot listen on 127.0.0.1:{port}" in line


def test_serve_without_the_extra_is_one_line():
    """Where openenv-core is not installed, `coda serve` says which extra to install (simulated here)."""
    code = (
        "import sys; sys.modules['openenv'] = None\n"
        "from coda_agent.cli import main\n"
        "sys.exit(main(['serve', 'coda/KAlgebra-v0', '--port', '0']))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    line = _one_line_error(proc)
    assert "openenv extra" in line and "pip install 'coda[openenv]'" in line


def test_serve_help_names_every_flag(capsys):
    from coda_agent.cli import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--port", "--host", "--max-sessions", "--session-timeout", "--tasks-dir", "--a11y-tree"):
        assert flag in text
    assert "(default: 8000)" in text and "(default: 127.0.0.1)" in text
