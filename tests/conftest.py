"""Shared fixtures: real KAlgebra envs on real Xvfb desktops (installed by `make setup`)."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

import pytest

from coda_env.backends.local import token_pids


class JSONHandler(BaseHTTPRequestHandler):
    """What the tests' stand-in OpenAI servers share: quiet logs and JSON replies."""

    def log_message(self, *a):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def live_token_pids(token: str) -> list[int]:
    """Processes (not zombies) that carry a desktop's token in their environment."""
    out = []
    for pid in token_pids(token):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def wait_until(cond, timeout: float = 10.0, every: float = 0.05):
    """Poll `cond` until it returns a truthy value or `timeout` passes; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(every)


def run_solution(env, task_id: str):
    """Reset on `task_id`, replay its oracle; return (rewards, last terminated, last truncated, last info)."""
    obs, info = env.reset(options={"task": task_id})
    assert info["task"] == task_id
    rewards, term, trunc = [], False, False
    for action in env.unwrapped.tasks[task_id].solution:
        obs, r, term, trunc, info = env.step(action)
        assert info["action_error"] is None, (task_id, action, info["action_error"])
        rewards.append(r)
        if term or trunc:
            break
    return rewards, term, trunc, info


@pytest.fixture(scope="module")
def kalgebra_env():
    from coda_env.env import CodaEnv

    env = CodaEnv(app="kalgebra")
    yield env
    env.close()


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_x(request, monkeypatch):
    """A test of the fast tier that tried to start a real desktop would fail here, not pass slowly."""
    if request.node.get_closest_marker("fast") is not None:
        from coda_env.backends.local import LocalDesktop

        def refuse(self):
            raise AssertionError("a `fast` test must not start Xvfb: use backend='fake'")

        monkeypatch.setattr(LocalDesktop, "start", refuse)


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test. On the shared 2-core test machine two threads under other sessions'
    load ran a tiny model's training steps about 7x slower than one (measured: 421 s against 64 s for the same
    PRM fit), their barrier waits stalling whenever a thread is descheduled."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
