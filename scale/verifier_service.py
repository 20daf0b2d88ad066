"""The verifier as a service: an HTTP server (stdlib, a thread per request) around a verifier pool.

    MINIRL_VERIFIER_TOKEN=... python -m scale.verifier_service --port 8470 --repository /data/tests
    # or: python -m scale.launch verifier ... (scale/README.md)

The client is scale/remote_verifier.py (`RemoteVerifier`, a minirl Verifier). Protocol (JSON
bodies; every endpoint but /health needs `Authorization: Bearer <token>`):

    GET  /health             200 {"status": "ok", "objects_uploaded": n, "batches": n}
    PUT  /objects/<sha256>   raw bytes; stored if they hash to <sha256>: 201 (new) / 200 (known)
    POST /score              {"items": [{"task", "text", "meta"}],
                              "objects": {sha256: {"utf8" | "base64": ...}}  (optional: by value)}
                             200 {"scores": [{"reward", "reason"}]}, or 404 {"error": "unknown
                             objects", "missing": [sha, ...]} when `meta` references test data the
                             repository does not hold (nothing is scored then)
    errors: 400 malformed body, 401 missing/wrong token, 404 unknown path or objects, 411 no
            Content-Length, 413 body over the limit, 503 busy (the pool stayed taken too long)

The service keeps test data in a content-addressed `TestRepository` (the one its verifier reads):
uploaded once, referenced by sha256 afterwards, checked against its hash on upload.

Limits: `max_body_bytes` per request (an oversized body is drained and answered 413),
`max_items` rollouts per request, `read_timeout_s` for reading a request, headers and body
together (HTTP/1.0: one per connection; a client that sends too slowly, a byte at a time, is
cut off), `queue_timeout_s` for waiting for the pool (then 503; the client retries). The pool's
own per-rollout timeout bounds the scoring.

Simplified on purpose: plain HTTP (put it behind TLS — a reverse proxy or an SSH tunnel — on any
untrusted network; the token travels in a header); one batch is scored at a time (parallelism is
the pool's workers).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from minirl.data.verifier_api import Verifier
from minirl.types import Prompt, Rollout
from minirl.verifiers.pool import private_temp_dir
from minirl.verifiers.repository import RepositoryError, TestRepository
from scale.remote_verifier import decode_object, is_sha, nested_references, references

__all__ = ["ServiceConfig", "VerifierService", "build_verifier", "main"]

TOKEN_ENV = "MINIRL_VERIFIER_TOKEN"


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    host: str = "127.0.0.1"  # bind address; "0.0.0.0" to serve other hosts
    port: int = 0  # 0 = any free port (see VerifierService.url)
    max_body_bytes: int = 16 << 20  # larger requests get 413
    max_items: int = 1024  # rollouts per /score request
    read_timeout_s: float = 30.0  # per request: a client that sends too slowly is cut off
    queue_timeout_s: float = 300.0  # per request: waiting for the pool longer than this -> 503

    def __post_init__(self):
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65536), got {self.port}")
        if self.max_body_bytes < 1 or self.max_items < 1:
            raise ValueError("max_body_bytes and max_items must be >= 1")
        if not (self.read_timeout_s > 0 and self.queue_timeout_s > 0):
            raise ValueError("read_timeout_s and queue_timeout_s must be > 0")


class _BadRequest(ValueError):
    pass


def _parse_items(body: Any, max_items: int) -> tuple[list[Rollout], dict[str, bytes]]:
    """A /score body -> (rollouts to score, objects sent by value). Raises _BadRequest."""
    if not isinstance(body, dict) or not isinstance(body.get("items"), list):
        raise _BadRequest("the body must be a JSON object with an 'items' list")
    items = body["items"]
    if len(items) > max_items:
        raise _BadRequest(f"{len(items)} items; this service takes at most {max_items} per request")
    rollouts = []
    empty = np.zeros(0, np.int32)
    for i, item in enumerate(items):
        ok = isinstance(item, dict) and isinstance(item.get("text"), str)
        ok = ok and isinstance(item.get("task", ""), str) and isinstance(item.get("meta", {}), dict)
        if not ok:
            raise _BadRequest(f"item {i} must be {{'task': str, 'text': str, 'meta': object}}")
        prompt = Prompt(
            uid=i, task=item.get("task", ""), text="", tokens=empty, meta=item.get("meta", {})
        )
        rollouts.append(
            Rollout(prompt, 0, empty, np.zeros(0, np.float32), empty, "eos", text=item["text"])
        )
    objects = body.get("objects", {})
    if not isinstance(objects, dict):
        raise _BadRequest("'objects' must be a JSON object {sha256: {'utf8' | 'base64': ...}}")
    decoded = {}
    for sha, obj in objects.items():
        try:
            data = decode_object(obj)
        except ValueError as e:
            raise _BadRequest(f"object {sha[:12]}: {e}") from None
        if not is_sha(sha) or hashlib.sha256(data).hexdigest() != sha:
            raise _BadRequest(f"object {sha[:12]}… does not hash to its name")
        decoded[sha] = data
    return rollouts, decoded


class VerifierService:
    """Serve `verifier` (e.g. a VerifierPool around a CodeVerifier) over HTTP, with test data in
    `repository` (the same one the verifier reads). Nothing starts until `start()`."""

    def __init__(
        self,
        verifier: Verifier,
        repository: TestRepository,
        token: str,
        config: ServiceConfig = ServiceConfig(),
    ):
        if not isinstance(token, str) or len(token) < 8:
            raise ValueError("the service needs a bearer token of at least 8 characters")
        self.verifier, self.repository, self.config = verifier, repository, config
        self._token = token.encode()
        self._pool_lock = threading.Lock()  # one batch at a time through the verifier
        self._complete: set[str] = set()  # objects whose nested references are all present
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.stats = {"batches": 0, "items": 0, "objects_uploaded": 0, "rejected": 0}

    # ---- lifecycle

    def start(self) -> str:
        """Bind and serve in a background thread; returns the base URL."""
        handler = type(
            "Handler", (_Handler,), {"service": self, "timeout": self.config.read_timeout_s}
        )
        self._server = ThreadingHTTPServer((self.config.host, self.config.port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self.url

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the service is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    def __enter__(self) -> VerifierService:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- the work (called by the handler threads)

    def authorized(self, header: str | None) -> bool:
        scheme, _, token = (header or "").partition(" ")
        return scheme == "Bearer" and hmac.compare_digest(token.strip().encode(), self._token)

    def missing(self, rollouts: Sequence[Rollout]) -> list[str]:
        """References the repository cannot serve (top level, and inside test files)."""
        out: set[str] = set()
        for sha in {s for r in rollouts for s in references(r.prompt.meta)}:
            if sha in self._complete:
                continue
            if not self.repository.has(sha):
                out.add(sha)
                continue
            try:
                nested = [
                    s
                    for s in nested_references(self.repository.get(sha))
                    if not self.repository.has(s)
                ]
            except RepositoryError:
                nested = []  # corrupt: the verifier reports it as the reason of a zero reward
            out.update(nested)
            if not nested:
                self._complete.add(sha)
        return sorted(out)

    def put_object(self, sha: str, data: bytes) -> bool:
        """Store an uploaded object; True if it was new. Raises _BadRequest on a wrong hash."""
        if not is_sha(sha) or hashlib.sha256(data).hexdigest() != sha:
            raise _BadRequest("the uploaded bytes do not hash to the sha256 in the path")
        new = not self.repository.has(sha)
        self.repository.put(data)
        self.stats["objects_uploaded"] += new
        return new

    def score(self, body: Any) -> tuple[int, dict]:
        rollouts, objects = _parse_items(body, self.config.max_items)
        for sha, data in objects.items():
            self.put_object(sha, data)
        missing = self.missing(rollouts)
        if missing:
            return 404, {"error": "unknown objects", "missing": missing}
        if not self._pool_lock.acquire(timeout=self.config.queue_timeout_s):
            return 503, {"error": f"verifier busy for more than {self.config.queue_timeout_s:g}s"}
        try:
            scores = self.verifier.score(rollouts)
        finally:
            self._pool_lock.release()
        self.stats["batches"] += 1
        self.stats["items"] += len(rollouts)
        return 200, {
            "scores": [{"reward": float(s.reward), "reason": str(s.reason)} for s in scores]
        }


class _Handler(BaseHTTPRequestHandler):
    """One request. `service` and `timeout` are set on a per-service subclass."""

    service: VerifierService
    server_version = "minirl-verifier/1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: errors go to the reply
        pass

    def setup(self) -> None:
        """The socket's timeout bounds each read; a timer bounds reading the whole request, so a
        client that drips a byte at a time is cut off too (`_read` stops the timer)."""
        super().setup()
        self._cutoff = threading.Timer(self.timeout, self._cut_off)
        self._cutoff.daemon = True
        self._cutoff.start()

    def _cut_off(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _read(self) -> None:
        self._cutoff.cancel()  # the request is read: scoring may take longer

    def handle(self) -> None:
        with contextlib.suppress(OSError):  # a client cut off, or gone: nobody to answer
            super().handle()

    def finish(self) -> None:
        self._cutoff.cancel()
        super().finish()

    def _reply(self, status: int, payload: dict, extra: Mapping[str, str] = {}) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes | None:
        """The request body, or None after replying 411/413."""
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._read()
            self._reply(411, {"error": "Content-Length is required"})
            return None
        n, limit = int(length), self.service.config.max_body_bytes
        if n > limit:
            while n > 0:  # drain, so the client reads our answer instead of a reset
                n -= len(self.rfile.read(min(n, 1 << 16)) or b"x" * n)
            self._read()
            self._reply(413, {"error": f"body of {length} bytes exceeds the limit of {limit}"})
            return None
        body = self.rfile.read(n)
        self._read()
        return body if len(body) == n else None  # short: the client was cut off, or left

    def _authorized(self) -> bool:
        if self.service.authorized(self.headers.get("Authorization")):
            return True
        self.service.stats["rejected"] += 1
        self._reply(401, {"error": "missing or wrong bearer token"}, {"WWW-Authenticate": "Bearer"})
        return False

    def do_GET(self) -> None:
        self._read()
        if self.path == "/health":
            s = self.service.stats
            self._reply(
                200,
                {
                    "status": "ok",
                    "objects_uploaded": s["objects_uploaded"],
                    "batches": s["batches"],
                },
            )
        else:
            self._reply(404, {"error": f"no such endpoint: GET {self.path}"})

    def do_PUT(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        if body is None:
            return
        sha = self.path.removeprefix("/objects/")
        if not self.path.startswith("/objects/"):
            self._reply(404, {"error": f"no such endpoint: PUT {self.path}"})
            return
        try:
            new = self.service.put_object(sha, body)
        except _BadRequest as e:
            self._reply(400, {"error": str(e)})
            return
        self._reply(201 if new else 200, {"sha256": sha})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        body = self._body()
        if body is None:
            return
        if self.path != "/score":
            self._reply(404, {"error": f"no such endpoint: POST {self.path}"})
            return
        try:
            status, payload = self.service.score(json.loads(body))
        except (ValueError, _BadRequest) as e:  # json.JSONDecodeError is a ValueError
            status, payload = 400, {"error": f"malformed request: {e}"}
        except Exception as e:  # a verifier bug: the client retries, then zeroes
            status, payload = 500, {"error": f"verifier failed: {type(e).__name__}: {e}"}
        self._reply(status, payload)


# ------------------------------------------------------------------------------- command line


def build_verifier(name: str, repository: TestRepository, workers: int, item_timeout_s: float):
    """The pool the command-line service runs: a registered verifier (get_verifier: "code"
    reads `repository`, "math"), a reward function of your own ("path/to/file.py:function",
    loaded by each worker), or a built-in task's own verifier ("task:countdown"), in a
    VerifierPool."""
    from minirl.verifiers import PoolConfig, VerifierPool, get_verifier

    if name.startswith("task:"):
        from minirl.tasks import get_task

        task_name = name.removeprefix("task:")
        try:  # tasks with test data by reference read it from the service's repository
            inner = get_task(task_name, repository=repository).verifier
        except ValueError:  # the task declares no repository
            inner = get_task(task_name).verifier
    elif name == "code":
        inner = get_verifier(name, repository=repository)
    else:
        inner = get_verifier(name)
    return VerifierPool(inner, PoolConfig(workers=workers, item_timeout_s=item_timeout_s))


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description="Serve a minirl verifier pool over HTTP. The bearer "
        f"token is read from ${TOKEN_ENV} or --token-file."
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8470)
    p.add_argument(
        "--repository", required=True, help="directory of the content-addressed test data"
    )
    p.add_argument(
        "--verifier",
        default="code",
        help="code | math | task:<built-in task> | path/to/file.py:function (not a reward "
        "model, rm:DIR, which runs batched in one process: minirl train --verifier rm:DIR)",
    )
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--item-timeout", type=float, default=60.0, help="seconds per rollout")
    p.add_argument("--token-file", default=None)
    p.add_argument("--max-body-mb", type=float, default=16.0)
    args = p.parse_args(argv)
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    else:
        token = os.environ.get(TOKEN_ENV, "")
    with private_temp_dir():  # nothing left in the temp dir, even after a SIGKILL
        repository = TestRepository(args.repository)
        try:  # a name it cannot build (unknown, a reward model, a file that fails): one line
            pool = build_verifier(args.verifier, repository, args.workers, args.item_timeout)
        except (KeyError, ValueError) as e:
            p.error(f"--verifier {args.verifier}: {e.args[0] if e.args else e}")
        serve(args, token, repository, pool)
    sys.exit(0)


def serve(args: argparse.Namespace, token: str, repository: TestRepository, pool) -> None:
    """Serve `pool` until SIGTERM or SIGINT, then stop both."""
    config = ServiceConfig(
        host=args.host, port=args.port, max_body_bytes=int(args.max_body_mb * 2**20)
    )
    service = VerifierService(pool, repository, token, config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    pool.start()  # workers up before the first request
    url = service.start()
    print(f"serving {args.verifier} verifier on {url}", flush=True)
    try:
        stop.wait()
    finally:
        service.stop()
        pool.close()


if __name__ == "__main__":
    main()
