"""Model-written math answers -> Python syntax -> a whitelisted AST -> a value. No eval().

    tree, src = parse_expression("\\frac{1}{2} + 2x")  # src = "( ( 1 ) / ( 2 ) ) + 2 * x"
    evaluate(tree, src, {"x": 0.25})                   # 1.0 (a float symbol value)
    evaluate(*parse_expression("\\frac{1}{3}+0.5"))    # Fraction(5, 6): exact

`latex_to_python` rewrites `\\frac{a}{b}`, `\\sqrt[n]{x}`, `\\sqrt{x}`, `\\pi`, `\\cdot`,
`\\times`, `\\div`, `^`, `{}` and the function commands `\\sin \\cos \\tan \\ln \\log \\exp`; any
other command is `Unsupported`. `parse_expression` makes implicit products explicit (`2x`, `xy`,
`2(x+1)`, `(a)(b)`), parses with `ast.parse(mode="eval")` and accepts only: numbers, `+ - * / **`, unary
`+ -`, calls of `sqrt sin cos tan log ln exp abs` with one argument, the constants `pi` and `e`
(Euler's number), and one-letter symbols. `evaluate` walks that tree: exact `Fraction`
arithmetic for numbers written as integers, fractions or decimals (the literal's source text is
read, so 0.1 is exactly 1/10), floats once sqrt/pi/sin/... or a fractional power appear.

Guards, because the input is model-written and every verdict must come quickly, in-process:

  * answers over MAX_CHARS characters are not parsed;
  * exact values are capped at MAX_EXACT_DIGITS decimal digits (numerator or denominator),
    checked before they are built: a literal `1e99999999` or a power `9^{9^{9}}` raises
    `Unsupported` instead of computing 10^99999999. Too large is refused, never approximated by
    a float (`(1+10^{-9})^{10^9}` is not e). A 400-character answer holds at most ~200
    operations, each on capped values, so evaluation time is bounded: measured, the slowest
    answers found (sums of 2000-digit powers) take ~10 ms to evaluate. The cost of an
    operation grows with the square of the size, so a 10^4-digit cap would allow ~25x that;
  * the `^` exponent of an exact power is checked against the cap before the power is
    computed (`exact_power_fits`), also by the sympy path of `math_equal.py`;
  * floats are checked after every operation, because floating point fails silently: overflow
    (inf, nan), underflow (`e^{-1000}` and `10^{-400}\\pi` come out 0) and cancellation
    (`(\\pi + 10^{20}) - 10^{20}` comes out 0; a sum under CANCELLATION = 1e-6 times its larger
    operand has lost at least 6 of a float's ~16 digits) all raise `Unsupported`, so a value
    that floating point lost never compares equal to anything. Division by zero and domain
    errors raise it too.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import sys
from fractions import Fraction

from minirl.verifiers.math_extract import match_brace

MAX_CHARS = 400
MAX_EXACT_DIGITS = 2000  # cap on exact values: far above any real answer (see the guards)
CANCELLATION = 1e-6  # a float sum this much smaller than its operands is refused
_MAX_EXACT_BITS = math.ceil(MAX_EXACT_DIGITS * math.log2(10))
_LITERAL_RE = re.compile(r"(\d*)\.?(\d*)(?:[eE]([-+]?\d+))?")
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


class Unsupported(ValueError):
    """The expression uses something outside the whitelist (or is too large)."""


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
            name = next(
                (
                    c
                    for c in sorted(_LATEX_COMMANDS, key=len, reverse=True)
                    if m and m.group(0).startswith(c)
                ),
                None,
            )
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
            left = (
                prev == ")"
                or prev[0].isdigit()
                or prev[0] == "."
                or (prev.isalpha() and prev not in _FUNCS)
            )
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


def literal_value(node: ast.Constant, src: str) -> Fraction:
    """The exact value of a numeric literal, read from its source text (0.1 stays 1/10).
    Raises Unsupported for a literal over MAX_EXACT_DIGITS digits (`1e99999999`)."""
    text = ast.get_source_segment(src, node) or repr(node.value)
    m = _LITERAL_RE.fullmatch(text)
    if m is None:
        raise Unsupported(f"numeric literal {text[:20]!r}")
    if abs(int(m.group(3) or 0)) + len(m.group(1)) + len(m.group(2)) > MAX_EXACT_DIGITS:
        raise Unsupported("numeric literal too large")
    return Fraction(text)


def exact(value: Fraction) -> Fraction:
    """`value`, unless its numerator or denominator has over MAX_EXACT_DIGITS digits."""
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > _MAX_EXACT_BITS:
        raise Unsupported("exact value too large")
    return value


def exact_power_fits(base: Fraction, n: int) -> bool:
    """Would `base ** n` stay within MAX_EXACT_DIGITS? Decided from sizes, before computing."""
    size = math.log2(max(abs(base.numerator), base.denominator))  # bits per factor
    return size == 0 or abs(n) <= _MAX_EXACT_BITS / size


def checked_float(value: float, *operands: Fraction | float) -> float:
    """`value`, unless floating point lost it: inf or nan (overflow), or 0 or subnormal from
    nonzero `operands` (underflow: a product, quotient or power that is really not 0)."""
    if not math.isfinite(value):
        raise Unsupported("float overflow")
    if abs(value) < sys.float_info.min and operands and all(x != 0 for x in operands):
        raise Unsupported("float underflow")
    return value


def to_float(x: Fraction | float) -> float:
    """float(x), refusing an exact value a float cannot hold (too large, or so small that it
    would become 0 or subnormal)."""
    try:
        return checked_float(float(x), x)
    except OverflowError:
        raise Unsupported("too large for a float") from None


def _pow_numeric(a: Fraction | float, b: Fraction | float) -> Fraction | float:
    if isinstance(a, Fraction) and isinstance(b, Fraction) and b.denominator == 1:
        n = b.numerator
        if a == 0 and n < 0:
            raise Unsupported("0 to a negative power")
        if not exact_power_fits(a, n):
            raise Unsupported("exact power too large")
        return exact(a**n)
    fa, fb = to_float(a), to_float(b)
    if fa < 0 and not fb.is_integer():
        raise Unsupported("negative base, fractional power")
    return checked_float(math.pow(fa, fb), fa)


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _arith(op: ast.operator, a: Fraction | float, b: Fraction | float) -> Fraction | float:
    """`a op b`: exact when both are, with every result checked (see the module docstring)."""
    if isinstance(op, ast.Pow):
        return _pow_numeric(a, b)
    if isinstance(op, ast.Div) and b == 0:
        raise Unsupported("division by zero")
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return exact(_OPERATORS[type(op)](a, b))
    a, b = to_float(a), to_float(b)
    value = _OPERATORS[type(op)](a, b)
    if isinstance(op, ast.Add | ast.Sub):
        if abs(value) < CANCELLATION * max(abs(a), abs(b)):
            raise Unsupported("float cancellation")
        return checked_float(value)
    return checked_float(value, a, b)


_FLOAT_FUNCS = {
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "log": math.log,
    "ln": math.log,
    "exp": math.exp,
}


def _call(name: str, x: Fraction | float) -> Fraction | float:
    """A whitelisted function of one value: exact for `abs` and for square roots of perfect
    squares (`sqrt(9/4)` = 3/2), else a checked float."""
    if name == "abs":
        return abs(x)
    if name == "sqrt":
        if x < 0:
            raise Unsupported("sqrt of a negative number")
        if isinstance(x, Fraction):
            rn, rd = math.isqrt(x.numerator), math.isqrt(x.denominator)
            if rn * rn == x.numerator and rd * rd == x.denominator:
                return Fraction(rn, rd)
        return checked_float(math.sqrt(to_float(x)))
    value = _FLOAT_FUNCS[name](to_float(x))
    return checked_float(value, 1) if name == "exp" else checked_float(value)  # e^x is never 0


def evaluate(tree: ast.Expression, src: str, env: dict[str, Fraction | float] | None = None):
    """Value of a checked tree: Fraction when exact, float otherwise. Symbols come from `env`.
    Raises Unsupported for domain errors, division by zero, unknown symbols, or a value too
    large to hold exactly or lost in floating point (the guards in the module docstring)."""
    env = env or {}

    def ev(node: ast.AST) -> Fraction | float:
        if isinstance(node, ast.Constant):
            return literal_value(node, src)
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
            return _call(node.func.id, ev(node.args[0]))
        return _arith(node.op, ev(node.left), ev(node.right))

    try:
        return ev(tree.body)
    except (OverflowError, ValueError, ZeroDivisionError, RecursionError) as e:
        raise Unsupported(str(e)) from None
