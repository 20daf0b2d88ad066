"""Multi-operand addition with a scratchpad: the long-tailed workload for the async experiments.

Prompt "12+345+6="; the completion adds the operands one at a time, one line per step, then
gives the final answer after "#### " and stops:

    21+543=753        12 + 345 = 357      (digits written least-significant first)
    753+6=363         357 + 6  = 363
    #### 363          the sum, 363, least-significant digit first

With `reverse_digits=True` (default) every number in the COMPLETION is written least-significant
digit first, so each output digit depends only on digits already seen and the carry: on this
machine a 0.8M-parameter model learned 2–4 digit addition in ~2 minutes with reversed answers
and not at all with left-to-right answers (docs/tasks.md). The prompt keeps normal notation.

The number of operands N is 2 + a truncated geometric variable (`continue_prob`), so the number
of scratchpad lines (N - 1), and with it the completion length, is long-tailed by construction:
most completions are a few dozen tokens, a few are several hundred (p50/p95/max in
docs/tasks.md). That spread is what makes asynchronous rollouts pay: a synchronous batch waits
for its longest member.

Demonstrations are the perfect scratchpads, so supervised training alone can solve this task;
it is NOT the "RL beats SFT" demo (that is countdown). The verifier checks only the final answer
(exact integer compare after "#### "); the scratchpad is free-form for the model.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from minirl.data.task_api import check_fraction, check_index, draw_in_split, make_prompt
from minirl.data.verifier_api import safe_scores
from minirl.modeling.tokenizer import CharTokenizer
from minirl.types import Prompt, Rollout, Score

_ANSWER = re.compile(r"####[ ]*(\S*)\s*\Z")


@dataclasses.dataclass(frozen=True)
class ArithmeticConfig:
    min_operands: int = 2
    max_operands: int = 20  # N = min_operands + Geometric(continue_prob), truncated here
    continue_prob: float = 0.7  # P(one more operand); mean N ~ min + p / (1 - p)
    min_digits: int = 1  # each operand has a uniform number of digits in [min, max]
    max_digits: int = 3
    reverse_digits: bool = True  # completion numbers least-significant digit first
    test_fraction: float = 0.1

    def __post_init__(self):
        if not 1 <= self.min_operands <= self.max_operands <= 64:
            raise ValueError("need 1 <= min_operands <= max_operands <= 64")
        if not 1 <= self.min_digits <= self.max_digits <= 12:
            raise ValueError("need 1 <= min_digits <= max_digits <= 12")
        if not 0.0 <= self.continue_prob < 1.0:
            raise ValueError("continue_prob must be in [0, 1)")
        check_fraction("test_fraction", self.test_fraction)


def scratchpad(operands: list[int], reverse_digits: bool = True) -> str:
    """The perfect worked solution: one line per addition, then "#### <sum>"."""
    fmt = (lambda n: str(n)[::-1]) if reverse_digits else str
    lines, total = [], operands[0]
    for x in operands[1:]:
        lines.append(f"{fmt(total)}+{fmt(x)}={fmt(total + x)}")
        total += x
    lines.append(f"#### {fmt(total)}")
    return "\n".join(lines)


class ArithmeticVerifier:
    """Exact integer compare of the text after the LAST "####" with meta["answer"].

    The answer must be the last thing in the completion (only whitespace may follow); it is
    read least-significant digit first when meta["reverse_digits"] is set.
    """

    def score(self, rollouts: list[Rollout]) -> list[Score]:
        return safe_scores(self.score_one, rollouts)

    def score_one(self, rollout: Rollout) -> Score:
        text = rollout.text
        at = text.rfind("####")
        if at < 0:
            return Score(0.0, "no '####' answer marker")
        m = _ANSWER.match(text, at)
        if m is None:
            return Score(0.0, "text after the answer")
        answer = m.group(1)
        if not answer:
            return Score(0.0, "empty answer")
        if not (answer.isascii() and answer.isdigit()) or len(answer) > 40:
            return Score(0.0, f"answer is not a non-negative integer: {answer[:20]!r}")
        if rollout.prompt.meta.get("reverse_digits", False):
            answer = answer[::-1]
        if int(answer) == int(rollout.prompt.meta["answer"]):
            return Score(1.0, "correct")
        return Score(0.0, "wrong answer")


class Arithmetic:
    """Multi-operand addition with a scratchpad (see module docstring)."""

    Config = ArithmeticConfig
    name = "arithmetic"

    def __init__(self, config: ArithmeticConfig = ArithmeticConfig(), tokenizer=None):
        self.config, self.tokenizer = config, tokenizer or CharTokenizer()
        self.verifier = ArithmeticVerifier()

    @property
    def max_new_tokens(self) -> int:
        """Length of the longest possible demonstration (+ EOS): all operands at the maximum."""
        c = self.config
        worst = [10**c.max_digits - 1] * c.max_operands
        return len(scratchpad(worst, c.reverse_digits)) + 1

    def _draw(self, rng: np.random.Generator) -> tuple[int, ...]:
        c = self.config
        n = c.min_operands
        while n < c.max_operands and rng.random() < c.continue_prob:
            n += 1
        digits = [int(d) for d in rng.integers(c.min_digits, c.max_digits + 1, size=n)]
        return tuple(int(rng.integers(10 ** (d - 1), 10**d)) for d in digits)  # d=1: 1..9

    def prompt(self, index: int, split: str = "train") -> Prompt:
        index = check_index(index)
        operands = draw_in_split(
            self.name, split, index, self.config.test_fraction, self._draw, content=lambda p: p
        )
        text = "+".join(map(str, operands)) + "="
        meta = {
            "answer": str(sum(operands)),
            "operands": list(operands),
            "reverse_digits": self.config.reverse_digits,
        }
        return make_prompt(self.name, self.config, split, index, text, meta, self.tokenizer)

    def demonstration(self, prompt: Prompt, sample: int = 0) -> str:
        """The perfect scratchpad (there is only one, so `sample` is ignored)."""
        return scratchpad(prompt.meta["operands"], prompt.meta["reverse_digits"])

    def tool_demonstration(self, prompt: Prompt) -> tuple[str, str, str]:
        """With a calculator (minirl/envs/): (tool, its argument, the answer turn) — the whole
        sum in one call, then `#### sum` written as the task writes answers."""
        total = str(sum(prompt.meta["operands"]))
        answer = total[::-1] if prompt.meta["reverse_digits"] else total
        return "calc", prompt.text.rstrip("="), f"#### {answer}"
