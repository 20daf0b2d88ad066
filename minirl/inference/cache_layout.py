"""Where the engine keeps keys and values: two layouts behind one small interface.

    layout = ContiguousLayout(model_cfg, engine_cfg)   # or PagedLayout (engine.paged=true)
    cache = layout.empty()                              # allocated once
    layout.ensure(slot, positions)                      # room for that many positions? (host)
    layout.release(slot)                                # the slot's sequence is done (host)
    layout.for_device(cache)                            # what the compiled functions take

    # inside the compiled prefill / decode (static methods, traced):
    cache = layout.write_rows(cache, rows, slot_ids, lengths)   # a prefill's keys/values in
    view = layout.view(cache, width)                            # what a decode chunk attends over
    cache = layout.write_back(cache, view, starts, count, steps)  # the chunk's new positions out

ContiguousLayout reserves `cache_len` positions for every slot up front: `ensure` always
succeeds, a view is the first `width` positions, nothing to release. PagedLayout
(minirl/inference/paged_cache.py: a block pool, block tables, a free list) hands blocks out as sequences
grow: `ensure` fails when the pool is dry (the engine then preempts the youngest sequence), a
view is gathered from the blocks, and the host's block table travels with the cache. The engine
and the compiled functions call only these methods, so neither has a branch on the layout.
"""

from __future__ import annotations

import jax.numpy as jnp

from minirl.inference import paged_cache
from minirl.modeling.model import KVCache, ModelConfig


class ContiguousLayout:
    """slots x cache_len positions, reserved up front."""

    def __init__(self, model_cfg: ModelConfig, engine_cfg):
        self.model_cfg, self.cfg = model_cfg, engine_cfg

    def empty(self) -> KVCache:
        return KVCache.zeros(self.model_cfg, self.cfg.slots, self.cfg.cache_len)

    def ensure(self, slot: int, positions: int) -> bool:
        return True

    def release(self, slot: int) -> None:
        pass

    def for_device(self, cache: KVCache) -> KVCache:
        return cache

    def memory(self, used_tokens: int, peak_tokens: int) -> dict[str, int]:
        """Positions allocated, used now and at the peak, and the largest temporary view."""
        c = self.cfg
        view = max((w for w in c.windows if w < c.cache_len), default=0)  # a window copy
        return {
            "allocated": c.slots * c.cache_len,
            "used": used_tokens,
            "peak_used": peak_tokens,
            "transient": c.slots * view,
        }

    @staticmethod
    def write_rows(cache: KVCache, rows: KVCache, slot_ids, lengths) -> KVCache:
        """Prefill: rows [R, T] go to slots `slot_ids` (>= B: dropped)."""
        t = rows.k[0].shape[1]
        put = lambda c, r: c.at[slot_ids, :t].set(r.astype(c.dtype), mode="drop")  # noqa: E731
        return KVCache(
            tuple(map(put, cache.k, rows.k)),
            tuple(map(put, cache.v, rows.v)),
            cache.lengths.at[slot_ids].set(lengths, mode="drop"),
        )

    @staticmethod
    def view(cache: KVCache, width: int) -> KVCache:
        """The first `width` positions of every slot."""
        if width == cache.size:
            return cache
        cut = lambda x: x[:, :width]  # noqa: E731
        return KVCache(tuple(map(cut, cache.k)), tuple(map(cut, cache.v)), cache.lengths)

    @staticmethod
    def write_back(cache: KVCache, view: KVCache, starts, count, steps: int) -> KVCache:
        """Copy each slot's new positions starts[b] .. starts[b] + count[b] - 1 from a window
        view back into the full cache."""
        if view.size == cache.size:
            return view
        positions = starts[:, None] + jnp.arange(steps, dtype=jnp.int32)[None, :]  # [B, N]
        target = jnp.where(jnp.arange(steps)[None, :] < count[:, None], positions, cache.size)
        index = jnp.minimum(positions, view.size - 1)[:, :, None, None]
        rows = jnp.arange(positions.shape[0])[:, None]

        def put(full, part):
            new = jnp.take_along_axis(part, index, axis=1)  # [B, N, K, Dh]
            return full.at[rows, target].set(new, mode="drop")  # out-of-range targets: dropped

        return KVCache(
            tuple(map(put, cache.k, view.k)), tuple(map(put, cache.v, view.v)), view.lengths
        )


class PagedLayout:
    """A pool of `block_size`-position blocks handed out on demand (minirl/inference/paged_cache.py)."""

    def __init__(self, model_cfg: ModelConfig, engine_cfg):
        self.model_cfg, self.cfg = model_cfg, engine_cfg
        c = engine_cfg
        self.blocks = paged_cache.BlockAllocator(
            c.pool_blocks, c.block_size, c.slots, c.blocks_per_slot
        )

    def empty(self) -> paged_cache.PagedKVCache:
        c, m = self.cfg, self.model_cfg
        shape = (c.slots, c.pool_blocks, c.block_size, c.blocks_per_slot)
        return paged_cache.PagedKVCache.zeros(m, *shape, m.compute_dtype)

    def ensure(self, slot: int, positions: int) -> bool:
        return self.blocks.ensure(slot, positions)

    def release(self, slot: int) -> None:
        self.blocks.release(slot)

    def for_device(self, cache: paged_cache.PagedKVCache) -> paged_cache.PagedKVCache:
        return cache._replace(table=jnp.asarray(self.blocks.table))  # the host's table is truth

    def memory(self, used_tokens: int, peak_tokens: int) -> dict[str, int]:
        c, blocks = self.cfg, self.blocks
        return {
            "allocated": c.pool_blocks * c.block_size,
            "used": blocks.num_used * c.block_size,
            "peak_used": blocks.peak_used * c.block_size,
            "transient": c.slots * c.cache_len,
        }  # (the widest view, gathered)

    write_rows = staticmethod(paged_cache.write_rows)
    view = staticmethod(paged_cache.gather_view)
    write_back = staticmethod(paged_cache.write_back)


def layout_of(engine_cfg) -> type:
    """The layout class `engine_cfg` asks for."""
    return PagedLayout if engine_cfg.paged else ContiguousLayout
