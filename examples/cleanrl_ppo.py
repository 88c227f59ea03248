"""PPO in one readable file, CleanRL style (after cleanrl/ppo_atari.py), on real KAlgebra desktops.

Same task and wrapped env as examples/sb3_ppo.py: `tab_3d_graph`, 84x84 pixels, a 12-cell click grid over the
tab strip plus DONE. The envs run in subprocesses (gymnasium's AsyncVectorEnv through `gym.make_vec`), in
SAME_STEP autoreset mode, so the observation after a finished episode is the next episode's first one, as
the classic PPO loop below expects.

    python examples/cleanrl_ppo.py --total-timesteps 64 --num-envs 2 --out runs/cleanrl-smoke   # ~1 min

Writes OUT/metrics.csv (one row per update: steps, episodic return, losses, steps/s) and OUT/agent.pt; then
reloads the agent and plays one greedy episode.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from torch.distributions import Categorical

import coda_env  # noqa: F401
from coda_env.wrappers import ClickGrid, PixelObservation

TASK = "tab_3d_graph"
TAB_STRIP = (0, 41, 1016, 65)
WRAPPERS = [
    functools.partial(PixelObservation, size=(84, 84)),
    functools.partial(ClickGrid, rows=1, cols=12, kinds=("click",), region=TAB_STRIP, extra=("DONE",)),
]
ENV_KWARGS = {"task": TASK, "settle_quiet": 0.2, "info_timings": False}  # 0.2: see sb3_ppo.make_env


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total-timesteps", type=int, default=20_000)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=32, help="steps per env per rollout")
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--gamma", type=float, default=0.95)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/cleanrl_ppo")
    return p.parse_args(argv)


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature-CNN trunk, policy and value heads; input (B, 84, 84, C) uint8."""

    def __init__(self, channels: int, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(channels, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def hidden(self, x):
        return self.network(x.permute(0, 3, 1, 2).float() / 255.0)

    def get_value(self, x):
        return self.critic(self.hidden(x))

    def get_action_and_value(self, x, action=None):
        h = self.hidden(x)
        dist = Categorical(logits=self.actor(h))
        if action is None:
            action = dist.sample()
        return action, dist.log_prob(action), dist.entropy(), self.critic(h)


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    envs = gym.make_vec(
        "coda/KAlgebra-v0",
        num_envs=args.num_envs,
        wrappers=WRAPPERS,
        vectorization_mode="async" if args.num_envs > 1 else "sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **ENV_KWARGS,
    )
    obs_shape, n_actions = envs.single_observation_space.shape, envs.single_action_space.n
    agent = Agent(obs_shape[-1], n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    batch_size = args.num_envs * args.num_steps
    minibatch_size = max(1, batch_size // args.num_minibatches)
    num_updates = max(1, args.total_timesteps // batch_size)

    obs_buf = torch.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=torch.uint8)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
    logprobs, rewards, dones, values = (torch.zeros((args.num_steps, args.num_envs)) for _ in range(4))

    global_step, returns, t0 = 0, [], time.monotonic()
    log = open(out / "metrics.csv", "w", newline="")
    writer = csv.writer(log)
    writer.writerow(
        ["update", "global_step", "episodes", "mean_return", "pg_loss", "v_loss", "entropy", "approx_kl", "steps_per_s"]
    )
    try:
        next_obs, _ = envs.reset(seed=args.seed)
        next_obs, next_done = torch.as_tensor(next_obs), torch.zeros(args.num_envs)
        ep_ret = np.zeros(args.num_envs)
        for update in range(1, num_updates + 1):
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs_buf[step], dones[step] = next_obs, next_done
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
                o, r, term, trunc, info = envs.step(action.numpy())
                done = np.logical_or(term, trunc)
                rewards[step] = torch.as_tensor(r, dtype=torch.float32)
                next_obs, next_done = torch.as_tensor(o), torch.as_tensor(done, dtype=torch.float32)
                ep_ret += r
                for i in np.flatnonzero(done):
                    returns.append(float(ep_ret[i]))
                    ep_ret[i] = 0.0

            # generalized advantage estimation
            with torch.no_grad():
                next_value = agent.get_value(next_obs).reshape(1, -1)
                advantages = torch.zeros_like(rewards)
                lastgaelam = 0
                for t in reversed(range(args.num_steps)):
                    nonterminal = 1.0 - (next_done if t == args.num_steps - 1 else dones[t + 1])
                    nextvalues = next_value if t == args.num_steps - 1 else values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nonterminal - values[t]
                    advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nonterminal * lastgaelam
                returns_t = advantages + values

            b_obs = obs_buf.reshape((-1, *obs_shape))
            b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
            b_adv, b_ret = advantages.reshape(-1), returns_t.reshape(-1)
            for _ in range(args.update_epochs):
                for idx in torch.randperm(batch_size).split(minibatch_size):
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[idx], b_actions[idx])
                    logratio = newlogprob - b_logprobs[idx]
                    ratio = logratio.exp()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    adv = b_adv[idx]
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8) if len(idx) > 1 else adv
                    pg_loss = torch.max(
                        -adv * ratio, -adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                    ).mean()
                    v_loss = 0.5 * ((newvalue.view(-1) - b_ret[idx]) ** 2).mean()
                    loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()
            sps = global_step / (time.monotonic() - t0)
            mean_ret = float(np.mean(returns[-20:])) if returns else float("nan")
            writer.writerow(
                [
                    update,
                    global_step,
                    len(returns),
                    mean_ret,
                    pg_loss.item(),
                    v_loss.item(),
                    entropy.mean().item(),
                    approx_kl.item(),
                    round(sps, 3),
                ]
            )
            log.flush()
            print(
                f"update {update}/{num_updates} step {global_step} episodes {len(returns)} "
                f"return(last 20) {mean_ret:.3f} sps {sps:.2f}",
                flush=True,
            )
    finally:
        log.close()
        envs.close()
    torch.save(
        {"state_dict": agent.state_dict(), "obs_shape": [int(s) for s in obs_shape], "n_actions": int(n_actions)},
        out / "agent.pt",
    )

    # reload and play one greedy episode
    saved = torch.load(out / "agent.pt", weights_only=True)
    agent = Agent(saved["obs_shape"][-1], saved["n_actions"])
    agent.load_state_dict(saved["state_dict"])
    env = gym.make("coda/KAlgebra-v0", **ENV_KWARGS)
    for w in WRAPPERS:
        env = w(env)
    try:
        o, info = env.reset(seed=args.seed)
        done, ret, steps = False, 0.0, 0
        while not done:
            with torch.no_grad():
                a = agent.actor(agent.hidden(torch.as_tensor(o)[None])).argmax(-1).item()
            o, r, term, trunc, info = env.step(a)
            ret, steps, done = ret + r, steps + 1, term or trunc
    finally:
        env.close()
    result = {
        "global_step": global_step,
        "episodes": len(returns),
        "train_seconds": round(time.monotonic() - t0, 1),
        "eval_return": ret,
        "eval_steps": steps,
        "eval_success": bool(info.get("success")),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
