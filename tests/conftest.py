"""Shared test set-up: JAX's persistent compilation cache (compiles are the cost of this suite),
and `make_rollout` (a Rollout carrying just a prompt and a text) for the data and task tests."""

import os

import numpy as np
import pytest

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/minirl-jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


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
