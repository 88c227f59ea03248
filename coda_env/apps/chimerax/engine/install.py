"""Complete the PyPI ChimeraX 1.7.1 wheel inside the engine venv (run with that venv's python).

Three fixes, each idempotent:
1. grako 3.16.5 (ChimeraX's command-line grammar library) imports Mapping/Callable from `collections`,
   which Python 3.10 removed; rewrite those imports to `collections.abc`.
2. The wheel lacks `chimerax.core.nogui`, the text UI that `--nogui` imports: install ours (nogui.py here).
3. The wheel lacks the per-bundle metadata the toolshed reads to register commands, selectors and formats:
   write one `<bundle>.dist-info` per bundle from bundles.json (see tools/chimerax_gen_bundles.py), each listing the
   bundle's packages in RECORD so the toolshed can map modules to bundles.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARK = "coda-chimerax-engine"


def patch_grako(site: Path) -> int:
    n = 0
    for f in (site / "grako").glob("*.py"):
        src = f.read_text()
        new = re.sub(
            r"^from collections import defaultdict, Mapping$",
            "from collections import defaultdict\nfrom collections.abc import Mapping",
            src,
            flags=re.M,
        )
        new = re.sub(
            r"^from collections import (Callable|Mapping)$", r"from collections.abc import \1", new, flags=re.M
        )
        new = re.sub(r"\bcollections\.(Mapping|Callable)\b", r"collections.abc.\1", new)
        if new != src:
            if "import collections.abc" not in new and "collections.abc." in new:
                new = new.replace("import collections\n", "import collections\nimport collections.abc\n", 1)
            f.write_text(new)
            n += 1
    return n


def install_nogui(site: Path) -> None:
    shutil.copyfile(HERE / "nogui.py", site / "chimerax" / "core" / "nogui.py")


def _packages(site: Path, module: str) -> list[str]:
    root = site.joinpath(*module.split("."))
    if not (root / "__init__.py").exists():
        return []
    return sorted(str(p.relative_to(site)) for p in root.rglob("__init__.py") if "__pycache__" not in p.parts)


def write_metadata(site: Path) -> tuple[int, list[str]]:
    data = json.loads((HERE / "bundles.json").read_text())
    for old in site.glob("ChimeraX_*.dist-info"):
        if (old / MARK).exists():
            shutil.rmtree(old)
    written, missing = 0, []
    for b in data["bundles"]:
        inits = _packages(site, b["module"])
        if not inits:
            missing.append(b["name"])  # a bundle that is not in the wheel (the GUI's, for example)
            continue
        d = site / f"{b['name'].replace('-', '_')}-{b['version']}.dist-info"
        d.mkdir(exist_ok=True)
        lines = ["Metadata-Version: 2.1", f"Name: {b['name']}", f"Version: {b['version']}", f"Summary: {b['synopsis']}"]
        lines += [f"Requires-Dist: {r}" for r in b["requires"]]
        lines += [f"Classifier: {c}" for c in b["classifiers"]]
        (d / "METADATA").write_text("\n".join(lines) + "\n\n" + b["synopsis"] + "\n")
        (d / "RECORD").write_text("".join(f"{p},,\n" for p in inits))
        (d / "INSTALLER").write_text(MARK + "\n")
        (d / MARK).write_text(data["source"] + "\n")
        written += 1
    return written, missing


def main() -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    if not (site / "chimerax" / "core").is_dir():
        sys.exit(f"install.py: no chimerax.core in {site}: install the ChimeraX wheel first")
    g = patch_grako(site)
    install_nogui(site)
    n, missing = write_metadata(site)
    print(
        f"chimerax-engine: grako files patched {g}, nogui installed, bundle metadata {n} "
        f"(not in the wheel: {len(missing)}: {', '.join(missing)})"
    )


if __name__ == "__main__":
    main()
