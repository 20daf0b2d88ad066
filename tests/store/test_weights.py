"""InMemoryWeightStore: the shared WeightStore contract plus what is specific to host memory."""

from __future__ import annotations

import time

import numpy as np
import pytest
from weightstore_suite import WeightStoreSuite, all_leaves_equal, filled, filled_nbytes, hammer

from minirl.store.weights import InMemoryWeightStore, WeightStore


class TestInMemoryWeightStore(WeightStoreSuite):
    def make_store(self, keep, tmp_path):
        return InMemoryWeightStore(keep=keep)


@pytest.mark.parametrize("keep", [0, -1, 2.0, True])
def test_keep_must_be_a_positive_int(keep):
    with pytest.raises(ValueError, match="keep"):
        InMemoryWeightStore(keep=keep)


def test_get_publishes_by_reference_without_copying():
    store = InMemoryWeightStore(keep=2)
    store.put(1, filled(1))
    a, b = store.get()[1], store.get()[1]
    assert a is not b  # fresh containers...
    assert np.shares_memory(a["embed"], b["embed"])  # ...around the same stored arrays
    assert not a["embed"].flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a["layers"][0]["w"][0, 0] = 5.0


def test_put_views_jax_arrays_on_the_cpu_and_copies_numpy():
    """A JAX array never changes, so `put` keeps a read-only view of it (at the 0.5B shape a 2 GB
    copy per version saved); a numpy array's owner may still write to it, so that is copied."""
    import jax.numpy as jnp

    x, y = jnp.arange(12.0).reshape(3, 4), np.arange(12.0).reshape(3, 4)
    store = InMemoryWeightStore(keep=2)
    store.put(1, {"jax": x, "numpy": y})
    got = store.get()[1]
    assert np.shares_memory(got["jax"], np.asarray(x)) and not got["jax"].flags.writeable
    assert not np.shares_memory(got["numpy"], y)
    y[0, 0] = 99.0
    assert got["numpy"][0, 0] == 0.0


def test_nbytes_counts_host_bytes_of_every_version():
    store = InMemoryWeightStore(keep=4)
    store.put(0, filled(0))
    store.put(1, {**filled(1), "step": 3, "note": None})  # non-array leaves cost nothing
    assert filled_nbytes() == 4 * 8 * 4 + 2 * (8 * 8 * 2 + 8 * 4) + 8 * 2 == 464
    assert store.nbytes() == 2 * 464
    assert store.get(1)[1]["step"] == 3 and store.get(1)[1]["note"] is None


def test_repr_names_the_versions():
    store = InMemoryWeightStore(keep=2)
    store.put(5, filled(5))
    assert repr(store) == "InMemoryWeightStore(keep=2, versions=[5])"


class TornStore:
    """A deliberately wrong store that overwrites one shared tree leaf by leaf: the hammer must
    catch it, or the concurrency test proves nothing."""

    def __init__(self):
        self.version, self.params = None, None

    def put(self, version, params):
        if self.params is None:
            self.version, self.params = version, params
            return
        layers = [x for d in self.params["layers"] for x in d.values()]
        for leaf in [self.params["embed"], self.params["norm"], *layers]:
            leaf[...] = params["embed"][0, 0]
            time.sleep(0)  # let a reader run mid-update
        self.version = version

    def get(self, version=None):
        return self.version, self.params

    def versions(self):
        return [self.version]

    def release(self, before_version):
        return []

    def nbytes(self):
        return 0


def test_the_hammer_catches_a_store_that_tears_versions():
    store = TornStore()
    assert isinstance(store, WeightStore)
    errors, _ = hammer(store, last=6, readers=2)
    assert any("torn read" in e for e in errors)
    assert all_leaves_equal(store.get()[1], 6.0)
