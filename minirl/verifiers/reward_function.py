"""Your own reward function as a verifier: `minirl train --data F --verifier my_reward.py:score`.

    # my_reward.py
    def score(completion: str, row: dict) -> float:      # or a bool, or a minirl Score
        return 1.0 if row["answer"] in completion else 0.0

`RewardFunction("path/to/file.py:function")` loads the file by its path (it need not be on
`sys.path` or in a package) and is a `Verifier`: `completion` is the model's text, `row` the
dataset row the prompt came from, every field as read from the file (`meta["fields"]`, which
dataset files put there for this verifier; for a built-in task's prompt, its text and meta:
`row_of`). `load_function` is also how `--env file.py:Class` and `--agent file.py:solve` are
loaded (minirl/envs/user_env.py, minirl/agents/). It runs wherever
verifiers run: in-process, in a `VerifierPool`'s workers and behind the verifier service
(scale/), because it travels as its path and name and each process loads the file itself.

A mistake in the set-up (no such file, not a .py file, the file fails to import, no such
function) raises ValueError at once, with one line saying which. What the function does with
a completion never stops the run: an exception, a NaN or infinite reward, or a value that is
not a number, bool or Score is reward 0 with the reason ("reward function raised KeyError:
'answer'", "reward function returned nan").
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import numbers
import os
from collections.abc import Callable, Sequence
from typing import Any

from minirl.types import Rollout, Score


def is_function_spec(name: str) -> bool:
    """Does a verifier name look like "path/to/file.py:function"?"""
    path, sep, function = name.rpartition(":")
    return bool(sep) and path.endswith(".py") and function.isidentifier()


def load_function(
    spec: str, flag: str = "--verifier", what: str = "function"
) -> Callable[..., Any]:
    """The callable `spec` ("path/to/file.py:name") names; ValueError saying what is wrong, as
    one line starting with the command-line `flag` it came from. The same loader serves
    `--verifier` (a function), `--env` (a class) and `--agent` (an async function): `what` is
    the word the messages use."""
    path, _, name = spec.rpartition(":")
    if not is_function_spec(spec):
        raise ValueError(f"{flag} {spec!r}: expected path/to/file.py:{what}")
    if not os.path.isfile(path):
        raise ValueError(f"{flag} {spec!r}: no file {path}")
    digest = hashlib.sha256(os.path.abspath(path).encode()).hexdigest()[:12]
    module_spec = importlib.util.spec_from_file_location(f"minirl_user_{digest}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # a user's file: any failure is a set-up error
        why = f"{type(e).__name__}: {e}"
        raise ValueError(f"{flag} {spec!r}: {path} failed to load: {why}") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{flag} {spec!r}: {path} has no {what} {name!r}")
    return function


def row_of(prompt) -> dict:
    """What a user's code is handed for a prompt: a dataset file's row as read (its fields, in
    `meta["fields"]`), or for a built-in task's prompt its text and meta ({"prompt": ..., ...})."""
    meta = prompt.meta
    return dict(meta["fields"]) if "fields" in meta else {"prompt": prompt.text, **meta}


def as_reward(value: Any, who: str = "reward function") -> Score:
    """A reward function's (or `who`'s) return value as a Score; a value that is not a finite
    number, a bool or a Score with a finite reward is reward 0 saying what came back."""
    if isinstance(value, Score):
        reward, reason = value.reward, value.reason
    elif isinstance(value, bool):
        reward, reason = float(value), "correct" if value else "wrong answer"
    elif isinstance(value, numbers.Real):  # numpy's scalars too
        reward, reason = value, ""
    else:
        return Score(0.0, f"{who} returned {type(value).__name__}, not a number")
    try:
        reward = float(reward)
    except (TypeError, ValueError):
        return Score(0.0, f"{who} returned a Score with reward {reward!r}")
    if not math.isfinite(reward):
        return Score(0.0, f"{who} returned {reward}")
    return Score(reward, str(reason))


class RewardFunction:
    """A `Verifier` over a function `(completion, row) -> float | bool | Score` in a file.
    Pickles as its spec: a worker process loads the file again."""

    def __init__(self, spec: str):
        self.spec = spec
        self._function = load_function(spec)

    def __getstate__(self) -> dict[str, Any]:
        return {"spec": self.spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"])

    def score_one(self, rollout: Rollout) -> Score:
        try:
            value = self._function(rollout.text or "", row_of(rollout.prompt))
        except Exception as e:  # noqa: BLE001 - the run survives anything the function does
            return Score(0.0, f"reward function raised {type(e).__name__}: {e}"[:300])
        return as_reward(value)

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        return [self.score_one(r) for r in rollouts]

    def __repr__(self) -> str:
        return f"RewardFunction({self.spec!r})"
