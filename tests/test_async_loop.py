"""The rollout thread's admission rule, on a stub controller (no model, no threads started)."""

import threading

import numpy as np

from minirl.async_loop import RolloutThread
from minirl.config import RLConfig
from minirl.controller import Controller, Counters
from minirl.types import Prompt


class StubController:
    """What `RolloutThread._admit` reads: the lock, the knobs, the counters, the prompt source."""

    def __init__(self, version: int, engine_version: int):
        self.cond = threading.Condition()
        self.rl = RLConfig(prompts_per_step=2, group_size=2, eta=0, max_lag=1)
        self.counters = Counters(
            version=version, engine_version=engine_version, groups_produced=2 * version,
            groups_trained=2 * version,
        )
        self.max_new_tokens = 4
        self.next_uid = 0

    reload_due = Controller.reload_due
    unconsumed = Controller.unconsumed

    def usable(self, prompts):
        return prompts

    @property
    def mixture(self):
        return self

    def next_prompts(self, n):
        self.next_uid += n
        return [
            Prompt(u, "t", "1+1=", np.array([1, 2], np.int32))
            for u in range(self.next_uid - n, self.next_uid)
        ]


class StubEngine:
    def __init__(self):
        self.requests = []

    def submit(self, requests):
        self.requests += requests


def test_no_prompt_is_admitted_while_a_reload_is_due():
    """The trainer may publish between the thread's reload check and its admission. Prompts
    admitted then would be sampled by the old weights and refused by k = 1: generation wasted
    (and, before stale discards stopped counting against eta, a stalled run at eta = 0)."""
    engine = StubEngine()
    due = RolloutThread(StubController(version=3, engine_version=2), engine)
    due._admit()
    assert engine.requests == [] and due.in_flight == {}
    fresh = RolloutThread(StubController(version=3, engine_version=3), engine)
    fresh._admit()  # the engine holds the newest weights: one batch (2 prompts x 2 samples)
    assert len(engine.requests) == 4 and len(fresh.in_flight) == 2
