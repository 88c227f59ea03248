"""`coda train coda`: CODA's stage 1 as published, step-level GRPO on TRL's GRPOTrainer over state datasets.

Tiny real Qwen2.5-VL checkpoints (coda_agent.tiny), SYNTHETIC states (random screens with a hand-written
accessibility table, named as such), the real a11y executor and the real reward. Fast tier (marker `fast`: no X
server, seconds): the trainer's class, settings, errors, prompts and reward; then short real training runs (no X
server; metrics, checkpoints and resume, the export, the command, the GPU benchmark's CPU path), the paper's
loop on the real KAlgebra env, and the learning test (about 40 s): real KAlgebra states, a tiny planner warmed
up to write one of four plans, GRPO through the a11y executor raises its mean reward on held-out states."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from coda_agent.models import TransformersVLM  # noqa: E402
from coda_agent.tiny import build_tiny_qwen2_5_vl  # noqa: E402
from coda_agent.train import METHODS, add_arguments, config_from_args  # noqa: E402
from coda_agent.train.coda import CodaConfig, build_trainer  # noqa: E402
from coda_agent.train.steplevel import config_flags, grpo_args, launch_command  # noqa: E402
from coda_agent.train.steplevel import ImageTextProcessor, load_states, trl_messages  # noqa: E402

fast = pytest.mark.fast
ROOT = Path(__file__).resolve().parent.parent

# A SYNTHETIC screen's accessibility table: KAlgebra's four tabs where the real app has them.
TABLE = (
    "role\tname\ttext\tx,y,w,h\tstates\n"
    "page tab\tCalculator\t\t0,39,85,27\tenabled,showing\n"
    "page tab\t2D Graph\t\t85,39,82,27\tenabled,showing\n"
    "page tab\t3D Graph\t\t167,39,82,27\tenabled,showing\n"
    "page tab\tDictionary\t\t249,39,86,27\tenabled,showing\n"
)


def synthetic_states(path: Path, n: int = 4, app: str = "kalgebra", history: int = 0) -> Path:
    """SYNTHETIC state dataset in coda_agent.states' format (random screens; target: the '2D Graph' tab)."""
    from coda_agent import states

    rng = np.random.default_rng(len(str(path)))
    rows = []
    for i in range(n):
        hist = [{"thought": f"t{k}", "action": f"Click the 'Calculator' tab ({k})"} for k in range(history)]
        shots = [rng.integers(0, 255, (800, 1280, 3), dtype=np.uint8) for _ in range(min(history, 2) + 1)]
        rows.append(
            {
                "id": f"synthetic:{i}:{history + 1}",
                "app": app,
                "task": f"synthetic_{i}",
                "step": history + 1,
                "source": "synthetic",
                "instruction": f"Plot x^{i} in the 2D Graph.",
                "history": json.dumps(hist),
                "images": [states._png(x) for x in shots],
                "target": "pyautogui.click(125, 53)",
                "box": [85, 39, 166, 65],
                "radius": 20.0,
                "screen": [1280, 800],
                "a11y": TABLE,
            }
        )
    states.build(rows, path)
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(scope="module")
def states_dir(tmp_path_factory):
    return synthetic_states(tmp_path_factory.mktemp("states") / "synthetic", n=4, history=3)


def _cfg(tiny_dir, states_dir, out, **kw):
    base = dict(
        planner=str(tiny_dir),
        data=[str(states_dir)],
        out=str(out),
        executor="a11y",
        group_size=4,
        states_per_step=2,
        micro_batch=4,
        max_steps=1,
        max_new_tokens=8,
        lora_r=4,
        lora_alpha=8,
        lr=1e-2,
        save_steps=1,
        seed=0,
    )
    return CodaConfig(**{**base, **kw})


# ------------------------------------------------------------------------------------------ pieces
@fast
def test_action_reward_is_importable_from_the_method():
    from coda_agent import steps
    from coda_agent.train import coda

    assert coda.action_reward is steps.action_reward
    assert (
        coda.action_reward("pyautogui.click(100, 50)", "pyautogui.click(125, 53)", (85, 39, 166, 65), (1280, 800))
        == 2.0
    )


@fast
def test_processor_gives_the_live_agents_token_ids(tiny_dir, states_dir):
    """The prompt TRL tokenizes (ImageTextProcessor over the stored state) is, token for token, the prompt the
    live planner sends (TransformersVLM.build_inputs over the same conversation)."""
    from coda_agent.states import planner_conversation

    ds, _ = load_states([states_dir])
    vlm = TransformersVLM(tiny_dir)
    proc = ImageTextProcessor.from_checkpoint(tiny_dir)
    for record in ds:
        conv = planner_conversation(record, history_images=2)
        live = vlm.build_inputs([conv])["input_ids"][0].tolist()
        msgs, images = trl_messages(conv)
        from trl.data_utils import prepare_multimodal_messages

        ids = proc.apply_chat_template(
            [prepare_multimodal_messages(msgs, images)], tokenize=True, return_dict=True, add_generation_prompt=True
        )["input_ids"][0]
        assert list(ids) == live
        assert sum(p["type"] == "image" for m in msgs for p in m["content"]) == len(images) == 3


@fast
def test_help_shows_every_setting_with_its_default(capsys):
    from coda_agent.cli import main

    assert "coda" in METHODS
    with pytest.raises(SystemExit) as e:
        main(["train", "coda", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(CodaConfig):
        assert f"--{f.name.replace('_', '-')}" in text, f.name
        assert f.metadata.get("help"), f"{f.name} has no help text"
    for shown in (
        "--group-size GROUP_SIZE plans sampled per state: the GRPO group G (TRL's num_generations) (default: 8)",
        "(default: 1e-06)",
        "(default: 0.04)",
        "(default: 0.2)",
        "(default: colocate)",
        "--use-vllm, --no-use-vllm",
        "--rounds ROUNDS",
    ):
        assert shown in text, shown


@fast
def test_settings_map_onto_trls_config(tiny_dir, tmp_path):
    proc = ImageTextProcessor.from_checkpoint(tiny_dir)
    cfg = CodaConfig(
        group_size=8,
        states_per_step=4,
        micro_batch=8,
        kl_coef=0.01,
        clip_eps=0.3,
        lr=5e-7,
        temperature=0.9,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_port=8123,
    )
    a = grpo_args(cfg, tmp_path, proc, has_eval=False)
    assert isinstance(a, trl.GRPOConfig)
    assert (
        a.num_generations,
        a.per_device_train_batch_size,
        a.gradient_accumulation_steps,
        a.beta,
        a.epsilon,
        a.learning_rate,
        a.temperature,
        a.use_vllm,
        a.vllm_mode,
        a.vllm_server_port,
        a.loss_type,
    ) == (8, 8, 4, 0.01, 0.3, 5e-7, 0.9, True, "server", 8123, "grpo")
    assert a.generation_kwargs is None  # vLLM: no transformers-only generation kwargs
    a = grpo_args(CodaConfig(), tmp_path, proc, has_eval=False)
    assert a.generation_kwargs["suppress_tokens"] == proc.vision_token_ids()  # no vision placeholders written
    with pytest.raises(ValueError, match="must divide"):
        grpo_args(CodaConfig(group_size=3, states_per_step=1, micro_batch=2), tmp_path, proc, has_eval=False)


@fast
def test_config_flags_rebuild_the_config_and_the_launcher_command():
    import argparse

    cfg = CodaConfig(
        planner="/p",
        data=["a", "b"],
        executor="http://h:1/v1",
        kl_coef=0.0,
        resume=False,
        use_vllm=True,
        tasks=["t1"],
        clip_eps_high=0.28,
    )
    p = argparse.ArgumentParser()
    add_arguments(p)
    again = config_from_args(CodaConfig, p.parse_args(["coda", *config_flags(cfg)]))
    assert again == cfg
    argv = launch_command("accelerate launch --config_file configs/accelerate/multi_gpu_zero3.yaml", cfg)
    assert argv[:5] == ["accelerate", "launch", "--config_file", "configs/accelerate/multi_gpu_zero3.yaml", "-m"]
    assert argv[5:8] == ["coda_agent.cli", "train", "coda"]
    assert launch_command("srun -n 1", cfg)[2:4] != ["-m", "coda_agent.cli"]  # srun runs this Python


@fast
def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    kinds = {}
    for f in sorted((ROOT / "configs" / "accelerate").glob("*.yaml")):
        c = load_config_from_file(str(f))
        kinds[f.stem] = (str(c.distributed_type), c.mixed_precision)
    assert kinds == {
        "single_gpu": ("DistributedType.NO", "bf16"),
        "multi_gpu_zero3": ("DistributedType.DEEPSPEED", "bf16"),
        "multi_gpu_fsdp": ("DistributedType.FSDP", "bf16"),
    }


# ------------------------------------------------------------------------------------------ errors
@fast
def test_errors_are_one_line_and_exit_code_2(tiny_dir, states_dir, tmp_path, capsys):
    from coda_agent.cli import main

    other = synthetic_states(tmp_path / "texstudio", n=2, app="texstudio")
    capsys.readouterr()
    base = ["train", "coda", "--planner", str(tiny_dir), "--executor", "a11y", "--out", str(tmp_path / "run")]
    cases = {
        "missing dataset": (base + ["--data", str(tmp_path / "nowhere")], "does not exist"),
        "another app (--app)": (base + ["--data", str(other), "--app", "kalgebra"], "not kalgebra"),
        "another app (--env)": (base + ["--data", str(other), "--env", "coda/KAlgebra-v0"], "not kalgebra"),
        "mixed apps": (base + ["--data", str(states_dir), str(other)], "mix apps"),
        "no dataset": (base, "--data"),
        "unreachable executor": (
            [
                "train",
                "coda",
                "--planner",
                str(tiny_dir),
                "--data",
                str(states_dir),
                "--executor",
                "http://127.0.0.1:9/v1",
                "--out",
                str(tmp_path / "run"),
            ],
            "did not answer",
        ),
        "no executor": (
            ["train", "coda", "--planner", str(tiny_dir), "--data", str(states_dir), "--out", str(tmp_path / "run")],
            "--executor",
        ),
        "endpoint planner": (base + ["--data", str(states_dir), "--planner", "http://127.0.0.1:9"], "endpoint"),
        "too few screenshots": (base + ["--data", str(states_dir), "--history-images", "5"], "--history-images 5"),
    }
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        cases["no vllm"] = (base + ["--data", str(states_dir), "--use-vllm"], "pip install vllm")
    for name, (argv, needle) in cases.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("coda train coda: error:"), (name, err)
        assert needle in err, (name, err)
    assert not (tmp_path / "run").exists()


@fast
def test_reward_goes_through_the_executor(states_dir):
    """Sampled planner answers -> the a11y executor -> action_reward against the label (2D Graph tab)."""
    from coda_agent.a11y_executor import A11yExecutor
    from coda_agent.train.coda import ExecutorReward

    ds, _ = load_states([states_dir])
    rec = ds[0]
    texts = [
        "Thought: the tab.\nAction: Click the '2D Graph' tab.",
        "Action: Click '3D Graph'",
        "no plan here",
        "Action: Press enter",
        "Action: Click 'Nothing like it'",
        "Action: DONE",
    ]
    logged = {}
    columns = {k: [rec[k]] * len(texts) for k in rec}
    rewards = ExecutorReward(A11yExecutor((1280, 800)))(
        prompts=[None] * len(texts),
        completions=[[{"role": "assistant", "content": t}] for t in texts],
        log_metric=lambda k, v: logged.setdefault(k, v),
        **columns,
    )
    assert rewards[0] == 2.0  # inside the box: 1 + 1
    assert 1.0 < rewards[1] < 1.5  # a click, 41 px off the box: 1 + exp(-41/50)
    assert rewards[2:] == [0.0, 0.0, 0.0, 0.0]  # no plan; a key; nothing to click; DONE
    assert logged == {
        "planner/parse_error_rate": 1 / 6,
        "executor/parse_error_rate": 1 / 4,
        "reward/type_match_rate": 2 / 6,
    }


class FakeReward:
    """FAKE extra reward for fast tests: a random tiny planner writes no plan that parses, so the real reward is
    0 for every sample; this one (the mean token id, scaled) makes advantages non-zero so the update runs."""

    __name__ = "fake_token_ids"

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        return [sum(ids) / max(1, len(ids)) / 1000 for ids in completion_ids]


def test_the_command_trains_and_says_where_the_planner_is(tiny_dir, states_dir, tmp_path, capsys):
    from coda_agent.cli import main

    out = tmp_path / "cli"
    assert (
        main(
            [
                "train",
                "coda",
                "--planner",
                str(tiny_dir),
                "--data",
                str(states_dir),
                "--executor",
                "a11y",
                "--max-steps",
                "1",
                "--group-size",
                "2",
                "--states-per-step",
                "2",
                "--micro-batch",
                "4",
                "--max-new-tokens",
                "4",
                "--lora-r",
                "2",
                "--out",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "1 steps over 4 states" in text and f"planner: {out / 'planner'}" in text
    assert (out / "planner" / "config.json").exists()


# ------------------------------------------------------------------------------------------ the trainer
@pytest.fixture(scope="module")
def built(tiny_dir, states_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("coda") / "run"
    cfg = _cfg(tiny_dir, states_dir, out, eval_data=[str(states_dir)], eval_generations=4)
    trainer = build_trainer(
        cfg,
        out,
        progress=False,  # what `coda train coda` builds, then runs
        extra_rewards=[FakeReward()],
    )
    return {"cfg": cfg, "out": out, "trainer": trainer}


@pytest.fixture(scope="module")
def one_run(built):
    from coda_agent.train.coda import run_trainer

    summary = run_trainer(built["trainer"], built["cfg"], built["out"], base=built["cfg"].planner)
    return {**built, "summary": summary}


@fast
def test_the_trainer_is_trls(built):
    assert isinstance(built["trainer"], trl.GRPOTrainer)
    assert built["trainer"].reward_func_names == ["action_reward", "fake_token_ids"]
    assert built["trainer"].num_generations == 4


def test_run_writes_metrics_checkpoints_and_a_planner_eval_loads(one_run, tiny_dir):
    out, summary = one_run["out"], one_run["summary"]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "rewards/action_reward/mean" in x]
    assert steps and all(
        k in steps[-1]
        for k in ("reward", "kl", "executor/parse_error_rate", "planner/parse_error_rate", "completions/mean_length")
    )
    assert lines[-1]["summary"] and {
        "eval_reward_before",
        "eval_reward_after",
        "states_per_s",
        "generated_tokens_per_s",
    } <= set(lines[-1])
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert (out / "checkpoints" / "checkpoint-1" / "trainer_state.json").exists()
    assert json.loads((out / "config.json").read_text())["group_size"] == 4
    planner = TransformersVLM(out / "planner")  # what `coda eval --planner` loads
    base = TransformersVLM(tiny_dir)
    diff = sum(
        float((a - b).abs().sum())
        for a, b in zip(planner.model.state_dict().values(), base.model.state_dict().values())
    )
    assert diff > 0  # the merged adapter changed the weights
    assert summary["steps"] == 1


def test_rerun_resumes_from_the_newest_checkpoint(one_run):
    from coda_agent.train.coda import train_once

    cfg = dataclasses.replace(one_run["cfg"], max_steps=2, eval_data=[])
    summary = train_once(cfg, progress=False)
    assert summary["steps"] == 2
    state = json.loads((one_run["out"] / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())
    assert [r["step"] for r in state["log_history"] if "loss" in r] == [1, 2]


# ------------------------------------------------------------------------------------------ GPU benchmark (CPU side)
@fast
def test_gpu_benchmark_arguments(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_train", ROOT / "benchmarks" / "gpu_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--dry-run"]) == 0
    shown = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (shown["steps"], shown["group_size"], shown["data"]) == (3, 8, "SYNTHETIC")
    for bad in (
        ["--steps", "0"],
        ["--group-size", "1"],
        ["--model", "3b", "--device", "cpu"],
        ["--states-per-step", "3", "--group-size", "3", "--micro-batch", "2"],
    ):
        with pytest.raises(SystemExit) as e:
            bench.parse_args(bad)
        assert e.value.code == 2
    cfg = bench.coda_config(bench.parse_args([]))
    assert (cfg.group_size, cfg.max_steps, cfg.lora_r > 0, cfg.executor) == (8, 3, True, "a11y")
    if not torch.cuda.is_available():
        assert bench.main([]) == 2
        assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["coda", "co-epg", "pro-cua"])
def test_gpu_benchmark_runs_on_cpu_with_a_tiny_model(tmp_path, states_dir, capsys, method):
    """The benchmark's whole path (model built from a config, LoRA, TRL, the method's reward (CODA's executor
    reward; Co-EPG's C-DREM over a second random model; PRO-CUA's VLM PRM, a second random model) plus the
    synthetic one, the adapter check) with the tiny config on the CPU."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_train", ROOT / "benchmarks" / "gpu_train.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(
        [
            "--model",
            "tiny",
            "--device",
            "cpu",
            "--data",
            str(states_dir),
            "--states",
            "8",
            "--steps",
            "2",
            "--group-size",
            "4",
            "--states-per-step",
            "2",
            "--micro-batch",
            "8",
            "--max-new-tokens",
            "8",
            "--lr",
            "1e-2",
            "--out",
            str(tmp_path / "b"),
            "--method",
            method,
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    result = json.loads(next(x for x in out.splitlines() if x.startswith('{"model_build_s"')))
    assert result["loss_finite"] and result["adapter_changed"] and len(result["seconds_per_step"]) == 2
    # the method's own reward was computed at every step (a random model's: its value is not the point)
    assert all(r is not None for r in result["real_reward_mean"]), result


# ------------------------------------------------------------------------------------------ the paper's loop
def test_rounds_collect_label_train_and_resume(tiny_dir, tmp_path):
    """--rounds on the real KAlgebra env: the starting planner's live run, then per round the oracle's states
    (+ successful live episodes) -> GRPO -> the new planner's live run; each round's live success rate in
    OUT/metrics.jsonl; a rerun with more rounds resumes after the finished ones."""
    from coda_agent.train.coda import run_rounds

    cfg = CodaConfig(
        planner=str(tiny_dir),
        executor="a11y",
        rounds=1,
        env="coda/KAlgebra-v0",
        tasks=["tab_3d_graph"],
        episodes=1,
        num_envs=1,
        episode_steps=2,
        group_size=2,
        states_per_step=2,
        micro_batch=4,
        max_steps=1,
        max_new_tokens=8,
        lora_r=4,
        lora_alpha=8,
        out=str(tmp_path / "loop"),
        save_steps=1,
    )
    history = run_rounds(cfg, progress=False)
    assert [h["round"] for h in history] == [-1, 0]
    assert all(0.0 <= h["live_success_rate"] <= 1.0 for h in history)
    out = tmp_path / "loop"
    assert (out / "oracle_states" / "dataset_info.json").exists()
    assert (out / "round_00" / "train" / "planner" / "config.json").exists()
    assert (out / "round_00" / "eval" / "results.json").exists()
    assert history[1]["states"] == 2  # tab_3d_graph's oracle: click the tab, DONE
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == [-1, 0]
    # one more round, its GRPO run as a launched process (`env` stands for accelerate launch: the same flags)
    more = run_rounds(dataclasses.replace(cfg, rounds=2, launcher="env"), progress=False)
    assert [h["round"] for h in more] == [-1, 0, 1]
    assert more[:2] == history  # finished rounds are not redone
    assert [json.loads(x)["round"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [-1, 0, 1]
    assert more[2]["planner"].endswith("round_01/train/planner")


# ------------------------------------------------------------------------------------------ learning
TRAIN_TASKS = ["plot_parabola", "plot_abs_shift", "plot_circle_implicit", "plot_derivative"]
HELD_OUT = ["plot_ln_squared", "plot_sine_scaled", "plot_with_tangent"]
# The warm-up teaches the answer format with four plans; the a11y executor grounds each on KAlgebra's tab bar.
# At the first step of a 2D-graph task the labelled action clicks the '2D Graph' tab: that plan scores 2, the
# other tabs 1 + exp(-d/50) (d: their distance to its box), a key press 0 (another action type).
PLANS = ["Click '2D Graph'", "Click '3D Graph'", "Press enter", "Click 'Dictionary'"]


def test_grpo_raises_the_mean_reward_on_held_out_states(tmp_path):
    """A real tiny Qwen2.5-VL planner, the a11y executor, real KAlgebra oracle states of the 2D-graph task
    family (first steps; 4 tasks to train on, 3 held out): a few GRPO steps raise the mean reward on the
    held-out states by at least 0.3."""
    from coda_agent import states
    from coda_agent.train.coda import run_trainer
    from coda_agent.train.sft import Example, SFTConfig, finetune
    from coda_agent.types import Sample

    for name, tasks in (("train", TRAIN_TASKS), ("held", HELD_OUT)):
        states.build([r for r in states.oracle_states("coda/KAlgebra-v0", tasks) if r["step"] == 1], tmp_path / name)
    train_ds, _ = load_states([tmp_path / "train"])
    held_ds, _ = load_states([tmp_path / "held"])
    assert set(train_ds["target"]) == set(held_ds["target"]) == {"pyautogui.click(125, 53)"}
    vlm = TransformersVLM(build_tiny_qwen2_5_vl(tmp_path / "tiny"))
    warm = [
        Example(
            r["task"],
            "kalgebra",
            1,
            Sample("planner", states.planner_conversation(r, history_images=2), []),
            f"Action: {p}",
        )
        for r in train_ds
        for p in PLANS
    ]
    finetune(
        SFTConfig(out=str(tmp_path / "warm"), epochs=16, lr=1e-2, micro_batch=4, lora_r=0), vlm, warm, progress=False
    )
    cfg = CodaConfig(
        planner=str(tmp_path / "warm" / "planner"),
        data=[str(tmp_path / "train")],
        eval_data=[str(tmp_path / "held")],
        out=str(tmp_path / "run"),
        executor="a11y",
        group_size=8,
        states_per_step=4,
        micro_batch=16,
        max_steps=8,
        updates_per_batch=3,
        lr=1e-3,
        kl_coef=0.01,
        max_new_tokens=12,
        lora_r=0,
        eval_generations=16,
        seed=0,
        save_steps=100,
    )
    trainer = build_trainer(cfg, Path(cfg.out), progress=False)
    summary = run_trainer(trainer, cfg, Path(cfg.out), base=cfg.planner)
    before, after = summary["eval_reward_before"], summary["eval_reward_after"]
    print(
        f"held-out mean reward before {before:.3f}, after {after:.3f} ({summary['steps']} GRPO steps, "
        f"{summary['states_per_s']:.2f} states/s, {summary['generated_tokens_per_s']:.1f} generated tokens/s)"
    )
    assert after >= before + 0.3, summary
    assert TransformersVLM(tmp_path / "run" / "planner").model is not None  # coda eval loads it
