"""minirl/modeling/exact.py by hand: the tree that pairs neighbours, how a contraction is cut, and
which device layouts exact mode accepts. (Its bits across row counts: tests/modeling/test_model.py;
across device meshes: tests/scale/test_exact_layouts.py; the Pallas kernel:
tests/modeling/test_exact_kernels.py.)"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from minirl.modeling import exact


def test_tree_sum_pairs_neighbours():
    # (1e8 + 1) + (-1e8 + 1) = 1e8 - 1e8 = 0 in float32 (each 1 is lost to rounding); a tree
    # pairing halves would give (1e8 - 1e8) + (1 + 1) = 2, a left-to-right sum 1.
    x = np.asarray([[1e8, 1.0, -1e8, 1.0], [1e8, -1e8, 1.0, 1.0]], np.float32)
    assert jax.jit(exact.tree_sum)(x).tolist() == [0.0, 2.0]  # the same values, paired otherwise
    assert float(exact.tree_sum(np.asarray([1.0, 2.0, 4.0], np.float32))) == 7.0  # zero-padded


def test_tree_sum_is_the_shards_subtrees_added_in_the_same_tree():
    """What makes the tree layout-invariant: each shard's own tree_sum, then tree_sum of those."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 64)) * 1e3, jnp.float32)

    @jax.jit
    def sums(x):
        shard_trees = [
            exact.tree_sum(jnp.stack([exact.tree_sum(b) for b in jnp.split(x, s, -1)], -1))
            for s in (2, 4, 8)
        ]
        return exact.tree_sum(x), jnp.stack(shard_trees), x.sum(-1)

    whole, by_shards, plain = sums(x)
    for got in by_shards:  # split 2, 4 and 8 ways
        np.testing.assert_array_equal(got, whole)
    assert not np.array_equal(whole, plain)  # the order matters at these magnitudes


def test_chunking_by_hand():
    assert exact.chunking(32) == (8, 1, 16)  # 8 groups of 4, each one 16-wide chunk
    assert exact.chunking(96) == (8, 1, 16)  # groups of 12
    assert exact.chunking(200) == (8, 1, 32)  # groups of 25
    assert exact.chunking(512) == (8, 2, 32)  # groups of 64: two 32-chunks each
    assert exact.chunking(4864) == (8, 19, 32)  # Qwen2.5-0.5B's MLP: groups of 608
    assert exact.chunking(12) == (4, 1, 16)  # gcd(12, 8) = 4 groups of 3
    assert exact.chunking(37) == (1, 2, 32)  # odd: one group, and a zero chunk (never one dot)


def test_chunk_layout_pads_each_group_at_its_end():
    x = jnp.arange(1, 13, dtype=jnp.float32)[None]  # [1, 12]: 4 groups of 3, padded to 16 each
    xc, wc = jax.jit(exact.chunk_layout)(x, jnp.ones((12, 2), jnp.float32))
    assert xc.shape == (1, 4, 1, 16) and wc.shape == (4, 1, 16, 2)
    np.testing.assert_array_equal(xc[0, 1, 0, :4], [4.0, 5.0, 6.0, 0.0])
    h = jnp.zeros((5, 3, 24))  # experts: x [..., E, F], w [E, F, O] -> E * G groups
    xc, wc = jax.eval_shape(exact.chunk_layout, h, jnp.zeros((3, 24, 7)))
    assert xc.shape == (5, 24, 1, 16) and wc.shape == (24, 1, 16, 7)


def test_exact_dense_is_close_to_the_product_in_both_layouts():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 5, 96)), rng.standard_normal((96, 7))
    h, we = rng.standard_normal((4, 3, 24)), rng.standard_normal((3, 24, 5))  # experts
    f32 = lambda *a: [jnp.asarray(v, jnp.float32) for v in a]  # noqa: E731
    got, experts, fast = jax.jit(
        lambda x, w, h, we: (exact.dense(x, w, True), exact.dense(h, we, True), exact.dense(h, we))
    )(*f32(x, w, h, we))
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(experts, np.einsum("bef,efo->bo", h, we), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast, experts, rtol=1e-5, atol=1e-5)


class _Split:
    """An array stand-in split `ways[d]` ways along each dim d (what check_layout reads)."""

    def __init__(self, shape, ways):
        self.shape = shape
        shard = tuple(-(-s // w) for s, w in zip(shape, ways, strict=True))
        self.sharding = types.SimpleNamespace(shard_shape=lambda _: shard)


def test_check_layout_accepts_splits_into_2_4_8_and_refuses_others():
    ok = {"a": _Split((64, 32), (2, 4)), "b": _Split((96,), (8,)), "c": np.zeros(3)}
    exact.check_layout(ok)
    for shape, ways in (((96, 8), (3, 1)), ((64, 8), (16, 1)), ((6, 8), (4, 1))):
        with pytest.raises(
            ValueError, match=r"layers/0/w \(\d+, 8\) is split \d+ ways along dim 0"
        ):
            exact.check_layout({"layers": {0: {"w": _Split(shape, ways)}}})
    exact.check_layout({"w": jax.device_put(jnp.zeros((4, 4)))})  # one device: nothing split


def test_kernel_mode_reads_its_environment_variable(monkeypatch):
    monkeypatch.delenv(exact.KERNEL_ENV, raising=False)
    assert exact.kernel_mode() == ("xla" if jax.default_backend() == "cpu" else "pallas")
    monkeypatch.setenv(exact.KERNEL_ENV, "interpret")
    assert exact.kernel_mode() == "interpret"
    monkeypatch.setenv(exact.KERNEL_ENV, "triton")
    with pytest.raises(ValueError, match="MINIRL_EXACT_KERNEL must be auto, xla, pallas or"):
        exact.kernel_mode()
