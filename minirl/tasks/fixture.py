"""A tiny task for tests: answer with a digit of the same parity as the number in the prompt.

Prompt "482:"; any completion whose FIRST character is an even digit ("0", "2", ..., "8") earns
1.0 (odd digit for an odd number). Completions are 1–2 tokens (a digit, EOS), so an RL test on a
random tiny model is fast, and the reward can rise within a bounded number of steps: a random
policy over the ~70-symbol vocabulary already succeeds ~7% of the time (5 good digits), learning
"write a digit" lifts that to ~50%, and reading the prompt's last digit lifts it to 100%.

Demonstrations: the prompt's last digit (always correct) — perfect demonstrations exist, which
is fine for a fixture; it is not a claim about RL.
"""

from __future__ import annotations

import dataclasses

from minirl.data.task_api import check_fraction, check_index, draw_in_split, make_prompt
from minirl.data.verifier_api import safe_scores
from minirl.modeling.tokenizer import CharTokenizer
from minirl.types import Prompt, Rollout, Score


@dataclasses.dataclass(frozen=True)
class FixtureConfig:
    max_value: int = 999  # the prompt's number is uniform in [0, max_value]
    test_fraction: float = 0.125

    def __post_init__(self):
        if self.max_value < 15:
            raise ValueError("max_value must be >= 15 so both splits have problems")
        check_fraction("test_fraction", self.test_fraction)


class FixtureVerifier:
    """1.0 if the completion starts with a digit of the prompt number's parity, else 0.0."""

    def score(self, rollouts: list[Rollout]) -> list[Score]:
        return safe_scores(self.score_one, rollouts)

    def score_one(self, rollout: Rollout) -> Score:
        first = rollout.text.lstrip()[:1]
        if not (first.isascii() and first.isdigit()):
            return Score(0.0, "does not start with a digit")
        if int(first) % 2 == rollout.prompt.meta["value"] % 2:
            return Score(1.0, "correct")
        return Score(0.0, "wrong parity")


class Fixture:
    Config = FixtureConfig
    name = "fixture"
    max_new_tokens = 2  # a digit, then EOS

    def __init__(self, config: FixtureConfig = FixtureConfig(), tokenizer=None):
        self.config, self.tokenizer = config, tokenizer or CharTokenizer()
        self.verifier = FixtureVerifier()

    def prompt(self, index: int, split: str = "train") -> Prompt:
        index = check_index(index)
        value = draw_in_split(
            self.name,
            split,
            index,
            self.config.test_fraction,
            lambda rng: int(rng.integers(0, self.config.max_value + 1)),
            content=lambda v: v,
        )
        return make_prompt(
            self.name, self.config, split, index, f"{value}:", {"value": value}, self.tokenizer
        )

    def demonstration(self, prompt: Prompt, sample: int = 0) -> str:
        return str(prompt.meta["value"] % 10)
