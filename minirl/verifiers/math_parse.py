"""Model-written math answers -> Python syntax -> a whitelisted AST -> a value. No eval().

    tree, src = parse_expression("\\frac{1}{2} + 2x")  # src = "( ( 1 ) / ( 2 ) ) + 2 * x"
    evaluate(tree, src, {"x": 0.25})                   # 1.0 (a float symbol value)
    evaluate(*parse_expression("\\frac{1}{3}+0.5"))    # Fraction(5, 6): exact

`latex_to_python` rewrites `\\frac{a}{b}`, `\\sqrt[n]{x}`, `\\sqrt{x}`, `\\pi`, `\\cdot`, `\\times`,
`\\div`, `^`, `{}` and the function commands `\\sin \\cos \\tan \\ln \\log \\exp`; any other command is
`Unsupported`. `parse_expression` makes implicit products explicit (`2x`, `xy`, `2(x+1)`,
`(a)(b)`), parses with `ast.parse(mode="eval")` and accepts only: numbers, `+ - * / **`, unary
`+ -`, calls of `sqrt sin cos tan log ln exp abs` with one argument, the constants `pi` and `e`
(Euler's number), and one-letter symbols. `evaluate` walks that tree: exact `Fraction`
arithmetic for numbers written as integers, fractions or decimals (the literal's source text is
read, so 0.1 is exactly 1/10), floats once sqrt/pi/sin/... or a fractional power appear.

Guards, because the input is model-written: answers over MAX_CHARS characters are not parsed;
an integer power is computed exactly only if the result stays under ~100k bits, else in floating
point, where overflow, division by zero and domain errors all raise `Unsupported`.
"""

from __future__ import annotations

import ast
import math
import re
from fractions import Fraction

from minirl.verifiers.math_extract import match_brace

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


def literal_value(node: ast.Constant, src: str) -> Fraction:
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
