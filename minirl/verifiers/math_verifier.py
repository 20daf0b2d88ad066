"""The math verifier: reward 1 when the model's final answer equals `meta["answer"]`.

RLAX (Sec. 6.1) notes that answer-only math verification takes tens of milliseconds and can run
in a single thread next to the inference workers; this is that verifier. Extraction and
equivalence live in `math_extract.py` and `math_equal.py`; this file only joins them to the
`Verifier` interface:

    verifier = MathVerifier()                       # or get_verifier("math", rel_tol=1e-4)
    verifier.score(rollouts)  # rollout.text = "... so the answer is \\boxed{1/2}",
                              # rollout.prompt.meta = {"answer": "0.5"}  ->  Score(1.0, "correct")

Rewards: 1 correct, `format_reward` (default 0) for a wrong answer that was at least found
(a final answer in the expected form), 0 otherwise; the reason says why ("no answer found",
"wrong answer: got '3', expected '4'"). No partial credit. An answer the checker could not
decide within its bounds (e.g. `(x-1)^{500}(x+1)^{500}` against `(x^2-1)^{500}`: no probe point
has a value that fits, and simplify runs out of its 1 s) is "undecided: <why>", never "wrong
answer"; it is rewarded like a found answer that is not shown correct (`format_reward`), since a
reward for an unchecked answer would be one for answers that are merely hard to check. Only
the last `max_chars` characters of a completion are read; when a completion is longer, a
reason other than "correct" says so.

Two backends judge equivalence, and `backend` picks one:
  "builtin"      minirl's own extraction and comparison (math_extract.py, math_equal.py): pure
                 Python with bounded work, safe in any thread, no extra dependency. The default.
  "math_verify"  the `math-verify` library (the `math` extra), which MATH/GSM8K graders use. It
                 bounds its work with signal.alarm timeouts, which only work in a process's main
                 thread, and without them hostile answers hang it (measured: `9^9^...` towers and
                 15 nested braces run for seconds to minutes). So it refuses to score off the
                 main thread (zero reward, saying why): run it in a `VerifierPool`, whose worker
                 processes score in their main thread and are killed past `item_timeout_s`.
Agreement of the two on generated answers: experiments/math_checker_agreement.py, quoted in
docs/verifiers.md, which also says why builtin is the default.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from minirl.configlib import optional_import
from minirl.data.verifier_api import safe_scores
from minirl.types import Rollout, Score
from minirl.verifiers.math_equal import Undecided, judge_equal
from minirl.verifiers.math_extract import EXTRACT_ORDER, extract_answer


@dataclasses.dataclass(frozen=True)
class MathVerifierConfig:
    extract: str | tuple[str, ...] = "auto"  # "auto" = EXTRACT_ORDER, or method name(s)
    # relative tolerance, only where exactness is impossible: an inexact value (sqrt, pi, sin)
    # or a decimal rounding a fraction like 1/3. Exact values compare exactly (docs/verifiers.md)
    rel_tol: float = 1e-6
    use_sympy: bool = True  # symbolic check for answers with variables, if sympy is installed
    sympy_timeout_s: float = 1.0  # sympy's time budget for one answer (tuples included)
    backend: str = "builtin"  # "builtin" | "math_verify" (the math-verify library; see above)
    format_reward: float = 0.0  # reward of a wrong answer that was found in the expected form
    math_verify_timeout_s: int = 2  # math-verify's own parse and verify timeouts (main thread)
    max_chars: int = 4000  # only the completion's last max_chars characters are read

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not 0.0 <= self.format_reward < 1.0:
            raise ValueError(f"format_reward must be in [0, 1), got {self.format_reward}")
        if self.math_verify_timeout_s < 1 or self.max_chars < 1:
            raise ValueError("math_verify_timeout_s and max_chars must be >= 1")
        methods = (self.extract,) if isinstance(self.extract, str) else self.extract
        bad = [m for m in methods if m != "auto" and m not in EXTRACT_ORDER]
        if bad or not methods:
            raise ValueError(f"extract must be 'auto' or names from {EXTRACT_ORDER}, got {bad}")
        if not 0 <= self.rel_tol < 1:
            raise ValueError(f"rel_tol must be in [0, 1), got {self.rel_tol}")
        if self.sympy_timeout_s <= 0:
            raise ValueError(f"sympy_timeout_s must be > 0, got {self.sympy_timeout_s}")


BACKENDS = ("builtin", "math_verify")


def score_math(text: str, meta: dict[str, Any], config: MathVerifierConfig) -> Score:
    """Score one completion against `meta["answer"]` (a string; numbers are accepted too)."""
    reference = meta.get("answer")
    if isinstance(reference, int | float) and not isinstance(reference, bool):
        reference = str(reference)
    if not isinstance(reference, str) or not reference.strip():
        return Score(0.0, "task has no reference answer (meta['answer'])")
    text = text or ""
    cut = (
        f" (only the last {config.max_chars} of its {len(text)} characters were read)"
        if len(text) > config.max_chars
        else ""
    )
    text = text[-config.max_chars :]
    judge = _builtin if config.backend == "builtin" else _math_verify
    found, same = judge(text, reference, config)
    if found is None:
        return Score(0.0, "no answer found" + cut)
    if same is True:
        return Score(1.0, "correct")
    if isinstance(same, Undecided):
        return Score(config.format_reward, f"undecided: {same.why}; got {found[:60]!r}" + cut)
    return Score(
        config.format_reward,
        f"wrong answer: got {found[:60]!r}, expected {reference[:60]!r}" + cut,
    )


def _builtin(
    text: str, reference: str, config: MathVerifierConfig
) -> tuple[str | None, bool | Undecided]:
    answer = extract_answer(text, config.extract)
    if answer is None:
        return None, False
    return answer, judge_equal(
        answer,
        reference,
        rel_tol=config.rel_tol,
        use_sympy=config.use_sympy,
        sympy_timeout_s=config.sympy_timeout_s,
    )


def _math_verify(text: str, reference: str, config: MathVerifierConfig) -> tuple[str | None, bool]:
    from math_verify import parse, verify  # the optional "math" extra

    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "math-verify's timeouts need the main thread; score it in a VerifierPool"
        )
    t = config.math_verify_timeout_s
    gold = parse(
        reference if "$" in reference or "\\boxed" in reference else f"${reference}$",
        parsing_timeout=t,
    )
    answer = parse(text, parsing_timeout=t)
    if not answer:
        return None, False
    return str(answer[-1]), bool(verify(gold, answer, timeout_seconds=t))


class MathVerifier:
    """`Verifier` for math-style tasks (`meta["answer"]`)."""

    def __init__(self, config: MathVerifierConfig = MathVerifierConfig()):
        if config.backend == "math_verify":  # say so now, not as a zero reward per rollout
            optional_import("math_verify", "math", "the math verifier's math_verify backend")
        self.config = config

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        return safe_scores(
            lambda r: score_math(r.text, r.prompt.meta, self.config),
            rollouts,
            "math verifier error",
        )
