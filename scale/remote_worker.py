"""Workers over TCP: minirl.workers' "call a method, get a future", across hosts.

minirl's controller reaches its parts through `worker.call(method, *args) -> Future`
(minirl/workers.py: in-process and local-process transports). This is the remote one:

    # on the engine host (scale/launch.py does this):
    serve(engine_role, host="0.0.0.0", port=8471, token=token)     # blocks, answers calls

    # on the controller host:
    engine = RemoteWorker("engine-host:8471", token)
    rollouts = engine.call("generate", requests).result()

Messages are minirl.workers' own encoding (msgpack + raw numpy buffers; Prompt, Rollout, Score,
Batch and registered dataclasses travel as tagged dicts; nothing is pickled), framed by an
8-byte length. The first frame of a connection is the bearer token (compared in constant time;
a wrong one closes the connection). Calls run one at a time, in the order they were made, like
every minirl worker. A lost connection fails the pending futures with `WorkerDied`; `restart()`
reconnects (restarting the remote process itself is the job of whoever runs the hosts —
Kubernetes, SLURM, a shell loop).

A worker that is itself a multi-host JAX job (a TPU slice: every host must run the same jitted
calls) is served SPMD-style: process 0 answers the network and broadcasts each call to the other
processes of its job (`jax.experimental.multihost_utils`), which run it too and discard the
result (`follow`). The controller sees one worker.

Simplified on purpose: plain TCP (use a private network, an SSH tunnel or a TLS proxy); one
client connection at a time; no call timeouts (the controller decides what is too slow).
"""

from __future__ import annotations

import hmac
import itertools
import socket
import struct
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from minirl.workers import WorkerDied, WorkerError, decode, encode

__all__ = ["RemoteWorker", "follow", "serve"]

_HEADER = struct.Struct("<Q")
MAX_FRAME = 1 << 34  # 16 GiB: a sanity bound on a length read from the network
SHUTDOWN = "__shutdown__"  # the method name that stops `serve`


def _send(sock: socket.socket, data: bytes) -> None:
    header = _HEADER.pack(len(data))
    if len(data) < 1 << 16:
        sock.sendall(header + data)  # small: one segment
    else:
        sock.sendall(header)
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("connection closed")
        got += k
    return bytes(buf)


def _recv(sock: socket.socket) -> bytes:
    (n,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"frame of {n} bytes exceeds the limit")
    return _recv_exact(sock, n)


# ------------------------------------------------------------------------------------- server


def _broadcast(data: bytes | None) -> bytes:
    """Process 0's bytes to every process of the JAX job (others pass None)."""
    from jax.experimental import multihost_utils

    n = np.array([0 if data is None else len(data)], np.int64)
    n = int(multihost_utils.broadcast_one_to_all(n)[0])
    buf = np.frombuffer(data, np.uint8) if data is not None else np.zeros(n, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(buf)).tobytes()


def _spmd() -> bool:
    import jax

    return jax.process_count() > 1


def _run(obj: Any, message: bytes) -> tuple[bytes, bool]:
    """Execute one encoded call on `obj`; returns (encoded reply, stop?)."""
    call_id, method, args, kwargs = decode(message)
    if method == SHUTDOWN:
        return encode((call_id, True, None)), True
    try:
        if method.startswith("_"):
            raise AttributeError(f"private method {method!r} cannot be called remotely")
        return encode((call_id, True, getattr(obj, method)(*args, **kwargs))), False
    except BaseException as e:  # noqa: BLE001 - sent back, raised in the caller
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        return encode((call_id, False, detail)), False


def serve(
    obj: Any, host: str, port: int, token: str, announce: Callable[[str], None] | None = None
) -> None:
    """Answer calls on `obj` until a `__shutdown__` call. `announce("host:port")` is called once
    listening (port 0 = any free port). In a multi-process JAX job, call it on process 0 and
    `follow(obj)` on the others."""
    if not token:
        raise ValueError("serve needs a non-empty token")
    spmd = _spmd()
    with socket.create_server((host, port), reuse_port=False) as listener:
        if announce is not None:
            host, port = listener.getsockname()[:2]
            announce(f"{host}:{port}")
        stop = False
        while not stop:
            conn, _ = listener.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                try:
                    if not hmac.compare_digest(_recv(conn), token.encode()):
                        continue  # wrong token: drop the connection
                    _send(conn, b"ok")
                    while not stop:
                        message = _recv(conn)
                        if spmd:
                            _broadcast(message)
                        reply, stop = _run(obj, message)
                        _send(conn, reply)
                except (ConnectionError, OSError):
                    continue  # the client went away: wait for the next one
    # (the followers saw the __shutdown__ call in the broadcast above and have stopped too)


def follow(obj: Any) -> None:
    """On processes 1.. of a multi-process worker job: run every call process 0 receives."""
    while True:
        _, stop = _run(obj, _broadcast(None))
        if stop:
            return


# ------------------------------------------------------------------------------------- client


class RemoteWorker:
    """A minirl worker (`call`, `alive`, `restart`, `close`) whose object lives at `address`
    ("host:port"), served by `serve`."""

    def __init__(
        self, address: str, token: str, name: str = "remote", connect_timeout_s: float = 60.0
    ):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"address must be host:port, got {address!r}")
        self.host, self.port, self.token, self.name = host, int(port), token, name
        self.connect_timeout_s = connect_timeout_s
        self._ids = itertools.count()
        self._sock: socket.socket | None = None
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def _connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send(sock, self.token.encode())
        try:
            if _recv(sock) != b"ok":
                raise ConnectionError("unexpected greeting")
        except ConnectionError:
            sock.close()
            raise WorkerError(f"{self.name} at {self.host}:{self.port} refused the token") from None
        self._sock = sock
        self._reader = threading.Thread(target=self._read_loop, args=(sock,), daemon=True)
        self._reader.start()

    def _read_loop(self, sock: socket.socket) -> None:
        while True:
            try:
                call_id, ok, value = decode(_recv(sock))
            except (ConnectionError, OSError):
                break
            future = self._pending.pop(call_id, None)
            if future is not None:
                future.set_result(value) if ok else future.set_exception(
                    WorkerError(f"{self.name}: {value}")
                )
        with self._lock:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(WorkerDied(f"{self.name}: connection lost"))
            self._pending.clear()
            if self._sock is sock:
                self._sock = None

    def call(self, method: str, *args, **kwargs) -> Future:
        future: Future = Future()
        call_id = next(self._ids)
        with self._lock:
            if self._sock is None:
                try:
                    self._connect()
                except OSError as e:
                    future.set_exception(WorkerDied(f"{self.name}: cannot connect ({e})"))
                    return future
            self._pending[call_id] = future
            sock = self._sock
        try:
            _send(sock, encode((call_id, method, args, kwargs)))
        except OSError as e:
            self._pending.pop(call_id, None)
            future.set_exception(WorkerDied(f"{self.name}: cannot send ({e})"))
        return future

    def alive(self) -> bool:
        return self._sock is not None

    def restart(self) -> None:
        """Drop the connection; the next call reconnects (to a restarted server)."""
        self.close()

    def shutdown(self) -> None:
        """Ask the server to stop (after the calls already sent)."""
        self.call(SHUTDOWN).result()
        self.close()

    def close(self) -> None:
        with self._lock:
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes our reader thread and tells the server
            except OSError:
                pass
            sock.close()
        if self._reader is not None:
            self._reader.join(5)
