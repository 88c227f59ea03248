"""coda/GRASS-v0 end to end: stock GRASS GIS 8.2 and its wxGUI under real Xvfb (skipped where GRASS is missing).

Every oracle scores 1.0 and DONE at once 0.0; check_env; the app killed mid-episode; no process or home
folder left; the GUI state reader; the `info` and `db` checks on the real app and on fixed data; every
ScienceBoard GrassGIS file converts or is refused with a reason; reset and step timings.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import statistics
import time
from pathlib import Path

import gymnasium as gym
import pytest

import coda_env  # noqa: F401  (registers the env ids)
from coda_env.apps.grass import available, scienceboard
from coda_env.apps.grass.checks import MODULES, build_args, parse_output, resolve
from coda_env.checks import run_checks
from coda_env.registry import CheckContext, CheckError
from coda_env.tasks import TaskError, broken_tasks, load_tasks

from .conftest import live_token_pids, run_solution, wait_until

NEEDS_GRASS = pytest.mark.skipif(available() is not None, reason=str(available()))
TASKS = sorted(load_tasks("grass"))
SB_DIR = (
    Path(os.environ.get("SCIENCEBOARD_DIR", Path(__file__).resolve().parents[1] / ".." / "shared" / "scienceboard"))
    / "tasks"
    / "VM"
    / "GrassGIS"
)


@pytest.fixture(scope="module")
def grass_env():
    env = gym.make("coda/GRASS-v0")
    yield env
    env.close()


# ------------------------------------------------------------------------------------------ task files
def test_tasks_load_and_are_broad():
    assert broken_tasks("grass") == {}
    tasks = load_tasks("grass")
    assert len(tasks) >= 20
    cats = {t.category for t in tasks.values()}
    assert {"layers", "display", "region", "analysis", "attributes", "questions"} <= cats
    assert all(t.solution[-1] == "DONE" or t.solution[-1].startswith("ANS ") for t in tasks.values())


# ------------------------------------------------------------------------------------------ checks (fixed data)
def _ctx(state):
    return CheckContext(answer=None, state=state)


STATE = {
    "layers": [
        {"name": "towns@PERMANENT", "opacity": 0.5, "checked": True, "params": {"color": "red"}},
        {"name": "elevation@PERMANENT", "opacity": 1.0, "checked": False, "params": {}},
    ],
    "statusbar": {"mode": 3, "mode_label": "Display geometry", "scale": 400.04},
    "region": {"width": 15000.0},
    "output": "n: 263975\nmean: 4",
}


@pytest.mark.parametrize(
    "check,want",
    [
        ({"type": "info", "path": "statusbar.mode", "value": 3}, True),
        ({"type": "info", "path": "statusbar.scale", "value": 400, "tol": 0.1}, True),
        ({"type": "info", "path": "statusbar.scale", "value": 400}, False),
        ({"type": "info", "path": ["layers", {"name": "towns@PERMANENT"}, "opacity"], "gt": 0.45, "lt": 0.55}, True),
        ({"type": "info", "path": ["layers", {"name": "elevation@PERMANENT"}, "checked"], "value": False}, True),
        ({"type": "info", "path": ["layers", {"name": "rivers@PERMANENT"}], "exists": False}, True),
        ({"type": "info", "path": ["layers", {"name": "rivers@PERMANENT"}, "opacity"], "value": 1}, False),
        ({"type": "info", "path": "layers.0.params.color", "one_of": ["red", "255:0:0"]}, True),
        ({"type": "info", "path": "output", "contains": "n: 263975"}, True),
        ({"type": "info", "path": "output", "all_in": ["n:", "mean"]}, True),
        ({"type": "info", "path": "region.width", "lt": 20000}, True),
        ({"type": "info", "path": "region", "expr": "state['width'] < 20000 and state['width'] > 1000"}, True),
        ({"type": "info", "expr": "len(state['layers']) == 2"}, True),
    ],
)
def test_info_check_on_fixed_state(check, want):
    ok, results = run_checks([check], _ctx(STATE))
    assert ok is want, results[0].detail


@pytest.mark.parametrize(
    "check",
    [
        {"type": "info", "path": "a", "value": 1, "contains": 2},  # two tests
        {"type": "info", "path": "a"},  # no test
        {"type": "info", "path": "a", "expr": "__import__('os')"},  # outside the predicate language
        {"type": "info", "path": "a", "expr": "state.__class__"},
        {"type": "db", "module": "r.mapcalc", "args": {"expression": "x=1"}, "value": 1},  # not a query
        {"type": "db", "module": "r.out.gdal", "args": {"input": "e", "output": "/tmp/x"}, "exists": True},
        {"type": "db", "module": "r.univar", "args": {"map": "e", "output": "/tmp/x"}, "exists": True},
        {"type": "db", "module": "v.db.select", "args": {"map": "t", "where": "1=1; DROP TABLE t"}, "exists": True},
        {"type": "db", "module": "v.db.select", "args": {"map": "t", "where": "1=1 -- x"}, "exists": True},
        {"type": "db", "module": "r.univar", "args": {"map": "e\nr.mapcalc"}, "exists": True},
        {"type": "db", "module": "r.univar", "args": {"map": "e"}, "flags": "x", "exists": True},
        {"type": "db", "module": "r.univar", "args": {"map": "e"}, "parse": "pickle", "exists": True},
    ],
)
def test_malformed_or_unsafe_checks_are_refused(check):
    from coda_env.checks import validate_check

    with pytest.raises(CheckError):
        validate_check(check)


def test_db_arguments_and_parsers():
    assert build_args({"module": "v.to.db", "args": {"map": "t", "option": "coor"}}) == ["map=t", "option=coor", "-p"]
    assert build_args({"module": "r.univar", "args": {"map": "elevation"}, "flags": "g"}) == ["map=elevation", "-g"]
    assert all(not ({"output", "rules", "input_file"} & opts) for opts, _ in MODULES.values())
    assert parse_output("n=4\nmean=2.5\nname=x\n", "kv") == {"n": 4.0, "mean": 2.5, "name": "x"}
    assert parse_output("cat|name\n1|Alba\n2|Bra\n", "table") == [
        {"cat": "1", "name": "Alba"},
        {"cat": "2", "name": "Bra"},
    ]
    assert parse_output("INTEGER|cat\nCHARACTER|name\n", "columns") == [
        {"name": "cat", "sql_type": "INTEGER"},
        {"name": "name", "sql_type": "CHARACTER"},
    ]
    assert resolve({"a": [{"k": "x", "v": 1}, {"k": "y", "v": 2}]}, ["a", {"k": "y"}, "v"]) == 2


# ------------------------------------------------------------------------------------------ ScienceBoard
SB_FILES = sorted(glob.glob(str(SB_DIR / "*.json")))
NEEDS_SB = pytest.mark.skipif(
    not SB_FILES,
    reason=f"ScienceBoard's GrassGIS task files are not in {SB_DIR} (set SCIENCEBOARD_DIR to a ScienceBoard checkout)",
)


@NEEDS_SB
def test_scienceboard_files_present():
    assert len(SB_FILES) == 34, f"expected ScienceBoard's 34 GrassGIS files in {SB_DIR}"


@pytest.mark.parametrize("path", SB_FILES, ids=lambda p: Path(p).stem)
def test_scienceboard_converts_or_is_refused(path):
    from coda_env.tasks import parse_task

    sb = json.loads(Path(path).read_text())
    try:
        task = scienceboard.convert(sb, path, grassdata="/data/grassdata")
    except TaskError as e:
        assert "not translated:" in str(e) and Path(path).name in str(e)
        return
    parse_task(task, path)  # loads like any task (ops and checks validated)
    assert task["requires"] and "grassdata" in task["requires"]
    ops = [op["func"] for op in task["initialize"]]
    assert ops[0] == "location" and set(ops) <= {"location", "layer", "scale"}
    assert all(op.get("grassdata") == "/data/grassdata" for op in task["initialize"] if op["func"] == "location")


@NEEDS_SB
def test_scienceboard_translation_shapes():
    """The lambda shapes map to paths and tests, not to code."""
    sb = json.loads((SB_DIR / "B-07.json").read_text())
    task = scienceboard.convert(sb, "B-07.json")
    assert task["evaluate"] == [
        {
            "type": "info",
            "path": ["windows", {"name": "firestations@PERMANENT"}, "_data", 1, "params", {"name": "icon"}, "value"],
            "value": "basic/marker",
        }
    ]
    sb = json.loads((SB_DIR / "A-07.json").read_text())  # abs((key % 360) - value): a restricted expr
    task = scienceboard.convert(sb, "A-07.json")
    assert task["evaluate"][0]["expr"].startswith("abs(state['region']['center_easting'] % 360 - 25)")
    sb = json.loads((SB_DIR / "D-01.json").read_text())  # 8.2 JSON has no info.columns: v.info -c
    check = scienceboard.convert(sb, "D-01.json")["evaluate"][0]
    assert check["module"] == "v.info" and check["parse"] == "columns"
    bad = {**sb, "initialize": [{"func": "execute", "command": "curl x | sh", "shell": True}]}
    with pytest.raises(TaskError, match="setup operation 'execute'"):
        scienceboard.convert(bad, "bad.json")
    bad = {**sb, "evaluate": [{"type": "info", "key": "lambda d: __import__('os').system('x')", "value": 1}]}
    with pytest.raises(TaskError, match="not translated"):
        scienceboard.convert(bad, "bad.json")


@NEEDS_SB
def test_scienceboard_location_from_user_grassdata(tmp_path):
    """A converted task runs on the user's location: here a copy of this project's, named as ScienceBoard's."""
    from coda_env.apps.grass import data
    from coda_env.apps.grass.adapter import Grass
    from coda_env.apps.grass.setup import SETUP_OPS
    from coda_env.registry import SetupContext

    db = tmp_path / "grassdata"
    db.mkdir()
    import shutil

    shutil.copytree(data.database() / data.LOCATION, db / "natural_earth_dataset")
    task = scienceboard.convert(json.loads((SB_DIR / "C-01.json").read_text()), "C-01.json", grassdata=str(db))
    app = Grass()
    op = task["initialize"][0]
    next(o for o in SETUP_OPS if o.name == "location").run(SetupContext(None, app, str(tmp_path), None, []), op)
    assert app.location_source == (str(db), "natural_earth_dataset", "PERMANENT")
    missing = scienceboard.convert(json.loads((SB_DIR / "C-03.json").read_text()), "C-03.json", grassdata=str(db))
    from coda_env.registry import AppError

    with pytest.raises(AppError, match="grassdata_piemonte"):
        next(o for o in SETUP_OPS if o.name == "location").run(
            SetupContext(None, app, str(tmp_path), None, []), missing["initialize"][0]
        )


# ------------------------------------------------------------------------------------------ the real app
@NEEDS_GRASS
@pytest.mark.parametrize("task_id", TASKS)
def test_oracle_scores_one(grass_env, task_id):
    rewards, term, trunc, info = run_solution(grass_env, task_id)
    assert term and not trunc, info
    assert rewards[-1] == 1.0, info.get("checks")
    assert info["success"] is True and "error" not in info


@NEEDS_GRASS
@pytest.mark.parametrize("task_id", TASKS)
def test_done_at_once_scores_zero(grass_env, task_id):
    grass_env.reset(options={"task": task_id})
    obs, r, term, trunc, info = grass_env.step("DONE")
    assert term and r == 0.0 and info["success"] is False, info.get("checks")


@NEEDS_GRASS
def test_state_reader_and_db_check_on_the_real_app(grass_env):
    grass_env.reset(options={"task": "layer_opacity_half"})
    env = grass_env.unwrapped
    st = env.app.state(env.desktop)
    assert [l["name"] for l in st["layers"]] == ["elevation@PERMANENT"]
    layer = st["layers"][0]
    assert layer["cmd"] == "d.rast map=elevation@PERMANENT" and layer["checked"] and layer["opacity"] == 1.0
    assert st["region"]["width"] > 0 and st["statusbar"]["modes"][3] == "Display geometry"
    assert st["computational_region"]["nsres"] == 100.0 and st["database"]["location"] == "coda"
    ctx = CheckContext(answer=None, desktop=env.desktop, home=env._home, state=st)
    ok, results = run_checks(
        [
            {
                "type": "db",
                "module": "r.univar",
                "args": {"map": "elevation"},
                "flags": "g",
                "parse": "kv",
                "path": "n",
                "value": 160000,
            },
            {
                "type": "db",
                "module": "g.list",
                "args": {"type": "vector"},
                "parse": "lines",
                "all_in": ["parks", "rivers", "towns"],
            },
            {
                "type": "db",
                "module": "v.db.select",
                "args": {"map": "towns", "where": "kind = 'city'"},
                "parse": "table",
                "path": [{"name": "Cuneo"}, "population"],
                "value": 56100,
            },
        ],
        ctx,
    )
    assert ok, [r.detail for r in results]
    ok, results = run_checks(
        [{"type": "db", "module": "r.univar", "args": {"map": "nosuchmap"}, "parse": "kv", "path": "n", "value": 1}],
        ctx,
    )
    assert not ok and "nosuchmap" in results[0].detail
    # the state server answers only its own protocol, and refuses layer commands outside d.rast/d.vect
    with pytest.raises(Exception, match="unknown op"):
        env.app.request({"op": "exec", "code": "1"})
    with pytest.raises(Exception, match="not an allowed layer command"):
        env.app.request({"op": "add_layer", "cmd": ["r.mapcalc", "map=x"]})
    # no GRASS file changed by reading: the mapset's files are the same after a state read
    mapset = Path(st["database"]["gisdbase"], "coda", "PERMANENT")
    before = {p: p.stat().st_mtime_ns for p in mapset.rglob("*") if p.is_file()}
    env.app.state(env.desktop)
    assert before == {p: p.stat().st_mtime_ns for p in mapset.rglob("*") if p.is_file()}


@NEEDS_GRASS
def test_a11y_text_is_bounded_and_fast(grass_env):
    grass_env.reset(options={"task": "layer_hide_elevation"})
    env = grass_env.unwrapped
    t0 = time.monotonic()
    text = env.app.a11y_text(env.desktop)
    took = time.monotonic() - t0
    rows = text.splitlines()
    assert rows[0] == "role\tname\tbox" and len(rows) <= 401
    assert any(r.startswith("menu\tRaster") for r in rows)
    assert any(r.startswith("layer\t[x] towns@PERMANENT\t") for r in rows)
    print(f"a11y_text: {len(rows)} rows in {took * 1000:.0f} ms")
    assert took < 1.0  # target 0.3 s; measured figures in the report (the machine is shared)


@NEEDS_GRASS
def test_check_env():
    from gymnasium.utils.env_checker import check_env

    env = gym.make("coda/GRASS-v0", task="layer_add_raster", info_timings=False)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


@NEEDS_GRASS
def test_app_killed_mid_episode_is_survived(grass_env):
    grass_env.reset(options={"task": "layer_add_raster"})
    env = grass_env.unwrapped
    proc = env.procs["grass"]
    os.killpg(proc.pid, signal.SIGKILL)
    wait_until(lambda: proc.poll() is not None, 10)
    obs, r, term, trunc, info = grass_env.step("WAIT")
    assert trunc and r == 0.0 and "grass" in info.get("error", "").lower(), info
    rewards, term, trunc, info = run_solution(grass_env, "layer_add_raster")  # reset recovers
    assert rewards[-1] == 1.0


@NEEDS_GRASS
def test_close_leaves_no_process_or_folder():
    """Nor GRASS's own session folders (`grass8-<user>-<pid>`, of the GUI and of each `db` query): they live
    in the desktop's folder (TMPDIR), which goes with it."""
    import tempfile

    sessions = os.path.join(tempfile.gettempdir(), "grass8-*")
    before, before_sessions = set(glob.glob("/tmp/coda-grass-*")), set(glob.glob(sessions))
    env = gym.make("coda/GRASS-v0", task="layer_add_raster")
    env.reset()
    token = env.unwrapped.desktop.token
    home = env.unwrapped._home
    tmpdir = env.unwrapped.desktop.tmpdir
    assert live_token_pids(token)
    ok, results = run_checks(
        [{"type": "db", "module": "g.list", "args": {"type": "raster"}, "parse": "lines", "contains": "elevation"}],
        CheckContext(
            answer=None, desktop=env.unwrapped.desktop, home=home, state=env.unwrapped.app.state(env.unwrapped.desktop)
        ),
    )
    assert ok, results[0].detail
    assert glob.glob(os.path.join(tmpdir, "**", "grass8-*"), recursive=True, include_hidden=True), (
        "GRASS's session folder is not in the desktop's folder"
    )
    env.close()
    assert wait_until(lambda: not live_token_pids(token), 10) is True or not live_token_pids(token)
    assert not os.path.exists(home) and not os.path.exists(tmpdir)
    assert set(glob.glob("/tmp/coda-grass-*")) <= before
    assert set(glob.glob(sessions)) <= before_sessions


@NEEDS_GRASS
def test_timings(grass_env):
    """Reset p50 over 10 resets, step p50 over 30 steps (printed; the figures go in the report)."""
    resets, steps = [], []
    for _ in range(10):
        t0 = time.monotonic()
        grass_env.reset(options={"task": "mapcalc_high_ground"})  # no setup ops: the launch itself
        resets.append(time.monotonic() - t0)
    for i in range(30):
        t0 = time.monotonic()
        grass_env.step(f"pyautogui.moveTo({600 + i}, {400 + i})")
        steps.append(time.monotonic() - t0)
    print(
        f"GRASS reset p50 {statistics.median(resets):.2f}s (min {min(resets):.2f}, max {max(resets):.2f}); "
        f"step p50 {statistics.median(steps) * 1000:.0f}ms; load {os.getloadavg()[0]:.1f}"
    )
    assert statistics.median(resets) < 30
