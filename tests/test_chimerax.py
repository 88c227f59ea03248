"""ChimeraX: the app package's logic, and the engine rig (the real ChimeraX 1.7.1 library, no GUI).

The engine tests run the adapter, every state field, setup op and check type, and every task's oracle at
the command level (the commands the oracle types, replayed over REST as the command line runs them) on
the engine that `make chimerax-engine` builds. The GUI suite (marker `chimerax`) needs UCSF's .deb and is
skipped, with the reason, where it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from coda_env.actions import parse_action
from coda_env.apps.chimerax import adapter as ad
from coda_env.apps.chimerax import checks as ck
from coda_env.apps.chimerax import setup as su
from coda_env.registry import AppError, CheckContext, CheckError, LaunchContext, SetupContext, SetupError

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "coda_env" / "apps" / "chimerax"
ENGINE = REPO / ".chimerax-engine" / "bin" / "chimerax-engine"
SB_DIR = Path(os.environ.get("SCIENCEBOARD_DIR", REPO.parent / "shared" / "scienceboard")) / "tasks" / "VM" / "ChimeraX"
needs_engine = pytest.mark.skipif(
    not ENGINE.exists(), reason="the ChimeraX engine is not built: run `make chimerax-engine`"
)
CHECKS = {c.name: c for c in ck.CHECKS}
OPS = {o.name: o for o in su.SETUP_OPS}


def load_tasks() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((PKG / "tasks").glob("*.json"))]


# ------------------------------------------------------------------ fast logic tests (no app)
@pytest.mark.fast
def test_missing_chimerax_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CODA_CHIMERAX", raising=False)
    from coda_env.apps import chimerax
    import glob

    if any(glob.glob(p) for p in ad.DEB_PATHS):
        pytest.skip("a real ChimeraX is installed here")
    msg = chimerax.available()
    assert msg is not None and "\n" not in msg
    for needed in ("chimerax", ".deb", "CHIMERAX_DEB=", "make vm-image", 'backend="libvirt"', "CODA_CHIMERAX"):
        assert needed in msg


@pytest.mark.fast
def test_command_whitelist():
    assert su.check_command("color /A red; style ball") == "color /A red; style ball"
    for bad in (
        "open /etc/passwd",
        "save ~/x.pdb",
        "runscript x.py",
        "shell ls",
        "color red; pyscript x",
        "hbonds saveFile /tmp/x",
        "remotecontrol rest start",
        "",
        "color\nred",
        "toolshed install x",
    ):
        with pytest.raises(SetupError):
            su.check_command(bad)


@pytest.mark.fast
@pytest.mark.parametrize(
    "command,words",
    [
        ("info models saveF /tmp/x", "info models's keyword 'saveFile', which writes a file"),
        ("hbonds /A saveF /tmp/x", "hbonds's keyword 'saveFile'"),
        ("hbonds /A s /tmp/x", "hbonds's keyword 'saveFile'"),  # ChimeraX picks `select`; refused anyway
        ("hbonds /A SAVEFILE /tmp/x", "keyword 'saveFile'"),
        ("hbonds /A save_file /tmp/x", "keyword 'saveFile'"),  # ChimeraX reads save_file as saveFile
        ("contacts /A sav /tmp/x", "contacts's keyword 'saveFile'"),
        ("clashes /A Save /tmp/x", "keyword 'saveFile'"),
        ("measure convexity #1 writeS true", "'writeSurfaceData', which writes a file"),
        (
            "color red; runs /tmp/x.py",
            "'runs' is not a full ChimeraX command name (ChimeraX would complete it to runscript)",
        ),
        ("sav /tmp/x.pdb", "would complete it to save"),
        ("Color red", "'Color' is not a full ChimeraX command name"),
        ("colo red", "is not a full ChimeraX command name"),
        ("save /tmp/x.pdb", "ChimeraX command 'save' is not allowed"),
        ("open /tmp/x.py", "ChimeraX command 'open' is not allowed"),
        ("runscript /tmp/x.py", "not allowed"),
        ("cd /tmp", "not allowed"),
        ("toolshed install x", "not allowed"),
        ("remotecontrol rest start port 9", "not allowed"),
        ("pyscript x", "'pyscript' is not a ChimeraX command"),
        ("color b", "ambiguous: it abbreviates the subcommands bfactor and byattribute"),
        ("color image #1 file /etc/hostname", "'color image' is not allowed in a task file: it reads an image file"),
        ("distance save /tmp/x", "'distance save' is not allowed in a task file: it writes a file"),
        ("info notify start models c url http://x/", "'info notify start' is not allowed"),
        ("info path", "lists the host's folders"),
        ("hbonds /A po 1", "could be read as the keyword 'port'"),
        ("wait 100000000", "frames to wait must be finite and at most 600"),
        ("wait 601", "at most 600"),
        ("turn y 90 100000", "a number in a command that animates must be finite and at most 3600"),
        ("size /A stickRadius 1e400", "must be finite"),
        ("label /A text nan", "must be finite"),
        ("turn 1,0,1e999 90", "must be finite"),
        ("2dlabels text 'hi'", "quotes"),
        ('label /A text "a;save /tmp/x"', "quotes"),
        ("color red\tblue", "control characters"),
        ("color red;", "empty command"),
        ("# save x", "comment"),
        ("", "1..2000 characters"),
        ("color " + "a" * 2000, "1..2000 characters"),
    ],
)
def test_commands_are_judged_by_what_chimerax_resolves_them_to(command, words):
    with pytest.raises(SetupError) as e:
        su.check_command(command)
    assert words in str(e.value), str(e.value)


@pytest.mark.fast
def test_commands_that_stay_allowed():
    from coda_env.apps.chimerax import commands as cx

    assert cx.check("color grey; color byhetero; style /A ball", su.POLICY) == ["color", "color", "style"]
    assert cx.check("hbonds /A reveal true name hb log true; ~hbonds", su.POLICY) == ["hbonds", "~hbonds"]
    assert cx.check("turn y 90 60; wait 60; lighting soft; graphics silhouettes true", su.POLICY) == [
        "turn",
        "wait",
        "lighting",
        "graphics silhouettes",
    ]
    assert (
        cx.check("select :5-7; transparency /A 50 target s; cartoon style /A width 2", su.POLICY)[2] == "cartoon style"
    )
    assert cx.check("info sel", ck.READ_ONLY) == ["info selection"]  # ScienceBoard's A-05, B-04
    assert cx.check("info rescolor /A:1-2", ck.READ_ONLY) == ["info rescolor"]
    # the table covers every whitelisted command, from ChimeraX itself (tools/chimerax_gen_commands.py)
    table = cx.table()["commands"]
    assert all("keywords" in table[v] for v in su.COMMAND_VERBS - {"measure"})
    assert all("keywords" in table[c] for c in ck.READ_ONLY.commands)
    assert "saveFile" in table["info models"]["keywords"] and "saveFile" in table["hbonds"]["keywords"]


@pytest.mark.fast
def test_setup_op_validation():
    OPS["chimerax_open"].validate({"data": "twohelix.pdb"})
    OPS["chimerax_open"].validate({"path": "in/x.cif"})
    for bad in (
        {"data": "../x.pdb"},
        {"data": "nope.pdb"},
        {"path": "/etc/x.pdb"},
        {"path": "../x.pdb"},
        {"data": "twohelix.pdb", "path": "x.pdb"},
        {"path": "x.txt"},
        {},
    ):
        with pytest.raises(SetupError):
            OPS["chimerax_open"].validate(bad)
    OPS["chimerax_turn"].validate({"axis": "y", "angle": 30})
    for bad in ({"axis": "w", "angle": 1}, {"axis": "x", "angle": "1"}, {"axis": "x", "angle": True}):
        with pytest.raises(SetupError):
            OPS["chimerax_turn"].validate(bad)
    for bad in ({"path": "../x.pdb"}, {"path": "x.sh"}):
        with pytest.raises(SetupError):
            OPS["chimerax_save"].validate(bad)


@pytest.mark.fast
def test_check_validation():
    CHECKS["states"].validate({"path": "models.0.name", "value": "x"})
    CHECKS["chimerax_info"].validate({"command": "info models", "json": "0.value", "value": "x"})
    CHECKS["chimerax_info"].validate({"log": True, "pattern": "Distance"})
    CHECKS["chimerax_file"].validate({"path": "a.png", "width": 10})
    CHECKS["chimerax_file"].validate({"path": "s.cxs", "state": [{"path": "models.0.name", "value": "x"}]})
    bad = [
        ("states", {"path": "", "value": 1}),
        ("states", {"path": "a", "value": 1, "pattern": "x"}),
        ("states", {"path": "a", "pattern": "(a+)+"}),
        ("chimerax_info", {"command": "color red", "value": 1}),
        ("chimerax_info", {"command": "info models; close", "value": 1}),
        ("chimerax_info", {"command": "measure center /A mark true; save x", "value": 1}),
        ("chimerax_info", {"command": "measure center /A mark true", "value": 1}),
        ("chimerax_info", {"command": "info models saveFile /tmp/x", "value": 1}),
        ("chimerax_file", {"path": "../x.pdb", "atoms": 1}),
        ("chimerax_file", {"path": "x.pdb", "width": 1}),
        ("chimerax_file", {"path": "x.pdb", "state": [{"path": "a", "value": 1}]}),
        ("chimerax_file", {"path": "x.pdb"}),
    ]
    for name, c in bad:
        with pytest.raises(CheckError):
            CHECKS[name].validate(c)


@pytest.mark.fast
def test_states_paths_and_tolerance():
    state = {
        "models": [{"name": "m", "chains": [{"id": "A"}]}],
        "camera": {"view_direction": [0.0, 0.0, -1.0]},
        "atoms": {"#1/A:1@CA": {"coord": [1.0, 2.0, 3.0]}},
    }
    ctx = CheckContext(answer=None, state=state)
    run = lambda c: CHECKS["states"].run(c, ctx)[0]  # noqa: E731
    assert run({"path": "models.0.chains.0.id", "value": "A"})
    assert run({"path": "camera.view_direction", "value": [0, 0.0004, -1], "tol": 1e-3})
    assert not run({"path": "camera.view_direction", "value": [0, 0.01, -1], "tol": 1e-3})
    assert run({"path": "atoms.#1/A:1@CA.coord.2", "value": 3})
    assert run({"path": "models.1", "exists": False}) and not run({"path": "models.0", "exists": False})
    assert run({"path": "models.0.name", "pattern": "^m$"})
    ok, detail = CHECKS["states"].run({"path": "models.3.name", "value": "m"}, ctx)
    assert not ok and "models.3" in detail


@pytest.mark.fast
def test_structure_summary_and_image_size():
    text = (PKG / "data" / "twohelix.pdb").read_text()
    s = ck.structure_summary(text, cif=False)
    assert s == {"atoms": 225, "residues": 33, "chains": ["A", "B"]}
    png = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + (400).to_bytes(4, "big") + (300).to_bytes(4, "big")
    assert ck.image_size(png) == (400, 300)
    assert ck.image_size(b"not an image") is None


@pytest.mark.fast
def test_shipped_structures_are_what_the_generator_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_structures", REPO / "tools" / "chimerax_make_structures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name, text in mod.build().items():
        assert (PKG / "data" / name).read_text() == text, name


@pytest.mark.fast
def test_task_files_are_valid():
    tasks = load_tasks()
    assert len(tasks) >= 25
    ids = set()
    for t in tasks:
        assert t["app"] == "chimerax" and t["id"] not in ids and t["solution"]
        ids.add(t["id"])
        for op in t.get("initialize", []):
            OPS[op["func"]].validate(op)
        for c in t["evaluate"]:
            if c["type"] in CHECKS:
                CHECKS[c["type"]].validate(c)
        for step in t["solution"]:
            parse_action(step)
        assert typed_commands(t["solution"]), t["id"]


# ------------------------------------------------------------------ the engine rig
def typed_commands(solution: list[str]) -> list[str]:
    """The commands an oracle types into the command line (text typed, then Enter)."""
    cmds, pending = [], ""
    for step in solution:
        for a in parse_action(step):
            if a.kind == "type":
                pending += a.text
                while "\n" in pending:
                    line, pending = pending.split("\n", 1)
                    cmds.append(line)
            elif a.kind == "press" and a.keys[0] in ("enter", "return"):
                cmds.append(pending)
                pending = ""
            elif a.kind == "hotkey" and a.keys == ("ctrl", "a"):
                pending = ""  # select-all then type: the text replaces the command line's content
    return [c for c in cmds if c.strip()]


def oracle_answer(solution: list[str]) -> str | None:
    for step in solution:
        for a in parse_action(step):
            if a.kind == "answer":
                return a.text
            if a.kind == "fail":
                return "FAIL"
    return None


def check_runner(name: str):
    """Any registered check type (the core's `answer` as well as this package's)."""
    import coda_env  # noqa: F401
    from coda_env.registry import CHECKS as ALL

    return ALL[name].run


class Engine:
    """One engine process on a real (Xvfb) desktop, launched by the adapter as the env would."""

    def __init__(self):
        from coda_env.backends.local import LocalConfig, LocalDesktop

        cfg = LocalConfig()
        cfg.accessibility = False
        cfg.window_manager = False
        # unsealed: the engine is this checkout's own build (a venv on pyenv's Python under /root), which the
        # sandbox's unprivileged user cannot run; the GUI (.deb, in /usr) runs sealed like every app
        cfg.sandbox = False
        self.desktop = LocalDesktop(cfg)
        self.desktop.start()
        self.home = tempfile.mkdtemp(prefix="coda-chimerax-test-")
        self.app = ad.ChimeraX(binary=str(ENGINE), gui=False)
        self.crashes: list[str] = []
        self.launch()

    def launch(self):
        t0 = time.monotonic()
        self.proc = self.app.launch(LaunchContext(desktop=self.desktop, home=self.home, task=None))
        deadline = time.monotonic() + 90
        while not self.app.ready(self.desktop):
            assert time.monotonic() < deadline, "the engine's REST server did not answer in 90 s"
            time.sleep(0.05)
        self.ready_s = time.monotonic() - t0

    def reset(self):
        """Back to a fresh session (cheaper than a relaunch; the profile and recorder stay). An engine that
        died (its Python has segfaulted, rarely, in a session reopen) is relaunched, so the crash fails the
        one test it happened in, with its cause, not every test after it."""
        died = self.app.exited_error(self.desktop)
        if died is not None:
            self.crashes.append(str(died))
            self.desktop.kill_group(self.proc)
            self.app.close()
            self.launch()
        for cmd in ("close session", "set bgColor black", "lighting default", "graphics silhouettes false"):
            self.app.command(self.desktop, cmd)
        self.app.typed(self.desktop, "log clear")
        for p in Path(self.home).iterdir():
            if not p.name.startswith(".") and p.name != "chimerax.log":
                shutil.rmtree(p) if p.is_dir() else p.unlink()

    def setup(self, task: dict):
        ctx = SetupContext(desktop=self.desktop, app=self.app, home=self.home, task=None)
        for op in task.get("initialize", []):
            OPS[op["func"]].run(ctx, op)

    def evaluate(self, task: dict, answer: str | None) -> list[tuple[bool, str]]:
        state = self.app.state(self.desktop)
        ctx = CheckContext(answer=answer, task=None, desktop=self.desktop, home=self.home, state=state)
        return [check_runner(c["type"])(c, ctx) for c in task["evaluate"]]

    def close(self):
        self.desktop.kill_group(self.proc)
        self.desktop.stop()
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="module")
def engine():
    if not ENGINE.exists():
        pytest.skip("the ChimeraX engine is not built: run `make chimerax-engine`")
    e = Engine()
    yield e
    e.close()


@needs_engine
def test_launch_profile_and_ready(engine):
    h = Path(engine.home)
    assert (h / ".config/ChimeraX").is_dir() and (h / ".local/share/ChimeraX").is_dir()
    assert "'never'" in (h / ".config/ChimeraX/chimerax.core-1").read_text()
    print(f"engine ready (REST answering, inside.py loaded) in {engine.ready_s:.2f} s")
    assert engine.app.command(engine.desktop, "version")["error"] is None
    with pytest.raises(AppError, match="Unknown command"):
        engine.app.command(engine.desktop, "nosuchcommand")


@needs_engine
def test_engine_writes_where_the_refused_spellings_say(engine, tmp_path):
    """The real ChimeraX 1.7.1 parser: abbreviated and respelled saveFile keywords DO write files outside
    the home (what the validator refuses, and why), and `info sel` is `info selection`."""
    engine.reset()
    engine.setup({"initialize": [{"func": "chimerax_open", "data": "twohelix.pdb"}]})
    spellings = {
        "a": "info models saveF {}",
        "b": "hbonds /A saveF {}",
        "c": "hbonds /A save_file {}",
        "e": "info chains /A sav {}",
        "d": "info models #1 Savef {}",
    }
    for name, template in spellings.items():
        target = tmp_path / f"{name}.txt"
        command = template.format(target)
        with pytest.raises(SetupError, match="saveFile"):
            su.check_command(command)
        try:
            engine.app.command(engine.desktop, command)
        except AppError:
            pass
        if name != "d":  # ChimeraX matches a typed word with capitals case-sensitively
            assert target.exists(), f"{command!r} wrote nothing: the premise of the refusal is gone"
    assert engine.app.command(engine.desktop, "info sel")["error"] is None


@needs_engine
def test_engine_command_table_is_what_chimerax_registers(tmp_path):
    """commands.json is what tools/chimerax_gen_commands.py writes from the engine now (regenerate it with that
    script when the engine changes)."""
    import subprocess

    out = tmp_path / "commands.json"
    r = subprocess.run(
        [str(ENGINE), "--exit", "--script", f"{REPO / 'tools' / 'chimerax_gen_commands.py'} {out}"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.exists(), r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads(out.read_text())["commands"] == json.loads((PKG / "commands.json").read_text())["commands"]


@needs_engine
def test_engine_leaves_no_process_behind():
    from .conftest import live_token_pids, wait_until

    e = Engine()
    token = e.desktop.token
    assert e.proc.pid in live_token_pids(token)
    e.close()
    assert wait_until(lambda: live_token_pids(token) == [], timeout=10), live_token_pids(token)


@needs_engine
def test_state_fields(engine):
    engine.reset()
    e, d = engine, engine.desktop
    e.setup({"initialize": [{"func": "chimerax_open", "data": "twohelix.pdb"}]})
    for cmd in (
        "color /A red",
        "show /B:3 atoms",
        "style /B:3 ball",
        "select /B:2-4",
        "label /A:1",
        "distance /A:1@CA /B:1@CA",
        "set bgColor white",
        "surface /B",
        "hbonds",
        "lighting soft",
        "graphics silhouettes true",
        "2dlabels text Hello",
    ):
        e.app.typed(d, cmd)
    s = e.app.state(d)
    m = s["models"][0]
    assert m["name"] == "twohelix.pdb" and m["type"] == "AtomicStructure" and m["atoms"] == 225
    assert [c["id"] for c in m["chains"]] == ["A", "B"] and m["chains"][1]["sequence"] == "SLEEKVKNFLDGA"
    assert s["residues"]["#1/A:5"]["ribbon_color"] == "#ff0000" and s["residues"]["#1/B:5"]["ribbon_color"] != "#ff0000"
    assert s["atoms"]["#1/B:3@CA"]["style"] == "ball" and s["atoms"]["#1/B:3@CA"]["shown"]
    assert s["selection"]["residues"] == ["#1/B:2", "#1/B:3", "#1/B:4"] and s["selection"]["atoms"] > 0
    assert s["residues"]["#1/A:1"]["label"] == "ALA 1"
    dist = next(g for g in s["pseudobond_groups"] if g["name"] == "distances")
    assert dist["lengths"] == [10.0]
    assert any(g["name"] == "hydrogen bonds" and g["count"] > 0 for g in s["pseudobond_groups"])
    assert s["background"]["color"] == "#ffffff"
    assert s["surfaces"] and s["surfaces"][0]["name"].endswith("_B SES surface")
    assert s["lighting"]["multishadow"] == 64 and s["silhouettes"]["enabled"]
    assert any(lab["text"] == "Hello" for lab in s["labels_2d"])
    assert "Distance between /A ALA 1 CA and /B SER 1 CA: 10.000" in s["log_text"]
    assert s["camera"]["field_of_view"] > 0 and len(s["camera"]["position"]) == 3
    OPS["chimerax_clear_log"].run(SetupContext(desktop=d, app=e.app, home=e.home, task=None), {})
    assert e.app.state(d)["log_text"] == ""


@needs_engine
def test_state_fields_for_scienceboard_mappings(engine):
    """The fields ScienceBoard's keys map onto: bounds, view rotation, markers, pseudobond colours, surface
    vertex colours, nucleotide styling, colour key, scale bar, shadow depth bias, models by id and name."""
    engine.reset()
    e, d = engine, engine.desktop
    e.setup({"initialize": [{"func": "chimerax_open", "data": "twohelix.pdb"}]})
    before = e.app.state(d)
    for cmd in (
        "turn y 30",
        "define centroid :HOH radius 1",
        "hbonds color rgb(139,0,0)",
        "surface /A",
        "rainbow /A target s",
        "key red:low blue:high",
        "key border false ticks true",
        "scalebar 10 thickness 4",
        "lighting soft",
    ):
        e.app.typed(d, cmd)
    s = e.app.state(d)
    m1 = s["models_by_id"]["#1"]
    assert m1 is s["models_by_name"]["twohelix.pdb"] or m1 == s["models_by_name"]["twohelix.pdb"]
    assert m1["bounds"]["xyz_min"] != before["models_by_id"]["#1"]["bounds"]["xyz_min"]  # turned
    assert abs(m1["view_rotation"][0][0] - 0.866) < 1e-3  # cos 30
    assert m1["nucleotides"]["drawing"] is False
    c = s["models_by_name"]["centroid"]["markers"][0]
    assert c["radius"] == 1.0 and c["coord"] == [4.3333, 4.3333, 2.3333]
    hb = s["models_by_name"]["hydrogen bonds"]
    assert hb["pseudobonds"] > 0 and hb["pb_colors"] == ["#8b0000"]
    surf = s["models_by_name"]["twohelix.pdb_A SES surface"]["surface"]
    assert surf["vertex_colored"] and len(surf["vertex_colors_sha256"]) == 64
    assert s["models_by_name"]["Color key"]["border"] is False and s["models_by_name"]["Color key"]["ticks"] is True
    assert s["models_by_name"]["scalebar"]["scalebar_width"] == 10.0
    assert s["models_by_name"]["scalebar"]["scalebar_height"] == 4.0
    assert s["lighting"]["multishadow_depth_bias"] == 0.01 and s["lighting"]["ambient_intensity"] == 1.5


@needs_engine
def test_setup_ops(engine):
    engine.reset()
    e, d = engine, engine.desktop
    e.setup(
        {
            "initialize": [
                {"func": "chimerax_open", "data": "strand.pdb", "as": "in/strand.pdb"},
                {"func": "chimerax_command", "command": "color /A blue; style stick"},
                {"func": "chimerax_save", "path": "out/copy.pdb"},
                {"func": "chimerax_open", "path": "out/copy.pdb"},
                {"func": "chimerax_turn", "axis": "y", "angle": 90},
                {"func": "chimerax_clear_log"},
            ]
        }
    )
    s = e.app.state(d)
    assert [m["name"] for m in s["models"] if m["type"] == "AtomicStructure"] == ["strand.pdb", "copy.pdb"]
    assert (Path(e.home) / "in/strand.pdb").exists() and (Path(e.home) / "out/copy.pdb").exists()
    assert s["residues"]["#1/A:1"]["ribbon_color"] == "#0000ff"
    assert s["models"][1]["atoms"] == 69  # the saved copy holds every atom
    assert abs(s["camera"]["view_direction"][0]) > 0.99  # turned 90 degrees about y
    assert s["log_text"] == ""
    with pytest.raises(AppError):  # an op whose command fails reports it
        OPS["chimerax_open"].run(SetupContext(desktop=d, app=e.app, home=e.home, task=None), {"path": "none.pdb"})


@needs_engine
def test_check_types(engine):
    engine.reset()
    e, d = engine, engine.desktop
    e.setup({"initialize": [{"func": "chimerax_open", "data": "twohelix.pdb"}]})
    for cmd in (
        "color /A orange",
        "distance /A:1@CA /B:1@CA",
        "save ~/shot.png width 160 height 120 supersample 1",
        "save ~/m.pdb",
        "save ~/m.cif",
        "color /B green",
        "save ~/s.cxs",
    ):
        e.app.typed(d, cmd)
    good = [
        {
            "type": "chimerax_info",
            "command": "info rescolor /A:1-2",
            "lines": ["#1/A:1 color #ffa500", "#1/A:2 color #ffa500"],
        },
        {"type": "chimerax_info", "command": "info models", "json": "0.value", "value": "twohelix.pdb"},
        {"type": "chimerax_info", "command": "measure center /B", "pattern": r"Center of mass of \d+ atoms"},
        {"type": "chimerax_info", "log": True, "pattern": r"10\.000"},
        {"type": "chimerax_file", "path": "shot.png", "width": 160, "height": 120},
        {"type": "chimerax_file", "path": "m.pdb", "atoms": 225, "chains": ["A", "B"]},
        {"type": "chimerax_file", "path": "m.cif", "atoms": 225, "residues": 33},
        {"type": "states", "path": "residues.#1/A:3.ribbon_color", "value": "#ffa500"},
        {
            "type": "chimerax_file",
            "path": "s.cxs",
            "state": [
                {"path": "residues.#1/B:3.ribbon_color", "value": "#008000"},
                {"path": "residues.#1/A:3.ribbon_color", "value": "#ffa500"},
            ],
        },
    ]
    results = e.evaluate({"evaluate": good}, None)
    assert all(ok for ok, _ in results), [d for ok, d in results if not ok]
    bad = [
        {"type": "chimerax_info", "command": "info rescolor /A:1", "lines": ["#1/A:1 color #ff0000"]},
        {"type": "chimerax_info", "log": True, "pattern": "no such text"},
        {"type": "chimerax_file", "path": "shot.png", "width": 161},
        {"type": "chimerax_file", "path": "missing.pdb", "atoms": 1},
        {"type": "states", "path": "residues.#1/A:3.ribbon_color", "value": "#ff0000"},
        {
            "type": "chimerax_file",
            "path": "s.cxs",
            "state": [{"path": "residues.#1/B:3.ribbon_color", "value": "#ff0000"}],
        },
    ]
    results = e.evaluate({"evaluate": bad}, None)
    assert not any(ok for ok, _ in results), results


TASKS = load_tasks()


@needs_engine
@pytest.mark.parametrize("task", TASKS, ids=[t["id"] for t in TASKS])
def test_task_oracle_commands(engine, task):
    """The oracle's typed commands make every check pass; with none (DONE at once) some check fails."""
    engine.reset()
    engine.setup(task)
    results = engine.evaluate(task, None)
    assert not all(ok for ok, _ in results), f"{task['id']} passes without doing anything: {results}"
    engine.reset()
    engine.setup(task)
    for cmd in typed_commands(task["solution"]):
        engine.app.typed(engine.desktop, cmd)
    results = engine.evaluate(task, oracle_answer(task["solution"]))
    assert all(ok for ok, _ in results), f"{task['id']}: {results}"


@pytest.mark.fast
def test_gym_make_without_chimerax_raises_one_clear_error(monkeypatch):
    """The engine is not the GUI: gym.make with no real ChimeraX refuses, naming both ways to get it."""
    import gymnasium as gym

    import coda_env  # noqa: F401
    from coda_env.registry import AppError as CoreAppError, get_app_spec

    if find_real := ad.find_chimerax():
        pytest.skip(f"a real ChimeraX is installed here ({find_real})")
    monkeypatch.setenv("CODA_CHIMERAX", str(ENGINE.parent / "no-such-chimerax"))
    with pytest.raises(CoreAppError) as e:
        gym.make("coda/ChimeraX-v0")
    msg = str(e.value)
    assert "ChimeraX is not installed" in msg and ".deb" in msg and "CHIMERAX_DEB=" in msg and "libvirt" in msg
    assert get_app_spec("chimerax").available() == ad.MISSING
    # the engine launcher is not taken for the GUI: it is not on PATH, nor named chimerax
    assert ad.find_chimerax() is None


# ------------------------------------------------------------------ the GUI suite (UCSF's .deb)
GUI_MISSING = None if ad.find_chimerax() else ("UCSF ChimeraX's GUI is not installed here (" + ad.MISSING + ")")
needs_gui = pytest.mark.skipif(GUI_MISSING is not None, reason=GUI_MISSING or "")


@pytest.fixture(scope="module")
def gui_env():
    from coda_env.env import CodaEnv

    env = CodaEnv(app="chimerax")
    yield env
    env.close()


@pytest.mark.chimerax
@needs_gui
@pytest.mark.parametrize("task", TASKS, ids=[t["id"] for t in TASKS])
def test_gui_oracle_scores_one(gui_env, task):
    from .conftest import run_solution

    rewards, term, trunc, info = run_solution(gui_env, task["id"])
    assert term and rewards[-1] == 1.0, (task["id"], info.get("checks"))


@pytest.mark.chimerax
@needs_gui
@pytest.mark.parametrize("task", TASKS, ids=[t["id"] for t in TASKS])
def test_gui_done_at_once_scores_zero(gui_env, task):
    gui_env.reset(options={"task": task["id"]})
    obs, r, term, trunc, info = gui_env.step("DONE")
    assert term and r == 0.0, task["id"]


@pytest.mark.chimerax
@needs_gui
def test_gui_check_env():
    from gymnasium.utils.env_checker import check_env

    from coda_env.env import CodaEnv

    env = CodaEnv(app="chimerax", task="color_chain_a_red")
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


@pytest.mark.chimerax
@needs_gui
def test_gui_killed_app_truncates_and_reset_recovers(gui_env):
    from .conftest import run_solution

    gui_env.reset(options={"task": "color_chain_a_red"})
    proc = gui_env.unwrapped.procs["chimerax"]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)
    obs, r, term, trunc, info = gui_env.step("pyautogui.click(640, 762)")
    assert trunc and not term and r == 0.0 and "chimerax exited" in info["error"]
    rewards, *_ = run_solution(gui_env, "color_chain_a_red")
    assert rewards[-1] == 1.0


# ------------------------------------------------------------------ ScienceBoard's ChimeraX tasks
SB_FILES = sorted(SB_DIR.glob("*.json"))
needs_sb = pytest.mark.skipif(not SB_FILES, reason=f"ScienceBoard's task files are not in {SB_DIR} (SCIENCEBOARD_DIR)")
# The tasks whose checks do not depend on the structure ScienceBoard opens (view, lighting, background,
# 2D models, answers): their converted checks and oracles run on the engine with a shipped structure in
# place of the PDB entry.
DATA_FREE = (
    "A-06",
    "A-07",
    "A-08",
    "A-09",
    "B-05",
    "B-06",
    "B-08",
    "C-01",
    "C-02",
    "C-03",
    "C-04",
    "C-05",
    "C-06",
    "C-07",
)


def _converted() -> dict[str, dict]:
    import coda_env  # noqa: F401
    from coda_env.scienceboard import convert_file
    from coda_env.tasks import TaskError

    out = {}
    for f in SB_FILES:
        try:
            out[f.stem] = convert_file(f)
        except TaskError as e:
            out[f.stem] = {"refused": str(e)}
    return out


@pytest.mark.fast
@needs_sb
def test_scienceboard_conversion_counts_and_reasons():
    conv = _converted()
    assert len(conv) == 29
    refused = {k: v["refused"] for k, v in conv.items() if "refused" in v}
    assert sorted(refused) == ["A-01", "D-03"], refused
    assert "network" in refused["A-01"] and "Colab" in refused["D-03"]
    oracles = json.loads((PKG / "scienceboard_oracles.json").read_text())
    for stem, t in conv.items():
        if "refused" in t:
            continue
        assert t["solution"] == oracles[stem] and t["origin"] == f"scienceboard:ChimeraX/{stem}"
        needs_data = any(op["func"] == "chimerax_user_structure" for op in t["initialize"])
        assert needs_data == ("requires" in t) and (not needs_data or "CODA_PDB_DIR" in t["requires"])
    print(f"ScienceBoard ChimeraX: {len(conv) - len(refused)} of {len(conv)} converted; refused: {refused}")


@pytest.mark.fast
def test_scienceboard_refuses_what_it_cannot_map():
    from coda_env.apps.chimerax import scienceboard as sbm
    from coda_env.tasks import TaskError

    base = {"type": "ChimeraX", "instruction": "x", "steps": 5, "initialize": []}
    bad = [
        {"evaluate": [{"type": "states", "key": "_state_containers.x.y", "value": 1}]},
        {
            "evaluate": [
                {
                    "type": "states",
                    "find": "lambda key, value: __import__('os')",
                    "key": "lambda key: key",
                    "pattern": ".+",
                }
            ]
        },
        {"evaluate": [{"type": "file", "key": "/home/user/x.pdb", "value": "ATOM"}]},
        {
            "initialize": [{"func": "download", "url": "http://evil/x.cif", "path": "/home/user/x.cif"}],
            "evaluate": [{"type": "stop", "value": "FAIL"}],
        },
        {"initialize": [{"func": "open", "name": "../../etc"}], "evaluate": [{"type": "stop", "value": "FAIL"}]},
    ]
    for extra in bad:
        with pytest.raises(TaskError):
            sbm.convert({**base, **extra}, "X-99.json")


def _substitute(task: dict) -> dict:
    """The task with the shipped twohelix.pdb in place of the user-supplied PDB entry."""
    ops = []
    for op in task["initialize"]:
        if op["func"] == "chimerax_user_structure":
            continue
        if op["func"] == "chimerax_open":
            op = {"func": "chimerax_open", "data": "twohelix.pdb", **({"name": op["name"]} if "name" in op else {})}
        ops.append(op)
    return {**task, "initialize": ops}


@needs_engine
@needs_sb
@pytest.mark.parametrize("stem", DATA_FREE)
def test_scienceboard_data_free_oracles_on_engine(engine, stem):
    task = _substitute(_converted()[stem])
    engine.reset()
    engine.setup(task)
    results = engine.evaluate(task, None)
    assert not all(ok for ok, _ in results), f"{stem} passes without doing anything: {results}"
    engine.reset()
    engine.setup(task)
    for cmd in typed_commands(task["solution"]):
        engine.app.typed(engine.desktop, cmd)
    results = engine.evaluate(task, oracle_answer(task["solution"]))
    assert all(ok for ok, _ in results), f"{stem}: {[d for ok, d in results if not ok]}"


PDB_DIR = os.environ.get("CODA_PDB_DIR")


@needs_engine
@needs_sb
@pytest.mark.skipif(
    not PDB_DIR,
    reason="set CODA_PDB_DIR to a folder of the PDB/AlphaFold mmCIF files ScienceBoard's "
    "ChimeraX tasks open (each converted task's `requires` lists them) to replay their oracles",
)
@pytest.mark.parametrize("stem", [f.stem for f in SB_FILES])
def test_scienceboard_oracles_with_user_structures_on_engine(engine, stem):
    task = _converted()[stem]
    if "refused" in task:
        pytest.skip(task["refused"])
    engine.reset()
    ctx = SetupContext(desktop=engine.desktop, app=engine.app, home=engine.home, task=None)
    from coda_env.registry import SETUP_OPS

    for op in task["initialize"]:
        SETUP_OPS[op["func"]].run(ctx, op)
    for cmd in typed_commands(task["solution"]):
        engine.app.typed(engine.desktop, cmd)
    results = engine.evaluate(task, oracle_answer(task["solution"]))
    assert all(ok for ok, _ in results), f"{stem}: {[d for ok, d in results if not ok]}"


@needs_engine
def test_a_replaced_inside_py_or_state_file_forges_nothing(engine):
    """The env runs inside.py once, at launch, and reads the state from `codadump`'s REST answer: a script
    or dump written over them in the agent-writable home (the forgery that made background_white pass on a
    black background) changes nothing the checks read."""
    engine.reset()
    e, d = engine, engine.desktop
    e.setup({"initialize": [{"func": "chimerax_open", "data": "twohelix.pdb"}]})
    forged = Path(e.home) / ad.CODA_DIR
    forged.mkdir(exist_ok=True)
    (forged / "inside.py").write_text(
        "import json, sys\nopen(sys.argv[2], 'w').write(json.dumps({'background': {'color': '#ffffff'}}))\n"
    )
    (forged / "state.json").write_text(json.dumps({"background": {"color": "#ffffff"}}))
    s = e.app.state(d)
    assert s["background"]["color"] == "#000000", s["background"]
    assert s["models"] and s["models"][0]["name"] == "twohelix.pdb"
    ctx = CheckContext(answer=None, task=None, desktop=d, home=e.home, state=s)
    assert not check_runner("states")({"type": "states", "path": "background.color", "value": "#ffffff"}, ctx)[0]


@needs_engine
def test_a_crashed_engine_is_named_and_the_rig_relaunches_it(engine):
    """A segfaulted ChimeraX (seen once in a session reopen under load) is reported as such, with the Python
    stack faulthandler leaves in its log, not as 'connection refused'; the next reset starts a fresh one."""
    engine.reset()
    engine.proc.send_signal(signal.SIGSEGV)
    engine.proc.wait(timeout=30)
    with pytest.raises(AppError, match=r"ChimeraX was killed by signal 11 \(SIGSEGV\).*Fatal Python error") as err:
        engine.app.state(engine.desktop)
    assert "Extension modules" not in str(err.value)
    with pytest.raises(AppError, match="SIGSEGV"):
        engine.app.command(engine.desktop, "version")
    engine.reset()
    assert engine.crashes and "SIGSEGV" in engine.crashes[-1]
    assert engine.proc.poll() is None and engine.app.state(engine.desktop)["models"] == []
