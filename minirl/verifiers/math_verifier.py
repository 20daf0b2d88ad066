"""The math verifier: reward 1 when the model's final answer equals `meta["answer"]`.

RLAX (Sec. 6.1) notes that answer-only math verification takes tens of milliseconds and can run
in a single thread next to the inference workers; this is that verifier. Extraction and
equivalence live in `math_extract.py` and `math_equal.py`; this file only joins them to the
`Verifier` interface:

    verifier = MathVerifier()                       # or get_verifier("math", rel_tol=1e-4)
    verifier.score(rollouts)  # rollout.text = "... so the answer is \\boxed{1/2}",
                              # rollout.prompt.meta = {"answer": "0.5"}  ->  Score(1.0, "correct")

Rewards are binary (1 correct, 0 otherwise); the reason says why ("no answer found", "wrong
answer: got '3', expected '4'"). Simplified on purpose: no partial credit, no format reward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from minirl.types import Rollout, Score
from minirl.verifiers.math_equal import math_equal
from minirl.verifiers.math_extract import EXTRACT_ORDER, extract_answer


@dataclasses.dataclass(frozen=True)
class MathVerifierConfig:
    extract: str | tuple[str, ...] = "auto"  # "auto" = EXTRACT_ORDER, or method name(s)
    rel_tol: float = 1e-6  # tolerance when either value is inexact (decimals, sqrt, pi)
    use_sympy: bool = True  # symbolic check for answers with variables, if sympy is installed
    sympy_timeout_s: float = 1.0

    def __post_init__(self):
        methods = (self.extract,) if isinstance(self.extract, str) else self.extract
        bad = [m for m in methods if m != "auto" and m not in EXTRACT_ORDER]
        if bad or not methods:
            raise ValueError(f"extract must be 'auto' or names from {EXTRACT_ORDER}, got {bad}")
        if not 0 <= self.rel_tol < 1:
            raise ValueError(f"rel_tol must be in [0, 1), got {self.rel_tol}")
        if self.sympy_timeout_s <= 0:
            raise ValueError(f"sympy_timeout_s must be > 0, got {self.sympy_timeout_s}")


def score_math(text: str, meta: dict[str, Any], config: MathVerifierConfig) -> Score:
    """Score one completion against `meta["answer"]` (a string; numbers are accepted too)."""
    reference = meta.get("answer")
    if isinstance(reference, int | float) and not isinstance(reference, bool):
        reference = str(reference)
    if not isinstance(reference, str) or not reference.strip():
        return Score(0.0, "task has no reference answer (meta['answer'])")
    answer = extract_answer(text or "", config.extract)
    if answer is None:
        return Score(0.0, "no answer found")
    same = math_equal(
        answer,
        reference,
        rel_tol=config.rel_tol,
        use_sympy=config.use_sympy,
        sympy_timeout_s=config.sympy_timeout_s,
    )
    if same:
        return Score(1.0, "correct")
    return Score(0.0, f"wrong answer: got {answer[:60]!r}, expected {reference[:60]!r}")


class MathVerifier:
    """`Verifier` for math-style tasks (`meta["answer"]`)."""

    def __init__(self, config: MathVerifierConfig = MathVerifierConfig()):
        self.config = config

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        scores = []
        for rollout in rollouts:
            try:
                scores.append(score_math(rollout.text, rollout.prompt.meta, self.config))
            except Exception as e:  # a bug here must not cost the run; make it visible instead
                scores.append(Score(0.0, f"math verifier error: {type(e).__name__}: {e}"))
        return scores
