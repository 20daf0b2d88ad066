"""Files written and read with a sha256 per fixed-size chunk, hashed on a thread pool.

The byte-level half of checkpoints.py: `write_file` writes a tree (or bytes already serialized)
and fsyncs it while every chunk is hashed; `read_tree_file` reads one back, array by array, its
chunks hashed as they arrive and compared (`check_hashes`) with the file's manifest entry
`{"size", "chunk_bytes", "sha256": [hex per chunk]}`.

Why a sha256 per chunk rather than one per file: sha256 (OpenSSL, with the CPU's SHA
instructions) hashes ~1.8 GB/s per core, several times slower than copying from the page cache,
so one hash per file would run on one core; independent chunks hash on every core, overlapped
with the disk. `split -b <chunk_bytes> FILE` + `sha256sum` reproduces the list.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from minirl.store.serialization import read_tree, write_tree

READ_BYTES = 16 << 20  # bytes per read call
HASH_THREADS = max(1, min(8, os.cpu_count() or 1))


class CorruptCheckpointError(RuntimeError):
    """A checkpoint that cannot be used: missing or damaged manifest or file."""


@dataclasses.dataclass(frozen=True)
class Serialized:
    """A tree already turned into its file's bytes (by `save_async`, which must copy at once)."""

    data: np.ndarray  # uint8, from `to_buffer`


def sha256_of(pieces: list[memoryview]) -> str:
    h = hashlib.sha256()
    for piece in pieces:
        h.update(piece)  # releases the GIL on large buffers
    return h.hexdigest()


class ChunkHashes:
    """The sha256 of every `chunk_bytes`-long piece of a byte stream, hashed on a thread pool.

    Bytes are fed in order with `add` (memoryviews: nothing is copied). Each completed chunk is
    handed to `pool` at once, so chunks are hashed in parallel with each other and with the disk
    transfer or copy that goes on in the caller's thread. The fed buffers must stay unchanged
    until `hexdigests()` returns. A stream always has at least one chunk (possibly empty).
    """

    def __init__(self, pool: ThreadPoolExecutor, chunk_bytes: int):
        self.pool, self.chunk_bytes = pool, chunk_bytes
        self.futures: list[Future] = []
        self.pieces: list[memoryview] = []  # of the chunk being filled
        self.filled = 0

    def add(self, view: memoryview) -> None:
        while view.nbytes:
            take = min(view.nbytes, self.chunk_bytes - self.filled)
            self.pieces.append(view[:take])
            self.filled, view = self.filled + take, view[take:]
            if self.filled == self.chunk_bytes:
                self._submit()

    def _submit(self) -> None:
        pieces, self.pieces, self.filled = self.pieces, [], 0
        self.futures.append(self.pool.submit(sha256_of, pieces))
        if len(self.futures) > 2 * HASH_THREADS:  # the fed buffers wait for their hash: a bound
            self.futures[-2 * HASH_THREADS - 1].result()

    def hexdigests(self) -> list[str]:
        if self.pieces or not self.futures:
            self._submit()
        return [f.result() for f in self.futures]


class HashedFile:
    """A raw binary file whose every byte written or read also goes into `hashes`."""

    def __init__(self, f, hashes: ChunkHashes):
        self.f, self.hashes = f, hashes

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        rest = view
        while rest.nbytes:  # raw files may write less than asked
            rest = rest[self.f.write(rest) :]
        self.hashes.add(view)
        return view.nbytes

    def readinto(self, view) -> int:
        n = self.f.readinto(view)
        self.hashes.add(memoryview(view).cast("B")[:n])
        return n


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(
    path: Path, payload: Any, pool: ThreadPoolExecutor, chunk_bytes: int
) -> tuple[int, ChunkHashes]:
    """Write a tree (or a `Serialized` one) and fsync it: (size, its hashes)."""
    with open(path, "wb", buffering=0) as f:
        hashed = HashedFile(f, ChunkHashes(pool, chunk_bytes))
        if isinstance(payload, Serialized):
            size = hashed.write(payload.data)
        else:
            size = write_tree(hashed, payload)
        os.fsync(f.fileno())  # the hashing goes on meanwhile
    return size, hashed.hashes


def read_tree_file(path: Path, entry: dict, pool: ThreadPoolExecutor, place=None) -> Any:
    """The tree in a file, its size and every chunk's sha256 checked against `entry` (damage
    raises CorruptCheckpointError). Arrays are read one by one into their own buffers, hashed as
    they arrive, each handed to `read_tree`'s `place`; nothing is returned unchecked."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptCheckpointError(f"{path.name} is missing") from None
    if size != entry["size"]:
        raise CorruptCheckpointError(
            f"{path.name} has {size} bytes, the manifest says {entry['size']} (truncated?)"
        )
    with open(path, "rb", buffering=0) as f:
        hashed = HashedFile(f, ChunkHashes(pool, entry["chunk_bytes"]))
        try:
            tree = read_tree(hashed, size, place)
        except ValueError as e:
            tree = e
        while hashed.readinto(bytearray(READ_BYTES)):  # what decoding left unread, hashed too
            pass
        if f.tell() != size:
            raise CorruptCheckpointError(f"{path.name} changed size while it was read")
    check_hashes(path.name, entry, hashed.hashes)  # first: damage is the likelier cause
    if isinstance(tree, ValueError):  # intact bytes, yet not a tree
        raise CorruptCheckpointError(f"{path.name} cannot be decoded: {tree}")
    return tree


def check_hashes(name: str, entry: dict, hashes: ChunkHashes) -> None:
    for i, (got, want) in enumerate(zip(hashes.hexdigests(), entry["sha256"], strict=True)):
        if got != want:
            first = i * entry["chunk_bytes"]
            last = min(first + entry["chunk_bytes"], entry["size"])
            raise CorruptCheckpointError(
                f"{name} fails its sha256 check in bytes {first}..{last} (damaged contents)"
            )


def n_chunks(size: int, chunk_bytes: int) -> int:
    return max(1, -(-size // chunk_bytes))


def write_file_bytes(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def atomic_write(path, data: bytes | Callable[[BinaryIO], None], mode: int = 0o644) -> None:
    """Write `path` whole or not at all: into a unique temp file beside it, then rename over it
    (atomic on POSIX). A crash leaves the old file, or none, never half of one. `data`: bytes,
    or a function that writes to the open binary file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    try:
        with os.fdopen(fd, "wb") as f:
            data(f) if callable(data) else f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
