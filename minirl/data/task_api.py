"""The `Task` interface, the counter-based generation helpers tasks are written with, and
`TaskRouter` (one verifier for several tasks). The built-in tasks and `get_task` are in
minirl/tasks/.

A built-in task is a deterministic function from `(split, index)` to a `Prompt`, plus what
training needs around it:

  task.name                         "countdown", "arithmetic", ...
  task.config                       small frozen dataclass of difficulty knobs
  task.prompt(index, split)         -> Prompt   (deterministic; no downloads, no state)
  task.demonstration(prompt)        -> str      the completion text a supervised warm-start may
                                                train on (EOS not included), see docs/tasks.md
  task.verifier.score(rollouts)     -> list[Score]   reads `rollout.text`; never raises on bad
                                                model output (zero reward with a reason)
  task.max_new_tokens               an upper bound on the length of a good completion (+ EOS)

Determinism (docs/design.md, "Rules every part keeps"): every random draw about a prompt comes from a
Philox stream keyed on a stable hash of (task, split, index, attempt) — never on how many draws
happened before — so prompt 1234 is the same prompt in every process, on every run.

Held-out split, disjoint BY CONTENT: a problem's split is a pure function of its content
(`split_of(task, content)`: a hash bucket, `test_fraction` of the buckets are "test"). To draw
prompt `index` of a split, the generator draws candidates from the streams (split, index, 0),
(split, index, 1), ... and keeps the first whose content falls in that split. So a test problem
can never appear in training, whatever the indices — the property a held-out split needs.

Simplification on purpose: tasks are plain classes (no inheritance).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from minirl.data.verifier_api import Verifier
from minirl.types import Prompt, Rollout, Score

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
MAX_ATTEMPTS = 10_000  # candidate draws before a split is declared (nearly) empty


@runtime_checkable
class Task(Protocol):
    name: str
    config: Any
    verifier: Verifier

    @property
    def max_new_tokens(self) -> int: ...

    def prompt(self, index: int, split: str = "train") -> Prompt: ...

    def demonstration(self, prompt: Prompt, sample: int = 0) -> str: ...


# ----------------------------------------------------------------------------- hashing / RNG


def _digest(parts: tuple, size: int) -> bytes:
    # json of a list is canonical and unambiguous for str/int/float/bool/None and nesting.
    blob = json.dumps(list(parts), separators=(",", ":"), sort_keys=True).encode()
    return hashlib.blake2b(blob, digest_size=size).digest()


def stable_hash(*parts) -> int:
    """A 63-bit non-negative int from JSON-able parts; identical in every process and run."""
    return int.from_bytes(_digest(parts, 8), "little") >> 1


def stream(*parts) -> np.random.Generator:
    """A fresh counter-based numpy Generator (Philox, 128-bit key) for the given key parts."""
    return np.random.Generator(np.random.Philox(key=int.from_bytes(_digest(parts, 16), "little")))


def fingerprint(config) -> str:
    """A short stable string for a frozen dataclass config (part of prompt uids)."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return _digest((type(config).__name__, repr(sorted(fields.items()))), 6).hex()


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


def check_index(index) -> int:
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError(f"prompt index must be a non-negative int, got {index!r}")
    return int(index)


def split_of(task_name: str, content: Hashable, test_fraction: float) -> str:
    """Which split a problem belongs to: a pure function of its content."""
    bucket = stable_hash("split", task_name, repr(content)) % 1_000_000
    return "test" if bucket < round(test_fraction * 1_000_000) else "train"


def draw_in_split(
    task_name: str,
    split: str,
    index: int,
    test_fraction: float,
    draw: Callable[[np.random.Generator], Any],
    content: Callable[[Any], Hashable],
):
    """Draw problem `index` of `split`: the first candidate (attempt 0, 1, ...) whose content
    hashes into `split`. Each attempt has its own counter-based stream."""
    check_split(split)
    for attempt in range(MAX_ATTEMPTS):
        problem = draw(stream(task_name, split, index, attempt))
        if split_of(task_name, content(problem), test_fraction) == split:
            return problem
    raise RuntimeError(
        f"{task_name}: no {split} problem found in {MAX_ATTEMPTS} draws for index {index}; "
        "the problem space is too small for this test_fraction — widen the config"
    )


def make_prompt(
    task_name: str, config, split: str, index: int, text: str, meta: dict, tokenizer
) -> Prompt:
    """A Prompt with a stable 63-bit uid from (task name, config fingerprint, split, index),
    its text encoded by `tokenizer` (the run's own, handed to the task by `get_task`)."""
    uid = stable_hash("prompt", task_name, fingerprint(config), split, index)
    return Prompt(uid=uid, task=task_name, text=text, tokens=tokenizer.encode(text), meta=meta)


def check_fraction(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {value}")


# ----------------------------------------------------------------------------- routing


class TaskRouter:
    """One verifier for a mixture of tasks: routes each rollout by `rollout.prompt.task`.

    `TaskRouter({"countdown": task.verifier, "gsm8k": math_verifier})`. Order is preserved; each
    verifier sees one batched call. An unknown task name is a configuration error (raises).
    """

    def __init__(self, verifiers: dict[str, Verifier]):
        self.verifiers = dict(verifiers)

    @classmethod
    def for_tasks(cls, tasks: Sequence[Task], **extra: Verifier) -> TaskRouter:
        return cls({**{t.name: t.verifier for t in tasks}, **extra})

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        by_task: dict[str, list[int]] = {}
        for i, r in enumerate(rollouts):
            by_task.setdefault(r.prompt.task, []).append(i)
        missing = sorted(set(by_task) - set(self.verifiers))
        if missing:
            raise ValueError(f"no verifier for task(s) {missing}; have {sorted(self.verifiers)}")
        out: list[Score | None] = [None] * len(rollouts)
        for task, idx in by_task.items():
            scores = self.verifiers[task].score([rollouts[i] for i in idx])
            for i, s in zip(idx, scores, strict=True):
                out[i] = s
        return out  # type: ignore[return-value]
