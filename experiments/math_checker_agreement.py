"""Do minirl's own math checker and `math-verify` agree? One table, one command.

    python experiments/math_checker_agreement.py            # the table (about a minute)
    python experiments/math_checker_agreement.py --show 20  # and the disagreements

The same (completion, gold answer) pairs are scored by the `math` verifier's two backends:
`builtin` (minirl/verifiers/math_extract.py + math_equal.py: extraction, a whitelisted LaTeX
parser, exact rationals, a tolerance for irrationals, sympy for symbols) and `math_verify` (the
`math-verify` library that graders of MATH / GSM8K-style answers use, run with its own
timeouts in this main thread). The pairs are generated here, deterministically, in the forms
models write answers in: GSM8K integers (with thousands separators, units, dollar signs,
`#### x`, "the answer is x"), fractions and decimals, LaTeX (`\\frac`, `\\dfrac`, `\\sqrt`,
`\\pi`, `\\text{}`, degrees, percentages), negative numbers, intervals, sets, expressions with
variables and equations, each once correct and once wrong, plus answers with no final answer.
Ground truth is how each pair was made.

What it prints: per category, how many pairs each backend gets right against the ground truth,
and how many times the two backends disagree. docs/verifiers.md quotes the result.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from minirl.types import Prompt, Rollout
from minirl.verifiers.math_verifier import MathVerifier, MathVerifierConfig


def cases(seed: int = 0) -> list[tuple[str, str, str, bool]]:
    """(category, completion, gold, correct?) — correct by construction."""
    rng = np.random.default_rng(seed)
    out = []

    def add(category, right, wrong, gold, wraps):
        for wrap in wraps:
            out.append((category, wrap(right), gold, True))
            out.append((category, wrap(wrong), gold, False))

    boxed = lambda a: f"We compute step by step. So the answer is $\\boxed{{{a}}}$."
    hashed = lambda a: f"3 + 4 = 7 apples.\n#### {a}"
    phrase = lambda a: f"Adding them up, the answer is {a}."
    for _ in range(12):
        n = int(rng.integers(1000, 2_000_000))
        add("integer, separators", f"{n:,}", f"{n + 7:,}", str(n), [boxed, hashed, phrase])
        add("integer, dollars/units", f"\\${n}", f"\\${n - 3}", str(n), [boxed])
        add(
            "integer, units text",
            f"{n} \\text{{ apples}}",
            f"{n + 1} \\text{{ apples}}",
            str(n),
            [boxed],
        )
        p, q = (int(x) for x in rng.integers(2, 40, 2))
        if p % q:
            add(
                "fraction vs decimal",
                f"\\frac{{{p}}}{{{q}}}",
                f"\\frac{{{p + 1}}}{{{q}}}",
                f"{p / q:.6g}" if len(f"{p / q:.6g}") < 6 else f"{p}/{q}",
                [boxed],
            )
            add(
                "dfrac vs frac",
                f"\\dfrac{{{p}}}{{{q}}}",
                f"\\dfrac{{{q}}}{{{p}}}",
                f"\\frac{{{p}}}{{{q}}}",
                [boxed],
            )
        k = int(rng.integers(2, 30))
        add("negative", f"-{k}", f"{k}", f"-{k}", [boxed, hashed])
        add("percent", f"{k}\\%", f"{k + 5}\\%", f"{k}", [boxed])
        add("degrees", f"{k * 5}^\\circ", f"{k * 5 + 10}^\\circ", f"{k * 5}", [boxed])
        add("sqrt", f"{k}\\sqrt{{2}}", f"{k}\\sqrt{{3}}", f"\\sqrt{{{2 * k * k}}}", [boxed])
        add("pi", f"\\frac{{{k}\\pi}}{{2}}", f"\\frac{{{k}\\pi}}{{3}}", f"{k}\\pi/2", [boxed])
        a, b = sorted(int(x) for x in rng.integers(-9, 9, 2))
        add("interval", f"[{a}, {b + 1})", f"({a}, {b + 1}]", f"[{a},{b + 1})", [boxed])
        add(
            "set", f"\\{{{a}, {b + 1}\\}}", f"\\{{{a}, {b + 2}\\}}", f"\\{{{b + 1},{a}\\}}", [boxed]
        )
        add("expression", f"{k}x + {k * 2}", f"{k}x + {k * 3}", f"{k}(x + 2)", [boxed])
        add("equation", f"x = {k}", f"x = {k + 1}", f"{k}", [boxed])
        out.append(("no answer", "I am not sure how to solve this.", str(k), False))
    return out


def score_all(pairs, backend: str) -> list[bool]:
    verifier = MathVerifier(MathVerifierConfig(backend=backend))
    rollouts = [
        Rollout(
            Prompt(i, "m", "", np.zeros(0, np.int32), {"answer": gold}),
            0,
            np.zeros(0, np.int32),
            np.zeros(0, np.float32),
            np.zeros(0, np.int32),
            "eos",
            text=text,
        )
        for i, (_, text, gold, _) in enumerate(pairs)
    ]
    return [s.reward >= 1.0 for s in verifier.score(rollouts)]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=0, help="print this many disagreements")
    args = p.parse_args(argv)
    pairs = cases(args.seed)
    results, seconds = {}, {}
    for backend in ("builtin", "math_verify"):
        t0 = time.perf_counter()
        results[backend] = score_all(pairs, backend)
        seconds[backend] = time.perf_counter() - t0
    rows = defaultdict(lambda: [0, 0, 0, 0])  # pairs, builtin right, math_verify right, disagree
    shown = []
    for (category, text, gold, truth), a, b in zip(
        pairs, results["builtin"], results["math_verify"], strict=True
    ):
        row = rows[category]
        row[0] += 1
        row[1] += a == truth
        row[2] += b == truth
        row[3] += a != b
        if a != b and len(shown) < args.show:
            shown.append(
                f"  [{category}] gold {gold!r}: builtin {a}, math_verify {b} <- {text[-60:]!r}"
            )
    total = [sum(r[i] for r in rows.values()) for i in range(4)]
    print(f"{'category':26s} {'pairs':>5s} {'builtin':>8s} {'math_verify':>11s} {'disagree':>8s}")
    for category, r in [*rows.items(), ("ALL", total)]:
        print(f"{category:26s} {r[0]:5d} {r[1]:8d} {r[2]:11d} {r[3]:8d}")
    print(f"seconds: builtin {seconds['builtin']:.1f}, math_verify {seconds['math_verify']:.1f}")
    print("\n".join(shown))
    return {"rows": dict(rows), "total": total, "seconds": seconds}


if __name__ == "__main__":
    main()
