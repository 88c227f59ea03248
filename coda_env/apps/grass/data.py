"""The GRASS database of the coda tasks: built once by GRASS itself, then copied into each episode's home.

`database()` builds it on first use into `$CODA_CACHE_DIR/grass/<DATA_VERSION>/grassdata` (default
`~/.cache/coda`) with `_build_db.py` (no downloads: every map comes from formulas and fixed coordinates),
under a lock and through a rename, so concurrent envs build it once. A reset then copies the location
(about 1.5 MB) into the fresh home, where the GUI may change it freely.

ScienceBoard's tasks need locations from its VM image instead; `set_grassdata(DIR)` (or $CODA_GRASSDATA)
names the user's GRASS database they are copied from (read only; never written).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

DATA_VERSION = "1"  # bump when _build_db.py changes: a new cache folder is built
LOCATION = "coda"
MAPSET = "PERMANENT"
EPSG = "EPSG:32632"
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's Python: the one with wxPython (python3 on PATH may not be)

_grassdata: str | None = None


class DataError(RuntimeError):
    """The GRASS database could not be built or found."""


def cache_root() -> Path:
    base = os.environ.get("CODA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "coda"
    )
    return Path(base) / "grass" / DATA_VERSION


def grass_env(home: str | None = None, tmpdir: str | None = None) -> dict[str, str]:
    """Environment for a GRASS command: Debian's Python, C locale, HOME (GRASS writes ~/.grass8) and, given
    the desktop's own folder, TMPDIR in it: GRASS's session folder (`grass8-<user>-<pid>`, left behind when
    the GUI is killed) and every temporary file of its modules then go with the desktop."""
    env = {"GRASS_PYTHON": SYSTEM_PYTHON, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    if home:
        env["HOME"] = home
    if tmpdir:
        env["TMPDIR"] = tmpdir
    return env


def database() -> Path:
    """The cached GRASS database folder (GISDBASE) holding location `coda`; built on first call."""
    root = cache_root()
    db = root / "grassdata"
    if (db / LOCATION / MAPSET / "WIND").exists():
        return db
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (db / LOCATION / MAPSET / "WIND").exists():
            _build(root, db)
    return db


def _build(root: Path, db: Path) -> None:
    if shutil.which("grass") is None:
        raise DataError("GRASS GIS is not installed: `apt-get install grass` (Debian 12: GRASS 8.2)")
    work = Path(tempfile.mkdtemp(prefix="build-", dir=root))
    try:
        env = {**os.environ, **grass_env(str(work))}
        steps = [
            ["grass", "-c", EPSG, "-e", str(work / "grassdata" / LOCATION)],
            [
                "grass",
                str(work / "grassdata" / LOCATION / MAPSET),
                "--exec",
                SYSTEM_PYTHON,
                str(Path(__file__).with_name("_build_db.py")),
            ],
        ]
        for argv in steps:
            r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise DataError(
                    f"building the GRASS database failed at {' '.join(argv[:3])}: {(r.stderr or r.stdout)[-800:]}"
                )
        for junk in (work / "grassdata" / LOCATION / MAPSET).glob(".gislock"):
            junk.unlink()
        if db.exists():
            shutil.rmtree(db)
        os.rename(work / "grassdata", db)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def set_grassdata(path: str | os.PathLike | None) -> None:
    """Where ScienceBoard's GRASS locations are (a GRASS database folder); None: $CODA_GRASSDATA."""
    global _grassdata
    _grassdata = str(Path(path).expanduser().resolve()) if path else None


def grassdata() -> str | None:
    return _grassdata or os.environ.get("CODA_GRASSDATA") or None


def is_location(path: Path) -> bool:
    return (path / "PERMANENT" / "DEFAULT_WIND").is_file()


def copy_location(src_db: str | os.PathLike, location: str, home: str) -> Path:
    """Copy one location into `home/grassdata/` (stale locks dropped); return the new GISDBASE."""
    src = Path(src_db) / location
    if not is_location(src):
        raise DataError(f"{src} is not a GRASS location (no PERMANENT/DEFAULT_WIND)")
    dst_db = Path(home) / "grassdata"
    dst = dst_db / location
    shutil.copytree(src, dst, symlinks=True, ignore=shutil.ignore_patterns(".gislock", ".tmp"))
    return dst_db
