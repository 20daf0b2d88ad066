"""The lessons' notebooks are made from the lessons and kept in step with them (issue #49).

Every `tutorials/NN_name.py` has a committed `tutorials/NN_name.ipynb` equal, byte for byte, to
what `python -m tutorials.build_notebooks` makes from it now: a lesson edited without rebuilding
its notebook fails here. Cheap: jupytext parses the text, nothing runs. The markdown conversion
of the docstrings is checked on hand-written input, and a lesson without cell markers is refused
with a sentence. The notebooks RUN in the slow lane (tests/test_tutorials.py, 01-05 in fast mode).
"""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "build_notebooks", ROOT / "tutorials/build_notebooks.py"
)
bn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bn)

LESSONS = bn.lessons()


def test_every_lesson_has_its_notebook_and_they_match():
    assert LESSONS, "no lessons found"
    stale = bn.drifted(LESSONS)
    assert not stale, f"rebuild with `python -m tutorials.build_notebooks`: {stale}"


def test_the_check_sees_a_lesson_changed_without_its_notebook(tmp_path, capsys):
    lesson = tmp_path / LESSONS[0].name
    shutil.copy(LESSONS[0], lesson)
    shutil.copy(LESSONS[0].with_suffix(".ipynb"), lesson.with_suffix(".ipynb"))
    assert bn.main([str(lesson), "--check"]) == 0
    lesson.write_text(lesson.read_text().replace("def main(", "def main(  ", 1))  # a code edit
    assert bn.main([str(lesson), "--check"]) == 1
    assert f"{lesson.name}: its notebook is out of date" in capsys.readouterr().out
    assert bn.main([str(lesson)]) == 0 and bn.main([str(lesson), "--check"]) == 0  # rebuilt


def test_a_notebook_opens_with_the_lesson_then_set_up_and_ends_with_the_measured_output():
    nb = json.loads(LESSONS[0].with_suffix(".ipynb").read_text())
    kinds = [c["cell_type"] for c in nb["cells"]]
    text = ["".join(c["source"]) for c in nb["cells"]]
    assert kinds[:2] == ["markdown", "code"] and text[0].startswith("# Lesson 01 — ")
    assert f'NAME = "{LESSONS[0].name}"' in text[1] and 'ARGS = ["--fast"]' in text[1]
    assert "%pip install" in text[1] and "JAX_PLATFORMS" in text[1]
    assert text[-1].startswith("## Expected output (full mode, measured)")
    assert "![01_model_and_kv_cache](figures/01_model_and_kv_cache.png)" in text[-1]
    assert text[-2].startswith('if __name__ == "__main__":')  # the lesson's last cell runs it
    assert all(not c.get("outputs") for c in nb["cells"] if c["cell_type"] == "code")
    assert [c["id"] for c in nb["cells"]] == [f"cell-{i:02d}" for i in range(len(kinds))]


def test_every_code_line_of_the_lesson_is_in_its_notebook():
    for lesson in LESSONS:
        nb = json.loads(lesson.with_suffix(".ipynb").read_text())
        code = "\n".join("".join(c["source"]) for c in nb["cells"][2:] if c["cell_type"] == "code")
        body = lesson.read_text().split('"""\n', 2)[-1]  # after the docstring
        missing = [line for line in body.splitlines() if line.strip() and not line.startswith("#")]
        assert all(line in code for line in missing), lesson.name


def test_docstring_text_becomes_markdown_word_for_word():
    doc = (
        "Some prose with a*b and <tag and `x*y <b>` kept.\n\n"
        "    python tutorials/01_x.py --fast   # a command\n\n"
        "  col1   col2\n  1.0    2.0\n\n\n  3.0    4.0\nafter\n\n"
        "A HEADING\n---------\nbody with figures/01_x.png in it."
    )
    md = bn.show_figures(bn.prose_to_markdown(doc), set())
    assert md == (
        r"Some prose with a\*b and &lt;tag and `x*y <b>` kept." + "\n\n"
        "```bash\npython tutorials/01_x.py --fast   # a command\n```\n\n"
        "```text\ncol1   col2\n1.0    2.0\n\n\n3.0    4.0\n```\nafter\n\n"
        "## A HEADING\n"
        "body with [figures/01_x.png](figures/01_x.png) in it.\n\n![01_x](figures/01_x.png)"
    )


def test_a_lesson_without_cells_is_refused_with_a_sentence(tmp_path, capsys):
    lesson = tmp_path / "16_new.py"
    lesson.write_text('"""Lesson 16 — new.\n\nExpected output (full mode, measured)\n---\nx\n"""\n')
    assert bn.main([str(lesson)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 16_new.py: a lesson opens with `# %% [markdown]`")
    with pytest.raises(bn.LessonFormatError):
        bn.lesson_notebook(lesson)
