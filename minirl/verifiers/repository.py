"""A content-addressed store for verifier data: test cases, checker programs, reference files.

RLAX (Sec. 6.1, "Oubliette") uploads all test data once, before training, to a persistent
repository and from then on refers to it by link: a verification request carries the candidate's
code plus links, never the (often huge) test data itself. This file is that repository in its
smallest honest form: a directory where every object is stored under the sha256 of its bytes.

    repo = TestRepository("/data/minirl-tests")
    sha = repo.put({"cases": [{"input": "1 2\\n", "output": "3\\n"}]})   # JSON-able -> canonical bytes
    repo.get_json(sha)                                                    # same object back

Properties:
  - The address is the content: `put` of equal content gives the same sha and stores it once.
  - Every read re-hashes the bytes: a flipped bit on disk is a `CorruptObjectError`, never
    silently wrong test data (the code verifier turns it into reward 0 with a clear reason).
  - Writes are atomic (temp file + `os.replace`), so a crash never leaves half an object.
  - A sha is validated (64 lowercase hex digits) before it touches the filesystem, so a
    reference taken from a dataset cannot walk out of the root ("../../etc/passwd").

Simplified on purpose: one local directory (a remote service wraps it later), no garbage
collection, no compression. Objects live at `root/ab/abcdef...` (two-character fan-out).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from minirl.store.hashed_files import atomic_write

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


class RepositoryError(Exception):
    """Base class: something is wrong with a reference or with stored data."""


class ObjectNotFoundError(RepositoryError):
    """No object is stored under this sha."""


class CorruptObjectError(RepositoryError):
    """The stored bytes no longer hash to their address."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(obj: Any) -> bytes:
    """The one byte encoding of a JSON-able object: sorted keys, no spaces, UTF-8. Two equal
    objects always get the same sha."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def check_sha(sha: Any) -> str:
    """Return `sha` if it is a well-formed sha256 hex digest, else raise RepositoryError."""
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise RepositoryError(f"not a sha256 reference: {sha!r:.80}")
    return sha


class TestRepository:
    """Content-addressed files under `root` (created on first `put`)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, root: str | os.PathLike):
        self.root = os.path.abspath(os.fspath(root))

    def _path(self, sha: str) -> str:
        check_sha(sha)
        return os.path.join(self.root, sha[:2], sha)

    def put(self, data: bytes | Any) -> str:
        """Store bytes (or a JSON-able object, encoded canonically); return its sha256."""
        raw = data if isinstance(data, bytes | bytearray) else canonical_json(data)
        raw = bytes(raw)
        sha = sha256_hex(raw)
        path = self._path(sha)
        if os.path.exists(path):
            return sha
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, raw)
        return sha

    def has(self, sha: str) -> bool:
        try:
            return os.path.isfile(self._path(sha))
        except RepositoryError:
            return False

    def get(self, sha: str) -> bytes:
        """The bytes stored under `sha`, verified: raises ObjectNotFoundError or
        CorruptObjectError (both RepositoryError) instead of returning wrong data."""
        path = self._path(sha)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"no object {sha[:12]}… in {self.root}") from None
        actual = sha256_hex(raw)
        if actual != sha:
            raise CorruptObjectError(
                f"object {sha[:12]}… is corrupt: its bytes hash to {actual[:12]}…"
            )
        return raw

    def get_json(self, sha: str) -> Any:
        raw = self.get(sha)
        try:
            return json.loads(raw)
        except ValueError as e:
            raise RepositoryError(f"object {sha[:12]}… is not JSON: {e}") from None
