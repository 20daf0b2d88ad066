"""The contract every WeightStore implementation must pass (RLAX's versioned parameter server).

Not collected on its own (no `test_` prefix). To test a store, subclass the suite in a test
module and say how to build one:

    from weightstore_suite import WeightStoreSuite   # or: from tests.weightstore_suite import ...

    class TestMyStore(WeightStoreSuite):
        def make_store(self, keep, tmp_path):
            return MyStore(keep=keep, path=tmp_path)

`make_store(keep, tmp_path)` must return an empty store that keeps at most `keep` versions;
`tmp_path` is a fresh directory for stores that need one. Every test builds its own store.
"""

from __future__ import annotations

import itertools
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from minirl.store.trees import assert_trees_equal
from minirl.store.weights import (
    EmptyStoreError,
    StaleVersionError,
    UnknownVersionError,
    WeightStore,
)

BF16 = ml_dtypes.bfloat16


def filled(version: int, width: int = 8) -> dict:
    """A small parameter tree whose every element equals `version` (exact in bf16 up to 256),
    so a reader can tell a whole version from a torn one."""
    v = float(version)
    return {
        "embed": np.full((4, width), v, np.float32),  # [V, D]
        "layers": [
            {"w": np.full((width, width), v, BF16), "b": np.full((width,), v, np.float32)}
            for _ in range(2)
        ],
        "norm": np.full((width,), v, BF16),
    }


def filled_nbytes(width: int = 8) -> int:
    return 4 * width * 4 + 2 * (width * width * 2 + width * 4) + width * 2


def all_leaves_equal(params: dict, value: float) -> bool:
    leaves = [params["embed"], params["norm"]]
    leaves += [x for layer in params["layers"] for x in (layer["w"], layer["b"])]
    return all(np.all(np.asarray(x, np.float32) == value) for x in leaves)


def hammer(store: WeightStore, last: int, readers: int) -> tuple[list[str], list[int]]:
    """Put versions 1..last (every element = the version) while `readers` threads read the
    latest and the oldest version in a loop. Returns (problems seen, reads per reader)."""
    store.put(0, filled(0, width=64))
    errors: list[str] = []
    reads = [0] * readers
    done = threading.Event()

    def reader(slot: int) -> None:
        seen = -1
        try:
            while not done.is_set():
                version, params = store.get()
                if version < seen:
                    errors.append(f"latest went backwards: {seen} -> {version}")
                if not all_leaves_equal(params, float(version)):
                    errors.append(f"torn read of version {version}")
                seen = version
                older = store.versions()[0]
                try:  # may be evicted between versions() and get(): that is allowed
                    v, p = store.get(older)
                    if v != older or not all_leaves_equal(p, float(older)):
                        errors.append(f"torn read of version {older}")
                except UnknownVersionError:
                    pass
                reads[slot] += 1
        except Exception as e:  # noqa: BLE001 - reported to the caller
            errors.append(repr(e))

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while min(reads) == 0 and not errors and time.monotonic() < deadline:
            time.sleep(0.001)  # every reader is running before the first put
        for v in range(1, last + 1):
            store.put(v, filled(v, width=64))
    finally:
        done.set()
        for t in threads:
            t.join(timeout=30)
    return errors, reads


class WeightStoreSuite:
    """Behaviour shared by all weight stores. Subclasses define `make_store(keep, tmp_path)`."""

    def make_store(self, keep: int, tmp_path) -> WeightStore:
        raise NotImplementedError("subclass WeightStoreSuite and define make_store")

    @pytest.fixture
    def new_store(self, tmp_path):
        counter = itertools.count()
        return lambda keep=3: self.make_store(keep, tmp_path / f"store{next(counter)}")

    # -- basics ----------------------------------------------------------------------------

    def test_satisfies_the_protocol(self, new_store):
        assert isinstance(new_store(), WeightStore)

    def test_empty_store(self, new_store):
        store = new_store()
        assert store.versions() == []
        assert store.nbytes() == 0
        with pytest.raises(EmptyStoreError, match="empty"):
            store.get()
        with pytest.raises(EmptyStoreError):
            store.get(0)

    def test_round_trip_is_bit_exact(self, new_store):
        rng = np.random.default_rng(0)
        params = {
            "f32": rng.standard_normal((3, 5)).astype(np.float32),
            "bf16": np.array([1.5, -0.0, np.nan, np.inf, 3.14159, 1e-30], BF16),
            "ints": np.arange(6, dtype=np.int32).reshape(2, 3),
            "nested": {"layers": [{"w": rng.standard_normal(4).astype(BF16)}] * 2},
        }
        store = new_store()
        store.put(7, params)
        version, got = store.get()
        assert version == 7
        assert_trees_equal(got, params)
        assert_trees_equal(store.get(7)[1], params)

    def test_accepts_jax_arrays(self, new_store):
        import jax.numpy as jnp

        params = {"w": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3)}
        store = new_store()
        store.put(0, params)
        got = store.get(0)[1]["w"]
        assert got.dtype == BF16 and got.shape == (2, 3)
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.arange(6).reshape(2, 3))

    def test_put_copies_the_callers_arrays(self, new_store):
        params = filled(1)
        store = new_store()
        store.put(1, params)
        params["embed"][...] = -1.0  # the trainer reuses its buffers
        params["layers"][0]["w"][...] = -1.0
        params["layers"].append("junk")
        assert all_leaves_equal(store.get(1)[1], 1.0)
        assert len(store.get(1)[1]["layers"]) == 2

    def test_readers_cannot_change_the_stored_version(self, new_store):
        store = new_store()
        store.put(1, filled(1))
        _, got = store.get()
        try:
            got["embed"][0, 0] = -1.0  # either refused (read-only) or a private copy
        except ValueError:
            pass
        got["layers"].clear()
        got["norm"] = None
        assert all_leaves_equal(store.get()[1], 1.0)

    # -- versions --------------------------------------------------------------------------

    def test_get_latest_and_specific_versions(self, new_store):
        store = new_store(keep=3)
        for v in (0, 2, 5):
            store.put(v, filled(v))
        assert store.versions() == [0, 2, 5]
        version, params = store.get()
        assert version == 5 and all_leaves_equal(params, 5.0)
        for v in (0, 2, 5):
            version, params = store.get(v)
            assert version == v and all_leaves_equal(params, float(v))

    def test_versions_must_strictly_increase(self, new_store):
        store = new_store()
        store.put(3, filled(3))
        with pytest.raises(StaleVersionError, match="version 3"):
            store.put(3, filled(9))
        with pytest.raises(StaleVersionError, match="strictly increase"):
            store.put(2, filled(9))
        assert store.versions() == [3]
        assert all_leaves_equal(store.get(3)[1], 3.0)

    @pytest.mark.parametrize("bad", [1.0, "1", True, None])
    def test_version_must_be_an_int(self, new_store, bad):
        with pytest.raises(TypeError, match="int"):
            new_store().put(bad, filled(1))

    def test_negative_version_is_refused(self, new_store):
        with pytest.raises(ValueError, match=">= 0"):
            new_store().put(-1, filled(1))

    def test_unknown_version_lists_the_available_ones(self, new_store):
        store = new_store()
        store.put(4, filled(4))
        store.put(6, filled(6))
        with pytest.raises(UnknownVersionError, match=r"version 5 .*available: \[4, 6\]"):
            store.get(5)

    # -- retention -------------------------------------------------------------------------

    def test_keep_is_a_hard_cap_that_evicts_the_oldest(self, new_store):
        store = new_store(keep=3)
        for v in range(6):
            store.put(v, filled(v))
        assert store.versions() == [3, 4, 5]
        assert store.nbytes() == 3 * filled_nbytes()
        with pytest.raises(UnknownVersionError, match=r"available: \[3, 4, 5\]"):
            store.get(1)
        assert all_leaves_equal(store.get(3)[1], 3.0)

    def test_release_drops_only_older_versions(self, new_store):
        store = new_store(keep=5)
        for v in (1, 2, 3, 4):
            store.put(v, filled(v))
        assert store.nbytes() == 4 * filled_nbytes()
        assert store.release(0) == []
        assert store.release(3) == [1, 2]
        assert store.versions() == [3, 4]
        assert store.nbytes() == 2 * filled_nbytes()
        assert store.release(3) == []  # idempotent, like every controller action
        with pytest.raises(UnknownVersionError):
            store.get(2)
        assert all_leaves_equal(store.get(3)[1], 3.0)

    def test_release_never_drops_the_newest_version(self, new_store):
        store = new_store()
        store.put(1, filled(1))
        store.put(2, filled(2))
        with pytest.raises(ValueError, match="newest version 2"):
            store.release(3)
        assert store.versions() == [1, 2]
        assert store.release(2) == [1]

    def test_put_after_release_keeps_counting(self, new_store):
        store = new_store(keep=2)
        store.put(1, filled(1))
        store.release(1)
        store.put(2, filled(2))
        store.put(3, filled(3))
        assert store.versions() == [2, 3]
        with pytest.raises(StaleVersionError):
            store.put(1, filled(1))

    # -- concurrency -----------------------------------------------------------------------

    def test_concurrent_readers_never_see_a_torn_version(self, new_store):
        store = new_store(keep=3)
        errors, reads = hammer(store, last=40, readers=3)
        assert not errors, errors[:5]
        assert min(reads) > 0
        assert store.versions() == [38, 39, 40]
