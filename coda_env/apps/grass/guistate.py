"""Runs INSIDE GRASS's wxGUI process (Debian's /usr/bin/python3), not in coda: a tiny state server.

The adapter copies this file and a one-line `usercustomize.py` into the user site folder of the env's own
HOME; Python imports `usercustomize` at start-up in every process of that HOME, and `install()` acts only in
the wxGUI's main program (`wxgui.py`). No GRASS file is changed, and GRASS knows nothing of it.

It connects once, at start, to the unix socket named by $CODA_GRASS_STATE_SOCKET, where the env listens; the
env takes that one connection and closes its socket, so a program the agent starts later (GRASS's console
runs programs) cannot take the GUI's place or listen in. A request is one JSON line with an "id", the reply
one JSON line with the same "id":
  {"op": "ping"}                           -> {"ok": true, "ready": bool}  (ready: both windows shown)
  {"op": "state"}                          -> {"ok": true, "state": {...}}  (see `_state`)
  {"op": "add_layer", "cmd": ["d.rast", "map=elevation"]}  set-up only: a d.rast/d.vect layer, as the
                                              Layer Manager's "Add raster/vector map layer" would add it
Everything that touches wx runs on the GUI thread (wx.CallAfter); the socket thread only waits for it.
Standard library and wx only: this file must import nothing from coda.
"""

import json
import os
import re
import socket
import sys
import threading

_SAFE_ARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.@:,+\- ]{1,200}$|^-[a-z]{1,8}$")
MAX_OUTPUT = 20000


def install():
    if not sys.argv or not sys.argv[0].endswith("wxgui.py"):
        return
    path = os.environ.pop("CODA_GRASS_STATE_SOCKET", None)  # the GUI's children (its console) never see it
    if not path:
        return
    _fast_find_library()
    _no_python_editor()
    threading.Thread(target=_serve, args=(path,), name="coda-grass-state", daemon=True).start()


_EDITOR_MODULES = ("main_window.frame", "lmgr.frame")


def _no_python_editor():
    """No task needs GRASS's Simple Python Editor (it runs Python code): its menu item and toolbar button
    do nothing. The GUI's frame classes are patched as their modules are imported, before any frame is made
    (their menus bind the handler when built)."""
    import importlib.abc
    import importlib.machinery

    def refuse(self, event=None):
        return None

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in _EDITOR_MODULES:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            real = spec.loader.exec_module

            def exec_module(module):
                real(module)
                for cls in vars(module).values():
                    if isinstance(cls, type) and "OnSimpleEditor" in vars(cls):
                        cls.OnSimpleEditor = refuse

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())


def _fast_find_library():
    """GRASS's ctypes loader asks ctypes.util.find_library for each of its ~27 libraries in $GISBASE/lib,
    which are not in the linker cache, so every call runs gcc and ld (a third of the GUI's start-up CPU).
    Same answers, found directly: the soname when $LD_LIBRARY_PATH holds lib<name>.so, None for the
    other spellings of GRASS's names (what the slow path answers too); anything else goes to the original."""
    import ctypes.util

    original = ctypes.util.find_library
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]

    def find_library(name):
        for d in dirs:
            if os.path.exists(os.path.join(d, "lib%s.so" % name)):
                return "lib%s.so" % name
        if "grass" in name:
            return None
        return original(name)

    ctypes.util.find_library = find_library


def _serve(path):
    """Connect once to the env's socket (at start, before any agent acts: the env takes that one connection
    and then closes its socket, so nothing started later can take the GUI's place) and answer on it."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    reader = conn.makefile("rb")
    while True:
        line = reader.readline(200000)
        if not line:
            return
        req = {}
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("a request is a JSON object")
            reply = _handle(req)
        except Exception as e:  # one bad request must not end the server
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        reply["id"] = req.get("id") if isinstance(req, dict) else None
        conn.sendall((json.dumps(reply, default=str) + "\n").encode())


def _handle(req):
    op = req.get("op")
    if op == "ping":
        return _on_gui(_ping)
    if op == "state":
        state = _on_gui(_state)
        state["computational_region"] = _comp_region()
        return {"ok": True, "state": state}
    if op == "set_scale":
        return _on_gui(lambda: _set_scale(req.get("scale")))
    if op == "close_splash":
        return _on_gui(_close_splash)
    if op == "layer_boxes":
        return {"ok": True, "layers": _on_gui(_layer_boxes)}
    if op == "add_layer":
        return _on_gui(lambda: _add_layer(req.get("map"), req.get("cmd")))
    return {"ok": False, "error": f"unknown op {op!r}"}


def _on_gui(fn, timeout=8.0):
    """Run fn on the wx main thread and return its result (its exception re-raised here)."""
    import wx

    if wx.GetApp() is None:
        raise RuntimeError("the wx application is not running yet")
    done = threading.Event()
    box = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as e:
            box["error"] = e
        finally:
            done.set()

    wx.CallAfter(run)
    if not done.wait(timeout):
        raise TimeoutError("the GUI thread did not answer")
    if "error" in box:
        raise box["error"]
    return box["value"]


# --------------------------------------------------------------------------------------------- reading
def _frames():
    import wx

    lmgr = next((w for w in wx.GetTopLevelWindows() if type(w).__name__ == "GMFrame"), None)
    return lmgr, (lmgr.GetMapDisplay() if lmgr is not None else None)


def _ping():
    lmgr, disp = _frames()
    ready = bool(lmgr and lmgr.IsShown() and disp and disp.IsShown() and disp.statusbarManager is not None)
    rendering = False
    if disp is not None:
        mgr = disp.GetMap().GetRenderMgr()
        rendering = bool(getattr(mgr, "_rendering", False))
        # A resized map canvas re-renders on an idle event 0.2 s after its last resize (BufferedWindow's
        # OnSize/OnIdle): until then the screen still shows the map drawn at the old size. Under load the
        # layout's last resize can come after the first render, so that counts as rendering too.
        win = disp.GetMapWindow()
        rendering = rendering or bool(getattr(win, "resize", False))

    return {"ok": True, "ready": ready, "rendering": rendering, "busy": _busy(lmgr)}


def _busy(lmgr):
    """A command the GUI started (console, module dialog) is queued or still running."""
    gcon = getattr(lmgr, "_gconsole", None) if lmgr is not None else None
    thread = getattr(gcon, "cmdThread", None)
    if thread is None:
        return False
    if not thread.requestQ.empty():
        return True
    module = getattr(getattr(thread, "requestCmd", None), "module", None)
    return module is not None and module.poll() is None


def _params(cmd):
    """A d.* command list as {"option": value}, and its flags."""
    params, flags = {}, []
    for a in cmd[1:]:
        if "=" in a:
            k, v = a.split("=", 1)
            params[k] = v
        elif a.startswith("-") and not a.startswith("--"):
            flags.extend(a[1:])
    return params, flags


def _layers(tree):
    out = []
    if tree is None:
        return out
    selected = {id(x) for x in (tree.GetSelections() or [])}
    item = tree.GetFirstChild(tree.root)[0]
    index = 0
    while item and item.IsOk():
        info = tree.GetLayerInfo(item) or {}
        ml = info.get("maplayer")
        cmd = list(info.get("cmd") or [])
        params, flags = _params(cmd)
        name = ml.GetName() if ml is not None and hasattr(ml, "GetName") else None
        opacity = ml.GetOpacity() if ml is not None and hasattr(ml, "GetOpacity") else None
        out.append(
            {
                "index": index,
                "name": name,
                "type": info.get("type"),
                "label": tree.GetItemText(item),
                "cmd": " ".join(cmd),
                "module": cmd[0] if cmd else None,
                "params": params,
                "flags": flags,
                "checked": bool(tree.IsItemChecked(item)),
                "selected": id(item) in selected,
                "opacity": round(float(opacity), 4) if opacity is not None else None,
                "group": tree.GetItemParent(item) is not tree.root,
            }
        )
        index += 1
        item = tree.GetNextItem(item)
    return out


def _region(disp):
    if disp is None:
        return {}
    r = dict(disp.GetMap().region)
    out = {k: r[k] for k in ("n", "s", "e", "w", "nsres", "ewres", "rows", "cols") if k in r}
    if {"n", "s", "e", "w"} <= out.keys():
        out["center_easting"] = (out["e"] + out["w"]) / 2.0
        out["center_northing"] = (out["n"] + out["s"]) / 2.0
        out["width"] = out["e"] - out["w"]
        out["height"] = out["n"] - out["s"]
    return out


def _statusbar(disp):
    sbm = getattr(disp, "statusbarManager", None) if disp is not None else None
    if sbm is None:
        return {}
    labels = list(sbm.GetItemLabels())
    mode = sbm.GetMode()
    try:
        scale = float(disp.GetMapScale())
    except Exception:
        scale = None
    text = disp.statusbar.GetStatusText(0) if getattr(disp, "statusbar", None) is not None else ""
    return {
        "mode": mode,
        "mode_label": labels[mode] if 0 <= mode < len(labels) else None,
        "modes": labels,
        "scale": scale,
        "text": text,
    }


def _toolbars(disp):
    if disp is None:
        return {}
    tbs = getattr(disp, "toolbars", {}) or {}
    shown = None
    mgr = getattr(disp, "_mgr", None)
    if mgr is not None and "map" in tbs:
        pane = mgr.GetPane(tbs["map"])
        shown = bool(pane.IsOk() and pane.IsShown())
    out = {"keys": sorted(tbs), "shown": shown, "layer": None}
    vd = tbs.get("vdigit")
    if vd is not None:
        ml = vd.GetLayer()
        out["layer"] = {"name": ml.GetName()} if ml is not None else None
    return out


def _windows():
    import wx

    out = []
    for w in wx.GetTopLevelWindows():
        if not w.IsShown():
            continue
        pos, size = w.GetPosition(), w.GetSize()
        out.append(
            {
                "title": w.GetTitle(),
                "class": type(w).__name__,
                "modal": bool(getattr(w, "IsModal", lambda: False)()),
                "box": [pos.x, pos.y, size.width, size.height],
            }
        )
    return out


def _state():
    import wx

    lmgr, disp = _frames()
    tree = lmgr.GetLayerTree() if lmgr is not None else None
    layers = _layers(tree)
    output = ""
    gout = getattr(lmgr, "goutput", None) if lmgr is not None else None
    if gout is not None:
        try:
            output = gout.cmdOutput.GetText()[-MAX_OUTPUT:]
        except Exception:
            output = ""
    prompt = None
    if gout is not None and getattr(gout, "cmdPrompt", None) is not None:
        try:
            prompt = gout.cmdPrompt.GetText()
        except Exception:
            prompt = None
    page = None
    if lmgr is not None and getattr(lmgr, "notebook", None) is not None:
        nb = lmgr.notebook
        page = nb.GetPageText(nb.GetSelection()) if nb.GetSelection() >= 0 else None
    displays = lmgr.GetAllMapDisplays() if lmgr is not None else []
    return {
        "layers": layers,
        # ScienceBoard's view of the same layers: each item's label and its d.* command's parameters
        "windows": [
            {
                "name": l["name"],
                "_text": l["label"],
                "_data": [
                    None,
                    {
                        "params": [{"name": k, "value": v} for k, v in l["params"].items()],
                        "flags": [{"name": f, "value": True} for f in l["flags"]],
                    },
                ],
            }
            for l in layers
        ],
        "region": _region(disp),
        "statusbar": _statusbar(disp),
        "toolbars": _toolbars(disp),
        "display": {
            "title": wx.GetTopLevelParent(disp).GetTitle() if disp is not None else None,
            "count": len(displays),
            "render": bool(disp.mapWindowProperties.autoRender) if disp is not None else None,
        },
        "dialogs": _windows(),
        "output": output,
        "console_input": prompt,
        "page": page,
        "mapset": os.environ.get("GISRC") and _gisenv(),
    }


def _comp_region():
    """The mapset's computational region (g.region -g, read only), outside the GUI thread."""
    try:
        import grass.script as gs

        return {
            k: float(v) if k not in ("projection", "zone") else v
            for k, v in gs.parse_command("g.region", flags="g").items()
        }
    except Exception as e:
        return {"error": str(e)}


def _gisenv():
    try:
        with open(os.environ["GISRC"]) as f:
            return dict(l.strip().split(": ", 1) for l in f if ": " in l)
    except OSError:
        return None


# --------------------------------------------------------------------------------------------- set-up
def _set_scale(scale):
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        return {"ok": False, "error": f"bad scale {scale!r}"}
    _, disp = _frames()
    disp.SetMapScale(float(scale))
    return {"ok": True}


def _close_splash():
    """wxgui.py shows its splash for a fixed 3 s; once the windows are up it only hides them. Then every
    window is laid out and painted now (Update), so the first screenshot shows the finished GUI."""
    import wx

    n = 0
    for w in wx.GetTopLevelWindows():
        if type(w).__name__ == "SplashScreen":
            w.Destroy()
            n += 1
    for w in wx.GetTopLevelWindows():
        if w.IsShown():
            w.Refresh()
            w.Update()
    return {"ok": True, "closed": n}


def _find(name, element):
    import grass.script as gs

    return gs.find_file(name, element=element)["fullname"] or None


def _layer_boxes():
    """The Layer Manager's layers with their on-screen boxes (the tree is custom-drawn: AT-SPI misses it)."""
    lmgr, _ = _frames()
    tree = lmgr.GetLayerTree() if lmgr is not None else None
    out = []
    if tree is None or not tree.IsShownOnScreen():
        return out
    item = tree.GetFirstChild(tree.root)[0]
    while item and item.IsOk():
        box = None
        rect = tree.GetBoundingRect(item)
        if rect is not None and rect.width > 0:
            x, y = tree.ClientToScreen((rect.x, rect.y))
            box = [x, y, rect.width, rect.height]
        out.append({"label": tree.GetItemText(item), "checked": bool(tree.IsItemChecked(item)), "box": box})
        item = tree.GetNextItem(item)
    return out


def _add_layer(name, cmd):
    if cmd is None and isinstance(name, str):  # the type from the data: a raster if one has that name
        kind = "d.rast" if _find(name, "cell") else "d.vect"
        cmd = [kind, "map=" + name]
    if isinstance(cmd, list) and cmd and cmd[0] in ("d.rast", "d.vect"):
        # fully qualified, as the GUI's "Add map layer" dialog writes it
        cmd = [
            a
            if not a.startswith("map=") or "@" in a
            else "map=" + (_find(a[4:], "cell" if cmd[0] == "d.rast" else "vector") or a[4:])
            for a in cmd
        ]
    if (
        not isinstance(cmd, list)
        or not cmd
        or cmd[0] not in ("d.rast", "d.vect")
        or not all(isinstance(a, str) and _SAFE_ARG.match(a) for a in cmd[1:])
        or not any(a.startswith("map=") for a in cmd[1:])
    ):
        return {"ok": False, "error": f"not an allowed layer command: {cmd!r}"}
    lmgr, disp = _frames()
    tree = lmgr.GetLayerTree()
    name = next(a.split("=", 1)[1] for a in cmd[1:] if a.startswith("map="))
    ltype = "raster" if cmd[0] == "d.rast" else "vector"
    tree.AddLayer(ltype=ltype, lname=name, lchecked=True, lcmd=list(cmd), multiple=True)
    return {"ok": True}
