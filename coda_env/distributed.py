"""RayVectorEnv: coda envs hosted as Ray actors, each with its own desktop, behind a gymnasium VectorEnv.

One process per env, as AsyncVectorEnv has, but the processes are Ray actors, so they can sit on any node
of a Ray cluster: each declares what it needs (`num_cpus`, `memory`) and Ray places it (spread over nodes by
default, or pinned to nodes, or into a placement group through `actor_options`). With the libvirt backend,
`hosts` spreads the actors' envs over other hosts through their backend's host option (a VM backend's
libvirt URIs: actor i uses hosts[i % len(hosts)]).

The facade behaves like gymnasium's vector envs in NEXT_STEP autoreset mode (the step after an episode ends
resets that env and returns its first observation, reward 0), and `get_attr`/`set_attr`/`call` reach the
envs, so a runner (the agent package's `run_episodes`) can set `next_task`. Failures never hang a step: an actor that
dies (its process killed, its node lost) or does not answer within `timeout` seconds is killed and replaced
by a fresh actor, and its episode ends as truncated with reward 0 and info["error"] naming what happened;
the next step resets it like any finished env. A desktop or app that dies inside a living actor is the env's
own business: CodaEnv ends that episode as truncated with info["error"] and its reset starts afresh.

Needs the `[ray]` extra (`pip install coda[ray]`). Call `ray.init(...)` first to choose the cluster; without
it, the first RayVectorEnv starts a local Ray instance.
"""

from __future__ import annotations

import os
import time
from copy import deepcopy
from typing import Any, Callable, Sequence

import gymnasium as gym
import numpy as np

from .backends import BACKENDS
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

__all__ = ["RayVectorEnv", "EnvActor"]


class EnvActor:
    """One env inside a Ray actor process (made a Ray actor class by RayVectorEnv; plain here so it can be
    tested and read without Ray)."""

    def __init__(self, env_id: str, env_kwargs: dict, wrappers: Sequence[Callable[[gym.Env], gym.Env]] = ()):
        import coda_env  # noqa: F401  (registers the env ids in this process)

        self.env = gym.make(env_id, **env_kwargs)
        for w in wrappers:
            self.env = w(self.env)

    def ping(self) -> int:
        """The actor's process id (it answers once the env is built)."""
        return os.getpid()

    def desktop_token(self) -> str | None:
        """The token the env's desktop marks its processes with (local backend), to find or audit them."""
        return getattr(getattr(self.env.unwrapped, "desktop", None), "token", None)

    def spaces(self) -> tuple[gym.Space, gym.Space, dict]:
        return self.env.observation_space, self.env.action_space, dict(self.env.metadata)

    def reset(self, seed: int | None = None, options: dict | None = None):
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        return self.env.step(action)

    def get_attr(self, name: str) -> Any:
        return self.env.get_wrapper_attr(name)

    def set_attr(self, name: str, value: Any) -> None:
        self.env.set_wrapper_attr(name, value)

    def call(self, name: str, args: tuple = (), kwargs: dict | None = None) -> Any:
        fn = self.env.get_wrapper_attr(name)
        return fn(*args, **(kwargs or {})) if callable(fn) else fn

    def close(self) -> None:
        self.env.close()


class RayVectorEnv(VectorEnv):
    """`num_envs` copies of `env_id` (made with `**env_kwargs`, then `wrappers` applied in order), one per Ray
    actor.

    num_cpus, memory: what each actor reserves (memory in bytes; None reserves none). placement: "spread"
    (Ray's SPREAD strategy: actors over as many nodes as possible), "pack" (Ray's default), or a list of Ray
    node ids (actor i pinned to node_ids[i % len]). actor_options: any other `ActorClass.options(...)`
    (a placement-group scheduling strategy, runtime_env, ...). hosts: actor i's env runs on hosts[i % n]
    through its backend's host option (the backends table's host_option). timeout: seconds a reset or step
    may take before the actor is declared hung and replaced (VMs under software emulation need more).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
        num_cpus: float = 1.0,
        memory: int | None = 1 << 30,
        placement: str | Sequence[str] = "spread",
        actor_options: dict | None = None,
        hosts: Sequence[str] | None = None,
        timeout: float = 120.0,
        start_timeout: float = 300.0,
        **env_kwargs,
    ):
        try:
            import ray
        except ImportError:
            raise ImportError("RayVectorEnv needs Ray: pip install 'coda[ray]' (or pip install ray)") from None
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self._ray = ray
        if not ray.is_initialized():
            ray.init(include_dashboard=False)
        self.num_envs, self.env_id = int(num_envs), env_id
        self.timeout, self.start_timeout = float(timeout), float(start_timeout)
        self._wrappers = tuple(wrappers)
        self._env_kwargs = [self._kwargs_for(i, env_kwargs, hosts) for i in range(self.num_envs)]
        self._options = [
            self._actor_options(i, num_cpus, memory, placement, actor_options) for i in range(self.num_envs)
        ]
        self._remote_cls = ray.remote(EnvActor)
        self._actors: list[Any] = [None] * self.num_envs
        self._pending_attrs: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._fresh: set[int] = set()  # envs whose actor was (re)started and has not answered yet
        self.restarts = 0  # actors replaced so far (dead or hung)
        self.closed = False
        try:
            for i in range(self.num_envs):
                self._actors[i] = self._spawn(i)
            self._wait_ready(list(range(self.num_envs)))
            obs_space, act_space, meta = ray.get(self._actors[0].spaces.remote(), timeout=self.timeout)
        except BaseException:
            self._kill_all()
            raise
        self.single_observation_space, self.single_action_space = obs_space, act_space
        self.observation_space = batch_space(obs_space, self.num_envs)
        self.action_space = batch_space(act_space, self.num_envs)
        self.metadata = {**meta, "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = None
        self._observations = create_empty_array(obs_space, self.num_envs)
        self._env_obs: list[Any] = [None] * self.num_envs
        self._autoreset = np.zeros(self.num_envs, dtype=bool)

    # ------------------------------------------------------------------ actors
    @staticmethod
    def _kwargs_for(i: int, env_kwargs: dict, hosts: Sequence[str] | None) -> dict:
        """Env i's keyword arguments: with `hosts`, the host it gets (round robin) through its backend's host
        option (the backends table's `host_option`; the backend defaults to the first that has one)."""
        kw = dict(env_kwargs)
        if hosts:
            spread = [b for b in BACKENDS.values() if b.host_option]
            backend = BACKENDS.get(kw.get("backend") or spread[0].name)
            if backend is None or not backend.host_option:
                raise ValueError(
                    "hosts need a backend that runs on other hosts ("
                    + ", ".join(f"backend={b.name!r}" for b in spread)
                    + f"), got backend={kw.get('backend')!r}"
                )
            kw["backend"] = backend.name
            kw["backend_options"] = {**(kw.get("backend_options") or {}), backend.host_option: hosts[i % len(hosts)]}
        return kw

    @staticmethod
    def _actor_options(
        i: int, num_cpus: float, memory: int | None, placement: str | Sequence[str], extra: dict | None
    ) -> dict:
        opts: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": 0, "max_concurrency": 1}
        if memory:
            opts["memory"] = int(memory)
        if placement == "spread":
            opts["scheduling_strategy"] = "SPREAD"
        elif placement == "pack":
            pass
        elif isinstance(placement, (list, tuple)) and placement:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(placement[i % len(placement)], soft=False)
        else:
            raise ValueError(f"placement must be 'spread', 'pack' or a list of Ray node ids, got {placement!r}")
        opts.update(extra or {})
        return opts

    def _spawn(self, i: int):
        return self._remote_cls.options(**self._options[i]).remote(self.env_id, self._env_kwargs[i], self._wrappers)

    def _wait_ready(self, idx: list[int]) -> None:
        """Block until the actors of `idx` have built their envs (a clear error if one cannot)."""
        refs = [self._actors[i].ping.remote() for i in idx]
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout)
        if len(ready) < len(refs):
            raise TimeoutError(
                f"RayVectorEnv: {len(refs) - len(ready)} env actor(s) were not placed or not built "
                f"within {self.start_timeout}s (not enough CPUs/memory in the cluster for "
                f"{self._options[idx[0]].get('num_cpus')} CPU each?)"
            )
        self._ray.get(refs)  # raises the env's own error (e.g. an unknown task) if building failed

    def _replace(self, i: int) -> None:
        """Kill actor i (dead, hung or broken) and start a fresh one; its env then needs a reset."""
        try:
            self._ray.kill(self._actors[i], no_restart=True)
        except Exception:
            pass
        self.restarts += 1
        self._actors[i] = self._spawn(i)
        self._fresh.add(i)
        for name, value in self._pending_attrs[i].items():
            self._actors[i].set_attr.remote(name, value)

    def _gather(self, refs: dict[int, Any], timeout: float) -> tuple[dict[int, Any], dict[int, str]]:
        """Results of the calls in `refs` by env index, and errors (dead actor, timeout) by env index. A call
        to an actor started since its last answer also has `start_timeout` to build its env."""
        results, errors = {}, {}
        t0 = time.monotonic()
        deadline = {i: t0 + timeout + (self.start_timeout if i in self._fresh else 0.0) for i in refs}
        pending = {ref: i for i, ref in refs.items()}
        while pending:
            wait = max(0.0, min(deadline[i] for i in pending.values()) - time.monotonic())
            ready, _ = self._ray.wait(list(pending), num_returns=1, timeout=wait)
            if not ready:
                now = time.monotonic()
                for ref, i in list(pending.items()):
                    if now >= deadline[i]:
                        del pending[ref]
                        errors[i] = (
                            f"EnvActorTimeout: env {i} did not answer within {deadline[i] - t0:.0f}s;"
                            " its actor was replaced"
                        )
                continue
            for ref in ready:
                i = pending.pop(ref)
                self._fresh.discard(i)
                try:
                    results[i] = self._ray.get(ref)
                except self._ray.exceptions.RayActorError as e:
                    errors[i] = f"EnvActorDied: env {i}'s actor died ({type(e).__name__}); it was replaced"
                except self._ray.exceptions.RayTaskError as e:
                    errors[i] = f"{type(e.cause).__name__ if e.cause else 'RayTaskError'}: {e.cause or e}"
        return results, errors

    # ------------------------------------------------------------------ VectorEnv API
    def reset(self, *, seed: int | Sequence[int | None] | None = None, options: dict | None = None):
        if seed is None or isinstance(seed, int):
            seeds = [None if seed is None else seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset got {len(seeds)} seeds for {self.num_envs} envs")
        results, errors = self._gather(
            {i: a.reset.remote(seed=seeds[i], options=options) for i, a in enumerate(self._actors)}, self.timeout
        )
        if errors:  # one retry on fresh actors for the envs that died or hung; then a clear error
            for i in errors:
                if errors[i].startswith(("EnvActorDied", "EnvActorTimeout")):
                    self._replace(i)
            retry, errors2 = self._gather(
                {i: self._actors[i].reset.remote(seed=seeds[i], options=options) for i in errors}, self.timeout
            )
            if errors2:
                raise RuntimeError("RayVectorEnv.reset failed: " + "; ".join(errors2.values()))
            results.update(retry)
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            self._env_obs[i], info = results[i]
            infos = self._add_info(infos, info, i)
            self._pending_attrs[i] = {}
        self._autoreset[:] = False
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        return deepcopy(self._observations), infos

    def step(self, actions):
        acts = list(iterate(self.action_space, actions))
        refs = {}
        for i, a in enumerate(self._actors):
            if self._autoreset[i]:
                refs[i] = a.reset.remote()
                self._pending_attrs[i] = {}
            else:
                refs[i] = a.step.remote(acts[i])
        results, errors = self._gather(refs, self.timeout)
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terms = np.zeros(self.num_envs, dtype=bool)
        truncs = np.zeros(self.num_envs, dtype=bool)
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            if i in errors:
                if errors[i].startswith(("EnvActorDied", "EnvActorTimeout")):
                    self._replace(i)
                # the episode ends here, truncated; the last observation stands in for the lost one
                if self._env_obs[i] is None:
                    self._env_obs[i] = self.single_observation_space.sample()
                truncs[i] = True
                info = {"error": errors[i], "success": False}
            elif self._autoreset[i]:
                self._env_obs[i], info = results[i]
            else:
                self._env_obs[i], rewards[i], terms[i], truncs[i], info = results[i]
            infos = self._add_info(infos, info, i)
        self._autoreset = np.logical_or(terms, truncs)
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        return deepcopy(self._observations), rewards, terms, truncs, infos

    def _each(self, method: str, *args) -> tuple:
        results, errors = self._gather(
            {i: getattr(a, method).remote(*args) for i, a in enumerate(self._actors)}, self.timeout
        )
        if errors:
            raise RuntimeError(f"RayVectorEnv.{method} failed: " + "; ".join(errors.values()))
        return tuple(results[i] for i in range(self.num_envs))

    def get_attr(self, name: str) -> tuple:
        return self._each("get_attr", name)

    def set_attr(self, name: str, values: Any | list | tuple) -> None:
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr got {len(values)} values for {self.num_envs} envs")
        results, errors = self._gather(
            {i: a.set_attr.remote(name, values[i]) for i, a in enumerate(self._actors)}, self.timeout
        )
        for i, v in enumerate(values):
            self._pending_attrs[i][name] = v  # re-applied if the actor is replaced before its next reset
        if errors:
            for i in errors:
                if errors[i].startswith(("EnvActorDied", "EnvActorTimeout")):
                    self._replace(i)  # the replacement gets the value from _pending_attrs
                else:
                    raise RuntimeError(f"RayVectorEnv.set_attr({name!r}) failed: {errors[i]}")

    def call(self, name: str, *args, **kwargs) -> tuple:
        return self._each("call", name, args, kwargs)

    def actor_pids(self) -> tuple[int, ...]:
        """The process id of each env's actor (for monitoring, and for the tests that kill one)."""
        return self._each("ping")

    def desktop_tokens(self) -> tuple[str | None, ...]:
        """Each env's desktop token (local backend; see coda_env.backends.local.TOKEN_VAR)."""
        return self._each("desktop_token")

    def _kill_all(self) -> None:
        live = [a for a in self._actors if a is not None]
        if live:  # let each env close its desktop; then the actors go whatever they answered
            try:
                self._ray.wait([a.close.remote() for a in live], num_returns=len(live), timeout=30)
            except Exception:
                pass
        for a in live:
            try:
                self._ray.kill(a, no_restart=True)
            except Exception:
                pass
        self._actors = [None] * self.num_envs

    def close_extras(self, **kwargs) -> None:
        self._kill_all()
