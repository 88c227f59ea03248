"""Task families: seeded generators of ordinary tasks, with train/val/test splits fixed by their parameters.

A family turns a seed into parameters (`sample`, from `random.Random(f"{name}/{seed}")`: the same stream on
every machine and Python 3 version) and parameters into a task dict (`build`): instruction, setup operations,
checks, an oracle `solution`, difficulty, category. The dict goes through `tasks.parse_task`, the validation of a
task file, so a family adds no way to run code or reach paths that a file lacks. An instance's id is
`family/seed`; the same family and seed give the same task, byte for byte.

Splits: an instance belongs to `train`, `val` or `test` by a hash of its family name and parameters (80/10/10),
never by its seed, so two seeds that give the same parameters give the same split, and a test instance can never
be drawn as a train instance under another seed.

Families register in their app's package (`AppSpec.families`), so a new family is an addition to that package.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

from .registry import get_app_spec
from .tasks import Task, TaskError, parse_task

SPLITS = ("train", "val", "test")
_SPLIT_EDGES = (80, 90)  # hash % 100 below 80: train; below 90: val; else test
MAX_SEED = 2**31 - 1


@dataclass(frozen=True)
class Family:
    """A generator of one kind of task for one app.

    `sample(rng)` draws the parameters (JSON data) from a `random.Random`; `build(params)` turns them into a
    task dict without "id" and "app"; `space` says in words what each parameter ranges over (for `coda tasks
    APP --families`); `size` is the number of distinct parameter sets the family can draw (or a lower bound)."""

    name: str
    app: str
    describe: str
    space: dict[str, str]
    sample: Callable[[random.Random], dict[str, Any]]
    build: Callable[[dict[str, Any]], dict[str, Any]]
    size: int

    def params(self, seed: int) -> dict[str, Any]:
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
            raise TaskError(f"family {self.name!r}: a seed is an integer in [0, {MAX_SEED}], got {seed!r}")
        return self.sample(random.Random(f"{self.name}/{seed}"))

    def split_of(self, params: dict[str, Any]) -> str:
        """The split of a parameter set: a hash of the family's name and the parameters, never of the seed."""
        key = json.dumps([self.name, params], sort_keys=True, separators=(",", ":"))
        bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
        return SPLITS[sum(bucket >= e for e in _SPLIT_EDGES)]

    def task_data(self, seed: int) -> dict[str, Any]:
        """The task dict of instance `seed` (what a task file would hold), its id `family/seed`."""
        params = self.params(seed)
        data = {"id": f"{self.name}/{seed}", "app": self.app, **self.build(params)}
        data["origin"] = f"family:{self.name}"
        return data

    def instance(self, seed: int) -> Task:
        """Instance `seed` as a validated Task (the checks of a task file)."""
        data = self.task_data(seed)
        # the id pattern of task files has no '/', so the instance validates under a stand-in id
        task = parse_task({**data, "id": f"{self.name}.{seed}"}, f"<family {self.name} seed {seed}>")
        return replace(task, id=data["id"], path=f"family:{self.name}/{seed}")

    def split(self, seed: int) -> str:
        return self.split_of(self.params(seed))

    def draw(self, rng: Any, split: str | None = None, tries: int = 1000) -> Task:
        """An instance of `split` (any split when None), its seed drawn from `rng` (numpy's Generator or
        `random.Random`): deterministic given the rng's state."""
        if split is not None and split not in SPLITS:
            raise TaskError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        for _ in range(tries):
            seed = int(rng.integers(MAX_SEED + 1)) if hasattr(rng, "integers") else rng.randint(0, MAX_SEED)
            if split is None or self.split(seed) == split:
                return self.instance(seed)
        raise TaskError(f"family {self.name!r} drew no {split} instance in {tries} tries")


def families(app: str) -> dict[str, Family]:
    """The families an app's package registers, by name."""
    return {f.name: f for f in get_app_spec(app).families}


def parse_id(task_id: str) -> tuple[str, int] | None:
    """("family", seed) for an instance id `family/seed`; None for any other id."""
    name, sep, seed = task_id.partition("/")
    if not sep or not seed.isdigit() or len(seed) > 10 or (seed.startswith("0") and seed != "0"):
        return None  # one spelling per instance: "plot2d_poly/007" is not "plot2d_poly/7"
    return name, int(seed)


def split_sizes(family: Family, seeds: int = 2000) -> dict[str, int]:
    """How many distinct parameter sets of each split the first `seeds` seeds give (a sampled estimate of the
    split's share of `family.size`)."""
    seen: dict[str, set[str]] = {s: set() for s in SPLITS}
    for seed in range(seeds):
        p = family.params(seed)
        seen[family.split_of(p)].add(json.dumps(p, sort_keys=True))
    return {s: len(v) for s, v in seen.items()}


class TaskSet(Mapping):
    """An app's tasks by id: the task files' (listed, iterated) and every family instance `family/seed`
    (made on first lookup, never listed: families hold thousands)."""

    def __init__(self, static: Mapping[str, Task], fams: Mapping[str, Family]):
        self.static, self.families = static, fams
        self._made: dict[str, Task] = {}

    def __getitem__(self, task_id: str) -> Task:
        if task_id in self.static:
            return self.static[task_id]
        if task_id in self._made:
            return self._made[task_id]
        parsed = parse_id(task_id) if isinstance(task_id, str) else None
        if parsed is None or parsed[0] not in self.families:
            raise KeyError(task_id)
        task = self.families[parsed[0]].instance(parsed[1])
        if len(self._made) > 10_000:
            self._made.clear()
        self._made[task_id] = task
        return task

    def __iter__(self) -> Iterator[str]:
        return iter(self.static)

    def __len__(self) -> int:
        return len(self.static)


def instance_ids(app: str, names: Sequence[str] | str, split: str | None, n: int, seed: int = 0) -> list[str]:
    """`n` distinct instance ids of `split` from the named families (or "families": all of the app's), taken in
    turn from each family with seeds drawn from `random.Random(seed)`: a fixed evaluation set for (n, seed)."""
    if split is not None and split not in SPLITS:
        raise TaskError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    fams = [families(app)[name] for name in pick_families(app, names)]
    rng = random.Random(seed)
    ids: list[str] = []
    seen: set[str] = set()
    while len(ids) < n:
        fam = fams[len(ids) % len(fams)]
        for _ in range(10_000):
            s = rng.randint(0, MAX_SEED)
            params = fam.params(s)
            key = json.dumps([fam.name, params], sort_keys=True)
            if key not in seen and (split is None or fam.split_of(params) == split):
                break
        else:
            raise TaskError(f"family {fam.name!r} has no more distinct {split or ''} instances to draw")
        seen.add(key)
        ids.append(f"{fam.name}/{s}")
    return ids


def expand(
    app: str, names: Sequence[str], split: str | None, n: int, seed: int = 0, task_ids: Iterable[str] = ()
) -> list[str]:
    """Task ids for a command line's `--tasks`: "families" or family names become `n` instances of `split`
    (instance_ids); task ids stay (a name that is both, in `task_ids`, is the task)."""
    fams = families(app)
    static = set(task_ids)
    picked = [t for t in names if t not in static and (t == "families" or t in fams)]
    if not picked:
        if split is not None:
            raise TaskError("--split draws family instances: name families in --tasks (or --tasks families)")
        return list(names)
    rest = [t for t in names if t not in picked]
    want = "families" if "families" in picked else picked
    return rest + instance_ids(app, want, split, n, seed)


def pick_families(app: str, names: Sequence[str] | str) -> list[str]:
    """Family names from "families" (all of the app's) or a list naming some; unknown names are an error."""
    known = families(app)
    if names == "families":
        if not known:
            raise TaskError(f"app {app!r} registers no task families")
        return list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise TaskError(f"unknown families for app {app!r}: {', '.join(unknown)} (known: {', '.join(known)})")
    return list(names)
