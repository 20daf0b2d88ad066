"""Countdown: reach a target from given numbers — the task where only the reward teaches.

Prompt "3 5 7 -> 22:"; a good completion is an arithmetic expression over the given numbers
whose value is the target, e.g. "3*5+7", then EOS. Rules (classic Countdown, as in TinyZero):

  * numbers are combined with + - * / and parentheses; no unary minus, no other characters
    except spaces; division is exact (rational), so 7/2*2 == 7;
  * with `use_all=True` (default) every given number is used EXACTLY once; with
    `use_all=False` each is used AT MOST once (the verifier reads the rule from `meta`);
  * the value must equal the target.

Why this task (docs/results.md): demonstrations can teach the FORMAT — a well-formed expression that
uses the given numbers — but not how to HIT the target; only the reward teaches that. So
`demonstration()` returns a random well-formed expression over the numbers, deliberately not
conditioned on the target. Targets are produced by the very same random-expression sampler
(restricted to integer values in [1, max_target]), so every problem is solvable and a model that
has learned only the format already succeeds sometimes: pass@1 is well below pass@8, and RL has
a graded signal to climb (measured numbers in docs/tasks.md).

Verification is a tiny recursive-descent parser over exact fractions — never `eval` — with a
length cap and a nesting cap, so hostile text ("9**9**9", 10k parentheses, "__import__") gets a
zero reward with a reason instead of hanging or crashing the run. Partial credit for a valid
expression with the wrong value is available (`format_reward`), off by default.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from fractions import Fraction

import numpy as np

from minirl.data.task_api import check_fraction, check_index, draw_in_split, make_prompt, stream
from minirl.data.verifier_api import safe_scores
from minirl.modeling.tokenizer import CharTokenizer
from minirl.types import Prompt, Rollout, Score

_OPS = "+-*/"
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclasses.dataclass(frozen=True)
class CountdownConfig:
    min_numbers: int = 3  # how many numbers a problem gives (uniform in [min, max])
    max_numbers: int = 4
    max_number: int = 9  # numbers are drawn uniformly from 1..max_number (repeats allowed)
    max_target: int = 99  # targets are integers in [1, max_target]
    ops: str = "+-*"  # operators used by targets and demonstrations (the verifier accepts +-*/)
    use_all: bool = True  # True: each number exactly once; False: at most once
    format_reward: float = 0.0  # reward for a valid expression with the wrong value
    test_fraction: float = 0.1  # share of problem contents reserved for the test split

    def __post_init__(self):
        if not 1 <= self.min_numbers <= self.max_numbers <= 8:
            raise ValueError("need 1 <= min_numbers <= max_numbers <= 8")
        if self.max_number < 1 or self.max_target < 1:
            raise ValueError("max_number and max_target must be >= 1")
        if not self.ops or set(self.ops) - set(_OPS):
            raise ValueError(f"ops must be a non-empty subset of {_OPS!r}, got {self.ops!r}")
        if not 0.0 <= self.format_reward < 1.0:
            raise ValueError("format_reward must be in [0, 1)")
        check_fraction("test_fraction", self.test_fraction)


# ----------------------------------------------------------------------------- expressions
# A tree is an int (a leaf) or a tuple (op, left, right).


def random_expression(numbers: list[int], ops: str, rng: np.random.Generator):
    """A random binary expression tree using every number once, in random order."""
    leaves = [int(numbers[i]) for i in rng.permutation(len(numbers))]

    def build(items):
        if len(items) == 1:
            return items[0]
        k = int(rng.integers(1, len(items)))
        return (ops[int(rng.integers(len(ops)))], build(items[:k]), build(items[k:]))

    return build(leaves)


def evaluate(tree) -> Fraction | None:
    """Exact value of a tree, or None on division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, a, b = tree
    x, y = evaluate(a), evaluate(b)
    if x is None or y is None:
        return None
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    return None if y == 0 else x / y


def render(tree, parent: str = "", right: bool = False) -> str:
    """Text with only the parentheses precedence needs: ("*", ("+", 3, 5), 7) -> "(3+5)*7"."""
    if isinstance(tree, int):
        return str(tree)
    op, a, b = tree
    text = render(a, op, False) + op + render(b, op, True)
    if parent and (
        _PREC[op] < _PREC[parent] or (right and _PREC[op] == _PREC[parent] and parent in "-/")
    ):
        return "(" + text + ")"
    return text


def sample_in_range(numbers, ops, max_target, rng, tries: int = 100):
    """A random expression whose value is an integer in [1, max_target] (None if none found)."""
    for _ in range(tries):
        tree = random_expression(numbers, ops, rng)
        value = evaluate(tree)
        if value is not None and value.denominator == 1 and 1 <= value <= max_target:
            return tree, int(value)
    return None


# ----------------------------------------------------------------------------- safe parser


class _Malformed(Exception):
    pass


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor (('*'|'/') factor)* ;
    factor := NUMBER | '(' expr ')'. Values are Fractions; literals are collected."""

    def __init__(self, text: str, max_depth: int):
        self.s, self.i, self.max_depth = text, 0, max_depth
        self.literals: list[int] = []
        self.div_by_zero = False

    def parse(self) -> Fraction:
        value = self.expr(0)
        self.skip()
        if self.i != len(self.s):
            raise _Malformed(f"unexpected {self.s[self.i]!r} at {self.i}")
        return value

    def skip(self):
        while self.i < len(self.s) and self.s[self.i] == " ":
            self.i += 1

    def peek(self) -> str:
        self.skip()
        return self.s[self.i] if self.i < len(self.s) else ""

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.s[self.i]
            self.i += 1
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            op = self.s[self.i]
            self.i += 1
            rhs = self.factor(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                self.div_by_zero = True  # keep parsing to report format errors first
                value = Fraction(0)
            else:
                value = value / rhs
        return value

    def factor(self, depth: int) -> Fraction:
        ch = self.peek()
        if ch == "(":
            if depth >= self.max_depth:
                raise _Malformed("parentheses nested too deeply")
            self.i += 1
            value = self.expr(depth + 1)
            if self.peek() != ")":
                raise _Malformed(f"expected ')' at {self.i}")
            self.i += 1
            return value
        if ch.isdigit() and ch.isascii():
            start = self.i
            while self.i < len(self.s) and self.s[self.i].isdigit() and self.s[self.i].isascii():
                self.i += 1
            literal = int(self.s[start : self.i])
            self.literals.append(literal)
            return Fraction(literal)
        where = f"{ch!r} at {self.i}" if ch else "end of text"
        raise _Malformed(f"expected a number or '(' but found {where}")


class CountdownVerifier:
    """Scores countdown completions; the problem (numbers, target, rule) is read from meta."""

    def __init__(self, format_reward: float = 0.0, max_chars: int = 128, max_depth: int = 16):
        self.format_reward, self.max_chars, self.max_depth = format_reward, max_chars, max_depth

    def score(self, rollouts: list[Rollout]) -> list[Score]:
        return safe_scores(self.score_one, rollouts)

    def score_one(self, rollout: Rollout) -> Score:
        meta = rollout.prompt.meta
        text = rollout.text.strip()
        if not text:
            return Score(0.0, "empty completion")
        if len(text) > self.max_chars:
            return Score(0.0, f"too long ({len(text)} > {self.max_chars} characters)")
        parser = _Parser(text, self.max_depth)
        try:
            value = parser.parse()
        except _Malformed as e:
            return Score(0.0, f"malformed: {e}")
        given, used = Counter(meta["numbers"]), Counter(parser.literals)
        for n, k in sorted(used.items()):
            if n not in given:
                return Score(0.0, f"uses {n}, which is not given")
            if k > given[n]:
                return Score(0.0, f"uses {n} more often than given")
        if meta["use_all"] and used != given:
            missing = sorted((given - used).elements())
            return Score(0.0, f"does not use every number (missing {missing})")
        if parser.div_by_zero:
            return Score(0.0, "division by zero")
        if value == meta["target"]:
            return Score(1.0, "correct")
        shown = str(value) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
        return Score(self.format_reward, f"wrong value {shown} (target {meta['target']})")


# ----------------------------------------------------------------------------- the task


class Countdown:
    """The countdown task (see module docstring). Stateless apart from its config."""

    Config = CountdownConfig
    name = "countdown"

    def __init__(self, config: CountdownConfig = CountdownConfig(), tokenizer=None):
        self.config, self.tokenizer = config, tokenizer or CharTokenizer()
        self.verifier = CountdownVerifier(config.format_reward)

    @property
    def max_new_tokens(self) -> int:
        c = self.config
        n, width = c.max_numbers, len(str(c.max_number))
        longest = n * width + (n - 1) + 2 * (n - 1)  # numbers, operators, parentheses
        return longest + 8 + 1  # a little slack for spaces, then EOS

    def _draw(self, rng: np.random.Generator):
        c = self.config
        for _ in range(100):
            n = int(rng.integers(c.min_numbers, c.max_numbers + 1))
            numbers = [int(x) for x in rng.integers(1, c.max_number + 1, size=n)]
            found = sample_in_range(numbers, c.ops, c.max_target, rng)
            if found is not None:
                return numbers, found[1], render(found[0])
        raise RuntimeError(f"countdown: config {c} rarely yields a target in range")

    def prompt(self, index: int, split: str = "train") -> Prompt:
        index = check_index(index)
        numbers, target, reference = draw_in_split(
            self.name,
            split,
            index,
            self.config.test_fraction,
            self._draw,
            content=lambda p: (tuple(sorted(p[0])), p[1]),
        )
        text = " ".join(map(str, numbers)) + f" -> {target}:"
        meta = {
            "numbers": numbers,
            "target": target,
            "use_all": self.config.use_all,
            "reference": reference,  # one solution, for humans and tests; demos do not use it
        }
        return make_prompt(self.name, self.config, split, index, text, meta, self.tokenizer)

    def demonstration(self, prompt: Prompt, sample: int = 0) -> str:
        """A random well-formed expression over the prompt's numbers (format only: it hits
        the target only as often as the random-expression policy does)."""
        c, numbers = self.config, prompt.meta["numbers"]
        rng = stream("countdown-demo", prompt.uid, sample)
        found = sample_in_range(numbers, c.ops, c.max_target, rng)
        return render(found[0] if found else random_expression(numbers, "+", rng))
