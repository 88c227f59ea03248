"""vm_images/build.sh's hooks for apps that Debian does not package (CHIMERAX_DEB, EXTRA_DEBS, EXTRA_TREES,
HOOK): their paths are checked before anything is built. Every run here passes CHECK_ONLY=1, which stops the
script right after that check, so none of them can start a build (that takes minutes and root; it is what
`make vm-image` runs, not tested here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BUILD = Path(__file__).resolve().parents[1] / "vm_images" / "build.sh"


def build_sh(cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("CHIMERAX_DEB", "EXTRA_DEBS", "EXTRA_TREES", "HOOK")}
    full.update(env, CHECK_ONLY="1")
    return subprocess.run(["bash", str(BUILD)], cwd=cwd, env=full, capture_output=True, text=True, timeout=30)


def make_deb(folder: Path, package: str, name: str) -> Path:
    """A real (empty) Debian package named `package`, standing in for ChimeraX's 600 MB .deb."""
    root = folder / f"{package}-src"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1.8-1\nArchitecture: all\n"
        f"Maintainer: coda tests <tests@example.invalid>\n"
        f"Description: stand-in for a test\n"
    )
    subprocess.run(["dpkg-deb", "--build", str(root), str(folder / name)], check=True, capture_output=True)
    return folder / name


def test_build_script_parses():
    assert subprocess.run(["bash", "-n", str(BUILD)], capture_output=True).returncode == 0


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb to make a test .deb")
def test_chimerax_deb_is_checked_before_the_build(tmp_path):
    deb = make_deb(tmp_path, "ucsf-chimerax", "ucsf-chimerax_1.8-1_amd64.deb")
    ok = build_sh(tmp_path, CHIMERAX_DEB=deb.name)  # relative to the caller's folder: made absolute
    assert ok.returncode == 0, ok.stderr
    assert f"would install {deb}," in ok.stdout

    missing = build_sh(tmp_path, CHIMERAX_DEB="/nowhere/ucsf-chimerax_1.8-1_amd64.deb")
    assert missing.returncode == 2
    assert "CHIMERAX_DEB: /nowhere/ucsf-chimerax_1.8-1_amd64.deb does not exist" in missing.stderr

    (tmp_path / "fake.deb").write_text("not a package")
    fake = build_sh(tmp_path, CHIMERAX_DEB="fake.deb")
    assert fake.returncode == 2 and "is not a Debian package (no .deb archive header)" in fake.stderr

    shutil.copy(deb, tmp_path / "chimerax.tar")
    named = build_sh(tmp_path, CHIMERAX_DEB="chimerax.tar")
    assert named.returncode == 2 and "chimerax.tar is not a .deb (its name does not end in .deb)" in named.stderr

    other = build_sh(tmp_path, CHIMERAX_DEB=str(make_deb(tmp_path, "hello-coda", "hello.deb")))
    assert other.returncode == 2 and "is the package 'hello-coda', not UCSF ChimeraX" in other.stderr

    folder = build_sh(tmp_path, CHIMERAX_DEB=str(tmp_path))
    assert folder.returncode == 2 and "is not a file" in folder.stderr


def test_other_hooks_are_checked_before_the_build(tmp_path):
    (tmp_path / "fake.deb").write_text("not a package")
    assert "EXTRA_DEBS: " in build_sh(tmp_path, EXTRA_DEBS="fake.deb").stderr
    tree = build_sh(tmp_path, EXTRA_TREES="nosuchdir:/opt/x")
    assert tree.returncode == 2 and f"EXTRA_TREES: {tmp_path}/nosuchdir is not a folder" in tree.stderr
    assert "is not SRC:/ABSOLUTE/DEST" in build_sh(tmp_path, EXTRA_TREES=f"{tmp_path}:opt").stderr
    hook = build_sh(tmp_path, HOOK="nohook.sh")
    assert hook.returncode == 2 and f"HOOK: {tmp_path}/nohook.sh is not a file" in hook.stderr
    (tmp_path / "hook.sh").write_text("#!/bin/sh\ntrue\n")
    (tmp_path / "tree").mkdir()
    ok = build_sh(tmp_path, HOOK="hook.sh", EXTRA_TREES="tree:/opt/tree")
    assert ok.returncode == 0, ok.stderr
    assert f"copy {tmp_path}/tree:/opt/tree, run {tmp_path}/hook.sh" in ok.stdout
