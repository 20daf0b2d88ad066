"""The worker transports: same results in-process and in a child process; death is reported."""

import os
import signal
import time

import numpy as np
import pytest

from minirl.control.workers import (
    InProcessWorker,
    ProcessWorker,
    WorkerDied,
    WorkerError,
    decode,
    encode,
)
from minirl.types import Prompt, Rollout, Score


class Echo:
    def __init__(self, scale=2.0):
        self.scale = scale
        self.calls = 0

    def double(self, x):
        self.calls += 1
        return x * self.scale

    def score(self, rollouts):
        return [Score(float(len(r.tokens)), "len") for r in rollouts]

    def count(self):
        return self.calls

    def fail(self):
        raise ValueError("bad input")

    def sleep(self, seconds):
        time.sleep(seconds)
        return seconds

    def pid(self):
        return os.getpid()


def make_echo():
    return Echo(3.0)


def _rollout(n):
    p = Prompt(
        uid=7, task="t", text="1+1", tokens=np.array([1, 5, 6], np.int32), meta={"answer": "2"}
    )
    return Rollout(
        p,
        0,
        np.arange(n, dtype=np.int32),
        np.full(n, -0.5, np.float32),
        np.zeros(n, np.int32),
        "eos",
    )


def test_codec_round_trips_dataclasses_and_arrays():
    msg = (3, "score", ([_rollout(4)],), {"k": np.float32(1.5), 2: None})
    back = decode(encode(msg))
    r = back[2][0][0]
    assert isinstance(r, Rollout) and isinstance(r.prompt, Prompt)
    np.testing.assert_array_equal(r.tokens, np.arange(4))
    assert r.logprobs.dtype == np.float32 and r.prompt.meta == {"answer": "2"}
    assert back[3] == {"k": 1.5, 2: None}


def test_codec_sends_namedtuples_as_dicts_of_fields():
    # an optimizer state (optax: tuples of namedtuples) travels as the checkpoint format stores
    # it, so a remote trainer's state_dict can be checkpointed and loaded back
    import collections

    State = collections.namedtuple("State", ["count", "mu"])
    back = decode(encode({"opt_state": (State(np.int32(2), {"w": np.ones(3, np.float32)}),)}))
    (state,) = back["opt_state"]
    assert state["count"] == 2 and state["mu"]["w"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("threaded", [False, True])
def test_in_process_worker(threaded):
    w = InProcessWorker(Echo(), threaded=threaded)
    assert w.call("double", 4).result() == 8
    with pytest.raises(ValueError, match="bad input"):
        w.call("fail").result()
    w.close()


@pytest.fixture(scope="module")
def proc():
    w = ProcessWorker(make_echo, name="echo").start()
    yield w
    w.close()


def test_process_worker_matches_in_process(proc):
    local = InProcessWorker(make_echo())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(proc.call("double", x).result(), local.call("double", x).result())
    rolls = [_rollout(3), _rollout(5)]
    assert proc.call("score", rolls).result() == local.call("score", rolls).result()
    assert proc.call("pid").result() != os.getpid()


def test_process_worker_reports_errors_and_keeps_going(proc):
    with pytest.raises(WorkerError, match="ValueError: bad input"):
        proc.call("fail").result(timeout=30)
    assert proc.call("double", 1).result(timeout=30) == 3.0


def test_calls_run_in_order(proc):
    futures = [proc.call("double", i) for i in range(20)]
    assert [f.result(timeout=30) for f in futures] == [3.0 * i for i in range(20)]


def test_killed_process_fails_pending_calls_and_restarts():
    w = ProcessWorker(make_echo, name="victim").start()
    pid = w.call("pid").result(timeout=30)
    slow = w.call("sleep", 30)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDied):
        slow.result(timeout=30)
    assert not w.alive()
    with pytest.raises(WorkerDied):
        w.call("double", 1).result(timeout=30)
    w.restart()
    assert w.call("double", 2).result(timeout=30) == 6.0
    assert w.call("pid").result(timeout=30) != pid
    w.close()
    assert not w.alive()


def test_a_send_into_a_dying_process_fails_the_call_once():
    """The race the async loop met: the process dies while a call is being sent, the reader
    thread fails the call's future (the process owed it an answer), then the send itself breaks
    its pipe. The caller gets one WorkerDied, never InvalidStateError from a second failure."""
    w = ProcessWorker(make_echo, name="dying").start()
    conn = w._conn

    class Breaking:
        def send_bytes(self, data):
            with w._lock:  # what the reader does when the process exits
                for future in w._pending.values():
                    future.set_exception(WorkerDied("dying process exited before answering"))
            raise BrokenPipeError(32, "Broken pipe")

        def __getattr__(self, name):
            return getattr(conn, name)

    w._conn = Breaking()
    future = w.call("double", 1)
    with pytest.raises(WorkerDied, match="exited before answering"):
        future.result(timeout=30)
    assert w._pending == {}
    w._conn = conn
    w.close()


def test_gather_fails_at_once_when_a_worker_dies_and_waits_for_other_errors():
    """A death fails the gathered call without waiting for the others (in a multi-process job
    they may wait forever for the dead one); other errors once all have answered."""
    from concurrent.futures import Future

    from minirl.control.workers import WorkerDied, gather

    slow, dying = Future(), Future()
    out = gather([slow, dying], lambda results: results)
    dying.set_exception(WorkerDied("gone"))
    assert out.done() and isinstance(out.exception(), WorkerDied)
    a, b = Future(), Future()
    out = gather([a, b], lambda results: results)
    b.set_exception(ValueError("bad"))
    assert not out.done()
    a.set_result(1)
    assert isinstance(out.exception(), ValueError)
    c, d = Future(), Future()
    out = gather([c, d], sum)
    c.set_result(2), d.set_result(3)
    assert out.result() == 5


def test_call_restarting_restarts_recovers_and_calls_again():
    """Two deaths: two restarts, each followed by `recover`, then the answer; a third death in
    a row is the caller's; a `recover` that did the call's work ends it."""
    from concurrent.futures import Future

    from minirl.control.workers import WorkerDied, call_restarting

    class Flaky:
        def __init__(self, deaths):
            self.deaths, self.log = deaths, []

        def call(self, method, *args):
            self.log.append(method)
            future = Future()
            if self.deaths:
                self.deaths -= 1
                future.set_exception(WorkerDied("killed"))
            else:
                future.set_result(args[0] * 2)
            return future

        def restart(self):
            self.log.append("restart")

    worker, heard = Flaky(deaths=2), []
    recover = lambda: worker.log.append("recover")  # noqa: E731
    assert call_restarting(worker, "double", 21, on_restart=heard.append, recover=recover) == 42
    assert worker.log == ["double", "restart", "recover"] * 2 + ["double"]
    assert [str(e) for e in heard] == ["killed", "killed"]
    with pytest.raises(WorkerDied):
        call_restarting(Flaky(deaths=3), "double", 1)
    done = Flaky(deaths=1)
    assert call_restarting(done, "submit", 1, recover=lambda: True) is None
    assert done.log == ["submit", "restart"]
