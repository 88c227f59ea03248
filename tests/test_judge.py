"""The VLM judge: verdict parsing, voting/weights/threshold/abstention maths (against a stand-in
chat-completions server that answers by a fixed rule: a stand-in, real vLLM/SGLang need a GPU and weights),
multi-resolution input, tiny real Qwen2.5-VL ensembles, reward=Judge(...) on the real KAlgebra env, and
`coda judge calibrate` over real `coda eval` runs."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import pickle
import shutil
import socket
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import coda_env  # noqa: F401  (registers the env ids)
from coda_agent.cli import main
from coda_agent.judge import (
    Judge,
    JudgeConfig,
    JudgeError,
    JudgeModel,
    agreement,
    fit_within,
    parse_verdict,
    pick_history,
)
from coda_env.tasks import load_tasks

from .conftest import JSONHandler, run_solution

TASKS = ["calc_power", "calc_log2_3", "calc_hypotenuse"]


# ------------------------------------------------------------------------------------------ stand-in server
class _StandIn(JSONHandler):
    """A stand-in judge endpoint. The served model name is the rule it answers by:
    'yes' / 'no': always that verdict; 'junk': no verdict; 'echo': only the template `VERDICT: YES|NO`;
    'cycle:PAT': PAT[seed % len(PAT)] with Y = YES, N = NO, X = no verdict; 'word:W': YES iff W is in the
    user's text; 'fullres': YES iff the last image is strictly larger than every earlier one.
    Every request is recorded: model, seed, temperature, user text, and each image's size, top-left pixel
    and md5 of its RGB bytes."""

    seen: list[dict] = []
    lock = threading.Lock()

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "yes", "object": "model"}]})

    def do_POST(self):
        from PIL import Image

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text, images = [], []
        for m in body["messages"]:
            if m["role"] != "user":
                continue
            for p in m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]:
                if p["type"] == "text":
                    text.append(p["text"])
                else:
                    raw = base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
                    with Image.open(io.BytesIO(raw)) as im:
                        rgb = im.convert("RGB")
                        images.append(
                            {
                                "size": im.size,
                                "pixel": rgb.getpixel((0, 0)),
                                "md5": hashlib.md5(rgb.tobytes()).hexdigest(),
                            }
                        )
        text = "\n".join(text)
        model, seed = body["model"], body.get("seed")
        with _StandIn.lock:
            _StandIn.seen.append(
                {"model": model, "seed": seed, "temperature": body["temperature"], "text": text, "images": images}
            )
        verdict = {
            "Y": "The final screen shows it done.\nVERDICT: YES",
            "N": "Not done.\nVERDICT: NO",
            "X": "I cannot tell from these screens.",
        }
        if model in ("yes", "no"):
            out = verdict[model[0].upper()]
        elif model == "junk":
            out = verdict["X"]
        elif model == "echo":
            out = "Answer with VERDICT: YES|NO"
        elif model.startswith("cycle:"):
            pat = model.split(":", 1)[1]
            out = verdict[pat[seed % len(pat)]]
        elif model.startswith("word:"):
            out = verdict["Y" if model.split(":", 1)[1].lower() in text.lower() else "N"]
        elif model == "fullres":
            area = [i["size"][0] * i["size"][1] for i in images]
            out = verdict["Y" if area and all(a < area[-1] for a in area[:-1]) else "N"]
        else:
            return self._send(404, {"error": {"message": f"model {model!r} does not exist"}})
        self._send(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10},
            },
        )


@pytest.fixture(scope="module")
def stand_in():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def seen(stand_in):
    _StandIn.seen.clear()
    return _StandIn.seen


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    return f"http://127.0.0.1:{port}"


def _solid(value: int, shape=(800, 1280, 3)) -> np.ndarray:
    return np.full(shape, value, dtype=np.uint8)


def _judge(url: str, *members: tuple[str, float], **kw) -> Judge:
    return Judge(JudgeConfig(models=[JudgeModel(url, w, model=name) for name, w in members], **kw))


# ------------------------------------------------------------------------------------------ parsing, selection
@pytest.mark.parametrize(
    "text,want",
    [
        ("Looks right.\nVERDICT: YES", True),
        ("VERDICT: NO", False),
        ("**Verdict:** no", False),
        ("verdict - YES.", True),
        ("VERDICT：YES", True),
        ("Yes.", True),
        (" no ", False),
        ("VERDICT: NO ... on reflection VERDICT: YES", True),  # the last verdict wins
        ("Reply with VERDICT: YES|NO", None),
        ("VERDICT: YES / NO", None),  # the echoed template
        ("yes and no", None),
        ("", None),
        ("The verdict is unclear", None),
        ("VERDICT: YESTERDAY", None),
    ],
)
def test_parse_verdict(text, want):
    assert parse_verdict(text) is want


def test_history_selection_and_downscale():
    assert pick_history(10, 4) == [0, 3, 6, 9]
    assert pick_history(3, 5) == [0, 1, 2] and pick_history(5, 1) == [0] and pick_history(0, 3) == []
    assert pick_history(7, 0) == []
    small = fit_within(_solid(9), (320, 200))
    assert small.shape == (200, 320, 3) and small.dtype == np.uint8 and int(small[0, 0, 0]) == 9
    assert fit_within(small, (320, 200)) is small  # idempotent: the env pre-shrinks
    assert fit_within(_solid(1), (300, 300)).shape == (188, 300, 3)  # aspect kept, never over the box


def test_config_validation_is_clear():
    with pytest.raises(ValueError, match="unknown judge settings.*'sample'"):
        JudgeConfig.from_dict({"models": ["http://x"], "sample": 3})
    with pytest.raises(ValueError, match="2 judge weights for 1 models"):
        JudgeConfig(models=["http://x"], weights=[1, 2])
    with pytest.raises(ValueError, match="not all 0"):
        JudgeConfig(models=["http://x", "http://y"], weights=[0, 0])
    with pytest.raises(ValueError, match="vote must be"):
        JudgeConfig(models=["http://x"], vote="mean")
    with pytest.raises(ValueError, match="needs 'spec'"):
        JudgeConfig(models=[{"url": "http://x"}])
    with pytest.raises(ValueError, match="at least one model"):
        Judge(JudgeConfig())
    c = JudgeConfig.from_dict({"models": [{"spec": "http://x", "weight": 2}], "history_size": [160, 100]})
    assert c.models[0].weight == 2.0 and c.history_size == (160, 100)


# ------------------------------------------------------------------------------------------ maths (stand-in)
def test_votes_weights_threshold_and_abstentions_by_hand(stand_in, seen):
    # seeds 1, 2, 3: 'cycle:YNX' answers N, X, Y -> 1 YES, 1 NO, 1 abstention -> vote 1/2
    members = [("yes", 1.0), ("no", 3.0), ("cycle:YNX", 2.0), ("junk", 5.0)]
    frames = [_solid(10), _solid(20), _solid(30)]
    r = _judge(stand_in, *members, samples=3, seed=1, threshold=0.25).score("Plot sin(x).", frames)
    assert r.votes == {"yes": 1.0, "no": 0.0, "cycle:YNX": 0.5, "junk": None}
    assert r.score == pytest.approx((1 * 1.0 + 3 * 0.0 + 2 * 0.5) / (1 + 3 + 2))  # junk's weight drops out
    assert r.success and not r.abstained
    assert r.parse_failures == 1 + 3
    cyc = next(m for m in r.models if m.name == "cycle:YNX")
    assert (cyc.yes, cyc.no, cyc.abstained, len(cyc.outputs)) == (1, 1, 1, 3)
    assert len(seen) == 4 * 3 and {s["seed"] for s in seen} == {1, 2, 3}
    assert all(s["temperature"] == 0.7 for s in seen)
    # majority: the cycle's 1-1 tie is NO -> (1*1 + 3*0 + 2*0) / 6
    m = _judge(stand_in, *members, samples=3, seed=1, threshold=0.25, vote="majority").score("Plot sin(x).", frames)
    assert m.votes["cycle:YNX"] == 0.0 and m.score == pytest.approx(1 / 6) and not m.success
    # the threshold is inclusive
    assert _judge(stand_in, *members, samples=3, seed=1, threshold=1 / 3).score("t", frames).success
    # seeds 4, 5, 6 on 'cycle:YYNX': Y, Y, N -> 2/3
    r2 = _judge(stand_in, ("cycle:YYNX", 1.0), samples=3, seed=4).score("t", frames)
    assert r2.votes == {"cycle:YYNX": pytest.approx(2 / 3)} and r2.success


def test_nobody_votes_means_no_success_even_at_threshold_zero(stand_in, seen):
    r = _judge(stand_in, ("junk", 1.0), ("echo", 1.0), samples=2, threshold=0.0).score("t", [_solid(1)])
    assert r.abstained and r.score == 0.0 and not r.success and r.parse_failures == 4
    assert all(len(m.outputs) == 2 for m in r.models)
    assert all(s["seed"] is None for s in seen) and len(seen) == 4  # no seed: one batched call per model


def test_same_served_name_twice_is_told_apart(stand_in, seen):
    r = _judge(stand_in, ("yes", 1.0), ("yes", 1.0), samples=1).score("t", [_solid(1)])
    assert [m.name for m in r.models] == ["yes", "yes#2"] and r.score == 1.0


def test_multi_resolution_views_reach_the_model(stand_in, seen):
    # earlier screens: 10, 10 (a WAIT: dropped), 20, 30, 40, then the final 99
    frames = [_solid(v) for v in (10, 10, 20, 30, 40, 99)]
    judge = _judge(stand_in, ("fullres", 1.0), samples=1, history=3, history_size=(320, 200))
    r = judge.score("Task text here.", frames, answer="81")
    assert r.images == [(320, 200)] * 3 + [(1280, 800)] and r.score == 1.0
    (req,) = seen
    assert [i["size"] for i in req["images"]] == [(320, 200)] * 3 + [(1280, 800)]
    # 3 of the 4 distinct earlier screens, evenly spaced (indices 0, 2, 3), then the final one
    assert [i["pixel"][0] for i in req["images"]] == [10, 30, 40, 99]
    assert "Task text here." in req["text"] and "final answer: 81" in req["text"]
    seen.clear()
    # no history: only the final screen; a final_size box shrinks it too (then 'fullres' has nothing to beat)
    r = _judge(stand_in, ("fullres", 1.0), samples=1, history=0, final_size=(640, 400)).score("t", frames)
    assert r.images == [(640, 400)] and [i["size"] for i in seen[0]["images"]] == [(640, 400)]
    assert "gave no textual answer" in seen[0]["text"]


def test_dead_endpoint_is_a_judge_error_naming_it():
    url = _dead_url()
    judge = Judge(JudgeConfig(models=[JudgeModel(url, model="m", options={"retries": 0, "backoff": 0.01})]))
    with pytest.raises(JudgeError, match=r"judge model 'm' failed.*127\.0\.0\.1.*did not answer"):
        judge.score("t", [_solid(1)])


def test_a_judge_built_from_config_pickles_without_its_models(stand_in, seen):
    judge = _judge(stand_in, ("yes", 1.0), samples=1)
    assert judge.score("t", [_solid(1)]).success  # loads the members
    clone = pickle.loads(pickle.dumps(judge))
    assert clone._members is None and clone.score("t", [_solid(1)]).success


def test_agreement_counts():
    a = agreement([(True, True), (True, False), (False, True), (False, False), (False, False)])
    assert a == {"n": 5, "tp": 1, "fp": 1, "fn": 1, "tn": 2, "precision": 0.5, "recall": 0.5, "agreement": 0.6}
    assert agreement([(False, False)])["precision"] is None and agreement([])["agreement"] is None


# ------------------------------------------------------------------------------------------ tiny real models
@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    pytest.importorskip("torch")
    from coda_agent.models import TransformersVLM
    from coda_agent.tiny import build_tiny_qwen2_5_vl

    root = tmp_path_factory.mktemp("tiny_judges")
    return [TransformersVLM(build_tiny_qwen2_5_vl(root / f"judge{s}", seed=s), name=f"tiny{s}") for s in (0, 1)]


def _random_screens(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, 255, (800, 1280, 3), dtype=np.uint8) for _ in range(n)]


def test_tiny_ensemble_votes_and_multi_resolution(tiny_pair):
    from coda_agent.models import smart_resize

    m0, m1 = tiny_pair
    cfg = JudgeConfig(samples=3, temperature=1.0, max_new_tokens=8, history=2, history_size=(160, 100), seed=0)
    judge = Judge([(m0, 1.0), (m1, 3.0)], cfg)
    screens = _random_screens(4)
    r = judge.score("Store 3^4 in a.", screens, answer="81")
    assert r.images == [(160, 100), (160, 100), (1280, 800)]
    assert [m.name for m in r.models] == ["tiny0", "tiny1"]
    for m in r.models:
        assert m.yes + m.no + m.abstained == 3 and len(m.outputs) == 3
        assert m.vote == (m.yes / (m.yes + m.no) if m.yes + m.no else None)
    voted = [(m.weight, m.vote) for m in r.models if m.vote is not None]
    want = sum(w * v for w, v in voted) / sum(w for w, _ in voted) if voted else 0.0
    assert 0.0 <= r.score <= 1.0 and r.score == pytest.approx(want)
    assert r.success == (bool(voted) and r.score >= cfg.threshold)
    assert r.parse_failures == sum(m.abstained for m in r.models)
    # per-sample seeds: reproducible, and the samples differ from each other
    again = judge.score("Store 3^4 in a.", screens, answer="81")
    assert [m.outputs for m in again.models] == [m.outputs for m in r.models]
    assert len(set(r.models[0].outputs)) > 1
    # what the real processor makes of the conversation: the final screen at the model's full grid, the
    # earlier ones at the small one
    enc = m0.build_inputs([judge.conversation("Store 3^4 in a.", screens, "81")])
    grids = [tuple(g) for g in enc["image_grid_thw"].tolist()]
    fh, fw = smart_resize(800, 1280, min_pixels=m0.min_pixels, max_pixels=m0.max_pixels)
    eh, ew = smart_resize(100, 160, min_pixels=m0.min_pixels, max_pixels=m0.max_pixels)
    assert grids == [(1, eh // 14, ew // 14)] * 2 + [(1, fh // 14, fw // 14)] and eh * ew < fh * fw


def test_tiny_majority_batched_and_weights(tiny_pair):
    m0, m1 = tiny_pair
    judge = Judge(
        [(m0, 0.0), (m1, 1.0)], JudgeConfig(samples=2, temperature=1.0, max_new_tokens=6, vote="majority", history=1)
    )
    results = judge.score_batch([("task a", _random_screens(2), None), ("task b", _random_screens(3), "7")])
    assert len(results) == 2
    for r in results:
        assert r.images[-1] == (1280, 800) and len(r.images) == 2  # history=1: the start screen
        assert all(m.vote in (None, 0.0, 1.0) for m in r.models)
        want = r.models[1].vote if r.models[1].vote is not None else 0.0  # weight 0: tiny0 never counts
        assert r.score == want and 0.0 <= r.score <= 1.0


# ------------------------------------------------------------------------------------------ the env
def test_env_reward_argument_errors():
    from coda_env.env import CodaEnv
    from coda_env.scoring import Scorer

    with pytest.raises(ValueError, match="reward must be 'check' or a scorer"):
        CodaEnv("kalgebra", reward="vlm")
    with pytest.raises(ValueError, match=r"reward=Judge\("):
        CodaEnv("kalgebra", reward="judge")
    with pytest.raises(TypeError, match="judge"):  # issue 27: the dead judge= parameter is gone
        CodaEnv("kalgebra", judge={"models": ["http://x"]})
    with pytest.raises(TypeError, match="scorer"):
        CodaEnv("kalgebra", reward=object())
    assert CodaEnv("kalgebra").scorer is None
    assert isinstance(Judge({"models": ["http://x"]}), Scorer)  # the judge follows coda_env's protocol


def _play(env, task_id: str):
    """The oracle's episode, keeping every screen the env returned (what `coda eval` stores as PNGs)."""
    obs, _ = env.reset(options={"task": task_id})
    frames = [obs["screenshot"]]
    for action in env.unwrapped.tasks[task_id].solution:
        obs, r, term, trunc, info = env.step(action)
        frames.append(obs["screenshot"])
        if term or trunc:
            return frames, r, info
    raise AssertionError("the solution did not end the episode")


def _md5s(judge: Judge, frames) -> list[str]:
    earlier, final = judge.images(frames)
    return [hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest() for a in (*earlier, final)]


def test_judge_reward_on_kalgebra(stand_in, seen):
    env = gym.make(
        "coda/KAlgebra-v0",
        reward=Judge(
            {
                "models": [{"spec": stand_in, "model": "word:power"}],
                "samples": 2,
                "history": 3,
                "history_size": [320, 200],
            }
        ),
    )
    try:
        base = env.unwrapped
        frames, reward, info = _play(env, "calc_power")
        assert reward == 1.0
        assert info["success"] is True and info["checks"][0]["passed"]  # the checks still ran
        j = info["judge"]
        assert j["score"] == 1.0 and j["success"] and j["votes"] == {"word:power": 1.0}
        assert len(seen) == 2 and j["images"][-1] == [1280, 800]
        sizes = [i["size"] for i in seen[0]["images"]]
        assert sizes[-1] == (1280, 800) and 2 <= len(sizes) <= 4
        assert all(s == (320, 200) for s in sizes[:-1])
        assert load_tasks("kalgebra")["calc_power"].instruction in seen[0]["text"]
        # what the env kept (small copies of changed screens) shows the judge exactly what the whole stored
        # trajectory would: the same images, byte for byte, as `coda judge calibrate` gives it
        assert [i["md5"] for i in seen[0]["images"]] == _md5s(base.scorer, frames)
        # ... also when the last step changed the screen (truncated by the budget right after typing)
        seen.clear()
        base.max_steps = 1
        obs, _ = env.reset(options={"task": "calc_power"})
        last, r, term, trunc, info = env.step(load_tasks("kalgebra")["calc_power"].solution[0])
        base.max_steps = None
        assert trunc and not term and r == 1.0 and info["judge"]["score"] == 1.0
        assert not np.array_equal(obs["screenshot"], last["screenshot"])
        assert [i["md5"] for i in seen[0]["images"]] == _md5s(base.scorer, [obs["screenshot"], last["screenshot"]])
        assert len(seen[0]["images"]) == 2
        assert base._frames == [] and "judge" in base.timings  # the screens are let go
        # the same judge on another task says NO though the checks pass: the two are reported side by side
        rewards, term, trunc, info = run_solution(env, "calc_log2_3")
        assert rewards[-1] == 0.0 and info["success"] is True and info["judge"]["score"] == 0.0
        # reward="score": the weighted mean itself (YES weight 1, NO weight 3 -> 0.25)
        base.scorer = _judge(stand_in, ("yes", 1.0), ("no", 3.0), samples=1, reward="score")
        rewards, term, trunc, info = run_solution(env, "calc_power")
        assert rewards[-1] == pytest.approx(0.25) and info["judge"]["success"] is False
        # mid-episode the env holds only small copies of screens that changed
        env.reset(options={"task": "calc_power"})
        env.step("WAIT")
        env.step("pyautogui.click(500, 751)")
        assert 1 <= len(base._frames) <= 3 and all(f.shape[1] <= 640 for f in base._frames)
    finally:
        env.close()


def test_dead_judge_endpoint_keeps_the_env_usable(stand_in, seen):
    dead = _dead_url()
    env = gym.make(
        "coda/KAlgebra-v0",
        reward=Judge(JudgeConfig(models=[JudgeModel(dead, model="m", options={"retries": 0})], samples=1)),
    )
    try:
        rewards, term, _, info = run_solution(env, "calc_power")
        assert term and rewards[-1] == 0.0
        assert info["error"].startswith("JudgeError") and dead in info["error"] and "judge" not in info
        assert info["success"] is True  # the checks' verdict stays
        rewards, _, _, info = run_solution(env, "calc_power")  # reset and play again: fine
        assert rewards[-1] == 0.0 and "JudgeError" in info["error"]
        env.unwrapped.scorer = _judge(stand_in, ("yes", 1.0), samples=1)  # a live judge: scored again
        rewards, _, _, info = run_solution(env, "calc_power")
        assert rewards[-1] == 1.0 and info.get("error") is None
    finally:
        env.close()


# ------------------------------------------------------------------------------------------ calibrate
@pytest.fixture(scope="module")
def eval_runs(tmp_path_factory):
    from coda_agent.eval import run_eval
    from coda_agent.policy import OracleAgent, RandomAgent

    root = tmp_path_factory.mktemp("runs")
    run_eval("coda/KAlgebra-v0", OracleAgent(), root / "oracle", TASKS, progress=False)
    run_eval(
        "coda/KAlgebra-v0", RandomAgent(seed=3), root / "random", TASKS, env_kwargs={"max_steps": 3}, progress=False
    )
    return root / "oracle", root / "random"


def _records(*runs: Path) -> list[dict]:
    return [json.loads(line) for r in runs for line in (r / "episodes.jsonl").read_text().splitlines()]


def test_calibrate_against_the_checks(eval_runs, stand_in, seen, tmp_path, capsys):
    oracle, random_run = eval_runs
    recs = _records(oracle, random_run)
    assert len(recs) == 6 and sum(r["success"] for r in recs) >= 3  # the oracle's 3
    # the stand-in says YES exactly for the episodes whose instruction has "power" (calc_power)
    pairs = [(r["success"], r["task"] == "calc_power") for r in recs]
    tp = sum(c and j for c, j in pairs)
    fp = sum(j and not c for c, j in pairs)
    fn = sum(c and not j for c, j in pairs)
    tn = sum(not c and not j for c, j in pairs)
    out = tmp_path / "report.json"
    assert (
        main(
            [
                "judge",
                "calibrate",
                "--runs",
                str(oracle),
                str(random_run),
                "--judge",
                stand_in,
                "--judge-model",
                "word:power",
                "--samples",
                "2",
                "--seed",
                "0",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    rep = json.loads(out.read_text())
    g = rep["by_app"]["kalgebra"]
    assert (g["n"], g["tp"], g["fp"], g["fn"], g["tn"]) == (6, tp, fp, fn, tn)
    assert g["precision"] == pytest.approx(tp / (tp + fp)) and g["recall"] == pytest.approx(tp / (tp + fn))
    assert g["agreement"] == pytest.approx((tp + tn) / 6)
    assert rep["overall"] == g and rep["skipped"] == [] and g["abstained"] == 0
    assert len(seen) == 6 * 2  # 6 episodes x 2 samples
    row = next(e for e in rep["episodes"] if e["task"] == "calc_power" and e["run"] == str(oracle))
    assert row["check"] is True and row["judge"] is True and row["score"] == 1.0
    assert "app:kalgebra" in printed and "overall" in printed

    # the ensemble through the CLI: weights 3 (word:power) and 1 ('no') -> 0.75 on calc_power
    def run(threshold: str) -> dict:
        assert (
            main(
                [
                    "judge",
                    "calibrate",
                    "--runs",
                    str(oracle),
                    str(random_run),
                    "--judge",
                    stand_in,
                    "--judge",
                    stand_in,
                    "--judge-model",
                    "word:power",
                    "--judge-model",
                    "no",
                    "--weights",
                    "3",
                    "1",
                    "--samples",
                    "1",
                    "--threshold",
                    threshold,
                    "--out",
                    str(out),
                    "--quiet",
                ]
            )
            == 0
        )
        return json.loads(out.read_text())

    assert run("0.75")["overall"] == g
    strict = run("0.8")["overall"]  # now nothing passes
    assert (strict["tp"], strict["fp"], strict["precision"], strict["recall"]) == (0, 0, None, 0.0)
    assert strict["tn"] == tn + fp and strict["fn"] == tp + fn


def test_calibrate_skips_broken_trajectories_and_reports_errors(eval_runs, stand_in, tmp_path, capsys):
    oracle, _ = eval_runs
    broken = tmp_path / "broken"
    shutil.copytree(oracle, broken)
    (broken / "trajectories" / "calc_log2_3__0" / "step_001.png").unlink()
    out = tmp_path / "r.json"
    assert (
        main(
            [
                "judge",
                "calibrate",
                "--runs",
                str(broken),
                "--judge",
                stand_in,
                "--judge-model",
                "yes",
                "--samples",
                "1",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    rep = json.loads(out.read_text())
    assert rep["overall"]["n"] == 2 and rep["overall"]["tp"] == 2 and rep["overall"]["precision"] == 1.0
    (skip,) = rep["skipped"]
    assert skip["task"] == "calc_log2_3" and "screenshots for" in skip["reason"]
    capsys.readouterr()
    assert main(["judge", "calibrate", "--runs", str(tmp_path / "nope"), "--judge", stand_in]) == 2
    assert "no episodes.jsonl" in capsys.readouterr().err
    assert (
        main(
            [
                "judge",
                "calibrate",
                "--runs",
                str(oracle),
                "--judge",
                _dead_url(),
                "--judge-model",
                "m",
                "--samples",
                "1",
                "--retries",
                "0",
                "--quiet",
            ]
        )
        == 2
    )
    assert "did not answer" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["judge"])


def test_judge_reward_through_coda_eval_on_an_async_vector_env(stand_in, seen, tmp_path):
    """The training path: judge-rewarded envs in worker processes (the judge is pickled without models)."""
    from coda_agent.eval import run_eval
    from coda_agent.policy import OracleAgent

    judge = {"models": [{"spec": stand_in, "model": "word:power"}], "samples": 1}
    s = run_eval(
        "coda/KAlgebra-v0",
        OracleAgent(),
        tmp_path / "run",
        TASKS[:2],
        num_envs=2,
        env_kwargs={"reward": Judge(judge)},
        progress=False,
    )
    recs = {r["task"]: r for r in _records(tmp_path / "run")}
    assert s["overall"]["success"] == 2  # eval's success is the checks'
    assert (recs["calc_power"]["reward"], recs["calc_log2_3"]["reward"]) == (1.0, 0.0)  # the judge's
    assert len(seen) == 2 and all(r["error"] is None for r in recs.values())
