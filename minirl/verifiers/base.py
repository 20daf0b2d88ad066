"""The verifier interface, an adapter for plain functions, and a small registry by name.

A verifier turns rollouts into rewards (DESIGN.md, "Interfaces that must stay narrow"):

    scores = verifier.score(rollouts)        # list[Score], same length and order as rollouts

It reads the model's output from `rollout.text` and what it needs about the task from
`rollout.prompt.meta` (e.g. `meta["answer"]` for math, `meta["tests"]` for code). The one hard
rule: it never raises because of what a model wrote. Unparsable, wrong, slow or hostile output is
reward 0 with a short reason; only a broken verifier set-up (a missing repository, bad config)
is an exception, raised early.

Tasks with their own notion of correctness wrap a function `(text, meta) -> Score | float |
bool` with `CallableVerifier`; `get_verifier("math")` builds a registered verifier by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from minirl.types import Rollout, Score


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


class CallableVerifier:
    """Adapter: a plain function `fn(text, meta) -> Score | float | bool` becomes a Verifier.

    An exception inside `fn` (it may parse model output carelessly) costs that rollout a zero
    reward whose reason names the exception, instead of crashing the batch.
    """

    def __init__(self, fn: Callable[[str, dict[str, Any]], Score | float | bool], name: str = ""):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "callable")

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        scores = []
        for rollout in rollouts:
            try:
                scores.append(as_score(self.fn(rollout.text, dict(rollout.prompt.meta))))
            except Exception as e:  # the function misjudged model output: zero, with the cause
                scores.append(Score(0.0, f"verifier error in {self.name}: {type(e).__name__}: {e}"))
        return scores

    def __repr__(self) -> str:
        return f"CallableVerifier({self.name})"


def _math_factory(**kwargs: Any) -> Verifier:
    from minirl.verifiers.math_verifier import MathVerifier, MathVerifierConfig

    return MathVerifier(MathVerifierConfig(**kwargs))


def _math_verify_factory(workers: int = 2, item_timeout_s: float = 30.0, **kwargs: Any) -> Verifier:
    """The math verifier on math-verify, in a pool of worker processes: its signal timeouts need
    a main thread, and the pool kills a worker that still hangs (minirl/verifiers/math_verifier.py)."""
    from minirl.verifiers.math_verifier import MathVerifier, MathVerifierConfig
    from minirl.verifiers.pool import PoolConfig, VerifierPool

    inner = MathVerifier(MathVerifierConfig(backend="math_verify", **kwargs))
    return VerifierPool(inner, PoolConfig(workers=workers, item_timeout_s=item_timeout_s))


def _code_factory(repository: Any = None, **kwargs: Any) -> Verifier:
    from minirl.verifiers.code_verifier import CodeVerifier, CodeVerifierConfig
    from minirl.verifiers.repository import TestRepository

    if repository is None:
        raise ValueError("get_verifier('code') needs repository=<TestRepository or path>")
    if not isinstance(repository, TestRepository):
        repository = TestRepository(repository)
    return CodeVerifier(repository, CodeVerifierConfig(**kwargs))


# name -> factory(**kwargs) -> Verifier. Built-ins are imported lazily (code pulls in the sandbox).
_FACTORIES: dict[str, Callable[..., Verifier]] = {
    "math": _math_factory, "math_verify": _math_verify_factory, "code": _code_factory}


def register_verifier(name: str, factory: Callable[..., Verifier]) -> None:
    """Make `get_verifier(name, **kwargs)` call `factory(**kwargs)`. Names are unique."""
    if name in _FACTORIES:
        raise ValueError(f"a verifier named {name!r} is already registered")
    _FACTORIES[name] = factory


def verifier_names() -> list[str]:
    return sorted(_FACTORIES)


def get_verifier(name: str, **kwargs: Any) -> Verifier:
    """Build a registered verifier: `get_verifier("math", rel_tol=1e-4)`,
    `get_verifier("code", repository="/data/tests", language="cpp")`."""
    if name not in _FACTORIES:
        raise KeyError(f"unknown verifier {name!r}; registered: {', '.join(verifier_names())}")
    return _FACTORIES[name](**kwargs)
