"""TeXstudio's check types: `compile` (the document builds) and `tex_file` (a saved file is its initial text
with given replacements made).

`compile` builds a scratch copy of the working folder, never the folder itself: the agent's files, and any
PDF it built, stay as they were. On this machine the copy is in the desktop's own folder, which the app's
sandbox cannot see (so nothing the agent left running can change what the check reads), and the build runs
sealed like the app, able to write only there. pdflatex runs with -no-shell-escape and -halt-on-error and
kpathsea's paranoid modes (openin_any=p, openout_any=p: no \\input of /etc/hostname, no writes outside);
bibtex runs when the document has a bibliography. Everything runs through the desktop, so it runs where the
app's files are.

`tex_file` compares a saved file with the task's initial text of that file (its `write_file` setup op) with
the replacements applied, which is how ScienceBoard states its TeXstudio tasks ("source" -> "target");
trailing whitespace of each line and trailing newlines do not count. Exact text, existence and hashes are
the core `file` check's; regular expressions the core `include`'s.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from typing import Any

from ...registry import CheckContext, CheckError, CheckType, confined

MAX_FILE = 2_000_000
_BIB = re.compile(r"^[^%\n]*\\(bibliography|addbibresource)\s*\{", re.M)


# ------------------------------------------------------------------------------------------ helpers
def normalize(text: str) -> str:
    """Trailing whitespace of each line and trailing blank lines do not count."""
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n")).rstrip("\n")


def initial_text(task: Any, path: str) -> str | None:
    """The content the task's setup wrote to `path` (the last `write_file` op naming it)."""
    text = None
    for op in getattr(task, "initialize", None) or []:
        if op.get("func") == "write_file" and op.get("path") == path and isinstance(op.get("content"), str):
            text = op["content"]
    return text


def _require_str(c: dict, key: str) -> None:
    if key in c and (not isinstance(c[key], str) or not c[key]):
        raise CheckError(f"{key} must be a non-empty string")


def _relpath(c: dict, key: str = "path") -> None:
    v = c.get(key)
    if not isinstance(v, str) or not v or v.startswith(("/", "~")) or ".." in v.split("/"):
        raise CheckError(f"{key} must be a path relative to the app's home folder, got {v!r}")


# ------------------------------------------------------------------------------------------ tex_file
def _validate_file(c: dict) -> None:
    _relpath(c)
    reps = c.get("replacements")
    if (
        not isinstance(reps, list)
        or not reps
        or not all(isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r) and r[0] for r in reps)
    ):
        raise CheckError('replacements must be a non-empty list of ["old", "new"] string pairs')


def _run_file(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    data = ctx.read_file(c["path"])
    if data is None:
        return False, f"{c['path']} is missing"
    base = initial_text(ctx.task, c["path"])
    if base is None:
        return False, f"the task writes no initial {c['path']} to apply replacements to"
    want = base
    for old, new in c["replacements"]:
        if old not in want:
            return False, f"the initial {c['path']} has no {old!r} to replace"
        want = want.replace(old, new)
    got, want = normalize(data[:MAX_FILE].decode("utf-8", errors="replace")), normalize(want)
    if got == want:
        return True, f"{c['path']} is its initial text with the {len(c['replacements'])} replacement(s) made"
    return False, f"{c['path']} differs from the expected text: {_first_diff(got, want)}"


def _first_diff(got: str, want: str) -> str:
    a, b = got.split("\n"), want.split("\n")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i + 1} is {x[:120]!r}, want {y[:120]!r}"
    return f"{len(a)} lines, want {len(b)}"


# ------------------------------------------------------------------------------------------ compile
_SCRIPT = r"""
cd "$1" || exit 90
f=$2; bib=$3
rm -f "$f.pdf" "$f.aux" "$f.bbl" "$f.blg" "$f.log" "$f.toc" "$f.out" "$f.lof" "$f.lot"
run() { pdflatex -interaction=nonstopmode -halt-on-error -no-shell-escape -file-line-error "$f.tex" >/dev/null 2>&1 || { echo "FAILED pdflatex ($1)"; exit 1; }; }
run first
if [ "$bib" = 1 ]; then
  bibtex "$f" >coda-bibtex.out 2>&1
  if [ $? -ge 2 ]; then echo "FAILED bibtex"; tail -n 8 coda-bibtex.out; exit 2; fi
  run "after bibtex"
fi
run last
if command -v pdftotext >/dev/null 2>&1; then pdftotext -enc UTF-8 "$f.pdf" coda-pdf.txt 2>/dev/null; fi
echo OK
"""


def _validate_compile(c: dict) -> None:
    _relpath(c)
    f = c.get("file", "main")
    if not isinstance(f, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", f) or f.startswith("."):
        raise CheckError(f"file must be a plain file name in the folder, got {f!r}")
    t = c.get("timeout", 60)
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not 1 <= t <= 600:
        raise CheckError("timeout must be 1..600 seconds")
    if "min_pages" in c and (
        not isinstance(c["min_pages"], int) or isinstance(c["min_pages"], bool) or c["min_pages"] < 1
    ):
        raise CheckError("min_pages must be a positive integer")
    _require_str(c, "contains")
    if "bibtex" in c and not isinstance(c["bibtex"], bool):
        raise CheckError("bibtex must be true or false")


def _log_errors(log: str) -> str:
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("!") or re.match(r"^\S+:\d+: ", line):
            return " ".join(x.strip() for x in lines[i : i + 3])[:300]
    return ""


def _run_compile(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    if ctx.desktop is None or ctx.home is None:
        return False, "the compile check needs the episode's desktop and home folder"
    folder = confined(ctx.home, c["path"])
    name = c.get("file", "main")
    name = name[:-4] if name.endswith(".tex") else name
    d = ctx.desktop
    src = d.read_file(f"{folder}/{name}.tex") if _exists(d, f"{folder}/{name}.tex") else None
    if src is None:
        return False, f"{c['path']}/{name}.tex is missing"
    text = src.decode("utf-8", errors="replace")
    bib = c.get("bibtex", bool(_BIB.search(text)))
    scratch = _scratch(d, ctx.home)
    if isinstance(scratch, tuple):
        return scratch
    timeout = float(c.get("timeout", 60))
    try:
        if d.tmpdir:  # this machine: a copy the app's sandbox cannot see, links kept as links
            try:
                shutil.copytree(folder, scratch, symlinks=True, dirs_exist_ok=True)
            except (OSError, shutil.Error) as e:
                return False, f"cannot copy {c['path']}: {e}"[:300]
        else:
            cp = d.run(["cp", "-a", "--", f"{folder}/.", scratch], timeout=30)
            if cp.returncode != 0:
                return False, f"cannot copy {c['path']}: {cp.stderr.decode(errors='replace')[:200]}"
        # TeX in paranoid mode (reads and writes only below the scratch folder), sealed like the app on
        # this machine (writable: the scratch folder only), so a document cannot read or run anything else
        argv = [
            "timeout",
            "-k",
            "2",
            str(int(timeout)),
            "env",
            *_TEX_ENV,
            "sh",
            "-c",
            _SCRIPT,
            "coda-compile",
            scratch,
            name,
            "1" if bib else "0",
        ]
        try:
            r = d.run(argv, timeout=timeout + 10, writable=[scratch])
        except Exception as e:  # subprocess.TimeoutExpired or a desktop error
            return False, f"the build did not finish within {timeout:.0f}s ({type(e).__name__})"
        out = r.stdout.decode(errors="replace").strip()
        log = _read(d, f"{scratch}/{name}.log").decode("latin-1")
        if r.returncode == 124:
            return False, f"the build did not finish within {timeout:.0f}s"
        if r.returncode != 0:
            return False, f"{out[:300]} {_log_errors(log)}".strip()
        notes = ["pdflatex" + (" + bibtex" if bib else "") + " succeeded"]
        m = re.search(r"Output written on .*?\((\d+) pages?", log.replace("\n", ""))
        pages = int(m.group(1)) if m else 0
        notes.append(f"{pages} page(s)")
        if "min_pages" in c and pages < c["min_pages"]:
            return False, f"{'; '.join(notes)}, want at least {c['min_pages']}"
        if "contains" in c:
            pdf_text = _read(d, f"{scratch}/coda-pdf.txt").decode("utf-8", errors="replace")
            hay, where = (pdf_text, "the PDF's text") if pdf_text else (log, "the build log")
            if _squash(c["contains"]) not in _squash(hay):
                return False, f"{'; '.join(notes)}; {where} lacks {c['contains']!r}"
            notes.append(f"{where} has {c['contains']!r}")
        return True, "; ".join(notes)
    finally:
        if d.tmpdir:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            d.run(["rm", "-rf", "--", scratch], timeout=30)


# kpathsea settings as environment variables: paranoid reads and writes, no shell escape in any form
_TEX_ENV = ("openin_any=p", "openout_any=p", "shell_escape=f")


def _scratch(d, home: str) -> str | tuple[bool, str]:
    """A fresh folder for a build: in the desktop's own folder, outside the app's home, where the desktop
    has one (this machine); else (a VM, which is the sandbox) in the home, as before."""
    if d.tmpdir:
        try:
            return tempfile.mkdtemp(prefix="check-compile-", dir=d.tmpdir)
        except OSError as e:
            return False, f"cannot make a scratch folder: {e}"
    mk = d.run(["mktemp", "-d", "-p", home, ".coda-compile-XXXXXX"], timeout=10)
    if mk.returncode != 0:
        return False, f"cannot make a scratch folder: {mk.stderr.decode(errors='replace')[:200]}"
    return mk.stdout.decode().strip()


def _squash(s: str) -> str:
    return " ".join(s.split())


def _exists(d, path: str) -> bool:
    return d.run(["test", "-f", path], timeout=10).returncode == 0


def _read(d, path: str) -> bytes:
    try:
        return d.read_file(path)
    except OSError:
        return b""


CHECKS = (
    CheckType(
        "compile",
        _run_compile,
        _validate_compile,
        required={"path"},
        optional={"file", "timeout", "min_pages", "contains", "bibtex"},
    ),
    CheckType("tex_file", _run_file, _validate_file, required={"path", "replacements"}),
)

__all__ = ["CHECKS", "normalize", "initial_text"]
