"""Task families (coda_env.families): every registered family's instances validate, are deterministic, keep to
their split; the env draws and replays them; the oracles solve them on the real apps (KAlgebra, TeXstudio) and
score 0 on the wrong instance."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import coda_env  # noqa: F401 - registers the apps
from coda_env import families as F
from coda_env.apps._fake import register_fake
from coda_env.registry import APPS, unregister_app
from coda_env.tasks import TaskError, parse_task

ALL = [f for spec in APPS.values() for f in spec.families if spec.name != "fake"]


@pytest.fixture
def fake_app():
    register_fake()
    yield
    unregister_app("fake")


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


@pytest.mark.fast
@pytest.mark.parametrize("family", ALL, ids=lambda f: f.name)
def test_a_thousand_instances_validate_without_x_and_keep_to_their_split(family):
    splits: dict[str, set[str]] = {s: set() for s in F.SPLITS}
    for seed in range(1000):
        task = family.instance(seed)  # parse_task's validation: fields, checks, setup operations, the oracle
        assert task.id == f"{family.name}/{seed}" and task.solution and task.evaluate
        p = family.params(seed)
        splits[family.split_of(p)].add(_key(p))
    assert not splits["train"] & splits["test"] and not splits["train"] & splits["val"]
    assert not splits["val"] & splits["test"]
    assert all(splits.values()), {s: len(v) for s, v in splits.items()}
    distinct = sum(len(v) for v in splits.values())
    assert family.size >= 1000 and distinct <= family.size, (family.size, distinct)
    print(family.name, {s: len(v) for s, v in splits.items()}, "of", family.size)


@pytest.mark.fast
@pytest.mark.parametrize("family", ALL, ids=lambda f: f.name)
def test_the_same_seed_gives_the_same_task_byte_for_byte(family):
    for seed in (0, 1, 12345, F.MAX_SEED):
        assert json.dumps(family.task_data(seed)) == json.dumps(family.task_data(seed))
        assert family.instance(seed) == family.instance(seed)
    # seeds that give the same parameters share a split: it hashes the parameters, never the seed
    by_params: dict[str, str] = {}
    for seed in range(3000):
        p = family.params(seed)
        assert by_params.setdefault(_key(p), family.split_of(p)) == family.split_of(p)


@pytest.mark.fast
def test_no_family_is_named_like_a_shipped_task():
    """`--tasks calc_power` must keep meaning the task file (a family of that name once took it over)."""
    from coda_env.tasks import load_tasks

    for spec in APPS.values():
        clash = set(F.families(spec.name)) & set(load_tasks(spec.name)) if spec.families else set()
        assert not clash, (spec.name, clash)
    # and where a user's task is named like a family, the task wins on a command line
    assert F.expand("kalgebra", ["plot2d_poly"], None, 3, task_ids=["plot2d_poly"]) == ["plot2d_poly"]


@pytest.mark.fast
def test_an_instance_is_the_same_on_every_machine():
    """random.Random seeded with a string hashes it with SHA-512: the stream, and so the task, are fixed."""
    kalg = F.families("kalgebra")
    assert kalg["plot2d_poly"].instance(7).instruction == "In KAlgebra's 2D Graph, plot y = -3x^2 - 7x + 3."
    assert kalg["calc_arith"].instance(7).instruction == (
        "In KAlgebra's Calculator, store 48 plus 80 in a variable named `u`."
    )
    assert kalg["plot2d_poly"].split(7) == "train" and kalg["plot3d_plane"].split(7) == "val"


@pytest.mark.fast
def test_bad_seeds_and_hostile_generators_are_refused():
    fam = F.families("kalgebra")["calc_exponent"]
    for bad in (-1, F.MAX_SEED + 1, 1.5, True, "3"):
        with pytest.raises(TaskError, match="seed"):
            fam.instance(bad)
    with pytest.raises(TaskError, match="split"):
        fam.draw(__import__("random").Random(0), "dev")
    # a generator's output passes the validators of a task file: a predicate that runs code is refused
    hostile = F.Family(
        "hostile",
        "kalgebra",
        "x",
        {},
        lambda rng: {},
        lambda p: {
            "instruction": "x",
            "steps": 1,
            "evaluate": [{"type": "predicate", "expr": "lambda s: __import__('os').system('true')"}],
        },
        1000,
    )
    with pytest.raises(TaskError):
        hostile.instance(0)
    with pytest.raises(TaskError):
        parse_task({**hostile.task_data(0), "id": "hostile.0"})


@pytest.mark.fast
def test_the_env_draws_instances_of_the_split_and_replays_one_by_id(fake_app):
    env = gym.make("coda/Fake-v0", tasks="families", split="test")
    fam = F.families("fake")["fake_type"]
    drawn = []
    for seed in range(12):
        _, info = env.reset(seed=seed)
        name, s = F.parse_id(info["task"])
        assert name == "fake_type" and fam.split(s) == "test", info["task"]
        drawn.append(info["task"])
    assert len(set(drawn)) > 6
    assert env.reset(seed=3)[1]["task"] == drawn[3]  # reset(seed=s) draws deterministically
    # one instance replayed by id: its oracle scores 1, another instance's oracle 0, DONE 0
    a, b = drawn[0], next(t for t in drawn if fam.params(F.parse_id(t)[1]) != fam.params(F.parse_id(drawn[0])[1]))
    for tid, oracle, want in ((a, a, 1.0), (a, b, 0.0)):
        obs, info = env.reset(options={"task": tid})
        assert obs["instruction"] == env.unwrapped.tasks[tid].instruction and info["task"] == tid
        for action in env.unwrapped.tasks[oracle].solution:
            _, r, term, trunc, info = env.step(action)
        assert term and r == want, (tid, oracle, info.get("checks"))
    env.reset(options={"task": a})
    assert env.step("DONE")[1] == 0.0
    env.close()
    # a list may mix task ids and family names
    env = gym.make("coda/Fake-v0", tasks=["fake_answer", "fake_type"], split="train")
    seen = {env.reset(seed=s)[1]["task"].split("/")[0] for s in range(20)}
    assert seen == {"fake_answer", "fake_type"}
    env.close()
    env = gym.make("coda/Fake-v0", tasks=["families"], split="val")  # a command line's `--tasks families`
    _, info = env.reset(seed=0)
    assert fam.split(F.parse_id(info["task"])[1]) == "val"
    env.close()


@pytest.mark.fast
def test_bad_family_options_name_the_problem(fake_app):
    cases = [
        ({"tasks": "famlies"}, "tasks must be"),
        ({"tasks": ["nope_family"]}, "unknown task"),
        ({"tasks": "families", "split": "dev"}, "split must be"),
        ({"tasks": ["fake_answer"], "split": "test"}, "draws family instances"),
    ]
    for kw, want in cases:
        with pytest.raises(TaskError, match=want):
            gym.make("coda/Fake-v0", **kw)
    env = gym.make("coda/Fake-v0", tasks="families")
    for bad, want in (
        ("fake_type/99999999999", "unknown task"),
        ("nope/3", "unknown task"),
        ("fake_type/07", "unknown"),
    ):
        with pytest.raises(TaskError, match=want):
            env.reset(options={"task": bad})
    _, info = env.reset(options={"task": "fake_type/5"})  # the env stays usable
    assert info["task"] == "fake_type/5"
    env.close()


# ------------------------------------------------------------------------------------------ the real apps
REAL = sorted((f for f in ALL if f.app in ("kalgebra", "texstudio")), key=lambda f: f.app)


def _replay(env, tid: str, oracle: str) -> tuple[float, dict]:
    env.reset(options={"task": tid})
    r, info = 0.0, {}
    for action in env.unwrapped.tasks[oracle].solution:
        _, r, term, trunc, info = env.step(action)
        assert info["action_error"] is None, (tid, action, info["action_error"])
        if term or trunc:
            break
    return r, info


def _oracle_check(env, family, n: int) -> None:
    seeds = [s for s in range(10 * n + 50) if family.split(s) == "test"][:n]
    solved = []
    for s in seeds:
        r, info = _replay(env, f"{family.name}/{s}", f"{family.name}/{s}")
        solved.append(r == 1.0)
        assert r == 1.0, (family.name, s, info.get("checks"))
        env.reset(options={"task": f"{family.name}/{s}"})
        assert env.step("DONE")[1] == 0.0
    other = next(s for s in seeds[1:] if family.params(s) != family.params(seeds[0]))
    r, info = _replay(env, f"{family.name}/{seeds[0]}", f"{family.name}/{other}")
    assert r == 0.0, (family.name, "another instance's oracle passed", info.get("checks"))
    print(family.name, f"oracle {sum(solved)}/{len(solved)} test-split instances")


class _Envs:
    """One real env at a time, per app, over the module (the families are grouped by app)."""

    def __init__(self):
        self.app, self.env = None, None

    def get(self, app: str):
        if app != self.app:
            self.close()
            self.app = app
            self.env = gym.make(APPS[app].env_id, tasks="families", split="test")
        return self.env

    def close(self):
        if self.env is not None:
            self.env.close()
        self.app, self.env = None, None


@pytest.fixture(scope="module")
def family_envs():
    envs = _Envs()
    yield envs
    envs.close()


@pytest.mark.parametrize("family", REAL, ids=lambda f: f.name)
def test_oracles_solve_two_test_instances(family_envs, family):
    _oracle_check(family_envs.get(family.app), family, 2)


@pytest.mark.slow
@pytest.mark.parametrize("family", REAL, ids=lambda f: f.name)
def test_oracles_solve_twenty_test_instances(family_envs, family):
    _oracle_check(family_envs.get(family.app), family, 20)


@pytest.mark.fast
def test_command_lines_expand_family_names_into_instances_of_a_split(capsys):
    ids = F.instance_ids("kalgebra", "families", "test", 14, seed=3)
    assert ids == F.instance_ids("kalgebra", "families", "test", 14, seed=3)  # a fixed evaluation set
    fams = F.families("kalgebra")
    assert len(set(ids)) == 14 and all(fams[F.parse_id(t)[0]].split(F.parse_id(t)[1]) == "test" for t in ids)
    assert {F.parse_id(t)[0] for t in ids} == set(fams)  # every family in turn
    mixed = F.expand("kalgebra", ["plot_parabola", "calc_exponent"], "train", 3)
    assert mixed[0] == "plot_parabola" and len(mixed) == 4 and all(t.startswith("calc_exponent/") for t in mixed[1:])
    assert F.expand("kalgebra", ["plot_parabola"], None, 3) == ["plot_parabola"]
    with pytest.raises(TaskError, match="--split draws family instances"):
        F.expand("kalgebra", ["plot_parabola"], "test", 3)
    from coda_agent.cli import main

    assert main(["tasks", "kalgebra", "--families"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in fams) and "FAMILY/SEED" in out


def test_coda_eval_and_coda_data_run_family_instances_of_a_split(tmp_path, capsys):
    from coda_agent.cli import main

    out = tmp_path / "ev"
    argv = ["eval", "--agent", "oracle", "--tasks", "families", "--split", "test", "--episodes", "7"]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    res = json.loads((out / "results.json").read_text())
    tasks = [e["task"] for e in res["episodes"]]
    assert tasks == F.instance_ids("kalgebra", "families", "test", 7) and all(e["success"] for e in res["episodes"])
    assert all((out / "trajectories" / f"{t.replace('/', '@')}__0" / "steps.jsonl").exists() for t in tasks)
    argv = ["data", "states", "oracle", "--tasks", "calc_exponent", "--split", "train", "--limit", "2"]
    assert main([*argv, "--out", str(tmp_path / "st"), "--quiet"]) == 0
    assert "wrote 6 states" in capsys.readouterr().out  # 2 instances: click the console, type, DONE
