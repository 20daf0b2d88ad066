"""The rollout thread's admission rule, on a stub controller (no model, no threads started)."""

import threading

import numpy as np

from minirl.config import RLConfig
from minirl.control.async_loop import RolloutThread
from minirl.control.controller import Controller, Counters
from minirl.types import Prompt


class StubController:
    """What `RolloutThread._admit` reads: the lock, the knobs, the counters, the prompt source."""

    def __init__(self, version: int, engine_version: int):
        self.cond = threading.Condition()
        self.rl = RLConfig(prompts_per_step=2, group_size=2, eta=0, max_lag=1)
        self.counters = Counters(
            version=version,
            engine_version=engine_version,
            groups_produced=2 * version,
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


class CheckedLock:
    """A lock that runs `check` whenever it is released by its outermost holder: the moments
    another thread (the trainer taking a snapshot) could acquire it."""

    def __init__(self, check):
        self._lock, self._depth, self.check = threading.RLock(), 0, check

    def acquire(self, *args):
        got = self._lock.acquire(*args)
        self._depth += got
        return got

    def release(self):
        self._depth -= 1
        if self._depth == 0:
            self.check()
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


def test_every_issued_prompt_is_in_flight_whenever_a_snapshot_could_be_taken():
    """A checkpoint is a snapshot taken under the controller's lock (run_dir.save_checkpoint).
    Whenever the rollout thread lets go of the lock, every prompt the mixture has issued must be
    in flight (nothing is buffered here): a prompt a snapshot saw neither buffered nor in flight
    would never be trained by a resumed run (a race an async kill-and-resume test once hit)."""
    ctl = StubController(version=0, engine_version=0)
    thread = RolloutThread(ctl, StubEngine())
    checks = []

    def every_issued_prompt_in_flight():
        checks.append(sorted(thread.in_flight) == list(range(ctl.next_uid)))

    ctl.cond = threading.Condition(CheckedLock(every_issued_prompt_in_flight))
    thread._admit()
    thread.resubmit(ctl.next_prompts(1))  # a resumed run re-issues its snapshot's prompts
    assert len(thread.in_flight) == 3 and checks and all(checks), checks


def test_the_rollout_thread_asks_the_engine_nothing_it_already_knows():
    """Whether the engine has work is what the thread has in flight: one loop is an admission
    and an engine step, no `pending` round trip (one per loop, to a remote engine)."""

    class Recording(StubEngine):
        calls = []

        def submit(self, requests):
            self.calls.append("submit")

        def step(self):
            self.calls.append("step")
            thread.stop()
            return []

    engine = Recording()
    thread = RolloutThread(StubController(version=0, engine_version=0), engine)
    thread.run()  # one loop, in this thread
    assert thread.error is None and engine.calls == ["submit", "step"]
