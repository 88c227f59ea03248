"""Runs INSIDE ChimeraX (`runscript inside.py ...`), never imported by coda: the adapter's eyes and hands.

    runscript inside.py init        once after launch: a recorder of the log (what a person sees in the Log
                                    panel; `log clear` empties it) and the `codatype` command
    runscript inside.py dump OUT    write the session's state as JSON to OUT (the engine tests' tool)
    codadump                        (a command `init` registers) the state as JSON in the REST answer

The env runs this file once, at launch, before any agent acts; later it asks `codadump` over REST, so a
changed inside.py in the agent-writable home, or a changed dump file, changes nothing the checks read.

`codatype <command>` runs a command the way the command line does (logged, echoed), but after the REST
call that asked for it returns: REST wraps its commands in a log of its own that hides their messages
from every other log, which the command line does not. The next REST call is queued behind it on the
main thread, so it sees the result.
"""

import json
import sys

MAX_ATOMS = 20000
STATE_MARK = "coda-state:"
STYLES = {0: "sphere", 1: "ball", 2: "stick"}


def _hex(rgba):
    return "#%02x%02x%02x" % (int(rgba[0]), int(rgba[1]), int(rgba[2]))


def _floats(seq, nd=4):
    return [round(float(v), nd) for v in seq]


def init(session):
    import os

    # ChimeraX started as root replaces HOME (/do/not/run/as/root) to keep its caches out of root's home;
    # its folders come from XDG_* (set to the app's home), and `~` in a typed path should be that home too.
    if os.environ.get("CODA_HOME"):
        os.environ["HOME"] = os.environ["CODA_HOME"]
    if getattr(session, "_coda_log", None) is not None:
        return
    from chimerax.core.logger import PlainTextLog

    class Recorder(PlainTextLog):
        excludes_other_logs = False
        levels = {
            PlainTextLog.LEVEL_INFO: "info",
            PlainTextLog.LEVEL_WARNING: "warning",
            PlainTextLog.LEVEL_ERROR: "error",
            PlainTextLog.LEVEL_BUG: "bug",
        }

        def __init__(self):
            super().__init__()
            self.entries = []

        def log(self, level, msg):
            self.entries.append((self.levels.get(level, "info"), msg))
            del self.entries[:-2000]
            return False

    rec = Recorder()
    session.logger.add_log(rec)
    session._coda_log = rec

    def on_command(trigger, text):
        if text and " ".join(text.split()).lower() == "log clear":
            rec.entries.clear()

    session.triggers.add_handler("command finished", on_command)

    from chimerax.core.commands import CmdDesc, RestOfLine, register, run

    def codatype(session, text):
        def later():
            from chimerax.core.errors import NotABug

            try:
                run(session, text, log=True)
            except NotABug as e:
                session.logger.error(str(e))
            except Exception as e:  # what the command line shows for a failing command
                session.logger.error(f"{type(e).__name__}: {e}")

        session.ui.thread_safe(later)

    register(
        "codatype",
        CmdDesc(required=[("text", RestOfLine)], synopsis="run a command as if typed in the command line (coda)"),
        codatype,
        logger=session.logger,
    )

    def codadump(session):
        session.logger.info(STATE_MARK + json.dumps(state(session)))

    register(
        "codadump", CmdDesc(synopsis="the session's state as JSON in the log (coda)"), codadump, logger=session.logger
    )


def _structure(m, out_atoms, out_residues, budget):
    atoms = m.atoms
    res = m.residues
    mid = "#" + m.id_string
    chains = []
    for c in m.chains:
        chains.append(
            {
                "id": c.chain_id,
                "spec": f"{mid}/{c.chain_id}",
                "sequence": c.characters,
                "polymer": {0: "none", 1: "protein", 2: "nucleic"}.get(int(c.polymer_type), "none"),
                "residues": int(c.num_existing_residues),
            }
        )
    label_text = {}
    for child in m.child_models():
        if type(child).__name__ == "ObjectLabels":
            for lab in child.labels():
                label_text[id(lab.object)] = lab.text
    ribbons = 0
    for r in res:
        spec = f"{mid}/{r.chain_id}:{r.number}{r.insertion_code}"
        shown = bool(r.ribbon_display)
        ribbons += shown
        ra = r.atoms
        out_residues[spec] = {
            "name": r.name,
            "chain": r.chain_id,
            "number": int(r.number),
            "ribbon": shown,
            "ribbon_color": _hex(r.ribbon_color),
            "selected": bool(ra.selecteds.any()) if len(ra) else False,
            "atoms_shown": int(ra.displays.sum()) if len(ra) else 0,
            "label": label_text.get(id(r)),
        }
    if len(atoms) <= budget:
        for a in atoms:
            r = a.residue
            spec = f"{mid}/{r.chain_id}:{r.number}{r.insertion_code}@{a.name}"
            out_atoms[spec] = {
                "element": a.element.name,
                "color": _hex(a.color),
                "shown": bool(a.display),
                "visible": bool(a.visible),
                "style": STYLES.get(int(a.draw_mode), "?"),
                "selected": bool(a.selected),
                "coord": _floats(a.scene_coord, 3),
                "radius": round(float(a.radius), 4),
                "label": label_text.get(id(a)),
            }
    nuc = {
        "drawing": hasattr(m, "_nucleotides_drawing"),
        "residues": len(getattr(m, "_nucleotide_info", {}) or {}),
        "ladder_stubs_only": getattr(getattr(m, "_ladder_params", None), "stubs_only", None),
    }
    styles = {}
    for mode in atoms.draw_modes:
        name = STYLES.get(int(mode), "?")
        styles[name] = styles.get(name, 0) + 1
    return {
        "chains": chains,
        "atoms": len(atoms),
        "residues": len(res),
        "bonds": int(m.num_bonds),
        "atoms_shown": int(atoms.displays.sum()) if len(atoms) else 0,
        "styles": styles,
        "ribbons_shown": ribbons,
        "atoms_listed": len(atoms) <= budget,
        "nucleotides": nuc,
    }


def dump(session, out):
    """The state as a file (a tool of the engine's tests; the env reads `codadump`'s REST answer)."""
    with open(out + ".tmp", "w") as f:
        json.dump(state(session), f)
    import os

    os.replace(out + ".tmp", out)


def state(session):
    view = session.main_view
    models, atoms, residues, labels2d, pbgroups, surfaces = [], {}, {}, [], [], []
    budget = MAX_ATOMS
    from chimerax.atomic import PseudobondGroup, Structure

    for m in session.models.list():
        mid = "#" + m.id_string
        entry = {
            "id": mid,
            "name": m.name,
            "type": type(m).__name__,
            "shown": bool(m.display),
            "visible": bool(m.visible),
            "parent": ("#" + m.parent.id_string) if m.parent is not None and m.parent.id else None,
        }
        inv_cam = view.camera.position.inverse()
        entry["position"] = [_floats(row) for row in m.position.matrix]
        entry["view_rotation"] = [_floats(row[:3]) for row in (inv_cam * m.position).matrix]
        b = m.bounds()
        entry["bounds"] = None if b is None else {"xyz_min": _floats(b.xyz_min), "xyz_max": _floats(b.xyz_max)}
        if isinstance(m, Structure):
            entry.update(_structure(m, atoms, residues, budget))
            budget -= entry["atoms"]
            if hasattr(m, "create_marker") or type(m).__name__ == "CentroidModel":  # markers, centroids
                entry["markers"] = [
                    {"coord": _floats(a.scene_coord), "radius": round(float(a.radius), 4)} for a in m.atoms[:100]
                ]
        elif isinstance(m, PseudobondGroup):
            pbs = m.pseudobonds
            info = {
                "id": mid,
                "name": m.name,
                "count": len(pbs),
                "shown": bool(m.display),
                "color": _hex(m.color),
                "lengths": _floats(pbs.lengths, 3)[:200] if len(pbs) else [],
            }
            info["pb_colors"] = sorted({_hex(c) for c in pbs.colors}) if len(pbs) else []
            entry.update(pseudobonds=len(pbs), pb_colors=info["pb_colors"], pb_color=info["color"])
            pbgroups.append(info)
        cls = type(m).__name__
        if cls == "MolecularSurface":
            vc = m.vertex_colors
            import hashlib

            import numpy

            digest = (
                None
                if vc is None
                else hashlib.sha256(numpy.ascontiguousarray(vc, dtype=numpy.uint8).tobytes()).hexdigest()
            )
            surf = {
                "id": mid,
                "name": m.name,
                "shown": bool(m.display),
                "color": _hex(m.color),
                "vertex_colored": vc is not None,
                "vertex_colors_sha256": digest,
                "transparent": bool(m.color[3] < 255 or (vc is not None and (vc[:, 3] < 255).any())),
            }
            surfaces.append(surf)
            entry.update(surface=surf)
        if cls == "LabelModel":
            lab = getattr(m, "label", None)
            info2d = {
                "id": mid,
                "name": m.name,
                "text": getattr(lab, "text", None),
                "scalebar_width": getattr(lab, "scalebar_width", None),
                "scalebar_height": getattr(lab, "scalebar_height", None),
            }
            labels2d.append(info2d)
            entry.update(
                label2d=info2d, scalebar_width=info2d["scalebar_width"], scalebar_height=info2d["scalebar_height"]
            )
        if cls == "ColorKeyModel":
            entry.update(border=bool(getattr(m, "_border", False)), ticks=bool(getattr(m, "_ticks", False)))
        models.append(entry)
    sel_atoms = [k for k, v in atoms.items() if v["selected"]]
    sel_res = [k for k, v in residues.items() if v["selected"]]
    cam = view.camera
    light = view.lighting
    rec = getattr(session, "_coda_log", None)
    from chimerax.core.logger import html_to_plain

    log = []
    if rec is not None:
        for level, msg in rec.entries:
            text = html_to_plain(msg) if "<" in msg and ">" in msg else msg
            log.append({"level": level, "text": text.rstrip("\n")})
    from chimerax.atomic import selected_atoms

    by_name = {}
    for e_ in models:
        by_name.setdefault(e_["name"], e_)
    state = {
        "models": models,
        "models_by_name": by_name,
        "models_by_id": {e_["id"]: e_ for e_ in models},
        "atoms": atoms,
        "residues": residues,
        "selection": {
            "atoms": int(len(selected_atoms(session))),
            "atom_specs": sel_atoms[:2000],
            "residues": sel_res[:2000],
        },
        "pseudobond_groups": pbgroups,
        "surfaces": surfaces,
        "labels_2d": labels2d,
        "background": {
            "color": _hex([round(c * 255) for c in view.background_color]),
            "rgba": _floats(view.background_color),
        },
        "camera": {
            "position": [_floats(row) for row in cam.position.matrix],
            "view_direction": _floats(cam.view_direction()),
            "field_of_view": round(float(cam.field_of_view), 4),
        },
        "lighting": {
            "key_intensity": round(float(light.key_light_intensity), 4),
            "fill_intensity": round(float(light.fill_light_intensity), 4),
            "ambient_intensity": round(float(light.ambient_light_intensity), 4),
            "shadows": bool(light.shadows),
            "multishadow": int(light.multishadow),
            "depth_cue": bool(light.depth_cue),
            "multishadow_depth_bias": round(float(light.multishadow_depth_bias), 4),
        },
        "silhouettes": {
            "enabled": bool(view.silhouette.enabled),
            "thickness": round(float(view.silhouette.thickness), 4),
            "depth_jump": round(float(view.silhouette.depth_jump), 4),
        },
        "log": log,
        "log_text": "\n".join(e["text"] for e in log),
    }
    return state


def _main():
    args = sys.argv[1:]
    session = globals()["session"]  # runscript provides it
    if args[:1] == ["init"]:
        init(session)
    elif args[:1] == ["dump"] and len(args) == 2:
        dump(session, args[1])
    else:
        raise SystemExit(f"inside.py: unknown arguments {args}")


_main()
