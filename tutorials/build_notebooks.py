"""Make each lesson's notebook from its .py file: `python -m tutorials.build_notebooks [--check]`.

A lesson is ONE file, `tutorials/NN_name.py`, written in jupytext's percent format: the module
docstring is the first cell (`# %% [markdown]` above it), `# %%` starts a code cell and
`# %% [markdown]` a cell of comment lines that are Markdown. Run as a script it is an ordinary
Python program (the markers are comments). This module turns it into `tutorials/NN_name.ipynb`:

    1. the lesson's title and its opening paragraphs (how to run it, what it writes),
    2. the set-up cell (the same in every notebook, written here): it installs minirl when it is
       missing and says which device JAX will use, then makes the notebook run the lesson exactly
       as `python tutorials/NN_name.py --fast` runs it (`sys.argv`, `__file__`),
    3. the docstring's sections (THE IDEA, WHAT THE SCRIPT DOES, ...) as Markdown cells,
    4. the lesson's own cells, in order; the last one calls `main()`,
    5. the docstring's "Expected output (full mode, measured)" section, with the figures it names
       shown inline, so the notebook ends with what the full mode printed when it was measured.

The docstring is plain text; `prose_to_markdown` makes it Markdown without changing its words
(a setext heading stays a heading, an indented block becomes a fenced code block, a stray `*` or
`<tag` is escaped). The notebooks carry no outputs and are never edited by hand: edit the .py and
run this module again. `--check` writes nothing and exits 1 when a committed notebook differs from
what its lesson makes now (tests/test_notebooks.py runs the same comparison). The site
(mkdocs.yml, tools/mkdocs_hooks.py) renders the lesson pages from the same cells.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from pathlib import Path

TUTORIALS = Path(__file__).resolve().parent
LESSON_GLOB = "[0-9][0-9]_*.py"
MEASURED = "Expected output (full mode, measured)"
FIGURE = re.compile(r"figures/[\w.-]+\.png")
COMMANDS = ("python ", "minirl ", "pip ", "PYTHONPATH=", "MINIRL_", "JAX_", "OMP_", "bash ")


class LessonFormatError(ValueError):
    """A lesson file that is not in the percent format this module expects."""


def lessons(folder: Path = TUTORIALS) -> list[Path]:
    return sorted(folder.glob(LESSON_GLOB))


# ---------------------------------------------------------------------------------------------
# The docstring's plain text as Markdown.
# ---------------------------------------------------------------------------------------------


def _escape_prose(text: str) -> str:
    """Escape what Markdown would read as emphasis or an HTML tag, outside `code spans`."""
    parts = re.split(r"(`+[^`]*?`+)", text)
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", parts[i].replace("*", r"\*"))
    return "".join(parts)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _fence(block: list[str]) -> list[str]:
    """An indented block as a fenced code block: `bash` when every line is a command."""
    indent = min(_indent(line) for line in block if line.strip())
    body = [line[indent:] for line in block]
    commands = all(line.startswith(COMMANDS) or line.startswith(" ") for line in body if line)
    return [f"```{'bash' if commands and body[0].startswith(COMMANDS) else 'text'}", *body, "```"]


def prose_to_markdown(text: str) -> str:
    """A docstring's plain text as Markdown, word for word."""
    lines, out, prose = text.strip("\n").split("\n"), [], []

    def flush():
        if prose:
            out.extend(_escape_prose("\n".join(prose)).split("\n"))
            prose.clear()

    i = 0
    while i < len(lines):
        line, nxt = lines[i], lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and not line[0].isspace() and re.fullmatch(r"-{3,}|={3,}", nxt.strip()):
            flush()
            out.append(f"## {line.strip()}")
            i += 2
        elif line[:2] == "  " and line.strip() and (i == 0 or not lines[i - 1].strip()):
            flush()
            j, indent = i, _indent(line)  # the block: up to a line indented less than it starts
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) >= indent):
                j += 1
            while not lines[j - 1].strip():
                j -= 1
            out.extend(_fence(lines[i:j]))
            i = j
        else:
            prose.append(line)
            i += 1
    flush()
    return "\n".join(out).strip("\n")


def show_figures(markdown: str, shown: set[str]) -> str:
    """Each figure a paragraph names (`figures/NN_name.png`) becomes a link, and the figure
    itself follows the paragraph, once per lesson. Code blocks are left as they are."""
    paragraphs, in_code = markdown.split("\n\n"), False
    for i, par in enumerate(paragraphs):
        fences = sum(line.startswith("```") for line in par.split("\n"))
        if in_code or fences:
            in_code ^= fences % 2 == 1
            continue
        new = [f for f in dict.fromkeys(FIGURE.findall(par)) if f not in shown]
        paragraphs[i] = "\n".join(  # a heading keeps its words; the figure follows it
            line if line.startswith("#") else FIGURE.sub(r"[\g<0>](\g<0>)", line)
            for line in par.split("\n")
        )
        for f in new:
            paragraphs[i] += f"\n\n![{Path(f).stem}]({f})"
            shown.add(f)
    return "\n\n".join(paragraphs)


def docstring_sections(doc: str) -> tuple[str, list[tuple[str, str]]]:
    """The docstring split at its setext headings: (the opening text, [(heading, body), ...])."""
    pieces = re.split(r"\n\n([^\n ][^\n]*)\n(?:-{3,}|={3,})\n", "\n" + doc.strip("\n"))
    head, rest = pieces[0].strip("\n"), pieces[1:]
    return head, [(rest[k].strip(), rest[k + 1].strip("\n")) for k in range(0, len(rest), 2)]


# ---------------------------------------------------------------------------------------------
# The notebook.
# ---------------------------------------------------------------------------------------------

SETUP = """\
# Set-up: the same first cell in every lesson notebook (tutorials/build_notebooks.py writes it).
# Inside a checkout of minirl this notebook sits in tutorials/, next to its lesson; on a hosted
# runtime, clone the repository first (tutorials/README.md, "Notebooks"). minirl is installed
# from that checkout if it is not installed yet.
import importlib.util
import os
import shutil
import sys
from pathlib import Path

NAME = "{name}"
found = [p for p in (Path(NAME), Path("minirl/tutorials") / NAME) if p.is_file()]
if not found:
    raise SystemExit(f"{{NAME}} is not here: open this notebook from tutorials/ of a checkout")
LESSON = found[0].resolve()  # the lesson's source; this notebook is made from it
if importlib.util.find_spec("minirl") is None:
    %pip install -q -e "{{LESSON.parents[1]}}"
    sys.path.insert(0, str(LESSON.parents[1]))  # importable now, without a restart

# The device: a GPU or TPU when there is one and JAX has its plugin, else the CPU.
plugins = {{"cuda": ("jax_cuda12_plugin", "jax_cuda13_plugin"), "tpu": ("libtpu",)}}
hardware = {{"cuda": shutil.which("nvidia-smi") is not None, "tpu": Path("/dev/accel0").exists()}}
usable = [k for k in plugins if hardware[k] and any(map(importlib.util.find_spec, plugins[k]))]
os.environ.setdefault("JAX_PLATFORMS", usable[0] if usable else "cpu")
print(f"{{NAME}}: JAX will run on {{os.environ['JAX_PLATFORMS']!r}}")

# Run the lesson as `python tutorials/{name} --fast` does. Its options: remove
# "--fast" for the full mode (minutes), add "--out", "DIR" to choose where it writes.
ARGS = ["--fast"]
sys.argv, __file__ = [str(LESSON), *ARGS], str(LESSON)"""


def _cell(kind: str, source: str, index: int):
    import nbformat

    make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
    return make(source, id=f"cell-{index:02d}")  # stable ids: the same lesson, the same bytes


def lesson_cells(path: Path) -> list[tuple[str, str]]:
    """The lesson as (kind, source) cells, in the order the notebook shows them."""
    import jupytext

    text = path.read_text()
    doc = ast.get_docstring(ast.parse(text), clean=False)
    cells = jupytext.reads(text, fmt="py:percent").cells
    if doc is None or not text.startswith("# %% [markdown]\n") or len(cells) < 2:
        raise LessonFormatError(
            f"{path.name}: a lesson opens with `# %% [markdown]` above its docstring and marks "
            "its code cells with `# %%` (tutorials/README.md, 'Notebooks')"
        )
    head, sections = docstring_sections(doc)
    title, _, intro = head.partition("\n")
    shown: set[str] = set()
    out = [("markdown", show_figures(f"# {title}\n\n{prose_to_markdown(intro)}", shown))]
    out.append(("code", SETUP.format(name=path.name)))
    measured = [s for s in sections if s[0] == MEASURED]
    if not measured:
        raise LessonFormatError(f"{path.name}: the docstring has no {MEASURED!r} section")
    for heading, body in [s for s in sections if s[0] != MEASURED]:
        out.append(("markdown", show_figures(f"## {heading}\n\n{prose_to_markdown(body)}", shown)))
    for i, cell in enumerate(cells[1:], start=2):
        if cell.cell_type == "code":
            try:  # a notebook runs cell by cell: each must be whole Python on its own
                ast.parse(cell.source)
            except SyntaxError as err:
                raise LessonFormatError(
                    f"{path.name}: cell {i}, which starts {cell.source.strip()[:40]!r}, is not "
                    f"valid Python on its own ({err.msg}): is a `# %%` inside a string or a block?"
                ) from None
        out.append((cell.cell_type, cell.source))
    for heading, body in measured:
        out.append(("markdown", show_figures(f"## {heading}\n\n{prose_to_markdown(body)}", shown)))
    return out


def lesson_notebook(path: Path) -> str:
    """The notebook of a lesson, as the text of an .ipynb file (no outputs)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [_cell(kind, src, i) for i, (kind, src) in enumerate(lesson_cells(path))]
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    nbformat.validate(nb)
    return nbformat.writes(nb, version=4) + "\n"


def _cells(notebook_text: str) -> list[tuple[str, str, str]]:
    import json

    cells = json.loads(notebook_text)["cells"]
    return [(c["cell_type"], c.get("id", ""), "".join(c["source"])) for c in cells]


def drifted(paths: list[Path]) -> list[str]:
    """The lessons whose committed notebook is missing or whose cells differ from what the
    lesson makes now (cells compared by kind, id and text, so another version of nbformat
    writing the same cells is not drift)."""
    stale = []
    for p in paths:
        nb = p.with_suffix(".ipynb")
        if not nb.is_file() or _cells(nb.read_text()) != _cells(lesson_notebook(p)):
            stale.append(p.name)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lessons", nargs="*", type=Path, help="lesson files (default: all)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 on drift")
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.lessons] or lessons()
    try:
        if args.check:
            stale = drifted(paths)
            for name in stale:
                print(f"{name}: its notebook is out of date (python -m tutorials.build_notebooks)")
            return 1 if stale else 0
        for p in paths:
            p.with_suffix(".ipynb").write_text(lesson_notebook(p))
            print(f"wrote {os.path.relpath(p.with_suffix('.ipynb'))}")
    except (LessonFormatError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
