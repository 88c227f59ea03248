#!/usr/bin/env bash
# The ChimeraX engine for coda's engine tests: ChimeraX 1.7.1's library (PyPI `ChimeraX==0.1.71`, LGPL; a
# yanked wheel, installable by exact version) in its own venv, completed by coda's nogui module and toolshed
# metadata (coda_env/apps/chimerax/engine/), run without a GUI with offscreen (OSMesa) rendering.
# It is NOT the ChimeraX GUI: coda/ChimeraX-v0 needs the real `chimerax` (the .deb); the engine lets the
# REST client, state, setup ops, checks and every task's oracle commands be tested for real on any machine.
#
# Makes .chimerax-engine/ (venv/ and bin/chimerax-engine, a `chimerax`-like launcher: same options, always
# --nogui --offscreen). Idempotent: a stamp of this script and the engine files skips a finished install.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${CHIMERAX_ENGINE_DIR:-.chimerax-engine}
ENGINE=coda_env/apps/chimerax/engine
PY=${CHIMERAX_ENGINE_PYTHON:-}
if [ -z "$PY" ]; then  # the wheel is for CPython 3.11 (Debian 12's python3)
  for c in python3.11 /usr/bin/python3.11 python3; do
    if command -v "$c" >/dev/null && [ "$("$c" -c 'import sys; print(sys.version_info[:2] == (3, 11))' 2>/dev/null)" = True ]; then
      PY=$c; break
    fi
  done
fi
# The wheel's own pins cannot all be met (imagecodecs==2024.1.1 is a yanked source-only release), so the
# wheel goes in with --no-deps and these, measured to work (tcia-utils unpinned pulls numpy 2 and breaks it).
DEPS=(numpy==1.26.4 tinyarray Cython packaging tomli pydicom==2.3.0 tcia-utils==1.5.1 pandas==2.2.3 appdirs
      filelock psutil Pillow python-dateutil requests sortedcontainers msgpack lz4 tifffile webcolors==1.13
      distro pkginfo wheel-filename==1.4.1 lxml grako==3.16.5 wheel PyOpenGL)
want=$( (cat "$0" "$ENGINE/install.py" "$ENGINE/nogui.py" "$ENGINE/bundles.json"; echo "${DEPS[*]}") | sha256sum | cut -d' ' -f1)
stamp="$DIR/.installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$DIR/bin/chimerax-engine" ]; then
  exit 0
fi
# OSMesa: offscreen rendering for `save image.png` (Debian's libosmesa6).
if ! ldconfig -p 2>/dev/null | grep libOSMesa >/dev/null; then  # (grep -q would SIGPIPE ldconfig under pipefail)
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "chimerax-engine: installing libosmesa6"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libosmesa6 >/dev/null \
    || { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends libosmesa6 >/dev/null; }
fi
if [ -z "$PY" ] || ! command -v "$PY" >/dev/null; then
  echo "chimerax-engine: no CPython 3.11 found (the ChimeraX wheel is cp311; set CHIMERAX_ENGINE_PYTHON)" >&2
  exit 1
fi
if [ ! -x "$DIR/venv/bin/python" ] && ! "$PY" -m venv "$DIR/venv"; then
  rm -rf "$DIR/venv"
  echo "chimerax-engine: $PY cannot make a venv (on Debian: apt-get install python3.11-venv)" >&2
  exit 1
fi
pip=("$DIR/venv/bin/pip" install -q --disable-pip-version-check)
if ! "$DIR/venv/bin/python" -c "import chimerax.core" 2>/dev/null; then
  echo "chimerax-engine: installing ChimeraX==0.1.71 (ChimeraX 1.7.1's library, about 700 MB with its dependencies)"
  "${pip[@]}" --no-deps ChimeraX==0.1.71
fi
"${pip[@]}" "${DEPS[@]}"
"$DIR/venv/bin/python" "$ENGINE/install.py"
mkdir -p "$DIR/bin"
cat > "$DIR/bin/chimerax-engine" <<LAUNCH
#!/bin/sh
# chimerax-like launcher of coda's ChimeraX engine (no GUI): chimerax-engine [chimerax options]
PYOPENGL_PLATFORM=osmesa exec "$(pwd)/$DIR/venv/bin/python" -m chimerax.core --nogui --offscreen "\$@"
LAUNCH
chmod +x "$DIR/bin/chimerax-engine"
echo "$want" > "$stamp"
echo "chimerax-engine: ready: $DIR/bin/chimerax-engine"
