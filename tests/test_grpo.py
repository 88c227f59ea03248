"""Decoupled GRPO: the maths on small tensors, then a learning run of a tiny real Qwen2.5-VL planner on the
real KAlgebra env, then stage-2 SFT on that run's successful trajectories."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from coda_agent.grpo import GRPOConfig, grpo_loss, group_advantages, token_logprobs, train   # noqa: E402
from coda_agent.models import SamplingParams, TransformersVLM                                 # noqa: E402
from coda_agent.policy import PlannerSample                                                    # noqa: E402
from coda_agent.sft import Example, SFTConfig, finetune, load_examples, mean_loss, tokenize    # noqa: E402
from coda_agent.tiny import build_tiny_qwen2_5_vl                                              # noqa: E402


# ------------------------------------------------------------------------------------------ maths
def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0,   1.0, 1.0, 1.0, 1.0,   0.0, 0.0, 0.0, 3.0])
    adv = group_advantages(r, 4, eps=0.0)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1.0, -1.0, 1.0]))      # mean .5, std .5
    assert torch.equal(adv[4:8], torch.zeros(4))                                # std 0: no signal
    std = np.std([0, 0, 0, 3])
    assert torch.allclose(adv[8:], torch.tensor([-0.75, -0.75, -0.75, 2.25]) / std)
    assert torch.allclose(adv.view(3, 4).sum(1), torch.zeros(3), atol=1e-6)


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
    assert g[0, 1] == 0                         # ratio above 1+eps with A>0: clipped, no gradient
    assert g[0, 2] != 0 and g[0, 0] != 0        # below the clip with A>0: min picks the unclipped term
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


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny") / "m")


def _samples(vlm, n=5):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        shot = rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)
        conv = [{"role": "user", "content": [{"type": "text", "text": f"task {i}"}, {"type": "image", "image": shot}]}]
        ids = vlm.tokenizer(f"Thought: t{i}\nAction: ANS {i * 7}", add_special_tokens=False)["input_ids"]
        out.append(PlannerSample(conv, ids[: 3 + i], None))          # different lengths: padding in play
    return out


def test_accumulated_micro_batches_equal_one_full_batch(tiny_dir):
    vlm = TransformersVLM(tiny_dir)
    samples = _samples(vlm)
    adv = torch.tensor([1.0, -0.5, 0.3, 2.0, -1.0])
    n = sum(len(s.token_ids) for s in samples)
    with torch.no_grad():
        old, _ = token_logprobs(vlm, samples, 1.0)

    def grads(chunks):
        vlm.model.zero_grad()
        total = 0.0
        for lo, hi in chunks:
            lp, m = token_logprobs(vlm, samples[lo:hi], 1.0)
            t = lp.shape[1]
            loss, _ = grpo_loss(lp, old[lo:hi, -t:], None, adv[lo:hi], m, 0.2, 0.0, n)
            loss.backward()
            total += float(loss)
        return total, [p.grad.clone() for p in vlm.model.parameters() if p.grad is not None]

    full_loss, full = grads([(0, 5)])
    acc_loss, acc = grads([(0, 2), (2, 4), (4, 5)])
    assert abs(full_loss - acc_loss) < 1e-5
    assert len(full) == len(acc) > 0
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(full, acc))
    # the scored tokens are exactly the sampled ones: generate's own log-probs match the trainer's
    shot = np.random.default_rng(3).integers(0, 255, (64, 96, 3), dtype=np.uint8)
    conv = [{"role": "user", "content": [{"type": "text", "text": "go"}, {"type": "image", "image": shot}]}]
    g, = vlm.generate([conv], SamplingParams(max_new_tokens=12, temperature=1.0, logprobs=True, seed=0))
    lp, m = token_logprobs(vlm, [PlannerSample(conv, g.token_ids, g.logprobs)], 1.0)
    assert torch.allclose(lp[0][m[0]], torch.tensor(g.logprobs), atol=1e-4)


# ------------------------------------------------------------------------------------------ learning
TASK = "calc_ans_multiply"                # "compute 17 x 23 ... submit the result as your answer (ANS)"
ANSWERS = ["391", "392", "390", "401"]    # the warm-up teaches the format with four answers, one right


def _success_rate(planner_dir, executor, n, tmp, seed):
    """Success of the planner at temperature 1 over n real episodes (1 step each)."""
    from coda_agent.executor import Executor
    from coda_agent.planner import Planner
    from coda_agent.policy import CodaAgent
    from coda_agent.rollout import collect_groups, make_vector_env
    vlm = TransformersVLM(planner_dir)
    torch.manual_seed(seed)
    agent = CodaAgent(Planner(vlm, "kalgebra", params=SamplingParams(max_new_tokens=24, temperature=1.0)),
                      Executor(executor, params=SamplingParams(max_new_tokens=8)))
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
    warm = [Example(TASK, "kalgebra", 1, PlannerSample(conv, [], None), f"Thought: compute it.\nAction: ANS {a}")
            for a in ANSWERS]
    finetune(SFTConfig(out=str(tmp / "warm"), epochs=120, lr=5e-3, micro_batch=4, lora_r=0), vlm, warm,
             progress=False)
    executor = TransformersVLM(build_tiny_qwen2_5_vl(tmp / "executor", seed=5))
    before, _ = _success_rate(tmp / "warm" / "planner", executor, 16, tmp / "before", seed=100)
    cfg = GRPOConfig(env="coda/KAlgebra-v0", tasks=[TASK], out=str(tmp / "run"), iterations=8,
                     tasks_per_iteration=1, group_size=8, num_envs=2, max_steps=1, max_new_tokens=24,
                     executor_max_new_tokens=8, executor_tries=1, lr=2e-3, kl_coef=0.01, lora_r=8, lora_alpha=16,
                     micro_batch=8, epochs=3, seed=0)
    history = train(cfg, TransformersVLM(tmp / "warm" / "planner"), executor, progress=False)
    after, _ = _success_rate(tmp / "run" / "planner", executor, 16, tmp / "after", seed=100)
    return {"before": before, "after": after, "history": history, "cfg": cfg, "tmp": tmp, "executor": executor}


def test_grpo_raises_the_success_rate(learned):
    before, after, history = learned["before"], learned["after"], learned["history"]
    print(f"success before {before:.2f}, after {after:.2f}; reward per iteration "
          f"{[round(h['reward_mean'], 2) for h in history]}")
    assert after >= before + 0.3, (before, after, history)
    assert all(h["logprob_mismatch"] < 1e-3 for h in history)      # the trainer scores what was sampled
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
    # resume: two more iterations continue from the checkpoint (iteration numbers go on)
    cfg2 = GRPOConfig(**{**cfg.__dict__, "iterations": cfg.iterations + 1})
    more = train(cfg2, TransformersVLM(tmp / "warm" / "planner"), learned["executor"], progress=False)
    assert [h["iteration"] for h in more] == [cfg.iterations]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == cfg.iterations + 1


def test_stage2_sft_on_successful_trajectories(learned):
    tmp = learned["tmp"]
    runs = [str(tmp / "run" / "rollouts" / "iter_*"), str(tmp / "after")]
    examples, counts = load_examples(runs)
    assert counts["kept"] >= 4 and counts["examples"] == counts["kept"]       # one planner call per episode
    assert all(e.target.rstrip().endswith("ANS 391") for e in examples)       # only successes are kept
    examples = examples[:16]                                                   # enough to see the loss fall
    vlm = TransformersVLM(build_tiny_qwen2_5_vl(tmp / "generalist", seed=9))
    tokenize(vlm, examples)
    before = mean_loss(vlm, examples)
    hist = finetune(SFTConfig(out=str(tmp / "sft"), epochs=6, lr=3e-3, micro_batch=4, grad_accum=2, lora_r=0),
                    vlm, examples, progress=False)
    assert hist[0]["loss"] == pytest.approx(before, rel=1e-4)
    print(f"stage-2 planner loss per epoch: {[round(h['loss'], 3) for h in hist]}")
    assert hist[-1]["loss"] < 0.6 * before, hist
    # the generalist is a self-contained checkpoint that `coda eval` runs on the app's tasks
    from coda_agent.cli import main
    rc = main(["eval", "--env", "coda/KAlgebra-v0", "--agent", "coda", "--planner", str(tmp / "sft" / "planner"),
               "--executor", str(tmp / "executor"), "--tasks", "calc_ans_multiply", "--max-steps", "1",
               "--out", str(tmp / "eval-generalist"), "--quiet"])
    results = json.loads((tmp / "eval-generalist" / "results.json").read_text())
    assert rc == 0 and results["summary"]["overall"]["n"] == 1


def test_train_cli_config_file_and_flags(tmp_path):
    import argparse

    from coda_agent.train_cli import add_arguments, config_from_args
    from coda_agent.cli import main
    p = argparse.ArgumentParser()
    add_arguments(p)
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({**GRPOConfig(planner="/p", group_size=4).__dict__, "lr": 0.5}))
    args = p.parse_args(["grpo", "--config", str(saved), "--group-size", "6", "--tasks", "a", "b", "--kl-coef", "0"])
    cfg = config_from_args(GRPOConfig, args)
    assert (cfg.planner, cfg.group_size, cfg.lr, cfg.tasks, cfg.kl_coef) == ("/p", 6, 0.5, ["a", "b"], 0.0)
    saved.write_text(json.dumps({"planer": "/typo"}))
    with pytest.raises(ValueError, match="unknown settings"):
        config_from_args(GRPOConfig, p.parse_args(["grpo", "--config", str(saved)]))
    sft = config_from_args(SFTConfig, p.parse_args(["sft", "--runs", "r1", "--filter", "judge", "--lora-r", "0"]))
    assert (sft.runs, sft.filter, sft.lora_r) == (["r1"], "judge", 0)
    # clear errors, exit code 2, no traceback
    assert main(["train", "grpo", "--executor", "/x"]) == 2
    assert main(["train", "grpo", "--planner", str(tmp_path / "missing"), "--executor", "/x"]) == 2
    assert main(["train", "sft", "--planner", str(tmp_path)]) == 2
