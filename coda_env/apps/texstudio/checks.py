"""TeXstudio's check types: `compile` (the document builds), and `tex_file` / `tex_include` (the saved files).

`compile` builds a scratch copy of the working folder, never the folder itself: the agent's files, and any
PDF it built, stay as they were. pdflatex runs with -no-shell-escape and -halt-on-error (TeX Live's default
openout_any=p keeps its writes inside the scratch folder); bibtex runs when the document has a bibliography.
Everything runs through the desktop, so it runs where the app's files are.

`tex_file` compares a saved file with exact text, or with the task's initial text of that file (its
`write_file` setup op) with given replacements applied, which is how ScienceBoard states its TeXstudio
tasks ("source" -> "target"). Trailing whitespace of each line and trailing newlines are ignored.
`tex_include` searches a saved file (or a state path) with a regular expression that cannot backtrack
catastrophically (nested unbounded repeats and back-references are refused when the task loads).
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

try:
    import re._parser as _sre_parse  # Python 3.11+
    import re._constants as _sre_const
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _sre_const  # type: ignore[no-redef]
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from ._core import CheckContext, CheckError, CheckType, confined

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
    modes = [k for k in ("equals", "replacements", "exists", "sha256") if k in c]
    if len(modes) != 1:
        raise CheckError("needs exactly one of equals, replacements, exists, sha256")
    if "equals" in c and not isinstance(c["equals"], str):
        raise CheckError("equals must be a string")
    if "exists" in c and not isinstance(c["exists"], bool):
        raise CheckError("exists must be true or false")
    if "sha256" in c and not (isinstance(c["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", c["sha256"])):
        raise CheckError("sha256 must be 64 lowercase hex digits")
    if "replacements" in c:
        reps = c["replacements"]
        if (not isinstance(reps, list) or not reps
                or not all(isinstance(r, list) and len(r) == 2 and all(isinstance(s, str) for s in r) and r[0]
                           for r in reps)):
            raise CheckError('replacements must be a non-empty list of ["old", "new"] string pairs')


def _run_file(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    data = ctx.read_file(c["path"])
    if "exists" in c:
        return (data is not None) == c["exists"], f"{c['path']} {'exists' if data is not None else 'is missing'}"
    if data is None:
        return False, f"{c['path']} is missing"
    if "sha256" in c:
        got = hashlib.sha256(data).hexdigest()
        return got == c["sha256"], f"{c['path']} sha256 {got[:12]}..., want {c['sha256'][:12]}..."
    text = data[:MAX_FILE].decode("utf-8", errors="replace")
    if "equals" in c:
        want = c["equals"]
    else:
        base = initial_text(ctx.task, c["path"])
        if base is None:
            return False, f"the task writes no initial {c['path']} to apply replacements to"
        want = base
        for old, new in c["replacements"]:
            if old not in want:
                return False, f"the initial {c['path']} has no {old!r} to replace"
            want = want.replace(old, new)
    got, want = normalize(text), normalize(want)
    if got == want:
        return True, f"{c['path']} has the expected text ({len(got)} characters)"
    return False, f"{c['path']} differs from the expected text: {_first_diff(got, want)}"


def _first_diff(got: str, want: str) -> str:
    a, b = got.split("\n"), want.split("\n")
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i + 1} is {x[:120]!r}, want {y[:120]!r}"
    return f"{len(a)} lines, want {len(b)}"


# ------------------------------------------------------------------------------------------ tex_include
def _safe_pattern(pattern: str) -> re.Pattern:
    """Compile a task's regex, refusing the constructs that backtrack catastrophically."""
    try:
        parsed = _sre_parse.parse(pattern)
    except re.error as e:
        raise CheckError(f"pattern {pattern!r} is not a regular expression: {e}") from None
    repeats = (_sre_const.MAX_REPEAT, _sre_const.MIN_REPEAT, getattr(_sre_const, "POSSESSIVE_REPEAT", None))

    def walk(items, inside_repeat: bool) -> None:
        for op, av in items:
            if op in (_sre_const.GROUPREF, _sre_const.GROUPREF_EXISTS):
                raise CheckError(f"pattern {pattern!r}: back-references are not allowed")
            if op in repeats:
                lo, hi, sub = av
                unbounded = hi == _sre_const.MAXREPEAT or hi > 1000
                if inside_repeat and unbounded:
                    raise CheckError(f"pattern {pattern!r}: nested unbounded repeats are not allowed")
                walk(sub, inside_repeat or unbounded)
            elif op == _sre_const.SUBPATTERN:
                walk(av[-1], inside_repeat)
            elif op == _sre_const.BRANCH:
                for b in av[1]:
                    walk(b, inside_repeat)
            elif op in (_sre_const.ASSERT, _sre_const.ASSERT_NOT):
                walk(av[1], inside_repeat)
    walk(parsed, False)
    return re.compile(pattern)


def _validate_include(c: dict) -> None:
    if ("path" in c) == ("state" in c):
        raise CheckError("needs exactly one of path (a saved file) or state (a dotted path into the state)")
    if "path" in c:
        _relpath(c)
    if not isinstance(c.get("pattern"), str) or len(c["pattern"]) > 1000:
        raise CheckError("pattern must be a string of at most 1000 characters")
    _safe_pattern(c["pattern"])
    if "count" in c and (not isinstance(c["count"], int) or isinstance(c["count"], bool) or c["count"] < 0):
        raise CheckError("count must be a non-negative integer")
    if "negate" in c and not isinstance(c["negate"], bool):
        raise CheckError("negate must be true or false")


def _dotted(state: Any, path: str) -> Any:
    cur = state
    for part in path.split("."):
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def _run_include(c: dict, ctx: CheckContext) -> tuple[bool, str]:
    if "path" in c:
        data = ctx.read_file(c["path"])
        if data is None:
            return False, f"{c['path']} is missing"
        text, where = data[:MAX_FILE].decode("utf-8", errors="replace"), c["path"]
    else:
        value = _dotted(ctx.state, c["state"])
        text, where = ("" if value is None else str(value))[:MAX_FILE], f"state {c['state']}"
    n = len(_safe_pattern(c["pattern"]).findall(text))
    ok = n == c["count"] if "count" in c else n > 0
    if c.get("negate"):
        ok = not ok
    return ok, f"{where}: {n} match(es) of {c['pattern']!r}" + (" (negated)" if c.get("negate") else "")


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
    if "min_pages" in c and (not isinstance(c["min_pages"], int) or isinstance(c["min_pages"], bool)
                             or c["min_pages"] < 1):
        raise CheckError("min_pages must be a positive integer")
    _require_str(c, "contains")
    if "bibtex" in c and not isinstance(c["bibtex"], bool):
        raise CheckError("bibtex must be true or false")


def _log_errors(log: str) -> str:
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("!") or re.match(r"^\S+:\d+: ", line):
            return " ".join(x.strip() for x in lines[i:i + 3])[:300]
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
    mk = d.run(["mktemp", "-d", "-p", ctx.home, ".coda-compile-XXXXXX"], timeout=10)
    if mk.returncode != 0:
        return False, f"cannot make a scratch folder: {mk.stderr.decode(errors='replace')[:200]}"
    scratch = mk.stdout.decode().strip()
    timeout = float(c.get("timeout", 60))
    try:
        cp = d.run(["cp", "-a", "--", f"{folder}/.", scratch], timeout=30)
        if cp.returncode != 0:
            return False, f"cannot copy {c['path']}: {cp.stderr.decode(errors='replace')[:200]}"
        try:
            r = d.run(["timeout", "-k", "2", str(int(timeout)), "sh", "-c", _SCRIPT, "coda-compile", scratch, name,
                       "1" if bib else "0"], timeout=timeout + 10)
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
        d.run(["rm", "-rf", "--", scratch], timeout=30)


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
    CheckType("compile", _run_compile, _validate_compile,
              (frozenset({"path"}), frozenset({"file", "timeout", "min_pages", "contains", "bibtex"}))),
    CheckType("tex_file", _run_file, _validate_file,
              (frozenset({"path"}), frozenset({"equals", "replacements", "exists", "sha256"}))),
    CheckType("tex_include", _run_include, _validate_include,
              (frozenset({"pattern"}), frozenset({"path", "state", "count", "negate"}))),
)

__all__ = ["CHECKS", "normalize", "initial_text"]
