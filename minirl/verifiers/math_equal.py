"""Is a candidate answer mathematically the same as the reference? (`math_equal`)

Both strings are first normalised (`math_extract.normalize_answer`); equal strings are equal.
Otherwise, in this order:

  1. Sequences. `(1, 2)`, `[0, 1)`: brackets must match (no brackets == round brackets) and the
     elements are compared one by one, in order. Equations `y = 2x` compare side by side.
  2. Parsing. LaTeX (`\\frac{a}{b}`, `\\sqrt[n]{x}`, `\\pi`, `\\cdot`, `^`, implicit products like
     `2\\pi r`) is rewritten into Python syntax and parsed with `ast.parse(mode="eval")`. The
     tree is walked by a whitelist evaluator — numbers, `+ - * / **`, unary minus, `sqrt`,
     `sin cos tan log ln exp abs`, `pi`, `e` (Euler's number), one-letter symbols. Nothing is
     ever passed to `eval()` (sympy's `parse_expr` uses eval, so it is not used either: sympy
     objects are built from the same whitelisted tree).
  3. Numbers (no symbols). Integers, fractions and decimals evaluate exactly with
     `fractions.Fraction`; two exact values are equal only if identical (1000000 != 1000001).
     If either side is inexact (written as a decimal, or involving sqrt/pi/...), they are equal
     when |a - b| <= rel_tol * max(|a|, |b|) (default 1e-6: "0.3333333" == "1/3", "0.333" != it;
     "3.14159265" == "\\pi", "3.14" != it).
  4. Expressions with symbols. A numeric probe evaluates both at fixed points; a disagreement
     is a fast "not equal". Then, if sympy is importable and `use_sympy`, `simplify(a - b) == 0`
     decides, timeboxed (SIGALRM, main thread only); without sympy or on timeout the probe's
     verdict stands.
  5. Words (two or more letters only: "Yes", "north") and anything unparsable compare as
     case-insensitive strings ("Yes" == "yes", "B" == "(B)"); so "xy" is a word, not x*y.

Resource guards (the input is model-written): answers longer than 400 characters only compare as
strings; integer powers are computed exactly only when the result stays under ~100k bits,
otherwise in floating point (overflow -> "not equal").
"""

from __future__ import annotations

import ast
import math
import re
import signal
import threading
from fractions import Fraction
from typing import Any

from minirl.verifiers.math_extract import match_brace, normalize_answer

MAX_CHARS = 400
_MAX_POW_BITS = 100_000
_FUNCS = ("sqrt", "sin", "cos", "tan", "log", "ln", "exp", "abs")
_CONSTS = ("pi", "e")
_LATEX_COMMANDS = {
    "pi": " pi ",
    "cdot": "*",
    "times": "*",
    "div": "/",
    "sin": " sin",
    "cos": " cos",
    "tan": " tan",
    "ln": " ln",
    "log": " log",
    "exp": " exp",
}
_WORD_RE = re.compile(r"^(?!(?:pi|e)$)[a-zA-Z]{2,}$")
_PROBE_VALUES = (0.5377, 1.8339, -2.2588, 0.8622, 0.3188, 1.3077)


class Unsupported(ValueError):
    """The expression uses something outside the whitelist (or is too large)."""


class _Timeout(Exception):
    pass


# ----------------------------------------------------------------------------------- parsing


def latex_to_python(s: str) -> str:
    """Rewrite a normalised LaTeX-ish answer into Python expression syntax (raises Unsupported)."""
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i) or s.startswith("\\sqrt", i):
            cmd, j = s[i + 1 : i + 5], i + 5
            root = None
            if cmd == "sqrt" and j < len(s) and s[j] == "[":
                k = s.find("]", j)
                if k < 0:
                    raise Unsupported("unclosed \\sqrt[")
                root, j = latex_to_python(s[j + 1 : k]), k + 1
            args = []
            for _ in range(2 if cmd == "frac" else 1):
                if j >= len(s) or s[j] != "{" or (end := match_brace(s, j)) < 0:
                    raise Unsupported(f"\\{cmd} without braces")
                args.append(latex_to_python(s[j + 1 : end - 1]))
                j = end
            if cmd == "frac":
                out.append(f"(({args[0]})/({args[1]}))")
            elif root is not None:
                out.append(f"(({args[0]})**(1/({root})))")
            else:
                out.append(f" sqrt({args[0]})")
            i = j
        elif s[i] == "\\":
            m = re.match(r"[a-zA-Z]+", s[i + 1 :])
            name = next((c for c in sorted(_LATEX_COMMANDS, key=len, reverse=True)
                         if m and m.group(0).startswith(c)), None)  # fmt: skip
            if name is None:
                raise Unsupported(f"unknown command \\{m.group(0) if m else s[i + 1 : i + 2]}")
            out.append(_LATEX_COMMANDS[name])
            i += 1 + len(name)
        else:
            out.append({"{": "(", "}": ")", "^": "**"}.get(s[i], s[i]))
            i += 1
    return "".join(out)


_TOKEN_RE = re.compile(r"\s*(\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|[a-zA-Z]+|\*\*|[-+*/(),]|\S)")


def _insert_products(expr: str) -> str:
    """Make implicit products explicit: `2x` -> `2*x`, `xy` -> `x*y`, `2(x+1)` -> `2*(x+1)`,
    `(a)(b)` -> `(a)*(b)`; known function names and constants stay whole words."""
    tokens: list[str] = []
    for tok in _TOKEN_RE.findall(expr):
        if tok.isalpha():
            while tok:  # split letter runs into known words and one-letter symbols
                word = next((w for w in _FUNCS + _CONSTS if tok.startswith(w)), tok[0])
                tokens.append(word)
                tok = tok[len(word) :]
        else:
            tokens.append(tok)
    out: list[str] = []
    for tok in tokens:
        if out:
            prev = out[-1]
            left = prev == ")" or prev[0].isdigit() or prev[0] == "." or (
                prev.isalpha() and prev not in _FUNCS)  # fmt: skip
            right = tok == "(" or tok[0].isdigit() or tok[0] == "." or tok.isalpha()
            if left and right:
                out.append("*")
        out.append(tok)
    return " ".join(out)


def parse_expression(answer: str) -> tuple[ast.Expression, str] | None:
    """(tree, python source) for a normalised answer, or None if it is not a whitelisted
    expression."""
    if not answer or len(answer) > MAX_CHARS:
        return None
    try:
        src = _insert_products(latex_to_python(answer))
        tree = ast.parse(src, mode="eval")
        _check_nodes(tree.body)
    except (Unsupported, SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tree, src


def _check_nodes(node: ast.AST) -> None:
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, int | float) or isinstance(node.value, bool):
            raise Unsupported("non-numeric constant")
    elif isinstance(node, ast.Name):
        if node.id in _FUNCS or not (node.id in _CONSTS or len(node.id) == 1):
            raise Unsupported(f"name {node.id}")
    elif isinstance(node, ast.BinOp) and isinstance(
        node.op, ast.Add | ast.Sub | ast.Mult | ast.Div | ast.Pow
    ):
        _check_nodes(node.left)
        _check_nodes(node.right)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        _check_nodes(node.operand)
    elif isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id in _FUNCS):
            raise Unsupported("call")
        if len(node.args) != 1 or node.keywords:
            raise Unsupported("call arity")
        _check_nodes(node.args[0])
    else:
        raise Unsupported(type(node).__name__)


def free_symbols(tree: ast.Expression) -> set[str]:
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return names - set(_CONSTS) - set(_FUNCS)


# -------------------------------------------------------------------------------- evaluation


def _literal(node: ast.Constant, src: str) -> Fraction:
    """The exact value of a numeric literal, read from its source text (0.1 stays 1/10)."""
    return Fraction(ast.get_source_segment(src, node) or repr(node.value))


def _pow_numeric(a: Fraction | float, b: Fraction | float) -> Fraction | float:
    if isinstance(a, Fraction) and isinstance(b, Fraction) and b.denominator == 1:
        n = b.numerator
        if (a.numerator.bit_length() + a.denominator.bit_length()) * abs(n) <= _MAX_POW_BITS:
            if a == 0 and n < 0:
                raise Unsupported("0 to a negative power")
            return a**n
    fa, fb = float(a), float(b)
    if fa < 0 and not fb.is_integer():
        raise Unsupported("negative base, fractional power")
    return math.pow(fa, fb)


def _sqrt_numeric(x: Fraction | float) -> Fraction | float:
    if x < 0:
        raise Unsupported("sqrt of a negative number")
    if isinstance(x, Fraction):
        rn, rd = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if rn * rn == x.numerator and rd * rd == x.denominator:
            return Fraction(rn, rd)
    return math.sqrt(x)


_NUMERIC_FUNCS = {
    "sqrt": _sqrt_numeric,
    "sin": lambda x: math.sin(x),
    "cos": lambda x: math.cos(x),
    "tan": lambda x: math.tan(x),
    "log": lambda x: math.log(x),
    "ln": lambda x: math.log(x),
    "exp": lambda x: math.exp(x),
    "abs": abs,
}


def evaluate(tree: ast.Expression, src: str, env: dict[str, float] | None = None):
    """Value of a checked tree: Fraction when exact, float otherwise. Symbols come from `env`.
    Raises Unsupported for domain errors, overflow, division by zero or unknown symbols."""
    env = env or {}

    def ev(node: ast.AST) -> Fraction | float:
        if isinstance(node, ast.Constant):
            return _literal(node, src)
        if isinstance(node, ast.Name):
            if node.id == "pi":
                return math.pi
            if node.id == "e":
                return math.e
            if node.id not in env:
                raise Unsupported(f"free symbol {node.id}")
            return env[node.id]
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Call):
            return _NUMERIC_FUNCS[node.func.id](ev(node.args[0]))
        a, b = ev(node.left), ev(node.right)
        op = node.op
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, ast.Div):
            if b == 0:
                raise Unsupported("division by zero")
            return a / b
        return _pow_numeric(a, b)

    try:
        value = ev(tree.body)
    except (OverflowError, ValueError, ZeroDivisionError, RecursionError) as e:
        raise Unsupported(str(e)) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise Unsupported("not finite")
    return value


def numbers_equal(a: Fraction | float, b: Fraction | float, exact: bool, rel_tol: float) -> bool:
    if exact and isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    return abs(a - b) <= rel_tol * max(abs(a), abs(b)) or a == b


def probe_equal(ta: tuple, tb: tuple, symbols: set[str]) -> bool | None:
    """Compare two expressions at fixed points (one value per symbol per point). None when
    fewer than two points are inside both domains."""
    names, agreed = sorted(symbols), 0
    for k in range(len(_PROBE_VALUES)):
        env = {s: _PROBE_VALUES[(k + 2 * j) % len(_PROBE_VALUES)] for j, s in enumerate(names)}
        try:
            va, vb = float(evaluate(*ta, env)), float(evaluate(*tb, env))
        except (Unsupported, OverflowError):
            continue
        if abs(va - vb) > 1e-8 * max(1.0, abs(va), abs(vb)):
            return False
        agreed += 1
    return True if agreed >= 2 else None


# ------------------------------------------------------------------------------ sympy (optional)


def _to_sympy(tree: ast.Expression, src: str, sp: Any):
    """Build a sympy expression from a checked tree — no parse_expr, no eval."""
    funcs = {"sqrt": sp.sqrt, "sin": sp.sin, "cos": sp.cos, "tan": sp.tan, "log": sp.log,
             "ln": sp.log, "exp": sp.exp, "abs": sp.Abs}  # fmt: skip

    def go(node: ast.AST):
        if isinstance(node, ast.Constant):
            value = _literal(node, src)
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
        return a**b

    return go(tree.body)


def _import_sympy():
    try:
        import sympy
    except ImportError:
        return None
    return sympy


def sympy_equal(ta: tuple, tb: tuple, timeout_s: float) -> bool | None:
    """simplify(a - b) == 0, or None if sympy is missing, fails, or runs past `timeout_s`.
    The timebox uses SIGALRM, so it only runs on the main thread (elsewhere: None)."""
    sp = _import_sympy()
    if sp is None or threading.current_thread() is not threading.main_thread():
        return None

    def on_alarm(signum, frame):
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        return bool(sp.simplify(_to_sympy(*ta, sp) - _to_sympy(*tb, sp)) == 0)
    except _Timeout:
        return None
    except Exception:  # sympy can raise nearly anything on odd input
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------------------------------- comparison


def _split_sequence(s: str) -> tuple[str, list[str]]:
    """("()", ["1", "2"]) for "(1,2)"; ("", [s]) for a scalar. Brackets count only when the
    outer pair encloses everything."""
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
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    if len(parts) == 1:
        return "", [s]
    return brackets or "()", parts


def _scalar_equal(a: str, b: str, rel_tol: float, use_sympy: bool, timeout_s: float) -> bool:
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
        exact = "." not in ta[1] and "." not in tb[1]
        try:
            return numbers_equal(va, vb, exact, rel_tol)
        except OverflowError:
            return False
    probe = probe_equal(ta, tb, symbols)
    if probe is False:
        return False
    if use_sympy:
        verdict = sympy_equal(ta, tb, timeout_s)
        if verdict is not None:
            return verdict
    return bool(probe)


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
    the normalised strings agree."""
    c, r = normalize_answer(candidate or ""), normalize_answer(reference or "")
    if not c or not r:
        return False
    if c == r:
        return True
    if len(c) > MAX_CHARS or len(r) > MAX_CHARS:
        return False
    args = (rel_tol, use_sympy, sympy_timeout_s)
    if c.count("=") == 1 and r.count("=") == 1:
        (cl, cr), (rl, rr) = c.split("="), r.split("=")
        return _scalar_equal(cl, rl, *args) and _scalar_equal(cr, rr, *args)
    (cb, cparts), (rb, rparts) = _split_sequence(c), _split_sequence(r)
    if len(cparts) > 1 or len(rparts) > 1:
        return (
            cb == rb
            and len(cparts) == len(rparts)
            and all(_scalar_equal(x, y, *args) for x, y in zip(cparts, rparts, strict=True))
        )
    return _scalar_equal(c, r, *args)
