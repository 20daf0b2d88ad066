"""Verifiers by name: `get_verifier("math", rel_tol=1e-4)`, `register_verifier(name, factory)`.

The built-ins ("math", "math_verify", "code") are imported when first built: the code verifier
pulls in the sandbox, math-verify is an optional extra. A name "path/to/file.py:function" is
your own reward function in that file (reward_function.py). `dataset_verifier(name)` is the one
a dataset file's rows are scored by (`data.verifier`), `row_targets(name)` what those rows hold.
A name "rm:DIR" is a reward model (`reward_model_dir`): a JAX model, built by the run where its
verifier lives (minirl/hf/reward_model.py says why), never here nor in a pool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minirl.configlib import ConfigError
from minirl.data.verifier_api import Verifier


def _math_factory(**kwargs: Any) -> Verifier:
    from minirl.verifiers.math_verifier import MathVerifier, MathVerifierConfig

    return MathVerifier(MathVerifierConfig(**kwargs))


def _math_verify_factory(workers: int = 2, item_timeout_s: float = 30.0, **kwargs: Any) -> Verifier:
    """The math verifier on math-verify, in a pool of worker processes: its signal timeouts need
    a main thread, and the pool kills a worker that still hangs (math_verifier.py)."""
    from minirl.verifiers.math_verifier import MathVerifier, MathVerifierConfig
    from minirl.verifiers.pool import PoolConfig, VerifierPool

    inner = MathVerifier(MathVerifierConfig(backend="math_verify", **kwargs))
    return VerifierPool(inner, PoolConfig(workers=workers, item_timeout_s=item_timeout_s))


def _code_factory(repository: Any = None, **kwargs: Any) -> Verifier:
    from minirl.verifiers.code_verifier import CodeVerifier, CodeVerifierConfig
    from minirl.verifiers.repository import TestRepository

    if repository is not None and not isinstance(repository, TestRepository):
        repository = TestRepository(repository)  # None: only tests the rows carry are judged
    return CodeVerifier(repository, CodeVerifierConfig(**kwargs))


REWARD_MODEL = "rm:"  # "rm:DIR": a reward model's score (minirl/hf/reward_model.py)
# name -> factory(**kwargs) -> Verifier. Built-ins are imported lazily (code pulls in the sandbox).
_FACTORIES: dict[str, Callable[..., Verifier]] = {
    "math": _math_factory,
    "math_verify": _math_verify_factory,
    "code": _code_factory,
}


def reward_model_dir(name: str) -> str:
    """DIR of a verifier name "rm:DIR" (a reward model's checkpoint directory), else ""."""
    return name.removeprefix(REWARD_MODEL) if name.startswith(REWARD_MODEL) else ""


def register_verifier(name: str, factory: Callable[..., Verifier]) -> None:
    """Make `get_verifier(name, **kwargs)` call `factory(**kwargs)`. Names are unique."""
    if name in _FACTORIES:
        raise ValueError(f"a verifier named {name!r} is already registered")
    _FACTORIES[name] = factory


def verifier_names() -> list[str]:
    return sorted(_FACTORIES)


def get_verifier(name: str, **kwargs: Any) -> Verifier:
    """Build a registered verifier: `get_verifier("math", rel_tol=1e-4)`,
    `get_verifier("code", repository="/data/tests", language="cpp")`, or your own reward
    function: `get_verifier("my_reward.py:score")`."""
    from minirl.verifiers.reward_function import RewardFunction, is_function_spec

    if is_function_spec(name) and name not in _FACTORIES:
        return RewardFunction(name, **kwargs)
    if reward_model_dir(name):
        raise ValueError(
            f"verifier {name!r}: a reward model runs in one process, batched, not by name or in "
            "a pool: minirl.hf.reward_model.RewardModel(DIR), or minirl train --verifier rm:DIR"
        )
    if name not in _FACTORIES:
        raise KeyError(f"unknown verifier {name!r}; registered: {', '.join(verifier_names())}")
    return _FACTORIES[name](**kwargs)


def dataset_verifier(name: str, format_reward: float = 0.0) -> Verifier:
    """The verifier that scores a dataset file's rows (`data.verifier`): a registered one (the
    code verifier judges in sandboxes forked by a pool of 2 workers; `format_reward` shapes the
    others) or your reward function "path/to/file.py:function" (a missing file or name:
    ValueError); an unknown name is a ConfigError. A reward model ("rm:DIR") is the run's to
    build (minirl/run/starting_point.py): here, a ValueError."""
    from minirl.verifiers.reward_function import is_function_spec

    if is_function_spec(name) or reward_model_dir(name):
        return get_verifier(name)
    if name not in _FACTORIES:
        raise ConfigError(
            f"data.verifier={name!r}: one of {verifier_names()}, path/to/file.py:function or "
            "rm:DIR (a reward model)"
        )
    if name == "code":
        from minirl.verifiers.pool import PoolConfig, VerifierPool

        return VerifierPool(get_verifier("code"), PoolConfig(workers=2))
    return get_verifier(name, **({"format_reward": format_reward} if format_reward else {}))


def row_targets(name: str) -> str:
    """What a dataset row must hold for the verifier `name` (minirl/tasks/files.py
    FileFormat.targets): "tests" for code, the whole "row" for your reward function, only its
    prompt for a reward model (which reads the prompt's chat "messages"), else the "answer"."""
    from minirl.verifiers.reward_function import is_function_spec

    if name == "code":
        return "tests"
    if reward_model_dir(name):
        return "messages"
    return "row" if is_function_spec(name) else "answer"
