"""The docs say only what is true of the code: every command, config key, Python snippet, path
and test they name exists as written (README.md, docs/*.md, scale/README.md, tutorials/README.md).

- Commands (`minirl ...`, `python -m scale.launch ...`, `python tutorials/...py ...`, pip extras,
  test paths): tests/doc_commands.py runs each to its `parse_args` and builds its config, in a
  process of its own (scripts set JAX options when imported), a few seconds in all.
- Config keys (`rl.group_size`, `--set engine.exact=true`): the key is one `minirl config` lists,
  and a value given with it is one the key takes.
- Python snippets: what they import exists, and every call of an imported name binds to its
  signature.
- Paths (`minirl/run/loop.py`, `tests/...::test_name`) and test names exist.

Each check is also shown to fail on a made-up line of the kind it exists to catch.
"""

import ast
import functools
import importlib
import inspect
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
from doc_commands import DOCS, ROOT, spans

from minirl.config import RunConfig
from minirl.configlib import ConfigError, describe, override
from minirl.run.presets import PRESETS

KEYS = {key for key, _, _ in describe(RunConfig)}
SECTIONS = "|".join(sorted({key.split(".")[0] for key in KEYS}))
KEY = re.compile(rf"((?:{SECTIONS})\.[a-z_]+)(?:=(.*))?")  # a word of a span: rl.steps(=50)
PLACEHOLDER = re.compile(r"[A-Z_]+|\.\.\.|<\w+>")  # rl.steps=N, model.dim=...
NOT_KEYS = {"task.train", "model.safetensors"}  # FileTask.train; the weights file
ENABLERS = ([], ["model.lora_rank=16"], ["model.num_experts=8"])  # what a knob may need beside it
# Paths the docs name that are not files of the repository: outputs, placeholders, the site.
NOT_FILES = re.compile(r"benchmarks/results|NN_name|minirl/tutorials/|tutorials/\w+\.md|\{")
OLD_PATHS = re.compile(r"<!-- relayout: keep.*?<!-- /relayout: keep -->", re.S)  # README's table
PROBES = {
    "minirl train --no-such-flag": "unrecognized arguments",
    "minirl train --set rl.workers=processes": "must be inprocess or process",
    "minirl config --preset custom": "needs a dataset",
    "minirl diagnose --fast --sources dtype,nope": "no source ['nope']",
    "minirl plan --sweep nope=1,2": "expected KNOB=V1,V2",
    "python -m scale.launch ray --checkpoints /tmp/ck": "need --weights",
    "python tutorials/01_model_and_kv_cache.py --fastest": "unrecognized arguments",
    "python experiments/mismatch.py --set model.dimm=64": "unknown key 'model.dimm'",
    "python experiments/nope.py --fast": "no file experiments/nope.py",
    "pip install -e '.[nope]'": "no extra ['nope']",
    "python -m pytest tests/nope.py": "no such test path",
}


def _docs():
    return [(name, (ROOT / name).read_text()) for name in DOCS]


@pytest.fixture(scope="module")
def commands():
    """tests/doc_commands.py over the docs and the probes, in one process of its own."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "doc_commands.py"), *PROBES],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_every_command_the_docs_show_parses(commands):
    assert commands["checked"] > 250  # the docs' commands were found
    assert not commands["failures"], "\n".join(commands["failures"])


def test_the_command_check_catches_what_it_exists_for(commands):
    for probe, why in PROBES.items():
        assert why in commands["probes"][probe], (probe, commands["probes"][probe])


def key_problems(text: str) -> list[str]:
    """The config keys `text`'s spans name that `minirl config` does not list, and the values
    given them that no preset takes."""
    out = []
    for line, span in spans(text):
        try:
            words = shlex.split(span)
        except ValueError:  # an apostrophe in prose
            words = span.split()
        for word in words:
            match = KEY.fullmatch(word)
            if not match or match.group(1) in NOT_KEYS or word.startswith("task.args"):
                continue
            key, value = match.groups()
            if key not in KEYS:
                out.append(f"{line}: {key} is not a config key ({span!r})")
            elif value and not (PLACEHOLDER.fullmatch(value) or not value.isascii()):
                why = _refused(key, value)
                if why:
                    out.append(f"{line}: {key}={value}: {why}")
    return out


def _refused(key: str, value: str) -> str:
    """Why no preset takes `key=value`, even with a LoRA rank or experts beside it, which
    some knobs need ("" when one does)."""
    why = ""
    for preset in PRESETS.values():
        for extra in ENABLERS:
            try:
                cfg = preset()
                for item in [*extra, f"{key}={value}"]:
                    cfg = override(cfg, item)
                return ""
            except ConfigError as e:
                why = str(e)
    return why


def test_every_config_key_the_docs_name_exists():
    problems = [f"{name}:{p}" for name, text in _docs() for p in key_problems(text)]
    assert not problems, "\n".join(problems)
    made_up = "`rl.workers=processes`, `--set engine.exactt=true`, `rl.group_size=4`"
    assert [p.split(": ")[1] for p in key_problems(made_up)] == [
        "rl.workers=processes",
        "engine.exactt is not a config key ('--set engine.exactt=true')",
    ]


def snippet_problems(code: str) -> list[str]:
    """Imports of a Python snippet that do not resolve, and calls of an imported name (or of
    its attributes, `ModelConfig.preset(...)`) whose arguments its signature does not take."""
    names, out = {}, []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module:
            try:
                module = importlib.import_module(node.module)
            except ImportError as e:
                out.append(f"import {node.module}: {e}")
                continue
            for alias in node.names:
                if not hasattr(module, alias.name):
                    out.append(f"{node.module} has no {alias.name}")
                else:
                    names[alias.asname or alias.name] = getattr(module, alias.name)
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Call):
            continue
        target, attrs = node.func, []
        while isinstance(target, ast.Attribute):
            target, attrs = target.value, [target.attr, *attrs]
        if not isinstance(target, ast.Name) or target.id not in names:
            continue
        obj = names[target.id]
        for attr in attrs:
            obj = getattr(obj, attr, None)
        starred = any(isinstance(a, ast.Starred) for a in node.args)
        if obj is None or starred or any(k.arg is None for k in node.keywords):
            continue
        try:
            signature = inspect.signature(obj)
        except (TypeError, ValueError):
            continue
        try:
            signature.bind(*node.args, **{k.arg: k.value for k in node.keywords})
        except TypeError as e:
            out.append(f"{ast.unparse(node)[:80]}: {e}")
    return out


def test_every_python_snippet_imports_and_calls_what_exists():
    # docs/weights.md imports tests/weightstore_suite.py: tests/ is on sys.path, as for any test
    problems = [
        f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {p}"
        for name, text in _docs()
        for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S)
        for p in snippet_problems(m.group(1))
    ]
    assert not problems, "\n".join(problems)
    made_up = (
        "from minirl.measure.diagnostics import MetricsWriter\n"
        "from minirl.store.weights import InMemoryWeightStore\n"
        "store = InMemoryWeightStore(keep=4, path='x')\n"
    )
    assert [p.split(":")[0] for p in snippet_problems(made_up)] == [
        "minirl.measure.diagnostics has no MetricsWriter",
        "InMemoryWeightStore(keep=4, path='x')",
    ]


@functools.cache
def _test_names() -> frozenset[str]:
    return frozenset(
        name
        for folder in ("tests", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        for name in re.findall(r"def (test_\w+)", path.read_text())
    )


def path_problems(text: str) -> list[str]:
    """Repository paths (minirl/..., tests/...::test_x) and test names the text names that do
    not exist."""
    out = []
    top = r"(?:minirl|scale|tests|tutorials|experiments|benchmarks|docs|tools)"
    for line, content in enumerate(text.split("\n"), 1):
        for path in re.findall(rf"(?<![\w/.:-])({top}/[\w./{{}}-]*\w/?)", content):
            if not NOT_FILES.search(path) and not (ROOT / path).exists():
                out.append(f"{line}: no file {path}")
        for name in re.findall(r"(?<![\w/])(test(?:_[a-z0-9]+){3,})\b", content):
            if name not in _test_names():  # field names like test_setup_code have fewer words
                out.append(f"{line}: no test {name}")
    return out


def test_every_path_and_test_the_docs_name_exists():
    problems = [
        f"{name}:{p}"
        for name, text in _docs()
        for p in path_problems(re.sub(OLD_PATHS, lambda m: "\n" * m.group(0).count("\n"), text))
    ]
    assert not problems, "\n".join(problems)
    made_up = "see minirl/run/nope.py and test_a_thing_that_never_was"
    assert path_problems(made_up) == [
        "1: no file minirl/run/nope.py",
        "1: no test test_a_thing_that_never_was",
    ]
