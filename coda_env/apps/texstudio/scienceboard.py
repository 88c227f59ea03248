"""ScienceBoard's TeXstudio task files -> coda task dicts. Their shell commands are never run.

Setup operations:
- `touch` {path, text} -> `write_file` (the path inside /home/user/ becomes home-relative).
- `launch` of texstudio -> `open_file` for each file it names (TeXstudio shows the last one).
- `launch` of another app (chimerax, KAlgebra, Celestia, GRASS GIS) -> the app joins the task's `apps`; the
  app's own package starts it with a fresh profile. VS Code (C-05, "may use to debug") is not an app here: it
  goes to `requires`.
- `execute` (their `rm` of ChimeraX's history files and of GRASS locks) -> dropped: every reset starts each
  app with a fresh profile, which is what those commands were for.
- `chimerax_clear_log`, `chimerax_turn` -> the ChimeraX package's ops of the same names; `chimerax_open`
  {name: PDB id} -> `chimerax_open` {path: "<id>.cif"}, a file the user supplies (`requires`; PDB downloads
  are not reachable here). `opt` (Celestia's render option) -> `celestia_opt`.
Checks:
- `file` {path, source, target} -> `tex_file` {path, replacements: [[source, target]]}: the saved file is the
  initial text with that replacement.
- `compile` {path, file} -> `compile`; `include` {path, pattern} -> the core `include`.
- `stop` {value: "ANS", args: [x]} -> the core `answer` check; a predicate (`pred`: "lambda dump: ...") ->
  the core `predicate` check through `coda_env.checks.translate_lambda`.
Figures a document includes that no operation writes (C-03/C-04 include figs/*.pdf from ScienceBoard's VM
image) are written as one-page placeholder PDFs, so that the document builds; `requires` says so.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Any

from ...scienceboard import base_task
from ...tasks import TaskError

SB_HOME = "/home/user/"
OTHER_APPS = {
    "chimerax": "chimerax",
    "kalgebra": "kalgebra",
    "celestia": "celestia",
    "celestia-qt6": "celestia",
    "grass": "grass",
}
_GRAPHICS = re.compile(r"^[^%\n]*\\includegraphics\s*(?:\[[^\]]*\])?\s*\{([^}]+)\}", re.M)


def _rel(path: Any, where: str) -> str:
    if not isinstance(path, str) or not path.startswith(SB_HOME):
        raise TaskError(f"{where}: path {path!r} is not inside {SB_HOME}")
    rel = os.path.normpath(path[len(SB_HOME) :])
    if rel.startswith("..") or rel in (".", ""):
        raise TaskError(f"{where}: path {path!r} leaves the home folder")
    return rel


def _argv(command: Any, where: str) -> list[str]:
    if isinstance(command, list) and all(isinstance(a, str) for a in command):
        return command
    if isinstance(command, str):
        try:
            return shlex.split(command)
        except ValueError as e:
            raise TaskError(f"{where}: cannot read the command {command!r}: {e}") from None
    raise TaskError(f"{where}: command must be a string or a list of strings")


def _launch(op: dict, where: str, init: list, apps: list, requires: list) -> None:
    argv = _argv(op.get("command"), where)
    words = [os.path.basename(w) for a in argv for w in a.split()]
    if argv and os.path.basename(argv[0]) == "texstudio":
        for a in argv[1:]:
            if not a.startswith("-"):
                init.append({"func": "open_file", "path": _rel(a, where)})
        return
    if "grass" in words and any("grassdata_piemonte" in a for a in argv):
        requires.append("ScienceBoard's GRASS location grassdata_piemonte_utm32n_wgs84_grass7 (its VM image)")
    for w in words:
        if w in OTHER_APPS:
            if OTHER_APPS[w] not in apps:
                apps.append(OTHER_APPS[w])
            return
    if words and words[0] == "code":
        requires.append(
            "VS Code with the Lean 4 extension, which the instruction offers for debugging "
            "(optional: the fix can be made in TeXstudio alone)"
        )
        return
    raise TaskError(f"{where}: launches {argv[:1]}, which this translation does not know")


def _placeholder_pdf() -> str:
    """A valid one-page PDF (ASCII), offsets computed, standing in for a figure of ScienceBoard's VM image."""
    objs = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] /Contents 4 0 R >>",
    ]
    stream = "0.8 g 0 0 200 100 re f"
    objs.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out, offsets = "%PDF-1.4\n", []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n{o}\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n" + "".join(f"{o:010d} 00000 n \n" for o in offsets)
    return out + f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n"


def _check(item: dict, where: str) -> dict:
    kind = item.get("type")
    if "pred" in item:  # a predicate over the app's state: translated, never evaluated as Python
        from ...predicate import translate_lambda

        return {"type": "predicate", "expr": translate_lambda(item["pred"])}
    if kind == "file":
        if not all(isinstance(item.get(k), str) for k in ("source", "target")):
            raise TaskError(f"{where}: a file check needs source and target strings")
        return {
            "type": "tex_file",
            "path": _rel(item.get("path"), where),
            "replacements": [[item["source"], item["target"]]],
        }
    if kind == "compile":
        return {"type": "compile", "path": _rel(item.get("path"), where), "file": str(item.get("file", "main"))}
    if kind == "include":
        return {"type": "include", "path": _rel(item.get("path"), where), "pattern": item["pattern"]}
    if kind == "stop":
        value, args = item.get("value"), item.get("args") or []
        if value == "ANS" and len(args) == 1:
            return {"type": "answer", "value": str(args[0])}
        if value == "FAIL":
            return {"type": "answer", "value": "FAIL"}
        raise TaskError(f"{where}: a stop check {value!r} with args {args!r} is not understood")
    raise TaskError(f"{where}: check type {kind!r} is not translated")


def convert(sb: dict, path: str) -> dict:
    """One ScienceBoard TeXstudio task file (its parsed JSON and its path) -> a coda task dict."""
    stem = os.path.splitext(os.path.basename(path))[0]
    if not isinstance(sb, dict) or sb.get("type") != "TeXstudio":
        raise TaskError(
            f"{path}: not a ScienceBoard TeXstudio task (type {sb.get('type') if isinstance(sb, dict) else None!r})"
        )
    init: list[dict] = []
    apps: list[str] = []
    requires: list[str] = []
    for i, op in enumerate(sb.get("initialize", [])):
        where = f"{path}: initialize[{i}]"
        func = op.get("func") if isinstance(op, dict) else None
        if func == "touch":
            if not isinstance(op.get("text"), str):
                raise TaskError(f"{where}: touch needs a text")
            init.append({"func": "write_file", "path": _rel(op.get("path"), where), "content": op["text"]})
        elif func == "launch":
            _launch(op, where, init, apps, requires)
        elif func == "execute":
            continue  # profile clean-up of another app: a fresh profile per reset does it
        elif func in ("chimerax_clear_log", "chimerax_turn"):
            init.append({k: v for k, v in op.items()})
        elif func == "chimerax_open":
            name = str(op.get("name", ""))
            if not re.fullmatch(r"[A-Za-z0-9]{4}", name):
                raise TaskError(f"{where}: chimerax_open needs a PDB id, got {name!r}")
            init.append({"func": "chimerax_open", "path": f"{name.lower()}.cif"})
            requires.append(
                f"the PDB entry {name.upper()} as {name.lower()}.cif in the app's home "
                f"(ScienceBoard fetched it from the PDB)"
            )
        elif func == "opt":
            init.append({"func": "celestia_opt", **{k: v for k, v in op.items() if k != "func"}})
        else:
            raise TaskError(f"{where}: setup operation {func!r} is not translated")
    evaluate = [_check(item, f"{path}: evaluate[{i}]") for i, item in enumerate(sb.get("evaluate", []))]
    # figures the finished document includes (the written text with the file checks' replacements applied)
    written = {op["path"] for op in init if op["func"] == "write_file"}
    missing: list[str] = []
    for op in list(init):
        if op["func"] == "write_file" and op["path"].endswith(".tex"):
            text = op["content"]
            for c in evaluate:
                if c["type"] == "tex_file" and c["path"] == op["path"]:
                    for old, new in c["replacements"]:
                        text = text.replace(old, new)
            folder = os.path.dirname(op["path"])
            for target in _GRAPHICS.findall(text):
                rel = os.path.normpath(os.path.join(folder, target.strip()))
                if not rel.endswith(".pdf") or rel.startswith("..") or rel in written or rel in missing:
                    continue
                missing.append(rel)
    for rel in missing:
        init.insert(0, {"func": "write_file", "path": rel, "content": _placeholder_pdf()})
    if missing:
        requires.append(
            "the figures " + ", ".join(missing) + " of ScienceBoard's VM image (blank placeholders stand in for them)"
        )
    if any(
        op["func"] == "write_file" and re.search(r"\\usepackage(\[[^\]]*\])?\{(kpfonts|beramono)\}", op["content"])
        for op in init
    ):
        requires.append("texlive-fonts-extra for kpfonts/beramono (CODA_TEXLIVE_FONTS_EXTRA=1 make setup)")
    if stem == "B-04":
        requires.append("a web browser with access to Google Scholar (the entry can also be typed by hand)")
    task: dict[str, Any] = {
        **base_task(sb, path, "texstudio"),
        "initialize": init,
        "evaluate": evaluate,
        "difficulty": "medium",
    }
    if apps:
        task["apps"] = apps
    if requires:
        task["requires"] = "; ".join(requires)
    return task
