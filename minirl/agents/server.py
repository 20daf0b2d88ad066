"""The endpoint's HTTP side: OpenAI-style requests on localhost, handed to the episode runner.

    endpoint = Endpoint(on_call, is_open, sampling, model="minirl").start()  # 127.0.0.1, a free port
    endpoint.url("3f2a-0-0")   -> "http://127.0.0.1:PORT/episodes/3f2a-0-0/v1"   (an agent's base_url)
    endpoint.close()

Routes (every one also under /episodes/<id>/v1/...):

    POST /episodes/<id>/v1/chat/completions     a chat call of episode <id>
    POST /episodes/<id>/v1/completions          a raw completion call of episode <id>
    GET  /v1/models                             the one model served

The episode is named in the path, so an unchanged OpenAI client (`base_url=` what the runner
hands the agent) says which episode each call continues. A handler thread reads the body (at most
`MAX_BODY` bytes, sent with its Content-Length; a connection silent for `IDLE_S` seconds is
closed, so a client that stops mid-request holds no thread for ever), checks it
(minirl/agents/protocol.py: a bad request is answered at once, with an OpenAI-style error body;
a call of an episode `is_open` does not know is a 404) and hands a `Request` to `on_call`, which
answers it later from the runner's thread through its future: the engine and the episodes are
touched by that one thread only. `close()` answers every call still waiting with a 503.

Why the standard library (http.server's ThreadingHTTPServer) and no web framework: the endpoint
is a few routes and JSON bodies on localhost; a thread per connection is what the runner's
one-queue design needs (handlers only wait on futures), HTTP/1.1 keep-alive serves the OpenAI
SDK's connection pool, and nothing new has to be installed. A framework would add an event loop
beside the runner's and a dependency, for routing we do not need. Measured overhead per turn:
benchmarks/test_bench_endpoint.py (docs/multiturn.md).

Simplified on purpose: localhost only, no authentication (any API key is accepted); streaming
sends the finished answer as server-sent events.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import threading
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from minirl.agents.protocol import APIError, Call, chat_call, completion_call, models, stream_chunks

MAX_BODY = 8 << 20  # bytes of one request body
IDLE_S = 300.0  # a connection silent this long (a request cut off, an idle keep-alive) is closed
_ROUTE = re.compile(r"^(?:/episodes/(?P<episode>[A-Za-z0-9_.-]+))?/v1/(?P<what>[a-z/]+?)/?$")


@dataclasses.dataclass
class Request:
    """A checked call of one episode, waiting for its answer: (status, body, stream)."""

    episode: str
    call: Call
    future: Future = dataclasses.field(default_factory=Future)


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler waiting on a dead run never keeps the process alive
    allow_reuse_address = True
    request_queue_size = 1024  # listen backlog: hundreds of agents connect at once

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (an agent cancelled mid-call) is no error of the run's."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Endpoint:
    """The HTTP server in front of the episode runner (module docstring)."""

    def __init__(self, on_call, is_open, sampling, model: str = "minirl", idle_s: float = IDLE_S):
        self.on_call, self.is_open, self.sampling, self.model = on_call, is_open, sampling, model
        self.idle_s = idle_s
        self._server: _Server | None = None
        self._waiting: set[Future] = set()
        self._lock = threading.Lock()
        self.closed = False

    def start(self) -> Endpoint:
        handler = type("Handler", (_Handler,), {"endpoint": self, "timeout": self.idle_s})
        self._server = _Server(("127.0.0.1", 0), handler)
        threading.Thread(
            target=self._server.serve_forever, name="minirl-endpoint", daemon=True
        ).start()
        return self

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, episode: str) -> str:
        return f"http://127.0.0.1:{self.port}/episodes/{episode}/v1"

    def close(self) -> None:
        """Stop serving; every call still waiting is answered with a 503."""
        with self._lock:
            self.closed, waiting = True, list(self._waiting)
        for future in waiting:
            if not future.done():
                future.set_result((503, APIError(503, "the run is over").body(), False))
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def answer(self, episode: str | None, what: str, body: Any) -> tuple[int, dict, bool]:
        """(status, JSON body, stream?) for one POST (from a handler thread)."""
        if what not in ("chat/completions", "completions"):
            raise APIError(404, f"no route /v1/{what}")
        if episode is None:
            raise APIError(
                404,
                "no episode in the URL: use the base_url your agent was given "
                "(http://127.0.0.1:PORT/episodes/<id>/v1), which says which episode a call continues",
            )
        if not self.is_open(episode):
            raise APIError(404, f"episode {episode} is over (or was restarted): no more calls")
        check = chat_call if what == "chat/completions" else completion_call
        request = Request(episode, check(body, self.sampling))
        with self._lock:
            if self.closed:
                raise APIError(503, "the run is over")
            self._waiting.add(request.future)
        try:
            self.on_call(request)
            return request.future.result()
        finally:
            with self._lock:
                self._waiting.discard(request.future)


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests (a thread each); `endpoint` is set by Endpoint.start."""

    endpoint: Endpoint
    protocol_version = "HTTP/1.1"  # keep-alive: the OpenAI SDK pools its connections

    def log_message(self, *args) -> None:  # no line per request on stderr
        pass

    def _send(self, status: int, body: dict, stream: bool = False) -> None:
        if stream and status == 200:
            events = [json.dumps(c) for c in stream_chunks(body)] + ["[DONE]"]
            data = "".join(f"data: {e}\n\n" for e in events).encode()
            kind = "text/event-stream"
        else:
            data, kind = json.dumps(body).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[str | None, str]:
        match = _ROUTE.match(self.path.split("?")[0])
        if match is None:
            raise APIError(404, f"no route {self.path}")
        return match["episode"], match["what"]

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        try:
            _, what = self._route()
            if what != "models":
                raise APIError(404, f"no route GET /v1/{what}")
            self._send(200, models(self.endpoint.model))
        except APIError as e:
            self._send(e.status, e.body())

    def _body(self):
        """The request's body, decoded; APIError (the connection then closes) for a body without
        a length, over MAX_BODY, not sent within the server's timeout, or not JSON."""
        length = self.headers.get("Content-Length") or "0"
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        size = int(length) if length.strip().isdigit() and not chunked else -1
        if size < 0:
            self.close_connection = True
            what = "a chunked body" if chunked else f"the Content-Length {length!r}"
            raise APIError(411, f"{what} is not read: send the body with its Content-Length")
        if size > MAX_BODY:
            self.close_connection = True
            left = size if size <= 8 * MAX_BODY else 0  # let it finish sending, within reason
            while left > 0:
                left -= len(self.rfile.read(min(65536, left))) or left
            raise APIError(413, f"the request body is over {MAX_BODY} bytes")
        try:
            data = self.rfile.read(size)
        except TimeoutError:  # a client that stopped sending: its thread must not wait forever
            self.close_connection = True
            raise APIError(408, f"the body did not arrive within {self.timeout} s") from None
        try:
            return json.loads(data or b"null")
        except (ValueError, RecursionError) as e:  # RecursionError: nested too deep to read
            raise APIError(400, f"the request body is not JSON: {e}") from None

    def do_POST(self) -> None:  # noqa: N802
        try:
            episode, what = self._route()
            self._send(*self.endpoint.answer(episode, what, self._body()))
        except APIError as e:
            self._send(e.status, e.body())
        except Exception as e:  # noqa: BLE001 - a bug of ours: a 500 body, not a dead thread
            self._send(500, APIError(500, f"{type(e).__name__}: {e}").body())
