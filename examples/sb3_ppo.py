"""PPO (Stable-Baselines3, CnnPolicy) on real KAlgebra, several envs in subprocesses, each with its own desktop.

Task: `tab_3d_graph` ("Switch KAlgebra to its 3D Graph tab"). Chosen because a pixel agent can learn it: the
click target is fixed (the tab sits at the same place on every reset) and success is visible on screen, so
the instruction need not be read. The other KAlgebra families need text typed from the instruction
(Calculator, Dictionary) or a plot's expression (2D/3D Graph): a job for a VLM, or for Vocabulary actions
plus instruction tokens, not for a CNN over 84x84 pixels. The action space is a 12-cell grid of clicks over
the tab strip plus DONE (13 actions); an episode scores 1.0 when the 3D Graph tab is current at its end.

    python examples/sb3_ppo.py                       # 4 envs, 20k steps (hours on 2 cores; set --timesteps)
    python examples/sb3_ppo.py --timesteps 64 --num-envs 2 --out runs/sb3-smoke   # a smoke run (~1 min)

Writes OUT/progress.csv (SB3's logger), OUT/model.zip; then reloads the model and plays one greedy episode.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import gymnasium as gym

import coda_env  # noqa: F401  (registers coda/KAlgebra-v0)
from coda_env.wrappers import ClickGrid, PixelObservation

TASK = "tab_3d_graph"
TAB_STRIP = (0, 41, 1016, 65)  # KAlgebra's tab bar at 1280x800: 12 cells of 85 px, one per tab and beyond


def make_env(settle_quiet: float = 0.2) -> gym.Env:
    """The wrapped env. settle_quiet=0.2: the 3D view paints ~0.1 s after its tab is clicked, and the agent
    should see the switched tab in the observation that follows its click."""
    env = gym.make("coda/KAlgebra-v0", task=TASK, settle_quiet=settle_quiet, info_timings=False)
    env = PixelObservation(env, size=(84, 84))
    return ClickGrid(env, rows=1, cols=12, kinds=("click",), region=TAB_STRIP, extra=("DONE",))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timesteps", type=int, default=20_000, help="total env steps over all envs (the budget)")
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--n-steps", type=int, default=32, help="steps per env per PPO update")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/sb3_ppo")
    args = p.parse_args(argv)

    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.vec_env import SubprocVecEnv

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vec_cls = SubprocVecEnv if args.num_envs > 1 else None
    envs = make_vec_env(make_env, n_envs=args.num_envs, seed=args.seed, **({"vec_env_cls": vec_cls} if vec_cls else {}))
    t0 = time.monotonic()
    try:
        batch = args.n_steps * args.num_envs
        model = PPO(
            "CnnPolicy",
            envs,
            n_steps=args.n_steps,
            batch_size=min(64, batch),
            n_epochs=4,
            learning_rate=2.5e-4,
            ent_coef=0.01,
            gamma=0.95,
            seed=args.seed,
            verbose=0,
        )
        model.set_logger(configure(str(out), ["stdout", "csv"]))
        model.learn(total_timesteps=args.timesteps)
        model.save(out / "model")
    finally:
        envs.close()
    train_s = time.monotonic() - t0

    # reload and play one greedy episode on a fresh env
    model = PPO.load(out / "model", device="cpu")
    env = make_env()
    try:
        obs, info = env.reset(seed=args.seed)
        done, ret, steps = False, 0.0, 0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, info = env.step(action)
            ret, steps, done = ret + r, steps + 1, term or trunc
    finally:
        env.close()
    result = {
        "timesteps": model.num_timesteps,
        "train_seconds": round(train_s, 1),
        "steps_per_second": round(model.num_timesteps / train_s, 2),
        "eval_return": ret,
        "eval_steps": steps,
        "eval_success": bool(info.get("success")),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
