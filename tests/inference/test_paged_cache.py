"""minirl/inference/paged_cache.py: the block allocator's bookkeeping and the pool <-> view round trip."""

import jax.numpy as jnp
import numpy as np
import pytest

from minirl.inference import paged_cache
from minirl.modeling.model import KVCache, ModelConfig

CFG = ModelConfig(
    vocab_size=16,
    dim=16,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    mlp_dim=16,
    max_seq_len=64,
)


def test_allocator_hands_out_blocks_on_demand_and_takes_them_back():
    a = paged_cache.BlockAllocator(num_blocks=6, block_size=4, slots=2, max_blocks_per_slot=3)
    assert a.num_used == 0 and len(a.free) == 5  # block 0 is the null block
    assert a.ensure(0, 5)  # 5 tokens -> 2 blocks
    assert a.table[0].tolist() == [1, 2, 0] and a.num_used == 2
    assert a.ensure(0, 8) and a.num_used == 2  # still fits in 2 blocks
    assert a.ensure(1, 9) and a.table[1].tolist() == [3, 4, 5]
    assert not a.ensure(0, 9)  # pool empty: nothing changes
    assert a.table[0].tolist() == [1, 2, 0] and a.num_used == 5 and a.peak_used == 5
    a.release(1)
    assert a.table[1].tolist() == [0, 0, 0] and a.num_used == 2
    assert not a.ensure(0, 13)  # more than a slot's table holds (3 blocks)
    assert a.ensure(0, 12) and 0 not in a.table[0].tolist()


def test_allocator_needs_a_real_block():
    with pytest.raises(ValueError, match="null block"):
        paged_cache.BlockAllocator(num_blocks=1, block_size=4, slots=1, max_blocks_per_slot=1)


def test_kv_bytes_per_token():
    # keys + values x 2 layers x 1 kv head x 4 dims x 4 bytes
    assert paged_cache.kv_bytes_per_token(CFG, jnp.float32) == 2 * 2 * 1 * 4 * 4
    assert paged_cache.kv_bytes_per_token(CFG, jnp.bfloat16) == 2 * 2 * 1 * 4 * 2


def test_write_rows_then_gather_matches_a_contiguous_cache():
    slots, bs, m = 3, 4, 4  # view width 16
    alloc = paged_cache.BlockAllocator(
        num_blocks=9, block_size=bs, slots=slots, max_blocks_per_slot=m
    )
    alloc.ensure(2, 7)
    alloc.ensure(0, 10)
    cache = paged_cache.PagedKVCache.zeros(CFG, slots, 9, bs, m, jnp.float32)
    cache = cache._replace(table=jnp.asarray(alloc.table))
    rng = np.random.default_rng(0)
    rows = KVCache(
        tuple(jnp.asarray(rng.standard_normal((3, 12, 1, 4)), jnp.float32) for _ in range(2)),
        tuple(jnp.asarray(rng.standard_normal((3, 12, 1, 4)), jnp.float32) for _ in range(2)),
        jnp.zeros(3, jnp.int32),
    )
    slot_ids, lengths = jnp.array([2, 0, slots]), jnp.array([7, 10, 5])  # third row is padding
    cache = paged_cache.write_rows(cache, rows, slot_ids, lengths)
    assert cache.lengths.tolist() == [10, 0, 7]
    view = paged_cache.gather_view(cache)
    assert view.k[0].shape == (slots, m * bs, 1, 4)
    for layer in range(2):
        np.testing.assert_array_equal(view.k[layer][2, :7], rows.k[layer][0, :7])
        np.testing.assert_array_equal(view.v[layer][0, :10], rows.v[layer][1, :10])
        np.testing.assert_array_equal(view.k[layer][1], 0.0)  # slot 1 owns no block
    np.testing.assert_array_equal(cache.k[0][0], 0.0)  # the null block is never written


def test_write_back_copies_only_the_new_positions():
    slots, bs, m = 2, 4, 3
    alloc = paged_cache.BlockAllocator(
        num_blocks=7, block_size=bs, slots=slots, max_blocks_per_slot=m
    )
    alloc.ensure(0, 12)
    alloc.ensure(1, 6)
    cache = paged_cache.PagedKVCache.zeros(CFG, slots, 7, bs, m, jnp.float32)
    cache = cache._replace(table=jnp.asarray(alloc.table), lengths=jnp.array([3, 5]))
    view = paged_cache.gather_view(cache)
    filled = lambda x: x + jnp.arange(m * bs, dtype=jnp.float32)[None, :, None, None] + 1
    view = KVCache(tuple(map(filled, view.k)), tuple(map(filled, view.v)), jnp.array([6, 6]))
    out = paged_cache.write_back(
        cache, view, starts=jnp.array([3, 5]), count=jnp.array([3, 1]), steps=4
    )
    back = paged_cache.gather_view(out)
    assert out.lengths.tolist() == [6, 6]
    np.testing.assert_array_equal(back.k[1][0, :, 0, 0], [0, 0, 0, 4, 5, 6] + [0] * 6)
    np.testing.assert_array_equal(back.v[0][1, :, 0, 0], [0] * 5 + [6] + [0] * 6)
