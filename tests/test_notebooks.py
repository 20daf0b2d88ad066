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


def test_a_cell_that_is_not_python_on_its_own_is_refused_with_a_sentence(tmp_path, capsys):
    """A notebook runs cell by cell, so a `# %%` in the middle of a block would split the code
    into cells that are not Python; the builder names the cell instead of writing it."""
    lesson = tmp_path / "16_new.py"
    lesson.write_text(
        '# %% [markdown]\n"""Lesson 16 — new.\n\nExpected output (full mode, measured)\n---\nx\n"""\n'
        "\n# %%\nfor i in range(3):\n    x = i\n# %%\n    y = x\n"
    )
    assert bn.main([str(lesson)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 16_new.py: cell 3, which starts 'y = x', is not valid Python")
    assert "is a `# %%` inside a string or a block?" in err
    assert not lesson.with_suffix(".ipynb").exists()


_FIND_SPEC = importlib.util.find_spec


class _Shell:
    """The one IPython method the set-up cell uses: `%pip ...` becomes run_line_magic, which
    expands `{expressions}` in the user's namespace first (IPython's var_expand)."""

    def __init__(self):
        self.magics, self.user_ns = [], {}

    def run_line_magic(self, name, line):
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        shell.user_ns.update(self.user_ns)
        self.magics.append((name, shell.var_expand(line)))


def _run_setup_cell(monkeypatch, *, minirl: bool, gpu: bool) -> tuple[dict, _Shell]:
    """Run a notebook's set-up cell as IPython would, in tutorials/, on a pretend machine."""
    from IPython.core.inputtransformer2 import TransformerManager

    lesson = LESSONS[0]
    cell = json.loads(lesson.with_suffix(".ipynb").read_text())["cells"][1]
    code = TransformerManager().transform_cell("".join(cell["source"]))
    missing = set() if minirl else {"minirl"}
    plugins = {"jax_cuda12_plugin"} if gpu else set()

    def find_spec(name, *args):
        if name in plugins:
            return object()  # a spec: the plugin "is installed"
        return None if name in missing or name.startswith("jax_cuda") else _FIND_SPEC(name)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(shutil, "which", lambda n: "/x/nvidia-smi" if gpu else None)
    monkeypatch.setattr("sys.argv", ["pytest"])
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.chdir(lesson.parent)
    shell = _Shell()
    namespace = shell.user_ns = {"get_ipython": lambda: shell, "__name__": "__main__"}
    exec(compile(code, "setup-cell", "exec"), namespace)
    return namespace, shell


def test_the_set_up_cell_installs_the_checkout_picks_the_device_and_sets_the_options(
    monkeypatch, capsys
):
    import os
    import sys

    lesson = LESSONS[0]
    ns, shell = _run_setup_cell(monkeypatch, minirl=False, gpu=True)  # a hosted GPU runtime
    assert shell.magics == [("pip", f'install -q -e "{ROOT}"')]
    assert sys.path[0] == str(ROOT) and os.environ["JAX_PLATFORMS"] == "cuda"
    assert sys.argv == [str(lesson), "--fast"] and ns["__file__"] == str(lesson)
    ns, shell = _run_setup_cell(monkeypatch, minirl=True, gpu=False)  # a checkout, a laptop
    assert shell.magics == [] and os.environ["JAX_PLATFORMS"] == "cpu"
    assert f"{lesson.name}: JAX will run on 'cpu'" in capsys.readouterr().out
