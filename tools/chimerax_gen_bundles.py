"""Regenerate bundles.json: the toolshed metadata the PyPI ChimeraX 1.7.1 wheel lacks.

The wheel ships every bundle's code in one distribution but none of the per-bundle metadata through which
ChimeraX's toolshed learns a bundle's commands, selectors, data formats and managers (without it:
"Unknown command: open"). That metadata is declared in each bundle's bundle_info.xml (or pyproject.toml)
in ChimeraX's public source. This script reads those declarations from a git clone of RBVI/ChimeraX at a
tag and writes the facts as JSON, one record per bundle:
    {"name", "version", "module", "synopsis", "requires": [dist names], "classifiers": ["ChimeraX :: ..."]}
install.py turns the records into one .dist-info folder per bundle inside the engine's venv.

Usage: python tools/chimerax_gen_bundles.py /path/to/ChimeraX.git v1.7.1 > coda_env/apps/chimerax/engine/bundles.json
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import tomllib


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", repo, *args], check=True, capture_output=True, text=True).stdout


def _quote(v: str) -> str:
    """A provider/manager keyword value as the toolshed's classifier parser reads it back."""
    if v == "" or re.search(r"[\s'\";]", v):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return v


def _kw(d: dict) -> list[str]:
    return [f"{k}:{_quote(str(v))}" for k, v in d.items()]


def from_xml(text: str) -> dict:
    root = ET.fromstring(text)
    a = root.attrib
    cats = [c.get("name") for cs in root.iter("Categories") for c in cs.iter("Category")]
    cls = [
        f"ChimeraX :: Bundle :: {','.join(cats)} :: {a['minSessionVersion']},{a['maxSessionVersion']}"
        f" :: {a['package']} :: {a.get('supercedes', '')} :: {a.get('customInit', '')}"
    ]
    for attr, kind in (
        ("installedDataDir", "DataDir"),
        ("installedIncludeDir", "IncludeDir"),
        ("installedLibraryDir", "LibraryDir"),
        ("installedExecutableDir", "ExecutableDir"),
    ):
        if a.get(attr):
            cls.append(f"ChimeraX :: {kind} :: {a[attr]}")
    for ms in root.iter("Managers"):
        for m in ms.iter("Manager"):
            kw = dict(m.attrib)
            cls.append(" :: ".join(["ChimeraX :: Manager", kw.pop("name"), *_kw(kw)]))
    for ps in root.iter("Providers"):
        for p in ps.iter("Provider"):
            kw = dict(p.attrib)
            mgr = kw.pop("manager", "") or ps.get("manager", "")
            cls.append(" :: ".join(["ChimeraX :: Provider", kw.pop("name"), mgr, *_kw(kw)]))
    inits: dict[str, list[str]] = {}
    for i in root.iter("InitAfter"):
        inits.setdefault(i.get("type"), []).append(i.get("bundle"))
    for t, names in inits.items():
        cls.append(" :: ".join(["ChimeraX :: InitAfter", t, *names]))
    for c in root.iter("ChimeraXClassifier"):
        text_ = " ".join((c.text or "").split())
        cls.append(text_ if text_.startswith("ChimeraX") else "ChimeraX :: " + text_)
    syn = root.find("Synopsis")
    return {
        "name": a["name"],
        "version": a["version"],
        "module": a["package"],
        "synopsis": " ".join((syn.text or "").split()) if syn is not None else a["name"],
        "requires": [d.get("name") for ds in root.iter("Dependencies") for d in ds.iter("Dependency")],
        "classifiers": cls,
    }


def from_toml(text: str, version: str) -> dict | None:
    """The newer pyproject.toml form (11 bundles in 1.7.1): commands, data formats, providers, managers."""
    d = tomllib.loads(text)
    cx = d.get("chimerax")
    if cx is None:
        return None
    proj = d["project"]
    name = proj["name"]
    module = "chimerax." + cx.get("module-name-override", name.removeprefix("ChimeraX-").lower().replace("-", "_"))
    cats = cx.get("categories", [])
    cls = [
        f"ChimeraX :: Bundle :: {','.join(cats)} :: {cx.get('min-session-version', 1)},"
        f"{cx.get('max-session-version', 1)} :: {module} :: :: "
        f"{'true' if cx.get('custom-init') else ''}"
    ]
    for cname, c in cx.get("command", {}).items():
        cls.append(
            f"ChimeraX :: Command :: {cname} :: {','.join(c.get('categories', cats))} :: {c.get('description', cname)}"
        )
    for sname, s in cx.get("selector", {}).items():
        cls.append(f"ChimeraX :: Selector :: {sname} :: {s.get('description', sname)}")
    for mname, m in cx.get("manager", {}).items():
        cls.append(" :: ".join(["ChimeraX :: Manager", mname, *_kw(m)]))
    for pname, p in cx.get("provider", {}).items():
        kw = {k: v for k, v in p.items() if k != "manager"}
        cls.append(" :: ".join(["ChimeraX :: Provider", pname, p.get("manager", ""), *_kw(kw)]))
    for fname, f in cx.get("data-format", {}).items():
        kw = {
            k: (",".join(v) if isinstance(v, list) else v)
            for k, v in f.items()
            if k not in ("open", "save") and not isinstance(v, (dict,))
        }
        kw = {k.replace("-", "_"): ("true" if v is True else "false" if v is False else v) for k, v in kw.items()}
        cls.append(" :: ".join(["ChimeraX :: Provider", fname, "data formats", *_kw(kw)]))
        for op in ("open", "save"):
            for entry in f.get(op, []):
                entry = dict(entry)
                if entry.pop("type", None) == "fetch":
                    pname = entry.pop("name")
                    entry["format_name"] = entry.pop("format-name", fname)
                    entry = {
                        k.replace("-", "_"): ("true" if v is True else "false" if v is False else v)
                        for k, v in entry.items()
                    }
                    cls.append(" :: ".join(["ChimeraX :: Provider", pname, "open command", "type:fetch", *_kw(entry)]))
                else:
                    entry = {
                        k.replace("-", "_"): ("true" if v is True else "false" if v is False else v)
                        for k, v in entry.items()
                    }
                    cls.append(" :: ".join(["ChimeraX :: Provider", fname, f"{op} command", *_kw(entry)]))
    reqs = [re.split(r"[\s~=<>!]", r.strip(), maxsplit=1)[0] for r in proj.get("dependencies", [])]
    return {
        "name": name,
        "version": version,
        "module": module,
        "synopsis": proj.get("description", name),
        "requires": [r for r in reqs if r.startswith("ChimeraX-")],
        "classifiers": cls,
    }


def main(repo: str, tag: str) -> None:
    files = _git(repo, "ls-tree", "-r", "--name-only", tag, "src/bundles").split()
    out = []
    for f in files:
        parts = f.split("/")
        if len(parts) != 4:
            continue
        if parts[3] == "bundle_info.xml":
            out.append(from_xml(_git(repo, "show", f"{tag}:{f}")))
        elif parts[3] == "pyproject.toml":
            rec = from_toml(_git(repo, "show", f"{tag}:{f}"), tag.lstrip("v"))
            if rec is not None:
                out.append(rec)
    out.sort(key=lambda r: r["name"])
    json.dump({"source": f"RBVI/ChimeraX {tag}", "bundles": out}, sys.stdout, indent=0)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
