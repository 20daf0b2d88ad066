"""Workers: "call a method, get a future" — the one way the controller reaches its parts.

The controller is the only active part of minirl (RLAX §3). Engine, verifiers and trainer are
passive objects; the controller drives them through `Worker.call(method, *args) -> Future`, and
its code is the same whatever carries the call:

  InProcessWorker(obj)             the default: the call runs right away in this thread, or on
                                   the worker's own thread with `threaded=True` (the async
                                   scheduler overlaps generation and training this way)
  ProcessWorker(factory)           the object lives in a separate local process (`multiprocess`);
                                   messages are msgpack (minirl.serialization), numpy arrays are
                                   sent as raw buffers. A worker process that dies fails its
                                   pending futures with `WorkerDied`; `restart()` brings up a fresh
                                   one and the controller re-issues what was in flight.
  (scale/)                         a remote transport, built on the same two methods.

Calls to one worker run one at a time, in the order they were made (like a real process).

Messages carry minirl's dataclasses (Prompt, Rollout, Score, Batch, Request, and any class registered
with `register_message_type`) as dicts tagged with their type name, so nothing is pickled after
the child starts; the factory that builds the worker's object is sent once, with dill (what
`multiprocess` uses), when the process starts.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from minirl import serialization
from minirl.scheduler import Request
from minirl.types import Batch, Prompt, Rollout, Score

_TYPES: dict[str, type] = {}
_TAG = "__minirl_type__"


class WorkerDied(RuntimeError):
    """The worker's process exited (or was killed) before answering."""


def register_message_type(cls: type) -> type:
    """Allow instances of a dataclass to travel in worker messages (also usable as a decorator)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    _TYPES[cls.__name__] = cls
    return cls


for _cls in (Prompt, Rollout, Score, Batch, Request):
    register_message_type(_cls)


def to_plain(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        name = type(x).__name__
        if _TYPES.get(name) is not type(x):
            raise TypeError(f"{name} cannot be sent to a worker: register it with register_message_type")
        return {_TAG: name, **{f.name: to_plain(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    if isinstance(x, dict):
        return {k: to_plain(v) for k, v in x.items()}
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple (optax state): dict of fields
        return {k: to_plain(v) for k, v in zip(x._fields, x, strict=True)}
    if isinstance(x, (list, tuple)):
        return type(x)(to_plain(v) for v in x)
    if isinstance(x, np.generic):
        return x.item()
    if hasattr(x, "__array__") and not isinstance(x, np.ndarray):  # jax arrays -> host numpy
        return np.asarray(x)
    return x


def from_plain(x: Any) -> Any:
    if isinstance(x, dict):
        if _TAG in x:
            cls = _TYPES[x[_TAG]]
            return cls(**{k: from_plain(v) for k, v in x.items() if k != _TAG})
        return {k: from_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(from_plain(v) for v in x)
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        return x.copy()
    return x


def encode(message: Any) -> bytes:
    """A message (nested Python values, numpy arrays, registered dataclasses) -> bytes."""
    return serialization.to_bytes(to_plain(message))


def decode(data: bytes) -> Any:
    return from_plain(serialization.from_bytes(data))


class InProcessWorker:
    """Runs calls on `obj` in this process: inline (a completed future) or on one thread."""

    def __init__(self, obj: Any, threaded: bool = False):
        self.obj = obj
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="minirl-worker") if threaded else None

    def call(self, method: str, *args, **kwargs) -> Future:
        fn = getattr(self.obj, method)
        if self._pool is not None:
            return self._pool.submit(fn, *args, **kwargs)
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - the caller sees it through the future
            future.set_exception(e)
        return future

    def alive(self) -> bool:
        return True

    def restart(self) -> None:
        pass

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _serve(factory_blob: bytes, conn) -> None:
    """The child process: build the object, then answer (id, method, args, kwargs) messages."""
    import dill

    obj = dill.loads(factory_blob)()
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        call_id, method, args, kwargs = decode(data)
        if method == "__close__":
            return
        try:
            reply = (call_id, True, getattr(obj, method)(*args, **kwargs))
            out = encode(reply)
        except BaseException as e:  # noqa: BLE001 - sent back, raised in the parent
            out = encode((call_id, False, f"{type(e).__name__}: {e}"))
        conn.send_bytes(out)


class WorkerError(RuntimeError):
    """The worker's method raised; the message names the original exception."""


class ProcessWorker:
    """Runs calls on an object built by `factory()` inside a separate local process."""

    def __init__(self, factory: Callable[[], Any], name: str = "worker"):
        self.factory, self.name = factory, name
        self._ids = itertools.count()
        self._proc = None

    def start(self) -> ProcessWorker:
        import dill
        import multiprocess as mp

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(dill.dumps(self.factory), child),
                                 name=f"minirl-{self.name}", daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        return self

    def _read_loop(self) -> None:
        conn, pending = self._conn, self._pending
        while True:
            try:
                call_id, ok, value = decode(conn.recv_bytes())
            except (EOFError, OSError):
                break
            future = pending.pop(call_id, None)
            if future is None:
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(WorkerError(f"{self.name}: {value}"))
        proc = self._proc
        if proc is not None:
            proc.join(timeout=5)  # reap it, so alive() is False once callers see WorkerDied
        with self._lock:  # the process is gone: fail whatever it still owed
            for future in pending.values():
                if not future.done():
                    future.set_exception(WorkerDied(f"{self.name} process exited before answering"))
            pending.clear()

    def call(self, method: str, *args, **kwargs) -> Future:
        if self._proc is None:
            self.start()
        future: Future = Future()
        call_id = next(self._ids)
        with self._lock:
            if not self._reader.is_alive():
                future.set_exception(WorkerDied(f"{self.name} process is not running"))
                return future
            self._pending[call_id] = future
        try:
            self._conn.send_bytes(encode((call_id, method, args, kwargs)))
        except (OSError, ValueError) as e:
            self._pending.pop(call_id, None)
            future.set_exception(WorkerDied(f"{self.name}: cannot send ({e})"))
        return future

    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def restart(self) -> None:
        """Stop the process (if any) and start a fresh one from the same factory."""
        self.close()
        self.start()

    def close(self) -> None:
        if self._proc is None:
            return
        try:
            self._conn.send_bytes(encode((-1, "__close__", (), {})))
        except (OSError, ValueError):
            pass
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
        self._reader.join(timeout=5)
        self._proc = None
