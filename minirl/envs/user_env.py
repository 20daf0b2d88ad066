"""Your own environment, from a file: `minirl train --env my_env.py:MyEnv` (task.env).

    # my_env.py
    class MyEnv:
        tools = [...]                        # optional: OpenAI function schemas the chat
                                             # template shows the model (docs/multiturn.md)
        def reset(self, row):                # the dataset row (a dict), or a built-in task's
            return row["question"]           # {"prompt": text, **meta}: the first message(s)
        def step(self, turn):                # the assistant's turn: its text (a str; with
            ...                              # tools, `turn.tool_calls` holds the parsed calls)
            return observation, reward, done, info      # or minirl.envs.Step(...)

A fresh instance per episode (the class is called with no arguments). `reset` answers with the
first message: its text (a user message) or a list of chat messages. `step` answers with the
observation (text: one `tool` message; a message dict; or a list of them), the reward this turn
earned, whether the episode is over and a dict of information (its "reason" becomes the
episode's Score reason). The episode's reward is the sum of its steps' rewards.
minirl/envs/episodes.py runs the episodes, in this process or in the engine's worker process
(rl.workers=process: the file is loaded again there, by its path).

What is checked at the start, as one line (ConfigError from `minirl train`): the file exists and
imports, it has the class, the class takes no constructor arguments, and `reset` and `step`
each take one argument. What is contained while the run goes on (reward 0 and the reason, the
run never stops): a constructor, `reset` or `step` that raises, returns something that is not
a step (a reward that is not a finite number, ...), or takes longer than task.timeout seconds
in all (each call runs on its own thread; a hung call's thread is left behind, the episode
ends).

Simplified on purpose: your code runs in the run's own process (a thread), like a reward
function: it can crash the process (os._exit, memory) — a tool that runs untrusted code should
use a sandbox, as minirl's `py` tool does (minirl/envs/python_tool.py).
"""

from __future__ import annotations

import inspect

from minirl.types import Prompt
from minirl.verifiers.reward_function import load_function, row_of


def load_env(spec: str) -> type:
    """The environment class `spec` ("path/to/file.py:Class") names; ValueError, one line,
    saying what is wrong with it."""
    cls = load_function(spec, flag="--env", what="class")
    if not inspect.isclass(cls):
        raise ValueError(f"--env {spec!r}: {cls.__name__!r} is a {type(cls).__name__}, not a class")
    _check_call(spec, cls, "the constructor", 0)
    for name in ("reset", "step"):
        method = getattr(cls, name, None)
        if not callable(method):
            raise ValueError(f"--env {spec!r}: {cls.__name__} has no method {name}(...)")
        _check_call(spec, method, f"{cls.__name__}.{name}", 2 if _plain(cls, name) else 1)
    return cls


def _plain(cls: type, name: str) -> bool:
    """Is `cls.name` a plain function (bound to an instance: `self` is its first argument)?"""
    return inspect.isfunction(inspect.getattr_static(cls, name))


def _check_call(spec: str, fn, what: str, args: int) -> None:
    """ValueError unless `fn` can be called with `args` positional arguments."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: leave it to the call
        return
    try:
        signature.bind(*range(args))
    except TypeError:
        takes = {0: "no arguments", 1: "one argument (self)", 2: "one argument"}[args]
        raise ValueError(
            f"--env {spec!r}: {what} must take {takes}; its signature is {signature}"
        ) from None


class FileEnv:
    """An `Environment` over an instance of your class: `reset` is handed the prompt's row
    (`row_of`), `step` returns what your `step` returned (a Step, or the 4-tuple the episode
    runner turns into one: minirl/envs/base.py `as_step`), `tools` are your class's."""

    def __init__(self, cls: type):
        self.env = cls()
        self.tools = getattr(self.env, "tools", None)

    def reset(self, prompt: Prompt):
        return self.env.reset(row_of(prompt))

    def step(self, turn):
        return self.env.step(turn)


class FileEnvs:
    """The episode runner's `make_env` for `--env spec`: a fresh FileEnv per episode. Travels
    to a worker process as its spec (the file is loaded again there)."""

    def __init__(self, spec: str):
        self.spec, self.cls = spec, load_env(spec)

    def __call__(self) -> FileEnv:
        return FileEnv(self.cls)

    def __getstate__(self) -> dict:
        return {"spec": self.spec}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["spec"])
