"""Shared test set-up: JAX's platform and its persistent compilation cache (compiles are the cost
of this suite), the GPU lane, and `make_rollout` (a Rollout carrying just a prompt and a text) for
the data and task tests.

The default lane runs on the CPU (JAX_PLATFORMS=cpu unless the environment says otherwise).
`pytest -m gpu` is the GPU lane: the bitwise claims (tests marked `gpu`) on the accelerator JAX
finds; the CPU is not forced then, and `JAX_PLATFORMS=cuda` is respected. Where JAX sees no
accelerator each of those tests is skipped with one line saying why. Outside the lane the
`gpu`-marked tests are ordinary tests and run on whatever platform the lane runs on.
"""

import os
import re

import numpy as np
import pytest


def gpu_lane(markexpr: str) -> bool:
    """True when a `-m` expression selects the gpu marker (`gpu`, `gpu and not slow`), not when
    it excludes it (`not gpu`)."""
    return re.search(r"(?<!not )\bgpu\b", markexpr or "") is not None


def pytest_configure(config):
    if not gpu_lane(config.getoption("markexpr", "")):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault(
        "MINIRL_COMPUTE_DTYPE", "float32"
    )  # a user model's default: not the CPU's
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/minirl-jax"))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    import jax

    jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


def no_accelerator_reason() -> str | None:
    """Why the GPU lane cannot run here (None: it can)."""
    import jax

    asked = os.environ.get("JAX_PLATFORMS", "")
    try:
        backend = jax.default_backend()
    except RuntimeError as e:  # JAX_PLATFORMS names a platform this machine does not have
        return f"GPU lane: JAX_PLATFORMS={asked!r} failed here: {str(e).splitlines()[0][:200]}"
    if backend != "cpu":
        return None
    return (
        f"GPU lane: JAX sees no accelerator here (backend 'cpu', JAX_PLATFORMS={asked!r}); "
        "run `JAX_PLATFORMS=cuda pytest -m gpu` on a machine with one"
    )


def pytest_collection_modifyitems(config, items):
    if not gpu_lane(config.getoption("markexpr", "")):
        return
    reason = no_accelerator_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason=reason))


def _rollout(prompt, text, sample_index=0, reward=None):
    from minirl.types import Rollout, Score

    return Rollout(
        prompt=prompt,
        sample_index=sample_index,
        tokens=np.zeros(0, np.int32),
        logprobs=np.zeros(0, np.float32),
        versions=np.zeros(0, np.int32),
        finish_reason="eos",
        text=text,
        score=None if reward is None else Score(reward),
    )


@pytest.fixture(scope="session")
def make_rollout():
    return _rollout
