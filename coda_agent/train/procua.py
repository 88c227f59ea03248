"""PRO-CUA: step-level process rewards for the agent's own states, on the step-level GRPO core (TRL).

The method (../shared/PAPERS.md). Interaction and optimisation are decoupled: the current policy rolls out
live and every state it visits becomes a row of a state dataset (`coda_agent.states`); at each state the
planner samples K candidate plans (TRL's num_generations), the fixed executor turns each into an action, a
process scorer gives each candidate a score in [0, 1], and GRPO updates the planner with group-relative
advantages over the K candidates of one state:

    A_i = (s_i - mean_j s_j) / (std_j s_j + 1e-4)          (state_advantages; TRL computes the same)

Dense credit per step, no labelled action needed. Two scorers share one interface (`ProcessScorer`:
candidates -> `StepScore`s):

- `VLMPRM`: a vision-language process reward model (a local checkpoint or an OpenAI-compatible endpoint) is
  shown the screen, the task, the earlier steps and the candidate, and asked for `SCORE: x` with x in [0, 1]
  (`parse_score`; the mean over --prm-samples samples). A candidate whose samples hold no readable score gets
  --prm-fallback (0 by default: an unreadable verdict is no evidence of progress) and counts as a parse failure.
- `ReplayScorer`: exact, from the real app. Env resets are deterministic, so the state is rebuilt by replaying
  the env actions that led to it (its `prefix`) in a fresh episode; the candidate is executed there and scored:
    * a terminal candidate (DONE, FAIL, ANS): 1 when the task's checks pass, else 0 (the episode's verdict);
    * any other: 0.5 * 1[it turned the checks from failing to passing] + 0.5 * clip(progress, 0, 1), where
      progress = (d(s, o) - d(s', o)) / d(s, o): how much of the way from the state s to the oracle's next
      state o the candidate's state s' went (1: it reached o; 0: no nearer, or farther).
  The oracle's next state: the task's oracle solution is replayed once (O_0 .. O_n, the state after each
  executor-sized step); a state's position j is the nearest O_j (ties: the later), o = O_{j+1} (O_n at the end).
  The distance d (`state_distance`, in [0, 1]) is the mean of two parts both the checks and the eye can see:
    * the app's checked state (`env.unwrapped.state()`, what the task's checks read), flattened to
      path -> value: the fraction of paths, over both states, whose values differ;
    * the accessibility table (the env's `a11y_tree`): rows as (role, name, text, states) with geometry left
      out, and the `focused` flag kept only on editable rows (container focus is not reproducible between
      replays; an input field's is, and it is the progress of a "click the field" step): the Jaccard distance
      of the two multisets of rows.
  Replays are cached by (task, prefix, action): a planner repeats itself, and the same action after the
  same prefix always gives the same score.

`coda prm calibrate` measures the VLM PRM against the replay scorer on state datasets (a candidate is positive
when its score is >= --positive): agreement, precision, recall per app. During training the scorer that is not
the reward (when both are configured) scores the same candidates, and the agreement is logged.

    coda train pro-cua --data STATES... --planner P --executor E --env ENV --out OUT
        one GRPO run with the process reward over state datasets (as `coda train coda`)
    coda train pro-cua --rounds K --env ENV --tasks ... --planner P --executor E --out OUT
        round r: the current planner (or --agent uitars: a UI-TARS collector) runs the tasks live
        (OUT/round_NN/collect, a `coda eval` run), every visited state is stored (OUT/round_NN/states, with the
        replay prefix, the a11y table and the performed action's box filled in by replaying it), GRPO with the
        process reward trains the planner (OUT/round_NN/train); a rerun resumes at the first unfinished round.
Logged beside TRL's scalars: `prm/score_mean|std|q25|q50|q75`, `prm/hist_0..3` (the share of scores in each
quarter of [0, 1]), `prm/parse_failure_rate`, `replay/score_mean|std`, `scorer/agreement`.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from .coda import CodaConfig, make_executor, resolve_app, run_trainer
from .common import Method, opt, write_config

# ------------------------------------------------------------------------------------------ settings


@dataclass
class ProcuaConfig(CodaConfig):
    """`coda train pro-cua`: CODA's step-level settings (the trainer, sampling, vLLM, rounds) plus the scorers."""

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
    scorer: str = opt("replay", "the process reward: replay (exact replay in the real app) | prm (the VLM PRM)")
    prm: str = opt(
        "", "the VLM process reward model: a checkpoint directory or an http(s):// endpoint (none: replay only)"
    )
    prm_model: str | None = opt(None, "model name at the --prm endpoint (default: the one it serves)")
    prm_samples: int = opt(1, "PRM answers per candidate (the score is their mean)")
    prm_temperature: float = opt(0.0, "PRM sampling temperature (0: greedy)")
    prm_max_new_tokens: int = opt(64, "tokens per PRM answer")
    prm_fallback: float = opt(0.0, "the score of a candidate whose PRM answers hold no readable SCORE")
    positive: float = opt(0.5, "a candidate is a good step when its score is >= this (agreement, calibration)")
    oracle_states: bool = opt(True, "round 0 also trains on the states of the tasks' oracle replays")
    # CODA's settings that PRO-CUA does not use (the reward is the process scorer's; every state is collected)
    reward_scale: float = opt(50.0, "not used by pro-cua (CODA's click-distance scale)")
    judge: list[str] = opt([], "not used by pro-cua (every visited state is collected, successful or not)")
    threshold: float = opt(0.5, "not used by pro-cua (CODA's judge threshold)")
    launcher: str | None = opt(None, "not used by pro-cua (its rounds run in one process)")


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
@dataclass
class Candidate:
    """One candidate step at a stored state: the state's record (a state dataset row, with `prefix` when it
    was collected here), the env action the candidate comes to (None: the plan or the executor gave none) and
    the policy's text."""

    state: dict
    action: str | None
    plan: str = ""


@dataclass
class StepScore:
    score: float  # in [0, 1]
    details: dict = field(default_factory=dict)


class ProcessScorer(Protocol):
    """What PRO-CUA's reward asks of a scorer: a score in [0, 1] per candidate, batched; `close` frees what it
    holds (envs, models)."""

    name: str

    def score(self, candidates: Sequence[Candidate]) -> list[StepScore]: ...

    def close(self) -> None: ...


# ---- the VLM PRM
PRM_SYSTEM = (
    "You are a process reward model for a computer-use agent working in a scientific desktop application. You "
    "see the task, the steps the agent took so far, the current screen and one candidate next step. Judge only "
    "that step: does performing it now move the task towards completion? A wrong element, a premature DONE or "
    "an answer the screen does not support is a bad step."
)
PRM_QUESTION = (
    "Rate the candidate step from 0 (useless or harmful) to 1 (exactly the right next step). Think briefly, "
    "then end your reply with one line:\nSCORE: <a number between 0 and 1>"
)
# `SCORE: 0.8`, `**Score:** .5`, `score = 1`, `Score: 7/10`, `SCORE: 80%`; not the echoed `SCORE: <a number`.
_SCORE = re.compile(r"score\W{0,6}?(\d+(?:\.\d+)?|\.\d+)\s*(%|/\s*(\d+(?:\.\d+)?))?", re.IGNORECASE)


def parse_score(text: str) -> float | None:
    """The step score in a PRM's answer, in [0, 1]; None when there is no readable one (no `SCORE: x`, or x
    outside [0, 1] after reading `x%` and `x/N`). The last SCORE wins (models restate). Only matched with a
    regular expression: the model's text is never executed."""
    found = _SCORE.findall(text or "")
    if not found:
        return None
    number, suffix, denom = found[-1]
    v = float(number)
    if suffix == "%":
        v /= 100
    elif suffix:
        d = float(denom)
        if d <= 0:
            return None
        v /= d
    return v if 0.0 <= v <= 1.0 and math.isfinite(v) else None


def _history_lines(record: dict) -> str:
    hist = json.loads(record.get("history") or "[]")
    if not hist:
        return "(none: this is the first step)"
    return "\n".join(f"{i}. {h.get('action', '')}" for i, h in enumerate(hist, 1))


def prm_conversation(c: Candidate) -> list[dict]:
    """The PRM's prompt for one candidate: the task, the earlier steps in words, the current screen, the
    candidate's plan (its Action line when it has one) and the env action it comes to."""
    from ..states import state_observation

    plan = c.plan.strip()
    m = re.search(r"Action:\s*(.+)", plan, re.DOTALL)
    step = (m.group(1) if m else plan).strip()[:500]
    text = (
        f"Task: {c.state['instruction']}\n\nSteps taken so far:\n{_history_lines(c.state)}\n\n"
        f"Candidate next step: {step or '(no text)'}\nIt performs: {c.action}\n\n{PRM_QUESTION}"
    )
    return [
        {"role": "system", "content": PRM_SYSTEM},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": state_observation(c.state)["screenshot"]},
                {"type": "text", "text": text},
            ],
        },
    ]


class VLMPRM:
    """The VLM process reward model: a local `transformers` checkpoint or an OpenAI-compatible endpoint
    (coda_agent.models.load_model), or any object with the models' `generate`. One batched call scores every
    candidate `samples` times; candidates without an action score 0 unasked (as in the replay)."""

    name = "prm"

    def __init__(
        self,
        model,
        samples: int = 1,
        temperature: float = 0.0,
        max_new_tokens: int = 64,
        fallback: float = 0.0,
        model_name: str | None = None,
        device: str | None = None,
    ):
        if isinstance(model, str):
            from ..policy import _load

            model = _load(model, model_name, {"device": device} if device else {})
        if not 0.0 <= fallback <= 1.0:
            raise ValueError(f"--prm-fallback {fallback} is not in [0, 1]")
        self.model = model
        self.samples, self.temperature, self.max_new_tokens, self.fallback = (
            max(1, samples),
            temperature,
            max_new_tokens,
            fallback,
        )

    def score(self, candidates: Sequence[Candidate]) -> list[StepScore]:
        from ..models import SamplingParams

        asked = [i for i, c in enumerate(candidates) if c.action is not None]
        convs = [prm_conversation(candidates[i]) for i in asked for _ in range(self.samples)]
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature)
        gens = self.model.generate(convs, params) if convs else []
        out = [StepScore(0.0, {"asked": False}) for _ in candidates]
        for k, i in enumerate(asked):
            texts = [g.text for g in gens[k * self.samples : (k + 1) * self.samples]]
            got = [v for v in map(parse_score, texts) if v is not None]
            score = sum(got) / len(got) if got else self.fallback
            out[i] = StepScore(score, {"asked": True, "parsed": len(got), "fallback": not got, "texts": texts})
        return out

    def close(self) -> None:
        self.model = None


# ---- the exact replay scorer
@dataclass(frozen=True)
class Measure:
    """What a state distance is taken over: the app's checked state (flattened) and the a11y table's rows."""

    state: tuple  # sorted (path, value) pairs
    rows: tuple  # sorted (role, name, text, states) tuples, repeats kept


def _flatten(value, path: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        return [kv for k in sorted(value) for kv in _flatten(value[k], f"{path}/{k}")]
    if isinstance(value, (list, tuple)):
        return [(f"{path}#len", str(len(value)))] + [
            kv for i, v in enumerate(value) for kv in _flatten(v, f"{path}/{i}")
        ]
    return [(path, json.dumps(value, sort_keys=True, default=str))]


def _rows(table: str) -> list[tuple[str, ...]]:
    rows = []
    for line in (table or "").splitlines()[1:]:
        cells = line.split("\t")
        if len(cells) < 5:
            continue
        role, name, text, _geometry, states = cells[:5]
        flags = set(states.split(",")) - {""}
        if "editable" not in flags:
            flags.discard("focused")
        rows.append((role, name, text, ",".join(sorted(flags))))
    return rows


def measure(app_state: dict, a11y_table: str) -> Measure:
    return Measure(tuple(sorted(_flatten(app_state))), tuple(sorted(_rows(a11y_table))))


def state_distance(a: Measure, b: Measure) -> float:
    """d(a, b) in [0, 1]: the mean of the checked-state part (share of paths whose values differ) and the a11y
    part (Jaccard distance of the row multisets); 0 for the same state."""
    sa, sb = dict(a.state), dict(b.state)
    keys = set(sa) | set(sb)
    d_state = sum(sa.get(k) != sb.get(k) for k in keys) / len(keys) if keys else 0.0
    ra, rb = Counter(a.rows), Counter(b.rows)
    union = sum((ra | rb).values())
    d_rows = 1.0 - sum((ra & rb).values()) / union if union else 0.0
    return 0.5 * d_state + 0.5 * d_rows


def oracle_runs(task, screen: tuple[int, int]) -> list[str]:
    """The env actions of a task's oracle, one per executor-sized step, exactly as `states.oracle_states`
    performs them (its records' step n comes after the first n - 1 of these)."""
    from ..states import executor_steps

    runs: list[str] = []
    carry = ""
    for action in task.solution:
        got = executor_steps(action, screen)
        if not got:
            carry = f"{carry}\n{action}".strip()
            continue
        if carry:
            got[0], carry = (got[0][0], f"{carry}\n{got[0][1]}"), ""
        runs += [run for _, run in got]
    return runs


def state_prefix(record: dict, tasks: dict, screen: tuple[int, int]) -> list[str]:
    """The env actions that lead from the task's reset to the record's state: its `prefix` column (states
    collected here), or for an oracle state the first step - 1 oracle actions."""
    if record.get("prefix"):
        return list(json.loads(record["prefix"]))
    if record.get("source") == "oracle":
        return oracle_runs(tasks[record["task"]], screen)[: int(record["step"]) - 1]
    if int(record.get("step", 1)) == 1:
        return []
    raise ValueError(
        f"state {record.get('id')} has no replay prefix: collect states with `coda train pro-cua --rounds` "
        "(or use oracle states)"
    )


class ReplayError(RuntimeError):
    """A prefix that no longer replays (an action errs or ends the episode): the state cannot be rebuilt."""


class ReplayScorer:
    """The exact process scorer (see the module's docstring). One env (`gym.make(env_id)`, with its a11y tree
    and no step budget), opened on first use and closed by `close`: the caller must close it."""

    name = "replay"

    def __init__(self, env_id: str, task_dirs: Sequence[str] | None = None):
        self.env_id, self.task_dirs = env_id, list(task_dirs or [])
        self._env = None
        self._oracle: dict[str, list[Measure]] = {}
        self._before: dict[tuple, tuple[Measure, bool]] = {}
        self._cache: dict[tuple, StepScore] = {}
        self.replays = 0
        self.seconds = 0.0

    @property
    def env(self):
        if self._env is None:
            import gymnasium as gym

            kw: dict[str, Any] = {"a11y_tree": True, "max_steps": 1_000_000}
            if self.task_dirs:
                kw["task_dirs"] = [str(Path(d).resolve()) for d in self.task_dirs]
            self._env = gym.make(self.env_id, **kw)
        return self._env

    @property
    def screen(self) -> tuple[int, int]:
        u = self.env.unwrapped
        return (u.width, u.height)

    @property
    def tasks(self) -> dict:
        return self.env.unwrapped.tasks

    def close(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            finally:
                self._env = None

    # ---- replay
    def _replay(self, task: str, prefix: Sequence[str]) -> dict:
        """A fresh episode of `task` with `prefix` performed; returns the last observation."""
        self.replays += 1
        obs, _ = self.env.reset(options={"task": task})
        for n, a in enumerate(prefix, 1):
            obs, _, term, trunc, info = self.env.step(a)
            if info.get("action_error") or info.get("error") or term or trunc:
                why = info.get("action_error") or info.get("error") or "the episode ended"
                raise ReplayError(f"{task}: prefix step {n} ({a!r}) does not replay: {why}")
        return obs

    def _measure(self, obs: dict) -> Measure:
        return measure(self.env.unwrapped.state(), obs.get("a11y_tree", ""))

    def _done(self) -> bool:
        """End the episode with DONE: do the task's checks pass in the state it is in?"""
        _, _, _, _, info = self.env.step("DONE")
        return bool(info.get("success"))

    def oracle_path(self, task: str) -> list[Measure]:
        """O_0 .. O_n: the measures after each of the oracle's non-terminal steps (cached per task)."""
        if task not in self._oracle:
            from coda_env.actions import TERMINAL_KINDS, parse_action

            runs = oracle_runs(self.tasks[task], self.screen)
            moves = [r for r in runs if not any(a.kind in TERMINAL_KINDS for a in parse_action(r, self.screen))]
            self.replays += 1
            obs, _ = self.env.reset(options={"task": task})
            path = [self._measure(obs)]
            for a in moves:
                obs, _, term, trunc, info = self.env.step(a)
                if info.get("action_error") or term or trunc:
                    raise ReplayError(f"{task}: the oracle's step {a!r} does not replay")
                path.append(self._measure(obs))
            self._oracle[task] = path
        return self._oracle[task]

    def complete(self, record: dict) -> dict:
        """A collected state with what a run folder lacks, from its replay: the a11y table at the state and the
        box of the element under its action's point (coda_agent.states.target_element)."""
        from coda_env.a11y import parse_table

        from ..states import target_element

        obs = self._replay(record["task"], state_prefix(record, self.tasks, self.screen))
        table = obs.get("a11y_tree", "")
        el = target_element(record["target"], parse_table(table), self.screen)
        return {**record, "a11y": table, "box": list(el.box) if el is not None else []}

    def score(self, candidates: Sequence[Candidate]) -> list[StepScore]:
        """Each candidate's replay score. A state whose prefix no longer replays scores 0 with
        details["error"] (counted in the logged `replay/error_rate`), not a crash of the training run."""
        t0 = time.monotonic()
        out = []
        try:
            for c in candidates:
                try:
                    out.append(self._score_one(c))
                except ReplayError as e:
                    out.append(StepScore(0.0, {"replayed": False, "error": str(e)}))
            return out
        finally:
            self.seconds += time.monotonic() - t0

    def _score_one(self, c: Candidate) -> StepScore:
        if c.action is None:
            return StepScore(0.0, {"replayed": False})
        task = c.state["task"]
        prefix = tuple(state_prefix(c.state, self.tasks, self.screen))
        key = (task, prefix, c.action)
        if key in self._cache:
            return self._cache[key]
        from coda_env.actions import ActionError, parse_action

        try:
            parse_action(c.action, self.screen)
        except ActionError:
            return StepScore(0.0, {"replayed": False, "error": "the action does not parse"})
        path = self.oracle_path(task)
        if (task, prefix) not in self._before:
            before = self._measure(self._replay(task, prefix))
            self._before[(task, prefix)] = (before, self._done())
        before, solved_before = self._before[(task, prefix)]
        dists = [state_distance(before, o) for o in path]
        j = max(range(len(path)), key=lambda i: (-dists[i], i))  # the nearest oracle state; ties: the later
        goal = path[min(j + 1, len(path) - 1)]
        self._replay(task, prefix)
        obs, _, term, trunc, info = self.env.step(c.action)
        if info.get("error"):  # the app or its desktop died: no score to give (and none cached)
            raise ReplayError(f"{task}: the candidate {c.action!r} crashed the episode: {info['error']}")
        details: dict[str, Any] = {"replayed": True, "position": j, "d_before": state_distance(before, goal)}
        if info.get("action_error"):
            details["action_error"] = info["action_error"]
        if term:
            s = StepScore(1.0 if info.get("success") else 0.0, {**details, "terminal": True})
        else:
            after = self._measure(obs)
            d0, d1 = details["d_before"], state_distance(after, goal)
            progress = (d0 - d1) / d0 if d0 > 0 else 0.0
            solved = self._done()
            completed = solved and not solved_before
            score = 0.5 * float(completed) + 0.5 * min(1.0, max(0.0, progress))
            s = StepScore(score, {**details, "d_after": d1, "progress": progress, "completed": completed})
        self._cache[key] = s
        return s


def make_scorers(cfg: ProcuaConfig) -> tuple[ProcessScorer, ProcessScorer | None]:
    """(the reward's scorer, the other one or None): --scorer picks the reward; the other is built when it
    is configured (a --prm beside the replay; the replay beside a --prm whenever --env is given)."""
    if cfg.scorer not in ("replay", "prm"):
        raise ValueError(f"--scorer {cfg.scorer!r}: replay | prm")
    if cfg.scorer == "prm" and not cfg.prm:
        raise ValueError("--scorer prm needs --prm PATH_OR_URL (the VLM process reward model)")
    if cfg.scorer == "replay" and not cfg.env:
        raise ValueError("the replay scorer needs --env (the env whose tasks the states belong to)")
    if cfg.prm and not cfg.prm.startswith(("http://", "https://")) and not Path(cfg.prm).is_dir():
        raise ValueError(f"--prm {cfg.prm!r} is neither a checkpoint directory nor an http(s):// URL")
    prm = (
        VLMPRM(
            cfg.prm,
            cfg.prm_samples,
            cfg.prm_temperature,
            cfg.prm_max_new_tokens,
            cfg.prm_fallback,
            cfg.prm_model,
            cfg.device,
        )
        if cfg.prm
        else None
    )
    replay = ReplayScorer(cfg.env) if cfg.env else None
    return (replay, prm) if cfg.scorer == "replay" else (prm, replay)  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------ the reward
def score_stats(name: str, scores: Sequence[float]) -> dict[str, float]:
    """The distribution of a batch's scores: mean, std, quartiles, and the share in each quarter of [0, 1]."""
    import numpy as np

    if not len(scores):
        return {}
    a = np.asarray(scores, dtype=float)
    out = {f"{name}/score_mean": float(a.mean()), f"{name}/score_std": float(a.std())}
    for q in (25, 50, 75):
        out[f"{name}/score_q{q}"] = float(np.percentile(a, q))
    bins = np.minimum((a * 4).astype(int), 3)
    for b in range(4):
        out[f"{name}/hist_{b}"] = float((bins == b).mean())
    return out


def agreement_rate(a: Sequence[float], b: Sequence[float], positive: float = 0.5) -> float:
    """The share of candidates on which two scorers agree about a good step (score >= positive)."""
    if not len(a):
        return float("nan")
    return sum((x >= positive) == (y >= positive) for x, y in zip(a, b)) / len(a)


class ProcessReward:
    """TRL reward function: each sampled plan (a completion) -> the executor's action (the `coda` agent's own
    path) -> the process scorer's score in [0, 1]. Logs the score distribution of the reward's scorer and,
    when a second scorer is given, its scores and the agreement between the two."""

    __name__ = "process_reward"  # the name TRL logs the reward under (rewards/process_reward/...)

    def __init__(self, executor, scorer: ProcessScorer, other: ProcessScorer | None = None, positive: float = 0.5):
        self.executor, self.scorer, self.other, self.positive = executor, scorer, other, positive

    def candidates(self, rows: Sequence[dict], texts: Sequence[str], counts: dict | None = None) -> list[Candidate]:
        from ..states import state_observation
        from .rewards import execute_plans

        actions = execute_plans(
            self.executor, [(r["instruction"], t, state_observation(r)) for r, t in zip(rows, texts)], counts
        )
        return [Candidate(r, a, t) for r, t, a in zip(rows, texts, actions)]

    def __call__(self, prompts, completions, log_metric=None, **columns) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        rows = [
            {k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(texts)}
            for i in range(len(texts))
        ]
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


def collected_states(run: Path, scorer: ReplayScorer, history_images: int = 2) -> list[dict]:
    """Every state a run folder's episodes visited (states.run_states with no success filter: PRO-CUA scores
    steps, not episodes), each with its replay `prefix` (JSON list of env actions) and the a11y table and
    target box its replay shows (`ReplayScorer.complete`). The `target` column keeps the performed action (the
    contract's column; PRO-CUA's reward does not read it)."""
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
        out.append(scorer.complete(rec))
    return out


def load_prefixed(paths: Sequence[str | Path], app: str | None = None):
    """State datasets (steplevel.load_states' checks) concatenated, those without a `prefix` column (oracle
    states, `coda data states`) given an empty one (the replay derives theirs), so that all share features."""
    from datasets import Value, concatenate_datasets

    from .steplevel import load_states

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


def collect(cfg: ProcuaConfig, planner: str, out: Path, scorer: ReplayScorer, progress: bool = True) -> dict:
    """The current policy live over the tasks (a `coda eval` run in OUT/collect, resumable), then every state
    it visited as a dataset (OUT/states). Returns the run's summary."""
    from ..eval import run_eval
    from ..models import SamplingParams
    from ..policy import make_agent
    from .common import probe_env

    env = probe_env(cfg.env, cfg.episode_steps)
    params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.live_temperature, top_p=cfg.top_p)
    if cfg.agent == "coda":
        agent = make_agent(
            "coda",
            env.app,
            env.screen,
            planner=planner,
            executor=make_executor(cfg, env.app, env.screen),
            history_images=cfg.history_images,
            seed=cfg.seed,
            model_options={"device": cfg.device} if cfg.device else {},
            planner_params=params,
        )
    elif cfg.agent == "uitars":
        if not cfg.collector:
            raise ValueError("--agent uitars needs --collector PATH_OR_URL (the UI-TARS model that collects)")
        agent = make_agent(
            "uitars",
            env.app,
            env.screen,
            executor=cfg.collector,
            history_images=cfg.history_images,
            seed=cfg.seed,
            model_options={"device": cfg.device} if cfg.device else {},
            planner_params=params,
        )
    else:
        raise ValueError(f"--agent {cfg.agent!r}: coda | uitars")
    env_kwargs = dict(env.kwargs)
    if getattr(agent, "wants_a11y_tree", False):
        env_kwargs["a11y_tree"] = True
    summary = run_eval(
        cfg.env,
        agent,
        out / "collect",
        task_ids=cfg.tasks,
        episodes=cfg.episodes,
        num_envs=cfg.num_envs,
        seed=cfg.seed,
        env_kwargs=env_kwargs,
        progress=progress,
        config={"planner": planner, "agent": cfg.agent, "collector": cfg.collector, "executor": cfg.executor},
    )
    if not (out / "states" / "dataset_info.json").exists():
        build_states(collected_states(out / "collect", scorer, cfg.history_images), out / "states")
    return summary


# ------------------------------------------------------------------------------------------ training
def train_once(
    cfg: ProcuaConfig,
    out: Path | None = None,
    progress: bool = True,
    extra_log: dict | None = None,
    scorers: tuple | None = None,
) -> dict:
    """One GRPO run with the process reward over state datasets (CODA's trainer, `build_trainer`, with PRO-CUA's
    reward in place of CODA's). `scorers` (reward's, other) are built from cfg when None, and then closed."""
    from .coda import build_trainer

    out = Path(out or cfg.out)
    own = scorers is None
    scorer, other = scorers if scorers is not None else make_scorers(cfg)
    try:
        train_states, app = load_prefixed(cfg.data, cfg.app)
        eval_states = load_prefixed(cfg.eval_data, app)[0] if cfg.eval_data else None
        screen = tuple(train_states.select_columns(["screen"])[0]["screen"]) or (1280, 800)
        executor = make_executor(cfg, app, screen)
        reward = ProcessReward(executor, scorer, other, cfg.positive)
        trainer = build_trainer(
            cfg,
            out,
            executor=executor,
            train_states=train_states,
            eval_states=eval_states,
            progress=progress,
            extra_log=extra_log,
            reward_funcs=[reward],
        )
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
    from .coda import _finished_rounds, _mark_done, _round_dir
    from .common import probe_env

    if not cfg.env:
        raise ValueError("--rounds needs --env (the env whose tasks the policy runs live)")
    env = probe_env(cfg.env, cfg.episode_steps)
    unknown = [t for t in (cfg.tasks or []) if t not in env.tasks]
    if unknown:
        raise ValueError(f"unknown tasks for {cfg.env}: {unknown}")
    cfg.app = env.app
    if not cfg.planner or not (Path(cfg.planner) / "config.json").exists():
        raise ValueError(f"--planner {cfg.planner!r} is not a checkpoint directory (no config.json)")
    make_executor(cfg, env.app, env.screen)  # a wrong --executor fails now, not after a collection
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_config(out, cfg)
    done = _finished_rounds(out)
    history: list[dict] = []
    planner = cfg.planner
    scorer, other = make_scorers(cfg)
    replay = scorer if isinstance(scorer, ReplayScorer) else other
    try:
        for r in range(cfg.rounds):
            rd = _round_dir(out, r)
            if r in done:
                history.append(done[r])
                planner = done[r]["planner"]
                continue
            live = collect(cfg, planner, rd, replay, progress)
            data = [str(rd / "states")]
            if r == 0 and cfg.oracle_states:
                oracle = out / "oracle_states"
                if not (oracle / "dataset_info.json").exists():
                    from .. import states

                    states.build(states.oracle_states(cfg.env, cfg.tasks, history_images=cfg.history_images), oracle)
                data.append(str(oracle))
            data += list(cfg.data)
            rcfg = ProcuaConfig(
                **{**asdict(cfg), "data": data, "planner": planner, "rounds": 0, "out": str(rd / "train")}
            )
            rec_train = train_once(rcfg, progress=progress, extra_log={"round": r}, scorers=(scorer, other))
            planner = str(rd / "train" / "planner")
            rec = {
                "round": r,
                "planner": planner,
                "collect_success_rate": float(live["overall"]["rate"]),
                "states": rec_train.get("states"),
                "steps": rec_train.get("steps"),
                **{
                    k: rec_train[k]
                    for k in ("eval_reward_before", "eval_reward_after", "replays", "replay_seconds")
                    if k in rec_train
                },
            }
            _mark_done(out, r, rec)
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(rec) + "\n")
            history.append(rec)
    finally:
        for s in (scorer, other):
            if s is not None:
                s.close()
    return history


def run(cfg: ProcuaConfig, progress: bool = True) -> list[dict]:
    if cfg.judge or cfg.launcher:
        raise ValueError(
            "pro-cua collects every visited state (no --judge) and runs its rounds in one process (no --launcher)"
        )
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
    "PRO-CUA: step-level GRPO on the planner with process rewards for its own live states (an exact replay "
    "scorer or a VLM PRM); --rounds K iterates collect -> score -> optimise",
    ProcuaConfig,
    run,
    summary,
)


# ------------------------------------------------------------------------------------------ calibration
def calibrate(
    data: Sequence[str | Path],
    prm: ProcessScorer,
    replay: ReplayScorer,
    candidates: int = 4,
    positive: float = 0.5,
    planner=None,
    executor=None,
    seed: int = 0,
) -> dict:
    """The VLM PRM against the replay scorer on state datasets: per state `candidates` candidate actions (the
    planner's sampled plans through the executor when both are given; else the state's own labelled action
    and the labels of other states of the dataset, which are mostly wrong here: a real positive and real
    negatives with no model), each scored by both; agreement, precision and recall of the PRM's good steps
    (score >= positive) against the replay's, per app and overall."""
    import random

    from ..judge import agreement
    from .steplevel import load_states

    ds, _ = load_states(list(map(str, data)))
    rows = [dict(r) for r in ds]
    rng = random.Random(seed)
    cands: list[Candidate] = []
    if planner is not None and executor is not None:
        from ..models import SamplingParams
        from ..states import planner_conversation

        reward = ProcessReward(executor, prm)
        convs = [planner_conversation(r) for r in rows for _ in range(candidates)]
        gens = planner.generate(convs, SamplingParams(max_new_tokens=128, temperature=1.0, seed=seed))
        cands = reward.candidates([r for r in rows for _ in range(candidates)], [g.text for g in gens])
    else:
        labels = sorted({r["target"] for r in rows})
        for r in rows:
            others = [t for t in labels if t != r["target"]]
            picks = [r["target"]] + rng.sample(others, min(len(others), max(0, candidates - 1)))
            cands += [Candidate(r, a, f"Action: {a}") for a in picks]
    p = [s.score for s in prm.score(cands)]
    q = [s.score for s in replay.score(cands)]
    by_app: dict[str, list[tuple[bool, bool]]] = {}
    for c, x, y in zip(cands, p, q):
        by_app.setdefault(c.state["app"], []).append((y >= positive, x >= positive))
    pairs = [pq for v in by_app.values() for pq in v]
    return {
        "positive": positive,
        "candidates": len(cands),
        "overall": agreement(pairs) | score_stats("prm", p) | score_stats("replay", q),
        "by_app": {a: agreement(v) for a, v in sorted(by_app.items())},
        "rows": [{"state": c.state["id"], "action": c.action, "prm": x, "replay": y} for c, x, y in zip(cands, p, q)],
    }


def add_calibrate_arguments(p) -> None:
    p.add_argument("--data", nargs="+", required=True, help="state datasets (`coda data states`, or collected here)")
    p.add_argument("--prm", required=True, help="the VLM PRM: a checkpoint directory or an http(s):// endpoint")
    p.add_argument("--prm-model", default=None, help="model name at the --prm endpoint")
    p.add_argument("--env", default="coda/KAlgebra-v0", help="the env whose tasks the states belong to (replays)")
    p.add_argument("--candidates", type=int, default=4, help="candidate actions per state")
    p.add_argument("--planner", default=None, help="sample the candidates from this planner (with --executor)")
    p.add_argument("--executor", default=None, help="a11y | UI-TARS directory | URL: the planner's executor")
    p.add_argument("--positive", type=float, default=0.5, help="a good step: score >= this")
    p.add_argument("--samples", type=int, default=1, help="PRM answers per candidate")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per PRM answer")
    p.add_argument("--fallback", type=float, default=0.0, help="the score of an unreadable PRM answer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the report (JSON) here")


def main_calibrate(args) -> int:
    from ..judge import _fmt

    if (args.planner is None) != (args.executor is None):
        raise ValueError("--planner and --executor go together (the planner's plans need the executor)")
    prm = VLMPRM(args.prm, args.samples, 0.0, args.max_new_tokens, args.fallback, args.prm_model)
    replay = ReplayScorer(args.env)
    try:
        planner = executor = None
        if args.planner:
            from ..policy import _load

            planner = _load(args.planner, None, {})
            executor = make_executor(CodaConfig(executor=args.executor), "", replay.screen)
        t0 = time.monotonic()
        report = calibrate(args.data, prm, replay, args.candidates, args.positive, planner, executor, args.seed)
        report["seconds"] = time.monotonic() - t0
    finally:
        replay.close()
    print(f"{'group':<16}{'n':>5}{'tp':>5}{'fp':>5}{'fn':>5}{'tn':>5}{'precision':>11}{'recall':>8}{'agree':>8}")
    for name, g in [*((f"app:{a}", g) for a, g in report["by_app"].items()), ("overall", report["overall"])]:
        print(
            f"{name:<16}{g['n']:>5}{g['tp']:>5}{g['fp']:>5}{g['fn']:>5}{g['tn']:>5}{_fmt(g['precision']):>11}"
            f"{_fmt(g['recall']):>8}{_fmt(g['agreement']):>8}"
        )
    o = report["overall"]
    print(
        f"PRM mean score {o.get('prm/score_mean', float('nan')):.3f}, replay mean score "
        f"{o.get('replay/score_mean', float('nan')):.3f}, {report['candidates']} candidates in {report['seconds']:.1f} s"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(f"report: {args.out}")
    return 0
