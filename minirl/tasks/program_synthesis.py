"""Program synthesis from examples, verified by running the candidate in the code sandbox.

Prompt "f(0)=4 f(2)=8 f(5)=14 -> f(x)="; a good completion is a Python expression in x that
computes the hidden function on every test point, e.g. "2*x+4", then EOS.

Hidden functions come from a small grammar, f(x) = a*g(x) + b with g(x) in {x, x*x} (the
`families` knob), a in 1..max_slope, b in -max_offset..max_offset. The visible examples are
`num_visible` distinct points in 0..visible_max (three points determine a and b and the family
uniquely); the HIDDEN tests are the visible points plus `num_hidden` further points in
-hidden_range..hidden_range, so a candidate that only fits the visible examples (a lookup-like
expression) fails. The split is by function: test-split functions never appear in training.

Verification is real: the expression is wrapped into a small Python program that reads the test
points from stdin and prints f(x) for each; `minirl.verifiers.CodeVerifier` runs it in the
sandbox (0.5 s CPU, memory limit, isolation) against the test file stored by reference in a
`TestRepository` (`meta["tests"]` is its sha256; `prompt()` stores it, idempotently). Outputs
are compared as floats, so "2*x/2" counts like "x". Before the sandbox, cheap checks reject
empty, multi-line or over-long text and, by default, characters outside the expression grammar
("0-9 x + - * / % ( ) space"); `charset_check=False` sends everything to the sandbox (which is
what the sandbox is for — the tests use it for hostile text).

Demonstrations (docs/tasks.md): what honestly exists without solving the problem is a guess of
the right SHAPE that agrees with ONE example: a random family and slope, with the offset chosen
so that f(x1) = y1 for the first visible example. It teaches the format, the grammar and how to
read an example; it is right only when the guessed family and slope happen to be right
(1/(len(families)*max_slope) of the time). Using all examples — inferring the slope and the
family — is what only the reward teaches.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from minirl.data.task_api import check_fraction, check_index, draw_in_split, make_prompt, stream
from minirl.data.verifier_api import safe_scores
from minirl.modeling.tokenizer import CharTokenizer
from minirl.types import Prompt, Rollout, Score

FAMILIES = {"linear": "x", "quadratic": "x*x"}
EXPRESSION_CHARS = frozenset("0123456789x+-*/%() ")
HARNESS = """import sys

def f(x):
    return ({expression})

print(*(f(int(t)) for t in sys.stdin.read().split()))
"""


@dataclasses.dataclass(frozen=True)
class ProgramSynthesisConfig:
    families: tuple[str, ...] = ("linear", "quadratic")
    max_slope: int = 5  # a in 1..max_slope
    max_offset: int = 9  # b in -max_offset..max_offset
    num_visible: int = 3  # examples shown in the prompt, from 0..visible_max
    visible_max: int = 6
    num_hidden: int = 6  # further test points, from -hidden_range..hidden_range
    hidden_range: int = 30
    test_fraction: float = 0.2  # share of FUNCTIONS reserved for the test split

    def __post_init__(self):
        if not self.families or set(self.families) - set(FAMILIES):
            raise ValueError(f"families must be a non-empty subset of {sorted(FAMILIES)}")
        if self.max_slope < 1 or self.max_offset < 0:
            raise ValueError("need max_slope >= 1 and max_offset >= 0")
        if not 2 <= self.num_visible <= self.visible_max + 1:
            raise ValueError("need 2 <= num_visible <= visible_max + 1")
        if self.num_hidden < 1 or 2 * self.hidden_range + 1 < self.num_hidden + self.num_visible:
            raise ValueError("hidden_range too small for num_hidden distinct points")
        check_fraction("test_fraction", self.test_fraction)


def render(family: str, a: int, b: int) -> str:
    """Canonical text of a*g(x)+b: render("linear", 2, -3) == "2*x-3"."""
    g = FAMILIES[family]
    text = g if a == 1 else f"{a}*{g}"
    return text + (f"+{b}" if b > 0 else f"-{-b}" if b < 0 else "")


def apply(family: str, a: int, b: int, x: int) -> int:
    return a * (x * x if family == "quadratic" else x) + b


def default_repository_path() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "minirl", "test-repository")


class ProgramSynthesisVerifier:
    """Cheap pre-checks, then the sandboxed code verifier on a harness around the expression."""

    def __init__(self, repository, charset_check: bool = True, max_chars: int = 64, cpu_s=0.5):
        from minirl.verifiers import CodeVerifier, CodeVerifierConfig, Limits

        config = CodeVerifierConfig(language="python", limits=Limits(cpu_s=cpu_s), compare="floats")
        self.code = CodeVerifier(repository, config)
        self.charset_check, self.max_chars = charset_check, max_chars

    def score(self, rollouts: list[Rollout]) -> list[Score]:
        return safe_scores(self.score_one, rollouts)

    def score_one(self, rollout: Rollout) -> Score:
        expression = rollout.text.strip()
        if not expression:
            return Score(0.0, "empty completion")
        if len(expression) > self.max_chars:
            return Score(0.0, f"too long ({len(expression)} > {self.max_chars} characters)")
        if "\n" in expression or "\r" in expression:
            return Score(0.0, "not a single-line expression")
        if self.charset_check and not set(expression) <= EXPRESSION_CHARS:
            bad = sorted(set(expression) - EXPRESSION_CHARS)[:5]
            return Score(0.0, f"characters outside the expression grammar: {bad}")
        score = self.code.score_one(HARNESS.format(expression=expression), rollout.prompt.meta)
        return Score(score.reward, score.reason)


class ProgramSynthesis:
    """f(x) from examples (see module docstring). `repository` holds the hidden tests: a
    `TestRepository`, a directory path, or None for ~/.cache/minirl/test-repository."""

    Config = ProgramSynthesisConfig
    name = "program_synthesis"
    max_new_tokens = 24  # canonical answers are <= 10 characters; room to explore, then EOS
    resources = ("repository", "charset_check")  # get_task keyword arguments outside Config

    def __init__(
        self,
        config: ProgramSynthesisConfig = ProgramSynthesisConfig(),
        repository=None,
        charset_check: bool = True,
        tokenizer=None,
    ):
        from minirl.verifiers import TestRepository

        if not isinstance(repository, TestRepository):
            repository = TestRepository(repository or default_repository_path())
        self.config, self.repository = config, repository
        self.tokenizer = tokenizer or CharTokenizer()
        self.verifier = ProgramSynthesisVerifier(repository, charset_check)

    def _draw(self, rng: np.random.Generator):
        c = self.config
        family = c.families[int(rng.integers(len(c.families)))]
        a = int(rng.integers(1, c.max_slope + 1))
        b = int(rng.integers(-c.max_offset, c.max_offset + 1))
        visible = sorted(
            int(x) for x in rng.choice(c.visible_max + 1, c.num_visible, replace=False)
        )
        pool = [x for x in range(-c.hidden_range, c.hidden_range + 1) if x not in visible]
        hidden = [int(pool[i]) for i in rng.choice(len(pool), c.num_hidden, replace=False)]
        return family, a, b, visible, hidden

    def prompt(self, index: int, split: str = "train") -> Prompt:
        from minirl.verifiers import put_tests

        index = check_index(index)
        family, a, b, visible, hidden = draw_in_split(
            self.name, split, index, self.config.test_fraction, self._draw, content=lambda p: p[:3]
        )
        xs = visible + hidden
        case = (" ".join(map(str, xs)) + "\n", " ".join(str(apply(family, a, b, x)) for x in xs))
        examples = [[x, apply(family, a, b, x)] for x in visible]
        text = " ".join(f"f({x})={y}" for x, y in examples) + " -> f(x)="
        meta = {
            "tests": put_tests(self.repository, [case]),  # the hidden tests, by reference
            "examples": examples,
            "reference": render(family, a, b),  # for humans and tests; demos do not use it
        }
        return make_prompt(self.name, self.config, split, index, text, meta, self.tokenizer)

    def demonstration(self, prompt: Prompt, sample: int = 0) -> str:
        """A random family and slope, offset fitted to the first visible example only."""
        c = self.config
        rng = stream("program_synthesis-demo", prompt.uid, sample)
        family = c.families[int(rng.integers(len(c.families)))]
        a = int(rng.integers(1, c.max_slope + 1))
        x1, y1 = prompt.meta["examples"][0]
        return render(family, a, y1 - apply(family, a, 0, x1))
