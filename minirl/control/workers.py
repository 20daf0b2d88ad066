"""Workers: "call a method, get a future" — the one way the controller reaches its parts.

The controller is the only active part of minirl (RLAX §3). Engine, verifiers and trainer are
passive objects; the controller drives them through `Worker.call(method, *args) -> Future`, and
its code is the same whatever carries the call:

  InProcessWorker(obj)             the default: the call runs right away in this thread, or on
                                   the worker's own thread with `threaded=True` (the async
                                   scheduler overlaps generation and training this way)
  ProcessWorker(factory)           the object lives in a separate local process (`multiprocess`);
                                   messages are msgpack (minirl.store.serialization), numpy arrays are
                                   sent as raw buffers. A worker process that dies fails its
                                   pending futures with `WorkerDied`; `restart()` brings up a fresh
                                   one and the controller re-issues what was in flight.
  RayWorker(factory)               (scale/ray_workers.py) the object lives in a Ray actor,
                                   anywhere on a Ray cluster; same messages, same WorkerDied.

Where a run's parts live is a placement: `LocalPlacement("inprocess" | "process")` here (the
`rl.workers` knob of `minirl train`), `RayPlacement` in scale/ray_workers.py. `tools.runner.Run`
asks it for an engine, a trainer and a verifier worker, each from a factory that builds the part.

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

from minirl.inference.scheduler import Request
from minirl.store import serialization
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
            raise TypeError(
                f"{name} cannot be sent to a worker: register it with register_message_type"
            )
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
        # start / close / call are atomic with respect to each other: a call made while another
        # thread restarts the worker registers its future and sends its message on the SAME
        # process's pipe (else its answer arrives where nobody waits for it, and it hangs)
        self._state = threading.RLock()

    def start(self) -> ProcessWorker:
        with self._state:
            return self._start()

    def _start(self) -> ProcessWorker:
        import dill
        import multiprocess as mp

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(dill.dumps(self.factory), child),
            name=f"minirl-{self.name}",
            daemon=True,
        )
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
        future: Future = Future()
        call_id = next(self._ids)
        with self._state:
            if self._proc is None:
                self.start()
            with self._lock:
                if not self._reader.is_alive():
                    future.set_exception(WorkerDied(f"{self.name} process is not running"))
                    return future
                self._pending[call_id] = future
            try:
                self._conn.send_bytes(encode((call_id, method, args, kwargs)))
            except (OSError, ValueError) as e:
                with self._lock:  # the reader may have failed it already, as the process died
                    self._pending.pop(call_id, None)
                    if not future.done():
                        future.set_exception(WorkerDied(f"{self.name}: cannot send ({e})"))
        return future

    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def restart(self) -> None:
        """Stop the process (if any) and start a fresh one from the same factory."""
        with self._state:
            self.close()
            self.start()

    def close(self) -> None:
        with self._state:
            self._close()

    def _close(self) -> None:
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


class LocalPlacement:
    """Where `minirl train` puts its parts (`rl.workers`): everything in this process
    (`inprocess`), or the engine, the verifier and a distillation teacher each in a local
    process (`process`; the trainer stays here). Each method takes a factory that builds the part, and `engine` and
    `verifier` may be given the part already built in this process, used in place of a new one
    when the part stays here."""

    def __init__(self, kind: str = "inprocess"):
        if kind not in ("inprocess", "process"):
            raise ValueError(f"placement must be inprocess or process, got {kind!r}")
        self.kind = kind

    def _worker(self, name: str, factory: Callable[[], Any], local: Any = None):
        if self.kind == "process":
            return ProcessWorker(factory, name=name).start()
        return InProcessWorker(factory() if local is None else local)

    def engine(self, factory: Callable[[], Any], local: Any = None):
        return self._worker("engine", factory, local)

    def verifier(self, factory: Callable[[], Any], local: Any = None):
        return self._worker("verifier", factory, local)

    def trainer(self, factory: Callable[[], Any]):
        return InProcessWorker(factory())

    def teacher(self, factory: Callable[[], Any]):
        return self._worker("teacher", factory)


def gather(futures: list[Future], combine: Callable[[list], Any]) -> Future:
    """One future for several: `combine(results)` once all succeed. Fails fast: the first
    `WorkerDied` fails it at once (the other calls may never answer: a multi-process job's live
    processes wait in a collective for the dead one), so the caller's restart path sees it;
    any other error fails it once every call has answered (the first such error)."""
    out: Future = Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def done(f: Future) -> None:
        with lock:
            if out.done():
                return
            remaining[0] -= 1
            if isinstance(f.exception(), WorkerDied):
                out.set_exception(f.exception())
                return
            if remaining[0]:
                return
            errors = [g.exception() for g in futures if g.exception() is not None]
            if errors:
                out.set_exception(errors[0])
                return
            try:
                out.set_result(combine([g.result() for g in futures]))
            except BaseException as e:  # noqa: BLE001 - the caller sees it through the future
                out.set_exception(e)

    for f in futures:
        f.add_done_callback(done)
    return out


def call_restarting(
    worker,
    method: str,
    *args,
    on_restart: Callable[[Exception], None] | None = None,
    recover: Callable[[], bool | None] | None = None,
    attempts: int = 3,
):
    """`worker.call(method, *args).result()`; if the worker's process died, restart it and call
    again, up to `attempts` calls in all. For parts whose answers depend only on what they are
    sent (a verdict; rollouts keyed by counter-based RNG), so a retry gives what the lost call
    would have. `on_restart(error)` hears of each death first (to log and count it);
    `recover()` runs after the restart (reload the weights the old process held, re-submit
    its requests) and returns True when that already did this call's work (None is returned)."""
    for attempt in range(attempts):
        try:
            return worker.call(method, *args).result()
        except WorkerDied as e:
            if attempt == attempts - 1:
                raise
            if on_restart is not None:
                on_restart(e)
            worker.restart()
            if recover is not None and recover():
                return None


def _sum_counts(results: list[dict]) -> dict:
    return {k: sum(r[k] for r in results) for k in results[0]}


class Replicas:
    """N engine workers behind one: data-parallel rollout. The controller and the rollout thread
    call it like one engine:

      generate(requests)   split into N contiguous shares, run at once, results in request order
      submit(requests)     requests dealt round-robin, so every replica gets a fair share
      step()               every replica steps at once; the finished rollouts of all
      pending, interrupt   summed over replicas;  work_stats: summed per counter
      anything else        (load_weights) sent to every replica; replica 0's answer

    Every replica loads the same version when the controller reloads (the j rule is the
    controller's), and each tags its tokens with the version it holds, as one engine does.
    Sampling is keyed by (seed, prompt, sample, position), so with `engine.exact` the rollouts do
    not depend on which replica made them. If one replica dies the call fails with `WorkerDied`
    and `restart()` restarts all of them: the caller re-issues everything in flight."""

    def __init__(self, workers: list):
        if not workers:
            raise ValueError("Replicas needs at least one worker")
        self.workers = list(workers)
        self._next = 0  # where round-robin submission resumes

    def call(self, method: str, *args, **kwargs) -> Future:
        ws, n = self.workers, len(self.workers)
        if method == "generate":
            (requests,) = args
            requests = list(requests)
            bounds = [len(requests) * i // n for i in range(n + 1)]
            shares = [requests[bounds[i] : bounds[i + 1]] for i in range(n)]
            futures = [w.call("generate", s) for w, s in zip(ws, shares, strict=True) if s]
            return gather(futures, lambda parts: [r for part in parts for r in part])
        if method == "submit":
            (requests,) = args
            shares = [[] for _ in ws]
            for i, request in enumerate(requests):
                shares[(self._next + i) % n].append(request)
            self._next = (self._next + len(requests)) % n
            return gather(
                [w.call("submit", s) for w, s in zip(ws, shares, strict=True) if s]
                or [_done(None)],
                lambda _: None,
            )
        futures = [w.call(method, *args, **kwargs) for w in ws]
        if method == "step":
            return gather(futures, lambda parts: [r for part in parts for r in part])
        if method in ("pending", "interrupt"):
            return gather(futures, sum)
        if method == "work_stats":
            return gather(futures, _sum_counts)
        return gather(futures, lambda results: results[0])

    def alive(self) -> bool:
        return all(w.alive() for w in self.workers)

    def restart(self) -> None:
        for w in self.workers:
            w.restart()
        self._next = 0

    def close(self) -> None:
        for w in self.workers:
            w.close()


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
