"""The verifier interface, an adapter for plain functions, and `safe_scores`.

A verifier turns rollouts into rewards (docs/design.md, "Interfaces that stay narrow"):

    scores = verifier.score(rollouts)        # list[Score], same length and order as rollouts

It reads the model's output from `rollout.text` and what it needs about the task from
`rollout.prompt.meta` (e.g. `meta["answer"]` for math, `meta["tests"]` for code). The one hard
rule: it never raises because of what a model wrote. Unparsable, wrong, slow or hostile output is
reward 0 with a short reason; only a broken verifier set-up (a missing repository, bad config)
is an exception, raised early.

Tasks with their own notion of correctness wrap a function `(text, meta) -> Score | float |
bool` with `CallableVerifier`. The verifiers themselves (math, sandboxed code, the worker pool)
are above the core, in minirl/verifiers/; `get_verifier("math")` builds one by name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from minirl.types import Rollout, Score

log = logging.getLogger(__name__)


@runtime_checkable
class Verifier(Protocol):
    """Anything with a batched `score`. Implementations must return one Score per rollout, in
    order, and must not raise on bad model output."""

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]: ...


def as_score(value: Score | float | int | bool) -> Score:
    """Accept the common shorthands a task function may return: a Score, a bool or a number."""
    if isinstance(value, Score):
        return value
    if isinstance(value, bool):
        return Score(1.0 if value else 0.0, "correct" if value else "wrong answer")
    if isinstance(value, int | float):
        return Score(float(value), "")
    raise TypeError(f"a verifier function must return Score, bool or float, got {type(value)}")


def safe_scores(
    score_one: Callable[[Rollout], Score],
    rollouts: Sequence[Rollout],
    prefix: str = "verifier error",
) -> list[Score]:
    """The one rule of every verifier, in one place: apply `score_one` to each rollout, and a
    bug that strange model output triggers becomes a zero reward whose reason names it
    ("<prefix>: ValueError: ..."), logged, never an exception that ends the run."""
    out = []
    for rollout in rollouts:
        try:
            out.append(score_one(rollout))
        except Exception as e:  # noqa: BLE001 - the run must survive any model output
            log.warning("%s on prompt %s: %s: %s", prefix, rollout.prompt.uid, type(e).__name__, e)
            out.append(Score(0.0, f"{prefix}: {type(e).__name__}: {e}"))
    return out


class CallableVerifier:
    """Adapter: a plain function `fn(text, meta) -> Score | float | bool` becomes a Verifier.

    An exception inside `fn` (it may parse model output carelessly) costs that rollout a zero
    reward whose reason names the exception, instead of crashing the batch.
    """

    def __init__(self, fn: Callable[[str, dict[str, Any]], Score | float | bool], name: str = ""):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "callable")

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        return safe_scores(
            lambda r: as_score(self.fn(r.text, dict(r.prompt.meta))),
            rollouts,
            f"verifier error in {self.name}",
        )

    def __repr__(self) -> str:
        return f"CallableVerifier({self.name})"
