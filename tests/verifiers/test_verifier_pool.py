"""VerifierPool: order, parallelism, hung and crashed workers, start-up failures."""

import os
import signal
import time

import pytest

from minirl.types import Score
from minirl.verifiers import CallableVerifier, MathVerifier, PoolConfig, Verifier, VerifierPool


def judge(text: str, meta: dict) -> Score:
    """A task function whose behaviour the text chooses: a value, a delay, a hang or a crash."""
    kind, _, arg = text.partition(":")
    if kind == "sleep":
        time.sleep(float(arg))
        return Score(1.0, f"slept {arg}")
    if kind == "hang":
        time.sleep(60)
    if kind == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if kind == "pid":
        time.sleep(0.2)  # long enough that both items are out before either returns
        return Score(1.0, str(os.getpid()))
    if kind == "raise":
        raise RuntimeError("bad task function")
    return Score(float(arg), f"value {arg}")


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(CallableVerifier(judge), PoolConfig(workers=2, item_timeout_s=1.0)) as p:
        yield p


def test_pool_is_a_verifier():
    assert isinstance(VerifierPool(MathVerifier()), Verifier)
    assert VerifierPool(MathVerifier())._slots == []  # no processes until first use


def test_output_order_is_input_order_whatever_finishes_first(pool, make_rollout):
    texts = ["sleep:0.3", "value:0.1", "sleep:0.1", "value:0.2", "sleep:0.2", "value:0.3"]
    scores = pool.score([make_rollout(t) for t in texts])
    assert [s.reason for s in scores] == [
        "slept 0.3",
        "value 0.1",
        "slept 0.1",
        "value 0.2",
        "slept 0.2",
        "value 0.3",
    ]
    assert pool.score([]) == []


def test_two_workers_share_a_batch(pool, make_rollout):
    scores = pool.score([make_rollout("pid"), make_rollout("pid")])
    assert {s.reason for s in scores} == {str(pid) for pid in pool.worker_pids}  # both worked


def test_two_threads_scoring_with_one_pool_each_get_their_own_scores(pool, make_rollout):
    """An async run's rollout thread and its evaluation may score with the same pool (the
    `--verifier code` pool of a dataset run): batches take turns, none gets another's scores."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [[make_rollout(f"value:0.{t}{i}") for i in range(4)] for t in (1, 2)]
    batches[0].insert(0, make_rollout("sleep:0.2"))  # both batches are in flight together
    with ThreadPoolExecutor(2) as threads:
        got = list(threads.map(pool.score, batches))
    assert [s.reason for s in got[0]] == ["slept 0.2"] + [f"value 0.1{i}" for i in range(4)]
    assert [s.reason for s in got[1]] == [f"value 0.2{i}" for i in range(4)]


def test_hung_and_crashed_workers_cost_only_their_item(pool, make_rollout):
    restarts = pool.restarts
    pids = set(pool.worker_pids)
    texts = ["value:1", "hang", "value:0.5", "crash", "segfault", "raise", "value:0.25"]
    scores = pool.score([make_rollout(t) for t in texts])
    assert [s.reward for s in scores] == [1.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.25]
    assert scores[1].reason == "verifier timed out after 1s"
    assert scores[3].reason == "verifier worker crashed (exit code -9)"
    assert scores[4].reason == "verifier worker crashed (exit code -11)"
    assert scores[5].reason == "verifier error in judge: RuntimeError: bad task function"
    assert pool.restarts == restarts + 3
    assert len(pool.worker_pids) == 2 and not pids & set(pool.worker_pids)  # replaced workers
    again = pool.score([make_rollout("value:1")] * 3)  # and the pool keeps going
    assert [s.reward for s in again] == [1.0] * 3


def test_one_and_two_workers_agree(make_rollout):
    rollouts = [make_rollout(f"\\boxed{{{i}}}", {"answer": str(i % 3)}) for i in range(6)]
    serial = MathVerifier().score(rollouts)
    with VerifierPool(MathVerifier(), PoolConfig(workers=1)) as one:
        assert one.score(rollouts) == serial
    with VerifierPool(MathVerifier(), PoolConfig(workers=2)) as two:
        assert two.score(rollouts) == serial


class Unpicklable:
    def __reduce__(self):
        raise TypeError("cannot be sent to a worker")

    def score(self, rollouts):
        return []


def fail_in_worker():
    raise ImportError("the worker cannot rebuild this verifier")


class BreaksInWorker:
    def __reduce__(self):
        return (fail_in_worker, ())

    def score(self, rollouts):
        return []


def test_a_verifier_that_cannot_reach_or_start_a_worker_is_a_clear_error():
    with pytest.raises(TypeError, match="cannot be sent to a worker"):
        VerifierPool(Unpicklable(), PoolConfig(workers=1)).start()
    pool = VerifierPool(BreaksInWorker(), PoolConfig(workers=1))
    with pytest.raises(RuntimeError, match="verifier worker failed to start"):
        pool.start()
    pool.close()


def test_config_validation():
    with pytest.raises(ValueError, match="workers"):
        PoolConfig(workers=0)
    with pytest.raises(ValueError, match="item_timeout_s"):
        PoolConfig(item_timeout_s=0)
    with pytest.raises(ValueError, match="start_method"):
        PoolConfig(start_method="thread")


def test_worker_dirs_are_removed_even_if_close_is_forgotten(tmp_path):
    """At interpreter exit multiprocess sends daemon workers SIGTERM; they clean up after
    themselves. Also covers SIGTERM directly."""
    import pathlib
    import subprocess
    import sys
    import textwrap

    import minirl

    script = tmp_path / "forget_close.py"
    script.write_text(
        textwrap.dedent("""
        import os, signal, time
        from minirl.verifiers import CallableVerifier, PoolConfig, VerifierPool
        if __name__ == "__main__":
            pool = VerifierPool(CallableVerifier(lambda text, meta: 1.0), PoolConfig(workers=2))
            pool.start()
            print(" ".join(pool.worker_dirs), flush=True)
            os.kill(pool.worker_pids[0], signal.SIGTERM)
            pool._slots[0].process.join(10)
            print(os.path.exists(pool.worker_dirs[0]), flush=True)
            # no pool.close()
    """)
    )
    root = pathlib.Path(minirl.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    dirs, after_sigterm = proc.stdout.split("\n")[:2]
    dirs = dirs.split()
    assert len(dirs) == 2 and after_sigterm == "False"
    assert not any(os.path.exists(d) for d in dirs)
