"""A paged KV cache: a pool of fixed-size blocks, a block table per slot, a free list.

What it is: the vLLM idea (PagedAttention, Kwon et al. 2023) in its simplest form. Instead of
reserving `cache_len` positions for every slot, keys and values live in a shared pool of
`num_blocks` blocks of `block_size` positions; slot b's position p is stored in block
`table[b, p // block_size]` at offset `p % block_size`. Blocks are handed out on demand as a
sequence grows and go back to the free list when it finishes, so the pool only has to hold the
tokens that exist, not `slots x cache_len`. When the pool runs dry the engine preempts the
youngest sequence and re-queues it (vLLM's "recompute" preemption); counter-based sampling
makes the recomputed rollout the same one.

Simplified on purpose: there is no paged-attention kernel. Each decode chunk gathers the slots'
blocks into a contiguous [B, S, K, Dh] view, runs the model's ordinary attention on it for all
steps of the chunk, and writes only the new positions back to the pool. The pool is what stays
in memory between calls; the view is a temporary of the contiguous cache's size that lives for
one call, and the gather costs one extra pass over it per chunk (measured in
benchmarks/test_bench_engine.py). Block 0 is the null block: unallocated table entries point to
it, it is never written, so gathered garbage is zeros (and masked anyway).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from minirl.modeling.model import KVCache, ModelConfig


def kv_bytes_per_token(cfg: ModelConfig, dtype) -> int:
    """Keys + values of one position across all layers."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(dtype).itemsize


class BlockAllocator:
    """Host-side bookkeeping: which blocks are free and which blocks each slot owns."""

    def __init__(self, num_blocks: int, block_size: int, slots: int, max_blocks_per_slot: int):
        if num_blocks < 2:
            raise ValueError("a paged cache needs at least 2 blocks (block 0 is the null block)")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.free: list[int] = list(range(num_blocks - 1, 0, -1))  # pop() hands out 1, 2, ...
        self.owned: list[list[int]] = [[] for _ in range(slots)]
        self.table = np.zeros((slots, max_blocks_per_slot), np.int32)  # [B, M]; 0 = null block
        self.peak_used = 0

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self.free)

    def ensure(self, slot: int, num_tokens: int) -> bool:
        """Give `slot` enough blocks for `num_tokens` positions. False (and no change) if the
        pool cannot, or if that is more than a slot's table holds."""
        need = self.blocks_for(num_tokens) - len(self.owned[slot])
        if need <= 0:
            return True
        if need > len(self.free) or self.blocks_for(num_tokens) > self.table.shape[1]:
            return False
        for _ in range(need):
            block = self.free.pop()
            self.table[slot, len(self.owned[slot])] = block
            self.owned[slot].append(block)
        self.peak_used = max(self.peak_used, self.num_used)
        return True

    def release(self, slot: int) -> None:
        self.free.extend(reversed(self.owned[slot]))
        self.owned[slot] = []
        self.table[slot] = 0


class PagedKVCache(NamedTuple):
    """The device side: the block pool per layer, each slot's length, and the block table."""

    k: tuple  # L x [N, Bs, K, Dh]  (N blocks of Bs positions)
    v: tuple  # L x [N, Bs, K, Dh]
    lengths: jax.Array  # [B] int32 real tokens per slot
    table: jax.Array  # [B, M] int32 block of each slot's M-th page

    @staticmethod
    def zeros(
        cfg: ModelConfig,
        slots: int,
        num_blocks: int,
        block_size: int,
        max_blocks_per_slot: int,
        dtype,
    ) -> PagedKVCache:
        shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)
        pool = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
        return PagedKVCache(
            pool(),
            pool(),
            jnp.zeros((slots,), jnp.int32),
            jnp.zeros((slots, max_blocks_per_slot), jnp.int32),
        )


def gather_view(cache: PagedKVCache, width: int | None = None) -> KVCache:
    """The contiguous view the model attends over: the first `width` positions (default all,
    M * Bs; a multiple of Bs) of every slot, [B, width, K, Dh] per layer."""
    table = cache.table if width is None else cache.table[:, : width // cache.k[0].shape[1]]

    def view(pool):  # [N, Bs, K, Dh] -> [B, width, K, Dh]
        pages = pool[table]  # [B, M, Bs, K, Dh]
        return pages.reshape(pages.shape[0], -1, *pages.shape[3:])

    return KVCache(tuple(map(view, cache.k)), tuple(map(view, cache.v)), cache.lengths)


def _scatter(cache: PagedKVCache, slot_ids, positions, valid, values_k, values_v) -> PagedKVCache:
    """Write values [R, T, K, Dh] of slots `slot_ids` [R] at `positions` [R, T] (where `valid`)
    into the pool; invalid entries go to an out-of-range block and are dropped."""
    bs, n = cache.k[0].shape[1], cache.k[0].shape[0]
    rows = jnp.take(cache.table, slot_ids, axis=0, mode="clip")  # [R, M]
    block = jnp.take_along_axis(rows, positions // bs, axis=1, mode="clip")  # [R, T]
    block = jnp.where(valid, block, n)  # n is out of range: dropped
    offset = positions % bs
    write = lambda pool, vals: pool.at[block, offset].set(vals.astype(pool.dtype), mode="drop")
    return cache._replace(
        k=tuple(map(write, cache.k, values_k)), v=tuple(map(write, cache.v, values_v))
    )


def write_rows(cache: PagedKVCache, rows: KVCache, slot_ids, lengths) -> PagedKVCache:
    """Prefill: copy the first lengths[r] positions of rows.k/v [R, T, K, Dh] to slot
    slot_ids[r] (slot ids >= slots are padding rows and are dropped); set its length."""
    t = rows.k[0].shape[1]
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (len(slot_ids), t))
    valid = (positions < lengths[:, None]) & (slot_ids < cache.lengths.shape[0])[:, None]
    cache = _scatter(cache, slot_ids, positions, valid, rows.k, rows.v)
    return cache._replace(lengths=cache.lengths.at[slot_ids].set(lengths, mode="drop"))


def write_back(cache: PagedKVCache, view: KVCache, starts, count, steps: int) -> PagedKVCache:
    """After a decode chunk of `steps` steps on `view`: copy each slot's new positions
    starts[b] .. starts[b] + count[b] - 1 from the view into the pool; take the view's lengths."""
    b, s = view.k[0].shape[:2]
    positions = starts[:, None] + jnp.arange(steps, dtype=jnp.int32)[None, :]  # [B, steps]
    valid = jnp.arange(steps)[None, :] < count[:, None]
    index = jnp.minimum(positions, s - 1)[:, :, None, None]
    pick = lambda x: jnp.take_along_axis(x, index, axis=1)  # [B, steps, K, Dh]
    cache = _scatter(
        cache, jnp.arange(b), positions, valid, tuple(map(pick, view.k)), tuple(map(pick, view.v))
    )
    return cache._replace(lengths=view.lengths)
