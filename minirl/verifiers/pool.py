"""Score a batch in parallel with worker processes that may crash or hang.

    with VerifierPool(CodeVerifier(repo), PoolConfig(workers=2, item_timeout_s=30)) as pool:
        scores = pool.score(rollouts)      # same order as rollouts, whatever finished first

A `VerifierPool` wraps any `Verifier` and is itself a `Verifier`. Each worker process holds its
own copy of the wrapped verifier and scores one rollout at a time; the parent hands out work,
collects results by index (so the output order is the input order: deterministic) and watches
two things:

  - a worker that dies (segfault, OOM kill, a program that managed to signal it) costs the item
    it was scoring a zero reward, reason "verifier worker crashed ...";
  - an item that runs past `item_timeout_s` gets its worker killed, a zero reward, reason
    "verifier timed out ...".

Either way a fresh worker replaces the old one and the batch goes on; `restarts` counts them.
A worker that cannot even start (it never says "ready") is a set-up error and raises.
When a worker is killed mid-run, what its sandbox runs left is cleaned up too: their processes
(as root by their uids, which derive from the worker's pid — a worker's main thread id is its
pid; in every mode by PDEATHSIG) and their work dirs (each worker keeps its temp files in its own
scratch directory, which the pool removes with the worker). Scratch directories are named after
the worker's pid (`minirl-worker-<pid>-...`); one whose worker is gone without cleaning up (the
whole pool SIGKILLed, as a preempted job is) is removed when the next pool starts.

Transport: the `multiprocess` package (dill pickling, so lambdas in a `CallableVerifier` work)
over one duplex pipe per worker. Workers start with "forkserver" by default: forking a parent
that runs JAX threads is unsafe, and forkserver makes replacements cheap. Workers start lazily
on the first `score` (no processes in the constructor); `close()` or the context manager stops
them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import multiprocess
from multiprocess.connection import wait

from minirl.data.verifier_api import Verifier
from minirl.types import Rollout, Score
from minirl.verifiers.child_io import remove_tree
from minirl.verifiers.isolation import kill_thread_sandboxes
from minirl.verifiers.sandbox import fork_here


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    workers: int = 2
    item_timeout_s: float = 60.0  # per rollout; give code at least (#tests x wall limit)
    start_method: str = "forkserver"  # "forkserver" | "spawn" | "fork"

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if not self.item_timeout_s > 0:
            raise ValueError(f"item_timeout_s must be > 0, got {self.item_timeout_s}")
        if self.start_method not in ("forkserver", "spawn", "fork"):
            raise ValueError(f"unknown start_method {self.start_method!r}")


def _recv_or_none(conn: Any) -> Any:
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _worker_main(conn: Any, verifier: Verifier) -> None:
    """Worker loop: make a scratch dir for this process's temp files (sandbox work dirs) and say
    ("ready", scratch); then receive (index, rollout) and send (index, reward, reason) until None
    or EOF (the pool is gone). The scratch dir goes with the worker on any orderly exit (also
    SIGTERM, which multiprocess sends daemon workers at interpreter exit); after a SIGKILL the
    pool removes it."""
    fork_here()  # a single-threaded worker forks its sandboxed programs itself
    scratch = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-")
    os.chmod(scratch, 0o711)  # sandbox uids may pass through to their own work dirs
    tempfile.tempdir = scratch  # this process only: it exists to run this loop
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    try:
        conn.send(("ready", scratch))
        while True:
            message = _recv_or_none(conn)
            if message is None:
                return
            index, rollout = message
            try:
                score = verifier.score([rollout])[0]
            except Exception as e:  # keep the worker alive; the item gets a zero
                score = Score(0.0, f"verifier error: {type(e).__name__}: {e}")
            conn.send((index, float(score.reward), str(score.reason)))
    finally:
        remove_tree(scratch)


_STARTUP_TIMEOUT_S = 120.0
_SCRATCH_PREFIX = "minirl-worker-"


def remove_stale_scratch(tmp: str | None = None) -> list[str]:
    """Remove the scratch directories of workers that no longer run (in `tmp`, default the
    temp dir). Returns what was removed."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        pid = name[len(_SCRATCH_PREFIX) :].split("-")[0]
        if not (name.startswith(_SCRATCH_PREFIX) and pid.isdigit()) or _alive(int(pid)):
            continue
        remove_tree(os.path.join(tmp, name))
        removed.append(name)
    return removed


@contextlib.contextmanager
def private_temp_dir() -> Iterator[str]:
    """Put every temp file of this process and of the processes it starts from here on (pool
    workers, multiprocess's forkserver) under one directory named like a worker's scratch: it
    is removed on exit, or, after a SIGKILL, by the next pool's `remove_stale_scratch`. For a
    process that serves a pool and may be killed whole, like the HTTP verifier service."""
    old_env, old_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    path = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-process-")
    os.chmod(path, 0o711)  # sandbox uids pass through to their own work dirs
    os.environ["TMPDIR"], tempfile.tempdir = path, path
    try:
        yield path
    finally:
        tempfile.tempdir = old_tempdir
        if old_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_env
        remove_tree(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclasses.dataclass
class _Slot:
    process: Any
    conn: Any
    scratch: str = ""  # the worker's temp dir, removed with the worker
    index: int | None = None  # item being scored, None when idle
    deadline: float = 0.0


class VerifierPool:
    """A `Verifier` that fans a batch out over worker processes (see module docstring)."""

    def __init__(self, verifier: Verifier, config: PoolConfig = PoolConfig()):
        self.verifier = verifier
        self.config = config
        self.restarts = 0
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()  # one batch at a time (an async run's rollout thread and
        # its evaluation may score with the same pool)

    # -- lifecycle

    def _spawn(self) -> _Slot:
        ctx = multiprocess.get_context(self.config.start_method)
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_worker_main, args=(child_conn, self.verifier), daemon=True)
        process.start()
        child_conn.close()
        # A worker that cannot even start (unpicklable verifier, missing __main__ guard with
        # forkserver/spawn, broken import) is a set-up error: raise it, don't zero every reward.
        hello = _recv_or_none(parent_conn) if parent_conn.poll(_STARTUP_TIMEOUT_S) else None
        if not (isinstance(hello, tuple) and hello[0] == "ready"):
            process.kill()
            process.join(5)
            raise RuntimeError(
                f"verifier worker failed to start (exit code {process.exitcode}); with "
                f"start_method={self.config.start_method!r} the main script needs an "
                "`if __name__ == '__main__':` guard and the verifier must be picklable"
            )
        return _Slot(process, parent_conn, scratch=hello[1])

    def start(self) -> None:
        if not self._slots:
            remove_stale_scratch()
        while len(self._slots) < self.config.workers:
            self._slots.append(self._spawn())

    def _replace(self, i: int) -> None:
        slot = self._slots[i]
        pid = slot.process.pid
        if slot.process.is_alive():
            slot.process.kill()
        slot.process.join(5)
        slot.conn.close()
        if os.geteuid() == 0 and pid is not None:
            kill_thread_sandboxes(pid)  # what its sandbox left behind
        remove_tree(slot.scratch)
        self._slots[i] = self._spawn()
        self.restarts += 1

    def close(self) -> None:
        for slot in self._slots:
            try:
                slot.conn.send(None)
            except (OSError, ValueError):
                pass
        for slot in self._slots:
            slot.process.join(2)
            if slot.process.is_alive():
                slot.process.kill()
                slot.process.join(2)
            slot.conn.close()
            remove_tree(slot.scratch)
        self._slots = []

    def __enter__(self) -> VerifierPool:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def worker_pids(self) -> list[int]:
        return [slot.process.pid for slot in self._slots]

    @property
    def worker_dirs(self) -> list[str]:
        """Each worker's scratch directory (its sandbox work dirs live inside)."""
        return [slot.scratch for slot in self._slots]

    # -- scoring

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        with self._lock:
            return self._score(rollouts)

    def _score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        self.start()
        results: list[Score | None] = [None] * len(rollouts)
        todo = list(range(len(rollouts)))[::-1]  # pop() from the end = input order
        while todo or any(s.index is not None for s in self._slots):
            for i, slot in enumerate(self._slots):  # hand out work
                if slot.index is None and todo and not slot.process.is_alive():
                    self._replace(i)  # died while idle: nobody's item is lost
                    slot = self._slots[i]
                if slot.index is None and todo:
                    slot.index = todo.pop()
                    slot.deadline = time.monotonic() + self.config.item_timeout_s
                    try:
                        slot.conn.send((slot.index, rollouts[slot.index]))
                    except (OSError, ValueError):
                        pass  # a dead worker: its sentinel fires below
            busy = [s for s in self._slots if s.index is not None]
            timeout = max(0.0, min(s.deadline for s in busy) - time.monotonic())
            ready = wait([s.conn for s in busy] + [s.process.sentinel for s in busy], timeout)
            for i, slot in enumerate(self._slots):
                if slot.index is None:
                    continue
                if slot.conn in ready:
                    try:
                        index, reward, reason = slot.conn.recv()
                    except (EOFError, OSError):
                        ready.append(slot.process.sentinel)
                    else:
                        results[index] = Score(reward, reason)
                        slot.index = None
                        continue
                if slot.process.sentinel in ready:
                    slot.process.join(1)
                    code = slot.process.exitcode
                    results[slot.index] = Score(0.0, f"verifier worker crashed (exit code {code})")
                    self._replace(i)
                elif time.monotonic() >= slot.deadline:
                    limit = self.config.item_timeout_s
                    results[slot.index] = Score(0.0, f"verifier timed out after {limit:g}s")
                    self._replace(i)
        return [r if r is not None else Score(0.0, "not scored") for r in results]
