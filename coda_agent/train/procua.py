"""PRO-CUA: step-level process rewards for the agent's own states, on the step-level GRPO core (TRL).

The method (../shared/PAPERS.md). Interaction and optimisation are decoupled: the current policy rolls out
live and every state it visits becomes a row of a state dataset (`coda_agent.states`); at each state the
planner samples K candidate plans (TRL's num_generations), the fixed executor turns each into an action, a
process reward model gives each candidate a score in [0, 1], and GRPO updates the planner with group-relative
advantages over the K candidates of one state:

    A_i = (s_i - mean_j s_j) / (std_j s_j + 1e-4)          (state_advantages; TRL computes the same)

Dense credit per step with no golden answer: the default path (`--scorer prm`) reads no task's oracle solution,
no labelled action and no oracle state. The scorers live in `coda_agent.prm` (one interface, `ProcessScorer`):

- `--scorer prm` (the default) with `--prm DIR|URL`: a PRM folder trained by `coda prm train` (a
  `ClassifierPRM`: the policy's architecture answering YES/NO, score p(YES); it holds prm.json), or a VLM
  checkpoint or OpenAI-compatible endpoint prompted for `SCORE: x` (`VLMPRM`; --prm-samples, --prm-fallback).
- `--scorer replay`: exact replay labels from the real app (`ReplayScorer`). PRIVILEGED: it reads the tasks'
  oracle solutions, so it is an ablation (and the yardstick the PRM is trained and calibrated against), never
  the default. `--compare-replay` scores the PRM's candidates with it too and logs the agreement: measurement
  beside training, which then reads the oracle.

    coda train pro-cua --data STATES... --planner P --executor E --prm PRM --out OUT
        one GRPO run with the process reward over state datasets (as `coda train coda`)
    coda train pro-cua --rounds K --env ENV --tasks ... --planner P --executor E --prm PRM --out OUT
        round r: the current planner (or --agent uitars: a UI-TARS collector) runs the tasks live
        (OUT/round_NN/collect, a `coda eval` run), every visited state is stored (OUT/round_NN/states, with its
        prefix of the agent's own actions, and the a11y table and the performed action's box filled in by
        replaying them: `StateReplayer`, no oracle), GRPO with the process reward trains the planner
        (OUT/round_NN/train); a rerun resumes at the first unfinished round. --oracle-states adds the tasks'
        oracle states to round 0 (privileged; off by default). --eval-data: held-out states the reward is
        measured on before and after (a yardstick; they may be labelled states).
Logged beside TRL's scalars: `prm/score_mean|std|q25|q50|q75`, `prm/hist_0..3` (the share of scores in each
quarter of [0, 1]), `prm/parse_failure_rate`, `replay/score_mean|std`, `scorer/agreement` (with both scorers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from ..prm import (
    Candidate,
    ProcessScorer,
    ReplayScorer,
    StateReplayer,
    agreement_rate,
    load_prm,
    score_stats,
)
from ..states import state_observation
from .common import Method, opt
from .steplevel import (
    Rounds,
    StepLevelConfig,
    build_trainer,
    completion_rows,
    execute_plans,
    live_eval,
    load_states,
    make_executor,
    oracle_state_paths,
    resolve_app,
    run_trainer,
)

# ------------------------------------------------------------------------------------------ settings


@dataclass
class ProcuaConfig(StepLevelConfig):
    """`coda train pro-cua`: the step-level settings (the trainer, sampling, vLLM, rounds) plus the scorers."""

    out: str = opt(
        "runs/pro-cua",
        "run folder: config.json, metrics.jsonl, tb/, checkpoints/, planner/ (with --rounds: round_NN/ per round)",
    )
    group_size: int = opt(8, "candidate plans sampled per state: the group K of the advantages (TRL's num_generations)")
    env: str | None = opt(
        None, "env id whose tasks the states belong to (the replay scorer's fresh envs; the rounds' live runs)"
    )
    episodes: int = opt(1, "live episodes per task per round (every state they visit is collected)")
    agent: str = opt(
        "coda",
        "the policy that collects states live: coda (the planner being trained + --executor) | uitars "
        "(--collector, a UI-TARS checkpoint or endpoint; its states train the planner off-policy)",
    )
    collector: str | None = opt(None, "--agent uitars: the UI-TARS checkpoint directory or http(s):// endpoint")
    scorer: str = opt(
        "prm",
        "the process reward: prm (the --prm model; reads no golden answer) | replay (exact replay in the real "
        "app; privileged: reads the tasks' oracle solutions; never the default)",
    )
    prm: str = opt(
        "",
        "the process reward model: a PRM folder from `coda prm train` (it holds prm.json), or a VLM checkpoint "
        "directory or http(s):// endpoint (prompted for SCORE: x); needed by --scorer prm",
    )
    prm_batch: int = opt(8, "candidates per forward pass of a trained (classifier) PRM")
    compare_replay: bool = opt(
        False, "also score the candidates with the replay scorer and log the agreement (privileged: reads the oracle)"
    )
    prm_model: str | None = opt(None, "model name at the --prm endpoint (default: the one it serves)")
    prm_samples: int = opt(1, "PRM answers per candidate (the score is their mean)")
    prm_temperature: float = opt(0.0, "PRM sampling temperature (0: greedy)")
    prm_max_new_tokens: int = opt(64, "tokens per PRM answer")
    prm_fallback: float = opt(0.0, "the score of a candidate whose PRM answers hold no readable SCORE")
    positive: float = opt(0.5, "a candidate is a good step when its score is >= this (agreement, calibration)")
    oracle_states: bool = opt(
        False, "round 0 also trains on the states of the tasks' oracle replays (privileged: reads the oracle)"
    )


# ------------------------------------------------------------------------------------------ advantages
def state_advantages(rewards: Sequence[float], group_size: int, scale: str = "group") -> list[float]:
    """Group-relative advantages over the K = `group_size` candidates of each state (consecutive runs of
    `rewards`), as TRL's GRPOTrainer computes them: (r - mean_group) / (std + 1e-4), std unbiased over the group
    (`scale="group"`), over the whole batch ("batch"), or no division ("none"). A state whose candidates all
    score the same gives advantages 0: it teaches nothing."""
    import torch
    from trl.trainer.utils import nanstd

    if group_size < 1 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards are no whole number of groups of {group_size}")
    r = torch.as_tensor(list(rewards), dtype=torch.float32)
    groups = r.view(-1, group_size)
    mean = groups.nanmean(dim=1, keepdim=True)
    adv = groups - mean
    if scale == "group":
        std = nanstd(groups, dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
        adv = adv / (std + 1e-4)
    elif scale == "batch":
        adv = adv / (nanstd(r) + 1e-4)
    elif scale != "none":
        raise ValueError(f"scale {scale!r}: group | batch | none")
    return adv.flatten().tolist()


# ------------------------------------------------------------------------------------------ scorers
def make_scorers(cfg: ProcuaConfig) -> tuple[ProcessScorer, ProcessScorer | None]:
    """(the reward's scorer, the other one or None): --scorer picks the reward (prm, the default: the --prm
    model; replay: the privileged ablation); the other is built when asked for: the --prm beside the replay,
    the replay beside the PRM with --compare-replay."""
    if cfg.scorer not in ("replay", "prm"):
        raise ValueError(f"--scorer {cfg.scorer!r}: prm | replay")
    if cfg.scorer == "prm" and not cfg.prm:
        raise ValueError(
            "--scorer prm (the default) needs --prm DIR|URL: a PRM folder from `coda prm train`, a VLM checkpoint "
            "or an endpoint (--scorer replay is the privileged ablation)"
        )
    with_replay = cfg.scorer == "replay" or cfg.compare_replay
    if with_replay and not cfg.env:
        raise ValueError("the replay scorer needs --env (the env whose tasks the states belong to)")
    prm = (
        load_prm(
            cfg.prm,
            samples=cfg.prm_samples,
            temperature=cfg.prm_temperature,
            max_new_tokens=cfg.prm_max_new_tokens,
            fallback=cfg.prm_fallback,
            model_name=cfg.prm_model,
            device=cfg.device,
            batch=cfg.prm_batch,
        )
        if cfg.prm
        else None
    )
    replay = ReplayScorer(cfg.env) if with_replay else None
    return (replay, prm) if cfg.scorer == "replay" else (prm, replay)  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------ the reward
class ProcessReward:
    """TRL reward function: each sampled plan (a completion) -> the executor's action (the `coda` agent's own
    path) -> the process scorer's score in [0, 1]. Logs the score distribution of the reward's scorer and,
    when a second scorer is given, its scores and the agreement between the two."""

    __name__ = "process_reward"  # the name TRL logs the reward under (rewards/process_reward/...)

    def __init__(self, executor, scorer: ProcessScorer, other: ProcessScorer | None = None, positive: float = 0.5):
        self.executor, self.scorer, self.other, self.positive = executor, scorer, other, positive

    def candidates(self, rows: Sequence[dict], texts: Sequence[str], counts: dict | None = None) -> list[Candidate]:
        actions = execute_plans(
            self.executor, [(r["instruction"], t, state_observation(r)) for r, t in zip(rows, texts)], counts
        )
        return [Candidate(r, a, t) for r, t, a in zip(rows, texts, actions)]

    def __call__(self, prompts, completions, log_metric=None, **columns) -> list[float]:
        texts, rows = completion_rows(completions, columns)
        counts: dict[str, int] = {}
        cands = self.candidates(rows, texts, counts)
        main = self.scorer.score(cands)
        scores = [s.score for s in main]
        metrics = score_stats(self.scorer.name, scores)
        if self.scorer.name == "prm":
            asked = [s for s in main if s.details.get("asked")]
            metrics["prm/parse_failure_rate"] = sum(s.details["fallback"] for s in asked) / max(1, len(asked))
        metrics[f"{self.scorer.name}/error_rate"] = sum("error" in s.details for s in main) / max(1, len(main))
        if self.other is not None:
            second = [s.score for s in self.other.score(cands)]
            metrics.update(score_stats(self.other.name, second))
            metrics["scorer/agreement"] = agreement_rate(scores, second, self.positive)
        n = max(1, len(texts))
        metrics["planner/parse_error_rate"] = counts.get("plan_parse_errors", 0) / n
        metrics["executor/no_action_rate"] = sum(c.action is None for c in cands) / n
        if log_metric is not None:
            for k, v in metrics.items():
                log_metric(k, v)
        return scores


# ------------------------------------------------------------------------------------------ collection
def prefixes_of_run(run: Path) -> dict[tuple[str, int], list[str]]:
    """(task, episode) -> the env actions performed in that episode of a run folder, in order (every step's,
    also those the env refused: the replay repeats exactly what happened)."""
    from coda_env.runs import load_episodes, read_jsonl

    episodes, _ = load_episodes(Path(run))
    return {
        (ep["task"], int(ep["episode"])): [
            st.get("action", "") for st in read_jsonl(ep["pngs"][0].parent / "steps.jsonl")
        ]
        for ep in episodes
    }


def collected_states(run: Path, replayer: StateReplayer, history_images: int = 2) -> list[dict]:
    """Every state a run folder's episodes visited (states.run_states with no success filter: PRO-CUA scores
    steps, not episodes), each with its `prefix` (JSON list of the env actions the agent performed before it)
    and the a11y table and performed action's box its replay shows (`StateReplayer.complete`: the agent's own
    actions replayed, no oracle read). The `target` column keeps the performed action (the contract's column;
    PRO-CUA's reward does not read it)."""
    from .. import states

    prefixes = prefixes_of_run(run)
    out = []
    every = states.run_states(
        run, keep_episode=lambda ep: True, keep_step=lambda st: True, history_images=history_images
    )
    for rec in every:
        head, k = rec["id"].rsplit(":", 1)
        task, episode = head.rsplit(":", 1)[1].rsplit("__", 1)
        rec["prefix"] = json.dumps(prefixes[(task, int(episode))][: int(k) - 1])
        out.append(replayer.complete(rec))
    return out


def load_prefixed(paths: Sequence[str | Path], app: str | None = None):
    """State datasets (steplevel.load_states' checks) concatenated, those without a `prefix` column (oracle
    states, `coda data states`) given an empty one (the replay derives theirs), so that all share features."""
    from datasets import Value, concatenate_datasets

    parts = []
    for p in paths:
        ds, app = load_states([p], app)
        if "prefix" not in ds.column_names:
            ds = ds.add_column("prefix", [""] * len(ds), feature=Value("string"))
        parts.append(ds)
    if not parts:
        raise ValueError("no state dataset: give --data DIR (made by `coda data states ...`)")
    return (parts[0] if len(parts) == 1 else concatenate_datasets(parts)), app


def build_states(records: Sequence[dict], path: Path):
    """A state dataset (coda_agent.states' columns plus `prefix`), saved to `path`."""
    from datasets import Dataset, Features, Value

    from ..states import features

    if not records:
        raise ValueError("no states were collected (no episode took a performed step)")
    feats = Features({**features(), "prefix": Value("string")})
    rows = [{**r, "prefix": r.get("prefix") or "[]"} for r in records]
    ds = Dataset.from_list(rows, features=feats)
    ds.save_to_disk(str(path))
    return ds


def collect(
    cfg: ProcuaConfig, planner: str, executor, out: Path, replayer: StateReplayer, progress: bool = True
) -> dict:
    """The current policy (the planner + the run's executor, or --agent uitars) live over the tasks (a `coda
    eval` run in OUT/collect, resumable), then every state it visited as a dataset (OUT/states). Returns the
    run's summary."""
    if cfg.agent == "coda":
        policy = executor
    elif cfg.agent == "uitars":
        if not cfg.collector:
            raise ValueError("--agent uitars needs --collector PATH_OR_URL (the UI-TARS model that collects)")
        policy = cfg.collector
    else:
        raise ValueError(f"--agent {cfg.agent!r}: coda | uitars")
    config = {"planner": planner, "agent": cfg.agent, "collector": cfg.collector, "executor": cfg.executor}
    summary = live_eval(cfg, planner, policy, out / "collect", progress, agent=cfg.agent, config=config)
    if not (out / "states" / "dataset_info.json").exists():
        build_states(collected_states(out / "collect", replayer, cfg.history_images), out / "states")
    return summary


# ------------------------------------------------------------------------------------------ training
def train_once(
    cfg: ProcuaConfig,
    out: Path | None = None,
    progress: bool = True,
    extra_log: dict | None = None,
    scorers: tuple | None = None,
    executor=None,
) -> dict:
    """One GRPO run with the process reward over state datasets (steplevel.build_trainer with PRO-CUA's reward).
    `scorers` (reward's, other) are built from cfg when None, and then closed; `executor` likewise."""
    out = Path(out or cfg.out)
    own = scorers is None
    scorer, other = scorers if scorers is not None else make_scorers(cfg)
    try:
        train_states, app = load_prefixed(cfg.data, cfg.app)
        eval_states = load_prefixed(cfg.eval_data, app)[0] if cfg.eval_data else None
        if executor is None:
            screen = tuple(train_states.select_columns(["screen"])[0]["screen"]) or (1280, 800)
            executor = make_executor(cfg, app, screen)
        reward = ProcessReward(executor, scorer, other, cfg.positive)
        trainer = build_trainer(
            cfg, out, [reward], train_states=train_states, eval_states=eval_states, progress=progress,
            extra_log=extra_log,
        )  # fmt: skip
        summary = run_trainer(trainer, cfg, out, base=cfg.planner, extra_log=extra_log)
        if isinstance(scorer, ReplayScorer) or isinstance(other, ReplayScorer):
            r = scorer if isinstance(scorer, ReplayScorer) else other
            summary.update(replays=r.replays, replay_seconds=r.seconds)
        return summary
    finally:
        if own:
            for s in (scorer, other):
                if s is not None:
                    s.close()


def run_rounds(cfg: ProcuaConfig, progress: bool = True) -> list[dict]:
    """collect -> score -> optimise, K rounds, resumable per round (see the module's docstring). Returns one
    record per round: the collecting planner's live success, the states, the held-out reward before/after."""
    from .common import probe_env

    if not cfg.env:
        raise ValueError("--rounds needs --env (the env whose tasks the policy runs live)")
    env = probe_env(cfg.env, cfg.episode_steps)
    unknown = [t for t in (cfg.tasks or []) if t not in env.tasks]
    if unknown:
        raise ValueError(f"unknown tasks for {cfg.env}: {unknown}")
    resolve_app(cfg)
    if not cfg.planner or not (Path(cfg.planner) / "config.json").exists():
        raise ValueError(f"--planner {cfg.planner!r} is not a checkpoint directory (no config.json)")
    executor = make_executor(cfg, env.app, env.screen)  # built once: a wrong --executor fails now
    rounds = Rounds(cfg.out, cfg)
    planner = cfg.planner
    scorer, other = make_scorers(cfg)
    # the collected states' a11y tables come from replaying the agent's own actions (a replay scorer is one too)
    replayer = next((s for s in (scorer, other) if isinstance(s, StateReplayer)), None) or StateReplayer(cfg.env)
    try:
        for r in range(cfg.rounds):
            rd = rounds.dir(r)
            if (done := rounds.done(r)) is not None:
                planner = done["planner"]
                continue
            live = collect(cfg, planner, executor, rd, replayer, progress)
            data = [str(rd / "states")]
            if r == 0 and cfg.oracle_states:  # privileged: off by default
                data += oracle_state_paths(cfg, rounds.out)
            data += list(cfg.data)
            rcfg = replace(cfg, data=data, planner=planner, rounds=0, out=str(rd / "train"))
            rec_train = train_once(
                rcfg, progress=progress, extra_log={"round": r}, scorers=(scorer, other), executor=executor
            )
            planner = str(rd / "train" / "planner")
            keep = ("eval_reward_before", "eval_reward_after", "replays", "replay_seconds")
            rounds.finish(
                r,
                {
                    "round": r,
                    "planner": planner,
                    "collect_success_rate": float(live["overall"]["rate"]),
                    "states": rec_train.get("states"),
                    "steps": rec_train.get("steps"),
                    **{k: rec_train[k] for k in keep if k in rec_train},
                },
            )
    finally:
        for s in {id(x): x for x in (scorer, other, replayer) if x is not None}.values():
            s.close()
    return rounds.history


def run(cfg: ProcuaConfig, progress: bool = True) -> list[dict]:
    if cfg.rounds > 0:
        return run_rounds(cfg, progress)
    resolve_app(cfg)
    return [train_once(cfg, progress=progress)]


def summary(cfg: ProcuaConfig, history: list[dict]) -> str:
    lines = []
    for h in history:
        parts = (
            [f"round {h['round']}: collecting planner's live success {h['collect_success_rate']:.3f}"]
            if "round" in h
            else []
        )
        parts.append(f"{h.get('steps', 0)} steps over {h.get('states', 0)} states")
        for k in ("eval_reward_before", "eval_reward_after", "replays"):
            if k in h:
                parts.append(f"{k.replace('_', ' ')} {h[k]:.3f}" if isinstance(h[k], float) else f"{k} {h[k]}")
        lines.append(", ".join(parts))
    if history:
        lines.append(f"planner: {history[-1].get('planner')}")
    return "\n".join(lines)


METHOD = Method(
    "pro-cua",
    "PRO-CUA: step-level GRPO on the planner with process rewards for its own live states (a trained PRM or a "
    "VLM PRM; --scorer replay: the privileged exact-replay ablation); --rounds K iterates collect -> score -> "
    "optimise",
    ProcuaConfig,
    run,
    summary,
)
