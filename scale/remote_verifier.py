"""A Verifier that scores remotely: the client of scale/verifier_service.py, test data by hash.

RLAX (§6.1, "Oubliette") runs code verification as a remote service and uploads all test data
once to a persistent repository; a request then carries the candidate's code plus links (content
hashes), never the test data. For the Codeforces set that cut the traffic of one epoch from about
500 GB to 1.35 GB. `RemoteVerifier` is that client on the Python standard library (`http.client`):

    verifier = RemoteVerifier("http://verifier-host:8470", token, repository=TestRepository(...))
    scores = verifier.score(rollouts)         # a Verifier like any other

Each rollout travels as {"task", "text", "meta"}. References are the meta keys "tests" and
"checker" (and the "input_sha256"/"output_sha256" of the cases inside a test file) — the keys
minirl/verifiers/code_verifier.py reads. The protocol is in scale/verifier_service.py.

Guarantees. `score` returns one Score per rollout, in order, and never loses one: a request that
fails transiently (connection refused or reset, timeout, 429/5xx) is retried with exponential
backoff (`backoff_s * 2**k`, capped at `backoff_max_s`, with jitter) up to `max_attempts` times;
after that budget the rollouts of that request get reward 0 and the reason "remote verifier:
unavailable after N attempts: <last error>" (the controller's metrics see them; the run goes
on). A 404 "unknown objects" makes the client upload the missing objects from its local
repository and resend (a restarted service with an empty repository costs one upload round);
rollouts whose data the client cannot provide get reward 0 with that reason. A 413 splits the
request in halves. A 401 raises `RemoteVerifierError`: a wrong token is a set-up error. Bytes on
the wire are counted in `client.stats`; `ClientConfig(by_value=True)` sends the referenced data
inside every request instead (to measure what sending by reference saves).

Simplified on purpose: plain HTTP (TLS belongs to a proxy or tunnel); a new TCP connection per
request; no streaming of results.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import random
import re
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from minirl.types import Rollout, Score
from minirl.verifiers.repository import RepositoryError, TestRepository

__all__ = ["ClientConfig", "RemoteVerifier", "RemoteVerifierError", "references"]

REFERENCE_KEYS = ("tests", "checker")  # meta keys that hold sha256 references
CASE_REFERENCE_KEYS = ("input_sha256", "output_sha256")  # inside a test file's cases
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


class RemoteVerifierError(RuntimeError):
    """The service refused the client's set-up (wrong token) — not a transient failure."""


def is_sha(x: Any) -> bool:
    return isinstance(x, str) and bool(_SHA_RE.match(x))


def references(meta: Mapping[str, Any]) -> list[str]:
    """The sha256 references in a task's meta (top level only)."""
    return [meta[k] for k in REFERENCE_KEYS if is_sha(meta.get(k))]


def nested_references(data: bytes) -> list[str]:
    """References inside a stored object: the cases of a test file that keep their input or
    output as separate objects. Anything unparsable has none (the verifier judges it later)."""
    try:
        obj = json.loads(data)
        cases = obj.get("cases", []) if isinstance(obj, dict) else []
        return [
            c[k]
            for c in cases
            if isinstance(c, dict)
            for k in CASE_REFERENCE_KEYS
            if is_sha(c.get(k))
        ]
    except (ValueError, AttributeError):
        return []


def plain_json(x: Any) -> Any:
    """json.dumps `default`: numpy scalars and arrays in task meta become JSON values."""
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON-serializable")


def encode_object(data: bytes) -> dict:
    try:
        return {"utf8": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}


def decode_object(obj: Any) -> bytes:
    if isinstance(obj, dict) and isinstance(obj.get("utf8"), str):
        return obj["utf8"].encode("utf-8")
    if isinstance(obj, dict) and isinstance(obj.get("base64"), str):
        return base64.b64decode(obj["base64"], validate=True)
    raise ValueError("an object must be {'utf8': str} or {'base64': str}")


# ------------------------------------------------------------------------------------- client


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    timeout_s: float = 300.0  # per HTTP request (connect + send + score + reply)
    max_attempts: int = 8  # per request, for transient failures; then the rollouts get reward 0
    backoff_s: float = 0.25  # delay before the first retry; doubles every attempt
    backoff_max_s: float = 15.0  # cap on one delay
    max_items: int = 256  # rollouts per /score request
    max_upload_rounds: int = 3  # 404 -> upload -> resend, at most this often per request
    by_value: bool = False  # send referenced test data inside every request (for comparison)

    def __post_init__(self):
        if not (self.timeout_s > 0 and self.backoff_s >= 0 and self.backoff_max_s >= 0):
            raise ValueError("timeout_s must be > 0 and backoff_s, backoff_max_s >= 0")
        if self.max_attempts < 1 or self.max_items < 1 or self.max_upload_rounds < 0:
            raise ValueError("max_attempts and max_items must be >= 1, max_upload_rounds >= 0")


class _Transient(Exception):
    """A failure worth retrying (the service may be restarting or overloaded)."""


class RemoteVerifier:
    """A `Verifier` that scores through a `VerifierService` (guarantees: module docstring).

    `url`: "http://host:port". `repository`: the local TestRepository that holds the objects the
    prompts reference (uploaded on demand); None if prompts reference nothing (math).
    """

    def __init__(
        self,
        url: str,
        token: str,
        repository: TestRepository | None = None,
        config: ClientConfig = ClientConfig(),
    ):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"url must look like http://host:port, got {url!r}")
        self.host, self.port = parsed.hostname, parsed.port or 80
        self.token, self.repository, self.config = token, repository, config
        self._rng = random.Random()  # backoff jitter only: no effect on results
        self.stats = dict.fromkeys(
            (
                "requests",
                "retries",
                "bytes_sent",
                "bytes_received",
                "uploads",
                "upload_bytes",
                "unscored",
            ),
            0,
        )

    # ---- the Verifier interface

    def score(self, rollouts: Sequence[Rollout]) -> list[Score]:
        out: list[Score | None] = [None] * len(rollouts)
        todo = []
        for i, r in enumerate(rollouts):
            try:
                item = {"task": r.prompt.task, "text": r.text or "", "meta": dict(r.prompt.meta)}
                json.dumps(item["meta"], default=plain_json)
            except (TypeError, ValueError) as e:
                out[i] = Score(0.0, f"remote verifier: task meta is not JSON-serializable: {e}")
                continue
            todo.append((i, item))
        step = self.config.max_items
        for start in range(0, len(todo), step):
            for i, score in self._score_batch(todo[start : start + step]):
                out[i] = score
        self.stats["unscored"] += sum(s.reason.startswith("remote verifier:") for s in out)
        return out  # type: ignore[return-value]

    def health(self) -> dict:
        status, payload = self._with_retries("GET", "/health", None)
        return payload if status == 200 else {"status": f"HTTP {status}", **payload}

    # ---- one request's life

    def _score_batch(self, batch: list[tuple[int, dict]]) -> list[tuple[int, Score]]:
        """Score (index, item) pairs; always returns one Score per pair."""
        done: list[tuple[int, Score]] = []
        uploads = 0
        while batch:
            body = {"items": [item for _, item in batch]}
            if self.config.by_value:
                body["objects"], unavailable = self._objects_of(batch)
                batch, zeroed = self._drop(batch, unavailable)
                done += zeroed
                body["items"] = [item for _, item in batch]
            try:
                status, reply = self._with_retries("POST", "/score", body)
            except _Transient as e:
                reason = (
                    f"remote verifier: unavailable after {self.config.max_attempts} attempts: {e}"
                )
                return done + [(i, Score(0.0, reason)) for i, _ in batch]
            if status == 200 and len(reply.get("scores", ())) == len(batch):
                scores = [Score(float(s["reward"]), str(s["reason"])) for s in reply["scores"]]
                return done + [(i, s) for (i, _), s in zip(batch, scores, strict=True)]
            if status == 404 and isinstance(reply.get("missing"), list):
                uploads += 1
                if uploads > self.config.max_upload_rounds:
                    reason = "remote verifier: the service keeps reporting unknown test data"
                    return done + [(i, Score(0.0, reason)) for i, _ in batch]
                batch, zeroed = self._drop(batch, self._upload(reply["missing"]))
                done += zeroed
                continue
            if status == 413 and len(batch) > 1:
                half = len(batch) // 2
                return done + self._score_batch(batch[:half]) + self._score_batch(batch[half:])
            if status == 401:
                raise RemoteVerifierError(
                    f"the verifier service at {self.host}:{self.port} "
                    "rejected the bearer token (HTTP 401)"
                )
            reason = f"remote verifier: HTTP {status}: {str(reply.get('error', reply))[:200]}"
            return done + [(i, Score(0.0, reason)) for i, _ in batch]
        return done

    def _drop(self, batch, unavailable: set[str]):
        """Split off the items that reference data nobody can provide (reward 0)."""
        if not unavailable:
            return batch, []
        keep, zeroed = [], []
        for i, item in batch:
            needed = set()
            for sha in references(item["meta"]):  # a test file needs its nested objects too
                data = self._local(sha)
                needed.update([sha, *(nested_references(data) if data else [])])
            gone = unavailable & needed
            if gone:
                sha = sorted(gone)[0]
                zeroed.append(
                    (
                        i,
                        Score(
                            0.0,
                            f"remote verifier: test data {sha[:12]}… is "
                            "unknown to the service and not in the local repository",
                        ),
                    )
                )
            else:
                keep.append((i, item))
        return keep, zeroed

    def _local(self, sha: str) -> bytes | None:
        if self.repository is None:
            return None
        try:
            return self.repository.get(sha)
        except RepositoryError:
            return None

    def _upload(self, shas: list[str]) -> set[str]:
        """PUT each missing object from the local repository; returns the shas it could not
        provide."""
        unavailable = set()
        for sha in shas:
            data = self._local(sha) if is_sha(sha) else None
            if data is None:
                unavailable.add(sha)
                continue
            try:
                status, reply = self._with_retries("PUT", f"/objects/{sha}", data)
            except _Transient:
                unavailable.add(sha)
                continue
            if status == 401:
                raise RemoteVerifierError(
                    "the verifier service rejected the bearer token (HTTP 401)"
                )
            if status in (200, 201):
                self.stats["uploads"] += 1
                self.stats["upload_bytes"] += len(data)
            else:
                unavailable.add(sha)
        return unavailable

    def _objects_of(self, batch) -> tuple[dict, set[str]]:
        """By value: every object the batch references (top level and nested), inline."""
        objects, unavailable = {}, set()
        todo = [s for _, item in batch for s in references(item["meta"])]
        while todo:
            sha = todo.pop()
            if sha in objects or sha in unavailable:
                continue
            data = self._local(sha)
            if data is None:
                unavailable.add(sha)
                continue
            objects[sha] = encode_object(data)
            todo += nested_references(data)
        return objects, unavailable

    # ---- HTTP with retries

    def _with_retries(self, method: str, path: str, body: Any) -> tuple[int, dict]:
        last = None
        for attempt in range(self.config.max_attempts):
            if attempt:
                self.stats["retries"] += 1
                delay = min(self.config.backoff_max_s, self.config.backoff_s * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + 0.5 * self._rng.random()))
            try:
                return self._request(method, path, body)
            except _Transient as e:
                last = e
        raise last  # type: ignore[misc]

    def _request(self, method: str, path: str, body: Any) -> tuple[int, dict]:
        """One HTTP exchange. Raises _Transient for failures worth retrying."""
        if body is None:
            data = b""
        elif isinstance(body, bytes):
            data = body
        else:
            data = json.dumps(body, default=plain_json).encode()
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Length": str(len(data)),
            "Content-Type": "application/octet-stream"
            if isinstance(body, bytes)
            else "application/json",
        }
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.config.timeout_s)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
            status = response.status
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timeout, torn reply
            raise _Transient(f"{type(e).__name__}: {e}") from None
        finally:
            conn.close()
            self.stats["requests"] += 1
            head = f"{method} {path} HTTP/1.1\r\n" + "".join(
                f"{k}: {v}\r\n" for k, v in headers.items()
            )
            self.stats["bytes_sent"] += len(head) + 2 + len(data)
        self.stats["bytes_received"] += len(raw) + sum(
            len(k) + len(v) + 4 for k, v in response.getheaders()
        )
        if status == 429 or status >= 500:
            raise _Transient(f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}")
        try:
            payload = json.loads(raw) if raw else {}
        except ValueError:
            raise _Transient(f"HTTP {status} with a body that is not JSON") from None
        return status, payload if isinstance(payload, dict) else {"reply": payload}
