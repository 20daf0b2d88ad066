"""Is a candidate answer mathematically the same as the reference? (`math_equal`)

Both strings are first normalised (`math_extract.normalize_answer`); equal strings are equal.
Otherwise, in this order:

  1. Sequences. `(1, 2)`, `[0, 1)`: brackets must match (no brackets == round brackets) and the
     elements are compared one by one, in order. Equations `y = 2x` compare side by side.
  2. Parsing (`math_parse.py`). LaTeX is rewritten into Python syntax, parsed with `ast.parse`
     and walked by a whitelist evaluator — numbers, `+ - * / **`, `sqrt`, `sin`..., `pi`, `e`,
     one-letter symbols. Nothing is ever passed to `eval()` (sympy's `parse_expr` uses eval, so
     it is not used either: sympy objects are built from the same whitelisted tree).
  3. Numbers (no symbols). Integers, decimals and fractions evaluate exactly with
     `fractions.Fraction`, and two exact values are equal only if identical (1000000 != 1000001,
     1000001.0 != 1000000, 0.5 == 1/2). The tolerance `rel_tol` (default 1e-6: equal when
     |a - b| <= rel_tol * max(|a|, |b|)) applies only where a value cannot be written exactly:
     when either side is inexact (sqrt, pi, sin, a fractional power: "3.14159265" == "\\pi",
     "3.14" != it), or when a decimal is compared with a fraction that has no finite decimal
     (1/3, 2/7), which a decimal can only round ("0.3333333" == "1/3", "0.333" != it).
     A value lost in floating point (overflow, underflow, cancellation) or too large to hold
     exactly is never equal to anything (guards in `math_parse.py`).
  4. Expressions with symbols. A probe evaluates both at six fixed rational points: exactly
     where it can (polynomials, rational functions), as checked floats otherwise (agreement
     within 1e-8 relative); a point where either side cannot be evaluated tells nothing. A
     disagreement is a fast "not equal". Then, if sympy is importable and `use_sympy`,
     `simplify(a - b) == 0` decides, timeboxed (SIGALRM, main thread only; `sympy_timeout_s`
     is the budget of one `math_equal` call, sequences included); without sympy or on timeout
     the probe decides, and it needs two agreeing points. With fewer, the comparison is
     undecided (`judge_equal` returns `Undecided(why)`, e.g. "budget exhausted"; `math_equal`
     reads it as not shown equal, and the math verifier reports it as its own verdict).
  5. Words (two or more letters only: "Yes", "north") and anything unparsable compare as
     case-insensitive strings ("Yes" == "yes", "B" == "(B)"); so "xy" is a word, not x*y.

Answers longer than MAX_CHARS (400) characters only compare as strings; huge powers and other
overflows are "not equal" (guards in `math_parse.py`). So every verdict comes in bounded time,
in the calling thread: normalisation is linear in the length, and what is evaluated is short.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import signal
import threading
import time
from fractions import Fraction
from typing import Any

from minirl.verifiers.math_extract import normalize_answer
from minirl.verifiers.math_parse import (
    MAX_CHARS,
    Unsupported,
    evaluate,
    exact_power_fits,
    free_symbols,
    literal_value,
    parse_expression,
    to_float,
)

_WORD_RE = re.compile(r"^(?!(?:pi|e)$)[a-zA-Z]{2,}$")
_PROBE_VALUES = tuple(Fraction(v) for v in "0.5377 1.8339 -2.2588 0.8622 0.3188 1.3077".split())
_PROBE_REL_TOL = 1e-8


class _Timeout(Exception):
    pass


def close(a: Fraction | float, b: Fraction | float, rel_tol: float) -> bool:
    """|a - b| <= rel_tol * max(|a|, |b|), in floating point. A value a float cannot hold
    raises Unsupported (so inf == inf or nan never count as close)."""
    fa, fb = to_float(a), to_float(b)
    return abs(fa - fb) <= rel_tol * max(abs(fa), abs(fb))


def has_finite_decimal(x: Fraction) -> bool:
    """Can `x` be written as a decimal with finitely many digits (1/8 yes, 1/3 no)? True when
    the denominator divides a power of 10, which `10^bits mod d` tells without a loop."""
    d = x.denominator
    return pow(10, d.bit_length(), d) == 0


def numbers_equal(
    a: Fraction | float,
    b: Fraction | float,
    rel_tol: float,
    a_decimal: bool = False,
    b_decimal: bool = False,
) -> bool:
    """Equality of two values (rule 3 of the module docstring). `a_decimal` / `b_decimal`: that
    side is written with a decimal point, so it may round a fraction like 1/3."""
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        if a == b:
            return True
        a_rounds_b = a_decimal and not has_finite_decimal(b)
        b_rounds_a = b_decimal and not has_finite_decimal(a)
        if not (a_rounds_b or b_rounds_a):
            return False  # two exact values, and neither can be a rounding of the other
    try:
        return close(a, b, rel_tol)
    except Unsupported:
        return False


def probe_equal(ta: tuple, tb: tuple, symbols: set[str]) -> bool | None:
    """Compare two expressions at fixed rational points (one value per symbol per point):
    exactly when both values are exact, within _PROBE_REL_TOL when either is a float. A point
    where either side has no value (outside its domain, too large, lost in floating point)
    is skipped. None when fewer than two points are left."""
    names, agreed = sorted(symbols), 0
    for k in range(len(_PROBE_VALUES)):
        env = {s: _PROBE_VALUES[(k + 2 * j) % len(_PROBE_VALUES)] for j, s in enumerate(names)}
        try:
            va, vb = evaluate(*ta, env), evaluate(*tb, env)
            exact = isinstance(va, Fraction) and isinstance(vb, Fraction)
            same = va == vb if exact else close(va, vb, _PROBE_REL_TOL)
        except Unsupported:
            continue
        if not same:
            return False
        agreed += 1
    return True if agreed >= 2 else None


# ------------------------------------------------------------------------------ sympy (optional)


def _to_sympy(tree: ast.Expression, src: str, sp: Any):
    """Build a sympy expression from a checked tree — no parse_expr, no eval."""
    funcs = {
        "sqrt": sp.sqrt,
        "sin": sp.sin,
        "cos": sp.cos,
        "tan": sp.tan,
        "log": sp.log,
        "ln": sp.log,
        "exp": sp.exp,
        "abs": sp.Abs,
    }

    def go(node: ast.AST):
        if isinstance(node, ast.Constant):
            value = literal_value(node, src)
            return sp.Rational(value.numerator, value.denominator)
        if isinstance(node, ast.Name):
            if node.id == "pi":
                return sp.pi
            return sp.E if node.id == "e" else sp.Symbol(node.id)
        if isinstance(node, ast.UnaryOp):
            v = go(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Call):
            return funcs[node.func.id](go(node.args[0]))
        a, b = go(node.left), go(node.right)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.Div):
            return a / b
        if b.is_number and abs(b) > 1000:
            raise Unsupported("exponent too large for symbolic comparison")
        if a.is_Rational and b.is_Integer and not exact_power_fits(Fraction(a.p, a.q), int(b)):
            raise Unsupported("exact power too large")  # sympy would compute it, uninterruptibly
        return a**b

    return go(tree.body)


def _import_sympy():
    try:
        import sympy
    except ImportError:
        return None
    return sympy


def sympy_equal(ta: tuple, tb: tuple, timeout_s: float) -> bool | str:
    """simplify(a - b) == 0, or, when sympy cannot decide, a string saying why: sympy is
    missing, fails, runs past `timeout_s`, or is called off the main thread (the timebox uses
    SIGALRM, which only the main thread receives)."""
    sp = _import_sympy()
    if sp is None:
        return "sympy is not installed"
    if threading.current_thread() is not threading.main_thread():
        return "the symbolic check runs on the main thread only"

    def on_alarm(signum, frame):
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:  # the timer starts inside: a budget of microseconds may fire at once
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        return bool(sp.simplify(_to_sympy(*ta, sp) - _to_sympy(*tb, sp)) == 0)
    except _Timeout:
        return "budget exhausted: the symbolic check ran out of its time (sympy_timeout_s)"
    except Unsupported as e:
        return f"too large for the symbolic check ({e})"
    except Exception as e:  # sympy can raise nearly anything on odd input
        return f"the symbolic check failed ({type(e).__name__})"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------- comparison


def _split_sequence(s: str) -> tuple[str, list[str]]:
    """("()", ["1", "2"]) for "(1,2)"; ("{}", [...]) for a set "\\{1,2\\}"; ("", [s]) for a
    scalar. Brackets count only when the outer pair encloses everything."""
    if s.startswith("\\{") and s.endswith("\\}") and "\\{" not in s[2:-2]:
        return "{}", _split_top(s[2:-2])
    brackets, inner = "", s
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        depth = 0
        for i, ch in enumerate(s):
            depth += ch in "([{"
            depth -= ch in ")]}"
            if depth == 0 and i < len(s) - 1:
                break
        else:
            brackets, inner = s[0] + s[-1], s[1:-1]
    parts = _split_top(inner)
    if len(parts) == 1:
        return "", [s]
    return brackets or "()", parts


def _split_top(inner: str) -> list[str]:
    """`inner` split at commas outside any bracket."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return parts


@dataclasses.dataclass(frozen=True)
class Undecided:
    """A comparison that could not be decided within its bounds (neither "equal" nor "not
    equal"); `why` says which bound. Falsy, so `math_equal` reads it as "not shown equal"."""

    why: str

    def __bool__(self) -> bool:
        return False


def _scalar_equal(
    a: str, b: str, rel_tol: float, use_sympy: bool, deadline: float
) -> bool | Undecided:
    if a == b:
        return True
    if _WORD_RE.match(a) or _WORD_RE.match(b):  # "Yes", "north": words, not products of symbols
        return a.casefold() == b.casefold()
    ta, tb = parse_expression(a), parse_expression(b)
    if ta is None or tb is None:
        return a.casefold() == b.casefold()
    symbols = free_symbols(ta[0]) | free_symbols(tb[0])
    if not symbols:
        try:
            va, vb = evaluate(*ta), evaluate(*tb)
        except Unsupported:
            return False
        return numbers_equal(va, vb, rel_tol, "." in ta[1], "." in tb[1])
    probe = probe_equal(ta, tb, symbols)
    if probe is False:
        return False
    why = "the symbolic check is off"
    if use_sympy and (budget := deadline - time.monotonic()) > 0:
        verdict = sympy_equal(ta, tb, budget)
        if isinstance(verdict, bool):
            return verdict
        why = verdict or "the symbolic check could not decide"
    elif use_sympy:
        why = "budget exhausted: the answer's symbolic time (sympy_timeout_s) was used up"
    if probe:
        return True
    return Undecided(f"too few probe points had a value, and {why}")


def _all_equal(verdicts) -> bool | Undecided:
    """Several element verdicts as one: False if any is False (evaluated lazily, in order),
    else the first Undecided, else True."""
    undecided = None
    for verdict in verdicts:
        if verdict is False:
            return False
        if isinstance(verdict, Undecided) and undecided is None:
            undecided = verdict
    return undecided or True


def _match_unordered(cparts: list[str], rparts: list[str], args) -> bool:
    """Each candidate element equals a different reference element (greedy: set elements are
    distinct values, so the first match is the only one). An undecided pair is no match."""
    left = list(rparts)
    for x in cparts:
        hit = next((i for i, y in enumerate(left) if _scalar_equal(x, y, *args) is True), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def math_equal(
    candidate: str,
    reference: str,
    *,
    rel_tol: float = 1e-6,
    use_sympy: bool = True,
    sympy_timeout_s: float = 1.0,
) -> bool:
    """True if `candidate` and `reference` denote the same answer (rules in the module
    docstring). Never raises on odd input: anything it cannot understand is "not equal" unless
    the normalised strings agree. `sympy_timeout_s` bounds all sympy calls of this one call.
    An undecided comparison is False here; `judge_equal` tells it apart."""
    return (
        judge_equal(
            candidate,
            reference,
            rel_tol=rel_tol,
            use_sympy=use_sympy,
            sympy_timeout_s=sympy_timeout_s,
        )
        is True
    )


def judge_equal(
    candidate: str,
    reference: str,
    *,
    rel_tol: float = 1e-6,
    use_sympy: bool = True,
    sympy_timeout_s: float = 1.0,
) -> bool | Undecided:
    """`math_equal` with its third verdict: True, False, or `Undecided(why)` when the numeric
    probe could not tell and the symbolic check did not decide (its time budget exhausted,
    sympy missing, too large, or off the main thread)."""
    c, r = normalize_answer(candidate or ""), normalize_answer(reference or "")
    if not c or not r:
        return False
    if c == r:
        return True
    if len(c) > MAX_CHARS or len(r) > MAX_CHARS:
        return False
    args = (rel_tol, use_sympy, time.monotonic() + sympy_timeout_s)
    if c.count("=") == 1 and r.count("=") == 1:
        (cl, cr), (rl, rr) = c.split("="), r.split("=")
        return _all_equal(_scalar_equal(x, y, *args) for x, y in ((cl, rl), (cr, rr)))
    (cb, cparts), (rb, rparts) = _split_sequence(c), _split_sequence(r)
    if cb == rb == "{}":  # sets: the same elements in any order
        return len(cparts) == len(rparts) and _match_unordered(cparts, rparts, args)
    if len(cparts) > 1 or len(rparts) > 1:
        if cb != rb or len(cparts) != len(rparts):
            return False
        return _all_equal(_scalar_equal(x, y, *args) for x, y in zip(cparts, rparts, strict=True))
    return _scalar_equal(c, r, *args)
