#!/usr/bin/env bash
# Install what coda needs on Debian 12: the desktop packages and a virtual environment with the project.
# Idempotent: packages already installed and an up-to-date venv are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
# bubblewrap seals every app (its own namespaces, no privileges, no network).
# libvirt-dev + pkg-config build libvirt-python (the [vm] extra); qemu-utils gives qemu-img for VM images.
APT_PACKAGES=(xvfb openbox dbus-daemon at-spi2-core bubblewrap libgl1-mesa-dri libvirt-dev pkg-config qemu-utils libosmesa6)
# Each app declares what it needs in its own packages.txt (this script names no app).
for f in coda_env/apps/[!_]*/packages.txt; do
  while read -r pkg _; do
    case "$pkg" in ''|'#'*) ;; *) APT_PACKAGES+=("$pkg") ;; esac
  done < "$f"
done
# ScienceBoard's C-03/C-04 documents also load kpfonts and beramono: texlive-fonts-extra, about 500 MB to
# download and 1.4 GB on disk, so only on request.
if [ "${CODA_TEXLIVE_FONTS_EXTRA:-0}" = 1 ]; then APT_PACKAGES+=(texlive-fonts-extra); fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.coda-installed
# The stamp covers this script too: a change of the extras below reinstalls.
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # torch first, pinned to the CPU build on this disk (CODA_TORCH=... for another build, e.g. a CUDA one):
  # an unpinned `torch` from another package would pull a multi-GB CUDA wheel. Never torchvision here: the
  # PyPI wheel does not match this torch ("operator torchvision::nms does not exist") and transformers
  # then fails to import; without it, transformers uses its PIL image processors.
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: installing ${CODA_TORCH:-torch==2.13.0}"
    .venv/bin/pip install -q --disable-pip-version-check "${CODA_TORCH:-torch==2.13.0}"
  fi
  echo "setup: installing the coda package into .venv"
  .venv/bin/pip install -q --disable-pip-version-check -e ".[dev,agent,train,vm,sb3,ray,openenv]"
  .venv/bin/pip uninstall -q -y torchvision 2>/dev/null || true
  echo "$want" > "$stamp"
fi
