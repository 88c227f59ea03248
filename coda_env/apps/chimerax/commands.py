"""ChimeraX command text from a task file, judged by what ChimeraX will run, not by how it is spelled.

ChimeraX's parser (chimerax.core.commands.cli, 1.7.1) completes an abbreviated word of a command name to the
first registered command it begins, and an abbreviated keyword to the keyword it begins, with or without
case (`info models saveF /tmp/x` runs `info models saveFile /tmp/x`; `save_file` is `saveFile` too). So a
task file's command is resolved here the same way, against the table ChimeraX 1.7.1 itself declares
(commands.json, written by tools/chimerax_gen_commands.py), and is refused when:
- the command's name is abbreviated or unknown; a word after it abbreviates more than one subcommand (ChimeraX
  would run whichever was registered first) or no subcommand unambiguously (`info sel` is `info selection`);
  or the resolved command is not in the policy's whitelist or is a forbidden subcommand (`color image` reads
  a file, `distance save` writes one, `info notify` reaches a URL);
- any word could resolve to a keyword that names a file, a URL or code (`saveFile`, `file`, `url`, ...), or
  is ambiguous among the command's keywords; every word is treated as a possible keyword (a value word that
  happens to abbreviate one is refused too: the safe side);
- a number is not finite or is out of bounds (`wait 100000000` would hold ChimeraX for days);
- it has quotes, control characters or a comment (no second tokenizer to disagree with ChimeraX's).
Nothing here runs anything: `check` returns the resolved command names or raises ValueError with the reason.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

TABLE_FILE = Path(__file__).resolve().parent / "commands.json"
MAX_TEXT = 2000
MAX_NUMBER = 1e6  # any number in a command
MAX_ANIMATED = 3600  # any number in a command that animates over frames (turn y 90 3600)
MAX_WAIT = 600  # frames `wait` may hold ChimeraX (10 s at 60 frames/s)
# Keywords that name a file, a folder, a URL or code, in any ChimeraX command (tools/chimerax_gen_commands.py's
# table, all of it): refused in every command, even where the table does not list them (another ChimeraX
# version may add them), for every word of 2+ characters that abbreviates one.
FILE_KEYWORDS: dict[str, str] = {
    "saveFile": "writes a file",
    "file": "reads a file",
    "filename": "names a file",
    "logFile": "writes a file",
    "outputFile": "writes a file",
    "output": "writes a file",
    "directory": "names a folder",
    "writeColors": "writes a file",
    "writeSurfaceData": "writes a file",
    "writeMol2": "writes a file",
    "save": "writes a file",
    "saveSettings": "writes settings",
    "path": "names a file",
    "tempPath": "names a folder",
    "executableLocation": "runs a program",
    "executableLinks": "runs commands",
    "url": "reaches the network",
    "host": "reaches the network",
    "port": "opens a port",
    "server": "reaches the network",
    "nameServer": "reaches the network",
    "script": "runs code",
    "python": "runs code",
    "runscript": "runs code",
    "showCommands": "runs commands",
    "relayCommands": "runs commands",
    "command": "runs commands",
}
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(inf|infinity|nan)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@lru_cache(maxsize=1)
def table() -> dict:
    return json.loads(TABLE_FILE.read_text())


def user_kw(word: str) -> str:
    """What ChimeraX compares with its keywords: `save_file` -> `saveFile` (cli.user_kw)."""
    parts = word.split("_")
    return parts[0] + "".join(p.capitalize() for p in parts[1:])


@dataclass(frozen=True)
class Policy:
    """Which resolved commands a use allows, and what it refuses besides FILE_KEYWORDS."""

    commands: frozenset[str]  # full names (with subcommands) allowed
    subtrees: frozenset[str] = frozenset()  # names whose every subcommand is allowed too
    forbidden: dict[str, str] = field(default_factory=dict)  # full name -> why (its subcommands too)
    keywords: dict[str, str] = field(default_factory=dict)  # extra forbidden keywords -> why

    def allows(self, name: str) -> bool:
        if any(name == f or name.startswith(f + " ") for f in self.forbidden):
            return False
        return name in self.commands or any(name.startswith(s + " ") for s in self.subtrees)


def split(text: object) -> list[str]:
    """The `;`-separated commands of a line (refusing what a tokenizer could read two ways)."""
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT:
        raise ValueError(f"must be one line of ChimeraX commands of 1..{MAX_TEXT} characters")
    if _CONTROL.search(text):
        raise ValueError("has control characters (one line of commands, no tabs or newlines)")
    if '"' in text or "'" in text:
        raise ValueError("has quotes: a task's ChimeraX commands are plain words")
    parts = text.split(";")
    for p in parts:
        if not p.strip():
            raise ValueError(f"has an empty command in {text!r}")
        if p.strip().startswith("#"):
            raise ValueError(f"has a comment in {text!r}")
    return [p.strip() for p in parts]


def _number(word: str) -> float | None:
    return float(word) if _NUMBER.fullmatch(word) else None


def _numbers(word: str) -> list[float]:
    """The numbers a word is: one, or a comma list (`1,0,0`); atom specs, colours and ranges are not."""
    values = [_number(piece) for piece in word.split(",")]
    return [v for v in values if v is not None]


def resolve_one(command: str, policy: Policy) -> str:
    """The full name of the command ChimeraX would run for one `;`-free command; ValueError if refused."""
    cmds = table()["commands"]
    words = command.split()
    head = words[0]
    if head not in cmds:
        near = sorted(n for n in table()["top"] if n.casefold().startswith(head.casefold()))
        if near:
            raise ValueError(
                f"{head!r} is not a full ChimeraX command name (ChimeraX would complete it to "
                f"{' or '.join(near[:8])}{' ...' if len(near) > 8 else ''}): spell commands in full"
            )
        raise ValueError(f"{head!r} is not a ChimeraX command")
    name, i = head, 1
    while i < len(words) and cmds.get(name, {}).get("subcommands"):
        subs = cmds[name]["subcommands"]
        w = words[i]
        if w in subs:
            name, i = f"{name} {w}", i + 1
            continue
        near = [s for s in subs if s.casefold().startswith(w.casefold())]
        if near == [s for s in subs if s.startswith(w)] and len(near) == 1:
            name, i = f"{name} {near[0]}", i + 1  # a unique abbreviation (`info sel`): what ChimeraX runs
            continue
        if near:  # ChimeraX would take the first registered subcommand the word begins
            raise ValueError(
                f"{w!r} after {name!r} is ambiguous: it abbreviates the subcommands "
                f"{' and '.join(near)}: spell it in full"
            )
        break
    for f, why in policy.forbidden.items():
        if name == f or name.startswith(f + " "):
            raise ValueError(f"{name!r} is not allowed in a task file: it {why}")
    entry = cmds.get(name, {})
    if "keywords" not in entry:
        raise ValueError(f"{name!r} is not a complete ChimeraX command here")
    if not policy.allows(name):
        raise ValueError(f"ChimeraX command {name!r} is not allowed in a task file")
    keywords = entry["keywords"]
    forbidden = {**FILE_KEYWORDS, **policy.keywords}
    animated = "frames" in keywords or "frames" in entry.get("positionals", [])
    limit = MAX_WAIT if name == "wait" else MAX_ANIMATED if animated else MAX_NUMBER
    for w in words[i:]:
        kw = user_kw(w).casefold()
        exact = [k for k in keywords if k.casefold() == kw]
        if exact and exact[0] not in forbidden:
            continue  # a keyword of the command, spelled in full: ChimeraX takes it as is
        if kw and kw[0].isalpha():
            cands = [k for k in keywords if k.casefold().startswith(kw)]
            bad = [k for k in cands if k in forbidden]
            if bad:
                raise ValueError(
                    f"{w!r} in {command!r} resolves to {name}'s keyword {bad[0]!r}, which {forbidden[bad[0]]}"
                )
            if len(kw) >= 2:
                bad = [k for k in forbidden if k.casefold().startswith(kw)]
                if bad:
                    raise ValueError(
                        f"{w!r} in {command!r} could be read as the keyword {bad[0]!r}, which {forbidden[bad[0]]}"
                    )
            if len(cands) > 1:
                raise ValueError(
                    f"{w!r} in {command!r} is ambiguous among {name}'s keywords "
                    f"({', '.join(cands)}): spell keywords in full"
                )
        for v in _numbers(w):
            if not math.isfinite(v) or abs(v) > limit:
                what = (
                    "frames to wait"
                    if name == "wait"
                    else "a number in a command that animates"
                    if animated
                    else "a number"
                )
                raise ValueError(f"{w!r} in {command!r}: {what} must be finite and at most {limit:g}")
    return name


def check(text: object, policy: Policy) -> list[str]:
    """The resolved command names of a line of ChimeraX commands; ValueError naming what is refused."""
    return [resolve_one(part, policy) for part in split(text)]
