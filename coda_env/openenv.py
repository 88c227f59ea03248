"""Any coda env served as an OpenEnv environment: `coda serve ENV_ID --port N` (the `openenv` extra).

OpenEnv (`openenv-core` on PyPI) is the environment format that TRL, SkyRL, Unsloth, ART, Oumi and torchforge
consume: `reset`/`step`/`state` over a FastAPI WebSocket server (`/ws`), typed actions and observations. This
module is the thin face of a coda env in that format; the env itself does all the work, as under `gym.make`.

## Sessions
Every WebSocket connection is one OpenEnv session and gets its own env: one `gym.make(ENV_ID, **env_kwargs)`
at the session's first reset (its own desktop: Xvfb, window manager, buses, the app), closed when the session
ends however it ends: the client's `close()`, a dropped or killed connection (the server's receive fails),
the idle timeout (`--session-timeout`), or the server stopping. Nothing of the session is left running.
The stateless HTTP `/reset` makes an env, resets it and closes it again; HTTP `/step` has no episode to step
(OpenEnv's HTTP routes keep no session) and answers 409: episodes live in WebSocket sessions.

## Actions
`CodaAction(action=...)`: one string in the env's action language, exactly what `env.step` takes: pyautogui
code (parsed with `ast` and interpreted against a whitelist by the env's own parser, never executed), or
`DONE`, `FAIL`, `WAIT`, `ANS <text>`. A bad action is answered as `env.step` answers it: an observation with
`action_error` set (and in `info`), the step counted, the session usable. Only text actions are served.

## Observations
`CodaObservation`: `screenshot` (PNG, base64), `instruction`, `a11y_tree` (when the server was started with
it), `task`, `step`, `action_error`, `terminated`, `truncated`, and `info` (the env's info, JSON-safe:
`success`, `checks`, `answer`, `error`, ...). OpenEnv's `reward` is the env's reward (0.0 on every step but the
last, then the checks' 1.0 or 0.0; None after a reset) and `done` is `terminated or truncated`.

## Reset arguments
`reset(seed=None, task=None, options=None)`: `task` picks the task (as `options={"task": ...}` does for the
env); other keys are refused by name. What the env is made with (backend, task folders, step budget, the
accessibility tree) is the server's choice, fixed by `coda serve`'s options: a client picks tasks and seeds,
never paths, backends or the sandbox.
"""

from __future__ import annotations

import base64
import difflib
import functools
import io
import signal
import socket
import sys
import threading
import weakref
from typing import Any

import gymnasium as gym
import numpy as np

try:
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
    from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata
    from pydantic import Field
except ImportError as e:  # the extra is not installed
    raise ImportError(
        f"serving envs through OpenEnv needs the openenv extra ({e.name or e} is missing): "
        "pip install 'coda[openenv]' (scripts/setup.sh installs it)"
    ) from None

import coda_env  # noqa: F401  (registers the env ids)

from .env import MAX_TEXT

PNG_LEVEL = 1  # zlib level 1: a 1280x800 screen in ~28 ms and ~50 KB here (level 6: ~52 ms, ~36 KB)

# Every environment of this process that may hold a desktop: what `serve` closes when the server stops.
_LIVE: weakref.WeakSet = weakref.WeakSet()


class NoEpisode(RuntimeError):
    """A step with no episode to step: before the session's first reset (or over stateless HTTP)."""


class CodaAction(Action):
    """One action in the env's action language (the string `env.step` takes)."""

    action: str = Field(
        ...,
        max_length=MAX_TEXT,
        description="pyautogui code (parsed and whitelisted, never executed), or DONE, FAIL, WAIT, ANS <text>",
    )


class CodaObservation(Observation):
    """The env's observation and what its info says of the step."""

    screenshot: str = Field(default="", description="the screen as a PNG, base64-encoded")
    instruction: str = Field(default="", description="the task's instruction")
    a11y_tree: str | None = Field(default=None, description="the app's accessibility tree (when served with it)")
    task: str | None = Field(default=None, description="the task's id")
    step: int = Field(default=0, description="steps taken in this episode")
    action_error: str | None = Field(default=None, description="why the action failed, as env.step says it")
    terminated: bool = Field(default=False, description="ended by DONE, FAIL or ANS")
    truncated: bool = Field(default=False, description="ended by the step budget or a crash (info.error)")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info (JSON-safe)")


class CodaState(State):
    """What the session is doing: its env id, task, and whether the episode is over."""

    env_id: str = ""
    task: str | None = None
    done: bool = True


def encode_png(frame: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, "PNG", compress_level=PNG_LEVEL)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _plain(x: Any) -> Any:
    """A JSON-safe copy of an info value (numpy scalars as numbers; anything else unknown as its str)."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return f"<array {x.dtype} {list(x.shape)}>"
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)


class CodaEnvironment(Environment):
    """One OpenEnv session's env: `gym.make(env_id, **env_kwargs)` at the first reset, closed with the session."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own desktop

    def __init__(self, env_id: str, env_kwargs: dict | None = None):
        super().__init__()
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.env: gym.Env | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._state = CodaState(env_id=env_id)
        _LIVE.add(self)

    def _observation(self, obs: dict, info: dict, reward, terminated: bool, truncated: bool) -> CodaObservation:
        return CodaObservation(
            screenshot=encode_png(obs["screenshot"]),
            instruction=obs["instruction"],
            a11y_tree=obs.get("a11y_tree"),
            task=info.get("task"),
            step=self._state.step_count,
            action_error=info.get("action_error"),
            terminated=terminated,
            truncated=truncated,
            info=_plain({k: v for k, v in info.items() if k != "instruction"}),
            reward=reward,
            done=terminated or truncated,
        )

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task: str | None = None,
        options: dict | None = None,
        **kwargs: Any,
    ) -> CodaObservation:
        if kwargs:
            raise ValueError(
                f"reset takes seed, episode_id, task and options; not {', '.join(sorted(kwargs))} "
                "(what the env is made with is the server's choice: coda serve --help)"
            )
        opts = dict(options or {})
        unknown = set(opts) - {"task"}
        if unknown:
            raise ValueError(f"reset options take only 'task', not {', '.join(sorted(unknown))}")
        if task is not None:
            opts["task"] = task
        with self._lock:
            if self._closed:
                raise RuntimeError("this session's env is closed")
            if self.env is None:
                self.env = gym.make(self.env_id, **self.env_kwargs)
            obs, info = self.env.reset(seed=seed, options=opts or None)
        self._state = CodaState(env_id=self.env_id, episode_id=episode_id, task=info["task"], done=False, step_count=0)
        return self._observation(obs, info, None, False, False)

    def step(self, action: CodaAction, timeout_s: float | None = None, **kwargs: Any) -> CodaObservation:
        with self._lock:
            if self.env is None or self._closed:
                raise NoEpisode(
                    "no episode to step: reset first (episodes live in WebSocket sessions, e.g. OpenEnv's "
                    "EnvClient; the stateless HTTP /step has none)"
                )
            obs, reward, terminated, truncated, info = self.env.step(action.action)
        self._state.step_count += 1
        self._state.done = bool(terminated or truncated)
        return self._observation(obs, info, float(reward), bool(terminated), bool(truncated))

    @property
    def state(self) -> CodaState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.env_id,
            description=(
                f"{self.env_id}, a coda env (a real desktop app) served through OpenEnv. Actions: "
                "{'action': <pyautogui code | DONE | FAIL | WAIT | ANS text>}; reset(task=..., seed=...)."
            ),
            version="0",
        )

    def close(self) -> None:
        """Close the env (its desktop and apps); safe to call more than once, from any thread."""
        with self._lock:
            self._closed = True
            env, self.env = self.env, None
        if env is not None:
            env.close()


def check_env(env_id: str, env_kwargs: dict | None = None) -> None:
    """Raise ValueError (or coda's error: app not installed, unknown task) if `env_id` is no coda env id or
    cannot be made here with `env_kwargs`; starts nothing."""
    known = coda_env.envs()
    if env_id.removeprefix("coda_env:") not in known:
        close = difflib.get_close_matches(env_id, known, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"{env_id!r} is not a coda env id ({hint}known: {', '.join(sorted(known))})")
    probe = gym.make(env_id, **(env_kwargs or {}))
    probe.close()


def make_app(
    env_id: str,
    env_kwargs: dict | None = None,
    max_sessions: int = 1,
    session_timeout: float | None = None,
):
    """The ASGI app (FastAPI's, from OpenEnv's `create_fastapi_app`) serving `env_id` as an OpenEnv environment:
    one env per WebSocket session."""
    app = create_fastapi_app(
        functools.partial(CodaEnvironment, env_id, dict(env_kwargs or {})),
        CodaAction,
        CodaObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout),
    )

    @app.exception_handler(NoEpisode)
    async def _no_episode(request: Request, exc: NoEpisode):  # the HTTP routes; the WebSocket answers itself
        return JSONResponse(status_code=409, content={"detail": str(exc)})

    return _QuietClose(app)


class _QuietClose:
    """The ASGI app, without the tracebacks OpenEnv 0.3.0's WebSocket route logs when a client is gone before
    the route's last send: at every session's end (it closes a socket the client already closed) and when a
    client drops during a reset or step (it answers into the closed socket). The route has closed the session's
    env by then (its `finally`); only these send-after-disconnect errors of WebSocket connections are quieted."""

    def __init__(self, app):
        self.app = app

    def __getattr__(self, name):  # the FastAPI app's routes, state, ... for callers that look
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        from starlette.websockets import WebSocketDisconnect
        from uvicorn.protocols.utils import ClientDisconnected

        gone: tuple[type[BaseException], ...] = (WebSocketDisconnect, ClientDisconnected)
        try:
            from starlette.websockets import WebSocketDisconnected  # starlette >= 1.0

            gone += (WebSocketDisconnected,)
        except ImportError:
            pass
        try:
            await self.app(scope, receive, send)
        except gone:
            if scope.get("type") != "websocket":
                raise


def close_all() -> None:
    """Close every env of this process that a session left open (the server is stopping)."""
    for env in list(_LIVE):
        try:
            env.close()
        except Exception as e:  # noqa: BLE001 - one env's failure must not keep the others running
            print(f"coda serve: closing an env failed: {type(e).__name__}: {e}", file=sys.stderr)


def serve(
    env_id: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    env_kwargs: dict | None = None,
    max_sessions: int = 1,
    session_timeout: float | None = None,
    log_level: str = "warning",
    sock: socket.socket | None = None,
) -> None:
    """Serve `env_id` until interrupted; every env is closed on the way out. `sock`: a listening socket bound
    by the caller (`coda serve` binds first, so that a taken port is said at once), else one on host:port."""
    import uvicorn

    try:
        check_env(env_id, env_kwargs)
        app = make_app(env_id, env_kwargs, max_sessions, session_timeout)
    except BaseException:
        if sock is not None:
            sock.close()
        raise
    if sock is None:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    # uvicorn's pings (20 s) find a client that vanished without closing its connection
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=10, ws_max_size=16 * 1024 * 1024)
    server = uvicorn.Server(config)
    actual = sock.getsockname()[1]
    url = f"{host if ':' not in host else f'[{host}]'}:{actual}"
    print(
        f"coda serve: {env_id} as an OpenEnv environment at ws://{url}/ws (health: http://{url}/health); "
        f"up to {max_sessions} session(s); Ctrl-C stops",
        flush=True,
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM (sessions end, their envs close), then raises the signal
    # again under the handlers it found: these make that an orderly return, after the sweep below
    stopped = [False]

    def _stop(sig, frame):
        stopped[0] = True

    main = threading.current_thread() is threading.main_thread()  # signal handlers: the main thread only
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        server.run(sockets=[sock])
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        close_all()
        sock.close()
    print(f"coda serve: stopped{' (signal)' if stopped[0] else ''}; every session's env closed", flush=True)
