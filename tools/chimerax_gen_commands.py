"""Writes ../commands.json: every command ChimeraX registers, with its subcommands and keywords, as ChimeraX
1.7.1 itself declares them. setup.py and checks.py resolve a task file's commands against this table the way
ChimeraX's parser does (commands/cli.py: words of a command name and keywords may be abbreviated), so that a
command is judged by what ChimeraX will run, not by how it is spelled.

Run inside coda's ChimeraX engine (`make chimerax-engine`), from the repository root:

    .chimerax-engine/bin/chimerax-engine --exit --script \
        "tools/chimerax_gen_commands.py coda_env/apps/chimerax/commands.json"

The engine lacks a few bundles (engine/README.md); the commands of those that the task whitelist uses are
added from ChimeraX's source at v1.7.1 (EXTRA below). Names of commands the engine does not have are taken
from bundles.json's declarations, so that an abbreviation of any of them is recognised as one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# src/bundles/nucleotides/src/cmd.py and __init__.py at v1.7.1 (the engine does not register it):
# `nucleotides` (required objects, representation) and the alias `~nucleotides` = "nucleotides $* atoms".
_NUC = {
    "subcommands": [],
    "positionals": ["objects", "representation"],
    "keywords": [
        "baseOnly",
        "dimensions",
        "glycosidic",
        "hideAtoms",
        "radius",
        "shape",
        "showOrientation",
        "showStubs",
        "thickness",
    ],
}
EXTRA = {"nucleotides": _NUC, "~nucleotides": _NUC}


def main(out: str) -> None:
    from chimerax.core.commands import cli

    table: dict[str, dict] = {}
    failed: list[str] = []

    def walk(info, prefix: str) -> None:
        for word, sub in list(info.subcommands.items()):
            name = f"{prefix} {word}".strip()
            if sub.is_deferred():
                try:
                    sub.lazy_register(name)
                except Exception:  # noqa: BLE001 - a bundle the engine lacks: its name still kept
                    failed.append(name)
            entry: dict = {"subcommands": sorted(sub.subcommands)}  # (their order varies with start-up)
            cd = sub.cmd_desc
            if isinstance(cd, cli.CmdDesc):
                entry["keywords"] = sorted(cd._keyword_map)
                entry["positionals"] = [str(k) for k in (*cd._required, *cd._optional)]
            table[name] = entry
            walk(sub, name)

    walk(cli._command_info.commands, "")
    declared = json.loads(
        (Path(__file__).resolve().parents[1] / "coda_env" / "apps" / "chimerax" / "engine" / "bundles.json").read_text()
    )
    for bundle in declared["bundles"]:
        for c in bundle.get("classifiers", []):
            parts = [p.strip() for p in c.split("::")]
            if len(parts) > 2 and parts[1] == "Command" and parts[2] not in table:
                table[parts[2]] = {"subcommands": [], "undeclared": True}
    for name, entry in EXTRA.items():
        table[name] = dict(entry)
    for name in list(table):  # a declared multi-word name: its first word is a command too
        words = name.split()
        for i in range(1, len(words)):
            parent, child = " ".join(words[:i]), words[i]
            p = table.setdefault(parent, {"subcommands": [], "undeclared": True})
            if child not in p["subcommands"]:
                p["subcommands"] = sorted([*p["subcommands"], child])
    top = sorted(n for n in table if " " not in n)
    doc = {
        "source": "UCSF ChimeraX 1.7.1 (coda's engine: the ChimeraX==0.1.71 wheel) + engine/bundles.json "
        "+ EXTRA of gen_commands.py",
        "top": top,
        "failed": sorted(failed),
        "commands": {n: table[n] for n in sorted(table)},
    }
    with open(out, "w") as f:
        f.write("{\n")
        f.write(
            ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in doc.items() if k != "commands")
        )
        f.write(',\n"commands": {\n')
        f.write(",\n".join(f"{json.dumps(n)}: {json.dumps(e, sort_keys=True)}" for n, e in doc["commands"].items()))
        f.write("\n}}\n")
    print(f"gen_commands: {len(table)} commands, {len(top)} top-level, {len(failed)} failed to register -> {out}")


if __name__ == "__main__" or "chimerax" in sys.modules:
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else str(Path(__file__).resolve().parents[1] / "coda_env" / "apps" / "chimerax" / "commands.json")
    )
