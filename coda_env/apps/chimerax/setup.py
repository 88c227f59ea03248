"""ChimeraX's setup operations (a task's `initialize`), run over REST once the app is ready.

A task file is data: commands are resolved as ChimeraX resolves them (abbreviations included, commands.py)
and checked against a whitelist of ChimeraX commands that change the view or the models (no `open`/`save`/
`runscript`/`shell`/..., no file, URL or code keyword in any spelling, bounded numbers), and every path is
confined to the app's home. Structures come from this package's data/ folder or from files a "files" op wrote into
home; nothing is fetched.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...registry import (
    SetupContext,
    SetupError,
    SetupOp,
    confined,
    number,
    relative_path,
)
from . import commands
from .adapter import DATA, quote

# Commands a task file may run (with their subcommands): they change what is shown, never files or code.
COMMAND_VERBS = frozenset(
    """
color rainbow style show hide cartoon ~cartoon surface ~surface select ~select label ~label turn roll move
view zoom lighting graphics set distance ~distance angle measure hbonds ~hbonds nucleotides ~nucleotides
transparency size clip ~clip camera delete close name cofr ~cofr ribbon ~ribbon material 2dlabels key
coulombic mlp contacts ~contacts clashes ~clashes addh swapaa align info wait windowsize rename split combine
~show ~display display
""".split()
)
# Subcommands of those that read or write files or reach out (refused with their own subcommands).
FORBIDDEN_SUBCOMMANDS = {
    "color image": "reads an image file",
    "distance save": "writes a file",
    "info notify": "sends the session's changes to a URL",
    "info path": "lists the host's folders",
}
POLICY = commands.Policy(commands=COMMAND_VERBS, subtrees=COMMAND_VERBS, forbidden=FORBIDDEN_SUBCOMMANDS)
SAVE_SUFFIXES = (".pdb", ".cif", ".cxs", ".png", ".jpg", ".jpeg", ".tif", ".defattr")
OPEN_SUFFIXES = (".pdb", ".cif", ".ent", ".cxs", ".mol2", ".sdf")


def check_command(text: object) -> str:
    """The command line, if each of its `;`-separated commands resolves (as ChimeraX resolves abbreviated
    command words and keywords: commands.py) to a whitelisted command with no file, URL or code keyword and
    bounded numbers; else SetupError naming what is refused."""
    try:
        commands.check(text, POLICY)
    except ValueError as e:
        raise SetupError(f"'command': {e}") from None
    return text  # type: ignore[return-value]


def _rel(op: dict, name: str = "path") -> None:
    relative_path(op.get(name), repr(name), SetupError)  # relative to the home, no '..', not absolute
    confined("/nonexistent-home", op.get(name), repr(name))


# ------------------------------------------------------------------ chimerax_open
def _open_validate(op: dict) -> None:
    if ("data" in op) == ("path" in op):
        raise SetupError(
            "chimerax_open needs exactly one of 'data' (a structure this package ships) or "
            "'path' (a file in the app's home)"
        )
    if "data" in op:
        name = op["data"]
        if not isinstance(name, str) or "/" in name or name.startswith(".") or not (DATA / name).is_file():
            shipped = ", ".join(sorted(p.name for p in DATA.iterdir() if p.suffix in OPEN_SUFFIXES))
            raise SetupError(f"'data' must name a structure in {DATA.name}/ ({shipped}), got {name!r}")
    else:
        _rel(op)
    if "name" in op and not (isinstance(op["name"], str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", op["name"])):
        raise SetupError(f"'name' must be a model name of letters, digits, _ . - (got {op['name']!r})")
    target = op.get("as", op.get("path", op.get("data")))
    if "as" in op:
        _rel(op, "as")
    if not str(target).lower().endswith(OPEN_SUFFIXES):
        raise SetupError(f"can open only {', '.join(OPEN_SUFFIXES)} files, got {target!r}")


def _open(ctx: SetupContext, op: dict) -> None:
    if "data" in op:
        rel = op.get("as", op["data"])
        ctx.write_file(rel, (DATA / op["data"]).read_bytes())
    else:
        rel = op["path"]
    name = f" name {op['name']}" if "name" in op else ""
    ctx.app.command(ctx.desktop, f"open {quote(ctx.path(rel))}{name}")


# ------------------------------------------------------------------ chimerax_user_structure
ENTRY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,59}")


def user_structure_dir() -> str | None:
    return os.environ.get("CODA_PDB_DIR")


def _user_validate(op: dict) -> None:
    if not isinstance(op.get("entry"), str) or not ENTRY.fullmatch(op["entry"]):
        raise SetupError(f"'entry' must be a PDB/AlphaFold entry name (letters, digits, _ -), got {op.get('entry')!r}")
    _rel(op)


def _user(ctx: SetupContext, op: dict) -> None:
    """Copy a structure the user supplied ($CODA_PDB_DIR/<entry>.cif) into home: coda never fetches."""
    folder = user_structure_dir()
    src = Path(folder, op["entry"] + ".cif") if folder else None
    if src is None or not src.is_file():
        raise SetupError(
            f"this task needs the structure {op['entry']}.cif in $CODA_PDB_DIR "
            f"({'unset' if not folder else folder}); coda never fetches: download it once "
            f"({source_url(op['entry'])}) and set CODA_PDB_DIR"
        )
    ctx.write_file(op["path"], src.read_bytes())


def source_url(entry: str) -> str:
    if entry.startswith("AF-"):
        return f"https://alphafold.ebi.ac.uk/files/{entry}.cif"
    return f"https://files.rcsb.org/download/{entry}.cif"


# ------------------------------------------------------------------ chimerax_command / turn / clear_log / save
def _command_validate(op: dict) -> None:
    check_command(op.get("command"))


def _command(ctx: SetupContext, op: dict) -> None:
    ctx.app.command(ctx.desktop, op["command"])


def _turn_validate(op: dict) -> None:
    if op.get("axis") not in ("x", "y", "z"):
        raise SetupError(f"'axis' must be x, y or z, got {op.get('axis')!r}")
    number(op.get("angle"), "'angle' (degrees)", -3600, 3600, error=SetupError)


def _turn(ctx: SetupContext, op: dict) -> None:
    ctx.app.command(ctx.desktop, f"turn {op['axis']} {float(op['angle']):g}")


def _clear_log(ctx: SetupContext, op: dict) -> None:
    # as typed: REST runs commands unlogged, and an unlogged `log clear` does not reach the log recorder
    ctx.app.typed(ctx.desktop, "log clear")


def _save_validate(op: dict) -> None:
    _rel(op)
    if not op["path"].lower().endswith(SAVE_SUFFIXES):
        raise SetupError(f"can save only {', '.join(SAVE_SUFFIXES)} files, got {op['path']!r}")


def _save(ctx: SetupContext, op: dict) -> None:
    path = ctx.path(op["path"])
    folder = Path(op["path"]).parent
    if str(folder) != ".":  # ChimeraX does not create folders; the desktop does on write
        ctx.write_file(str(folder / ".keep"), b"")
    ctx.app.command(ctx.desktop, f"save {quote(path)}")


def _none(op: dict) -> None:
    return None


SETUP_OPS = [
    SetupOp("chimerax_open", _open, _open_validate, optional={"data", "path", "as", "name"}),
    SetupOp("chimerax_user_structure", _user, _user_validate, required={"entry", "path"}, phase="files"),
    SetupOp("chimerax_command", _command, _command_validate, required={"command"}),
    SetupOp("chimerax_turn", _turn, _turn_validate, required={"axis", "angle"}),
    SetupOp("chimerax_clear_log", _clear_log, _none),
    SetupOp("chimerax_save", _save, _save_validate, required={"path"}),
]
