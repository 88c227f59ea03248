"""Import of ScienceBoard's task files (its `tasks/VM/<App>/*.json`) as coda task files.

The core does what every app shares: reading the file, finding the app package that translates its
ScienceBoard `type` (`AppSpec.scienceboard_names`), the common fields (id, instruction, steps, origin), the
oracle this project wrote for it (`apps/<app>/scienceboard_oracles.json`, keyed by ScienceBoard's file
stem), and validation: a converted task must load like any other. Each app package owns its part
(`apps/<app>/scienceboard.py: convert(sb, path) -> dict`): setup operations, checks, predicates. Nothing
of a ScienceBoard file is ever run: shell commands map to setup operations or are refused, lambda strings
are translated into the restricted predicate language (`checks.translate_lambda`) or refused.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

from .registry import APPS, AppSpec
from .tasks import TaskError, parse_task, read_task_file


def app_for(sb: dict, path: str) -> AppSpec:
    kind = sb.get("type")
    for spec in APPS.values():
        if kind in spec.scienceboard_names:
            return spec
    raise TaskError(
        f"{path}: ScienceBoard app {kind!r} has no coda translation "
        f"(apps that translate: {', '.join(n for s in APPS.values() for n in s.scienceboard_names)})"
    )


def task_id(path: str | Path) -> str:
    """The coda id of a ScienceBoard file: `sb_` + its stem, made safe."""
    return "sb_" + re.sub(r"[^A-Za-z0-9_.-]", "_", Path(path).stem)


def base_task(sb: dict, path: str | Path, app: str) -> dict:
    """The fields every translation shares; an app's `convert` adds `initialize`, `evaluate` and the rest."""
    if not isinstance(sb.get("instruction"), str) or not sb["instruction"].strip():
        raise TaskError(f"{path}: no instruction")
    steps = sb.get("steps", 15)
    if not isinstance(steps, int) or isinstance(steps, bool):
        raise TaskError(f"{path}: steps must be an integer")
    return {
        "id": task_id(path),
        "app": app,
        "instruction": sb["instruction"].strip(),
        "steps": max(1, min(100, steps)),
        "origin": f"scienceboard:{sb.get('type')}/{Path(path).stem}",
        "category": "ScienceBoard",
    }


def oracles(spec: AppSpec) -> dict[str, list[str]]:
    """This project's oracle solutions of the app's ScienceBoard tasks, by file stem."""
    if spec.scienceboard is None:
        return {}
    f = Path(inspect.getfile(spec.scienceboard)).with_name("scienceboard_oracles.json")
    if not f.exists():
        return {}
    data = json.loads(f.read_text())
    return {k: v for k, v in data.items() if isinstance(v, list)}


def import_options() -> dict[str, str]:
    """The import options the app packages declare (AppSpec.scienceboard_options): name -> help."""
    out: dict[str, str] = {}
    for spec in APPS.values():
        out.update(spec.scienceboard_options)
    return out


def convert(sb: Any, path: str | Path = "<scienceboard task>", **options: str) -> dict:
    """One ScienceBoard task (decoded JSON) as a coda task dict; TaskError with the reason when refused.
    `options` (import options, `import_options()`) go to the app's translation where it takes them."""
    path = str(path)
    if not isinstance(sb, dict):
        raise TaskError(f"{path}: a ScienceBoard task file holds a JSON object")
    spec = app_for(sb, path)
    if spec.scienceboard is None or not hasattr(spec.scienceboard, "convert"):
        raise TaskError(f"{path}: the {spec.name} package has no ScienceBoard translation yet")
    takes = inspect.signature(spec.scienceboard.convert).parameters
    kwargs = {k: v for k, v in options.items() if v is not None and k in takes}
    task = spec.scienceboard.convert(sb, path, **kwargs)
    stem = Path(path).stem
    if "solution" not in task and stem in oracles(spec):
        task["solution"] = oracles(spec)[stem]
    parse_task(task, path)  # a converted task must load like any other (raises TaskError)
    return task


def convert_file(path: str | Path, **options: str) -> dict:
    """`convert` of a ScienceBoard task file on disk."""
    return convert(read_task_file(path), path, **options)


def find_files(src: Path) -> list[Path]:
    """ScienceBoard's layout (`tasks/VM/<App>/*.json`, from a checkout, its tasks folder or VM folder) or a
    flat folder of task files."""
    for base in (src / "tasks" / "VM", src / "VM", src):
        files = sorted(base.glob("*/*.json")) if base != src or not list(src.glob("*.json")) else []
        if files:
            return files
    return sorted(src.glob("*.json"))


def import_folder(src: Path, out: Path, **options: str) -> dict:
    """Convert every file under `src` into OUT/<app>/<id>.json; OUT/import-report.json says, per file,
    converted (and where) or refused (and why)."""
    if not src.is_dir():
        raise TaskError(f"{src} is not a folder of ScienceBoard task files")
    files = find_files(src)
    if not files:
        raise TaskError(f"{src} holds no ScienceBoard task files (*.json, or tasks/VM/<App>/*.json)")
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"source": str(src), "files": [], "by_app": {}}
    for f in files:
        rel = str(f.relative_to(src))
        app = next((n for n, spec in APPS.items() if f.parent.name in spec.scienceboard_names), f.parent.name.lower())
        try:
            task = convert_file(f, **options)
        except TaskError as e:
            reason = str(e)
            reason = reason[len(str(f)) + 2 :] if reason.startswith(str(f) + ": ") else reason
            report["files"].append({"file": rel, "status": "refused", "reason": reason})
        else:
            app = task["app"]
            dest = out / app / f"{task['id']}.json"
            dest.parent.mkdir(exist_ok=True)
            dest.write_text(json.dumps(task, indent=1))
            report["files"].append(
                {
                    "file": rel,
                    "status": "converted",
                    "task": task["id"],
                    "app": app,
                    "to": str(dest.relative_to(out)),
                    "oracle": bool(task.get("solution")),
                    "requires": task.get("requires", ""),
                }
            )
        counts = report["by_app"].setdefault(app, {"converted": 0, "refused": 0})
        counts[report["files"][-1]["status"]] += 1
    (out / "import-report.json").write_text(json.dumps(report, indent=1))
    return report
