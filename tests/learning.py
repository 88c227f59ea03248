"""Helper module (not a test file) that the step-level methods' learning tests share: the KAlgebra task split,
the warm-up plans, the state datasets built once per session, and the state-blind baseline a learning test must
beat.

Why a baseline: at the first step of every KAlgebra task the screen is the same (the Calculator tab), so only
the instruction's words tell which action is right. The first oracle step is one of four actions, and the
instruction names where to act:

    '2D Graph' tab      pyautogui.click(125, 53)    plot_* tasks
    '3D Graph' tab      pyautogui.click(207, 53)    plot3d_*, tab_3d_graph
    'Dictionary' tab    pyautogui.click(291, 53)    dict_*
    console input       pyautogui.click(500, 751)   calc_*

The held-out states come from tasks never trained on and need all four actions (none more than half of them),
so a policy that writes one constant plan whatever the state cannot pass: `state_blind_baseline` scores every
plan the warm-up teaches, as a constant answer, on every held-out state through the method's own reward, and a
learning test asserts that the trained policy beats the best of them by a stated margin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

ENV = "coda/KAlgebra-v0"

# The split (the Co-EPG and PRO-CUA learning tests use it too). HELD_OUT: 7 states, 4 distinct correct actions.
HELD_OUT = [
    "plot_ln_squared",
    "plot_sine_scaled",
    "plot3d_sphere",
    "plot3d_saddle",
    "dict_gcd",
    "calc_power",
    "calc_log2_3",
]
TRAIN = [
    "plot_parabola",
    "plot_abs_shift",
    "plot_circle_implicit",
    "plot_derivative",
    "plot_with_tangent",
    "plot3d_cone",
    "plot3d_gaussian",
    "tab_3d_graph",
    "dict_factorial",
    "dict_conjugate_from_graph",
    "calc_factorial_10",
    "calc_gcd_lcm",
    "calc_hypotenuse",
    "calc_sum_squares",
]
# PRO-CUA's three-way need: its process reward model learns on PRM_TRAIN, the policy on POLICY_TRAIN (TRAIN in two).
PRM_TRAIN = [
    "plot_with_tangent",
    "plot_derivative",
    "plot3d_cone",
    "tab_3d_graph",
    "dict_factorial",
    "calc_factorial_10",
    "calc_gcd_lcm",
]
POLICY_TRAIN = [
    "plot_parabola",
    "plot_abs_shift",
    "plot_circle_implicit",
    "plot3d_gaussian",
    "dict_conjugate_from_graph",
    "calc_hypotenuse",
    "calc_sum_squares",
]
SPLITS = {"train": TRAIN, "held_out": HELD_OUT, "prm_train": PRM_TRAIN, "policy_train": POLICY_TRAIN}

# The plan in words that makes the a11y executor (coda_agent.a11y_executor) perform each first oracle action on
# the real screen. The console input is an unnamed `text` element of the a11y table (11,737,996,30): the executor
# finds it by its kind word ("input field"). "Press enter" is a plan of the wrong action type (a key, never a
# click): it scores 0 everywhere.
CORRECT_PLANS = {
    "pyautogui.click(125, 53)": "Click '2D Graph'",
    "pyautogui.click(207, 53)": "Click '3D Graph'",
    "pyautogui.click(291, 53)": "Click 'Dictionary'",
    "pyautogui.click(500, 751)": "Click the input field",
}
WRONG_TYPE_PLAN = "Press enter"
# What the warm-up teaches, uniformly for every training state (the answer format, never which plan fits where).
PLANS = [*CORRECT_PLANS.values(), WRONG_TYPE_PLAN]

Reward = Callable[[Sequence[dict], Sequence[str]], Sequence[float]]


def answer(plan: str) -> str:
    """The planner's answer that carries `plan` (the format `coda_agent.planner.parse_plan` reads)."""
    return f"Action: {plan}"


# ------------------------------------------------------------------------------------------ the states
_BUILT: dict[Path, dict[str, Path]] = {}


def state_sets(tmp_path_factory) -> dict[str, Path]:
    """The first-step oracle states of every split, as state datasets (`coda_agent.states`): {split name: folder}
    for the names of SPLITS. Built once per pytest session under its base temp folder (real KAlgebra under Xvfb,
    each task's oracle replayed once: about 25 s on 2 cores) and reused by every later call."""
    root = Path(tmp_path_factory.getbasetemp()) / "learning_states"
    if root in _BUILT:
        return _BUILT[root]
    paths = {name: root / name for name in SPLITS}
    if not all((p / "dataset_info.json").exists() for p in paths.values()):
        from coda_agent import states

        tasks = list(dict.fromkeys(t for ts in SPLITS.values() for t in ts))
        report: dict = {}
        firsts = [r for r in states.oracle_states(ENV, tasks, report=report) if r["step"] == 1]
        by_task = {r["task"]: r for r in firsts}
        missing = [t for t in tasks if t not in by_task]
        if missing:
            raise RuntimeError(f"no oracle state for {missing}: {report.get('left_out')}")
        for name, ts in SPLITS.items():
            states.build([by_task[t] for t in ts], paths[name])
    _BUILT[root] = paths
    return paths


def rows(path: Path) -> list[dict]:
    """A state dataset's rows as dicts (the shape the rewards take)."""
    from coda_agent.train.steplevel import load_states

    ds, _ = load_states([path])
    return [dict(r) for r in ds]


# ------------------------------------------------------------------------------------------ the warm-up
def warmup_examples(train_rows: Sequence[dict], plans: Sequence[str] = PLANS, history_images: int = 2) -> list:
    """SFT examples (coda_agent.train.sft.Example) that teach the answer FORMAT only: every plan of `plans` for
    every training state, so the warmed-up planner's choice of plan does not depend on the state."""
    from coda_agent import states
    from coda_agent.train.sft import Example
    from coda_agent.types import Sample

    return [
        Example(
            r["task"],
            r["app"],
            int(r["step"]),
            Sample("planner", states.planner_conversation(r, history_images=history_images), []),
            answer(p),
        )
        for r in train_rows
        for p in plans
    ]


# ------------------------------------------------------------------------------------------ the baseline
def coda_reward(executor=None) -> Reward:
    """CODA's reward as a (rows, texts) -> rewards callable: the a11y executor (or `executor`) grounds each plan,
    `action_reward` = 1[type] + r_dist in [0, 2] scores it against the state's label (coda.score_plans)."""
    from coda_agent.a11y_executor import A11yExecutor
    from coda_agent.train.coda import score_plans

    executor = executor or A11yExecutor((1280, 800))
    return lambda rows, texts: score_plans(executor, rows, texts)[0]


def state_blind_baseline(
    held_rows: Sequence[dict], reward: Reward, plans: Sequence[str] = PLANS
) -> tuple[str, float, dict[str, float]]:
    """The held-out mean reward of each constant plan: `plans[k]` answered (`answer`) at every held-out state
    and scored by `reward` (the same reward the tested method trains and evaluates with). Returns (the best
    plan, its mean reward, {plan: mean reward} for all of them). A policy that writes these plans whatever the
    state has a mean reward that is a mixture of these, so no more than the best one's."""
    table = {}
    for p in plans:
        got = list(reward(list(held_rows), [answer(p)] * len(held_rows)))
        table[p] = sum(got) / len(got)
    best = max(table, key=table.get)
    return best, table[best], table
