"""Shared fixtures for the verifier tests: rollouts from (text, meta), a fresh repository, and a
poll for leftover sandbox processes (a SIGKILLed process needs a moment to finish exiting)."""

import time

import numpy as np
import pytest

from minirl.types import Prompt, Rollout
from minirl.verifiers import TestRepository
from minirl.verifiers.isolation import stray_processes


@pytest.fixture
def make_rollout():
    def make(text: str, meta: dict | None = None, uid: int = 0) -> Rollout:
        prompt = Prompt(uid=uid, task="t", text="", tokens=np.zeros(1, np.int32), meta=meta or {})
        zeros = np.zeros(1, np.int32)
        return Rollout(prompt, 0, zeros, np.zeros(1, np.float32), zeros, "eos", text=text)

    return make


@pytest.fixture
def repo(tmp_path):
    return TestRepository(tmp_path / "repo")


@pytest.fixture
def wait_no_strays():
    def wait(timeout_s: float = 3.0) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while (left := stray_processes()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    return wait
