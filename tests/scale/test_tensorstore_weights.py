"""TensorStoreWeightStore: the shared WeightStore contract on `file` and `memory` kvstores, plus
what is specific to TensorStore: atomic commits, partial (slice / sharded) reads, several store
objects on one root, eviction while reading."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
from weightstore_suite import WeightStoreSuite, all_leaves_equal, filled

from minirl.store.trees import assert_trees_equal
from minirl.store.weights import UnknownVersionError
from scale.tensorstore_layout import chunk_shape
from scale.tensorstore_weights import TensorStoreWeightStore

BF16 = ml_dtypes.bfloat16


class TestFileStore(WeightStoreSuite):
    def make_store(self, keep, tmp_path):
        # no fsync: the contract is about visibility, and fsyncs make the hammer test 4x slower
        return TensorStoreWeightStore(f"file://{tmp_path}", keep=keep, file_sync=False)


class TestMemoryStore(WeightStoreSuite):
    def make_store(self, keep, tmp_path):
        return TensorStoreWeightStore("memory://weights/", keep=keep)  # fresh context each


def params_tree(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "embed": rng.standard_normal((16, 8)).astype(BF16),  # [V, D]
        "layers": [
            {"attn": {"q_proj": rng.standard_normal((8, 12)).astype(np.float32)}},
            {"attn": {"q_proj": rng.standard_normal((8, 12)).astype(np.float32)}},
        ],
        "final_norm": np.ones(8, BF16),
        "zeros": np.zeros((3, 3), np.float32),  # all fill value: must still be stored
        "step": 5,
        "tag": ("a", np.float32(2.5)),
    }


def test_bfloat16_round_trip_is_exact_including_specials(tmp_path):
    bits = np.arange(0, 1 << 16, 7, dtype=np.uint16)  # every 7th bf16 bit pattern, NaNs included
    x = bits[:9360].view(BF16).reshape(-1, 13)  # [720, 13]
    store = TensorStoreWeightStore(tmp_path / "w", chunk_bytes=1000)  # several chunks
    store.put(0, {"x": x})
    got = store.get(0)[1]["x"]
    assert got.dtype == BF16
    np.testing.assert_array_equal(got.view(np.uint16), x.view(np.uint16))


def test_structure_scalars_and_non_array_leaves_round_trip(tmp_path):
    params = params_tree()
    store = TensorStoreWeightStore(tmp_path / "w")
    store.put(3, params)
    _, got = store.get()
    assert_trees_equal(got, params)
    assert isinstance(got["tag"][1], np.float32) and got["step"] == 5


def test_read_slices_reads_only_the_selection(tmp_path):
    params = params_tree()
    store = TensorStoreWeightStore(tmp_path / "w", chunk_bytes=64)  # embed: 16 chunks of 2 rows
    store.put(1, params)
    before = store.stats["bytes_read"]
    version, part = store.read_slices(None, {"embed": np.s_[4:10, 2:6], "layers/1/attn/q_proj": 3})
    assert version == 1
    np.testing.assert_array_equal(part["embed"], params["embed"][4:10, 2:6])
    np.testing.assert_array_equal(
        part["layers/1/attn/q_proj"], params["layers"][1]["attn"]["q_proj"][3]
    )
    assert store.stats["bytes_read"] - before == 6 * 4 * 2 + 12 * 4
    with pytest.raises(KeyError, match="no array 'nope'"):
        store.read_slices(1, {"nope": ()})


def test_get_sharded_places_arrays_with_the_given_sharding(tmp_path):
    params = {"w": np.arange(24, dtype=np.float32).reshape(6, 4), "b": np.ones(4, BF16)}
    store = TensorStoreWeightStore(tmp_path / "w")
    store.put(2, params)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("tensor",))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "tensor"))
    version, got = store.get_sharded(
        None,
        lambda path, shape: (
            spec
            if len(shape) == 2
            else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        ),
    )
    assert version == 2 and isinstance(got["w"], jax.Array) and got["w"].sharding == spec
    np.testing.assert_array_equal(np.asarray(got["w"]), params["w"])
    assert got["b"].dtype == jnp.bfloat16


def test_chunks_tile_the_shards_of_a_sharded_array():
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("fsdp",))
    x = jax.device_put(
        jnp.zeros((8, 6)), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    )
    assert chunk_shape(x, 1 << 20) == [8, 6]  # one shard: one chunk
    assert chunk_shape(np.zeros((7, 4), np.float32), 32) == [2, 4]  # ~32 bytes: 2 rows
    assert chunk_shape(np.zeros((0, 4), np.float32), 32) == [1, 4]  # zarr needs chunks >= 1
    assert chunk_shape(np.float32(1.0), 32) == []


def test_an_uncommitted_version_is_invisible_and_its_leftovers_are_cleared(tmp_path):
    store = TensorStoreWeightStore(tmp_path / "w")
    store.put(1, filled(1))
    store.begin(2)
    store.write(2, filled(2))  # a crash here: arrays written, no manifest
    assert store.versions() == [1]
    assert store.get()[0] == 1
    reader = TensorStoreWeightStore(tmp_path / "w")
    assert reader.versions() == [1]
    store.put(2, filled(2))  # the retry clears and rewrites version 2
    assert reader.get()[0] == 2 and all_leaves_equal(reader.get()[1], 2.0)


def test_discard_from_rolls_the_store_back_for_a_resumed_run(tmp_path):
    store = TensorStoreWeightStore(tmp_path / "w", keep=8, file_sync=False)
    for v in range(5):
        store.put(v, filled(v))
    assert store.discard_from(3) == [4, 3] and store.versions() == [0, 1, 2]
    assert sorted(os.listdir(tmp_path / "w" / "data")) == [f"{v:012d}" for v in range(3)]
    store.put(3, filled(30))  # the replayed version 3: new weights under the old number
    assert all_leaves_equal(TensorStoreWeightStore(tmp_path / "w").get(3)[1], 30.0)
    assert store.discard_from(7) == [] and store.versions() == [0, 1, 2, 3]


def test_several_store_objects_share_one_root_and_one_memory_context():
    ctx = ts.Context()
    writer = TensorStoreWeightStore("memory://run/", keep=2, context=ctx)
    reader = TensorStoreWeightStore("memory://run/", keep=2, context=ctx)
    for v in range(4):
        writer.put(v, filled(v))
    assert reader.versions() == [2, 3]
    assert all_leaves_equal(reader.get(2)[1], 2.0)
    assert TensorStoreWeightStore("memory://run/", context=ts.Context()).versions() == []


def test_manifest_is_the_commit_marker_and_is_readable_json(tmp_path):
    store = TensorStoreWeightStore(tmp_path / "w")
    store.put(7, params_tree())
    with open(tmp_path / "w" / "manifests" / "000000000007.json") as f:
        manifest = json.load(f)
    assert manifest["version"] == 7 and manifest["format"].startswith("minirl-tensorstore")
    entries = {e["path"]: e for e in manifest["arrays"]}
    assert entries["embed"]["dtype"] == "bfloat16" and entries["embed"]["shape"] == [16, 8]
    assert (
        manifest["nbytes"]
        == store.nbytes()
        == sum(x.nbytes for x in jax.tree.leaves(params_tree()) if hasattr(x, "nbytes"))
    )
    os.remove(tmp_path / "w" / "manifests" / "000000000007.json")  # un-commit by hand
    assert store.versions() == []


def test_a_version_deleted_during_a_read_is_unknown_not_zeros(tmp_path):
    store = TensorStoreWeightStore(tmp_path / "w", keep=3)
    store.put(1, filled(1))
    store.put(2, filled(2))
    manifest = store._manifest_for(1)[1]  # a reader got this far ...
    store.release(2)  # ... then the writer deleted version 1 (manifest, then chunks)
    with pytest.raises(UnknownVersionError, match="version 1"):
        store._read(1, manifest, [(e, ()) for e in manifest["arrays"]])


def test_missing_data_of_a_committed_version_is_an_error(tmp_path):
    store = TensorStoreWeightStore(tmp_path / "w")
    store.put(1, {"zeros": np.zeros((4, 4), np.float32)})  # all-fill chunks are stored too
    chunk_dir = tmp_path / "w" / "data" / "000000000001" / "00000" / "c"
    assert any(chunk_dir.rglob("*"))
    for f in [p for p in chunk_dir.rglob("*") if p.is_file()]:
        f.unlink()
    with pytest.raises(ValueError, match="missing"):
        store.get(1)


@pytest.mark.parametrize("bad", [{"x": np.array(["a"])}, {"x": np.array([object()])}])
def test_unstorable_dtypes_are_refused_clearly(tmp_path, bad):
    with pytest.raises(TypeError, match="dtype"):
        TensorStoreWeightStore(tmp_path / "w").put(0, bad)


@pytest.mark.parametrize("kwargs", [{"keep": 0}, {"keep": 1.5}, {"chunk_bytes": 0}])
def test_bad_config_is_refused(tmp_path, kwargs):
    with pytest.raises(ValueError):
        TensorStoreWeightStore(tmp_path, **kwargs)


def test_the_newest_evicted_mid_read_is_read_again_a_version_by_number_is_not():
    """A reader of "the newest" whose version is evicted while it reads (a writer put `keep`
    versions meanwhile: a loaded machine, a slow reader) gets the new newest, never an error;
    a version asked for by number that is gone stays an UnknownVersionError."""
    store = TensorStoreWeightStore("memory://evicted-mid-read/", keep=2)
    store.put(1, {"w": np.full(4, 1.0, np.float32)})
    real_read, calls = store._read, []

    def slow_read(version, manifest, wanted):
        calls.append(version)
        if len(calls) == 1:  # while the first read runs, the writer moves on by two versions
            store.put(2, {"w": np.full(4, 2.0, np.float32)})
            store.put(3, {"w": np.full(4, 3.0, np.float32)})
        return real_read(version, manifest, wanted)

    store._read = slow_read
    version, params = store.get()
    assert (version, calls) == (3, [1, 3])
    np.testing.assert_array_equal(params["w"], np.full(4, 3.0, np.float32))
    calls.clear()
    store.put(4, {"w": np.full(4, 4.0, np.float32)})
    store.put(5, {"w": np.full(4, 5.0, np.float32)})  # version 3 is evicted (keep=2)
    with pytest.raises(UnknownVersionError):
        store.get(3)


@pytest.mark.parametrize(
    "name", ["7.json", "0000000000007.json", "00000000000٣.json", "\udcff.json"]
)
def test_a_stray_file_under_manifests_is_no_version(tmp_path, name):
    """Only manifest_key(v) names version v: a "7.json" had listed a version 7 that no read
    found, so `get()` retried it forever; a name that is not UTF-8 crashed the listing."""
    store = TensorStoreWeightStore(tmp_path / "w")
    store.put(0, {"w": np.arange(4, dtype=np.float32)})
    with open(os.path.join(os.fsencode(tmp_path / "w" / "manifests"), os.fsencode(name)), "w") as f:
        f.write("{}")
    assert store.versions() == [0]
    assert store.get()[0] == 0


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: "{not json",
        lambda m: [m],
        lambda m: {**m, "version": 5},  # another version's manifest copied over this one
        lambda m: {**m, "arrays": m["arrays"][:1]},  # had been an IndexError
        lambda m: {**m, "skeleton": "!!"},
        lambda m: {
            **m,
            "arrays": [{**m["arrays"][0], "name": "../../../elsewhere"}, m["arrays"][1]],
        },
        lambda m: {
            **m,
            "arrays": [{**m["arrays"][0], "shape": [2]}, m["arrays"][1]],
        },  # had read 2 of 4
        lambda m: {**m, "arrays": [{**m["arrays"][0], "shape": [10**12]}, m["arrays"][1]]},  # abort
        lambda m: {**m, "arrays": [{**m["arrays"][0], "dtype": "float64"}, m["arrays"][1]]},
        lambda m: {**m, "arrays": [{**m["arrays"][0], "dtype": "object"}, m["arrays"][1]]},
    ],
)
def test_a_damaged_or_hand_edited_manifest_is_refused_before_any_read(tmp_path, edit):
    store = TensorStoreWeightStore(tmp_path / "w")
    store.put(0, {"a": np.arange(4, dtype=np.float32), "b": np.ones((2, 2), np.float32)})
    path = tmp_path / "w" / "manifests" / "000000000000.json"
    edited = edit(json.loads(path.read_text()))
    path.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    with pytest.raises(
        ValueError, match="version 0: (the store's manifest is damaged|its manifest is not JSON)"
    ):
        TensorStoreWeightStore(tmp_path / "w").get(0)


# (leaf, manifest fields as edited, what the array's zarr.json records): same bytes per element
# or the same number of elements, so the manifest's own byte count still adds up.
SAME_SIZE_EDITS = [
    ("w", {"dtype": "int32"}, r"float32 \[4\] \(chunks \[4\]\)"),
    ("h", {"dtype": "float16"}, r"bfloat16 \[2, 3\] \(chunks \[2, 3\]\)"),
    ("h", {"shape": [3, 2], "chunks": [3, 2]}, r"bfloat16 \[2, 3\] \(chunks \[2, 3\]\)"),
    ("h", {"chunks": [1, 3]}, r"bfloat16 \[2, 3\] \(chunks \[2, 3\]\)"),
]


@pytest.mark.parametrize(
    ("leaf", "edit", "stored"), SAME_SIZE_EDITS, ids=["f32-i32", "bf16-f16", "shape", "chunks"]
)
def test_a_manifest_that_disagrees_with_the_stored_array_is_refused(tmp_path, leaf, edit, stored):
    """A manifest entry whose dtype was edited to another of the same width (float32 -> int32,
    bfloat16 -> float16), or whose shape or chunks were edited keeping the byte count, passed
    every check of the manifest alone, and the weights were read as garbage (readers open
    arrays with the manifest's metadata). Each array's zarr.json says what it really is: the
    read is refused, naming the version and the array, by get, read_slices and get_sharded."""
    params = {"w": np.arange(4, dtype=np.float32), "h": np.ones((2, 3), BF16)}
    TensorStoreWeightStore(tmp_path / "w").put(3, params)
    path = tmp_path / "w" / "manifests" / "000000000003.json"
    manifest = json.loads(path.read_text())
    for entry in manifest["arrays"]:
        if entry["path"] == leaf:
            entry.update(edit)
    path.write_text(json.dumps(manifest))
    match = f"version 3: array '{leaf}' .* is stored as {stored}, but the version's manifest says"
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    for read in (
        lambda s: s.get(3),
        lambda s: s.read_slices(None, {"w": ()}),
        lambda s: s.get_sharded(3, cpu),
    ):
        with pytest.raises(ValueError, match=match):
            read(TensorStoreWeightStore(tmp_path / "w"))


def test_a_missing_zarr_json_of_a_committed_version_is_named(tmp_path):
    store = TensorStoreWeightStore(tmp_path / "w")
    store.put(0, {"a": np.arange(4, dtype=np.float32), "b": np.ones((2, 2), np.float32)})
    (tmp_path / "w" / "data" / "000000000000" / "00001" / "zarr.json").unlink()
    with pytest.raises(ValueError, match="version 0: array 'b' .*zarr.json is missing"):
        TensorStoreWeightStore(tmp_path / "w").get(0)
