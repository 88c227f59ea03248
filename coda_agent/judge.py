"""A vision-language judge: did this episode accomplish its instruction? (CODA's reward model.)

CODA scores rollouts with open VLM judges and raises their precision three ways, all here:
  - voting: each model answers `samples` times (sampled at `temperature`); its vote is the fraction of YES
    among the samples it could parse (`vote="fraction"`), or 1/0 by strict majority (`vote="majority"`: a
    tie is NO, precision first). A sample with no readable `VERDICT: YES|NO` is an abstention: counted in
    `parse_failures`, never a crash, never a NO. A model whose samples all abstain casts no vote.
  - multi-resolution: the final screenshot at full resolution (the fine view the verdict rests on) and up to
    `history` earlier screens downscaled to fit `history_size` (the global view of what happened). Earlier
    screens identical to their predecessor are dropped first (WAIT steps); the rest are taken evenly spaced,
    the start screen always among them.
  - ensemble: the score is the weight-averaged vote of the models that voted; nobody voted -> score 0.0.
`success = score >= threshold`. The model's text is only matched against a regular expression: never eval'd.

A `Judge` follows coda_env's scorer protocol (`coda_env.scoring.Scorer`): `gym.make(id, reward=judge)` scores
episodes with it. Nothing here imports torch at import time: models are loaded on first use, so building a
Judge (or an env with one) is cheap and pickles to vector-env workers without weights.

Serving note: a judge prompt holds up to history + 1 images; vLLM needs `--limit-mm-per-prompt image=N`
(N >= history + 1) for that.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from coda_env.runs import RunError, load_episodes, read_jsonl, read_png  # noqa: F401  (re-exported)
from coda_env.scoring import Episode, Score, ScoringError, fit_within

# ------------------------------------------------------------------------------------------ prompts
JUDGE_SYSTEM = (
    "You are a strict evaluator of a computer-use agent working in a scientific desktop application. You see "
    "the task the agent was given, screenshots of its episode, and its final answer if it gave one. Decide "
    "whether the task was fully accomplished in the final state. Judge only what the screenshots and the "
    "answer show; if the evidence is missing or ambiguous, the answer is NO."
)

JUDGE_TASK = "Task given to the agent:\n{instruction}"
JUDGE_HISTORY = "Earlier screens of the episode, in order, downscaled (screen {i} of {n}):"
JUDGE_FINAL = "The final screen, at full resolution:"
JUDGE_ANSWER = "The agent's final answer: {answer}"
JUDGE_NO_ANSWER = "The agent gave no textual answer (it ended with DONE or ran out of steps)."
JUDGE_QUESTION = (
    "Was the task accomplished? Think briefly about what the task requires and what the final screen shows, "
    "then end your reply with exactly one line:\nVERDICT: YES\nor\nVERDICT: NO"
)

# `VERDICT: YES`, `**Verdict:** no`, `verdict - YES.`; not the echoed template `VERDICT: YES|NO`.
_VERDICT = re.compile(r"verdict\W{0,6}(yes|no)\b(?!\s*[|/]\s*(?:yes|no)\b)", re.IGNORECASE)
_BARE = re.compile(r"^\W*(yes|no)\W*$", re.IGNORECASE)


def parse_verdict(text: str) -> bool | None:
    """True for YES, False for NO, None when the text holds no readable verdict (an abstention).
    The last `VERDICT:` wins (models restate); a reply that is only `Yes.`/`no` counts too."""
    found = _VERDICT.findall(text or "")
    if found:
        return found[-1].lower() == "yes"
    bare = _BARE.match(text or "")
    return bare.group(1).lower() == "yes" if bare else None


class JudgeError(ScoringError):
    """A judge model could not be loaded or did not answer; the message names which."""


# ------------------------------------------------------------------------------------------ config
@dataclass
class JudgeModel:
    """One ensemble member: `spec` is a local checkpoint directory or an http(s):// endpoint."""

    spec: str
    weight: float = 1.0
    model: str | None = None  # the served model name at an endpoint (default: the first it lists)
    options: dict = field(default_factory=dict)  # passed to coda_agent.models.load_model


@dataclass
class JudgeConfig:
    models: list = field(default_factory=list)  # specs (str), dicts of JudgeModel fields, or JudgeModels
    weights: list[float] | None = None  # overrides the models' weights, one per model
    samples: int = 3  # samples per model (the votes)
    temperature: float = 0.7
    max_new_tokens: int = 256
    vote: str = "fraction"  # "fraction" | "majority"
    threshold: float = 0.5  # success = score >= threshold
    reward: str = "binary"  # env reward: "binary" (1.0/0.0 by threshold) | "score"
    history: int = 4  # at most this many earlier screens
    history_size: tuple[int, int] = (640, 400)  # earlier screens fit in this (width, height)
    final_size: tuple[int, int] | None = None  # None: the final screen at full resolution
    seed: int | None = None  # sample i gets seed + i (reproducible); None: batched

    def __post_init__(self) -> None:
        ms = []
        for m in self.models:
            if isinstance(m, JudgeModel):
                ms.append(m)
            elif isinstance(m, str):
                ms.append(JudgeModel(m))
            elif isinstance(m, dict):
                unknown = set(m) - {f.name for f in fields(JudgeModel)}
                if unknown or "spec" not in m:
                    raise ValueError(f"judge model {m!r}: needs 'spec'; known keys: spec, weight, model, options")
                ms.append(JudgeModel(**m))
            else:
                raise TypeError(f"judge model must be a spec string, dict or JudgeModel, got {type(m).__name__}")
        if self.weights is not None:
            if len(self.weights) != len(ms):
                raise ValueError(f"{len(self.weights)} judge weights for {len(ms)} models")
            for m, w in zip(ms, self.weights):
                m.weight = float(w)
            self.weights = None
        self.models = ms
        self.history_size = tuple(self.history_size)
        self.final_size = tuple(self.final_size) if self.final_size is not None else None
        if any(m.weight < 0 or not math.isfinite(m.weight) for m in ms) or (ms and sum(m.weight for m in ms) <= 0):
            raise ValueError("judge weights must be finite, >= 0, and not all 0")
        if self.samples < 1:
            raise ValueError("judge samples must be >= 1")
        if self.temperature < 0:
            raise ValueError("judge temperature must be >= 0")
        if self.vote not in ("fraction", "majority"):
            raise ValueError(f"judge vote must be 'fraction' or 'majority', got {self.vote!r}")
        if self.reward not in ("binary", "score"):
            raise ValueError(f"judge reward must be 'binary' or 'score', got {self.reward!r}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError("judge threshold must be in [0, 1]")
        if self.history < 0:
            raise ValueError("judge history must be >= 0")
        for name in ("history_size", "final_size"):
            v = getattr(self, name)
            if v is not None and (len(v) != 2 or min(v) < 1):
                raise ValueError(f"judge {name} must be (width, height) in pixels, got {v!r}")

    @classmethod
    def from_dict(cls, d: dict) -> JudgeConfig:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown judge settings {sorted(unknown)}; known: {[f.name for f in fields(cls)]}")
        return cls(**d)


# ------------------------------------------------------------------------------------------ results
@dataclass
class ModelVote:
    name: str
    weight: float
    yes: int
    no: int
    abstained: int  # samples with no readable verdict
    vote: float | None  # None: every sample abstained
    outputs: list[str]


@dataclass
class JudgeResult:
    score: float
    success: bool
    models: list[ModelVote]
    images: list[tuple[int, int]]  # (width, height) of each image shown, earlier screens first
    seconds: float = 0.0

    @property
    def votes(self) -> dict[str, float | None]:
        return {m.name: m.vote for m in self.models}

    @property
    def parse_failures(self) -> int:
        return sum(m.abstained for m in self.models)

    @property
    def abstained(self) -> bool:
        """No model voted: the score 0.0 is a default, not a verdict."""
        return all(m.vote is None for m in self.models)

    def to_dict(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "success": self.success,
            "abstained": self.abstained,
            "parse_failures": self.parse_failures,
            "votes": self.votes,
            "models": [asdict(m) for m in self.models],
            "images": [list(s) for s in self.images],
            "seconds": round(self.seconds, 3),
        }


# ------------------------------------------------------------------------------------------ images
def pick_history(n: int, k: int) -> list[int]:
    """k of n indices, evenly spaced, first and last included."""
    if k <= 0 or n <= 0:
        return []
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


# ------------------------------------------------------------------------------------------ judge
class Judge:
    """Scores an episode (instruction, screenshots in order, final answer) with an ensemble of VLMs.

    `Judge(JudgeConfig(models=[...]))` or `Judge({"models": [...], ...})` loads the models on first use;
    `Judge([(vlm, weight), ...], config)` uses ready VLM objects (config.models is then ignored)."""

    def __init__(self, models: JudgeConfig | dict | Sequence[tuple[Any, float]], config: JudgeConfig | None = None):
        if isinstance(models, dict):
            models = JudgeConfig.from_dict(models)
        if isinstance(models, JudgeConfig):
            self.config, self._members, self._from_config = models, None, True
            if not models.models:
                raise ValueError("a judge needs at least one model (a checkpoint path or an http(s) URL)")
            self._weights = [m.weight for m in models.models]
        else:
            pairs = list(models)
            if not pairs:
                raise ValueError("a judge needs at least one (model, weight)")
            self.config = config or JudgeConfig()
            self._weights = [float(w) for _, w in pairs]
            JudgeConfig(models=[JudgeModel("given", w) for w in self._weights])  # validates the weights
            self._members, self._from_config = [m for m, _ in pairs], False

    def __getstate__(self):
        state = self.__dict__.copy()
        if self._from_config:
            state["_members"] = None  # a vector-env worker loads its own: weights are not pickled
        return state

    @property
    def members(self) -> list:
        """The VLMs, loaded on first use (a load failure is a JudgeError naming the spec)."""
        if self._members is None:
            from coda_agent.models import load_model

            loaded = []
            for m in self.config.models:
                try:
                    loaded.append(load_model(m.spec, m.model, **m.options))
                except (RuntimeError, OSError, ValueError, TypeError) as e:  # ModelError, bad options
                    raise JudgeError(f"judge model {m.spec!r} could not be loaded: {e}") from e
            self._members = loaded
        return self._members

    def names(self) -> list[str]:
        """Model names, made unique (two endpoints may serve the same name)."""
        out: list[str] = []
        for m in self.members:
            base = name = str(getattr(m, "name", type(m).__name__))
            i = 2
            while name in out:
                name, i = f"{base}#{i}", i + 1
            out.append(name)
        return out

    # ---------------------------------------------------------------------------------- inputs
    def images(self, screenshots: Sequence[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
        """(earlier screens as shown, final screen as shown): the multi-resolution view."""
        if not len(screenshots):
            raise ValueError("the judge needs at least the final screenshot")
        c = self.config
        final = np.asarray(screenshots[-1])
        if c.final_size is not None:
            final = fit_within(final, c.final_size)
        earlier: list[np.ndarray] = []
        if c.history > 0:
            for f in screenshots[:-1]:
                t = fit_within(np.asarray(f), c.history_size)
                if not earlier or not np.array_equal(t, earlier[-1]):
                    earlier.append(t)
            earlier = [earlier[i] for i in pick_history(len(earlier), c.history)]
        return earlier, final

    def conversation(
        self, instruction: str, screenshots: Sequence[np.ndarray], answer: str | None = None
    ) -> list[dict]:
        """The judge's chat: system prompt, then the task, the earlier screens, the final one, the answer."""
        return self._conversation(instruction, *self.images(screenshots), answer)

    @staticmethod
    def _conversation(instruction: str, earlier: list[np.ndarray], final: np.ndarray, answer: str | None) -> list[dict]:
        parts: list[dict] = [{"type": "text", "text": JUDGE_TASK.format(instruction=instruction)}]
        for i, img in enumerate(earlier):
            parts += [
                {"type": "text", "text": JUDGE_HISTORY.format(i=i + 1, n=len(earlier))},
                {"type": "image", "image": img},
            ]
        parts += [
            {"type": "text", "text": JUDGE_FINAL},
            {"type": "image", "image": final},
            {"type": "text", "text": JUDGE_ANSWER.format(answer=answer) if answer else JUDGE_NO_ANSWER},
            {"type": "text", "text": JUDGE_QUESTION},
        ]
        return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": parts}]

    # ---------------------------------------------------------------------------------- scoring
    def _sample(self, model, convs: list[list[dict]]) -> list[list[str]]:
        """`samples` outputs per conversation. With a seed, sample i of every conversation gets seed + i (one
        call per sample: an HTTP server given one seed for all would return one answer n times)."""
        from coda_agent.models import SamplingParams

        c, n = self.config, self.config.samples
        params = {"max_new_tokens": c.max_new_tokens, "temperature": c.temperature}
        if c.seed is None:
            gens = model.generate([conv for conv in convs for _ in range(n)], SamplingParams(**params))
            texts = [g.text for g in gens]
            return [texts[j * n : (j + 1) * n] for j in range(len(convs))]
        out: list[list[str]] = [[] for _ in convs]
        for i in range(n):
            for j, g in enumerate(model.generate(convs, SamplingParams(seed=c.seed + i, **params))):
                out[j].append(g.text)
        return out

    def score_batch(self, episodes: Sequence[tuple[str, Sequence[np.ndarray], str | None]]) -> list[JudgeResult]:
        """Judge several episodes (instruction, screenshots, answer) with one batched call per model."""
        t0 = time.monotonic()
        c = self.config
        convs, shown = [], []
        for instruction, screenshots, answer in episodes:
            earlier, final = self.images(screenshots)
            shown.append([(a.shape[1], a.shape[0]) for a in (*earlier, final)])
            convs.append(self._conversation(instruction, earlier, final, answer))
        per_model: list[list[list[str]]] = []
        for model in self.members:
            try:
                per_model.append(self._sample(model, convs))
            except (RuntimeError, OSError, ValueError) as e:  # ModelError (dead endpoint), CUDA OOM, ...
                raise JudgeError(
                    f"judge model {getattr(model, 'name', model)!r} failed: {type(e).__name__}: {e}"
                ) from e
        names = self.names()  # after the calls: an endpoint's served name is known by then
        seconds = (time.monotonic() - t0) / max(1, len(convs))
        results = []
        for j in range(len(convs)):
            votes = []
            for name, w, outs in zip(names, self._weights, per_model):
                verdicts = [parse_verdict(t) for t in outs[j]]
                yes, no = verdicts.count(True), verdicts.count(False)
                vote = None
                if yes + no:
                    vote = yes / (yes + no) if c.vote == "fraction" else (1.0 if yes > no else 0.0)
                votes.append(ModelVote(name, w, yes, no, verdicts.count(None), vote, list(outs[j])))
            voted = [(v.weight, v.vote) for v in votes if v.vote is not None and v.weight > 0]
            total = sum(w for w, _ in voted)
            score = sum(w * v for w, v in voted) / total if total > 0 else 0.0
            score = min(1.0, max(0.0, score))
            results.append(JudgeResult(score, bool(total > 0 and score >= c.threshold), votes, shown[j], seconds))
        return results

    def judge(self, instruction: str, screenshots: Sequence[np.ndarray], answer: str | None = None) -> JudgeResult:
        """Judge one episode given as (instruction, screenshots in order, final answer)."""
        return self.score_batch([(instruction, screenshots, answer)])[0]

    # ---------------------------------------------------------------------------------- scorer protocol
    @property
    def history_size(self) -> tuple[int, int] | None:
        """What the env keeps of earlier screens for this judge (coda_env.scoring.Scorer)."""
        return self.config.history_size if self.config.history > 0 else None

    def score(
        self, episode: Episode | str, screenshots: Sequence[np.ndarray] | None = None, answer: str | None = None
    ) -> Score | JudgeResult:
        """The scorer protocol: `score(Episode) -> Score` (what the env calls at the end of an episode:
        reward 1.0/0.0 by threshold, or the score itself with config.reward="score"). For stored episodes,
        `score(instruction, screenshots, answer)` is `judge(...)`."""
        if not isinstance(episode, Episode):
            return self.judge(episode, screenshots or [], answer)
        result = self.judge(episode.instruction, [*episode.earlier, episode.final], episode.answer)
        reward = float(result.score) if self.config.reward == "score" else (1.0 if result.success else 0.0)
        return Score(reward, result.success, result.to_dict())


def make_judge(judge: Judge | JudgeConfig | dict) -> Judge:
    """A Judge from itself, a JudgeConfig or a dict of its fields."""
    return judge if isinstance(judge, Judge) else Judge(judge)


# ------------------------------------------------------------------------------------------ calibrate
def agreement(pairs: Sequence[tuple[bool, bool]]) -> dict[str, Any]:
    """Judge vs checks over (check, judge) pairs: counts, precision, recall, agreement (None when 0/0)."""
    tp = sum(c and j for c, j in pairs)
    fp = sum(j and not c for c, j in pairs)
    fn = sum(c and not j for c, j in pairs)
    tn = sum(not c and not j for c, j in pairs)
    n = len(pairs)
    return {
        "n": n,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": tp / (tp + fp) if tp + fp else None,
        "recall": tp / (tp + fn) if tp + fn else None,
        "agreement": (tp + tn) / n if n else None,
    }


def calibrate(runs: Sequence[Path], judge: Judge, batch: int = 8, progress: bool = False) -> dict[str, Any]:
    """Judge every stored episode of the runs; compare with their programmatic checks, per app and overall."""
    episodes, skipped = [], []
    for run in runs:
        g, s = load_episodes(Path(run))
        episodes += g
        skipped += s
    rows = []
    for i in range(0, len(episodes), batch):
        chunk = episodes[i : i + batch]
        results = judge.score_batch([(e["instruction"], [read_png(p) for p in e["pngs"]], e["answer"]) for e in chunk])
        for e, r in zip(chunk, results):
            rows.append(
                {k: e[k] for k in ("run", "app", "task", "episode", "check", "answer")}
                | {
                    "judge": r.success,
                    "score": r.score,
                    "abstained": r.abstained,
                    "parse_failures": r.parse_failures,
                    "votes": r.votes,
                    "images": len(r.images),
                }
            )
        if progress:
            print(f"judged {len(rows)}/{len(episodes)}", file=sys.stderr)
    by_app: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_app[r["app"]].append(r)

    def group(rs: list[dict]) -> dict[str, Any]:
        return agreement([(r["check"], r["judge"]) for r in rs]) | {
            "abstained": sum(r["abstained"] for r in rs),
            "parse_failures": sum(r["parse_failures"] for r in rs),
        }

    c = judge.config
    return {
        "judge": {
            "models": judge.names(),
            "weights": judge._weights,
            "samples": c.samples,
            "temperature": c.temperature,
            "vote": c.vote,
            "threshold": c.threshold,
            "history": c.history,
            "history_size": list(c.history_size),
        },
        "overall": group(rows),
        "by_app": {a: group(rs) for a, rs in sorted(by_app.items())},
        "episodes": rows,
        "skipped": skipped,
    }


def percent(v: float | None) -> str:
    """A rate as the calibration reports print it (a dash for none)."""
    return "    -" if v is None else f"{v:>5.1%}"


def print_report(report: dict) -> None:
    print(
        f"{'group':<16}{'n':>5}{'tp':>5}{'fp':>5}{'fn':>5}{'tn':>5}{'precision':>11}{'recall':>8}"
        f"{'agree':>8}{'abstain':>9}"
    )
    for name, g in [*((f"app:{a}", g) for a, g in report["by_app"].items()), ("overall", report["overall"])]:
        print(
            f"{name:<16}{g['n']:>5}{g['tp']:>5}{g['fp']:>5}{g['fn']:>5}{g['tn']:>5}{percent(g['precision']):>11}"
            f"{percent(g['recall']):>8}{percent(g['agreement']):>8}{g['abstained']:>9}"
        )
    if report["skipped"]:
        print(f"skipped {len(report['skipped'])} episodes (see the report's 'skipped')")


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
        return w, h
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, got {text!r}") from None


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", nargs="+", required=True, help="`coda eval` run directories (--out of each run)")
    p.add_argument(
        "--judge",
        action="append",
        required=True,
        help="judge model: checkpoint directory or http(s):// endpoint (repeat for an ensemble)",
    )
    p.add_argument(
        "--judge-model",
        action="append",
        default=None,
        help="served model name at each --judge endpoint, in order (default: the first served)",
    )
    p.add_argument("--weights", nargs="+", type=float, default=None, help="one weight per --judge")
    d = JudgeConfig()
    p.add_argument("--samples", type=int, default=d.samples, help="samples per model (votes)")
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--vote", choices=("fraction", "majority"), default=d.vote)
    p.add_argument("--threshold", type=float, default=d.threshold, help="judge success = score >= threshold")
    p.add_argument("--history", type=int, default=d.history, help="earlier screens shown (downscaled)")
    p.add_argument("--history-size", type=_size, default=d.history_size, help="WxH box earlier screens fit in")
    p.add_argument("--final-size", type=_size, default=None, help="WxH box for the final screen (default: full)")
    p.add_argument("--seed", type=int, default=None, help="sample i gets seed + i (default: unseeded, batched)")
    p.add_argument("--retries", type=int, default=None, help="retries of a failed HTTP request (default: 3)")
    p.add_argument("--batch", type=int, default=8, help="episodes per batched judge call")
    p.add_argument("--out", default=None, help="write the report (JSON) here")
    p.add_argument("--quiet", action="store_true")


def main_calibrate(args: argparse.Namespace) -> int:
    names = args.judge_model or []
    if len(names) > len(args.judge):
        print("coda judge calibrate: error: more --judge-model than --judge", file=sys.stderr)
        return 2
    try:
        opts = {"retries": args.retries} if args.retries is not None else {}
        models = [
            JudgeModel(
                s,
                model=names[i] if i < len(names) else None,
                options=opts if s.startswith(("http://", "https://")) else {},
            )
            for i, s in enumerate(args.judge)
        ]
        config = JudgeConfig(
            models=models,
            weights=args.weights,
            samples=args.samples,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            vote=args.vote,
            threshold=args.threshold,
            history=args.history,
            history_size=args.history_size,
            final_size=args.final_size,
            seed=args.seed,
        )
        report = calibrate([Path(r) for r in args.runs], Judge(config), args.batch, progress=not args.quiet)
    except (ValueError, JudgeError, RunError) as e:
        print(f"coda judge calibrate: error: {e}", file=sys.stderr)
        return 2
    print_report(report)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
        print(f"report: {args.out}")
    return 0
