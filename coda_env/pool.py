"""EnvPool: N envs, each in its own process, stepped independently (no lockstep).

A gymnasium vector env steps all its envs together: `step()` returns when the slowest env is done, so with
envs whose steps and resets take different times (an app's launch, a settle wait, a check), every env waits
for the others; on this 2-core machine that left each of two envs idle about a quarter of the time
(`benchmarks/throughput.py --profile`). An EnvPool instead has envpool's asynchronous interface: `send_reset`
and `send_step` address one env, and `recv()` returns the results of whichever envs have finished, at least
one, so a runner acts on the envs that are ready and the others keep working. `coda_agent.rollout.run_episodes`
drives one (what `coda eval --num-envs N` and the trainers use by default).

    pool = EnvPool("coda/KAlgebra-v0", 2, wrappers=[SetupFailure])
    pool.send_reset(0, options={"task": "calc_power"}); pool.send_reset(1, options={"task": "dict_gcd"})
    for r in pool.recv():          # Result(env, kind "reset" or "step", obs, reward, terminated, ...)
        pool.send_step(r.env, "DONE")

Processes: each env lives in a worker process (the platform's default start method, as gymnasium's
AsyncVectorEnv: forked on Linux, so env settings need not pickle; `context="spawn"` for a parent whose
threads make forking unsafe), which ignores Ctrl-C (the parent closes the pool) and closes its env when its pipe closes, so a parent that
dies however it dies leaves no worker behind (the desktops' own watchdogs are the second line). A worker that
dies (killed, out of memory) is replaced by a fresh one, and what was asked of it is answered: a step as a
truncated episode with reward 0 and info["error"], a reset as a failed set-up (info["setup_error"], as
`coda_env.wrappers.SetupFailure` answers one). An exception raised by the env inside a living worker is
raised by `recv()` as `EnvPoolError` naming the env, as gymnasium's AsyncVectorEnv re-raises it.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

__all__ = ["EnvPool", "EnvPoolError", "Result"]


class EnvPoolError(RuntimeError):
    """An env raised inside its worker (the message names the env and carries the worker's traceback)."""


@dataclass
class Result:
    """What one env answered: to a reset (`kind` "reset": obs and info) or to a step (all fields)."""

    env: int
    kind: str
    obs: dict[str, Any]
    info: dict[str, Any]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False


def _worker(pipe: Connection, parent_end: Connection, env_id: str, env_kwargs: dict, wrappers: Sequence[Callable]):
    """One env, answering its pipe until told to close or the pipe closes (the parent is gone)."""
    parent_end.close()  # a forked worker holds the parent's end too: closed, so the parent's death is our EOF
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent's Ctrl-C is the parent's to handle
    import coda_env  # noqa: F401  (registers the env ids in this process)

    env = None
    try:
        env = gym.make(env_id, **env_kwargs)
        for w in wrappers:
            env = w(env)
        pipe.send(("ready", None))
        while True:
            try:
                cmd, arg = pipe.recv()
            except (EOFError, OSError):
                return
            try:
                if cmd == "reset":
                    seed, options, upcoming = arg
                    obs, info = env.reset(seed=seed, options=options)
                    if upcoming is not None:  # the task after this one, so a swap reset can prepare it
                        env.set_wrapper_attr("upcoming_task", upcoming)
                    out = ("reset", (obs, info))
                elif cmd == "step":
                    out = ("step", env.step(arg))
                elif cmd == "close":
                    return
                else:
                    out = ("error", f"unknown command {cmd!r}")
            except Exception as e:  # noqa: BLE001 - the env's error, raised again in the parent
                out = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
            try:
                pipe.send(out)
            except (BrokenPipeError, OSError):
                return
    finally:
        if env is not None:
            env.close()
        pipe.close()


@dataclass
class _Slot:
    process: Any
    pipe: Connection
    asked: str | None = None  # "reset" or "step" while an answer is due
    task: str | None = None  # the task of the reset last asked
    last_obs: dict[str, Any] | None = field(default=None, repr=False)


class EnvPool:
    """`num_envs` instances of `env_id` (made with `env_kwargs`, then wrapped by `wrappers` in order), each
    in its own process; see the module docstring."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
        context: str | None = None,
        start_timeout: float = 120.0,
        **env_kwargs,
    ):
        if num_envs < 1:
            raise ValueError(f"an EnvPool needs at least one env, not {num_envs}")
        self.env_id, self.num_envs = env_id, num_envs
        self.env_kwargs, self.wrappers = dict(env_kwargs), tuple(wrappers)
        self.start_timeout = start_timeout
        self._ctx = mp.get_context(context)
        probe = gym.make(env_id, **env_kwargs)  # the spaces (no desktop starts before a reset)
        self.observation_space, self.action_space = probe.observation_space, probe.action_space
        probe.close()
        self._slots: list[_Slot | None] = [None] * num_envs
        self.closed = False
        try:
            for i in range(num_envs):
                self._slots[i] = self._start()
            for i in range(num_envs):
                self._await_ready(i)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------------------------------- workers
    def _start(self) -> _Slot:
        parent, child = self._ctx.Pipe()
        p = self._ctx.Process(
            target=_worker,
            args=(child, parent, self.env_id, self.env_kwargs, self.wrappers),
            name="coda-envpool-worker",
            daemon=True,
        )
        p.start()
        child.close()
        return _Slot(p, parent)

    def _await_ready(self, i: int) -> None:
        s = self._slots[i]
        if not s.pipe.poll(self.start_timeout):
            raise EnvPoolError(f"env {i} of {self.env_id}: its worker did not start in {self.start_timeout:g} s")
        try:
            kind, arg = s.pipe.recv()
        except EOFError:
            raise EnvPoolError(f"env {i} of {self.env_id}: its worker died while making the env") from None
        if kind != "ready":
            raise EnvPoolError(f"env {i} of {self.env_id} could not be made: {arg}")

    def _replace(self, i: int) -> str:
        """Env i's worker is gone: start a fresh one; returns what happened to the old one."""
        s = self._slots[i]
        s.process.join(timeout=5)
        code = s.process.exitcode
        s.pipe.close()
        self._slots[i] = self._start()
        self._await_ready(i)
        return f"env {i}'s worker process died (exit code {code}); a fresh one replaced it"

    # ---------------------------------------------------------------------------------------- API
    def send_reset(
        self, i: int, *, seed: int | None = None, options: dict | None = None, upcoming: str | None = None
    ) -> None:
        """Ask env i to reset (options={"task": id} picks the task); `upcoming` is the task it runs after
        this one, when known (its `upcoming_task`: a swap reset prepares it during this episode)."""
        self._send(i, "reset", (seed, options, upcoming))
        self._slots[i].task = (options or {}).get("task")

    def send_step(self, i: int, action: Any) -> None:
        """Ask env i to take `action`."""
        self._send(i, "step", action)

    def _send(self, i: int, cmd: str, arg: Any) -> None:
        if self.closed:
            raise EnvPoolError("the EnvPool is closed")
        s = self._slots[i]
        if s.asked is not None:
            raise EnvPoolError(f"env {i} has not answered its {s.asked} yet: recv() it first")
        s.asked = cmd
        try:
            s.pipe.send((cmd, arg))
        except (BrokenPipeError, OSError):
            pass  # the worker is gone: recv() answers for it

    @property
    def busy(self) -> list[int]:
        """The envs with an answer due."""
        return [i for i, s in enumerate(self._slots) if s is not None and s.asked is not None]

    def recv(self, timeout: float | None = None) -> list[Result]:
        """The answers of every env that has one ready, waiting up to `timeout` s (None: until one has);
        [] when none is due or none came in time."""
        due = {self._slots[i].pipe: i for i in self.busy}
        if not due:
            return []
        out = []
        for pipe in wait(list(due), timeout):
            i = due[pipe]
            s = self._slots[i]
            asked, s.asked = s.asked, None
            try:
                kind, arg = pipe.recv()
            except (EOFError, OSError):
                out.append(self._died(i, asked))
                continue
            if kind == "error":
                raise EnvPoolError(f"env {i} of {self.env_id} raised in its {asked}: {arg}")
            if kind == "reset":
                obs, info = arg
                s.last_obs = obs
                out.append(Result(i, "reset", obs, info))
            else:
                obs, reward, terminated, truncated, info = arg
                s.last_obs = obs
                out.append(Result(i, "step", obs, info, float(reward), bool(terminated), bool(truncated)))
        return out

    def _died(self, i: int, asked: str) -> Result:
        task = self._slots[i].task
        last = self._slots[i].last_obs
        error = self._replace(i)
        blank = {
            k: (np.zeros_like(v) if isinstance(v, np.ndarray) else "")
            for k, v in (last or self.observation_space.sample()).items()
        }
        if asked == "reset":
            return Result(i, "reset", blank, {"task": task, "setup_error": error})
        return Result(i, "step", blank, {"task": task, "success": False, "error": error}, 0.0, False, True)

    def close(self) -> None:
        """Close every env and end its worker (a worker that does not end in time is killed)."""
        if self.closed:
            return
        self.closed = True
        for s in self._slots:
            if s is None:
                continue
            try:
                # an answer still due is read first: a worker blocks sending an observation larger than the
                # pipe's buffer until it is read, and would never see the "close" behind it
                if s.asked is not None and s.pipe.poll(30):
                    s.pipe.recv()
                s.pipe.send(("close", None))
            except (EOFError, BrokenPipeError, OSError):
                pass
        for s in self._slots:
            if s is None:
                continue
            s.process.join(timeout=30)
            if s.process.is_alive():
                s.process.kill()
                s.process.join(timeout=5)
            s.pipe.close()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if not getattr(self, "closed", True):
            self.close()
