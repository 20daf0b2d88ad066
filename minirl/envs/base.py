"""The environment interface for multi-turn episodes, and the tool interface environments use.

An environment is one episode's world (a fresh one per episode, made by a factory):

    first = env.reset(prompt)                 # the first message(s) the model sees
    step = env.step(turn)                     # after each assistant turn:
    step.observation, step.reward, step.done, step.info

`reset` turns a task's `Prompt` into the first message: its text (a user message), or a list of
chat messages ({"role", "content"} dicts: a system message, then the user's). `step` reads one
assistant turn (decoded text, special tokens dropped) and answers with the observation to show
next: text (one message in the `tool` role), one message dict, or a list of them (several tool
results, a user message); minirl/envs/turns.py adds the chat template's turn markers and
tokenizes it. With the reward this turn earned and whether the episode is over. The episode's
reward is the sum of its steps' rewards (minirl/envs/episodes.py). `as_step` also takes the
Gymnasium-style 4-tuple `(observation, reward, done, info)` (your own environment, from a file:
minirl/envs/user_env.py).

The one hard rule, as for verifiers (minirl/data/verifier_api.py): nothing the model writes may
crash the run. A tool that fails (bad input, a crash, hostile code, a time-out) answers with an
error message as its output; an environment that raises anyway, or answers with something that
is not a step, is caught by `safe_step`, which ends the episode with reward 0 and the error as
the reason. `in_thread` runs a call on its own thread, so the episode runner can stop waiting
for an environment that hangs (task.timeout).

A tool is a named function from the text of a call to the text of its result:

    tool.name = "calc";  tool("12*(3+4)") -> "84"
"""

from __future__ import annotations

import logging
import math
import numbers
import threading
import time
from concurrent.futures import Future
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from minirl.types import Prompt

log = logging.getLogger(__name__)


class Step(NamedTuple):
    """What an environment answers to one assistant turn."""

    observation: Any  # shown before the next turn: text, a message dict or a list ("" when done)
    reward: float  # earned by this turn
    done: bool  # the episode is over
    info: dict[str, Any] | None = None  # "reason": a short account (the episode Score's reason)


@runtime_checkable
class Environment(Protocol):
    def reset(self, prompt: Prompt) -> str | list[dict]: ...

    def step(self, turn_text: str) -> Step: ...


@runtime_checkable
class Tool(Protocol):
    """`tool(call_text) -> result text`; never raises for what the model wrote."""

    name: str

    def __call__(self, call: str) -> str: ...


def as_step(value: Any) -> Step:
    """An environment's answer as a `Step`: a Step, or the 4-tuple (observation, reward, done,
    info); ValueError saying what is off (a reward that is not a finite number, ...)."""
    if not isinstance(value, tuple | list) or len(value) != 4:
        what = f"a {len(value)}-tuple" if isinstance(value, tuple | list) else type(value).__name__
        raise ValueError(f"step returned {what}, not (observation, reward, done, info)")
    observation, reward, done, info = value
    if not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
        raise ValueError(f"step returned the reward {reward!r}, not a finite number")
    if not (
        isinstance(done, bool | np.bool_) or isinstance(done, numbers.Integral) and done in (0, 1)
    ):
        raise ValueError(f"step returned done={done!r}, not a bool")
    if info is not None and not isinstance(info, dict):
        raise ValueError(f"step returned info of type {type(info).__name__}, not a dict")
    observation = "" if observation is None else observation
    info = dict(info or {})
    if "reason" in info:  # the episode Score's reason: text, as it travels (pickle, JSON)
        info["reason"] = str(info["reason"])
    return Step(observation, float(reward), bool(done), info)


def failed(reason: str) -> Step:
    """The step that ends an episode whose environment failed: reward 0 (for the whole
    episode: `info["failed"]`), the reason said."""
    log.warning("%s", reason)
    return Step("", 0.0, True, {"reason": reason[:300], "failed": True})


def safe_step(env: Environment, turn_text: str) -> Step:
    """env.step(turn_text) as a Step, or — if the environment raises or answers with something
    that is not a step — the end of the episode with reward 0 and the error as the reason
    (logged), never an exception that ends the run."""
    try:
        return as_step(env.step(turn_text))
    except Exception as e:  # noqa: BLE001 - the run must survive any model output
        return failed(f"environment error: {type(e).__name__}: {e}")


def in_thread(fn, *args) -> Future:
    """`fn(*args)` on a fresh daemon thread; its future's `finished_at` (time.monotonic) says
    when it answered. A call that never returns leaves only its thread behind (Python cannot
    stop a thread: whatever it holds stays held; the caller stops waiting for it)."""
    future: Future = Future()

    def run():
        try:
            value = fn(*args)
            future.finished_at = time.monotonic()
            future.set_result(value)
        except BaseException as e:  # noqa: BLE001 - even SystemExit stays in this thread
            future.finished_at = time.monotonic()
            error = e if isinstance(e, Exception) else RuntimeError(f"{type(e).__name__}: {e}")
            future.set_exception(error)

    threading.Thread(target=run, daemon=True, name="minirl-env-call").start()
    return future
