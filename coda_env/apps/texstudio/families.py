"""TeXstudio's task families (coda_env.families): seeded edits of a generated LaTeX document.

Each instance writes its own `atelier/main.tex` (a title, an author, 2 to 4 sections of generated sentences)
and opens it; the edit lands on a line whose place in the document varies with the seed, so the agent must
find it. Checks are the shipped tasks': `tex_file` (the saved file is the initial text with exactly this
instance's replacement made) and `compile` (the document still builds and shows the new text). The oracles
move the caret with the keyboard from the top of the file (ctrl+home, down, right), as the shipped tasks' do.
"""

from __future__ import annotations

import random
from typing import Any

from ...families import Family

PATH = "atelier/main.tex"
ADJECTIVES = [
    "Stable", "Rapid", "Quiet", "Bright", "Hidden", "Open", "Early", "Late", "Simple", "Robust", "Final", "Draft",
    "Partial", "Global", "Local", "Hybrid",
]  # fmt: skip
NOUNS = [
    "Notes", "Report", "Survey", "Study", "Analysis", "Methods", "Results", "Overview", "Experiments", "Models",
    "Measurements", "Review", "Summary", "Proposal", "Outline", "Record",
]  # fmt: skip
AUTHORS = ["A. Writer", "B. Keller", "C. Moreau", "D. Tanaka", "E. Okafor", "F. Rossi", "G. Novak", "H. Silva"]
SECTIONS = [
    "Intro", "Background", "Setup", "Method", "Data", "Results", "Discussion", "Outlook", "Samples", "Theory",
    "Design", "Evaluation",
]  # fmt: skip
SUBJECTS = ["sample", "signal", "colour", "pressure", "current", "spectrum", "surface", "mixture", "crystal", "probe"]
VERBS = ["changed", "stayed", "rose", "fell", "drifted", "settled", "varied", "peaked"]
ENDINGS = ["over time", "at night", "in the cold", "after mixing", "near the edge", "under load", "without light"]
WORDS = ["crucial", "notable", "subtle", "robust", "careful", "uneven", "gradual", "precise", "modest", "striking"]


def _sentence(rng: random.Random) -> str:
    return f"The {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(ENDINGS)}."


def _doc(rng: random.Random) -> dict[str, Any]:
    """A document's parameters: title, author, sections (names distinct), each with 1 to 3 sentences."""
    names = rng.sample(SECTIONS, rng.randint(2, 4))
    return {
        "title": f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}",
        "author": rng.choice(AUTHORS),
        "sections": [[n, [_sentence(rng) for _ in range(rng.randint(1, 3))]] for n in names],
    }


def _lines(doc: dict[str, Any], extra: dict[int, list[str]] | None = None) -> list[str]:
    """The document's lines; `extra` puts lines after section k's sentences (k: the section's index)."""
    out = ["\\documentclass{article}", f"\\title{{{doc['title']}}}", f"\\author{{{doc['author']}}}"]
    out += ["\\begin{document}", "\\maketitle", ""]
    for k, (name, sentences) in enumerate(doc["sections"]):
        out.append(f"\\section{{{name}}}")
        out += sentences
        out += (extra or {}).get(k, [])
        out.append("")
    out.append("\\end{document}")
    return out


def _task(instruction: str, lines: list[str], replacement: list[str], contains: str | None, keys: list[str]):
    text = "\n".join(lines) + "\n"
    if text.count(replacement[0]) != 1:  # the sampler makes the edited text unique; a broken sampler fails here
        raise ValueError(f"{replacement[0]!r} is not unique in the generated document")
    compile_check: dict[str, Any] = {"type": "compile", "path": "atelier", "file": "main"}
    if contains:
        compile_check["contains"] = contains
    return {
        "instruction": instruction,
        "steps": 15,
        "difficulty": "easy",
        "category": "editing",
        "initialize": [{"func": "write_file", "path": PATH, "content": text}, {"func": "open_file", "path": PATH}],
        "evaluate": [{"type": "tex_file", "path": PATH, "replacements": [replacement]}, compile_check],
        "solution": [*keys, "pyautogui.hotkey('ctrl', 's')", "DONE"],
    }


def _goto(line: int, column: int | None) -> list[str]:
    """Keys that put the caret on `line` (0-based) at `column` (None: the line's end)."""
    keys = ["pyautogui.hotkey('ctrl', 'home')"]
    if line:
        keys.append(f"pyautogui.press('down', presses={line})")
    if column is None:
        keys.append("pyautogui.press('end')")
    elif column:
        keys.append(f"pyautogui.press('right', presses={column})")
    return keys


def _select(n: int) -> str:
    return f"pyautogui.keyDown('shift')\npyautogui.press('right', presses={n})\npyautogui.keyUp('shift')"


def _line_of(lines: list[str], text: str) -> int:
    return next(i for i, ln in enumerate(lines) if text in ln)


# ------------------------------------------------------------------------------------------ the families
def _title_sample(rng: random.Random) -> dict[str, Any]:
    doc = _doc(rng)
    new = doc["title"]
    while new == doc["title"]:
        new = f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}"
    return {"doc": doc, "new": new}


def _title_build(p: dict[str, Any]) -> dict[str, Any]:
    doc, old, new = p["doc"], p["doc"]["title"], p["new"]
    lines = _lines(doc)
    keys = [*_goto(1, len("\\title{")), _select(len(old)), f"pyautogui.write({new!r})"]
    return _task(
        f"Change the document title from '{old}' to '{new}' in main.tex and save.",
        lines,
        [f"\\title{{{old}}}", f"\\title{{{new}}}"],
        new,
        keys,
    )


def _section_sample(rng: random.Random) -> dict[str, Any]:
    doc = _doc(rng)
    k = rng.randrange(len(doc["sections"]))
    taken = {s[0] for s in doc["sections"]}
    new = rng.choice([n for n in SECTIONS if n not in taken]) + rng.choice(["", " and Scope", " in Detail"])
    return {"doc": doc, "k": k, "new": new}


def _section_build(p: dict[str, Any]) -> dict[str, Any]:
    doc, old, new = p["doc"], p["doc"]["sections"][p["k"]][0], p["new"]
    lines = _lines(doc)
    keys = [*_goto(_line_of(lines, f"\\section{{{old}}}"), len("\\section")), _select(len(old) + 2)]
    keys.append(f"pyautogui.write({'{' + new + '}'!r})")
    return _task(
        f"Rename the section '{old}' to '{new}' in main.tex and save.",
        lines,
        [f"\\section{{{old}}}", f"\\section{{{new}}}"],
        new,
        keys,
    )


def _word_sample(rng: random.Random) -> dict[str, Any]:
    doc = _doc(rng)
    k = rng.randrange(len(doc["sections"]))
    return {"doc": doc, "k": k, "word": rng.choice(WORDS), "lead": rng.choice(["This step is", "The effect was"])}


def _bold_build(p: dict[str, Any]) -> dict[str, Any]:
    line = f"{p['lead']} {p['word']} for the result."
    lines = _lines(p["doc"], {p["k"]: [line]})
    keys = [*_goto(lines.index(line), len(p["lead"]) + 1), _select(len(p["word"])), "pyautogui.hotkey('ctrl', 'b')"]
    return _task(
        f"Make the word '{p['word']}' bold in main.tex (\\textbf{{{p['word']}}}) and save.",
        lines,
        [p["word"], f"\\textbf{{{p['word']}}}"],
        None,
        keys,
    )


def _year_sample(rng: random.Random) -> dict[str, Any]:
    doc = _doc(rng)
    old = rng.randint(1950, 2029)
    return {"doc": doc, "k": rng.randrange(len(doc["sections"])), "old": old, "new": old + rng.choice([-2, -1, 1, 2])}


def _year_build(p: dict[str, Any]) -> dict[str, Any]:
    line = f"The series began in {p['old']}."
    lines = _lines(p["doc"], {p["k"]: [line]})
    keys = [*_goto(lines.index(line), len("The series began in ")), _select(4), f"pyautogui.write('{p['new']}')"]
    return _task(
        f"The year in main.tex is wrong: change {p['old']} to {p['new']} and save the file.",
        lines,
        [str(p["old"]), str(p["new"])],
        str(p["new"]),
        keys,
    )


def _marked_sample(rng: random.Random) -> dict[str, Any]:
    doc = _doc(rng)
    return {"doc": doc, "k": rng.randrange(len(doc["sections"])), "what": rng.choice(WORDS) + " " + rng.choice(NOUNS)}


def _comment_build(p: dict[str, Any]) -> dict[str, Any]:
    line = f"Secret draft: {p['what'].lower()}."
    lines = _lines(p["doc"], {p["k"]: [line]})
    return _task(
        f"Comment out the line '{line}' in main.tex by putting a % at the start of it, then save.",
        lines,
        [line, "%" + line],
        None,
        [*_goto(lines.index(line), 0), "pyautogui.write('%')"],
    )


def _delete_build(p: dict[str, Any]) -> dict[str, Any]:
    line = f"TODO: check the {p['what'].lower()}"
    lines = _lines(p["doc"], {p["k"]: [line]})
    keys = [*_goto(lines.index(line), 0), "pyautogui.hotkey('shift', 'down')", "pyautogui.press('delete')"]
    return _task(
        f"Delete the whole line '{line}' from main.tex (leave no empty line in its place) and save.",
        lines,
        [line + "\n", ""],
        None,
        keys,
    )


def _items_sample(rng: random.Random) -> dict[str, Any]:
    doc = _doc(rng)
    items = rng.sample([w.capitalize() for w in WORDS + SUBJECTS], rng.randint(2, 5))
    return {
        "doc": doc,
        "k": rng.randrange(len(doc["sections"])),
        "items": items,
        "kind": rng.choice(["itemize", "enumerate"]),
    }


def _items_build(p: dict[str, Any]) -> dict[str, Any]:
    anchor = "The items are listed below."
    lines = _lines(p["doc"], {p["k"]: [anchor]})
    env, items = p["kind"], p["items"]
    block = f"\\begin{{{env}}}\n" + "".join(f"\\item {it}\n" for it in items) + f"\\end{{{env}}}\n"
    kind = "a bulleted list (itemize)" if env == "itemize" else "a numbered list (enumerate)"
    keys = [*_goto(lines.index(anchor), None), f"pyautogui.write({chr(10) + block.rstrip(chr(10))!r})"]
    return _task(
        f"In main.tex, right after the line '{anchor}', add {kind} with the items {', '.join(items)}, in this "
        "order. Save the file.",
        lines,
        [anchor + "\n", anchor + "\n" + block],
        items[-1],
        keys,
    )


def _date_sample(rng: random.Random) -> dict[str, Any]:
    month = rng.choice(["January", "March", "May", "July", "September", "November"])
    return {"doc": _doc(rng), "date": f"{rng.randint(1, 28)} {month} {rng.randint(2000, 2029)}"}


def _date_build(p: dict[str, Any]) -> dict[str, Any]:
    lines = _lines(p["doc"])
    author = f"\\author{{{p['doc']['author']}}}"
    typed = "\n\\date{" + p["date"] + "}"
    keys = [*_goto(2, None), f"pyautogui.write({typed!r})"]
    return _task(
        f"Add the line \\date{{{p['date']}}} right after the \\author line in main.tex and save.",
        lines,
        [author + "\n", author + "\n" + f"\\date{{{p['date']}}}\n"],
        p["date"],
        keys,
    )


def _size(doc_choices: int, *more: int) -> int:
    out = doc_choices
    for m in more:
        out *= m
    return out


# Distinct documents: titles (16*16) x authors (8) x section lists (>= 12*11 ordered pairs) x sentences.
_DOCS = 16 * 16 * 8 * 12 * 11
FAMILIES = [
    Family(
        "tex_title",
        "texstudio",
        "change the document's title",
        {"doc": "a generated document (title, author, 2-4 sections)", "new": "another title"},
        _title_sample,
        _title_build,
        _size(_DOCS, 255),
    ),
    Family(
        "tex_rename_section",
        "texstudio",
        "rename one of the document's sections",
        {"doc": "a generated document", "k": "which section", "new": "a new name"},
        _section_sample,
        _section_build,
        _size(_DOCS, 2, 30),
    ),
    Family(
        "tex_bold_word",
        "texstudio",
        "make a word bold (\\textbf) where it stands",
        {"doc": "a generated document", "k": "the section it is in", "word": f"{len(WORDS)} words"},
        _word_sample,
        _bold_build,
        _size(_DOCS, 2, len(WORDS), 2),
    ),
    Family(
        "tex_replace_year",
        "texstudio",
        "correct a year in a sentence",
        {"doc": "a generated document", "k": "the section", "old": "1950..2029", "new": "old ± 1 or 2"},
        _year_sample,
        _year_build,
        _size(_DOCS, 2, 80, 4),
    ),
    Family(
        "tex_comment_line",
        "texstudio",
        "comment out a line with %",
        {"doc": "a generated document", "k": "the section", "what": "the line's words"},
        _marked_sample,
        _comment_build,
        _size(_DOCS, 2, len(WORDS) * len(NOUNS)),
    ),
    Family(
        "tex_delete_line",
        "texstudio",
        "delete a TODO line",
        {"doc": "a generated document", "k": "the section", "what": "the line's words"},
        _marked_sample,
        _delete_build,
        _size(_DOCS, 2, len(WORDS) * len(NOUNS)),
    ),
    Family(
        "tex_insert_list",
        "texstudio",
        "insert an itemize or enumerate list after a line",
        {"doc": "a generated document", "k": "the section", "items": "2-5 words", "kind": "itemize, enumerate"},
        _items_sample,
        _items_build,
        _size(_DOCS, 2, 20 * 19, 2),
    ),
    Family(
        "tex_add_date",
        "texstudio",
        "add a \\date line after the \\author line",
        {"doc": "a generated document", "date": "day, month, year 2000..2029"},
        _date_sample,
        _date_build,
        _size(_DOCS, 28 * 6 * 30),
    ),
]
