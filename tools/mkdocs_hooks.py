"""MkDocs hooks (mkdocs.yml, `hooks:`): the lessons, the lessons' index and scale/README.md join
the site, and plain mentions of pages become links.

What the site shows that is not in docs/ is made here, at build time, from the files it comes
from, so nothing is copied into docs/ by hand:

- each lesson `tutorials/NN_name.py` becomes a page `tutorials/NN_name.md` built from the same
  cells as its notebook (tutorials/build_notebooks.py): its text, its code, its measured output
  and its figures inline, with links to its notebook and its source, which are published beside
  it; the lessons join the "Lessons" section of the navigation in order, so a new lesson needs
  no edit of mkdocs.yml;
- tutorials/README.md is the lessons' index page (its links to `NN_name.py` go to the pages);
  scale/README.md is the page `scale.md`;
- a Markdown link from docs/ to a repository file outside docs/ (`../experiments/...png`) is
  published under `repo/` and the link points there;
- `docs/NAME.md` and `lesson NN` written in prose (not in code) become links to those pages.

`mkdocs build --strict` then checks every link and every image: a missing figure or a link to a
page that does not exist fails the build (mkdocs.yml, `validation`).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "build_notebooks", ROOT / "tutorials/build_notebooks.py"
)
notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebooks)

LESSONS_SECTION = "Lessons"
CODE = re.compile(r"(```.*?```|`+[^`\n]*`+)", re.S)  # fenced blocks and code spans: left alone
LINK_OUT = re.compile(r"(\]\()\.\./([^)#\s]+)")  # ](../path): a link out of docs/


def lesson_page(path: Path) -> str:
    """A lesson as one Markdown page: the notebook's cells without its set-up cell, the code as
    Python blocks, and where to get the notebook."""
    cells = notebooks.lesson_cells(path)
    title, _, rest = cells[0][1].partition("\n")
    notebook = path.with_suffix(".ipynb").name
    run = (
        f'!!! tip "Run it"\n    In Jupyter: [{notebook}]({notebook}) (its first cell installs '
        f"minirl when it is missing and picks the device; the notebook runs the fast mode). "
        f"As a script: `python tutorials/{path.name} --fast`. Source: [{path.name}]({path.name})."
    )
    parts = [title, run, rest.strip("\n")]
    for kind, source in cells[2:]:
        parts.append(f"```python\n{source}\n```" if kind == "code" else source)
    return "\n\n".join(parts) + "\n"


def lessons_index(readme: str) -> str:
    """tutorials/README.md with its links to the lessons' sources pointing at their pages."""
    return re.sub(r"\]\((\d\d_[\w]+)\.py\)", r"](\1.md)", readme)


def _add(files: Files, config, src_uri: str, *, content=None, path: Path | None = None) -> None:
    if files.get_file_from_path(src_uri) is None:
        if content is not None:
            files.append(File.generated(config, src_uri, content=content))
        else:
            files.append(File.generated(config, src_uri, abs_src_path=str(path)))


def on_config(config):
    """Every lesson joins the "Lessons" section of the navigation, after its index page."""
    for entry in config["nav"] or []:
        if isinstance(entry, dict) and LESSONS_SECTION in entry:
            section = entry[LESSONS_SECTION]
            for path in notebooks.lessons():
                title = path.read_text().split('"""', 2)[1].split(":")[0].split("\n")[0]
                section.append({title.replace("Lesson ", ""): f"tutorials/{path.stem}.md"})
    return config


def on_files(files: Files, config) -> Files:
    tutorials = ROOT / "tutorials"
    for path in notebooks.lessons():
        _add(files, config, f"tutorials/{path.stem}.md", content=lesson_page(path))
        for published in (path, path.with_suffix(".ipynb")):
            if published.is_file():  # a missing notebook: the lesson page's link fails the build
                _add(files, config, f"tutorials/{published.name}", path=published)
    for figure in sorted((tutorials / "figures").glob("*.png")):
        _add(files, config, f"tutorials/figures/{figure.name}", path=figure)
    _add(
        files,
        config,
        "tutorials/index.md",
        content=lessons_index(tutorials.joinpath("README.md").read_text()),
    )
    _add(files, config, "scale.md", content=(ROOT / "scale/README.md").read_text())
    docs = Path(config["docs_dir"])
    for page in sorted(docs.rglob("*.md")):
        for _, target in LINK_OUT.findall(page.read_text()):
            outside = (page.parent / ".." / target).resolve()
            if outside.is_file() and docs not in outside.parents:
                _add(files, config, f"repo/{outside.relative_to(ROOT)}", path=outside)
    return files


def _linkify(prose: str, page_uri: str, pages: dict[str, str]) -> str:
    """`docs/NAME.md` and `lesson NN` in prose become links to those pages (not on headings, not
    to the page itself)."""
    depth = page_uri.count("/")
    up = "../" * depth

    def doc(m):
        uri = f"{m.group(1)}.md"
        return m.group(0) if uri == page_uri or uri not in pages else f"[{m.group(0)}]({up}{uri})"

    def lesson(m):
        uri = pages.get(f"lesson {m.group(2)}")
        return m.group(0) if uri in (None, page_uri) else f"[{m.group(0)}]({up}{uri})"

    out = []
    for line in prose.split("\n"):
        if not line.startswith("#"):
            line = re.sub(r"(?<![\[(/\w])docs/([\w/]+)\.md\b", doc, line)
            line = re.sub(r"(?<![\[\w])([Ll]esson) (\d\d)\b(?!\])", lesson, line)
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    uri = page.file.src_uri
    pages = {f.src_uri: f.src_uri for f in files.documentation_pages()}
    for path in notebooks.lessons():
        pages[f"lesson {path.name[:2]}"] = f"tutorials/{path.stem}.md"
    pieces = CODE.split(markdown)
    for i in range(0, len(pieces), 2):  # the even pieces are prose
        if "/" not in uri:  # a page of docs/: links out of docs/ go to their published copy
            pieces[i] = LINK_OUT.sub(lambda m: f"{m.group(1)}repo/{m.group(2)}", pieces[i])
        pieces[i] = _linkify(pieces[i], uri, pages)
    return "".join(pieces)
