"""Math verifier: answer extraction, normalisation and the equivalence table."""

import importlib
import os
import time

import pytest

from minirl.types import Score
from minirl.verifiers import (
    MathVerifier,
    MathVerifierConfig,
    extract_answer,
    math_equal,
    normalize_answer,
)
from minirl.verifiers.math_equal import (
    Undecided,
    _import_sympy,
    judge_equal,
    probe_equal,
    sympy_equal,
)
from minirl.verifiers.math_extract import brace_pairs, match_brace
from minirl.verifiers.math_parse import Unsupported, parse_expression
from minirl.verifiers.math_verifier import score_math

# (candidate, reference, equivalent?) — each row was checked by hand.
EQUIVALENCE_TABLE = [
    # surface forms
    ("1,000", "1000", True),
    ("$1,000$", "1000", True),
    ("1{,}000{,}000", "10^6", True),
    ("3\\,000", "3000", True),
    ("\\!100", "100", True),
    ("1000 dollars", "1000", True),
    ("5 square units", "5", True),
    ("12 \\text{ cm}", "12", True),
    ("\\$12.50", "12.5", True),
    ("50\\%", "50", True),
    ("90^\\circ", "90", True),
    ("90^{\\circ}", "90°", True),
    ("x=5", "5", True),
    ("x = 3", "3", True),
    ("-3", "- 3", True),
    ("(B)", "B", True),
    ("\\text{(A)}", "A", True),
    ("Yes", "yes", True),
    ("\\displaystyle\\frac{1}{3}", "1/3", True),
    # exact rationals and decimals
    ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac12", "1/2", True),
    ("\\tfrac{3}{4}", "0.75", True),
    ("\\frac{10}{4}", "\\frac{5}{2}", True),
    ("2.50", "5/2", True),
    ("0.5", ".5", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\frac{-1}{2}", "-1/2", True),
    ("1e3", "1000", True),
    ("2^{10}", "1024", True),
    ("9\\cdot 3", "27", True),
    ("6 \\times 7", "42", True),
    # irrational values: tolerance
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\sqrt{2}/2", "1/\\sqrt{2}", True),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2", True),
    ("\\sqrt[3]{8}", "2", True),
    ("\\pi/2", "\\frac{\\pi}{2}", True),
    ("3.14159265", "\\pi", True),
    ("0.3333333", "1/3", True),
    ("e^{0}", "1", True),
    ("\\ln(e^{2})", "2", True),
    # sequences and intervals
    ("\\left(1,2\\right)", "(1, 2)", True),
    ("\\left[ 1, 2 \\right]", "[1,2]", True),
    ("(1,2)", "1, 2", True),
    ("[0,1)", "[0, 1)", True),
    ("(\\frac{1}{2}, 3)", "(0.5, 3)", True),
    ("\\{2, 1\\}", "\\{1,2\\}", True),  # a set: any order
    ("\\{\\frac{1}{2}, -3\\}", "\\{-3,0.5\\}", True),
    # expressions with symbols
    ("(x+1)^2", "x^2+2x+1", True),
    ("2x+1", "1+2x", True),
    ("x^2 - 1", "(x-1)(x+1)", True),
    ("\\frac{x}{2}", "0.5x", True),
    ("2\\pi r", "2r\\pi", True),
    ("y = 2x+1", "2x+1", True),
    ("\\sin(x)^2+\\cos(x)^2", "1", True),
    # NOT equivalent
    ("3.14", "\\pi", False),
    ("0.333", "1/3", False),
    ("\\frac{1}{3}", "0.33", False),
    ("\\sqrt{2}", "1.41", False),
    ("1000000", "1000001", False),
    ("-5", "5", False),
    ("1,000", "1", False),
    ("\\frac{1}{2}", "\\frac{1}{3}", False),
    ("2x", "2", False),
    ("x+1", "x-1", False),
    ("x^2", "x^3", False),
    ("x", "y", False),
    ("[0,1)", "(0,1)", False),
    ("(1,2)", "(2,1)", False),
    ("(1,2,3)", "(1,2)", False),
    ("\\{1, 3\\}", "\\{1,2\\}", False),
    ("\\{1\\}", "\\{1,1\\}", False),
    ("5 or 7", "5", False),
    ("12 cm", "13", False),
    ("north", "south", False),
    ("2", "two", False),
    ("", "5", False),
    ("1/0", "0", False),
    ("2^10000", "3", False),
    ("10^{100000}", "1", False),
    ("x^{1000000}", "x", False),
]


def test_table_is_big_and_balanced():
    assert len(EQUIVALENCE_TABLE) >= 60
    assert sum(eq for *_, eq in EQUIVALENCE_TABLE) >= 25
    assert sum(not eq for *_, eq in EQUIVALENCE_TABLE) >= 20


@pytest.mark.parametrize("candidate,reference,expected", EQUIVALENCE_TABLE)
def test_equivalence_table(candidate, reference, expected):
    assert math_equal(candidate, reference) is expected
    assert math_equal(reference, candidate) is expected  # symmetric


@pytest.mark.parametrize(
    "candidate,reference,expected",
    [
        ("(x+1)^2", "x^2+2x+1", True),
        ("x^2 - 1", "(x-1)(x+1)", True),
        ("x+1", "x-1", False),
        ("\\frac{x}{2}", "x/3", False),
    ],
)
def test_symbolic_without_sympy_uses_the_numeric_probe(candidate, reference, expected):
    assert math_equal(candidate, reference, use_sympy=False) is expected


def test_tolerance_is_configurable():
    assert not math_equal("0.333", "1/3")
    assert math_equal("0.333", "1/3", rel_tol=1e-2)
    assert not math_equal("3", "4", rel_tol=0.2)  # exact integers never use the tolerance


# Each pair was once graded equal: a float overflowed, underflowed or cancelled, an exact power
# too large to compute was approximated, or a tolerance was applied to a value written exactly.
LOST_EXACTNESS = [
    ("x^{3000}", "2x^{3000}"),  # the probe's float points: x^3000 is ~1e-194, 0 or inf
    ("x^{3000}", "-x^{3000}"),
    ("x^{10000}", "x^{10001}"),
    ("1000001.0", "1000000"),  # a decimal point used to switch the tolerance on
    ("1.0000001", "1"),
    ("0.3333334", "0.3333333"),
    ("e^{-1000}", "0"),  # underflow
    ("10^{-400}\\pi", "0"),
    ("\\sin(10^{-400})", "0"),
    ("\\frac{1}{\\pi^{400}\\pi^{400}}", "0"),  # overflow to inf, then 1/inf = 0
    ("(\\pi+10^{20})-10^{20}", "0"),  # cancellation
    ("(1+10^{-9})^{10^9}", "e"),  # (1 + 1/n)^n is not e
]


@pytest.mark.parametrize("use_sympy", [True, False])
@pytest.mark.parametrize("candidate,reference", LOST_EXACTNESS)
def test_values_lost_in_floating_point_are_never_equal(candidate, reference, use_sympy):
    assert math_equal(candidate, reference, use_sympy=use_sympy) is False
    assert math_equal(reference, candidate, use_sympy=use_sympy) is False


@pytest.mark.parametrize("use_sympy", [True, False])
@pytest.mark.parametrize(
    "candidate,reference",
    [
        ("x^{3000}", "x^{3000}"),
        ("1000000.0", "1000000"),
        ("0.5", "1/2"),
        ("2/3", "0.6666667"),  # a decimal can only round 2/3: rel_tol applies
        ("x^{400}", "x^{399}x"),  # exact at the probe's rational points
        ("\\ln(1)", "0"),
        ("1^{10^{400}}", "1"),
    ],
)
def test_exact_values_that_are_equal_stay_equal(candidate, reference, use_sympy):
    assert math_equal(candidate, reference, use_sympy=use_sympy) is True
    assert math_equal(reference, candidate, use_sympy=use_sympy) is True


def test_a_decimal_rounds_only_a_fraction_without_a_finite_decimal():
    assert math_equal("0.33", "1/3", rel_tol=0.1)  # 1/3 has no finite decimal: 0.33 rounds it
    assert not math_equal("0.13", "1/8", rel_tol=0.1)  # 1/8 is exactly 0.125
    assert math_equal("0.125", "1/8", rel_tol=0)


def test_sympy_timebox_returns_none_quickly():
    _import_sympy()  # the import is not part of the timebox
    ta, tb = parse_expression("(x+1)^{12}"), parse_expression("(x-1)^{12}+x")
    start = time.monotonic()
    assert sympy_equal(ta, tb, timeout_s=1e-4).startswith("budget exhausted")
    assert time.monotonic() - start < 2.0  # a guard against hangs, not a speed test


def test_an_exhausted_budget_is_undecided_never_a_wrong_answer(make_rollout, monkeypatch):
    """Issue #34: a correct (x-1)^500 (x+1)^500 against (x^2-1)^500 has no probe point whose
    exact value fits, so simplify must decide, and it needs more than its 1 s here. How long
    sympy takes depends on the machine (and its cache), so the test makes it run out of time
    for certain: the verdict is "undecided" with the reason, rewarded like a found answer not
    shown correct (format_reward), never "wrong answer"."""
    candidate, reference = "(x-1)^{500}(x+1)^{500}", "(x^2-1)^{500}"
    ta, tb = parse_expression(candidate), parse_expression(reference)
    assert probe_equal(ta, tb, {"x"}) is None  # no point decides: sympy would have to
    no_sympy = judge_equal(candidate, reference, use_sympy=False)
    assert isinstance(no_sympy, Undecided) and "symbolic check is off" in no_sympy.why
    assert math_equal(candidate, reference, use_sympy=False) is False  # not shown equal
    assert judge_equal("(x^{500}, 2)", f"({candidate}, 3)", use_sympy=False) is False

    module = importlib.import_module("minirl.verifiers.math_equal")
    out_of_time = sympy_equal(parse_expression("(x+1)^{12}"), parse_expression("x"), 1e-9)
    assert out_of_time.startswith("budget exhausted")
    monkeypatch.setattr(module, "sympy_equal", lambda ta, tb, timeout_s: out_of_time)
    verdict = judge_equal(candidate, reference)
    assert isinstance(verdict, Undecided) and "budget exhausted" in verdict.why
    config = MathVerifierConfig(format_reward=0.1)
    text = f"so \\boxed{{{candidate}}}"
    (score,) = MathVerifier(config).score([make_rollout(text, {"answer": reference})])
    assert score.reward == 0.1 and score.reason.startswith("undecided: ")
    assert "budget exhausted" in score.reason and "wrong answer" not in score.reason


def test_a_long_completion_says_only_its_end_was_read():
    digits = "7" * 100_000
    score = score_math(f"\\boxed{{{digits}}}", {"answer": digits}, MathVerifierConfig())
    assert score.reward == 0.0
    assert "(only the last 4000 of its 100008 characters were read)" in score.reason
    assert score_math("\\boxed{7}", {"answer": "7"}, MathVerifierConfig()).reason == "correct"


def test_sympy_timeout_is_the_budget_of_the_whole_answer(monkeypatch):
    """A tuple of symbolic elements shares one sympy budget instead of one per element."""
    budgets = []

    def slow_sympy(ta, tb, timeout_s):
        budgets.append(timeout_s)
        time.sleep(timeout_s)
        return None

    module = importlib.import_module("minirl.verifiers.math_equal")  # not the function
    monkeypatch.setattr(module, "sympy_equal", slow_sympy)
    candidate = "(" + ",".join(f"x+{k}" for k in range(5)) + ")"
    reference = "(" + ",".join(f"{k}+x" for k in range(5)) + ")"
    assert math_equal(candidate, reference, sympy_timeout_s=0.3) is True  # the probe decides
    assert 0 < sum(budgets) <= 0.3


HOSTILE_ANSWERS = [
    "__import__('os').system('touch /tmp/minirl-pwned')",
    "().__class__.__bases__[0].__subclasses__()",
    "lambda: 1",
    "\\frac{",
    "}{",
    "((((((((",
    "\\sqrt[",
    "x**",
    "2^2^2^2^2^2",
    "9" * 399,
    "1" * 5000,
    "(" * 300 + "1" + ")" * 300,
    "\\frac{1}{0}",
    "0^{-1}",
    "(-8)^{1/3}",
    "\\sqrt{-1}",
    "\\log(0)",
    "\\unknowncommand{3}",
    "\x00\x01",
]


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS)
def test_hostile_answers_are_just_wrong(answer):
    start = time.monotonic()
    assert math_equal(answer, "5") is False
    assert math_equal(answer, answer) is True  # identical strings are equal, nothing evaluated
    assert time.monotonic() - start < 5.0  # a guard against hangs, not a speed test
    assert not os.path.exists("/tmp/minirl-pwned")


# Verdicts must come in bounded time, in-process: nothing may build 10^99999999 or scan a long
# text once per brace. The bound is generous (each takes milliseconds); it catches hangs.
HUGE_NUMBERS = [
    "1e99999999",
    "1e-99999999",
    "1e9999999",
    "9^9^9^9",
    "9^{9^{9^{9}}}",
    "10^{10^{10}}",
    "2**99999999",
    "x^{10^{10}}",
    "(10^{1000})^{1000}",
    "x+((10^{1000})^{1000})^{1000}",
]


# A guard against hangs and quadratic work, not a speed test: before the fix these inputs took
# 6 s to forever; now milliseconds (0.17 s at most). Measured in this process's CPU time, not
# wall time, so a machine loaded by other work cannot make it fail (it did, at load 7: 4.3 s).
HANG_GUARD_S = 3.0


@pytest.mark.parametrize("answer", HUGE_NUMBERS)
def test_huge_numbers_get_a_verdict_at_once(answer):
    _import_sympy()  # the one-time import is not part of a verdict
    for candidate, reference, expected in [
        (answer, "5", False),
        ("5", answer, False),
        (answer, answer, True),
    ]:
        start = time.process_time()
        assert math_equal(candidate, reference) is expected
        assert time.process_time() - start < HANG_GUARD_S


LONG_TEXTS = {
    "unclosed boxes": "\\boxed{" * 15_000,
    "nested text": "\\text{" * 15_000 + "1" + "}" * 15_000,
    "unclosed text": "\\text{" * 15_000 + "1",
    "phrase then spaces": "the answer is 1" + " " * 100_000 + "x",
    "bare boxes": "\\boxed" * 15_000,
    "boxed tokens": "\\boxed 1" * 12_000,
    "repeated phrase": "the answer is " * 7_000,
    "hashes": "####\n" * 20_000,
}


@pytest.mark.parametrize("name", LONG_TEXTS)
def test_long_texts_get_a_verdict_at_once(name, make_rollout):
    text = LONG_TEXTS[name]
    verifier = MathVerifier(MathVerifierConfig(max_chars=len(text)))
    for call in [
        lambda: extract_answer(text),
        lambda: normalize_answer(text),
        lambda: math_equal(text, "1"),
        lambda: math_equal("1", text),  # the reference is normalised too
        lambda: verifier.score([make_rollout(text, {"answer": text})]),
    ]:
        start = time.process_time()
        call()
        assert time.process_time() - start < HANG_GUARD_S


@pytest.mark.parametrize(
    "text,mode,expected",
    [
        ("so the result is \\boxed{\\frac{1}{2}}.", "auto", "\\frac{1}{2}"),
        ("\\boxed{1} then fixed: \\boxed{\\{1,\\{2\\}\\}}", "auto", "\\{1,\\{2\\}\\}"),
        ("nested \\boxed{\\sqrt{\\frac{a}{b}}} end", "auto", "\\sqrt{\\frac{a}{b}}"),
        ("\\boxed 5 apples", "auto", "5"),
        ("\\fbox{7}", "auto", "7"),
        ("work...\n#### 1,234\n", "auto", "1,234"),
        ("The answer is 42.", "auto", "42"),
        ("Final answer: $x=3$", "auto", "$x=3$"),
        ("the answer is 3. Wait, the answer is 4.", "auto", "4"),
        ("we get 3 and then 7 apples", "auto", "7"),
        ("a loss of -2.5 units", "auto", "-2.5"),
        ("about 3/4 of them", "auto", "3/4"),
        ("no digits here", "auto", None),
        ("", "auto", None),
        ("\\boxed{2} and #### 3", "hash", "3"),
        ("\\boxed{2} and #### 3", "boxed", "2"),
        ("The answer is 9 and 10", "last_number", "10"),
        ("unbalanced \\boxed{3", "auto", "3"),  # falls through to the last number
        ("#### 5\n\\boxed{6}", ("hash", "boxed"), "5"),
    ],
)
def test_extract_answer(text, mode, expected):
    assert extract_answer(text, mode) == expected


def test_extract_answer_rejects_unknown_mode():
    with pytest.raises(ValueError, match="unknown extraction method"):
        extract_answer("1", "magic")


def test_brace_pairs_agrees_with_match_brace():
    """The one-pass matcher against the scan it replaces, on every `{` of random strings."""
    import random

    rng = random.Random(0)
    for _ in range(2000):
        s = "".join(rng.choice("{}{}a") for _ in range(rng.randrange(12)))
        pairs = brace_pairs(s)
        for i, ch in enumerate(s):
            if ch == "{":
                assert pairs.get(i, -1) == match_brace(s, i), (s, i)


@pytest.mark.parametrize(
    "raw,normal",
    [
        ("$1,234$", "1234"),
        ("\\left( 1 , 2 \\right)", "(1,2)"),
        ("\\dfrac{3}{4}", "\\frac{3}{4}"),
        ("\\frac34", "\\frac{3}{4}"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("45^{\\circ}", "45"),
        ("x = 7.", "7"),
        ("10\\%", "10"),
        ("3 meters", "3"),
        ("(C)", "C"),
    ],
)
def test_normalize_answer(raw, normal):
    assert normalize_answer(raw) == normal


@pytest.mark.parametrize(
    "candidate,reference,expected",
    [
        ("\u22123", "-3", True),  # U+2212 minus sign
        ("\u20133", "-3", True),  # en dash used as a minus
        ("\u22123", "3", False),
        ("1\u202f000", "1000", True),  # narrow no-break space as thousands separator
        ("1\u00a0000", "1000", True),
        ("x\u200b+1", "x+1", True),  # zero-width space
        ("2×3", "6", True),
        ("2 · 3", "6", True),
        ("6÷2", "3", True),
        ("\uff11\uff12", "12", True),  # full-width digits
        ("2π", "2\\pi", True),
        ("√2", "\\sqrt{2}", True),
        ("x²", "x2", False),  # superscripts are not mapped to digits
    ],
)
def test_unicode_a_model_types(candidate, reference, expected):
    assert math_equal(candidate, reference) is expected
    assert math_equal(reference, candidate) is expected


def test_a_unicode_minus_is_kept_in_the_last_number():
    config = MathVerifierConfig()
    assert extract_answer("so x = \u22123") == "\u22123"
    assert score_math("so x = \u22123", {"answer": "3"}, config).reward == 0.0
    assert score_math("so x = \u22123", {"answer": "-3"}, config).reward == 1.0


def test_math_verifier_scores_a_batch(make_rollout):
    verifier = MathVerifier()
    rollouts = [
        make_rollout("so \\boxed{\\frac{1}{2}}", {"answer": "0.5"}),
        make_rollout("#### 7", {"answer": "8"}),
        make_rollout("I don't know", {"answer": "3"}),
        make_rollout("the answer is 12", {"answer": 12}),
        make_rollout("\\boxed{1}", {}),
    ]
    scores = verifier.score(rollouts)
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert scores[0] == Score(1.0, "correct")
    assert scores[1].reason == "wrong answer: got '7', expected '8'"
    assert scores[2].reason == "no answer found"
    assert "no reference answer" in scores[4].reason


def test_math_verifier_config_is_validated():
    with pytest.raises(ValueError, match="extract"):
        MathVerifierConfig(extract="everything")
    with pytest.raises(ValueError, match="rel_tol"):
        MathVerifierConfig(rel_tol=-1)
    assert MathVerifier(MathVerifierConfig(extract="hash")).score([]) == []


@pytest.mark.parametrize(
    "answer",
    [
        "__import__('os')",
        "x.real",
        "lambda: 1",
        "[1]",
        "x % 2",
        "x // 2",
        "sqrt",
        "sqrt(1, 2)",
        "x == 1",
        "'1'",
    ],
)
def test_parser_whitelist_rejects_everything_else(answer):
    assert parse_expression(answer) is None


def test_decimals_are_exact_and_functions_are_floats():
    from fractions import Fraction

    from minirl.verifiers.math_parse import evaluate

    assert evaluate(*parse_expression("0.1+0.2")) == Fraction(3, 10)  # not 0.30000000000000004
    assert evaluate(*parse_expression("\\sqrt{\\frac{9}{4}}")) == Fraction(3, 2)  # perfect squares
    assert isinstance(evaluate(*parse_expression("\\sqrt{2}")), float)
    assert evaluate(*parse_expression("2x^2"), {"x": Fraction(1, 2)}) == Fraction(1, 2)


@pytest.mark.parametrize(
    "answer",
    [
        "1e99999999",
        "9^{9^{9}}",
        "(2/3)^{100000}",
        "e^{-1000}",
        "10^{-400}\\pi",
        "(\\pi+10^{20})-10^{20}",
        "(10^{200})^{2}\\pi",
    ],
)
def test_evaluate_refuses_values_too_large_or_lost_in_floating_point(answer):
    from minirl.verifiers.math_parse import evaluate

    with pytest.raises(Unsupported):
        evaluate(*parse_expression(answer))


# ------------------------------------------------------------------------ backends and shaping


def test_format_reward_goes_to_wrong_but_found_answers(make_rollout):
    verifier = MathVerifier(MathVerifierConfig(format_reward=0.1))
    texts = ["so \\boxed{7}", "so \\boxed{8}", "I give up"]
    rewards = [s.reward for s in verifier.score([make_rollout(t, {"answer": "7"}) for t in texts])]
    assert rewards == [1.0, 0.1, 0.0]
    with pytest.raises(ValueError, match="format_reward"):
        MathVerifierConfig(format_reward=1.0)
    with pytest.raises(ValueError, match="backend"):
        MathVerifierConfig(backend="sympy")


CHECKS = [
    ("so \\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
    ("#### 1,234", "1234", 1.0),
    ("the answer is \\boxed{\\{3, 1\\}}", "\\{1,3\\}", 1.0),
    ("\\boxed{x = 4}", "4", 1.0),
    ("\\boxed{5}", "4", 0.0),
    ("no idea", "4", 0.0),
]


@pytest.mark.parametrize("backend", ["builtin", "math_verify"])
def test_both_backends_judge_alike(make_rollout, backend):
    pytest.importorskip("math_verify")
    verifier = MathVerifier(MathVerifierConfig(backend=backend))
    scores = verifier.score([make_rollout(text, {"answer": gold}) for text, gold, _ in CHECKS])
    assert [s.reward for s in scores] == [r for *_, r in CHECKS], [s.reason for s in scores]


def test_math_verify_refuses_off_the_main_thread_and_runs_in_the_pool(make_rollout):
    import threading

    from minirl.verifiers import PoolConfig, VerifierPool

    pytest.importorskip("math_verify")
    verifier = MathVerifier(MathVerifierConfig(backend="math_verify"))
    rollouts = [make_rollout(text, {"answer": gold}) for text, gold, _ in CHECKS]
    out = []
    thread = threading.Thread(target=lambda: out.extend(verifier.score(rollouts[:1])))
    thread.start()
    thread.join()
    assert out[0].reward == 0.0 and "main thread" in out[0].reason  # zero, and why
    # Pool workers score in their own main thread: math-verify's timeouts work there, and an
    # answer that would hang it (a power tower) costs only its item, bounded by the timeouts.
    hostile = make_rollout(
        "\\boxed{9^{9^{9^{9^{9^{9^{9}}}}}}} and " + "{" * 30 + "}" * 30, {"answer": "1"}
    )
    with VerifierPool(verifier, PoolConfig(workers=1, item_timeout_s=20)) as pool:
        t0 = time.perf_counter()
        scores = pool.score([*rollouts, hostile])
        assert time.perf_counter() - t0 < 20
    assert [s.reward for s in scores] == [r for *_, r in CHECKS] + [0.0]
