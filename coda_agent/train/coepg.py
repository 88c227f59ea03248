"""Co-EPG (arXiv 2511.10705): planner and grounding model that improve each other, on the step-level core.

The planner writes the next step in words (the `coda` planner's Thought/Action answer, so `coda eval --agent
coda --planner OUT/planner` runs it); a grounding model maps (screenshot, plan) to a point. The planner is trained
with GRPO (TRL's GRPOTrainer through coda.build_trainer: the same prompts, checkpoints, logging and export as
`coda train coda`) under the C-DREM reward, and the grounding model by SFT (TRL's SFTTrainer) on the planner's
successful plans. The maths:

    step data     each state's labelled action a_T gives its type t_T, its value v_T (typed text, keys, scroll
                  direction, answer; "" for a pointer step) and its target: the element's box, or the disc of
                  `radius` around its point where there is no box (`step_data`).
    the gate      the plan's own type and value (`plan_step`: the plan's words read with the a11y executor's verb
                  grammar, e.g. "Type 'sin(x)' and press enter" -> ("type", "sin(x)")) must match: type exactly,
                  value by token F1 > 0.5 (`token_f1`; two empty values match). Otherwise r = 0.
    C-DREM        verifiers j each ground the plan: a point p_j and the mean log-likelihood l_j of the tokens that
                  spell p_j's coordinates; c_j = exp(l_j) in (0, 1] (the geometric-mean token probability);
                  w = softmax_j(sigma_j * c_j) with static priors sigma_j (1 : 1 : 2, the own model highest);
                  r = sum_j w_j * 1[p_j inside the target] (edges included). No point: w_j = 0; no log-probs (an
                  endpoint without them, the a11y verifier): c_j = 1, its prior alone (`cdrem_weights`). A step
                  with no pointer (a key, a typed text, DONE, ANS) needs no grounding: r = 1 when the gate passes.
    GRPO          A_i = (r_i - mean) / std over the G plans of a state; the paper's G = 7, lr 5e-7, temperature
                  0.9, beta 0.01, eps 0.2 are the defaults; the SFTs' lr 1e-6 and 3 epochs too.
    the iteration round k (`run_rounds`): D_k from the planner pool Pi and the verifier pool Phi (plans the
                  verifiers ground inside the target); SFT of the planner and of the grounding model on D_k;
                  GRPO of the planner under C-DREM; SFT of the grounding model on the optimised planner's
                  verified plans; pi_k' joins Pi and phi_k joins Phi (the two newest own generations kept); D_{k+1}
                  regenerated. K rounds (the paper: 3); OUT/round_NN/, a rerun resumes at the first unfinished one.

Pools: planners are checkpoints or OpenAI-compatible endpoints (--planners, beside the own planner); verifiers
are local checkpoints (`transformers`, UI-TARS-style: its computer-use prompt, the screenshot, and an answer that
starts `Thought: <plan>\nAction:`), endpoints (whose log-probs give l_j: vLLM and SGLang with `logprobs: true`),
or `a11y` (the accessibility tree grounds the plan; no model).

    coda train co-epg --data STATES --planner P --grounder G [--grounders U ...] --out OUT [--rounds K]
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, Sequence

from ..steps import POINTER_TYPES, canonical_steps
from .common import Method, opt
from .steplevel import (
    ImageTextProcessor,
    Rounds,
    RunLogCallback,
    StepLevelConfig,
    build_trainer,
    checkpointing_field,
    completion_rows,
    export_planner,
    live_eval,
    load_states,
    make_executor,
    oracle_state_paths,
    resolve_app,
    run_trainer,
    success_rate,
    trl_messages,
    world_size,
)

__all__ = [
    "CDREMReward",
    "CoEPGConfig",
    "EndpointGrounder",
    "Grounding",
    "TransformersGrounder",
    "cdrem_weights",
    "gate",
    "inside",
    "plan_step",
    "step_data",
    "target_step",
    "token_f1",
]

# ------------------------------------------------------------------------------------------ settings


@dataclass
class CoEPGConfig(StepLevelConfig):
    """`coda train co-epg`: the step-level settings with the paper's GRPO values, plus the pools and the SFT."""

    out: str = opt(
        "runs/co-epg",
        "run folder: config.json, metrics.jsonl, round_NN/{data,planner_sft,grounder_sft,train,grounder_grpo_sft}",
    )
    grounder: str = opt(
        "",
        "the own grounding model phi (a UI-TARS-style checkpoint directory): fine-tuned by SFT each round, its "
        "newest generation in the verifier pool with the highest prior",
    )
    grounders: list[str] = opt(
        [],
        "the fixed verifiers of the pool Phi: checkpoint directories, http(s):// endpoints, or a11y (the "
        "accessibility tree grounds the plan; no model, no log-probs)",
    )
    grounder_priors: list[float] = opt([], "static priors sigma of --grounders, one each (default: 1 each)")
    grounder_models: list[str] = opt([], "model names at the --grounders endpoints (default: what each serves)")
    own_prior: float = opt(2.0, "prior sigma of the newest own grounding model (the paper's 1:1:2)")
    previous_prior: float = opt(1.0, "prior sigma of the previous generation of the own grounding model")
    grounder_max_new_tokens: int = opt(48, "tokens per grounding answer (greedy)")
    planners: list[str] = opt(
        [], "the fixed planners of the pool Pi that write D_k beside the own planner: checkpoints or endpoints"
    )
    executor: str = opt(
        "", "the executor of the live runs (--episodes > 0 with --env): default the newest own grounding model"
    )
    # the paper's GRPO values
    group_size: int = opt(7, "plans sampled per state: the GRPO group G (the paper's 7)")
    states_per_step: int = opt(4, "states per optimizer step, over all processes (each gives G plans)")
    micro_batch: int = opt(7, "completions per forward pass per device (states-per-step x G must divide by it)")
    lr: float = opt(5e-7, "AdamW learning rate of the planner's GRPO (the paper's 5e-7)")
    temperature: float = opt(0.9, "planner sampling temperature (the paper's 0.9)")
    kl_coef: float = opt(0.01, "KL penalty to the reference planner (beta; the paper's 0.01)", "--beta")
    clip_eps: float = opt(0.2, "PPO clip range of the ratio (epsilon; the paper's 0.2)")
    # the iteration
    rounds: int = opt(
        0, "Co-EPG iterations K (D_k -> SFT -> GRPO -> grounder SFT -> pools); 0: one GRPO run on --data (paper: 3)"
    )
    oracle_states: bool = opt(True, "with --env: the states of D_k are the tasks' oracle replays (plus any --data)")
    episodes: int = opt(0, "live episodes per task after each round (needs --env; 0: no live runs)")
    pool_size: int = opt(2, "own generations kept in each pool (the paper keeps the two newest)")
    sft_plans: int = opt(4, "plans each pooled planner samples per state when D_k is generated")
    sft_min_reward: float = opt(0.5, "C-DREM reward over the verifier pool a plan needs to be verified (join D_k)")
    sft_lr: float = opt(1e-6, "AdamW learning rate of both SFTs (the paper's 1e-6)")
    sft_epochs: float = opt(3.0, "passes of each SFT over its data (the paper's 3)")
    sft_micro_batch: int = opt(4, "examples per forward pass of the SFTs")
    sft_lora_r: int = opt(0, "LoRA rank of the SFTs (0: every weight)")
    planner_sft: bool = opt(True, "SFT of the planner on D_k each round (--no-planner-sft: GRPO alone, an ablation)")


# ------------------------------------------------------------------------------------------ step data
_TOKEN = re.compile(r"\w+|[^\w\s]")


def token_f1(a: str, b: str) -> float:
    """Bag-of-tokens F1 of two values (case-folded words and single punctuation marks, so `sin(x)` is 4
    tokens); 1.0 when both are empty, 0.0 when only one is."""
    x, y = _TOKEN.findall(a.casefold()), _TOKEN.findall(b.casefold())
    if not x and not y:
        return 1.0
    common = sum((Counter(x) & Counter(y)).values())
    if common == 0:
        return 0.0
    p, r = common / len(x), common / len(y)
    return 2 * p * r / (p + r)


def _value(step) -> str:
    if step.type in ("type", "answer"):
        return step.text
    if step.type in ("key", "key_down", "key_up"):
        return " ".join(sorted(step.keys))
    if step.type == "scroll":
        return ("up" if step.amount > 0 else "down") if step.axis == "v" else ("left" if step.amount > 0 else "right")
    return ""


def target_step(target: str, screen: Sequence[int] = (1280, 800)) -> tuple[str, str, list[int]]:
    """A labelled action -> (its type, its value, the point of its first pointer step or []): what the gate and
    the grounding need. Values of several steps are joined by a space."""
    steps = canonical_steps(target, (int(screen[0]), int(screen[1])))
    kind = "+".join(s.type for s in steps)
    value = " ".join(v for v in (_value(s) for s in steps) if v)
    first = next((s for s in steps if s.type in POINTER_TYPES), None)
    point = []
    if first is not None:
        p = first.start if first.type == "drag" and first.start is not None else first.point
        point = list(p) if p is not None else []
    return kind, value, point


def step_data(ds):
    """A state dataset with the columns C-DREM needs beside its `box` and `radius`: `action_type`, `value` and
    `point` (the target's first pointer point, [] for none), derived from each state's labelled `target`.
    Added as columns (no screenshot is decoded or rewritten)."""
    if "action_type" in ds.column_names:
        return ds
    rows = ds.select_columns(["target", "screen"])
    found = [target_step(r["target"], r["screen"]) for r in rows]
    ds = ds.add_column("action_type", [f[0] for f in found])
    ds = ds.add_column("value", [f[1] for f in found])
    return ds.add_column("point", [f[2] for f in found])


def plan_step(text: str) -> tuple[str, str] | None:
    """The action type and value a planner's answer states, read from its words with the a11y executor's verb
    grammar (the same sentences it can act on; the last sentence that reads as a step wins): click / double-click /
    right-click / hover -> click, double_click, right_click, move with value ""; type 'x' -> ("type", "x");
    press ctrl+a -> ("key", "a ctrl"); scroll down -> ("scroll", "down"); drag -> ("drag", ""); DONE / FAIL /
    WAIT -> ("done"|"fail"|"wait", ""); ANS x -> ("answer", "x"). None when the answer does not parse or
    states no step."""
    from ..a11y_executor import step_kind
    from ..planner import PlanParseError, parse_plan

    try:
        plan = parse_plan(text)
    except PlanParseError:
        return None
    if plan.terminal:
        word, _, rest = plan.terminal.partition(" ")
        return ("answer", rest.strip()) if word == "ANS" else (word.lower(), "")
    return step_kind(plan.action)


def gate(plan: tuple[str, str] | None, action_type: str, value: str) -> bool:
    """The plan passes when its type equals the target's exactly and its value's token F1 exceeds 0.5."""
    return plan is not None and plan[0] == action_type and token_f1(plan[1], value) > 0.5


def inside(
    point: Sequence[int] | None,
    box: Sequence[int] | None,
    target: Sequence[int] | None = None,
    radius: float = 0.0,
) -> bool:
    """Whether a predicted point hits the target: inside `box` (left, top, right, bottom; edges included), or,
    with no box, within `radius` of the target's point (its disc, edge included)."""
    if point is None:
        return False
    x, y = point
    if box is not None and len(box) == 4:
        return box[0] <= x <= box[2] and box[1] <= y <= box[3]
    if target is not None and len(target) == 2:
        return math.dist((x, y), target) <= radius
    return False


# ------------------------------------------------------------------------------------------ C-DREM
def cdrem_weights(logliks: Sequence[float | None], priors: Sequence[float]) -> list[float]:
    """C-DREM's weights w = softmax_j(sigma_j * c_j) over the grounding models that gave a point, with the
    confidence c_j = exp(mean log-likelihood of j's coordinate tokens), in (0, 1] (the geometric-mean token
    probability: with equal confidence the larger prior weighs more, as the paper's 1:1:2 "own model highest"
    intends; ../shared/PAPERS.md). `logliks[j]`: -inf (or NaN) when j gave no point -> weight 0 (when none did,
    every weight is 0 and the plan scores 0); None when j returns no log-probs -> c_j = 1 (its prior alone).
    `priors` sigma_j >= 0."""
    if len(logliks) != len(priors):
        raise ValueError(f"{len(logliks)} log-likelihoods but {len(priors)} priors")
    if any(p < 0 or not math.isfinite(p) for p in priors):
        raise ValueError(f"priors must be finite and >= 0, got {list(priors)}")
    if any(ll is not None and ll > 0 for ll in logliks):
        raise ValueError(f"a mean log-likelihood is <= 0, got {list(logliks)}")
    logits = [
        s * (1.0 if ll is None else math.exp(ll)) if ll is None or math.isfinite(ll) else None
        for ll, s in zip(logliks, priors)
    ]
    finite = [z for z in logits if z is not None]
    if not finite:
        return [0.0] * len(logliks)
    top = max(finite)
    exps = [math.exp(z - top) if z is not None else 0.0 for z in logits]
    total = sum(exps)
    return [e / total for e in exps]


@dataclass
class Grounding:
    """One grounding model's answer to a plan: the point on the screen (None: it gave none), the mean
    log-likelihood of its coordinate tokens (-inf without a point; None when the model returns no log-probs)
    and its text."""

    point: tuple[int, int] | None
    loglik: float | None
    text: str = ""


class Grounder(Protocol):
    """A grounding model of the C-DREM pool (a verifier): (instruction, plan text, observation: the state's env
    observation, `states.state_observation`) -> Grounding, batched."""

    name: str

    def ground(self, items: Sequence[tuple[str, str, Any]], screen: tuple[int, int]) -> list[Grounding]: ...


def grounding_conversation(instruction: str, plan: str, screenshot) -> list[dict]:
    """What a grounding model is asked: UI-TARS's own prompt with the plan as its thought, as CODA hands UI-TARS
    the planner's thought (executor.uitars_conversation); its SFT answers continue the same prefill."""
    from ..executor import uitars_conversation

    return uitars_conversation(instruction, plan, screenshot)


_POINT_ARG = re.compile(r"(?:start_box|point|start_point)\s*=\s*(['\"])(.*?)\1", re.DOTALL)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def read_grounding(
    text: str,
    pieces: Sequence[str] | None,
    logprobs: Sequence[float] | None,
    image_size: tuple[int, int],
    screen: tuple[int, int],
) -> Grounding:
    """A grounding model's answer -> its first point on the screen and the mean log-probability of the tokens
    that spell that point's numbers (`pieces`: each generated token's text, in order, joined = `text`). Parsed
    with UI-TARS's grammar (never evaluated); no point -> (None, -inf). Without logprobs: (point, None)."""
    from ..uitars import UITarsParseError, parse_uitars

    try:
        _, actions = parse_uitars(text)
    except UITarsParseError:
        return Grounding(None, -math.inf, text)
    first = next((a for a in actions if "start" in a.args), None)
    m = _POINT_ARG.search(text)
    if first is None or m is None:
        return Grounding(None, -math.inf, text)
    (iw, ih), (sw, sh) = image_size, screen
    px, py = first.args["start"]
    point = (min(sw - 1, max(0, round(px / iw * sw))), min(sh - 1, max(0, round(py / ih * sh))))
    if not logprobs or pieces is None:
        return Grounding(point, None, text)
    spans = [(m.start(2) + d.start(), m.start(2) + d.end()) for d in _NUMBER.finditer(m.group(2))]
    picked, pos = [], 0
    for piece, lp in zip(pieces, logprobs):
        a, b = pos, pos + len(piece)
        pos = b
        if any(a < e and s < b for s, e in spans):
            picked.append(lp)
    return Grounding(point, sum(picked) / len(picked) if picked else None, text)


class TransformersGrounder:
    """A local grounding checkpoint (UI-TARS-1.5 or a tiny test model), greedy, with its tokens' log-probs."""

    def __init__(self, path: str | Path, name: str | None = None, device: str | None = None, max_new_tokens: int = 48):
        from ..models import TransformersVLM

        self.vlm = TransformersVLM(path, device=device)
        self.name = name or Path(path).name
        self.max_new_tokens = max_new_tokens

    def ground(self, items: Sequence[tuple[str, str, Any]], screen: tuple[int, int]) -> list[Grounding]:
        from ..models import SamplingParams, model_image_size

        if not items:
            return []
        convs = [grounding_conversation(i, p, o["screenshot"]) for i, p, o in items]
        gens = self.vlm.generate(convs, SamplingParams(max_new_tokens=self.max_new_tokens, logprobs=True))
        size = model_image_size(self.vlm, screen)
        tok = self.vlm.tokenizer
        out = []
        for g in gens:
            ids = g.token_ids or []
            pieces, prev = [], ""
            for k in range(len(ids)):  # each token's text as the decoded answer spells it
                cur = tok.decode(ids[: k + 1], skip_special_tokens=True)
                pieces.append(cur[len(prev) :])
                prev = cur
            out.append(read_grounding(g.text, pieces, g.logprobs, size, screen))
        return out


class EndpointGrounder:
    """A grounding model behind an OpenAI-compatible endpoint (vLLM, SGLang), asked for the logprobs of its
    tokens (`logprobs: true`); an answer without them has no log-likelihood (C-DREM then weighs it by its prior
    alone)."""

    def __init__(self, url: str, model: str | None = None, name: str | None = None, max_new_tokens: int = 48):
        from ..models import OpenAIVLM

        self.vlm = OpenAIVLM(url, model=model)
        self.name = name or model or url
        self.max_new_tokens = max_new_tokens

    def _one(self, conv, screen) -> Grounding:
        from ..models import model_image_size

        body = {
            "model": self.vlm.model,
            "messages": [self.vlm._message(m) for m in conv],
            "max_tokens": self.max_new_tokens,
            "temperature": 0.0,
            "logprobs": True,
            "continue_final_message": True,
            "add_generation_prompt": False,
        }
        data = self.vlm._request("POST", "/chat/completions", body)
        choice = (data.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content") or ""
        content = (choice.get("logprobs") or {}).get("content") or []
        pieces = [t.get("token", "") for t in content] if content else None
        lps = [float(t["logprob"]) for t in content] if content else None
        if pieces is not None and "".join(pieces) != text:  # tokens that do not spell the text cannot be aligned
            pieces = lps = None
        return read_grounding(text, pieces, lps, model_image_size(self.vlm, screen), screen)

    def ground(self, items: Sequence[tuple[str, str, Any]], screen: tuple[int, int]) -> list[Grounding]:
        from concurrent.futures import ThreadPoolExecutor

        convs = [grounding_conversation(i, p, o["screenshot"]) for i, p, o in items]
        with ThreadPoolExecutor(max(1, min(16, len(convs)))) as pool:
            return list(pool.map(lambda c: self._one(c, screen), convs))


# ------------------------------------------------------------------------------------------ the pools
class A11yGrounder:
    """A verifier without a model: the a11y executor grounds the plan in the state's accessibility table (the
    point of the action it comes to). It returns no log-probs, so C-DREM weighs it by its prior alone."""

    def __init__(self, name: str = "a11y"):
        self.name = name

    def ground(self, items: Sequence[tuple[str, str, Any]], screen: tuple[int, int]) -> list[Grounding]:
        from ..a11y_executor import A11yExecutor
        from ..steps import canonical_steps

        out = []
        for res in A11yExecutor(screen).execute(list(items)):
            steps = canonical_steps(res.action, screen) if res.action else []
            first = next((st for st in steps if st.type in POINTER_TYPES and st.point is not None), None)
            point = None if first is None else tuple(first.start if first.type == "drag" else first.point)
            out.append(Grounding(point, None if point else -math.inf, res.action or ""))
        return out


def make_grounder(spec: str, name: str | None = None, model: str | None = None, cfg: CoEPGConfig | None = None):
    """A verifier: `a11y`, a checkpoint directory or an http(s):// endpoint."""
    tokens = cfg.grounder_max_new_tokens if cfg else 48
    if spec == "a11y":
        return A11yGrounder(name or "a11y")
    if spec.startswith(("http://", "https://")):
        return EndpointGrounder(spec, model, name, tokens)
    if not (Path(spec) / "config.json").exists():
        raise ValueError(f"grounding model {spec!r} is neither a11y, a checkpoint directory nor an http(s):// endpoint")
    return TransformersGrounder(spec, name, cfg.device if cfg else None, tokens)


def grounding_pool(cfg: CoEPGConfig, own: Sequence[str] = ()) -> tuple[list, list[float]]:
    """The verifier pool Phi and its priors: the fixed --grounders, then the own grounding model's generations
    (`own`, oldest first; default --grounder), the newest with --own-prior, older ones --previous-prior."""
    priors = list(cfg.grounder_priors) or [1.0] * len(cfg.grounders)
    if len(priors) != len(cfg.grounders):
        raise ValueError(f"--grounder-priors gives {len(priors)} priors for {len(cfg.grounders)} --grounders")
    models = list(cfg.grounder_models) + [None] * (len(cfg.grounders) - len(cfg.grounder_models))
    pool = [make_grounder(s, f"fixed{j}", m, cfg) for j, (s, m) in enumerate(zip(cfg.grounders, models))]
    own = list(own) or ([cfg.grounder] if cfg.grounder else [])
    for k, path in enumerate(own):
        newest = k == len(own) - 1
        pool.append(make_grounder(path, "own" if newest else f"own_prev{len(own) - 1 - k}", None, cfg))
        priors.append(cfg.own_prior if newest else cfg.previous_prior)
    if not pool:
        raise ValueError("coda train co-epg needs grounding models: --grounder DIR and/or --grounders DIR|URL|a11y ...")
    return pool, priors


# ------------------------------------------------------------------------------------------ D_k
def sample_plans(spec: str, rows: Sequence[dict], cfg: CoEPGConfig, n: int) -> tuple[list[list[str]], int]:
    """`n` plans per state from one planner of the pool (a checkpoint or an endpoint), at --temperature.
    Returns (plans per state, generated tokens)."""
    from ..models import SamplingParams, load_model
    from ..states import planner_conversation

    vlm = load_model(spec, **({"device": cfg.device} if cfg.device else {}))
    convs = [planner_conversation(r, history_images=cfg.history_images) for r in rows]
    plans: list[list[str]] = [[] for _ in rows]
    tokens = 0
    for k in range(n):
        params = SamplingParams(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed + 1000 * k
        )
        for i, g in enumerate(vlm.generate(convs, params)):
            plans[i].append(g.text)
            tokens += len(g.token_ids or [])
    return plans, tokens


def verified_plans(
    cfg: CoEPGConfig, planners: Sequence[str], rows: Sequence[dict], reward: CDREMReward
) -> tuple[list[tuple[dict, str]], dict]:
    """D_k: every planner of the pool samples --sft-plans plans per state; a plan is verified when it passes the
    gate and the verifier pool grounds it inside the target (its C-DREM reward is at least --sft-min-reward).
    Returns ((state, plan) pairs, counts)."""
    pairs: list[tuple[dict, str]] = []
    sampled = passed = tokens = 0
    for spec in planners:
        plans, t = sample_plans(spec, rows, cfg, cfg.sft_plans)
        tokens += t
        flat_rows = [r for r, ps in zip(rows, plans) for _ in ps]
        flat = [p for ps in plans for p in ps]
        rewards, stats = reward.score(flat_rows, flat)
        sampled += len(flat)
        passed += round(stats["cdrem/gate_pass_rate"] * len(flat))
        pairs += [(r, p) for r, p, x in zip(flat_rows, flat, rewards) if x >= cfg.sft_min_reward]
    counts = {"plans_sampled": sampled, "plans_passed_gate": passed, "plans_verified": len(pairs)}
    return pairs, counts | {"plan_tokens": tokens}


def heldout_reward(cfg: CoEPGConfig, planner: str, rows: Sequence[dict], reward: CDREMReward) -> float:
    """The planner's mean C-DREM reward on held-out states under the given verifier pool (--eval-generations
    plans per state): the figure after the grounder's SFT, with the pool the next round trains under."""
    plans, _ = sample_plans(planner, rows, cfg, cfg.eval_generations or cfg.group_size)
    flat_rows = [r for r, ps in zip(rows, plans) for _ in ps]
    rewards, _ = reward.score(flat_rows, [p for ps in plans for p in ps])
    return sum(rewards) / max(1, len(rewards))


# ------------------------------------------------------------------------------------------ SFT (TRL)
class CDREMReward:
    """TRL reward function: each sampled plan -> the gate (type, value) -> C-DREM over the grounding pool.
    Logs the gate pass rate, the plan readability rate and, per grounding model, its mean C-DREM weight and
    hit rate over the plans it grounded."""

    __name__ = "cdrem"  # TRL logs the reward as rewards/cdrem/...

    def __init__(self, grounders: Sequence[Grounder], priors: Sequence[float]):
        if len(grounders) != len(priors):
            raise ValueError(f"{len(grounders)} grounding models but {len(priors)} priors")
        if not grounders:
            raise ValueError("C-DREM needs at least one grounding model (--grounder / --grounders)")
        self.grounders, self.priors = list(grounders), [float(p) for p in priors]
        self.last_weights: dict[str, float] = {}  # each grounding model's mean weight in the last scored batch

    def score(self, rows: Sequence[dict], texts: Sequence[str]) -> tuple[list[float], dict[str, float]]:
        from ..executor import executor_text
        from ..planner import parse_plan
        from ..states import state_observation

        rewards = [0.0] * len(texts)
        read = passed = 0
        todo = []
        for i, (row, text) in enumerate(zip(rows, texts)):
            kind, value, point = (
                (row["action_type"], row["value"], row["point"])
                if "action_type" in row
                else target_step(row["target"], row["screen"])
            )
            plan = plan_step(text)
            read += plan is not None
            if not gate(plan, kind, value):
                continue
            passed += 1
            if not point:  # nothing to ground: the gate decides
                rewards[i] = 1.0
                continue
            todo.append((i, point))
        stats = {"cdrem/gate_pass_rate": passed / max(1, len(texts)), "cdrem/readable_rate": read / max(1, len(texts))}
        if todo:
            screen = tuple(int(v) for v in rows[todo[0][0]]["screen"])
            items = [
                (rows[i]["instruction"], executor_text(parse_plan(texts[i])), state_observation(rows[i]))
                for i, _ in todo
            ]
            answers = [g.ground(items, screen) for g in self.grounders]
            weights_sum = [0.0] * len(self.grounders)
            hits_sum = [0] * len(self.grounders)
            for k, (i, point) in enumerate(todo):
                row = rows[i]
                box = list(row["box"]) if row.get("box") else None
                hits = [inside(a[k].point, box, point, float(row.get("radius") or 0.0)) for a in answers]
                w = cdrem_weights([a[k].loglik for a in answers], self.priors)
                rewards[i] = sum(wj * h for wj, h in zip(w, hits))
                for j in range(len(w)):
                    weights_sum[j] += w[j]
                    hits_sum[j] += hits[j]
            self.last_weights = {g.name: weights_sum[j] / len(todo) for j, g in enumerate(self.grounders)}
            for j, g in enumerate(self.grounders):
                stats[f"cdrem/weight/{g.name}"] = weights_sum[j] / len(todo)
                stats[f"cdrem/hit_rate/{g.name}"] = hits_sum[j] / len(todo)
        return rewards, stats

    def __call__(self, prompts, completions, log_metric=None, **columns) -> list[float]:
        texts, rows = completion_rows(completions, columns)
        rewards, stats = self.score(rows, texts)
        if log_metric is not None:
            for k, v in stats.items():
                log_metric(k, v)
        return rewards


# ------------------------------------------------------------------------------------------ grounding SFT data
_VERBS = {"click": "click", "double_click": "left_double", "right_click": "right_single", "move": "hover"}


def grounding_answer(plan: str, action_type: str, point: Sequence[int], image_size, screen) -> str | None:
    """The SFT target of a successful plan: `Thought: <plan>\\nAction: click(start_box='(x,y)')` with the
    target's point in the pixels of the image the model sees (UI-TARS-1.5's coordinates); None for a step that
    is not one point (keys, text, drags)."""
    verb = _VERBS.get(action_type)
    if verb is None or not point:
        return None
    (iw, ih), (sw, sh) = image_size, screen
    x, y = round(point[0] / sw * iw), round(point[1] / sh * ih)
    return f"Thought: {plan}\nAction: {verb}(start_box='({x},{y})')"


def _image_size(image_processor, screen: Sequence[int]) -> tuple[int, int]:
    from ..models import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, smart_resize

    size = getattr(image_processor, "size", None) or {}
    lo = size.get("shortest_edge") or getattr(image_processor, "min_pixels", None) or DEFAULT_MIN_PIXELS
    hi = size.get("longest_edge") or getattr(image_processor, "max_pixels", None) or DEFAULT_MAX_PIXELS
    h, w = smart_resize(int(screen[1]), int(screen[0]), min_pixels=lo, max_pixels=hi)
    return w, h


def _target_point(row: dict) -> list[int]:
    """Where the grounding model should point: the centre of the target's box, else its point."""
    box = list(row.get("box") or [])
    if len(box) == 4:
        return [(box[0] + box[2]) // 2, (box[1] + box[3]) // 2]
    return list(row["point"])


def grounding_examples(pairs: Sequence[tuple[dict, str]], image_processor):
    """(state, successful plan) pairs -> a prompt-completion dataset TRL's SFTTrainer reads: the grounding
    conversation's user turn with the screenshot, and the answer that points at the target. States whose step
    is not one point are left out."""
    from datasets import Dataset

    from ..executor import executor_text
    from ..models import to_pil
    from ..planner import parse_plan
    from ..states import state_observation

    rows = []
    for row, text in pairs:
        screen = (int(row["screen"][0]), int(row["screen"][1]))
        plan = executor_text(parse_plan(text))
        answer = grounding_answer(
            plan, row["action_type"], _target_point(row), _image_size(image_processor, screen), screen
        )
        if answer is None:
            continue
        shot = to_pil(state_observation(row)["screenshot"])
        rows.append({"instruction": row["instruction"], "answer": answer, "images": [shot]})
    if not rows:
        return None
    return Dataset.from_list(rows).with_transform(_sft_transform)


def _sft_transform(batch: dict[str, list]) -> dict[str, list]:
    from .. import prompts

    prompts_, completions = [], []
    for instruction, answer in zip(batch["instruction"], batch["answer"]):
        prompts_.append(
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": prompts.uitars_prompt(instruction)}, {"type": "image"}],
                }
            ]
        )
        completions.append([{"role": "assistant", "content": [{"type": "text", "text": answer}]}])
    return {"prompt": prompts_, "completion": completions, "images": batch["images"]}


def planner_examples(pairs: Sequence[tuple[dict, str]], history_images: int = 2):
    """D_k's (state, verified plan) pairs -> a prompt-completion dataset TRL's SFTTrainer reads: the planner's
    conversation at the state (as the live agent builds it) and the plan as the answer."""
    from datasets import Dataset

    from ..states import planner_conversation

    rows = []
    for row, plan in pairs:
        msgs, images = trl_messages(planner_conversation(row, history_images=history_images))
        rows.append({"prompt": json.dumps(msgs), "answer": plan, "images": images})
    if not rows:
        return None
    return Dataset.from_list(rows).with_transform(_planner_transform)


def _planner_transform(batch: dict[str, list]) -> dict[str, list]:
    return {
        "prompt": [json.loads(p) for p in batch["prompt"]],
        "completion": [[{"role": "assistant", "content": [{"type": "text", "text": a}]}] for a in batch["answer"]],
        "images": batch["images"],
    }


def sft(cfg: CoEPGConfig, base: str, examples, out: Path, phase: str, progress: bool = True) -> dict:
    """Fine-tune the checkpoint `base` (the planner or the grounding model) on `examples` with TRL's SFTTrainer
    (loss on the answer only; --sft-lr, --sft-epochs), exported to OUT/model. Returns a summary."""
    import torch
    from transformers import AutoModelForImageTextToText
    from trl import SFTConfig, SFTTrainer

    out = Path(out)
    if (out / "done.json").exists():  # finished in an earlier run
        return json.loads((out / "done.json").read_text())
    cuda = torch.cuda.is_available() and (cfg.device or "cuda").startswith("cuda")
    bf16 = cuda if cfg.bf16 is None else cfg.bf16
    processor = ImageTextProcessor.from_checkpoint(base)
    model = AutoModelForImageTextToText.from_pretrained(
        base, dtype=torch.bfloat16 if bf16 else torch.float32, local_files_only=True
    )
    args = SFTConfig(
        output_dir=str(out / "checkpoints"),
        seed=cfg.seed,
        use_cpu=not cuda,
        bf16=bf16,
        learning_rate=cfg.sft_lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=cfg.max_grad_norm,
        per_device_train_batch_size=cfg.sft_micro_batch,
        num_train_epochs=cfg.sft_epochs,
        max_length=None,  # a screenshot alone can be over 1000 tokens: never cut into the answer
        completion_only_loss=True,
        **{checkpointing_field(): False},
        logging_steps=1,
        report_to=[],
        disable_tqdm=not progress,
        save_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    peft_config = None
    if cfg.sft_lora_r > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.sft_lora_r,
            lora_alpha=2 * cfg.sft_lora_r,
            target_modules=list(cfg.lora_targets),
            task_type="CAUSAL_LM",
        )
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=examples,
        processing_class=processor,
        peft_config=peft_config,
        callbacks=[RunLogCallback(out, {"phase": phase})],
    )
    if not progress:
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    t0 = time.monotonic()
    result = trainer.train()
    export_planner(trainer, base, processor, out / "model")
    rec = {
        "model": str(out / "model"),
        "examples": len(examples),
        "loss": result.training_loss,
        "seconds": time.monotonic() - t0,
    }
    (out / "done.json").write_text(json.dumps(rec))
    return rec


# ------------------------------------------------------------------------------------------ GRPO
def train_grpo(
    cfg: CoEPGConfig,
    out: Path | None = None,
    grounders: tuple[list, list[float]] | None = None,
    progress: bool = True,
    extra_log: dict | None = None,
) -> dict:
    """One GRPO run of the planner over cfg.data under C-DREM (steplevel.build_trainer with this reward, then
    steplevel.run_trainer: held-out reward before and after, checkpoints, resume, export). Returns its summary."""
    out = Path(out or cfg.out)
    train, app = load_states(cfg.data, cfg.app)
    held = step_data(load_states(cfg.eval_data, app)[0]) if cfg.eval_data else None
    reward = CDREMReward(*(grounders or grounding_pool(cfg)))
    trainer = build_trainer(
        cfg, out, [reward], train_states=step_data(train), eval_states=held, progress=progress, extra_log=extra_log
    )
    return run_trainer(trainer, cfg, out, base=cfg.planner, extra_log=extra_log)


# ------------------------------------------------------------------------------------------ the iteration
def run_rounds(cfg: CoEPGConfig, progress: bool = True) -> list[dict]:
    """K Co-EPG iterations, resumable per round. Round k, with the planner pool Pi (--planners + the own
    planner's newest generations) and the verifier pool Phi (--grounders + the own grounding model's):
      1. D_k: Pi writes plans on the states, Phi verifies them (`verified_plans`);
      2. SFT of the planner pi and of the grounding model phi on D_k (TRL's SFTTrainer);
      3. GRPO of pi under C-DREM over Phi (with phi's new generation) -> pi_k';
      4. SFT of phi on pi_k''s verified plans -> phi_k;
      5. pi_k' joins Pi, phi_k joins Phi (the --pool-size newest own generations kept); D_{k+1} is
         regenerated by the next round.
    Logged per round: |D_k|, the pool members, the verifiers' mean C-DREM weights, the held-out reward before,
    after GRPO and after the grounder's SFT (`eval_reward_final`, under the next round's pool)."""

    if world_size() > 1:
        raise ValueError("the Co-EPG iteration runs in one process (its SFTs and plan sampling are not distributed)")
    if not cfg.grounder or not (Path(cfg.grounder) / "config.json").exists():
        raise ValueError(f"--rounds needs --grounder DIR (the own grounding model, trained by SFT): {cfg.grounder!r}")
    if not cfg.planner or not (Path(cfg.planner) / "config.json").exists():
        raise ValueError(f"--planner {cfg.planner!r} is not a checkpoint directory (no config.json)")
    if not cfg.env and not cfg.data:
        raise ValueError("--rounds needs --data STATES or --env (whose tasks' oracle replays give the states)")
    resolve_app(cfg)
    rounds = Rounds(cfg.out, cfg)
    data = (oracle_state_paths(cfg, rounds.out) if cfg.env and cfg.oracle_states else []) + list(cfg.data)
    states_ds, cfg.app = load_states(data, cfg.app)
    rows = list(step_data(states_ds))
    held = list(step_data(load_states(cfg.eval_data, cfg.app)[0])) if cfg.eval_data else []
    executor = make_executor(replace(cfg, executor=cfg.executor or "a11y"), cfg.app) if cfg.episodes else None
    own_planners, own = [cfg.planner], [cfg.grounder]
    for r in range(cfg.rounds):
        rd = rounds.dir(r)
        if (rec := rounds.done(r)) is not None:
            own_planners = (own_planners + [rec["planner"]])[-cfg.pool_size :]
            own = (own + [rec["grounder"]])[-cfg.pool_size :]
            continue
        rec: dict[str, Any] = {"round": r}
        pool = grounding_pool(cfg, own)
        planners = [*cfg.planners, *own_planners]
        d_k, counts = verified_plans(cfg, planners, rows, CDREMReward(*pool))
        rec.update(data=len(d_k), planner_pool=planners, verifier_pool=[g.name for g in pool[0]], **counts)
        planner, grounder = own_planners[-1], own[-1]
        if d_k and cfg.planner_sft:
            planner = sft(
                cfg, planner, planner_examples(d_k, cfg.history_images), rd / "planner_sft", "planner_sft", progress
            )["model"]
        examples = grounding_examples(d_k, ImageTextProcessor.from_checkpoint(grounder).image_processor)
        if examples is not None:
            grounder = sft(cfg, grounder, examples, rd / "grounder_sft", "grounder_sft", progress)["model"]
        pool = grounding_pool(cfg, [*own[:-1], grounder][-cfg.pool_size :])
        gcfg = replace(cfg, data=data, planner=planner, rounds=0, out=str(rd / "train"))
        grpo = train_grpo(gcfg, grounders=pool, progress=progress, extra_log={"round": r})
        planner = str(rd / "train" / "planner")
        reward = CDREMReward(*pool)
        pairs, _ = verified_plans(cfg, [planner], rows, reward)
        rec["grounder_examples"] = len(pairs)
        examples = grounding_examples(pairs, ImageTextProcessor.from_checkpoint(grounder).image_processor)
        if examples is not None:
            grounder = sft(cfg, grounder, examples, rd / "grounder_grpo_sft", "grounder_sft", progress)["model"]
        own_planners = (own_planners + [planner])[-cfg.pool_size :]
        own = (own + [grounder])[-cfg.pool_size :]
        rec.update(planner=planner, grounder=grounder, steps=grpo.get("steps"), states=grpo.get("states"))
        rec.update({k: grpo[k] for k in ("eval_reward_before", "eval_reward_after") if k in grpo})
        next_reward = CDREMReward(*grounding_pool(cfg, own))
        if held:
            rec["eval_reward_final"] = heldout_reward(cfg, planner, held, next_reward)
            rec["mean_weights"] = dict(next_reward.last_weights)
        if cfg.env and cfg.episodes > 0:
            live = live_eval(
                replace(cfg, executor=cfg.executor or grounder),
                planner,
                executor or make_executor(replace(cfg, executor=grounder), cfg.app),
                rd / "eval",
                progress,
            )
            rec["live_success_rate"] = success_rate(live)
        rounds.finish(r, rec)
    return rounds.history


def run(cfg: CoEPGConfig, progress: bool = True) -> list[dict]:
    if cfg.rounds > 0:
        return run_rounds(cfg, progress)
    resolve_app(cfg)
    return [train_grpo(cfg, progress=progress)]


def summary(cfg: CoEPGConfig, history: list[dict]) -> str:
    lines = []
    for h in history:
        extra = "".join(f" {k} {h[k]:.3f}" for k in ("eval_reward_before", "eval_reward_after") if k in h)
        if "round" in h:
            live = f" live success {h['live_success_rate']:.3f}" if "live_success_rate" in h else ""
            lines.append(
                f"round {h['round']}:{extra}{live} sft examples {h.get('sft_examples', 0)}  planner {h['planner']}  "
                f"grounder {h['grounder']}"
            )
        else:
            lines.append(f"{h.get('steps', 0)} steps over {h.get('states', 0)} states,{extra}")
            lines.append(f"planner: {h.get('planner')}")
    return "\n".join(lines)


METHOD = Method(
    "co-epg",
    "Co-EPG: GRPO on the planner under C-DREM (an ensemble of grounding models scores each plan, gated by "
    "action type and value) and SFT of the grounding model on the planner's successful plans, iterated",
    CoEPGConfig,
    run,
    summary,
)
