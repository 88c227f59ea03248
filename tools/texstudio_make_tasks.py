"""Writes tasks/*.json: this package's own TeXstudio tasks, each with an oracle solution that works through
the GUI (cursor keys, selection, typing, shortcuts such as ctrl+b, ctrl+tab, ctrl+s, F5). Run it after editing
a task here: `python tools/texstudio_make_tasks.py`; with `--scienceboard SB/tasks/VM/TeXstudio` it
writes scienceboard_oracles.json instead."""

import json
import os
import sys

APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "coda_env", "apps", "texstudio")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(APP, "tasks")


def W(t):
    return ("TYPE", t)


def K(*k):
    return "pyautogui.hotkey(" + ", ".join(repr(x) for x in k) + ")"


def P(k, n=1):
    return f"pyautogui.press({k!r})" if n == 1 else f"pyautogui.press({k!r}, presses={n})"


SAVE = K("ctrl", "s")
TAB = K("ctrl", "tab")


# The oracles move with the keyboard (ctrl+home, down, right, shift+right), not with the find panel: under a
# heavy load the panel sometimes ignores the Escape that should close it (the app is still showing it when the
# key arrives), and the typing after it goes astray. Keys in the editor are handled in order, so positions
# computed from the document's text are exact (word wrap is off in the profile). `find` and `after_line` are
# markers that `task()` turns into keys, following the text as the oracle edits it.
def find(anchor):
    return [("FIND", anchor)]


def line_start(anchor):
    return [("LINE", anchor)]


def after_line(anchor, text):
    return [("AFTER", anchor), ("TYPE", "\n" + text)]


def replace_each(pairs):
    return [a for old, new in pairs for a in find(old) + [W(new)]]


def _goto(text, pos):
    line = text.count("\n", 0, pos)
    col = pos - (text.rfind("\n", 0, pos) + 1)
    return [K("ctrl", "home")] + _keys("down", line) + _keys("right", col)


def _keys(key, n):  # the action language allows presses=1..100 per call
    calls = [f"pyautogui.press({key!r}, presses={min(100, n - i)})" for i in range(0, n, 100)]
    return ["\n".join(calls)] if calls else []


def resolve(solution, texts, current):
    """Markers -> action strings, simulating the edits on `texts` (file -> text) to place later moves."""
    out, sel, cursor = [], None, 0
    for a in solution:
        text = texts[current]
        if isinstance(a, str):
            out.append(a)
            if a == TAB:
                names = [n for n in texts if n != current]
                current, sel = names[0], None
            elif a == K("ctrl", "end"):
                cursor, sel = len(text), None
            continue
        kind, arg = a
        if kind == "FIND":
            pos = text.index(arg)
            out += _goto(text, pos) + [
                "pyautogui.keyDown('shift')\n" + _keys("right", len(arg))[0] + "\npyautogui.keyUp('shift')"
            ]
            sel, cursor = (pos, len(arg)), pos + len(arg)
        elif kind == "LINE":
            pos = text.rfind("\n", 0, text.index(arg)) + 1
            out += _goto(text, pos)
            sel, cursor = None, pos
        elif kind == "AFTER":
            eol = text.index("\n", text.index(arg))
            out += _goto(text, text.rfind("\n", 0, eol) + 1) + [P("end")]
            sel, cursor = None, eol
        elif kind == "TYPE":
            out.append(f"pyautogui.write({arg!r})")
            if sel:
                texts[current] = text[: sel[0]] + arg + text[sel[0] + sel[1] :]
                cursor, sel = sel[0] + len(arg), None
            else:
                texts[current] = text[:cursor] + arg + text[cursor:]
                cursor += len(arg)
    return out


def doc(body, pre=""):
    return "\\documentclass{article}\n" + pre + "\\begin{document}\n" + body + "\\end{document}\n"


TASKS = []


def task(id, instruction, files, evaluate, solution, difficulty="easy", category="editing", steps=15, opened=None):
    init = [{"func": "write_file", "path": f"atelier/{n}", "content": c} for n, c in files.items()]
    init += [{"func": "open_file", "path": f"atelier/{n}"} for n in (opened or [list(files)[0]])]
    opened = opened or [list(files)[0]]
    solution = resolve(solution, {n: files[n] for n in opened}, opened[-1])
    if not solution[-1].startswith(("ANS", "DONE", "FAIL")):
        solution = solution + ["DONE"]
    steps = max(steps, len(solution) + 5)  # room for the oracle and a few slips
    TASKS.append(
        {
            "id": id,
            "app": "texstudio",
            "instruction": instruction,
            "steps": steps,
            "difficulty": difficulty,
            "category": category,
            "initialize": init,
            "evaluate": evaluate,
            "solution": solution,
        }
    )


def same_with(path, reps):
    return {"type": "tex_file", "path": f"atelier/{path}", "replacements": reps}


def compiles(**kw):
    return {"type": "compile", "path": "atelier", "file": "main", **kw}


# ---------------------------------------------------------------- tasks
intro = doc("\\section{Introduction}\nThe results are shown below.\n\nMore text follows here.\n")
task(
    "insert_itemize",
    "In main.tex, right after the line 'The results are shown below.', add a bulleted list (itemize) with three "
    "items: Alpha, Beta, Gamma. Save the file.",
    {"main.tex": intro},
    [
        same_with(
            "main.tex",
            [
                [
                    "The results are shown below.\n",
                    "The results are shown below.\n\\begin{itemize}\n\\item Alpha\n\\item Beta\n\\item Gamma\n\\end{itemize}\n",
                ]
            ],
        ),
        compiles(contains="Gamma"),
    ],
    after_line("shown below.", "\\begin{itemize}\n\\item Alpha\n\\item Beta\n\\item Gamma\n\\end{itemize}") + [SAVE],
)


def tiny_pdf():
    objs = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 100] /Contents 4 0 R >>",
    ]
    stream = "0.2 0.4 0.8 rg 10 10 180 80 re f"
    objs.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out, offs = "%PDF-1.4\n", []
    for i, o in enumerate(objs, 1):
        offs.append(len(out))
        out += f"{i} 0 obj\n{o}\nendobj\n"
    x = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n" + "".join(f"{o:010d} 00000 n \n" for o in offs)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{x}\n%%EOF\n"
    return out


report = doc(
    "\\section{Method}\nWe measured the colour of each sample.\nThe colour changed over time.\n\n"
    "\\section{Results}\nThe colour was stable in 2023.\n"
)
task(
    "replace_all_word",
    "Using TeXstudio's Find & Replace, replace every 'colour' with 'color' in main.tex, then save.",
    {"main.tex": report},
    [same_with("main.tex", [["colour", "color"]]), compiles()],
    replace_each(
        [
            ("measured the colour", "measured the color"),
            ("The colour changed", "The color changed"),
            ("The colour was", "The color was"),
        ]
    )
    + [SAVE],
    category="find-replace",
)

task(
    "replace_year",
    "The year in main.tex is wrong: change 2023 to 2024 and save the file.",
    {"main.tex": report},
    [same_with("main.tex", [["2023", "2024"]]), compiles(contains="2024")],
    find("2023") + [W("2024"), SAVE],
    category="find-replace",
)

titled = doc("\\maketitle\n\n\\section{Intro}\nThis is a draft.\n", pre="\\title{Draft Notes}\n\\author{A. Writer}\n")
task(
    "change_title",
    "Change the document title from 'Draft Notes' to 'Final Report' in main.tex and save.",
    {"main.tex": titled},
    [same_with("main.tex", [["\\title{Draft Notes}", "\\title{Final Report}"]]), compiles(contains="Final Report")],
    find("Draft Notes") + [W("Final Report"), SAVE],
)

task(
    "rename_section",
    "Rename the section 'Intro' to 'Introduction' in main.tex and save.",
    {"main.tex": titled},
    [same_with("main.tex", [["\\section{Intro}", "\\section{Introduction}"]]), compiles(contains="Introduction")],
    find("{Intro}") + [W("{Introduction}"), SAVE],
)

task(
    "add_author_date",
    "Add the line \\date{1 May 2024} right after the \\author line in main.tex and save.",
    {"main.tex": titled},
    [
        same_with("main.tex", [["\\author{A. Writer}\n", "\\author{A. Writer}\n\\date{1 May 2024}\n"]]),
        compiles(contains="1 May 2024"),
    ],
    after_line("\\author{A. Writer}", "\\date{1 May 2024}") + [SAVE],
)

task(
    "insert_enumerate",
    "In main.tex, right after 'More text follows here.', add a numbered list (enumerate) with the items "
    "First and Second. Save the file.",
    {"main.tex": intro},
    [
        same_with(
            "main.tex",
            [
                [
                    "More text follows here.\n",
                    "More text follows here.\n\\begin{enumerate}\n\\item First\n\\item Second\n\\end{enumerate}\n",
                ]
            ],
        ),
        compiles(contains="Second"),
    ],
    after_line("follows here.", "\\begin{enumerate}\n\\item First\n\\item Second\n\\end{enumerate}") + [SAVE],
)

physics = doc(
    "\\section{Energy}\nEinstein's relation is given by\n\nwhich links mass and energy.\n",
    pre="\\usepackage{amsmath}\n",
)
task(
    "insert_equation",
    "In main.tex, on the empty line after 'Einstein's relation is given by', insert a numbered equation "
    "environment containing E = mc^2 with the label eq:energy (\\label{eq:energy}). Save the file.",
    {"main.tex": physics},
    [
        {
            "type": "include",
            "path": "atelier/main.tex",
            "pattern": r"given by\n\\begin\{equation\}\s*(\\label\{eq:energy\}\s*)?E\s*=\s*mc\^\{?2\}?\s*(\\label\{eq:energy\}\s*)?\\end\{equation\}",
        },
        {"type": "include", "path": "atelier/main.tex", "pattern": r"\\label\{eq:energy\}", "count": 1},
        compiles(contains="(1)"),
    ],
    after_line("is given by", "\\begin{equation}\n\\label{eq:energy}\nE = mc^2\n\\end{equation}") + [SAVE],
    difficulty="medium",
    category="math",
)

task(
    "inline_math",
    "In main.tex, replace the words 'x squared' with the inline math $x^2$ and save.",
    {"main.tex": doc("The area grows like x squared for large x.\n")},
    [same_with("main.tex", [["x squared", "$x^2$"]]), compiles()],
    find("x squared") + [W("$x^2$"), SAVE],
    category="math",
)

table_doc = doc("\\section{Data}\nThe measurements:\n\n\\section{Discussion}\nSee above.\n")
TABLE = "\\begin{tabular}{|l|r|}\n\\hline\nSample & Value \\\\\n\\hline\nA & 1.5 \\\\\nB & 2.5 \\\\\n\\hline\n\\end{tabular}"
task(
    "insert_table",
    "In main.tex, after the line 'The measurements:', insert a tabular with two columns (l and r, with vertical "
    "rules: {|l|r|}), a header row 'Sample & Value', and the rows 'A & 1.5' and 'B & 2.5', with \\hline above "
    "and below the header and at the end. Save the file.",
    {"main.tex": table_doc},
    [
        {"type": "include", "path": "atelier/main.tex", "pattern": r"\\begin\{tabular\}\{\|l\|r\|\}"},
        {"type": "include", "path": "atelier/main.tex", "pattern": r"Sample\s*&\s*Value\s*\\\\"},
        {"type": "include", "path": "atelier/main.tex", "pattern": r"A\s*&\s*1\.5\s*\\\\"},
        {"type": "include", "path": "atelier/main.tex", "pattern": r"B\s*&\s*2\.5\s*\\\\"},
        compiles(contains="2.5"),
    ],
    after_line("The measurements:", TABLE) + [SAVE],
    difficulty="medium",
    category="table",
)

task(
    "table_add_row",
    "The table in main.tex lacks a row for sample C with value 3.5. Add the row 'C & 3.5 \\\\' after the row of B "
    "and save.",
    {"main.tex": doc("\\section{Data}\n" + TABLE + "\n")},
    [same_with("main.tex", [["B & 2.5 \\\\\n", "B & 2.5 \\\\\nC & 3.5 \\\\\n"]]), compiles(contains="3.5")],
    after_line("B & 2.5", "C & 3.5 \\\\") + [SAVE],
    category="table",
)

FIG = (
    "\\begin{figure}[h]\n\\centering\n\\includegraphics[width=0.5\\textwidth]{figs/plot.pdf}\n"
    "\\caption{A blue box}\n\\label{fig:box}\n\\end{figure}"
)
task(
    "insert_figure",
    "In main.tex, after the line 'The figure below shows the box.', insert a figure environment that includes "
    "figs/plot.pdf at width 0.5\\textwidth (centered), with the caption 'A blue box' and the label fig:box. "
    "Save the file.",
    {
        "main.tex": doc("\\section{Figure}\nThe figure below shows the box.\n", pre="\\usepackage{graphicx}\n"),
        "figs/plot.pdf": tiny_pdf(),
    },
    [
        {"type": "include", "path": "atelier/main.tex", "pattern": r"\\begin\{figure\}"},
        {
            "type": "include",
            "path": "atelier/main.tex",
            "pattern": r"\\includegraphics\[width=0\.5\\textwidth\]\{figs/plot(\.pdf)?\}",
        },
        {"type": "include", "path": "atelier/main.tex", "pattern": r"\\caption\{A blue box\}"},
        {"type": "include", "path": "atelier/main.tex", "pattern": r"\\label\{fig:box\}"},
        compiles(contains="A blue box"),
    ],
    after_line("shows the box.", FIG) + [SAVE],
    difficulty="medium",
    category="figure",
)

task(
    "fix_environment_typo",
    "main.tex does not compile: an environment name is misspelled. Fix it so the document builds, and save.",
    {"main.tex": doc("Things to buy:\n\\begin{itemze}\n\\item Milk\n\\item Bread\n\\end{itemize}\n")},
    [same_with("main.tex", [["\\begin{itemze}", "\\begin{itemize}"]]), compiles(contains="Bread")],
    find("itemze") + [W("itemize"), SAVE],
    category="fix-error",
)

task(
    "fix_missing_brace",
    "main.tex does not compile because a closing brace is missing after 'important'. Add it and save.",
    {"main.tex": doc("This is \\textbf{important.\n\nAnother paragraph.\n")},
    [same_with("main.tex", [["\\textbf{important.", "\\textbf{important}."]]), compiles(contains="Another paragraph")],
    find("important") + [W("important}"), SAVE],
    category="fix-error",
)

task(
    "fix_undefined_command",
    "main.tex uses \\textbff, which does not exist. Change it to \\textbf so the document compiles, and save.",
    {"main.tex": doc("A \\textbff{bold} claim.\n")},
    [same_with("main.tex", [["\\textbff{", "\\textbf{"]]), compiles(contains="bold claim")],
    find("textbff") + [W("textbf"), SAVE],
    category="fix-error",
)

BIB = (
    "@book{knuth1984,\n  title={The TeXbook},\n  author={Knuth, Donald E.},\n  year={1984},\n"
    "  publisher={Addison-Wesley}\n}\n"
)
cited = doc("TeX was designed by Knuth.\n\n\\bibliographystyle{plain}\n\\bibliography{refs}\n")
task(
    "cite_bibtex",
    "Cite the book in refs.bib (key knuth1984) at the end of the sentence 'TeX was designed by Knuth' in main.tex, "
    "as 'TeX was designed by Knuth \\cite{knuth1984}.', save, and make sure the bibliography builds with BibTeX.",
    {"main.tex": cited, "refs.bib": BIB},
    [same_with("main.tex", [["by Knuth.", "by Knuth \\cite{knuth1984}."]]), compiles(contains="The TeXbook")],
    find("by Knuth") + [W("by Knuth \\cite{knuth1984}"), SAVE],
    category="bibliography",
    difficulty="medium",
    opened=["refs.bib", "main.tex"],
)

NEWBIB = (
    "\n@article{turing1936,\n  title={On computable numbers},\n  author={Turing, Alan},\n"
    "  journal={Proceedings of the London Mathematical Society},\n  year={1936}\n}\n"
)
task(
    "add_bib_entry",
    "Add an @article entry with key turing1936 to refs.bib (title 'On computable numbers', author 'Turing, Alan', "
    "journal 'Proceedings of the London Mathematical Society', year 1936), and cite it in main.tex after "
    "'computable functions' as '\\cite{turing1936}'. Save both files.",
    {
        "main.tex": doc(
            "We rely on computable functions.\n\\nocite{knuth1984}\n\n\\bibliographystyle{plain}\n\\bibliography{refs}\n"
        ),
        "refs.bib": BIB,
    },
    [
        {"type": "include", "path": "atelier/refs.bib", "pattern": r"@article\{turing1936,"},
        {"type": "include", "path": "atelier/refs.bib", "pattern": r"title=\{On computable numbers\}"},
        {"type": "include", "path": "atelier/refs.bib", "pattern": r"@book\{knuth1984,"},
        {"type": "include", "path": "atelier/main.tex", "pattern": r"computable functions\s*\\cite\{turing1936\}"},
        compiles(contains="On computable numbers"),
    ],
    find("functions") + [W("functions \\cite{turing1936}"), SAVE, TAB, K("ctrl", "end"), W(NEWBIB), SAVE],
    category="bibliography",
    difficulty="hard",
    opened=["refs.bib", "main.tex"],
    steps=20,
)

book = doc("\\section{Overview}\nThis book has chapters.\n\n\\input{chapter1}\n")
CH1 = "\\section{Chapter One}\nThe first chapter is short.\n"
CH2 = "\\section{Chapter Two}\nThe second chapter is shorter.\n"
task(
    "input_chapter",
    "main.tex includes chapter1.tex. Include chapter2.tex as well: add \\input{chapter2} on the line after "
    "\\input{chapter1}, then save.",
    {"main.tex": book, "chapter1.tex": CH1, "chapter2.tex": CH2},
    [
        same_with("main.tex", [["\\input{chapter1}\n", "\\input{chapter1}\n\\input{chapter2}\n"]]),
        compiles(contains="second chapter is shorter"),
    ],
    after_line("\\input{chapter1}", "\\input{chapter2}") + [SAVE],
    category="multi-file",
    opened=["chapter1.tex", "main.tex"],
)

task(
    "edit_included_file",
    "The document main.tex includes chapter1.tex (open in another tab). In chapter1.tex, change 'is short' to "
    "'is long' and save chapter1.tex.",
    {"main.tex": book, "chapter1.tex": CH1},
    [
        same_with("chapter1.tex", [["is short", "is long"]]),
        {"type": "file", "path": "atelier/main.tex", "equals": book},
        compiles(contains="first chapter is long"),
    ],
    [TAB] + find("is short") + [W("is long"), SAVE],
    category="multi-file",
    difficulty="medium",
    opened=["chapter1.tex", "main.tex"],
)

task(
    "add_conclusion_section",
    "Add a new section titled 'Conclusion' at the end of the document in main.tex (just before \\end{document}), "
    "with the sentence 'We are done.' on the line after the heading. Save the file.",
    {"main.tex": intro},
    [
        same_with(
            "main.tex",
            [["More text follows here.\n", "More text follows here.\n\\section{Conclusion}\nWe are done.\n"]],
        ),
        compiles(contains="Conclusion"),
    ],
    after_line("More text follows here.", "\\section{Conclusion}\nWe are done.") + [SAVE],
    category="structure",
)

task(
    "add_label_and_ref",
    "In main.tex, give the section 'Method' the label sec:method (put \\label{sec:method} on the line after the "
    "\\section line) and replace the text 'the method section' with 'Section~\\ref{sec:method}'. Save.",
    {
        "main.tex": doc(
            "\\section{Method}\nWe did things.\n\n\\section{Results}\nAs described in the method section, it works.\n"
        )
    },
    [
        same_with(
            "main.tex",
            [
                ["\\section{Method}\n", "\\section{Method}\n\\label{sec:method}\n"],
                ["the method section", "Section~\\ref{sec:method}"],
            ],
        ),
        compiles(contains="Section 1"),
    ],
    after_line("\\section{Method}", "\\label{sec:method}")
    + find("the method section")
    + [W("Section~\\ref{sec:method}"), SAVE],
    category="structure",
    difficulty="medium",
)

task(
    "bold_word",
    "Make the word 'crucial' bold in main.tex (\\textbf{crucial}) and save.",
    {"main.tex": doc("This step is crucial for success.\n")},
    [same_with("main.tex", [["crucial", "\\textbf{crucial}"]]), compiles()],
    find("crucial") + [K("ctrl", "b"), SAVE],
    category="formatting",
)

task(
    "delete_todo_line",
    "Delete the whole line 'TODO: remove this line' from main.tex (leave no empty line in its place) and save.",
    {"main.tex": doc("First line.\nTODO: remove this line\nLast line.\n")},
    [same_with("main.tex", [["TODO: remove this line\n", ""]]), compiles()],
    line_start("TODO") + [K("shift", "down"), P("delete"), SAVE],
    category="editing",
)

task(
    "comment_out_line",
    "Comment out the line 'Secret draft sentence.' in main.tex by putting a % at the start of it, then save.",
    {"main.tex": doc("Public sentence.\nSecret draft sentence.\n")},
    [same_with("main.tex", [["Secret draft sentence.", "%Secret draft sentence."]]), compiles()],
    line_start("Secret draft") + [W("%"), SAVE],
    category="editing",
)

task(
    "build_pdf",
    "Build main.tex to a PDF in TeXstudio (Build & View).",
    {"main.tex": doc("A document to build.\n")},
    [
        {"type": "file", "path": "atelier/main.pdf", "exists": True},
        {"type": "file", "path": "atelier/main.tex", "equals": doc("A document to build.\n")},
    ],
    [P("f5"), "WAIT"],
    category="build",
)

task(
    "count_sections_answer",
    "How many \\section commands does main.tex have? Answer with the number (ANS <n>).",
    {"main.tex": doc("\\section{A}\nx\n\\section{B}\ny\n\\subsection{B1}\nz\n\\section{C}\nw\n")},
    [{"type": "answer", "value": "3"}],
    ["ANS 3"],
    category="reading",
)

# ---------------------------------------------------------------- ScienceBoard oracles
SB_BIB = (
    "\n@article{avagyan2018new,\n  title={A New Method in the Problem of Three Cubes},\n"
    "  author={Avagyan, Armen and Dallakyan, Gurgen},\n  journal={arXiv preprint arXiv:1802.06776},\n"
    "  year={2018}\n}\n"
)
SB_EDITS = {  # file stem -> the oracle's edit of main.tex (what the other app, or the document, tells)
    "A-01": ("xxx.xx", "109.03"),
    "A-02": ("???", "ASN"),
    "A-03": ("TGCCAT", "CTCGAG"),
    "A-04": ("38657", "46368"),
    "B-01": ("\\cite{}", "\\cite{de2015lean}"),
    "B-02": ("????-???? \\cite{}", "1966-047A \\cite{celestia}"),
    "B-03": ("0 \\cite{}", "8 \\cite{GRASS_GIS_software}"),
    "C-01": ("4 oxygen", "9 oxygen"),
    "C-02": ("x: M. B", "x: A. B"),
    "C-03": ("figs/lat.pdf", "figs/latency.pdf"),
    "C-04": ("0.49\\textwidth]{figs/envelope", "0.48\\textwidth]{figs/envelope"),
    "C-05": ("IsConnected.img", "IsConnected.image"),
    "C-06": ("\\or c", "\\vee c"),
}
SB_ANSWERS = {"D-01": "ANS 13", "D-02": "ANS 52"}


def scienceboard_oracles(folder: str) -> dict:
    """Oracles of ScienceBoard's TeXstudio files, by stem, computed on the texts their translation writes."""
    import glob

    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    from coda_env.apps.texstudio import scienceboard as sb

    out = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.json"))):
        stem = os.path.splitext(os.path.basename(f))[0]
        t = sb.convert(json.load(open(f)), f)
        texts = {op["path"]: op["content"] for op in t["initialize"] if op["func"] == "write_file"}
        opened = [op["path"] for op in t["initialize"] if op["func"] == "open_file"]
        shown = {n: texts[n] for n in opened}
        if stem in SB_ANSWERS:
            out[stem] = [SB_ANSWERS[stem]]
        elif stem == "B-04":  # the BibTeX entry goes at the end of refs.bib (the other tab)
            out[stem] = ["\n".join(resolve([TAB, K("ctrl", "end"), W(SB_BIB), SAVE], shown, opened[-1])), "DONE"]
        else:  # one step of keys (some of these tasks allow only 5 steps), then DONE
            old, new = SB_EDITS[stem]
            out[stem] = ["\n".join(resolve(find(old) + [W(new), SAVE], shown, opened[-1])), "DONE"]
    return out


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--scienceboard":  # python make_tasks.py --scienceboard DIR
        dest = os.path.join(APP, "scienceboard_oracles.json")
        with open(dest, "w") as f:
            json.dump(scienceboard_oracles(sys.argv[2]), f, indent=1)
            f.write("\n")
        print("wrote", dest)
        sys.exit(0)
    os.makedirs(OUT, exist_ok=True)
    for t in TASKS:
        with open(os.path.join(OUT, t["id"] + ".json"), "w") as f:
            json.dump(t, f, indent=2)
            f.write("\n")
    print(len(TASKS), "tasks")
