"""Training (coda_agent.train): fast tests of the maths, the shared core, the CLI and the loop (marker `fast`:
no X server, tiny real transformers models, a FAKE env), then GRPO's learning run of a tiny real Qwen2.5-VL
planner on the real KAlgebra env, then stage-2 SFT on that run's successful trajectories."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coda_agent.models import SamplingParams, TransformersVLM  # noqa: E402
from coda_agent.rollout import Sample  # noqa: E402
from coda_agent.tiny import build_tiny_qwen2_5_vl  # noqa: E402
from coda_agent.train import METHODS, add_arguments, config_from_args  # noqa: E402
from coda_agent.train import common  # noqa: E402
from coda_agent.train.common import (
    accumulate,
    load_checkpoint,
    prepare_model,
    save_checkpoint,  # noqa: E402
    token_logprobs,
)
from coda_agent.train.grpo import GRPOConfig, group_advantages, grpo_loss, train  # noqa: E402
from coda_agent.train.sft import Example, SFTConfig, finetune, load_examples, mean_loss, tokenize  # noqa: E402

fast = pytest.mark.fast


# ------------------------------------------------------------------------------------------ maths
@fast
def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 3.0])
    keys = ["a#0"] * 4 + ["b#1"] * 4 + ["c#2"] * 4
    adv = group_advantages(r, keys, eps=0.0)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]))  # mean .5, std .5
    assert torch.equal(adv[4:8], torch.zeros(4))  # std 0: no signal
    std = np.std([0, 0, 0, 3])
    assert torch.allclose(adv[8:], torch.tensor([-0.75, -0.75, -0.75, 2.25]) / std)
    assert torch.allclose(adv.view(3, 4).sum(1), torch.zeros(3), atol=1e-6)


@fast
def test_group_advantages_by_key_not_position():
    """Members of a group anywhere in the batch; the same task in two groups is two groups; a group of one
    has no signal."""
    keys = ["t#0", "u#1", "t#0", "t#2", "u#1", "t#0", "t#2", "v#3"]
    r = torch.tensor([1.0, 5.0, 0.0, 2.0, 1.0, 0.0, 2.0, 7.0])
    adv = group_advantages(r, keys, eps=0.0)
    t0 = np.array([1.0, 0.0, 0.0])
    want_t0 = (t0 - t0.mean()) / t0.std()
    assert torch.allclose(adv[[0, 2, 5]], torch.tensor(want_t0, dtype=torch.float32))
    assert torch.allclose(adv[[1, 4]], torch.tensor([1.0, -1.0]))  # 5 and 1: mean 3, std 2
    assert torch.equal(adv[[3, 6]], torch.zeros(2))  # t#2: equal rewards
    assert adv[7] == 0  # v#3: alone
    # the same rewards in a shuffled order give each episode the same advantage
    perm = [7, 3, 0, 5, 1, 6, 2, 4]
    shuffled = group_advantages(r[perm], [keys[i] for i in perm], eps=0.0)
    assert torch.allclose(shuffled, adv[perm])
    with pytest.raises(ValueError, match="group keys"):
        group_advantages(r, keys[:-1])


@fast
def test_clipping_kl_and_masking():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.0, 0.5, -0.5], [0.1, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    adv = torch.tensor([1.0, -2.0])
    loss, st = grpo_loss(new, old, None, adv, mask, clip_eps=0.2, kl_coef=0.0, n_tokens=4)
    r = np.exp([0.0, 0.5, -0.5, 0.1])
    # A=+1: min(r, clip(r)) = 1, 1.2, e^-.5 ; A=-2: min(-2r, -2clip(r)) = -2e^.1 (inside the clip range)
    want = -(1.0 + 1.2 + r[2] - 2 * r[3]) / 4
    assert abs(float(loss) - want) < 1e-6
    assert st["clipped_tokens"] == 2 and st["tokens"] == 4
    loss.backward()
    g = new.grad
    assert g[0, 1] == 0  # ratio above 1+eps with A>0: clipped, no gradient
    assert g[0, 2] != 0 and g[0, 0] != 0  # below the clip with A>0: min picks the unclipped term
    assert torch.equal(g[1, 1:], torch.zeros(2))  # masked tokens give nothing
    # masked positions do not change the loss whatever their values
    new2 = new.detach().clone()
    new2[1, 1:] = 5.0
    assert abs(float(grpo_loss(new2, old, None, adv, mask, 0.2, 0.0, 4)[0]) - want) < 1e-6
    # KL (k3): zero at ref == new, exp(d) - d - 1 otherwise
    ref = torch.zeros(2, 3)
    l0, s0 = grpo_loss(old.clone(), old, ref, adv, mask, 0.2, 0.5, 4)
    assert s0["kl_sum"] == 0.0
    _, s1 = grpo_loss(new.detach(), old, ref, adv, mask, 0.2, 0.5, 4)
    d = -np.array([0.0, 0.5, -0.5, 0.1])
    assert abs(s1["kl_sum"] - float(np.sum(np.exp(d) - d - 1))) < 1e-6


# ------------------------------------------------------------------------------------------ shared core
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(scope="module")
def tiny_executor_dir(tmp_path_factory):
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-exec") / "m", seed=5)


def _samples(vlm, n=5):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        shot = rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)
        conv = [{"role": "user", "content": [{"type": "text", "text": f"task {i}"}, {"type": "image", "image": shot}]}]
        ids = vlm.tokenizer(f"Thought: t{i}\nAction: ANS {i * 7}", add_special_tokens=False)["input_ids"]
        out.append(Sample("planner", conv, ids[: 3 + i]))  # different lengths: padding in play
    return out


@fast
def test_accumulated_micro_batches_equal_one_full_batch(tiny_dir):
    """common.accumulate over micro-batches gives the full batch's loss and gradient (GRPO and SFT both step
    through it), and the scored tokens are exactly the sampled ones."""
    vlm = TransformersVLM(tiny_dir)
    samples = _samples(vlm)
    adv = torch.tensor([1.0, -0.5, 0.3, 2.0, -1.0])
    n = sum(len(s.token_ids) for s in samples)
    with torch.no_grad():
        old, _ = token_logprobs(vlm, samples, 1.0)
    params = [p for p in vlm.model.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.0)  # a step that leaves the weights alone

    def grads(bounds):
        def loss_fn(k, b):
            lo, hi = b
            lp, m = token_logprobs(vlm, samples[lo:hi], 1.0)
            return grpo_loss(lp, old[lo:hi, -lp.shape[1] :], None, adv[lo:hi], m, 0.2, 0.0, n)

        total, gn, sums = accumulate(optimizer, params, bounds, 1e9, loss_fn)
        assert sums["tokens"] == n
        return total, gn, [p.grad.clone() for p in params if p.grad is not None]

    full_loss, full_gn, full = grads([(0, 5)])
    acc_loss, acc_gn, acc = grads([(0, 2), (2, 4), (4, 5)])
    assert abs(full_loss - acc_loss) < 1e-5 and abs(full_gn - acc_gn) < 1e-4 * full_gn
    assert len(full) == len(acc) > 0
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(full, acc))
    shot = np.random.default_rng(3).integers(0, 255, (64, 96, 3), dtype=np.uint8)
    conv = [{"role": "user", "content": [{"type": "text", "text": "go"}, {"type": "image", "image": shot}]}]
    (g,) = vlm.generate([conv], SamplingParams(max_new_tokens=12, temperature=1.0, logprobs=True, seed=0))
    lp, m = token_logprobs(vlm, [Sample("planner", conv, g.token_ids, g.logprobs)], 1.0)
    assert torch.allclose(lp[0][m[0]], torch.tensor(g.logprobs), atol=1e-4)


@fast
@pytest.mark.parametrize("lora_r", [4, 0])
def test_checkpoint_round_trip(tiny_dir, tmp_path, lora_r):
    """Trainable weights (by name), optimizer and RNGs come back exactly; a checkpoint of other settings is
    refused with a clear error; a crash between the save's two renames leaves a usable checkpoint."""
    cfg = GRPOConfig(out=str(tmp_path), lora_r=lora_r)
    vlm = TransformersVLM(tiny_dir)
    opt, _ = prepare_model(vlm, 1e-2, lora_r, 8, cfg.lora_targets)
    params = [p for p in vlm.model.parameters() if p.requires_grad]
    samples = _samples(vlm, 2)
    accumulate(opt, params, [samples], 1.0, lambda k, ch: (-token_logprobs(vlm, ch, 1.0)[0].sum(), {}))
    rng = random.Random(3)
    rng.random()
    save_checkpoint(tmp_path, cfg, vlm.model, opt, 6, rng)
    saved = {n: p.detach().clone() for n, p in vlm.model.named_parameters() if p.requires_grad}
    want_rng, want_draw = rng.getstate(), torch.rand(3)
    assert json.loads((tmp_path / "checkpoint" / "config.json").read_text())["lora_r"] == lora_r

    vlm2 = TransformersVLM(tiny_dir)
    opt2, _ = prepare_model(vlm2, 1e-2, lora_r, 8, cfg.lora_targets)
    rng2 = random.Random(99)
    assert load_checkpoint(tmp_path, vlm2.model, opt2, rng2) == 7
    got = {n: p for n, p in vlm2.model.named_parameters() if p.requires_grad}
    assert set(got) == set(saved) and all(torch.equal(got[n], saved[n]) for n in saved)
    assert rng2.getstate() == want_rng and torch.equal(torch.rand(3), want_draw)
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)
    # another LoRA setting does not fit: a clear error, nothing loaded silently
    vlm3 = TransformersVLM(tiny_dir)
    opt3, _ = prepare_model(vlm3, 1e-2, 0 if lora_r else 4, 8, cfg.lora_targets)
    with pytest.raises(ValueError, match="does not fit this model"):
        load_checkpoint(tmp_path, vlm3.model, opt3, random.Random(0))
    # a crash after the old checkpoint was moved aside and before the new one was renamed in
    (tmp_path / "checkpoint").rename(tmp_path / "checkpoint.old")
    (tmp_path / "checkpoint.tmp").mkdir()
    assert load_checkpoint(tmp_path, vlm2.model, opt2, random.Random(0)) == 7
    save_checkpoint(tmp_path, cfg, vlm.model, opt, 7, rng)  # recovers: one checkpoint, no leftovers
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint"]
    assert load_checkpoint(tmp_path, vlm2.model, opt2, random.Random(0)) == 8


# ------------------------------------------------------------------------------------------ rollouts
class _FakeAgent:
    """A FAKE agent: answers DONE and hands in one made-up sample of each role per step."""

    name = "fake"

    def reset(self, slot, task):
        pass

    def act(self, batch):
        from coda_agent.policy import AgentStep

        return [AgentStep("DONE", samples=[Sample("planner", [], [1, 2]), Sample("executor", [], [3])]) for _ in batch]


@fast
def test_collect_groups_tags_samples_with_role_group_and_reward():
    import gymnasium as gym

    from coda_agent.rollout import collect_groups
    from tests.fakes import FAKE_ENV_ID

    envs = gym.make_vec(
        FAKE_ENV_ID,
        num_envs=1,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP},
    )
    try:
        tasks = common.probe_env(FAKE_ENV_ID).tasks
        rollouts = collect_groups(envs, _FakeAgent(), tasks, ["fake_answer", "fake_note", "fake_answer"], 2, seed=0)
    finally:
        envs.close()
    assert [r.group for r in rollouts] == ["fake_answer#0"] * 2 + ["fake_note#1"] * 2 + ["fake_answer#2"] * 2
    assert [r.reward for r in rollouts] == [1.0, 0.0] * 3  # the fake alternates
    for r in rollouts:
        assert [s.role for s in r.samples] == ["planner", "executor"]
        assert all(s.group == r.group and s.reward == r.reward for s in r.samples)


# ------------------------------------------------------------------------------------------ the loop
def _fake_cfg(tmp, **kw):
    from tests.fakes import FAKE_ENV_ID

    base = dict(
        env=FAKE_ENV_ID,
        tasks=["fake_answer", "fake_type_42"],
        out=str(tmp),
        iterations=3,
        tasks_per_iteration=2,
        group_size=2,
        num_envs=1,
        max_steps=1,
        max_new_tokens=6,
        executor_max_new_tokens=4,
        executor_tries=1,
        lr=1e-3,
        lora_r=4,
        lora_alpha=8,
        micro_batch=4,
        kl_coef=0.01,
    )
    return GRPOConfig(**{**base, **kw})


@fast
def test_grpo_loop_progress_per_iteration_metrics_and_resume(tiny_dir, tiny_executor_dir, tmp_path, monkeypatch):
    """On the FAKE app (rewards alternate 1, 0 whatever the agent does), the real GRPO loop with tiny models:
    the progress bar advances once per iteration, right after that iteration's record is written; the
    checkpoint resumes; the trained planner is exported."""
    from tqdm import tqdm

    metrics = tmp_path / "metrics.jsonl"
    seen = []

    class RecordingBar(tqdm):
        def update(self, n=1):
            out = super().update(n)
            seen.append((self.n, len(metrics.read_text().splitlines())))
            return out

    monkeypatch.setattr(common, "tqdm", RecordingBar)
    executor = TransformersVLM(tiny_executor_dir)
    history = train(_fake_cfg(tmp_path), TransformersVLM(tiny_dir), executor, progress=True)
    assert seen == [(1, 1), (2, 2), (3, 3)]  # per iteration, not once per run
    assert [h["iteration"] for h in history] == [0, 1, 2]
    for h in history:
        assert h["samples"] == 4 and h["reward_mean"] == 0.5  # 2 groups x 2 episodes x 1 planner call
        assert h["grad_norm"] > 0 and h["logprob_mismatch"] < 1e-3
    assert (tmp_path / "planner" / "config.json").exists()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert json.loads((tmp_path / "config.json").read_text())["group_size"] == 2
    seen.clear()
    more = train(_fake_cfg(tmp_path, iterations=4), TransformersVLM(tiny_dir), executor, progress=True)
    assert [h["iteration"] for h in more] == [3] and seen == [(4, 4)]
    assert [json.loads(x)["iteration"] for x in metrics.read_text().splitlines()] == [0, 1, 2, 3]


@fast
def test_grpo_trains_uitars_end_to_end_by_role(tiny_dir, tmp_path):
    """agent_factory: --agent uitars trains the acting model itself on its `policy` samples."""
    history = train(_fake_cfg(tmp_path, agent="uitars", iterations=1), TransformersVLM(tiny_dir), progress=False)
    assert history[0]["samples"] == 4 and history[0]["grad_norm"] > 0
    assert (tmp_path / "policy" / "config.json").exists() and not (tmp_path / "planner").exists()
    with pytest.raises(ValueError, match="no executor"):
        train(_fake_cfg(tmp_path / "x", agent="uitars", executor="/x"), TransformersVLM(tiny_dir), progress=False)
    with pytest.raises(ValueError, match="unknown --agent"):
        train(_fake_cfg(tmp_path / "y", agent="nope"), TransformersVLM(tiny_dir), progress=False)


# ------------------------------------------------------------------------------------------ CLI
@fast
def test_train_help_lists_methods_and_every_flag_with_its_default(capsys):
    import dataclasses

    from coda_agent.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert {"coda", "grpo", "sft"} <= set(METHODS)
    for m in METHODS.values():
        assert m.name in text and " ".join(m.help.split()) in text
    for m in METHODS.values():
        with pytest.raises(SystemExit):
            main(["train", m.name, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for f in dataclasses.fields(m.config):
            assert f"--{f.name.replace('_', '-')}" in text
            assert f.metadata.get("help"), f"{m.name}.{f.name} has no help text"
        defaults = {f.name: f.default for f in dataclasses.fields(m.config)}
        if "group_size" in defaults:  # each method's own G (CODA 8, Co-EPG the paper's 7) is shown
            assert f"(default: {defaults['group_size']})" in text
        else:
            assert "(default: check)" in text  # sft's example filter
        assert "--config FILE.json" in text


@fast
def test_train_cli_config_file_and_flags(tmp_path, monkeypatch):
    import argparse

    from coda_agent.cli import main

    monkeypatch.chdir(tmp_path)
    p = argparse.ArgumentParser()
    add_arguments(p)
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({**GRPOConfig(planner="/p", group_size=4).__dict__, "lr": 0.5}))
    args = p.parse_args(
        ["grpo", "--config", str(saved), "--group-size", "6", "--tasks", "a", "b", "--kl-coef", "0", "--no-resume"]
    )
    cfg = config_from_args(GRPOConfig, args)
    assert (cfg.planner, cfg.group_size, cfg.lr, cfg.tasks, cfg.kl_coef, cfg.resume) == (
        "/p",
        6,
        0.5,
        ["a", "b"],
        0.0,
        False,
    )
    saved.write_text(json.dumps({"planer": "/typo"}))
    with pytest.raises(ValueError, match="unknown settings"):
        config_from_args(GRPOConfig, p.parse_args(["grpo", "--config", str(saved)]))
    sft = config_from_args(SFTConfig, p.parse_args(["sft", "--from", "r1", "r2", "--filter", "judge", "--lora-r", "0"]))
    assert (sft.runs, sft.filter, sft.lora_r) == (["r1", "r2"], "judge", 0)
    # clear errors, exit code 2, no traceback, nothing written
    assert main(["train", "grpo", "--executor", "/x"]) == 2
    assert main(["train", "grpo", "--planner", str(tmp_path / "missing"), "--executor", "/x"]) == 2
    assert main(["train", "sft", "--planner", str(tmp_path)]) == 2
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------ learning
TASK = "calc_ans_multiply"  # "compute 17 x 23 ... submit the result as your answer (ANS)"
ANSWERS = ["391", "392", "390", "401"]  # the warm-up teaches the format with four answers, one right


def _success_rate(planner_dir, executor, n, tmp, seed):
    """Success of the planner at temperature 1 over n real episodes (1 step each)."""
    from coda_agent.executor import Executor
    from coda_agent.planner import Planner
    from coda_agent.policy import CodaAgent
    from coda_agent.rollout import collect_groups, make_vector_env

    vlm = TransformersVLM(planner_dir)
    torch.manual_seed(seed)
    agent = CodaAgent(
        Planner(vlm, "kalgebra", params=SamplingParams(max_new_tokens=24, temperature=1.0)),
        Executor(executor, params=SamplingParams(max_new_tokens=8)),
    )
    envs = make_vector_env("coda/KAlgebra-v0", 2, max_steps=1)
    try:
        import coda_env.tasks as ct

        rs = collect_groups(envs, agent, ct.load_tasks("kalgebra"), [TASK], n, seed=seed, out=tmp)
    finally:
        envs.close()
    return sum(r.success for r in rs) / n, rs


@pytest.fixture(scope="module")
def learned(tiny_dir, tmp_path_factory):
    """Warm-up SFT (format, four answers) -> success before; GRPO -> success after."""
    import gymnasium as gym

    from coda_agent.planner import Planner

    tmp = tmp_path_factory.mktemp("grpo")
    env = gym.make("coda/KAlgebra-v0")
    try:
        obs, _ = env.reset(seed=0, options={"task": TASK})
    finally:
        env.close()
    vlm = TransformersVLM(tiny_dir)
    conv = Planner(None, "kalgebra").conversation(obs["instruction"], [], obs["screenshot"])
    warm = [
        Example(TASK, "kalgebra", 1, Sample("planner", conv, []), f"Thought: compute it.\nAction: ANS {a}")
        for a in ANSWERS
    ]
    finetune(SFTConfig(out=str(tmp / "warm"), epochs=120, lr=5e-3, micro_batch=4, lora_r=0), vlm, warm, progress=False)
    executor = TransformersVLM(build_tiny_qwen2_5_vl(tmp / "executor", seed=5))
    before, _ = _success_rate(tmp / "warm" / "planner", executor, 16, tmp / "before", seed=100)
    cfg = GRPOConfig(
        env="coda/KAlgebra-v0",
        tasks=[TASK],
        out=str(tmp / "run"),
        iterations=8,
        tasks_per_iteration=1,
        group_size=8,
        num_envs=2,
        max_steps=1,
        max_new_tokens=24,
        executor_max_new_tokens=8,
        executor_tries=1,
        lr=2e-3,
        kl_coef=0.01,
        lora_r=8,
        lora_alpha=16,
        micro_batch=8,
        epochs=3,
        seed=0,
    )
    history = train(cfg, TransformersVLM(tmp / "warm" / "planner"), executor, progress=False)
    after, _ = _success_rate(tmp / "run" / "planner", executor, 16, tmp / "after", seed=100)
    return {"before": before, "after": after, "history": history, "cfg": cfg, "tmp": tmp, "executor": executor}


def test_grpo_raises_the_success_rate(learned):
    before, after, history = learned["before"], learned["after"], learned["history"]
    print(
        f"success before {before:.2f}, after {after:.2f}; reward per iteration "
        f"{[round(h['reward_mean'], 2) for h in history]}"
    )
    assert after >= before + 0.3, (before, after, history)
    assert all(h["logprob_mismatch"] < 1e-3 for h in history)  # the trainer scores what was sampled
    assert any(h["kl"] > 0 for h in history) and all(h["samples"] == 8 for h in history)


def test_grpo_writes_metrics_tensorboard_and_resumes(learned):
    cfg, tmp = learned["cfg"], learned["tmp"]
    out = tmp / "run"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == list(range(cfg.iterations))
    for key in ("reward_mean/kalgebra", "success_rate", "kl", "clip_frac", "planner_tokens_per_s", "env_steps_per_s"):
        assert key in lines[0]
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert json.loads((out / "config.json").read_text())["group_size"] == 8
    assert (out / "rollouts" / "iter_0000" / "episodes.jsonl").exists()
    # resume: one more iteration continues from the checkpoint (iteration numbers go on)
    cfg2 = GRPOConfig(**{**cfg.__dict__, "iterations": cfg.iterations + 1})
    more = train(cfg2, TransformersVLM(tmp / "warm" / "planner"), learned["executor"], progress=False)
    assert [h["iteration"] for h in more] == [cfg.iterations]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == cfg.iterations + 1


def test_stage2_sft_on_successful_trajectories(learned):
    tmp = learned["tmp"]
    runs = [str(tmp / "run" / "rollouts" / "iter_*"), str(tmp / "after")]
    examples, counts = load_examples(runs)
    assert counts["kept"] >= 4 and counts["examples"] == counts["kept"]  # one planner call per episode
    assert all(e.target.rstrip().endswith("ANS 391") for e in examples)  # only successes are kept
    examples = examples[:16]  # enough to see the loss fall
    vlm = TransformersVLM(build_tiny_qwen2_5_vl(tmp / "generalist", seed=9))
    tokenize(vlm, examples)
    before = mean_loss(vlm, examples)
    hist = finetune(
        SFTConfig(out=str(tmp / "sft"), epochs=6, lr=3e-3, micro_batch=4, grad_accum=2, lora_r=0),
        vlm,
        examples,
        progress=False,
    )
    assert hist[0]["loss"] == pytest.approx(before, rel=1e-4)
    print(f"stage-2 planner loss per epoch: {[round(h['loss'], 3) for h in hist]}")
    assert hist[-1]["loss"] < 0.6 * before, hist
    assert [json.loads(x)["epoch"] for x in (tmp / "sft" / "metrics.jsonl").read_text().splitlines()] == list(range(7))
    # the generalist is a self-contained checkpoint that `coda eval` runs on the app's tasks
    from coda_agent.cli import main

    rc = main(
        [
            "eval",
            "--env",
            "coda/KAlgebra-v0",
            "--agent",
            "coda",
            "--planner",
            str(tmp / "sft" / "planner"),
            "--executor",
            str(tmp / "executor"),
            "--tasks",
            "calc_ans_multiply",
            "--max-steps",
            "1",
            "--out",
            str(tmp / "eval-generalist"),
            "--quiet",
        ]
    )
    results = json.loads((tmp / "eval-generalist" / "results.json").read_text())
    assert rc == 0 and results["summary"]["overall"]["n"] == 1
