"""Versioned weight store: minirl's in-memory parameter server (RLAX §3, "parameter server").

The trainer `put`s each new parameter set under a version number; rollout engines `get` the
latest version (or the one the controller names) when they reload. Every rollout token carries
the version that produced it, so the store is what makes staleness measurable in versions.

RLAX keeps "up to N weight snapshots in host memory" per parameter server and garbage-collects
versions before step s "only once global progress to step s is confirmed": the controller decides
when old weights may go (`release(before_version)`), and `InMemoryWeightStore(keep=N)` adds a hard
cap that evicts the oldest version. Versions strictly increase; `get` hands out the stored
read-only arrays without a copy, and a reader sees a whole version or none. What each call
promises, its errors, and the contract every store must pass (tests/weightstore_suite.py):
docs/weights.md, "The weight store".

`put` makes every leaf read-only host numpy: numpy leaves are copied (the caller may write to them
afterwards), JAX arrays on the CPU are viewed in place (they never change, and a buffer a view
holds is never donated: minirl.store.trees.host_view).

Simplified on purpose: one process, host memory only (scale/ adds a TensorStore-backed store with
the same interface).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from minirl.store.trees import host_view


class EmptyStoreError(LookupError):
    """`get` on a store that holds no version yet."""


class UnknownVersionError(LookupError):
    """`get` of a version that was never put, or was released or evicted."""


class StaleVersionError(ValueError):
    """`put` of a version that is not newer than the newest stored one."""


@runtime_checkable
class WeightStore(Protocol):
    """What the controller, trainer and engines need from a weight store."""

    def put(self, version: int, params: Any) -> None:
        """Store `params` (a pytree of arrays) as `version`; versions strictly increase."""

    def get(self, version: int | None = None) -> tuple[int, Any]:
        """(version, params) of `version`, or of the newest version if None."""

    def versions(self) -> list[int]:
        """Stored versions, oldest first."""

    def release(self, before_version: int) -> list[int]:
        """Drop all versions older than `before_version`; returns the dropped versions."""

    def nbytes(self) -> int:
        """Bytes held by all stored versions."""


# Checks shared by every implementation, so all stores fail with the same messages.


def check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, int | np.integer):
        raise TypeError(f"a weight version must be an int, got {type(version).__name__}")
    if version < 0:
        raise ValueError(f"a weight version must be >= 0, got {version}")
    return int(version)


def check_new_version(version: int, latest: int | None) -> None:
    if latest is not None and version <= latest:
        raise StaleVersionError(
            f"cannot put weight version {version}: the store already holds version {latest}, "
            "and versions must strictly increase"
        )


def check_release(before_version: int, latest: int | None) -> None:
    if latest is not None and before_version > latest:
        raise ValueError(
            f"release(before_version={before_version}) would drop the newest version {latest}; "
            "the store always keeps its newest version"
        )


def unknown_version(version: int, available: list[int]) -> UnknownVersionError:
    return UnknownVersionError(
        f"weight version {version} is not in the store (available: {available}); "
        "it was never put, or it was released or evicted"
    )


def empty_store() -> EmptyStoreError:
    return EmptyStoreError("the weight store is empty: no version has been put yet")


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    params: Any  # the stored pytree; array leaves are read-only host numpy arrays
    nbytes: int


def _host_copy(x: Any) -> Any:
    if x is None or isinstance(x, bool | int | float | str | bytes):
        return x  # immutable already
    return host_view(x)  # a JAX array viewed in place on the CPU; numpy a private copy


def _snapshot(params: Any) -> _Snapshot:
    """An immutable host copy of a pytree of arrays (read-only numpy leaves)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    copies = [_host_copy(x) for x in leaves]
    nbytes = sum(a.nbytes for a in copies if isinstance(a, np.ndarray))
    return _Snapshot(jax.tree_util.tree_unflatten(treedef, copies), nbytes)


class InMemoryWeightStore:
    """Up to `keep` versions of the parameters in host memory (see the module docstring)."""

    def __init__(self, keep: int = 4):
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep must be an int >= 1, got {keep!r}")
        self.keep = keep
        self._lock = threading.Lock()
        self._snapshots: dict[int, _Snapshot] = {}  # insertion order == ascending versions

    def _latest(self) -> int | None:
        return next(reversed(self._snapshots)) if self._snapshots else None

    def put(self, version: int, params: Any) -> None:
        version = check_version(version)
        with self._lock:
            check_new_version(version, self._latest())  # fail before the expensive copy
        snap = _snapshot(params)  # outside the lock: readers keep reading meanwhile
        with self._lock:
            check_new_version(version, self._latest())  # another writer may have won
            self._snapshots[version] = snap  # the version becomes visible here, whole
            while len(self._snapshots) > self.keep:  # hard cap: evict the oldest
                del self._snapshots[next(iter(self._snapshots))]

    def get(self, version: int | None = None) -> tuple[int, Any]:
        with self._lock:
            if not self._snapshots:
                raise empty_store()
            version = self._latest() if version is None else check_version(version)
            snap = self._snapshots.get(version)
            if snap is None:
                raise unknown_version(version, list(self._snapshots))
        # Fresh containers around the shared read-only arrays: a reader that edits its dict
        # cannot change what other readers see.
        return version, jax.tree_util.tree_map(lambda x: x, snap.params)

    def versions(self) -> list[int]:
        with self._lock:
            return list(self._snapshots)

    def release(self, before_version: int) -> list[int]:
        before_version = check_version(before_version)
        with self._lock:
            check_release(before_version, self._latest())
            gone = [v for v in self._snapshots if v < before_version]
            for v in gone:
                del self._snapshots[v]
        return gone

    def nbytes(self) -> int:
        with self._lock:
            return sum(s.nbytes for s in self._snapshots.values())

    def __repr__(self) -> str:
        return f"InMemoryWeightStore(keep={self.keep}, versions={self.versions()})"
