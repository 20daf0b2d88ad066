"""RemoteWorker / serve: minirl's worker interface over TCP on 127.0.0.1 (server in a thread)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from minirl.types import Prompt, Score
from minirl.workers import WorkerDied, WorkerError
from scale.launch import wait_for_output
from scale.remote_worker import RemoteWorker, serve
from scale.tensorstore_weights import StoredWeights

TOKEN = "worker-token-123"


class Counter:
    def __init__(self):
        self.calls = []

    def add(self, x, y=0):
        self.calls.append((x, y))
        return x + y

    def echo(self, value):
        return value

    def fail(self):
        raise ValueError("bad input 42")


@pytest.fixture
def server():
    obj = Counter()
    ready, address = threading.Event(), []

    def announce(a):
        address.append(a)
        ready.set()

    thread = threading.Thread(
        target=serve, args=(obj, "127.0.0.1", 0, TOKEN, announce), daemon=True
    )
    thread.start()
    assert ready.wait(10)
    yield obj, address[0], thread
    if thread.is_alive():
        RemoteWorker(address[0], TOKEN).shutdown()
        thread.join(10)


def test_calls_run_in_order_and_carry_minirl_types(server):
    obj, address, _ = server
    worker = RemoteWorker(address, TOKEN)
    futures = [worker.call("add", i, y=10) for i in range(20)]
    assert [f.result(10) for f in futures] == [i + 10 for i in range(20)]
    assert obj.calls == [(i, 10) for i in range(20)]
    prompt = Prompt(7, "t", "hi", np.array([1, 2, 3], np.int32), {"answer": "4"})
    back = worker.call("echo", [prompt, Score(1.0, "ok"), StoredWeights(3)]).result(10)
    assert back[1] == Score(1.0, "ok") and back[2] == StoredWeights(3)
    assert back[0].uid == 7 and back[0].meta == {"answer": "4"}
    np.testing.assert_array_equal(back[0].tokens, [1, 2, 3])
    big = np.arange(1 << 18, dtype=np.float32)  # 1 MB: framed in two sends
    np.testing.assert_array_equal(worker.call("echo", big).result(10), big)
    worker.close()


def test_errors_come_back_through_the_future(server):
    _, address, _ = server
    worker = RemoteWorker(address, TOKEN)
    with pytest.raises(WorkerError, match="ValueError: bad input 42"):
        worker.call("fail").result(10)
    with pytest.raises(WorkerError, match="private method"):
        worker.call("_secret").result(10)
    assert worker.call("add", 1, 2).result(10) == 3  # the server goes on
    worker.close()


def test_wrong_token_is_refused(server):
    _, address, _ = server
    with pytest.raises(WorkerError, match="refused the token"):
        RemoteWorker(address, "not-the-token").call("add", 1)
    worker = RemoteWorker(address, TOKEN)
    assert worker.call("add", 2, 2).result(10) == 4  # still serving
    worker.close()  # one client at a time: free the server for the next


def test_a_stopped_server_fails_calls_with_worker_died(server):
    _, address, thread = server
    worker = RemoteWorker(address, TOKEN)
    worker.shutdown()
    thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(WorkerDied, match="cannot connect"):
        worker.call("add", 1).result(10)
    assert not worker.alive()


@pytest.mark.slow  # two JAX processes: ~10 s
def test_a_two_process_job_runs_every_call_on_both_processes(tmp_path):
    import json
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("spmd_worker.py")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    log = tmp_path / "calls"
    procs = [subprocess.Popen([sys.executable, str(script), str(log), coordinator, str(i)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(2)]  # fmt: skip
    try:
        address, _ = wait_for_output(procs[0], r"listening on (127\.0\.0\.1:\d+)", 300)
        worker = RemoteWorker(address, "spmd-token-123")
        assert worker.call("total", [1, 2]).result(120) == 6.0  # 3 on each of 2 devices
        assert worker.call("total", [5]).result(120) == 10.0
        worker.shutdown()
        assert [p.wait(120) for p in procs] == [0, 0]
        calls = [json.loads(Path(f"{log}.{i}").read_text()) for i in range(2)]
        assert calls[0] == calls[1] == [["total", [1, 2]], ["total", [5]]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
