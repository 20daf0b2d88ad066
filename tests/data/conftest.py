"""Shared helpers for the data-layer tests: a Rollout carrying just a prompt and a text."""

import numpy as np
import pytest

from minirl.types import Rollout


def _rollout(prompt, text, sample_index=0, reward=None):
    from minirl.types import Score

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
