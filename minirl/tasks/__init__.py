"""The built-in tasks (countdown, scratchpad arithmetic, program synthesis, the test fixture) and
a user's dataset files (files.py), each a `minirl.data.Task`; `get_task` builds one by name.

    task = get_task("countdown", max_numbers=5)
    prompt = task.prompt(0, "train")          # deterministic from (task, split, index)

The registry maps names to import paths resolved on use, so importing this package stays cheap
(docs/tasks.md).
"""

from __future__ import annotations

import dataclasses
import importlib

from minirl.data.task_api import Task
from minirl.modeling.tokenizer import CharTokenizer
from minirl.tasks.files import FileReport, FileTask, PromptFile

_REGISTRY = {
    "countdown": "minirl.tasks.countdown:Countdown",
    "arithmetic": "minirl.tasks.arithmetic:Arithmetic",
    "program_synthesis": "minirl.tasks.program_synthesis:ProgramSynthesis",
    "fixture": "minirl.tasks.fixture:Fixture",
}


def list_tasks() -> list[str]:
    return sorted(_REGISTRY)


def get_task(name: str, tokenizer=None, **cfg) -> Task:
    """Build a registered task; keyword arguments are fields of its config dataclass, or
    resources the task declares in `resources` (e.g. program_synthesis's `repository`).
    `tokenizer` encodes its prompts: the run's tokenizer (default: the character tokenizer the
    built-in tasks were designed for).

    Example: `get_task("countdown", max_numbers=5)`.
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(list_tasks())}")
    module, cls_name = _REGISTRY[name].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    fields = {f.name for f in dataclasses.fields(cls.Config)}
    resources = set(getattr(cls, "resources", ()))
    unknown = sorted(set(cfg) - fields - resources)
    if unknown:
        raise ValueError(
            f"task {name!r} has no option(s) {unknown}; options: {sorted(fields | resources)}"
        )
    config = cls.Config(**{k: v for k, v in cfg.items() if k in fields})
    tokenizer = CharTokenizer() if tokenizer is None else tokenizer
    return cls(config, tokenizer=tokenizer, **{k: v for k, v in cfg.items() if k in resources})


__all__ = ["FileReport", "FileTask", "PromptFile", "get_task", "list_tasks"]
