"""BEPA (Bi-level Expert-to-Policy Assimilation) on the episodic GRPO loop: the maths and the loop, top to bottom.

A few expert trajectories (each task's oracle solution, JSON files, successful `coda eval` episodes) become
guidance the policy can use, in two levels (arXiv 2601.05787; its code, "Verl_GUI", is unreleased):

LEVEL-1, self-rolled reachable trajectories. Each expert trajectory is re-rolled by the *base* policy in the real
env. At step k the policy is shown the expert's k-th action as a hint, appended to its own prompt:
    --agent coda:   "Hint: an expert's next step here: Click at (500, 751), then type '17*23', ..." and the
                    planner must write the step in words (its Thought/Action format); the fixed executor acts
    --agent uitars: "Hint: an expert's next action here: click(start_box='(197,247)')" in UI-TARS's grammar
The policy samples `level1_tries` answers under the hinted prompt; the first that reproduces the hinted action
(planner: the same terminal answer, or a step that names every literal of the action: its points, typed text
and keys; UI-TARS: the same env action, points within POINT_TOLERANCE px) is the step. When none does and
`level1_splice` is on, the step is the policy's own last thought with the expert's action written in the
policy's format ("format conversion"), its tokens scored by the policy. Either way a step's tokens are the
policy's tokenizer's and its behaviour log-probs b_t are the policy's under the hinted prompt, while the stored
conversation is the un-hinted one (what the policy sees in RLVR). Keep rule: a re-roll is kept only when the
task's checks pass at its end (`keep_rerolls`); the rest are dropped. Kept re-rolls seed the per-task cache.

LEVEL-2, the per-task cache in RLVR. Each iteration runs G on-policy episodes per task, as `coda train grpo`.
Mixing (`mix`): with "all-fail" (the default), a group whose G episodes all failed gets one cached trajectory
of its task (the newest) as an extra, off-policy member with its cached reward; "always" adds one to every
group whose task has a cached entry; "never" is plain GRPO (the cache still fills). Advantages are then
group-relative over the G+1 members as in grpo.py, so the cached success gets A > 0 and the failures A < 0.
Loss per token t of a sample with advantage A (n: new log-prob, o: rollout policy's, b: behaviour's):
    on-policy   ratio_t = exp(n_t - o_t),  L_t = -min(ratio_t A, clip(ratio_t, 1 - eps, 1 + eps) A)
    off-policy  w_t = clip(exp(n_t - b_t), F, C)  held constant (truncated importance sampling; C = --ratio-clip,
                F = --ratio-floor: a token of the expert's that failed answers share, pushed down by their negative
                advantages, keeps at least weight F instead of fading out),
                L_t = -w_t A exp(n_t - sg(n_t))      (value -w_t A; gradient -w_t A grad n_t)
    plus beta * k3-KL to the reference on every token, summed and divided by the batch's token count.
The cache update (`TaskCache.add`): every successful on-policy episode goes in front of its task's entries
(newest first) and the oldest beyond `cache_size` fall out, so the policy's own newer successes replace the
LEVEL-1 re-rolls. The cache is saved in OUT/checkpoint/bepa_cache.pt with each checkpoint and resumes with it.

Logged per iteration besides GRPO's: cache_hit_rate (all-fail groups that found a cached trajectory / all-fail
groups), off_policy_share (off-policy samples / trained samples), cache_entries, off_policy_weight (mean w_t),
and level1_keep_rate/<app> (kept re-rolls / re-rolls; also in OUT/level1.json with every re-roll's outcome).
"""

from __future__ import annotations

import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch

from coda_env.actions import Action, ActionError, parse_action

from ..models import Generation, SamplingParams, TransformersVLM, model_image_size
from ..planner import PlanParseError, parse_plan
from ..rollout import Rollout, collect_groups
from ..types import Sample
from ..uitars import UITarsParseError
from .common import (
    Method,
    RunLog,
    accumulate,
    agent_factory,
    export_planner,
    load_checkpoint,
    load_trainable,
    make_envs,
    opt,
    prepare_model,
    probe_env,
    reference_logprobs,
    save_checkpoint,
    token_logprobs,
    trainable_parameters,
    write_config,
)
from .grpo import GRPOConfig, group_advantages

MIX_RULES = ("all-fail", "always", "never")
_THOUGHT = re.compile(r"Thought:\s*(\S.*?)\s*(?:\nAction:|$)", re.DOTALL)  # a non-empty thought
POINT_TOLERANCE = 10  # screen pixels within which a UI-TARS point reproduces the expert's point


@dataclass
class BEPAConfig(GRPOConfig):
    out: str = opt(
        "runs/bepa",
        "run folder: config.json, metrics.jsonl, tb/, checkpoint/ (with the cache), level1/, level1.json, "
        "rollouts/, planner/",
    )
    experts: list[str] = opt(
        ["oracle"],
        "expert trajectories: `oracle` (each task's solution), JSON files or folders of them ({task, app, "
        "actions} or a list of such), `coda eval` run folders (their successful episodes); one that does not "
        "parse or belongs to another app is reported and skipped",
    )
    level1_rollouts: int = opt(1, "LEVEL-1 re-rolls of each expert trajectory under the base policy")
    level1_tries: int = opt(4, "LEVEL-1: answers sampled per step under the hint before falling back")
    level1_splice: bool = opt(
        True,
        "LEVEL-1: when no sampled answer reproduces the hinted action, the step is the policy's own thought "
        "with the expert's action written in its format (--no-level1-splice: its last sample, as sampled)",
    )
    cache_size: int = opt(2, "LEVEL-2: trajectories kept per task (newest first)")
    mix: str = opt(
        "all-fail",
        "LEVEL-2 mixing rule: all-fail (a cached trajectory joins a group only when all G on-policy episodes "
        "fail) | always (whenever the task has one) | never (plain GRPO; the cache still fills)",
    )
    ratio_clip: float = opt(
        2.0, "LEVEL-2: upper clip C of an off-policy member's per-token importance ratio pi_new / pi_behaviour"
    )
    ratio_floor: float = opt(
        0.5,
        "LEVEL-2: lower clip of that ratio (0: none); keeps the expert's tokens that the policy moved away "
        "from (a prefix shared with failed answers) from losing their weight",
    )


# ------------------------------------------------------------------------------------------ expert trajectories
@dataclass
class Expert:
    task: str
    app: str
    actions: list[str]
    source: str  # `oracle` or the file / run folder it came from


def _expert_records(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return data if isinstance(data, list) else [data]


def load_experts(specs: Sequence[str], app: str, tasks: dict, screen=(1280, 800)) -> tuple[list[Expert], list[dict]]:
    """Expert trajectories of `app`'s `tasks` from `specs` -> (experts, skipped). Skipped entries name the file
    and the reason (does not parse, another app, unknown task, an invalid action, a failed episode); nothing in
    a file is executed (actions are parsed by coda_env.actions)."""
    from coda_env.runs import RunError, read_jsonl, trajectory_dir

    experts: list[Expert] = []
    skipped: list[dict] = []

    def add(rec, source: str) -> None:
        if not isinstance(rec, dict) or not isinstance(rec.get("actions"), list) or not rec.get("task"):
            skipped.append({"file": source, "reason": "not an expert trajectory: needs task and actions (a list)"})
            return
        if rec.get("app", app) != app:
            skipped.append({"file": source, "reason": f"belongs to another app ({rec.get('app')!r}, not {app!r})"})
            return
        if rec["task"] not in tasks:
            skipped.append({"file": source, "reason": f"unknown task {rec['task']!r} for {app}"})
            return
        for i, a in enumerate(rec["actions"]):
            try:
                parse_action(a, screen)
            except (ActionError, TypeError) as e:
                skipped.append({"file": source, "reason": f"actions[{i}] is not a valid action: {e}"})
                return
        if not rec["actions"]:
            skipped.append({"file": source, "reason": "no actions"})
            return
        experts.append(Expert(rec["task"], app, list(rec["actions"]), source))

    for spec in specs:
        if spec == "oracle":
            for t in tasks.values():
                if t.solution:
                    add({"task": t.id, "app": t.app, "actions": list(t.solution)}, "oracle")
            continue
        path = Path(spec)
        if (path / "episodes.jsonl").exists():  # a `coda eval` run folder: its successful episodes
            for rec in read_jsonl(path / "episodes.jsonl"):
                where = f"{path}: {rec.get('task')} episode {rec.get('episode')}"
                if not rec.get("success"):
                    continue
                if rec.get("app") != app:
                    skipped.append({"file": where, "reason": f"belongs to another app ({rec.get('app')!r})"})
                    continue
                try:
                    steps = read_jsonl(trajectory_dir(path, rec["task"], rec["episode"]) / "steps.jsonl")
                except (RunError, ValueError, KeyError, OSError) as e:
                    skipped.append({"file": where, "reason": str(e)})
                    continue
                add({"task": rec["task"], "app": app, "actions": [s.get("action") for s in steps]}, where)
            continue
        files = sorted(path.glob("*.json")) if path.is_dir() else [path]
        for f in files:
            try:
                records = _expert_records(f)
            except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
                skipped.append({"file": str(f), "reason": f"does not parse: {e}"})
                continue
            for rec in records:
                add(rec, str(f))
    return experts, skipped


# ------------------------------------------------------------------------------------------ the hint, per format
def _pt(a: Action) -> str:
    return f"({a.x}, {a.y})"


def step_in_words(action: str, screen=(1280, 800)) -> str:
    """The expert's env action as the planner writes a step: a terminal answer as it is, GUI actions in words."""
    acts = parse_action(action, screen)
    if len(acts) == 1 and (acts[0].terminal or acts[0].kind == "wait"):
        return acts[0].to_pyautogui()
    words = []
    for a in acts:
        k = a.kind
        if k == "click":
            how = {1: "Click", 2: "Double-click", 3: "Triple-click"}.get(a.clicks, f"Click {a.clicks} times")
            words.append(f"{'Right-click' if a.button == 'right' else how} at {_pt(a)}")
        elif k == "type":
            words.append(f"type {a.text!r}")
        elif k in ("press", "hotkey", "key_down", "key_up"):
            words.append(f"press {'+'.join(a.keys)}")
        elif k in ("scroll", "hscroll"):
            way = ("up" if a.amount > 0 else "down") if k == "scroll" else ("right" if a.amount > 0 else "left")
            words.append(f"scroll {way}" + (f" at {_pt(a)}" if a.x is not None else ""))
        elif k == "move":
            words.append(f"move the pointer to {_pt(a)}")
        elif k == "drag":
            words.append(f"drag to {_pt(a)}")
        else:
            words.append(a.to_pyautogui())
    return ", then ".join(words)


def action_literals(action: str, screen=(1280, 800)) -> list[str]:
    """What a planner's step must name to reproduce `action`: its points, typed texts and keys."""
    out = []
    for a in parse_action(action, screen):
        if a.x is not None:
            out.append(f"{a.x}, {a.y}")
        if a.text:
            out.append(a.text)
        out += list(a.keys)
    return out


def uitars_text(action: str, image_size: tuple[int, int], screen=(1280, 800)) -> str | None:
    """The expert's env action in UI-TARS's grammar (points in the resized image's pixels), or None when the
    grammar cannot say it (UI-TARS has no ANS: finished() is DONE)."""
    iw, ih = image_size
    sw, sh = screen

    def box(a):
        return f"start_box='({round(a.x / sw * iw)},{round(a.y / sh * ih)})'"

    out = []
    for a in parse_action(action, screen):
        k = a.kind
        if k == "done":
            out.append("finished(content='')")
        elif k == "fail":
            out.append("call_user()")
        elif k == "wait":
            out.append("wait()")
        elif k == "click" and a.x is not None and a.clicks in (1, 2):
            fn = "right_single" if a.button == "right" else ("left_double" if a.clicks == 2 else "click")
            out.append(f"{fn}({box(a)})")
        elif k == "type":
            out.append(f"type(content={a.text!r})")
        elif k in ("press", "hotkey") and a.presses == 1:
            out.append(f"hotkey(key='{' '.join(a.keys)}')")
        else:
            return None
    return "\n\n".join(out)


def _same_actions(got: str, want: str, screen) -> bool:
    try:
        ga, wa = parse_action(got, screen), parse_action(want, screen)
    except ActionError:
        return False
    if len(ga) != len(wa):
        return False
    for g, w in zip(ga, wa):
        if replace(g, x=w.x, y=w.y) != w:
            return False
        if w.x is not None and (g.x is None or abs(g.x - w.x) > POINT_TOLERANCE or abs(g.y - w.y) > POINT_TOLERANCE):
            return False
    return True


@dataclass
class Hint:
    """One expert action as the trained policy must produce it: the hint text shown, the action written in
    the policy's format (`answer`, None when the format cannot say it) and the test of a sampled answer."""

    text: str
    answer: str | None
    role: str
    action: str
    screen: tuple[int, int]
    image_size: tuple[int, int]

    @classmethod
    def make(cls, role: str, action: str, screen, image_size) -> "Hint":
        if role == "planner":
            words = step_in_words(action, screen)
            return cls(f"Hint: an expert's next step here: {words}", words, role, action, screen, image_size)
        ut = uitars_text(action, image_size, screen)
        return cls(f"Hint: an expert's next action here: {ut or action}", ut, role, action, screen, image_size)

    def matches(self, text: str) -> bool:
        """Does the policy's sampled answer reproduce the hinted action (in its own format)?"""
        if self.role == "planner":
            try:
                plan = parse_plan(text)
            except PlanParseError:
                return False
            want = parse_action(self.action, self.screen)
            if want[0].terminal or want[0].kind == "wait":
                return plan.terminal is not None and _same_actions(plan.terminal, self.action, self.screen)
            return plan.terminal is None and all(lit in plan.action for lit in action_literals(self.action))
        from ..executor import uitars_action

        try:
            got = uitars_action(text, self.image_size, self.screen)
        except UITarsParseError:
            return False
        return _same_actions(got, self.action, self.screen)

    def splice(self, texts: Sequence[str]) -> str | None:
        """The policy's own thought (from the first of its sampled answers that has one) with the expert's
        action in its format (None: the format cannot say it)."""
        if self.answer is None:
            return None
        thought = next((m.group(1).strip() for t in texts if (m := _THOUGHT.search(t or ""))), "")
        return f"Thought: {thought or 'I follow the next step.'}\nAction: {self.answer}"


def with_hint(conv: list, hint: str) -> list:
    """A copy of `conv` whose last user turn ends with the hint text (images shared, not copied)."""
    conv = [dict(m) for m in conv]
    k = max(i for i, m in enumerate(conv) if m["role"] == "user")
    content = conv[k]["content"]
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    conv[k]["content"] = parts + [{"type": "text", "text": hint}]
    return conv


def _current_image(conv: list):
    for m in reversed(conv):
        if m["role"] == "user" and not isinstance(m["content"], str):
            for p in reversed(m["content"]):
                if p["type"] == "image":
                    return p["image"]
    return None


class HintedModel:
    """The trained VLM during LEVEL-1, as the agent's planner (coda) or acting model (uitars). Each conversation
    is answered under its slot's hint (found by the current screenshot, the object the agent put in it), with
    up to `tries` samples, else spliced; the returned Generation carries the policy's tokens and its
    behaviour log-probs under the hinted prompt, and the agent keeps the un-hinted conversation in its Sample.
    Everything else (name, pixel limits, tokenizer) is the wrapped model's."""

    def __init__(self, vlm: TransformersVLM, tries: int, splice: bool, temperature: float):
        self.vlm, self.tries, self.do_splice, self.temperature = vlm, tries, splice, temperature
        self.hints: dict[int, Hint | None] = {}  # id(current screenshot) -> hint
        self.stats = {"matched": 0, "spliced": 0, "unmatched": 0}

    def __getattr__(self, name):
        return getattr(self.vlm, name)

    def generate(self, conversations, params: SamplingParams) -> list[Generation]:
        out = []
        for conv in conversations:
            hint = self.hints.get(id(_current_image(conv)))
            if hint is None:  # past the expert's end: the policy acts on its own
                out += self.vlm.generate([conv], params)
                continue
            hinted = with_hint(conv, hint.text)
            gens = self.vlm.generate([hinted] * max(1, self.tries), params)
            got = next((g for g in gens if hint.matches(g.text)), None)
            if got is not None:
                self.stats["matched"] += 1
                out.append(got)
                continue
            texts = [g.text for g in gens]
            if self.do_splice and not any(_THOUGHT.search(t or "") for t in texts):
                texts += [g.text for g in self.vlm.generate([conv], params)]  # its thought without the hint
            text = hint.splice(texts) if self.do_splice else None
            if text is None:
                self.stats["unmatched"] += 1
                out.append(gens[-1])
                continue
            self.stats["spliced"] += 1
            out.append(self._scored(hinted, text))
        return out

    def _scored(self, hinted, text: str) -> Generation:
        tok = self.vlm.tokenizer
        eos = self.vlm.model.generation_config.eos_token_id
        eos = eos[0] if isinstance(eos, (list, tuple)) else eos
        ids = tok(text, add_special_tokens=False)["input_ids"] + [eos]
        with torch.no_grad():
            lp, m = token_logprobs(self.vlm, [Sample("planner", hinted, ids)], self.temperature)
        return Generation(text, ids, [float(x) for x in lp[0][m[0]]])


class HintAgent:
    """Wraps the trained agent for LEVEL-1: at each step of an episode it sets the hint of the expert action
    the re-roll is at (the episode's expert picked at reset, in queue order per task)."""

    def __init__(self, agent, model: HintedModel, experts: dict[str, list[Expert]], role: str, screen):
        self.agent, self.model, self.role, self.screen = agent, model, role, screen
        self.todo = {t: list(v) for t, v in experts.items()}
        self.current: dict[int, tuple[Expert, int]] = {}
        self.image_size = model_image_size(model, screen)
        self.name = f"bepa-level1({agent.name})"

    @property
    def wants_a11y_tree(self) -> bool:
        return bool(getattr(self.agent, "wants_a11y_tree", False))

    def reset(self, slot: int, task) -> None:
        self.current[slot] = (self.todo[task.id].pop(0), 0)
        self.agent.reset(slot, task)

    def act(self, batch):
        self.model.hints = {}
        for slot, obs in batch:
            ex, k = self.current[slot]
            hint = Hint.make(self.role, ex.actions[k], self.screen, self.image_size) if k < len(ex.actions) else None
            self.model.hints[id(obs["screenshot"])] = hint
            self.current[slot] = (ex, k + 1)
        return self.agent.act(batch)


def keep_rerolls(rollouts: Sequence[Rollout]) -> tuple[list[Rollout], dict[str, float]]:
    """LEVEL-1's keep rule: only re-rolls the task's checks passed are kept. Returns (kept, keep rate per app)."""
    kept = [r for r in rollouts if r.success]
    rates: dict[str, list[int]] = {}
    for r in rollouts:
        rates.setdefault(r.app, []).append(int(r.success))
    return kept, {a: sum(v) / len(v) for a, v in rates.items()}


# ------------------------------------------------------------------------------------------ the cache
@dataclass
class CachedTrajectory:
    task: str
    samples: list[Sample]  # the trained role's calls: un-hinted conversation, tokens, behaviour log-probs
    reward: float
    source: str  # "level1" | "policy"
    iteration: int  # -1: LEVEL-1


@dataclass
class TaskCache:
    """Per task, at most `size` successful trajectories, newest first."""

    size: int
    entries: dict[str, list[CachedTrajectory]] = field(default_factory=dict)

    def add(self, traj: CachedTrajectory) -> None:
        """A newer success goes in front; the oldest beyond `size` fall out."""
        self.entries[traj.task] = ([traj] + self.entries.get(traj.task, []))[: self.size]

    def pick(self, task: str) -> CachedTrajectory | None:
        got = self.entries.get(task)
        return got[0] if got else None

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())

    def save(self, path: Path, step: int) -> None:
        """Plain data (dicts, lists, arrays), written to a temporary file and renamed."""
        tmp = path.with_suffix(".tmp")
        entries = {t: [asdict(x) for x in v] for t, v in self.entries.items()}
        torch.save({"step": step, "size": self.size, "entries": entries}, tmp)
        tmp.rename(path)

    @classmethod
    def load(cls, path: Path, size: int) -> "TaskCache":
        state = torch.load(path, weights_only=False)
        cache = cls(size)
        for task, trajs in state["entries"].items():
            for t in reversed(trajs):  # oldest first, so the newest ends in front
                cache.add(CachedTrajectory(**{**t, "samples": [Sample(**s) for s in t["samples"]]}))
        return cache


def from_rollout(r: Rollout, role: str, source: str, iteration: int) -> CachedTrajectory:
    samples = [replace(s, group=None) for s in r.samples if s.role == role]
    return CachedTrajectory(r.task, samples, r.reward, source, iteration)


def mix_groups(
    rollouts: Sequence[Rollout], cache: TaskCache, rule: str
) -> tuple[list[Rollout], list[bool], dict[str, float]]:
    """The on-policy rollouts plus, per group, at most one cached trajectory by `rule` -> (rollouts, off-policy
    flags, stats: all_fail_groups, cache_hits, cache_hit_rate, off_policy_members)."""
    if rule not in MIX_RULES:
        raise ValueError(f"--mix must be one of {', '.join(MIX_RULES)}, not {rule!r}")
    groups: dict[str, list[Rollout]] = {}
    for r in rollouts:
        groups.setdefault(r.group, []).append(r)
    out, off = list(rollouts), [False] * len(rollouts)
    all_fail = hits = 0
    for key, members in groups.items():
        failed = not any(r.success for r in members)
        all_fail += failed
        cached = cache.pick(members[0].task)
        if cached is not None and failed:
            hits += 1
        if cached is None or rule == "never" or (rule == "all-fail" and not failed):
            continue
        samples = [replace(s, group=key, reward=cached.reward) for s in cached.samples]
        out.append(
            Rollout(
                cached.task,
                members[0].app,
                key,
                samples,
                reward=cached.reward,
                success=True,
                info={"off_policy": cached.source},
            )
        )
        off.append(True)
    stats = {
        "all_fail_groups": all_fail,
        "cache_hits": hits,
        "cache_hit_rate": hits / all_fail if all_fail else 0.0,
        "off_policy_members": sum(off),
    }
    return out, off, stats


# ------------------------------------------------------------------------------------------ the maths
def clipped_weight(
    new_lp: torch.Tensor, behaviour_lp: torch.Tensor, ratio_clip: float, ratio_floor: float = 0.0
) -> torch.Tensor:
    """Per-token importance ratio pi_new / pi_behaviour, clipped to [floor, C] and held constant (no gradient)."""
    return torch.clamp(torch.exp(new_lp.detach() - behaviour_lp), min=ratio_floor, max=ratio_clip)


def bepa_loss(
    new_lp: torch.Tensor,
    old_lp: torch.Tensor,
    behaviour_lp: torch.Tensor,
    off: torch.Tensor,
    ref_lp: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    ratio_clip: float,
    kl_coef: float,
    n_tokens: int,
    ratio_floor: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """Per-token log-probs [B, T], off-policy flags [B], advantages [B] -> (loss, stats): GRPO's clipped
    objective on on-policy rows, truncated importance sampling on off-policy rows (see the module's text)."""
    mask = mask.float()
    a = adv.unsqueeze(1)
    ratio = torch.exp(new_lp - old_lp)
    on_tok = -torch.min(ratio * a, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    w = clipped_weight(new_lp, behaviour_lp, ratio_clip, ratio_floor)
    off_tok = -w * a * torch.exp(new_lp - new_lp.detach())
    offm = off.unsqueeze(1).expand_as(new_lp)
    per_token = torch.where(offm, off_tok, on_tok)
    kl = torch.zeros_like(new_lp)
    if ref_lp is not None and kl_coef > 0:
        d = ref_lp - new_lp
        kl = torch.exp(d) - d - 1
        per_token = per_token + kl_coef * kl
    loss = (per_token * mask).sum() / n_tokens
    with torch.no_grad():
        on_mask, off_mask = mask * (~offm).float(), mask * offm.float()
        stats = {
            "clipped_tokens": float((((ratio - 1).abs() > clip_eps).float() * on_mask).sum()),
            "kl_sum": float((kl * mask).sum()),
            "tokens": float(mask.sum()),
            "on_tokens": float(on_mask.sum()),
            "off_tokens": float(off_mask.sum()),
            "off_weight_sum": float((w * off_mask).sum()),
            "off_clipped_tokens": float(((w >= ratio_clip).float() * off_mask).sum()),
        }
    return loss, stats


# ------------------------------------------------------------------------------------------ one update
def train_batch(
    cfg: BEPAConfig,
    vlm: TransformersVLM,
    optimizer,
    rollouts: Sequence[Rollout],
    off_flags: Sequence[bool],
    ref_model=None,
    role: str = "planner",
) -> dict:
    """One BEPA update from on-policy rollouts and their off-policy members, grouped by the rollouts' keys."""
    model = vlm.model
    adv = group_advantages(torch.tensor([r.reward for r in rollouts]), [r.group for r in rollouts], cfg.adv_eps)
    items = [(s, float(a), o) for r, a, o in zip(rollouts, adv, off_flags) for s in r.samples if s.role == role]
    if cfg.kl_coef == 0:
        items = [x for x in items if x[1] != 0]
    stats = {
        "loss": 0.0,
        "kl": 0.0,
        "clip_frac": 0.0,
        "planner_tokens": 0,
        "logprob_mismatch": 0.0,
        "samples": len(items),
        "off_policy_samples": sum(o for _, _, o in items),
        "off_policy_share": sum(o for _, _, o in items) / len(items) if items else 0.0,
        "off_policy_weight": 0.0,
        "off_policy_clip_frac": 0.0,
        "grad_norm": 0.0,
    }
    if not items:
        return stats
    chunks = [items[i : i + cfg.micro_batch] for i in range(0, len(items), cfg.micro_batch)]
    n_tokens = sum(len(s.token_ids) for s, _, _ in items)
    old, beh, ref = [], [], []
    model.eval()
    with torch.no_grad():
        for ch in chunks:
            samples = [s for s, _, _ in ch]
            lp, m = token_logprobs(vlm, samples, cfg.temperature)
            old.append(lp)
            b = lp.clone()  # behaviour log-probs of off-policy rows, right-aligned like the completions
            for row, (s, _, o) in enumerate(ch):
                if o and s.logprobs:
                    n = min(len(s.logprobs), lp.shape[1])
                    b[row, lp.shape[1] - n :] = torch.tensor(s.logprobs[-n:], dtype=lp.dtype, device=lp.device)
                elif not o and s.logprobs:
                    got = lp[row][m[row]][: len(s.logprobs)]
                    want = torch.tensor(s.logprobs[: len(got)], dtype=got.dtype, device=got.device)
                    stats["logprob_mismatch"] = max(stats["logprob_mismatch"], float((got - want).abs().max()))
            beh.append(b.masked_fill(~m, 0.0))
            if cfg.kl_coef > 0:
                ref.append(reference_logprobs(vlm, samples, cfg.temperature, ref_model))

    def loss_fn(k, ch):
        lp, m = token_logprobs(vlm, [s for s, _, _ in ch], cfg.temperature)
        a = torch.tensor([x for _, x, _ in ch], device=lp.device)
        o = torch.tensor([x for _, _, x in ch], dtype=torch.bool, device=lp.device)
        return bepa_loss(
            lp,
            old[k],
            beh[k],
            o,
            ref[k] if ref else None,
            a,
            m,
            cfg.clip_eps,
            cfg.ratio_clip,
            cfg.kl_coef,
            n_tokens,
            cfg.ratio_floor,
        )

    model.train()
    params = trainable_parameters(model)
    for _ in range(cfg.epochs):
        loss_sum, grad_norm, totals = accumulate(optimizer, params, chunks, cfg.max_grad_norm, loss_fn)
    model.eval()
    stats.update(
        loss=loss_sum,
        kl=totals["kl_sum"] / max(1, totals["tokens"]),
        clip_frac=totals["clipped_tokens"] / max(1, totals["on_tokens"]),
        off_policy_weight=totals["off_weight_sum"] / max(1, totals["off_tokens"]),
        off_policy_clip_frac=totals["off_clipped_tokens"] / max(1, totals["off_tokens"]),
        planner_tokens=n_tokens,
        grad_norm=grad_norm,
    )
    return stats


# ------------------------------------------------------------------------------------------ LEVEL-1
def level1(cfg: BEPAConfig, vlm, env, executor_vlm, experts: Sequence[Expert], out: Path) -> tuple[TaskCache, dict]:
    """Re-roll every expert trajectory `level1_rollouts` times under the base policy with hints; the kept
    re-rolls seed the cache. Trajectories are written as they happen under OUT/level1; OUT/level1.json lists
    every re-roll's outcome. Returns (cache, stats with keep rates per app and env steps)."""
    factory, role = agent_factory(cfg.agent)
    cache = TaskCache(cfg.cache_size)
    stats: dict = {"rerolls": 0, "kept": 0, "env_steps": 0, "keep_rate": {}}
    if not experts:
        return cache, stats
    model = HintedModel(vlm, cfg.level1_tries, cfg.level1_splice, cfg.temperature)
    by_task: dict[str, list[Expert]] = {}
    for ex in experts:
        by_task.setdefault(ex.task, []).extend([ex] * cfg.level1_rollouts)
    order = [ex.task for ex in experts]
    agent = HintAgent(factory(cfg, model, env, executor_vlm), model, by_task, role, env.screen)
    envs = make_envs(env, max(1, min(cfg.num_envs, len(order) * cfg.level1_rollouts)), agent)
    vlm.model.eval()
    try:
        rollouts = collect_groups(
            envs, agent, env.tasks, order, cfg.level1_rollouts, seed=cfg.seed, out=out / "level1", group_key=_l1_key
        )
    finally:
        envs.close()
    kept, rates = keep_rerolls(rollouts)
    for r in reversed(kept):  # the first expert ends in front
        cache.add(from_rollout(r, role, "level1", -1))
    report = [
        {"task": r.task, "source": ex.source, "success": r.success, "steps": len(r.steps)}
        for r, ex in zip(rollouts, [e for e in experts for _ in range(cfg.level1_rollouts)])
    ]
    (out / "level1.json").write_text(
        json.dumps({"keep_rate": rates, "hints": model.stats, "rerolls": report}, indent=1)
    )
    stats.update(
        rerolls=len(rollouts),
        kept=len(kept),
        env_steps=sum(len(r.steps) for r in rollouts),
        keep_rate=rates,
        **{f"hints_{k}": v for k, v in model.stats.items()},
    )
    return cache, stats


def _l1_key(task_id: str, index: int) -> str:
    return f"level1:{task_id}#{index}"


# ------------------------------------------------------------------------------------------ the loop
CACHE_FILE = "bepa_cache.pt"


def train(
    cfg: BEPAConfig, planner_vlm: TransformersVLM | None = None, executor_vlm=None, progress: bool = True
) -> list[dict]:
    """LEVEL-1 (once; skipped on resume when the checkpoint holds the cache), then GRPO iterations with the
    LEVEL-2 cache. One record per iteration (out/metrics.jsonl, TensorBoard under out/tb); rollouts under
    out/rollouts/iter_NNNN; the trained model in out/planner (out/policy for uitars)."""
    if cfg.mix not in MIX_RULES:
        raise ValueError(f"--mix must be one of {', '.join(MIX_RULES)}, not {cfg.mix!r}")
    if cfg.cache_size < 1 or cfg.ratio_clip <= 0 or not 0 <= cfg.ratio_floor <= cfg.ratio_clip:
        raise ValueError("--cache-size must be >= 1, --ratio-clip > 0 and 0 <= --ratio-floor <= --ratio-clip")
    out = Path(cfg.out)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    vlm = planner_vlm or load_trainable(cfg.planner, cfg.device)
    if not isinstance(vlm, TransformersVLM):
        raise ValueError("BEPA trains the model's weights: --planner must be a local checkpoint directory")
    factory, role = agent_factory(cfg.agent)
    env = probe_env(cfg.env, cfg.max_steps)
    ids = list(cfg.tasks or env.tasks)
    unknown = [t for t in ids if t not in env.tasks]
    if unknown:
        raise ValueError(f"unknown tasks for {cfg.env}: {unknown}")
    agent = factory(cfg, vlm, env, executor_vlm)
    write_config(out, cfg)
    experts, skipped = load_experts(cfg.experts, env.app, {t: env.tasks[t] for t in ids}, env.screen)
    for s in skipped:
        print(f"bepa: skipped expert trajectory {s['file']}: {s['reason']}", file=sys.stderr)
    optimizer, ref_model = prepare_model(
        vlm, cfg.lr, cfg.lora_r, cfg.lora_alpha, cfg.lora_targets, frozen_reference=cfg.kl_coef > 0
    )
    start = load_checkpoint(out, vlm.model, optimizer, rng) if cfg.resume else 0
    cache_path = out / "checkpoint" / CACHE_FILE
    l1: dict = {"keep_rate": {}, "env_steps": 0}
    if start > 0 and cache_path.exists():
        cache = TaskCache.load(cache_path, cfg.cache_size)
        l1.update(json.loads((out / "level1.json").read_text()) if (out / "level1.json").exists() else {})
    else:  # LEVEL-1 runs under the base policy, before any update
        cache, l1 = level1(cfg, vlm, env, executor_vlm, experts, out)
    keep = {f"level1_keep_rate/{a}": v for a, v in l1.get("keep_rate", {}).items()}

    history: list[dict] = []
    envs = make_envs(env, min(cfg.num_envs, cfg.group_size * cfg.tasks_per_iteration), agent)
    log = RunLog(out, cfg.iterations, start, progress, unit="it")
    try:
        for it in range(start, cfg.iterations):
            batch = rng.sample(ids, min(cfg.tasks_per_iteration, len(ids)))
            t0 = time.monotonic()
            vlm.model.eval()
            rollouts = collect_groups(
                envs,
                agent,
                env.tasks,
                batch,
                cfg.group_size,
                seed=cfg.seed + it,
                out=out / "rollouts" / f"iter_{it:04d}",
            )
            t_roll = time.monotonic() - t0
            mixed, off, mix_stats = mix_groups(rollouts, cache, cfg.mix)
            for r in rollouts:  # the policy's own newer successes replace cache entries (after mixing)
                if r.success:
                    cache.add(from_rollout(r, role, "policy", it))
            t1 = time.monotonic()
            stats = train_batch(cfg, vlm, optimizer, mixed, off, ref_model, role)
            t_train = time.monotonic() - t1
            env_steps = sum(len(r.steps) for r in rollouts)
            gen_tokens = sum(len(s.token_ids) for r in rollouts for s in r.samples if s.role == role)
            by_app: dict[str, list[float]] = {}
            for r in rollouts:
                by_app.setdefault(r.app, []).append(r.reward)
            rec = {
                "iteration": it,
                "reward_mean": float(sum(r.reward for r in rollouts) / len(rollouts)),
                "success_rate": sum(r.success for r in rollouts) / len(rollouts),
                **{f"reward_mean/{a}": sum(v) / len(v) for a, v in by_app.items()},
                "env_steps": env_steps,
                "level1_env_steps": l1.get("env_steps", 0),
                "env_steps_per_s": env_steps / t_roll,
                "planner_tokens_per_s": gen_tokens / t_roll,
                "train_tokens_per_s": stats["planner_tokens"] / t_train if t_train > 0 else 0.0,
                "rollout_s": t_roll,
                "train_s": t_train,
                "cache_entries": len(cache),
                **mix_stats,
                **keep,
                **stats,
            }
            history.append(rec)
            if (it + 1) % cfg.save_every == 0 or it + 1 == cfg.iterations:
                save_checkpoint(out, cfg, vlm.model, optimizer, it, rng)
                cache.save(cache_path, it)
            log.log(
                it,
                rec,
                f"reward {rec['reward_mean']:.2f} cache hit {mix_stats['cache_hit_rate']:.2f} "
                f"off {stats['off_policy_share']:.2f}",
            )
        if start < cfg.iterations:
            export_planner(vlm, out / role)
    finally:
        log.close()
        envs.close()
    return history


def summary(cfg: BEPAConfig, history: list[dict]) -> str:
    lines = [
        f"iteration {h['iteration']}: reward {h['reward_mean']:.3f} success {h['success_rate']:.3f} "
        f"cache hit {h['cache_hit_rate']:.2f} off-policy {h['off_policy_share']:.2f} "
        f"(weight {h['off_policy_weight']:.2f}) cache {h['cache_entries']} kl {h['kl']:.4f}"
        for h in history
    ]
    if history:
        rates = [f"{k.split('/', 1)[1]} {v:.2f}" for k, v in history[0].items() if k.startswith("level1_keep")]
        lines.append("LEVEL-1 keep rate: " + (", ".join(rates) or "no expert trajectory"))
    role = agent_factory(cfg.agent)[1]
    lines.append(f"trained model: {Path(cfg.out) / role}")
    return "\n".join(lines)


METHOD = Method(
    "bepa",
    "BEPA: episodic GRPO with expert trajectories re-rolled by the policy (LEVEL-1) and a per-task cache "
    "mixed into all-fail groups (LEVEL-2)",
    BEPAConfig,
    lambda cfg, progress: train(cfg, progress=progress),
    summary,
)

__all__ = [
    "BEPAConfig",
    "CachedTrajectory",
    "Expert",
    "Hint",
    "HintedModel",
    "TaskCache",
    "bepa_loss",
    "clipped_weight",
    "keep_rerolls",
    "level1",
    "load_experts",
    "mix_groups",
    "train",
    "train_batch",
]
