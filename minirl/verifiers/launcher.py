"""A launcher process that forks sandboxed programs on behalf of a multi-threaded process.

The sandbox starts each program with `subprocess.Popen(preexec_fn=...)`, which is a real
`fork()` of the calling process followed by Python code in the child. In a process with other
threads (JAX's XLA runtime keeps a dozen) that is unsafe: a thread may hold a lock (the
allocator's, the import lock, a logging handler's) at the moment of the fork, and the child, in
which only the forking thread exists, can deadlock on it. JAX warns ("os.fork() was called")
for this reason.

So `run_sandboxed` forks directly only in a process made for it: a `VerifierPool` worker
(single-threaded Python, started by forkserver; it calls `sandbox.fork_here()`) or this
launcher. Any other caller (the trainer's process above all) hands the run to a launcher:

    launcher = Launcher("minirl.verifiers.sandbox:serve_runs")   # nothing started yet
    result = launcher.run(run_args)     # starts the process on first use; runs serve_runs()
    launcher.close()

The launcher is a fresh interpreter, started without forking this process's Python state
(`subprocess.Popen` without `preexec_fn` uses vfork/posix_spawn and runs no Python in the child),
in its own session (a Ctrl-C in the terminal is for its parent to handle). It is
single-threaded (numpy's BLAS threads are switched off in it) and does one run at a time, the
same `sandbox._run` the direct path does, with the run's uid chosen by the caller (so per-thread
uid bookkeeping stays the caller's). Requests and results are pickled over its stdin/stdout; a
launcher that dies is restarted on the next run, and the run it was doing is a sandbox error.
When its parent exits, its stdin closes and it exits; a run in progress ends first, within its
wall limit (its program's PDEATHSIG follows the launcher, not the caller).
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

_HEADER = struct.Struct("<Q")


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("the other side closed the pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other side closed the pipe mid-message")
    return pickle.loads(data)


class LauncherDied(RuntimeError):
    """The launcher process ended while (or before) it did a run."""


class Launcher:
    """The client side: one launcher process per `Launcher`, started lazily, running the
    function `entry` ("module:function", which calls `serve`); `run` is safe to call from any
    thread (runs are serialised)."""

    def __init__(self, entry: str):
        module, _, function = entry.partition(":")
        self._code = f"from {module} import {function}; {function}()"
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self.starts = 0  # how many launcher processes were started (for tests)

    def _start(self) -> subprocess.Popen:
        package_root = str(Path(__file__).resolve().parents[3])  # the directory holding minirl/
        path = os.environ.get("PYTHONPATH", "")
        env = {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
        env.update({k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")})
        self.starts += 1
        return subprocess.Popen(
            [sys.executable, "-c", self._code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,
        )

    def run(self, args: tuple) -> Any:
        """The served function's result for `args` in the launcher, or the exception it raised
        (re-raised here); `LauncherDied` if the process ended first (the next run starts a new
        one)."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = self._start()
            try:
                _send(self._proc.stdin, args)
                ok, value = _receive(self._proc.stdout)
            except (EOFError, OSError) as e:
                self._stop()
                raise LauncherDied(f"the sandbox launcher died: {e}") from None
        if not ok:
            raise value
        return value

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the launcher (it exits when its stdin closes)."""
        with self._lock:
            self._stop()


def serve(handle: Callable[..., Any]) -> None:
    """The launcher's loop: read args -> `handle(*args)` -> write (True, result) or (False,
    the exception), until stdin closes."""
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the reply pipe
    while True:
        try:
            args = _receive(requests)
        except EOFError:
            return
        try:
            reply = (True, handle(*args))
        except Exception as e:  # a set-up error (e.g. a bad file name): the caller raises it
            reply = (False, e)
        _send(replies, reply)
