"""Serialization of parameter pytrees and the pytree helpers (paths, templates, comparisons)."""

from __future__ import annotations

import collections
import io
import struct

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import msgpack
import numpy as np
import optax
import pytest
from hypothesis import given, settings

from minirl.store.serialization import MAGIC, from_bytes, read_tree, to_buffer, to_bytes, write_tree
from minirl.store.trees import (
    TreeMismatchError,
    assert_trees_allclose,
    assert_trees_equal,
    flatten_tree,
    match_template,
    tree_mismatch,
    unflatten_tree,
)

BF16 = ml_dtypes.bfloat16
Pair = collections.namedtuple("Pair", "first second")


def mixed_tree() -> dict:
    rng = np.random.default_rng(0)
    return {
        "embed": rng.standard_normal((5, 3)).astype(np.float32),
        "layers": [
            {"w": rng.standard_normal((3, 3)).astype(BF16), "b": np.zeros(3, np.float32)},
            {"w": np.asfortranarray(rng.standard_normal((3, 4))), "b": np.arange(4)[::2]},
        ],
        "pair": (np.float32(2.5), np.array(7, np.int64), np.zeros((0, 3), np.float16)),
        "big_endian": np.arange(3, dtype=">i4"),
        "by_layer": {0: np.ones(2, np.uint8), 1: np.array([True, False])},
        "meta": [None, True, 3, -2.5, "text", b"\x00\x01", 2**100, -(2**70)],
        "empty": {},
    }


# -- round trips -------------------------------------------------------------------------------


def test_round_trip_is_bit_exact_for_a_mixed_tree():
    tree = mixed_tree()
    back = from_bytes(to_bytes(tree))
    assert_trees_equal(back, tree)
    assert isinstance(back["pair"], tuple) and isinstance(back["layers"], list)
    assert isinstance(back["pair"][0], np.float32)  # numpy scalars stay scalars
    assert back["pair"][1].shape == () and back["pair"][2].shape == (0, 3)
    assert back["big_endian"].dtype == np.dtype(">i4")
    assert back["meta"][6] == 2**100 and back["meta"][7] == -(2**70)


def test_every_bfloat16_bit_pattern_survives():
    bits = np.arange(2**16, dtype=np.uint16)  # all values, NaN payloads and -0.0 included
    tree = {"all": bits.view(BF16).reshape(256, 256)}
    back = from_bytes(to_bytes(tree))["all"]
    assert back.dtype == BF16
    np.testing.assert_array_equal(back.view(np.uint16).ravel(), bits)


def test_jax_arrays_come_back_as_numpy_with_the_same_bits():
    x = jax.random.normal(jax.random.key(0), (4, 6), jnp.bfloat16)
    back = from_bytes(to_bytes({"x": x}))["x"]
    assert isinstance(back, np.ndarray) and back.dtype == BF16
    np.testing.assert_array_equal(back.view(np.uint16), np.asarray(x).view(np.uint16))


def test_write_tree_and_read_tree_match_the_bytes_format():
    tree = mixed_tree()
    f = io.BytesIO()
    n = write_tree(f, tree)
    assert f.getvalue() == to_bytes(tree) and n == len(f.getvalue())
    f.seek(0)
    back = read_tree(f, size=n)
    assert_trees_equal(back, tree)
    assert back["embed"].flags.writeable  # fresh arrays, read straight into place


def test_from_bytes_gives_zero_copy_read_only_views_unless_copy():
    b = to_bytes({"w": np.arange(1000, dtype=np.float32)})
    view = from_bytes(b)["w"]
    assert not view.flags.writeable and not view.flags.owndata
    owned = from_bytes(b, copy=True)["w"]
    assert owned.flags.writeable and owned.flags.owndata
    np.testing.assert_array_equal(view, owned)


def test_to_buffer_holds_the_same_bytes_and_gives_writable_views():
    tree = mixed_tree()
    buf = to_buffer(tree)
    assert buf.dtype == np.uint8 and buf.tobytes() == to_bytes(tree)
    back = from_bytes(buf)
    assert_trees_equal(back, tree)
    w = back["embed"]
    assert w.flags.writeable and np.shares_memory(w, buf)  # zero copy
    w[0, 0] = 99.0
    assert from_bytes(buf)["embed"][0, 0] == 99.0


def test_layout_is_a_small_header_then_aligned_raw_bytes():
    arrays = {"a": np.ones(1_000_003, np.float32), "b": np.ones(5, BF16), "c": np.ones(1, np.int8)}
    b = to_bytes(arrays)
    assert b[:8] == MAGIC
    (n,) = struct.unpack("<Q", b[8:16])
    header = msgpack.unpackb(b[16 : 16 + n])
    start = -(-(16 + n) // 64) * 64
    assert [o % 64 for _, _, o in header["arrays"]] == [0, 0, 0]
    assert header["arrays"][1][0] == "bfloat16"
    assert len(b) - sum(a.nbytes for a in arrays.values()) < 400  # no per-element encoding
    a0 = np.frombuffer(b, np.float32, count=1_000_003, offset=start + header["arrays"][0][2])
    np.testing.assert_array_equal(a0, arrays["a"])


def test_namedtuples_are_stored_as_dicts_and_templates_bring_them_back():
    params = {"w": jnp.ones((2, 3), jnp.bfloat16), "layers": [{"a": jnp.zeros(4)}]}
    opt_state = optax.adamw(1e-3).init(params)
    stored = from_bytes(to_bytes(opt_state))
    assert isinstance(stored, tuple) and set(stored[0]) == {"count", "mu", "nu"}
    back = match_template(stored, opt_state)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(opt_state)
    assert type(back[0]).__name__ == "ScaleByAdamState"
    assert_trees_equal(back, jax.tree_util.tree_map(np.asarray, opt_state))


@settings(max_examples=40, deadline=None)
@given(
    st.recursive(
        st.one_of(
            st.none(),
            st.integers(),
            st.floats(allow_nan=False),
            st.text(max_size=5),
            hnp.arrays(
                st.sampled_from([np.float32, np.int32, np.uint8, np.float64]),
                hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
            ),
            hnp.arrays(np.uint16, hnp.array_shapes(max_dims=2)).map(lambda a: a.view(BF16)),
        ),
        lambda kids: st.one_of(
            st.lists(kids, max_size=3),
            st.lists(kids, max_size=3).map(tuple),
            st.dictionaries(st.text(min_size=1, max_size=4), kids, max_size=3),
        ),
        max_leaves=12,
    )
)
def test_round_trip_property(tree):
    assert tree_mismatch(from_bytes(to_bytes(tree)), tree) is None


# -- errors ------------------------------------------------------------------------------------


def test_errors_are_clear():
    with pytest.raises(TypeError, match="object"):
        to_bytes({"x": np.array([object()])})
    with pytest.raises(TypeError, match=r"cannot serialize set at 'a/0'"):
        to_bytes({"a": [{1, 2}]})
    with pytest.raises(TypeError, match="keys must be str or int"):
        to_bytes({("a", 1): 1})
    with pytest.raises(ValueError, match="magic"):
        from_bytes(b"not a tree at all")
    b = to_bytes({"w": np.ones(100, np.float32)})
    with pytest.raises(ValueError, match="truncated"):
        from_bytes(b[:-10])
    with pytest.raises(ValueError, match="truncated"):
        read_tree(io.BytesIO(b[:-10]))
    with pytest.raises(ValueError, match="truncated"):
        read_tree(io.BytesIO(b[:-10]), size=len(b) - 10)  # caught before reading the data


def test_unknown_format_version_is_refused():
    header = msgpack.packb({"format": 99, "arrays": [], "tree": msgpack.packb(None)})
    with pytest.raises(ValueError, match="format 99"):
        from_bytes(MAGIC + struct.pack("<Q", len(header)) + header)


# -- flatten / unflatten ------------------------------------------------------------------------


def test_flatten_names_paths_and_unflatten_inverts_it_for_dicts():
    tree = {"b": {"y": 2, "x": 1}, "a": [10, Pair(20, None)]}
    flat = flatten_tree(tree)
    assert flat == {"a/0": 10, "a/1/first": 20, "b/x": 1, "b/y": 2}  # None has no leaf
    nested = {"layers": {"0": {"w": 1, "b": 2}}, "norm": 3}
    assert unflatten_tree(flatten_tree(nested)) == nested
    with pytest.raises(ValueError, match="separator"):
        flatten_tree({"a/b": 1})
    with pytest.raises(ValueError, match="passes through a leaf"):
        unflatten_tree({"a": 1, "a/b": 2})


# -- templates ----------------------------------------------------------------------------------


def test_template_mismatch_names_the_parameter_and_both_shapes():
    stored = {"layers": [{"w": np.zeros((4, 8), np.float32)}], "norm": np.zeros(8, np.float32)}
    bigger = {"layers": [{"w": np.zeros((4, 16), np.float32)}], "norm": np.zeros(8, np.float32)}
    with pytest.raises(TreeMismatchError, match=r"'layers/0/w'.*\(4, 8\).*\(4, 16\)"):
        match_template(stored, bigger)
    other_dtype = {**stored, "norm": jax.ShapeDtypeStruct((8,), jnp.bfloat16)}
    with pytest.raises(TreeMismatchError, match=r"'norm'.*float32.*bfloat16"):
        match_template(stored, other_dtype)
    with pytest.raises(TreeMismatchError, match=r"1 parameter\(s\) missing, first 'extra'"):
        match_template(stored, {**stored, "extra": np.zeros(1)})
    with pytest.raises(TreeMismatchError, match=r"1 unexpected parameter\(s\), first 'norm'"):
        match_template(stored, {"layers": stored["layers"]})
    specs = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), stored)
    assert_trees_equal(match_template(stored, specs), stored)


# -- comparisons -------------------------------------------------------------------------------


def test_tree_mismatch_names_the_first_differing_leaf():
    a = {"x": np.zeros((2, 3), np.float32), "y": np.ones(4, BF16)}
    assert tree_mismatch(a, {k: v.copy() for k, v in a.items()}) is None
    changed = {**a, "y": np.array([1, 1, 3, 1], BF16)}
    assert tree_mismatch(a, changed) == (
        "leaf 'y': shape (4,) bfloat16: 1 of 4 elements differ, first at index (2,): 1.0 vs 3.0"
    )
    assert tree_mismatch(a, {**a, "x": np.zeros((3, 2), np.float32)}) == (
        "leaf 'x': shape (2, 3) float32 vs shape (3, 2) float32"
    )
    assert "float32 vs shape (2, 3) float64" in tree_mismatch(a, {**a, "x": np.zeros((2, 3))})
    assert "first only in expected: 'z'" in tree_mismatch(a, {**a, "z": np.zeros(1)})
    assert "different containers" in tree_mismatch({"p": (1, 2)}, {"p": [1, 2]})


def test_exact_and_allclose_comparisons():
    nan = np.array([np.nan, 1.0], np.float32)
    assert_trees_equal({"n": nan}, {"n": nan.copy()})  # bit-exact: NaN equals itself
    with pytest.raises(AssertionError, match="'z'"):
        assert_trees_equal({"z": np.float32(0.0)}, {"z": np.float32(-0.0)})
    assert_trees_allclose({"z": np.float32(0.0)}, {"z": np.float32(-0.0)})
    near = {"v": np.array([1.0, 2.0 + 2.5e-7], np.float32)}
    assert_trees_allclose(near, {"v": np.array([1.0, 2.0], np.float32)}, rtol=1e-6)
    with pytest.raises(AssertionError, match=r"'v'.*index \(1,\)"):
        assert_trees_allclose(near, {"v": np.array([1.0, 2.0], np.float32)}, rtol=1e-9)
    with pytest.raises(AssertionError, match=r"'v'.*index \(1,\)"):
        assert_trees_equal(near, {"v": np.array([1.0, 2.0], np.float32)})
