"""The process reward model (PRO-CUA's reward): score one candidate step at a state, train a PRM, calibrate it.

PRO-CUA (../shared/PAPERS.md) gives dense step credit *without golden answers or expert trajectories*, on the
agent's own states: a process reward model looks at a state (the task, the earlier steps, the current screen)
and one candidate next step, and says how good a step it is. Everything that scores candidates here follows one
interface, `ProcessScorer` (candidates -> `StepScore`s in [0, 1]); a candidate without an action (its plan or the
executor gave none) scores 0 unasked. Three scorers:

- `ClassifierPRM` (trained here; runs on a CPU): a Qwen2.5-VL checkpoint (the policy's architecture; tiny in
  tests) asked after `prm_conversation`'s prompt whether the candidate is a good next step, answering YES or NO.
  Its score is p(YES) / (p(YES) + p(NO)) from the next-token logits at the answer position: one forward pass per
  candidate, batched, no generation. `train_prm` fine-tunes it (`coda prm train`: the log-loss of that score,
  classes balanced); its folder is a checkpoint plus `prm.json` (kind, prompt version, positive threshold,
  training stats).
- `VLMPRM`: a served or local VLM, prompted (not trained here) to end its answer with `SCORE: x` (`parse_score`;
  the mean over samples; an unreadable answer gets the fallback and counts as a parse failure).
- `ReplayScorer`: exact replay labels from the real app. PRIVILEGED: it reads the task's oracle solution (the
  oracle's next state is its yardstick), so it is what a PRM is trained and calibrated against, and an ablation
  of PRO-CUA (`--scorer replay`), never its default. Env resets are deterministic, so a state is rebuilt by
  replaying the env actions that led to it (its `prefix`) in a fresh episode; the candidate is executed there:
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
  Replays are cached by (task, prefix, action). Its base, `StateReplayer`, only rebuilds a state from the
  agent's own recorded actions (the a11y table a run folder lacks) and reads no oracle.

Training data for a PRM may be privileged (PRO-CUA later trains the policy on the PRM's scores, never on the
oracle): `train_prm` labels candidate steps at the states of train-split tasks with the replay scorer. The
candidates of a state (`state_candidates`): its labelled action (worded as the planner would say it,
`coda_agent.states.describe_action`), the other clickable elements of its a11y table (each a click at the
element's centre, worded the same way, so that the words tell nothing of which one is the label; the labelled
element's siblings first: hard negatives), and optionally a planner's sampled plans through the executor.

    coda prm train --data STATES... --env ENV --out DIR [--base CKPT] [--epochs N] [--lr X]
    coda prm calibrate --data HELD_OUT_STATES... --env ENV --prm DIR|URL
        agreement, precision and recall of the PRM's good steps against the replay's (per app), beside the
        majority-class rate; for a trained PRM folder or a served VLM PRM.

Nothing here imports torch at import time; nothing imports from coda_agent.train (it imports this).
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence


# ------------------------------------------------------------------------------------------ the vocabulary
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


# ------------------------------------------------------------------------------------------ the prompt
PROMPT_VERSION = 1  # the system text, the layout of prm_conversation and the questions; stored in prm.json
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
PRM_YES_NO_QUESTION = "Is the candidate step a good next step? Answer with one word: YES or NO."
ANSWERS = ("YES", "NO")
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


def prm_conversation(c: Candidate, question: str = PRM_QUESTION) -> list[dict]:
    """The PRM's prompt for one candidate: the task, the earlier steps in words, the current screen, the
    candidate's plan (its Action line when it has one), the env action it comes to, and `question` (the VLM
    PRM's SCORE request, or the classifier's YES/NO one)."""
    from .states import state_observation

    plan = c.plan.strip()
    m = re.search(r"Action:\s*(.+)", plan, re.DOTALL)
    step = (m.group(1) if m else plan).strip()[:500]
    text = (
        f"Task: {c.state['instruction']}\n\nSteps taken so far:\n{_history_lines(c.state)}\n\n"
        f"Candidate next step: {step or '(no text)'}\nIt performs: {c.action}\n\n{question}"
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


# ------------------------------------------------------------------------------------------ the VLM PRM
class VLMPRM:
    """The prompted VLM process reward model: a local `transformers` checkpoint or an OpenAI-compatible endpoint
    (coda_agent.models.load_model), or any object with the models' `generate`. One batched call scores every
    candidate `samples` times; candidates without an action score 0 unasked (as in the replay). Not trained
    here: `ClassifierPRM` is the trained one."""

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
            from .models import load_model

            model = load_model(model, model_name, **({"device": device} if device else {}))
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
        from .models import SamplingParams

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


# ------------------------------------------------------------------------------------------ the trained PRM
class ClassifierPRM:
    """The trained process reward model: a Qwen2.5-VL checkpoint asked `PRM_YES_NO_QUESTION` after
    `prm_conversation`'s prompt. Score = p(YES) / (p(YES) + p(NO)) = sigmoid(l_YES - l_NO), from the next-token
    logits at the answer position (the assistant turn's first token); one forward pass per candidate, `batch`
    candidates at a time, no generation. YES and NO are the first tokens of the two words (they must differ).

    `model`: a PRM folder (`train_prm`'s: a checkpoint plus prm.json, whose prompt version must be this one's),
    a bare checkpoint directory (an untrained classifier: what `train_prm` starts from), or a loaded
    `TransformersVLM`."""

    name = "prm"

    def __init__(self, model, batch: int = 8, device: str | None = None):
        from .models import TransformersVLM

        self.meta: dict = {}
        if not isinstance(model, TransformersVLM):
            path = Path(model)
            if (path / "prm.json").exists():
                self.meta = read_prm_meta(path)
                if self.meta.get("prompt_version") != PROMPT_VERSION:
                    raise ValueError(
                        f"{path}/prm.json: prompt version {self.meta.get('prompt_version')!r}, this coda asks "
                        f"version {PROMPT_VERSION}: retrain it (`coda prm train`)"
                    )
            model = TransformersVLM(path, device=device)
        self.vlm = model
        self.batch = max(1, batch)
        tok = model.tokenizer
        ids = [tok(w, add_special_tokens=False)["input_ids"] for w in ANSWERS]
        if not all(ids) or ids[0][0] == ids[1][0]:
            raise ValueError(f"{model.name}: the tokenizer gives YES and NO no distinct first tokens")
        self.yes_id, self.no_id = ids[0][0], ids[1][0]

    @property
    def positive(self) -> float:
        """The replay score its YES labels stood for (prm.json; 0.5 for an untrained one)."""
        return float(self.meta.get("positive", 0.5))

    def conversations(self, candidates: Sequence[Candidate]) -> list[list[dict]]:
        return [prm_conversation(c, PRM_YES_NO_QUESTION) for c in candidates]

    def answer_logits(self, conversations: Sequence[list[dict]]):
        """(n, vocab) next-token logits at the answer position of each conversation, in one forward pass
        (left padding: the last position of every row). With gradients when torch's grad mode is on."""
        inputs = self.vlm.build_inputs(conversations)
        out = self.vlm.model(**inputs, logits_to_keep=1)
        return out.logits[:, -1, :]

    def score(self, candidates: Sequence[Candidate]) -> list[StepScore]:
        import torch

        asked = [i for i, c in enumerate(candidates) if c.action is not None]
        out = [StepScore(0.0, {"asked": False}) for _ in candidates]
        self.vlm.model.eval()
        with torch.no_grad():
            for k in range(0, len(asked), self.batch):
                part = asked[k : k + self.batch]
                logits = self.answer_logits(self.conversations([candidates[i] for i in part])).float()
                two = torch.stack([logits[:, self.yes_id], logits[:, self.no_id]], dim=1)
                p_yes = torch.softmax(two, dim=1)[:, 0].tolist()
                for i, p in zip(part, p_yes):
                    out[i] = StepScore(float(p), {"asked": True, "fallback": False, "p_yes": float(p)})
        return out

    def close(self) -> None:
        self.vlm = None


def read_prm_meta(path: str | Path) -> dict:
    """A PRM folder's prm.json, checked to be a classifier PRM's."""
    p = Path(path) / "prm.json"
    try:
        meta = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{p} cannot be read: {e}") from None
    if not isinstance(meta, dict) or meta.get("kind") != "classifier":
        raise ValueError(f"{p}: kind {meta.get('kind') if isinstance(meta, dict) else None!r}, want 'classifier'")
    return meta


def load_prm(
    spec: str,
    *,
    samples: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    fallback: float = 0.0,
    model_name: str | None = None,
    device: str | None = None,
    batch: int = 8,
) -> ClassifierPRM | VLMPRM:
    """The PRM a --prm names: a trained classifier folder (it holds prm.json) -> `ClassifierPRM`; a checkpoint
    directory (config.json) or an http(s):// endpoint -> the prompted `VLMPRM` (the sampling settings are its)."""
    if not spec:
        raise ValueError("no --prm: give a PRM folder (`coda prm train`), a VLM checkpoint or an http(s):// URL")
    if spec.startswith(("http://", "https://")):
        return VLMPRM(spec, samples, temperature, max_new_tokens, fallback, model_name, device)
    p = Path(spec)
    if not p.is_dir():
        raise ValueError(
            f"--prm {spec!r} is not a directory (a PRM folder from `coda prm train` or a VLM checkpoint) "
            "nor an http(s):// URL"
        )
    if (p / "prm.json").exists():
        return ClassifierPRM(p, batch=batch, device=device)
    if not (p / "config.json").exists():
        raise ValueError(
            f"--prm {spec!r} holds neither prm.json (a PRM trained by `coda prm train`) nor config.json (a VLM "
            "checkpoint for the prompted PRM)"
        )
    return VLMPRM(spec, samples, temperature, max_new_tokens, fallback, model_name, device)


# ------------------------------------------------------------------------------------------ exact replays
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
    performs them (its records' step n comes after the first n - 1 of these). Reads the task's solution."""
    from .states import solution_steps

    return [run for _, run in solution_steps(task, screen)]


def state_prefix(record: dict, tasks: dict, screen: tuple[int, int]) -> list[str]:
    """The env actions that lead from the task's reset to the record's state: its `prefix` column (states
    collected here: the agent's own actions), or for an oracle state the first step - 1 oracle actions."""
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


class StateReplayer:
    """Rebuilds stored states in the real app: a fresh episode of the state's task with the env actions that
    led to it performed. One env (`gym.make(env_id)`, with its a11y tree and no step budget), opened on first
    use and closed by `close`: the caller must close it. For a collected state (its `prefix`: the agent's own
    actions) it reads nothing of the task's oracle."""

    name = "replayer"

    def __init__(self, env_id: str, task_dirs: Sequence[str] | None = None):
        self.env_id, self.task_dirs = env_id, list(task_dirs or [])
        self._env = None
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

    def prefix(self, record: dict) -> list[str]:
        """The env actions that lead to a collected state: its `prefix` (the agent's own actions; none at a
        first step). An oracle state is refused: its prefix is the oracle's (ReplayScorer's to read)."""
        if record.get("source") == "oracle":
            raise ValueError(f"state {record.get('id')} is an oracle state: its prefix would read the oracle")
        return state_prefix(record, {}, self.screen)

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

    def complete(self, record: dict) -> dict:
        """A collected state with what a run folder lacks, from the replay of the agent's own actions (its
        `prefix`): the a11y table at the state and the box of the element under the action the agent performed
        there (its `target` column; coda_agent.states.target_element)."""
        from coda_env.a11y import parse_table

        from .states import target_element

        obs = self._replay(record["task"], self.prefix(record))
        table = obs.get("a11y_tree", "")
        el = target_element(record["target"], parse_table(table), self.screen)
        return {**record, "a11y": table, "box": list(el.box) if el is not None else []}


class ReplayScorer(StateReplayer):
    """The exact process scorer (see the module's docstring). PRIVILEGED: it reads the task's oracle solution
    (`oracle_runs`, the oracle's path of states) to score a step, so it labels a PRM's training data and
    calibrates it, and is PRO-CUA's ablation (`--scorer replay`), never its default."""

    name = "replay"

    def __init__(self, env_id: str, task_dirs: Sequence[str] | None = None):
        super().__init__(env_id, task_dirs)
        self._oracle: dict[str, list[Measure]] = {}
        self._before: dict[tuple, tuple[Measure, bool]] = {}
        self._cache: dict[tuple, StepScore] = {}

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

    def prefix(self, record: dict) -> list[str]:
        """As StateReplayer's, and for an oracle state the oracle's first step - 1 actions."""
        return state_prefix(record, self.tasks, self.screen)

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
        prefix = tuple(self.prefix(c.state))
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


# ------------------------------------------------------------------------------------------ statistics
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


# ------------------------------------------------------------------------------------------ candidates
# a11y roles a click on does nothing a step could want: containers and read-only text
_NOT_CLICKABLE = frozenset(
    {
        "frame",
        "page tab list",
        "status bar",
        "application",
        "filler",
        "panel",
        "layered pane",
        "scroll pane",
        "window",
        "label",
        "separator",
        "tool tip",
        "static",
    }
)


def load_rows(paths: Sequence[str | Path]) -> list[dict]:
    """The rows of state datasets (`coda data states`, or collected by `coda train pro-cua --rounds`), of any
    app. Errors are one-line ValueErrors naming the folder."""
    from .states import load_checked

    if not paths:
        raise ValueError("no state dataset: give --data DIR (made by `coda data states ...`)")
    return [dict(r) for p in paths for r in load_checked(p)]


def element_candidates(record: dict, k: int, seed: int = 0) -> list[Candidate]:
    """Up to `k` candidates at a state (all when k <= 0): its labelled action (`target`, in words as the planner
    would say it: states.describe_action with the state's a11y elements), then clicks at the centres of the
    other clickable elements of its a11y table, worded the same way (so that the wording gives no hint of which
    is the label): first the labelled element's siblings (its role: the other tabs of a tab click, the hard
    negatives), then the other roles in turn, each role's elements in a seeded order per state."""
    from coda_env.a11y import parse_table

    from .states import describe_action, target_element

    screen = (int(record["screen"][0]), int(record["screen"][1])) if record.get("screen") else (1280, 800)
    elements = parse_table(record.get("a11y") or "")
    label = record["target"]
    out = [Candidate(record, label, f"Action: {describe_action(label, elements, screen)}")]
    hit = target_element(label, elements, screen)
    seen = {label}
    by_role: dict[str, list] = {}
    for e in elements:
        if e.role in _NOT_CLICKABLE or (e.states and "showing" not in e.states):
            continue
        x, y = e.center
        action = f"pyautogui.click({x}, {y})"
        under = target_element(action, elements, screen)
        if under is None or under != e or under == hit or action in seen:
            continue
        seen.add(action)
        by_role.setdefault(e.role, []).append(action)
    rng = random.Random(f"{seed}:{record['id']}")
    roles = sorted(by_role)
    rng.shuffle(roles)
    for r in roles:
        rng.shuffle(by_role[r])
    first = [hit.role] if hit is not None and hit.role in by_role else []
    order = [a for r in first for a in by_role[r]]
    rest = [by_role[r] for r in roles if r not in first]
    while any(rest):
        for q in rest:
            if q:
                order.append(q.pop(0))
    for action in order:
        if 0 < k <= len(out):
            break
        out.append(Candidate(record, action, f"Action: {describe_action(action, elements, screen)}"))
    return out


def plan_candidates(planner, executor, rows: Sequence[dict], k: int, seed: int = 0, max_new_tokens: int = 128):
    """`k` candidates per state from a planner's sampled plans (temperature 1), each turned into an env action
    by the executor through the coda agent's own path (None where the plan or the executor gave none)."""
    from .executor import plans_to_actions
    from .models import SamplingParams
    from .planner import PlanParseError, parse_plan
    from .states import planner_conversation, state_observation

    reps = [r for r in rows for _ in range(k)]
    if not reps:
        return []
    convs = [planner_conversation(r) for r in reps]
    texts = [
        g.text
        for g in planner.generate(convs, SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed))
    ]
    items = []
    for r, t in zip(reps, texts):
        try:
            plan = parse_plan(t)
        except PlanParseError:
            plan = None
        items.append((r["instruction"], plan, state_observation(r)))
    results = plans_to_actions(executor, items)
    return [Candidate(r, res.action, t) for r, t, res in zip(reps, texts, results)]


def state_candidates(
    rows: Sequence[dict],
    candidates: int,
    seed: int = 0,
    planner=None,
    executor=None,
    plans: int = 0,
    max_new_tokens: int = 128,
) -> list[Candidate]:
    """Every state's element candidates (`element_candidates`, `candidates` per state) followed by `plans`
    planner samples per state (with a planner and its executor), duplicates (same state, same action) left out."""
    out = [c for r in rows for c in element_candidates(r, candidates, seed)] if candidates >= 0 else []
    if planner is not None and executor is not None and plans > 0:
        out += plan_candidates(planner, executor, rows, plans, seed, max_new_tokens)
    seen, unique = set(), []
    for c in out:
        key = (c.state["id"], c.action)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def _check_tasks(rows: Sequence[dict], replay: StateReplayer) -> None:
    tasks = replay.tasks
    unknown = sorted({r["task"] for r in rows if r["task"] not in tasks})
    if unknown:
        raise ValueError(f"the states' tasks {unknown[:5]} are no tasks of {replay.env_id} (wrong --env?)")


# ------------------------------------------------------------------------------------------ training
def label_candidates(
    rows: Sequence[dict],
    env: str,
    *,
    candidates: int = 8,
    planner: str | None = None,
    executor: str | None = None,
    plans: int = 0,
    task_dirs: Sequence[str] | None = None,
    seed: int = 0,
    device: str | None = None,
) -> tuple[list[Candidate], list[StepScore], dict]:
    """The candidates of the states (`state_candidates`; `plans` samples of the `planner` through the
    `executor` when given) and their exact replay scores (`ReplayScorer`: privileged, it reads the tasks'
    oracles). Returns (candidates, scores, {replays, replay_seconds, label_seconds})."""
    if (planner is None) != (executor is None):
        raise ValueError("--planner and --executor go together (the planner's plans need the executor)")
    replay = ReplayScorer(env, task_dirs)
    t0 = time.monotonic()
    try:
        _check_tasks(rows, replay)
        plan_model = plan_executor = None
        if planner is not None and plans > 0:
            from .models import load_model
            from .policy import make_executor as agents_executor

            plan_model = load_model(planner, None, **({"device": device} if device else {}))
            plan_executor = agents_executor(executor, replay.screen)
        cands = state_candidates(rows, candidates, seed, plan_model, plan_executor, plans)
        scores = replay.score(cands)
        stats = {"replays": replay.replays, "replay_seconds": replay.seconds}
    finally:
        replay.close()
    stats["label_seconds"] = time.monotonic() - t0
    return cands, scores, stats


def fit_classifier(
    prm: ClassifierPRM,
    cands: Sequence[Candidate],
    labels: Sequence[bool],
    *,
    epochs: int = 3,
    lr: float = 1e-5,
    batch: int = 8,
    lora_r: int = 0,
    lora_alpha: int = 16,
    max_grad_norm: float = 1.0,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Fine-tune the classifier in place on (candidate, YES/NO) pairs. The loss is the cross-entropy of the
    answer token over the two answers, softmax([l_YES, l_NO]) at the answer position
    (`ClassifierPRM.answer_logits`): -log score for a YES, -log(1 - score) for a NO, the log-loss of the very
    probability the scorer returns. (The full-vocabulary token loss of SFT also spends its gradient on pushing
    every other token down, which the score never reads; on a tiny random-init model it left the score flat at
    the class prior after 10 epochs, where the two-answer loss separated the classes.) An example of class c
    weighs N / (2 N_c): balanced classes, so answering the majority earns nothing. AdamW, gradient clipping,
    `epochs` shuffled passes of `batch` examples; full weights, or LoRA (`lora_r` > 0, merged back at the
    end). Candidates without an action are left out (the scorer never asks about them). Returns stats."""
    import torch

    pairs = [(c, bool(y)) for c, y in zip(cands, labels) if c.action is not None]
    n = len(pairs)
    counts = {True: sum(y for _, y in pairs), False: n - sum(y for _, y in pairs)}
    if counts[True] == 0 or counts[False] == 0:
        which = "NO" if counts[True] == 0 else "YES"
        raise ValueError(
            f"all {n} labels are {which}: nothing to tell apart (more states, more --candidates, or another --positive)"
        )
    vlm = prm.vlm
    torch.manual_seed(seed)
    if lora_r > 0:
        from peft import LoraConfig, get_peft_model

        vlm.model = get_peft_model(
            vlm.model,
            LoraConfig(
                r=lora_r,
                lora_alpha=lora_alpha,
                lora_dropout=0.0,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            ),
        )
    else:
        for p in vlm.model.parameters():
            p.requires_grad_(True)
    params = [p for p in vlm.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    convs = prm.conversations([c for c, _ in pairs])
    ys = [y for _, y in pairs]
    weight = {c: n / (2 * counts[c]) for c in counts}
    order = list(range(n))
    rng = random.Random(seed)
    losses = []
    t0 = time.monotonic()
    vlm.model.train()
    for epoch in range(epochs):
        rng.shuffle(order)
        total = 0.0
        for k in range(0, n, batch):
            idx = order[k : k + batch]
            logits = prm.answer_logits([convs[i] for i in idx]).float()
            two = torch.stack([logits[:, prm.yes_id], logits[:, prm.no_id]], dim=1)  # the score's own softmax
            tgt = torch.tensor([0 if ys[i] else 1 for i in idx], device=logits.device)
            w = torch.tensor([weight[ys[i]] for i in idx], device=logits.device)
            loss = (torch.nn.functional.cross_entropy(two, tgt, reduction="none") * w).sum() / len(idx)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            total += loss.item() * len(idx)
        losses.append(total / n)
        if progress:
            print(f"prm epoch {epoch + 1}/{epochs}: loss {total / n:.4f}", flush=True)
    seconds = time.monotonic() - t0
    if lora_r > 0:
        vlm.model = vlm.model.merge_and_unload()
    vlm.model.eval()
    got = [s.score >= 0.5 for s in prm.score([c for c, _ in pairs])]
    return {
        "examples": n,
        "yes": counts[True],
        "no": counts[False],
        "class_weights": {"YES": weight[True], "NO": weight[False]},
        "epoch_loss": losses,
        "train_agreement": sum(a == b for a, b in zip(got, ys)) / n,
        "train_seconds": seconds,
    }


def train_prm(
    data: Sequence[str | Path],
    env: str,
    out: str | Path,
    base: str | Path,
    *,
    epochs: int = 3,
    lr: float = 1e-5,
    batch: int = 8,
    candidates: int = 8,
    positive: float = 0.5,
    planner: str | None = None,
    executor: str | None = None,
    plans: int = 0,
    task_dirs: Sequence[str] | None = None,
    lora_r: int = 0,
    lora_alpha: int = 16,
    seed: int = 0,
    device: str | None = None,
    progress: bool = False,
) -> dict:
    """Train a `ClassifierPRM` from the checkpoint `base` on exact replay labels; save it to `out` (a checkpoint,
    prm.json, and labels.jsonl: every labelled candidate). Returns the training stats (also in prm.json).

    Data (`label_candidates`): the candidates of every state of `data` (the labelled action, the other
    clickable elements, `plans` planner samples), each labelled by the `ReplayScorer`: YES when its score is
    >= `positive`. The states should be of the PRM's own train-split tasks: the labels read their oracles (a
    PRM's training data may be privileged; what PRO-CUA trains on with the PRM is not).

    Training (`fit_classifier`) is a plain torch loop, not TRL's SFTTrainer with a completion-only loss. The
    loss is one token per example, the answer, and it is the log-loss of the score itself (cross-entropy over
    the two answers YES and NO), which SFTTrainer's loss (over the whole vocabulary, on every completion token)
    is not; the loop reads the logits exactly where the scorer reads them (`ClassifierPRM.answer_logits`: the
    same prompt, batching and left padding), so training and scoring cannot drift apart. SFTTrainer would add
    a prompt/completion dataset with images, its collator and a chat-template round trip, and nothing this
    needs (no generation, no packing, one process). Classes are balanced by weight, since most candidate steps
    are bad and a PRM that always says NO would otherwise do well."""
    from .models import TransformersVLM

    out = Path(out)
    if not base or not (Path(base) / "config.json").exists():
        raise ValueError(f"--base {str(base)!r} is not a checkpoint directory (no config.json)")
    if epochs < 1 or batch < 1 or lr <= 0:
        raise ValueError("--epochs and --batch must be >= 1 and --lr > 0")
    if not 0.0 < positive <= 1.0:
        raise ValueError(f"--positive {positive} is not in (0, 1]")
    rows = load_rows(data)
    cands, scores, label_stats = label_candidates(
        rows,
        env,
        candidates=candidates,
        planner=planner,
        executor=executor,
        plans=plans,
        task_dirs=task_dirs,
        seed=seed,
        device=device,
    )
    if not cands:
        raise ValueError("the states gave no candidate steps (no labelled action, no clickable element)")
    labels = [s.score >= positive for s, c in zip(scores, cands)]
    asked = [y for y, c in zip(labels, cands) if c.action is not None]
    if not any(asked) or all(asked):
        raise ValueError(
            f"all {len(asked)} replay labels are {'YES' if asked and all(asked) else 'NO'} at --positive "
            f"{positive}: nothing to tell apart (more states, more --candidates, or another --positive)"
        )
    prm = ClassifierPRM(TransformersVLM(base, device=device), batch=batch)
    stats = {"states": len(rows), "candidates": len(cands), **label_stats}
    stats |= fit_classifier(
        prm,
        cands,
        labels,
        epochs=epochs,
        lr=lr,
        batch=batch,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        seed=seed,
        progress=progress,
    )
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "labels.jsonl", "w") as f:
        for c, s, y in zip(cands, scores, labels):
            rec = {"state": c.state["id"], "task": c.state["task"], "plan": c.plan, "action": c.action}
            f.write(json.dumps(rec | {"replay": s.score, "label": "YES" if y else "NO"}) + "\n")
    vlm = prm.vlm
    vlm.model.save_pretrained(out)
    vlm.tokenizer.save_pretrained(out)
    vlm.image_processor.save_pretrained(out)
    meta = {
        "kind": "classifier",
        "prompt_version": PROMPT_VERSION,
        "question": PRM_YES_NO_QUESTION,
        "answers": list(ANSWERS),
        "positive": positive,
        "base": str(base),
        "env": env,
        "data": [str(d) for d in data],
        "settings": {
            "epochs": epochs,
            "lr": lr,
            "batch": batch,
            "candidates": candidates,
            "plans": plans,
            "planner": planner,
            "executor": executor,
            "lora_r": lora_r,
            "seed": seed,
        },
        "stats": stats,
    }
    (out / "prm.json").write_text(json.dumps(meta, indent=1))
    return stats


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
    prm_positive: float | None = None,
) -> dict:
    """A PRM against the replay scorer on state datasets: per state `candidates` candidate actions (the
    planner's sampled plans through the executor when both are given; else `element_candidates`: the state's
    labelled action and clicks on its other clickable elements), each scored by both; agreement, precision
    and recall of the PRM's good steps (score >= `prm_positive`, default `positive`) against the replay's
    (score >= `positive`), per app and overall, and the majority-class rate of the replay's labels (what a
    PRM that always gives the same answer agrees)."""
    from .judge import agreement

    rows = load_rows(list(map(str, data)))
    _check_tasks(rows, replay)
    if planner is not None and executor is not None:
        cands = state_candidates(rows, -1, seed, planner, executor, candidates)
    else:
        cands = state_candidates(rows, candidates, seed)
    good = positive if prm_positive is None else prm_positive
    p = [s.score for s in prm.score(cands)]
    q = [s.score for s in replay.score(cands)]
    by_app: dict[str, list[tuple[bool, bool]]] = {}
    for c, x, y in zip(cands, p, q):
        by_app.setdefault(c.state["app"], []).append((y >= positive, x >= good))
    pairs = [pq for v in by_app.values() for pq in v]

    def group(v: list[tuple[bool, bool]]) -> dict:
        yes = sum(y for y, _ in v)
        return agreement(v) | {"majority": max(yes, len(v) - yes) / len(v) if v else None}

    return {
        "positive": positive,
        "prm_positive": good,
        "candidates": len(cands),
        "overall": group(pairs) | score_stats("prm", p) | score_stats("replay", q),
        "by_app": {a: group(v) for a, v in sorted(by_app.items())},
        "rows": [
            {"state": c.state["id"], "plan": c.plan, "action": c.action, "prm": x, "replay": y}
            for c, x, y in zip(cands, p, q)
        ],
    }


def add_calibrate_arguments(p) -> None:
    p.add_argument("--data", nargs="+", required=True, help="state datasets (`coda data states`, or collected here)")
    p.add_argument(
        "--prm",
        required=True,
        help="the PRM: a folder from `coda prm train` (a classifier: it holds prm.json), or a VLM checkpoint "
        "directory or http(s):// endpoint (the prompted PRM)",
    )
    p.add_argument("--prm-model", default=None, help="model name at the --prm endpoint")
    p.add_argument("--env", default="coda/KAlgebra-v0", help="the env whose tasks the states belong to (replays)")
    p.add_argument(
        "--tasks-dir", action="append", default=[], metavar="DIR", help="a folder of your own task files (repeatable)"
    )
    p.add_argument(
        "--candidates", type=int, default=4, help="candidate actions per state (the labelled one among them)"
    )
    p.add_argument("--planner", default=None, help="sample the candidates from this planner (with --executor)")
    p.add_argument("--executor", default=None, help="a11y | UI-TARS directory | URL: the planner's executor")
    p.add_argument(
        "--positive",
        type=float,
        default=None,
        help="a good step: replay score >= this (default: the classifier's training threshold, else 0.5); a "
        "classifier's good step is p(YES) >= 0.5, a VLM PRM's score >= this",
    )
    p.add_argument("--samples", type=int, default=1, help="VLM PRM: answers per candidate")
    p.add_argument("--max-new-tokens", type=int, default=64, help="VLM PRM: tokens per answer")
    p.add_argument("--fallback", type=float, default=0.0, help="VLM PRM: the score of an unreadable answer")
    p.add_argument("--batch", type=int, default=8, help="classifier PRM: candidates per forward pass")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the report (JSON) here")


def main_calibrate(args) -> int:
    from .judge import percent

    if (args.planner is None) != (args.executor is None):
        raise ValueError("--planner and --executor go together (the planner's plans need the executor)")
    if args.candidates < 1:
        raise ValueError("--candidates must be >= 1")
    load_rows(args.data)  # a wrong --data fails before any model is loaded
    prm = load_prm(
        args.prm,
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        fallback=args.fallback,
        model_name=args.prm_model,
        device=args.device,
        batch=args.batch,
    )
    classifier = isinstance(prm, ClassifierPRM)
    positive = args.positive if args.positive is not None else (prm.positive if classifier else 0.5)
    replay = ReplayScorer(args.env, args.tasks_dir)
    try:
        planner = executor = None
        if args.planner:
            from .models import load_model
            from .policy import make_executor as agents_executor

            planner = load_model(args.planner, None, **({"device": args.device} if args.device else {}))
            executor = agents_executor(args.executor, replay.screen)
        t0 = time.monotonic()
        report = calibrate(
            args.data,
            prm,
            replay,
            args.candidates,
            positive,
            planner,
            executor,
            args.seed,
            prm_positive=0.5 if classifier else None,
        )
        report["seconds"] = time.monotonic() - t0
        report["prm"] = {"spec": args.prm, "kind": "classifier" if classifier else "vlm"}
    finally:
        replay.close()
        prm.close()
    print(
        f"{'group':<16}{'n':>5}{'tp':>5}{'fp':>5}{'fn':>5}{'tn':>5}{'precision':>11}{'recall':>8}{'agree':>8}"
        f"{'majority':>10}"
    )
    for name, g in [*((f"app:{a}", g) for a, g in report["by_app"].items()), ("overall", report["overall"])]:
        print(
            f"{name:<16}{g['n']:>5}{g['tp']:>5}{g['fp']:>5}{g['fn']:>5}{g['tn']:>5}{percent(g['precision']):>11}"
            f"{percent(g['recall']):>8}{percent(g['agreement']):>8}{percent(g['majority']):>10}"
        )
    o = report["overall"]
    print(
        f"PRM ({report['prm']['kind']}) mean score {o.get('prm/score_mean', float('nan')):.3f}, replay mean score "
        f"{o.get('replay/score_mean', float('nan')):.3f}, {report['candidates']} candidates in {report['seconds']:.1f} s"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(f"report: {args.out}")
    return 0


def add_train_arguments(p) -> None:
    p.add_argument(
        "--data", nargs="+", required=True, help="state datasets of the PRM's train-split tasks (`coda data states`)"
    )
    p.add_argument("--env", required=True, help="the env whose tasks the states belong to (the replay labels)")
    p.add_argument("--out", required=True, help="the PRM folder to write: a checkpoint, prm.json, labels.jsonl")
    p.add_argument(
        "--base",
        default=None,
        help="the Qwen2.5-VL checkpoint directory the PRM starts from (none: --planner's, the policy's own)",
    )
    p.add_argument(
        "--tasks-dir", action="append", default=[], metavar="DIR", help="a folder of your own task files (repeatable)"
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=8,
        help="element candidates per state, the labelled action among them (0: every clickable element)",
    )
    p.add_argument("--planner", default=None, help="also sample candidates from this planner (with --executor)")
    p.add_argument("--executor", default=None, help="a11y | UI-TARS directory | URL: the planner's executor")
    p.add_argument("--plans", type=int, default=4, help="planner samples per state (with --planner)")
    p.add_argument(
        "--positive", type=float, default=0.5, help="a candidate is labelled YES when its replay score >= this"
    )
    p.add_argument("--epochs", type=int, default=3, help="passes over the labelled candidates")
    p.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate")
    p.add_argument("--batch", type=int, default=8, help="candidates per optimizer step (and per scoring pass)")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank (0: full weights)")
    p.add_argument("--lora-alpha", type=int, default=16, help="LoRA alpha")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no per-epoch lines")


def main_train(args) -> int:
    base = args.base or args.planner
    if not base:
        raise ValueError("coda prm train needs --base CKPT (or --planner: the PRM then starts from the policy)")
    load_rows(args.data)  # a wrong --data fails before anything starts
    stats = train_prm(
        args.data,
        args.env,
        args.out,
        base,
        epochs=args.epochs,
        lr=args.lr,
        batch=args.batch,
        candidates=args.candidates,
        positive=args.positive,
        planner=args.planner,
        executor=args.executor,
        plans=args.plans if args.planner else 0,
        task_dirs=args.tasks_dir,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        seed=args.seed,
        device=args.device,
        progress=not args.quiet,
    )
    print(
        f"PRM: {args.out} ({stats['examples']} labelled candidates at {stats['states']} states: {stats['yes']} YES, "
        f"{stats['no']} NO; {stats['replays']} replays in {stats['label_seconds']:.1f} s, trained in "
        f"{stats['train_seconds']:.1f} s; train agreement {stats['train_agreement']:.3f}, last loss "
        f"{stats['epoch_loss'][-1]:.4f})"
    )
    return 0
