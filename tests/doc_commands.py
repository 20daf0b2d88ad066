"""The commands the docs tell a user to type, run through their real parsers (tests/test_docs.py).

    doc_commands()          every command of README.md, docs/*.md, scale/README.md and
                            tutorials/README.md: (file, line, text, inline)
    spans(text)             the inline `code` spans of a page: (line, text)
    check(text) -> str      why the command does not parse ("" when it does)
    python tests/doc_commands.py [CMD ...]
                            checks every doc command and each CMD in THIS process, prints JSON

A command is checked as far as it can be without doing its work: `minirl ...`, `python -m
scale.launch ...`, `python -m scale.diagnose ...` and `python path/to/script.py ...` run their
own entry point up to `parse_args`, which is stopped there (no training, no Ray); then the
config they would build is built (`--preset`, `--set`, `--model` ...: an unknown key or a bad
value fails), and the plan/launch checks that run before any work. `python -m pytest PATH`,
`bash FILE.sh` and `python -m PACKAGE.module` need their files; `pip install ".[EXTRA]"` its
extras. Placeholders stay placeholders: `--model DIR` gets a made-up model directory (a
config.json, no weights), `--step N` a number, `...`, `$VAR` and `[`/`]` are dropped and
`--worst|--best` is its first choice. An inline mention that leaves out what a command needs
(`minirl export`, `minirl train --model`) only has to name real flags.

Run in a process of its own: scripts set environment variables and JAX options when imported.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import os
import re
import runpy
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]
DOCS += ["scale/README.md", "tutorials/README.md"]
PROGRAMS = ("minirl", "python", "python3", "bash", "pip")
ENTRY_POINTS = {"minirl.cli": "minirl.cli", "scale.launch": "scale.launch"}
ENTRY_POINTS["scale.diagnose"] = "scale.diagnose"
MENTION = ("the following arguments are required", "expected one argument")
SCRIPT = re.compile(r"(tutorials|experiments|benchmarks)/\w+\.py$")


def doc_commands() -> list[tuple[str, int, str, bool]]:
    """(file, line, command text, inline?) of every candidate command in the docs: the lines of
    non-Python fenced blocks (continuation lines joined, `NAME="..."` assignments expanded into
    later `$NAME`s of the block) and the inline `code` spans."""
    out = []
    for name in DOCS:
        text = (ROOT / name).read_text()
        fence, start, pending, env = None, 0, "", {}
        for i, line in enumerate(text.split("\n"), 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                fence, env = (None if fence is not None else stripped[3:]), {}
                continue
            if fence is None or fence == "python":
                continue
            start = start if pending else i
            if stripped.endswith("\\"):
                pending += stripped[:-1] + " "
                continue
            command, pending = pending + stripped, ""
            if m := re.match(r'^([A-Z_]+)="([^"]*)"$', command):
                env[m.group(1)] = m.group(2)
            for var, value in env.items():
                command = command.replace(f"${var}", value)
            out.append((name, start, command, False))
        out += [(name, line, span, True) for line, span in spans(text)]
    return [c for c in out if _program(c[2]) is not None]


def spans(text: str) -> list[tuple[int, str]]:
    """(line, text) of every inline `code` span outside fenced blocks (one may wrap a line)."""
    outside = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [
        (outside.count("\n", 0, m.start()) + 1, m.group(1).replace("\n", " "))
        for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", outside)
    ]


def _program(text: str) -> str | None:
    """The program a line runs (after VAR=value prefixes), if it is one of ours."""
    words = [w for w in text.split() if not re.match(r"^[A-Z_]+=", w)]
    if not words:
        return None
    if words[0] in PROGRAMS or (SCRIPT.match(words[0]) and len(words) > 1):  # a path alone is
        return words[0]  # a mention of the file
    return None


def words_of(text: str) -> list[list[str]]:
    """The argv of each command in `text` (split at &&, ;, & and |), placeholders made concrete."""
    out, current = [], []
    for word in shlex.split(text, comments=True):
        word = word[1:] if word.startswith("[") else word  # [--step N], not ".[extra]"
        word = word[:-1] if word.endswith("]") and "[" not in word else word
        if word in ("&&", ";", "&", "|"):
            out, current = out + [current], []
        elif word and word not in ("...", "…") and not word.startswith("$"):
            current.append(word.split("|")[0] if word.startswith("-") else word)
    return [_concrete(_without_env(w)) for w in [*out, current] if _without_env(w)]


def _without_env(argv: list[str]) -> list[str]:
    while argv and re.match(r"^[A-Z_]+=", argv[0]):
        argv = argv[1:]
    return argv


_MODEL_DIR: list[str] = []


def model_dir() -> str:
    """A model directory for `--model DIR`: a config.json (the `tiny` preset's) and an empty
    safetensors index, which is all a config is built from."""
    if not _MODEL_DIR:
        from minirl.hf.hf_config import config_to_hf
        from minirl.modeling.model_config import ModelConfig

        path = Path(tempfile.mkdtemp(prefix="minirl-doc-model-"))
        atexit.register(shutil.rmtree, path, ignore_errors=True)
        (path / "config.json").write_text(json.dumps(config_to_hf(ModelConfig.preset("tiny"))))
        (path / "model.safetensors.index.json").write_text('{"weight_map": {}}')
        _MODEL_DIR.append(str(path))
    return _MODEL_DIR[0]


def _concrete(argv: list[str]) -> list[str]:
    from minirl.modeling.model_config import PRESETS

    out = list(argv)
    for i, word in enumerate(out[:-1]):
        value = out[i + 1]
        if word == "--model" or (word == "--teacher" and value not in PRESETS):
            out[i + 1] = model_dir()
        elif word in ("--step", "-n") and not value.isdigit():
            out[i + 1] = "1"
        elif word == "--staleness" and value.isupper():
            out[i : i + 2] = ["", ""]
    return [w for w in out if w]


class _Parsed(BaseException):
    """Raised by the patched `parse_args`: the command parsed; its work is not done."""

    def __init__(self, namespace):
        self.namespace = namespace


def _stop_after_parsing(self, args=None, namespace=None):
    raise _Parsed(_PARSE_ARGS(self, args, namespace))


_PARSE_ARGS = argparse.ArgumentParser.parse_args


def check(text: str, inline: bool = False) -> str:
    """Why a command in `text` does not parse or build its config ("" when all do)."""
    try:
        commands = words_of(text)
    except ValueError as e:
        return f"not a command line: {e}"
    for argv in commands:
        why = _check_argv(argv, inline)
        if why:
            return why
    return ""


def _check_argv(argv: list[str], inline: bool) -> str:
    program, rest = argv[0], argv[1:]
    if program not in PROGRAMS and not SCRIPT.match(program):
        return ""  # another program (mkdocs, jupyter, ray, `. .venv/bin/activate`)
    if program == "pip":
        return _check_extras(rest)
    if program == "bash":
        return "" if not rest or (ROOT / rest[0]).exists() else f"no file {rest[0]}"
    if program in ("python", "python3"):
        if rest[:1] == ["-m"] and len(rest) > 1 and rest[1] not in ENTRY_POINTS:
            return _check_module(rest[1], rest[2:])
        if rest[:1] == ["-m"] and len(rest) > 1:
            return _parse(ENTRY_POINTS[rest[1]], rest[2:], inline)
        if not rest:
            return ""
        program, rest = rest[0], rest[1:]
    if program == "minirl":
        return _parse("minirl.cli", rest, inline)
    if re.search(r"(^|/)[A-Z]{2,}_\w*\.py$", program):
        return ""  # a placeholder: tutorials/NN_name.py
    if not (ROOT / program).exists():
        return f"no file {program}"
    if Path(program).name.startswith("test_"):
        return ""  # a pytest file: its -k and -m are pytest's
    return _parse(str(ROOT / program), rest, inline)


def _check_extras(args: list[str]) -> str:
    section = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    known = set(re.findall(r"^([\w-]+) = \[", section.split("\n[")[0], flags=re.M))
    for word in args:
        for group in re.findall(r"\[([\w,-]+)\]", word):
            unknown = set(group.split(",")) - known
            if unknown:
                return f"no extra {sorted(unknown)} in pyproject.toml (have {sorted(known)})"
    return ""


def _check_module(module: str, args: list[str]) -> str:
    if module == "pytest":
        missing = [a for a in args if "/" in a and not (ROOT / a.split("::")[0]).exists()]
        return f"no such test path {missing}" if missing else ""
    if not (ROOT / module.split(".")[0]).is_dir():
        return ""  # not ours (venv, pip)
    path = ROOT / (module.replace(".", "/") + ".py")
    return "" if path.exists() else f"no module {module} here"


def _parse(target: str, args: list[str], inline: bool) -> str:
    """Run `target`'s entry point (a module name, or a script's path) up to parse_args."""
    saved = (dict(os.environ), list(sys.path), sys.argv)
    stderr = io.StringIO()
    argparse.ArgumentParser.parse_args = _stop_after_parsing
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            if target.endswith(".py"):
                sys.argv, sys.path[:0] = [target, *args], [str(Path(target).parent)]
                runpy.run_path(target, run_name="__main__")
            else:
                __import__(target, fromlist=["main"]).main(args)
        return f"{target} {args}: ran without parsing its arguments" if args else ""
    except _Parsed as parsed:
        return _check_config(target, parsed.namespace)
    except SystemExit as e:
        said = (stderr.getvalue().strip().splitlines() or [""])[-1]
        if e.code in (0, None) or (inline and any(m in said for m in MENTION)):
            return ""
        return f"{Path(target).name} {' '.join(args)}: {said}"
    except Exception as e:  # noqa: BLE001 - what a user would see instead of a parsed command
        return f"{Path(target).name} {' '.join(args)}: {type(e).__name__}: {e}"
    finally:
        argparse.ArgumentParser.parse_args = _PARSE_ARGS
        os.environ.clear()
        os.environ.update(saved[0])
        sys.path[:], sys.argv = saved[1], saved[2]


def _check_config(target: str, args) -> str:
    """What the command checks before its work: the config, plan's numbers, launch's jobs."""
    from minirl.configlib import ConfigError

    try:
        if hasattr(args, "overrides") and hasattr(args, "env") and not getattr(args, "resume", 0):
            from minirl.run.config_args import config_from_args

            fast = getattr(args, "fast", False)
            config_from_args(args, default_preset="fixture" if fast else None)
        elif hasattr(args, "overrides") and hasattr(args, "preset"):  # an experiment's own flags
            from minirl.run.presets import make_config

            make_config(args.preset or "countdown", args.overrides)
        if getattr(args, "sources", None):
            from minirl.diagnose.table import source_names

            unknown = set(args.sources.split(",")) - {*source_names(), "sharding"}
            if unknown:
                return f"--sources: no source {sorted(unknown)}"
        if getattr(args, "role", "") == "ray":
            from scale.ray_run import check_job_arguments

            check_job_arguments(args)
        if getattr(args, "command", "") == "plan":
            from minirl.sim import plan

            plan.check_options(args)
            plan.knobs_of(args)
            if args.sweep:
                plan._sweep(args)
    except (ConfigError, ValueError, OSError) as e:
        return f"{Path(target).name}: {e}"
    return ""


def check_docs() -> tuple[int, list[str]]:
    """(commands checked, "file:line: command -> why" for each that fails)."""
    commands = doc_commands()
    failures = [
        f"{name}:{line}: {text!r} -> {why}"
        for name, line, text, inline in commands
        if (why := check(text, inline))
    ]
    return len(commands), failures


if __name__ == "__main__":
    checked, failures = check_docs()
    probes = {text: check(text) for text in sys.argv[1:]}
    print(json.dumps({"checked": checked, "failures": failures, "probes": probes}))
