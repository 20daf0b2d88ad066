"""The environment interface for multi-turn episodes, and the tool interface environments use.

An environment is one episode's world (a fresh one per episode, made by a factory):

    first = env.reset(prompt)                 # the user's first message (text)
    step = env.step(turn_text)                # after each assistant turn:
    step.observation, step.reward, step.done, step.info

`reset` turns a task's `Prompt` into the first message the model sees; `step` reads one
assistant turn (decoded text, special tokens dropped) and answers with the observation to show
next (a tool's output, as text: minirl/envs/turns.py adds the chat template's turn markers and
tokenizes it), the reward this turn earned, and whether the episode is over. The episode's
reward is the sum of its steps' rewards (minirl/envs/episodes.py).

The one hard rule, as for verifiers (minirl/data/verifier_api.py): nothing the model writes may
crash the run. A tool that fails (bad input, a crash, hostile code, a time-out) answers with an
error message as its output; an environment that raises anyway is caught by `safe_step`, which
ends the episode with reward 0 and the error as the reason.

A tool is a named function from the text of a call to the text of its result:

    tool.name = "calc";  tool("12*(3+4)") -> "84"
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Protocol, runtime_checkable

from minirl.types import Prompt

log = logging.getLogger(__name__)


class Step(NamedTuple):
    """What an environment answers to one assistant turn."""

    observation: str  # shown to the model before its next turn ("" when done)
    reward: float  # earned by this turn
    done: bool  # the episode is over
    info: dict[str, Any] | None = None  # "reason": a short account (the episode Score's reason)


@runtime_checkable
class Environment(Protocol):
    def reset(self, prompt: Prompt) -> str: ...

    def step(self, turn_text: str) -> Step: ...


@runtime_checkable
class Tool(Protocol):
    """`tool(call_text) -> result text`; never raises for what the model wrote."""

    name: str

    def __call__(self, call: str) -> str: ...


def safe_step(env: Environment, turn_text: str) -> Step:
    """env.step(turn_text), or — if the environment raises — the end of the episode with reward
    0 and the exception as the reason (logged), never an exception that ends the run."""
    try:
        step = env.step(turn_text)
        info = dict(step.info or {})
        return Step(str(step.observation), float(step.reward), bool(step.done), info)
    except Exception as e:  # noqa: BLE001 - the run must survive any model output
        log.warning("environment error: %s: %s", type(e).__name__, e)
        return Step("", 0.0, True, {"reason": f"environment error: {type(e).__name__}: {e}"})
